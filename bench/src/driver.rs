//! The run driver: one [`Bench`] holds the connections and the sales it
//! made, runs each scenario's strategies in turn ([`measure`]), and deletes
//! everything it created afterwards. The figures are judged in `targets.rs`
//! and printed in `report.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Result};
use flashsale::{Engine, SaleSpec};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use redis::Value;

use crate::args::Args;
use crate::report::{Machine, RunResult};
use crate::strategies::{UNBATCHED, UNBATCHED_10};
use crate::{anchor, load, lockbench, strategies, targets};

/// A result row from the load generator's figures.
fn row(
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
        note,
    }
}

/// Holds of the `engine hold` row's burst, all due within about a second.
const BURST_HOLDS: u64 = 10_000;

/// A hold sweeper as `serve` runs it (every 100 ms), keeping each expired
/// hold's lag.
struct Sweeper {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(u64, Vec<u64>)>,
}

impl Sweeper {
    fn start(engine: &Engine) -> Sweeper {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (engine, flag) = (engine.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let (mut expired, mut lags) = (0u64, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                if let Ok(r) = engine.expire_due().await {
                    expired += r.expired;
                    lags.extend(r.lags_ms);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (expired, lags)
        });
        Sweeper { stop, task }
    }

    /// Stops it; holds expired and their lags (ms).
    async fn stop(self) -> (u64, Vec<u64>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// p50, p99 and max of `lags` (ms); zeros when empty.
fn lag_figures(lags: &[u64]) -> (u64, u64, u64) {
    let mut l = lags.to_vec();
    l.sort_unstable();
    let at = |q: f64| {
        l.get(((q * l.len() as f64) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    (at(0.5), at(0.99), l.last().copied().unwrap_or(0))
}

/// How long the `engine hold` row holds each order.
const HOLD_MS: u64 = 2000;

/// A snapshot of the cluster's servers around a row: per master (script
/// calls, µs of CPU the server process used), from `INFO commandstats` and
/// `INFO cpu`; and how many forks (AOF rewrites, RDB saves) every node,
/// replicas included, had made by then.
#[derive(Debug, Default)]
struct MasterTime {
    masters: std::collections::BTreeMap<String, (u64, u64)>,
    /// Per node that answered: forks it had started (`total_forks`: AOF
    /// rewrites, RDB saves, and the snapshots sent to resync a replica),
    /// and whether one runs now (taken before a row, a fork the row ran
    /// beside although it started earlier).
    forks: std::collections::BTreeMap<String, (u64, bool)>,
    /// Nodes of the slot map that did not answer.
    unanswered: usize,
    /// Script calls the masters failed or rejected (`failed_calls` and
    /// `rejected_calls` of EVALSHA and EVAL), summed.
    script_errors: u64,
}

/// Reads every master's script calls and CPU time, and every node's fork
/// count. CPU time, not the command statistics' usec: those count a
/// script's inner commands twice (in the script's usec and in their own),
/// and leave out what a call costs outside command execution (reading,
/// parsing, replying), which is what batching saves.
async fn master_time(
    engine: &Engine,
    conn: &mut redis::cluster_async::ClusterConnection,
) -> Result<MasterTime> {
    let mut out = MasterTime::default();
    let map = engine.slot_map().await?;
    for master in map.masters() {
        let Some((host, port)) = master.rsplit_once(':') else {
            continue;
        };
        let port: u16 = port.parse()?;
        let stats = info(conn, host, port, "commandstats").await?;
        let cpu = info(conn, host, port, "cpu").await?;
        let counts = commandstats(&stats);
        out.script_errors += counts.script_errors;
        out.masters.insert(master, (counts.scripts, cpu_us(&cpu)));
    }
    for node in all_nodes(&map) {
        // A node that cannot be reached (a replica being replaced) is
        // left out of the count, not a reason to abort the bench.
        let text = match node_connection(engine, &node).await {
            Ok(mut conn) => redis::cmd("INFO")
                .arg("persistence")
                .arg("stats")
                .query_async::<String>(&mut conn)
                .await
                .ok(),
            Err(_) => None,
        };
        match text {
            Some(text) => {
                let p = Persistence::of(&text);
                // Running means a child exists; scheduled alone is not a
                // fork yet (it shows in total_forks once it starts).
                out.forks.insert(node, (p.total_forks, p.forking));
            }
            None => out.unanswered += 1,
        }
    }
    Ok(out)
}

/// Every node of the cluster, masters and replicas, as `host:port`.
fn all_nodes(map: &flashsale::placement::SlotMap) -> Vec<String> {
    let mut nodes: Vec<String> = map
        .ranges
        .iter()
        .flat_map(|r| std::iter::once(&r.master).chain(&r.replicas))
        .cloned()
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// A connection of its own to the node at `host:port` (replicas are not on
/// the cluster connection), with the first seed node's credentials and
/// settings, and timeouts so that a node that hangs cannot hang the bench.
async fn node_connection(engine: &Engine, node: &str) -> Result<redis::aio::MultiplexedConnection> {
    use redis::IntoConnectionInfo;
    let (host, port) = node
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("node address {node:?} has no port"))?;
    let seed = engine
        .config()
        .cluster_nodes
        .first()
        .ok_or_else(|| anyhow!("no cluster node configured"))?;
    let info = seed
        .as_str()
        .into_connection_info()?
        .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port.parse()?));
    let client = redis::Client::open(info)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// What `INFO persistence` says of a node's forks and its AOF.
#[derive(Debug, Default, PartialEq)]
struct Persistence {
    /// A fork (AOF rewrite or RDB save) runs or is scheduled.
    busy: bool,
    /// A fork's child runs now.
    forking: bool,
    aof_enabled: bool,
    aof_current_size: u64,
    aof_base_size: u64,
    /// Forks started since the server started (`INFO stats`).
    total_forks: u64,
}

impl Persistence {
    fn of(text: &str) -> Persistence {
        let field = |k: &str| -> u64 {
            text.lines()
                .filter_map(|l| l.trim().split_once(':'))
                .find(|(name, _)| *name == k)
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Persistence {
            busy: field("aof_rewrite_in_progress") > 0
                || field("aof_rewrite_scheduled") > 0
                || field("rdb_bgsave_in_progress") > 0,
            forking: field("aof_rewrite_in_progress") > 0 || field("rdb_bgsave_in_progress") > 0,
            aof_enabled: field("aof_enabled") > 0,
            aof_current_size: field("aof_current_size"),
            aof_base_size: field("aof_base_size"),
            total_forks: field("total_forks"),
        }
    }

    /// True when a rewrite now is worth it: `headroom` more bytes of AOF
    /// would cross the automatic rewrite threshold
    /// (`auto-aof-rewrite-percentage` `pct` over the base size, and at
    /// least `min_size`; `pct` 0 turns it off), and the AOF has grown since
    /// its last rewrite. Without the second test a small dataset (base +
    /// headroom above `min_size` right after a rewrite) would be rewritten
    /// again and again, to no gain; with it, a small dataset is rewritten
    /// before each row that follows writes (cheap: it is small).
    fn rewrite_due_within(&self, headroom: u64, pct: u64, min_size: u64) -> bool {
        if !self.aof_enabled || pct == 0 {
            return false;
        }
        let threshold = min_size.max(self.aof_base_size + self.aof_base_size * pct / 100);
        self.aof_current_size + headroom >= threshold && self.aof_current_size > self.aof_base_size
    }
}

/// AOF most rows write (a hot1 row of 50,000 purchases: well under this);
/// the `orders drain` row's 100,000 orders and their reads, acks and trims
/// write more, and a fork it meets is counted in its row.
const ROW_AOF_HEADROOM: u64 = 64 << 20;

/// The value of `CONFIG GET name` on `conn`'s node, as a number (0 when
/// unreadable).
async fn config_number(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap_or_default();
    v.get(1).and_then(|x| x.parse().ok()).unwrap_or(0)
}

/// Makes sure no node forks during the next row: waits for any AOF rewrite
/// or RDB save under way to end, and rewrites now any AOF the row could
/// push over Redis's automatic rewrite threshold. A fork copies the whole
/// dataset while the row runs (copy-on-write faults slow the server, the
/// child takes a core) and made one row of a run twice as slow as the
/// next. Rows still count the forks that happened anyway
/// (`persistence_forks`). Gives up waiting after a minute per node.
async fn settle(engine: &Engine) -> Result<()> {
    let map = engine.slot_map().await?;
    for node in all_nodes(&map) {
        let Ok(mut conn) = node_connection(engine, &node).await else {
            eprintln!("settle: {node} cannot be reached; its forks are not waited for");
            continue;
        };
        let pct = config_number(&mut conn, "auto-aof-rewrite-percentage").await;
        let min_size = config_number(&mut conn, "auto-aof-rewrite-min-size").await;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut asked = false;
        while std::time::Instant::now() < deadline {
            let Ok(text) = redis::cmd("INFO")
                .arg("persistence")
                .query_async::<String>(&mut conn)
                .await
            else {
                eprintln!("settle: {node} did not answer INFO; its forks are not waited for");
                break;
            };
            let p = Persistence::of(&text);
            if p.busy {
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else if !asked && p.rewrite_due_within(ROW_AOF_HEADROOM, pct, min_size) {
                let _: redis::RedisResult<String> =
                    redis::cmd("BGREWRITEAOF").query_async(&mut conn).await;
                asked = true;
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else {
                break;
            }
        }
        if std::time::Instant::now() >= deadline {
            eprintln!("settle: {node} still forking after a minute; the row may meet it");
        }
    }
    Ok(())
}

/// `INFO <section>` of the node at `host:port`, as text.
async fn info(
    conn: &mut redis::cluster_async::ClusterConnection,
    host: &str,
    port: u16,
    section: &str,
) -> Result<String> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let v = conn
        .route_command(
            redis::cmd("INFO").arg(section).clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            }),
        )
        .await?;
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Value::VerbatimString { text, .. } => Ok(text),
        Value::SimpleString(s) => Ok(s),
        other => Err(anyhow!("INFO {section} of {host}:{port}: {other:?}")),
    }
}

/// µs of CPU (system + user) of the server process from `INFO cpu`; not
/// its children's: those are its forks (AOF rewrites, RDB saves), whose
/// cost is the dataset's size, not the row's requests.
fn cpu_us(text: &str) -> u64 {
    let secs: f64 = text
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| matches!(*k, "used_cpu_sys" | "used_cpu_user"))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum();
    (secs * 1e6).round() as u64
}

/// (script calls, usec of every command but INFO) from `INFO commandstats`.
/// What `INFO commandstats` of one node says.
#[derive(Debug, PartialEq, Eq)]
struct CommandStats {
    /// Script calls (EVALSHA and EVAL).
    scripts: u64,
    /// Microseconds in every command but INFO.
    usec: u64,
    /// Script calls failed (an error reply) or rejected (before running).
    script_errors: u64,
}

fn commandstats(text: &str) -> CommandStats {
    let (mut scripts, mut usec, mut script_errors) = (0u64, 0u64, 0u64);
    for line in text.lines() {
        let Some((name, rest)) = line.trim().split_once(':') else {
            continue;
        };
        let field = |k: &str| -> u64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        if name == "cmdstat_info" || !name.starts_with("cmdstat_") {
            continue;
        }
        usec += field("usec=");
        if matches!(name, "cmdstat_evalsha" | "cmdstat_eval") {
            // `calls=` and not `rejected_calls=`/`failed_calls=`: each
            // key is matched at the start of its own pair.
            scripts += field("calls=");
            script_errors += field("rejected_calls=") + field("failed_calls=");
        }
    }
    CommandStats {
        scripts,
        usec,
        script_errors,
    }
}

/// Fills the master-time figures of `row` from snapshots before and after.
/// The ceiling counts requests: each master's share of the row's requests
/// (its share of the script calls; a batch counts as many requests as an
/// average call of the row carried) over the master time it spent.
/// Forks the row ran beside: started during it, or running when it began.
/// None when a node did not answer either time, or restarted (its count
/// went down): its forks are then unknown, not zero.
fn row_forks(before: &MasterTime, after: &MasterTime) -> Option<u64> {
    if before.unanswered + after.unanswered > 0 || before.forks.len() != after.forks.len() {
        return None;
    }
    let mut forks = 0;
    for (node, &(total, running)) in &before.forks {
        let &(later, _) = after.forks.get(node)?;
        forks += later.checked_sub(total)? + u64::from(running);
    }
    Some(forks)
}

/// The note's words for the forks during a row ("" for none).
fn disturbed(forks: Option<u64>) -> String {
    match forks {
        Some(0) => String::new(),
        Some(n) => format!(
            "; disturbed: {n} fork(s) (AOF rewrite, RDB save) on the cluster during the row"
        ),
        None => "; forks during the row unknown: a node did not answer or restarted".into(),
    }
}

/// Forks during the row go into `persistence_forks` and the note.
fn with_master_time(mut row: RunResult, before: &MasterTime, after: &MasterTime) -> RunResult {
    let forks = row_forks(before, after);
    row.persistence_forks = forks;
    row.note.push_str(&disturbed(forks));
    let deltas: Vec<(u64, u64)> = after
        .masters
        .iter()
        .map(|(m, (calls, us))| {
            let (c0, u0) = before.masters.get(m).copied().unwrap_or((0, 0));
            (calls.saturating_sub(c0), us.saturating_sub(u0))
        })
        .collect();
    let all_calls: u64 = deltas.iter().map(|d| d.0).sum();
    let usec: u64 = deltas.iter().map(|d| d.1).sum();
    let mut ceiling = 0.0;
    for &(dc, du) in &deltas {
        if dc > 0 && du > 0 {
            let requests = row.ops as f64 * dc as f64 / all_calls as f64;
            ceiling += 1e6 * requests / du as f64;
        }
    }
    row.redis_us_per_op = Some(usec as f64 / row.ops.max(1) as f64);
    row.master_us_per_confirmed = (row.confirmed > 0).then(|| usec as f64 / row.confirmed as f64);
    row.projected_ceiling = (ceiling > 0.0).then_some(ceiling);
    row
}

/// CPU time this process has used (user + system, every thread), µs.
fn process_cpu_us() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// A `door` row counts checks, allowed or not: its throughput is answers/s.
fn checks_row(mut r: RunResult) -> RunResult {
    r.throughput = r.answers_per_s;
    r.repetitions = vec![r.throughput];
    r.throughput_min = r.throughput;
    r.throughput_max = r.throughput;
    r
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

    /// [`settle`], unless the row in hand settled already: the `orders`
    /// rows settle before their writers start and their clock runs, and
    /// their selling phase must not wait for a fork inside that clock.
    async fn settle(&mut self) -> Result<()> {
        if std::mem::take(&mut self.settled_for_next_row) {
            return Ok(());
        }
        settle(&self.engine).await
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
    /// about ops / 2: half the buyers go home empty, and any oversell
    /// shows).
    async fn engine_run(
        &mut self,
        scenario: &str,
        label: &str,
        engine: Engine,
        skus: Vec<String>,
        rate: Option<f64>,
        ops: u64,
    ) -> Result<RunResult> {
        let (engine, skus_arc, run): (Engine, Arc<Vec<String>>, Arc<str>) = (
            engine,
            Arc::new(skus.clone()),
            // User ids allow no spaces: "engine ack=replicated" -> "engine_ack=replicated".
            format!("{}-{scenario}-{}", self.run, label.replace(' ', "_")).into(),
        );
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let cpu_before = process_cpu_us();
        let batches_before = engine.stats().purchase_batch_sizes.snapshot();
        let fallthroughs_before = engine.stats().fallthroughs.load(Ordering::Relaxed);
        let batch_sizes = engine.clone();
        let stats = self
            .load(format!("{scenario} {label}"), ops, rate, move |i| {
                strategies::engine_op(engine.clone(), skus_arc.clone(), run.clone(), i)
            })
            .await;
        let client_us = process_cpu_us().saturating_sub(cpu_before);
        let after = master_time(&self.engine, &mut self.conn).await?;
        let fallthroughs = batch_sizes
            .stats()
            .fallthroughs
            .load(Ordering::Relaxed)
            .saturating_sub(fallthroughs_before);
        let batches: Vec<u64> = batch_sizes
            .stats()
            .purchase_batch_sizes
            .snapshot()
            .iter()
            .zip(&batches_before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let mut sold = 0u64;
        let mut below_zero = 0u64;
        let mut stock = 0u64;
        // Orders ever queued (entries-added, which an order writer's trims
        // cannot lower): each purchase here is one unit and one entry, so a
        // unit taken without its order, or an order without its unit,
        // shows as the anchor's row shows it.
        let mut queued = 0u64;
        for sku in &skus {
            let st = self.engine.sale_status(sku).await?;
            stock += st.initial;
            sold += st.initial - st.remaining;
            for b in &st.buckets {
                below_zero += b.remaining.min(0).unsigned_abs();
                queued += flashsale::orders::stream_info(&mut self.conn, &b.stream)
                    .await
                    .entries_added;
            }
        }
        let oversold = stats.confirmed.saturating_sub(stock)
            + below_zero
            + stats.confirmed.abs_diff(sold)
            + queued.abs_diff(sold);
        let mut r = with_master_time(
            row(
                scenario,
                label,
                self.args.concurrency,
                &stats,
                stock,
                oversold,
                match rate {
                    Some(r) => format!(
                        "paced at {r:.0}/s, latency from when each was due; {fallthroughs} fall-throughs"
                    ),
                    None => format!("stock = ops / 2; {fallthroughs} fall-throughs"),
                },
            ),
            &before,
            &after,
        );
        r.batch_p50 = targets::size_at(&batches, 0.5);
        r.batch_p99 = targets::size_at(&batches, 0.99);
        r.client_us_per_confirmed =
            (r.confirmed > 0).then(|| client_us as f64 / r.confirmed as f64);
        Ok(r)
    }

    /// redis-benchmark EVALSHA of `script` on `skus` sales of `buckets`
    /// buckets, stock ops / 2 in all: one process per bucket, requests and
    /// clients split evenly (as the engine's placement spreads buyers), then
    /// judged by the stock and streams it left behind.
    async fn anchor_run(
        &mut self,
        scenario: &str,
        strategy: &str,
        script: anchor::Script,
        pipeline: usize,
        buckets: u32,
        skus: usize,
    ) -> Result<RunResult> {
        let ops = self.args.ops;
        let skus = skus.max(1);
        let mut sales = Vec::with_capacity(skus);
        for (k, stock) in anchor::shares(ops / 2, skus).into_iter().enumerate() {
            let name = format!("{scenario}-{strategy}-{k}").replace(' ', "_");
            sales.push(self.sale(&name, stock.max(1), buckets).await?);
        }
        let buckets: Vec<&flashsale::BucketStatus> =
            sales.iter().flat_map(|s| s.buckets.iter()).collect();
        // Weighted as the engine's run of this scenario spreads its buyers:
        // over SKUs evenly (buyer i takes SKU i % n), over the buckets of one
        // SKU by each buyer's home bucket (CRC16 of the user id).
        let weights: Vec<u64> = if skus == 1 && buckets.len() > 1 {
            let mut w = vec![0u64; buckets.len()];
            for i in 0..ops {
                let user = format!("{}-{scenario}-engine-u{i}", self.run);
                w[usize::from(flashsale::placement::tag_slot(&user)) % buckets.len()] += 1;
            }
            w
        } else {
            vec![1; buckets.len()]
        };
        // One connection per bucket when pipelined; else the clients split.
        let clients = if pipeline > 1 {
            vec![1; buckets.len()]
        } else {
            anchor::weighted(self.args.concurrency as u64, &weights)
        };
        let requests = anchor::weighted(ops, &weights);
        let targets: Vec<anchor::Target> = buckets
            .iter()
            .zip(clients.iter().zip(&requests))
            .map(|(b, (&c, &r))| anchor::Target {
                master: b.master.clone(),
                tag: b.tag.clone(),
                clients: c as usize,
                requests: r,
            })
            .collect();
        let bar = self.bar(1, format!("{scenario} {strategy} (redis-benchmark)"));
        let sha = match script {
            anchor::Script::Purchase => flashsale::scripts::Scripts::new().purchase.sha,
            anchor::Script::Floor => self.load_on_masters(anchor::FLOOR_LUA).await?,
        };
        // When the last unit went: polled from the stock keys, since
        // redis-benchmark shows nothing until it exits.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let poller = {
            let keys: Vec<String> = buckets.iter().map(|b| b.key.clone()).collect();
            let mut conn = self.engine.dedicated_connection().await?;
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut empty = true;
                    for k in &keys {
                        let v: Option<i64> = redis::cmd("GET")
                            .arg(k)
                            .query_async(&mut conn)
                            .await
                            .unwrap_or(Some(1));
                        if v.unwrap_or(0) > 0 {
                            empty = false;
                            break;
                        }
                    }
                    if empty {
                        return Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                None
            })
        };
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let a = anchor::run(&targets, script, &sha, pipeline).await;
        let after = master_time(&self.engine, &mut self.conn).await?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sold_out_at = poller.await.ok().flatten();
        let a = a?;
        bar.inc(1);
        bar.finish();
        // What it left behind: units sold, orders ever added to the streams
        // (entries-added, which trimming by an order writer cannot lower).
        let (mut stock, mut left, mut below_zero, mut queued) = (0u64, 0u64, 0u64, 0u64);
        for sale in &sales {
            let st = self.engine.sale_status(&sale.sku).await?;
            stock += st.initial;
            left += st.remaining;
            for b in &st.buckets {
                below_zero += b.remaining.min(0).unsigned_abs();
                queued += flashsale::orders::stream_info(&mut self.conn, &b.stream)
                    .await
                    .entries_added;
            }
        }
        let sold = stock - left;
        if script == anchor::Script::Floor {
            // The floor queues no orders: what it took is what it sold.
            queued = sold;
        }
        let oversold = queued.saturating_sub(stock) + below_zero + queued.abs_diff(sold);
        // Measured, never assumed: the script calls the masters failed or
        // rejected; and with stock left over, every request that did not
        // queue an order (a sold-out answer was impossible), which also
        // counts the requests that never reached a master.
        let failed = after.script_errors.saturating_sub(before.script_errors);
        let errors = if left > 0 {
            a.requests.saturating_sub(queued).max(failed)
        } else {
            failed
        };
        let selling = sold_out_at
            .map(|t| t.saturating_duration_since(a.spawned))
            .filter(|d| !d.is_zero())
            .unwrap_or(a.elapsed);
        let secs = a.elapsed.as_secs_f64().max(1e-9);
        let throughput = queued as f64 / selling.as_secs_f64().max(1e-9);
        let pct = |q: f64| a.latency_us.value_at_quantile(q) as f64 / 1000.0;
        let connections: u64 = targets.iter().map(|t| t.clients as u64).sum();
        let result = RunResult {
            scenario: scenario.into(),
            strategy: strategy.into(),
            ops: a.requests,
            concurrency: connections as usize * pipeline.max(1),
            throughput,
            repetitions: vec![throughput],
            throughput_min: throughput,
            throughput_max: throughput,
            answers_per_s: a.requests as f64 / secs,
            stock,
            redis_us_per_op: None,
            master_us_per_confirmed: None,
            client_us_per_confirmed: None,
            projected_ceiling: None,
            batch_p50: None,
            batch_p99: None,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            p999_ms: Some(pct(0.999)),
            confirmed: queued,
            oversold,
            errors,
            ratio_to_anchor: None,
            expiry_lag_p99_ms: None,
            persistence_forks: None,
            engine_per_s: None,
            note: format!(
                "redis-benchmark EVALSHA {}, {} bucket(s), {connections} connection(s) x {} in flight; checked against stock{}",
                match script {
                    anchor::Script::Purchase => "purchase.lua",
                    anchor::Script::Floor => "of GET/compare/DECRBY (the floor)",
                },
                targets.len(),
                pipeline.max(1),
                match script {
                    anchor::Script::Purchase => " and streams",
                    anchor::Script::Floor => "",
                },
            ),
        };
        Ok(with_master_time(result, &before, &after))
    }

    /// The `orders` rows, both on a hot1 sale of their own with the order
    /// writers (two, the default):
    /// - `orders`: the writers drain from the start while the engine sells
    ///   (both share the machine). Throughput is orders written per second,
    ///   from the first purchase until PostgreSQL holds every order the run
    ///   confirmed; the note gives the backlog's peak (the stream's length,
    ///   sampled every 10 ms; entries leave it once written and
    ///   acknowledged) and the engine's own selling rate in that run.
    /// - `orders drain`: the engine sells the whole stock first with no
    ///   writer running, then the writers start and drain the backlog alone.
    ///   Throughput is orders written per second of that drain, from the
    ///   writers' start (their connections and first look at the sales
    ///   included): the writers' own peak rate, on the same machine, as
    ///   `engine` is the engine's own. Its backlog is four times the other
    ///   rows' (`--ops` x 2 orders), so the start is a small part of it.
    ///
    /// Runs after the repetition's other sales were cleared, so the writers
    /// see no other bench sale. Empty when PostgreSQL cannot be reached (the
    /// rows need it).
    async fn orders_runs(&mut self) -> Result<Vec<RunResult>> {
        let mut rows = Vec::new();
        for (label, live) in [("orders", true), ("orders drain", false)] {
            rows.extend(self.orders_run(label, live).await?);
        }
        Ok(rows)
    }

    /// One `orders` row (see [`Bench::orders_runs`]): `live`, the writers
    /// run while the engine sells; else they start once it has sold out.
    async fn orders_run(&mut self, label: &str, live: bool) -> Result<Option<RunResult>> {
        let pool = match flashsale::db::pool(&self.postgres_url, 8) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{label} row skipped: {e}");
                return Ok(None);
            }
        };
        if let Err(e) = flashsale::db::migrate(&pool).await {
            eprintln!("{label} row skipped: PostgreSQL: {e}");
            return Ok(None);
        }
        let pool = &pool;
        // Any fork the row could meet happens now, before the clock runs;
        // the selling phase inside the clock does not settle again.
        self.settle().await?;
        self.settled_for_next_row = true;
        let forks_before = master_time(&self.engine, &mut self.conn).await?;
        let ops = if live {
            self.args.ops
        } else {
            self.args.ops * 4
        };
        let st = self
            .sale(&format!("hot1-{}", label.replace(' ', "-")), ops / 2, 1)
            .await?;
        let mut writers = None;
        if live {
            writers = Some(
                self.engine
                    .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
                    .await?,
            );
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let mut conn = self.engine.dedicated_connection().await?;
            let (stream, stop) = (st.buckets[0].stream.clone(), stop.clone());
            tokio::spawn(async move {
                let mut peak = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let len: u64 = redis::cmd("XLEN")
                        .arg(&stream)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(0);
                    peak = peak.max(len);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                peak
            })
        };
        let mut started = std::time::Instant::now();
        let e = self.engine.clone();
        let sold = self
            .engine_run("hot1", label, e, vec![st.sku.clone()], None, ops)
            .await?;
        let confirmed = sold.confirmed;
        if writers.is_none() {
            // The whole backlog is in the stream: the drain starts now.
            started = std::time::Instant::now();
            writers = Some(
                self.engine
                    .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
                    .await?,
            );
        }
        // The writers' own count of rows inserted says when they are done,
        // checked against PostgreSQL: their count takes in every sale they
        // drain (a sale left by another run would end the wait early), and
        // a COMMIT whose answer was lost is counted by nobody (the wait
        // would run to the cap). So PostgreSQL is asked when the count says
        // done, and every half second as a backstop; asking it every few
        // ms would cost it more than the writers' inserts do.
        let deadline = started + self.cap();
        let inserted =
            |w: &Option<flashsale::WriterHandle>| w.as_ref().map_or(0, |w| w.progress().written);
        let mut trust_count = true;
        let mut next_ask = std::time::Instant::now() + Duration::from_millis(500);
        let mut timed_out = false;
        let drained;
        loop {
            let now = std::time::Instant::now();
            if now >= deadline {
                timed_out = true;
                drained = started.elapsed();
                break;
            }
            let says_done = trust_count && inserted(&writers) >= confirmed;
            if says_done || now >= next_ask {
                // Done when the count says so or, found by the backstop,
                // when it was asked: the query itself is not timed.
                let seen = started.elapsed();
                if order_rows(pool, &st.sku).await? >= confirmed {
                    drained = seen;
                    break;
                }
                trust_count &= !says_done;
                next_ask = now + Duration::from_millis(500);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let peak = sampler.await.unwrap_or(0);
        let report = match writers {
            Some(w) => w.shutdown().await?,
            None => flashsale::WriterReport::default(),
        };
        let forks = row_forks(
            &forks_before,
            &master_time(&self.engine, &mut self.conn).await?,
        );
        let (written, distinct) = order_counts(pool, &st.sku).await?;
        let _ = flashsale::db::client(pool)
            .await?
            .execute("DELETE FROM orders WHERE sku = $1", &[&st.sku])
            .await;
        let rate = written as f64 / drained.as_secs_f64().max(1e-9);
        let errors = orders_errors(sold.errors, confirmed, written, distinct);
        let mut note = if live {
            format!(
                "orders into PostgreSQL per second, 2 writers draining while the engine sells, \
                 from the first purchase until all {written} were written; backlog peak {peak}; \
                 the engine sold at {:.0}/s in the same run",
                sold.throughput
            )
        } else {
            format!(
                "orders into PostgreSQL per second, 2 writers draining a backlog of {peak} \
                 the engine had sold alone (at {:.0}/s), from the writers' start until all \
                 {written} were written",
                sold.throughput
            )
        };
        note.push_str(&format!(
            "; batches held for a replica {}; latency and batch columns are the selling phase's",
            report.held_unreplicated
        ));
        note.push_str(&disturbed(forks));
        if timed_out {
            note.push_str(&format!(
                "; timed out after {} s with {written} of {confirmed} written",
                self.cap().as_secs()
            ));
        }
        Ok(Some(RunResult {
            strategy: label.into(),
            throughput: rate,
            repetitions: vec![rate],
            throughput_min: rate,
            throughput_max: rate,
            answers_per_s: rate,
            confirmed: written,
            errors,
            // Per purchase, not per order written: left out.
            redis_us_per_op: None,
            master_us_per_confirmed: None,
            client_us_per_confirmed: None,
            projected_ceiling: None,
            engine_per_s: Some(sold.throughput),
            persistence_forks: forks,
            note,
            ..sold
        }))
    }

    /// The `engine hold` row, in two parts. Under load: a hot1 sale with
    /// holds (`HOLD_MS`), each buyer with an even index paying at once and
    /// the others never, while a sweeper expires due holds every 100 ms
    /// (serve's default); throughput is purchases per second (a payment is
    /// part of its buyer's op). Then a burst: `BURST_HOLDS` holds made as
    /// fast as the engine sells and never paid, so they all fall due within
    /// about the same second. The note gives the lag from each hold's
    /// deadline to its units back on sale for both; `expiry_lag_p99_ms` is
    /// the larger p99.
    async fn hold_run(&mut self) -> Result<RunResult> {
        let ops = self.args.ops;
        let sku = self.hold_sale("hot1-hold", ops / 2).await?;
        let sweeper = Sweeper::start(&self.engine);
        let (engine, sku_arc, run): (Engine, Arc<str>, Arc<str>) = (
            self.engine.clone(),
            sku.as_str().into(),
            format!("{}-hold", self.run).into(),
        );
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let cpu_before = process_cpu_us();
        let batches_before = self.engine.stats().purchase_batch_sizes.snapshot();
        let (paid, pay_errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counters = (paid.clone(), pay_errors.clone());
        let stats = self
            .load("hot1 engine hold".into(), ops, None, move |i| {
                strategies::hold_op(
                    engine.clone(),
                    sku_arc.clone(),
                    run.clone(),
                    i,
                    counters.0.clone(),
                    counters.1.clone(),
                )
            })
            .await;
        let (paid, pay_errors) = (
            paid.load(Ordering::Relaxed),
            pay_errors.load(Ordering::Relaxed),
        );
        let client_us = process_cpu_us().saturating_sub(cpu_before);
        let after = master_time(&self.engine, &mut self.conn).await?;
        let batches: Vec<u64> = self
            .engine
            .stats()
            .purchase_batch_sizes
            .snapshot()
            .iter()
            .zip(&batches_before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let load_done = self.wait_no_holds(&sku).await?;
        let (_, load_lags) = sweeper.stop().await;
        // Every confirmed purchase not paid expired (its units came back,
        // and may have been sold again).
        let expired = stats.confirmed.saturating_sub(paid);
        let st = self.engine.sale_status(&sku).await?;
        let below_zero: u64 = st
            .buckets
            .iter()
            .map(|b| b.remaining.min(0).unsigned_abs())
            .sum();

        // The burst: every hold due within about a second.
        // As many as the run's ops allow (a smoke run is small).
        let burst_n = BURST_HOLDS.min(ops.max(100));
        let burst_sku = self.hold_sale("hot1-hold-burst", burst_n).await?;
        let (engine, sku_arc, run): (Engine, Arc<str>, Arc<str>) = (
            self.engine.clone(),
            burst_sku.as_str().into(),
            format!("{}-burst", self.run).into(),
        );
        let made = std::time::Instant::now();
        let never = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let burst = self
            .load("hot1 hold burst".into(), burst_n, None, move |i| {
                // Odd buyers never pay.
                strategies::hold_op(
                    engine.clone(),
                    sku_arc.clone(),
                    run.clone(),
                    2 * i + 1,
                    never.0.clone(),
                    never.1.clone(),
                )
            })
            .await;
        let making = made.elapsed();
        let sweeper = Sweeper::start(&self.engine);
        let burst_done = self.wait_no_holds(&burst_sku).await?;
        let (burst_expired, burst_lags) = sweeper.stop().await;

        let (lp50, lp99, lmax) = lag_figures(&load_lags);
        let (bp50, bp99, bmax) = lag_figures(&burst_lags);
        let mut r = row(
            "hot1",
            "engine hold",
            self.args.concurrency,
            &stats,
            ops / 2,
            // Once every hold ended, the units out are exactly the paid
            // orders: more is an oversell (fewer, units lost: an error).
            (ops / 2).saturating_sub(st.remaining).saturating_sub(paid) + below_zero,
            format!(
                "hold_ms {HOLD_MS}, half the buyers pay at once (inside their op), {expired} holds expired, lag p50 {lp50} / p99 {lp99} / max {lmax} ms; burst: {} holds made in {:.2} s, {burst_expired} expired, lag p50 {bp50} / p99 {bp99} / max {bmax} ms (sweeper every 100 ms)",
                burst.confirmed,
                making.as_secs_f64()
            ),
        );
        r.expiry_lag_p99_ms = Some(lp99.max(bp99) as f64);
        r.errors += pay_errors
            + paid.saturating_sub((ops / 2).saturating_sub(st.remaining))
            + burst.errors
            + burst.confirmed.abs_diff(burst_expired)
            // A hold still held at the cap: its lag is missing from the figures.
            + u64::from(!load_done)
            + u64::from(!burst_done);
        r.batch_p50 = targets::size_at(&batches, 0.5);
        r.batch_p99 = targets::size_at(&batches, 0.99);
        // CPU of the selling phase (payments included), per purchase.
        r.client_us_per_confirmed =
            (r.confirmed > 0).then(|| client_us as f64 / r.confirmed as f64);
        Ok(with_master_time(r, &before, &after))
    }

    /// A sale of `stock` units with holds of `HOLD_MS`; its SKU.
    async fn hold_sale(&mut self, name: &str, stock: u64) -> Result<String> {
        let sku = format!("bench-{}-{name}", self.run);
        self.engine
            .create_sale(SaleSpec {
                hold_ms: HOLD_MS,
                ..SaleSpec::new(&sku, stock)
            })
            .await?;
        self.created.push(sku.clone());
        Ok(sku)
    }

    /// Waits (at most the cap plus a hold) until no order of `sku` is held;
    /// false when some still were at the end.
    async fn wait_no_holds(&mut self, sku: &str) -> Result<bool> {
        let deadline = std::time::Instant::now() + self.cap() + Duration::from_millis(HOLD_MS);
        let st = self.engine.sale_status(sku).await?;
        loop {
            let mut held = 0u64;
            for b in &st.buckets {
                held += redis::cmd("ZCARD")
                    .arg(flashsale::keys::BucketKeys::new(&b.tag).holds)
                    .query_async::<u64>(&mut self.conn)
                    .await?;
            }
            if held == 0 {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Loads `code` on every master; returns its SHA.
    async fn load_on_masters(&mut self, code: &str) -> Result<String> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        self.conn
            .route_command(
                redis::cmd("SCRIPT").arg("LOAD").arg(code).clone(),
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                )),
            )
            .await?;
        Ok(redis::Script::new(code).get_hash().to_owned())
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
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let stats = self
            .load("hot1 naive (GET, DECR)".into(), ops, None, move |_| {
                strategies::naive_op(conn.clone(), k.clone())
            })
            .await;
        let after = master_time(&self.engine, &mut self.conn).await?;
        let left: i64 = redis::cmd("GET")
            .arg(&*key)
            .query_async(&mut self.conn)
            .await?;
        Ok(with_master_time(
            row(
                "hot1",
                "naive",
                self.args.concurrency,
                &stats,
                stock,
                stats.confirmed.saturating_sub(stock),
                format!("stock {stock}, left {left} (below zero = oversold)"),
            ),
            &before,
            &after,
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
        let mut out = vec![checks_row(row(
            "door",
            "in-process limiter",
            self.args.concurrency,
            &stats,
            0,
            0,
            "token bucket per user, no I/O".into(),
        ))];

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
        out.push(checks_row(row(
            "door",
            "redis rate_limit.lua",
            self.args.concurrency,
            &stats,
            0,
            0,
            "fixed window, one EVALSHA per check".into(),
        )));
        Ok(out)
    }

    async fn lock_run(&mut self) -> Result<Option<RunResult>> {
        if self.lock_nodes.is_empty() {
            return Ok(None);
        }
        let ops = self.args.lock_ops;
        let stock = ops / 2;
        let key = self.plain_stock("lock", stock).await?;
        // The seeds' pattern: a plain SET NX PX lock on one Redis, not
        // flashsale's own lock (which would measure its fencing and FIFO
        // gate instead of the pattern).
        let node = redis::Client::open(self.lock_nodes[0].as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let conn = self.conn.clone();
        let k = key.clone();
        let stats = self
            .load(
                "hot1 lock (SET NX PX,GET,DECR)".into(),
                ops,
                None,
                move |i| strategies::lock_op(node.clone(), conn.clone(), k.clone(), i),
            )
            .await;
        let left: i64 = redis::cmd("GET")
            .arg(&*key)
            .query_async(&mut self.conn)
            .await?;
        let sold = (stock as i64 - left).max(0) as u64;
        let oversold = left.min(0).unsigned_abs() + stats.confirmed.abs_diff(sold);
        Ok(Some(row(
            "hot1",
            "lock",
            self.args.concurrency,
            &stats,
            stock,
            oversold,
            format!(
                "SET NX PX lock on {}, GET, DECR, compare-and-delete",
                flashsale::redact::host_port(&self.lock_nodes[0])
            ),
        )))
    }

    /// Deletes every sale and key this run created, and takes the sales out
    /// of the index, so reconcile and the order writer never see them.
    pub async fn cleanup(&mut self) -> Result<()> {
        for sku in std::mem::take(&mut self.created) {
            if let Ok(st) = self.engine.sale_status(&sku).await {
                for b in &st.buckets {
                    let keys = flashsale::keys::BucketKeys::new(&b.tag);
                    let _: i64 = redis::cmd("DEL")
                        .arg(&b.key)
                        .arg(&b.stream)
                        .arg(&keys.sale)
                        .arg(&keys.pending)
                        .arg(&keys.holds)
                        .arg(&keys.owed)
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

/// Rows of `sku` in PostgreSQL's orders (the cheap count, asked while the
/// clock runs).
async fn order_rows(pool: &flashsale::db::Pool, sku: &str) -> Result<u64> {
    let n: i64 = flashsale::db::client(pool)
        .await?
        .query_one("SELECT COUNT(*) FROM orders WHERE sku = $1", &[&sku])
        .await?
        .get(0);
    Ok(n.max(0) as u64)
}

/// (rows, distinct buyers) of `sku` in PostgreSQL's orders; each bench
/// buyer buys once, so the two differ only by duplicates.
async fn order_counts(pool: &flashsale::db::Pool, sku: &str) -> Result<(u64, u64)> {
    let row = flashsale::db::client(pool)
        .await?
        .query_one(
            "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM orders WHERE sku = $1",
            &[&sku],
        )
        .await?;
    let (n, d): (i64, i64) = (row.get(0), row.get(1));
    Ok((n.max(0) as u64, d.max(0) as u64))
}

/// Errors of an `orders` row: the selling phase's, every confirmed buyer
/// with no order in PostgreSQL, every order written more than once (rows
/// beyond the distinct buyers) and every buyer with an order beyond those
/// confirmed. Each wrong row counts once.
fn orders_errors(selling: u64, confirmed: u64, written: u64, distinct: u64) -> u64 {
    selling
        + confirmed.saturating_sub(distinct)
        + written.saturating_sub(distinct)
        + distinct.saturating_sub(confirmed)
}

const PURCHASE: anchor::Script = anchor::Script::Purchase;

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
            "none" => {}
            other => {
                return Err(anyhow!(
                    "unknown scenario {other:?} (hot1, hotB, many, none)"
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

#[cfg(test)]
mod tests {
    use super::{
        commandstats, cpu_us, orders_errors, row_forks, CommandStats, MasterTime, Persistence,
    };

    #[test]
    fn cpu_time_adds_system_and_user_seconds() {
        let text = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:0.000000\r\nused_cpu_user_children:0.000000\r\nused_cpu_sys_main_thread:1.400000\r\n";
        assert_eq!(cpu_us(text), 1_750_000);
        assert_eq!(cpu_us(""), 0);
    }

    #[test]
    fn a_fork_rewriting_the_aof_is_not_charged_to_the_rows_requests() {
        let text = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:3.000000\r\nused_cpu_user_children:4.000000\r\n";
        assert_eq!(cpu_us(text), 1_750_000);
    }

    #[test]
    fn a_node_that_does_not_answer_makes_the_forks_unknown_not_zero() {
        let snap = |nodes: &[(&str, u64, bool)], unanswered| MasterTime {
            masters: Default::default(),
            forks: nodes
                .iter()
                .map(|(n, t, r)| (n.to_string(), (*t, *r)))
                .collect(),
            unanswered,
            script_errors: 0,
        };
        let a = snap(&[("a:1", 5, false), ("b:2", 7, true)], 0);
        // One fork started on a, and the one running on b when it began.
        assert_eq!(
            row_forks(&a, &snap(&[("a:1", 6, false), ("b:2", 7, false)], 0)),
            Some(2)
        );
        // b did not answer at the end: unknown, not a phantom or a zero.
        assert_eq!(row_forks(&a, &snap(&[("a:1", 6, false)], 1)), None);
        // b restarted (its count went down): unknown.
        assert_eq!(
            row_forks(&a, &snap(&[("a:1", 5, false), ("b:2", 0, false)], 0)),
            None
        );
    }

    #[test]
    fn an_order_written_twice_is_an_error_of_the_orders_row() {
        // 100 confirmed, 101 rows for 100 buyers: one duplicate.
        assert_eq!(orders_errors(0, 100, 101, 100), 1);
        // 100 confirmed, 100 rows for 99 buyers: one missing, one twice.
        assert_eq!(orders_errors(0, 100, 100, 99), 2);
        // An order for a buyer never confirmed.
        assert_eq!(orders_errors(0, 100, 101, 101), 1);
        // One missing, none duplicated.
        assert_eq!(orders_errors(0, 100, 99, 99), 1);
        // The selling phase's own errors are the row's too.
        assert_eq!(orders_errors(3, 100, 100, 100), 3);
        assert_eq!(orders_errors(0, 100, 100, 100), 0);
    }

    #[test]
    fn a_rewrite_is_due_when_the_next_row_could_cross_the_threshold() {
        let text = "# Persistence\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\naof_rewrite_scheduled:0\r\nrdb_bgsave_in_progress:0\r\naof_rewrites:4\r\nrdb_saves:1\r\naof_current_size:40000000\r\naof_base_size:10000000\r\n# Stats\r\ntotal_forks:6\r\n";
        let p = Persistence::of(text);
        assert!(!p.busy);
        // Every fork, the snapshots sent to a replica's resync included.
        assert_eq!(p.total_forks, 6);
        let mb = 1 << 20;
        // Threshold max(64 MB, 2 x 10 MB) = 64 MB: 40 MB + 64 MB crosses it,
        // and 30 MB of it came since the last rewrite.
        assert!(p.rewrite_due_within(64 * mb, 100, 64 * mb));
        assert!(!p.rewrite_due_within(10 * mb, 100, 64 * mb));
        // Base 40 MB, 55 MB now: a row writing 30 MB crosses 80 MB.
        let grown = "aof_enabled:1\r\naof_current_size:55000000\r\naof_base_size:40000000\r\n";
        assert!(Persistence::of(grown).rewrite_due_within(64 * mb, 100, 64 * mb));
        // Just rewritten (current = base): a rewrite now would gain nothing.
        let fresh = "aof_enabled:1\r\naof_current_size:30000000\r\naof_base_size:30000000\r\n";
        assert!(!Persistence::of(fresh).rewrite_due_within(64 * mb, 100, 64 * mb));
        // Automatic rewrites off, or no AOF: nothing is ever due.
        assert!(!p.rewrite_due_within(64 * mb, 0, 64 * mb));
        assert!(
            !Persistence::of("aof_enabled:0\r\naof_current_size:999999999\r\n").rewrite_due_within(
                64 * mb,
                100,
                64 * mb
            )
        );
        assert!(Persistence::of("aof_rewrite_scheduled:1\r\n").busy);
    }

    #[test]
    fn commandstats_sum_every_command_but_info_and_count_script_calls() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=200,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=5,usec=5,usec_per_call=1.00\r\ncmdstat_info:calls=3,usec=300,usec_per_call=100.00\r\n";
        assert_eq!(
            commandstats(text),
            CommandStats {
                scripts: 10,
                usec: 205,
                script_errors: 0
            }
        );
        assert_eq!(
            commandstats(""),
            CommandStats {
                scripts: 0,
                usec: 0,
                script_errors: 0
            }
        );
        // From the bench-truth issue: the anchor's errors were set to 0
        // once its stock ran out; they are read from the failed and
        // rejected script calls.
        let failing = "cmdstat_evalsha:calls=10,usec=200,usec_per_call=20.00,rejected_calls=2,failed_calls=3\r\n";
        assert_eq!(commandstats(failing).script_errors, 5);
        assert_eq!(commandstats(failing).scripts, 10);
    }
}
