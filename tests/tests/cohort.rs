//! Lock cohorting against real redis-server processes: a plain lock released
//! while another task of the same client waits passes straight to it, with
//! no trip to the lock nodes; its fencing tokens still grow, across clients
//! too; the cohort ends within its bound and clients elsewhere get their
//! turn; a fixed lease is set again for the task that takes it over; and a
//! waiter that gave up never strands a grant.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashsale::lock::{LockClient, LockConfig, LockOptions, TokenClock};
use flashsale_tests::{evalsha_calls, RedisServer};

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(s: &[RedisServer]) -> Vec<String> {
    s.iter().map(|s| s.url()).collect()
}

/// A client whose tokens come from the nodes' counters alone (the clock
/// frozen at the epoch), so a hand-off token that some later grant reuses
/// shows as a repeat instead of hiding under the µs clock.
fn counter_client(nodes: &[RedisServer]) -> LockClient {
    LockClient::new(&urls(nodes), counter_config()).expect("lock client")
}

fn counter_config() -> LockConfig {
    LockConfig {
        token_clock: TokenClock::Fixed(Duration::ZERO),
        ..LockConfig::default()
    }
}

/// A counter client whose cohorts are bounded by count alone (a window of
/// a minute): tests of what a hand-off does must not depend on how fast a
/// loaded machine gets through the default 2 ms window.
fn unhurried_client(nodes: &[RedisServer], cohort_max: u32) -> LockClient {
    LockClient::new(
        &urls(nodes),
        LockConfig {
            cohort_max,
            cohort_window: Duration::from_secs(60),
            ..counter_config()
        },
    )
    .expect("lock client")
}

/// Waits (bounded) until `n` tasks of `locks` queue for `name` in its line.
async fn until_queued(locks: &LockClient, name: &str, n: usize) {
    for _ in 0..5_000 {
        if locks.queued(name) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{n} tasks never queued for {name}");
}

/// Three clients of four tasks each take one lock 100 times per task; every
/// grant writes its token, under the lock, after the one before. Returns
/// the tokens in the order the grants held the lock.
async fn tokens_in_grant_order(nodes: &[RedisServer]) -> Vec<u64> {
    let clients: Vec<LockClient> = (0..3).map(|_| counter_client(nodes)).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|t| {
            let (locks, order, inside) = (clients[t % 3].clone(), order.clone(), inside.clone());
            tokio::spawn(async move {
                let opts = LockOptions::new(format!("task-{t}")).wait(Duration::from_secs(120));
                for _ in 0..100 {
                    let guard = locks.lock("tokens", &opts).await.expect("lock");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    order.lock().expect("order").push(guard.fencing_token());
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.unlock().await, "the holder releases its own grant");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("order").clone();
    order
}

fn assert_strictly_growing(tokens: &[u64]) {
    assert_eq!(tokens.len(), 1200);
    if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
        panic!(
            "a grant's token {} is not above the one before, {}",
            w[1], w[0]
        );
    }
}

/// Found while building cohorting: a hand-off takes the next token above
/// the grant's, and without the reservation on the nodes the next grant of
/// another client took the same number again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_hand_offs_stay_below_the_next_clients_grant_on_one_node() {
    let nodes = servers(1);
    assert_strictly_growing(&tokens_in_grant_order(&nodes).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_hand_offs_stay_below_the_next_clients_grant_on_three_nodes() {
    let nodes = servers(3);
    assert_strictly_growing(&tokens_in_grant_order(&nodes).await);
}

/// Four tasks of one client pass the lock among themselves: far fewer
/// script calls on the node than a trip per grant and per release would
/// take, and every task still gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_hand_the_lock_on_without_asking_the_node() {
    let nodes = servers(1);
    let locks = unhurried_client(&nodes, 64);
    // Warm up: load the scripts, open the connection.
    let opts = LockOptions::new("warm");
    assert!(
        locks
            .lock("warm", &opts)
            .await
            .expect("lock")
            .unlock()
            .await
    );
    let before = evalsha_calls(&nodes[0]);
    let per_task: Vec<_> = (0..4)
        .map(|t| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let opts = LockOptions::new(format!("task-{t}")).wait(Duration::from_secs(60));
                for _ in 0..100 {
                    let guard = locks.lock("shared", &opts).await.expect("lock");
                    tokio::task::yield_now().await;
                    assert!(guard.unlock().await);
                }
            })
        })
        .collect();
    for t in per_task {
        t.await.expect("task");
    }
    let calls = evalsha_calls(&nodes[0]) - before;
    assert!(
        calls < 400,
        "400 grants took {calls} script calls: the lock went back to the node nearly every time"
    );
}

