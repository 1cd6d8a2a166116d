//! The hold sweeper: expires every held order whose deadline passed, in
//! every sale that holds orders, a batch per `transition.lua` call, and
//! gives back the quotas other buckets owe their buyers' home buckets.
//! Safe beside live buyers, payments and other sweepers: each expiry is the
//! same compare-and-set as a payment or a cancel (`ops/holds.rs`), and the
//! order's state decides. It sits beside the fall-through sweeper
//! (`fall_through.rs`): both finish what no buyer is left to finish.

use serde::Serialize;

use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{HoldError, PurchaseError, Unavailable};
use crate::metrics as m;
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::quota_return::{self, QuotaReturn};
use crate::scripts::transition::TransitionReply;

use crate::ops::holds::unix_ms;

/// Most orders one `transition.lua` call expires, and one read of a
/// bucket's deadline index returns.
const EXPIRE_BATCH: usize = 256;

/// Most batches one pass expires in one bucket, so one bucket (or a bad
/// index) never holds the pass back from every other sale.
const MAX_ROUNDS: usize = 64;

/// What one pass of [`Engine::expire_due`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExpiryReport {
    /// Holds this pass expired (their units are back on sale).
    pub expired: u64,
    /// Due entries that were paid or cancelled meanwhile (index cleaned).
    pub already_final: u64,
    /// Quotas given back in another bucket (orders served away from home).
    pub quotas_returned: u64,
    /// Largest lag seen, deadline to units back (ms).
    pub max_lag_ms: u64,
    /// Each expired hold's lag (ms), for whoever measures it (the bench).
    #[serde(skip)]
    pub lags_ms: Vec<u64>,
    /// Buckets or sales this pass could not handle (tried again next pass).
    pub errors: u64,
}

impl Engine {
    /// Expires every hold whose deadline passed, in every sale that holds
    /// orders, and gives back the quotas other buckets owe. Safe beside live
    /// buyers, payments and other sweepers; `flashsale serve` runs it every
    /// `hold_sweep_ms` ([`Engine::spawn_hold_sweeper`]).
    pub async fn expire_due(&self) -> Result<ExpiryReport, HoldError> {
        let skus = self
            .list_sales()
            .await
            .map_err(|e| HoldError::Unavailable(Unavailable::unconfirmed(e.to_string())))?;
        let mut report = ExpiryReport::default();
        for sku in skus {
            let sale = match self.sale(&sku).await {
                Ok(s) if s.hold_ms > 0 => s,
                Ok(_) | Err(PurchaseError::UnknownSale(_)) => continue,
                Err(e) => {
                    tracing::warn!(sku, error = %e, "hold sweeper skips a sale this pass");
                    report.errors += 1;
                    continue;
                }
            };
            let mut held = 0u64;
            for b in &sale.buckets {
                if let Err(e) = self.expire_bucket(&sale, b, &mut report).await {
                    tracing::warn!(sku, bucket = b.index, error = %e, "hold sweeper skips a bucket this pass");
                    report.errors += 1;
                }
                held += self
                    .cluster()
                    .run_cmd::<u64>(redis::cmd("ZCARD").arg(&b.keys.holds))
                    .await
                    .unwrap_or(0);
            }
            metrics::gauge!(m::HOLDS_HELD, "sku" => sku.clone()).set(held as f64);
        }
        Ok(report)
    }

