//! Natural batching per bucket on a real cluster: purchases that queue
//! behind a call in flight go together as one script call, and each still
//! gets its own answer, decided as if it were alone.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use flashsale::{Confirmed, Engine, PurchaseError, PurchaseRequest, SaleSpec};
use flashsale_tests::{engine_on, stream_orders, wait_until, RedisCluster};
use tokio::task::JoinHandle;

/// One purchase on its own task.
fn buy(
    engine: &Engine,
    sku: &str,
    user: &str,
    request_id: &str,
    qty: i64,
) -> JoinHandle<Result<Confirmed, PurchaseError>> {
    let engine = engine.clone();
    let (sku, user, request_id) = (sku.to_owned(), user.to_owned(), request_id.to_owned());
    tokio::spawn(async move {
        engine
            .purchase(PurchaseRequest {
                sku: &sku,
                user: &user,
                qty,
                request_id: &request_id,
            })
            .await
    })
}

/// The light-load rule the tests that pause a master run with
/// (`batch_light_load`): purchases a bucket may have in flight before new
/// ones queue behind them, whatever `batch_in_flight` says.
const LIGHT_LOAD_CALLS: u64 = 4;

/// An engine on `cluster` with `batch_light_load = LIGHT_LOAD_CALLS`.
async fn light_load_engine(cluster: &RedisCluster) -> Engine {
    flashsale_tests::engine_with(cluster, |c| c.batch_light_load = LIGHT_LOAD_CALLS as u32).await
}

/// Purchases sent to Redis so far, and batches of exactly `n`, from the
/// engine's batch sizes.
fn sent_and_batches_of(engine: &Engine, n: usize) -> (u64, u64) {
    let sizes = engine.stats().purchase_batch_sizes.snapshot();
    let sent = sizes.iter().enumerate().map(|(k, c)| k as u64 * c).sum();
    (sent, sizes.get(n).copied().unwrap_or(0))
}

/// One batch holds a purchase that is confirmed, one sold out, one over the
/// limit, one replayed and one mismatched, and each gets its own answer.
/// The bucket's master is paused for writes so the first purchases' calls
/// (as at light load) stay in flight while the five queue behind them; they
/// then go as one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_with_mixed_outcomes_answers_each_purchase_on_its_own() {
    let cluster = RedisCluster::start(3, 0);
    let engine = light_load_engine(&cluster).await;
    let sku = "mixed";
    let status = engine
        .create_sale(SaleSpec {
            per_user_limit: 2,
            ..SaleSpec::new(sku, 5 + LIGHT_LOAD_CALLS)
        })
        .await
        .expect("create");
    let master = cluster.master_of_slot(status.buckets[0].slot);

    // Before the batch: "c" is at the limit, "d" and "e" bought once each.
    let c = buy(&engine, sku, "c", "c1", 2).await.expect("task");
    c.expect("c buys two");
    let d_first = buy(&engine, sku, "d", "d1", 1)
        .await
        .expect("task")
        .expect("d buys one");
    buy(&engine, sku, "e", "e1", 1)
        .await
        .expect("task")
        .expect("e buys one");

    let stats = engine.stats();
    let queued0 = stats.purchases_queued.load(Ordering::SeqCst);
    let (sent0, fives0) = sent_and_batches_of(&engine, 5);
    let _: String = cluster
        .node(master)
        .cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    let fillers: Vec<_> = (0..LIGHT_LOAD_CALLS)
        .map(|i| buy(&engine, sku, &format!("f{i}"), "f", 1))
        .collect();
    wait_until(
        Duration::from_secs(20),
        "the first purchases are in flight",
        || async { sent_and_batches_of(&engine, 5).0 == sent0 + LIGHT_LOAD_CALLS },
    )
    .await;
    let confirmed = buy(&engine, sku, "x", "x1", 1);
    let sold_out = buy(&engine, sku, "y", "y1", 2);
    let over_limit = buy(&engine, sku, "c", "c2", 1);
    let replayed = buy(&engine, sku, "d", "d1", 1);
    let mismatched = buy(&engine, sku, "e", "e1", 2);
    wait_until(
        Duration::from_secs(20),
        "five purchases queue behind them",
        || async {
            engine.stats().purchases_queued.load(Ordering::SeqCst) == queued0 + LIGHT_LOAD_CALLS + 5
        },
    )
    .await;
    let _: String = cluster.node(master).cmd(&["CLIENT", "UNPAUSE"]);

    for f in fillers {
        f.await.expect("task").expect("a filler is confirmed");
    }
    let x = confirmed.await.expect("task").expect("x is confirmed");
    assert!(!x.replayed, "{x:?}");
    assert_eq!(sold_out.await.expect("task"), Err(PurchaseError::SoldOut));
    assert!(
        matches!(
            over_limit.await.expect("task"),
            Err(PurchaseError::LimitExceeded {
                limit: 2,
                already: 2
            })
        ),
        "c is over the limit"
    );
    let d_again = replayed.await.expect("task").expect("d1 replays");
    assert!(d_again.replayed);
    assert_eq!(d_again.order_id, d_first.order_id);
    assert_eq!(
        mismatched.await.expect("task"),
        Err(PurchaseError::RequestMismatch)
    );

    assert_eq!(
        sent_and_batches_of(&engine, 5),
        (sent0 + LIGHT_LOAD_CALLS + 5, fives0 + 1),
        "the five went as one call"
    );
    let status = engine.sale_status(sku).await.expect("status");
    assert_eq!(status.remaining, 0);
    let orders = stream_orders(&cluster, &status);
    assert_eq!(
        orders.len() as u64,
        4 + LIGHT_LOAD_CALLS,
        "c (one order of 2), d, e, the fillers, x: {orders:?}"
    );
}

