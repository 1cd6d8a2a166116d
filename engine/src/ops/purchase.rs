//! The hot path, top to bottom: validate, local sold-out flag, `purchase.lua`
//! in the buyer's home bucket (in that bucket's next batch, `batch.rs`),
//! decode the reply, answer. Only
//! when the home bucket is short does a purchase walk the other buckets
//! (`fall_through.rs`); a retry of a decided request is answered by
//! `replay.rs`. A request is (sku, user,
//! request_id); it makes at most one order, and a confirmed request answers
//! every retry with that order. No lock is held across an await; nothing from
//! the network is unwrapped.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::batch::HomeReply;
use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{InvalidInput, PurchaseError, Unavailable};
use crate::metrics as m;
use crate::order_id;
use crate::order_state::OrderState;
use crate::replication::Expect;
use crate::sale::BucketHandle;
use crate::scripts::purchase::{HomePurchase, PurchaseReply};
use crate::scripts::refusal::Refusal;
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
    /// The waiting room's admission token, for a sale that has a room.
    admission: Option<&'a str>,
}

impl<'a> CheckedPurchase<'a> {
    /// The request as it was given.
    pub fn request(&self) -> PurchaseRequest<'a> {
        self.req
    }

    /// The same request, carrying the admission token a sale with a
    /// waiting room asks for (from [`Engine::queue_status`]).
    pub fn with_admission(self, token: &'a str) -> Self {
        CheckedPurchase {
            admission: Some(token),
            ..self
        }
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

impl Engine {
    /// Whether an admission is used up by this decided purchase: a refusal
    /// ends it; a confirmation ends it once the user holds the per-user
    /// limit (with a limit above 1, a first purchase of 1 leaves them
    /// entitled to more, so their place stays counted). A failed read
    /// counts it used: the place frees when the window passes anyway.
    async fn admission_spent(
        &self,
        sale: &crate::sale::SaleHandle,
        user: &str,
        result: &Result<Confirmed, PurchaseError>,
    ) -> bool {
        if result.is_err() || sale.per_user_limit <= 1 {
            return true;
        }
        let home = &sale.buckets[sale.home_bucket(user)];
        let held: Result<Option<u64>, _> = self
            .cluster()
            .run_cmd(redis::cmd("GET").arg(home.keys.quota(user)))
            .await;
        match held {
            Ok(units) => units.unwrap_or(0) >= u64::from(sale.per_user_limit),
            Err(_) => true,
        }
    }
}

/// True when a purchase's answer is final for its admission: confirmed, or
/// refused by the sale (not an error the buyer should retry).
fn decided(result: &Result<Confirmed, PurchaseError>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => matches!(
            e,
            PurchaseError::SoldOut
                | PurchaseError::LimitExceeded { .. }
                | PurchaseError::Ended
                | PurchaseError::Closed
                | PurchaseError::OrderLost { .. }
        ),
    }
}

/// An answer the engine cannot give safely; the buyer retries.
pub(super) fn unconfirmed(why: impl Into<String>) -> PurchaseError {
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
    /// The buyer's home bucket, and the request's record key there, built
    /// once: the purchase, its acks and its settle all name that record.
    pub(crate) home: u32,
    pub(crate) home_record: &'a str,
}

impl<'a> RequestKey<'a> {
    /// The request in its home bucket `home`, whose record key there,
    /// `home_record`, the caller built once (`home.keys.request(user,
    /// request_id)`; checked in debug builds, so that a caller handing
    /// another bucket's or another request's key fails every test instead
    /// of settling against the wrong record).
    pub(crate) fn in_home(
        user: &'a str,
        request_id: &'a str,
        qty: u64,
        conn_gen: u64,
        home: &BucketHandle,
        home_record: &'a str,
    ) -> Self {
        debug_assert_eq!(home_record, home.keys.request(user, request_id));
        Self {
            user,
            request_id,
            qty,
            conn_gen,
            home: home.index,
            home_record,
        }
    }

