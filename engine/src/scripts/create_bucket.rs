//! `lua/create_bucket.lua`, one bucket of a sale made unless it exists: its
//! text, its reply codes, the reply decoded, and its call built from named
//! keys and arguments (the script's header says the same, in the same
//! order).

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{bad, int, BadReply, LuaScript};

/// The script's text.
pub(crate) const SOURCE: &str = include_str!("../../../lua/create_bucket.lua");

/// Created now.
pub const CREATED: i64 = 1;
/// It existed; nothing changed.
pub const EXISTED: i64 = 0;

/// `create_bucket.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateBucketReply {
    /// The bucket was created now (code 1).
    Created,
    /// It existed; nothing changed (code 0).
    Existed,
}

/// Decodes a `create_bucket.lua` reply.
pub(crate) fn decode(v: Value) -> Result<CreateBucketReply, BadReply> {
    const S: &str = "create_bucket";
    match int(S, &v)? {
        CREATED => Ok(CreateBucketReply::Created),
        EXISTED => Ok(CreateBucketReply::Existed),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// One bucket as its sale hash describes it (ARGV[2..], field by field),
/// with its keys (KEYS[1..2]) and its units (ARGV[1]).
pub(crate) struct NewBucket<'a> {
    pub(crate) sale: &'a str,
    pub(crate) stock: &'a str,
    /// Units of this bucket, also its `initial`.
    pub(crate) units: u64,
    pub(crate) sku: &'a str,
    pub(crate) tag: &'a str,
    pub(crate) bucket: usize,
    pub(crate) buckets: usize,
    pub(crate) starts_ms: u64,
    pub(crate) ends_ms: u64,
    pub(crate) limit: u32,
    pub(crate) hold_ms: u64,
    pub(crate) late: &'a str,
}

impl NewBucket<'_> {
    /// The `EVALSHA` of `script` (this build's create_bucket.lua) in
    /// `slot`; the bucket is made open.
    pub(crate) fn call<'s>(&self, script: &'s LuaScript, slot: u16) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[self.sale, self.stock]);
        call.arg(self.units)
            .arg("sku")
            .arg(self.sku)
            .arg("tag")
            .arg(self.tag)
            .arg("bucket")
            .arg(self.bucket)
            .arg("buckets")
            .arg(self.buckets)
            .arg("state")
            .arg("open")
            .arg("starts_ms")
            .arg(self.starts_ms)
            .arg("ends_ms")
            .arg(self.ends_ms)
            .arg("limit")
            .arg(self.limit)
            .arg("hold_ms")
            .arg(self.hold_ms)
            .arg("late")
            .arg(self.late)
            .arg("initial")
            .arg(self.units);
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_create_bucket_reply_shape_decodes() {
        assert_eq!(decode(Value::Int(1)), Ok(CreateBucketReply::Created));
        assert_eq!(decode(Value::Int(0)), Ok(CreateBucketReply::Existed));
        assert!(decode(Value::Int(7)).is_err());
        assert!(decode(Value::Nil).is_err());
    }
}
