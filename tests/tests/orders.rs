//! The order pipeline against a real cluster and a real PostgreSQL: every
//! confirmed order reaches the `orders` table exactly once, through writer
//! crashes, concurrent writers, a database outage and poison entries.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use flashsale::{Engine, PurchaseRequest, SaleSpec};
use flashsale_tests::fixture::Fixture;
use flashsale_tests::{
    db_order_ids, fast_writer, wait_for_db_orders, wait_until, PgDb, RedisCluster, TcpProxy,
};

/// `n` purchases of one unit each at a concurrency of 100; returns the
/// confirmed order ids.
async fn buy(engine: &Engine, sku: &str, n: usize, tag: &str) -> Vec<String> {
    let sem = Arc::new(tokio::sync::Semaphore::new(100));
    let sku: Arc<str> = sku.into();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await.expect("semaphore");
        let engine = engine.clone();
        let sku = sku.clone();
        let id = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            let r = engine
                .purchase(PurchaseRequest {
                    sku: &sku,
                    user: &id,
                    qty: 1,
                    request_id: &id,
                })
                .await;
            drop(permit);
            r
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        if let Ok(c) = t.await.expect("task") {
            ids.push(c.order_id);
        }
    }
    ids
}

/// The rows in PostgreSQL are exactly the confirmed orders: the same set,
/// and as many rows as confirmations (each confirmation its own order).
fn assert_exactly_once(confirmed: &[String], in_db: &[String]) {
    let ok: HashSet<_> = confirmed.iter().collect();
    assert_eq!(
        ok.len(),
        confirmed.len(),
        "each confirmation is its own order"
    );
    let db: HashSet<_> = in_db.iter().collect();
    assert_eq!(
        ok, db,
        "every confirmed order is in PostgreSQL, and nothing else"
    );
    assert_eq!(in_db.len(), confirmed.len(), "one row per confirmed order");
}

/// This machine's clock, ms since the Unix epoch (Redis reads the same).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// A pool reaching `pg` through a proxy the test can cut and restore.
async fn pool_through_proxy(pg: &PgDb, size: usize) -> (TcpProxy, deadpool_postgres::Pool) {
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=1",
        proxy.port, pg.name
    );
    let pool = flashsale::db::pool(&url, size).expect("pool");
    (proxy, pool)
}

/// Entries delivered to the writers' group and not yet acknowledged, over
/// every bucket of `sku`.
async fn pending_entries(cluster: &RedisCluster, engine: &Engine, sku: &str) -> i64 {
    let status = engine.sale_status(sku).await.expect("status");
    status
        .buckets
        .iter()
        .map(|b| writers_pending(cluster.node(cluster.master_of_slot(b.slot)), &b.stream))
        .sum()
}

