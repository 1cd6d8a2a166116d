//! `lua/restock.lua`, units added to one bucket once per operation: its
//! text, its reply codes, the reply decoded, and its call built from named
//! keys and arguments (the script's header says the same, in the same
//! order).

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{array, bad, int, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/restock.lua");

/// Applied now.
pub const APPLIED: i64 = 1;
/// Applied before under this operation id.
pub const ALREADY_APPLIED: i64 = 2;
/// The sale is closed.
pub const CLOSED: i64 = -5;
/// No such bucket.
pub const UNKNOWN_SALE: i64 = -6;
/// Arguments refused.
pub const BAD_ARGS: i64 = -7;
/// This operation id was used with other units.
pub const MISMATCH: i64 = -8;
/// The bucket would pass 2^53-1 units.
pub const TOO_LARGE: i64 = -9;

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

/// Decodes a `restock.lua` reply.
pub(crate) fn decode(v: Value) -> Result<RestockReply, BadReply> {
    const S: &str = "restock";
    let items = array(S, v, 2)?;
    let (c0, n) = (int(S, &items[0])?, int(S, &items[1])?);
    Ok(match c0 {
        APPLIED => RestockReply::Applied,
        ALREADY_APPLIED => RestockReply::AlreadyApplied,
        CLOSED => RestockReply::Closed,
        UNKNOWN_SALE => RestockReply::UnknownSale,
        BAD_ARGS => RestockReply::BadArgs,
        MISMATCH => RestockReply::Mismatch { units: n },
        TOO_LARGE => RestockReply::TooLarge,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// One call: the bucket's sale and stock keys (KEYS[1..2]) and ARGV.
pub(crate) struct RestockArgs<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    pub(crate) units: u64,
    /// The admin call's idempotency key.
    pub(crate) op: &'a str,
    /// Apply even to a closed bucket (the engine checked the sale was open
    /// when the restock began).
    pub(crate) finish: bool,
}

impl RestockArgs<'_> {
    /// The `EVALSHA` of `script` (this build's restock.lua) in `slot`.
    pub(crate) fn call<'s>(&self, script: &'s LuaScript, slot: u16) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[self.sale, self.stock]);
        call.arg(self.units)
            .arg(self.op)
            .arg(if self.finish { "finish" } else { "" });
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restock_reply_shape_decodes() {
        let v = |a: i64, b: i64| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(decode(v(1, 10)), Ok(RestockReply::Applied));
        assert_eq!(decode(v(2, 5)), Ok(RestockReply::AlreadyApplied));
        assert_eq!(decode(v(-5, 0)), Ok(RestockReply::Closed));
        assert_eq!(decode(v(-6, 0)), Ok(RestockReply::UnknownSale));
        assert_eq!(decode(v(-7, 0)), Ok(RestockReply::BadArgs));
        assert_eq!(decode(v(-8, 4)), Ok(RestockReply::Mismatch { units: 4 }));
        assert_eq!(decode(v(-9, 0)), Ok(RestockReply::TooLarge));
        assert!(decode(v(0, 0)).is_err());
        assert!(decode(Value::Int(3)).is_err(), "the old bare-integer reply");
    }
}
