//! The lock benchmark: acquire+release pairs per second and hand-off latency
//! (from one holder's unlock to the next holder's grant), uncontended and
//! contended, on 1 and 3 lock nodes, for flashsale's lock module and for the
//! `rslock` crate on the very same instances; beside them the fair lock and
//! a semaphore of one permit, under the same scenarios.
//!
//! Every row checks what it measures: each holder, once granted, marks the
//! name held in a witness (an atomic in one process, a file created with
//! `O_EXCL` across processes) and clears it before it releases; a second
//! holder inside at once is counted in `overlaps`. A failed acquire and a
//! release the lock did not confirm are `errors`. A row with either has no
//! rate to judge (`targets.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale::lock::{LockClient, LockConfig, LockOptions, PermitOptions};
use hdrhistogram::Histogram;
use serde::Serialize;

/// The figures of one lock run.
#[derive(Debug, Clone, Serialize)]
pub struct LockResult {
    /// `flashsale`, `rslock`, `flashsale fair` or `flashsale semaphore(1)`.
    pub implementation: String,
    /// Lock nodes used.
    pub nodes: usize,
    /// Tasks competing for the one lock name (1 = uncontended).
    pub tasks: usize,
    /// Pairs completed.
    pub pairs: u64,
    /// Pairs per second.
    pub pairs_per_second: f64,
    /// Median unlock-to-next-grant time, ms (contended runs only).
    pub handoff_p50_ms: Option<f64>,
    /// 99th percentile hand-off, ms.
    pub handoff_p99_ms: Option<f64>,
    /// Pairs that failed: an acquire that gave up, or a release not
    /// confirmed.
    pub errors: u64,
    /// Grants made while another holder was inside (mutual exclusion
    /// broken), seen by the row's witness.
    #[serde(default)]
    pub overlaps: u64,
    /// Cross-process rows: the longest any worker waited for one grant
    /// (a worker still waiting when the window closed counts its wait so
    /// far), ms.
    pub longest_wait_ms: Option<f64>,
}

/// Processes and workers per process of the cross-process scenario.
pub const PROCESSES: usize = 4;
/// Workers (tasks sharing one client) in each process.
pub const WORKERS: usize = 4;

/// The operations both implementations provide.
#[derive(Clone)]
enum Impl {
    Flashsale(LockClient),
    /// flashsale's default: no fixed lease, the watchdog renews it.
    Watchdog(LockClient),
    Fair(LockClient),
    Semaphore(LockClient),
    Rslock(Arc<rslock::LockManager>),
}

/// rslock with its retry tuned: [`RSLOCK_TUNED_TRIES`] tries a call, a
/// random pause of up to [`RSLOCK_TUNED_DELAY`] between them (its default
/// is 3 tries and up to 200 ms). The best of a sweep on this machine
/// (16 workers on one client sharing one name, 3 s each, 1 and 3 nodes;
/// tries,ms of 1,1 3,1 3,5 3,20 3,50 3,100 3,200 1,100 5,20 5,50 10,2
/// 10,10 10,50): short pauses made it slower, since its workers then
/// crowd the node; 10,50 was best or tied on both node counts.
pub const RSLOCK_TUNED: &str = "rslock-tuned";
/// Tries per `lock()` call of [`RSLOCK_TUNED`].
pub const RSLOCK_TUNED_TRIES: u32 = 10;
/// Longest pause between two tries of [`RSLOCK_TUNED`].
pub const RSLOCK_TUNED_DELAY: Duration = Duration::from_millis(50);

/// Overrides [`RSLOCK_TUNED`]'s retry for a sweep: `tries,delay_ms`
/// (inherited by the cross-process children).
pub const RSLOCK_RETRY_ENV: &str = "FLASHSALE_BENCH_RSLOCK_RETRY";

/// The tuned retry: [`RSLOCK_RETRY_ENV`] when it parses, else the
/// constants.
fn tuned_retry() -> (u32, Duration) {
    std::env::var(RSLOCK_RETRY_ENV)
        .ok()
        .and_then(|v| {
            let (tries, ms) = v.split_once(',')?;
            let ms: u64 = ms.trim().parse().ok()?;
            // rslock draws its pause from 0..delay: never an empty range.
            Some((tries.trim().parse().ok()?, Duration::from_millis(ms.max(1))))
        })
        .unwrap_or((RSLOCK_TUNED_TRIES, RSLOCK_TUNED_DELAY))
}

