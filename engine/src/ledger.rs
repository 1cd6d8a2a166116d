//! Reconcile: proves the ledger per SKU. Every unit ever put on sale is
//! either still in Redis, or an order waiting in a stream, or an order in
//! PostgreSQL: `initial = remaining + pending + written`. With holds, an
//! order's units count as taken while it is held or paid: a cancel or an
//! expiry (an event on the stream, then a row of `order_events`) gave them
//! back, a late payment's retake took them again, so the units of orders
//! are summed as orders - returned + retaken, on each side. Read-only on both
//! Redis and PostgreSQL; exact while buyers and the writer run (see
//! `reconcile_one`), so it can run on a timer inside `flashsale serve`.

use std::collections::HashSet;

use deadpool_postgres::Pool;
use redis::Value;
use serde::Serialize;

use crate::db::{self, DbError};
use crate::engine::Engine;
use crate::error::AdminError;
use crate::keys;
use crate::metrics as m;
use crate::orders::entry::Record;
use crate::scripts::ledger_snapshot::{self, LedgerKeys, LedgerSnapshot};

/// The ledger of one SKU.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LedgerReport {
    /// The SKU.
    pub sku: String,
    /// Units ever put on sale (creation plus restocks).
    pub initial: u64,
    /// Units left in Redis (sum of bucket stock keys).
    pub remaining: i64,
    /// Units in orders still in the streams and not yet in PostgreSQL (net
    /// of the transitions there: negative while a written order's cancel or
    /// expiry is still on its way).
    pub pending: i64,
    /// Units in orders in PostgreSQL (net of the transitions there).
    pub written: i64,
    /// Of the units in orders in PostgreSQL, those in held orders (waiting
    /// for payment) and those in paid ones.
    pub held_in_db: u64,
    /// See `held_in_db`.
    pub paid_in_db: u64,
    /// Orders (rows) in PostgreSQL.
    pub orders_in_db: u64,
    /// Entries in the dead-letter streams (not counted as units).
    pub dead_lettered: u64,
    /// Units of orders in PostgreSQL whose ids lie past everything the
    /// bucket's stream ever generated: the stream lost them (a failover took
    /// back writes the order writer had already committed). Always an
    /// imbalance, whatever the other figures say.
    pub lost_from_stream: u64,
    /// `initial == remaining + pending + written` and nothing was lost from
    /// a stream.
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
    #[error(transparent)]
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
            (r.initial as i64 - (r.remaining + r.pending + r.written)).unsigned_abs()
                + r.lost_from_stream
        })
        .sum();
    metrics::gauge!(m::LEDGER_IMBALANCE).set(imbalance as f64);
    metrics::gauge!(m::LEDGER_CONSERVED).set(if imbalance == 0 { 1.0 } else { 0.0 });
    Ok(reports)
}

/// One bucket's ledger, read atomically by `ledger_snapshot.lua`.
struct Snapshot {
    initial: u64,
    stock: i64,
    last_id: (u64, u64),
    entries: Vec<(String, u64)>,
    /// Transitions still in the stream: (order id, version, units delta).
    events: Vec<(String, i32, i64)>,
}

/// The orders (id, qty) and transitions (id, version, units delta) still in
/// `stream` with ids up to `last`, read in chunks so no single call holds
/// the master for long.
async fn queued_orders(
    conn: &mut redis::cluster_async::ClusterConnection,
    stream: &str,
    last: (u64, u64),
) -> Result<(Vec<(String, u64)>, Vec<(String, i32, i64)>), redis::RedisError> {
    let end = format!("{}-{}", last.0, last.1);
    let mut start = "-".to_owned();
    let mut out = Vec::new();
    let mut events = Vec::new();
    loop {
        let v: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg(&end)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        let entries = crate::orders::entry::parse_entries(&v);
        let Some(tail) = entries.last() else { break };
        // Nothing comes after the last id there is (and "(" before it is
        // an error): the range is done.
        let done = tail.id == end;
        start = format!("({}", tail.id);
        let tag = crate::keys::stream_tag(stream).unwrap_or_default();
        for e in &entries {
            match e.to_record(tag) {
                Ok(Record::Order(o)) => out.push((o.order_id, o.qty as u64)),
                Ok(Record::Event(ev)) => {
                    let delta = ev.units_delta();
                    events.push((ev.order_id, ev.version, delta));
                }
                Err(_) => {}
            }
        }
        if done {
            break;
        }
    }
    Ok((out, events))
}

