//! The ways of selling a unit that the harness compares, each as one
//! operation for the load generator: through the engine (`engine`), the
//! seeds' lock-based pattern with a plain `SET NX PX` lock (`lock`), and
//! GET-then-DECR with no lock at all (`naive`, which oversells and says so).

use std::sync::Arc;
use std::time::Duration;

use flashsale::{Engine, PurchaseError, PurchaseRequest};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;

use crate::load::Outcome;

/// The label of the hot1 engine row with `batch_max = 1` (one purchase
/// per call).
pub const UNBATCHED: &str = "engine batch_max=1";
/// The same, paced at 10 % of the batched engine's peak.
pub const UNBATCHED_10: &str = "engine@10% batch_max=1";

/// One engine purchase for buyer `i` of run `run` on one of `skus`.
pub async fn engine_op(engine: Engine, skus: Arc<Vec<String>>, run: Arc<str>, i: u64) -> Outcome {
    let sku = &skus[(i as usize) % skus.len()];
    let user = format!("{run}-u{i}");
    match engine
        .purchase(PurchaseRequest {
            sku,
            user: &user,
            qty: 1,
            request_id: &user,
        })
        .await
    {
        Ok(_) => Outcome::Confirmed,
        Err(PurchaseError::SoldOut) => Outcome::SoldOut,
        Err(_) => Outcome::Error,
    }
}

/// One purchase of two units, as user and request `i`, on the `refused`
/// row's sale, where no bucket holds two: every bucket refuses it.
pub async fn refused_op(engine: Engine, sku: Arc<str>, run: Arc<str>, i: u64) -> Outcome {
    let user = format!("{run}-u{i}");
    match engine
        .purchase(PurchaseRequest {
            sku: &sku,
            user: &user,
            qty: 2,
            request_id: &user,
        })
        .await
    {
        Ok(_) => Outcome::Confirmed,
        Err(PurchaseError::SoldOut) => Outcome::SoldOut,
        Err(_) => Outcome::Error,
    }
}

/// One purchase on a sale with holds; buyers with an even `i` pay at once
/// (the shop's backend, after the payment went through), the others never
/// do and their holds expire.
pub async fn hold_op(
    engine: Engine,
    sku: Arc<str>,
    run: Arc<str>,
    i: u64,
    paid: Arc<std::sync::atomic::AtomicU64>,
    pay_errors: Arc<std::sync::atomic::AtomicU64>,
) -> Outcome {
    use std::sync::atomic::Ordering;
    let user = format!("{run}-u{i}");
    match engine
        .purchase(PurchaseRequest {
            sku: &sku,
            user: &user,
            qty: 1,
            request_id: &user,
        })
        .await
    {
        // The purchase is confirmed either way; a failed payment leaves
        // the hold to expire, and is counted on its own.
        Ok(c) if i % 2 == 0 => {
            match engine.pay(&c.order_id, &user).await {
                Ok(_) => paid.fetch_add(1, Ordering::Relaxed),
                Err(_) => pay_errors.fetch_add(1, Ordering::Relaxed),
            };
            Outcome::Confirmed
        }
        Ok(_) => Outcome::Confirmed,
        Err(PurchaseError::SoldOut) => Outcome::SoldOut,
        Err(_) => Outcome::Error,
    }
}

/// GET, check, DECR: two round trips and a race between them.
async fn get_check_decr(conn: &mut ClusterConnection, key: &str) -> Outcome {
    let stock: Result<Option<i64>, _> = redis::cmd("GET").arg(key).query_async(conn).await;
    match stock {
        Ok(Some(s)) if s > 0 => match redis::cmd("DECR").arg(key).query_async::<i64>(conn).await {
            Ok(_) => Outcome::Confirmed,
            Err(_) => Outcome::Error,
        },
        Ok(_) => Outcome::SoldOut,
        Err(_) => Outcome::Error,
    }
}

/// The naive way: GET, check, DECR with nothing in between to stop a race.
pub async fn naive_op(mut conn: ClusterConnection, key: Arc<str>) -> Outcome {
    get_check_decr(&mut conn, &key).await
}

/// Releases a lock only if this token holds it.
const UNLOCK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) else return 0 end";

/// The seeds' pattern: `SET lock token NX PX 5000` (retried at once, for up
/// to 30 s), GET, check, DECR, then a compare-and-delete unlock. Correct
/// while the lease holds, and as slow as the lock hand-off.
pub async fn lock_op(
    mut node: MultiplexedConnection,
    mut conn: ClusterConnection,
    key: Arc<str>,
    i: u64,
) -> Outcome {
    let lock = format!("bench-lock:{key}");
    let token = format!("{i}-{:016x}", rand_u64());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let taken: Result<Option<String>, _> = redis::cmd("SET")
            .arg(&lock)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query_async(&mut node)
            .await;
        match taken {
            Ok(Some(_)) => break,
            // Retried at once: a timer sleep would wake on tokio's 1 ms
            // ticks and cap the row at about one hand-off per tick.
            Ok(None) if std::time::Instant::now() < deadline => tokio::task::yield_now().await,
            _ => return Outcome::Error,
        }
    }
    let outcome = get_check_decr(&mut conn, &key).await;
    let released: Result<i64, _> = redis::Script::new(UNLOCK)
        .key(&lock)
        .arg(&token)
        .invoke_async(&mut node)
        .await;
    match released {
        Ok(1) => outcome,
        _ => Outcome::Error,
    }
}

/// A random token part; the bench needs no cryptographic randomness.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}
