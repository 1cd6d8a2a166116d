//! The waiting room (issue #39) on a real cluster: joins are idempotent,
//! admission never lets the admitted-and-not-done pass `overbook x
//! (remaining + held)`, every waiting ticket reads `sold_out` once the stock is gone, a
//! purchase needs a valid admission, fifo admits in join order, places are
//! shuffled before a shuffled start, and `serve` speaks the HTTP contract.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use flashsale::admission::PassError;
use flashsale::{
    Engine, PurchaseError, PurchaseRequest, QueueOrder, QueueRate, QueueSpec, QueueState,
    QueueStatus, SaleSpec,
};
use flashsale_tests::pg::PgDb;
use flashsale_tests::serve::{create_sale, http_client, ServeProcess};
use flashsale_tests::{engine_with, wait_until, RedisCluster};

const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

async fn room_engine(cluster: &RedisCluster) -> Engine {
    engine_with(cluster, |c| c.room.secret = Some(SECRET.into())).await
}

fn spec(sku: &str, stock: u64, buckets: u32, queue: QueueSpec) -> SaleSpec {
    SaleSpec {
        buckets,
        per_user_limit: 1,
        queue: Some(queue),
        ..SaleSpec::new(sku, stock)
    }
}

fn room(rate: QueueRate, order: QueueOrder, overbook: f64) -> QueueSpec {
    QueueSpec {
        rate,
        window_ms: 60_000,
        order,
        overbook,
    }
}

async fn buy(
    engine: &Engine,
    sku: &str,
    user: &str,
    rid: &str,
    token: Option<&str>,
) -> Result<flashsale::Confirmed, PurchaseError> {
    let req = PurchaseRequest {
        sku,
        user,
        qty: 1,
        request_id: rid,
    };
    match token {
        Some(t) => engine.purchase_admitted(req, t).await,
        None => engine.purchase(req).await,
    }
}

async fn remaining(engine: &Engine, sku: &str) -> u64 {
    engine.sale_status(sku).await.expect("status").remaining
}

