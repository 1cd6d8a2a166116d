//! Orders that wait for payment, on a real cluster and the real PostgreSQL:
//! pay, cancel and expiry race, and each hold ends once, its units back on
//! sale once, and PostgreSQL agrees state by state.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flashsale::{
    Confirmed, Engine, HoldError, InvalidInput, OrderState, PurchaseError, PurchaseRequest,
    SaleSpec,
};
use flashsale_tests::fixture::Fixture;
use flashsale_tests::{engine_with, fast_writer, wait_until, RedisCluster};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn buy(
    engine: &Engine,
    sku: &str,
    user: &str,
    rid: &str,
) -> Result<Confirmed, PurchaseError> {
    engine
        .purchase(PurchaseRequest {
            sku,
            user,
            qty: 1,
            request_id: rid,
        })
        .await
}

/// Units left in every bucket of `sku`.
async fn remaining(engine: &Engine, sku: &str) -> u64 {
    engine
        .sale_status(sku)
        .await
        .expect("status")
        .buckets
        .iter()
        .map(|b| u64::try_from(b.remaining).expect("never below zero"))
        .sum()
}

/// Transition entries per order on the sale's streams.
fn events_by_order(
    cluster: &RedisCluster,
    status: &flashsale::SaleStatus,
) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for b in &status.buckets {
        let node = cluster.node(cluster.master_of_slot(b.slot));
        let reply: redis::Value = node.cmd(&["XRANGE", &b.stream, "-", "+"]);
        for e in flashsale::orders::entry::parse_entries(&reply) {
            let get = |k: &str| {
                e.fields
                    .iter()
                    .find(|(f, _)| f == k)
                    .map(|(_, v)| v.clone())
            };
            if let (Some(kind), Some(id)) = (get("kind"), get("order_id")) {
                out.entry(id).or_default().push(kind);
            }
        }
    }
    out
}

