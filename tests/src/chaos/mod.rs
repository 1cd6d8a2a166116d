//! `flashsale-chaos`: random histories under faults, and a checker that
//! proves the promise. One run starts its own topology ([`topology`]),
//! engine and writer processes ([`procs`], [`worker`]), sends a workload
//! drawn from the seed ([`workload`]) while the nemesis injects faults drawn
//! from the same seed ([`nemesis`]), records every operation
//! ([`history`]), heals everything, resends every `unknown` until it is
//! decided, drains the writer, and checks ([`checker`]).
//!
//! One seed fixes the sequence of operations and the schedule of faults;
//! the interleaving of real processes on a real machine is not fixed, so a
//! seed reproduces a run's shape, not its every timing.

pub mod checker;
#[cfg(test)]
mod checker_tests;
pub mod history;
pub mod nemesis;
pub mod procs;
pub mod protocol;
pub mod report;
pub mod topology;
pub mod worker;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale::orders::entry::Record;
use history::{History, OpRecord, Phase};
use nemesis::{Fault, Targets};
use procs::{ChildProc, ChildSpec};
use protocol::{Op, Outcome};
use topology::Topology;
use workload::Workload;

/// Calls in flight at once from the controller.
const IN_FLIGHT: usize = 48;
/// Longest the controller waits for one answer before calling it `unknown`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Most operations one run sends, whatever its duration.
const MAX_OPS: u64 = 2_000_000;
/// Resends of an `unknown` after healing before it counts as unresolved.
const RESOLVE_ATTEMPTS: usize = 20;
/// Longest the whole resend phase may take.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(180);

/// What one run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// The seed of the workload and the fault schedule.
    pub seed: u64,
    /// How long the workload and the nemesis run.
    pub duration: Duration,
    /// The engines' ack mode.
    pub ack: flashsale::Ack,
    /// Faults the nemesis may inject.
    pub faults: Vec<Fault>,
    /// Engine processes.
    pub engines: usize,
    /// A planted bug for the child processes (`planted-bugs` builds only).
    pub plant: Option<String>,
    /// Where to write the history (JSONL).
    pub history: Option<PathBuf>,
}

/// Everything a run found.
pub struct RunResult {
    /// The options it ran with.
    pub options: Options,
    /// Seconds the workload ran.
    pub duration_s: f64,
    /// Every operation.
    pub ops: Vec<OpRecord>,
    /// Faults injected, by kind.
    pub faults: Vec<(Fault, u64)>,
    /// Every fault tried: when, whether it was injected and landed.
    pub windows: Vec<history::FaultWindow>,
    /// The checker's findings.
    pub verdict: checker::Verdict,
    /// The history, for citing lines.
    pub history: Arc<History>,
}

