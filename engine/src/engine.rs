//! The [`Engine`]: one handle on the inventory cluster that a seckill service
//! clones into every task. It owns the cluster connection, the loaded
//! scripts, the cache of sale metadata, and the one place where a script is
//! called: [`Engine::run_script`], which reloads on NOSCRIPT and retries what
//! may pass (failover, reshard) within the configured budget. It never talks
//! to the lock nodes or PostgreSQL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, RedisError, Value};

use crate::config::Config;
use crate::error::{classify, ConnectError, Recovery};
use crate::metrics as m;
use crate::placement::SlotMap;
use crate::sale::SaleHandle;
use crate::scripts::{LuaScript, Scripts};

/// Failed attempts to reach a node after which a call renews the shared
/// connection (see [`Engine::renew_connection`]).
const RENEW_AFTER: u32 = 3;

/// Most script reloads one call makes after NOSCRIPT before it gives up.
pub const MAX_RELOADS: u32 = 3;

/// A cheap-to-clone handle on the inventory cluster.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: ClusterClient,
    /// The shared cluster connection; replaced by a fresh one (topology
    /// discovered anew from the seed nodes) when calls keep failing to reach
    /// a slot, which a connection stuck on a dead master's address would.
    conn: RwLock<ClusterConnection>,
    /// When the connection was last replaced.
    renewed_at: std::sync::Mutex<Option<Instant>>,
    /// Bumped each time the connection is replaced: WAIT covers only writes
    /// made on its own connection, so a purchase whose writes may have gone
    /// out on a replaced one is not confirmed by a WAIT on the new one.
    conn_generation: AtomicU64,
    pub(crate) scripts: Scripts,
    pub(crate) config: Config,
    /// Sale metadata by SKU. A std lock: it is never held across an await.
    pub(crate) sales: RwLock<HashMap<String, Arc<SaleHandle>>>,
    pub(crate) epoch: Instant,
    pub(crate) stats: Stats,
    /// Group commit of `ack = replicated`.
    pub(crate) waits: crate::replication::WaitBatches,
    /// Locks for admin operations, when lock nodes are configured.
    pub(crate) locks: Option<crate::lock::LockClient>,
}

/// Counters an embedding service (or a test) can read without a metrics
/// recorder; the same events also go to the `metrics` facade.
#[derive(Debug, Default)]
pub struct Stats {
    /// Scripts loaded again after NOSCRIPT.
    pub script_reloads: AtomicU64,
    /// Redis calls retried after a redirect, failover or broken connection.
    pub redis_retries: AtomicU64,
    /// Purchases answered "sold out" from the local flag.
    pub sold_out_local: AtomicU64,
}

impl Engine {
    /// Connects to the inventory cluster, checks that every slot is served,
    /// and loads every script on every master.
    pub async fn connect(config: Config) -> Result<Engine, ConnectError> {
        config.validate().map_err(ConnectError::Config)?;
        let client = ClusterClient::builder(config.cluster_nodes.clone())
            .connection_timeout(std::time::Duration::from_secs(1))
            .response_timeout(std::time::Duration::from_secs(2))
            .retries(4)
            .build()
            .map_err(|e| ConnectError::Config(e.to_string()))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| ConnectError::Redis(e.to_string()))?;
        m::describe();
        let locks = if config.lock_nodes.is_empty() {
            None
        } else {
            Some(
                crate::lock::LockClient::new(
                    &config.lock_nodes,
                    crate::lock::LockConfig::default(),
                )
                .map_err(|e| ConnectError::Config(e.to_string()))?,
            )
        };
        let engine = Engine {
            inner: Arc::new(Inner {
                client,
                conn: RwLock::new(conn),
                renewed_at: std::sync::Mutex::new(None),
                conn_generation: AtomicU64::new(0),
                scripts: Scripts::new(),
                config,
                sales: RwLock::new(HashMap::new()),
                epoch: Instant::now(),
                stats: Stats::default(),
                waits: Default::default(),
                locks,
            }),
        };
        let map = engine
            .slot_map()
            .await
            .map_err(|e| ConnectError::Redis(e.to_string()))?;
        if !map.covers_all_slots() {
            return Err(ConnectError::Redis("not every slot is served".into()));
        }
        engine
            .load_scripts()
            .await
            .map_err(|e| ConnectError::Redis(format!("SCRIPT LOAD: {e}")))?;
        Ok(engine)
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The lock client over `lock_nodes`, when any are configured.
    pub fn locks(&self) -> Option<&crate::lock::LockClient> {
        self.inner.locks.as_ref()
    }

