//! Sales as the hot path and readers see them: the [`SaleSpec`] of a new
//! sale, the cached [`SaleHandle`] (tags, slots, keys, the local sold-out
//! flag), and the status read from Redis. The writes that make and change a
//! sale live in `admin.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::engine::Engine;
use crate::error::{AdminError, PurchaseError};
use crate::keys::{self, BucketKeys};
use crate::placement::tag_slot;
use crate::validate;

/// Largest number of buckets one SKU may be split into.
pub const MAX_BUCKETS: u32 = 64;

/// Most units a sale, and any one bucket over its life (creation plus
/// restocks), may hold: 2^53 - 1, the largest integer a Lua number (a
/// double) holds exactly. Checked before anything reaches Redis, and again
/// by the scripts.
pub const MAX_UNITS: u64 = (1 << 53) - 1;

/// What [`Engine::create_sale`] creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleSpec {
    /// The item on sale; 1-64 bytes of `A-Z a-z 0-9 . _ - :`.
    pub sku: String,
    /// Units on sale, split evenly over the buckets.
    pub stock: u64,
    /// Number of buckets (1 = one Redis key; more spreads a hot SKU over
    /// masters).
    pub buckets: u32,
    /// Most units one user may buy; 0 means no limit.
    pub per_user_limit: u32,
    /// When purchases open; `None` = now.
    pub starts_at: Option<SystemTime>,
    /// When purchases stop; `None` = never (until closed).
    pub ends_at: Option<SystemTime>,
}

impl SaleSpec {
    /// A sale of `stock` units in one bucket, open now, with no user limit.
    pub fn new(sku: impl Into<String>, stock: u64) -> Self {
        SaleSpec {
            sku: sku.into(),
            stock,
            buckets: 1,
            per_user_limit: 0,
            starts_at: None,
            ends_at: None,
        }
    }
}

/// One bucket of a cached sale: its tag, slot and keys.
#[derive(Debug)]
pub struct BucketHandle {
    /// Position of the bucket in the sale (0-based).
    pub index: u32,
    /// The shard tag (without braces).
    pub tag: String,
    /// The cluster slot of the tag.
    pub slot: u16,
    /// The bucket's fixed keys.
    pub keys: BucketKeys,
}

/// The immutable part of a sale that the hot path needs, cached per process,
/// plus the process-local sold-out flag.
#[derive(Debug)]
pub struct SaleHandle {
    /// The SKU.
    pub sku: String,
    /// The buckets, in order.
    pub buckets: Vec<BucketHandle>,
    /// Most units one user may buy; 0 means no limit.
    pub per_user_limit: u32,
    /// Engine time (ms) when every bucket was seen empty; 0 = not sold out.
    pub(crate) sold_out_at: AtomicU64,
}

impl SaleHandle {
    /// The buyer's home bucket: where the user's quota and request records
    /// live, so the per-user limit is checked in one slot whatever bucket
    /// ends up serving the order. CRC16 of the user id spreads buyers evenly.
    pub fn home_bucket(&self, user: &str) -> usize {
        usize::from(tag_slot(user)) % self.buckets.len()
    }

    /// True when this process saw the sale sold out less than `recheck` ago.
    pub(crate) fn sold_out_fresh(&self, now_ms: u64, recheck: Duration) -> bool {
        let at = self.sold_out_at.load(Ordering::Relaxed);
        at != 0 && now_ms.saturating_sub(at) < recheck.as_millis() as u64
    }

    pub(crate) fn mark_sold_out(&self, now_ms: u64) {
        self.sold_out_at.store(now_ms, Ordering::Relaxed);
    }

    pub(crate) fn clear_sold_out(&self) {
        self.sold_out_at.store(0, Ordering::Relaxed);
    }
}

/// A sale as Redis holds it now, bucket by bucket.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SaleStatus {
    /// The SKU.
    pub sku: String,
    /// "open" or "closed".
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
    /// Units put in this bucket (creation plus restocks).
    pub initial: u64,
    /// Units left (a negative value in Redis would be reported as is).
    pub remaining: i64,
    /// Entries in the bucket's order stream now.
    pub stream_len: u64,
}

