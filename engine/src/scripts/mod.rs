//! The Lua scripts of `lua/`, compiled in, with their SHA1 digests, and the
//! codes each script's reply starts with, named once, next to the script
//! (the Lua header says the same; `replies.rs` turns the codes into enums).
//! Loading them on the masters is the cluster's job; this module only names
//! them, so the hot path never hashes or copies script text. The lock
//! nodes' scripts are the lock module's (`lock/scripts.rs`).
//!
//! A script of the purchase's walk has a file of its own (`take.rs`,
//! `settle.rs`): its text, codes, decoded reply and a call built from
//! named keys and arguments, so a call site cannot put an argument in the
//! wrong place. `refusal.rs` and `record.rs` are what those scripts share;
//! `call.rs` is the one way an `EVALSHA` is built.

use crate::lua::code;
pub use crate::lua::LuaScript;

pub(crate) mod call;
pub(crate) mod purchase;
pub(crate) mod record;
pub(crate) mod refusal;
pub(crate) mod settle;
pub(crate) mod take;

/// `lua/create_bucket.lua`: create one bucket unless it exists.
const CREATE_BUCKET_LUA: &str = include_str!("../../../lua/create_bucket.lua");
/// Reply codes of `create_bucket.lua`.
pub mod create_bucket {
    /// Created now.
    pub const CREATED: i64 = 1;
    /// It existed; nothing changed.
    pub const EXISTED: i64 = 0;
}

/// `lua/restock.lua`: add units to one bucket, once per operation.
const RESTOCK_LUA: &str = include_str!("../../../lua/restock.lua");
/// Reply codes of `restock.lua`.
pub mod restock {
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
}

/// `lua/create_meta.lua`: claim a SKU and record a sale's plan.
const CREATE_META_LUA: &str = include_str!("../../../lua/create_meta.lua");
/// Reply codes of `create_meta.lua`.
pub mod create_meta {
    /// This operation claimed the SKU now.
    pub const CLAIMED: i64 = 1;
    /// This operation claimed it before.
    pub const RESUMED: i64 = 2;
    /// Another operation claimed it.
    pub const TAKEN: i64 = 3;
    /// This operation claimed it before with another plan.
    pub const MISMATCH: i64 = 4;
}

/// `lua/transition.lua`: pay, cancel or expire held orders of one bucket.
const TRANSITION_LUA: &str = include_str!("../../../lua/transition.lua");
/// Reply codes of `transition.lua`.
pub mod transition {
    /// Done now.
    pub const DONE: i64 = 1;
    /// Done before by the same call.
    pub const ALREADY: i64 = 2;
    /// A late payment took a unit again.
    pub const RETAKEN: i64 = 3;
    /// Expire: the order is not held.
    pub const NOT_HELD: i64 = 0;
    /// No such order.
    pub const UNKNOWN_ORDER: i64 = -1;
    /// Pay: the hold ended.
    pub const HOLD_ENDED: i64 = -2;
    /// Cancel: already final.
    pub const ALREADY_FINAL: i64 = -3;
    /// Pay: paid before with another reference.
    pub const PAYMENT_CONFLICT: i64 = -4;
    /// Expire: not due yet.
    pub const NOT_DUE: i64 = -5;
    /// No such sale in the bucket.
    pub const UNKNOWN_SALE: i64 = -6;
    /// Arguments refused.
    pub const BAD_ARGS: i64 = -7;
}

/// `lua/quota_return.lua`: give a buyer's quota back once, in the home
/// bucket (replies 1 now, 0 before, -7 bad arguments).
const QUOTA_RETURN_LUA: &str = include_str!("../../../lua/quota_return.lua");

/// `lua/ledger_snapshot.lua`: one bucket's ledger at one instant
/// (`{initial, stock, last_id}`, no code).
const LEDGER_SNAPSHOT_LUA: &str = include_str!("../../../lua/ledger_snapshot.lua");

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
}

impl Scripts {
    /// The scripts of this build.
    pub fn new() -> Self {
        Scripts {
            purchase: LuaScript::new("purchase", code("purchase", purchase::SOURCE)),
            take: LuaScript::new("take", take::SOURCE),
            settle: LuaScript::new("settle", settle::SOURCE),
            create_bucket: LuaScript::new("create_bucket", CREATE_BUCKET_LUA),
            restock: LuaScript::new("restock", code("restock", RESTOCK_LUA)),
            create_meta: LuaScript::new("create_meta", CREATE_META_LUA),
            ledger_snapshot: LuaScript::new("ledger_snapshot", LEDGER_SNAPSHOT_LUA),
            ack: LuaScript::new("ack", ACK_LUA),
            transition: LuaScript::new("transition", code("transition", TRANSITION_LUA)),
            quota_return: LuaScript::new("quota_return", QUOTA_RETURN_LUA),
            trim: LuaScript::new("trim", TRIM_LUA),
            dead_letter: LuaScript::new("dead_letter", DEAD_LETTER_LUA),
            forget_consumers: LuaScript::new("forget_consumers", FORGET_CONSUMERS_LUA),
        }
    }

    /// All scripts, for loading them on a node.
    pub fn all(&self) -> [&LuaScript; 13] {
        [
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
