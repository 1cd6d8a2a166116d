//! The run driver: one [`Bench`] holds the connections and the sales it
//! made, runs each scenario's strategies in turn ([`measure`]), and deletes
//! everything it created afterwards. The figures are judged in `targets.rs`
//! and printed in `report.rs`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Result};
use flashsale::{Engine, SaleSpec};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use redis::Value;

use crate::report::{Machine, RunResult};
use crate::{anchor, load, lockbench, strategies, Args};

/// A result row from the load generator's figures.
fn row(
    scenario: &str,
    strategy: &str,
    concurrency: usize,
    stats: &load::LoadStats,
    oversold: u64,
    note: String,
) -> RunResult {
    RunResult {
        scenario: scenario.into(),
        strategy: strategy.into(),
        ops: stats.done,
        concurrency,
        throughput: stats.throughput(),
        p50_ms: stats.pct_ms(0.5),
        p99_ms: stats.pct_ms(0.99),
        p999_ms: Some(stats.pct_ms(0.999)),
        confirmed: stats.confirmed,
        oversold,
        errors: stats.errors,
        ratio_to_anchor: None,
        note,
    }
}

pub struct Bench {
    pub args: Args,
    pub engine: Engine,
    pub conn: redis::cluster_async::ClusterConnection,
    /// The same cluster with `ack = replicated` (WAIT for one replica).
    pub replicated: Engine,
    /// Whether the masters have replicas.
    pub has_replicas: bool,
    pub lock_nodes: Vec<String>,
    pub run: String,
    pub created: Vec<String>,
    pub plain_keys: Vec<String>,
    pub bars: MultiProgress,
}

