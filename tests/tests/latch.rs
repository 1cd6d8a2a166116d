//! The count-down latch (`flashsale::lock::Latch`) against real,
//! independent redis-server lock nodes: it opens after exactly `count`
//! distinct count-downs and not before, a resent count-down counts once, a
//! waiter times out with a typed error, and count-downs that reached
//! different majorities still open it.

use std::time::Duration;

use flashsale::lock::{LockClient, LockConfig, LockError};
use flashsale_tests::RedisServer;

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn client(s: &[RedisServer]) -> LockClient {
    let urls: Vec<String> = s.iter().map(|s| s.url()).collect();
    LockClient::new(&urls, LockConfig::default()).expect("lock client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latch_opens_after_exactly_its_count_and_a_resent_count_down_counts_once() {
    let nodes = servers(3);
    // The waiter and the counters are separate clients, as separate
    // processes would be.
    let latch = client(&nodes).latch("batch-7").expect("latch");
    assert_eq!(latch.set_count(3).await.expect("set"), 3);
    assert_eq!(
        latch.set_count(5).await.expect("set again"),
        3,
        "the first count stays"
    );
    let waiter = {
        let latch = client(&nodes).latch("batch-7").expect("latch");
        tokio::spawn(async move { latch.wait(Duration::from_secs(30)).await })
    };
    let counter = client(&nodes).latch("batch-7").expect("latch");
    counter.count_down_as("worker-1").await.expect("down 1");
    counter.count_down_as("worker-2").await.expect("down 2");
    // worker-2 retries after a timeout: the same id counts once.
    counter.count_down_as("worker-2").await.expect("resent");
    assert_eq!(latch.remaining().await.expect("remaining"), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "not open with one count-down missing"
    );
    counter.count_down().await.expect("down 3");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter wakes")
        .expect("task")
        .expect("open");
    assert_eq!(latch.remaining().await.expect("remaining"), 0);
    latch
        .wait(Duration::ZERO)
        .await
        .expect("an open latch stays open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_latch_times_out_and_bad_input_changes_nothing() {
    let nodes = servers(1);
    let locks = client(&nodes);
    let latch = locks.latch("closed").expect("latch");
    assert!(
        matches!(latch.count_down().await, Err(LockError::Invalid(_))),
        "no count set"
    );
    // A waiter that comes before the count is set waits for it.
    assert!(matches!(
        latch.wait(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    latch.set_count(1).await.expect("set");
    let err = latch
        .wait(Duration::from_millis(300))
        .await
        .expect_err("closed");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(matches!(
        latch.set_count(0).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        latch.set_count(10_001).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        latch.count_down_as("").await,
        Err(LockError::Invalid(_))
    ));
    let long = "x".repeat(201);
    assert!(matches!(
        latch.count_down_as(&long).await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(locks.latch(""), Err(LockError::Invalid(_))));
    assert_eq!(
        latch.remaining().await.expect("remaining"),
        1,
        "nothing counted"
    );
}

/// Count 2 on 3 nodes; one count-down reaches A and B, the other B and C
/// (each sent by a client that knows only those two nodes). A counter would
/// end A = 1, B = 0, C = 1, with no majority at zero; the union of ids over
/// any majority has both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_downs_that_reached_different_majorities_still_open_the_latch() {
    let nodes = servers(3);
    let latch = client(&nodes).latch("split").expect("latch");
    latch.set_count(2).await.expect("set");
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let ab = LockClient::new(&[a.url(), b.url()], LockConfig::default()).expect("client");
    let bc = LockClient::new(&[b.url(), c.url()], LockConfig::default()).expect("client");
    ab.latch("split")
        .expect("latch")
        .count_down_as("one")
        .await
        .expect("down on A and B");
    bc.latch("split")
        .expect("latch")
        .count_down_as("two")
        .await
        .expect("down on B and C");
    let on_a: Vec<String> = a.node.cmd(&["SMEMBERS", "flashsale:latch:split:downs"]);
    let on_c: Vec<String> = c.node.cmd(&["SMEMBERS", "flashsale:latch:split:downs"]);
    assert_eq!(
        (on_a.len(), on_c.len()),
        (1, 1),
        "each saw one: {on_a:?} {on_c:?}"
    );
    // Any majority: a client over each pair of nodes.
    for (x, y) in [(a, b), (a, c), (b, c)] {
        let pair = LockClient::new(&[x.url(), y.url()], LockConfig::default()).expect("client");
        let left = pair.latch("split").expect("latch").remaining().await;
        assert_eq!(
            left.expect("both answer"),
            0,
            "open on {} and {}",
            x.url(),
            y.url()
        );
    }
    latch.wait(Duration::from_secs(5)).await.expect("open");
    // Two nodes frozen: no majority, a typed error.
    a.node.signal("STOP");
    b.node.signal("STOP");
    let r = latch.remaining().await;
    a.node.signal("CONT");
    b.node.signal("CONT");
    assert!(matches!(r, Err(LockError::NoQuorum { .. })), "{r:?}");
}

/// Found by the attack: a count set on two nodes and another count set
/// later on the third made readers disagree (one opened, another never
/// would), and ids kept piling up after the latch opened. Now a count
/// already set is copied to the nodes that lack it, nodes that hold two
/// counts are a typed error for every reader, and an open latch records no
/// more ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_take_different_counts_and_an_open_latch_stops_growing() {
    let nodes = servers(3);
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let pair = |x: &RedisServer, y: &RedisServer| {
        LockClient::new(&[x.url(), y.url()], LockConfig::default()).expect("client")
    };
    // Set on A and B only; a later set_count with another count keeps it
    // and copies it to C.
    assert_eq!(
        pair(a, b)
            .latch("l")
            .expect("latch")
            .set_count(2)
            .await
            .expect("set"),
        2
    );
    let all = client(&nodes).latch("l").expect("latch");
    assert_eq!(
        all.set_count(5).await.expect("set again"),
        2,
        "the first count stays"
    );
    assert_eq!(
        c.node.cmd::<String>(&["GET", "flashsale:latch:l:count"]),
        "2"
    );
    // Two counts on the nodes (written behind the latch's back, as a
    // partial set_count on a minority would leave): every reader refuses.
    let _: () = c.node.cmd(&["SET", "flashsale:latch:l:count", "5"]);
    assert!(matches!(all.remaining().await, Err(LockError::Invalid(_))));
    assert!(matches!(
        all.wait(Duration::from_millis(200)).await,
        Err(LockError::Invalid(_))
    ));
    let _: () = c.node.cmd(&["SET", "flashsale:latch:l:count", "2"]);
    // Open after two; later count-downs are not recorded.
    for id in ["w1", "w2", "w3", "w4"] {
        all.count_down_as(id).await.expect("down");
    }
    all.wait(Duration::from_secs(5)).await.expect("open");
    for n in &nodes {
        assert_eq!(n.node.cmd::<i64>(&["SCARD", "flashsale:latch:l:downs"]), 2);
    }
}

/// `cmd key` (PTTL, PEXPIRETIME: -2 no such key, -1 no expiry) on each node.
fn on_each(nodes: &[RedisServer], cmd: &str, key: &str) -> Vec<i64> {
    nodes.iter().map(|n| n.node.cmd(&[cmd, key])).collect()
}

/// The PTTL of `key` on each node.
fn pttls(nodes: &[RedisServer], key: &str) -> Vec<i64> {
    on_each(nodes, "PTTL", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_given_a_lifetime_leaves_no_key_without_an_expiry_on_any_node() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let count_key = "flashsale:latch:nightly-7:count";
    let downs_key = "flashsale:latch:nightly-7:downs";
    let latch = locks.latch("nightly-7").expect("latch");
    // A lifetime out of bounds is refused before anything is written.
    for bad in [Duration::ZERO, Duration::from_secs(366 * 24 * 3600)] {
        assert!(
            matches!(
                latch.set_count_for(2, bad).await,
                Err(LockError::Invalid(_))
            ),
            "lifetime {bad:?}"
        );
        assert_eq!(pttls(&nodes, count_key), vec![-2; 3], "nothing written");
    }
    let hour = 3_600_000;
    assert_eq!(
        latch
            .set_count_for(2, Duration::from_millis(hour as u64))
            .await
            .expect("set"),
        2
    );
    for t in pttls(&nodes, count_key) {
        assert!(t > 0 && t <= hour, "the count expires on every node: {t}");
    }
    latch.count_down_as("a").await.expect("down");
    latch.count_down_as("b").await.expect("down");
    for t in pttls(&nodes, downs_key) {
        assert!(
            t > 0 && t <= hour,
            "the count-downs expire with the count on every node: {t}"
        );
    }
    latch.wait(Duration::ZERO).await.expect("open");

    // A latch set without a lifetime keeps its keys, as before.
    let forever = locks.latch("forever").expect("latch");
    forever.set_count(1).await.expect("set");
    forever.count_down_as("a").await.expect("down");
    assert_eq!(pttls(&nodes, "flashsale:latch:forever:count"), vec![-1; 3]);
    assert_eq!(pttls(&nodes, "flashsale:latch:forever:downs"), vec![-1; 3]);

    // A short lifetime ends: both keys go from every node.
    let brief = locks.latch("brief").expect("latch");
    brief
        .set_count_for(2, Duration::from_millis(300))
        .await
        .expect("set");
    brief.count_down_as("a").await.expect("down");
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let left: i64 = nodes
                .iter()
                .map(|n| {
                    n.node.cmd::<i64>(&[
                        "EXISTS",
                        "flashsale:latch:brief:count",
                        "flashsale:latch:brief:downs",
                    ])
                })
                .sum();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the keys outlived the latch's lifetime");
}

/// The PEXPIRETIME of `key` on each node.
fn deadlines(nodes: &[RedisServer], key: &str) -> Vec<i64> {
    on_each(nodes, "PEXPIRETIME", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lacked_the_count_gets_the_latchs_own_deadline_not_a_fresh_one() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let count_key = "flashsale:latch:job-9:count";
    let downs_key = "flashsale:latch:job-9:downs";
    let latch = locks.latch("job-9").expect("latch");
    latch
        .set_count_for(2, Duration::from_secs(600))
        .await
        .expect("set");
    let deadline = deadlines(&nodes, count_key)[0];
    assert!(deadline > 0);
    assert_eq!(
        deadlines(&nodes, count_key),
        vec![deadline; 3],
        "one deadline on every node"
    );

    // Node 3 lost the latch (it was down when the count was set, say).
    let _: i64 = nodes[2].node.cmd(&["DEL", count_key]);
    // A later call, with another lifetime, copies the count there: with the
    // latch's own deadline, so node 3 cannot keep it after the others.
    latch
        .set_count_for(2, Duration::from_secs(3600))
        .await
        .expect("set again");
    assert_eq!(deadlines(&nodes, count_key), vec![deadline; 3]);
    // So does a call without a lifetime: the copy never lives for good.
    let _: i64 = nodes[2].node.cmd(&["DEL", count_key]);
    latch.set_count(2).await.expect("set without a lifetime");
    assert_eq!(deadlines(&nodes, count_key), vec![deadline; 3]);

    // A set of count-downs left without an expiry (by a count-down from an
    // engine before lifetimes, say) takes the count's at the next one.
    let _: i64 = nodes[0].node.cmd(&["SADD", downs_key, "old"]);
    latch.count_down_as("a").await.expect("down");
    assert_eq!(deadlines(&nodes, downs_key), vec![deadline; 3]);

    // An init that reaches a node after the latch's deadline (a node that
    // answered late) creates nothing there.
    let script = include_str!("../../lua/latch.lua");
    let past = (deadline - 600_000 - 1).to_string();
    let reply: redis::Value = nodes[0].node.cmd(&[
        "EVAL",
        script,
        "2",
        "flashsale:latch:late:count",
        "flashsale:latch:late:downs",
        "init",
        "2",
        &past,
    ]);
    let exists: i64 = nodes[0].node.cmd(&["EXISTS", "flashsale:latch:late:count"]);
    assert_eq!(exists, 0, "a past deadline made a count: {reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_would_end_a_latch_at_different_times_are_a_typed_error_not_an_opening() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let count_key = "flashsale:latch:split:count";
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        + 600_000)
        .to_string();
    // Two setters raced: the one with a lifetime reached nodes 1 and 2
    // first, the one without (set_count) node 3.
    let _: String = nodes[0].node.cmd(&["SET", count_key, "1", "PXAT", &far]);
    let _: String = nodes[1].node.cmd(&["SET", count_key, "1", "PXAT", &far]);
    let _: String = nodes[2].node.cmd(&["SET", count_key, "1"]);
    let latch = locks.latch("split").expect("latch");
    latch.count_down_as("a").await.expect("down");
    // Node 3 would hold the count, open, after the others dropped it: the
    // readers say the nodes disagree instead of taking either.
    for r in [
        latch.remaining().await.map(|_| ()),
        latch.wait(Duration::ZERO).await,
        latch
            .set_count_for(1, Duration::from_secs(3600))
            .await
            .map(|_| ()),
    ] {
        assert!(
            matches!(&r, Err(LockError::Invalid(m)) if m.contains("different times")),
            "{r:?}"
        );
    }

    // A set of count-downs filled without an expiry (by an older engine's
    // count-downs) takes the count's at the next count-down, which adds
    // nothing to it.
    let full = locks.latch("full").expect("latch");
    full.set_count_for(1, Duration::from_secs(600))
        .await
        .expect("set");
    for n in &nodes {
        let _: i64 = n.node.cmd(&["SADD", "flashsale:latch:full:downs", "old"]);
    }
    full.count_down_as("x").await.expect("down");
    let ends = deadlines(&nodes, "flashsale:latch:full:count");
    assert!(ends[0] > 0);
    assert_eq!(deadlines(&nodes, "flashsale:latch:full:downs"), ends);
}