/// Reads every ticket, waiting past the 100 ms a snapshot may be shared.
async fn read_all(
    engine: &Engine,
    tickets: &HashMap<String, String>,
) -> HashMap<String, QueueStatus> {
    tokio::time::sleep(Duration::from_millis(120)).await;
    let mut out = HashMap::new();
    for (user, t) in tickets {
        out.insert(user.clone(), engine.queue_status(t).await.expect("status"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_again_keeps_the_place_and_nobody_is_admitted_before_a_shuffled_start() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let starts = SystemTime::now() + Duration::from_secs(3600);
    engine
        .create_sale(SaleSpec {
            starts_at: Some(starts),
            ..spec(
                "wr-shuffle",
                10,
                3,
                room(QueueRate::Auto, QueueOrder::ShuffleAtStart, 1.0),
            )
        })
        .await
        .expect("create");
    let mut places = Vec::new();
    for i in 0..60 {
        let user = format!("u{i}");
        let first = engine.join_queue("wr-shuffle", &user).await.expect("join");
        let again = engine
            .join_queue("wr-shuffle", &user)
            .await
            .expect("join again");
        assert_eq!(first.state, QueueState::Waiting);
        let (a, b) = (
            engine.queue_status(&first.ticket).await.expect("read"),
            engine.queue_status(&again.ticket).await.expect("read"),
        );
        assert_eq!(
            a.position, b.position,
            "{user}: one place however often one joins"
        );
        places.push(a.position);
    }
    assert_eq!(
        engine.admit_round("wr-shuffle").await.expect("round"),
        0,
        "before the start"
    );
    let status = engine.room_status("wr-shuffle").await.expect("room");
    assert_eq!(
        (status.joined, status.waiting, status.admitted),
        (60, 60, 0)
    );
    // Shuffled: the joiners' positions are not their join order.
    let in_join_order = places.windows(2).filter(|w| w[0] <= w[1]).count();
    assert!(in_join_order < 50, "places follow join order: {places:?}");
    assert!(matches!(
        engine.join_queue("wr-shuffle", "").await,
        Err(flashsale::QueueError::Invalid(_))
    ));
    engine
        .create_sale(SaleSpec::new("wr-none", 5))
        .await
        .expect("create");
    assert!(matches!(
        engine.join_queue("wr-none", "u1").await,
        Err(flashsale::QueueError::NoQueue(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_and_not_done_stay_within_overbook_times_stock_and_sold_out_reaches_every_ticket()
{
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-bound";
    engine
        .create_sale(spec(
            sku,
            10,
            2,
            room(QueueRate::Auto, QueueOrder::Fifo, 1.5),
        ))
        .await
        .expect("create");
    let mut tickets = HashMap::new();
    for i in 0..100 {
        let user = format!("b{i}");
        let s = engine.join_queue(sku, &user).await.expect("join");
        tickets.insert(user, s.ticket);
    }
    let mut bought = 0;
    let mut purchase_calls = 0;
    for _round in 0..200 {
        engine.admit_round(sku).await.expect("round");
        let left = remaining(&engine, sku).await;
        let room = engine.room_status(sku).await.expect("room");
        assert!(
            room.admitted_not_done as f64 <= (1.5 * left as f64).floor().max(0.0) + 1e-9
                || left == 0,
            "admitted and not done {} past 1.5 x {left}",
            room.admitted_not_done
        );
        if left == 0 {
            break;
        }
        let statuses = read_all(&engine, &tickets).await;
        let admitted: Vec<(&String, &QueueStatus)> = statuses
            .iter()
            .filter(|(_, s)| s.state == QueueState::Admitted)
            .collect();
        assert!(admitted.len() as u64 <= room.admitted);
        // Each admitted user buys once (a retry would replay).
        for (user, s) in admitted {
            let token = s
                .admission_token
                .as_deref()
                .expect("an admitted ticket carries a token");
            purchase_calls += 1;
            match buy(&engine, sku, user, &format!("{user}-r"), Some(token)).await {
                Ok(c) if !c.replayed => bought += 1,
                Ok(_) | Err(PurchaseError::SoldOut) | Err(PurchaseError::LimitExceeded { .. }) => {}
                Err(e) => panic!("{user}: {e}"),
            }
        }
    }
    assert_eq!(bought, 10, "every unit sold, none twice");
    assert!(
        purchase_calls <= 10 + 15 + 15,
        "purchase calls {purchase_calls} for 10 units"
    );
    // The stock is gone: one round flips the state, and every ticket still
    // waiting reads sold_out.
    engine.admit_round(sku).await.expect("round");
    let statuses = read_all(&engine, &tickets).await;
    let waiting = statuses
        .values()
        .filter(|s| s.state == QueueState::Waiting)
        .count();
    assert_eq!(
        waiting, 0,
        "a ticket still reads waiting after the stock is gone"
    );
    assert!(
        statuses
            .values()
            .filter(|s| s.state == QueueState::SoldOut)
            .count()
            >= 75
    );
    assert_eq!(
        engine.room_status(sku).await.expect("room").state,
        "sold_out"
    );
    // A restock moves the line again.
    engine.restock(sku, 2).await.expect("restock");
    engine.admit_round(sku).await.expect("round");
    let statuses = read_all(&engine, &tickets).await;
    assert!(
        statuses.values().any(|s| s.state == QueueState::Admitted),
        "nobody admitted after a restock"
    );
    assert_eq!(engine.room_status(sku).await.expect("room").state, "open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_without_a_valid_admission_is_refused_and_changes_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-gate";
    for s in [sku, "wr-other"] {
        engine
            .create_sale(spec(s, 5, 1, room(QueueRate::Auto, QueueOrder::Fifo, 1.0)))
            .await
            .expect("create");
    }
    let alice = engine.join_queue(sku, "alice").await.expect("join");
    let bob = engine.join_queue(sku, "bob").await.expect("join");
    let other = engine.join_queue("wr-other", "alice").await.expect("join");
    engine.admit_round(sku).await.expect("round");
    engine.admit_round("wr-other").await.expect("round");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let alice = engine.queue_status(&alice.ticket).await.expect("read");
    let bob = engine.queue_status(&bob.ticket).await.expect("read");
    let other = engine.queue_status(&other.ticket).await.expect("read");
    assert_eq!(alice.state, QueueState::Admitted);
    let token = alice.admission_token.clone().expect("token");
    let bobs = bob.admission_token.clone().expect("token");
    let others = other.admission_token.clone().expect("token");
    let forged = {
        let mut t = token.clone().into_bytes();
        let i = t.len() / 2;
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        String::from_utf8(t).expect("ascii")
    };
    let stranger = engine_with(&cluster, |c| {
        c.room.key_id = Some("k2".into());
        c.room.secret = Some("another-secret-of-at-least-32-bytes!".into());
    })
    .await;
    let minted = {
        let s = stranger.join_queue(sku, "alice").await.expect("join");
        s.ticket
    };
    type Case<'a> = (&'a str, Option<&'a str>, fn(&PurchaseError) -> bool);
    let cases: Vec<Case> = vec![
        ("no token", None, |e| *e == PurchaseError::NotAdmitted),
        ("a ticket for a token", Some(&alice.ticket), |e| {
            *e == PurchaseError::NotAdmitted
        }),
        ("bob's token", Some(&bobs), |e| {
            *e == PurchaseError::InvalidTicket(PassError::OtherUser)
        }),
        ("another sale's token", Some(&others), |e| {
            *e == PurchaseError::InvalidTicket(PassError::OtherSale)
        }),
        ("a forged token", Some(&forged), |e| {
            matches!(e, PurchaseError::InvalidTicket(_))
        }),
        ("another key's pass", Some(&minted), |e| {
            *e == PurchaseError::InvalidTicket(PassError::UnknownKey)
        }),
    ];
    for (what, t, ok) in cases {
        let rid = format!("r-{}", what.replace(' ', "-"));
        let r = buy(&engine, sku, "alice", &rid, t).await;
        assert!(matches!(&r, Err(e) if ok(e)), "{what}: {r:?}");
    }
    assert_eq!(
        remaining(&engine, sku).await,
        5,
        "a refused purchase changed the stock"
    );
    assert!(matches!(
        engine.queue_status(&forged).await,
        Err(flashsale::QueueError::InvalidTicket(_))
    ));
    assert!(matches!(
        engine.queue_status(&token).await,
        Err(flashsale::QueueError::InvalidTicket(PassError::WrongKind))
    ));
    // The token buys up to the limit (1), and a replay of it cannot buy past.
    buy(&engine, sku, "alice", "first", Some(&token))
        .await
        .expect("admitted buys");
    let again = buy(&engine, sku, "alice", "second", Some(&token)).await;
    assert!(
        matches!(again, Err(PurchaseError::LimitExceeded { .. })),
        "{again:?}"
    );
    let retry = buy(&engine, sku, "alice", "first", Some(&token))
        .await
        .expect("a retry of a decided request");
    assert!(retry.replayed);
    assert_eq!(remaining(&engine, sku).await, 4);
    assert_eq!(
        engine
            .room_status(sku)
            .await
            .expect("room")
            .admitted_not_done,
        1,
        "bob"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_admits_in_join_order_within_one_process() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-fifo";
    engine
        .create_sale(spec(
            sku,
            100,
            3,
            room(QueueRate::PerSecond(10.0), QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    let mut order = Vec::new();
    for i in 0..40 {
        let user = format!("f{i:02}");
        let s = engine.join_queue(sku, &user).await.expect("join");
        order.push((user, s.ticket));
    }
    let mut admitted_at: HashMap<String, usize> = HashMap::new();
    for round in 0..400 {
        engine.admit_round(sku).await.expect("round");
        tokio::time::sleep(Duration::from_millis(120)).await;
        for (user, t) in &order {
            if admitted_at.contains_key(user) {
                continue;
            }
            if engine.queue_status(t).await.expect("read").state == QueueState::Admitted {
                admitted_at.insert(user.clone(), round);
            }
        }
        if admitted_at.len() == order.len() {
            break;
        }
    }
    assert_eq!(admitted_at.len(), order.len(), "everyone admitted in time");
    let rounds: Vec<usize> = order.iter().map(|(u, _)| admitted_at[u]).collect();
    let inversions = rounds.windows(2).filter(|w| w[0] > w[1]).count();
    assert_eq!(inversions, 0, "admitted out of join order: {rounds:?}");
    assert!(
        rounds.last() > rounds.first(),
        "the rate (10/s, a second's worth at first) spread 40 admissions over rounds: {rounds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_the_waiting_room_contract() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let server = ServeProcess::start(&cluster, &pg, &format!("[room]\nsecret = {SECRET:?}"), "");
    let base = server.base();
    let c = http_client();
    let (code, body) = create_sale(
        &c,
        &base,
        serde_json::json!({"sku": "wr-http", "stock": 3, "buckets": 2, "per_user_limit": 1,
            "queue": {"rate_per_s": "auto", "window_ms": 60000, "order": "fifo", "overbook": 1}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = create_sale(
        &c,
        &base,
        serde_json::json!({"sku": "wr-bad", "stock": 3, "queue": {"overbook": 0.5}}),
    )
    .await;
    assert_eq!(
        (code, body["error"].as_str()),
        (422, Some("invalid")),
        "{body}"
    );

    let join = |user: &'static str| {
        let c = c.clone();
        let url = format!("{base}/v1/sales/wr-http/queue");
        async move {
            let r = c
                .post(url)
                .json(&serde_json::json!({"user": user}))
                .send()
                .await
                .expect("join");
            assert_eq!(r.status().as_u16(), 200);
            r.json::<serde_json::Value>().await.expect("json")
        }
    };
    let joined = join("ann").await;
    for field in ["ticket", "state", "position", "ahead", "eta_ms"] {
        assert!(
            joined.get(field).is_some(),
            "join answers {field}: {joined}"
        );
    }
    let ticket = joined["ticket"].as_str().expect("ticket").to_owned();
    let purchase = |token: Option<String>| {
        let c = c.clone();
        let url = format!("{base}/v1/sales/wr-http/purchase");
        async move {
            let mut body = serde_json::json!({"user": "ann", "qty": 1, "request_id": "ann-1"});
            if let Some(t) = token {
                body["admission_token"] = t.into();
            }
            let r = c.post(url).json(&body).send().await.expect("purchase");
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.expect("json"),
            )
        }
    };
    let (code, body) = purchase(None).await;
    assert_eq!((code, body["error"].as_str()), (403, Some("not_admitted")));
    let (code, body) = purchase(Some("k1.bm90.aGVsbG8".into())).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (403, Some("invalid_ticket"))
    );
    let r = c
        .get(format!("{base}/v1/queue/not-a-ticket"))
        .send()
        .await
        .expect("read");
    assert_eq!(r.status().as_u16(), 403);

    // serve's admitter lets ann in.
    let read = || {
        let (c, url) = (c.clone(), format!("{base}/v1/queue/{ticket}"));
        async move {
            let r = c.get(url).send().await.expect("read");
            r.json::<serde_json::Value>().await.expect("json")
        }
    };
    wait_until(
        Duration::from_secs(30),
        "ann admitted by serve's admitter",
        || {
            let read = read();
            async move { read.await["state"] == "admitted" }
        },
    )
    .await;
    let status = read().await;
    assert!(status["admitted_until_ms"].as_u64().is_some(), "{status}");
    let token = status["admission_token"]
        .as_str()
        .expect("token")
        .to_owned();
    let (code, body) = purchase(Some(token)).await;
    assert_eq!(code, 200, "{body}");

    // The same route as an event stream: the first event is the reading.
    let r = c
        .get(format!("{base}/v1/queue/{ticket}"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream")));
    let mut r = r;
    let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
        .await
        .expect("an event in time")
        .expect("read")
        .expect("a chunk");
    let text = String::from_utf8_lossy(&chunk);
    assert!(
        text.starts_with("data: {") && text.contains("\"state\""),
        "{text}"
    );
}

/// Admits until `users` all read admitted, or `rounds` rounds pass;
/// answers how many did.
async fn admit_until(engine: &Engine, sku: &str, tickets: &[String], rounds: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..rounds {
        engine.admit_round(sku).await.expect("round");
        tokio::time::sleep(Duration::from_millis(120)).await;
        admitted = 0;
        for t in tickets {
            if engine.queue_status(t).await.expect("read").state == QueueState::Admitted {
                admitted += 1;
            }
        }
        if admitted == tickets.len() {
            break;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_lifted_above_a_fence_from_a_clock_ahead_do_not_freeze_the_line() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-tie";
    let status = engine
        .create_sale(spec(
            sku,
            100,
            1,
            room(QueueRate::PerSecond(1.0), QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    // A process whose clock runs 2 s ahead fenced the shard: every join
    // from here is lifted above its floor (to the same place, before the
    // fix).
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let unix_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let ahead = flashsale::room::arrival_place(unix_ms + 2_000);
    let _: i64 = node.cmd(&[
        "HSET",
        &format!("{{{}}}:lineh", b.tag),
        "f",
        &ahead.to_string(),
    ]);
    let mut tickets = Vec::new();
    for u in ["t0", "t1", "t2"] {
        tickets.push(engine.join_queue(sku, u).await.expect("join").ticket);
    }
    let admitted = admit_until(&engine, sku, &tickets, 60).await;
    assert_eq!(
        admitted, 3,
        "the line froze on places lifted to the same floor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_user_limit_above_one_admits_only_whom_the_units_can_serve() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-limit2";
    engine
        .create_sale(SaleSpec {
            per_user_limit: 2,
            ..spec(sku, 4, 1, room(QueueRate::Auto, QueueOrder::Fifo, 1.0))
        })
        .await
        .expect("create");
    let mut tickets = Vec::new();
    for i in 0..6 {
        tickets.push(
            engine
                .join_queue(sku, &format!("l{i}"))
                .await
                .expect("join")
                .ticket,
        );
    }
    let admitted = admit_until(&engine, sku, &tickets, 5).await;
    assert_eq!(
        admitted, 2,
        "4 units, up to 2 each, overbook 1: two people, not {admitted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_below_one_a_second_still_admits() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-slow";
    engine
        .create_sale(spec(
            sku,
            10,
            1,
            room(QueueRate::PerSecond(0.5), QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    let tickets = vec![engine.join_queue(sku, "s0").await.expect("join").ticket];
    assert_eq!(
        admit_until(&engine, sku, &tickets, 60).await,
        1,
        "0.5/s admitted nobody"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_past_two_to_the_53_over_all_buckets_does_not_stop_the_room() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-huge";
    engine
        .create_sale(spec(
            sku,
            (1 << 53) - 1,
            2,
            room(QueueRate::Auto, QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    engine.restock(sku, 1 << 52).await.expect("restock");
    let tickets = vec![engine.join_queue(sku, "h0").await.expect("join").ticket];
    assert_eq!(admit_until(&engine, sku, &tickets, 5).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_without_a_token_costs_no_redis_trip() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-trip";
    let status = engine
        .create_sale(spec(
            sku,
            10,
            1,
            room(QueueRate::Auto, QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    // Warm the sale's handle, then count the bucket master's commands.
    let _ = buy(&engine, sku, "warm", "w", None).await;
    let node = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    let calls = || -> u64 {
        let info: String = node.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|c| c.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = calls();
    for i in 0..20 {
        let r = buy(&engine, sku, &format!("bot{i}"), "r", Some("k1.AAAA.BBBB")).await;
        assert!(matches!(r, Err(PurchaseError::InvalidTicket(_))), "{r:?}");
        let r = buy(&engine, sku, &format!("bot{i}"), "r", None).await;
        assert_eq!(r, Err(PurchaseError::NotAdmitted));
    }
    // INFO itself is the one call counted.
    assert!(calls() - before <= 1, "refused purchases reached Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_with_a_limit_above_one_stays_counted_until_spent() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-spent";
    engine
        .create_sale(SaleSpec {
            per_user_limit: 2,
            ..spec(sku, 4, 1, room(QueueRate::Auto, QueueOrder::Fifo, 1.0))
        })
        .await
        .expect("create");
    let mut tickets = Vec::new();
    for u in ["a", "b", "c"] {
        tickets.push(engine.join_queue(sku, u).await.expect("join").ticket);
    }
    assert_eq!(admit_until(&engine, sku, &tickets, 3).await, 2);
    let token = |i: usize| {
        let (engine, t) = (engine.clone(), tickets[i].clone());
        async move {
            engine
                .queue_status(&t)
                .await
                .expect("read")
                .admission_token
                .expect("admitted")
        }
    };
    let (ta, tb) = (token(0).await, token(1).await);
    buy(&engine, sku, "a", "a1", Some(&ta))
        .await
        .expect("a buys 1");
    buy(&engine, sku, "b", "b1", Some(&tb))
        .await
        .expect("b buys 1");
    engine.admit_round(sku).await.expect("round");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let c = engine.queue_status(&tickets[2]).await.expect("read");
    assert_eq!(
        c.state,
        QueueState::Waiting,
        "c admitted while a and b may still take the 2 units left"
    );
    buy(&engine, sku, "a", "a2", Some(&ta))
        .await
        .expect("a buys a 2nd");
    buy(&engine, sku, "b", "b2", Some(&tb))
        .await
        .expect("b buys a 2nd");
    engine.admit_round(sku).await.expect("round");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let c = engine.queue_status(&tickets[2]).await.expect("read");
    assert_eq!(c.state, QueueState::SoldOut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_sale_tells_its_line_sold_out() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-closed";
    engine
        .create_sale(spec(
            sku,
            5,
            1,
            room(QueueRate::Auto, QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    let a = engine.join_queue(sku, "a").await.expect("join").ticket;
    engine.admit_round(sku).await.expect("round");
    let b = engine.join_queue(sku, "b").await.expect("join").ticket;
    engine.close_sale(sku).await.expect("close");
    engine.admit_round(sku).await.expect("round");
    tokio::time::sleep(Duration::from_millis(120)).await;
    for t in [&a, &b] {
        let s = engine.queue_status(t).await.expect("read");
        assert_eq!(s.state, QueueState::SoldOut, "a closed sale's line");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_lifted_above_a_fence_keep_their_order_across_shards() {
    let cluster = RedisCluster::start(3, 0);
    let engine = room_engine(&cluster).await;
    let sku = "wr-lifted";
    let status = engine
        .create_sale(spec(
            sku,
            100,
            3,
            room(QueueRate::Auto, QueueOrder::Fifo, 1.0),
        ))
        .await
        .expect("create");
    let unix_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let ahead = flashsale::room::arrival_place(unix_ms + 10_000);
    for b in &status.buckets {
        let node = cluster.node(cluster.master_of_slot(b.slot));
        let _: i64 = node.cmd(&[
            "HSET",
            &format!("{{{}}}:lineh", b.tag),
            "f",
            &ahead.to_string(),
        ]);
    }
    let keys = engine.pass_keys().expect("keys");
    let mut places = Vec::new();
    for i in 0..30 {
        let t = engine
            .join_queue(sku, &format!("o{i}"))
            .await
            .expect("join")
            .ticket;
        places.push(keys.verify(&t, 0, 0).expect("ticket").place);
    }
    let inversions = places.windows(2).filter(|w| w[0] > w[1]).count();
    assert_eq!(inversions, 0, "lifted joins out of join order: {places:?}");
}
