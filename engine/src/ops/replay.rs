//! A retry answered from its request's record: the same order, in the state
//! it is in now, once the bucket that took it is known still to hold it
//! (a failover under `ack = leader` can take a take back), or the order a
//! concurrent attempt made in its place. Why a file of its own: it is the
//! purchase's second answer, read after the home bucket's reply names a
//! decided request, and it never takes a unit.

use crate::config::Ack;
use crate::engine::Engine;
use crate::error::PurchaseError;
use crate::metrics as m;
use crate::order_state::OrderState;
use crate::replication::Expect;
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::take::{TakeMode, TakeReply};

use super::purchase::{unconfirmed, Confirmed, RequestKey};

impl Engine {
    /// The answer to a replay: the same order, in the state it is in now
    /// (a sale that holds orders is asked; any other's orders are paid).
    pub(super) async fn replayed(
        &self,
        sale: &SaleHandle,
        order_id: String,
        bucket: u32,
    ) -> Result<Confirmed, PurchaseError> {
        let (status, expires_at_ms) = if sale.hold_ms == 0 {
            (OrderState::Paid, None)
        } else {
            let view = self.order(&order_id).await.map_err(|e| {
                unconfirmed(format!("the state of order {order_id} is unreadable: {e}"))
            })?;
            (view.state, Some(view.expires_at_ms))
        };
        Ok(Confirmed {
            order_id,
            bucket,
            replayed: true,
            status,
            expires_at_ms,
        })
    }

    /// A replay confirms only an order that still exists: when another
    /// bucket served it, that bucket is asked to confirm it still holds it.
    /// Returns the order to answer with and its bucket: the one the home
    /// record names, or, when its bucket no longer holds it (see
    /// [`Engine::find_taken`]), the one a bucket does hold for the request.
    /// Under `ack = leader` an order a failover took back (the take's
    /// master died before its replica had it, the home record on another
    /// master lived), with no other in its place, is reported lost
    /// ([`PurchaseError::OrderLost`]). That is final unless an attempt of
    /// the same request was still walking across the failover and takes
    /// again; and a replay in the moment between the taking bucket's record
    /// expiring and the home record's (written a little later) is told lost
    /// too. Under `replicated` a confirmed home record's take was on a
    /// replica first: a missing record there has expired, and the order
    /// stands. Under `replicated` the replay also waits until a replica
    /// holds both records: the home record was re-propagated by
    /// `purchase.lua`, the other bucket's by the confirm.
    /// `home_replicated`: the replay's batch was already acknowledged by a
    /// replica of the home bucket.
    pub(super) async fn confirm_replay(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        order_id: String,
        bucket: u32,
        home_replicated: bool,
    ) -> Result<(String, u32), PurchaseError> {
        let leader = self.config().ack == Ack::Leader;
        let Some(taker) = sale.buckets.get(bucket as usize) else {
            return Err(unconfirmed(format!(
                "request record names bucket {bucket}, the sale has {}",
                sale.buckets.len()
            )));
        };
        let confirmed = || Expect::Confirmed(order_id.clone());
        if taker.index == home.index {
            // The order and the record are one script's writes in one slot:
            // a failover keeps both or neither.
            if !(home_replicated || leader) {
                self.ack(home, request, confirmed()).await?;
            }
            return Ok((order_id, bucket));
        }
        match self
            .take(sale, taker, home, request, &order_id, TakeMode::Confirm)
            .await?
        {
            TakeReply::Taken {
                order_id: taken, ..
            } if taken == order_id => {
                if !leader {
                    tokio::try_join!(
                        self.ack(home, request, confirmed()),
                        self.ack(taker, request, confirmed())
                    )?;
                }
                Ok((order_id, bucket))
            }
            TakeReply::Lost if !leader => {
                // Under `replicated` the home record was settled confirmed
                // only once the take was on a replica, so no failover took
                // it back: the taking bucket's record, written before the
                // home record with the same TTL, expired first. The order
                // stands (from the attack on #33's changes: this answered
                // `order_lost` for an order paid in PostgreSQL).
                if !home_replicated {
                    self.ack(home, request, confirmed()).await?;
                }
                Ok((order_id, bucket))
            }
            TakeReply::Taken { .. } | TakeReply::Lost | TakeReply::Refused { .. } => {
                self.answer_for_moved_order(sale, home, request, order_id)
                    .await
            }
            other => Err(unconfirmed(format!(
                "bucket {bucket} answered a replay with {other:?}"
            ))),
        }
    }

    /// The bucket the home record names no longer holds its order `named`:
    /// a failover took the take back (under `ack = leader`), and a
    /// concurrent attempt may since have taken again, there or, after a
    /// refusal there, further on. The order that exists is the answer;
    /// none is [`PurchaseError::OrderLost`]. Under `replicated` the new
    /// order's bucket is acknowledged first (the home record, which still
    /// names the old one, cannot be).
    async fn answer_for_moved_order(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        named: String,
    ) -> Result<(String, u32), PurchaseError> {
        let found = self.find_taken(sale, home, request, &named).await?;
        match found.as_slice() {
            [] => {
                metrics::counter!(m::REDIS_RETRIES, "reason" => "replay_lost").increment(1);
                Err(PurchaseError::OrderLost { order_id: named })
            }
            [(order_id, bucket)] => {
                metrics::counter!(m::REDIS_RETRIES, "reason" => "replay_moved").increment(1);
                if self.config().ack != Ack::Leader {
                    if let Some(b) = sale.buckets.get(*bucket as usize) {
                        self.ack(b, request, Expect::Confirmed(order_id.clone()))
                            .await?;
                    }
                }
                Ok((order_id.clone(), *bucket))
            }
            more => Err(unconfirmed(format!(
                "buckets hold {} orders for this request ({more:?}), its home record names {named}",
                more.len()
            ))),
        }
    }

    /// Every order a bucket other than `home` holds for the request, asked
    /// of each with a confirm (which never takes and never refuses).
    async fn find_taken(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        named: &str,
    ) -> Result<Vec<(String, u32)>, PurchaseError> {
        let mut found = Vec::new();
        for b in sale.buckets.iter().filter(|b| b.index != home.index) {
            match self
                .take(sale, b, home, request, named, TakeMode::Confirm)
                .await?
            {
                TakeReply::Taken { order_id, .. } => found.push((order_id, b.index)),
                TakeReply::Lost | TakeReply::Refused { .. } => {}
                TakeReply::UnknownSale => return Err(PurchaseError::UnknownSale(sale.sku.clone())),
                TakeReply::Mismatch => return Err(PurchaseError::RequestMismatch),
                TakeReply::BadArgs => {
                    return Err(unconfirmed("take.lua refused the engine's arguments"))
                }
            }
        }
        Ok(found)
    }
}
