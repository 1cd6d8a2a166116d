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
}

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
    loop {
        let quiet = Duration::from_millis(rng.random_range(500..1500));
        tokio::time::sleep(quiet).await;
        if Instant::now() + Duration::from_secs(2) >= until {
            break;
        }
        if cycle.is_empty() {
            cycle = enabled.to_vec();
            cycle.shuffle(&mut rng);
        }
        let Some(fault) = cycle.pop() else { break };
        let pick: usize = rng.random_range(0..1000);
        history.nemesis(fault.name(), "start", "");
        let detail = inject(targets, fault, pick, history, until).await;
        let healed = heal_cluster(targets.topo).await;
        let detail = match (&detail, &healed) {
            (Ok(d), Ok(())) => d.clone(),
            (Err(e), _) => format!("not injected: {e}"),
            (_, Err(e)) => format!("not healed: {e}"),
        };
        history.nemesis(fault.name(), "end", &detail);
        healed?;
        if detail.starts_with("not injected") {
            if fault == Fault::Migrate {
                // A migration that failed half-way may have split a slot's
                // data: what follows would not test the engine.
                return Err(anyhow::anyhow!("migrate fault failed: {detail}"));
            }
            continue;
        }
        if let Some(c) = counts.iter_mut().find(|(f, _)| *f == fault) {
            c.1 += 1;
        }
    }
    Ok(counts)
}

/// Applies one fault and heals it; `pick` chooses the victim.
async fn inject(
    t: &Targets<'_>,
    fault: Fault,
    pick: usize,
    history: &History,
    until: Instant,
) -> anyhow::Result<String> {
    let topo = t.topo;
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
            topo.with_cluster(move |c| {
                c.node_mut(m).kill();
                c.node(r).signal("CONT");
            })
            .await?;
            wait_cluster(topo, move |c| c.master_ports().contains(&r)).await?;
            topo.with_cluster(move |c| c.node_mut(m).restart()).await?;
            Ok(format!(
                "master {m} killed with {queued} entries queued ({confirmed} purchases confirmed) after its replica was cut off, replica {r} promoted"
            ))
        }
        Fault::Pause => {
            let m = pick_master(topo, pick).await?;
            topo.with_cluster(move |c| c.node(m).signal("STOP")).await?;
            tokio::time::sleep(Duration::from_millis(2500)).await;
            topo.with_cluster(move |c| c.node(m).signal("CONT")).await?;
            Ok(format!("master {m} paused 2.5 s"))
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
            Ok(format!("master {m} paused writes 4 s"))
        }
        Fault::Flush => {
            topo.with_cluster(|c| {
                for m in c.master_ports() {
                    let _: () = c.node(m).cmd(&["SCRIPT", "FLUSH"]);
                }
            })
            .await?;
            Ok("scripts flushed on every master".into())
        }
        Fault::Migrate => {
            if t.buckets.is_empty() {
                return Err(anyhow::anyhow!("no bucket slots"));
            }
            let slot = t.buckets[pick % t.buckets.len()].slot;
            topo.with_cluster(move |c| {
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
            .await
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
            Ok(format!("master {m} cut off 3 s"))
        }
        Fault::EngineKill => {
            let i = pick % t.engines.len();
            t.engines[i].kill_and_restart().await?;
            Ok(format!("engine {i} killed and restarted"))
        }
        Fault::WriterKill => {
            t.writer.kill().await;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            t.writer.ensure_running().await?;
            Ok("order writer killed, restarted after 1 s".into())
        }
        Fault::PgDown => {
            topo.pg_proxy.cut();
            tokio::time::sleep(Duration::from_secs(10)).await;
            topo.pg_proxy.restore();
            Ok("PostgreSQL unreachable 10 s".into())
        }
        Fault::LockPause => {
            // Aim at a process that holds or is taking a lock right now.
            let mut i = pick % t.engines.len();
            for _ in 0..20 {
                if let Some(holder) = t
                    .engines
                    .iter()
                    .position(|e| e.locks_in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0)
                {
                    i = holder;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            t.engines[i].signal(libc::SIGSTOP);
            tokio::time::sleep(LOCK_LEASE * 3).await;
            t.engines[i].signal(libc::SIGCONT);
            Ok(format!("engine {i} frozen for 3 lock leases"))
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