/// One client's four tasks keep taking the lock; a task of another client
/// asks for it once. Its cohort bound makes the first client give the lock
/// back to the node, and its next task lets the waiting client go first:
/// the other client gets in within a few cohorts, not whenever the busy
/// client's tasks happen to be slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_client_lets_a_waiting_client_in_after_its_cohort() {
    for n in [1usize, 3] {
        let nodes = servers(n);
        // A pause of 200 ms for the other client (wake_spread x 4): a live
        // waiter slower than the pause counts as nobody, and a loaded
        // machine must not make it look dead.
        let patient = LockConfig {
            wake_spread: Duration::from_millis(50),
            ..counter_config()
        };
        let busy = LockClient::new(&urls(&nodes), patient).expect("lock client");
        let other = LockClient::new(&urls(&nodes), patient).expect("lock client");
        // The other client's connections open and its scripts load first:
        // on a loaded machine that alone outlasted several cohorts, which
        // the test would have counted as waiting for the lock.
        let warm = other
            .lock("warm-up", &LockOptions::new("other"))
            .await
            .expect("warm up");
        assert!(warm.unlock().await);
        let cohort = LockConfig::default().cohort_max as u64 + 1;
        let done = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicU64::new(0));
        let loops: Vec<_> = (0..4)
            .map(|t| {
                let (locks, done, taken) = (busy.clone(), done.clone(), taken.clone());
                tokio::spawn(async move {
                    let opts = LockOptions::new(format!("busy-{t}")).wait(Duration::from_secs(60));
                    // Bounded: far more grants than the bound allows.
                    for _ in 0..(cohort * 40) {
                        if done.load(Ordering::SeqCst) {
                            break;
                        }
                        let guard = locks.lock("hot", &opts).await.expect("lock");
                        taken.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        guard.unlock().await;
                    }
                })
            })
            .collect();
        // Wait until the busy client is at it.
        while taken.load(Ordering::SeqCst) < 10 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Three times over: a waiting client that got in by luck once
        // would not get in by luck every time.
        let mut waits = Vec::new();
        for _ in 0..3 {
            let asked_at = taken.load(Ordering::SeqCst);
            let guard = other
                .lock(
                    "hot",
                    &LockOptions::new("other").wait(Duration::from_secs(60)),
                )
                .await
                .expect("the other client gets the lock");
            waits.push(taken.load(Ordering::SeqCst) - asked_at);
            assert!(guard.unlock().await);
        }
        done.store(true, Ordering::SeqCst);
        for l in loops {
            l.await.expect("busy task");
        }
        assert!(
            waits.iter().all(|&w| w <= 3 * cohort),
            "{n} node(s): the other client waited through {waits:?} grants of the busy one \
             (a cohort is at most {cohort})"
        );
    }
}

