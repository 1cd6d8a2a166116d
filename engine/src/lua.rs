//! What every Lua script shares, inventory's and the lock nodes' alike: its
//! compiled-in text with the SHA1 `EVALSHA` uses, the text a planted build
//! runs, and the error for a reply that breaks its script's promised shape.
//! The scripts themselves, their codes and decoders live with their side:
//! `scripts/` and `replies.rs` for the inventory, `lock/scripts.rs` for
//! the locks, so neither side imports the other's.

use redis::Value;

/// One script: its file name, its text and the SHA1 that `EVALSHA` uses.
#[derive(Debug, Clone)]
pub struct LuaScript {
    /// File name under `lua/`, used as a metric label.
    pub name: &'static str,
    /// The script text.
    pub code: &'static str,
    /// Lowercase hex SHA1 of `code`, as `SCRIPT LOAD` returns it.
    pub sha: String,
}

impl LuaScript {
    pub(crate) fn new(name: &'static str, code: &'static str) -> Self {
        LuaScript {
            name,
            code,
            sha: redis::Script::new(code).get_hash().to_string(),
        }
    }
}

/// The text of one script as this build runs it: in a `planted-bugs`
/// build with a plant switched on, possibly broken on purpose (see
/// `crate::planted`).
pub(crate) fn code(name: &str, text: &'static str) -> &'static str {
    #[cfg(feature = "planted-bugs")]
    if let Some(broken) = crate::planted::rewrite(name, text) {
        // Leaked once per engine: only planted test builds ever get here.
        return Box::leak(broken.into_boxed_str());
    }
    let _ = name;
    text
}

/// A reply that does not have the shape its script promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{script}.lua replied with an unexpected shape: {detail}")]
pub struct BadReply {
    /// The script.
    pub script: &'static str,
    /// What was wrong.
    pub detail: String,
}

pub(crate) fn bad(script: &'static str, detail: impl Into<String>) -> BadReply {
    BadReply {
        script,
        detail: detail.into(),
    }
}

pub(crate) fn int(script: &'static str, v: &Value) -> Result<i64, BadReply> {
    match v {
        Value::Int(n) => Ok(*n),
        other => Err(bad(script, format!("expected an integer, got {other:?}"))),
    }
}

pub(crate) fn text(script: &'static str, v: &Value) -> Result<String, BadReply> {
    match v {
        Value::BulkString(b) => {
            String::from_utf8(b.clone()).map_err(|_| bad(script, "text is not UTF-8"))
        }
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(bad(script, format!("expected text, got {other:?}"))),
    }
}

/// A reply of exactly `len` items.
pub(crate) fn array(script: &'static str, v: Value, len: usize) -> Result<Vec<Value>, BadReply> {
    match v {
        Value::Array(items) if items.len() == len => Ok(items),
        other => Err(bad(script, format!("{other:?}"))),
    }
}

/// A `{code, order_id, n}` reply, or `{code, order_id, n, expires_ms}`
/// from a sale that holds orders: the items and the deadline, if any.
pub(crate) fn order_reply(
    script: &'static str,
    v: Value,
) -> Result<(Vec<Value>, Option<u64>), BadReply> {
    let items = match v {
        Value::Array(items) if items.len() == 3 || items.len() == 4 => items,
        other => return Err(bad(script, format!("{other:?}"))),
    };
    let expires = match items.get(3) {
        Some(v) => {
            Some(u64::try_from(int(script, v)?).map_err(|_| bad(script, "negative expires_ms"))?)
        }
        None => None,
    };
    Ok((items, expires))
}

pub(crate) fn bucket(script: &'static str, n: i64) -> Result<u32, BadReply> {
    u32::try_from(n).map_err(|_| bad(script, format!("bucket {n}")))
}

/// A `{code, text, n}` reply, as the purchase scripts send it: for the
/// decoders' tests.
#[cfg(test)]
pub(crate) fn order_reply_value(code: i64, s: &str, n: i64) -> Value {
    Value::Array(vec![
        Value::Int(code),
        Value::BulkString(s.as_bytes().to_vec()),
        Value::Int(n),
    ])
}
