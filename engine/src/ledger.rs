//! Reconcile: proves the ledger per SKU. Every unit ever put on sale is
//! either still in Redis, or an order waiting in a stream, or an order in
//! PostgreSQL: `initial = remaining + pending + written`. Read-only on both
//! Redis and PostgreSQL; meant for a quiescent sale (while buyers and the
//! writer run, figures move between the terms as they are read).

use deadpool_postgres::Pool;
use redis::Value;
use serde::Serialize;

use crate::db::{self, DbError};
use crate::engine::Engine;
use crate::error::AdminError;
use crate::keys;
use crate::orders::entry::parse_entries;

/// Gauge: 1 when every SKU checked last balanced, else 0.
pub const CONSERVED: &str = "flashsale_ledger_conserved";
/// Gauge: sum over SKUs of |initial - (remaining + pending + written)|.
pub const IMBALANCE: &str = "flashsale_ledger_imbalance_units";

/// The ledger of one SKU.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LedgerReport {
    /// The SKU.
    pub sku: String,
    /// Units ever put on sale (creation plus restocks).
    pub initial: u64,
    /// Units left in Redis (sum of bucket stock keys).
    pub remaining: i64,
    /// Units in orders still in the streams and not yet in PostgreSQL.
    pub pending: u64,
    /// Units in orders in PostgreSQL.
    pub written: u64,
    /// Orders (rows) in PostgreSQL.
    pub orders_in_db: u64,
    /// Entries in the dead-letter streams (not counted as units).
    pub dead_lettered: u64,
    /// `initial == remaining + pending + written`.
    pub conserved: bool,
}

/// Why reconcile could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// Redis side.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// PostgreSQL side.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A Redis read failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Checks `skus` (every sale when empty) and publishes the gauges.
pub async fn reconcile(
    engine: &Engine,
    pool: &Pool,
    skus: &[String],
) -> Result<Vec<LedgerReport>, LedgerError> {
    db::migrate(pool).await?;
    let skus = if skus.is_empty() {
        engine.list_sales().await?
    } else {
        skus.to_vec()
    };
    let mut reports = Vec::with_capacity(skus.len());
    for sku in &skus {
        reports.push(reconcile_one(engine, pool, sku).await?);
    }
    let imbalance: u64 = reports
        .iter()
        .map(|r| {
            (r.initial as i64 - (r.remaining + r.pending as i64 + r.written as i64)).unsigned_abs()
        })
        .sum();
    metrics::gauge!(IMBALANCE).set(imbalance as f64);
    metrics::gauge!(CONSERVED).set(if imbalance == 0 { 1.0 } else { 0.0 });
    Ok(reports)
}

async fn reconcile_one(
    engine: &Engine,
    pool: &Pool,
    sku: &str,
) -> Result<LedgerReport, LedgerError> {
    let status = engine.sale_status(sku).await?;
    let mut conn = engine.dedicated_connection().await?;
    let client = db::client(pool).await?;
    let mut pending = 0u64;
    let mut dead_lettered = 0u64;
    for b in &status.buckets {
        let mut start = "-".to_owned();
        loop {
            let v: Value = redis::cmd("XRANGE")
                .arg(&b.stream)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            let entries = parse_entries(&v);
            let Some(last) = entries.last() else { break };
            start = format!("({}", last.id);
            let orders: Vec<(String, u64)> = entries
                .iter()
                .filter_map(|e| e.to_order().ok())
                .map(|o| (o.order_id, o.qty as u64))
                .collect();
            let ids: Vec<String> = orders.iter().map(|(id, _)| id.clone()).collect();
            let rows = client
                .query(
                    "SELECT order_id FROM orders WHERE order_id = ANY($1)",
                    &[&ids],
                )
                .await
                .map_err(DbError::from)?;
            let in_db: std::collections::HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
            pending += orders
                .iter()
                .filter(|(id, _)| !in_db.contains(id))
                .map(|(_, q)| q)
                .sum::<u64>();
        }
        let tag = &b.tag;
        dead_lettered += redis::cmd("XLEN")
            .arg(keys::dead_letter_stream(tag))
            .query_async::<u64>(&mut conn)
            .await?;
    }
    let row = client
        .query_one(
            "SELECT COALESCE(SUM(qty), 0)::int8, COUNT(*)::int8 FROM orders WHERE sku = $1",
            &[&sku],
        )
        .await
        .map_err(DbError::from)?;
    let written = row.get::<_, i64>(0).max(0) as u64;
    let orders_in_db = row.get::<_, i64>(1).max(0) as u64;
    let remaining: i64 = status.buckets.iter().map(|b| b.remaining).sum();
    let conserved = status.initial as i64 == remaining + pending as i64 + written as i64;
    Ok(LedgerReport {
        sku: sku.to_owned(),
        initial: status.initial,
        remaining,
        pending,
        written,
        orders_in_db,
        dead_lettered,
        conserved,
    })
}

/// Records `reports` in `ledger_checks`, fenced by the reconcile lock's
/// token: a reconcile that lost its lock cannot write over a newer one.
pub async fn record(
    pool: &Pool,
    reports: &[LedgerReport],
    fencing_token: u64,
) -> Result<(), DbError> {
    let mut c = db::client(pool).await?;
    let tx = c.transaction().await?;
    db::fenced(&tx, "ledger_checks", fencing_token).await?;
    let token = fencing_token as i64;
    for r in reports {
        tx.execute(
            "INSERT INTO ledger_checks (sku, initial, remaining, pending, written, conserved, fencing_token)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&r.sku, &(r.initial as i64), &r.remaining, &(r.pending as i64), &(r.written as i64), &r.conserved, &token],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
