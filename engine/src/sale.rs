//! Sales: creating one (placing its buckets on distinct masters), reading its
//! status, restocking and closing it, and the cached [`SaleHandle`] the hot
//! path uses. Admin operations are rare; they may take several round trips
//! and never sit on the purchase path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use serde::Serialize;

use crate::engine::Engine;
use crate::error::{AdminError, InvalidInput, PurchaseError};
use crate::keys::{self, BucketKeys};
use crate::placement::{pick_tags, tag_slot};
use crate::validate;

/// Largest number of buckets one SKU may be split into.
pub const MAX_BUCKETS: u32 = 64;

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

fn unix_ms(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn unavailable(e: redis::RedisError) -> AdminError {
    AdminError::Unavailable(e.to_string())
}

impl Engine {
    /// Creates a sale: picks shard tags so the buckets sit on distinct
    /// masters, writes the metadata and each bucket. Fails with
    /// `AlreadyExists` (changing nothing) when the SKU has a sale.
    pub async fn create_sale(&self, spec: SaleSpec) -> Result<SaleStatus, AdminError> {
        validate::sku(&spec.sku).map_err(AdminError::Invalid)?;
        if spec.buckets == 0 || spec.buckets > MAX_BUCKETS {
            return Err(AdminError::Invalid(InvalidInput::Spec(format!(
                "buckets must be 1..={MAX_BUCKETS}, got {}",
                spec.buckets
            ))));
        }
        if spec.stock > i64::MAX as u64 / 2 {
            return Err(AdminError::Invalid(InvalidInput::Spec(
                "stock is too large".into(),
            )));
        }
        let (starts_ms, ends_ms) = (unix_ms(spec.starts_at), unix_ms(spec.ends_at));
        if ends_ms != 0 && ends_ms <= starts_ms {
            return Err(AdminError::Invalid(InvalidInput::Spec(
                "ends_at must be after starts_at".into(),
            )));
        }
        let sku = spec.sku.clone();
        self.under_admin_lock(&sku, self.create_sale_locked(spec, starts_ms, ends_ms))
            .await
    }

    async fn create_sale_locked(
        &self,
        spec: SaleSpec,
        starts_ms: u64,
        ends_ms: u64,
    ) -> Result<SaleStatus, AdminError> {
        let map = self.slot_map().await.map_err(unavailable)?;
        let tags = pick_tags(&spec.sku, spec.buckets, &map)
            .ok_or_else(|| AdminError::Unavailable("cluster has no masters".into()))?;

        let meta = keys::sale_meta(&spec.sku);
        let claimed: bool = self
            .run_cmd(redis::cmd("HSETNX").arg(&meta).arg("sku").arg(&spec.sku))
            .await
            .map_err(unavailable)?;
        if !claimed {
            return Err(AdminError::AlreadyExists(spec.sku));
        }
        let tag_list = tags.join(",");
        let _: () = self
            .run_cmd(
                redis::cmd("HSET")
                    .arg(&meta)
                    .arg("tags")
                    .arg(&tag_list)
                    .arg("limit")
                    .arg(spec.per_user_limit)
                    .arg("starts_ms")
                    .arg(starts_ms)
                    .arg("ends_ms")
                    .arg(ends_ms)
                    .arg("stock")
                    .arg(spec.stock),
            )
            .await
            .map_err(unavailable)?;

        let b = u64::from(spec.buckets);
        for (i, tag) in tags.iter().enumerate() {
            let i = i as u64;
            let units = spec.stock / b + u64::from(i < spec.stock % b);
            let bk = BucketKeys::new(tag);
            let mut cmd =
                Engine::evalsha(&self.inner.scripts.create_bucket, &[&bk.sale, &bk.stock]);
            cmd.arg(units);
            for (f, v) in [
                ("sku", spec.sku.clone()),
                ("tag", tag.clone()),
                ("bucket", i.to_string()),
                ("buckets", b.to_string()),
                ("state", "open".into()),
                ("starts_ms", starts_ms.to_string()),
                ("ends_ms", ends_ms.to_string()),
                ("limit", spec.per_user_limit.to_string()),
                ("initial", units.to_string()),
            ] {
                cmd.arg(f).arg(v);
            }
            self.run_script(&self.inner.scripts.create_bucket, tag_slot(tag), &cmd)
                .await
                .map_err(unavailable)?;
        }
        let _: () = self
            .run_cmd(redis::cmd("SADD").arg(keys::sale_index()).arg(&spec.sku))
            .await
            .map_err(unavailable)?;
        tracing::info!(sku = %spec.sku, buckets = spec.buckets, stock = spec.stock, "sale created");
        self.sale_status(&spec.sku).await
    }

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
                    .arg("limit"),
            )
            .await?;
        let (Some(Some(tags)), Some(limit)) = (fields.first(), fields.get(1)) else {
            return Ok(None);
        };
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

    /// Adds `qty` units to an open sale, spread over its buckets, and clears
    /// this process's sold-out flag (other processes see the new stock
    /// within `sold_out_recheck`).
    pub async fn restock(&self, sku: &str, qty: u64) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        if qty == 0 || qty > i64::MAX as u64 / 2 {
            return Err(AdminError::Invalid(InvalidInput::Spec(format!(
                "restock qty must be positive and sane, got {qty}"
            ))));
        }
        self.under_admin_lock(sku, self.restock_locked(sku, qty))
            .await
    }

    async fn restock_locked(&self, sku: &str, qty: u64) -> Result<SaleStatus, AdminError> {
        let sale = self.admin_sale(sku).await?;
        let n = sale.buckets.len() as u64;
        for (i, b) in sale.buckets.iter().enumerate() {
            let units = qty / n + u64::from((i as u64) < qty % n);
            if units == 0 {
                continue;
            }
            let mut cmd =
                Engine::evalsha(&self.inner.scripts.restock, &[&b.keys.sale, &b.keys.stock]);
            cmd.arg(units);
            let reply = self
                .run_script(&self.inner.scripts.restock, b.slot, &cmd)
                .await
                .map_err(unavailable)?;
            match reply {
                Value::Int(-6) => return Err(AdminError::UnknownSale(sku.to_owned())),
                Value::Int(-5) => return Err(AdminError::Closed(sku.to_owned())),
                _ => {}
            }
        }
        let _: () = self
            .run_cmd(
                redis::cmd("HINCRBY")
                    .arg(keys::sale_meta(sku))
                    .arg("stock")
                    .arg(qty),
            )
            .await
            .map_err(unavailable)?;
        sale.clear_sold_out();
        self.sale_status(sku).await
    }

    /// Closes a sale: every bucket refuses new purchases from now on; retried
    /// request_ids still get their first answer.
    pub async fn close_sale(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        self.under_admin_lock(sku, self.close_sale_locked(sku))
            .await
    }

    async fn close_sale_locked(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        let sale = self.admin_sale(sku).await?;
        for b in &sale.buckets {
            let _: () = self
                .run_cmd(
                    redis::cmd("HSET")
                        .arg(&b.keys.sale)
                        .arg("state")
                        .arg("closed"),
                )
                .await
                .map_err(unavailable)?;
        }
        let _: () = self
            .run_cmd(
                redis::cmd("HSET")
                    .arg(keys::sale_meta(sku))
                    .arg("state")
                    .arg("closed"),
            )
            .await
            .map_err(unavailable)?;
        self.sale_status(sku).await
    }

    /// Runs `op` (a future: nothing happens until it is awaited) while
    /// holding the SKU's admin lock.
    async fn under_admin_lock<T>(
        &self,
        sku: &str,
        op: impl std::future::Future<Output = Result<T, AdminError>>,
    ) -> Result<T, AdminError> {
        let guard = self.admin_lock(sku).await?;
        let result = op.await;
        if let Some(g) = guard {
            g.unlock().await;
        }
        result
    }

    /// Holds the SKU's admin lock (when lock nodes are configured) so two
    /// operators' create/restock/close of one SKU never interleave.
    async fn admin_lock(&self, sku: &str) -> Result<Option<crate::lock::LockGuard>, AdminError> {
        let Some(locks) = self.locks() else {
            return Ok(None);
        };
        let owner = format!(
            "admin-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        locks
            .lock(
                &format!("sale-admin:{sku}"),
                &crate::lock::LockOptions::new(owner),
            )
            .await
            .map(Some)
            .map_err(|e| AdminError::Lock(e.to_string()))
    }

    /// The cached sale handle, with errors as admin errors.
    pub(crate) async fn admin_sale(&self, sku: &str) -> Result<Arc<SaleHandle>, AdminError> {
        self.sale(sku).await.map_err(|e| match e {
            PurchaseError::UnknownSale(s) => AdminError::UnknownSale(s),
            other => AdminError::Unavailable(other.to_string()),
        })
    }
}