/// 1,000 holds, each paid within ±5 ms of its deadline while a sweeper
/// expires what is due: each ends paid or expired, never both; a payment
/// that was answered "paid" is paid, one answered `HoldExpired` is expired;
/// and the units add up (stock back = expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_racing_the_deadline_ends_paid_or_expired_never_both() {
    const N: usize = 1000;
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 1500,
            ..SaleSpec::new("race", N as u64)
        })
        .build()
        .await;
    let engine = fx.engine.clone();
    let mut orders = Vec::new();
    for i in 0..N {
        let c = buy(&engine, "race", &format!("u{i}"), "r")
            .await
            .expect("buy");
        assert_eq!(c.status, OrderState::Held);
        orders.push(c);
    }
    assert_eq!(remaining(&engine, "race").await, 0);
    let sweeper = {
        let engine = engine.clone();
        tokio::spawn(async move {
            loop {
                let _ = engine.expire_due().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut payers = Vec::new();
    for (i, c) in orders.iter().enumerate() {
        let engine = engine.clone();
        let (id, deadline) = (c.order_id.clone(), c.expires_at_ms.expect("held"));
        let at = (deadline as i64 + (i as i64 % 11) - 5).max(0) as u64;
        payers.push(tokio::spawn(async move {
            let wait = at.saturating_sub(now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            (id.clone(), engine.pay(&id, &format!("pay-{i}")).await)
        }));
    }
    let mut answered = HashMap::new();
    for p in payers {
        let (id, r) = p.await.expect("payer");
        answered.insert(id, r);
    }
    // Every hold is due now: one last pass, then the sweeper stops.
    engine.expire_due().await.expect("sweep");
    sweeper.abort();
    let (mut paid, mut expired) = (0, 0);
    for c in &orders {
        let view = engine.order(&c.order_id).await.expect("order");
        match (&answered[&c.order_id], view.state) {
            (Ok(t), OrderState::Paid) if t.state == OrderState::Paid => paid += 1,
            (Err(HoldError::HoldExpired { .. }), OrderState::Expired) => expired += 1,
            (answer, state) => panic!("{}: answered {answer:?}, is {state}", c.order_id),
        }
    }
    assert_eq!(paid + expired, N);
    assert_eq!(
        remaining(&engine, "race").await,
        expired as u64,
        "units back = holds expired"
    );
    let status = engine.sale_status("race").await.expect("status");
    for (id, kinds) in events_by_order(&fx.cluster, &status) {
        assert_eq!(kinds.len(), 1, "{id}: one transition, got {kinds:?}");
    }
    eprintln!("paid {paid}, expired {expired}");
}

/// A cancel gives the unit and the quota back once: a second cancel
/// replays, a payment after it is `HoldExpired`; then cancels racing
/// payments on 50 orders: each order ends one way, and only the cancelled
/// units come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_twice_and_cancel_racing_a_payment_give_units_back_once() {
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 60_000,
            per_user_limit: 1,
            ..SaleSpec::new("cancel", 100)
        })
        .build()
        .await;
    let e = &fx.engine;
    let c = buy(e, "cancel", "alice", "r1").await.expect("buy");
    assert!(matches!(
        buy(e, "cancel", "alice", "r2").await,
        Err(PurchaseError::LimitExceeded { .. })
    ));
    let first = e.cancel(&c.order_id).await.expect("cancel");
    assert_eq!(
        (first.state, first.replayed),
        (OrderState::Cancelled, false)
    );
    let second = e.cancel(&c.order_id).await.expect("cancel again");
    assert_eq!(
        (second.state, second.replayed),
        (OrderState::Cancelled, true)
    );
    assert_eq!(remaining(e, "cancel").await, 100, "the unit came back once");
    assert_eq!(
        e.pay(&c.order_id, "late").await,
        Err(HoldError::HoldExpired {
            state: OrderState::Cancelled
        })
    );
    // The quota came back too: alice may buy again, once.
    let again = buy(e, "cancel", "alice", "r3").await.expect("quota back");
    assert_eq!(again.status, OrderState::Held);
    assert_eq!(remaining(e, "cancel").await, 99);

    let mut held = Vec::new();
    for i in 0..50 {
        held.push(
            buy(e, "cancel", &format!("b{i}"), "r")
                .await
                .expect("buy")
                .order_id,
        );
    }
    assert_eq!(remaining(e, "cancel").await, 49);
    let mut races = Vec::new();
    for id in &held {
        let (e1, e2, id1, id2) = (e.clone(), e.clone(), id.clone(), id.clone());
        races.push(tokio::spawn(async move {
            let (p, c) = tokio::join!(e1.pay(&id1, "ref"), e2.cancel(&id2));
            (p, c)
        }));
    }
    let mut cancelled = 0;
    for r in races {
        match r.await.expect("race") {
            (
                Ok(p),
                Err(HoldError::AlreadyFinal {
                    state: OrderState::Paid,
                }),
            ) => {
                assert_eq!(p.state, OrderState::Paid)
            }
            (
                Err(HoldError::HoldExpired {
                    state: OrderState::Cancelled,
                }),
                Ok(c),
            ) => {
                assert_eq!(c.state, OrderState::Cancelled);
                cancelled += 1;
            }
            other => panic!("pay and cancel both or neither won: {other:?}"),
        }
    }
    assert_eq!(remaining(e, "cancel").await, 49 + cancelled);
}

/// 2,000 holds due at once, two sweepers at the same time and a third
/// stopped mid-pass: each hold is expired once, its units back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_at_once_and_one_stopped_mid_batch_expire_each_hold_once() {
    const N: usize = 2000;
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 500,
            buckets: 3,
            per_user_limit: 1,
            ..SaleSpec::new("sweep", N as u64)
        })
        .build()
        .await;
    let e = &fx.engine;
    let mut ids = Vec::new();
    let mut latest = 0;
    for i in 0..N {
        let c = buy(e, "sweep", &format!("u{i}"), "r").await.expect("buy");
        latest = latest.max(c.expires_at_ms.expect("held"));
        ids.push(c.order_id);
    }
    assert_eq!(remaining(e, "sweep").await, 0);
    tokio::time::sleep(Duration::from_millis(latest.saturating_sub(now_ms()) + 20)).await;
    let stopped = {
        let e = e.clone();
        tokio::spawn(async move { e.expire_due().await })
    };
    tokio::time::sleep(Duration::from_millis(3)).await;
    stopped.abort();
    let (a, b) = tokio::join!(e.expire_due(), e.expire_due());
    let (a, b) = (a.expect("sweeper a"), b.expect("sweeper b"));
    let last = e.expire_due().await.expect("last pass");
    assert_eq!(
        remaining(e, "sweep").await,
        N as u64,
        "every unit back, once"
    );
    assert!(a.expired + b.expired + last.expired <= N as u64);
    for id in &ids {
        assert_eq!(e.order(id).await.expect("order").state, OrderState::Expired);
    }
    let status = e.sale_status("sweep").await.expect("status");
    let events = events_by_order(&fx.cluster, &status);
    assert_eq!(events.len(), N);
    assert!(
        events.values().all(|k| k == &["expired"]),
        "one expiry per hold"
    );
    assert_conserved(e, &fx.pool, "sweep").await;
    // The quotas came back (in the home bucket, whichever bucket served):
    // each buyer may buy again.
    for i in 0..N {
        buy(e, "sweep", &format!("u{i}"), "again")
            .await
            .expect("quota back");
    }
}

