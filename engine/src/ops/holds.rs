//! Orders that wait for payment. A sale with `hold_ms > 0` confirms a
//! purchase as a *held* order; the shop then pays it ([`Engine::pay`]) or
//! cancels it ([`Engine::cancel`]), or its deadline passes and the hold
//! sweeper expires it ([`Engine::expire_due`]). Cancelled and expired units
//! go back on sale, and to the buyer's quota, once. Every transition is one
//! compare-and-set in the order's bucket (`lua/transition.lua`), appended to
//! the bucket's stream in the same step, so the order writer persists it; any
//! number of callers and sweepers may race, the order's state decides.
//!
//! ```text
//!            pay                     cancel
//!   paid <-------- held ----------------------> cancelled
//!    ^              |                               |
//!    |              | deadline (sweeper, or a       |
//!    |              v  payment that came too late)  |
//!    +-------- expired <----------------------------+
//!     late payment, late_payment = "retake",
//!     a unit left (from expired or cancelled)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::ScriptCall;
use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{HoldError, InvalidInput, PurchaseError, Unavailable};
use crate::metrics as m;
use crate::order_id;
use crate::order_state::{OrderState, OrderView, Transition};
use crate::sale::{BucketHandle, SaleHandle};
use crate::scripts::transition::{self, TransitionArgs, TransitionKeys, TransitionReply};
use crate::validate;

/// Longest payment reference accepted.
pub const MAX_PAYMENT_REF: usize = 128;

/// An order id checked and resolved to its sale and bucket.
struct Located {
    sale: Arc<SaleHandle>,
    bucket: usize,
}

impl Located {
    fn bucket(&self) -> &BucketHandle {
        &self.sale.buckets[self.bucket]
    }
}

impl Engine {
    /// Pays the held order `order_id` under the shop's `payment_ref`. A retry
    /// with the same reference answers the same; another reference on a paid
    /// order is [`HoldError::PaymentConflict`]; a payment after the hold
    /// ended is [`HoldError::HoldExpired`] (or, under `late_payment =
    /// "retake"`, takes a unit again if one is left).
    pub async fn pay(&self, order_id: &str, payment_ref: &str) -> Result<Transition, HoldError> {
        check_payment_ref(payment_ref)?;
        let result = self.transition_one(order_id, "pay", payment_ref).await;
        if let Ok(t) = &result {
            if t.retaken && !t.replayed {
                metrics::counter!(m::LATE_PAYMENTS, "result" => "retaken").increment(1);
            }
        }
        if let Err(HoldError::HoldExpired { .. }) = &result {
            metrics::counter!(m::LATE_PAYMENTS, "result" => "refused").increment(1);
        }
        result
    }

    /// Cancels the held order `order_id`: its units go back on sale and to
    /// the buyer's quota, once. A retry answers the same; a cancel of a paid
    /// or expired order is [`HoldError::AlreadyFinal`].
    pub async fn cancel(&self, order_id: &str) -> Result<Transition, HoldError> {
        self.transition_one(order_id, "cancel", "").await
    }

    /// The held order `order_id` as its bucket has it now.
    pub async fn order(&self, order_id: &str) -> Result<OrderView, HoldError> {
        let at = self.locate(order_id).await?;
        let b = at.bucket();
        let fields: Vec<Option<String>> = self
            .cluster()
            .run_cmd(
                redis::cmd("HMGET")
                    .arg(b.keys.order(order_id))
                    .arg("state")
                    .arg("user")
                    .arg("qty")
                    .arg("expires_ms"),
            )
            .await?;
        let field = |i: usize| fields.get(i).cloned().flatten();
        let Some(state) = field(0) else {
            return Err(HoldError::UnknownOrder(order_id.to_owned()));
        };
        let unreadable = || {
            HoldError::Unavailable(Unavailable::unconfirmed(format!(
                "order {order_id}: its record is unreadable"
            )))
        };
        Ok(OrderView {
            order_id: order_id.to_owned(),
            sku: at.sale.sku.clone(),
            user: field(1).ok_or_else(unreadable)?,
            qty: field(2)
                .and_then(|q| q.parse().ok())
                .ok_or_else(unreadable)?,
            state: OrderState::parse(&state).ok_or_else(unreadable)?,
            expires_at_ms: field(3)
                .and_then(|e| e.parse().ok())
                .ok_or_else(unreadable)?,
        })
    }