    /// Runs [`Engine::expire_due`] every `hold_sweep_ms` until aborted.
    pub fn spawn_hold_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(engine.config().hold_sweep);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = engine.expire_due().await {
                    tracing::warn!(error = %e, "hold sweeper pass failed");
                }
            }
        })
    }

    /// Expires the due holds of one bucket, a batch at a time, until none
    /// is due, then gives back what quotas it owes.
    async fn expire_bucket(
        &self,
        sale: &SaleHandle,
        b: &BucketHandle,
        report: &mut ExpiryReport,
    ) -> Result<(), HoldError> {
        for _ in 0..MAX_ROUNDS {
            let now = unix_ms();
            let due: Vec<String> = self
                .cluster()
                .run_cmd(
                    redis::cmd("ZRANGE")
                        .arg(&b.keys.holds)
                        .arg("-inf")
                        .arg(now)
                        .arg("BYSCORE")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(EXPIRE_BATCH),
                )
                .await?;
            if due.is_empty() {
                break;
            }
            let orders: Vec<(&str, &str)> = due.iter().map(|id| (id.as_str(), "")).collect();
            let replies = self.transition(b, "expire", &orders).await?;
            let mut moved = false;
            let back_at = unix_ms();
            for reply in replies {
                match reply {
                    TransitionReply::Done {
                        expires_ms, units, ..
                    } => {
                        let lag = back_at.saturating_sub(expires_ms);
                        report.expired += 1;
                        report.max_lag_ms = report.max_lag_ms.max(lag);
                        report.lags_ms.push(lag);
                        metrics::counter!(m::HOLDS_EXPIRED).increment(1);
                        metrics::counter!(m::UNITS_RETURNED, "how" => "expired")
                            .increment(units.max(0) as u64);
                        metrics::histogram!(m::HOLD_EXPIRY_LAG_SECONDS).record(lag as f64 / 1000.0);
                        moved = true;
                    }
                    // Both leave the index (transition.lua removes them).
                    TransitionReply::NotHeld | TransitionReply::UnknownOrder => {
                        report.already_final += 1;
                        moved = true;
                    }
                    // Due by this process's clock, not yet by the master's.
                    TransitionReply::NotDue => {}
                    // One odd entry (a record the scripts never wrote) must
                    // not stop the rest of the batch or the owed quotas;
                    // transition.lua took it off the index.
                    other => {
                        report.errors += 1;
                        moved = true;
                        tracing::warn!(bucket = b.index, reply = ?other, "an expiry got an odd answer");
                    }
                }
            }
            if report.expired > 0 {
                sale.clear_sold_out();
            }
            if !moved || due.len() < EXPIRE_BATCH {
                break;
            }
        }
        if sale.per_user_limit > 0 && sale.buckets.len() > 1 {
            report.quotas_returned += self.return_owed_quotas(sale, b).await?;
        }
        Ok(())
    }

    /// Gives back, in each buyer's home bucket, the quota of every order of
    /// bucket `b` whose units came back there while its home is another
    /// bucket; then takes the order off `b`'s owed set. Each step is
    /// idempotent, so a crash between them is finished by the next pass.
    pub(crate) async fn return_owed_quotas(
        &self,
        sale: &SaleHandle,
        b: &BucketHandle,
    ) -> Result<u64, HoldError> {
        let owed: Vec<String> = self
            .cluster()
            .run_cmd(
                redis::cmd("ZRANGE")
                    .arg(&b.keys.owed)
                    .arg(0)
                    .arg(EXPIRE_BATCH as i64 - 1),
            )
            .await?;
        if owed.is_empty() {
            return Ok(0);
        }
        if self.config().ack == Ack::Replicated {
            // The quota goes back in another slot, durably: first make sure
            // the state it rests on (cancelled or expired here) is on a
            // replica of this bucket, or a failover could bring the order
            // back held, payable, with its quota already returned. Under
            // replicated every transition.lua answer rewrites the order's
            // version, so this no-op "expire" and its WAIT cover whatever
            // call set each state; if no replica answers, nothing is given
            // back this pass.
            let ids: Vec<(&str, &str)> = owed.iter().map(|id| (id.as_str(), "")).collect();
            self.transition(b, "expire", &ids).await?;
        }
        let mut returned = 0;
        for order_id in owed {
            let fields: Vec<Option<String>> = self
                .cluster()
                .run_cmd(
                    redis::cmd("HMGET")
                        .arg(b.keys.order(&order_id))
                        .arg("user")
                        .arg("qty")
                        .arg("home")
                        .arg("state"),
                )
                .await?;
            let field = |i: usize| fields.get(i).cloned().flatten();
            let home = field(2)
                .and_then(|h| h.parse::<usize>().ok())
                .and_then(|h| sale.buckets.get(h));
            let qty = field(1).and_then(|q| q.parse::<u64>().ok());
            // Only an order whose units went back owes its quota.
            let ended = matches!(field(3).as_deref(), Some("cancelled" | "expired"));
            if let (Some(user), Some(qty), Some(home), true) = (field(0), qty, home, ended) {
                let (quota, marker) = (home.keys.quota(&user), home.keys.quota_returned(&order_id));
                let call = QuotaReturn {
                    quota: &quota,
                    marker: &marker,
                    units: qty,
                    marker_ttl_secs: self.config().request_ttl_secs(),
                    replicated: self.config().replicated_flag(),
                }
                .call(&self.scripts().quota_return, home.slot);
                if self.call_acked(&call, quota_return::decode).await? {
                    returned += 1;
                }
            } else if field(3).is_some() && !ended {
                tracing::warn!(order_id, "owed quota of an order that did not end; dropped");
            } else {
                // The order's record is gone (kept request_ttl after it
                // ended): nothing left to give back by.
                tracing::warn!(order_id, "owed quota without a readable order; dropped");
            }
            let _: i64 = self
                .cluster()
                .run_cmd(redis::cmd("ZREM").arg(&b.keys.owed).arg(&order_id))
                .await?;
        }
        Ok(returned)
    }
}
