//! `lua/settle.lua`, the close of a pending request in its home bucket:
//! its text, its reply codes, the reply decoded, and its call built with
//! every key and argument named (the script's header, in the same order).

use redis::Value;

use super::call::ScriptCall;
use super::record::RequestRecord;
use super::refusal::Refusal;
use crate::lua::{array, bad, int, text, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/settle.lua");

/// This call settled the record.
pub const SETTLED: i64 = 1;
/// It was settled already.
pub const ALREADY: i64 = 0;

/// `settle.lua`: the request's record after settling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleReply {
    /// True when this call settled the request.
    pub settled: bool,
    /// The record as it is now.
    pub record: RequestRecord,
}

/// Decodes a `settle.lua` reply.
pub(crate) fn decode(v: Value) -> Result<SettleReply, BadReply> {
    const S: &str = "settle";
    let items = array(S, v, 2)?;
    let settled = match int(S, &items[0])? {
        SETTLED => true,
        ALREADY => false,
        c => return Err(bad(S, format!("code {c}"))),
    };
    let raw = text(S, &items[1])?;
    let record = RequestRecord::parse(&raw).ok_or_else(|| bad(S, format!("record {raw:?}")))?;
    Ok(SettleReply { settled, record })
}

/// How the walk over the other buckets ended (ARGV[1] to ARGV[4]).
pub(crate) enum Outcome<'a> {
    /// Bucket `bucket` took, with this order.
    Confirmed { bucket: u32, order_id: &'a str },
    /// Every bucket refused.
    Refused(Refusal),
}

/// KEYS of one call, in the header's order.
pub(crate) struct SettleKeys<'a> {
    pub(crate) quota: &'a str,
    pub(crate) record: &'a str,
    pub(crate) pending: &'a str,
}

/// ARGV of one call, in the header's order.
pub(crate) struct SettleArgs<'a> {
    pub(crate) outcome: Outcome<'a>,
    pub(crate) record_ttl_secs: u64,
    /// The request's member of the pending set (`keys::pending_member`).
    pub(crate) pending_member: &'a str,
    pub(crate) qty: u64,
}

impl SettleArgs<'_> {
    /// The `EVALSHA` of `script` (this build's settle.lua) in `slot`.
    pub(crate) fn call<'s>(
        &self,
        script: &'s LuaScript,
        slot: u16,
        keys: &SettleKeys<'_>,
    ) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[keys.quota, keys.record, keys.pending]);
        match self.outcome {
            Outcome::Confirmed { bucket, order_id } => {
                call.arg("C").arg(bucket).arg(order_id).arg(0)
            }
            Outcome::Refused(why) => call.arg("S").arg(0).arg("").arg(why.code()),
        };
        call.arg(self.record_ttl_secs)
            .arg(self.pending_member)
            .arg(self.qty);
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::record::RequestRecord;

    #[test]
    fn records_and_settle_replies_decode() {
        let v =
            |code: i64, s: &str| Value::Array(vec![Value::Int(code), Value::BulkString(s.into())]);
        assert_eq!(
            decode(v(1, "C:2:1:abc:def")),
            Ok(SettleReply {
                settled: true,
                record: RequestRecord::Confirmed {
                    qty: 2,
                    bucket: 1,
                    order_id: "abc:def".into()
                }
            })
        );
        assert_eq!(
            decode(v(0, "S:1:-5")).map(|r| r.record),
            Ok(RequestRecord::Refused {
                qty: 1,
                why: Refusal::Closed
            })
        );
        assert_eq!(
            decode(v(0, "")).map(|r| r.record),
            Ok(RequestRecord::Missing)
        );
        assert_eq!(
            RequestRecord::parse("P:3"),
            Some(RequestRecord::Pending { qty: 3 })
        );
        assert!(decode(v(0, "Z:1")).is_err());
        assert!(decode(v(2, "P:1")).is_err());
    }
}
