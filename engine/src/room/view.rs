//! One process's snapshot of a room: the gate (cursor, counts, the rounds
//! still in their window, the state) and the line's histogram, read at most
//! every [`VIEW_MAX_AGE_MS`] and shared by every status read in between, so
//! a million waiting clients cost the cluster a few reads per process per
//! second, not one per poll. What a ticket reads is computed here from the
//! snapshot and the ticket's signed place alone: the place is in the
//! ticket, so a line entry lost in a failover loses nobody's place.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::place;
use super::spec::{QueueRate, QueueSpec};

/// How old a snapshot may be before a status read refreshes it.
pub(crate) const VIEW_MAX_AGE_MS: u64 = 100;

/// Longest estimate given: a year.
const MAX_ETA_MS: f64 = 365.0 * 24.0 * 3600.0 * 1000.0;

/// Admissions counted for the measured rate: the rounds of the last 10 s.
const RATE_SPAN_MS: u64 = 10_000;

/// A sale's room as one process holds it: the settings, and the latest
/// snapshot of the gate that every status read in this process shares.
#[derive(Debug)]
pub(crate) struct Room {
    pub(crate) spec: QueueSpec,
    /// The sale's start (ms since the epoch; 0 = from creation): shuffled
    /// places before it, no admission before it.
    pub(crate) starts_ms: u64,
    view: Mutex<Option<Arc<RoomView>>>,
    /// Held by the one status read that refreshes the snapshot; the others
    /// wait for it rather than all reading Redis at once.
    pub(crate) refresh: tokio::sync::Mutex<()>,
}

impl Room {
    pub(crate) fn new(spec: QueueSpec, starts_ms: u64) -> Room {
        Room {
            spec,
            starts_ms,
            view: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn fresh(&self, now_ms: u64) -> Option<Arc<RoomView>> {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        view.as_ref()
            .filter(|v| now_ms.saturating_sub(v.read_ms) < VIEW_MAX_AGE_MS)
            .cloned()
    }

    pub(crate) fn store(&self, view: Arc<RoomView>) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
    }

    pub(crate) fn configured_rate(&self) -> Option<f64> {
        match self.spec.rate {
            QueueRate::PerSecond(r) => Some(r),
            QueueRate::Auto => None,
        }
    }
}

/// What a ticket reads.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// In line.
    Waiting,
    /// May buy until `admitted_until_ms`.
    Admitted,
    /// The stock is at 0 (a restock, or holds coming back, reopen it).
    SoldOut,
    /// Admitted, and the window has passed.
    Expired,
}

/// The gate and the histogram at one instant.
#[derive(Debug, Clone, Default)]
pub(crate) struct RoomView {
    /// When it was read (this host's clock, ms since the epoch).
    pub(crate) read_ms: u64,
    pub(crate) sold_out: bool,
    /// Every place at or below it is admitted.
    pub(crate) cursor: u64,
    /// Every place at or below it was admitted in a round whose window has
    /// passed.
    pub(crate) expired_cursor: u64,
    /// Rounds still in their window: (cursor, Redis ms of the round, count).
    pub(crate) rounds: Vec<(u64, u64, u64)>,
    pub(crate) admitted: u64,
    /// Admitted and not yet done.
    pub(crate) open: u64,
    pub(crate) flips: u64,
    /// Joins per histogram cell, over every shard.
    pub(crate) cells: BTreeMap<u64, u64>,
    pub(crate) joined: u64,
}

/// A ticket's reading of a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    pub(crate) state: QueueState,
    /// 1 is first; counted to within the joins of one histogram cell.
    pub(crate) position: u64,
    /// Still waiting before this place.
    pub(crate) ahead: u64,
    pub(crate) eta_ms: Option<u64>,
    /// Deadline of an admission (ms since the epoch, Redis time).
    pub(crate) until_ms: Option<u64>,
}