/// Stock 500 against 2,000 buyers, at most 256 in flight: exactly 500 sold,
/// every order once in the streams, and the purchases shared calls.
async fn two_thousand_buyers_at_256_in_flight(buckets: u32) {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let sku = format!("batched-{buckets}");
    engine
        .create_sale(SaleSpec {
            buckets,
            ..SaleSpec::new(&sku, 500)
        })
        .await
        .expect("create");
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(2000);
    for i in 0..2000 {
        let permit = gate.clone().acquire_owned().await.expect("semaphore");
        let id = format!("buyer-{i}");
        let task = buy(&engine, &sku, &id, &id, 1);
        tasks.push(tokio::spawn(async move {
            let answer = task.await.expect("buyer task");
            drop(permit);
            answer
        }));
    }
    let mut confirmed = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(c) => confirmed.push(c.order_id),
            Err(PurchaseError::SoldOut) => {}
            Err(e) => panic!("a buyer got {e:?}"),
        }
    }
    assert_eq!(confirmed.len(), 500, "exactly the stock is sold");
    let status = engine.sale_status(&sku).await.expect("status");
    assert_eq!(status.remaining, 0);
    let streamed = stream_orders(&cluster, &status);
    let streamed_ids: HashSet<_> = streamed.iter().map(|(o, _)| o.clone()).collect();
    assert_eq!(streamed.len(), 500, "each order once in the streams");
    assert_eq!(streamed_ids, confirmed.into_iter().collect::<HashSet<_>>());
    let stats = engine.stats();
    assert!(
        stats.largest_purchase_batch.load(Ordering::SeqCst) > 1,
        "purchases shared calls"
    );
    assert!(
        stats.purchase_batches.load(Ordering::SeqCst)
            < stats.purchases_queued.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_stampede_on_one_bucket_sells_exactly_the_stock() {
    two_thousand_buyers_at_256_in_flight(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_stampede_on_three_buckets_sells_exactly_the_stock() {
    two_thousand_buyers_at_256_in_flight(3).await;
}

/// `batch_max = 1` is one call per purchase: nothing is ever batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_max_one_sends_each_purchase_alone() {
    let cluster = RedisCluster::start(3, 0);
    let engine = flashsale_tests::engine_with(&cluster, |c| c.batch_max = 1).await;
    engine
        .create_sale(SaleSpec::new("alone", 100))
        .await
        .expect("create");
    let tasks: Vec<_> = (0..200)
        .map(|i| buy(&engine, "alone", &format!("u{i}"), "r", 1))
        .collect();
    let mut sold = 0;
    for t in tasks {
        if t.await.expect("task").is_ok() {
            sold += 1;
        }
    }
    assert_eq!(sold, 100);
    let stats = engine.stats();
    assert_eq!(stats.largest_purchase_batch.load(Ordering::SeqCst), 1);
}

/// Found by the attack on batching: with the bucket's master stalled, each
/// batch took the whole retry deadline to fail and the next one was sent
/// only then, so a purchase deep in the queue waited many deadlines, and
/// was sent (and made an order) long after its buyer had been told
/// "unavailable". A purchase queued past the deadline is answered unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bucket_never_sends_purchases_queued_past_the_retry_deadline() {
    let cluster = RedisCluster::start(3, 0);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.retry.deadline = Duration::from_secs(1);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec::new("stalled", 1000))
        .await
        .expect("create");
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let stats = engine.stats();
    let (queued0, unsent0) = (
        stats.purchases_queued.load(Ordering::SeqCst),
        stats.purchases_unsent.load(Ordering::SeqCst),
    );
    let _: String = cluster
        .node(master)
        .cmd(&["CLIENT", "PAUSE", "60000", "WRITE"]);
    let buyers: Vec<_> = (0..320)
        .map(|i| buy(&engine, "stalled", &format!("s{i}"), "r", 1))
        .collect();
    wait_until(
        Duration::from_secs(50),
        "every buyer is answered while the master is still paused",
        || async { buyers.iter().all(|b| b.is_finished()) },
    )
    .await;
    let _: String = cluster.node(master).cmd(&["CLIENT", "UNPAUSE"]);
    for b in buyers {
        let answer = b.await.expect("task");
        assert!(
            matches!(answer, Err(PurchaseError::Unavailable(_))),
            "{answer:?}"
        );
    }
    let queued = stats.purchases_queued.load(Ordering::SeqCst) - queued0;
    let unsent = stats.purchases_unsent.load(Ordering::SeqCst) - unsent0;
    assert_eq!(queued, 320);
    assert!(
        queued - unsent <= LIGHT_LOAD_CALLS,
        "at most the calls in flight when the master stalled were sent: {} of {queued}",
        queued - unsent
    );
}