/// Stock 100 held 1 s, 40 % of buyers never pay: after the window their
/// units are sold to new buyers (a second engine, whose sold-out flag must
/// learn within `sold_out_recheck_ms` that stock came back); in the end
/// paid + held = 100 and PostgreSQL agrees state by state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaid_units_are_resold_after_the_window_and_postgres_agrees() {
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 1000,
            buckets: 2,
            ..SaleSpec::new("resale", 100)
        })
        .build()
        .await;
    let e = fx.engine.clone();
    let sweeper = e.spawn_hold_sweeper();
    let writer = e
        .spawn_order_writer(fx.pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    let other = Arc::new(
        engine_with(&fx.cluster, |c| {
            c.sold_out_recheck = Duration::from_millis(300);
        })
        .await,
    );
    let mut first = Vec::new();
    for i in 0..100 {
        first.push(
            buy(&e, "resale", &format!("first{i}"), "r")
                .await
                .expect("buy"),
        );
    }
    assert!(matches!(
        buy(&other, "resale", "late0", "r").await,
        Err(PurchaseError::SoldOut)
    ));
    for (i, c) in first.iter().enumerate().filter(|(i, _)| i % 5 >= 2) {
        e.pay(&c.order_id, &format!("p{i}"))
            .await
            .expect("pay in time");
    }
    assert_conserved(&e, &fx.pool, "resale").await;
    // The 40 unpaid units go back on sale and are bought by new buyers on
    // the other engine.
    let mut resold = Vec::new();
    let started = std::time::Instant::now();
    let mut n = 0;
    while resold.len() < 40 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "only {} of 40 units resold",
            resold.len()
        );
        n += 1;
        match buy(&other, "resale", &format!("late{n}"), "r").await {
            Ok(c) => resold.push(c),
            Err(PurchaseError::SoldOut) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("late{n}: {e}"),
        }
    }
    assert_eq!(resold.len(), 40);
    for (i, c) in resold.iter().enumerate() {
        other
            .pay(&c.order_id, &format!("q{i}"))
            .await
            .expect("pay resold");
    }
    assert_eq!(remaining(&e, "resale").await, 0, "sold out again");
    let report = writer.drain(Duration::from_secs(30)).await.expect("drain");
    sweeper.abort();
    assert!(report.written >= 140);
    let states = fx.pg.query(
        "SELECT status || '=' || count(*) FROM orders WHERE sku = 'resale' GROUP BY status ORDER BY status",
    );
    assert_eq!(states.trim(), "expired=40\npaid=100", "PostgreSQL by state");
    let events = fx
        .pg
        .query("SELECT kind || '=' || count(*) FROM order_events GROUP BY kind ORDER BY kind");
    assert_eq!(events.trim(), "expired=40\npaid=100");
    let paid_refs = fx.pg.query(
        "SELECT count(*) FROM orders WHERE sku = 'resale' AND status = 'paid' AND payment_ref IS NOT NULL AND paid_at IS NOT NULL",
    );
    assert_eq!(paid_refs.trim(), "100");
    let ledger = assert_conserved(&e, &fx.pool, "resale").await;
    assert_eq!(
        (
            ledger.remaining,
            ledger.pending,
            ledger.held_in_db,
            ledger.paid_in_db
        ),
        (0, 0, 0, 100)
    );
}