/// A `LockManager` on `urls`, with the tuned retry when `tuned`.
fn rslock_manager(urls: &[String], tuned: bool) -> Arc<rslock::LockManager> {
    let mut m = rslock::LockManager::new(urls.to_vec());
    if tuned {
        let (tries, delay) = tuned_retry();
        m.set_retry(tries, delay);
    }
    Arc::new(m)
}

/// Where holders of one name mark it held: a second mark while one stands
/// is a break of mutual exclusion.
#[derive(Clone)]
enum Witness {
    /// Holders in one process: how many are inside now.
    InProcess(Arc<AtomicU64>),
    /// Holders in several processes: a file that exists while one is
    /// inside, created with `O_EXCL`.
    File(Arc<std::path::PathBuf>),
}

impl Witness {
    fn in_process() -> Witness {
        Witness::InProcess(Arc::new(AtomicU64::new(0)))
    }

    /// The witness of lock `name` shared by every process of a run.
    fn across_processes(name: &str) -> Witness {
        Witness::File(Arc::new(std::env::temp_dir().join(format!("{name}.held"))))
    }

    /// Marks the name held while a holder is inside, yielding once so other
    /// tasks run meanwhile; true when another holder was inside already.
    async fn inside(&self) -> bool {
        match self {
            Witness::InProcess(n) => {
                let overlap = n.fetch_add(1, Ordering::SeqCst) != 0;
                tokio::task::yield_now().await;
                n.fetch_sub(1, Ordering::SeqCst);
                overlap
            }
            Witness::File(path) => {
                let made = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path.as_path());
                tokio::task::yield_now().await;
                match made {
                    Ok(_) => {
                        let _ = std::fs::remove_file(path.as_path());
                        false
                    }
                    Err(_) => true,
                }
            }
        }
    }
}

/// Labels of the flashsale rows beside `flashsale` and `rslock`.
pub const FAIR: &str = "flashsale fair";
/// flashsale's lock under the watchdog (no fixed lease), in the
/// cross-process scenario: a task of the holder's process takes it over
/// with no trip to the nodes (a fixed lease is set again on the nodes).
pub const WATCHDOG: &str = "flashsale-watchdog";
/// The fair lock in the cross-process scenario.
pub const XPROC_FAIR: &str = "flashsale-fair";
/// A semaphore of one permit in the cross-process scenario.
pub const XPROC_SEMAPHORE: &str = "flashsale-semaphore(1)";
/// A semaphore of one permit used as a lock.
pub const SEMAPHORE: &str = "flashsale semaphore(1)";

const TTL: Duration = Duration::from_secs(10);

impl Impl {
    /// Acquire (waiting as long as it takes, up to 60 s), returning a release token.
    async fn acquire(&self, name: &str, worker: usize) -> Option<Held> {
        match self {
            Impl::Flashsale(c) => {
                let opts = LockOptions::new(format!("w{worker}"))
                    .lease(TTL)
                    .wait(Duration::from_secs(60));
                c.lock(name, &opts).await.ok().map(Held::Flashsale)
            }
            Impl::Watchdog(c) => {
                let opts = LockOptions::new(format!("w{worker}")).wait(Duration::from_secs(60));
                c.lock(name, &opts).await.ok().map(Held::Flashsale)
            }
            Impl::Fair(c) => {
                let opts = LockOptions::new(format!("w{worker}"))
                    .lease(TTL)
                    .wait(Duration::from_secs(60))
                    .fair();
                c.lock(name, &opts).await.ok().map(Held::Flashsale)
            }
            Impl::Semaphore(c) => {
                let opts = PermitOptions::new(format!("w{worker}"))
                    .lease(TTL)
                    .wait(Duration::from_secs(60));
                let sem = c.semaphore(name).ok()?;
                let mut permits = sem.acquire(1, &opts).await.ok()?;
                permits.pop().map(Held::Permit)
            }
            Impl::Rslock(m) => {
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    if let Ok(l) = m.lock(name.as_bytes(), TTL).await {
                        return Some(Held::Rslock(l));
                    }
                }
                None
            }
        }
    }

    /// Gives the grant back; false when the release was not confirmed
    /// (rslock's `unlock` reports nothing: always true).
    async fn release(&self, held: Held) -> bool {
        match (self, held) {
            (_, Held::Flashsale(g)) => g.unlock().await,
            (_, Held::Permit(p)) => p.release().await.is_ok(),
            (Impl::Rslock(m), Held::Rslock(l)) => {
                m.unlock(&l).await;
                true
            }
            (_, Held::Rslock(_)) => false,
        }
    }
}

