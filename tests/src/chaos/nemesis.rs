//! The faults of a chaos run, one at a time in an order drawn from the
//! seed, each bounded in time and healed before the next. Only loopback
//! processes and proxies this run started are ever touched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::history::History;
use super::procs::ChildProc;
use super::topology::Topology;
use super::worker::LOCK_LEASE;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// kill -9 of a master whose replica was first cut off and frozen, so
    /// the replica that takes over misses the master's last writes. Aimed
    /// at a master taking orders, and only once it has taken some since
    /// the cut (a kill that loses no order tests nothing).
    Kill,
    /// SIGSTOP of a master past the node timeout, then SIGCONT: it comes
    /// back into a world where its replica was promoted.
    Pause,
    /// `CLIENT PAUSE ... ALL` on a master.
    Stall,
    /// `SCRIPT FLUSH` on every master.
    Flush,
    /// Live migration of a bucket's slot to another master.
    Migrate,
    /// The proxy in front of a master drops every connection and refuses
    /// new ones: engines and its replica lose it, the cluster bus does not.
    Partition,
    /// kill -9 of an engine process (restarted at once).
    EngineKill,
    /// kill -9 of the order writer (restarted a second later).
    WriterKill,
    /// PostgreSQL unreachable for 10 s (its proxy cut).
    PgDown,
    /// An engine process frozen (SIGSTOP) past the lock lease, then resumed.
    LockPause,
}

impl Fault {
    /// Every fault with its `--faults` name.
    pub const ALL: [(&'static str, Fault); 10] = [
        ("kill", Fault::Kill),
        ("pause", Fault::Pause),
        ("stall", Fault::Stall),
        ("flush", Fault::Flush),
        ("migrate", Fault::Migrate),
        ("partition", Fault::Partition),
        ("engine-kill", Fault::EngineKill),
        ("writer-kill", Fault::WriterKill),
        ("pg-down", Fault::PgDown),
        ("lock-pause", Fault::LockPause),
    ];

    /// The `--faults` name.
    pub fn name(self) -> &'static str {
        Fault::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    /// The fault called `name`.
    pub fn from_name(name: &str) -> Option<Fault> {
        Fault::ALL.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
    }

    /// How long one injection may take, healing included, on a busy
    /// machine (the longest wait of its aim, its hold, its heal): what a
    /// run must leave it.
    pub fn budget(self) -> Duration {
        Duration::from_millis(match self {
            Fault::Kill => 11_000,
            Fault::Pause => 4_000,
            Fault::Stall => 5_000,
            Fault::Flush => 1_000,
            Fault::Migrate => 3_000,
            Fault::Partition => 4_000,
            Fault::EngineKill => 2_000,
            Fault::WriterKill => 2_000,
            Fault::PgDown => 12_500,
            Fault::LockPause => 4_000,
        })
    }
}

/// The shortest run in which every fault of `faults` is injected once:
/// their budgets, the quiet between them, and the last seconds a fault is
/// not started in.
pub fn shortest_run(faults: &[Fault]) -> Duration {
    let mut kinds: Vec<Fault> = faults.to_vec();
    kinds.sort();
    kinds.dedup();
    kinds
        .iter()
        .map(|f| f.budget() + QUIET_MAX)
        .sum::<Duration>()
        + Duration::from_secs(2)
}

/// Longest quiet between two faults.
const QUIET_MAX: Duration = Duration::from_millis(1500);

/// Failed attempts at one kind in a cycle before the nemesis moves on.
const ATTEMPTS: usize = 3;

/// What the nemesis may touch.
pub struct Targets<'a> {
    /// The cluster, proxies, lock nodes and database proxy.
    pub topo: &'a Topology,
    /// Engine processes.
    pub engines: &'a [Arc<ChildProc>],
    /// The order writer process.
    pub writer: &'a ChildProc,
    /// The sales' buckets (`migrate` moves their slots, `kill` aims at
    /// their masters).
    pub buckets: Vec<Bucket>,
}

/// One bucket of a sale, as the nemesis sees it.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// The sale.
    pub sku: String,
    /// Its position in the sale (what a confirmed order names).
    pub index: u32,
    /// Its slot.
    pub slot: u16,
    /// Its order stream.
    pub stream: String,
}

/// How long a cluster may take to heal after a fault before the run gives up.
const HEAL_TIMEOUT: Duration = Duration::from_secs(90);

