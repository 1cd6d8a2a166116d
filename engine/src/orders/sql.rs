//! The order writer's SQL: one batch of orders inserted in one transaction,
//! and which refusals of PostgreSQL are for good (the rows themselves) and
//! which may pass (the server or the network). Never touches Redis.

use deadpool_postgres::Pool;

use super::entry::OrderRow;
use crate::db::{self, DbError};

/// Why a batch was not written.
pub(super) enum WriteFailure {
    /// PostgreSQL refused the data itself; retrying cannot help.
    Permanent(String),
    /// Shutdown's grace ran out while PostgreSQL kept failing.
    Stopped,
}

/// SQLSTATE class 22 (data exception) or 23 (integrity constraint): the
/// rows themselves are refused, so the same statement will fail forever.
pub(super) fn is_permanent(e: &DbError) -> bool {
    match e {
        DbError::Query(q) => q
            .code()
            .is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("23")),
        _ => false,
    }
}

/// The database's own message of a refusal (no connection details).
pub(super) fn db_message(e: &DbError) -> String {
    match e {
        DbError::Query(q) => q
            .as_db_error()
            .map(|d| format!("{}: {}", d.code().code(), d.message()))
            .unwrap_or_else(|| q.to_string()),
        other => other.to_string(),
    }
}

/// One batch, one transaction: `INSERT ... ON CONFLICT (order_id) DO NOTHING`
/// from arrays, so the statement is the same whatever the batch size.
pub async fn write_batch(pool: &Pool, rows: &[OrderRow]) -> Result<u64, DbError> {
    let mut c = db::client(pool).await?;
    let tx = c.transaction().await?;
    let col = |f: fn(&OrderRow) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let ids = col(|r| r.order_id.clone());
    let skus = col(|r| r.sku.clone());
    let users = col(|r| r.user_id.clone());
    let tags = col(|r| r.shard_tag.clone());
    let stream_ids = col(|r| r.stream_id.clone());
    let qtys: Vec<i32> = rows.iter().map(|r| r.qty).collect();
    let buckets: Vec<i32> = rows.iter().map(|r| r.bucket).collect();
    let created: Vec<i64> = rows.iter().map(|r| r.created_ms).collect();
    let n = tx
        .execute(
            "INSERT INTO orders (order_id, sku, user_id, qty, bucket, shard_tag, stream_id, created_at)
             SELECT o, s, u, q, b, t, i, to_timestamp(ms::double precision / 1000)
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[], $7::text[], $8::int8[])
                  AS x(o, s, u, q, b, t, i, ms)
             ON CONFLICT (order_id) DO NOTHING",
            &[&ids, &skus, &users, &qtys, &buckets, &tags, &stream_ids, &created],
        )
        .await?;
    tx.commit().await?;
    Ok(n)
}
