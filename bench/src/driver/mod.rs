//! The run driver: one [`Bench`] holds the connections and the sales it
//! made, runs each scenario's strategies in turn ([`measure`]), and deletes
//! everything it created afterwards. The figures are judged in `targets.rs`
//! and printed in `report.rs`.

mod anchor_row;
mod door_rows;
mod engine_row;
mod hold_row;
mod http_row;
mod lock_row;
mod naive_row;
mod nodes;
mod orders_rows;
mod refused_row;
mod stock_clock;

use std::time::Duration;

use anyhow::{anyhow, Result};
use flashsale::{Engine, SaleSpec};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::args::Args;
use crate::report::{Machine, RunResult};
use crate::strategies::{UNBATCHED, UNBATCHED_10};
use crate::{anchor, load, lockbench};

use nodes::*;

/// A result row from the load generator's figures.
pub(super) fn row(
    scenario: &str,
    strategy: &str,
    concurrency: usize,
    stats: &load::LoadStats,
    stock: u64,
    oversold: u64,
    note: String,
) -> RunResult {
    RunResult {
        scenario: scenario.into(),
        strategy: strategy.into(),
        ops: stats.done,
        concurrency,
        throughput: stats.throughput(),
        repetitions: vec![stats.throughput()],
        throughput_min: stats.throughput(),
        throughput_max: stats.throughput(),
        answers_per_s: stats.answers_per_s(),
        stock,
        redis_us_per_op: None,
        master_us_per_confirmed: None,
        client_us_per_confirmed: None,
        projected_ceiling: None,
        batch_p50: None,
        batch_p99: None,
        p50_ms: stats.pct_ms(0.5),
        p99_ms: stats.pct_ms(0.99),
        p999_ms: Some(stats.pct_ms(0.999)),
        confirmed: stats.confirmed,
        oversold,
        errors: stats.errors,
        ratio_to_anchor: None,
        expiry_lag_p99_ms: None,
        persistence_forks: None,
        engine_per_s: None,
        db_us_per_order: None,
        stock_clock: false,
        note,
    }
}

/// A `door` row counts checks, allowed or not: its throughput is answers/s.
pub(super) fn checks_row(r: RunResult) -> RunResult {
    let answers = r.answers_per_s;
    r.with_rate(answers)
}

pub struct Bench {
    pub args: Args,
    pub engine: Engine,
    pub conn: redis::cluster_async::ClusterConnection,
    /// The same cluster with `ack = replicated` (WAIT for one replica).
    pub replicated: Engine,
    /// The same cluster with `batch_max = 1`: one purchase per script call.
    pub unbatched: Engine,
    /// Where the `orders` row's writers write.
    pub postgres_url: String,
    /// Whether the masters have replicas.
    pub has_replicas: bool,
    pub lock_nodes: Vec<String>,
    pub run: String,
    pub created: Vec<String>,
    pub plain_keys: Vec<String>,
    /// Which repetition is running (0-based): decides the run order.
    pub rep: usize,
    /// The next `settle` is skipped: the row calling it settled already.
    pub settled_for_next_row: bool,
    pub bars: MultiProgress,
}

