//! The walk over a sale's other buckets when the buyer's home bucket is
//! short: `take.lua` in each, in one fixed order, each outcome final per
//! bucket, then `settle.lua` in the home bucket with where the walk ended.
//! Why a file of its own: the hot path never comes here while the home
//! bucket has stock, and the fall-through sweeper finishes a walk no
//! caller is left to finish with the same `walk` and `settle`.

use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{PurchaseError, Unavailable};
use crate::keys;
use crate::order_id;
use crate::order_state::OrderState;
use crate::replication::Expect;
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::record::RequestRecord;
use crate::scripts::refusal::Refusal;
use crate::scripts::settle::{self, Outcome, SettleArgs, SettleKeys, SettleReply};
use crate::scripts::take::{self, TakeArgs, TakeKeys, TakeMode, TakeReply};

use super::purchase::{unconfirmed, Confirmed, RequestKey};

/// Where a walk over the other buckets ended.
pub(crate) struct WalkOutcome {
    /// The bucket that took (slot, order id, bucket index, replayed).
    pub(crate) taken: Option<(u16, String, u32, bool)>,
    /// The hold's deadline, when the walk's own take made a held order.
    pub(crate) expires_ms: Option<u64>,
    /// The strongest refusal seen.
    pub(crate) refusal: Refusal,
    /// Every bucket walked reported no stock at all.
    pub(crate) all_empty: bool,
}

impl Engine {
    /// The home bucket was short and holds the request as pending: walk the
    /// other buckets, settle the home record with the outcome, and answer
    /// with what the record says then (a concurrent attempt may have settled
    /// it first; both walked the same buckets to the same outcome).
    pub(super) async fn fall_through(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        nonce: &str,
        home_stock: i64,
        since_ms: u64,
    ) -> Result<Confirmed, PurchaseError> {
        let walk = self
            .walk(sale, home, request, nonce, TakeMode::Take { since_ms })
            .await?;
        let settled = self.settle(home, request, &walk).await?;
        let answer = match settled.record {
            RequestRecord::Confirmed {
                order_id, bucket, ..
            } => {
                let ours = settled.settled
                    && walk
                        .taken
                        .as_ref()
                        .is_some_and(|(_, id, _, replayed)| *id == order_id && !replayed);
                if ours {
                    Ok(Confirmed {
                        order_id,
                        bucket,
                        replayed: false,
                        status: if walk.expires_ms.is_some() {
                            OrderState::Held
                        } else {
                            OrderState::Paid
                        },
                        expires_at_ms: walk.expires_ms,
                    })
                } else {
                    // Another attempt's order. Under `leader` its take may
                    // have been lost since (this walk may even have taken
                    // again where it was): answer only what a bucket holds.
                    // Under `replicated` the acks below check it.
                    let (order_id, bucket) = if self.config().ack == Ack::Leader {
                        self.confirm_replay(sale, home, request, order_id, bucket, true)
                            .await?
                    } else {
                        (order_id, bucket)
                    };
                    self.replayed(sale, order_id, bucket).await
                }
            }
            RequestRecord::Refused { why, .. } => Err(PurchaseError::from(why)),
            // settle.lua writes a missing record from the outcome, so this
            // is never answered; refuse rather than guess.
            RequestRecord::Missing => Err(unconfirmed("settle.lua left no record")),
            RequestRecord::Pending { .. } => {
                Err(unconfirmed("settle.lua left the request pending"))
            }
        };
        match &answer {
            Ok(c) => {
                // Confirm only once every write of the purchase is on a
                // replica: the home bucket's reservation and record, and the
                // bucket that took.
                let taker = sale.buckets.get(c.bucket as usize).unwrap_or(home);
                let confirmed = || Expect::Confirmed(c.order_id.clone());
                // The walk acked its own take before settling; only an order
                // another attempt took still needs its bucket's ack here.
                let acked_by_walk = walk
                    .taken
                    .as_ref()
                    .is_some_and(|(_, id, _, _)| *id == c.order_id);
                if taker.index == home.index || acked_by_walk {
                    self.ack(home, request, confirmed()).await?;
                } else {
                    tokio::try_join!(
                        self.ack(home, request, confirmed()),
                        self.ack(taker, request, confirmed())
                    )?;
                }
            }
            Err(PurchaseError::SoldOut) if walk.all_empty && home_stock == 0 => {
                sale.mark_sold_out(self.now_ms());
            }
            Err(_) => {}
        }
        answer
    }