/// A fixed-lease lock handed from one waiting task of a client to the next:
/// a first holder takes it, two tasks queue behind it, the first of them
/// gets it from the node (reserving tokens, since the other waits) and,
/// once the node's lease ran down to `down_to_ms`, hands it over. Returns
/// the ms left on the node before the hand-off, the second guard, and the
/// node's PTTL at the moment its `lock()` returned.
async fn hand_over_leased(
    nodes: &[RedisServer],
    name: &str,
    lease: Duration,
    down_to_ms: i64,
) -> (i64, flashsale::lock::LockGuard, i64) {
    let locks = unhurried_client(nodes, 64);
    let opts = |owner: &str| {
        LockOptions::new(owner)
            .lease(lease)
            .wait(Duration::from_secs(60))
    };
    let first = locks.lock(name, &opts("first")).await.expect("lock");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let middle = {
        let (locks, name, o) = (locks.clone(), name.to_owned(), opts("middle"));
        tokio::spawn(async move {
            let guard = locks.lock(&name, &o).await.expect("middle");
            let _ = tx.send(guard);
        })
    };
    until_queued(&locks, name, 1).await;
    let last = {
        let (locks, name, o) = (locks.clone(), name.to_owned(), opts("last"));
        tokio::spawn(async move { locks.lock(&name, &o).await })
    };
    until_queued(&locks, name, 2).await;
    assert!(first.unlock().await);
    let middle_guard = rx.await.expect("the middle task holds it");
    middle.await.expect("middle task");
    let key = format!("flashsale:lock:{name}");
    let pttl = || -> i64 { nodes[0].node.cmd(&["PTTL", &key]) };
    while pttl() > down_to_ms {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left_before = pttl();
    let t_middle = middle_guard.fencing_token();
    assert!(middle_guard.unlock().await);
    let second = last.await.expect("task").expect("handed over");
    let at_grant = pttl();
    assert_eq!(
        second.fencing_token(),
        t_middle + 1,
        "the last task took the lock over with the next reserved token"
    );
    (left_before, second, at_grant)
}

/// A task that takes a fixed-lease lock over gets its own lease, set on
/// the node behind it while most of the first lease is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_handed_over_starts_again_for_the_new_holder() {
    let nodes = servers(1);
    let (left_before, second, _) =
        hand_over_leased(&nodes, "leased", Duration::from_secs(30), 29_700).await;
    // The new lease is set right after the grant: wait for it (bounded).
    let pttl = || -> i64 { nodes[0].node.cmd(&["PTTL", "flashsale:lock:leased"]) };
    let mut left_after = pttl();
    for _ in 0..500 {
        if left_after > left_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        left_after = pttl();
    }
    assert!(
        left_after > left_before,
        "the new holder's lease ({left_after} ms left) is what remained of the first ({left_before} ms)"
    );
    assert!(second.unlock().await);
    let gone: i64 = nodes[0].node.cmd(&["EXISTS", "flashsale:lock:leased"]);
    assert_eq!(gone, 0, "the last holder's unlock frees the node");
}

/// With less than half of it left, the new lease is set on the node before
/// the new holder gets the lock: it never holds on a key about to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_handed_over_near_its_end_is_set_before_the_new_holder_holds() {
    let nodes = servers(1);
    let (left_before, second, at_grant) =
        hand_over_leased(&nodes, "short", Duration::from_millis(1_000), 400).await;
    assert!(
        at_grant > left_before + 300,
        "the node had {at_grant} ms left when the new holder got the lock, {left_before} before"
    );
    assert!(second.unlock().await);
}

/// Found by the attack on cohorting: a holder whose hand-over found its
/// waiter gone (it gave up after the holder looked) left the release to a
/// spawned task, so `unlock()` returned with the lock still on the node.
/// Now the grant comes back and `unlock()` releases it before returning. On
/// one thread a spawned release could not have run before the read below.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_that_gave_up_leaves_no_grant_stranded_in_its_client() {
    let nodes = servers(1);
    let locks = unhurried_client(&nodes, 64);
    let wait = Duration::from_secs(60);
    let (middle, last) = chain(
        &locks,
        "stranded",
        LockOptions::new("first"),
        LockOptions::new("middle").wait(wait),
        LockOptions::new("last").wait(wait),
    )
    .await;
    // The middle holder reserved tokens for the last task; it gives up.
    last.abort();
    assert!(last.await.is_err(), "the waiter was cancelled");
    assert!(middle.unlock().await);
    let held: i64 = nodes[0].node.cmd(&["EXISTS", "flashsale:lock:stranded"]);
    assert_eq!(held, 0, "unlock() returned with the lock still on the node");
}

/// Found by the attack on cohorting: a waiter count left on the node by a
/// client that died made every cohort end pause for the full pause (about
/// 50 ms), for the count's whole life (the dead waiter's wait + 5 s). After
/// one pause nobody used, the client stops pausing for a while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_waiter_count_makes_a_client_pause_for_nobody_at_most_once_a_second() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("recorder");
    let nodes = servers(1);
    // A waiter that died ten minutes into a long wait.
    let _: () = nodes[0]
        .node
        .cmd(&["SET", "flashsale:waiters:stale", "1", "PX", "600000"]);
    // Cohorts of 4: a hundred cohort ends in 400 grants.
    let locks = unhurried_client(&nodes, 4);
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let opts = LockOptions::new(format!("task-{t}")).wait(Duration::from_secs(60));
                for _ in 0..100 {
                    let guard = locks.lock("stale", &opts).await.expect("lock");
                    tokio::task::yield_now().await;
                    assert!(guard.unlock().await);
                }
            })
        })
        .collect();
    let started = std::time::Instant::now();
    for t in tasks {
        t.await.expect("task");
    }
    // Each pause counts as a wait; nothing else waits here (one client).
    let waits = recorder
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("flashsale_lock_waits_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64;
    let seconds = started.elapsed().as_secs() + 1;
    assert!(
        waits <= seconds,
        "{waits} pauses for nobody in {seconds} s (a hundred cohort ends)"
    );
}

