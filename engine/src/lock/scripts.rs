//! The lock nodes' Lua scripts, compiled in, and their replies, decoded
//! once: the codes named here, next to the scripts (each Lua header says
//! the same), and one decoder per reply shape. The lock module imports
//! nothing of the inventory's scripts or replies, nor they of these.

use redis::Value;

use crate::lua::{bad, code, int, text, BadReply, LuaScript};

/// `lua/lock_acquire.lua`: SET NX PX on one lock node, with its fence.
const LOCK_ACQUIRE_LUA: &str = include_str!("../../../lua/lock_acquire.lua");
/// `lua/lock_fence.lua`: raise a node's fencing counter (replies the counter).
const LOCK_FENCE_LUA: &str = include_str!("../../../lua/lock_fence.lua");
/// `lua/lock_release.lua`: release if this grant holds the lock.
const LOCK_RELEASE_LUA: &str = include_str!("../../../lua/lock_release.lua");
/// `lua/lock_extend.lua`: renew if this grant holds the lock.
const LOCK_EXTEND_LUA: &str = include_str!("../../../lua/lock_extend.lua");
/// `lua/lock_waiting.lua`: count a waiter in or out (replies the count).
const LOCK_WAITING_LUA: &str = include_str!("../../../lua/lock_waiting.lua");
/// `lua/semaphore_permits.lua`: read or raise a semaphore's total.
const SEMAPHORE_PERMITS_LUA: &str = include_str!("../../../lua/semaphore_permits.lua");
/// `lua/semaphore_free.lua`: which permit slots are free on a node.
const SEMAPHORE_FREE_LUA: &str = include_str!("../../../lua/semaphore_free.lua");
/// `lua/lock_fair_acquire.lua`: take a lock when first in its queue.
const LOCK_FAIR_ACQUIRE_LUA: &str = include_str!("../../../lua/lock_fair_acquire.lua");
/// `lua/lock_dequeue.lua`: take a waiter out of a lock's queue.
const LOCK_DEQUEUE_LUA: &str = include_str!("../../../lua/lock_dequeue.lua");
/// `lua/rw_acquire.lua`: take a read-write lock to read or to write.
const RW_ACQUIRE_LUA: &str = include_str!("../../../lua/rw_acquire.lua");
/// `lua/rw_release.lua`: release one holder of a read-write lock.
const RW_RELEASE_LUA: &str = include_str!("../../../lua/rw_release.lua");
/// `lua/rw_extend.lua`: renew one holder of a read-write lock.
const RW_EXTEND_LUA: &str = include_str!("../../../lua/rw_extend.lua");
/// `lua/latch.lua`: a count-down latch (init, count down, read).
const LATCH_LUA: &str = include_str!("../../../lua/latch.lua");
/// Reply codes of the lock scripts.
pub mod codes {
    /// lock_acquire: taken on this node; release/extend: done.
    pub const DONE: i64 = 1;
    /// lock_acquire: held by another grant; release/extend: this token does
    /// not hold it.
    pub const NOT_HELD: i64 = 0;
    /// lock_release: released, and others wait for the lock (a wake-up went
    /// out).
    pub const RELEASED_TO_WAITERS: i64 = 2;
}

/// The scripts of the lock nodes.
#[derive(Debug, Clone)]
pub struct LockScripts {
    /// `lua/lock_acquire.lua`.
    pub acquire: LuaScript,
    /// `lua/lock_fence.lua`.
    pub fence: LuaScript,
    /// `lua/lock_release.lua`.
    pub release: LuaScript,
    /// `lua/lock_extend.lua`.
    pub extend: LuaScript,
    /// `lua/lock_waiting.lua`.
    pub waiting: LuaScript,
    /// `lua/semaphore_permits.lua`.
    pub permits: LuaScript,
    /// `lua/latch.lua`.
    pub latch: LuaScript,
    /// `lua/semaphore_free.lua`.
    pub free_slots: LuaScript,
    /// `lua/lock_fair_acquire.lua`.
    pub fair_acquire: LuaScript,
    /// `lua/lock_dequeue.lua`.
    pub dequeue: LuaScript,
    /// `lua/rw_acquire.lua`.
    pub rw_acquire: LuaScript,
    /// `lua/rw_release.lua`.
    pub rw_release: LuaScript,
    /// `lua/rw_extend.lua`.
    pub rw_extend: LuaScript,
}