/// A purchase whose caller went away while it waited in the queue is never
/// sent: it makes no order nobody will be told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_whose_caller_is_gone_is_dropped_from_the_queue_unsent() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let status = engine
        .create_sale(SaleSpec::new("walked-away", 1000))
        .await
        .expect("create");
    let stream = status.buckets[0].stream.clone();
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let unsent0 = engine.stats().purchases_unsent.load(Ordering::SeqCst);
    let _: String = cluster
        .node(master)
        .cmd(&["CLIENT", "PAUSE", "60000", "WRITE"]);
    let callers: Vec<_> = (0..100)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let user = format!("w{i}");
                let buy = engine.purchase(PurchaseRequest {
                    sku: "walked-away",
                    user: &user,
                    qty: 1,
                    request_id: "r",
                });
                // The buyer gives up long before the master comes back.
                tokio::time::timeout(Duration::from_millis(200), buy).await
            })
        })
        .collect();
    for c in callers {
        assert!(c.await.expect("task").is_err(), "the caller timed out");
    }
    let _: String = cluster.node(master).cmd(&["CLIENT", "UNPAUSE"]);
    // The purchases in flight when the master stalled (one per call, as at
    // light load) were sent; every other one is dropped when its turn comes.
    let dropped = 100 - LIGHT_LOAD_CALLS;
    wait_until(
        Duration::from_secs(30),
        "the queued purchases are dropped unsent",
        || async { engine.stats().purchases_unsent.load(Ordering::SeqCst) - unsent0 >= dropped },
    )
    .await;
    let orders: i64 = cluster.node(master).cmd(&["XLEN", &stream]);
    assert!(
        orders as u64 <= LIGHT_LOAD_CALLS,
        "{orders} orders from callers that were gone"
    );
}

/// With `batch_light_load`, a purchase at light load does not wait a round
/// trip behind another purchase's call: while the calls in flight carry only
/// a few purchases, a new one goes at once in a call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_light_load_a_purchase_never_waits_behind_another_ones_call() {
    let cluster = RedisCluster::start(3, 0);
    let engine = light_load_engine(&cluster).await;
    let status = engine
        .create_sale(SaleSpec::new("light", 10))
        .await
        .expect("create");
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let (sent0, _) = sent_and_batches_of(&engine, 1);
    let _: String = cluster
        .node(master)
        .cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    let first = buy(&engine, "light", "a", "r", 1);
    wait_until(Duration::from_secs(20), "the first call is out", || async {
        sent_and_batches_of(&engine, 1).0 == sent0 + 1
    })
    .await;
    let second = buy(&engine, "light", "b", "r", 1);
    wait_until(
        Duration::from_secs(20),
        "the second goes while the first is still out",
        || async { sent_and_batches_of(&engine, 1).0 == sent0 + 2 },
    )
    .await;
    let _: String = cluster.node(master).cmd(&["CLIENT", "UNPAUSE"]);
    first.await.expect("task").expect("a is confirmed");
    second.await.expect("task").expect("b is confirmed");
}