/// Reconcile's exact ledger (units out = orders - returned + retaken) holds.
async fn assert_conserved(
    engine: &Engine,
    pool: &deadpool_postgres::Pool,
    sku: &str,
) -> flashsale::ledger::LedgerReport {
    let mut r = flashsale::ledger::reconcile(engine, pool, &[sku.to_owned()])
        .await
        .expect("reconcile");
    let r = r.remove(0);
    assert!(r.conserved, "{r:?}");
    r
}

/// Bad input gets a typed error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_order_ids_payment_refs_and_holds_get_typed_errors_and_change_nothing() {
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 60_000,
            ..SaleSpec::new("bad", 10)
        })
        .build()
        .await;
    let e = &fx.engine;
    e.create_sale(SaleSpec::new("plain", 10))
        .await
        .expect("plain sale");
    let c = buy(e, "bad", "u", "r").await.expect("buy");
    let plain = buy(e, "plain", "u", "r").await.expect("buy plain");
    assert_eq!(
        (plain.status, plain.expires_at_ms),
        (OrderState::Paid, None)
    );
    let nonce = c.order_id.rsplit('~').next().expect("nonce").to_owned();
    let unknown = format!("bad~0~{}", "0".repeat(32));
    let other_bucket = format!("bad~5~{nonce}");
    let other_sku = format!("plain~0~{nonce}");
    let no_sale = format!("nosuch~0~{nonce}");
    for (id, want) in [
        (unknown.as_str(), "unknown_order"),
        (other_bucket.as_str(), "unknown_order"),
        (no_sale.as_str(), "unknown_order"),
        (other_sku.as_str(), "no_holds"),
        (plain.order_id.as_str(), "no_holds"),
        ("", "invalid"),
        ("not-an-order", "invalid"),
        ("bad~0~../../etc", "invalid"),
    ] {
        assert_eq!(
            e.pay(id, "p").await.map_err(|e| e.code()).err(),
            Some(want),
            "pay {id:?}"
        );
        assert_eq!(
            e.cancel(id).await.map_err(|e| e.code()).err(),
            Some(want),
            "cancel {id:?}"
        );
    }
    for r in ["", &"x".repeat(129), "has space", "a\u{202E}b"] {
        assert!(
            matches!(e.pay(&c.order_id, r).await, Err(HoldError::Invalid(_))),
            "payment_ref {r:?}"
        );
    }
    assert_eq!(
        e.order(&c.order_id).await.expect("order").state,
        OrderState::Held
    );
    assert_eq!(remaining(e, "bad").await, 9, "nothing changed");
    let absurd = e
        .create_sale(SaleSpec {
            hold_ms: u64::MAX,
            ..SaleSpec::new("absurd", 1)
        })
        .await;
    assert!(
        matches!(
            absurd,
            Err(flashsale::AdminError::Invalid(InvalidInput::Spec(_)))
        ),
        "{absurd:?}"
    );
    assert!(e.sale_status("absurd").await.is_err(), "no sale made");
    // A payment with the first reference is answered the same; another
    // reference is a conflict.
    let paid = e.pay(&c.order_id, "p1").await.expect("pay");
    assert!(!paid.replayed);
    assert!(e.pay(&c.order_id, "p1").await.expect("again").replayed);
    assert_eq!(
        e.pay(&c.order_id, "p2").await,
        Err(HoldError::PaymentConflict)
    );
    assert_eq!(
        e.cancel(&c.order_id).await,
        Err(HoldError::AlreadyFinal {
            state: OrderState::Paid
        })
    );
    // A retry of the purchase replays the order in the state it is in now.
    let replay = buy(e, "bad", "u", "r").await.expect("replay");
    assert_eq!((replay.replayed, replay.status), (true, OrderState::Paid));
}

