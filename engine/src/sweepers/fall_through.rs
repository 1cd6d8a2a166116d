//! The sweeper: settles fall-throughs whose process died between buckets.
//! A purchase whose home bucket was short leaves its request pending (quota
//! reserved) while it walks the other buckets; if the process dies there and
//! the buyer never retries, nobody would settle it, and the user would be
//! held at a false limit. The sweeper finds requests pending longer than
//! `pending_timeout` in each bucket's pending index, walks the other buckets
//! in the same fixed order as a buyer (but never takes, only makes each
//! refusal final), and settles: confirmed where a bucket took, else the quota
//! comes back. Any number of sweepers may run at once with live buyers: every
//! step is a compare-and-set in one slot. It never writes stock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::engine::Engine;
use crate::error::{AdminError, PurchaseError, Unavailable};
use crate::keys;
use crate::ops::purchase::RequestKey;
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::record::RequestRecord;
use crate::scripts::take::TakeMode;

/// Most pending requests one pass reads from one bucket's index.
const BATCH: usize = 256;

/// What one pass of [`Engine::settle_abandoned`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Pending requests found older than `pending_timeout`.
    pub found: u64,
    /// Requests this pass settled (confirmed elsewhere, or quota returned).
    pub settled: u64,
    /// Requests or sales this pass could not handle (logged; tried again
    /// next pass). One sale's trouble never stops the others.
    pub errors: u64,
}

impl Engine {
    /// Settles fall-throughs left pending longer than `pending_timeout`, in
    /// every sale. Safe beside live buyers and other sweepers; the order
    /// writer runs it on a timer.
    pub async fn settle_abandoned(&self) -> Result<SweepReport, PurchaseError> {
        let skus = self.list_sales().await.map_err(|e| match e {
            AdminError::Unavailable(u) => PurchaseError::Unavailable(u),
            other => PurchaseError::Unavailable(Unavailable::unconfirmed(other.to_string())),
        })?;
        let age = self.config().pending_timeout;
        let mut report = SweepReport::default();
        for sku in skus {
            let sale = match self.sale(&sku).await {
                Ok(s) => s,
                Err(PurchaseError::UnknownSale(_)) => continue,
                Err(e) => {
                    tracing::warn!(sku, error = %e, "sweeper skips a sale this pass");
                    report.errors += 1;
                    continue;
                }
            };
            if sale.buckets.len() < 2 {
                continue;
            }
            for home in &sale.buckets {
                if let Err(e) = self.sweep_bucket(&sale, home, age, &mut report).await {
                    tracing::warn!(sku, bucket = home.index, error = %e, "sweeper skips a bucket this pass");
                    report.errors += 1;
                }
            }
        }
        Ok(report)
    }

    async fn sweep_bucket(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        age: Duration,
        report: &mut SweepReport,
    ) -> Result<(), PurchaseError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let cutoff = now_ms.saturating_sub(age.as_millis() as u64);
        // With their scores: each is when its request's walk began, which
        // the refusals this sweep makes final are kept from (`take.lua`).
        let members: Vec<(String, f64)> = self
            .cluster()
            .run_cmd(
                redis::cmd("ZRANGEBYSCORE")
                    .arg(&home.keys.pending)
                    .arg("-inf")
                    .arg(cutoff)
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(BATCH),
            )
            .await?;
        for (member, since) in members {
            let since_ms = if since.is_finite() && since > 0.0 {
                since as u64
            } else {
                0
            };
            report.found += 1;
            let Some((user, request_id)) = keys::parse_pending_member(&member) else {
                tracing::warn!(member, "pending index entry of an unknown shape; removed");
                let _: Result<i64, _> = self
                    .cluster()
                    .run_cmd(redis::cmd("ZREM").arg(&home.keys.pending).arg(&member))
                    .await;
                continue;
            };
            let home_record = home.keys.request(user, request_id);
            let record: Option<String> = self
                .cluster()
                .run_cmd(redis::cmd("GET").arg(&home_record))
                .await?;
            // Whatever the record says, settle.lua decides again atomically;
            // the qty only has to name the same request in the other buckets.
            let qty = match record.as_deref().and_then(RequestRecord::parse) {
                Some(RequestRecord::Pending { qty }) => qty,
                _ => 1,
            };
            let request = RequestKey::in_home(
                user,
                request_id,
                qty,
                self.cluster().generation(),
                home,
                &home_record,
            );
            let settled = match self
                .walk(sale, home, request, "-", TakeMode::Refuse { since_ms })
                .await
            {
                Ok(walk) => self
                    .settle(home, request, &walk)
                    .await
                    .map(|s| (s, walk.taken.is_some())),
                Err(e) => Err(e),
            };
            let (settled, took) = match settled {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(sku = %sale.sku, error = %e, "sweeper could not settle a request");
                    report.errors += 1;
                    continue;
                }
            };
            if settled.settled {
                report.settled += 1;
                tracing::info!(
                    sku = %sale.sku,
                    confirmed = took,
                    "settled an abandoned fall-through"
                );
            }
        }
        Ok(())
    }
}