/// Injects faults from `enabled` until `until`, one at a time; returns how
/// many of each were injected. An error means the topology could not be
/// healed (the run is then not a valid experiment).
pub async fn run(
    targets: &Targets<'_>,
    enabled: &[Fault],
    mut rng: StdRng,
    until: Instant,
    history: &History,
) -> anyhow::Result<Vec<(Fault, u64)>> {
    let mut counts: Vec<(Fault, u64)> = enabled.iter().map(|&f| (f, 0)).collect();
    if enabled.is_empty() {
        tokio::time::sleep_until(until.into()).await;
        return Ok(counts);
    }
    let mut cycle: Vec<Fault> = Vec::new();
    // Failed attempts at each kind in this cycle.
    let mut failed: Vec<(Fault, usize)> = Vec::new();
    loop {
        let quiet = Duration::from_millis(rng.random_range(500..QUIET_MAX.as_millis() as u64));
        tokio::time::sleep(quiet).await;
        if Instant::now() + Duration::from_secs(2) >= until {
            break;
        }
        if cycle.is_empty() {
            cycle = enabled.to_vec();
            cycle.shuffle(&mut rng);
            failed.clear();
        }
        let Some(fault) = cycle.pop() else { break };
        let pick: usize = rng.random_range(0..1000);
        let started_ms = history.now_ms();
        history.nemesis(fault.name(), "start", "");
        let injected = inject(targets, fault, pick, history, until).await;
        let healed = heal_cluster(targets.topo).await;
        let (detail, landed) = match (&injected, &healed) {
            (Ok(d), Ok(())) => (d.detail.clone(), d.landed),
            (Err(e), _) => (format!("not injected: {e}"), false),
            (_, Err(e)) => (format!("not healed: {e}"), false),
        };
        let skus = injected.as_ref().ok().and_then(|d| d.skus.clone());
        history.nemesis(fault.name(), "end", &detail);
        history.fault_window(
            fault.name(),
            started_ms,
            injected.is_ok(),
            landed,
            &detail,
            skus,
        );
        healed?;
        if injected.is_err() {
            if fault == Fault::Migrate {
                // A migration that failed half-way may have split a slot's
                // data: what follows would not test the engine.
                return Err(anyhow::anyhow!("migrate fault failed: {detail}"));
            }
            // Tried again after the others of this cycle (what kept it
            // from landing, a master taking no orders, say, may have passed
            // by then), before any kind is repeated; a few times only: one
            // that cannot be injected is reported, not looped on.
            let tries = match failed.iter_mut().find(|(f, _)| *f == fault) {
                Some(entry) => {
                    entry.1 += 1;
                    entry.1
                }
                None => {
                    failed.push((fault, 1));
                    1
                }
            };
            if tries < ATTEMPTS {
                cycle.insert(0, fault);
            }
            continue;
        }
        if let Some(c) = counts.iter_mut().find(|(f, _)| *f == fault) {
            c.1 += 1;
        }
    }
    Ok(counts)
}

/// What an injection did.
struct Injected {
    detail: String,
    /// It landed where it was aimed (see `FaultWindow::landed`).
    landed: bool,
    /// The sales on the master it stopped (see `FaultWindow::skus`).
    skus: Option<Vec<String>>,
}

impl From<String> for Injected {
    fn from(detail: String) -> Self {
        Injected {
            detail,
            landed: false,
            skus: None,
        }
    }
}

/// The sales with a bucket among `buckets`, each once.
fn skus_of(buckets: &[Bucket]) -> Vec<String> {
    let mut skus: Vec<String> = buckets.iter().map(|b| b.sku.clone()).collect();
    skus.sort();
    skus.dedup();
    skus
}