/// Found by the attack: an order served by a bucket other than the buyer's
/// home bucket expired (its quota came back), the buyer bought again, and a
/// late payment under `late_payment = "retake"` took a unit for the first
/// order too: two paid units for a limit of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_payment_never_takes_a_unit_past_the_buyers_limit() {
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 300,
            buckets: 2,
            per_user_limit: 1,
            late_payment: flashsale::LatePayment::Retake,
            ..SaleSpec::new("retake", 4)
        })
        .build()
        .await;
    let e = &fx.engine;
    let home0 = |p: &str| flashsale_tests::user_with_home(p, 2, 0);
    // Empty the buyer's home bucket (2 units), so its order is served by
    // the other bucket.
    for p in ["fill-a", "fill-b"] {
        let c = buy(e, "retake", &home0(p), "r").await.expect("fill");
        assert_eq!(c.bucket, 0);
        e.pay(&c.order_id, p).await.expect("fill paid");
    }
    let buyer = home0("buyer");
    let away = buy(e, "retake", &buyer, "r1").await.expect("away");
    assert_eq!(away.bucket, 1, "served away from home");
    tokio::time::sleep(Duration::from_millis(
        away.expires_at_ms.expect("held").saturating_sub(now_ms()) + 20,
    ))
    .await;
    assert_eq!(e.expire_due().await.expect("sweep").expired, 1);
    let again = buy(e, "retake", &buyer, "r2")
        .await
        .expect("quota came back");
    e.pay(&again.order_id, "p2").await.expect("pay the second");
    let late = e.pay(&away.order_id, "p1").await;
    assert!(
        matches!(late, Err(HoldError::HoldExpired { .. })),
        "a retake past the limit: {late:?}"
    );
    assert_eq!(
        e.order(&away.order_id).await.expect("order").state,
        OrderState::Expired
    );
}

/// Found by the attack: a held order's record expired with `request_ttl`
/// before anyone swept it, so its unit never came back, and 256 or more
/// such index entries made the sweeper loop forever (no other sale's holds
/// expired again). A hold's record now lives until the hold ends; and an
/// index entry whose record is gone anyway (evicted, deleted) is dropped,
/// never spun on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outliving_request_ttl_still_gives_its_unit_back_and_no_sweep_spins() {
    let cluster = RedisCluster::start(3, 0);
    let e = engine_with(&cluster, |c| {
        c.request_ttl = Duration::from_secs(1);
        c.pending_timeout = Duration::from_millis(100);
    })
    .await;
    e.create_sale(SaleSpec {
        hold_ms: 200,
        ..SaleSpec::new("short-ttl", 300)
    })
    .await
    .expect("sale");
    let mut latest = 0;
    for i in 0..300 {
        let c = buy(&e, "short-ttl", &format!("u{i}"), "r")
            .await
            .expect("buy");
        latest = latest.max(c.expires_at_ms.expect("held"));
    }
    // Past the deadline and past request_ttl, with no sweeper running.
    tokio::time::sleep(Duration::from_millis(
        latest.saturating_sub(now_ms()) + 2500,
    ))
    .await;
    let report = tokio::time::timeout(Duration::from_secs(60), e.expire_due())
        .await
        .expect("a sweep pass ends")
        .expect("sweep");
    assert_eq!(report.expired, 300);
    assert_eq!(remaining(&e, "short-ttl").await, 300, "every unit back");

    // Records gone behind the engine's back (an eviction): the pass still
    // ends, and drops the entries it can do nothing with.
    e.create_sale(SaleSpec {
        hold_ms: 200,
        ..SaleSpec::new("evicted", 300)
    })
    .await
    .expect("sale");
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(
            buy(&e, "evicted", &format!("u{i}"), "r")
                .await
                .expect("buy")
                .order_id,
        );
    }
    let status = e.sale_status("evicted").await.expect("status");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    for id in &ids {
        let _: i64 = node.cmd(&["DEL", &format!("{{{}}}:o:{id}", b.tag)]);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    tokio::time::timeout(Duration::from_secs(60), e.expire_due())
        .await
        .expect("a sweep pass ends")
        .expect("sweep");
    let left: i64 = node.cmd(&["ZCARD", &format!("{{{}}}:holds", b.tag)]);
    assert_eq!(left, 0, "entries without a record are dropped");
}