impl Bench {
    fn bar(&self, len: u64, msg: String) -> ProgressBar {
        if self.args.quiet {
            return ProgressBar::hidden();
        }
        let b = self.bars.add(ProgressBar::new(len));
        b.set_style(
            ProgressStyle::with_template("{msg:28} {bar:40} {pos}/{len} {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(msg);
        b
    }

    async fn sale(
        &mut self,
        name: &str,
        stock: u64,
        buckets: u32,
    ) -> Result<flashsale::SaleStatus> {
        let sku = format!("bench-{}-{name}", self.run);
        let st = self
            .engine
            .create_sale(SaleSpec {
                buckets,
                ..SaleSpec::new(&sku, stock)
            })
            .await?;
        self.created.push(sku);
        Ok(st)
    }

    /// Runs `op` `ops` times at the configured concurrency (paced to `rate`
    /// when given) behind a progress bar labelled `label`.
    async fn load<F, Fut>(
        &self,
        label: String,
        ops: u64,
        rate: Option<f64>,
        op: F,
    ) -> load::LoadStats
    where
        F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = load::Outcome> + Send,
    {
        let bar = self.bar(ops, label);
        let stats = load::run(ops, self.args.concurrency, self.cap(), rate, &bar, op).await;
        bar.finish();
        stats
    }

    fn cap(&self) -> Duration {
        Duration::from_secs(self.args.cap_seconds)
    }

    /// `ops` purchases through `engine` over `skus` (whose stock adds up to
    /// at least `ops`, so every call reaches Redis).
    async fn engine_run(
        &mut self,
        scenario: &str,
        label: &str,
        engine: Engine,
        skus: Vec<String>,
        rate: Option<f64>,
        ops: u64,
    ) -> Result<RunResult> {
        let stock = ops;
        let (engine, skus_arc, run): (Engine, Arc<Vec<String>>, Arc<str>) = (
            engine,
            Arc::new(skus.clone()),
            // User ids allow no spaces: "engine ack=replicated" -> "engine_ack=replicated".
            format!("{}-{scenario}-{}", self.run, label.replace(' ', "_")).into(),
        );
        let stats = self
            .load(format!("{scenario} {label}"), ops, rate, move |i| {
                strategies::engine_op(engine.clone(), skus_arc.clone(), run.clone(), i)
            })
            .await;
        let mut sold = 0u64;
        let mut below_zero = 0u64;
        for sku in &skus {
            let st = self.engine.sale_status(sku).await?;
            sold += st.initial - st.remaining;
            below_zero += st
                .buckets
                .iter()
                .map(|b| b.remaining.min(0).unsigned_abs())
                .sum::<u64>();
        }
        let oversold =
            stats.confirmed.saturating_sub(stock) + below_zero + stats.confirmed.abs_diff(sold);
        Ok(row(
            scenario,
            label,
            self.args.concurrency,
            &stats,
            oversold,
            match rate {
                Some(r) => format!("paced at {r:.0}/s"),
                None => "stock >= ops: every call reaches Redis".into(),
            },
        ))
    }

    async fn anchor_run(
        &mut self,
        scenario: &str,
        name: &str,
        buckets: u32,
        skus: usize,
    ) -> Result<RunResult> {
        let ops = self.args.ops;
        let mut targets = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for k in 0..skus.max(1) {
            let st = self
                .sale(&format!("{name}{k}"), ops + 1000, buckets)
                .await?;
            for b in &st.buckets {
                if seen.insert(b.master.clone()) {
                    targets.push(anchor::Target {
                        master: b.master.clone(),
                        tag: b.tag.clone(),
                    });
                }
            }
        }
        let bar = self.bar(1, format!("{scenario} anchor (redis-benchmark)"));
        let sha = flashsale::scripts::Scripts::new().purchase.sha;
        let a = anchor::run(&targets, &sha, self.args.concurrency, ops).await?;
        bar.inc(1);
        bar.finish();
        Ok(RunResult {
            scenario: scenario.into(),
            strategy: "anchor".into(),
            ops: a.ops,
            concurrency: self.args.concurrency,
            throughput: a.rps,
            p50_ms: a.p50_ms,
            p99_ms: a.p99_ms,
            p999_ms: None,
            confirmed: a.ops,
            oversold: 0,
            errors: 0,
            ratio_to_anchor: Some(1.0),
            note: format!(
                "redis-benchmark EVALSHA purchase.lua on {} master(s)",
                targets.len()
            ),
        })
    }

    async fn plain_stock(&mut self, name: &str, stock: u64) -> Result<Arc<str>> {
        let key = format!("{{bench-{}-{name}}}:stock", self.run);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(stock)
            .query_async(&mut self.conn)
            .await?;
        self.plain_keys.push(key.clone());
        Ok(key.into())
    }

    async fn naive_run(&mut self) -> Result<RunResult> {
        let ops = self.args.ops;
        let stock = ops / 2;
        let key = self.plain_stock("naive", stock).await?;
        let conn = self.conn.clone();
        let k = key.clone();
        let stats = self
            .load("hot1 naive (GET, DECR)".into(), ops, None, move |_| {
                strategies::naive_op(conn.clone(), k.clone())
            })
            .await;
        let left: i64 = redis::cmd("GET")
            .arg(&*key)
            .query_async(&mut self.conn)
            .await?;
        Ok(row(
            "hot1",
            "naive",
            self.args.concurrency,
            &stats,
            stats.confirmed.saturating_sub(stock),
            format!("stock {stock}, left {left} (below zero = oversold)"),
        ))
    }

    /// "Which costs less at the door": the service's in-process rate limiter
    /// against the seeds' Redis rate-limit script, one check per request.
    async fn door_runs(&mut self) -> Result<Vec<RunResult>> {
        let ops = self.args.ops;
        let limiter = Arc::new(flashsale::ratelimit::RateLimiter::new(5.0, 5, 0.0, 0));
        let stats = self
            .load("door in-process limiter".into(), ops, None, move |i| {
                let limiter = limiter.clone();
                async move {
                    if limiter.allow(&format!("door-u{}", i % 10_000)) {
                        load::Outcome::Confirmed
                    } else {
                        load::Outcome::SoldOut
                    }
                }
            })
            .await;
        let mut out = vec![row(
            "door",
            "in-process limiter",
            self.args.concurrency,
            &stats,
            0,
            "token bucket per user, no I/O".into(),
        )];

        let script = redis::Script::new(include_str!("../../lua/rate_limit.lua"));
        let sha = script.get_hash().to_owned();
        let _: Value = self
            .conn
            .route_command(
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(include_str!("../../lua/rate_limit.lua"))
                    .clone(),
                redis::cluster_routing::RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
                )),
            )
            .await?;
        let (conn, run) = (self.conn.clone(), self.run.clone());
        let stats = self
            .load("door redis rate_limit.lua".into(), ops, None, move |i| {
                let (mut conn, sha, run) = (conn.clone(), sha.clone(), run.clone());
                async move {
                    let window = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let key = format!("{{rl:{run}-door-u{}}}:{window}", i % 10_000);
                    match redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(&key)
                        .arg(5)
                        .arg(1000)
                        .query_async::<i64>(&mut conn)
                        .await
                    {
                        Ok(1) => load::Outcome::Confirmed,
                        Ok(_) => load::Outcome::SoldOut,
                        Err(_) => load::Outcome::Error,
                    }
                }
            })
            .await;
        out.push(row(
            "door",
            "redis rate_limit.lua",
            self.args.concurrency,
            &stats,
            0,
            "fixed window, one EVALSHA per check".into(),
        ));
        Ok(out)
    }

    async fn lock_run(&mut self) -> Result<Option<RunResult>> {
        if self.lock_nodes.is_empty() {
            return Ok(None);
        }
        let ops = self.args.lock_ops;
        let key = self.plain_stock("lock", ops).await?;
        let locks = flashsale::lock::LockClient::new(
            &self.lock_nodes,
            flashsale::lock::LockConfig::default(),
        )?;
        let conn = self.conn.clone();
        let worker = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stats = self
            .load("hot1 lock (lock,GET,DECR)".into(), ops, None, move |_| {
                let w = worker.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                strategies::lock_op(locks.clone(), conn.clone(), key.clone(), w)
            })
            .await;
        Ok(Some(row(
            "hot1",
            "lock",
            self.args.concurrency,
            &stats,
            0,
            format!("Redlock on {} lock node(s)", self.lock_nodes.len()),
        )))
    }