/// Applies one fault and heals it; `pick` chooses the victim.
async fn inject(
    t: &Targets<'_>,
    fault: Fault,
    pick: usize,
    history: &History,
    until: Instant,
) -> anyhow::Result<Injected> {
    let topo = t.topo;
    let done = |s: String| Ok(Injected::from(s));
    match fault {
        Fault::Kill => {
            let (m, served) = pick_busy_master(t, pick).await?;
            let r = topo.with_cluster(move |c| c.replica_of(m)).await?;
            topo.with_cluster(move |c| {
                c.node(r).signal("STOP");
                // Cut the replication link while the replica cannot
                // reconnect: what the master writes now is only on it.
                let _: redis::Value = c.node(m).cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
            })
            .await?;
            let (confirmed, queued) =
                wait_for_unreplicated_orders(t, history, m, &served, until).await;
            if confirmed + queued as usize == 0 {
                // A kill with nothing at risk tests nothing (and a run whose
                // only kill missed was vacuous): the replica is let back,
                // and the kill is tried again later in the cycle.
                topo.with_cluster(move |c| c.node(r).signal("CONT")).await?;
                return Err(anyhow::anyhow!(
                    "master {m} took no order in {UNREPLICATED_MAX:?} after its replica was cut off: not killed"
                ));
            }
            topo.with_cluster(move |c| {
                c.node_mut(m).kill();
                c.node(r).signal("CONT");
            })
            .await?;
            wait_cluster(topo, move |c| c.master_ports().contains(&r)).await?;
            topo.with_cluster(move |c| c.node_mut(m).restart()).await?;
            Ok(Injected {
                detail: format!("master {m} killed with {queued} entries queued ({confirmed} purchases confirmed) after its replica was cut off, replica {r} promoted"),
                landed: true,
                skus: Some(skus_of(&served)),
            })
        }
        Fault::Pause => {
            let m = pick_master(topo, pick).await?;
            let buckets = t.buckets.clone();
            let served: Vec<Bucket> = topo
                .with_cluster(move |c| {
                    buckets
                        .into_iter()
                        .filter(|b| c.master_of_slot(b.slot) == m)
                        .collect()
                })
                .await?;
            topo.with_cluster(move |c| c.node(m).signal("STOP")).await?;
            tokio::time::sleep(Duration::from_millis(2500)).await;
            topo.with_cluster(move |c| c.node(m).signal("CONT")).await?;
            Ok(Injected {
                skus: Some(skus_of(&served)),
                ..Injected::from(format!("master {m} paused 2.5 s"))
            })
        }
        Fault::Stall => {
            // Longer than the engine's 2 s response timeout: the engine
            // gives up and retries while its first attempt is still queued.
            let m = pick_master(topo, pick).await?;
            topo.with_cluster(move |c| {
                let _: () = c.node(m).cmd(&["CLIENT", "PAUSE", "4000", "WRITE"]);
            })
            .await?;
            tokio::time::sleep(Duration::from_millis(4100)).await;
            done(format!("master {m} paused writes 4 s"))
        }
        Fault::Flush => {
            topo.with_cluster(|c| {
                for m in c.master_ports() {
                    let _: () = c.node(m).cmd(&["SCRIPT", "FLUSH"]);
                }
            })
            .await?;
            done("scripts flushed on every master".into())
        }
        Fault::Migrate => {
            if t.buckets.is_empty() {
                return Err(anyhow::anyhow!("no bucket slots"));
            }
            let slot = t.buckets[pick % t.buckets.len()].slot;
            let moved = topo.with_cluster(move |c| {
                let from = c.master_of_slot(slot);
                let others: Vec<u16> = c
                    .master_ports()
                    .into_iter()
                    .filter(|&p| p != from)
                    .collect();
                let to = others[pick % others.len()];
                // Slowly, key batch by key batch, so purchases run into ASK
                // and TRYAGAIN while the slot is half moved.
                let on_both = c.migrate_slot_paced(slot, from, to, 10, Duration::from_millis(20));
                if on_both.is_empty() {
                    format!("slot {slot} moved from {from} to {to}")
                } else {
                    format!(
                        "slot {slot} moved from {from} to {to}; on both nodes before the move: {on_both:?}"
                    )
                }
            })
            .await?;
            done(moved)
        }
        Fault::Partition => {
            let m = pick_master(topo, pick).await?;
            let proxy = topo
                .proxies
                .get(&m)
                .ok_or_else(|| anyhow::anyhow!("no proxy announced as {m}"))?;
            proxy.cut();
            tokio::time::sleep(Duration::from_millis(3000)).await;
            proxy.restore();
            done(format!("master {m} cut off 3 s"))
        }
        Fault::EngineKill => {
            let i = pick % t.engines.len();
            t.engines[i].kill_and_restart().await?;
            done(format!("engine {i} killed and restarted"))
        }
        Fault::WriterKill => {
            t.writer.kill().await;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            t.writer.ensure_running().await?;
            done("order writer killed, restarted after 1 s".into())
        }
        Fault::PgDown => {
            // Aimed at the writer with work in hand: cut while orders are
            // being queued, and it has landed once orders reached the
            // streams while PostgreSQL was gone (the writer read them then,
            // and could not commit them).
            // Each stream asked on the master of its slot (another master
            // answers MOVED, which reads as "could not tell").
            let buckets: Vec<(u16, String)> = t
                .buckets
                .iter()
                .map(|b| (b.slot, b.stream.clone()))
                .collect();
            let added = || {
                let buckets = buckets.clone();
                topo.with_cluster(move |c| {
                    buckets
                        .iter()
                        .filter_map(|(slot, stream)| {
                            entries_added(c, c.master_of_slot(*slot), std::slice::from_ref(stream))
                        })
                        .sum::<u64>()
                })
            };
            let mut before = added().await.unwrap_or(0);
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = added().await.unwrap_or(before);
                if now > before {
                    before = now;
                    break;
                }
            }
            topo.pg_proxy.cut();
            let cut = Instant::now();
            let mut during = 0;
            while cut.elapsed() < Duration::from_secs(8) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                during = added().await.unwrap_or(before).saturating_sub(before);
                if during > 0 && cut.elapsed() >= Duration::from_secs(4) {
                    break;
                }
            }
            topo.pg_proxy.restore();
            Ok(Injected {
                detail: format!(
                    "PostgreSQL unreachable {:.1} s while {during} entries were queued",
                    cut.elapsed().as_secs_f64()
                ),
                landed: during > 0,
                skus: None,
            })
        }
        Fault::LockPause => {
            // Aim at a process that holds or is taking a lock right now.
            let mut i = pick % t.engines.len();
            let mut aimed = false;
            for _ in 0..20 {
                if let Some(holder) = t
                    .engines
                    .iter()
                    .position(|e| e.locks_in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0)
                {
                    i = holder;
                    aimed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            t.engines[i].signal(libc::SIGSTOP);
            tokio::time::sleep(LOCK_LEASE * 3).await;
            t.engines[i].signal(libc::SIGCONT);
            // Landed: the process frozen held or was taking a lock (else
            // one chosen at random; the table shows how often).
            Ok(Injected {
                landed: aimed,
                ..Injected::from(format!(
                    "engine {i} frozen for 3 lock leases{}",
                    if aimed {
                        ", a lock in hand"
                    } else {
                        ", holding no lock"
                    }
                ))
            })
        }
    }
}

