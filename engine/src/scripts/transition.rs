//! `lua/transition.lua`, held orders of one bucket paid, cancelled or
//! expired: its text, its reply codes, the reply decoded, and its call
//! built from named keys and arguments (the script's header says the same,
//! in the same order).

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{array, bad, int, text, BadReply, LuaScript};
use crate::order_state::OrderState;

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/transition.lua");

/// Done now.
pub const DONE: i64 = 1;
/// Done before by the same call.
pub const ALREADY: i64 = 2;
/// A late payment took a unit again.
pub const RETAKEN: i64 = 3;
/// Expire: the order is not held.
pub const NOT_HELD: i64 = 0;
/// No such order.
pub const UNKNOWN_ORDER: i64 = -1;
/// Pay: the hold ended.
pub const HOLD_ENDED: i64 = -2;
/// Cancel: already final.
pub const ALREADY_FINAL: i64 = -3;
/// Pay: paid before with another reference.
pub const PAYMENT_CONFLICT: i64 = -4;
/// Expire: not due yet.
pub const NOT_DUE: i64 = -5;
/// No such sale in the bucket.
pub const UNKNOWN_SALE: i64 = -6;
/// Arguments refused.
pub const BAD_ARGS: i64 = -7;

/// What `transition.lua` said of one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransitionReply {
    /// The order moved now (`retaken`: a late payment took a unit again).
    Done {
        /// Its state now.
        state: OrderState,
        /// When its hold expired or expires (ms).
        expires_ms: u64,
        /// A late payment retook a unit.
        retaken: bool,
        /// Units this call gave back to stock (a retake: minus those it took).
        units: i64,
    },
    /// The same transition happened before: the same answer.
    Already {
        /// Its state.
        state: OrderState,
        /// Its deadline (ms).
        expires_ms: u64,
    },
    /// Expire: the order is not held; nothing to do.
    NotHeld,
    /// No such order in the bucket.
    UnknownOrder,
    /// Pay: the hold ended before the payment.
    HoldEnded {
        /// `expired` or `cancelled`.
        state: OrderState,
        /// Units this call gave back (the payment found the hold past its
        /// deadline and expired it); 0 when it had ended before.
        units: i64,
    },
    /// Cancel: the order is already final.
    AlreadyFinal {
        /// Its state.
        state: OrderState,
        /// Units this call gave back (past the deadline: it expired).
        units: i64,
    },
    /// Pay: paid before under another payment reference.
    PaymentConflict,
    /// Expire: its deadline has not come.
    NotDue,
    /// No sale in the bucket.
    UnknownSale,
    /// The engine sent an argument out of range.
    BadArgs,
}

/// Decodes the reply of `transition.lua`: one per order, in the order sent.
pub(crate) fn decode_batch(v: Value) -> Result<Vec<TransitionReply>, BadReply> {
    match v {
        Value::Array(items) => items.into_iter().map(decode).collect(),
        other => Err(bad("transition", format!("{other:?}"))),
    }
}

fn decode(v: Value) -> Result<TransitionReply, BadReply> {
    const S: &str = "transition";
    let items = array(S, v, 4)?;
    let c0 = int(S, &items[0])?;
    let units = int(S, &items[3])?;
    let state_text = text(S, &items[1])?;
    let expires_ms =
        u64::try_from(int(S, &items[2])?).map_err(|_| bad(S, "negative expires_ms"))?;
    let state =
        || OrderState::parse(&state_text).ok_or_else(|| bad(S, format!("state {state_text:?}")));
    Ok(match c0 {
        DONE | RETAKEN => TransitionReply::Done {
            state: state()?,
            expires_ms,
            // A late payment that found its hold past the deadline but
            // not yet swept keeps the unit it has (code 3, units 0): only
            // one that took units back from stock retook.
            retaken: c0 == RETAKEN && units < 0,
            units,
        },
        ALREADY => TransitionReply::Already {
            state: state()?,
            expires_ms,
        },
        NOT_HELD => TransitionReply::NotHeld,
        UNKNOWN_ORDER => TransitionReply::UnknownOrder,
        HOLD_ENDED => TransitionReply::HoldEnded {
            state: state()?,
            units,
        },
        ALREADY_FINAL => TransitionReply::AlreadyFinal {
            state: state()?,
            units,
        },
        PAYMENT_CONFLICT => TransitionReply::PaymentConflict,
        NOT_DUE => TransitionReply::NotDue,
        UNKNOWN_SALE => TransitionReply::UnknownSale,
        BAD_ARGS => TransitionReply::BadArgs,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// The bucket's own KEYS[1..5], in the header's order.
pub(crate) struct TransitionKeys<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    pub(crate) orders: &'a str,
    pub(crate) holds: &'a str,
    pub(crate) owed: &'a str,
}

/// ARGV[1..3], shared by every order of the call.
pub(crate) struct TransitionArgs {
    /// "pay", "cancel" or "expire".
    pub(crate) op: &'static str,
    pub(crate) record_ttl_secs: u64,
    /// "1" when the engine waits for a replica (`Config::replicated_flag`).
    pub(crate) replicated: &'static str,
}

impl TransitionArgs {
    /// The `EVALSHA` of `script` (this build's transition.lua) in `slot`
    /// for `orders`, each its order key, order id and payment reference
    /// ("" unless paying).
    pub(crate) fn call<'s>(
        &self,
        script: &'s LuaScript,
        slot: u16,
        bucket: &TransitionKeys<'_>,
        orders: &[(&str, &str, &str)],
    ) -> ScriptCall<'s> {
        let mut keys = Vec::with_capacity(5 + orders.len());
        keys.extend([
            bucket.sale,
            bucket.stock,
            bucket.orders,
            bucket.holds,
            bucket.owed,
        ]);
        keys.extend(orders.iter().map(|(key, _, _)| *key));
        let mut call = ScriptCall::new(script, slot, &keys);
        call.arg(self.op)
            .arg(self.record_ttl_secs)
            .arg(self.replicated);
        for (_, id, payment_ref) in orders {
            call.arg(*id).arg(*payment_ref);
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::order_reply_value as reply;

    #[test]
    fn every_transition_reply_shape_decodes_and_unknown_ones_are_refused() {
        let r = |code: i64, state: &str, exp: i64| {
            let Value::Array(mut items) = reply(code, state, exp) else {
                unreachable!()
            };
            items.push(Value::Int(if code == 3 { -1 } else { 0 }));
            Value::Array(vec![Value::Array(items)])
        };
        assert_eq!(
            decode_batch(r(1, "paid", 5)),
            Ok(vec![TransitionReply::Done {
                state: OrderState::Paid,
                expires_ms: 5,
                retaken: false,
                units: 0,
            }])
        );
        assert_eq!(
            decode_batch(r(3, "paid", 5)),
            Ok(vec![TransitionReply::Done {
                state: OrderState::Paid,
                expires_ms: 5,
                retaken: true,
                units: -1,
            }])
        );
        assert_eq!(
            decode_batch(r(-2, "expired", 5)),
            Ok(vec![TransitionReply::HoldEnded {
                state: OrderState::Expired,
                units: 0,
            }])
        );
        assert_eq!(
            decode_batch(r(-1, "", 0)),
            Ok(vec![TransitionReply::UnknownOrder])
        );
        assert!(decode_batch(r(1, "sold", 5)).is_err(), "unknown state");
        assert!(decode_batch(r(9, "paid", 5)).is_err(), "unknown code");
        assert!(decode_batch(r(1, "paid", -5)).is_err(), "negative deadline");
    }
}
