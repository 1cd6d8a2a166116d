//! One request, one order, one answer, under retries, timeouts and crashes
//! half-way; admin operations applied exactly once and never left half-done.
//! Each test reproduces, on a real cluster, a defect a review found: the
//! crash is real (the engine that ran the first half is dropped while the
//! node it was waiting on is paused, so the rest never runs), the timeout is
//! real (`CLIENT PAUSE ... WRITE` on the bucket's master).

use std::time::Duration;

use flashsale::{Engine, PurchaseError, PurchaseRequest, SaleSpec, SaleStatus};
use flashsale_tests::{
    engine_on, engine_with, stream_orders, user_with_home, wait_until, RedisCluster,
};

fn req<'a>(sku: &'a str, user: &'a str, qty: i64, request_id: &'a str) -> PurchaseRequest<'a> {
    PurchaseRequest {
        sku,
        user,
        qty,
        request_id,
    }
}

/// Where an abandoned fall-through's process "dies".
#[derive(Clone, Copy, PartialEq, Eq)]
enum Abandon {
    /// After purchase.lua left the request pending in the home bucket, before
    /// any other bucket was asked.
    BeforeTake,
    /// After bucket `other` took the stock, before the home bucket was settled.
    AfterTake,
}

/// Runs a purchase of `user` (whose home bucket is `home`) that falls
/// through to bucket `other`, and kills it at `how`: a fresh engine runs it
/// while the node it would talk to next is paused, then that engine is
/// dropped (its connections close, so the paused command never runs).
#[allow(clippy::too_many_arguments)]
async fn abandon_fall_through(
    cluster: &RedisCluster,
    status: &SaleStatus,
    user: &str,
    rid: &str,
    qty: i64,
    home: usize,
    other: usize,
    how: Abandon,
) {
    let home_b = &status.buckets[home];
    let other_b = &status.buckets[other];
    let home_node = cluster.node(cluster.master_of_slot(home_b.slot));
    let other_node = cluster.node(cluster.master_of_slot(other_b.slot));
    assert_ne!(
        home_node.port, other_node.port,
        "buckets on distinct masters"
    );
    let (home_clients, other_clients) = (
        home_node.connected_clients(),
        other_node.connected_clients(),
    );
    let other_len: usize = other_node.cmd(&["XLEN", &other_b.stream]);
    // It keeps retrying (it must still be waiting on the paused node when
    // the test lets the next step through, however slow the machine).
    let doomed = engine_with(cluster, |c| c.retry.deadline = Duration::from_secs(120)).await;
    let _: () = other_node.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    let buyer = {
        let (e, sku, user, rid) = (
            doomed.clone(),
            status.sku.clone(),
            user.to_owned(),
            rid.to_owned(),
        );
        tokio::spawn(async move { e.purchase(req(&sku, &user, qty, &rid)).await })
    };
    // This request's own record (other users may have records there).
    let record = format!("{{{}}}:r:{}:{user}:{rid}", home_b.tag, user.len());
    wait_until(Duration::from_secs(60), "the request is pending", || {
        let n: i64 = home_node.cmd(&["EXISTS", &record]);
        async move { n == 1 }
    })
    .await;
    let (paused, clients) = match how {
        Abandon::BeforeTake => (other_node, other_clients),
        Abandon::AfterTake => {
            let _: () = home_node.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
            let _: () = other_node.cmd(&["CLIENT", "UNPAUSE"]);
            wait_until(Duration::from_secs(60), "the other bucket took", || {
                let n: usize = other_node.cmd(&["XLEN", &other_b.stream]);
                async move { n > other_len }
            })
            .await;
            (home_node, home_clients)
        }
    };
    buyer.abort();
    let _ = buyer.await;
    drop(doomed);
    wait_until(
        Duration::from_secs(20),
        "the dead engine's connections close",
        || {
            let n = paused.connected_clients();
            async move { n <= clients }
        },
    )
    .await;
    let _: () = paused.cmd(&["CLIENT", "UNPAUSE"]);
    if how == Abandon::BeforeTake {
        let took: usize = other_node.cmd(&["XLEN", &other_b.stream]);
        assert_eq!(took, other_len, "setup: the dead engine's take never ran");
    }
}

/// An engine whose sweeper settles a fall-through pending for 500 ms.
async fn sweeping_engine(cluster: &RedisCluster) -> Engine {
    engine_with(cluster, |c| {
        c.pending_timeout = Duration::from_millis(500);
    })
    .await
}