/// Found by the attack on cohorting: a `try_lock` that is refused counted
/// itself among the waiters and out again (two script calls instead of
/// one), and a holder releasing in between paused for a caller already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_lock_is_one_call_and_counts_no_waiter() {
    let nodes = servers(1);
    let holder = counter_client(&nodes);
    let prober = counter_client(&nodes);
    let guard = holder
        .lock("probed", &LockOptions::new("holder"))
        .await
        .expect("lock");
    // Warm the prober up (scripts loaded, connection open).
    let warm = prober
        .try_lock("other", &LockOptions::new("prober"))
        .await
        .expect("nodes answer")
        .expect("free");
    assert!(warm.unlock().await);
    let before = evalsha_calls(&nodes[0]);
    let got = prober
        .try_lock("probed", &LockOptions::new("prober"))
        .await
        .expect("nodes answer");
    assert!(got.is_none(), "held by the holder");
    assert_eq!(
        evalsha_calls(&nodes[0]) - before,
        1,
        "one attempt, no count"
    );
    let count: Option<i64> = nodes[0].node.cmd(&["GET", "flashsale:waiters:probed"]);
    assert_eq!(count.unwrap_or(0), 0);
    assert!(guard.unlock().await);
}

/// Takes `name` with `first` options, then queues a middle task (`middle`)
/// and a last task (`last`) behind it; the first unlocks, so the middle one
/// gets the lock from the node with tokens reserved for the last. Returns
/// the middle guard and the last task's pending `lock()`.
async fn chain(
    locks: &LockClient,
    name: &str,
    first: LockOptions,
    middle: LockOptions,
    last: LockOptions,
) -> (
    flashsale::lock::LockGuard,
    tokio::task::JoinHandle<Result<flashsale::lock::LockGuard, flashsale::lock::LockError>>,
) {
    let guard = locks.lock(name, &first).await.expect("first");
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (locks, name) = (locks.clone(), name.to_owned());
        tokio::spawn(async move {
            let _ = tx.send(locks.lock(&name, &middle).await.expect("middle"));
        });
    }
    until_queued(locks, name, 1).await;
    let last = {
        let (locks, name) = (locks.clone(), name.to_owned());
        tokio::spawn(async move { locks.lock(&name, &last).await })
    };
    until_queued(locks, name, 2).await;
    assert!(guard.unlock().await);
    (rx.await.expect("middle holds"), last)
}

/// Found by the second attack on cohorting: a task taking over with a fixed
/// lease shorter than what the grant had left got the old (longer) validity
/// and set its lease in the background; with that round short of a
/// majority, it believed it held long after the nodes let the key go. On one
/// thread, and read before the task yields, the node shows which it was.
#[tokio::test(flavor = "current_thread")]
async fn a_shorter_fixed_lease_handed_over_is_set_before_the_new_holder_holds() {
    let nodes = servers(1);
    let locks = unhurried_client(&nodes, 64);
    let wait = Duration::from_secs(60);
    let first = locks
        .lock("shorter", &LockOptions::new("first"))
        .await
        .expect("first");
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let locks = locks.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new("middle").wait(wait);
            let _ = tx.send(locks.lock("shorter", &opts).await.expect("middle"));
        });
    }
    until_queued(&locks, "shorter", 1).await;
    let last = {
        let (locks, url) = (locks.clone(), nodes[0].url());
        tokio::spawn(async move {
            let opts = LockOptions::new("last")
                .lease(Duration::from_secs(2))
                .wait(wait);
            let guard = locks.lock("shorter", &opts).await.expect("last");
            // No await between the grant and this read.
            let mut conn = redis::Client::open(url)
                .and_then(|c| c.get_connection())
                .expect("node");
            let pttl: i64 = redis::cmd("PTTL")
                .arg("flashsale:lock:shorter")
                .query(&mut conn)
                .expect("pttl");
            (guard, pttl)
        })
    };
    until_queued(&locks, "shorter", 2).await;
    assert!(first.unlock().await);
    let middle = rx.await.expect("middle holds");
    let t = middle.fencing_token();
    assert!(middle.unlock().await);
    let (last, pttl) = last.await.expect("task");
    assert_eq!(last.fencing_token(), t + 1, "a hand-off");
    assert!(
        pttl <= 2_000,
        "the node kept the key {pttl} ms when the new holder got it, past its 2 s lease"
    );
    assert!(last.unlock().await);
}

