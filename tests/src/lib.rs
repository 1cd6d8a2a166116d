//! Test fixtures: real `redis-server` processes (single instances and whole
//! Redis Clusters) on free loopback ports in temp dirs, killed on drop, and a
//! fresh PostgreSQL database per test, dropped on drop. Tests never use the
//! `ops/up` ports. Nothing here is mocked.

use std::time::{Duration, Instant};

pub mod binaries;
pub mod chaos;
pub mod fixture;
pub mod pg;
pub mod pg_tls;
pub mod proxy;
pub mod redis_nodes;
pub mod serve;
pub mod tls;
pub mod waiting;

pub use binaries::*;
pub use pg::PgDb;
pub use proxy::TcpProxy;
pub use redis_nodes::*;
pub use serve::{create_sale, http_client, ServeProcess, ADMIN_TOKEN};
pub use waiting::{wait_for, wait_until};

/// An engine on `cluster` with the default knobs and a retry deadline that
/// covers a failover.
pub async fn engine_on(cluster: &RedisCluster) -> flashsale::Engine {
    let config = flashsale::Config {
        cluster_nodes: cluster.seeds(),
        // Never the ops/up lock ports: tests that want locks start their own.
        lock_nodes: Vec::new(),
        ..flashsale::Config::default()
    };
    flashsale::Engine::connect(config)
        .await
        .expect("engine connects to the test cluster")
}

/// The new orders in every order stream of `status`, as (order_id, user)
/// pairs, read straight from Redis with XRANGE (transitions left out).
pub fn stream_orders(
    cluster: &RedisCluster,
    status: &flashsale::SaleStatus,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in &status.buckets {
        let node = cluster.node(cluster.master_of_slot(b.slot));
        let reply: redis::Value = node.cmd(&["XRANGE", &b.stream, "-", "+"]);
        for e in flashsale::orders::entry::parse_entries(&reply) {
            // An entry the writer could not parse would be dead-lettered:
            // never an order, and never silently left out of a test's count.
            match e.to_record(&b.tag) {
                Ok(flashsale::orders::entry::Record::Order(o)) => out.push((o.order_id, o.user_id)),
                Ok(flashsale::orders::entry::Record::Event(_)) => {}
                Err(why) => panic!("entry {e:?} of {} does not parse: {why}", b.stream),
            }
        }
    }
    out
}

/// A writer config for tests: short waits, quick claims.
pub fn fast_writer(claim_idle: Duration) -> flashsale::WriterConfig {
    flashsale::WriterConfig {
        batch: 100,
        idle_wait: Duration::from_millis(10),
        claim_idle,
        discover_every: Duration::from_millis(100),
        ..flashsale::WriterConfig::default()
    }
}

/// Order ids in the test database, for `sku`.
pub async fn db_order_ids(pool: &deadpool_postgres::Pool, sku: &str) -> Vec<String> {
    let c = pool.get().await.expect("db connection");
    c.query("SELECT order_id FROM orders WHERE sku = $1", &[&sku])
        .await
        .expect("query orders")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Waits until the database holds `n` orders of `sku` (or panics after `timeout`).
pub async fn wait_for_db_orders(
    pool: &deadpool_postgres::Pool,
    sku: &str,
    n: usize,
    timeout: Duration,
) {
    let start = Instant::now();
    loop {
        let have = db_order_ids(pool, sku).await.len();
        if have >= n {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "{sku}: {have} of {n} orders in PostgreSQL after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A user id whose home bucket, in a sale of `buckets` buckets, is `home`
/// (the engine picks it from CRC16 of the user id).
pub fn user_with_home(prefix: &str, buckets: usize, home: usize) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|u| usize::from(flashsale::placement::tag_slot(u)) % buckets == home)
        .expect("some user id lands in every bucket")
}

/// An engine on `cluster` with the test defaults, changed by `tweak`.
pub async fn engine_with(
    cluster: &RedisCluster,
    tweak: impl FnOnce(&mut flashsale::Config),
) -> flashsale::Engine {
    let mut config = flashsale::Config {
        cluster_nodes: cluster.seeds(),
        lock_nodes: Vec::new(),
        ..flashsale::Config::default()
    };
    tweak(&mut config);
    flashsale::Engine::connect(config)
        .await
        .expect("engine connects to the test cluster")
}