/// Runs the sweeper until a pass settles something.
async fn sweep_until_settled(engine: &Engine) {
    wait_until(Duration::from_secs(20), "the sweeper settles it", || {
        let e = engine.clone();
        async move { e.settle_abandoned().await.expect("sweep").settled > 0 }
    })
    .await;
}

async fn sale(engine: &Engine, spec: SaleSpec) -> SaleStatus {
    engine.create_sale(spec).await.expect("create sale")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_request_id_is_a_different_request() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    sale(&engine, SaleSpec::new("shared-id", 10)).await;
    let alice = engine
        .purchase(req("shared-id", "alice", 1, "rid-1"))
        .await
        .expect("alice buys");
    let bob = engine
        .purchase(req("shared-id", "bob", 1, "rid-1"))
        .await
        .expect("bob buys with the same request id");
    assert!(!bob.replayed, "bob's request is his own, not a replay");
    assert_ne!(bob.order_id, alice.order_id, "bob never sees alice's order");
    let status = engine.sale_status("shared-id").await.expect("status");
    let users: Vec<String> = stream_orders(&cluster, &status)
        .into_iter()
        .map(|(_, u)| u)
        .collect();
    assert_eq!(users.len(), 2, "two users, two orders: {users:?}");
    assert_eq!(status.remaining, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_request_id_with_other_qty_is_refused_and_changes_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // Two buckets: the first unit sits in bucket 0, so carol (home 1) falls
    // through and dave (home 0) buys at home.
    sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 2,
            ..SaleSpec::new("mismatch", 10)
        },
    )
    .await;
    let carol = user_with_home("carol", 2, 1);
    let dave = user_with_home("dave", 2, 0);
    for user in [&carol, &dave] {
        let first = engine
            .purchase(req("mismatch", user, 1, "r1"))
            .await
            .expect("first try confirms");
        let other = engine.purchase(req("mismatch", user, 2, "r1")).await;
        assert_eq!(
            other,
            Err(PurchaseError::RequestMismatch),
            "{user}: same request id, other qty"
        );
        let again = engine
            .purchase(req("mismatch", user, 1, "r1"))
            .await
            .expect("the real retry");
        assert_eq!(again.order_id, first.order_id);
        // The limit is 2 and the user holds 1: one more unit, not two.
        engine
            .purchase(req("mismatch", user, 1, "r2"))
            .await
            .expect("a second unit is within the limit");
        let over = engine.purchase(req("mismatch", user, 1, "r3")).await;
        assert!(
            matches!(over, Err(PurchaseError::LimitExceeded { limit: 2, .. })),
            "{user}: {over:?}"
        );
    }
    let status = engine.sale_status("mismatch").await.expect("status");
    assert_eq!(status.remaining, 6, "four units sold, no more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_retry_after_restock_never_makes_a_second_order() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // Stock 1 over 3 buckets: only bucket 0 has a unit. Erin's home is
    // bucket 1, so she walks bucket 2 (empty) then bucket 0 (takes).
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 3,
            per_user_limit: 5,
            ..SaleSpec::new("restock-race", 1)
        },
    )
    .await;
    let erin = user_with_home("erin", 3, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &erin,
        "erin-1",
        1,
        1,
        0,
        Abandon::AfterTake,
    )
    .await;
    // Every bucket gets a unit, bucket 2 (which erin found empty) included.
    engine.restock("restock-race", 3).await.expect("restock");
    let retry = engine
        .purchase(req("restock-race", &erin, 1, "erin-1"))
        .await
        .expect("the retry gets the first attempt's order");
    let status = engine.sale_status("restock-race").await.expect("status");
    let orders = stream_orders(&cluster, &status);
    assert_eq!(orders.len(), 1, "one request, one order: {orders:?}");
    assert_eq!(retry.order_id, orders[0].0);
    assert_eq!(status.remaining, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_of_a_confirmed_request_is_not_answered_by_the_sold_out_flag() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    sale(&engine, SaleSpec::new("last-unit", 1)).await;
    let alice = engine
        .purchase(req("last-unit", "alice", 1, "a1"))
        .await
        .expect("alice buys the last unit");
    assert_eq!(
        engine.purchase(req("last-unit", "bob", 1, "b1")).await,
        Err(PurchaseError::SoldOut)
    );
    let local_before = engine
        .stats()
        .sold_out_local
        .load(std::sync::atomic::Ordering::Relaxed);
    let retry = engine
        .purchase(req("last-unit", "alice", 1, "a1"))
        .await
        .expect("alice's retry keeps her order");
    assert_eq!(retry.order_id, alice.order_id);
    assert!(retry.replayed);
    // The flag still spares the purchase script for new requests.
    assert_eq!(
        engine.purchase(req("last-unit", "carl", 1, "c1")).await,
        Err(PurchaseError::SoldOut)
    );
    let local_after = engine
        .stats()
        .sold_out_local
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(local_after > local_before, "new requests meet the flag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_fall_through_is_settled_without_the_buyer() {
    let cluster = RedisCluster::start(3, 0);
    let engine = sweeping_engine(&cluster).await;
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("abandoned", 1)
        },
    )
    .await;
    let frank = user_with_home("frank", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &frank,
        "frank-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    // Nobody retries. The sweeper settles the request: no bucket took
    // stock, so frank's reserved quota comes back, exactly once.
    let mut settled = 0;
    sweep_until_settled(&engine).await;
    settled += 1;
    let again = engine.settle_abandoned().await.expect("sweep again");
    assert_eq!(again.settled, 0, "settled once ({settled} then none)");
    let bought = engine
        .purchase(req("abandoned", &frank, 1, "frank-2"))
        .await
        .expect("frank is not held at his limit by a dead attempt");
    assert_eq!(bought.bucket, 0);
    let status = engine.sale_status("abandoned").await.expect("status");
    assert_eq!(stream_orders(&cluster, &status).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_fall_through_that_took_stock_is_settled_as_confirmed() {
    let cluster = RedisCluster::start(3, 0);
    let engine = sweeping_engine(&cluster).await;
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("abandoned-took", 5)
        },
    )
    .await;
    // Bucket 1 is emptied first, so gina (home 1) must fall through.
    let h1 = user_with_home("h1", 2, 1);
    engine
        .purchase(req("abandoned-took", &h1, 1, "h1-a"))
        .await
        .expect("bucket 1's first unit");
    let h2 = user_with_home("h2", 2, 1);
    engine
        .purchase(req("abandoned-took", &h2, 1, "h2-a"))
        .await
        .expect("bucket 1's second unit");
    let gina = user_with_home("gina", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &gina,
        "gina-1",
        1,
        1,
        0,
        Abandon::AfterTake,
    )
    .await;
    sweep_until_settled(&engine).await;
    // The unit is hers: the limit of 1 holds, and her retry gets the order.
    let over = engine
        .purchase(req("abandoned-took", &gina, 1, "gina-2"))
        .await;
    assert!(
        matches!(over, Err(PurchaseError::LimitExceeded { .. })),
        "{over:?}"
    );
    let retry = engine
        .purchase(req("abandoned-took", &gina, 1, "gina-1"))
        .await
        .expect("the order the dead attempt made");
    let status = engine.sale_status("abandoned-took").await.expect("status");
    let orders = stream_orders(&cluster, &status);
    assert_eq!(orders.len(), 3);
    assert!(orders.iter().any(|(id, _)| *id == retry.order_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_retry_after_the_window_ends_does_not_sell() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let ends = std::time::SystemTime::now() + Duration::from_secs(4);
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            ends_at: Some(ends),
            ..SaleSpec::new("window", 1)
        },
    )
    .await;
    let hank = user_with_home("hank", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &hank,
        "hank-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    // The window is Redis's clock: wait until the bucket's master says so.
    let ends_ms = ends
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64;
    let node = cluster.node(cluster.master_of_slot(status.buckets[1].slot));
    wait_until(Duration::from_secs(30), "the window ends", || {
        let (secs, micros): (u64, u64) = node.cmd(&["TIME"]);
        async move { secs * 1000 + micros / 1000 > ends_ms }
    })
    .await;
    let late = engine.purchase(req("window", &hank, 1, "hank-1")).await;
    assert_eq!(late, Err(PurchaseError::Ended), "no sale after the end");
    let status = engine.sale_status("window").await.expect("status");
    assert!(stream_orders(&cluster, &status).is_empty());
    assert_eq!(status.remaining, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_holds_for_the_whole_sale_not_per_request_ttl() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_with(&cluster, |c| {
        c.request_ttl = Duration::from_secs(1);
        c.pending_timeout = Duration::from_millis(500);
    })
    .await;
    let status = sale(
        &engine,
        SaleSpec {
            per_user_limit: 1,
            ..SaleSpec::new("long-sale", 10)
        },
    )
    .await;
    engine
        .purchase(req("long-sale", "ivy", 1, "ivy-1"))
        .await
        .expect("ivy buys her one unit");
    let node = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    let records = format!("{{{}}}:r:*", status.buckets[0].tag);
    wait_until(Duration::from_secs(20), "request records expire", || {
        let n = node.keys(&records).len();
        async move { n == 0 }
    })
    .await;
    let again = engine.purchase(req("long-sale", "ivy", 1, "ivy-2")).await;
    assert!(
        matches!(again, Err(PurchaseError::LimitExceeded { limit: 1, .. })),
        "the limit is per sale: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_retry_does_not_raise_a_false_sold_out() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // Bucket 0 has the only unit; jack (home 1) is left pending.
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 5,
            ..SaleSpec::new("false-flag", 1)
        },
    )
    .await;
    let jack = user_with_home("jack", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &jack,
        "jack-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    let v0 = user_with_home("v0", 2, 0);
    engine
        .purchase(req("false-flag", &v0, 1, "v0-1"))
        .await
        .expect("bucket 0's unit");
    engine.restock("false-flag", 2).await.expect("restock");
    engine
        .purchase(req("false-flag", &v0, 1, "v0-2"))
        .await
        .expect("bucket 0's new unit");
    // Bucket 0 is empty, bucket 1 (jack's home) has a unit. Jack's retry
    // finds nothing where it may look, but must not flag the sale sold out.
    let _ = engine.purchase(req("false-flag", &jack, 1, "jack-1")).await;
    let kim = user_with_home("kim", 2, 1);
    let r = engine.purchase(req("false-flag", &kim, 1, "kim-1")).await;
    assert!(r.is_ok(), "bucket 1 still has a unit: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_retried_after_a_timeout_is_applied_once() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let status = sale(&engine, SaleSpec::new("restock-once", 10)).await;
    let node = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    // The master holds writes for 4 s, past the client's 2 s response
    // timeout: the engine's own retries resend the restock.
    let _: () = node.cmd(&["CLIENT", "PAUSE", "4000", "WRITE"]);
    let r = engine.restock("restock-once", 5).await;
    let _: () = node.cmd(&["CLIENT", "UNPAUSE"]);
    let status = engine.sale_status("restock-once").await.expect("status");
    assert_eq!(
        (status.initial, status.remaining),
        (15, 15),
        "one restock of 5 (answer {r:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_that_times_out_still_makes_a_usable_sale() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let meta_slot = flashsale::placement::tag_slot("fs:slow-create");
    let node = cluster.node(cluster.master_of_slot(meta_slot));
    let _: () = node.cmd(&["CLIENT", "PAUSE", "4000", "WRITE"]);
    let created = engine.create_sale(SaleSpec::new("slow-create", 10)).await;
    let _: () = node.cmd(&["CLIENT", "UNPAUSE"]);
    let created = created.expect("a create retried after a timeout still creates");
    assert_eq!(created.initial, 10);
    engine
        .purchase(req("slow-create", "lee", 1, "lee-1"))
        .await
        .expect("the sale sells");
    assert!(engine
        .list_sales()
        .await
        .expect("list")
        .contains(&"slow-create".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_call_dropped_half_way_still_completes_the_sale() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // Pause every master that will hold a bucket of the sale, so the create
    // is in the middle when its caller goes away.
    let masters = cluster.master_ports();
    for p in &masters {
        let _: () = cluster.node(*p).cmd(&["CLIENT", "PAUSE", "3000", "WRITE"]);
    }
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        engine.create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("dropped", 30)
        }),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the caller gave up before the create finished"
    );
    for p in &masters {
        let _: () = cluster.node(*p).cmd(&["CLIENT", "UNPAUSE"]);
    }
    wait_until(Duration::from_secs(30), "the create completes", || {
        let e = engine.clone();
        async move {
            e.list_sales()
                .await
                .is_ok_and(|s| s.contains(&"dropped".to_owned()))
                && e.sale_status("dropped")
                    .await
                    .is_ok_and(|s| s.initial == 30 && s.buckets.len() == 3)
        }
    })
    .await;
    engine
        .purchase(req("dropped", "mia", 1, "mia-1"))
        .await
        .expect("the completed sale sells");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_past_two_to_the_53_is_refused_before_redis() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let huge = engine
        .create_sale(SaleSpec::new("huge", 4_611_686_018_427_387_904))
        .await;
    assert!(
        matches!(huge, Err(flashsale::AdminError::Invalid(_))),
        "{huge:?}"
    );
    assert!(!engine
        .list_sales()
        .await
        .expect("list")
        .contains(&"huge".to_owned()));
    sale(&engine, SaleSpec::new("near-max", (1 << 53) - 10)).await;
    let over = engine.restock("near-max", 100).await;
    assert!(
        matches!(over, Err(flashsale::AdminError::Invalid(_))),
        "{over:?}"
    );
    let status = engine.sale_status("near-max").await.expect("status");
    assert_eq!(status.initial, (1 << 53) - 10, "nothing changed");
    engine
        .purchase(req("near-max", "ned", 1, "ned-1"))
        .await
        .expect("the sale still sells");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_durations_are_refused_at_connect() {
    let cluster = RedisCluster::start(3, 0);
    for tweak in [
        (|c: &mut flashsale::Config| c.request_ttl = Duration::from_millis(u64::MAX))
            as fn(&mut flashsale::Config),
        |c| c.sold_out_recheck = Duration::from_millis(u64::MAX),
        |c| c.retry.deadline = Duration::from_millis(u64::MAX),
    ] {
        let mut config = flashsale::Config {
            cluster_nodes: cluster.seeds(),
            lock_nodes: Vec::new(),
            ..flashsale::Config::default()
        };
        tweak(&mut config);
        let r = Engine::connect(config).await;
        assert!(
            matches!(r, Err(flashsale::ConnectError::Config(_))),
            "refused: {:?}",
            r.err()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_rewrites_a_lost_home_record_so_a_retry_replays() {
    let cluster = RedisCluster::start(3, 0);
    let engine = sweeping_engine(&cluster).await;
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 5,
            ..SaleSpec::new("lost-record", 1)
        },
    )
    .await;
    let rita = user_with_home("rita", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &rita,
        "rita-1",
        1,
        1,
        0,
        Abandon::AfterTake,
    )
    .await;
    // What a failover of the home master under ack = leader can do: the
    // pending record is gone, while bucket 0 holds rita's order.
    let home = cluster.node(cluster.master_of_slot(status.buckets[1].slot));
    for k in home.keys(&format!("{{{}}}:r:*", status.buckets[1].tag)) {
        let _: i64 = home.cmd(&["DEL", &k]);
    }
    sweep_until_settled(&engine).await;
    // Rita's home bucket gets a unit; her retry must replay, not buy there.
    engine.restock("lost-record", 2).await.expect("restock");
    let retry = engine
        .purchase(req("lost-record", &rita, 1, "rita-1"))
        .await
        .expect("the retry answers");
    let status = engine.sale_status("lost-record").await.expect("status");
    let orders = stream_orders(&cluster, &status);
    assert_eq!(orders.len(), 1, "one request, one order: {orders:?}");
    assert_eq!(retry.order_id, orders[0].0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_settles_other_sales_when_one_is_broken() {
    let cluster = RedisCluster::start(3, 0);
    let engine = sweeping_engine(&cluster).await;
    let broken = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("aa-broken", 1)
        },
    )
    .await;
    let fine = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("zz-fine", 1)
        },
    )
    .await;
    let sam = user_with_home("sam", 2, 1);
    abandon_fall_through(
        &cluster,
        &broken,
        &sam,
        "sam-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    abandon_fall_through(&cluster, &fine, &sam, "sam-2", 1, 1, 0, Abandon::BeforeTake).await;
    // Bucket 0 of the first sale vanishes: its walk cannot finish.
    let b0 = &broken.buckets[0];
    let _: i64 = cluster
        .node(cluster.master_of_slot(b0.slot))
        .cmd(&["DEL", &format!("{{{}}}:sale", b0.tag)]);
    // Once both requests are older than pending_timeout, one pass meets the
    // broken sale first (sorted order) and must still settle the other.
    let mut report = flashsale::SweepReport::default();
    for _ in 0..200 {
        report = engine.settle_abandoned().await.expect("sweep");
        if report.found >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        report.errors >= 1,
        "the broken sale is reported: {report:?}"
    );
    assert_eq!(
        report.settled, 1,
        "the other sale is still swept: {report:?}"
    );
    engine
        .purchase(req("zz-fine", &sam, 1, "sam-3"))
        .await
        .expect("sam's quota in the fine sale came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_id_reused_with_other_parameters_is_refused() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    engine
        .create_sale_op(SaleSpec::new("ops", 5), "k1")
        .await
        .expect("create");
    let again = engine
        .create_sale_op(SaleSpec::new("ops", 5), "k1")
        .await
        .expect("the same create, retried, answers the same");
    assert_eq!(again.initial, 5);
    let other = engine
        .create_sale_op(
            SaleSpec {
                buckets: 3,
                per_user_limit: 2,
                ..SaleSpec::new("ops", 500)
            },
            "k1",
        )
        .await;
    assert!(
        matches!(other, Err(flashsale::AdminError::OperationMismatch(_))),
        "{other:?}"
    );
    engine.restock_op("ops", 5, "r1").await.expect("restock");
    let other = engine.restock_op("ops", 6, "r1").await;
    assert!(
        matches!(other, Err(flashsale::AdminError::OperationMismatch(_))),
        "{other:?}"
    );
    let status = engine
        .restock_op("ops", 5, "r1")
        .await
        .expect("the same restock, retried");
    assert_eq!((status.initial, status.remaining), (10, 10), "applied once");
}

/// From the last attack on serve: a refused multi-bucket request left a
/// record in every bucket for `request_ttl` (a day), and needs no
/// authentication, so a flood of them filled Redis (about 665 B each). A
/// bucket's refusal now lives only while a walk of the request could still
/// take there (twice the walk limit, `pending_timeout`, from the walk's
/// start); the home bucket's record, which answers every retry, keeps its
/// day, so the answer does not change even after a restock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_multi_bucket_request_keeps_only_its_home_record_past_the_walk_limit() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_with(&cluster, |c| {
        c.pending_timeout = Duration::from_millis(1000);
    })
    .await;
    // A unit in each bucket; two units are more than any bucket holds.
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 3,
            ..SaleSpec::new("refused-records", 3)
        },
    )
    .await;
    let liz = user_with_home("liz", 3, 0);
    let refused = engine
        .purchase(req("refused-records", &liz, 2, "liz-1"))
        .await;
    assert!(
        matches!(refused, Err(PurchaseError::SoldOut)),
        "{refused:?}"
    );
    let record = |b: usize| {
        let bucket = &status.buckets[b];
        let key = flashsale::keys::BucketKeys::new(&bucket.tag).request(&liz, "liz-1");
        let node = cluster.node(cluster.master_of_slot(bucket.slot));
        let ttl: i64 = node.cmd(&["PTTL", &key]);
        ttl
    };
    for b in [1, 2] {
        let ttl = record(b);
        assert!(
            (1..=2000).contains(&ttl) || ttl == -2,
            "bucket {b}'s refusal lives past twice the walk limit: PTTL {ttl}"
        );
    }
    wait_until(
        Duration::from_secs(30),
        "the other buckets' refusals expire",
        || async { record(1) == -2 && record(2) == -2 },
    )
    .await;
    assert!(
        record(0) > 3_600_000,
        "the home record keeps request_ttl: PTTL {}",
        record(0)
    );
    // Every bucket can now sell two units; the retry still gets its
    // first answer, and nothing is taken.
    engine.restock("refused-records", 6).await.expect("restock");
    let retry = engine
        .purchase(req("refused-records", &liz, 2, "liz-1"))
        .await;
    assert!(matches!(retry, Err(PurchaseError::SoldOut)), "{retry:?}");
    let status = engine.sale_status("refused-records").await.expect("status");
    assert!(stream_orders(&cluster, &status).is_empty());
    assert_eq!(status.remaining, 9);
}