/// How long the kill fault lets a cut-off master take orders: once it has
/// confirmed one (what a kill must then not lose), at least
/// [`CONFIRMED_MIN`]; once it has only queued entries (a correct engine
/// under `ack = replicated` confirms none while the replica is cut), at
/// least [`QUEUED_MIN`]; and at most [`UNREPLICATED_MAX`] or until the run
/// ends (purchases can be slow on a busy machine, and a kill before any
/// order would test nothing; a longer wait would crowd out other faults).
const CONFIRMED_MIN: Duration = Duration::from_millis(1500);
const QUEUED_MIN: Duration = Duration::from_secs(3);
const UNREPLICATED_MAX: Duration = Duration::from_secs(6);

/// Waits, by the rules above, while master `m` (serving `served`) takes
/// orders its replica, cut off just now, will never see; returns how many
/// purchases were confirmed and entries queued meanwhile.
async fn wait_for_unreplicated_orders(
    t: &Targets<'_>,
    history: &History,
    m: u16,
    served: &[Bucket],
    until: Instant,
) -> (usize, u64) {
    let since = history.now_ms();
    let start = Instant::now();
    let keys: Vec<(String, u32)> = served.iter().map(|b| (b.sku.clone(), b.index)).collect();
    let streams: Vec<String> = served.iter().map(|b| b.stream.clone()).collect();
    let queued_now =
        |streams: Vec<String>| t.topo.with_cluster(move |c| entries_added(c, m, &streams));
    // A poll that fails is "unknown", never 0 (which would make every
    // entry ever added look new).
    let mut cut_at = queued_now(streams.clone()).await.ok().flatten();
    let mut queued = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let confirmed = history.orders_confirmed_since(since, &keys);
        match (cut_at, queued_now(streams.clone()).await.ok().flatten()) {
            (Some(at), Some(now)) => queued = now.saturating_sub(at),
            (None, now) => cut_at = now,
            (Some(_), None) => {}
        }
        let waited = start.elapsed();
        if (confirmed > 0 && waited >= CONFIRMED_MIN)
            || (queued > 0 && waited >= QUEUED_MIN)
            || waited >= UNREPLICATED_MAX
            || Instant::now() >= until
        {
            return (confirmed, queued);
        }
    }
}

/// How many entries (orders, and payments, cancels and expiries of held
/// orders) `streams` have ever had on node `m` (`entries-added` of XINFO
/// STREAM: trimming does not lower it); `None` when a stream could not be
/// read.
fn entries_added(c: &crate::RedisCluster, m: u16, streams: &[String]) -> Option<u64> {
    let mut conn = c.node(m).conn();
    // A master that stops answering must not hold the cluster lock (and
    // its frozen replica) past this.
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut total = 0;
    for key in streams {
        let info: redis::RedisResult<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("XINFO").arg("STREAM").arg(key).query(&mut conn);
        match info {
            Ok(info) => match info.get("entries-added") {
                Some(redis::Value::Int(n)) => total += u64::try_from(*n).ok()?,
                _ => return None,
            },
            // No such stream yet: nothing queued there.
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {}
            Err(_) => return None,
        }
    }
    Some(total)
}