/// Entries of `stream` delivered to the writers' group and not yet
/// acknowledged; 0 while the group does not exist.
fn writers_pending(node: &flashsale_tests::RedisNode, stream: &str) -> i64 {
    let summary: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(flashsale::orders::GROUP)
        .query(&mut node.conn());
    match summary {
        Ok(redis::Value::Array(p)) => match p.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_orders_reach_postgres_exactly_once() {
    let Fixture {
        cluster: _cluster,
        pg: _pg,
        pool,
        engine,
        ..
    } = Fixture::builder()
        .sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("tenk", 10_000)
        })
        .build()
        .await;
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");

    // Reconcile keeps running while buyers and the writer move units around:
    // its snapshot must balance every time, not only at quiescence.
    // It runs for the whole sale and drain (not a fixed number of times),
    // so on a slow machine it still sees the middle of the flow.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let (engine, pool, done) = (engine.clone(), pool.clone(), done.clone());
        tokio::spawn(async move {
            let mut checks = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let r = flashsale::ledger::reconcile(&engine, &pool, &["tenk".to_owned()])
                    .await
                    .expect("reconcile");
                checks.push(r[0].clone());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            checks
        })
    };
    let confirmed = buy(&engine, "tenk", 10_000, "b").await;
    assert_eq!(confirmed.len(), 10_000);
    wait_for_db_orders(&pool, "tenk", 10_000, Duration::from_secs(60)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let checks = checker.await.expect("checker");
    assert!(
        checks.iter().all(|c| c.conserved),
        "unbalanced under load: {:?}",
        checks.iter().find(|c| !c.conserved)
    );
    assert!(
        checks.iter().any(|c| c.pending > 0 && c.written > 0),
        "some checks ran mid-flight"
    );
    wait_for_db_orders(&pool, "tenk", 10_000, Duration::from_secs(60)).await;
    let report = writer.shutdown().await.expect("writer stops");
    assert_eq!(report.written, 10_000);
    assert_exactly_once(&confirmed, &db_order_ids(&pool, "tenk").await);

    let ledger = flashsale::ledger::reconcile(&engine, &pool, &["tenk".to_owned()])
        .await
        .expect("reconcile");
    assert_eq!(
        (
            ledger[0].initial,
            ledger[0].remaining,
            ledger[0].pending,
            ledger[0].written
        ),
        (10_000, 0, 0, 10_000)
    );
    assert!(ledger[0].conserved);
    let status = engine.sale_status("tenk").await.expect("status");
    assert!(
        status.buckets.iter().all(|b| b.stream_len == 0),
        "acknowledged entries are trimmed (by whichever of the default two writers \
         acknowledges last: trimming only up to its own last ack left the other's entries)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_killed_mid_batch_loses_and_duplicates_nothing() {
    let Fixture {
        cluster,
        pg,
        pool,
        engine,
        ..
    } = Fixture::builder()
        .sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("crash", 3000)
        })
        .build()
        .await;
    let confirmed = buy(&engine, "crash", 3000, "c").await;

    // The first writer reaches PostgreSQL through a proxy the test cuts
    // after its first rows: it then holds read-but-unacknowledged entries
    // for certain when it is killed.
    let (proxy, via_proxy) = pool_through_proxy(&pg, 2).await;
    let first = engine
        .spawn_order_writer(
            via_proxy,
            flashsale::WriterConfig {
                batch: 20,
                ..fast_writer(Duration::from_millis(500))
            },
        )
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "crash", 1, Duration::from_secs(30)).await;
    proxy.cut();
    flashsale_tests::wait_until(
        Duration::from_secs(30),
        "the first writer holds entries it cannot write",
        || {
            let (cluster, engine) = (&cluster, &engine);
            async move { pending_entries(cluster, engine, "crash").await > 0 }
        },
    )
    .await;
    first.abort();
    let left = pending_entries(&cluster, &engine, "crash").await;
    assert!(left > 0, "the killed writer left entries pending");
    assert!(
        db_order_ids(&pool, "crash").await.len() < 3000,
        "the first writer was killed before it finished"
    );

    let second = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_millis(500)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "crash", 3000, Duration::from_secs(60)).await;
    // Entries the dead writer had committed but not acknowledged (the cut
    // can fall between its COMMIT and the reply) are already in PostgreSQL,
    // so 3,000 rows can be there before the second writer takes them over:
    // wait for the takeover itself, the event this test is about.
    flashsale_tests::wait_until(
        Duration::from_secs(60),
        "the second writer took over every pending entry",
        || {
            let (cluster, engine) = (&cluster, &engine);
            async move { pending_entries(cluster, engine, "crash").await == 0 }
        },
    )
    .await;
    let report = second.shutdown().await.expect("stops");
    assert!(
        report.claimed > 0,
        "the second writer took over the dead one's pending entries: {report:?}"
    );
    assert_eq!(pending_entries(&cluster, &engine, "crash").await, 0);
    assert_exactly_once(&confirmed, &db_order_ids(&pool, "crash").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_at_once_write_everything_once() {
    let Fixture {
        cluster,
        pg,
        pool,
        engine,
        ..
    } = Fixture::builder()
        .pool_size(8)
        .sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("twin", 4000)
        })
        .build()
        .await;
    // Writer A reaches PostgreSQL through a proxy that is cut once A has
    // started: it reads a batch and cannot write it. Writer B (1 ms claim
    // threshold) steals A's entries and writes them. Then A's database comes
    // back and A writes its batch too: ON CONFLICT must absorb every row.
    let (proxy, via_proxy) = pool_through_proxy(&pg, 2).await;
    let cfg = || flashsale::WriterConfig {
        batch: 50,
        ..fast_writer(Duration::from_millis(1))
    };
    let a = engine
        .spawn_order_writer(via_proxy, cfg())
        .await
        .expect("writer a");
    proxy.cut();
    let confirmed = buy(&engine, "twin", 4000, "t").await;
    flashsale_tests::wait_until(Duration::from_secs(30), "A holds a batch", || {
        let (cluster, engine) = (&cluster, &engine);
        async move { pending_entries(cluster, engine, "twin").await > 0 }
    })
    .await;
    let b = engine
        .spawn_order_writer(pool.clone(), cfg())
        .await
        .expect("writer b");
    wait_for_db_orders(&pool, "twin", 4000, Duration::from_secs(60)).await;
    proxy.restore();
    // A's batch, written by B already, goes through A's retry now.
    flashsale_tests::wait_until(Duration::from_secs(30), "A acknowledges its batch", || {
        let acked = a.progress().acked;
        async move { acked > 0 }
    })
    .await;
    let (ra, rb) = (
        a.shutdown().await.expect("a"),
        b.shutdown().await.expect("b"),
    );
    assert_eq!(ra.written + rb.written, 4000, "rows inserted once in all");
    assert!(rb.claimed > 0, "B stole A's entries: {rb:?}");
    assert!(
        ra.acked > ra.written,
        "A's batch met rows B had written, and ON CONFLICT absorbed them: {ra:?}"
    );
    assert_exactly_once(&confirmed, &db_order_ids(&pool, "twin").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_backs_up_the_streams_then_drains() {
    let Fixture {
        cluster: _cluster,
        pg,
        pool: direct,
        engine,
        ..
    } = Fixture::builder()
        .pool_size(2)
        .sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("outage", 5000)
        })
        .build()
        .await;
    let (proxy, pool) = pool_through_proxy(&pg, 4).await;
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");

    let mut confirmed = buy(&engine, "outage", 500, "before").await;
    wait_for_db_orders(&direct, "outage", 500, Duration::from_secs(30)).await;

    proxy.cut();
    let cut_at = std::time::Instant::now();
    let mut backlog_seen = 0u64;
    let mut wave = 0;
    while cut_at.elapsed() < Duration::from_secs(10) {
        let got = buy(&engine, "outage", 200, &format!("during{wave}")).await;
        assert_eq!(
            got.len(),
            200,
            "purchases keep confirming while PostgreSQL is down"
        );
        confirmed.extend(got);
        wave += 1;
        let status = engine.sale_status("outage").await.expect("status");
        backlog_seen = backlog_seen.max(status.buckets.iter().map(|b| b.stream_len).sum());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        db_order_ids(&direct, "outage").await.len(),
        500,
        "nothing was written during the outage"
    );
    assert!(
        backlog_seen >= 200 * wave as u64,
        "the backlog grew in the streams: {backlog_seen}"
    );

    proxy.restore();
    wait_for_db_orders(&direct, "outage", confirmed.len(), Duration::from_secs(60)).await;
    writer.shutdown().await.expect("stops");
    assert_exactly_once(&confirmed, &db_order_ids(&direct, "outage").await);
    let ledger = flashsale::ledger::reconcile(&engine, &direct, &[])
        .await
        .expect("reconcile");
    assert!(ledger.iter().all(|r| r.conserved), "{ledger:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entry_is_dead_lettered_and_later_orders_still_written() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("poison", 100))
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let _: String = node.cmd(&["XADD", &b.stream, "*", "order_id", "evil", "qty", "lots"]);
    let confirmed = buy(&engine, "poison", 50, "p").await;

    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "poison", 50, Duration::from_secs(30)).await;
    let report = writer.shutdown().await.expect("stops");
    assert_eq!(report.dead_lettered, 1);
    assert_exactly_once(&confirmed, &db_order_ids(&pool, "poison").await);

    let dead = format!("{{{}}}:orders:dead", b.tag);
    let len: i64 = node.cmd(&["XLEN", &dead]);
    assert_eq!(len, 1);
    let entry: redis::Value = node.cmd(&["XRANGE", &dead, "-", "+"]);
    let text = format!("{entry:?}");
    assert!(
        text.contains("field qty is not an integer"),
        "the reason is kept: {text}"
    );
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &["poison".to_owned()])
        .await
        .expect("reconcile");
    assert!(
        ledger[0].conserved && ledger[0].dead_lettered == 1,
        "{ledger:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reports_orders_their_stream_lost() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("lost", 10))
        .build()
        .await;
    let status = sale.expect("sale");
    let confirmed = buy(&engine, "lost", 3, "l").await;
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "lost", 3, Duration::from_secs(30)).await;
    writer.shutdown().await.expect("stops");
    assert_eq!(confirmed.len(), 3);
    // What a failover before replication does: the stream (with its ids)
    // and the stock go back to before the three orders, while PostgreSQL
    // already holds them.
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let _: i64 = node.cmd(&["DEL", &b.stream]);
    let _: () = node.cmd(&["SET", &b.key, "10"]);
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &["lost".to_owned()])
        .await
        .expect("reconcile");
    assert!(
        !ledger[0].conserved,
        "a lost stream is never balanced: {ledger:?}"
    );
    assert_eq!(ledger[0].lost_from_stream, 3, "{ledger:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_postgres_refuses_is_dead_lettered_and_other_skus_still_flow() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("refused", 100))
        .build()
        .await;
    let status = sale.expect("sale");
    engine
        .create_sale(SaleSpec::new("bystander", 100))
        .await
        .expect("create");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    // Well-formed for the writer, but out of PostgreSQL's timestamp range.
    let _: String = node.cmd(&[
        "XADD",
        &b.stream,
        "*",
        "order_id",
        "far-future",
        "sku",
        "refused",
        "user",
        "u",
        "qty",
        "1",
        "bucket",
        "0",
        "tag",
        &b.tag,
        "ts",
        "99999999999999999",
    ]);
    let mine = buy(&engine, "refused", 20, "r").await;
    let theirs = buy(&engine, "bystander", 20, "y").await;
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "bystander", 20, Duration::from_secs(30)).await;
    wait_for_db_orders(&pool, "refused", 20, Duration::from_secs(30)).await;
    let report = writer.shutdown().await.expect("stops");
    assert_eq!(report.rejected, 1, "{report:?}");
    assert_exactly_once(&mine, &db_order_ids(&pool, "refused").await);
    assert_exactly_once(&theirs, &db_order_ids(&pool, "bystander").await);
    let dead: redis::Value = node.cmd(&["XRANGE", &format!("{{{}}}:orders:dead", b.tag), "-", "+"]);
    let text = format!("{dead:?}");
    assert!(
        text.contains("far-future") && text.contains("out of range"),
        "dead-lettered with the database's message: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_keeps_entries_another_consumer_group_has_not_read() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("audited", 100))
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let _: () = node.cmd(&["XGROUP", "CREATE", &b.stream, "audit", "0", "MKSTREAM"]);
    let confirmed = buy(&engine, "audited", 30, "a").await;
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "audited", 30, Duration::from_secs(30)).await;
    writer.shutdown().await.expect("stops");
    let read: redis::Value = node.cmd(&[
        "XREADGROUP",
        "GROUP",
        "audit",
        "auditor",
        "COUNT",
        "1000",
        "STREAMS",
        &b.stream,
        ">",
    ]);
    let text = format!("{read:?}");
    for id in &confirmed {
        assert!(
            text.contains(id.as_str()),
            "the audit group still reads {id}"
        );
    }
}

