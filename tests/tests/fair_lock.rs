//! Fair locks (`LockOptions::fair`) on real, independent redis-server lock
//! nodes: grants in arrival order across processes and across the tasks of
//! one process, a waiter that died queued costs at most its entry lease,
//! and a waiter that gives up or is dropped leaves the queue at once.

use std::process::Child;
use std::time::{Duration, Instant};

use flashsale::lock::{LockClient, LockConfig, LockOptions};
use flashsale_tests::{flashsale_cmd, wait_for, RedisServer};

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(s: &[RedisServer]) -> Vec<String> {
    s.iter().map(|s| s.url()).collect()
}

fn client(s: &[RedisServer], queue_lease: Duration) -> LockClient {
    LockClient::new(
        &urls(s),
        LockConfig {
            watchdog_ttl: Duration::from_secs(3),
            queue_lease,
            ..LockConfig::default()
        },
    )
    .expect("lock client")
}

/// Entries in the fair queue of `name` on each node.
fn queued(nodes: &[RedisServer], name: &str) -> Vec<i64> {
    let key = format!("flashsale:fairq:{name}");
    nodes.iter().map(|n| n.node.cmd(&["ZCARD", &key])).collect()
}

/// Waits until every node has `n` entries queued for `name`.
fn wait_queued(nodes: &[RedisServer], name: &str, n: i64) {
    wait_for(
        Duration::from_secs(30),
        || queued(nodes, name).iter().all(|&q| q == n),
        || format!("{n} waiters never queued: {:?}", queued(nodes, name)),
    );
}

fn port_of(s: &RedisServer) -> String {
    s.url().rsplit(':').next().unwrap_or_default().to_owned()
}

/// The scenario: 8 `lock exec --fair` processes queued 100 ms apart
/// behind a holder, on 3 nodes; the fourth is killed (kill -9) while queued.
/// The other seven run in the order they queued, and the dead one holds the
/// line up for at most its entry lease (the CLI's default, 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_get_a_fair_lock_in_arrival_order_even_when_one_dies_queued() {
    let nodes = servers(3);
    let data = RedisServer::start();
    let port = port_of(&data);
    let holder_client = client(&nodes, Duration::from_secs(2));
    let opts = LockOptions::new("holder").fair();
    let holder = holder_client.lock("line", &opts).await.expect("holder");

    let mut children: Vec<Child> = Vec::new();
    for i in 0..8 {
        let script =
            format!("redis-cli -p {port} RPUSH order \"{i} $(date +%s%3N)\" >/dev/null; sleep 0.1");
        let child = flashsale_cmd(None, None, &urls(&nodes))
            .args([
                "lock", "exec", "--fair", "--name", "line", "--wait", "120s", "--owner",
            ])
            .arg(format!("p{i}"))
            .args(["--", "sh", "-c", &script])
            .spawn()
            .expect("spawn lock exec --fair");
        children.push(child);
        wait_queued(&nodes, "line", i + 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    flashsale_tests::kill_9_with_children(&mut children[3]);
    assert!(holder.unlock().await, "the holder still held the lock");

    for (i, c) in children.iter_mut().enumerate() {
        if i == 3 {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(s) = c.try_wait().expect("wait") {
                break s;
            }
            assert!(Instant::now() < deadline, "process {i} never finished");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "process {i}: {status}");
    }
    let order: Vec<String> = data.node.cmd(&["LRANGE", "order", "0", "-1"]);
    let ids: Vec<&str> = order
        .iter()
        .map(|e| e.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["0", "1", "2", "4", "5", "6", "7"], "{order:?}");
    let at = |i: usize| -> i64 {
        order[i]
            .split(' ')
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or_default()
    };
    // 2 ran for 0.1 s; then the dead 3 was first in line until its entry's
    // lease (2 s from its last renewal, before the kill) ended.
    let stall = at(3) - at(2);
    eprintln!("the dead waiter held the line up for {stall} ms");
    assert!(
        stall <= 2_000 + 100 + 3_000,
        "the dead waiter cost more than its lease: {stall} ms"
    );
    assert_eq!(
        queued(&nodes, "line"),
        [0, 0, 0],
        "the queue is empty after"
    );
}

/// Tasks of one process queue on the nodes too (no local gate in front):
/// six tasks queued 50 ms apart on 3 nodes get the lock in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_process_get_a_fair_lock_in_arrival_order() {
    let nodes = servers(3);
    let c = client(&nodes, Duration::from_secs(2));
    let holder = c
        .lock("tasks", &LockOptions::new("holder").fair())
        .await
        .expect("holder");
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (c, order) = (c.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new(format!("t{i}"))
                .fair()
                .wait(Duration::from_secs(60));
            let g = c.lock("tasks", &opts).await.expect("a fair waiter");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(g.unlock().await);
        }));
        wait_queued(&nodes, "tasks", i + 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(holder.unlock().await);
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().expect("order"), [0, 1, 2, 3, 4, 5]);
}

