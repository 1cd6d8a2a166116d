//! The Lua scripts of `lua/`, compiled in, with their SHA1 digests. Loading
//! them on the masters is the engine's job; this module only names them, so
//! the hot path never hashes or copies script text.

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

/// Every script the engine runs.
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
}

impl Scripts {
    /// The scripts of this build.
    pub fn new() -> Self {
        Scripts {
            purchase: LuaScript::new("purchase", purchase_code()),
            take: LuaScript::new("take", include_str!("../../lua/take.lua")),
            settle: LuaScript::new("settle", include_str!("../../lua/settle.lua")),
            create_bucket: LuaScript::new(
                "create_bucket",
                include_str!("../../lua/create_bucket.lua"),
            ),
            restock: LuaScript::new("restock", include_str!("../../lua/restock.lua")),
            create_meta: LuaScript::new("create_meta", include_str!("../../lua/create_meta.lua")),
            ledger_snapshot: LuaScript::new(
                "ledger_snapshot",
                include_str!("../../lua/ledger_snapshot.lua"),
            ),
            ack: LuaScript::new("ack", include_str!("../../lua/ack.lua")),
        }
    }

    /// All scripts, for loading them on a node.
    pub fn all(&self) -> [&LuaScript; 8] {
        [
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

/// The text of `lua/purchase.lua` (in a `planted-bugs` build, possibly
/// broken on purpose; see `crate::planted`).
fn purchase_code() -> &'static str {
    let code = include_str!("../../lua/purchase.lua");
    #[cfg(feature = "planted-bugs")]
    if crate::planted::active(crate::planted::Plant::NoStockCheck) {
        // Leaked once per engine: only planted test builds ever get here.
        return Box::leak(crate::planted::purchase_without_stock_check(code).into_boxed_str());
    }
    code
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