/// Found by the attack on two writers per process: trimming was no longer
/// bounded by the trimming writer's own acknowledgements, so when the
/// writers' group was missing at the moment of the ack (destroyed, or a
/// promoted replica that never had it; XACK on a missing group answers 0,
/// not an error), the trim went by another group alone and deleted entries
/// the writers had never read. Trimming now needs the writers' group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_writer_group_never_lets_another_group_trim_unwritten_orders() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("orphaned", 50))
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let confirmed = buy(&engine, "orphaned", 50, "o").await;
    flashsale::db::migrate(&pool).await.expect("migrations");
    // The writer reads a batch and blocks on its INSERT.
    let mut locker = pool.get().await.expect("db connection");
    let lock = locker.transaction().await.expect("transaction");
    lock.batch_execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let writer = engine
        .spawn_order_writer(
            pool.clone(),
            flashsale::WriterConfig {
                batch: 10,
                writers: 1,
                ..fast_writer(Duration::from_secs(5))
            },
        )
        .await
        .expect("writer");
    flashsale_tests::wait_until(Duration::from_secs(30), "the writer holds a batch", || {
        let pending = writers_pending(node, &b.stream);
        async move { pending == 10 }
    })
    .await;
    // Meanwhile the writers' group disappears, and an audit group reads
    // everything.
    let _: i64 = node.cmd(&["XGROUP", "DESTROY", &b.stream, "flashsale-writer"]);
    let _: () = node.cmd(&["XGROUP", "CREATE", &b.stream, "audit", "0"]);
    let _: redis::Value = node.cmd(&[
        "XREADGROUP",
        "GROUP",
        "audit",
        "auditor",
        "NOACK",
        "COUNT",
        "1000",
        "STREAMS",
        &b.stream,
        ">",
    ]);
    lock.commit().await.expect("unlock");
    // Every order still reaches PostgreSQL: the writer recreates its group
    // and reads the stream again.
    wait_for_db_orders(&pool, "orphaned", 50, Duration::from_secs(60)).await;
    writer.shutdown().await.expect("stops");
    assert_exactly_once(&confirmed, &db_order_ids(&pool, "orphaned").await);
}