/// `late_payment = "retake"`: a late payment takes a unit again only if
/// one is left (never oversells), and the ledger counts the retake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_payment_retakes_a_unit_only_if_one_is_left() {
    let fx = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: 300,
            late_payment: flashsale::LatePayment::Retake,
            ..SaleSpec::new("late", 2)
        })
        .build()
        .await;
    let e = &fx.engine;
    let a = buy(e, "late", "a", "r").await.expect("a");
    let b = buy(e, "late", "b", "r").await.expect("b");
    let deadline = a.expires_at_ms.max(b.expires_at_ms).expect("held");
    tokio::time::sleep(Duration::from_millis(
        deadline.saturating_sub(now_ms()) + 20,
    ))
    .await;
    assert_eq!(e.expire_due().await.expect("sweep").expired, 2);
    let c = buy(e, "late", "c", "r")
        .await
        .expect("c buys a unit back on sale");
    e.pay(&c.order_id, "pc").await.expect("c pays");
    let d = buy(e, "late", "d", "r").await.expect("d buys the last one");
    e.pay(&d.order_id, "pd").await.expect("d pays");
    assert_eq!(remaining(e, "late").await, 0);
    assert!(
        matches!(
            e.pay(&a.order_id, "pa").await,
            Err(HoldError::HoldExpired {
                state: OrderState::Expired
            })
        ),
        "no unit left: refused"
    );
    e.cancel(&d.order_id).await.expect_err("paid is final");
    let c2 = buy(e, "late", "e", "r").await;
    assert!(matches!(c2, Err(PurchaseError::SoldOut)), "{c2:?}");
    // A unit comes back (an operator's restock); b's late payment then
    // retakes it, as a new transition of b's order.
    let writer = e
        .spawn_order_writer(fx.pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    e.restock("late", 1).await.expect("restock");
    let retaken = e.pay(&b.order_id, "pb").await.expect("retake");
    assert_eq!((retaken.state, retaken.retaken), (OrderState::Paid, true));
    assert_eq!(remaining(e, "late").await, 0, "the retake took the unit");
    writer.drain(Duration::from_secs(30)).await.expect("drain");
    let ledger = assert_conserved(e, &fx.pool, "late").await;
    assert_eq!(
        (ledger.initial, ledger.paid_in_db, ledger.held_in_db),
        (3, 3, 0)
    );
}