/// Runs one experiment. An `Err` means the run itself could not be carried
/// out (a topology that would not start or heal), not that the checker
/// found a violation.
pub async fn run(options: Options) -> anyhow::Result<RunResult> {
    let topo = Topology::start().await?;
    let config = topo.engine_config(options.ack);
    let controller = flashsale::Engine::connect(config.clone())
        .await
        .map_err(|e| anyhow::anyhow!("controller engine: {e}"))?;
    let mut workload = Workload::new(options.seed, options.engines);
    let mut buckets = Vec::new();
    for s in &workload.sales {
        let status = controller
            .create_sale(flashsale::SaleSpec {
                buckets: s.buckets,
                per_user_limit: s.limit,
                hold_ms: s.hold_ms,
                late_payment: s.late,
                ..flashsale::SaleSpec::new(&s.sku, s.stock)
            })
            .await
            .map_err(|e| anyhow::anyhow!("create {}: {e}", s.sku))?;
        buckets.extend(status.buckets.iter().map(|b| nemesis::Bucket {
            sku: s.sku.clone(),
            index: b.index,
            slot: b.slot,
            stream: b.stream.clone(),
        }));
    }
    // In a file, not on the command line: `ps` shows arguments to everyone.
    let config_path = topo.dir.path().join("engine-config.json");
    let config_json = serde_json::to_string(&config)?;
    std::fs::write(&config_path, &config_json)?;
    let config_json = config_path.display().to_string();
    let plant_args: Vec<String> = options
        .plant
        .iter()
        .flat_map(|p| ["--plant".to_owned(), p.clone()])
        .collect();
    let mut engines = Vec::new();
    for i in 0..options.engines.max(1) {
        let mut args = vec![
            "engine".to_owned(),
            "--config".into(),
            config_json.clone(),
            "--resource".into(),
            topo.resource.url(),
        ];
        args.extend(plant_args.iter().cloned());
        let spec = ChildSpec {
            args,
            log: topo.dir.path().join(format!("engine-{i}.log")),
        };
        engines.push(Arc::new(ChildProc::start(spec).await?));
    }
    let mut writer_args = vec!["writer".to_owned(), "--config".into(), config_json];
    writer_args.extend(plant_args.iter().cloned());
    let writer = ChildProc::start(ChildSpec {
        args: writer_args,
        log: topo.dir.path().join("writer.log"),
    })
    .await?;

    let history = Arc::new(History::new());
    let pool = flashsale::db::pool(&topo.pg_direct_url(), 4)?;
    let targets = Targets {
        topo: &topo,
        engines: &engines,
        writer: &writer,
        buckets,
    };
    let started = Instant::now();
    let until = started + options.duration;
    let nemesis_rng = Workload::fork(options.seed);
    let mut negative_samples = Vec::new();
    let (faults, (), ()) = tokio::join!(
        nemesis::run(&targets, &options.faults, nemesis_rng, until, &history),
        drive(&mut workload, &engines, &history, until, options.duration),
        periodic_reconcile(&controller, &pool, &history, &mut negative_samples, until),
    );
    let duration_s = started.elapsed().as_secs_f64();
    let faults = faults?;
    nemesis::heal_all(&targets).await?;
    resolve(&engines, &history).await;
    // Every hold made so far ends by now, paid or not: the engines'
    // sweepers must have ended it within the drain.
    tokio::time::sleep(workload.longest_hold()).await;
    let reconcile = drain(&controller, &pool, &history, &workload).await?;
    let end = ledger_end(&controller, &workload).await?;
    let checked_at_ms = unix_ms();
    let rows = db_orders(&pool).await?;
    let db_events = db_events(&pool).await?;
    let redis_states = redis_states(&controller, &workload, &rows).await?;
    for e in &engines {
        e.stop().await;
    }
    writer.stop().await;
    let ops = history.ops();
    let windows = history.fault_windows();
    let verdict = checker::check(&checker::Inputs {
        ops: &ops,
        sales: &workload.sales,
        end: &end,
        rows: &rows,
        reconcile: &reconcile,
        negative_samples: &negative_samples,
        ack: options.ack,
        db_events: &db_events,
        history_start_ms: history.start_unix_ms(),
        redis_states: &redis_states,
        checked_at_ms,
        fault_windows: &windows,
    });
    if let Some(path) = &options.history {
        history
            .write_to(path)
            .map_err(|e| anyhow::anyhow!("write history: {e}"))?;
    }
    Ok(RunResult {
        options,
        duration_s,
        ops,
        faults,
        windows,
        verdict,
        history,
    })
}

/// Sends the workload until `until`, at most [`IN_FLIGHT`] calls at once.
async fn drive(
    workload: &mut Workload,
    engines: &[Arc<ChildProc>],
    history: &Arc<History>,
    until: Instant,
    duration: Duration,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let start = Instant::now();
    let mut next_id = 0u64;
    // Orders of sales with holds, as their purchases are confirmed: what
    // payments and cancels pick from.
    let held: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let hold_skus: Arc<std::collections::HashSet<String>> = Arc::new(
        workload
            .sales
            .iter()
            .filter(|s| s.hold_ms > 0)
            .map(|s| s.sku.clone())
            .collect(),
    );
    while Instant::now() < until && next_id < MAX_OPS {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let progress = start.elapsed().as_secs_f64() / duration.as_secs_f64().max(0.001);
        let step = {
            let held = held.lock().unwrap_or_else(|p| p.into_inner());
            workload.next(progress, &held)
        };
        let mut sends = vec![step.process];
        if step.twice {
            sends.push((step.process + 1) % engines.len());
        }
        let mut calls = Vec::new();
        for process in sends {
            next_id += 1;
            let (engine, history, op) =
                (engines[process].clone(), history.clone(), step.op.clone());
            let (held, hold_skus) = (held.clone(), hold_skus.clone());
            let id = next_id;
            let retry = step.retry_on_unknown;
            calls.push(async move {
                let mut r = call(&engine, &history, id, process, &op, Phase::Run).await;
                if retry && matches!(r.outcome, Outcome::Unknown { .. }) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    r = call(&engine, &history, id + MAX_OPS, process, &op, Phase::Run).await;
                }
                note_held(&r, &hold_skus, &held);
            });
        }
        // A "twice" step's calls really run at once: each on its own task.
        let handles: Vec<_> = calls.into_iter().map(tokio::spawn).collect();
        tokio::spawn(async move {
            for h in handles {
                let _ = h.await;
            }
            drop(permit);
        });
    }
    // Every call in flight ends before the run is healed and checked.
    let _ = permits.acquire_many(IN_FLIGHT as u32).await;
}

