//! The hot path against a real 3-master Redis Cluster: no oversell under a
//! stampede, per-user limits across buckets and retries, typed errors for bad
//! input, and placement of a hot SKU's buckets on distinct masters.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flashsale::{Engine, InvalidInput, PurchaseError, PurchaseRequest, SaleSpec};
use flashsale_tests::{engine_on, stream_orders, RedisCluster};

/// Runs `buyers` purchases at once (one task each) with distinct users and
/// request ids; returns every answer.
async fn stampede(
    engine: &Engine,
    sku: &str,
    buyers: usize,
) -> Vec<Result<flashsale::Confirmed, PurchaseError>> {
    let sku: Arc<str> = sku.into();
    let tasks: Vec<_> = (0..buyers)
        .map(|i| {
            let engine = engine.clone();
            let sku = sku.clone();
            tokio::spawn(async move {
                let user = format!("user-{i}");
                let rid = format!("req-{i}");
                engine
                    .purchase(PurchaseRequest {
                        sku: &sku,
                        user: &user,
                        qty: 1,
                        request_id: &rid,
                    })
                    .await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(buyers);
    for t in tasks {
        out.push(t.await.expect("buyer task"));
    }
    out
}

async fn two_thousand_buyers_against_500(buckets: u32) {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let sku = format!("hot-{buckets}");
    engine
        .create_sale(SaleSpec {
            buckets,
            ..SaleSpec::new(&sku, 500)
        })
        .await
        .expect("create sale");

    let answers = stampede(&engine, &sku, 2000).await;
    let confirmed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    let others: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(confirmed.len(), 500, "exactly the stock is sold");
    assert!(
        others.iter().all(|e| **e == PurchaseError::SoldOut),
        "only sold-out refusals: {others:?}"
    );
    let ids: HashSet<_> = confirmed.iter().map(|c| c.order_id.clone()).collect();

    let status = engine.sale_status(&sku).await.expect("status");
    assert_eq!(status.remaining, 0);
    for b in &status.buckets {
        let node = cluster.node(cluster.master_of_slot(b.slot));
        let raw: i64 = node.cmd(&["GET", &b.key]);
        assert!(raw >= 0, "bucket {} stock went below zero: {raw}", b.index);
    }
    let streamed = stream_orders(&cluster, &status);
    assert_eq!(
        streamed.len(),
        500,
        "the streams hold exactly the confirmed orders"
    );
    let streamed_ids: HashSet<_> = streamed.iter().map(|(o, _)| o.clone()).collect();
    assert_eq!(
        streamed_ids, ids,
        "the streams hold the very orders that were confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stampede_on_one_bucket_never_oversells() {
    two_thousand_buyers_against_500(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stampede_on_three_buckets_never_oversells() {
    two_thousand_buyers_against_500(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_holds_across_buckets_and_retries() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // Scarce stock over 3 buckets, so many purchases fall through from an
    // empty home bucket to the others while holding the user's quota.
    for (sku, stock) in [("limit-ample", 5000u64), ("limit-scarce", 60)] {
        engine
            .create_sale(SaleSpec {
                buckets: 3,
                per_user_limit: 1,
                ..SaleSpec::new(sku, stock)
            })
            .await
            .expect("create sale");
        let tasks: Vec<_> = (0..200)
            .flat_map(|u| (0..5).map(move |t| (u, t)))
            .map(|(u, t)| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let user = format!("u{u}");
                    let rid = format!("{sku}-u{u}-try{t}");
                    let r = engine
                        .purchase(PurchaseRequest {
                            sku,
                            user: &user,
                            qty: 1,
                            request_id: &rid,
                        })
                        .await;
                    (user, r)
                })
            })
            .collect();
        let mut per_user: HashMap<String, usize> = HashMap::new();
        let mut total = 0;
        for t in tasks {
            let (user, r) = t.await.expect("task");
            match r {
                Ok(_) => {
                    *per_user.entry(user).or_default() += 1;
                    total += 1;
                }
                Err(PurchaseError::LimitExceeded { limit: 1, .. })
                | Err(PurchaseError::SoldOut) => {}
                Err(e) => panic!("unexpected error {e:?}"),
            }
        }
        assert!(
            per_user.values().all(|&n| n == 1),
            "no user above the limit on {sku}"
        );
        assert_eq!(
            total,
            (stock as usize).min(200),
            "{sku}: every unit that could be sold was"
        );
        let status = engine.sale_status(sku).await.expect("status");
        let mut streamed: HashMap<String, usize> = HashMap::new();
        for (_, user) in stream_orders(&cluster, &status) {
            *streamed.entry(user).or_default() += 1;
        }
        assert_eq!(
            streamed, per_user,
            "{sku}: the streams agree with the answers"
        );
        assert_eq!(
            status.remaining + total as u64,
            stock,
            "{sku}: conservation"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_request_id_never_makes_a_second_order() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // One bucket per case: "fresh" confirms in the home bucket; "fallthrough"
    // has a user whose home bucket is empty, so the replay goes via take/settle.
    engine
        .create_sale(SaleSpec {
            buckets: 3,
            per_user_limit: 5,
            ..SaleSpec::new("retry", 2)
        })
        .await
        .expect("create sale");
    for (user, rid) in [("alice", "same-request-a"), ("bob", "same-request-b")] {
        let tries: Vec<_> = (0..10)
            .map(|_| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    engine
                        .purchase(PurchaseRequest {
                            sku: "retry",
                            user,
                            qty: 1,
                            request_id: rid,
                        })
                        .await
                })
            })
            .collect();
        let mut ids = HashSet::new();
        for t in tries {
            let c = t
                .await
                .expect("task")
                .expect("the retried purchase confirms");
            ids.insert(c.order_id);
        }
        assert_eq!(ids.len(), 1, "{rid}: ten tries, one order id");
    }
    let status = engine.sale_status("retry").await.expect("status");
    assert_eq!(
        stream_orders(&cluster, &status).len(),
        2,
        "two requests, two orders"
    );
    assert_eq!(status.remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_typed_errors_and_change_nothing() {
    type BadCase<'a> = (&'a str, &'a str, i64, &'a str, fn(&PurchaseError) -> bool);
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let hour = Duration::from_secs(3600);
    engine
        .create_sale(SaleSpec {
            buckets: 2,
            per_user_limit: 2,
            ..SaleSpec::new("open", 10)
        })
        .await
        .expect("create");
    engine
        .create_sale(SaleSpec {
            starts_at: Some(SystemTime::now() + hour),
            ..SaleSpec::new("later", 10)
        })
        .await
        .expect("create");
    // A sale cannot be created already over: this one ends soon, and the
    // test waits (on the bucket master's clock) until it has.
    let ends = SystemTime::now() + Duration::from_millis(1500);
    let over = engine
        .create_sale(SaleSpec {
            ends_at: Some(ends),
            ..SaleSpec::new("over", 10)
        })
        .await
        .expect("create");
    let ends_ms = ends
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64;
    let node = cluster.node(cluster.master_of_slot(over.buckets[0].slot));
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || {
            let (secs, micros): (u64, u64) = node.cmd(&["TIME"]);
            secs * 1000 + micros / 1000 > ends_ms
        },
        || "the sale's window ended".into(),
    );
    engine
        .create_sale(SaleSpec::new("shut", 10))
        .await
        .expect("create");
    engine.close_sale("shut").await.expect("close");

    let snapshot = |engine: Engine| async move {
        let mut s = Vec::new();
        for sku in ["open", "later", "over", "shut"] {
            let st = engine.sale_status(sku).await.expect("status");
            s.push((
                st.remaining,
                st.buckets.iter().map(|b| b.stream_len).sum::<u64>(),
            ));
        }
        s
    };
    let before = snapshot(engine.clone()).await;
    let kib = "x".repeat(1024);
    let cases: Vec<BadCase> = vec![
        ("open", "u", 0, "r1", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::QtyNotPositive(0)))
        }),
        ("open", "u", -3, "r2", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::QtyNotPositive(-3)))
        }),
        ("open", "u", 3, "r3", |e| {
            matches!(
                e,
                PurchaseError::Invalid(InvalidInput::QtyTooLarge { qty: 3, max: 2 })
            )
        }),
        ("open", "u", 1_000_000, "r4", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::QtyTooLarge { .. }))
        }),
        ("open", "", 1, "r5", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::Empty("user")))
        }),
        ("open", "u", 1, "", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::Empty("request_id")))
        }),
        ("open", &kib, 1, "r6", |e| {
            matches!(
                e,
                PurchaseError::Invalid(InvalidInput::TooLong { field: "user", .. })
            )
        }),
        ("open", "u", 1, &kib, |e| {
            matches!(
                e,
                PurchaseError::Invalid(InvalidInput::TooLong {
                    field: "request_id",
                    ..
                })
            )
        }),
        ("", "u", 1, "r7", |e| {
            matches!(e, PurchaseError::Invalid(InvalidInput::Empty("sku")))
        }),
        ("no{such}", "u", 1, "r8", |e| {
            matches!(
                e,
                PurchaseError::Invalid(InvalidInput::BadChar { field: "sku", .. })
            )
        }),
        (
            "nosuch",
            "u",
            1,
            "r9",
            |e| matches!(e, PurchaseError::UnknownSale(s) if s == "nosuch"),
        ),
        ("later", "u", 1, "r10", |e| *e == PurchaseError::NotStarted),
        ("over", "u", 1, "r11", |e| *e == PurchaseError::Ended),
        ("shut", "u", 1, "r12", |e| *e == PurchaseError::Closed),
    ];
    for (sku, user, qty, request_id, expected) in cases {
        let r = engine
            .purchase(PurchaseRequest {
                sku,
                user,
                qty,
                request_id,
            })
            .await;
        match r {
            Err(e) => assert!(
                expected(&e),
                "sku={sku:.10} user={user:.10} qty={qty} rid={request_id:.10}: got {e:?}"
            ),
            Ok(c) => panic!("sku={sku} qty={qty}: confirmed {c:?}"),
        }
    }
    assert_eq!(
        snapshot(engine.clone()).await,
        before,
        "bad input changed nothing"
    );
    assert!(matches!(
        engine.create_sale(SaleSpec::new("open", 5)).await,
        Err(flashsale::AdminError::AlreadyExists(_))
    ));
    assert!(matches!(
        engine
            .create_sale(SaleSpec {
                buckets: 0,
                ..SaleSpec::new("zero", 5)
            })
            .await,
        Err(flashsale::AdminError::Invalid(_))
    ));
    assert!(matches!(
        engine.restock("shut", 5).await,
        Err(flashsale::AdminError::Closed(_))
    ));
    assert_eq!(
        snapshot(engine.clone()).await,
        before,
        "refused admin calls changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_of_a_hot_sku_sit_on_distinct_masters() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let status = engine
        .create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("spread", 30)
        })
        .await
        .expect("create");
    let mut masters = HashSet::new();
    for b in &status.buckets {
        let any = &cluster.nodes[0];
        let slot: i64 = any.cmd(&["CLUSTER", "KEYSLOT", &b.key]);
        assert_eq!(
            slot as u16, b.slot,
            "engine and Redis agree on the slot of {}",
            b.key
        );
        let port = cluster.master_of_slot(b.slot);
        assert_eq!(
            b.master,
            format!("127.0.0.1:{port}"),
            "status names the real master"
        );
        masters.insert(port);
    }
    assert_eq!(masters.len(), 3, "three buckets on three distinct masters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_reopens_a_sold_out_sale() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    engine
        .create_sale(SaleSpec {
            buckets: 2,
            ..SaleSpec::new("again", 4)
        })
        .await
        .expect("create");
    let first = stampede(&engine, "again", 10).await;
    assert_eq!(first.iter().filter(|a| a.is_ok()).count(), 4);
    let r = engine
        .purchase(PurchaseRequest {
            sku: "again",
            user: "late",
            qty: 1,
            request_id: "late-1",
        })
        .await;
    assert_eq!(r, Err(PurchaseError::SoldOut));
    let status = engine.restock("again", 6).await.expect("restock");
    assert_eq!((status.initial, status.remaining), (10, 6));
    let r = engine
        .purchase(PurchaseRequest {
            sku: "again",
            user: "late",
            qty: 1,
            request_id: "late-2",
        })
        .await;
    assert!(r.is_ok(), "restock clears the local sold-out flag: {r:?}");
}

