//! The Lua scripts of `lua/` the inventory cluster runs, one file each:
//! the script's text, its reply codes (the Lua header says the same), its
//! reply decoded once into an enum, and its call built from named keys and
//! arguments, so no call site can put an argument in the wrong place.
//! `refusal.rs` and `record.rs` are what the purchase's scripts share;
//! `call.rs` is the one way an `EVALSHA` is built. This file is the
//! registry: every script with its SHA1, made once, so the hot path never
//! hashes or copies script text. Loading them on the masters is the
//! cluster's job. The order writer's scripts (ack, trim, dead letters,
//! forgotten consumers) answer with plain data read where they are called;
//! the lock nodes' scripts are the lock module's (`lock/scripts.rs`).

use crate::lua::code;
pub use crate::lua::LuaScript;

pub(crate) mod call;
pub(crate) mod create_bucket;
pub(crate) mod create_meta;
pub(crate) mod ledger_snapshot;
pub(crate) mod purchase;
pub(crate) mod quota_return;
pub(crate) mod record;
pub(crate) mod refusal;
pub(crate) mod restock;
pub(crate) mod room;
pub(crate) mod settle;
pub(crate) mod take;
pub(crate) mod transition;

/// `lua/ack.lua`: probe write and record reads before a group commit's
/// WAIT (the records themselves, no code).
const ACK_LUA: &str = include_str!("../../../lua/ack.lua");

/// `lua/dead_letter.lua`: the order writer's dead letters.
const DEAD_LETTER_LUA: &str = include_str!("../../../lua/dead_letter.lua");
/// `lua/forget_consumers.lua`: delete the writers' dead consumers.
const FORGET_CONSUMERS_LUA: &str = include_str!("../../../lua/forget_consumers.lua");
/// `lua/trim.lua`: the order writer's trim of a stream.
const TRIM_LUA: &str = include_str!("../../../lua/trim.lua");

/// Every script the engine runs on the inventory cluster.
#[derive(Debug, Clone)]
pub struct Scripts {
    /// `lua/purchase.lua`: the whole purchase in the buyer's home bucket.
    pub purchase: LuaScript,
    /// `lua/take.lua`: take stock for a pending request from another bucket.
    pub take: LuaScript,
    /// `lua/settle.lua`: close a pending request in the home bucket.
    pub settle: LuaScript,
    /// `lua/create_bucket.lua`: create one bucket unless it exists.
    pub create_bucket: LuaScript,
    /// `lua/restock.lua`: add units to one bucket, once per operation.
    pub restock: LuaScript,
    /// `lua/create_meta.lua`: claim a SKU and record a sale's plan.
    pub create_meta: LuaScript,
    /// `lua/ledger_snapshot.lua`: one bucket's ledger at one instant.
    pub ledger_snapshot: LuaScript,
    /// `lua/ack.lua`: probe write and record reads before a group commit's WAIT.
    pub ack: LuaScript,
    /// `lua/transition.lua`: pay, cancel or expire held orders.
    pub transition: LuaScript,
    /// `lua/quota_return.lua`: give a quota back once in the home bucket.
    pub quota_return: LuaScript,
    /// `lua/trim.lua`: delete the entries of an order stream every group is
    /// done with.
    pub trim: LuaScript,
    /// `lua/dead_letter.lua`: move an entry the writers cannot write to
    /// the dead-letter stream and acknowledge it, once.
    pub dead_letter: LuaScript,
    /// `lua/forget_consumers.lua`.
    pub forget_consumers: LuaScript,
    /// `lua/join.lua`: a user joins a sale's waiting line, once.
    pub join: LuaScript,
    /// `lua/line_fence.lua`: a line shard's floor raised before a round.
    pub line_fence: LuaScript,
    /// `lua/admit.lua`: one admission round on the room's gate.
    pub admit: LuaScript,
    /// `lua/room_done.lua`: an admission used, its place freed.
    pub room_done: LuaScript,
}

impl Scripts {
    /// The scripts of this build.
    pub fn new() -> Self {
        Scripts {
            purchase: LuaScript::new("purchase", code("purchase", purchase::SOURCE)),
            take: LuaScript::new("take", code("take", take::SOURCE)),
            settle: LuaScript::new("settle", settle::SOURCE),
            create_bucket: LuaScript::new("create_bucket", create_bucket::SOURCE),
            restock: LuaScript::new("restock", code("restock", restock::SOURCE)),
            create_meta: LuaScript::new("create_meta", create_meta::SOURCE),
            ledger_snapshot: LuaScript::new("ledger_snapshot", ledger_snapshot::SOURCE),
            ack: LuaScript::new("ack", ACK_LUA),
            transition: LuaScript::new("transition", code("transition", transition::SOURCE)),
            quota_return: LuaScript::new("quota_return", quota_return::SOURCE),
            trim: LuaScript::new("trim", TRIM_LUA),
            dead_letter: LuaScript::new("dead_letter", DEAD_LETTER_LUA),
            forget_consumers: LuaScript::new("forget_consumers", FORGET_CONSUMERS_LUA),
            join: LuaScript::new("join", room::JOIN),
            line_fence: LuaScript::new("line_fence", room::LINE_FENCE),
            admit: LuaScript::new("admit", room::ADMIT),
            room_done: LuaScript::new("room_done", room::ROOM_DONE),
        }
    }

    /// All scripts, for loading them on a node.
    pub fn all(&self) -> [&LuaScript; 17] {
        [
            &self.join,
            &self.line_fence,
            &self.admit,
            &self.room_done,
            &self.trim,
            &self.dead_letter,
            &self.forget_consumers,
            &self.transition,
            &self.quota_return,
            &self.ack,
            &self.create_meta,
            &self.purchase,
            &self.take,
            &self.settle,
            &self.create_bucket,
            &self.restock,
            &self.ledger_snapshot,
        ]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