/// Adds the order a confirmed purchase of a sale with holds named.
fn note_held(
    r: &OpRecord,
    hold_skus: &std::collections::HashSet<String>,
    held: &std::sync::Mutex<Vec<String>>,
) {
    if let (
        Op::Purchase { sku, .. },
        Outcome::Ok {
            value: protocol::OkValue::Order { order_id, .. },
        },
    ) = (&r.op, &r.outcome)
    {
        if hold_skus.contains(sku) {
            // A replayed answer adds its order again: retries are paid and
            // cancelled more often, as in life.
            held.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(order_id.clone());
        }
    }
}

/// One call, recorded as invoke and completion.
async fn call(
    engine: &ChildProc,
    history: &History,
    id: u64,
    process: usize,
    op: &Op,
    phase: Phase,
) -> OpRecord {
    let invoke = history.invoke(id, process, op);
    let outcome = engine.call(id, op, CALL_TIMEOUT).await;
    history.complete(id, process, op.clone(), outcome, invoke, phase)
}

/// After healing, resends every operation that ended `unknown` (same
/// parameters, same ids) until it is decided or the attempts run out: in
/// rounds, every undecided operation of a round at once (at most
/// [`IN_FLIGHT`]), so one that stays unknown cannot starve the rest.
async fn resolve(engines: &[Arc<ChildProc>], history: &Arc<History>) {
    let mut seen = std::collections::HashSet::new();
    let mut undecided: Vec<Op> = history
        .ops()
        .into_iter()
        .filter(|o| matches!(o.outcome, Outcome::Unknown { .. }))
        .filter(|o| !matches!(o.op, Op::Status { .. } | Op::Lock { .. }))
        .map(|o| o.op)
        .filter(|op| seen.insert(format!("{op:?}")))
        .collect();
    let mut id = 10 * MAX_OPS;
    let deadline = Instant::now() + RESOLVE_DEADLINE;
    let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    for _round in 0..RESOLVE_ATTEMPTS {
        if undecided.is_empty() || Instant::now() > deadline {
            // What is still unknown now is reported as unresolved.
            return;
        }
        let mut tasks = Vec::new();
        for (n, op) in undecided.drain(..).enumerate() {
            id += 1;
            let process = n % engines.len();
            let (engine, history, permits) =
                (engines[process].clone(), history.clone(), permits.clone());
            let call_id = id;
            tasks.push(tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let r = call(&engine, &history, call_id, process, &op, Phase::Final).await;
                matches!(r.outcome, Outcome::Unknown { .. }).then_some(op)
            }));
        }
        for t in tasks {
            if let Ok(Some(op)) = t.await {
                undecided.push(op);
            }
        }
        if !undecided.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// What `flashsale serve` does on a timer, while faults go on: reconcile
/// (its verdict is recorded; only the final one, after draining, is
/// checked, since no outside truth exists mid-run) and a look at every
/// bucket's stock, which must never be below zero.
async fn periodic_reconcile(
    controller: &flashsale::Engine,
    pool: &deadpool_postgres::Pool,
    history: &History,
    negative: &mut Vec<(String, usize)>,
    until: Instant,
) {
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_secs(3)).await;
        match flashsale::ledger::reconcile(controller, pool, &[]).await {
            Ok(reports) => {
                let conserved: Vec<(String, bool)> =
                    reports.into_iter().map(|r| (r.sku, r.conserved)).collect();
                history.info("reconcile", serde_json::json!(conserved));
            }
            Err(e) => {
                history.info("reconcile_failed", serde_json::json!(e.to_string()));
            }
        }
        sample_during(controller, history, negative).await;
    }
    sample_during(controller, history, negative).await;
}