/// A failover mid-window under `ack = replicated`: the master of the
/// sale's bucket is killed while payments and cancels flow. Every payment
/// and cancel answered OK is still so on the promoted replica, and once
/// the window is over every unit not paid is back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_window_under_replicated_ack_loses_no_payment_and_returns_no_unit_twice() {
    const N: usize = 40;
    let mut cluster = RedisCluster::start(3, 1);
    let e = engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        // Long enough to outlast the failover: answers come after it.
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    let status = e
        .create_sale(SaleSpec {
            hold_ms: 6000,
            ..SaleSpec::new("failover", N as u64)
        })
        .await
        .expect("sale");
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(
            buy(&e, "failover", &format!("u{i}"), "r")
                .await
                .expect("buy")
                .order_id,
        );
    }
    let mut paid_ok = Vec::new();
    for id in &ids[..10] {
        e.pay(id, "before").await.expect("pay before");
        paid_ok.push(id.clone());
    }
    let mut cancelled_ok = Vec::new();
    for id in &ids[10..15] {
        e.cancel(id).await.expect("cancel before");
        cancelled_ok.push(id.clone());
    }
    // Payments and cancels in flight while the master dies.
    let during: Vec<_> = ids[15..30]
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let (e, id) = (e.clone(), id.clone());
            tokio::spawn(async move {
                let r = if k % 3 == 0 {
                    e.cancel(&id).await
                } else {
                    e.pay(&id, "during").await
                };
                (id, r)
            })
        })
        .collect();
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let replica = cluster.replica_of(master);
    cluster.node_mut(master).kill();
    tokio::task::block_in_place(|| {
        flashsale_tests::wait_for(
            Duration::from_secs(60),
            || cluster.master_ports().contains(&replica),
            || "the replica was not promoted".into(),
        )
    });
    for t in during {
        let (id, r) = t.await.expect("task");
        match r {
            Ok(t) if t.state == OrderState::Paid => paid_ok.push(id),
            Ok(t) if t.state == OrderState::Cancelled => cancelled_ok.push(id),
            Ok(t) => panic!("{id}: {t:?}"),
            Err(HoldError::Unavailable(_)) => {}
            Err(other) => panic!("{id}: {other}"),
        }
    }
    for id in &paid_ok {
        assert_eq!(
            e.order(id).await.expect("order").state,
            OrderState::Paid,
            "{id}: answered paid, lost in the failover"
        );
    }
    for id in &cancelled_ok {
        assert_eq!(
            e.order(id).await.expect("order").state,
            OrderState::Cancelled
        );
    }
    // After the window every hold ends; units back = orders not paid.
    wait_until(Duration::from_secs(60), "every hold ended", || {
        let (e, ids) = (e.clone(), ids.clone());
        async move {
            let _ = e.expire_due().await;
            let mut held = 0;
            for id in &ids {
                if let Ok(v) = e.order(id).await {
                    held += usize::from(v.state == OrderState::Held);
                }
            }
            held == 0
        }
    })
    .await;
    let mut paid = 0u64;
    for id in &ids {
        paid += u64::from(e.order(id).await.expect("order").state == OrderState::Paid);
    }
    assert_eq!(
        remaining(&e, "failover").await,
        N as u64 - paid,
        "every unit not paid came back, once"
    );
    let status = e.sale_status("failover").await.expect("status");
    for (id, kinds) in events_by_order(&cluster, &status) {
        assert!(kinds.len() <= 1, "{id}: one transition, got {kinds:?}");
    }
}

/// Found by the second chaos attack: under `ack = replicated`, the sweeper
/// gave an away-served order's quota back in the buyer's home bucket as
/// soon as the serving bucket's master said the order was cancelled, before
/// any replica had the cancel. A failover then brought the order back held
/// (payable) with its quota already returned: the buyer could go over the
/// limit. The quota now goes back only once the serving bucket's state is
/// on a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_replicated_ack_an_owed_quota_waits_for_the_serving_buckets_replica() {
    let cluster = RedisCluster::start(3, 1);
    let e = engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_millis(1500);
    })
    .await;
    let status = e
        .create_sale(SaleSpec {
            hold_ms: 60_000,
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("owed", 4)
        })
        .await
        .expect("sale");
    let home0 = |p: &str| flashsale_tests::user_with_home(p, 2, 0);
    for p in ["fill-a", "fill-b"] {
        let c = buy(&e, "owed", &home0(p), "r").await.expect("fill");
        assert_eq!(c.bucket, 0);
        e.pay(&c.order_id, p).await.expect("fill paid");
    }
    let buyer = home0("buyer");
    let away = buy(&e, "owed", &buyer, "r1").await.expect("away");
    assert_eq!(away.bucket, 1, "served away from home");
    let quota_key = flashsale::keys::BucketKeys::new(&status.buckets[0].tag).quota(&buyer);
    let home_master = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    let quota = || {
        home_master
            .cmd::<Option<i64>>(&["GET", &quota_key])
            .unwrap_or(0)
    };
    assert_eq!(quota(), 1);

    // The serving bucket's replica stops acknowledging: the cancel runs on
    // its master but cannot be confirmed.
    let serving = cluster.master_of_slot(status.buckets[1].slot);
    let replica = cluster.node(cluster.replica_of(serving));
    replica.signal("STOP");
    let cancel = e.cancel(&away.order_id).await;
    assert!(
        matches!(cancel, Err(HoldError::Unavailable(_))),
        "unconfirmed: {cancel:?}"
    );
    let _ = e.expire_due().await;
    let before = quota();
    replica.signal("CONT");
    assert_eq!(
        before, 1,
        "the quota went back before the cancel it rests on was on a replica"
    );
    // Once the replica has it, the sweeper gives the quota back, once.
    wait_until(
        Duration::from_secs(30),
        "the owed quota to come back",
        || async {
            let _ = e.expire_due().await;
            quota() == 0
        },
    )
    .await;
    let _ = e.expire_due().await;
    assert_eq!(quota(), 0);
    buy(&e, "owed", &buyer, "r2")
        .await
        .expect("the quota came back");
}

