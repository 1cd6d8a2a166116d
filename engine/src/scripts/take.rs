//! `lua/take.lua`, one step of a fall-through walk: its text, its reply
//! codes, the reply decoded, and its call built with every key and
//! argument named, so no call site can put one in the wrong place (the
//! script's header says the same, in the same order).

use redis::Value;

use super::call::ScriptCall;
use super::refusal::Refusal;
use crate::lua::{bad, bucket, int, order_reply, text, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/take.lua");

/// Taken now.
pub const TAKEN: i64 = 1;
/// Taken before by this request.
pub const REPLAYED: i64 = 2;
/// No such sale.
pub const UNKNOWN_SALE: i64 = -6;
/// Arguments refused.
pub const BAD_ARGS: i64 = -7;
/// The request id was used with another qty.
pub const MISMATCH: i64 = -8;
/// A replay check found no order here (a failover took it back).
pub const LOST: i64 = -9;

/// `take.lua`, one step of a fall-through walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeReply {
    /// This bucket took the stock now (or, `replayed`, took it before).
    Taken {
        /// The order.
        order_id: String,
        /// The bucket.
        bucket: u32,
        /// True when an earlier attempt took it.
        replayed: bool,
        /// When its hold expires (ms, Redis time), when it is new and the
        /// sale holds orders.
        expires_ms: Option<u64>,
    },
    /// This bucket refused the request for good.
    Refused {
        /// Why.
        why: Refusal,
        /// Units left in the bucket (0 when not read).
        stock: i64,
    },
    /// No sale in this bucket.
    UnknownSale,
    /// The engine sent an argument out of range.
    BadArgs,
    /// The request was made before with another qty.
    Mismatch,
    /// Asked to confirm: this bucket holds no record of the request (the
    /// order a replay names is gone, lost with a failover).
    Lost,
}

/// Decodes a `take.lua` reply.
pub(crate) fn decode(v: Value) -> Result<TakeReply, BadReply> {
    const S: &str = "take";
    let (items, expires_ms) = order_reply(S, v)?;
    let (c0, n) = (int(S, &items[0])?, int(S, &items[2])?);
    Ok(match c0 {
        TAKEN | REPLAYED => TakeReply::Taken {
            order_id: text(S, &items[1])?,
            bucket: bucket(S, n)?,
            replayed: c0 == REPLAYED,
            expires_ms,
        },
        UNKNOWN_SALE => TakeReply::UnknownSale,
        BAD_ARGS => TakeReply::BadArgs,
        MISMATCH => TakeReply::Mismatch,
        LOST => TakeReply::Lost,
        c => match Refusal::from_code(c) {
            Some(why) => TakeReply::Refused { why, stock: n },
            None => return Err(bad(S, format!("code {c}"))),
        },
    })
}

/// What a walk step does with the request in this bucket (ARGV[5]): a
/// buyer's walk takes; the sweeper's only makes refusals final; a replay
/// only confirms the order is there. `since_ms` is when the request's walk
/// began (its pending score, the home master's clock): no bucket takes
/// past it plus the walk limit, so a refusal need not be kept longer than
/// that (see `take.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeMode {
    Take { since_ms: u64 },
    Refuse { since_ms: u64 },
    Confirm,
}

/// KEYS of one call, in the header's order.
pub(crate) struct TakeKeys<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    pub(crate) orders: &'a str,
    pub(crate) record: &'a str,
    pub(crate) holds: &'a str,
    /// The order's hold key, only when the sale holds orders.
    pub(crate) order: Option<&'a str>,
}

/// ARGV of one call, in the header's order.
pub(crate) struct TakeArgs<'a> {
    pub(crate) qty: u64,
    pub(crate) order_id: &'a str,
    pub(crate) user: &'a str,
    pub(crate) record_ttl_secs: u64,
    pub(crate) mode: TakeMode,
    /// "1" when the engine waits for a replica (`Config::replicated_flag`).
    pub(crate) replicated: &'static str,
    pub(crate) home_bucket: u32,
    /// `OrderRecord::script_arg`.
    pub(crate) order_record: &'static str,
    pub(crate) walk_limit_ms: u64,
}

impl TakeArgs<'_> {
    /// The `EVALSHA` of `script` (this build's take.lua) in `slot`.
    pub(crate) fn call<'s>(
        &self,
        script: &'s LuaScript,
        slot: u16,
        keys: &TakeKeys<'_>,
    ) -> ScriptCall<'s> {
        let mut list = [
            keys.sale,
            keys.stock,
            keys.orders,
            keys.record,
            keys.holds,
            "",
        ];
        let n = match keys.order {
            Some(order) => {
                list[5] = order;
                6
            }
            None => 5,
        };
        let (word, since_ms) = match self.mode {
            TakeMode::Take { since_ms } => ("take", since_ms),
            TakeMode::Refuse { since_ms } => ("refuse", since_ms),
            TakeMode::Confirm => ("confirm", 0),
        };
        let mut call = ScriptCall::new(script, slot, &list[..n]);
        call.arg(self.qty)
            .arg(self.order_id)
            .arg(self.user)
            .arg(self.record_ttl_secs)
            .arg(word)
            .arg(self.replicated)
            .arg(self.home_bucket)
            .arg(self.order_record)
            .arg(since_ms)
            .arg(self.walk_limit_ms);
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::order_reply_value as reply;

    #[test]
    fn every_take_reply_shape_decodes() {
        assert_eq!(
            decode(reply(2, "o", 1)),
            Ok(TakeReply::Taken {
                order_id: "o".into(),
                bucket: 1,
                replayed: true,
                expires_ms: None,
            })
        );
        assert_eq!(
            decode(reply(-4, "", 0)),
            Ok(TakeReply::Refused {
                why: Refusal::Ended,
                stock: 0
            })
        );
        assert_eq!(decode(reply(-6, "", 0)), Ok(TakeReply::UnknownSale));
        assert_eq!(decode(reply(-7, "", 0)), Ok(TakeReply::BadArgs));
        assert_eq!(decode(reply(-8, "", 0)), Ok(TakeReply::Mismatch));
        assert_eq!(decode(reply(-9, "", 0)), Ok(TakeReply::Lost));
        assert!(decode(reply(-2, "", 0)).is_err(), "take has no limit code");
    }
}
