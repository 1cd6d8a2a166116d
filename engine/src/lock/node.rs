//! One independent lock node: a lazily (re)connected multiplexed connection
//! and EVALSHA of the lock scripts with a per-node timeout and a reload on
//! NOSCRIPT (a node restarted empty has no scripts). Never talks to the
//! inventory cluster.

use crate::tls::Certificates;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use crate::lua::LuaScript;

/// One lock node.
pub struct LockNode {
    /// `host:port`, used in errors and as a metric label.
    pub addr: String,
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
}

/// Why one node did not answer usefully.
#[derive(Debug, Clone)]
pub enum NodeError {
    /// No answer within the per-node timeout.
    Timeout,
    /// A Redis or connection error.
    Redis(String),
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Timeout => f.write_str("timeout"),
            NodeError::Redis(e) => f.write_str(e),
        }
    }
}

impl LockNode {
    /// A node at `url` (`redis://host:port`, or `rediss://` with
    /// `certificates`); connects on first use.
    pub fn new(url: &str, certificates: &Certificates) -> Result<LockNode, super::LockError> {
        let addr = crate::redact::host_port(url);
        let client = certificates
            .client(url)
            .map_err(|e| super::LockError::Config(format!("{addr}: {e}")))?;
        Ok(LockNode {
            addr,
            client,
            conn: Mutex::new(None),
        })
    }

    /// Runs one plain command within `timeout` (the nodes' own checks,
    /// not the lock scripts).
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: Cmd,
        timeout: Duration,
    ) -> Result<T, NodeError> {
        let run = async {
            let mut conn = self.connection().await?;
            cmd.query_async::<T>(&mut conn)
                .await
                .map_err(|e| NodeError::Redis(e.to_string()))
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout),
        }
    }

    /// The URL-less client, for the pub/sub connection.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The node's one connection, opened on first use. Every command to the
    /// node goes out on it, in order: a release sent after a timed-out
    /// attempt runs after that attempt's `SET NX`, never before it.
    async fn connection(&self) -> Result<MultiplexedConnection, NodeError> {
        if let Some(c) = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        // No response timeout of the client's own (redis-rs defaults to
        // 500 ms, then the connection would be given up and a release could
        // go out on a new one, racing the old one's buffered SET NX): the
        // per-node timeout is ours, in `eval`, and leaves the connection be.
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| NodeError::Redis(e.to_string()))?;
        // Two callers may have connected at once: keep the first stored, so
        // every command still shares one connection.
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Ok(slot.get_or_insert(c).clone())
    }

    fn forget_connection(&self) {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Runs `script` with `keys` and `args`, within `timeout`; on NOSCRIPT,
    /// loads it and retries once.
    pub async fn eval(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        match tokio::time::timeout(timeout, self.eval_inner(script, keys, args)).await {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout),
        }
    }

    async fn eval_inner(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, NodeError> {
        // Sized up front: growing the buffers argument by argument was the
        // client's largest source of allocations per lock call.
        let data: usize = keys.iter().chain(args).map(|a| a.len()).sum();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), 64 + data);
        cmd.arg("EVALSHA")
            .arg(&script.sha)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let mut conn = self.connection().await?;
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let _: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script.code)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| NodeError::Redis(e.to_string()))?;
                cmd.query_async::<Value>(&mut conn)
                    .await
                    .map_err(|e| NodeError::Redis(e.to_string()))
            }
            Err(e) => {
                // A slow node is not a broken link: keep the connection, or
                // what was written on it could run after what follows it.
                if !e.is_timeout()
                    && (e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error())
                {
                    self.forget_connection();
                }
                Err(NodeError::Redis(e.to_string()))
            }
        }
    }
}

/// The address a lock node's URL names, to tell two nodes apart: host and
/// port, lower-cased, the default port filled in (never the user info).
fn named_address(url: &str) -> String {
    let hp = crate::redact::host_port(url).to_ascii_lowercase();
    let has_port = match hp.rsplit_once(':') {
        Some((host, port)) => !port.is_empty() && (!host.contains(':') || host.ends_with(']')),
        None => false,
    };
    if has_port || hp.is_empty() {
        hp
    } else {
        format!("{hp}:6379")
    }
}

/// Two of `urls` that name one lock node, as `host:port` each: by their
/// text, or, with `resolve`, by an address both resolve to (`localhost`
/// and `127.0.0.1`). One server listed twice makes every majority a lie:
/// its one answer would count two or three times.
pub fn same_node(urls: &[String], resolve: bool) -> Option<(String, String)> {
    use std::net::ToSocketAddrs;
    let named: Vec<String> = urls.iter().map(|u| named_address(u)).collect();
    let reached: Vec<Vec<std::net::SocketAddr>> = named
        .iter()
        .map(|a| {
            if resolve && !a.is_empty() {
                a.to_socket_addrs().map(|i| i.collect()).unwrap_or_default()
            } else {
                Vec::new()
            }
        })
        .collect();
    for i in 0..named.len() {
        for j in i + 1..named.len() {
            let same_text = !named[i].is_empty() && named[i] == named[j];
            let same_addr = reached[i].iter().any(|a| reached[j].contains(a));
            if same_text || same_addr || (named[i].is_empty() && urls[i] == urls[j]) {
                return Some((named[i].clone(), named[j].clone()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_named_twice_is_found() {
        let u = |s: &str| s.to_owned();
        assert!(same_node(&[u("redis://a:1"), u("redis://b:1")], false).is_none());
        assert!(same_node(&[u("redis://a:1"), u("redis://A:1")], false).is_some());
        assert!(same_node(&[u("redis://a"), u("redis://a:6379")], false).is_some());
        assert!(same_node(&[u("redis://u:pw@a:1/0"), u("redis://a:1")], false).is_some());
        assert!(same_node(&[u("redis://127.0.0.1:7"), u("redis://localhost:7")], true).is_some());
        assert!(same_node(&[u("redis://127.0.0.1:7"), u("redis://127.0.0.1:8")], true).is_none());
    }
}
