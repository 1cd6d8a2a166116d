//! Deliberately broken behaviours, to prove that `flashsale-chaos` (the
//! random-history checker in `tests/`) can fail: each one breaks one promise
//! the checker must then report. Compiled only with the `planted-bugs`
//! feature; a default build contains none of this, and even a planted build
//! behaves correctly until [`plant`] is called.

use std::sync::atomic::{AtomicU8, Ordering};

/// One planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Plant {
    /// Every attempt gets a fresh record key: a retry is a new purchase.
    SkipRequestCheck = 1,
    /// `ack = replicated` confirms without waiting for a replica.
    SkipWait = 2,
    /// The order writer acknowledges entries before its insert commits, and
    /// drops the batch when the insert fails.
    WriterAckBeforeCommit = 3,
    /// `purchase.lua` takes stock without checking there is enough.
    NoStockCheck = 4,
    /// `transition.lua` gives a cancelled order's units back again on every
    /// repeated cancel, not only on the one that left `held`.
    CancelReturnsTwice = 5,
    /// `purchase.lua` skips the per-user limit (the quota is still kept).
    SkipQuotaCheck = 6,
    /// `lock_acquire.lua` takes a lock with SET PX, without NX: a held
    /// lock is overwritten, so two holders hold it at once.
    LockWithoutNx = 7,
    /// `restock.lua` forgets which operations it applied: a retried restock
    /// adds its units again.
    RestockTwice = 8,
    /// `transition.lua` takes a hold as due half a second before its
    /// deadline: a payment or cancel in that half second finds it expired.
    ExpireEarly = 9,
    /// `purchase.lua` sells from a closed bucket as from an open one.
    SellAfterClose = 10,
    /// `lock_release.lua` answers "released" and deletes nothing: a waiter
    /// gets in only once the lease runs out. Only for the chaos workload's
    /// locks (`chaos-lock-*`): the engine's own admin lock keeps working,
    /// so the rest of the run goes on and the check is seen alone.
    ReleaseKeepsLock = 11,
    /// `take.lua` (a walk into another bucket) takes when the bucket holds
    /// one unit fewer than asked: a bucket goes a unit below zero, which a
    /// later restock of it can cover while the sale never ran short.
    TakeOneShort = 12,
}

impl Plant {
    /// Every plant, with the name `--plant` takes.
    pub const ALL: [(&'static str, Plant); 12] = [
        ("skip-request-check", Plant::SkipRequestCheck),
        ("skip-wait", Plant::SkipWait),
        ("writer-ack-before-commit", Plant::WriterAckBeforeCommit),
        ("no-stock-check", Plant::NoStockCheck),
        ("cancel-returns-twice", Plant::CancelReturnsTwice),
        ("skip-quota-check", Plant::SkipQuotaCheck),
        ("lock-without-nx", Plant::LockWithoutNx),
        ("restock-twice", Plant::RestockTwice),
        ("expire-early", Plant::ExpireEarly),
        ("sell-after-close", Plant::SellAfterClose),
        ("release-keeps-lock", Plant::ReleaseKeepsLock),
        ("take-one-short", Plant::TakeOneShort),
    ];

    /// The plant called `name`.
    pub fn from_name(name: &str) -> Option<Plant> {
        Plant::ALL.iter().find(|(n, _)| *n == name).map(|&(_, p)| p)
    }
}

static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Switches `plant` on for this whole process. Call before connecting an
/// engine (the scripts are chosen at connect time).
pub fn plant(plant: Plant) {
    ACTIVE.store(plant as u8, Ordering::SeqCst);
}

/// True when `plant` is switched on.
pub fn active(plant: Plant) -> bool {
    ACTIVE.load(Ordering::Relaxed) == plant as u8
}

/// The text of script `name` with the active plant's break, or None when
/// no plant touches it.
pub(crate) fn rewrite(name: &str, code: &str) -> Option<String> {
    let plant = Plant::ALL.iter().map(|&(_, p)| p).find(|p| active(*p))?;
    let broken = match (name, plant) {
        ("purchase", Plant::NoStockCheck) => purchase_without_stock_check(code),
        ("purchase", Plant::SkipQuotaCheck) => purchase_without_quota_check(code),
        ("purchase", Plant::SellAfterClose) => {
            replace_once(code, "local open = sale[1] == 'open'", "local open = true")
        }
        ("lock_acquire", Plant::LockWithoutNx) => lock_acquire_without_nx(code),
        ("lock_release", Plant::ReleaseKeepsLock) => replace_once(
            code,
            "  redis.call('DEL', KEYS[1])\n",
            "  if not string.find(KEYS[1], 'chaos-lock', 1, true) then redis.call('DEL', KEYS[1]) end\n",
        ),
        ("transition", Plant::CancelReturnsTwice) => transition_returning_twice(code),
        ("transition", Plant::ExpireEarly) => replace_once(
            code,
            "local due = now_ms >= expires_ms",
            "local due = now_ms + 500 >= expires_ms",
        ),
        ("take", Plant::TakeOneShort) => replace_once(
            code,
            "or stock < qty or",
            "or stock + 1 < qty or",
        ),
        ("restock", Plant::RestockTwice) => replace_once(
            code,
            "local done = redis.call('HGET', KEYS[1], 'op:' .. ARGV[2])",
            "local done = false",
        ),
        _ => return None,
    };
    Some(broken)
}

/// `code` with `from` (which must be there: a changed script must not
/// leave its plant silently unplanted) replaced by `to`.
fn replace_once(code: &str, from: &str, to: &str) -> String {
    assert!(
        code.contains(from),
        "a script changed: update its plant ({from})"
    );
    code.replacen(from, to, 1)
}

/// `purchase.lua` with its stock check removed (for [`Plant::NoStockCheck`]).
fn purchase_without_stock_check(code: &str) -> String {
    code.replace("if have < qty and buckets <= 1 then", "if false then")
        .replace("if have >= qty then", "if true then")
}

/// `purchase.lua` with its per-user limit check removed (for
/// [`Plant::SkipQuotaCheck`]).
fn purchase_without_quota_check(code: &str) -> String {
    let check = "    if used + qty > limit then";
    assert!(
        code.contains(check),
        "purchase.lua changed: update the plant"
    );
    code.replace(check, "    if false then")
}

/// `lock_acquire.lua` whose SET overwrites a held lock (for
/// [`Plant::LockWithoutNx`]).
fn lock_acquire_without_nx(code: &str) -> String {
    let set = "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";
    assert!(
        code.contains(set),
        "lock_acquire.lua changed: update the plant"
    );
    code.replace(set, "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])")
}

/// `transition.lua` whose repeated cancel gives the units back again (for
/// [`Plant::CancelReturnsTwice`]).
fn transition_returning_twice(code: &str) -> String {
    let replay = "    if state == 'cancelled' then\n      return {2, state, expires_ms, 0}";
    let twice = "    if state == 'cancelled' then\n      redis.call('INCRBY', KEYS[2], qty)\n      return {2, state, expires_ms, 0}";
    assert!(
        code.contains(replay),
        "transition.lua changed: update the plant"
    );
    code.replace(replay, twice)
}