/// A close cut off half-way (the metadata and the first bucket closed, the
/// others not yet: the process died, or a failover took back a bucket's
/// close) leaves buckets that still sell. The status said "closed" as soon
/// as any one bucket was, so an operator was told the sale had stopped
/// while buyers were still being confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_sale_is_not_reported_closed_while_a_bucket_still_sells() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let mut spec = SaleSpec::new("half-shut", 30);
    spec.buckets = 3;
    let created = engine.create_sale(spec).await.expect("create");
    assert_eq!(created.state, "open");
    assert!(created.buckets.iter().all(|b| b.state == "open"));
    // What close_sale's first two writes leave: the metadata, then bucket 0.
    let meta = flashsale::keys::sale_meta("half-shut");
    let meta_node =
        cluster.node(cluster.master_of_slot(flashsale::placement::key_slot(meta.as_bytes())));
    let _: i64 = meta_node.cmd(&["HSET", &meta, "state", "closed"]);
    let first = &created.buckets[0];
    let _: i64 = cluster.node(cluster.master_of_slot(first.slot)).cmd(&[
        "HSET",
        &format!("{{{}}}:sale", first.tag),
        "state",
        "closed",
    ]);

    // Bucket 1 still sells...
    let user = flashsale_tests::user_with_home("half", 3, 1);
    let bought = engine
        .purchase(PurchaseRequest {
            sku: "half-shut",
            user: &user,
            qty: 1,
            request_id: "r1",
        })
        .await;
    assert!(bought.is_ok(), "bucket 1 is still open: {bought:?}");
    // ...so the sale is not reported closed, and each bucket says its own.
    let status = engine.sale_status("half-shut").await.expect("status");
    assert_eq!(status.state, "closing", "{status:?}");
    let states: Vec<&str> = status.buckets.iter().map(|b| b.state.as_str()).collect();
    assert_eq!(states, ["closed", "open", "open"]);

    // Finished, every bucket closed: closed.
    let closed = engine.close_sale("half-shut").await.expect("close");
    assert_eq!(closed.state, "closed", "{closed:?}");
    assert!(closed.buckets.iter().all(|b| b.state == "closed"));
}
