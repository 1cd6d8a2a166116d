//! Semaphores with leased permits (`flashsale::lock::Semaphore`) against
//! real, independent redis-server lock nodes: never more holders than
//! permits across processes, a killed holder's permit back within its
//! lease, leases that end and extend, releases that never add a permit,
//! and the total changed live.

use std::time::{Duration, Instant};

use flashsale::lock::{LockClient, LockConfig, LockError, PermitOptions};
use flashsale_tests::{flashsale_cmd, RedisServer};

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(s: &[RedisServer]) -> Vec<String> {
    s.iter().map(|s| s.url()).collect()
}

fn client(s: &[RedisServer]) -> LockClient {
    LockClient::new(
        &urls(s),
        LockConfig {
            watchdog_ttl: Duration::from_secs(2),
            ..LockConfig::default()
        },
    )
    .expect("lock client")
}

/// 12 `flashsale semaphore exec` processes over 3 permits on 3 nodes: each
/// command counts itself in and out on a separate Redis, and records how
/// many were inside when it entered.
#[test]
fn twelve_processes_over_three_permits_never_exceed_three() {
    let nodes = servers(3);
    let data = RedisServer::start();
    let port = data.url().rsplit(':').next().unwrap_or_default().to_owned();
    let script = format!(
        "n=$(redis-cli -p {port} INCR inside); redis-cli -p {port} RPUSH seen \"$n $FLASHSALE_PERMIT_SLOT\" >/dev/null; \
         sleep 0.3; redis-cli -p {port} DECR inside >/dev/null"
    );
    let children: Vec<_> = (0..12)
        .map(|_| {
            flashsale_cmd(None, None, &urls(&nodes))
                .args([
                    "semaphore",
                    "exec",
                    "--name",
                    "pool",
                    "--permits",
                    "3",
                    "--lease",
                    "2s",
                    "--wait",
                    "120s",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ])
                .spawn()
                .expect("spawn semaphore exec")
        })
        .collect();
    for mut c in children {
        assert!(
            c.wait().expect("wait").success(),
            "every exec got a permit and ran"
        );
    }
    let seen: Vec<String> = data.node.cmd(&["LRANGE", "seen", "0", "-1"]);
    assert_eq!(seen.len(), 12, "every command ran once: {seen:?}");
    let most = seen
        .iter()
        .filter_map(|s| s.split(' ').next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    assert!(most <= 3, "at most 3 inside at once: {seen:?}");
    assert!(
        most >= 2,
        "permits were shared at once, not one at a time: {seen:?}"
    );
    let slots: std::collections::HashSet<&str> =
        seen.iter().filter_map(|s| s.split(' ').nth(1)).collect();
    assert!(
        slots.iter().all(|s| ["0", "1", "2"].contains(s)),
        "only the 3 slots: {slots:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_kill_9_gives_its_permit_back_within_the_lease() {
    let nodes = servers(3);
    let mut holder = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--name",
            "one",
            "--permits",
            "1",
            "--lease",
            "2s",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .expect("spawn semaphore exec");
    flashsale_tests::wait_for(
        Duration::from_secs(20),
        || {
            nodes[0]
                .node
                .cmd::<i64>(&["EXISTS", "flashsale:lock:sem\0one\x000"])
                == 1
        },
        || "the holder never took the permit".into(),
    );
    flashsale_tests::kill_9_with_children(&mut holder);
    let killed = Instant::now();
    let pttl: i64 = nodes[0].node.cmd(&["PTTL", "flashsale:lock:sem\0one\x000"]);
    assert!(
        pttl > 0,
        "the permit outlives its holder until its lease ends"
    );

    let sem = client(&nodes).semaphore("one").expect("semaphore");
    let opts = PermitOptions::new("next").wait(Duration::from_secs(30));
    assert!(
        sem.try_acquire(1, &opts).await.expect("try").is_none(),
        "not free while the dead holder's lease runs"
    );
    let permits = sem
        .acquire(1, &opts)
        .await
        .expect("the next waiter gets it");
    let waited = killed.elapsed();
    assert!(
        waited + Duration::from_millis(50) >= Duration::from_millis(pttl as u64),
        "not before the lease ends: {waited:?} < {pttl} ms"
    );
    assert!(
        waited <= Duration::from_millis(pttl as u64 + 8000),
        "soon after the lease ends: {waited:?}"
    );
    for p in permits {
        p.release().await.expect("release a live permit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_end_extend_and_an_expired_permit_says_so_on_release() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let sem = locks.semaphore("leased").expect("semaphore");
    sem.set_permits(2).await.expect("set");
    let fixed = PermitOptions::new("a")
        .lease(Duration::from_millis(600))
        .wait(Duration::ZERO);
    // Two permits are two slots, never one slot counted twice.
    let mut two = sem.acquire(2, &fixed).await.expect("both permits");
    assert_ne!(two[0].slot(), two[1].slot());
    assert_ne!(two[0].id(), two[1].id());
    assert!(
        sem.try_acquire(1, &fixed).await.expect("try").is_none(),
        "none left"
    );
    let kept = two.remove(0);
    let lapsed = two.remove(0);
    // One is extended past its first lease, the other left to lapse.
    kept.extend(Duration::from_secs(5))
        .await
        .expect("extend a live permit");
    lapsed.lost().await;
    assert!(kept.extend(Duration::from_secs(5)).await.is_ok());
    assert!(!kept.is_lost(), "the extended permit is still held");
    // Its release says it had expired (redisson#4086): nothing came back
    // from it, and its slot is free again for one new holder only.
    let slot = lapsed.slot();
    let err = lapsed.release().await.expect_err("an expired permit");
    assert!(matches!(err, LockError::Expired { .. }), "{err:?}");
    let again = sem
        .acquire(1, &fixed.clone().wait(Duration::from_secs(5)))
        .await
        .expect("the lapsed slot is free");
    assert_eq!(again[0].slot(), slot);
    assert!(
        sem.try_acquire(1, &fixed).await.expect("try").is_none(),
        "releasing an expired permit added no permit"
    );
    assert!(matches!(kept.extend(Duration::from_secs(1)).await, Ok(())));
    kept.release().await.expect("release the kept permit");
    for p in again {
        p.release().await.expect("release");
    }
    // Bad input: no change.
    assert!(matches!(
        sem.acquire(0, &fixed).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        sem.acquire(3, &fixed).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        sem.set_permits(0).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        sem.set_permits(1001).await,
        Err(LockError::Invalid(_))
    ));
    assert_eq!(sem.permits().await.expect("permits"), 2);
    assert!(matches!(locks.semaphore(""), Err(LockError::Invalid(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_permits_changes_the_total_live_and_wakes_a_waiter() {
    let nodes = servers(1);
    let locks = client(&nodes);
    let sem = locks.semaphore("live").expect("semaphore");
    sem.set_permits(1).await.expect("set 1");
    let opts = PermitOptions::new("x").wait(Duration::from_secs(30));
    let first = sem.acquire(1, &opts).await.expect("the one permit");
    let waiter = {
        let sem = sem.clone();
        let opts = opts.clone();
        tokio::spawn(async move { sem.acquire(1, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "waits while the one permit is held");
    sem.set_permits(2).await.expect("raise to 2");
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the raised total lets the waiter in")
        .expect("task")
        .expect("second permit");
    assert_ne!(second[0].slot(), first[0].slot());
    // Lowered back to 1: the holder of slot 1 keeps it until it releases,
    // and no new permit goes out while slot 0 is held.
    sem.set_permits(1).await.expect("lower to 1");
    assert_eq!(sem.permits().await.expect("permits"), 1);
    for p in second {
        p.release().await.expect("release slot 1");
    }
    assert!(sem.try_acquire(1, &opts).await.expect("try").is_none());
    // A release wakes a waiter at once (pub/sub), not at a poll.
    let waiter = {
        let sem = sem.clone();
        let opts = opts.clone();
        tokio::spawn(async move { sem.acquire(1, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in first {
        p.release().await.expect("release slot 0");
    }
    let third = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken")
        .expect("task")
        .expect("third permit");
    assert_eq!(third[0].slot(), 0);
}

fn alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
}

/// Found by the attack: only the command's own pid was signalled, so what
/// it started ran on after the permit was lost, and a kill -9 of the exec
/// left the command running once its lease ended: more than K commands at
/// once. The command now runs in its own process group, signalled as a
/// whole, and dies with the exec.
#[test]
fn nothing_the_command_started_outlives_a_lost_permit_or_a_killed_exec() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let pidfile = dir.path().join("grandchild");
    let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            // The test reads the command's pid file: host pids, the walk.
            "--no-pid-namespace",
            "--name",
            "g",
            "--permits",
            "1",
            "--lease",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn");
    let mut exec = exec;
    flashsale_tests::wait_for(
        Duration::from_secs(20),
        || std::fs::read_to_string(&pidfile).is_ok_and(|p| !p.trim().is_empty()),
        || "the command never started".into(),
    );
    let grandchild = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .to_owned();
    // The only lock node stops answering: the watchdog cannot renew.
    nodes[0].node.signal("STOP");
    let status = exec.wait().expect("wait");
    nodes[0].node.signal("CONT");
    assert_eq!(status.code(), Some(79), "the permit was lost");
    assert!(
        !alive(&grandchild),
        "the command's background job outlived the permit"
    );

    // kill -9 of the exec: its command dies with it.
    let exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--name",
            "k",
            "--permits",
            "1",
            "--lease",
            "1s",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .expect("spawn");
    let mut exec = exec;
    let child = {
        let mut found = String::new();
        flashsale_tests::wait_for(
            Duration::from_secs(20),
            || {
                let out = std::process::Command::new("pgrep")
                    .args(["-P", &exec.id().to_string()])
                    .output()
                    .expect("pgrep");
                found = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                !found.is_empty()
            },
            || "the command never started".into(),
        );
        found
    };
    exec.kill().expect("kill -9 the exec");
    let _ = exec.wait();
    flashsale_tests::wait_for(
        Duration::from_secs(10),
        || !alive(&child),
        || format!("the command {child} outlived its exec"),
    );
}

/// Found by the attack: a waiter looked at every slot with a lock attempt
/// each time (1,000 slots: thousands of scripts a second), an owner near
/// the length limit failed inside, and a huge lease wrapped to a short one
/// on the nodes while the holder believed it held. Now a look is one call
/// per node, and the bounds are typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_looks_with_one_call_per_node_and_bad_leases_and_owners_are_refused() {
    let nodes = servers(1);
    let holder = client(&nodes).semaphore("wide").expect("semaphore");
    holder.set_permits(50).await.expect("set");
    let all = holder
        .acquire(
            50,
            // Fixed leases: no watchdog renewals in the script count.
            &PermitOptions::new("holder")
                .lease(Duration::from_secs(60))
                .wait(Duration::from_secs(20)),
        )
        .await
        .expect("every permit");
    let waiter = client(&nodes).semaphore("wide").expect("semaphore");
    let calls = || -> u64 {
        let info: String = nodes[0].node.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let before = calls();
    let err = waiter
        .acquire(1, &PermitOptions::new("w").wait(Duration::from_secs(1)))
        .await
        .err()
        .expect("none free");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let used = calls() - before;
    // About 5 looks of 2 calls (the total, the free slots), plus counting
    // itself in and out as a waiter of each of the 50 slots once.
    assert!(
        used < 200,
        "{used} scripts for one waiter in 1 s over 50 held slots"
    );
    for p in all {
        p.release().await.expect("release");
    }

    let long_owner = "o".repeat(184);
    assert!(matches!(
        waiter.acquire(1, &PermitOptions::new(long_owner)).await,
        Err(LockError::Invalid(_))
    ));
    let huge = Duration::from_secs(25 * 3600);
    assert!(matches!(
        waiter
            .acquire(1, &PermitOptions::new("w").lease(huge))
            .await,
        Err(LockError::Invalid(_))
    ));
    let p = waiter
        .acquire(1, &PermitOptions::new("w").lease(Duration::from_secs(5)))
        .await
        .expect("a permit");
    assert!(matches!(
        p[0].extend(Duration::from_millis(u64::MAX)).await,
        Err(LockError::Invalid(_))
    ));
    assert!(!p[0].is_lost());
}
