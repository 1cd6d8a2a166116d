//! The ways of selling a unit that the harness compares, each as one
//! operation for the load generator: through the engine (`engine`), the
//! seeds' lock-based pattern through flashsale's lock module (`lock`), and
//! GET-then-DECR with no lock at all (`naive`, which oversells and says so).

use std::sync::Arc;
use std::time::Duration;

use flashsale::lock::{LockClient, LockOptions};
use flashsale::{Engine, PurchaseError, PurchaseRequest};
use redis::cluster_async::ClusterConnection;

use crate::load::Outcome;

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

/// The seeds' pattern: take the SKU's distributed lock, GET, check, DECR,
/// unlock. Correct, and as slow as the lock hand-off.
pub async fn lock_op(
    locks: LockClient,
    mut conn: ClusterConnection,
    key: Arc<str>,
    worker: u64,
) -> Outcome {
    let opts = LockOptions::new(format!("bench-worker-{worker}"))
        .lease(Duration::from_secs(5))
        .wait(Duration::from_secs(30));
    let Ok(guard) = locks.lock(&format!("bench-stock:{key}"), &opts).await else {
        return Outcome::Error;
    };
    let outcome = get_check_decr(&mut conn, &key).await;
    guard.unlock().await;
    outcome
}
