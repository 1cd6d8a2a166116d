//! The inventory cluster as the engine talks to it: one shared connection
//! (renewed when calls keep failing to reach a slot), the scripts loaded on
//! every master, and the one retry loop every call goes through. A script
//! call is built in one place, [`ScriptCall`] (keys, then arguments, then
//! the slot it runs in), and its reply is decoded once by the function the
//! caller hands to [`Cluster::call`]. Knows nothing of sales or purchases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, RedisError, Value};

use crate::config::Backoff;
use crate::error::{classify, ConnectError, Recovery, Unavailable};
use crate::lua::BadReply;
use crate::metrics::{self as m, Stats};
use crate::placement::SlotMap;
pub(crate) use crate::scripts::call::ScriptCall;
use crate::scripts::{LuaScript, Scripts};
use crate::tls::Certificates;

/// Failed attempts to reach a node after which a call renews the shared
/// connection (see [`Cluster::renew_connection`]).
const RENEW_AFTER: u32 = 3;

/// Most script reloads one call makes after NOSCRIPT before it gives up.
pub const MAX_RELOADS: u32 = 3;

/// The connection to the inventory cluster and the scripts on it.
pub(crate) struct Cluster {
    client: ClusterClient,
    /// The shared connection; replaced by a fresh one (topology discovered
    /// anew from the seed nodes) when calls keep failing to reach a slot,
    /// which a connection stuck on a dead master's address would.
    conn: RwLock<ClusterConnection>,
    /// When the connection was last replaced.
    renewed_at: Mutex<Option<Instant>>,
    /// Bumped each time the connection is replaced: WAIT covers only writes
    /// made on its own connection, so a purchase whose writes may have gone
    /// out on a replaced one is not confirmed by a WAIT on the new one.
    generation: AtomicU64,
    scripts: Scripts,
    retry: Backoff,
    stats: Arc<Stats>,
}

/// Why a script call gave no decoded reply.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Redis failed, past the retry budget.
    Redis(RedisError),
    /// The script replied in a shape its decoder does not know.
    Reply(BadReply),
}

impl From<CallError> for Unavailable {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Redis(e) => Unavailable::from(e),
            CallError::Reply(e) => Unavailable::Reply(e),
        }
    }
}

