//! flashsale under exactly the least privileges it documents
//! (`flashsale::acl`): every node of the cluster and a lock node get an
//! ACL user with that rule, and the engine, its scripts, the order writer,
//! the sweepers, reconcile and every kind of lock run as those users. A
//! command used without its permission fails here with NOPERM.

use std::time::Duration;

use flashsale::lock::{LockOptions, PermitOptions};
use flashsale::{Ack, Config, Engine, PurchaseRequest, SaleSpec};
use flashsale_tests::{
    fast_writer, user_with_home, wait_for_db_orders, PgDb, RedisCluster, RedisServer,
};

fn buy<'a>(sku: &'a str, user: &'a str, qty: i64, rid: &'a str) -> PurchaseRequest<'a> {
    PurchaseRequest {
        sku,
        user,
        qty,
        request_id: rid,
    }
}

/// `ACL SETUSER <user> on ><password> <rule>` on `node`.
fn set_user(node: &flashsale_tests::RedisNode, user: &str, rule: &str) {
    let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">acl-test-pw"];
    args.extend(rule.split_whitespace());
    let _: () = node.cmd(&args);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_the_writer_and_the_locks_run_under_the_least_privilege_rules() {
    let cluster = RedisCluster::start(3, 1);
    for n in &cluster.nodes {
        set_user(n, "flashsale", flashsale::acl::INVENTORY_RULE);
    }
    let lock_node = RedisServer::start();
    set_user(&lock_node.node, "locks", flashsale::acl::LOCK_RULE);
    let as_user =
        |url: String, user: &str| url.replace("redis://", &format!("redis://{user}:acl-test-pw@"));
    let config = Config {
        cluster_nodes: cluster
            .seeds()
            .into_iter()
            .map(|s| as_user(s, "flashsale"))
            .collect(),
        lock_nodes: vec![as_user(lock_node.url(), "locks")],
        ack: Ack::Replicated,
        pending_timeout: Duration::from_millis(500),
        room: flashsale::admission::RoomKeysConfig {
            secret: Some("acl-test-room-secret-of-32-bytes-or-more".into()),
            ..Default::default()
        },
        ..Config::default()
    };
    let engine = Engine::connect(config)
        .await
        .expect("the engine connects as the least-privilege user");

    // A multi-bucket sale: purchases at home and through the walk, a
    // restock, a sold-out answer, status, close.
    engine
        .create_sale(SaleSpec {
            buckets: 3,
            per_user_limit: 2,
            ..SaleSpec::new("acl-sale", 3)
        })
        .await
        .expect("create");
    for i in 0..3 {
        let user = user_with_home(&format!("a{i}"), 3, 0);
        engine
            .purchase(buy("acl-sale", &user, 1, "r"))
            .await
            .expect("confirmed, at home or through the walk");
    }
    let late = user_with_home("late", 3, 1);
    let refused = engine.purchase(buy("acl-sale", &late, 1, "r")).await;
    assert!(
        matches!(refused, Err(flashsale::PurchaseError::SoldOut)),
        "{refused:?}"
    );
    engine.restock("acl-sale", 3).await.expect("restock");
    engine.sale_status("acl-sale").await.expect("status");
    engine
        .settle_abandoned()
        .await
        .expect("the fall-through sweeper");

    // A waiting room: join, an admission round (fence, read, gate, the
    // sold-out flip's PUBLISH), a ticket read, an admitted purchase and
    // its room_done.
    engine
        .create_sale(SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            queue: Some(flashsale::QueueSpec {
                rate: flashsale::QueueRate::Auto,
                window_ms: 60_000,
                order: flashsale::QueueOrder::Fifo,
                overbook: 1.0,
            }),
            ..SaleSpec::new("acl-room", 1)
        })
        .await
        .expect("create a room sale");
    let ticket = engine
        .join_queue("acl-room", "w")
        .await
        .expect("join")
        .ticket;
    engine
        .admit_round("acl-room")
        .await
        .expect("admission round");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let token = engine
        .queue_status(&ticket)
        .await
        .expect("ticket read")
        .admission_token
        .expect("admitted");
    engine
        .purchase_admitted(buy("acl-room", "w", 1, "r"), &token)
        .await
        .expect("admitted purchase");
    engine
        .admit_round("acl-room")
        .await
        .expect("the sold-out flip");
    let room = engine.room_status("acl-room").await.expect("room");
    assert_eq!(
        (room.state.as_str(), room.admitted_not_done),
        ("sold_out", 0)
    );

    // Holds: pay, cancel, expiry.
    let held = engine
        .create_sale(SaleSpec {
            hold_ms: 200,
            ..SaleSpec::new("acl-hold", 10)
        })
        .await
        .expect("create a hold sale");
    assert_eq!(held.sku, "acl-hold");
    let paid = engine
        .purchase(buy("acl-hold", "p", 1, "r"))
        .await
        .expect("held");
    engine.pay(&paid.order_id, "pay-1").await.expect("pay");
    let cancelled = engine
        .purchase(buy("acl-hold", "c", 1, "r"))
        .await
        .expect("held");
    engine.cancel(&cancelled.order_id).await.expect("cancel");
    engine
        .purchase(buy("acl-hold", "e", 1, "r"))
        .await
        .expect("held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    engine.expire_due().await.expect("the expiry sweeper");
    engine.order(&paid.order_id).await.expect("order lookup");

    // The order writer and reconcile.
    let pg = PgDb::create();
    let pool = flashsale::db::pool(&pg.url(), 4).expect("pool");
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "acl-sale", 3, Duration::from_secs(60)).await;
    writer.shutdown().await.expect("writer stops");
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &[])
        .await
        .expect("reconcile");
    assert!(ledger.iter().all(|r| r.conserved), "{ledger:?}");
    engine.close_sale("acl-sale").await.expect("close");

    // Every kind of lock.
    let locks = engine.locks().expect("lock nodes");
    let guard = locks
        .lock("acl", &LockOptions::new("o").wait(Duration::from_secs(5)))
        .await
        .expect("lock");
    assert!(guard.unlock().await);
    let fair = locks
        .lock("acl-fair", &LockOptions::new("o").fair())
        .await
        .expect("fair lock");
    assert!(fair.unlock().await);
    let read = locks
        .read_lock("acl-rw", &LockOptions::new("o"))
        .await
        .expect("read lock");
    assert!(read.unlock().await);
    let write = locks
        .write_lock("acl-rw", &LockOptions::new("o"))
        .await
        .expect("write lock");
    assert!(write.unlock().await);
    let sem = locks.semaphore("acl-sem").expect("semaphore");
    sem.set_permits(2).await.expect("permits");
    let permits = sem
        .acquire(1, &PermitOptions::new("o"))
        .await
        .expect("a permit");
    for p in permits {
        p.release().await.expect("released");
    }
    let latch = locks.latch("acl-latch").expect("latch");
    latch.set_count(1).await.expect("count");
    latch.count_down().await.expect("count down");
    latch.wait(Duration::from_secs(5)).await.expect("open");

    // And the rule is narrow: what flashsale never needs is refused.
    let mut c = redis::Client::open(as_user(cluster.nodes[0].url(), "flashsale"))
        .expect("url")
        .get_connection()
        .expect("connect as flashsale");
    for cmd in [
        vec!["FLUSHALL"],
        vec!["KEYS", "*"],
        vec!["CONFIG", "GET", "*"],
        vec!["GET", "not-a-tag"],
        // The writers' group is created and its dead consumers deleted,
        // never destroyed or moved (the attack on this rule did both).
        vec!["XGROUP", "DESTROY", "{acl}:orders", "writers"],
        vec!["XGROUP", "SETID", "{acl}:orders", "writers", "0"],
    ] {
        let mut q = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            q.arg(*a);
        }
        let r: redis::RedisResult<redis::Value> = q.query(&mut c);
        let e = r.expect_err("refused").to_string().to_lowercase();
        assert!(e.contains("noperm"), "{cmd:?}: {e}");
    }
}