fn unavailable(e: redis::RedisError) -> AdminError {
    AdminError::Unavailable(e.to_string())
}

impl Engine {
    /// Every SKU that has a sale.
    pub async fn list_sales(&self) -> Result<Vec<String>, AdminError> {
        let mut skus: Vec<String> = self
            .run_cmd(redis::cmd("SMEMBERS").arg(keys::sale_index()))
            .await
            .map_err(unavailable)?;
        skus.sort();
        Ok(skus)
    }

    /// The cached handle of a sale, loading its metadata on first use.
    pub(crate) async fn sale(&self, sku: &str) -> Result<Arc<SaleHandle>, PurchaseError> {
        if let Some(h) = self.cached_sale(sku) {
            return Ok(h);
        }
        match self.load_sale(sku).await {
            Ok(Some(h)) => {
                let mut map = self.inner.sales.write().unwrap_or_else(|p| p.into_inner());
                Ok(map.entry(sku.to_owned()).or_insert(h).clone())
            }
            Ok(None) => Err(PurchaseError::UnknownSale(sku.to_owned())),
            Err(e) => Err(PurchaseError::Unavailable(e.to_string())),
        }
    }

    fn cached_sale(&self, sku: &str) -> Option<Arc<SaleHandle>> {
        let map = self.inner.sales.read().unwrap_or_else(|p| p.into_inner());
        map.get(sku).cloned()
    }

    async fn load_sale(&self, sku: &str) -> Result<Option<Arc<SaleHandle>>, redis::RedisError> {
        let fields: Vec<Option<String>> = self
            .run_cmd(
                redis::cmd("HMGET")
                    .arg(keys::sale_meta(sku))
                    .arg("tags")
                    .arg("limit")
                    .arg("created"),
            )
            .await?;
        let (Some(Some(tags)), Some(limit)) = (fields.first(), fields.get(1)) else {
            return Ok(None);
        };
        // A sale whose create has not finished (some bucket may be missing)
        // does not sell yet: a walk over a missing bucket could not make its
        // refusal final. It is not cached, so it sells once finished.
        if fields.get(2).cloned().flatten().as_deref() == Some("0") {
            return Ok(None);
        }
        let per_user_limit = limit.as_deref().and_then(|l| l.parse().ok()).unwrap_or(0);
        let buckets = tags
            .split(',')
            .enumerate()
            .map(|(i, tag)| BucketHandle {
                index: i as u32,
                tag: tag.to_owned(),
                slot: tag_slot(tag),
                keys: BucketKeys::new(tag),
            })
            .collect();
        Ok(Some(Arc::new(SaleHandle {
            sku: sku.to_owned(),
            buckets,
            per_user_limit,
            sold_out_at: AtomicU64::new(0),
        })))
    }

    /// The sale as Redis holds it now: per bucket its tag, slot, master,
    /// stock and stream length, and the totals.
    pub async fn sale_status(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        let sale = self.admin_sale(sku).await?;
        let map = self.slot_map().await.map_err(unavailable)?;
        let meta: Vec<Option<String>> = self
            .run_cmd(
                redis::cmd("HMGET")
                    .arg(keys::sale_meta(sku))
                    .arg("starts_ms")
                    .arg("ends_ms"),
            )
            .await
            .map_err(unavailable)?;
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
            let (fields, stock, stream_len): (Vec<Option<String>>, Option<i64>, u64) = pipe
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if fields.first().cloned().flatten().as_deref() == Some("closed") {
                status.state = "closed".into();
            }
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
                initial,
                remaining,
                stream_len,
            });
        }
        Ok(status)
    }

    /// The cached sale handle, with errors as admin errors.
    pub(crate) async fn admin_sale(&self, sku: &str) -> Result<Arc<SaleHandle>, AdminError> {
        self.sale(sku).await.map_err(|e| match e {
            PurchaseError::UnknownSale(s) => AdminError::UnknownSale(s),
            other => AdminError::Unavailable(other.to_string()),
        })
    }
}