/// Where a request's entry in its home bucket's pending set lives: the
/// home master, the set's key, and the member (the record key without its
/// `{tag}:r:` prefix).
fn pending_entry<'a>(
    cluster: &'a RedisCluster,
    home: &flashsale::BucketStatus,
    user: &str,
    request_id: &str,
) -> (&'a flashsale_tests::RedisNode, String, String) {
    let keys = flashsale::keys::BucketKeys::new(&home.tag);
    let member = keys
        .request(user, request_id)
        .split_once(":r:")
        .map(|(_, m)| m.to_string())
        .expect("a request key");
    (
        cluster.node(cluster.master_of_slot(home.slot)),
        keys.pending.clone(),
        member,
    )
}

/// What makes a short-lived refusal safe: a walk takes nowhere once past
/// its limit (`pending_timeout` from its start, each bucket's master
/// judging by its own clock). A request left pending by an attempt that
/// died before any take, retried after the limit when every bucket has
/// stock, is refused and takes nothing: before, it took in the first
/// bucket with stock, where a refusal could since have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_past_its_limit_takes_nowhere_even_with_stock() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_with(&cluster, |c| {
        c.pending_timeout = Duration::from_millis(1000);
    })
    .await;
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 5,
            ..SaleSpec::new("old-walk", 1)
        },
    )
    .await;
    // Bucket 0 has the only unit; max (home 1) is left pending.
    let max = user_with_home("max", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &max,
        "max-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    let (home_node, pending, member) = pending_entry(&cluster, &status.buckets[1], &max, "max-1");
    let since: f64 = home_node.cmd(&["ZSCORE", &pending, &member]);
    // Until bucket 0's master is past twice the walk's limit on its own
    // clock, when a refusal would no longer be needed there.
    let other_node = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    wait_until(
        Duration::from_secs(30),
        "bucket 0's clock passes twice the walk limit",
        || async {
            let now: Vec<u64> = other_node.cmd(&["TIME"]);
            now.first().is_some_and(|s| s * 1000 > since as u64 + 2000)
        },
    )
    .await;
    engine.restock("old-walk", 4).await.expect("restock");
    let before = engine.sale_status("old-walk").await.expect("status");
    let retry = engine.purchase(req("old-walk", &max, 1, "max-1")).await;
    assert!(matches!(retry, Err(PurchaseError::SoldOut)), "{retry:?}");
    let after = engine.sale_status("old-walk").await.expect("status");
    assert_eq!(after.remaining, before.remaining, "nothing was taken");
    assert!(stream_orders(&cluster, &after).is_empty());
    // From the attack on this change: past twice the limit the refusal was
    // not recorded at all, and under `ack = replicated` the walk waited for
    // a replica to hold a record that never came (`unavailable`, not
    // `sold_out`). A refusal is recorded for at least one limit.
    let record = flashsale::keys::BucketKeys::new(&status.buckets[0].tag).request(&max, "max-1");
    let ttl: i64 = other_node.cmd(&["PTTL", &record]);
    assert!(
        (1..=1000).contains(&ttl),
        "bucket 0 records its refusal for one limit: PTTL {ttl}"
    );
}

