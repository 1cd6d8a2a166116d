//! Admin operations: create, restock, close and repair a sale. Each carries
//! an operation id and applies exactly once however often it is retried (the
//! engine's own retries after a timeout included), and each runs to the end
//! on a task of its own, so a caller that goes away (an HTTP client that
//! disconnects drops the handler's future) never leaves it half-done. A
//! create records its whole plan in one atomic step first; every later step
//! follows from the plan and is idempotent, so a create cut off by a crash is
//! finished by the same create, by any later create of the SKU, or by
//! [`Engine::repair_sale`]. Never on the purchase path.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::engine::Engine;
use crate::error::{AdminError, InvalidInput, Unavailable};
use crate::keys::{self, BucketKeys};
use crate::ops::status::SaleStatus;
use crate::placement::{pick_tags, tag_slot};
use crate::sale::{SaleSpec, MAX_BUCKETS, MAX_HOLD_MS, MAX_UNITS};
use crate::scripts::create_bucket::{self, NewBucket};
use crate::scripts::create_meta::{self, CreateMetaReply, SalePlan};
use crate::scripts::restock::{self, RestockArgs, RestockReply};
use crate::validate;

/// Latest start a new sale may have, from now.
pub const MAX_START_AHEAD: Duration = Duration::from_secs(366 * 24 * 3600);
/// Latest end a new sale may have, from now.
pub const MAX_END_AHEAD: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// A state the engine cannot act on (metadata it cannot read, no masters).
fn unconfirmed(why: impl Into<String>) -> AdminError {
    AdminError::Unavailable(Unavailable::unconfirmed(why))
}

