//! What a lock call asks for (the lock alone, or a read-write lock's read or
//! write side), and, for each, the keys and scripts it uses on the nodes.
//! The rest of the lock code (attempts, the grant, the watchdog, release)
//! is the same for every kind; only these differ.

use std::borrow::Cow;

use super::scripts::LockScripts;
use crate::lua::LuaScript;

/// The key that records a lock's holder on a node (also the key of each
/// slot of a semaphore, which is a set of locks).
pub(super) fn lock_key(name: &str) -> String {
    format!("flashsale:lock:{name}")
}

/// The counter of clients waiting for a lock on a node.
fn waiters_key(name: &str) -> String {
    format!("flashsale:waiters:{name}")
}

/// A lock's fencing counter on a node.
fn fence_key(name: &str) -> String {
    format!("flashsale:fence:{name}")
}

/// The kind of hold a grant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Mode {
    /// The lock itself (plain or fair): one holder.
    Exclusive,
    /// A read-write lock's read side: many holders, no writer.
    Read,
    /// A read-write lock's write side: one holder, no readers.
    Write,
}

impl Mode {
    /// The key that records the holders on a node.
    pub(super) fn hold_key(self, name: &str) -> String {
        match self {
            Mode::Exclusive => lock_key(name),
            Mode::Read | Mode::Write => format!("flashsale:rw:{name}"),
        }
    }

    /// The node's fencing counter for `name`: a read-write lock counts apart
    /// from a lock of the same name.
    pub(super) fn fence_key(self, name: &str) -> String {
        match self {
            Mode::Exclusive => fence_key(name),
            Mode::Read | Mode::Write => format!("flashsale:rwfence:{name}"),
        }
    }

    /// How many clients wait (releases publish only when some do).
    pub(super) fn waiters_key(self, name: &str) -> String {
        match self {
            Mode::Exclusive => waiters_key(name),
            Mode::Read | Mode::Write => format!("flashsale:rwwaiters:{name}"),
        }
    }

    /// What a release publishes and a waiter listens for.
    pub(super) fn wake_name(self, name: &str) -> Cow<'_, str> {
        match self {
            Mode::Exclusive => Cow::Borrowed(name),
            Mode::Read | Mode::Write => Cow::Owned(format!("rw\0{name}")),
        }
    }

    /// The queue of waiters and its expiry index: the fair lock's queue, or
    /// a read-write lock's waiting writers (which have no index: their
    /// scores are their ends).
    pub(super) fn queue_keys(self, name: &str) -> (String, String) {
        match self {
            Mode::Exclusive => (
                format!("flashsale:fairq:{name}"),
                format!("flashsale:fairq-exp:{name}"),
            ),
            Mode::Read | Mode::Write => {
                let q = format!("flashsale:rwq:{name}");
                (q.clone(), q)
            }
        }
    }

    /// How a grant's token is named in release and renewal.
    pub(super) fn credential(self, token: &str) -> Cow<'_, str> {
        match self {
            Mode::Exclusive => Cow::Borrowed(token),
            Mode::Read => Cow::Owned(format!("r:{token}")),
            Mode::Write => Cow::Owned(format!("w:{token}")),
        }
    }

    pub(super) fn release_script(self, scripts: &LockScripts) -> &LuaScript {
        match self {
            Mode::Exclusive => &scripts.release,
            Mode::Read | Mode::Write => &scripts.rw_release,
        }
    }

    pub(super) fn extend_script(self, scripts: &LockScripts) -> &LuaScript {
        match self {
            Mode::Exclusive => &scripts.extend,
            Mode::Read | Mode::Write => &scripts.rw_extend,
        }
    }
}
