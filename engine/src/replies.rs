//! Script replies, decoded once. Each Lua script answers with a small array
//! whose first element is a code; what the codes mean is written in the
//! script's header and, on the Rust side, only here: one enum per script and
//! one function that turns a `redis::Value` into it. Everything above works
//! with the enums and never with bare integers. Nothing here does I/O.
//! The lock nodes' replies are the lock module's (`lock/scripts.rs`).
//! Being moved, one script at a time, into a file per script under
//! `scripts/` (text, codes, reply, decoder and a typed call together):
//! take.lua and settle.lua are there.

use redis::Value;

use crate::lua::array;
pub use crate::lua::BadReply;
use crate::lua::{bad, int, text};
use crate::order_state::OrderState;
use crate::scripts;

/// `restock.lua`, one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestockReply {
    /// Applied now.
    Applied,
    /// Applied before by this operation; nothing changed.
    AlreadyApplied,
    /// The sale is closed.
    Closed,
    /// No such bucket.
    UnknownSale,
    /// Units out of range.
    BadArgs,
    /// The operation id was used with other units.
    Mismatch {
        /// Units of the first use.
        units: i64,
    },
    /// The bucket would pass 2^53-1 units.
    TooLarge,
}

/// `create_meta.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateMetaReply {
    /// This operation claimed the SKU now.
    Claimed,
    /// This operation claimed it before (a retry); `created` tells whether
    /// that create finished.
    Resumed {
        /// Every bucket exists and the sale is indexed.
        created: bool,
    },
    /// Another operation claimed it.
    Taken {
        /// Whether that create finished.
        created: bool,
    },
    /// This operation claimed it before with another plan.
    Mismatch,
}

/// `create_bucket.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateBucketReply {
    /// The bucket was created now (code 1).
    Created,
    /// It existed; nothing changed (code 0).
    Existed,
}

// Only reconcile (the postgres feature) reads a ledger.
#[cfg(feature = "postgres")]
/// `ledger_snapshot.lua`: one bucket's ledger at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// Every unit ever put in the bucket.
    pub initial: u64,
    /// Units left.
    pub stock: i64,
    /// The stream's last generated id, as (ms, seq): unsigned 64-bit, as
    /// Redis has them.
    pub last_id: (u64, u64),
}

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
pub fn transition_batch(v: Value) -> Result<Vec<TransitionReply>, BadReply> {
    match v {
        Value::Array(items) => items.into_iter().map(transition).collect(),
        other => Err(bad("transition", format!("{other:?}"))),
    }
}

