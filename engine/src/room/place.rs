//! Places in a waiting line: a number, lower is earlier, exact in a double
//! (a sorted-set score and a Lua number) because every place is below
//! 2^53. Places below [`SHUFFLED_BELOW`] are the shuffled early joiners'
//! (a keyed hash of the user); places above are arrival stamps: this
//! process's clock in 1/1024 ms, made strictly increasing per process, so
//! one process never admits its joiners out of order. Across processes,
//! order follows their clocks; a place a round has already counted is never
//! handed out again (`lua/join.lua` lifts it above the shard's floor).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Shuffled places are `0..SHUFFLED_BELOW` (40 bits of a keyed hash).
pub(crate) const SHUFFLED_BELOW: u64 = 1 << 40;

/// Arrival stamps count from here (2023-11-14): a stamp of 2^40 + ms * 4096
/// stays below 2^53 until about the year 2090.
const STAMP_EPOCH_MS: u64 = 1_700_000_000_000;

/// Stamps per millisecond.
const PER_MS: u64 = 4096;

/// A place's last 6 bits name its line shard (`lua/join.lua` sets them),
/// so no two shards hand out the same place: a process steps its stamps by
/// this much (64 arrivals a millisecond before it runs ahead of its clock).
pub(crate) const SHARD_SLOTS: u64 = 64;

/// Arrival stamps are counted in histogram cells of 100 ms.
const CELL_STAMPS: u64 = 100 * PER_MS;

/// Shuffled places are counted in 1,024 cells of 2^30.
const SHUFFLED_CELL_SHIFT: u32 = 30;

/// The last stamp this process gave.
static LAST_STAMP: AtomicU64 = AtomicU64::new(0);

/// Milliseconds since the Unix epoch by this host's clock.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The arrival place of an instant (ms since the epoch), its shard bits 0.
pub fn arrival_place(unix_ms: u64) -> u64 {
    SHUFFLED_BELOW + unix_ms.saturating_sub(STAMP_EPOCH_MS) * PER_MS
}

/// A new arrival place, above every one this process gave before.
pub(crate) fn arrival() -> u64 {
    let now = arrival_place(unix_ms());
    let mut last = LAST_STAMP.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + SHARD_SLOTS);
        match LAST_STAMP.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// A place a join got, maybe lifted above a fence another process set
/// with a clock ahead of ours: later stamps of this process start above it,
/// so this process's next joins keep their order across shards (only joins
/// in flight together can still cross).
pub(crate) fn observe(place: u64) {
    let at = place - place % SHARD_SLOTS;
    LAST_STAMP.fetch_max(at, Ordering::Relaxed);
}

/// The histogram cell of a place (`lua/join.lua` computes the same).
pub(crate) fn cell(place: u64) -> u64 {
    if place < SHUFFLED_BELOW {
        place >> SHUFFLED_CELL_SHIFT
    } else {
        (SHUFFLED_BELOW >> SHUFFLED_CELL_SHIFT) + (place - SHUFFLED_BELOW) / CELL_STAMPS
    }
}

/// Where `place` lies inside its cell, in [0, 1): status reads count that
/// share of the cell's joins as ahead (joins spread over a cell: uniformly
/// for shuffled places, by arrival time for the others).
pub(crate) fn within_cell(place: u64) -> f64 {
    if place < SHUFFLED_BELOW {
        let width = 1u64 << SHUFFLED_CELL_SHIFT;
        (place % width) as f64 / width as f64
    } else {
        ((place - SHUFFLED_BELOW) % CELL_STAMPS) as f64 / CELL_STAMPS as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_increase_and_cells_follow_places() {
        let a = arrival();
        let b = arrival();
        assert!(b > a && a > SHUFFLED_BELOW && b < (1 << 53));
        assert_eq!(
            (a % SHARD_SLOTS, b % SHARD_SLOTS),
            (0, 0),
            "the shard's bits free"
        );
        assert_eq!(cell(0), 0);
        assert_eq!(cell(SHUFFLED_BELOW - 1), 1023);
        assert_eq!(cell(SHUFFLED_BELOW), 1024);
        assert_eq!(cell(SHUFFLED_BELOW + CELL_STAMPS), 1025);
        assert!(cell(a) <= cell(b));
        assert_eq!(within_cell(SHUFFLED_BELOW + CELL_STAMPS / 2), 0.5);
        assert_eq!(within_cell(3 << 30), 0.0);
    }
}