    /// Counters of retries, reloads and local sold-out answers.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// A clone of the cluster connection, for callers in this crate that send
    /// plain commands (admin, status, order writer).
    pub(crate) fn conn(&self) -> ClusterConnection {
        self.inner
            .conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Which shared connection is in use (see `conn_generation`).
    pub(crate) fn conn_generation(&self) -> u64 {
        self.inner.conn_generation.load(Ordering::SeqCst)
    }

    /// Replaces the shared connection with a fresh one, at most once every
    /// two seconds however many calls ask. The fresh connection learns the
    /// slot map from the seed nodes, so a failover the old one missed (its
    /// requests kept going to a dead master's address) is found.
    async fn renew_connection(&self) {
        {
            let mut at = self
                .inner
                .renewed_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(2)) {
                return;
            }
            *at = Some(Instant::now());
        }
        match self.inner.client.get_async_connection().await {
            Ok(fresh) => {
                *self.inner.conn.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                self.inner.conn_generation.fetch_add(1, Ordering::SeqCst);
                metrics::counter!(m::REDIS_RETRIES, "reason" => "renew_connection").increment(1);
                tracing::info!("cluster connection renewed from the seed nodes");
            }
            Err(e) => tracing::warn!(error = %e, "cluster connection could not be renewed"),
        }
    }

    /// A new cluster connection of its own, for long-running readers (the
    /// order writer, reconcile) that must not share the purchase path's.
    pub async fn dedicated_connection(&self) -> Result<ClusterConnection, RedisError> {
        self.inner.client.get_async_connection().await
    }

    /// Milliseconds since this engine was created; 0 is never returned, so 0
    /// can mean "unset" in atomics.
    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Reads the cluster's slot map with `CLUSTER SLOTS`.
    pub async fn slot_map(&self) -> Result<SlotMap, RedisError> {
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
    pub async fn load_scripts(&self) -> Result<(), RedisError> {
        for script in self.inner.scripts.all() {
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

    /// Loads one script on the master of `slot` (after NOSCRIPT there).
    async fn reload_on(&self, script: &LuaScript, slot: u16) -> Result<(), RedisError> {
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
        self.inner
            .stats
            .script_reloads
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts an `EVALSHA` of `script` with its KEYS; the caller adds ARGV.
    pub(crate) fn evalsha(script: &LuaScript, keys: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha).arg(keys.len()).arg(keys);
        cmd
    }

    /// Runs a prepared `EVALSHA` whose keys hash to `slot`. On NOSCRIPT it
    /// loads the script on that slot's master and retries; on errors that
    /// may pass it backs off and retries until the retry deadline. Retrying is
    /// safe because every script is idempotent per request record.
    ///
    /// The design said "reload and retry once"; we allow [`MAX_RELOADS`]
    /// because the script cache can be flushed again between our reload and
    /// our retry (an operator's second `SCRIPT FLUSH`, or a failover right
    /// after a flush), and a buyer should not see that as an error.
    pub(crate) async fn run_script(
        &self,
        script: &LuaScript,
        slot: u16,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        self.run_with_retry(cmd, Some((script, slot))).await
    }

    /// Sends a plain command with the same retry policy as scripts (admin and
    /// status calls; not the hot path).
    pub(crate) async fn run_cmd<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> Result<T, RedisError> {
        self.run_with_retry(cmd, None).await
    }

    /// The one retry loop: `script` (with its slot) is what to reload on
    /// NOSCRIPT; a plain command gives up on NOSCRIPT like on any other
    /// permanent error.
    async fn run_with_retry<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
        script: Option<(&LuaScript, u16)>,
    ) -> Result<T, RedisError> {
        let backoff = self.inner.config.retry;
        let started = Instant::now();
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
                        self.pause_or_give_up(&mut attempt, started, backoff, err, "reload")
                            .await?;
                    }
                }
                (Recovery::ReloadScript | Recovery::GiveUp, _) => return Err(err),
                (Recovery::RetryLater, _) => {
                    self.pause_or_give_up(&mut attempt, started, backoff, err, "retry_later")
                        .await?
                }
                (Recovery::Reconnect, _) => {
                    self.pause_or_give_up(&mut attempt, started, backoff, err, "reconnect")
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
        backoff: crate::config::Backoff,
        err: RedisError,
        reason: &'static str,
    ) -> Result<(), RedisError> {
        let delay = backoff.delay(*attempt);
        if started.elapsed() + delay > backoff.deadline {
            return Err(err);
        }
        *attempt += 1;
        metrics::counter!(m::REDIS_RETRIES, "reason" => reason).increment(1);
        self.inner
            .stats
            .redis_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(error = %err, reason, attempt = *attempt, "retrying redis call");
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Readiness: every slot is served and every script is loaded on every
    /// master. Returns what is wrong otherwise.
    pub async fn readiness(&self) -> Result<(), String> {
        let map = self
            .slot_map()
            .await
            .map_err(|e| format!("cluster unreachable: {e}"))?;
        if !map.covers_all_slots() {
            return Err("cluster: not every slot is served".into());
        }
        let shas: Vec<&str> = self
            .inner
            .scripts
            .all()
            .iter()
            .map(|s| s.sha.as_str())
            .collect();
        for master in map.masters() {
            let Some((host, port)) = master.rsplit_once(':') else {
                continue;
            };
            let port: u16 = port
                .parse()
                .map_err(|_| format!("bad master address {master}"))?;
            let reply = self
                .conn()
                .route_command(
                    redis::cmd("SCRIPT").arg("EXISTS").arg(&shas).clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port,
                    }),
                )
                .await
                .map_err(|e| format!("{master}: {e}"))?;
            let all_loaded =
                matches!(&reply, Value::Array(v) if v.iter().all(|x| matches!(x, Value::Int(1))));
            if !all_loaded {
                // Not fatal for buyers (NOSCRIPT reloads), but say so and fix it.
                self.load_scripts()
                    .await
                    .map_err(|e| format!("{master}: SCRIPT LOAD: {e}"))?;
            }
        }
        Ok(())
    }