/// Samples every bucket's stock once (the checker also reads it at the end).
async fn sample_during(
    controller: &flashsale::Engine,
    history: &History,
    negative: &mut Vec<(String, usize)>,
) {
    let Ok(skus) = controller.list_sales().await else {
        return;
    };
    for sku in skus {
        if let Ok(s) = controller.sale_status(&sku).await {
            for b in s.buckets.iter().filter(|b| b.remaining < 0) {
                let detail = format!("{sku}: bucket {} stock {}", b.index, b.remaining);
                let line = history.info("negative_stock", serde_json::json!(detail));
                negative.push((detail, line));
            }
        }
    }
}

/// Waits until the writer has written every order and transition still in
/// a stream and no hold is left past its deadline (or nothing moves for
/// [`STUCK`]: the checker then counts what never arrived), then returns
/// reconcile's verdict per SKU.
async fn drain(
    controller: &flashsale::Engine,
    pool: &deadpool_postgres::Pool,
    history: &History,
    workload: &Workload,
) -> anyhow::Result<BTreeMap<String, bool>> {
    const STUCK: Duration = Duration::from_secs(10);
    let skus: Vec<String> = workload.sales.iter().map(|s| s.sku.clone()).collect();
    let start = Instant::now();
    // The sweeper settles abandoned fall-throughs after pending_timeout.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut last: Option<(Backlog, Instant)> = None;
    loop {
        let reports = flashsale::ledger::reconcile(controller, pool, &skus).await;
        let backlog = backlog(controller, pool, workload).await;
        if let (Ok(reports), Ok(backlog)) = (&reports, &backlog) {
            let backlog = *backlog;
            let pending: i64 = reports.iter().map(|r| r.pending).sum();
            let backlog = Backlog { pending, ..backlog };
            let stuck = match last {
                Some((b, since)) if b == backlog => since.elapsed() >= STUCK,
                _ => {
                    last = Some((backlog, Instant::now()));
                    false
                }
            };
            if backlog == Backlog::default() || stuck || start.elapsed() > Duration::from_secs(120)
            {
                history.info(
                    "reconcile",
                    serde_json::to_value(reports).unwrap_or_default(),
                );
                if backlog != Backlog::default() {
                    history.info(
                        "writer_stuck",
                        serde_json::json!({
                            "pending_units": backlog.pending,
                            "unwritten": backlog.unwritten,
                            "overdue_holds": backlog.overdue_holds,
                            "owed_quotas": backlog.owed,
                            "pending_walks": backlog.walks,
                        }),
                    );
                }
                return Ok(reports
                    .iter()
                    .map(|r| (r.sku.clone(), r.conserved))
                    .collect());
            }
        } else if start.elapsed() > Duration::from_secs(120) {
            return Err(anyhow::anyhow!(
                "after healing, reconcile or the backlog read failed: {:?} / {:?}",
                reports.err(),
                backlog.err()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What is left to settle after healing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Backlog {
    /// Units reconcile counts as pending (in streams, not in PostgreSQL).
    pending: i64,
    /// Orders and transitions in streams, not in PostgreSQL.
    unwritten: usize,
    /// Orders held more than a second past their deadline, in PostgreSQL
    /// or in a bucket's deadline index.
    overdue_holds: i64,
    /// Quotas other buckets still owe back (orders on an `owed` set).
    owed: u64,
    /// Purchases still walking other buckets (their quota is reserved).
    walks: u64,
}

/// The backlog now (its `pending` is filled in from reconcile).
async fn backlog(
    controller: &flashsale::Engine,
    pool: &deadpool_postgres::Pool,
    workload: &Workload,
) -> anyhow::Result<Backlog> {
    let end = ledger_end(controller, workload).await?;
    let rows = db_orders(pool).await?;
    let events = db_events(pool).await?;
    let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
    let unwritten = end
        .values()
        .map(|e| {
            e.in_streams
                .iter()
                .filter(|(id, _)| !ids.contains(id.as_str()))
                .count()
                + e.events_in_streams
                    .iter()
                    .filter(|ev| !events.contains_key(*ev))
                    .count()
        })
        .sum();
    let now = unix_ms();
    let overdue_holds = rows
        .iter()
        .filter(|r| r.status == "held" && r.expires_ms.is_some_and(|e| e + 1_000 < now))
        .count() as i64
        + end
            .values()
            .map(|e| e.left.overdue_in_index as i64)
            .sum::<i64>();
    Ok(Backlog {
        pending: 0,
        unwritten,
        overdue_holds,
        owed: end.values().map(|e| e.left.owed).sum(),
        walks: end.values().map(|e| e.left.pending_walks).sum(),
    })
}

/// Wall-clock milliseconds since the Unix epoch (the masters' clocks are
/// this machine's).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Per SKU, read from Redis: units ever put in, every bucket's stock, and
/// the orders and transitions still in its streams.
async fn ledger_end(
    controller: &flashsale::Engine,
    workload: &Workload,
) -> anyhow::Result<BTreeMap<String, checker::EndLedger>> {
    let mut conn = controller
        .dedicated_connection()
        .await
        .map_err(|e| anyhow::anyhow!("connection: {e}"))?;
    let mut out = BTreeMap::new();
    for s in &workload.sales {
        let status = controller
            .sale_status(&s.sku)
            .await
            .map_err(|e| anyhow::anyhow!("status {}: {e}", s.sku))?;
        let mut in_streams = Vec::new();
        let mut events_in_streams = Vec::new();
        let mut left = checker::HoldsLeft::default();
        let mut bucket_restocks = Vec::new();
        let now = unix_ms();
        for b in &status.buckets {
            let keys = flashsale::keys::BucketKeys::new(&b.tag);
            let (owed, overdue, dead, walks): (u64, u64, u64, u64) = redis::pipe()
                .cmd("ZCARD")
                .arg(&keys.owed)
                .cmd("ZCOUNT")
                .arg(&keys.holds)
                .arg("-inf")
                .arg(now - 1_000)
                .cmd("XLEN")
                .arg(flashsale::keys::dead_letter_stream(&b.tag))
                .cmd("ZCARD")
                .arg(&keys.pending)
                .query_async(&mut conn)
                .await
                .map_err(|e| anyhow::anyhow!("holds of {}: {e}", b.tag))?;
            // Each restock's share of this bucket, as the script recorded it.
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&keys.sale)
                .query_async(&mut conn)
                .await
                .map_err(|e| anyhow::anyhow!("sale hash of {}: {e}", b.tag))?;
            let mut shares = BTreeMap::new();
            for (field, units) in fields {
                if let Some(op) = field.strip_prefix("op:") {
                    let units = units.parse::<u64>().map_err(|e| {
                        anyhow::anyhow!("restock {op} of {}: units {units:?}: {e}", b.tag)
                    })?;
                    shares.insert(op.to_owned(), units);
                }
            }
            bucket_restocks.push(shares);
            left.owed += owed;
            left.overdue_in_index += overdue;
            left.dead_letters += dead;
            left.pending_walks += walks;
            if s.limit > 0 {
                let users = workload.users();
                let mut mget = redis::cmd("MGET");
                for u in &users {
                    mget.arg(keys.quota(u));
                }
                let used: Vec<Option<i64>> = mget
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| anyhow::anyhow!("quotas of {}: {e}", b.tag))?;
                for (u, n) in users.into_iter().zip(used) {
                    *left.quotas.entry(u).or_default() += n.unwrap_or(0);
                }
            }
            let v: redis::Value = redis::cmd("XRANGE")
                .arg(&b.stream)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .map_err(|e| anyhow::anyhow!("XRANGE {}: {e}", b.stream))?;
            for e in flashsale::orders::entry::parse_entries(&v) {
                match e.to_record(&b.tag) {
                    Ok(Record::Order(o)) => {
                        in_streams.push((o.order_id, o.qty.unsigned_abs().into()))
                    }
                    Ok(Record::Event(ev)) => events_in_streams.push((ev.order_id, ev.version)),
                    // The engine writes only entries the writer parses; one
                    // it would dead-letter is an order that never reaches
                    // PostgreSQL, so the run stops on it.
                    Err(why) => anyhow::bail!("entry {e:?} of {} does not parse: {why}", b.stream),
                }
            }
        }
        out.insert(
            s.sku.clone(),
            checker::EndLedger {
                initial: status.buckets.iter().map(|b| b.initial).sum(),
                stocks: status.buckets.iter().map(|b| b.remaining).collect(),
                bucket_initials: status.buckets.iter().map(|b| b.initial).collect(),
                bucket_restocks,
                in_streams,
                events_in_streams,
                left,
            },
        );
    }
    Ok(out)
}

async fn db_orders(pool: &deadpool_postgres::Pool) -> anyhow::Result<Vec<checker::DbOrder>> {
    let c = pool.get().await?;
    let rows = c
        .query(
            "SELECT order_id, sku, user_id, qty, status, payment_ref,
                    (extract(epoch FROM expires_at) * 1000)::int8, version,
                    (extract(epoch FROM paid_at) * 1000)::int8,
                    (extract(epoch FROM expired_at) * 1000)::int8,
                    (extract(epoch FROM created_at) * 1000)::int8
             FROM orders",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| checker::DbOrder {
            order_id: r.get(0),
            sku: r.get(1),
            user: r.get(2),
            qty: u64::try_from(r.get::<_, i32>(3)).unwrap_or(0),
            status: r.get(4),
            payment_ref: r.get(5),
            expires_ms: r.get(6),
            version: r.get(7),
            paid_ms: r.get(8),
            expired_ms: r.get(9),
            created_ms: r.get(10),
        })
        .collect())
}

/// Every transition PostgreSQL holds, by (order id, version).
async fn db_events(
    pool: &deadpool_postgres::Pool,
) -> anyhow::Result<std::collections::HashMap<(String, i32), checker::DbEvent>> {
    let c = pool.get().await?;
    let rows = c
        .query(
            "SELECT order_id, version, kind, retake, (extract(epoch FROM at) * 1000)::int8
             FROM order_events",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                (r.get(0), r.get(1)),
                checker::DbEvent {
                    kind: r.get(2),
                    retake: r.get(3),
                    at_ms: r.get(4),
                },
            )
        })
        .collect())
}