enum Held {
    Flashsale(flashsale::lock::LockGuard),
    Permit(flashsale::lock::Permit),
    Rslock(rslock::Lock),
}

/// Runs `pairs` acquire+release pairs on one name, one task per client.
async fn run_one(
    imps: Vec<Impl>,
    label: &str,
    nodes: usize,
    tasks: usize,
    pairs: u64,
    cap: Duration,
) -> LockResult {
    let name = format!(
        "lockbench-{}-{nodes}-{tasks}-{}",
        label.replace(' ', "-"),
        std::process::id()
    );
    if let Some(Impl::Semaphore(c)) = imps.first() {
        if let Ok(sem) = c.semaphore(&name) {
            let _ = sem.set_permits(1).await;
        }
    }
    let next = Arc::new(AtomicU64::new(0));
    let released_at = Arc::new(AtomicU64::new(0));
    let witness = Witness::in_process();
    let overlaps = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let workers: Vec<_> = imps
        .into_iter()
        .enumerate()
        .map(|(w, imp)| {
            let (name, next, released_at) = (name.clone(), next.clone(), released_at.clone());
            let (witness, overlaps) = (witness.clone(), overlaps.clone());
            tokio::spawn(async move {
                let mut handoff =
                    Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("constant bounds");
                let (mut done, mut errors) = (0u64, 0u64);
                while next.fetch_add(1, Ordering::Relaxed) < pairs && epoch.elapsed() < cap {
                    let asked = epoch.elapsed().as_micros() as u64;
                    let Some(held) = imp.acquire(&name, w).await else {
                        errors += 1;
                        continue;
                    };
                    let got = epoch.elapsed().as_micros() as u64;
                    let rel = released_at.load(Ordering::SeqCst);
                    // Only a grant that waited for a release is a hand-off.
                    if tasks > 1 && rel > asked {
                        let _ = handoff.record((got - rel).max(1));
                    }
                    if witness.inside().await {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    released_at.store(epoch.elapsed().as_micros() as u64, Ordering::SeqCst);
                    if !imp.release(held).await {
                        errors += 1;
                    }
                    done += 1;
                }
                (done, errors, handoff)
            })
        })
        .collect();
    let mut handoff =
        Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("constant bounds");
    let (mut done, mut errors) = (0, 0);
    for w in workers {
        if let Ok((d, e, h)) = w.await {
            done += d;
            errors += e;
            let _ = handoff.add(&h);
        }
    }
    let elapsed = epoch.elapsed().as_secs_f64();
    let pct = |q: f64| (!handoff.is_empty()).then(|| handoff.value_at_quantile(q) as f64 / 1000.0);
    LockResult {
        implementation: label.to_owned(),
        nodes,
        tasks,
        pairs: done,
        pairs_per_second: done as f64 / elapsed.max(1e-9),
        handoff_p50_ms: pct(0.5),
        handoff_p99_ms: pct(0.99),
        errors,
        overlaps: overlaps.load(Ordering::Relaxed),
        longest_wait_ms: None,
    }
}

/// The four `|`-separated fields of a `--lock-child` or `--lock-shared`
/// SPEC (`flag` and `layout` name them in the error).
fn spec_fields<'a>(spec: &'a str, flag: &str, layout: &str) -> anyhow::Result<[&'a str; 4]> {
    let mut parts = spec.splitn(4, '|');
    let (Some(a), Some(b), Some(c), Some(d)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        anyhow::bail!("{flag}: expected {layout}");
    };
    Ok([a, b, c, d])
}