    /// One group-commit round for `slot` (see `replication.rs`):
    /// `lua/ack.lua` (probe write, then each record read) and `WAIT 1
    /// timeout_ms`, pipelined on one connection to the slot's master.
    /// `records` are (key, hash field or ""). Returns whether a replica
    /// acknowledged everything written on that node before the WAIT, and
    /// each value on that node ("" if missing).
    pub(crate) async fn wait_replicated(
        &self,
        slot: u16,
        probe: &str,
        records: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<(bool, Vec<String>), RedisError> {
        let script = &self.inner.scripts.ack;
        let mut pipe = redis::pipe();
        let eval = pipe
            .cmd("EVALSHA")
            .arg(&script.sha)
            .arg(1 + records.len())
            .arg(probe);
        for (key, _) in records {
            eval.arg(*key);
        }
        eval.arg(60_000);
        for (_, field) in records {
            eval.arg(*field);
        }
        pipe.cmd("WAIT").arg(1).arg(timeout_ms);
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        let replies = match self.conn().route_pipeline(pipe, 0, 2, route).await {
            Ok(r) => r,
            Err(e) => {
                if classify(&e) == Recovery::ReloadScript {
                    // The caller retries; the script is there by then.
                    let _ = self.reload_on(script, slot).await;
                }
                return Err(e);
            }
        };
        // An error comes back inline in a pipeline: NOSCRIPT (a promoted
        // replica never had the script) is reloaded for the caller's next
        // round; any other error, or anything but the records, acks nobody.
        if let Some(Value::ServerError(e)) = replies.first() {
            let e = RedisError::from(e.clone());
            if classify(&e) == Recovery::ReloadScript {
                let _ = self.reload_on(script, slot).await;
            }
            return Err(e);
        }
        let records: Vec<String> = match replies.first() {
            Some(Value::Array(items)) if items.len() == records.len() => items
                .iter()
                .map(|v| match v {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    _ => String::new(),
                })
                .collect(),
            _ => return Ok((false, vec![String::new(); records.len()])),
        };
        let acked = matches!(replies.get(1), Some(Value::Int(n)) if *n >= 1);
        Ok((acked, records))
    }
}