    /// Walks the buckets after `home` in their fixed order, stopping at the
    /// first that takes. Never stops at a refusal: every bucket before the
    /// one that takes must have refused for good (see `take.lua`). Each
    /// bucket names the order it would make with the purchase's `nonce`.
    pub(crate) async fn walk(
        &self,
        sale: &SaleHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        nonce: &str,
        mode: TakeMode,
    ) -> Result<WalkOutcome, PurchaseError> {
        let n = sale.buckets.len();
        let mut out = WalkOutcome {
            taken: None,
            expires_ms: None,
            refusal: Refusal::SoldOut,
            all_empty: true,
        };
        for step in 1..n {
            let b = &sale.buckets[(home.index as usize + step) % n];
            let order_id = order_id::compose(&sale.sku, b.index, nonce);
            match self.take(sale, b, home, request, &order_id, mode).await? {
                TakeReply::Taken {
                    order_id,
                    bucket,
                    replayed,
                    expires_ms,
                } => {
                    out.expires_ms = expires_ms;
                    if mode != TakeMode::Confirm {
                        // The home record is settled as confirmed only once
                        // the take is on a replica (by a buyer's walk or the
                        // sweeper's): settled earlier, a failover that took
                        // the take back would leave a record naming an order
                        // that does not exist, and a request no retry could
                        // ever decide.
                        self.ack(b, request, Expect::Confirmed(order_id.clone()))
                            .await?;
                    }
                    out.taken = Some((b.slot, order_id, bucket, replayed));
                    break;
                }
                TakeReply::Refused { why, stock } => {
                    out.refusal = out.refusal.max(why);
                    out.all_empty &= stock <= 0;
                    if matches!(mode, TakeMode::Take { .. }) {
                        // A refusal is what lets the walk go on to the next
                        // bucket; a failover that forgot it could let a retry
                        // take here after this walk took further on.
                        self.ack(b, request, Expect::Refused).await?;
                    }
                }
                TakeReply::UnknownSale => return Err(PurchaseError::UnknownSale(sale.sku.clone())),
                TakeReply::Mismatch => return Err(PurchaseError::RequestMismatch),
                TakeReply::Lost => {
                    return Err(unconfirmed("take.lua answered a walk as a replay check"))
                }
                TakeReply::BadArgs => {
                    return Err(unconfirmed("take.lua refused the engine's arguments"))
                }
            }
        }
        Ok(out)
    }

    /// One `take.lua` call on bucket `b` of `sale`, for a buyer whose home
    /// is `home`.
    pub(super) async fn take(
        &self,
        sale: &SaleHandle,
        b: &BucketHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        order_id: &str,
        mode: TakeMode,
    ) -> Result<TakeReply, PurchaseError> {
        let record_key = request.record_in(b);
        let order_key = b.keys.order(order_id);
        let keys = TakeKeys {
            sale: &b.keys.sale,
            stock: &b.keys.stock,
            orders: &b.keys.orders,
            record: &record_key,
            holds: &b.keys.holds,
            order: (sale.hold_ms > 0).then_some(order_key.as_str()),
        };
        let args = TakeArgs {
            qty: request.qty,
            order_id,
            user: request.user,
            record_ttl_secs: self.config().request_ttl_secs(),
            mode,
            replicated: self.config().replicated_flag(),
            home_bucket: home.index,
            order_record: self.config().order_record.script_arg(),
            walk_limit_ms: self.config().walk_limit_ms(),
        };
        let call = args.call(&self.scripts().take, b.slot, &keys);
        Ok(self
            .cluster()
            .call(&call, take::decode)
            .await
            .map_err(Unavailable::from)?)
    }

    /// `settle.lua` in the home bucket with the walk's outcome.
    pub(crate) async fn settle(
        &self,
        home: &BucketHandle,
        request: RequestKey<'_>,
        walk: &WalkOutcome,
    ) -> Result<SettleReply, PurchaseError> {
        let quota = home.keys.quota(request.user);
        let member = keys::pending_member(request.user, request.request_id);
        let args = SettleArgs {
            outcome: match &walk.taken {
                Some((_, order_id, bucket, _)) => Outcome::Confirmed {
                    bucket: *bucket,
                    order_id,
                },
                None => Outcome::Refused(walk.refusal),
            },
            record_ttl_secs: self.config().request_ttl_secs(),
            pending_member: &member,
            qty: request.qty,
        };
        let keys = SettleKeys {
            quota: &quota,
            record: request.home_record,
            pending: &home.keys.pending,
        };
        let call = args.call(&self.scripts().settle, home.slot, &keys);
        Ok(self
            .cluster()
            .call(&call, settle::decode)
            .await
            .map_err(Unavailable::from)?)
    }
}