impl Cluster {
    /// Connects to the cluster through its seed nodes.
    pub(crate) async fn connect(
        nodes: &[String],
        retry: Backoff,
        stats: Arc<Stats>,
        certificates: &Certificates,
    ) -> Result<Cluster, ConnectError> {
        let tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        let builder = ClusterClient::builder(nodes.to_vec())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .retries(4);
        let client = certificates
            .cluster_builder(builder, tls)
            .build()
            .map_err(ConnectError::redis)?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| ConnectError::at_connect(e, tls))?;
        Ok(Cluster {
            client,
            conn: RwLock::new(conn),
            renewed_at: Mutex::new(None),
            generation: AtomicU64::new(0),
            scripts: Scripts::new(),
            retry,
            stats,
        })
    }

    /// The scripts of this build.
    pub(crate) fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// A clone of the shared connection (clones multiplex one socket per
    /// node).
    pub(crate) fn conn(&self) -> ClusterConnection {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Which shared connection is in use (see `generation`).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A new connection of its own, for long-running readers (the order
    /// writer, reconcile) that must not share the purchase path's.
    pub(crate) async fn dedicated_connection(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    /// Replaces the shared connection with a fresh one, at most once every
    /// two seconds however many calls ask. The fresh connection learns the
    /// slot map from the seed nodes, so a failover the old one missed (its
    /// requests kept going to a dead master's address) is found.
    async fn renew_connection(&self) {
        {
            let mut at = self.renewed_at.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| t.elapsed() < Duration::from_secs(2)) {
                return;
            }
            *at = Some(Instant::now());
        }
        match self.client.get_async_connection().await {
            Ok(fresh) => {
                *self.conn.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                self.generation.fetch_add(1, Ordering::SeqCst);
                metrics::counter!(m::REDIS_RETRIES, "reason" => "renew_connection").increment(1);
                tracing::info!("cluster connection renewed from the seed nodes");
            }
            Err(e) => tracing::warn!(error = %e, "cluster connection could not be renewed"),
        }
    }

    /// Reads the cluster's slot map with `CLUSTER SLOTS`.
    pub(crate) async fn slot_map(&self) -> Result<SlotMap, RedisError> {
        let reply = self
            .conn()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        SlotMap::from_cluster_slots(&reply).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "CLUSTER SLOTS reply has an unknown shape",
            ))
        })
    }

    /// Loads every script on every master (`SCRIPT LOAD`).
    pub(crate) async fn load_scripts(&self) -> Result<(), RedisError> {
        for script in self.scripts.all() {
            self.conn()
                .route_command(
                    redis::cmd("SCRIPT").arg("LOAD").arg(script.code).clone(),
                    RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    )),
                )
                .await?;
        }
        Ok(())
    }

    /// True when every script is loaded on the master at `host:port`.
    pub(crate) async fn scripts_loaded_on(
        &self,
        host: &str,
        port: u16,
    ) -> Result<bool, RedisError> {
        let shas: Vec<&str> = self.scripts.all().iter().map(|s| s.sha.as_str()).collect();
        let reply = self
            .conn()
            .route_command(
                redis::cmd("SCRIPT").arg("EXISTS").arg(&shas).clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                }),
            )
            .await?;
        Ok(matches!(&reply, Value::Array(v) if v.iter().all(|x| matches!(x, Value::Int(1)))))
    }

    /// Loads one script on the master of `slot` (after NOSCRIPT there).
    pub(crate) async fn reload_on(&self, script: &LuaScript, slot: u16) -> Result<(), RedisError> {
        self.conn()
            .route_command(
                redis::cmd("SCRIPT").arg("LOAD").arg(script.code).clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot,
                    SlotAddr::Master,
                ))),
            )
            .await?;
        metrics::counter!(m::SCRIPT_RELOADS, "script" => script.name).increment(1);
        self.stats.script_reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `call` and decodes its reply with `decode`. On NOSCRIPT it loads
    /// the script on that slot's master and retries; on errors that may pass
    /// it backs off and retries until the retry deadline. Retrying is safe
    /// because every script is idempotent per request or operation record.
    ///
    /// We allow [`MAX_RELOADS`] reloads, not one, because the script cache
    /// can be flushed again between our reload and our retry (an operator's
    /// second `SCRIPT FLUSH`, or a failover right after a flush), and a buyer
    /// should not see that as an error.
    pub(crate) async fn call<R>(
        &self,
        call: &ScriptCall<'_>,
        decode: fn(Value) -> Result<R, BadReply>,
    ) -> Result<R, CallError> {
        self.call_since(call, decode, Instant::now()).await
    }

    /// [`Cluster::call`] for a request that started at `started` (a
    /// purchase that waited in its bucket's queue): the retry deadline runs
    /// from then.
    pub(crate) async fn call_since<R>(
        &self,
        call: &ScriptCall<'_>,
        decode: fn(Value) -> Result<R, BadReply>,
        started: Instant,
    ) -> Result<R, CallError> {
        let v: Value = self
            .run_with_retry(&call.cmd, Some((call.script, call.slot)), started)
            .await
            .map_err(CallError::Redis)?;
        decode(v).map_err(CallError::Reply)
    }

    /// One attempt, no retry: `call`, then `WAIT 1 wait_ms`, pipelined on
    /// one connection to the master of the call's slot, so the WAIT covers
    /// the call's writes and everything the master wrote before them, and
    /// nothing else can be what it counts (a WAIT sent alone may reach
    /// another node, or a renewed connection). Returns the decoded reply and
    /// whether a replica acknowledged; `None` when the script's reply did
    /// not come back clean (an error, a redirect, NOSCRIPT, a broken link):
    /// the caller then goes through [`Cluster::call`], whose retry is safe
    /// for the same reason any retry is.
    pub(crate) async fn call_then_wait<R>(
        &self,
        call: &ScriptCall<'_>,
        decode: fn(Value) -> Result<R, BadReply>,
        wait_ms: u64,
    ) -> Option<(R, bool)> {
        let mut pipe = redis::pipe();
        pipe.add_command(call.cmd.clone());
        pipe.cmd("WAIT").arg(1).arg(wait_ms);
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(call.slot, SlotAddr::Master));
        let replies = self.conn().route_pipeline(pipe, 0, 2, route).await.ok()?;
        let mut replies = replies.into_iter();
        let reply = decode(replies.next()?).ok()?;
        let replicated = matches!(replies.next(), Some(Value::Int(n)) if n >= 1);
        Some((reply, replicated))
    }

    /// Sends a plain command with the same retry policy as scripts (admin
    /// and status calls; not the hot path).
    pub(crate) async fn run_cmd<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> Result<T, RedisError> {
        self.run_with_retry(cmd, None, Instant::now()).await
    }

    /// The one retry loop: `script` (with its slot) is what to reload on
    /// NOSCRIPT; a plain command gives up on NOSCRIPT like on any other
    /// permanent error.
    async fn run_with_retry<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
        script: Option<(&LuaScript, u16)>,
        started: Instant,
    ) -> Result<T, RedisError> {
        let mut attempt = 0u32;
        let mut reloads = 0u32;
        loop {
            let mut conn = self.conn();
            let err = match cmd.query_async::<T>(&mut conn).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match (classify(&err), script) {
                (Recovery::ReloadScript, Some((script, slot))) if reloads < MAX_RELOADS => {
                    reloads += 1;
                    if let Err(e) = self.reload_on(script, slot).await {
                        tracing::warn!(script = script.name, slot, error = %e, "script reload failed");
                        self.pause_or_give_up(&mut attempt, started, err, "reload")
                            .await?;
                    }
                }
                (Recovery::ReloadScript | Recovery::GiveUp, _) => return Err(err),
                (Recovery::RetryLater, _) => {
                    self.pause_or_give_up(&mut attempt, started, err, "retry_later")
                        .await?
                }
                (Recovery::Reconnect, _) => {
                    self.pause_or_give_up(&mut attempt, started, err, "reconnect")
                        .await?;
                    if attempt >= RENEW_AFTER {
                        self.renew_connection().await;
                    }
                }
            }
        }
    }

    /// Sleeps before the next retry, or returns `err` when the deadline
    /// would pass first.
    async fn pause_or_give_up(
        &self,
        attempt: &mut u32,
        started: Instant,
        err: RedisError,
        reason: &'static str,
    ) -> Result<(), RedisError> {
        let delay = self.retry.delay(*attempt);
        if started.elapsed() + delay > self.retry.deadline {
            return Err(err);
        }
        *attempt += 1;
        metrics::counter!(m::REDIS_RETRIES, "reason" => reason).increment(1);
        self.stats.redis_retries.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(error = %err, reason, attempt = *attempt, "retrying redis call");
        tokio::time::sleep(delay).await;
        Ok(())
    }
}