/// A purchase queues its order as one field: the SKU and the bucket are read
/// back from the order id, the shard tag from the stream, the time from the
/// entry id. A row that got any of them wrong (another bucket's tag, the
/// home bucket for an order a fall-through took elsewhere, a time off by
/// the id's sequence) would still be "written exactly once"; this checks
/// every column against what the buyer was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_order_record_reaches_postgres_with_every_column_the_buyer_was_told() {
    every_column_as_the_buyer_was_told(flashsale::OrderRecord::Compact).await;
}

/// `order_record = "fields"`, for upgrades: the entries are in the form an
/// order writer from before the compact one reads (every field it needed),
/// and today's writer still writes them right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_per_column_order_record_for_older_writers_reaches_postgres_with_every_column() {
    every_column_as_the_buyer_was_told(flashsale::OrderRecord::Fields).await;
}

async fn every_column_as_the_buyer_was_told(form: flashsale::OrderRecord) {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine: _default_engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("rows-paid", 30)
        })
        .build()
        .await;
    let paid = sale.expect("sale");
    let engine = flashsale_tests::engine_with(&cluster, |c| c.order_record = form).await;
    let held = engine
        .create_sale(SaleSpec {
            buckets: 3,
            hold_ms: 600_000,
            ..SaleSpec::new("rows-held", 30)
        })
        .await
        .expect("create");
    let started = unix_ms();
    // Buyers until both sales are sold out: with 3 buckets of 10 units and
    // homes picked by user id, some buyers' homes run out first and their
    // purchases fall through to another bucket (take.lua).
    let mut told = Vec::new();
    for sku in ["rows-paid", "rows-held"] {
        for i in 0..200u32 {
            let user = format!("row:user#{i}");
            let qty = 1 + i64::from(i % 2);
            match engine
                .purchase(PurchaseRequest {
                    sku,
                    user: &user,
                    qty,
                    request_id: &format!("r{i}"),
                })
                .await
            {
                Ok(c) => told.push((sku, user, qty, c)),
                Err(flashsale::PurchaseError::SoldOut) => {}
                Err(e) => panic!("purchase {sku} {user}: {e}"),
            }
        }
    }
    let finished = unix_ms();
    // The form on the streams: an older writer needed every one of these.
    for status in [&paid, &held] {
        for b in &status.buckets {
            let node = cluster.node(cluster.master_of_slot(b.slot));
            let reply: redis::Value = node.cmd(&["XRANGE", &b.stream, "-", "+"]);
            for e in flashsale::orders::entry::parse_entries(&reply) {
                let names: Vec<&str> = e.fields.iter().map(|(f, _)| f.as_str()).collect();
                let old = ["order_id", "sku", "user", "qty", "bucket", "tag", "ts"];
                match form {
                    flashsale::OrderRecord::Fields => assert!(
                        old.iter().all(|f| names.contains(f)),
                        "a field per column: {names:?}"
                    ),
                    flashsale::OrderRecord::Compact => {
                        assert!(names == ["p"] || names == ["h"], "one field: {names:?}")
                    }
                }
            }
        }
    }
    let units = |sku: &str| -> i64 { told.iter().filter(|t| t.0 == sku).map(|t| t.2).sum::<i64>() };
    assert_eq!(
        (units("rows-paid"), units("rows-held")),
        (30, 30),
        "both sell out"
    );

    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    for sku in ["rows-paid", "rows-held"] {
        let n = told.iter().filter(|t| t.0 == sku).count();
        wait_for_db_orders(&pool, sku, n, Duration::from_secs(30)).await;
    }
    let report = writer.shutdown().await.expect("stops");
    assert_eq!(report.dead_lettered, 0, "{report:?}");

    let c = pool.get().await.expect("db connection");
    for (sku, user, qty, confirmed) in &told {
        let row = c
            .query_one(
                "SELECT sku, user_id, qty, bucket, shard_tag, status,
                        (extract(epoch FROM created_at) * 1000)::int8,
                        (extract(epoch FROM expires_at) * 1000)::int8
                 FROM orders WHERE order_id = $1",
                &[&confirmed.order_id],
            )
            .await
            .expect("the confirmed order is in PostgreSQL");
        let tags = if *sku == "rows-paid" { &paid } else { &held };
        let bucket: i32 = row.get(3);
        let created_ms: i64 = row.get(6);
        let expires_ms: Option<i64> = row.get(7);
        assert_eq!(
            (
                row.get::<_, String>(0),
                row.get::<_, String>(1),
                i64::from(row.get::<_, i32>(2)),
                bucket,
                row.get::<_, String>(4),
                row.get::<_, String>(5),
                expires_ms,
            ),
            (
                sku.to_string(),
                user.clone(),
                *qty,
                confirmed.bucket as i32,
                tags.buckets[confirmed.bucket as usize].tag.clone(),
                if *sku == "rows-paid" { "paid" } else { "held" }.to_owned(),
                confirmed.expires_at_ms.map(|e| e as i64),
            ),
            "order {}",
            confirmed.order_id
        );
        // Redis and the test share this machine's clock; to_timestamp keeps
        // microseconds, so allow a millisecond of rounding either side.
        assert!(
            (started - 1..=finished + 1).contains(&created_ms),
            "order {} created at {created_ms}, purchases ran {started}..{finished}",
            confirmed.order_id
        );
    }
}

