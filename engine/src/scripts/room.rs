//! The waiting room's scripts (`lua/join.lua`, `lua/line_fence.lua`,
//! `lua/admit.lua`, `lua/room_done.lua`): their texts, reply codes, replies
//! decoded once into enums, and calls built from named keys and arguments.
//! One file for the four because they share one model, the line and its
//! gate (`room/`), and each is a few lines; the Lua headers say the same.

use redis::Value;

use super::call::ScriptCall;
use crate::lua::{array, bad, int, BadReply, LuaScript};

/// `lua/join.lua`.
pub(crate) const JOIN: &str = include_str!("../../../lua/join.lua");
/// `lua/line_fence.lua`.
pub(crate) const LINE_FENCE: &str = include_str!("../../../lua/line_fence.lua");
/// `lua/admit.lua`.
pub(crate) const ADMIT: &str = include_str!("../../../lua/admit.lua");
/// `lua/room_done.lua`.
pub(crate) const ROOM_DONE: &str = include_str!("../../../lua/room_done.lua");

/// The reply every room script gives to arguments it refuses.
const BAD_ARGS: i64 = -7;

/// `join.lua`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinReply {
    /// Joined now at this place.
    Joined(u64),
    /// Had joined before, at this place.
    Rejoined(u64),
}

fn place(s: &'static str, v: &Value) -> Result<u64, BadReply> {
    u64::try_from(int(s, v)?).map_err(|_| bad(s, "negative place"))
}

pub(crate) fn decode_join(v: Value) -> Result<JoinReply, BadReply> {
    const S: &str = "join";
    let items = array(S, v, 2)?;
    match int(S, &items[0])? {
        1 => Ok(JoinReply::Joined(place(S, &items[1])?)),
        2 => Ok(JoinReply::Rejoined(place(S, &items[1])?)),
        BAD_ARGS => Err(bad(S, "arguments refused")),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// One join: the shard's line and histogram keys.
pub(crate) fn join<'s>(
    script: &'s LuaScript,
    slot: u16,
    line: &str,
    hist: &str,
    user: &str,
    proposed: u64,
    shard: u32,
) -> ScriptCall<'s> {
    let mut call = ScriptCall::new(script, slot, &[line, hist]);
    call.arg(user).arg(proposed).arg(shard);
    call
}

/// `line_fence.lua`'s answer: the shard's floor now.
pub(crate) fn decode_fence(v: Value) -> Result<u64, BadReply> {
    const S: &str = "line_fence";
    let items = array(S, v, 2)?;
    match int(S, &items[0])? {
        1 => place(S, &items[1]),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// One fence of one shard.
pub(crate) fn fence<'s>(script: &'s LuaScript, slot: u16, hist: &str, at: u64) -> ScriptCall<'s> {
    let mut call = ScriptCall::new(script, slot, &[hist]);
    call.arg(at);
    call
}

/// `admit.lua`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdmitReply {
    /// The cursor moved over `admitted` places at Redis time `at_ms`.
    Admitted { admitted: u64, at_ms: u64 },
    /// Another round moved the cursor first; it is now `cursor`.
    Raced { cursor: u64 },
    /// More than the stock (`capacity`) or the rate (`allow`) allow now.
    TooMany { capacity: u64, allow: u64 },
}

pub(crate) fn decode_admit(v: Value) -> Result<AdmitReply, BadReply> {
    const S: &str = "admit";
    let items = array(S, v, 3)?;
    let (a, b) = (place(S, &items[1])?, place(S, &items[2])?);
    match int(S, &items[0])? {
        1 => Ok(AdmitReply::Admitted {
            admitted: a,
            at_ms: b,
        }),
        2 => Ok(AdmitReply::Raced { cursor: a }),
        3 => Ok(AdmitReply::TooMany {
            capacity: a,
            allow: b,
        }),
        BAD_ARGS => Err(bad(S, "arguments refused")),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// One admission round's compare-and-set on the gate.
pub(crate) struct AdmitArgs<'a> {
    pub(crate) room: &'a str,
    pub(crate) rounds: &'a str,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) count: u64,
    pub(crate) remaining: u64,
    pub(crate) held: u64,
    pub(crate) overbook: f64,
    /// 0 = auto.
    pub(crate) rate_per_s: f64,
    pub(crate) window_ms: u64,
    pub(crate) channel: &'a str,
    /// Units one admission may buy (the sale's per-user limit).
    pub(crate) limit: u32,
    /// The gate's `done_total` read before the stock was.
    pub(crate) done_read: u64,
}

impl AdmitArgs<'_> {
    pub(crate) fn call<'s>(&self, script: &'s LuaScript, slot: u16) -> ScriptCall<'s> {
        let mut call = ScriptCall::new(script, slot, &[self.room, self.rounds]);
        call.arg(self.from)
            .arg(self.to)
            .arg(self.count)
            .arg(self.remaining)
            .arg(self.held)
            .arg(self.overbook)
            .arg(self.rate_per_s)
            .arg(self.window_ms)
            .arg(self.channel)
            .arg(self.limit)
            .arg(self.done_read);
        call
    }
}

/// `room_done.lua`'s answer: true when a place was freed now.
pub(crate) fn decode_done(v: Value) -> Result<bool, BadReply> {
    const S: &str = "room_done";
    let items = array(S, v, 1)?;
    match int(S, &items[0])? {
        1 => Ok(true),
        2 => Ok(false),
        BAD_ARGS => Err(bad(S, "arguments refused")),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// One user's admission used.
pub(crate) fn done<'s>(
    script: &'s LuaScript,
    slot: u16,
    keys: [&str; 3],
    user: &str,
    place: u64,
) -> ScriptCall<'s> {
    let mut call = ScriptCall::new(script, slot, &keys);
    call.arg(user).arg(place);
    call
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[i64]) -> Value {
        Value::Array(items.iter().map(|n| Value::Int(*n)).collect())
    }

    #[test]
    fn every_room_reply_shape_decodes() {
        assert_eq!(decode_join(v(&[1, 5])), Ok(JoinReply::Joined(5)));
        assert_eq!(decode_join(v(&[2, 3])), Ok(JoinReply::Rejoined(3)));
        assert!(decode_join(v(&[-7, 0])).is_err());
        assert!(decode_join(v(&[1, -1])).is_err());
        assert_eq!(decode_fence(v(&[1, 9])), Ok(9));
        assert!(decode_fence(v(&[-7, 0])).is_err());
        assert_eq!(
            decode_admit(v(&[1, 4, 100])),
            Ok(AdmitReply::Admitted {
                admitted: 4,
                at_ms: 100
            })
        );
        assert_eq!(
            decode_admit(v(&[2, 7, 0])),
            Ok(AdmitReply::Raced { cursor: 7 })
        );
        assert_eq!(
            decode_admit(v(&[3, 1, 2])),
            Ok(AdmitReply::TooMany {
                capacity: 1,
                allow: 2
            })
        );
        assert!(decode_admit(v(&[-7, 0, 0])).is_err());
        assert_eq!(decode_done(v(&[1])), Ok(true));
        assert_eq!(decode_done(v(&[2])), Ok(false));
        assert!(decode_done(v(&[-7])).is_err());
    }
}