/// Found by the attack on the lock CLIs and holds: under `ack =
/// replicated`, a first, unrepeated `pay` or `cancel` whose replica was slow
/// to acknowledge answered `replayed: true` (the first reply was dropped
/// and the call sent again, which then was a replay), and a late payment
/// that took a unit answered `retaken: false`. The answer must be the first
/// call's: what the transition did, not what its retry saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_replicated_ack_a_slow_replica_does_not_turn_a_first_transition_into_a_replay() {
    let cluster = RedisCluster::start(3, 1);
    let e = engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(60);
    })
    .await;
    let held = e
        .create_sale(SaleSpec {
            hold_ms: 600_000,
            ..SaleSpec::new("slowrep", 4)
        })
        .await
        .expect("sale");
    let lapsing = e
        .create_sale(SaleSpec {
            hold_ms: 300,
            late_payment: flashsale::LatePayment::Retake,
            ..SaleSpec::new("slowlate", 2)
        })
        .await
        .expect("sale");
    let late = buy(&e, "slowlate", "l", "r").await.expect("l");
    // `late`'s hold runs out and is swept, so its payment is a retake.
    let deadline = late.expires_at_ms.expect("held");
    tokio::time::sleep(Duration::from_millis(
        deadline.saturating_sub(now_ms()) + 20,
    ))
    .await;
    wait_until(
        Duration::from_secs(30),
        "the late hold to expire",
        || async {
            let _ = e.expire_due().await;
            matches!(e.order(&late.order_id).await, Ok(v) if v.state == OrderState::Expired)
        },
    )
    .await;
    let paid = buy(&e, "slowrep", "p", "r").await.expect("p");
    let cancelled = buy(&e, "slowrep", "c", "r").await.expect("c");

    for (what, id, status) in [
        ("pay", paid.order_id.clone(), &held),
        ("cancel", cancelled.order_id.clone(), &held),
        ("late pay", late.order_id.clone(), &lapsing),
    ] {
        let b = &status.buckets[0];
        let master = cluster.master_of_slot(b.slot);
        let record = flashsale::keys::BucketKeys::new(&b.tag).order(&id);
        let state_on_master = || {
            cluster
                .node(master)
                .cmd::<Option<String>>(&["HGET", &record, "state"])
                .unwrap_or_default()
        };
        let replica = cluster.node(cluster.replica_of(master));
        replica.signal("STOP");
        let engine = e.clone();
        let order = id.clone();
        let call = tokio::spawn(async move {
            match what {
                "cancel" => engine.cancel(&order).await,
                _ => engine.pay(&order, "ref").await,
            }
        });
        let want = if what == "cancel" {
            "cancelled"
        } else {
            "paid"
        };
        wait_until(
            Duration::from_secs(30),
            "the master to apply the transition",
            || async { state_on_master() == want },
        )
        .await;
        // Long enough for the first round's WAIT (1 s) to run out on the
        // stopped replica, so the call is sent again.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        replica.signal("CONT");
        let t = call.await.expect("task").expect("transition confirmed");
        assert!(!t.replayed, "{what}: a first call answered as a replay");
        if what == "late pay" {
            assert!(t.retaken, "{what}: the unit it took is not reported");
        }
    }
}