impl Impl {
    /// The lock named `implementation` on `urls`: `flashsale` (fixed
    /// lease), [`WATCHDOG`], [`XPROC_FAIR`], `rslock` or [`RSLOCK_TUNED`],
    /// each on a client of its own.
    fn on(implementation: &str, urls: &[String]) -> anyhow::Result<Impl> {
        let client = || LockClient::new(urls, LockConfig::default());
        Ok(match implementation {
            "flashsale" => Impl::Flashsale(client()?),
            WATCHDOG => Impl::Watchdog(client()?),
            XPROC_FAIR => Impl::Fair(client()?),
            "rslock" => Impl::Rslock(rslock_manager(urls, false)),
            RSLOCK_TUNED => Impl::Rslock(rslock_manager(urls, true)),
            other => anyhow::bail!("unknown lock implementation {other:?}"),
        })
    }
}

/// One process of the cross-process scenario (`--lock-child SPEC`, SPEC =
/// `implementation|window_ms|name|url,url...`): [`WORKERS`] tasks on one
/// client take and release `name` until the window closes, marking it held
/// in a file every process of the run shares. Prints `acquisitions
/// longest_wait_us errors overlaps`.
pub async fn child(spec: &str) -> anyhow::Result<String> {
    let [implementation, window_ms, name, urls] =
        spec_fields(spec, "--lock-child", "implementation|window_ms|name|urls")?;
    let window = Duration::from_millis(window_ms.parse()?);
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let imp = if implementation == XPROC_SEMAPHORE {
        let client = LockClient::new(&urls, LockConfig::default())?;
        // Every process sets the same total; the latest wins, all say 1.
        client.semaphore(name)?.set_permits(1).await?;
        Impl::Semaphore(client)
    } else {
        Impl::on(implementation, &urls)?
    };
    let witness = Witness::across_processes(name);
    let run =
        take_and_release(imp, WORKERS, |_| (name.to_owned(), witness.clone()), window).await?;
    Ok(format!(
        "{} {} {} {}",
        run.done,
        run.longest.as_micros(),
        run.errors,
        run.overlaps
    ))
}