/// `purchase.lua` keeps the stock it takes in a local and writes it once
/// per batch. A purchase that raises an error midway (a quota key that holds
/// no number, or a hash, as only tampering could leave them) ends the script
/// after the purchases before it made their orders; Redis keeps what a
/// script wrote before an error, so those orders must have taken their stock
/// too, or the next buyers would be sold units already sold. The error keeps
/// its Redis code (WRONGTYPE, not a wrapped ERR), as it had before the loop
/// ran under pcall, so what the engine and its operators see of it does not
/// depend on where in the batch it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_midway_keeps_the_stock_its_earlier_purchases_took() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let sku = "midway";
    let status = engine
        .create_sale(SaleSpec {
            per_user_limit: 5,
            ..SaleSpec::new(sku, 20)
        })
        .await
        .expect("create");
    let b = &status.buckets[0];
    let keys = flashsale::keys::BucketKeys::new(&b.tag);
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let _: () = node.cmd(&["SET", &keys.quota("poisoned"), "garbage"]);
    let _: i64 = node.cmd(&["HSET", &keys.quota("hashed"), "f", "1"]);

    // Two batches: "a" and "b" then the poisoned one; "c" and "d" then the
    // hashed one. Each buyer asks for 2 units.
    let batches = [["a", "b", "poisoned"], ["c", "d", "hashed"]];
    let mut order_ids = Vec::new();
    let mut codes = Vec::new();
    for (n, users) in batches.iter().enumerate() {
        let ids: Vec<String> = (0..users.len())
            .map(|i| format!("{sku}~0~{:032x}", n * 10 + i))
            .collect();
        let mut script = redis::cmd("EVAL");
        script
            .arg(include_str!("../../lua/purchase.lua"))
            .arg(5 + 2 * users.len())
            .arg(&keys.sale)
            .arg(&keys.stock)
            .arg(&keys.orders)
            .arg(&keys.pending)
            .arg(&keys.holds);
        for u in users {
            script.arg(keys.quota(u)).arg(keys.request(u, "r1"));
        }
        script.arg(3600).arg("0").arg("compact");
        for (u, id) in users.iter().zip(&ids) {
            script.arg(2).arg(id).arg(*u);
        }
        let reply: redis::RedisResult<redis::Value> = script.query(&mut node.conn());
        let err = reply.expect_err("the poisoned purchase fails the call");
        codes.push(err.code().map(str::to_owned));
        order_ids.extend(users.iter().zip(ids).take(2).map(|(u, id)| (*u, id)));
    }

    let stock: i64 = node.cmd(&["GET", &keys.stock]);
    let queued: i64 = node.cmd(&["XLEN", &keys.orders]);
    assert_eq!(
        (stock, queued),
        (12, 4),
        "the four purchases before the errors took 2 units each and queued their orders"
    );
    assert_eq!(
        codes,
        [Some("ERR".to_owned()), Some("WRONGTYPE".to_owned())],
        "a Lua error is ERR, a command's error keeps its code"
    );
    // The engine's retry of those four gets their orders back.
    for (u, id) in order_ids {
        let c = buy(&engine, sku, u, "r1", 2)
            .await
            .expect("task")
            .expect("replayed");
        assert_eq!((c.order_id.as_str(), c.replayed), (id.as_str(), true));
    }
}

/// Appends an entry with the last possible stream id, as only tampering could
/// leave: every later `XADD *` on that stream then fails ("The stream has
/// exhausted the last possible ID").
fn exhaust_stream(node: &flashsale_tests::RedisNode, stream: &str) {
    let _: String = node.cmd(&[
        "XADD",
        stream,
        "18446744073709551615-18446744073709551615",
        "junk",
        "1",
    ]);
}