fn spec_error(msg: impl Into<String>) -> AdminError {
    AdminError::Invalid(InvalidInput::Spec(msg.into()))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh operation id for a caller that did not bring one.
pub fn new_operation_id() -> String {
    format!("op-{:032x}", rand::random::<u128>())
}

/// A sale's plan as `create_meta.lua` stored it.
struct Plan {
    tags: Vec<String>,
    stock: u64,
    limit: u32,
    hold_ms: u64,
    late: String,
    starts_ms: u64,
    ends_ms: u64,
    created: bool,
    closed: bool,
    /// `restock:<op>` fields: operation id -> units, and whether it finished
    /// (`restock-done:<op>`; a separate prefix, so no operation id can pass
    /// for another's completion mark).
    restocks: Vec<(String, u64, bool)>,
}

impl Plan {
    fn parse(fields: HashMap<String, String>) -> Option<Plan> {
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let tags: Vec<String> = fields.get("tags")?.split(',').map(str::to_owned).collect();
        let mut restocks = Vec::new();
        for (k, v) in &fields {
            let Some(op) = k.strip_prefix("restock:") else {
                continue;
            };
            let done = fields.contains_key(&format!("restock-done:{op}"));
            restocks.push((op.to_owned(), v.parse().ok()?, done));
        }
        Some(Plan {
            tags,
            stock: num("stock")?,
            limit: u32::try_from(num("limit").unwrap_or(0)).ok()?,
            hold_ms: num("hold_ms").unwrap_or(0),
            late: fields
                .get("late")
                .cloned()
                .unwrap_or_else(|| "refuse".into()),
            starts_ms: num("starts_ms").unwrap_or(0),
            ends_ms: num("ends_ms").unwrap_or(0),
            // Sales made before plans were recorded have no "created" field.
            created: fields.get("created").is_none_or(|c| c == "1"),
            closed: fields.get("state").is_some_and(|s| s == "closed"),
            restocks,
        })
    }
}

/// Refuses a spec that cannot make a sale that sells, before Redis.
fn check_spec(spec: &SaleSpec) -> Result<(u64, u64), AdminError> {
    validate::sku(&spec.sku).map_err(AdminError::Invalid)?;
    if spec.buckets == 0 || spec.buckets > MAX_BUCKETS {
        return Err(spec_error(format!(
            "buckets must be 1..={MAX_BUCKETS}, got {}",
            spec.buckets
        )));
    }
    if spec.stock == 0 {
        return Err(spec_error("stock must be at least 1"));
    }
    if spec.hold_ms > MAX_HOLD_MS {
        return Err(spec_error(format!(
            "hold_ms must be at most {MAX_HOLD_MS} (7 days), got {}",
            spec.hold_ms
        )));
    }
    if spec.stock > MAX_UNITS {
        return Err(spec_error(format!(
            "stock must be at most {MAX_UNITS}, got {}",
            spec.stock
        )));
    }
    if let Some(q) = &spec.queue {
        q.check_with(spec.per_user_limit)
            .map_err(|e| spec_error(e.to_string()))?;
    }
    let now = SystemTime::now();
    let starts_ms = spec.starts_at.map(unix_ms).unwrap_or(0);
    let ends_ms = spec.ends_at.map(unix_ms).unwrap_or(0);
    if spec.starts_at.is_some() && starts_ms > unix_ms(now + MAX_START_AHEAD) {
        return Err(spec_error("starts_at is more than a year away"));
    }
    if spec.ends_at.is_some() {
        if ends_ms <= unix_ms(now) {
            return Err(spec_error("ends_at is in the past"));
        }
        if ends_ms > unix_ms(now + MAX_END_AHEAD) {
            return Err(spec_error("ends_at is more than ten years away"));
        }
        if ends_ms <= starts_ms {
            return Err(spec_error("ends_at must be after starts_at"));
        }
    }
    Ok((starts_ms, ends_ms))
}

/// The units bucket `i` of `n` gets of `total`: an even split, the first
/// buckets taking the remainder. The same on every retry.
fn share(total: u64, n: usize, i: usize) -> u64 {
    let n = n as u64;
    total / n + u64::from((i as u64) < total % n)
}

impl Engine {
    /// Creates a sale: picks shard tags so the buckets sit on distinct
    /// masters, records the plan, indexes the sale, creates each bucket.
    /// Fails with `AlreadyExists` when the SKU has a sale (after finishing
    /// that sale's create if a crash left it half-done). Each call is a new
    /// operation; to retry one safely, use [`Engine::create_sale_op`].
    pub async fn create_sale(&self, spec: SaleSpec) -> Result<SaleStatus, AdminError> {
        self.create_sale_op(spec, &new_operation_id()).await
    }

    /// [`Engine::create_sale`] under the caller's operation id: a retry with
    /// the same id (after a timeout, say) finishes and answers the first
    /// create instead of `AlreadyExists`.
    pub async fn create_sale_op(
        &self,
        spec: SaleSpec,
        operation_id: &str,
    ) -> Result<SaleStatus, AdminError> {
        let (starts_ms, ends_ms) = check_spec(&spec)?;
        validate::id("operation_id", operation_id).map_err(AdminError::Invalid)?;
        let engine = self.clone();
        let op = operation_id.to_owned();
        self.run_to_completion(spec.sku.clone(), async move {
            engine.create_locked(spec, &op, starts_ms, ends_ms).await
        })
        .await
    }

    async fn create_locked(
        &self,
        spec: SaleSpec,
        op: &str,
        starts_ms: u64,
        ends_ms: u64,
    ) -> Result<SaleStatus, AdminError> {
        let map = self.cluster().slot_map().await?;
        let tags = pick_tags(&spec.sku, spec.buckets, &map)
            .ok_or_else(|| unconfirmed("cluster has no masters"))?;
        let meta = keys::sale_meta(&spec.sku);
        let room = spec.queue.map(|q| q.encode()).unwrap_or_default();
        let plan = SalePlan {
            sku: &spec.sku,
            tags: &tags,
            stock: spec.stock,
            buckets: spec.buckets,
            limit: spec.per_user_limit,
            hold_ms: spec.hold_ms,
            late: spec.late_payment.as_str(),
            starts_ms,
            ends_ms,
            room: &room,
        };
        let call = plan.call(
            &self.scripts().create_meta,
            tag_slot(&format!("fs:{}", spec.sku)),
            &meta,
            op,
        );
        let reply = self.cluster().call(&call, create_meta::decode).await;
        match reply.map_err(Unavailable::from)? {
            CreateMetaReply::Claimed | CreateMetaReply::Resumed { .. } => {
                self.finish_create(&spec.sku).await?;
                tracing::info!(sku = %spec.sku, buckets = spec.buckets, stock = spec.stock, "sale created");
                self.sale_status(&spec.sku).await
            }
            CreateMetaReply::Mismatch => Err(AdminError::OperationMismatch(op.to_owned())),
            CreateMetaReply::Taken { created } => {
                if !created {
                    // Someone's create was cut off half-way: finish it, so
                    // the SKU is never left half-made.
                    self.finish_create(&spec.sku).await?;
                }
                Err(AdminError::AlreadyExists(spec.sku))
            }
        }
    }

    async fn plan(&self, sku: &str) -> Result<Option<Plan>, AdminError> {
        let fields: HashMap<String, String> = self
            .cluster()
            .run_cmd(redis::cmd("HGETALL").arg(keys::sale_meta(sku)))
            .await?;
        if fields.is_empty() {
            return Ok(None);
        }
        Plan::parse(fields)
            .map(Some)
            .ok_or_else(|| unconfirmed(format!("sale {sku:?}: metadata unreadable")))
    }

    /// Every step after the plan, each idempotent: index the sale first (so
    /// the order writer finds every stream that could hold an order), then
    /// create each bucket, then mark the plan done.
    async fn finish_create(&self, sku: &str) -> Result<(), AdminError> {
        let plan = self
            .plan(sku)
            .await?
            .ok_or_else(|| AdminError::UnknownSale(sku.to_owned()))?;
        let _: () = self
            .cluster()
            .run_cmd(redis::cmd("SADD").arg(keys::sale_index()).arg(sku))
            .await?;
        if plan.created {
            return Ok(());
        }
        let n = plan.tags.len();
        for (i, tag) in plan.tags.iter().enumerate() {
            let bk = BucketKeys::new(tag);
            let units = share(plan.stock, n, i);
            let call = NewBucket {
                sale: &bk.sale,
                stock: &bk.stock,
                units,
                sku,
                tag,
                bucket: i,
                buckets: n,
                starts_ms: plan.starts_ms,
                ends_ms: plan.ends_ms,
                limit: plan.limit,
                hold_ms: plan.hold_ms,
                late: &plan.late,
            }
            .call(&self.scripts().create_bucket, tag_slot(tag));
            self.cluster()
                .call(&call, create_bucket::decode)
                .await
                .map_err(Unavailable::from)?;
        }
        let _: () = self
            .cluster()
            .run_cmd(
                redis::cmd("HSET")
                    .arg(keys::sale_meta(sku))
                    .arg("created")
                    .arg("1"),
            )
            .await?;
        Ok(())
    }

    /// Finishes whatever a crash left half-done on `sku`: a create (index,
    /// buckets), a restock recorded but not applied to every bucket, a close
    /// not yet on every bucket. Safe to run at any time, any number of times.
    pub async fn repair_sale(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        let engine = self.clone();
        let owned = sku.to_owned();
        self.run_to_completion(sku.to_owned(), async move {
            let plan = engine
                .plan(&owned)
                .await?
                .ok_or_else(|| AdminError::UnknownSale(owned.clone()))?;
            engine.finish_create(&owned).await?;
            // A close first: a bucket that should be closed stops selling
            // before anything else is done.
            if plan.closed {
                engine.close_buckets(&owned).await?;
            }
            // A restock accepted before a close is finished even on closed
            // buckets, so it is never left half-applied.
            for (op, units, done) in &plan.restocks {
                if !done {
                    engine.apply_restock(&owned, *units, op).await?;
                }
            }
            engine.sale_status(&owned).await
        })
        .await
    }

    /// Adds `qty` units to an open sale, spread over its buckets. Each call
    /// is a new operation; to retry one safely, use [`Engine::restock_op`].
    pub async fn restock(&self, sku: &str, qty: u64) -> Result<SaleStatus, AdminError> {
        self.restock_op(sku, qty, &new_operation_id()).await
    }

    /// [`Engine::restock`] under the caller's operation id: however often it
    /// is retried, it adds `qty` units once. The same id with another `qty`
    /// is refused. Clears this process's sold-out flag (other processes see
    /// the new stock within `sold_out_recheck`).
    pub async fn restock_op(
        &self,
        sku: &str,
        qty: u64,
        operation_id: &str,
    ) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        validate::id("operation_id", operation_id).map_err(AdminError::Invalid)?;
        if qty == 0 || qty > MAX_UNITS {
            return Err(spec_error(format!(
                "restock qty must be 1..={MAX_UNITS}, got {qty}"
            )));
        }
        let engine = self.clone();
        let (owned, op) = (sku.to_owned(), operation_id.to_owned());
        self.run_to_completion(sku.to_owned(), async move {
            engine.restock_locked(&owned, qty, &op).await
        })
        .await
    }

    async fn restock_locked(
        &self,
        sku: &str,
        qty: u64,
        op: &str,
    ) -> Result<SaleStatus, AdminError> {
        let sale = self.admin_sale(sku).await?;
        let plan = self
            .plan(sku)
            .await?
            .ok_or_else(|| AdminError::UnknownSale(sku.to_owned()))?;
        // Checked once, on the metadata, before any bucket changes: a close
        // that lands half-way then cannot leave the restock half-applied.
        let known = plan.restocks.iter().any(|(o, _, _)| o == op);
        if plan.closed && !known {
            return Err(AdminError::Closed(sku.to_owned()));
        }
        // Refuse a restock that would take any bucket past MAX_UNITS before
        // any bucket changes (the script checks again, as the last guard).
        let n = sale.buckets.len();
        for (i, b) in sale.buckets.iter().enumerate() {
            let initial: Option<u64> = self
                .cluster()
                .run_cmd(redis::cmd("HGET").arg(&b.keys.sale).arg("initial"))
                .await?;
            if initial.unwrap_or(0).saturating_add(share(qty, n, i)) > MAX_UNITS {
                return Err(spec_error(format!(
                    "restock would take bucket {i} past {MAX_UNITS} units"
                )));
            }
        }
        // Record the intent on the sale's metadata, so a crash half-way is
        // finished by `repair_sale` and a reused id with other units refused.
        let meta = keys::sale_meta(sku);
        let field = format!("restock:{op}");
        let _: bool = self
            .cluster()
            .run_cmd(redis::cmd("HSETNX").arg(&meta).arg(&field).arg(qty))
            .await?;
        let recorded: Option<u64> = self
            .cluster()
            .run_cmd(redis::cmd("HGET").arg(&meta).arg(&field))
            .await?;
        if recorded != Some(qty) {
            return Err(AdminError::OperationMismatch(op.to_owned()));
        }
        self.apply_restock(sku, qty, op).await?;
        sale.clear_sold_out();
        self.sale_status(sku).await
    }

    /// Applies restock `op` of `qty` units to every bucket that has not had
    /// it yet, then marks it done on the metadata.
    async fn apply_restock(&self, sku: &str, qty: u64, op: &str) -> Result<(), AdminError> {
        let sale = self.admin_sale(sku).await?;
        let n = sale.buckets.len();
        for (i, b) in sale.buckets.iter().enumerate() {
            let units = share(qty, n, i);
            if units == 0 {
                continue;
            }
            let call = RestockArgs {
                sale: &b.keys.sale,
                stock: &b.keys.stock,
                units,
                op,
                finish: true,
            }
            .call(&self.scripts().restock, b.slot);
            let reply = self.cluster().call(&call, restock::decode).await;
            match reply.map_err(Unavailable::from)? {
                RestockReply::Applied | RestockReply::AlreadyApplied => {
                    let expect = crate::replication::Expect::Units(units);
                    self.confirm_replicated(b, &format!("op:{op}"), expect, "restock")
                        .await?;
                }
                RestockReply::Closed => return Err(AdminError::Closed(sku.to_owned())),
                RestockReply::UnknownSale => return Err(AdminError::UnknownSale(sku.to_owned())),
                RestockReply::Mismatch { .. } => {
                    return Err(AdminError::OperationMismatch(op.to_owned()))
                }
                RestockReply::TooLarge => {
                    return Err(spec_error(format!(
                        "restock would take bucket {i} past {MAX_UNITS} units"
                    )))
                }
                RestockReply::BadArgs => {
                    return Err(spec_error(format!("restock of {units} units refused")))
                }
            }
        }
        let _: () = self
            .cluster()
            .run_cmd(
                redis::cmd("HSET")
                    .arg(keys::sale_meta(sku))
                    .arg(format!("restock-done:{op}"))
                    .arg(1),
            )
            .await?;
        Ok(())
    }

    /// Under `ack = replicated`, an admin change to a bucket (a restock, a
    /// close) is reported done only once a replica of the bucket's master
    /// holds it (the bucket's `field` is `expect`): a failover must not take
    /// back units an operator was told were added (found by
    /// `flashsale-chaos --seed 20261122`: confirmed restocks missing after
    /// `kill` faults), nor reopen a sale they were told is closed.
    async fn confirm_replicated(
        &self,
        bucket: &crate::sale::BucketHandle,
        field: &str,
        expect: crate::replication::Expect,
        what: &str,
    ) -> Result<(), AdminError> {
        if self.config().ack == crate::config::Ack::Leader {
            return Ok(());
        }
        let started = std::time::Instant::now();
        loop {
            let why = match self
                .waits()
                .replicated(bucket.slot, &bucket.keys.sale, field, expect.clone())
                .await
            {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    Unavailable::unconfirmed(format!("no replica acknowledged the {what}"))
                }
                Err(e) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    e
                }
            };
            if started.elapsed() >= self.config().retry.deadline {
                return Err(AdminError::Unavailable(why));
            }
        }
    }

    /// Closes a sale: every bucket refuses new purchases from now on; retried
    /// request_ids still get their first answer. Idempotent.
    pub async fn close_sale(&self, sku: &str) -> Result<SaleStatus, AdminError> {
        validate::sku(sku).map_err(AdminError::Invalid)?;
        let engine = self.clone();
        let owned = sku.to_owned();
        self.run_to_completion(sku.to_owned(), async move {
            engine.admin_sale(&owned).await?;
            // The metadata first: a close cut off half-way is then finished
            // by `repair_sale`.
            let _: () = engine
                .cluster()
                .run_cmd(
                    redis::cmd("HSET")
                        .arg(keys::sale_meta(&owned))
                        .arg("state")
                        .arg("closed"),
                )
                .await?;
            engine.close_buckets(&owned).await?;
            engine.sale_status(&owned).await
        })
        .await
    }

    async fn close_buckets(&self, sku: &str) -> Result<(), AdminError> {
        let sale = self.admin_sale(sku).await?;
        for b in &sale.buckets {
            let _: () = self
                .cluster()
                .run_cmd(
                    redis::cmd("HSET")
                        .arg(&b.keys.sale)
                        .arg("state")
                        .arg("closed"),
                )
                .await?;
        }
        // Every bucket closed on its master first: a bucket whose close
        // cannot be confirmed must not leave the ones after it selling.
        for b in &sale.buckets {
            let closed = crate::replication::Expect::Text("closed");
            self.confirm_replicated(b, "state", closed, "close").await?;
        }
        Ok(())
    }

    /// Runs an admin operation on a task of its own, under the SKU's admin
    /// lock, and waits for it. If the caller's future is dropped, the task
    /// still runs to the end: an operation is never cut off half-way by the
    /// caller going away.
    async fn run_to_completion<T: Send + 'static>(
        &self,
        sku: String,
        op: impl std::future::Future<Output = Result<T, AdminError>> + Send + 'static,
    ) -> Result<T, AdminError> {
        let engine = self.clone();
        tokio::spawn(async move {
            let guard = engine.admin_lock(&sku).await?;
            let result = op.await;
            if let Some(g) = guard {
                g.unlock().await;
            }
            result
        })
        .await
        .map_err(|e| unconfirmed(format!("admin task: {e}")))?
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
            .map_err(AdminError::Lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_never_change() {
        for (total, n) in [(10u64, 3usize), (1, 3), (MAX_UNITS, 64), (7, 1)] {
            let parts: Vec<u64> = (0..n).map(|i| share(total, n, i)).collect();
            assert_eq!(parts.iter().sum::<u64>(), total);
            assert!(parts.windows(2).all(|w| w[0] >= w[1]));
        }
    }

    #[test]
    fn no_operation_id_passes_for_another_ones_completion() {
        let fields: HashMap<String, String> = [
            ("tags", "a,b"),
            ("stock", "10"),
            ("restock:z:done", "4"),
            ("restock:x", "2"),
            ("restock-done:x", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut r = Plan::parse(fields).expect("plan").restocks;
        r.sort();
        assert_eq!(
            r,
            vec![("x".into(), 2, true), ("z:done".into(), 4, false)],
            "the op called \"z:done\" is still to finish"
        );
    }

    #[test]
    fn sales_that_can_never_sell_are_refused() {
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let bad = [
            SaleSpec::new("s", 0),
            SaleSpec::new("s", MAX_UNITS + 1),
            SaleSpec {
                ends_at: Some(now - day),
                ..SaleSpec::new("s", 1)
            },
            SaleSpec {
                starts_at: Some(now + 2 * day),
                ends_at: Some(now + day),
                ..SaleSpec::new("s", 1)
            },
            SaleSpec {
                starts_at: Some(now + 400 * day),
                ..SaleSpec::new("s", 1)
            },
            SaleSpec {
                buckets: 0,
                ..SaleSpec::new("s", 1)
            },
        ];
        for spec in bad {
            assert!(
                matches!(check_spec(&spec), Err(AdminError::Invalid(_))),
                "{spec:?}"
            );
        }
        assert!(check_spec(&SaleSpec::new("s", MAX_UNITS)).is_ok());
    }
}