/// The cross-process contended scenario: [`PROCESSES`] copies of this
/// binary, [`WORKERS`] workers each, all on one name for `window`, for
/// flashsale and rslock on 1 and 3 nodes. Acquisitions per second over the
/// window, and the longest wait of any worker.
pub async fn cross_process(
    lock_nodes: &[String],
    window: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<LockResult>> {
    let exe = std::env::current_exe()?;
    let mut out = Vec::new();
    for n in [1usize, 3] {
        if lock_nodes.len() < n {
            continue;
        }
        let urls = lock_nodes[..n].join(",");
        for implementation in [
            "flashsale",
            WATCHDOG,
            "rslock",
            RSLOCK_TUNED,
            XPROC_FAIR,
            XPROC_SEMAPHORE,
        ] {
            bar.set_message(format!("lock x-proc {implementation} nodes={n}"));
            let name = format!(
                "lockbench-xproc-{implementation}-{n}-{}",
                std::process::id()
            );
            let spec = format!("{implementation}|{}|{name}|{urls}", window.as_millis());
            let mut children = Vec::with_capacity(PROCESSES);
            for _ in 0..PROCESSES {
                children.push(
                    std::process::Command::new(&exe)
                        .arg("--lock-child")
                        .arg(&spec)
                        .stdout(std::process::Stdio::piped())
                        .spawn()?,
                );
            }
            let (mut done, mut longest_us, mut errors, mut overlaps) = (0u64, 0u64, 0u64, 0u64);
            for c in children {
                let output = tokio::task::spawn_blocking(move || c.wait_with_output()).await??;
                let text = String::from_utf8_lossy(&output.stdout);
                let fields: Vec<u64> = text
                    .split_whitespace()
                    .filter_map(|f| f.parse().ok())
                    .collect();
                match (output.status.success(), fields.as_slice()) {
                    (true, [d, l, e, o]) => {
                        done += d;
                        longest_us = longest_us.max(*l);
                        errors += e;
                        overlaps += o;
                    }
                    // A process that did not report counts as one error.
                    _ => errors += 1,
                }
            }
            out.push(LockResult {
                implementation: format!("{implementation} x-proc"),
                nodes: n,
                tasks: PROCESSES * WORKERS,
                pairs: done,
                pairs_per_second: done as f64 / window.as_secs_f64().max(1e-9),
                handoff_p50_ms: None,
                handoff_p99_ms: None,
                errors,
                overlaps,
                longest_wait_ms: Some(longest_us as f64 / 1000.0),
            });
            bar.inc(1);
        }
    }
    Ok(out)
}

/// Workers sharing one client in the scenarios U and C.
pub const SHARED_WORKERS: usize = 16;

/// The scenarios with [`SHARED_WORKERS`] tokio workers on one client (one
/// `LockClient`, one rslock `LockManager`): `U`, each worker locks a name of
/// its own (the cost of an uncontended pair); `C`, every worker shares one
/// name. Row labels are `<implementation> U` and `<implementation> C`.
pub async fn shared_client(
    lock_nodes: &[String],
    window: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<LockResult>> {
    let mut out = Vec::new();
    for n in [1usize, 3] {
        if lock_nodes.len() < n {
            continue;
        }
        let urls = lock_nodes[..n].to_vec();
        for contended in [false, true] {
            let scenario = if contended { "C" } else { "U" };
            for implementation in ["flashsale", WATCHDOG, "rslock", RSLOCK_TUNED] {
                bar.set_message(format!("lock {implementation} {scenario} nodes={n}"));
                let imp = Impl::on(implementation, &urls)?;
                let name = format!(
                    "lockbench-shared-{implementation}-{scenario}-{n}-{}",
                    std::process::id()
                );
                let run = shared_window(imp, &name, contended, window).await?;
                out.push(LockResult {
                    implementation: format!("{implementation} {scenario}"),
                    nodes: n,
                    tasks: SHARED_WORKERS,
                    pairs: run.done,
                    pairs_per_second: run.done as f64 / window.as_secs_f64().max(1e-9),
                    handoff_p50_ms: None,
                    handoff_p99_ms: None,
                    errors: run.errors,
                    overlaps: run.overlaps,
                    longest_wait_ms: Some(run.longest.as_secs_f64() * 1000.0),
                });
                bar.inc(1);
            }
        }
    }
    Ok(out)
}

/// One scenario of [`shared_client`] alone (`--lock-shared SPEC`, SPEC =
/// `implementation|U or C|window_ms|url,url...`): prints
/// `pairs pairs_per_second longest_wait_ms errors overlaps`.
pub async fn shared_alone(spec: &str) -> anyhow::Result<String> {
    let [implementation, scenario, window_ms, urls] = spec_fields(
        spec,
        "--lock-shared",
        "implementation|U or C|window_ms|urls",
    )?;
    let window = Duration::from_millis(window_ms.parse()?);
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let imp = Impl::on(implementation, &urls)?;
    let name = format!(
        "lockbench-alone-{implementation}-{scenario}-{}",
        std::process::id()
    );
    let run = shared_window(imp, &name, scenario == "C", window).await?;
    Ok(format!(
        "{} {:.0} {:.1} {} {}",
        run.done,
        run.done as f64 / window.as_secs_f64().max(1e-9),
        run.longest.as_secs_f64() * 1000.0,
        run.errors,
        run.overlaps
    ))
}

/// [`SHARED_WORKERS`] workers on `imp` taking and releasing their name
/// (`name`, or `name-<worker>` when not `contended`), each name with a
/// witness of its own, until `window` ends.
async fn shared_window(
    imp: Impl,
    name: &str,
    contended: bool,
    window: Duration,
) -> anyhow::Result<Window> {
    let shared = Witness::in_process();
    let name_of = |w: usize| {
        if contended {
            (name.to_owned(), shared.clone())
        } else {
            (format!("{name}-{w}"), Witness::in_process())
        }
    };
    take_and_release(imp, SHARED_WORKERS, name_of, window).await
}

/// What a window of takes and releases did.
#[derive(Default)]
struct Window {
    /// Pairs done.
    done: u64,
    /// The longest any worker waited for one grant (a wait the window cut
    /// off counts as far as it got).
    longest: Duration,
    /// Acquires that gave up, and releases not confirmed.
    errors: u64,
    /// Grants made while the witness saw another holder inside.
    overlaps: u64,
}

/// `workers` tasks on `imp`, worker `w` taking and releasing the name and
/// witness `name_of(w)` until `window` ends.
async fn take_and_release(
    imp: Impl,
    workers: usize,
    name_of: impl Fn(usize) -> (String, Witness),
    window: Duration,
) -> anyhow::Result<Window> {
    let end = tokio::time::Instant::now() + window;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let imp = imp.clone();
            let (name, witness) = name_of(w);
            tokio::spawn(async move {
                let mut run = Window::default();
                while tokio::time::Instant::now() < end {
                    let asked = Instant::now();
                    match tokio::time::timeout_at(end, imp.acquire(&name, w)).await {
                        Ok(Some(held)) => {
                            run.longest = run.longest.max(asked.elapsed());
                            if witness.inside().await {
                                run.overlaps += 1;
                            }
                            if !imp.release(held).await {
                                run.errors += 1;
                            }
                            run.done += 1;
                        }
                        Ok(None) => run.errors += 1,
                        Err(_) => run.longest = run.longest.max(asked.elapsed()),
                    }
                }
                run
            })
        })
        .collect();
    let mut total = Window::default();
    for t in tasks {
        let run = t.await?;
        total.done += run.done;
        total.longest = total.longest.max(run.longest);
        total.errors += run.errors;
        total.overlaps += run.overlaps;
    }
    Ok(total)
}