impl Bench {
    pub(super) fn bar(&self, len: u64, msg: String) -> ProgressBar {
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

    /// [`settle`], unless the row in hand settled already: the `orders`
    /// rows settle before their writers start and their clock runs, and
    /// their selling phase must not wait for a fork inside that clock.
    pub(super) async fn settle(&mut self) -> Result<()> {
        if std::mem::take(&mut self.settled_for_next_row) {
            return Ok(());
        }
        settle(&self.engine).await
    }

    pub(super) async fn sale(
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
    pub(super) async fn load<F, Fut>(
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

    pub(super) fn cap(&self) -> Duration {
        Duration::from_secs(self.args.cap_seconds)
    }

    /// Deletes every sale and key this run created, and takes the sales out
    /// of the index, so reconcile and the order writer never see them.
    pub async fn cleanup(&mut self) -> Result<()> {
        for sku in std::mem::take(&mut self.created) {
            if let Ok(st) = self.engine.sale_status(&sku).await {
                for b in &st.buckets {
                    self.delete_bucket_keys(&b.tag, b.slot).await?;
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

impl Bench {
    /// Every key of one bucket (they all start `{tag}:` and share its
    /// slot): stock, stream, sale hash, indexes, and the request records
    /// and quotas its buyers left, which would otherwise live out their TTL
    /// (a day, for the `http` row's serve) and fill the cluster run after
    /// run. Scanned on the bucket's master, outside every row's clock.
    async fn delete_bucket_keys(&mut self, tag: &str, slot: u16) -> Result<()> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            slot,
            SlotAddr::Master,
        )));
        let mut pattern = String::with_capacity(tag.len() + 4);
        pattern.push('{');
        for c in tag.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str("}:*");
        let mut cursor = 0u64;
        loop {
            let reply = self
                .conn
                .route_command(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .clone(),
                    route.clone(),
                )
                .await?;
            let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
            if !keys.is_empty() {
                let _: i64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut self.conn)
                    .await?;
            }
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

/// What the bench runs on: versions, cores, masters and replicas.
pub async fn machine(
    conn: &mut redis::cluster_async::ClusterConnection,
    engine: &Engine,
) -> Machine {
    let map = engine.slot_map().await.ok();
    let version = async {
        let master = map.as_ref()?.masters().into_iter().next()?.to_owned();
        let (host, port) = master.rsplit_once(':')?;
        let text = info(conn, host, port.parse().ok()?, "server").await.ok()?;
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

pub(super) const PURCHASE: anchor::Script = anchor::Script::Purchase;

/// The hot1 anchors: purchase.lua one call at a time per connection, the
/// same pipelined 16 deep on one connection, and the floor script.
async fn hot1_anchors(b: &mut Bench) -> Result<Vec<RunResult>> {
    Ok(vec![
        b.anchor_run("hot1", "anchor", PURCHASE, 1, 1, 1).await?,
        b.anchor_run("hot1", "anchor P16", PURCHASE, 16, 1, 1)
            .await?,
        b.anchor_run("hot1", "floor", anchor::Script::Floor, 1, 1, 1)
            .await?,
    ])
}

/// Every scenario the arguments ask for, once. The anchor runs first in
/// even repetitions and last in odd ones, so neither side always meets a
/// cold (or a warm) cluster.
pub async fn measure(b: &mut Bench) -> Result<(Vec<RunResult>, Vec<lockbench::LockResult>)> {
    let ops = b.args.ops;
    let anchor_first = b.rep % 2 == 0;
    let mut results = Vec::new();
    for sc in b.args.scenarios.clone() {
        match sc.as_str() {
            "hot1" => {
                if anchor_first {
                    results.extend(hot1_anchors(b).await?);
                }
                let st = b.sale("hot1", ops / 2, 1).await?;
                let e = b.engine.clone();
                let r = b
                    .engine_run("hot1", "engine", e.clone(), vec![st.sku.clone()], None, ops)
                    .await?;
                // Paced at 80 % and 10 % of the rate it sold at (the selling
                // phase): the answer rate would count cheap sold-out answers
                // too.
                let peak = r.throughput;
                results.push(r);
                // The same engine sending one purchase per call: what
                // batching gains, and (paced at 10 %) that it adds no latency
                // when the load is light.
                let st = b.sale("hot1-unbatched", ops / 2, 1).await?;
                let u = b.unbatched.clone();
                results.push(
                    b.engine_run(
                        "hot1",
                        UNBATCHED,
                        u.clone(),
                        vec![st.sku.clone()],
                        None,
                        ops,
                    )
                    .await?,
                );
                // Light load is 10 % of the lower of the two peaks, the
                // same rate for both: light for either engine.
                let light = peak.min(results.last().map_or(peak, |r| r.throughput)) * 0.1;
                for (label, engine, rate) in [
                    ("engine@80%", e.clone(), peak * 0.8),
                    ("engine@10%", e.clone(), light),
                    (UNBATCHED_10, u, light),
                ] {
                    let paced_ops = (rate * b.args.paced_seconds).max(100.0) as u64;
                    let name = format!("hot1-paced-{}", label.replace(['@', '%', ' ', '='], ""));
                    let st = b.sale(&name, paced_ops / 2, 1).await?;
                    results.push(
                        b.engine_run(
                            "hot1",
                            label,
                            engine,
                            vec![st.sku.clone()],
                            Some(rate),
                            paced_ops,
                        )
                        .await?,
                    );
                }
                results.push(b.hold_run().await?);
                // The durability knob: confirm only once a replica has the
                // order (needs replicas; without them every WAIT times out).
                if b.has_replicas {
                    let st = b.sale("hot1-replicated", ops / 2, 1).await?;
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
                if !anchor_first {
                    results.extend(hot1_anchors(b).await?);
                }
            }
            // hot1's engine row alone, then paced at 10 % of its rate: the
            // hot path's cost and its latency at light load, with nothing
            // that needs plain text (the anchor's redis-benchmark) or
            // replicas. bench/tls runs it on a TLS cluster and a plain one.
            "engine" => {
                let st = b.sale("engine", ops / 2, 1).await?;
                let e = b.engine.clone();
                let r = b
                    .engine_run("hot1", "engine", e.clone(), vec![st.sku.clone()], None, ops)
                    .await?;
                let rate = r.throughput * 0.1;
                results.push(r);
                let paced_ops = (rate * b.args.paced_seconds).max(100.0) as u64;
                let st = b.sale("engine-paced10", paced_ops / 2, 1).await?;
                results.push(
                    b.engine_run(
                        "hot1",
                        "engine@10%",
                        e,
                        vec![st.sku.clone()],
                        Some(rate),
                        paced_ops,
                    )
                    .await?,
                );
            }
            "hotB" => {
                let buckets = b.args.buckets;
                if anchor_first {
                    results.push(
                        b.anchor_run("hotB", "anchor", PURCHASE, 1, buckets, 1)
                            .await?,
                    );
                }
                let st = b.sale("hotB", ops / 2, buckets).await?;
                let e = b.engine.clone();
                results.push(
                    b.engine_run("hotB", "engine", e, vec![st.sku.clone()], None, ops)
                        .await?,
                );
                if !anchor_first {
                    results.push(
                        b.anchor_run("hotB", "anchor", PURCHASE, 1, buckets, 1)
                            .await?,
                    );
                }
            }
            "many" => {
                let n = b.args.skus.max(1);
                if anchor_first {
                    results.push(b.anchor_run("many", "anchor", PURCHASE, 1, 1, n).await?);
                }
                let mut skus = Vec::with_capacity(n);
                for (k, stock) in anchor::shares(ops / 2, n).into_iter().enumerate() {
                    skus.push(b.sale(&format!("many{k}"), stock.max(1), 1).await?.sku);
                }
                let e = b.engine.clone();
                results.push(b.engine_run("many", "engine", e, skus, None, ops).await?);
                if !anchor_first {
                    results.push(b.anchor_run("many", "anchor", PURCHASE, 1, 1, n).await?);
                }
            }
            "door" => results.extend(b.door_runs().await?),
            // After the orders rows, on a cleaned cluster (below).
            "http" => {}
            "refused" => results.push(b.refused_run().await?),
            "none" => {}
            other => {
                return Err(anyhow!(
                "unknown scenario {other:?} (hot1, hotB, many, door, http, refused, engine, none)"
            ))
            }
        }
    }
    if b.args.scenarios.iter().any(|s| s == "hot1") {
        // Last, on a cluster cleared of this repetition's sales (so the
        // writers drain only this row's orders), and after every other row
        // (so PostgreSQL's work after the bulk insert disturbs none).
        b.cleanup().await?;
        results.extend(b.orders_runs().await?);
    }
    if b.args.scenarios.iter().any(|s| s == "http") {
        // Its order writer drains every sale in the index: only its own
        // may be there.
        b.cleanup().await?;
        results.extend(b.http_run().await?);
    }
    let mut locks = Vec::new();
    if !b.args.no_lock_bench && !b.lock_nodes.is_empty() {
        let bar = b.bar(38, "lock benchmark".into());
        locks = lockbench::run_all(
            &b.lock_nodes,
            b.args.lock_pairs,
            b.args.lock_tasks,
            b.cap(),
            &bar,
        )
        .await?;
        let window = Duration::from_secs(b.args.lock_window_seconds.clamp(1, 60));
        locks.extend(lockbench::shared_client(&b.lock_nodes, window, &bar).await?);
        locks.extend(lockbench::cross_process(&b.lock_nodes, window, &bar).await?);
        bar.finish();
    }
    Ok((results, locks))
}
