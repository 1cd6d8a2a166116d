//! `lua/ledger_snapshot.lua`, one bucket's ledger at one instant
//! (`{initial, stock, last_id}`, no code): its text, the reply decoded,
//! and its call built from named keys. Only reconcile (the postgres
//! feature) reads a ledger.

// Loaded on every master whatever the build; read only by reconcile.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{array, bad, int, text, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/ledger_snapshot.lua");

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

/// Decodes a `ledger_snapshot.lua` reply.
pub(crate) fn decode(v: Value) -> Result<LedgerSnapshot, BadReply> {
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

/// The bucket's keys (KEYS[1..3]); the script takes no ARGV.
pub(crate) struct LedgerKeys<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    pub(crate) orders: &'a str,
}

impl LedgerKeys<'_> {
    /// The `EVALSHA` of `script` (this build's ledger_snapshot.lua) in
    /// `slot`.
    pub(crate) fn call<'s>(&self, script: &'s LuaScript, slot: u16) -> ScriptCall<'s> {
        ScriptCall::new(script, slot, &[self.sale, self.stock, self.orders])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ledger_reply_shape_decodes() {
        let snap = |last: &str| {
            Value::Array(vec![
                Value::Int(10),
                Value::Int(-2),
                Value::BulkString(last.as_bytes().to_vec()),
            ])
        };
        assert_eq!(
            decode(snap("17-3")),
            Ok(LedgerSnapshot {
                initial: 10,
                stock: -2,
                last_id: (17, 3)
            })
        );
        assert!(decode(snap("17")).is_err());
        assert!(decode(snap("a-b")).is_err());
        assert!(decode(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