/// The state and version of every order of a sale with holds, as its
/// record in Redis says (orders whose record is gone are left out).
async fn redis_states(
    controller: &flashsale::Engine,
    workload: &Workload,
    rows: &[checker::DbOrder],
) -> anyhow::Result<std::collections::HashMap<String, (String, i32)>> {
    let mut conn = controller
        .dedicated_connection()
        .await
        .map_err(|e| anyhow::anyhow!("connection: {e}"))?;
    let mut tags = std::collections::HashMap::new();
    for s in workload.sales.iter().filter(|s| s.hold_ms > 0) {
        let status = controller
            .sale_status(&s.sku)
            .await
            .map_err(|e| anyhow::anyhow!("status {}: {e}", s.sku))?;
        for b in status.buckets {
            tags.insert((s.sku.clone(), b.index), b.tag);
        }
    }
    let mut out = std::collections::HashMap::new();
    for r in rows.iter().filter(|r| workload.holds(&r.sku)) {
        // `<sku>~<bucket>~<nonce>`: the bucket that holds the record.
        let bucket = r.order_id.split('~').nth(1).and_then(|b| b.parse().ok());
        let Some(tag) = bucket.and_then(|b: u32| tags.get(&(r.sku.clone(), b))) else {
            continue;
        };
        let (state, v): (Option<String>, Option<i32>) = redis::cmd("HMGET")
            .arg(flashsale::keys::BucketKeys::new(tag).order(&r.order_id))
            .arg("state")
            .arg("v")
            .query_async(&mut conn)
            .await
            .map_err(|e| anyhow::anyhow!("order {}: {e}", r.order_id))?;
        if let (Some(state), Some(v)) = (state, v) {
            out.insert(r.order_id.clone(), (state, v));
        }
    }
    Ok(out)
}