impl LockScripts {
    /// The lock scripts of this build.
    pub fn new() -> Self {
        LockScripts {
            acquire: LuaScript::new("lock_acquire", code("lock_acquire", LOCK_ACQUIRE_LUA)),
            fence: LuaScript::new("lock_fence", LOCK_FENCE_LUA),
            release: LuaScript::new("lock_release", code("lock_release", LOCK_RELEASE_LUA)),
            extend: LuaScript::new("lock_extend", LOCK_EXTEND_LUA),
            waiting: LuaScript::new("lock_waiting", LOCK_WAITING_LUA),
            permits: LuaScript::new("semaphore_permits", SEMAPHORE_PERMITS_LUA),
            latch: LuaScript::new("latch", LATCH_LUA),
            free_slots: LuaScript::new("semaphore_free", SEMAPHORE_FREE_LUA),
            fair_acquire: LuaScript::new("lock_fair_acquire", LOCK_FAIR_ACQUIRE_LUA),
            dequeue: LuaScript::new("lock_dequeue", LOCK_DEQUEUE_LUA),
            rw_acquire: LuaScript::new("rw_acquire", RW_ACQUIRE_LUA),
            rw_release: LuaScript::new("rw_release", RW_RELEASE_LUA),
            rw_extend: LuaScript::new("rw_extend", RW_EXTEND_LUA),
        }
    }
}

impl Default for LockScripts {
    fn default() -> Self {
        Self::new()
    }
}

/// `lock_acquire.lua` on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockAcquireReply {
    /// This node granted the lock.
    pub granted: bool,
    /// The lock's remaining ttl on this node, ms (when not granted).
    pub pttl: i64,
    /// The node's fencing counter (the grant's token on a single node).
    pub fence: u64,
}

/// Decodes a `lock_acquire.lua` reply.
pub fn lock_acquire(v: &Value) -> Result<LockAcquireReply, BadReply> {
    const S: &str = "lock_acquire";
    let Value::Array(items) = v else {
        return Err(bad(S, format!("{v:?}")));
    };
    let [code, pttl, fence] = items.as_slice() else {
        return Err(bad(S, format!("{} items", items.len())));
    };
    let granted = match int(S, code)? {
        codes::DONE => true,
        codes::NOT_HELD => false,
        c => return Err(bad(S, format!("code {c}"))),
    };
    let fence = match fence {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => text(S, other)?.parse().ok(),
    }
    .ok_or_else(|| bad(S, format!("fence {fence:?}")))?;
    Ok(LockAcquireReply {
        granted,
        pttl: int(S, pttl)?,
        fence,
    })
}

/// What one node said to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRelease {
    /// This grant did not hold the lock there (expired, or another's now).
    NotHeld,
    /// Released; nobody waited.
    Released,
    /// Released, and other clients wait for it: they were woken.
    ReleasedToWaiters,
}

/// Decodes a `lock_release.lua` or `rw_release.lua` reply.
pub fn lock_release(v: &Value) -> Result<LockRelease, BadReply> {
    const S: &str = "lock_release";
    match int(S, v)? {
        codes::NOT_HELD => Ok(LockRelease::NotHeld),
        codes::DONE => Ok(LockRelease::Released),
        codes::RELEASED_TO_WAITERS => Ok(LockRelease::ReleasedToWaiters),
        c => Err(bad(S, format!("code {c}"))),
    }
}

/// Decodes a `lock_extend.lua` (or `rw_extend.lua`) reply: true when done,
/// false when this grant does not hold the lock.
pub fn lock_done(v: &Value) -> Result<bool, BadReply> {
    const S: &str = "lock_release/lock_extend";
    match int(S, v)? {
        codes::DONE => Ok(true),
        codes::NOT_HELD => Ok(false),
        c => Err(bad(S, format!("code {c}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lock_reply_shape_decodes() {
        let reply =
            |code: i64, fence: Value| Value::Array(vec![Value::Int(code), Value::Int(-2), fence]);
        assert_eq!(
            lock_acquire(&reply(1, Value::BulkString(b"17".to_vec()))),
            Ok(LockAcquireReply {
                granted: true,
                pttl: -2,
                fence: 17
            })
        );
        assert_eq!(
            lock_acquire(&reply(0, Value::Int(5))).map(|r| (r.granted, r.fence)),
            Ok((false, 5))
        );
        assert!(lock_acquire(&reply(2, Value::Int(5))).is_err());
        assert_eq!(lock_release(&Value::Int(0)), Ok(LockRelease::NotHeld));
        assert_eq!(lock_release(&Value::Int(1)), Ok(LockRelease::Released));
        assert_eq!(
            lock_release(&Value::Int(2)),
            Ok(LockRelease::ReleasedToWaiters)
        );
        assert!(lock_release(&Value::Int(3)).is_err());
        assert!(lock_acquire(&reply(1, Value::Int(-5))).is_err());
        assert!(lock_acquire(&reply(1, Value::BulkString(b"x".to_vec()))).is_err());
        assert!(lock_acquire(&Value::Array(vec![Value::Int(1)])).is_err());
        assert_eq!(lock_done(&Value::Int(1)), Ok(true));
        assert_eq!(lock_done(&Value::Int(0)), Ok(false));
        assert!(lock_done(&Value::Int(3)).is_err());
        assert!(lock_done(&Value::Nil).is_err());
    }
}
