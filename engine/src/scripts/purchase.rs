//! `lua/purchase.lua`, a batch of whole purchases in their buyers' home
//! bucket: its text, its reply codes, the reply decoded, and its call
//! built from the bucket's keys and each purchase's named fields (the
//! script's header says the same, in the same order).

use redis::Value;

use super::call::ScriptCall;
use super::refusal::Refusal;
use crate::lua::{bad, bucket, int, order_reply, text, BadReply, LuaScript};

/// The script's text (a planted build may rewrite it: the registry in
/// `scripts/mod.rs` asks `lua::code`).
pub(crate) const SOURCE: &str = include_str!("../../../lua/purchase.lua");

/// Confirmed now.
pub const CONFIRMED: i64 = 1;
/// Confirmed before; this is the replay.
pub const REPLAYED: i64 = 2;
/// Home bucket short: reserved, walk the others.
pub const FALL_THROUGH: i64 = 3;
/// Already pending from an earlier attempt: walk again.
pub const PENDING: i64 = 4;
/// Past the per-user limit.
pub const LIMIT_REACHED: i64 = -2;
/// Window not open yet.
pub const NOT_STARTED: i64 = -3;
/// No such sale.
pub const UNKNOWN_SALE: i64 = -6;
/// Arguments refused.
pub const BAD_ARGS: i64 = -7;
/// The request id was used with another qty.
pub const MISMATCH: i64 = -8;

/// `purchase.lua`, in the buyer's home bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseReply {
    /// A new order, queued on the bucket's stream.
    Confirmed {
        /// The order.
        order_id: String,
        /// The bucket that took the stock.
        bucket: u32,
        /// When its hold expires (ms, Redis time); `None`: paid at once.
        expires_ms: Option<u64>,
    },
    /// This request was confirmed before: the same order.
    Replayed {
        /// The order.
        order_id: String,
        /// The bucket that took the stock.
        bucket: u32,
    },
    /// The home bucket is short: quota reserved, request pending; walk the
    /// other buckets.
    FallThrough {
        /// Units left in the home bucket.
        home_stock: i64,
        /// When the walk began (ms, the home master's clock): its limit
        /// counts from here (see `take.lua`).
        since_ms: u64,
    },
    /// An earlier attempt left this request pending: walk the other buckets.
    Pending {
        /// Units left in the home bucket.
        home_stock: i64,
        /// When the first attempt's walk began (0 if no longer known: a
        /// walk past its limit).
        since_ms: u64,
    },
    /// Refused: sold out (a one-bucket sale, or every bucket refused this
    /// request before), ended or closed.
    Refused {
        /// Why.
        why: Refusal,
        /// Units left in the home bucket.
        home_stock: i64,
    },
    /// The per-user limit would be exceeded.
    LimitReached {
        /// Units the user holds or has reserved.
        used: i64,
    },
    /// The sale's window has not opened.
    NotStarted,
    /// No sale in this bucket.
    UnknownSale,
    /// The engine sent an argument out of range (a bug, not the buyer's).
    BadArgs,
    /// The request was made before with another qty.
    Mismatch,
}

/// Decodes a `purchase.lua` reply.
pub(crate) fn decode(v: Value) -> Result<PurchaseReply, BadReply> {
    const S: &str = "purchase";
    let (items, expires_ms) = order_reply(S, v)?;
    let (c0, n) = (int(S, &items[0])?, int(S, &items[2])?);
    Ok(match c0 {
        CONFIRMED => PurchaseReply::Confirmed {
            order_id: text(S, &items[1])?,
            bucket: bucket(S, n)?,
            expires_ms,
        },
        REPLAYED => PurchaseReply::Replayed {
            order_id: text(S, &items[1])?,
            bucket: bucket(S, n)?,
        },
        // Their fourth item is the walk's start, not a deadline.
        FALL_THROUGH => PurchaseReply::FallThrough {
            home_stock: n,
            since_ms: expires_ms.unwrap_or(0),
        },
        PENDING => PurchaseReply::Pending {
            home_stock: n,
            since_ms: expires_ms.unwrap_or(0),
        },
        LIMIT_REACHED => PurchaseReply::LimitReached { used: n },
        NOT_STARTED => PurchaseReply::NotStarted,
        UNKNOWN_SALE => PurchaseReply::UnknownSale,
        BAD_ARGS => PurchaseReply::BadArgs,
        MISMATCH => PurchaseReply::Mismatch,
        c => match Refusal::from_code(c) {
            Some(why) => PurchaseReply::Refused { why, home_stock: n },
            None => return Err(bad(S, format!("code {c}"))),
        },
    })
}

/// Decodes the reply of a batch of `purchase.lua`: one reply per purchase,
/// in the order sent (the caller checks the count against its batch).
pub(crate) fn decode_batch(v: Value) -> Result<Vec<PurchaseReply>, BadReply> {
    match v {
        Value::Array(items) => items.into_iter().map(decode).collect(),
        other => Err(bad(
            "purchase",
            format!("expected one reply per purchase, got {other:?}"),
        )),
    }
}

/// One purchase of a batch: its keys and arguments.
pub(crate) struct HomePurchase {
    /// `{tag}:q:<user>`.
    pub(crate) quota_key: String,
    /// `{tag}:r:<n>:<user>:<request_id>`.
    pub(crate) record_key: String,
    /// `{tag}:o:<order_id>`, when the sale holds orders (`hold_ms > 0`).
    pub(crate) order_key: Option<String>,
    pub(crate) qty: u64,
    /// The order id to use if this purchase makes a new order.
    pub(crate) order_id: String,
    pub(crate) user: String,
}