    /// The request's record key in `bucket`: the one built, for the home
    /// bucket; made here for any other.
    pub(crate) fn record_in<'k>(&'k self, bucket: &BucketHandle) -> std::borrow::Cow<'k, str> {
        if bucket.index == self.home {
            std::borrow::Cow::Borrowed(self.home_record)
        } else {
            std::borrow::Cow::Owned(bucket.keys.request(self.user, self.request_id))
        }
    }
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
        Ok(CheckedPurchase {
            req,
            qty,
            admission: None,
        })
    }

    /// [`Engine::purchase`] on a sale with a waiting room: `admission_token`
    /// is what the user's ticket read once admitted. Without a valid one
    /// the answer is [`PurchaseError::NotAdmitted`] (none, a ticket, one
    /// past its window) or [`PurchaseError::InvalidTicket`] (forged,
    /// another sale's or user's), with no Redis trip; a retry of a request
    /// already decided, with the user's own token even past its window,
    /// gets its first answer. On a sale without a room the token is not
    /// looked at.
    pub async fn purchase_admitted(
        &self,
        req: PurchaseRequest<'_>,
        admission_token: &str,
    ) -> Result<Confirmed, PurchaseError> {
        let started = Instant::now();
        let result = match self.check(req) {
            Ok(checked) => {
                self.purchase_inner(checked.with_admission(admission_token))
                    .await
            }
            Err(e) => Err(e),
        };
        self.count_purchase(&result, started);
        result
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
        checked: CheckedPurchase<'_>,
    ) -> Result<Confirmed, PurchaseError> {
        let sale = self.sale(checked.req.sku).await?;
        let admitted = match self.check_admission(&sale, checked.req.user, checked.admission) {
            Ok(place) => place,
            Err(refused) => {
                // A retry, with its own admission past its window, of a
                // request Redis already decided gets its answer; anything
                // else stops here, having changed nothing and cost no
                // Redis trip.
                if !refused.expired {
                    return Err(refused.why);
                }
                let home = &sale.buckets[sale.home_bucket(checked.req.user)];
                let record = home.keys.request(checked.req.user, checked.req.request_id);
                if !self.request_seen(&record).await? {
                    return Err(refused.why);
                }
                None
            }
        };
        let result = self.purchase_in_sale(checked, &sale).await;
        if let Some(place) = admitted {
            if decided(&result) && self.admission_spent(&sale, checked.req.user, &result).await {
                self.admission_used(&sale.sku, checked.req.user, place)
                    .await;
            }
        }
        result
    }

    async fn purchase_in_sale(
        &self,
        CheckedPurchase { req, qty, .. }: CheckedPurchase<'_>,
        sale: &std::sync::Arc<crate::sale::SaleHandle>,
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

        let request = RequestKey::in_home(
            req.user,
            req.request_id,
            u64::from(qty),
            self.cluster().generation(),
            home,
            &record_key,
        );
        let nonce = order_id::new_nonce();
        let order_id = order_id::compose(&sale.sku, home.index, &nonce);
        let order_key = (sale.hold_ms > 0).then(|| home.keys.order(&order_id));
        let HomeReply { reply, replicated } =
            self.buy_in_home(home, request, order_id, order_key).await?;
        match reply {
            PurchaseReply::Confirmed {
                order_id,
                bucket,
                expires_ms,
            } => {
                // Under `leader` nothing waits: no order id is copied for a
                // WAIT that will not run.
                if !replicated && cfg.ack != Ack::Leader {
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
                    .confirm_replay(sale, home, request, order_id, bucket, replicated)
                    .await?;
                self.replayed(sale, order_id, bucket).await
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
                self.fall_through(sale, home, request, &nonce, home_stock, since_ms)
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
        order_id: String,
        order_key: Option<String>,
    ) -> Result<HomeReply, PurchaseError> {
        // Owned: the purchase goes to the bucket's sender task.
        let purchase = HomePurchase {
            quota_key: home.keys.quota(request.user),
            record_key: request.home_record.to_owned(),
            order_key,
            qty: request.qty,
            order_id,
            user: request.user.to_owned(),
        };
        Ok(self.batches().purchase(&home.queue, purchase).await?)
    }

    /// True when Redis holds a record of this request (any outcome).
    async fn request_seen(&self, record_key: &str) -> Result<bool, PurchaseError> {
        let rec: Option<Vec<u8>> = self
            .cluster()
            .run_cmd(redis::cmd("GET").arg(record_key))
            .await?;
        Ok(rec.is_some())
    }

    /// With `ack = replicated`, waits for one replica before confirming,
    /// asking again (one WAIT of up to a second each time) within the retry
    /// deadline, so a replica that is resyncing or briefly stalled delays
    /// the answer instead of failing it. Past the deadline the answer is
    /// `Unavailable`: the buyer retries with the same request_id and gets the
    /// same order once it is replicated.
    pub(super) async fn ack(
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
        let record = request.record_in(bucket);
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
