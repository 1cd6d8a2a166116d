//! `lua/create_meta.lua`, the claim of a SKU and the record of its sale's
//! plan: its text, its reply codes, the reply decoded, and its call built
//! from named keys and arguments (the script's header says the same, in the
//! same order).

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{array, bad, int, text, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/create_meta.lua");

/// This operation claimed the SKU now.
pub const CLAIMED: i64 = 1;
/// This operation claimed it before.
pub const RESUMED: i64 = 2;
/// Another operation claimed it.
pub const TAKEN: i64 = 3;
/// This operation claimed it before with another plan.
pub const MISMATCH: i64 = 4;

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

/// Decodes a `create_meta.lua` reply.
pub(crate) fn decode(v: Value) -> Result<CreateMetaReply, BadReply> {
    const S: &str = "create_meta";
    let items = array(S, v, 3)?;
    let created = text(S, &items[2])? == "1";
    Ok(match int(S, &items[0])? {
        CLAIMED => CreateMetaReply::Claimed,
        RESUMED => CreateMetaReply::Resumed { created },
        TAKEN => CreateMetaReply::Taken { created },
        MISMATCH => CreateMetaReply::Mismatch,
        c => return Err(bad(S, format!("code {c}"))),
    })
}

/// A sale's plan, as the meta hash keeps it (ARGV[2..], field by field).
pub(crate) struct SalePlan<'a> {
    pub(crate) sku: &'a str,
    /// The buckets' hash tags, in bucket order.
    pub(crate) tags: &'a [String],
    pub(crate) stock: u64,
    pub(crate) buckets: u32,
    pub(crate) limit: u32,
    pub(crate) hold_ms: u64,
    /// `LatePayment::as_str`.
    pub(crate) late: &'a str,
    pub(crate) starts_ms: u64,
    pub(crate) ends_ms: u64,
    /// The waiting room's settings (`QueueSpec::encode`); "" = no room, and
    /// then no field is written (plans made before rooms compare equal).
    pub(crate) room: &'a str,
}

impl SalePlan<'_> {
    /// The `EVALSHA` of `script` (this build's create_meta.lua) on the
    /// SKU's meta key `meta` in `slot`, claiming it for operation `op`.
    pub(crate) fn call<'s>(
        &self,
        script: &'s LuaScript,
        slot: u16,
        meta: &str,
        op: &str,
    ) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[meta]);
        call.arg(op)
            .arg("sku")
            .arg(self.sku)
            .arg("tags")
            .arg(self.tags.join(","))
            .arg("stock")
            .arg(self.stock)
            .arg("buckets")
            .arg(self.buckets)
            .arg("limit")
            .arg(self.limit)
            .arg("hold_ms")
            .arg(self.hold_ms)
            .arg("late")
            .arg(self.late)
            .arg("starts_ms")
            .arg(self.starts_ms)
            .arg("ends_ms")
            .arg(self.ends_ms);
        if !self.room.is_empty() {
            call.arg("room").arg(self.room);
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_create_meta_reply_shape_decodes() {
        let c = |code: i64, created: &str| {
            Value::Array(vec![
                Value::Int(code),
                Value::BulkString(b"op".to_vec()),
                Value::BulkString(created.into()),
            ])
        };
        assert_eq!(decode(c(1, "0")), Ok(CreateMetaReply::Claimed));
        assert_eq!(
            decode(c(2, "1")),
            Ok(CreateMetaReply::Resumed { created: true })
        );
        assert_eq!(
            decode(c(3, "0")),
            Ok(CreateMetaReply::Taken { created: false })
        );
        assert_eq!(decode(c(4, "1")), Ok(CreateMetaReply::Mismatch));
        assert!(decode(c(5, "0")).is_err());
    }
}
