//! The hot path, top to bottom: validate, local sold-out flag, `purchase.lua`
//! in the buyer's home bucket (in that bucket's next batch, `batch.rs`),
//! decode the reply, answer. Only
//! when the home bucket is short does a purchase walk the other buckets
//! (`take.lua`, in one fixed order, each outcome final per bucket) and settle
//! the home bucket's pending record (`settle.lua`). A request is (sku, user,
//! request_id); it makes at most one order, and a confirmed request answers
//! every retry with that order. No lock is held across an await; nothing from
//! the network is unwrapped.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::batch::HomeReply;
use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{InvalidInput, PurchaseError, Unavailable};
use crate::keys;
use crate::metrics as m;
use crate::order_id;
use crate::order_state::OrderState;
use crate::replication::Expect;
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::purchase::{HomePurchase, PurchaseReply};
use crate::scripts::record::RequestRecord;
use crate::scripts::refusal::Refusal;
use crate::scripts::settle::{self, Outcome, SettleArgs, SettleKeys, SettleReply};
use crate::scripts::take::{self, TakeArgs, TakeKeys, TakeMode, TakeReply};
use crate::validate;

/// One buyer's request. Borrowed, so a service can pass fields straight from
/// its parsed HTTP body without copying.
#[derive(Debug, Clone, Copy)]
pub struct PurchaseRequest<'a> {
    /// The item.
    pub sku: &'a str,
    /// The buyer; quota is counted per user.
    pub user: &'a str,
    /// Units wanted (checked: 1..=limit).
    pub qty: i64,
    /// Idempotency key: a retry with the same id gets the first answer.
    pub request_id: &'a str,
}

/// A request whose sku, ids and qty passed the engine's checks
/// ([`Engine::check`]): a service that must refuse bad input before its own
/// work (a rate limiter that should hold only valid user ids) checks once
/// and buys with [`Engine::purchase_checked`], so nothing is validated
/// twice. Made only by `check`.
#[derive(Debug, Clone, Copy)]
pub struct CheckedPurchase<'a> {
    req: PurchaseRequest<'a>,
    qty: u32,
}

impl<'a> CheckedPurchase<'a> {
    /// The request as it was given.
    pub fn request(&self) -> PurchaseRequest<'a> {
        self.req
    }
}

/// A confirmed purchase: its order is queued on the bucket's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmed {
    /// Order id (primary key in PostgreSQL); it names the sale and bucket
    /// that hold the order (`order_id.rs`), so paying or cancelling it needs
    /// nothing else.
    pub order_id: String,
    /// Bucket that served the order.
    pub bucket: u32,
    /// True when this request_id was confirmed before and this is its replay.
    pub replayed: bool,
    /// `paid` when the sale holds no orders; else `held` for a new order,
    /// and the order's state now for a replay.
    pub status: OrderState,
    /// When the hold ends (ms since the Unix epoch, Redis time); `None` when
    /// the sale holds no orders.
    pub expires_at_ms: Option<u64>,
}

/// An answer the engine cannot give safely; the buyer retries.
fn unconfirmed(why: impl Into<String>) -> PurchaseError {
    PurchaseError::Unavailable(Unavailable::unconfirmed(why))
}

impl From<Refusal> for PurchaseError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::SoldOut => PurchaseError::SoldOut,
            Refusal::Ended => PurchaseError::Ended,
            Refusal::Closed => PurchaseError::Closed,
        }
    }
}