/// An order's time is the script's one clock reading, the one its hold's
/// deadline is counted from, not the id Redis gives its stream entry: the
/// ids of one batch step on as it runs, and after the clock steps back (or
/// a failover to a node whose clock is behind) every new id is the last one
/// plus a sequence number, however late. A row must then still say when the
/// order was made and be held exactly `hold_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_orders_row_is_held_exactly_hold_ms_even_when_the_stream_id_is_ahead_of_the_clock() {
    const HOLD_MS: i64 = 600_000;
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec {
            hold_ms: HOLD_MS as u64,
            ..SaleSpec::new("ahead", 200)
        })
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    // The stream's last id a minute ahead of the clock, as a clock that
    // stepped back would leave it.
    let ahead = format!("{}-0", unix_ms() + 60_000);
    let _: String = node.cmd(&["XADD", &b.stream, &ahead, "x", "y"]);
    let _: i64 = node.cmd(&["XDEL", &b.stream, &ahead]);

    let started = unix_ms();
    // 200 buyers at once: batches of many held purchases, one clock each.
    let confirmed = buy(&engine, "ahead", 200, "h").await;
    let finished = unix_ms();
    assert_eq!(confirmed.len(), 200);
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "ahead", 200, Duration::from_secs(30)).await;
    writer.shutdown().await.expect("stops");

    let c = pool.get().await.expect("db connection");
    let rows = c
        .query(
            "SELECT order_id, (extract(epoch FROM created_at) * 1000)::int8,
                    (extract(epoch FROM expires_at) * 1000)::int8
             FROM orders WHERE sku = 'ahead'",
            &[],
        )
        .await
        .expect("rows");
    assert_eq!(rows.len(), 200);
    for row in rows {
        let (id, created, expires): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            expires - created,
            HOLD_MS,
            "order {id} is held exactly hold_ms"
        );
        assert!(
            (started - 1..=finished + 1).contains(&created),
            "order {id} created at {created}, purchases ran {started}..{finished}"
        );
    }
}