/// A waiter that is dropped (a timeout around `lock`) or gives up leaves the
/// queue on every node at once, not when its entry lease (here a minute)
/// ends, so the next waiter is not held up; `try_lock` of a fair lock does
/// not jump the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_that_gives_up_or_is_dropped_leaves_the_queue_at_once() {
    let nodes = servers(3);
    let c = client(&nodes, Duration::from_secs(60));
    let holder = c
        .lock("q", &LockOptions::new("holder").fair())
        .await
        .expect("holder");

    let impatient = LockOptions::new("impatient").fair();
    let dropped = tokio::time::timeout(Duration::from_millis(600), c.lock("q", &impatient));
    let c2 = c.clone();
    let watcher = tokio::spawn(async move {
        c2.lock(
            "q",
            &LockOptions::new("gives-up")
                .fair()
                .wait(Duration::from_millis(900)),
        )
        .await
    });
    assert!(dropped.await.is_err(), "the dropped waiter never got it");
    assert!(
        watcher.await.expect("task").is_err(),
        "the waiter that gave up never got it"
    );
    let started = Instant::now();
    wait_queued(&nodes, "q", 0);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "left by the dequeue, not by the minute-long lease"
    );

    // A waiter queues; the lock is then free, but try_lock from someone
    // else must not take it ahead of the waiter.
    let (c3, order) = (
        c.clone(),
        std::sync::Arc::new(std::sync::Mutex::new(Vec::<&str>::new())),
    );
    let o = order.clone();
    let waiter = tokio::spawn(async move {
        let g = c3
            .lock(
                "q",
                &LockOptions::new("waiter")
                    .fair()
                    .wait(Duration::from_secs(60)),
            )
            .await
            .expect("the queued waiter");
        o.lock().expect("order").push("waiter");
        g
    });
    wait_queued(&nodes, "q", 1);
    let other = LockClient::new(&urls(&nodes), LockConfig::default()).expect("client");
    assert!(holder.unlock().await);
    let jumped = other
        .try_lock("q", &LockOptions::new("jumper").fair())
        .await
        .expect("try_lock");
    if let Some(j) = jumped {
        panic!(
            "try_lock took the lock ahead of a queued waiter (token {})",
            j.fencing_token()
        );
    }
    let g = waiter.await.expect("task");
    assert_eq!(*order.lock().expect("order"), ["waiter"]);
    assert!(g.unlock().await);
}

/// Found by the attack: `lock exec` that gave up (exit 75) left its queue
/// entry behind (the dequeue ran in a task the exit cancelled), holding the
/// fair queue, or the readers behind a waiting writer, up for its lease.
/// Now a call that fails leaves the queue before it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_exec_that_gives_up_leaves_the_queue_before_it_exits() {
    let nodes = servers(3);
    let c = client(&nodes, Duration::from_secs(60));
    let fair = c
        .lock("gives-up", &LockOptions::new("holder").fair())
        .await
        .expect("holder");
    let reader = c
        .read_lock("gives-up", &LockOptions::new("reader"))
        .await
        .expect("reader");
    for side in ["--fair", "--write"] {
        let out = flashsale_cmd(None, None, &urls(&nodes))
            .args([
                "lock", "exec", side, "--name", "gives-up", "--wait", "300ms",
            ])
            .args(["--", "true"])
            .output()
            .expect("run lock exec");
        assert_eq!(out.status.code(), Some(75), "{side}: {out:?}");
        let key = if side == "--fair" {
            "flashsale:fairq:gives-up"
        } else {
            "flashsale:rwq:gives-up"
        };
        let left: Vec<i64> = nodes.iter().map(|n| n.node.cmd(&["ZCARD", key])).collect();
        assert_eq!(left, [0, 0, 0], "{side}: entries left when it exited");
    }
    assert!(fair.unlock().await);
    assert!(reader.unlock().await);
}