/// Found by the second attack on cohorting: the lease set behind a hand-off
/// ran after the new holder's own `extend` and cut it back. On one thread
/// the holder's extend goes out first (the round behind it was only
/// spawned), which is the order that cut it.
#[tokio::test(flavor = "current_thread")]
async fn an_extend_right_after_a_hand_off_is_not_undone_by_the_lease_set_behind_it() {
    let nodes = servers(1);
    let locks = unhurried_client(&nodes, 64);
    let (lease, wait) = (Duration::from_millis(1_500), Duration::from_secs(60));
    let first = locks
        .lock("extended", &LockOptions::new("first"))
        .await
        .expect("first");
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let locks = locks.clone();
        let opts = LockOptions::new("middle").lease(lease).wait(wait);
        tokio::spawn(async move {
            let _ = tx.send(locks.lock("extended", &opts).await.expect("middle"));
        });
    }
    until_queued(&locks, "extended", 1).await;
    let last = {
        let locks = locks.clone();
        let opts = LockOptions::new("last").lease(lease).wait(wait);
        tokio::spawn(async move {
            let guard = locks.lock("extended", &opts).await.expect("last");
            guard.extend(Duration::from_secs(30)).await.expect("extend");
            guard
        })
    };
    until_queued(&locks, "extended", 2).await;
    assert!(first.unlock().await);
    let middle = rx.await.expect("middle holds");
    let t = middle.fencing_token();
    assert!(middle.unlock().await);
    let last = last.await.expect("task");
    assert_eq!(last.fencing_token(), t + 1, "a hand-off");
    // Whatever runs behind the hand-off has run once the lease it would
    // have set is over: the node must still have the key.
    let pttl = || -> i64 { nodes[0].node.cmd(&["PTTL", "flashsale:lock:extended"]) };
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            pttl() > 25_000,
            "the 30 s extension was cut to {} ms",
            pttl()
        );
    }
    assert!(!last.is_lost());
    assert!(last.unlock().await);
}

/// Found by the second attack on cohorting: each hand-off restarted the
/// watchdog, whose first renewal came a third of the ttl later; handed on
/// more often than that, the lock was never renewed and expired on the
/// node under a holder that was never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_on_faster_than_its_renewals_is_still_renewed() {
    let nodes = servers(1);
    let ttl = Duration::from_millis(1_500);
    let locks = LockClient::new(
        &urls(&nodes),
        LockConfig {
            watchdog_ttl: ttl,
            cohort_max: 255,
            cohort_window: Duration::from_secs(60),
            ..counter_config()
        },
    )
    .expect("lock client");
    // Both tasks queue behind a starter, so the grant the first of them
    // takes from the node reserves tokens for hand-offs to the other.
    let starter = locks
        .lock("renewed", &LockOptions::new("starter"))
        .await
        .expect("lock");
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..2)
        .map(|t| {
            let (locks, tokens) = (locks.clone(), tokens.clone());
            tokio::spawn(async move {
                let opts = LockOptions::new(format!("task-{t}")).wait(Duration::from_secs(60));
                // Each holds it a tenth of the ttl, 40 times between them:
                // about three ttls, never long enough for a renewal.
                for _ in 0..20 {
                    let guard = locks.lock("renewed", &opts).await.expect("lock");
                    tokens.lock().expect("tokens").push(guard.fencing_token());
                    tokio::time::sleep(ttl / 10).await;
                    assert!(!guard.is_lost());
                    assert!(
                        guard.unlock().await,
                        "the grant had run out under its holder"
                    );
                }
            })
        })
        .collect();
    until_queued(&locks, "renewed", 2).await;
    assert!(starter.unlock().await);
    for t in tasks {
        t.await.expect("task");
    }
    let tokens = tokens.lock().expect("tokens").clone();
    let handed = tokens.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert_eq!(
        handed,
        tokens.len() - 1,
        "every grant after the first was a hand-off: {tokens:?}"
    );
}