/// The ledger of one SKU, exact even while buyers and the writer run:
/// 1. each bucket is read in one atomic step (units ever put in, stock, the
///    stream's last id), so `initial = stock + orders with id <= last_id`;
/// 2. then the entries up to last_id still in the stream are read in chunks
///    (the writer may trim some meanwhile, but only after writing them);
/// 3. then PostgreSQL is read in one REPEATABLE READ snapshot, counting only
///    orders with ids up to last_id.
///
/// Every order up to last_id is then either still in the stream and not in
/// PostgreSQL (pending), or in PostgreSQL (written): never both, never neither.
async fn reconcile_one(
    engine: &Engine,
    pool: &Pool,
    sku: &str,
) -> Result<LedgerReport, LedgerError> {
    let sale = engine.admin_sale(sku).await?;
    let mut snaps = Vec::with_capacity(sale.buckets.len());
    let mut dead_lettered = 0u64;
    let mut conn = engine.dedicated_connection().await?;
    for b in &sale.buckets {
        let call = LedgerKeys {
            sale: &b.keys.sale,
            stock: &b.keys.stock,
            orders: &b.keys.orders,
        }
        .call(&engine.scripts().ledger_snapshot, b.slot);
        let reply = engine.cluster().call(&call, ledger_snapshot::decode).await;
        let LedgerSnapshot {
            initial,
            stock,
            last_id,
        } = reply.map_err(|e| AdminError::Unavailable(e.into()))?;
        let (entries, events) = queued_orders(&mut conn, &b.keys.orders, last_id).await?;
        let snap = Snapshot {
            initial,
            stock,
            last_id,
            entries,
            events,
        };
        snaps.push((b, snap));
        dead_lettered += redis::cmd("XLEN")
            .arg(keys::dead_letter_stream(&b.tag))
            .query_async::<u64>(&mut conn)
            .await?;
    }

    let mut client = db::client(pool).await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(DbError::from)?;
    let (mut initial, mut remaining, mut pending, mut written, mut orders_in_db) =
        (0u64, 0i64, 0i64, 0i64, 0u64);
    let (mut held_in_db, mut paid_in_db) = (0u64, 0u64);
    let mut beyond = Vec::new();
    for (b, snap) in &snaps {
        // Stream id parts are unsigned 64-bit: compared as numeric, so an id
        // past 2^63 (written by hand) is compared, not an error.
        let (last_ms, last_seq) = (snap.last_id.0.to_string(), snap.last_id.1.to_string());
        let row = tx
            .query_one(
                "SELECT COALESCE(SUM(qty), 0)::int8, COUNT(*)::int8 FROM orders
                 WHERE shard_tag = $1
                   AND (split_part(stream_id, '-', 1)::numeric, split_part(stream_id, '-', 2)::numeric) <= ($2::text::numeric, $3::text::numeric)",
                &[&b.tag, &last_ms, &last_seq],
            )
            .await
            .map_err(DbError::from)?;
        written += row.get::<_, i64>(0).max(0);
        orders_in_db += row.get::<_, i64>(1).max(0) as u64;
        let returned = tx
            .query_one(
                "SELECT COALESCE(SUM(CASE WHEN kind IN ('cancelled', 'expired') THEN -qty
                                          WHEN retake THEN qty ELSE 0 END), 0)::int8
                 FROM order_events
                 WHERE shard_tag = $1
                   AND (split_part(stream_id, '-', 1)::numeric, split_part(stream_id, '-', 2)::numeric) <= ($2::text::numeric, $3::text::numeric)",
                &[&b.tag, &last_ms, &last_seq],
            )
            .await
            .map_err(DbError::from)?;
        written += returned.get::<_, i64>(0);
        let by_state = tx
            .query_one(
                "SELECT COALESCE(SUM(qty) FILTER (WHERE status = 'held'), 0)::int8,
                        COALESCE(SUM(qty) FILTER (WHERE status = 'paid'), 0)::int8
                 FROM orders WHERE shard_tag = $1",
                &[&b.tag],
            )
            .await
            .map_err(DbError::from)?;
        held_in_db += by_state.get::<_, i64>(0).max(0) as u64;
        paid_in_db += by_state.get::<_, i64>(1).max(0) as u64;
        let (ev_ids, ev_versions): (Vec<&str>, Vec<i32>) = snap
            .events
            .iter()
            .map(|(id, v, _)| (id.as_str(), *v))
            .unzip();
        let ev_rows = tx
            .query(
                "SELECT e.order_id, e.version FROM order_events e
                 JOIN UNNEST($1::text[], $2::int4[]) AS x(o, v) ON e.order_id = x.o AND e.version = x.v",
                &[&ev_ids, &ev_versions],
            )
            .await
            .map_err(DbError::from)?;
        let ev_in_db: HashSet<(String, i32)> =
            ev_rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        pending += snap
            .events
            .iter()
            .filter(|(id, v, _)| !ev_in_db.contains(&(id.clone(), *v)))
            .map(|(_, _, d)| d)
            .sum::<i64>();
        let ids: Vec<&str> = snap.entries.iter().map(|(id, _)| id.as_str()).collect();
        let rows = tx
            .query(
                "SELECT order_id FROM orders WHERE order_id = ANY($1)",
                &[&ids],
            )
            .await
            .map_err(DbError::from)?;
        let in_db: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
        pending += snap
            .entries
            .iter()
            .filter(|(id, _)| !in_db.contains(id))
            .map(|(_, q)| *q as i64)
            .sum::<i64>();
        initial += snap.initial;
        remaining += snap.stock;
        let later = tx
            .query(
                "SELECT stream_id, qty::int8 FROM orders
                 WHERE shard_tag = $1
                   AND (split_part(stream_id, '-', 1)::numeric, split_part(stream_id, '-', 2)::numeric) > ($2::text::numeric, $3::text::numeric)",
                &[&b.tag, &last_ms, &last_seq],
            )
            .await
            .map_err(DbError::from)?;
        for r in later {
            beyond.push((b, r.get::<_, String>(0), r.get::<_, i64>(1).max(0) as u64));
        }
    }
    tx.commit().await.map_err(DbError::from)?;
    // Rows past the snapshot may be orders made since (fine), or orders the
    // stream lost (a failover): the stream's last id, read again now, tells
    // them apart, since every order made since has an id up to it.
    let mut lost_from_stream = 0u64;
    for (b, stream_id, qty) in beyond {
        let last = crate::orders::stream_info(&mut conn, &b.keys.orders)
            .await
            .last_generated_id;
        if crate::orders::stream_cmp_ids(&stream_id, &last) == std::cmp::Ordering::Greater {
            lost_from_stream += qty;
        }
    }
    metrics::gauge!(m::STOCK_REMAINING, "sku" => sku.to_owned()).set(remaining as f64);
    metrics::gauge!(m::UNITS_HELD, "sku" => sku.to_owned()).set(held_in_db as f64);
    metrics::gauge!(m::UNITS_PAID, "sku" => sku.to_owned()).set(paid_in_db as f64);
    let conserved = initial as i64 == remaining + pending + written && lost_from_stream == 0;
    Ok(LedgerReport {
        sku: sku.to_owned(),
        initial,
        remaining,
        pending,
        written,
        held_in_db,
        paid_in_db,
        orders_in_db,
        dead_lettered,
        lost_from_stream,
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
    let tx = db::begin(&mut c).await?;
    db::fenced(&tx, "ledger_checks", fencing_token).await?;
    let token = fencing_token as i64;
    for r in reports {
        tx.execute(
            "INSERT INTO ledger_checks (sku, initial, remaining, pending, written, conserved, fencing_token)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&r.sku, &(r.initial as i64), &r.remaining, &r.pending, &r.written, &r.conserved, &token],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
