//! One timer per client for every live grant, instead of a task per grant:
//! each grant has an entry, due when its watchdog must renew it or when its
//! fixed lease runs out, in one ordered map that one task of the client
//! sleeps on. Taking and giving back a lock then costs an insert and a
//! remove, not a task started and cancelled. Only the renewal itself, a
//! round on the nodes every ttl/3, runs in a task of its own.

//!
//! This file is the schedule alone, over any grant that says where its
//! keeping is ([`Keepable`]); `renewal.rs` is the timer task and what it
//! does when an entry falls due.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// When an entry is due (ms since client start), and a number that makes
/// two entries due in the same ms different.
pub(super) type Due = (u64, u64);

/// A grant the keeper can keep: it says where its [`Kept`] is.
pub(super) trait Keepable {
    fn kept(&self) -> MutexGuard<'_, Kept>;
}

/// The entries of every live grant of one client, by when they are due.
pub(super) struct Keeper<T> {
    entries: Mutex<BTreeMap<Due, Arc<T>>>,
    next_seq: AtomicU64,
    /// Wakes the timer task when an entry due before its alarm came in.
    sooner: Arc<Notify>,
    /// When the timer task wakes next (ms since client start): set and read
    /// under the entries' lock, so an entry put in between its look and its
    /// sleep is never missed. Entries given back do not move it, so most
    /// new entries (due later than the one before) wake nothing.
    alarm_ms: AtomicU64,
}

impl<T> Default for Keeper<T> {
    fn default() -> Self {
        Keeper {
            entries: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
            sooner: Arc::new(Notify::new()),
            alarm_ms: AtomicU64::new(0),
        }
    }
}

/// What keeps one grant: its entry in the keeper, the renewal or lease
/// round it has in flight, and whether it was given back (then nothing may
/// schedule or start anything for it again).
#[derive(Default)]
pub(super) struct Kept {
    pub(super) given_back: bool,
    pub(super) due: Option<Due>,
    pub(super) round: Option<JoinHandle<()>>,
}

impl<T: Keepable> Keeper<T> {
    fn entries(&self) -> MutexGuard<'_, BTreeMap<Due, Arc<T>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `held`'s entry at `at_ms`, in place of the one it had; nothing
    /// once the grant was given back.
    pub(super) fn schedule(&self, held: &Arc<T>, at_ms: u64) {
        let mut kept = held.kept();
        let wake = self.schedule_kept(held, &mut kept, at_ms);
        drop(kept);
        self.wake_if(wake);
    }

    /// [`Keeper::schedule`] with `held`'s keeping already locked (so what
    /// decided `at_ms` and the move are one step); true when the timer
    /// task must be woken, once the lock is let go.
    pub(super) fn schedule_kept(&self, held: &Arc<T>, kept: &mut Kept, at_ms: u64) -> bool {
        if kept.given_back {
            return false;
        }
        let due = (at_ms, self.next_seq.fetch_add(1, Ordering::Relaxed));
        let mut entries = self.entries();
        if let Some(old) = kept.due.take() {
            entries.remove(&old);
        }
        entries.insert(due, held.clone());
        kept.due = Some(due);
        at_ms < self.alarm_ms.load(Ordering::Relaxed)
    }

    pub(super) fn wake_if(&self, wake: bool) {
        if wake {
            self.sooner.notify_one();
        }
    }

    /// Brings `held`'s entry forward to `at_ms` if it is due later. An
    /// entry being fired right now is rescheduled under the same lock, from
    /// the validity it reads there, so it cannot move back past this.
    pub(super) fn no_later_than(&self, held: &Arc<T>, at_ms: u64) {
        let mut kept = held.kept();
        let later = kept.due.is_some_and(|(due, _)| due > at_ms);
        let wake = later && self.schedule_kept(held, &mut kept, at_ms);
        drop(kept);
        self.wake_if(wake);
    }

    /// The grant was given back: its entry goes, and a round it has in
    /// flight is stopped (a renewal must never extend a released lock).
    pub(super) fn give_back(&self, held: &T) {
        let mut kept = held.kept();
        kept.given_back = true;
        if let Some(due) = kept.due.take() {
            self.entries().remove(&due);
        }
        if let Some(round) = kept.round.take() {
            round.abort();
        }
    }

    /// Takes out every entry due at `now_ms`; with them, when the next
    /// one is due (an hour on when none is: a new entry wakes the timer),
    /// which is also the alarm a sooner entry must beat to wake it.
    pub(super) fn take_due(&self, now_ms: u64) -> (Vec<(Due, Arc<T>)>, u64) {
        let mut entries = self.entries();
        let mut due = Vec::new();
        while let Some(entry) = entries.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            due.push(entry.remove_entry());
        }
        let next = entries
            .first_key_value()
            .map_or(now_ms + 3_600_000, |(k, _)| k.0);
        self.alarm_ms.store(next, Ordering::Relaxed);
        (due, next)
    }

    /// What wakes the timer task when an entry due sooner comes in.
    pub(super) fn sooner(&self) -> Arc<Notify> {
        self.sooner.clone()
    }
}
