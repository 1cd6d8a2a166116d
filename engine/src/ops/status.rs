//! What a sale looks like in Redis right now, for operators and readers:
//! the list of sales, and each sale's buckets with their slot, master, stock
//! and stream length. Reads only; never on the hot path.

use serde::Serialize;

use crate::engine::Engine;
use crate::error::AdminError;
use crate::keys;
use crate::validate;

/// A sale as Redis holds it now, bucket by bucket.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SaleStatus {
    /// The SKU.
    pub sku: String,
    /// "open" (every bucket sells), "closed" (no bucket sells), or
    /// "closing": a close begun and not finished (the process died, or a
    /// failover took back a bucket's close), so some buckets still sell;
    /// `close_sale` again, or `repair_sale`, finishes it. Never "closed"
    /// while a bucket sells.
    pub state: String,
    /// Most units one user may buy; 0 means no limit.
    pub per_user_limit: u32,
    /// Window start, ms since the Unix epoch (0 = from creation).
    pub starts_ms: u64,
    /// Window end, ms since the Unix epoch (0 = open-ended).
    pub ends_ms: u64,
    /// Every unit ever put on sale (creation plus restocks).
    pub initial: u64,
    /// Units left over all buckets.
    pub remaining: u64,
    /// Per bucket.
    pub buckets: Vec<BucketStatus>,
}

/// One bucket as Redis holds it now.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BucketStatus {
    /// Position in the sale.
    pub index: u32,
    /// Shard tag.
    pub tag: String,
    /// Stock key, for cross-checking with `redis-cli`.
    pub key: String,
    /// Order stream key.
    pub stream: String,
    /// Slot of the tag.
    pub slot: u16,
    /// `host:port` of the master serving the slot now.
    pub master: String,
    /// "open" or "closed": whether this bucket sells.
    pub state: String,
    /// Units put in this bucket (creation plus restocks).
    pub initial: u64,
    /// Units left (a negative value in Redis would be reported as is).
    pub remaining: i64,
    /// Entries in the bucket's order stream now.
    pub stream_len: u64,
}

impl Engine {
    /// Every SKU that has a sale.
    pub async fn list_sales(&self) -> Result<Vec<String>, AdminError> {
        let mut skus: Vec<String> = self
            .cluster()
            .run_cmd(redis::cmd("SMEMBERS").arg(keys::sale_index()))
            .await?;
        skus.sort();
        Ok(skus)
    }

    /// The sale as Redis holds it now: per bucket its tag, slot, master,
    /// stock and stream length, and the totals.
    pub async fn sale_status(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        let sale = self.admin_sale(sku).await?;
        let map = self.cluster().slot_map().await?;
        let meta: Vec<Option<String>> = self
            .cluster()
            .run_cmd(
                redis::cmd("HMGET")
                    .arg(keys::sale_meta(sku))
                    .arg("starts_ms")
                    .arg("ends_ms")
                    .arg("state"),
            )
            .await?;
        let num = |v: Option<&Option<String>>| -> u64 {
            v.and_then(|s| s.as_deref())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let mut status = SaleStatus {
            sku: sku.to_owned(),
            state: "open".into(),
            per_user_limit: sale.per_user_limit,
            starts_ms: num(meta.first()),
            ends_ms: num(meta.get(1)),
            initial: 0,
            remaining: 0,
            buckets: Vec::with_capacity(sale.buckets.len()),
        };
        for b in &sale.buckets {
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET")
                .arg(&b.keys.sale)
                .arg("state")
                .arg("initial");
            pipe.cmd("GET").arg(&b.keys.stock);
            pipe.cmd("XLEN").arg(&b.keys.orders);
            let (fields, stock, stream_len): (Vec<Option<String>>, Option<i64>, u64) =
                pipe.query_async(&mut self.cluster().conn()).await?;
            let bucket_state = if fields.first().cloned().flatten().as_deref() == Some("closed") {
                "closed"
            } else {
                "open"
            };
            let initial = num(fields.get(1));
            let remaining = stock.unwrap_or(0);
            status.initial += initial;
            status.remaining += remaining.max(0) as u64;
            status.buckets.push(BucketStatus {
                index: b.index,
                tag: b.tag.clone(),
                key: b.keys.stock.clone(),
                stream: b.keys.orders.clone(),
                slot: b.slot,
                master: map.master_of(b.slot).unwrap_or("?").to_owned(),
                state: bucket_state.into(),
                initial,
                remaining,
                stream_len,
            });
        }
        let closed = status
            .buckets
            .iter()
            .filter(|b| b.state == "closed")
            .count();
        let meta_closed = meta.get(2).and_then(|s| s.as_deref()) == Some("closed");
        status.state = if closed == status.buckets.len() && closed > 0 {
            "closed"
        } else if closed == 0 && !meta_closed {
            "open"
        } else {
            "closing"
        }
        .into();
        Ok(status)
    }
}