    /// Deletes every sale and key this run created, and takes the sales out
    /// of the index, so reconcile and the order writer never see them.
    pub async fn cleanup(&mut self) -> Result<()> {
        for sku in std::mem::take(&mut self.created) {
            if let Ok(st) = self.engine.sale_status(&sku).await {
                for b in &st.buckets {
                    let _: i64 = redis::cmd("DEL")
                        .arg(&b.key)
                        .arg(&b.stream)
                        .arg(format!("{{{}}}:sale", b.tag))
                        .query_async(&mut self.conn)
                        .await?;
                }
            }
            let _: i64 = redis::cmd("SREM")
                .arg(flashsale::keys::sale_index())
                .arg(&sku)
                .query_async(&mut self.conn)
                .await?;
            let _: i64 = redis::cmd("DEL")
                .arg(flashsale::keys::sale_meta(&sku))
                .query_async(&mut self.conn)
                .await?;
        }
        for key in std::mem::take(&mut self.plain_keys) {
            let _: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut self.conn)
                .await?;
        }
        Ok(())
    }
}

/// What the bench runs on: versions, cores, masters and replicas.
pub async fn machine(
    conn: &mut redis::cluster_async::ClusterConnection,
    engine: &Engine,
) -> Machine {
    let map = engine.slot_map().await.ok();
    let version = async {
        let info: Value = redis::cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await
            .ok()?;
        let text = match info {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            Value::Map(m) => m
                .into_iter()
                .filter_map(|(_, v)| match v {
                    Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            _ => return None,
        };
        text.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(|v| v.trim().to_owned())
    }
    .await;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu,
        redis_version: version.unwrap_or_else(|| "unknown".into()),
        masters: map.as_ref().map(|m| m.masters().len()).unwrap_or(0),
        replicas: map
            .as_ref()
            .map(|m| {
                m.ranges.iter().map(|r| r.replicas.len()).max().unwrap_or(0) * m.masters().len()
            })
            .unwrap_or(0),
    }
}

/// Every scenario the arguments ask for, once.
pub async fn measure(b: &mut Bench) -> Result<(Vec<RunResult>, Vec<lockbench::LockResult>)> {
    let ops = b.args.ops;
    let mut results = Vec::new();
    for sc in b.args.scenarios.clone() {
        match sc.as_str() {
            "hot1" => {
                results.push(b.anchor_run("hot1", "hot1-anchor", 1, 1).await?);
                let st = b.sale("hot1", ops, 1).await?;
                let e = b.engine.clone();
                let r = b
                    .engine_run("hot1", "engine", e.clone(), vec![st.sku.clone()], None, ops)
                    .await?;
                let peak = r.throughput;
                results.push(r);
                let paced_ops = ((peak * 0.8) * 5.0).min(ops as f64).max(100.0) as u64;
                let st = b.sale("hot1-paced", paced_ops, 1).await?;
                results.push(
                    b.engine_run(
                        "hot1",
                        "engine@80%",
                        e,
                        vec![st.sku.clone()],
                        Some(peak * 0.8),
                        paced_ops,
                    )
                    .await?,
                );
                // The durability knob: confirm only once a replica has the
                // order (needs replicas; without them every WAIT times out).
                if b.has_replicas {
                    let st = b.sale("hot1-replicated", ops, 1).await?;
                    let r = b.replicated.clone();
                    let label = "engine ack=replicated";
                    results.push(
                        b.engine_run("hot1", label, r, vec![st.sku.clone()], None, ops)
                            .await?,
                    );
                }
                if let Some(r) = b.lock_run().await? {
                    results.push(r);
                }
                results.push(b.naive_run().await?);
            }
            "hotB" => {
                let buckets = b.args.buckets;
                results.push(b.anchor_run("hotB", "hotB-anchor", buckets, 1).await?);
                let st = b.sale("hotB", ops, buckets).await?;
                let e = b.engine.clone();
                results.push(
                    b.engine_run("hotB", "engine", e, vec![st.sku.clone()], None, ops)
                        .await?,
                );
            }
            "many" => {
                let n = b.args.skus.max(1);
                results.push(b.anchor_run("many", "many-anchor", 1, n).await?);
                let mut skus = Vec::with_capacity(n);
                for k in 0..n {
                    skus.push(
                        b.sale(&format!("many{k}"), ops / n as u64 + 1, 1)
                            .await?
                            .sku,
                    );
                }
                let e = b.engine.clone();
                results.push(b.engine_run("many", "engine", e, skus, None, ops).await?);
            }
            "door" => results.extend(b.door_runs().await?),
            "none" => {}
            other => {
                return Err(anyhow!(
                    "unknown scenario {other:?} (hot1, hotB, many, none)"
                ))
            }
        }
    }
    let mut locks = Vec::new();
    if !b.args.no_lock_bench && !b.lock_nodes.is_empty() {
        let bar = b.bar(8, "lock benchmark".into());
        locks = lockbench::run_all(
            &b.lock_nodes,
            b.args.lock_pairs,
            b.args.lock_tasks,
            b.cap(),
            &bar,
        )
        .await?;
        bar.finish();
    }
    Ok((results, locks))
}
