//! The order writer's SQL: one batch of orders and transitions written in
//! one transaction,
//! and which refusals of PostgreSQL are for good (the rows themselves) and
//! which may pass (the server or the network). Never touches Redis.

use deadpool_postgres::Pool;

use super::entry::{OrderEvent, OrderRow};
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

/// One batch, one transaction: `INSERT ... ON CONFLICT DO NOTHING` from
/// arrays, so the statement is the same whatever the batch size. Orders of
/// sales without holds take that one statement. Held orders and
/// transitions also lock their order ids (advisory, in one sorted order, so
/// two writers never deadlock) and then apply every recorded transition
/// newer than the row's version: two writers may hold an order and its
/// transition in concurrent transactions (two consumers of one stream), and
/// without the lock each would miss the other's uncommitted row.
pub async fn write_batch(
    pool: &Pool,
    rows: &[OrderRow],
    events: &[OrderEvent],
) -> Result<u64, DbError> {
    let mut c = db::client(pool).await?;
    let tx = db::begin(&mut c).await?;
    let touched: Vec<String> = rows
        .iter()
        .filter(|r| r.expires_ms.is_some())
        .map(|r| r.order_id.clone())
        .chain(events.iter().map(|e| e.order_id.clone()))
        .collect();
    if !touched.is_empty() {
        tx.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM
               (SELECT DISTINCT hashtextextended(x, 14) AS k FROM unnest($1::text[]) x ORDER BY 1) s",
            &[&touched],
        )
        .await?;
    }
    let n = if rows.is_empty() {
        0
    } else {
        insert_orders(&tx, rows).await?
    };
    if !events.is_empty() {
        insert_events(&tx, events).await?;
    }
    if !touched.is_empty() {
        tx.execute(
            // The state follows the newest version only; each moment
            // (paid_at, ...) is set from its own event, whatever order the
            // events were written in.
            "UPDATE orders o SET
                 status = CASE WHEN e.version > o.version THEN e.kind ELSE o.status END,
                 version = GREATEST(o.version, e.version),
                 paid_at = (SELECT max(x.at) FROM order_events x WHERE x.order_id = o.order_id AND x.kind = 'paid'),
                 payment_ref = (SELECT max(x.payment_ref) FROM order_events x WHERE x.order_id = o.order_id AND x.kind = 'paid'),
                 cancelled_at = (SELECT max(x.at) FROM order_events x WHERE x.order_id = o.order_id AND x.kind = 'cancelled'),
                 expired_at = (SELECT max(x.at) FROM order_events x WHERE x.order_id = o.order_id AND x.kind = 'expired')
             FROM (SELECT DISTINCT ON (order_id) order_id, version, kind FROM order_events
                   WHERE order_id = ANY($1::text[]) ORDER BY order_id, version DESC) e
             WHERE o.order_id = e.order_id",
            &[&touched],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(n)
}

async fn insert_orders(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: &[OrderRow],
) -> Result<u64, DbError> {
    let col = |f: fn(&OrderRow) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let ids = col(|r| r.order_id.clone());
    let skus = col(|r| r.sku.clone());
    let users = col(|r| r.user_id.clone());
    let tags = col(|r| r.shard_tag.clone());
    let stream_ids = col(|r| r.stream_id.clone());
    let qtys: Vec<i32> = rows.iter().map(|r| r.qty).collect();
    let buckets: Vec<i32> = rows.iter().map(|r| r.bucket).collect();
    let created: Vec<i64> = rows.iter().map(|r| r.created_ms).collect();
    // -1: paid at once (no hold).
    let expires: Vec<i64> = rows.iter().map(|r| r.expires_ms.unwrap_or(-1)).collect();
    Ok(tx
        .execute(
            "INSERT INTO orders (order_id, sku, user_id, qty, bucket, shard_tag, stream_id, created_at,
                                 status, expires_at, paid_at)
             SELECT o, s, u, q, b, t, i, to_timestamp(ms::double precision / 1000),
                    CASE WHEN e < 0 THEN 'paid' ELSE 'held' END,
                    CASE WHEN e < 0 THEN NULL ELSE to_timestamp(e::double precision / 1000) END,
                    CASE WHEN e < 0 THEN to_timestamp(ms::double precision / 1000) END
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[], $7::text[], $8::int8[], $9::int8[])
                  AS x(o, s, u, q, b, t, i, ms, e)
             ON CONFLICT (order_id) DO NOTHING",
            &[&ids, &skus, &users, &qtys, &buckets, &tags, &stream_ids, &created, &expires],
        )
        .await?)
}

async fn insert_events(
    tx: &deadpool_postgres::Transaction<'_>,
    events: &[OrderEvent],
) -> Result<u64, DbError> {
    let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
    let versions: Vec<i32> = events.iter().map(|e| e.version).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let at: Vec<i64> = events.iter().map(|e| e.at_ms).collect();
    let refs: Vec<Option<&str>> = events.iter().map(|e| e.payment_ref.as_deref()).collect();
    let stream_ids: Vec<&str> = events.iter().map(|e| e.stream_id.as_str()).collect();
    let qtys: Vec<i32> = events.iter().map(|e| e.qty).collect();
    let retakes: Vec<bool> = events.iter().map(|e| e.retake).collect();
    let tags: Vec<&str> = events.iter().map(|e| e.shard_tag.as_str()).collect();
    Ok(tx
        .execute(
            "INSERT INTO order_events (order_id, version, kind, at, payment_ref, qty, retake, shard_tag, stream_id)
             SELECT o, v, k, to_timestamp(ms::double precision / 1000), r, q, rt, t, i
             FROM UNNEST($1::text[], $2::int4[], $3::text[], $4::int8[], $5::text[], $6::int4[], $7::bool[], $8::text[], $9::text[])
                  AS x(o, v, k, ms, r, q, rt, t, i)
             ON CONFLICT (order_id, version) DO NOTHING",
            &[&ids, &versions, &kinds, &at, &refs, &qtys, &retakes, &tags, &stream_ids],
        )
        .await?)
}