fn transition(v: Value) -> Result<TransitionReply, BadReply> {
    const S: &str = "transition";
    let items = array(S, v, 4)?;
    let code = int(S, &items[0])?;
    let units = int(S, &items[3])?;
    let state_text = text(S, &items[1])?;
    let expires_ms =
        u64::try_from(int(S, &items[2])?).map_err(|_| bad(S, "negative expires_ms"))?;
    let state =
        || OrderState::parse(&state_text).ok_or_else(|| bad(S, format!("state {state_text:?}")));
    use scripts::transition as code;
    Ok(match code {
        code::DONE | code::RETAKEN => TransitionReply::Done {
            state: state()?,
            expires_ms,
            // A late payment that found its hold past the deadline but
            // not yet swept keeps the unit it has (code 3, units 0): only
            // one that took units back from stock retook.
            retaken: code == code::RETAKEN && units < 0,
            units,
        },
        code::ALREADY => TransitionReply::Already {
            state: state()?,
            expires_ms,
        },
        code::NOT_HELD => TransitionReply::NotHeld,
        code::UNKNOWN_ORDER => TransitionReply::UnknownOrder,
        code::HOLD_ENDED => TransitionReply::HoldEnded {
            state: state()?,
            units,
        },
        code::ALREADY_FINAL => TransitionReply::AlreadyFinal {
            state: state()?,
            units,
        },
        code::PAYMENT_CONFLICT => TransitionReply::PaymentConflict,
        code::NOT_DUE => TransitionReply::NotDue,
        code::UNKNOWN_SALE => TransitionReply::UnknownSale,
        code::BAD_ARGS => TransitionReply::BadArgs,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// Decodes a `quota_return.lua` reply: true when given back now.
pub fn quota_return(v: Value) -> Result<bool, BadReply> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(bad("quota_return", format!("{other:?}"))),
    }
}

/// Decodes a `restock.lua` reply.
pub fn restock(v: Value) -> Result<RestockReply, BadReply> {
    const S: &str = "restock";
    let items = array(S, v, 2)?;
    let (code, n) = (int(S, &items[0])?, int(S, &items[1])?);
    use scripts::restock as code;
    Ok(match code {
        code::APPLIED => RestockReply::Applied,
        code::ALREADY_APPLIED => RestockReply::AlreadyApplied,
        code::CLOSED => RestockReply::Closed,
        code::UNKNOWN_SALE => RestockReply::UnknownSale,
        code::BAD_ARGS => RestockReply::BadArgs,
        code::MISMATCH => RestockReply::Mismatch { units: n },
        code::TOO_LARGE => RestockReply::TooLarge,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// Decodes a `create_meta.lua` reply.
pub fn create_meta(v: Value) -> Result<CreateMetaReply, BadReply> {
    const S: &str = "create_meta";
    let items = array(S, v, 3)?;
    let created = text(S, &items[2])? == "1";
    use scripts::create_meta as code;
    Ok(match int(S, &items[0])? {
        code::CLAIMED => CreateMetaReply::Claimed,
        code::RESUMED => CreateMetaReply::Resumed { created },
        code::TAKEN => CreateMetaReply::Taken { created },
        code::MISMATCH => CreateMetaReply::Mismatch,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// Decodes a `create_bucket.lua` reply.
pub fn created_bucket(v: Value) -> Result<CreateBucketReply, BadReply> {
    const S: &str = "create_bucket";
    match int(S, &v)? {
        scripts::create_bucket::CREATED => Ok(CreateBucketReply::Created),
        scripts::create_bucket::EXISTED => Ok(CreateBucketReply::Existed),
        c => Err(bad(S, format!("code {c}"))),
    }
}

#[cfg(feature = "postgres")]
/// Decodes a `ledger_snapshot.lua` reply.
pub fn ledger_snapshot(v: Value) -> Result<LedgerSnapshot, BadReply> {
    const S: &str = "ledger_snapshot";
    let items = array(S, v, 3)?;
    let initial = int(S, &items[0])?.max(0) as u64;
    let stock = int(S, &items[1])?;
    let last = text(S, &items[2])?;
    let last_id = last
        .split_once('-')
        .and_then(|(ms, seq)| Some((ms.parse().ok()?, seq.parse().ok()?)))
        .ok_or_else(|| bad(S, format!("stream id {last:?}")))?;
    Ok(LedgerSnapshot {
        initial,
        stock,
        last_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::order_reply_value as reply;

    #[test]
    fn every_create_bucket_and_ledger_reply_shape_decodes() {
        assert_eq!(
            created_bucket(Value::Int(1)),
            Ok(CreateBucketReply::Created)
        );
        assert_eq!(
            created_bucket(Value::Int(0)),
            Ok(CreateBucketReply::Existed)
        );
        assert!(created_bucket(Value::Int(7)).is_err());
        assert!(created_bucket(Value::Nil).is_err());
        let snap = |last: &str| {
            Value::Array(vec![
                Value::Int(10),
                Value::Int(-2),
                Value::BulkString(last.as_bytes().to_vec()),
            ])
        };
        assert_eq!(
            ledger_snapshot(snap("17-3")),
            Ok(LedgerSnapshot {
                initial: 10,
                stock: -2,
                last_id: (17, 3)
            })
        );
        assert!(ledger_snapshot(snap("17")).is_err());
        assert!(ledger_snapshot(snap("a-b")).is_err());
        assert!(ledger_snapshot(Value::Array(vec![Value::Int(1)])).is_err());
    }

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
            transition_batch(r(1, "paid", 5)),
            Ok(vec![TransitionReply::Done {
                state: OrderState::Paid,
                expires_ms: 5,
                retaken: false,
                units: 0,
            }])
        );
        assert_eq!(
            transition_batch(r(3, "paid", 5)),
            Ok(vec![TransitionReply::Done {
                state: OrderState::Paid,
                expires_ms: 5,
                retaken: true,
                units: -1,
            }])
        );
        assert_eq!(
            transition_batch(r(-2, "expired", 5)),
            Ok(vec![TransitionReply::HoldEnded {
                state: OrderState::Expired,
                units: 0,
            }])
        );
        assert_eq!(
            transition_batch(r(-1, "", 0)),
            Ok(vec![TransitionReply::UnknownOrder])
        );
        assert!(transition_batch(r(1, "sold", 5)).is_err(), "unknown state");
        assert!(transition_batch(r(9, "paid", 5)).is_err(), "unknown code");
        assert!(
            transition_batch(r(1, "paid", -5)).is_err(),
            "negative deadline"
        );
        assert_eq!(quota_return(Value::Int(1)), Ok(true));
        assert!(quota_return(Value::Int(-7)).is_err());
    }

    #[test]
    fn restock_and_create_replies_decode() {
        let v = |a: i64, b: i64| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(restock(v(1, 10)), Ok(RestockReply::Applied));
        assert_eq!(restock(v(2, 5)), Ok(RestockReply::AlreadyApplied));
        assert_eq!(restock(v(-5, 0)), Ok(RestockReply::Closed));
        assert_eq!(restock(v(-6, 0)), Ok(RestockReply::UnknownSale));
        assert_eq!(restock(v(-7, 0)), Ok(RestockReply::BadArgs));
        assert_eq!(restock(v(-8, 4)), Ok(RestockReply::Mismatch { units: 4 }));
        assert_eq!(restock(v(-9, 0)), Ok(RestockReply::TooLarge));
        assert!(restock(v(0, 0)).is_err());
        assert!(
            restock(Value::Int(3)).is_err(),
            "the old bare-integer reply"
        );
        let c = |code: i64, created: &str| {
            Value::Array(vec![
                Value::Int(code),
                Value::BulkString(b"op".to_vec()),
                Value::BulkString(created.into()),
            ])
        };
        assert_eq!(create_meta(c(1, "0")), Ok(CreateMetaReply::Claimed));
        assert_eq!(
            create_meta(c(2, "1")),
            Ok(CreateMetaReply::Resumed { created: true })
        );
        assert_eq!(
            create_meta(c(3, "0")),
            Ok(CreateMetaReply::Taken { created: false })
        );
        assert_eq!(create_meta(c(4, "1")), Ok(CreateMetaReply::Mismatch));
        assert!(create_meta(c(5, "0")).is_err());
    }
}