/// Every combination: {flashsale, rslock} x {1, 3 nodes} x {1, `tasks`}.
pub async fn run_all(
    lock_nodes: &[String],
    pairs: u64,
    tasks: usize,
    cap: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<LockResult>> {
    let mut out = Vec::new();
    for n in [1usize, 3] {
        if lock_nodes.len() < n {
            continue;
        }
        let urls = lock_nodes[..n].to_vec();
        for t in [1usize, tasks] {
            // One client per task, as separate processes would have: the
            // contention happens on the lock nodes, for both implementations.
            let mut flashsale = Vec::with_capacity(t);
            let mut fair = Vec::with_capacity(t);
            let mut sem = Vec::with_capacity(t);
            let mut rs = Vec::with_capacity(t);
            let mut rs_tuned = Vec::with_capacity(t);
            for _ in 0..t {
                flashsale.push(Impl::Flashsale(LockClient::new(
                    &urls,
                    LockConfig::default(),
                )?));
                fair.push(Impl::Fair(LockClient::new(&urls, LockConfig::default())?));
                sem.push(Impl::Semaphore(LockClient::new(
                    &urls,
                    LockConfig::default(),
                )?));
                rs.push(Impl::Rslock(rslock_manager(&urls, false)));
                rs_tuned.push(Impl::Rslock(rslock_manager(&urls, true)));
            }
            for (label, imps) in [
                ("flashsale", flashsale),
                ("rslock", rs),
                (RSLOCK_TUNED, rs_tuned),
                (FAIR, fair),
                (SEMAPHORE, sem),
            ] {
                bar.set_message(format!("lock {label} nodes={n} tasks={t}"));
                out.push(run_one(imps, label, n, t, pairs, cap).await);
                bar.inc(1);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Witness;

    /// The witness is what makes a lock row able to fail: two holders
    /// inside at once (no lock at all here) must be seen, in one process
    /// and across processes, and one holder after another must not.
    #[tokio::test(flavor = "current_thread")]
    async fn the_witness_sees_two_holders_at_once_and_not_one_after_another() {
        let name = format!("lockbench-witness-test-{}", std::process::id());
        for witness in [Witness::in_process(), Witness::across_processes(&name)] {
            let (a, b) = tokio::join!(witness.inside(), witness.inside());
            assert!(!a && b, "the second holder inside at once is an overlap");
            assert!(!witness.inside().await, "one after another is not");
            assert!(!witness.inside().await);
        }
    }
}
