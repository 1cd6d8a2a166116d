//! One `EVALSHA`, built in one place: keys first (they fix the slot), then
//! ARGV. Each script's file builds its call through it; the cluster sends
//! it (`Cluster::call`).

use redis::{Cmd, ToRedisArgs};

use crate::lua::LuaScript;

/// One `EVALSHA` of a script whose keys all hash to one slot: the one place
/// such a call is built. Keys come first (they fix the slot), then ARGV.
pub(crate) struct ScriptCall<'s> {
    pub(crate) script: &'s LuaScript,
    pub(crate) slot: u16,
    pub(crate) cmd: Cmd,
}

impl<'s> ScriptCall<'s> {
    /// An `EVALSHA` of `script` with `keys`, all in `slot`.
    pub(crate) fn new(script: &'s LuaScript, slot: u16, keys: &[&str]) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha).arg(keys.len()).arg(keys);
        ScriptCall { script, slot, cmd }
    }

    /// Appends one ARGV value.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}