/// A master and the sales' buckets it serves now.
struct Serving {
    master: u16,
    buckets: Vec<Bucket>,
}

impl Serving {
    fn streams(&self) -> Vec<String> {
        self.buckets.iter().map(|b| b.stream.clone()).collect()
    }
}

/// The master the kill fault aims at, and the buckets it serves: one
/// queuing orders now (a sold-out bucket's master would lose nothing), else
/// any bucket's master, else any master; `pick` chooses among them.
async fn pick_busy_master(t: &Targets<'_>, pick: usize) -> anyhow::Result<(u16, Vec<Bucket>)> {
    let buckets = t.buckets.clone();
    let serving: Vec<Serving> = t
        .topo
        .with_cluster(move |c| {
            let mut serving: Vec<Serving> = Vec::new();
            for b in buckets {
                let m = c.master_of_slot(b.slot);
                match serving.iter_mut().find(|s| s.master == m) {
                    Some(s) => s.buckets.push(b),
                    None => serving.push(Serving {
                        master: m,
                        buckets: vec![b],
                    }),
                }
            }
            if serving.is_empty() {
                serving = c
                    .master_ports()
                    .into_iter()
                    .map(|master| Serving {
                        master,
                        buckets: Vec::new(),
                    })
                    .collect();
            }
            serving
        })
        .await?;
    // Entries added on each master's streams, now and 300 ms later.
    let sample = |serving: Vec<(u16, Vec<String>)>| {
        t.topo.with_cluster(move |c| {
            serving
                .iter()
                .map(|(m, streams)| entries_added(c, *m, streams))
                .collect::<Vec<_>>()
        })
    };
    let streams: Vec<(u16, Vec<String>)> =
        serving.iter().map(|s| (s.master, s.streams())).collect();
    let before = sample(streams.clone()).await.unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = sample(streams).await.unwrap_or_default();
    let busy: Vec<&Serving> = serving
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| matches!((b, a), (Some(b), Some(a)) if a > b))
        .map(|(s, _)| s)
        .collect();
    let from: Vec<&Serving> = if busy.is_empty() {
        serving.iter().collect()
    } else {
        busy
    };
    let chosen = from
        .get(pick % from.len().max(1))
        .ok_or_else(|| anyhow::anyhow!("no master to kill"))?;
    Ok((chosen.master, chosen.buckets.clone()))
}

async fn pick_master(topo: &Topology, pick: usize) -> anyhow::Result<u16> {
    topo.with_cluster(move |c| {
        let masters = c.master_ports();
        masters[pick % masters.len()]
    })
    .await
}

/// Polls `ok` on the cluster until it holds (a failed poll counts as "not
/// yet"), for at most [`HEAL_TIMEOUT`].
async fn wait_cluster(
    topo: &Topology,
    ok: impl Fn(&mut crate::RedisCluster) -> bool + Send + Sync + Clone + 'static,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let ok = ok.clone();
        if topo.with_cluster(move |c| ok(c)).await.unwrap_or(false) {
            return Ok(());
        }
        if start.elapsed() > HEAL_TIMEOUT {
            return Err(anyhow::anyhow!("cluster not healed after {HEAL_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Brings every node back (SIGCONT, restart of a dead one, proxies open)
/// and waits until the cluster is whole again.
pub async fn heal_cluster(topo: &Topology) -> anyhow::Result<()> {
    for p in topo.proxies.values() {
        p.restore();
    }
    topo.with_cluster(|c| {
        for n in c.nodes.iter_mut() {
            n.signal("CONT");
            if !n.is_running() {
                n.restart();
            }
        }
    })
    .await?;
    topo.with_cluster(|c| c.wait_healthy(HEAL_TIMEOUT)).await?;
    let open = topo.with_cluster(|c| c.open_slots()).await?;
    if open.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("slots left half-migrated: {open:?}"))
    }
}

/// Heals everything: the cluster, PostgreSQL's proxy, every process.
pub async fn heal_all(t: &Targets<'_>) -> anyhow::Result<()> {
    t.topo.pg_proxy.restore();
    for e in t.engines {
        e.signal(libc::SIGCONT);
        e.ensure_running().await?;
    }
    t.writer.ensure_running().await?;
    heal_cluster(t.topo).await
}