    /// One pay or cancel, with its metrics and its follow-ups: the local
    /// sold-out flag cleared and owed quotas given back when units came
    /// back.
    async fn transition_one(
        &self,
        order_id: &str,
        op: &'static str,
        payment_ref: &str,
    ) -> Result<Transition, HoldError> {
        let at = self.locate(order_id).await?;
        let b = at.bucket();
        let reply = self
            .transition(b, op, &[(order_id, payment_ref)])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Unavailable::unconfirmed("transition.lua answered no order"))?;
        let done = |state, expires_at_ms, replayed, retaken| Transition {
            order_id: order_id.to_owned(),
            state,
            expires_at_ms,
            replayed,
            retaken,
        };
        // What this call gave back to stock (a retake: took, negative).
        let (units, state) = match &reply {
            TransitionReply::Done { units, state, .. }
            | TransitionReply::HoldEnded { units, state }
            | TransitionReply::AlreadyFinal { units, state } => (*units, *state),
            _ => (0, OrderState::Held),
        };
        if units > 0 {
            metrics::counter!(m::UNITS_RETURNED, "how" => state.as_str()).increment(units as u64);
            at.sale.clear_sold_out();
            if at.sale.per_user_limit > 0 && at.sale.buckets.len() > 1 {
                // The transition is done whatever happens here: a quota
                // not given back now is given back by the sweeper's next
                // pass (the order stays on the owed set until it is).
                if let Err(e) = self.return_owed_quotas(&at.sale, b).await {
                    tracing::warn!(order_id, error = %e, "owed quota left to the sweeper");
                }
            }
        }
        let result = match reply {
            TransitionReply::Done {
                state,
                expires_ms,
                retaken,
                ..
            } => Ok(done(state, expires_ms, false, retaken)),
            TransitionReply::Already { state, expires_ms } => {
                Ok(done(state, expires_ms, true, false))
            }
            TransitionReply::UnknownOrder => Err(HoldError::UnknownOrder(order_id.to_owned())),
            TransitionReply::HoldEnded { state, .. } => Err(HoldError::HoldExpired { state }),
            TransitionReply::AlreadyFinal { state, .. } => Err(HoldError::AlreadyFinal { state }),
            TransitionReply::PaymentConflict => Err(HoldError::PaymentConflict),
            TransitionReply::UnknownSale => Err(HoldError::UnknownOrder(order_id.to_owned())),
            other => Err(HoldError::Unavailable(Unavailable::unconfirmed(format!(
                "transition.lua answered a {op} with {other:?}"
            )))),
        };
        let label = match &result {
            Ok(t) if t.replayed => "replayed",
            Ok(t) => t.state.as_str(),
            Err(e) => e.code(),
        };
        metrics::counter!(m::HOLD_TRANSITIONS, "op" => op, "result" => label).increment(1);
        result
    }

    /// Checks an order id and finds its sale and bucket.
    async fn locate(&self, order_id: &str) -> Result<Located, HoldError> {
        let route = order_id::route(order_id).map_err(HoldError::Invalid)?;
        let sale = match self.sale(route.sku).await {
            Ok(s) => s,
            Err(PurchaseError::UnknownSale(_)) => {
                return Err(HoldError::UnknownOrder(order_id.to_owned()))
            }
            Err(PurchaseError::Unavailable(u)) => return Err(HoldError::Unavailable(u)),
            Err(e) => {
                return Err(HoldError::Unavailable(Unavailable::unconfirmed(
                    e.to_string(),
                )))
            }
        };
        let bucket = route.bucket as usize;
        if bucket >= sale.buckets.len() {
            return Err(HoldError::UnknownOrder(order_id.to_owned()));
        }
        if sale.hold_ms == 0 {
            return Err(HoldError::NoHolds(sale.sku.clone()));
        }
        Ok(Located { sale, bucket })
    }

    /// One `transition.lua` call on bucket `b` for `orders` (id, payment
    /// reference). Under `ack = replicated` the answer counts only once a
    /// replica has the call's writes: the WAIT goes in the same pipeline,
    /// and a call no replica acknowledged is sent again (every transition
    /// answers its retry the same, rewriting its record so the new call
    /// propagates) until the retry deadline.
    pub(crate) async fn transition(
        &self,
        b: &BucketHandle,
        op: &'static str,
        orders: &[(&str, &str)],
    ) -> Result<Vec<TransitionReply>, HoldError> {
        let order_keys: Vec<String> = orders.iter().map(|(id, _)| b.keys.order(id)).collect();
        let each: Vec<(&str, &str, &str)> = order_keys
            .iter()
            .zip(orders)
            .map(|(key, (id, payment_ref))| (key.as_str(), *id, *payment_ref))
            .collect();
        let bucket = TransitionKeys {
            sale: &b.keys.sale,
            stock: &b.keys.stock,
            orders: &b.keys.orders,
            holds: &b.keys.holds,
            owed: &b.keys.owed,
        };
        let args = TransitionArgs {
            op,
            record_ttl_secs: self.config().request_ttl_secs(),
            replicated: self.config().replicated_flag(),
        };
        let call = args.call(&self.scripts().transition, b.slot, &bucket, &each);
        let replies = self.call_acked(&call, transition::decode_batch).await?;
        if replies.len() == orders.len() {
            Ok(replies)
        } else {
            Err(HoldError::Unavailable(Unavailable::unconfirmed(format!(
                "transition.lua answered {} of {} orders",
                replies.len(),
                orders.len()
            ))))
        }
    }

    /// A hold script call whose answer counts only once it is safe: under
    /// `ack = leader` as soon as the master answers; under `ack =
    /// replicated` once a replica has the call's writes (the WAIT goes in
    /// the same pipeline). A call no replica acknowledged is sent again
    /// until the retry deadline: every hold script answers its retry the
    /// same and, under `replicated`, writes (unchanged) what its answer
    /// rests on, so the new call's WAIT covers the first call's writes.
    pub(crate) async fn call_acked<R>(
        &self,
        call: &ScriptCall<'_>,
        decode: fn(redis::Value) -> Result<R, crate::lua::BadReply>,
    ) -> Result<R, HoldError> {
        if self.config().ack == Ack::Leader {
            return Ok(self
                .cluster()
                .call(call, decode)
                .await
                .map_err(Unavailable::from)?);
        }
        let started = Instant::now();
        // The answer is the first call's: a call sent again is a replay of
        // it (`replayed`, no units), sent only so that its WAIT covers the
        // first call's writes. Answering the replay's reply would report a
        // first payment as replayed and a retake as none.
        let mut first: Option<R> = None;
        loop {
            match self.cluster().call_then_wait(call, decode, 1000).await {
                Some((reply, true)) => return Ok(first.unwrap_or(reply)),
                Some((reply, false)) => {
                    first.get_or_insert(reply);
                }
                None => {
                    // Not a clean reply (NOSCRIPT, a redirect, a broken
                    // link): the ordinary call reloads and retries; its
                    // writes are covered by the next round's WAIT.
                    let reply = self
                        .cluster()
                        .call(call, decode)
                        .await
                        .map_err(Unavailable::from)?;
                    first.get_or_insert(reply);
                }
            }
            if started.elapsed() >= self.config().retry.deadline {
                return Err(HoldError::Unavailable(Unavailable::unconfirmed(
                    "no replica acknowledged the change in time; retry",
                )));
            }
            metrics::counter!(m::REDIS_RETRIES, "reason" => "replica_wait").increment(1);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Wall-clock ms, the clock of hold deadlines (set by the masters' TIME;
/// the scripts check again by theirs, so a skewed clock here only delays or
/// retries an expiry).
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A payment reference: 1..=128 bytes, printable, no spaces.
fn check_payment_ref(r: &str) -> Result<(), HoldError> {
    if r.len() > MAX_PAYMENT_REF {
        return Err(HoldError::Invalid(InvalidInput::TooLong {
            field: "payment_ref",
            len: r.len(),
            max: MAX_PAYMENT_REF,
        }));
    }
    validate::id("payment_ref", r).map_err(HoldError::Invalid)
}