/// Found by the attack on the order path: the writer read the stream's
/// groups, then their pending entries, then trimmed, in three round trips,
/// so a group created at id 0 between the read and the trim (an audit
/// reader starting while the writers drain) lost entries that were in the
/// stream when it was made. The bound and the trim are now one script.
/// Groups are made again and again while a writer trims after every batch
/// of 50; each must first read the entry that was first when it was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_created_while_the_writer_trims_loses_no_entry() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("racetrim", 1))
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let mut conn = node.conn();
    const ENTRIES: usize = 40_000;
    let ts = unix_ms();
    for chunk in (0..ENTRIES).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("XADD")
                .arg(&b.stream)
                .arg("*")
                .arg("p")
                .arg(format!("1 {ts} racetrim~0~{i:032x} u{i}"))
                .ignore();
        }
        let _: () = pipe.query(&mut conn).expect("queue the orders");
    }
    let writer = engine
        .spawn_order_writer(
            pool.clone(),
            flashsale::WriterConfig {
                batch: 50,
                ..fast_writer(Duration::from_secs(5))
            },
        )
        .await
        .expect("writer");

    // The id at `path` (indices into nested arrays): XRANGE replies
    // [[id, fields]], XREADGROUP [[stream, [[id, fields]]]].
    let id_at = |v: &redis::Value, path: &[usize]| -> Option<String> {
        let mut v = v;
        for &i in path {
            match v {
                redis::Value::Array(items) => v = items.get(i)?,
                _ => return None,
            }
        }
        match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into()),
            _ => None,
        }
    };
    let started = std::time::Instant::now();
    let (mut made, mut lost) = (0u32, Vec::new());
    while started.elapsed() < Duration::from_secs(20) {
        let len: i64 = redis::cmd("XLEN")
            .arg(&b.stream)
            .query(&mut conn)
            .expect("xlen");
        if len < 100 {
            break;
        }
        let group = format!("audit{made}");
        let (first, _): (redis::Value, redis::Value) = redis::pipe()
            .atomic()
            .cmd("XRANGE")
            .arg(&b.stream)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .cmd("XGROUP")
            .arg("CREATE")
            .arg(&b.stream)
            .arg(&group)
            .arg("0")
            .query(&mut conn)
            .expect("make a group at 0");
        let read: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&group)
            .arg("a")
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(&b.stream)
            .arg(">")
            .query(&mut conn)
            .expect("read");
        let _: i64 = redis::cmd("XGROUP")
            .arg("DESTROY")
            .arg(&b.stream)
            .arg(&group)
            .query(&mut conn)
            .expect("destroy");
        made += 1;
        if let Some(first) = id_at(&first, &[0, 0]) {
            let read = id_at(&read, &[0, 1, 0, 0]);
            if read.as_deref() != Some(first.as_str()) {
                lost.push((first, read));
            }
        }
        // While a group made at 0 is on the stream, nothing is trimmed:
        // leave the writer time to trim between groups.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    writer.shutdown().await.expect("stops");
    assert!(
        made > 100,
        "only {made} groups made while the writer drained"
    );
    assert!(
        lost.is_empty(),
        "{} of {made} groups lost entries (first when made, first read): {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

/// Found by the attack on the order path: a writer stopped (SIGSTOP, a long
/// pause) between its INSERT and its COMMIT held its rows' locks with no end,
/// and the writer that took its entries over waited on them for good while
/// every other stream waited behind it. flashsale's write transactions
/// (`db::begin`: the writer's batches, migrations, fenced writes) now run
/// with `SET LOCAL idle_in_transaction_session_timeout = '30s'`, so the
/// server ends a session left idle in one. Found by the attack on that fix:
/// a startup option for it made flashsale unable to connect through
/// PgBouncer (which refuses startup options) and overrode a user's own
/// value for every statement; nothing outlives the transaction now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_transaction_left_idle_is_ended_by_the_server_and_the_session_is_untouched() {
    let pg = PgDb::create();
    let pool = flashsale::db::pool(&pg.url(), 2).expect("pool");
    async fn show(c: &deadpool_postgres::Object) -> String {
        c.query_one("SHOW idle_in_transaction_session_timeout", &[])
            .await
            .expect("show")
            .get::<_, String>(0)
    }
    let mut c = pool.get().await.expect("connection");
    assert_eq!(show(&c).await, "0", "the session is as the server set it");
    {
        let tx = flashsale::db::begin(&mut c).await.expect("begin");
        let inside: String = tx
            .query_one("SHOW idle_in_transaction_session_timeout", &[])
            .await
            .expect("show")
            .get(0);
        assert_eq!(inside, "30s", "inside a write transaction");
        tx.commit().await.expect("commit");
    }
    assert_eq!(show(&c).await, "0", "nothing outlives the transaction");

    // A write transaction left idle, as a stopped writer's: the server ends
    // its session, and with it the transaction and its locks.
    let mut idle = pool.get().await.expect("connection");
    let tx = flashsale::db::begin(&mut idle).await.expect("begin");
    let pid: i32 = tx
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("in the transaction")
        .get(0);
    wait_until(
        Duration::from_secs(120),
        "the session idle in its transaction was never ended",
        || async {
            let alive: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .expect("activity")
                .get(0);
            alive == 0
        },
    )
    .await;
    assert!(
        tx.execute("SELECT 1", &[]).await.is_err(),
        "its transaction is gone"
    );
}