/// From the attack on the walk limit: a retry whose walk start was gone
/// from the home bucket's pending set (read as 0) refused in every bucket
/// without recording it, and settled the request as sold out, while an
/// earlier attempt still walking with the real start took further on: an
/// order for a request answered `sold_out`, its quota given back. With
/// its start unknown, a walk's refusals are kept `request_ttl`, as before
/// the walk limit, so the earlier attempt finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_walk_start_is_lost_keeps_its_refusals() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_with(&cluster, |c| {
        c.pending_timeout = Duration::from_millis(1000);
    })
    .await;
    let status = sale(
        &engine,
        SaleSpec {
            buckets: 2,
            per_user_limit: 5,
            ..SaleSpec::new("lost-start", 1)
        },
    )
    .await;
    let ned = user_with_home("ned", 2, 1);
    abandon_fall_through(
        &cluster,
        &status,
        &ned,
        "ned-1",
        1,
        1,
        0,
        Abandon::BeforeTake,
    )
    .await;
    let (home_node, pending, member) = pending_entry(&cluster, &status.buckets[1], &ned, "ned-1");
    let removed: i64 = home_node.cmd(&["ZREM", &pending, &member]);
    assert_eq!(removed, 1, "setup: the pending entry was there");
    let retry = engine.purchase(req("lost-start", &ned, 1, "ned-1")).await;
    assert!(matches!(retry, Err(PurchaseError::SoldOut)), "{retry:?}");
    let other = &status.buckets[0];
    let other_node = cluster.node(cluster.master_of_slot(other.slot));
    let record = flashsale::keys::BucketKeys::new(&other.tag).request(&ned, "ned-1");
    let ttl: i64 = other_node.cmd(&["PTTL", &record]);
    assert!(
        ttl > 3_600_000,
        "bucket 0 keeps its refusal as long as the request: PTTL {ttl}"
    );
}