/// An order that cannot be queued must not be confirmed. `purchase.lua` once
/// wrote the quota and the confirmed request record (and kept the stock it
/// took) before its `XADD`, so a stream that refused the order left a request
/// that answered "confirmed" on every retry, units gone, and no order that
/// would ever reach PostgreSQL. `take.lua` (a fall-through) and
/// `transition.lua` (a hold cancelled: units back, state moved, then the
/// event) had the same shape. Each script now queues first: a refused
/// `XADD` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_the_stream_refuses_is_not_confirmed_and_takes_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;

    // purchase.lua, paid at once, under a per-user limit.
    let status = engine
        .create_sale(SaleSpec {
            per_user_limit: 5,
            ..SaleSpec::new("refused", 10)
        })
        .await
        .expect("create");
    let b = &status.buckets[0];
    let keys = flashsale::keys::BucketKeys::new(&b.tag);
    let node = cluster.node(cluster.master_of_slot(b.slot));
    exhaust_stream(node, &keys.orders);
    let order_id = format!("refused~0~{:032x}", 1);
    let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg(include_str!("../../lua/purchase.lua"))
        .arg(7)
        .arg(&keys.sale)
        .arg(&keys.stock)
        .arg(&keys.orders)
        .arg(&keys.pending)
        .arg(&keys.holds)
        .arg(keys.quota("u"))
        .arg(keys.request("u", "r1"))
        .arg(3600)
        .arg("0")
        .arg("compact")
        .arg(2)
        .arg(&order_id)
        .arg("u")
        .query(&mut node.conn());
    reply.expect_err("the refused XADD fails the purchase");
    let stock: i64 = node.cmd(&["GET", &keys.stock]);
    let record: Option<String> = node.cmd(&["GET", &keys.request("u", "r1")]);
    let quota: Option<String> = node.cmd(&["GET", &keys.quota("u")]);
    assert_eq!(
        (stock, record, quota),
        (10, None, None),
        "purchase.lua: no stock taken, no record, no quota used"
    );

    // take.lua: a fall-through taking in a bucket whose stream refuses.
    let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg(include_str!("../../lua/take.lua"))
        .arg(5)
        .arg(&keys.sale)
        .arg(&keys.stock)
        .arg(&keys.orders)
        .arg(keys.request("w", "r1"))
        .arg(&keys.holds)
        .arg(2)
        .arg(format!("refused~0~{:032x}", 2))
        .arg("w")
        .arg(3600)
        .arg("take")
        .arg("0")
        .arg("0")
        .arg("compact")
        // The walk began now, with a minute to take.
        .arg(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        )
        .arg(60_000)
        .query(&mut node.conn());
    reply.expect_err("the refused XADD fails the take");
    let stock: i64 = node.cmd(&["GET", &keys.stock]);
    let record: Option<String> = node.cmd(&["GET", &keys.request("w", "r1")]);
    assert_eq!(
        (stock, record),
        (10, None),
        "take.lua: no stock taken, no record"
    );

    // transition.lua: a held order cancelled while its stream refuses.
    let status = engine
        .create_sale(SaleSpec {
            hold_ms: 60_000,
            ..SaleSpec::new("refused-held", 10)
        })
        .await
        .expect("create");
    let b = &status.buckets[0];
    let keys = flashsale::keys::BucketKeys::new(&b.tag);
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let held = buy(&engine, "refused-held", "h", "r1", 2)
        .await
        .expect("task")
        .expect("held");
    exhaust_stream(node, &keys.orders);
    let order_key = keys.order(&held.order_id);
    let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg(include_str!("../../lua/transition.lua"))
        .arg(6)
        .arg(&keys.sale)
        .arg(&keys.stock)
        .arg(&keys.orders)
        .arg(&keys.holds)
        .arg(&keys.owed)
        .arg(&order_key)
        .arg("cancel")
        .arg(3600)
        .arg("0")
        .arg(&held.order_id)
        .arg("")
        .query(&mut node.conn());
    reply.expect_err("the refused XADD fails the cancel");
    let stock: i64 = node.cmd(&["GET", &keys.stock]);
    let state: Option<String> = node.cmd(&["HGET", &order_key, "state"]);
    let indexed: Option<f64> = node.cmd(&["ZSCORE", &keys.holds, &held.order_id]);
    assert_eq!(
        (stock, state.as_deref(), indexed.is_some()),
        (8, Some("held"), true),
        "transition.lua: no units back, the order still held and indexed"
    );
}