/// Found by the attack on the order path: a stream id is two 64-bit
/// unsigned numbers, and the ledger read them as signed ones (in Rust and in
/// its SQL), so one stream whose last id had a part past 2^63 (an entry
/// added by hand with the last possible id) failed `reconcile` of every
/// sale, blinding the ledger and its gauges. Such an entry is not an order:
/// the sale still reconciles, and so do the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_id_past_two_to_the_63_does_not_blind_the_ledger() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("farid", 10))
        .build()
        .await;
    engine
        .create_sale(SaleSpec::new("nearid", 10))
        .await
        .expect("create");
    let confirmed = buy(&engine, "farid", 2, "f").await;
    assert_eq!(confirmed.len(), 2);
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer");
    wait_for_db_orders(&pool, "farid", 2, Duration::from_secs(30)).await;
    writer.shutdown().await.expect("stops");
    let b = &sale.expect("sale").buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let _: String = node.cmd(&[
        "XADD",
        &b.stream,
        "18446744073709551615-18446744073709551615",
        "junk",
        "1",
    ]);
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &[])
        .await
        .expect("reconcile every sale");
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert!(
        ledger.iter().all(|r| r.conserved),
        "both sales balance: {ledger:?}"
    );
}

/// Found by the attack on the order path: the writer copied an entry it
/// cannot write to the dead-letter stream and acknowledged it later, in
/// another command, so an acknowledgement that failed (or a writer that
/// died in between) left the entry pending, and every later attempt copied
/// it again: one malformed entry became 6 dead letters, and reconcile
/// reported 6. The copy and the acknowledgement are now one step. Here the
/// master refuses XACK to the writer's user for a while (ACL), so attempts
/// fail again and again; once it allows it, the entry is dead-lettered
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_is_dead_lettered_once_however_often_its_acknowledgement_fails() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("deadonce", 10))
        .build()
        .await;
    let b = &sale.expect("sale").buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let dead = flashsale::keys::dead_letter_stream(&b.tag);
    let _: String = node.cmd(&["XADD", &b.stream, "*", "junk", "1"]);
    let _: () = node.cmd(&["ACL", "LOG", "RESET"]);
    let _: () = node.cmd(&["ACL", "SETUSER", "default", "-xack"]);
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_millis(200)))
        .await
        .expect("writer");
    // Several attempts, each refused its acknowledgement.
    wait_until(
        Duration::from_secs(60),
        "the writer never tried to acknowledge three times",
        || async { acl_refusals(node) >= 3 },
    )
    .await;
    let _: () = node.cmd(&["ACL", "SETUSER", "default", "+xack"]);
    wait_until(
        Duration::from_secs(60),
        "the entry was never dead-lettered",
        || async {
            let len: i64 = node.cmd(&["XLEN", &dead]);
            writers_pending(node, &b.stream) == 0 && len > 0
        },
    )
    .await;
    writer.shutdown().await.expect("stops");
    let copies: i64 = node.cmd(&["XLEN", &dead]);
    assert_eq!(copies, 1, "one malformed entry, one dead letter");
}

