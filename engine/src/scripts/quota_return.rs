//! `lua/quota_return.lua`, a buyer's quota given back once, in the home
//! bucket (replies 1 now, 0 before): its text, the reply decoded, and its
//! call built from named keys and arguments (the script's header says the
//! same, in the same order).

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{bad, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/quota_return.lua");

/// Decodes a `quota_return.lua` reply: true when given back now.
pub(crate) fn decode(v: Value) -> Result<bool, BadReply> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(bad("quota_return", format!("{other:?}"))),
    }
}

/// One call: its keys (KEYS[1..2]) and ARGV.
pub(crate) struct QuotaReturn<'a> {
    /// `{home}:q:<user>`.
    pub(crate) quota: &'a str,
    /// `{home}:u:<order_id>`, set once the quota came back.
    pub(crate) marker: &'a str,
    pub(crate) units: u64,
    pub(crate) marker_ttl_secs: u64,
    /// "1" when the engine waits for a replica (`Config::replicated_flag`).
    pub(crate) replicated: &'static str,
}

impl QuotaReturn<'_> {
    /// The `EVALSHA` of `script` (this build's quota_return.lua) in `slot`.
    pub(crate) fn call<'s>(&self, script: &'s LuaScript, slot: u16) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[self.quota, self.marker]);
        call.arg(self.units)
            .arg(self.marker_ttl_secs)
            .arg(self.replicated);
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_quota_return_reply_shape_decodes() {
        assert_eq!(decode(Value::Int(1)), Ok(true));
        assert!(decode(Value::Int(-7)).is_err());
    }
}