fn num(fields: &HashMap<String, String>, k: &str) -> u64 {
    fields.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl RoomView {
    /// The view from the gate's hash and each shard's histogram hash.
    pub(crate) fn from_hashes(
        read_ms: u64,
        gate: &HashMap<String, String>,
        shards: &[HashMap<String, String>],
    ) -> RoomView {
        let mut rounds: Vec<(u64, u64, u64)> = gate
            .iter()
            .filter_map(|(k, v)| {
                let id = k.strip_prefix("t:")?.parse().ok()?;
                Some((id, v.parse().ok()?, num(gate, &format!("c:{id}"))))
            })
            .collect();
        rounds.sort_unstable();
        let mut cells = BTreeMap::new();
        let mut joined = 0;
        for shard in shards {
            for (k, v) in shard {
                if let (Some(cell), Ok(n)) = (
                    k.strip_prefix('h').and_then(|c| c.parse::<u64>().ok()),
                    v.parse::<u64>(),
                ) {
                    *cells.entry(cell).or_insert(0) += n;
                    joined += n;
                }
            }
        }
        RoomView {
            read_ms,
            sold_out: gate.get("state").map(String::as_str) == Some("sold_out"),
            cursor: num(gate, "cursor"),
            expired_cursor: num(gate, "expired_cursor"),
            rounds,
            admitted: num(gate, "admitted"),
            open: num(gate, "open"),
            flips: num(gate, "flips"),
            cells,
            joined,
        }
    }

    /// Admissions per second over the rounds of the last 10 s (Redis
    /// time): those after the first such round, over the time since it;
    /// `None` with fewer than two rounds.
    pub(crate) fn measured_rate(&self) -> Option<f64> {
        let last = self.rounds.last()?.1;
        let since = last.saturating_sub(RATE_SPAN_MS);
        let mut recent = self.rounds.iter().filter(|r| r.1 > since);
        let first = recent.next()?.1;
        let later: u64 = recent.map(|r| r.2).sum();
        let span = last.saturating_sub(first);
        (span > 0 && later > 0).then(|| later as f64 * 1000.0 / span as f64)
    }

    /// Joins before `place`: every earlier cell's, and of its own cell
    /// the share that lies before it.
    fn before(&self, place: u64) -> u64 {
        let cell = place::cell(place);
        let below: u64 = self.cells.range(..cell).map(|(_, n)| n).sum();
        let own = self.cells.get(&cell).copied().unwrap_or(0);
        below + (own as f64 * place::within_cell(place)) as u64
    }

    /// Still waiting in the line.
    pub(crate) fn waiting(&self) -> u64 {
        self.joined.saturating_sub(self.admitted)
    }

    /// What the ticket of `place` reads at `now_ms`, given the room's
    /// window and its configured rate (for the estimate before any round).
    pub(crate) fn read(
        &self,
        place: u64,
        now_ms: u64,
        window_ms: u64,
        rate: Option<f64>,
    ) -> Reading {
        let position = self.before(place) + 1;
        let waiting = |state| Reading {
            state,
            position,
            ahead: 0,
            eta_ms: None,
            until_ms: None,
        };
        if place <= self.cursor {
            if place <= self.expired_cursor {
                return waiting(QueueState::Expired);
            }
            let Some(&(_, at, _)) = self.rounds.iter().find(|r| r.0 >= place) else {
                return waiting(QueueState::Expired);
            };
            let until = at + window_ms;
            if now_ms >= until {
                return waiting(QueueState::Expired);
            }
            if self.sold_out {
                return waiting(QueueState::SoldOut);
            }
            return Reading {
                until_ms: Some(until),
                ..waiting(QueueState::Admitted)
            };
        }
        if self.sold_out {
            return waiting(QueueState::SoldOut);
        }
        let ahead = position.saturating_sub(1).saturating_sub(self.admitted);
        let eta_ms = self
            .measured_rate()
            .or(rate)
            .filter(|r| *r > 0.0)
            .map(|r| (ahead as f64 * 1000.0 / r).min(MAX_ETA_MS) as u64);
        Reading {
            ahead,
            eta_ms,
            ..waiting(QueueState::Waiting)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_ticket_reads_waiting_admitted_expired_and_sold_out() {
        let p = |i: u64| (i << 30) + 5;
        let gate = hashes(&[
            ("cursor", &p(3).to_string()),
            ("admitted", "4"),
            ("open", "4"),
            (&format!("t:{}", p(3)), "10000"),
            (&format!("c:{}", p(3)), "4"),
        ]);
        let shard = hashes(&[
            ("f", "0"),
            ("h0", "1"),
            ("h1", "1"),
            ("h2", "1"),
            ("h3", "1"),
            ("h7", "2"),
        ]);
        let view = RoomView::from_hashes(0, &gate, &[shard]);
        assert_eq!(view.joined, 6);
        assert_eq!(view.waiting(), 2);
        let r = view.read(p(2), 10_500, 1_000, None);
        assert_eq!((r.state, r.until_ms), (QueueState::Admitted, Some(11_000)));
        assert_eq!(
            view.read(p(2), 11_000, 1_000, None).state,
            QueueState::Expired
        );
        // Half-way through cell 7, whose two joins are one before, one after.
        let w = view.read((7 << 30) + (1 << 29), 10_500, 1_000, Some(2.0));
        assert_eq!(w.state, QueueState::Waiting);
        assert_eq!((w.position, w.ahead), (6, 1));
        assert_eq!(w.eta_ms, Some(500), "one round: the configured 2 a second");
        let mut two = view.clone();
        two.rounds.push((p(4), 12_000, 8));
        assert_eq!(
            two.measured_rate(),
            Some(4.0),
            "8 admitted in the 2 s after the first round"
        );
        let mut sold = view.clone();
        sold.sold_out = true;
        assert_eq!(
            sold.read(p(7), 10_500, 1_000, None).state,
            QueueState::SoldOut
        );
        assert_eq!(
            sold.read(p(2), 10_500, 1_000, None).state,
            QueueState::SoldOut
        );
        sold.expired_cursor = p(3);
        assert_eq!(
            sold.read(p(2), 10_500, 1_000, None).state,
            QueueState::Expired
        );
    }
}