/// Who a request is, inside the engine.
#[derive(Clone, Copy)]
pub(crate) struct RequestKey<'a> {
    pub(crate) user: &'a str,
    pub(crate) request_id: &'a str,
    pub(crate) qty: u64,
    /// The shared connection in use when the request started: a WAIT
    /// counts for it only on that connection.
    pub(crate) conn_gen: u64,
}

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
    /// Buys `qty` units for `user`. Never oversells. A request is (sku,
    /// user, request_id): a retry gets the first confirmation, never a second
    /// order; the same request with another qty is refused
    /// ([`PurchaseError::RequestMismatch`]).
    pub async fn purchase(&self, req: PurchaseRequest<'_>) -> Result<Confirmed, PurchaseError> {
        let started = Instant::now();
        let result = match self.check(req) {
            Ok(checked) => self.purchase_inner(checked).await,
            Err(e) => Err(e),
        };
        self.count_purchase(&result, started);
        result
    }

    /// Checks a request as [`Engine::purchase`] does first (sku, ids in
    /// their allowed shape and Unicode NFC, 1 <= qty <= `max_qty`), without
    /// touching Redis; the error is the one `purchase` would answer.
    pub fn check<'a>(
        &self,
        req: PurchaseRequest<'a>,
    ) -> Result<CheckedPurchase<'a>, PurchaseError> {
        validate::sku(req.sku).map_err(PurchaseError::Invalid)?;
        validate::id("user", req.user).map_err(PurchaseError::Invalid)?;
        validate::id("request_id", req.request_id).map_err(PurchaseError::Invalid)?;
        let qty = validate::qty(req.qty, self.config().max_qty).map_err(PurchaseError::Invalid)?;
        Ok(CheckedPurchase { req, qty })
    }

    /// [`Engine::purchase`] of a request already checked by
    /// [`Engine::check`]: the same answer, without the checks again.
    pub async fn purchase_checked(
        &self,
        checked: CheckedPurchase<'_>,
    ) -> Result<Confirmed, PurchaseError> {
        let started = Instant::now();
        let result = self.purchase_inner(checked).await;
        self.count_purchase(&result, started);
        result
    }

    fn count_purchase(&self, result: &Result<Confirmed, PurchaseError>, started: Instant) {
        let label = match &result {
            Ok(c) if c.replayed => "replayed",
            Ok(_) => "confirmed",
            Err(e) => e.code(),
        };
        metrics::counter!(m::PURCHASES, "result" => label).increment(1);
        metrics::histogram!(m::PURCHASE_SECONDS).record(started.elapsed().as_secs_f64());
    }

    async fn purchase_inner(
        &self,
        CheckedPurchase { req, qty }: CheckedPurchase<'_>,
    ) -> Result<Confirmed, PurchaseError> {
        let cfg = self.config();
        let planted_id;
        let req = if planted!(SkipRequestCheck) {
            planted_id = format!("{}~{}", req.request_id, order_id::new_nonce());
            PurchaseRequest {
                request_id: &planted_id,
                ..req
            }
        } else {
            req
        };

        let sale = self.sale(req.sku).await?;
        if sale.per_user_limit > 0 && qty > sale.per_user_limit {
            return Err(PurchaseError::Invalid(InvalidInput::QtyTooLarge {
                qty: req.qty,
                max: sale.per_user_limit,
            }));
        }
        let home = &sale.buckets[sale.home_bucket(req.user)];
        let record_key = home.keys.request(req.user, req.request_id);
        if sale.sold_out_fresh(self.now_ms(), cfg.sold_out_recheck)
            && !self.request_seen(&record_key).await?
        {
            // Only a request Redis has never seen is answered by the flag: a
            // GET instead of the purchase script. A retry of a decided
            // request goes on to the script and gets its decision.
            self.stats()
                .sold_out_local
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(m::SOLD_OUT_LOCAL).increment(1);
            return Err(PurchaseError::SoldOut);
        }

        let request = RequestKey {
            user: req.user,
            request_id: req.request_id,
            qty: u64::from(qty),
            conn_gen: self.cluster().generation(),
        };
        let nonce = order_id::new_nonce();
        let order_id = order_id::compose(&sale.sku, home.index, &nonce);
        let order_key = (sale.hold_ms > 0).then(|| home.keys.order(&order_id));
        let HomeReply { reply, replicated } = self
            .buy_in_home(home, request, record_key, order_id, order_key)
            .await?;
        match reply {
            PurchaseReply::Confirmed {
                order_id,
                bucket,
                expires_ms,
            } => {
                if !replicated {
                    self.ack(home, request, Expect::Confirmed(order_id.clone()))
                        .await?;
                }
                Ok(Confirmed {
                    order_id,
                    bucket,
                    replayed: false,
                    status: if expires_ms.is_some() {
                        OrderState::Held
                    } else {
                        OrderState::Paid
                    },
                    expires_at_ms: expires_ms,
                })
            }
            PurchaseReply::Replayed { order_id, bucket } => {
                let (order_id, bucket) = self
                    .confirm_replay(&sale, home, request, order_id, bucket, replicated)
                    .await?;
                self.replayed(&sale, order_id, bucket).await
            }
            PurchaseReply::FallThrough {
                home_stock,
                since_ms,
            }
            | PurchaseReply::Pending {
                home_stock,
                since_ms,
            } => {
                metrics::counter!(m::FALLTHROUGHS).increment(1);
                self.stats()
                    .fallthroughs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // The home bucket's reservation and record are what stop a
                // retry from buying again: on a replica before any bucket
                // takes.
                if !replicated {
                    self.ack(home, request, Expect::Pending).await?;
                }
                self.fall_through(&sale, home, request, &nonce, home_stock, since_ms)
                    .await
            }
            PurchaseReply::Refused { why, home_stock } => {
                if why == Refusal::SoldOut && home_stock == 0 && sale.buckets.len() == 1 {
                    sale.mark_sold_out(self.now_ms());
                }
                Err(why.into())
            }
            PurchaseReply::LimitReached { used } => Err(PurchaseError::LimitExceeded {
                limit: sale.per_user_limit,
                already: u32::try_from(used.max(0)).unwrap_or(u32::MAX),
            }),
            PurchaseReply::NotStarted => Err(PurchaseError::NotStarted),
            PurchaseReply::UnknownSale => Err(PurchaseError::UnknownSale(req.sku.to_owned())),
            PurchaseReply::Mismatch => Err(PurchaseError::RequestMismatch),
            PurchaseReply::BadArgs => {
                Err(unconfirmed("purchase.lua refused the engine's arguments"))
            }
        }
    }

    /// `purchase.lua` in the buyer's home bucket, in the bucket's next
    /// batch, decoded.
    async fn buy_in_home(
        &self,
        home: &BucketHandle,
        request: RequestKey<'_>,
        record_key: String,
        order_id: String,
        order_key: Option<String>,
    ) -> Result<HomeReply, PurchaseError> {
        let purchase = HomePurchase {
            quota_key: home.keys.quota(request.user),
            record_key,
            order_key,
            qty: request.qty,
            order_id,
            user: request.user.to_owned(),
        };
        Ok(self.batches().purchase(&home.queue, purchase).await?)
    }

    /// The answer to a replay: the same order, in the state it is in now
    /// (a sale that holds orders is asked; any other's orders are paid).
    async fn replayed(
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
    async fn confirm_replay(
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

    /// True when Redis holds a record of this request (any outcome).
    async fn request_seen(&self, record_key: &str) -> Result<bool, PurchaseError> {
        let rec: Option<Vec<u8>> = self
            .cluster()
            .run_cmd(redis::cmd("GET").arg(record_key))
            .await?;
        Ok(rec.is_some())
    }

    /// The home bucket was short and holds the request as pending: walk the
    /// other buckets, settle the home record with the outcome, and answer
    /// with what the record says then (a concurrent attempt may have settled
    /// it first; both walked the same buckets to the same outcome).
    async fn fall_through(
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
    async fn take(
        &self,
        sale: &SaleHandle,
        b: &BucketHandle,
        home: &BucketHandle,
        request: RequestKey<'_>,
        order_id: &str,
        mode: TakeMode,
    ) -> Result<TakeReply, PurchaseError> {
        let record_key = b.keys.request(request.user, request.request_id);
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
        let (quota, record) = (
            home.keys.quota(request.user),
            home.keys.request(request.user, request.request_id),
        );
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
            record: &record,
            pending: &home.keys.pending,
        };
        let call = args.call(&self.scripts().settle, home.slot, &keys);
        Ok(self
            .cluster()
            .call(&call, settle::decode)
            .await
            .map_err(Unavailable::from)?)
    }

    /// With `ack = replicated`, waits for one replica before confirming,
    /// asking again (one WAIT of up to a second each time) within the retry
    /// deadline, so a replica that is resyncing or briefly stalled delays
    /// the answer instead of failing it. Past the deadline the answer is
    /// `Unavailable`: the buyer retries with the same request_id and gets the
    /// same order once it is replicated.
    async fn ack(
        &self,
        bucket: &BucketHandle,
        request: RequestKey<'_>,
        expect: Expect,
    ) -> Result<(), PurchaseError> {
        if self.config().ack == Ack::Leader {
            return Ok(());
        }
        if planted!(SkipWait) {
            return Ok(());
        }
        let same_connection = || {
            if self.cluster().generation() == request.conn_gen {
                Ok(())
            } else {
                // The purchase's writes may have gone out on a connection
                // since replaced: a WAIT on the new one would not cover them.
                // The retry replays and waits on its own connection.
                Err(unconfirmed(
                    "the cluster connection was renewed mid-purchase; retry",
                ))
            }
        };
        same_connection()?;
        let started = Instant::now();
        let deadline = self.config().retry.deadline;
        // The request's record in this bucket: every write of the purchase
        // there leaves it, so its presence on the node that answers the WAIT
        // ties the WAIT to this purchase's writes (see `replication.rs`).
        let record = bucket.keys.request(request.user, request.request_id);
        loop {
            let why = match self
                .waits()
                .replicated(bucket.slot, &record, "", expect.clone())
                .await
            {
                Ok(true) => return same_connection(),
                Ok(false) => Unavailable::unconfirmed(
                    "no replica acknowledged the order, or its master no longer holds it",
                ),
                Err(e) => {
                    // The WAIT itself failed (a broken link): not a spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    e
                }
            };
            if started.elapsed() >= deadline {
                return Err(PurchaseError::Unavailable(why));
            }
            metrics::counter!(m::REDIS_RETRIES, "reason" => "replica_wait").increment(1);
        }
    }
}
