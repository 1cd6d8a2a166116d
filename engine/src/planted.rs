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
}

impl Plant {
    /// Every plant, with the name `--plant` takes.
    pub const ALL: [(&'static str, Plant); 4] = [
        ("skip-request-check", Plant::SkipRequestCheck),
        ("skip-wait", Plant::SkipWait),
        ("writer-ack-before-commit", Plant::WriterAckBeforeCommit),
        ("no-stock-check", Plant::NoStockCheck),
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

/// `purchase.lua` with its stock check removed (for [`Plant::NoStockCheck`]).
pub(crate) fn purchase_without_stock_check(code: &str) -> String {
    code.replace("if have < qty and buckets <= 1 then", "if false then")
        .replace("if have >= qty then", "if true then")
}