/// The bucket's own KEYS[1..5], in the header's order.
pub(crate) struct HomeBucketKeys<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    pub(crate) orders: &'a str,
    pub(crate) pending: &'a str,
    pub(crate) holds: &'a str,
}

/// ARGV[1..3], shared by every purchase of a batch.
pub(crate) struct BatchArgs {
    pub(crate) record_ttl_secs: u64,
    /// "1" when the engine waits for a replica (`Config::replicated_flag`).
    pub(crate) replicated: &'static str,
    /// `OrderRecord::script_arg`.
    pub(crate) order_record: &'static str,
}

impl BatchArgs {
    /// The `EVALSHA` of `script` (this build's purchase.lua) in `slot` for
    /// `batch`: the bucket's keys, then each purchase's (quota, record, and
    /// its hold when the sale holds orders); the shared arguments, then each
    /// purchase's (qty, order id, user).
    pub(crate) fn call<'s, 'p>(
        &self,
        script: &'s LuaScript,
        slot: u16,
        bucket: &HomeBucketKeys<'_>,
        batch: impl Iterator<Item = &'p HomePurchase> + Clone,
    ) -> ScriptCall<'s> {
        let mut keys: Vec<&str> = Vec::with_capacity(5 + 3 * batch.size_hint().0);
        keys.extend([
            bucket.sale,
            bucket.stock,
            bucket.orders,
            bucket.pending,
            bucket.holds,
        ]);
        for p in batch.clone() {
            keys.push(&p.quota_key);
            keys.push(&p.record_key);
            if let Some(order_key) = &p.order_key {
                keys.push(order_key);
            }
        }
        let mut call = ScriptCall::new(script, slot, &keys);
        call.arg(self.record_ttl_secs)
            .arg(self.replicated)
            .arg(self.order_record);
        for p in batch {
            call.arg(p.qty).arg(&p.order_id).arg(&p.user);
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::order_reply_value as reply;

    #[test]
    fn every_purchase_reply_shape_decodes() {
        let id = || "o1".to_owned();
        for (v, want) in [
            (
                reply(1, "o1", 2),
                PurchaseReply::Confirmed {
                    order_id: id(),
                    bucket: 2,
                    expires_ms: None,
                },
            ),
            (
                Value::Array(vec![
                    Value::Int(1),
                    Value::BulkString(b"o1".to_vec()),
                    Value::Int(2),
                    Value::Int(1_700_000_000_000),
                ]),
                PurchaseReply::Confirmed {
                    order_id: id(),
                    bucket: 2,
                    expires_ms: Some(1_700_000_000_000),
                },
            ),
            (
                reply(2, "o1", 0),
                PurchaseReply::Replayed {
                    order_id: id(),
                    bucket: 0,
                },
            ),
            (
                Value::Array(vec![
                    Value::Int(3),
                    Value::BulkString(vec![]),
                    Value::Int(0),
                    Value::Int(1_764_000_000_123),
                ]),
                PurchaseReply::FallThrough {
                    home_stock: 0,
                    since_ms: 1_764_000_000_123,
                },
            ),
            (
                reply(4, "", 7),
                PurchaseReply::Pending {
                    home_stock: 7,
                    since_ms: 0,
                },
            ),
            (
                reply(-1, "", 0),
                PurchaseReply::Refused {
                    why: Refusal::SoldOut,
                    home_stock: 0,
                },
            ),
            (reply(-2, "", 3), PurchaseReply::LimitReached { used: 3 }),
            (reply(-3, "", 0), PurchaseReply::NotStarted),
            (
                reply(-4, "", 0),
                PurchaseReply::Refused {
                    why: Refusal::Ended,
                    home_stock: 0,
                },
            ),
            (
                reply(-5, "", 0),
                PurchaseReply::Refused {
                    why: Refusal::Closed,
                    home_stock: 0,
                },
            ),
            (reply(-6, "", 0), PurchaseReply::UnknownSale),
            (reply(-7, "", 0), PurchaseReply::BadArgs),
            (reply(-8, "", 0), PurchaseReply::Mismatch),
        ] {
            assert_eq!(decode(v), Ok(want));
        }
        assert!(decode(reply(9, "", 0)).is_err());
        assert!(decode(reply(1, "o1", -1)).is_err(), "negative bucket");
        assert!(decode(Value::Int(1)).is_err());
        assert!(decode(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn a_batch_reply_decodes_each_purchase_in_order_and_refuses_a_bad_one() {
        let batch = Value::Array(vec![reply(1, "o1", 0), reply(-2, "", 3)]);
        assert_eq!(
            decode_batch(batch),
            Ok(vec![
                PurchaseReply::Confirmed {
                    order_id: "o1".into(),
                    bucket: 0,
                    expires_ms: None,
                },
                PurchaseReply::LimitReached { used: 3 },
            ])
        );
        assert!(decode_batch(Value::Array(vec![reply(1, "o1", 0), reply(9, "", 0)])).is_err());
        assert!(
            decode_batch(reply(1, "o1", 0)).is_err(),
            "a lone reply is not a batch"
        );
        assert!(decode_batch(Value::Int(1)).is_err());
    }
}
