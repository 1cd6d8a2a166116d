//! Sales as the hot path sees them: the [`SaleSpec`] of a new sale, the
//! cached [`SaleHandle`] (tags, slots, keys, the local sold-out flag), and
//! the `SaleCache` that owns the handles of one process. Each bucket's
//! handle carries its batch queue (`batch.rs`). The writes that
//! make and change a sale live in `ops/admin.rs`; the status read, in
//! `ops/status.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use redis::RedisError;

use crate::batch::BucketQueue;
use crate::cluster::Cluster;
use crate::keys::{self, BucketKeys};
use crate::placement::tag_slot;

/// Largest number of buckets one SKU may be split into.
pub const MAX_BUCKETS: u32 = 64;

/// Most units a sale, and any one bucket over its life (creation plus
/// restocks), may hold: 2^53 - 1, the largest integer a Lua number (a
/// double) holds exactly. Checked before anything reaches Redis, and again
/// by the scripts.
pub const MAX_UNITS: u64 = (1 << 53) - 1;

/// Longest hold a sale may give: 7 days, in ms.
pub const MAX_HOLD_MS: u64 = 7 * 24 * 3600 * 1000;

/// What a payment that comes after its hold ended gets
/// ([`SaleSpec::late_payment`]).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatePayment {
    /// Refused with [`crate::HoldError::HoldExpired`]: the unit went back on
    /// sale.
    #[default]
    Refuse,
    /// The order takes a unit again if its bucket has one left (and the
    /// buyer's limit allows), as a new transition of the same order; never
    /// oversells. Else refused as under `Refuse`.
    Retake,
}

impl LatePayment {
    /// The name kept in the sale's hash.
    pub fn as_str(self) -> &'static str {
        match self {
            LatePayment::Refuse => "refuse",
            LatePayment::Retake => "retake",
        }
    }
}

/// What [`Engine::create_sale`](crate::Engine::create_sale) creates.
#[derive(Debug, Clone, PartialEq)]
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
    /// How long a confirmed purchase is held for payment, in ms
    /// (1..=[`MAX_HOLD_MS`]); 0 = no hold, an order is paid when confirmed.
    /// A held order is paid ([`Engine::pay`](crate::Engine::pay)), cancelled
    /// ([`Engine::cancel`](crate::Engine::cancel)) or expires, and then its units go back on sale.
    pub hold_ms: u64,
    /// What a payment after the hold ended gets.
    pub late_payment: LatePayment,
    /// A waiting room in front of the sale (`None`: anyone may buy). With
    /// one, a purchase needs an admission token from the room, and the
    /// sale needs a per-user limit (what one admission buys at most).
    pub queue: Option<crate::room::QueueSpec>,
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
            hold_ms: 0,
            late_payment: LatePayment::Refuse,
            queue: None,
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
    /// Purchases whose home is this bucket, waiting for the next batch.
    pub(crate) queue: Arc<BucketQueue>,
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
    /// How long an order is held for payment (ms); 0 = paid when confirmed.
    pub hold_ms: u64,
    /// Engine time (ms) when every bucket was seen empty; 0 = not sold out.
    pub(crate) sold_out_at: AtomicU64,
    /// The sale's waiting room, if it has one.
    pub(crate) room: Option<crate::room::Room>,
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

/// The sales this process has seen, by SKU. A sale's tags and limit never
/// change once created, so a handle is loaded once and kept. A std lock: it
/// is never held across an await.
#[derive(Default)]
pub(crate) struct SaleCache {
    sales: RwLock<HashMap<String, Arc<SaleHandle>>>,
}

impl SaleCache {
    /// The handle of `sku`, loading its metadata on first use; `None` when
    /// no finished sale exists.
    pub(crate) async fn get(
        &self,
        cluster: &Cluster,
        sku: &str,
    ) -> Result<Option<Arc<SaleHandle>>, RedisError> {
        if let Some(h) = self.cached(sku) {
            return Ok(Some(h));
        }
        let Some(h) = load(cluster, sku).await? else {
            return Ok(None);
        };
        let mut map = self.sales.write().unwrap_or_else(|p| p.into_inner());
        Ok(Some(map.entry(sku.to_owned()).or_insert(h).clone()))
    }

    fn cached(&self, sku: &str) -> Option<Arc<SaleHandle>> {
        let map = self.sales.read().unwrap_or_else(|p| p.into_inner());
        map.get(sku).cloned()
    }
}

/// Reads a sale's metadata from Redis.
async fn load(cluster: &Cluster, sku: &str) -> Result<Option<Arc<SaleHandle>>, RedisError> {
    let fields: Vec<Option<String>> = cluster
        .run_cmd(
            redis::cmd("HMGET")
                .arg(keys::sale_meta(sku))
                .arg("tags")
                .arg("limit")
                .arg("created")
                .arg("hold_ms")
                .arg("room")
                .arg("starts_ms"),
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
    let hold_ms = fields
        .get(3)
        .cloned()
        .flatten()
        .and_then(|h| h.parse().ok())
        .unwrap_or(0);
    let field = |i: usize| fields.get(i).cloned().flatten();
    let room = match field(4) {
        None => None,
        Some(text) => {
            // A room this build cannot read must not sell without it.
            let spec = crate::room::QueueSpec::decode(&text).ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::Parse,
                    "sale's queue settings unreadable",
                    sku.to_owned(),
                ))
            })?;
            let starts_ms = field(5).and_then(|s| s.parse().ok()).unwrap_or(0);
            Some(crate::room::Room::new(spec, starts_ms))
        }
    };
    let buckets = tags
        .split(',')
        .enumerate()
        .map(|(i, tag)| {
            let (slot, keys) = (tag_slot(tag), BucketKeys::new(tag));
            BucketHandle {
                index: i as u32,
                tag: tag.to_owned(),
                slot,
                queue: Arc::new(BucketQueue::new(slot, &keys)),
                keys,
            }
        })
        .collect();
    Ok(Some(Arc::new(SaleHandle {
        sku: sku.to_owned(),
        buckets,
        per_user_limit,
        hold_ms,
        sold_out_at: AtomicU64::new(0),
        room,
    })))
}