/// Commands the node refused for lack of permission so far (the counts of
/// `ACL LOG`).
fn acl_refusals(node: &flashsale_tests::RedisNode) -> i64 {
    let log: redis::Value = node.cmd(&["ACL", "LOG"]);
    let redis::Value::Array(entries) = log else {
        return 0;
    };
    entries
        .iter()
        .map(|e| match e {
            redis::Value::Array(kv) => kv
                .iter()
                .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"count"))
                .and_then(|i| match kv.get(i + 1) {
                    Some(redis::Value::Int(n)) => Some(*n),
                    _ => None,
                })
                .unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// The consumer names in the writers' group on `stream`.
fn writer_consumers(node: &flashsale_tests::RedisNode, stream: &str) -> Vec<String> {
    let info: redis::RedisResult<Vec<Vec<redis::Value>>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(flashsale::orders::GROUP)
        .query(&mut node.conn());
    info.unwrap_or_default()
        .iter()
        .filter_map(|c| match c.get(1) {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect()
}

/// From the last attack on serve: every writer process names its consumers
/// anew, so the group kept one dead consumer per writer ever started, in
/// every stream, for good. A consumer idle past `forget_idle` with nothing
/// pending is deleted; one that still holds an entry is kept until that
/// entry is taken over and written, so nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_writer_consumers_are_forgotten_once_they_hold_nothing() {
    let Fixture {
        cluster,
        pg: _pg,
        pool,
        engine,
        sale,
    } = Fixture::builder()
        .sale(SaleSpec::new("ghosts", 100))
        .build()
        .await;
    let status = sale.expect("sale");
    let b = &status.buckets[0];
    let node = cluster.node(cluster.master_of_slot(b.slot));
    let group = flashsale::orders::GROUP;
    let _: () = node.cmd(&["XGROUP", "CREATE", &b.stream, group, "0", "MKSTREAM"]);
    let confirmed = buy(&engine, "ghosts", 5, "g").await;
    // A writer that died holding one entry, and one that died holding none.
    let _: redis::Value = node.cmd(&[
        "XREADGROUP",
        "GROUP",
        group,
        "ghost-holding",
        "COUNT",
        "1",
        "STREAMS",
        &b.stream,
        ">",
    ]);
    let _: i64 = node.cmd(&["XGROUP", "CREATECONSUMER", &b.stream, group, "ghost-empty"]);
    let writer = engine
        .spawn_order_writer(
            pool.clone(),
            flashsale::WriterConfig {
                writers: 1,
                forget_idle: Duration::from_millis(300),
                ..fast_writer(Duration::from_millis(500))
            },
        )
        .await
        .expect("writer");
    flashsale_tests::wait_until(Duration::from_secs(60), "both ghosts are forgotten", || {
        let left = writer_consumers(node, &b.stream);
        std::future::ready(!left.iter().any(|c| c.starts_with("ghost-")))
    })
    .await;
    wait_for_db_orders(&pool, "ghosts", 5, Duration::from_secs(30)).await;
    let report = writer.shutdown().await.expect("stops");
    assert!(report.consumers_forgotten >= 2, "{report:?}");
    assert!(
        report.claimed >= 1,
        "the held entry was taken over: {report:?}"
    );
    let in_db = flashsale_tests::db_order_ids(&pool, "ghosts").await;
    assert_exactly_once(&confirmed, &in_db);
}
