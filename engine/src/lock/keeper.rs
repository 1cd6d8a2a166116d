//! One timer per client for every live grant, instead of a task per grant:
//! each grant has an entry, due when its watchdog must renew it or when its
//! fixed lease runs out, in one ordered map that one task of the client
//! sleeps on. Taking and giving back a lock then costs an insert and a
//! remove, not a task started and cancelled. Only the renewal itself, a
//! round on the nodes every ttl/3, runs in a task of its own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::client::{drift, Held, Inner};
use super::LockClient;
use crate::metrics as m;

/// When an entry is due (ms since client start), and a number that makes
/// two entries due in the same ms different.
type Due = (u64, u64);

/// The entries of every live grant of one client, by when they are due.
#[derive(Default)]
pub(super) struct Keeper {
    entries: Mutex<BTreeMap<Due, Arc<Held>>>,
    next_seq: AtomicU64,
    /// Wakes the timer task when an entry due before its alarm came in.
    sooner: Arc<Notify>,
    /// When the timer task wakes next (ms since client start): set and read
    /// under the entries' lock, so an entry put in between its look and its
    /// sleep is never missed. Entries given back do not move it, so most
    /// new entries (due later than the one before) wake nothing.
    alarm_ms: AtomicU64,
}

/// What keeps one grant: its entry in the keeper, the renewal or lease
/// round it has in flight, and whether it was given back (then nothing may
/// schedule or start anything for it again).
#[derive(Default)]
pub(super) struct Kept {
    given_back: bool,
    due: Option<Due>,
    round: Option<JoinHandle<()>>,
}

impl Keeper {
    fn entries(&self) -> MutexGuard<'_, BTreeMap<Due, Arc<Held>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `held`'s entry at `at_ms`, in place of the one it had; nothing
    /// once the grant was given back.
    fn schedule(&self, held: &Arc<Held>, at_ms: u64) {
        let mut kept = held.kept();
        let wake = self.schedule_kept(held, &mut kept, at_ms);
        drop(kept);
        self.wake_if(wake);
    }

    /// [`Keeper::schedule`] with `held`'s keeping already locked (so what
    /// decided `at_ms` and the move are one step); true when the timer
    /// task must be woken, once the lock is let go.
    fn schedule_kept(&self, held: &Arc<Held>, kept: &mut Kept, at_ms: u64) -> bool {
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

    fn wake_if(&self, wake: bool) {
        if wake {
            self.sooner.notify_one();
        }
    }

    /// Brings `held`'s entry forward to `at_ms` if it is due later. An
    /// entry being fired right now is rescheduled under the same lock, from
    /// the validity it reads there, so it cannot move back past this.
    pub(super) fn no_later_than(&self, held: &Arc<Held>, at_ms: u64) {
        let mut kept = held.kept();
        let later = kept.due.is_some_and(|(due, _)| due > at_ms);
        let wake = later && self.schedule_kept(held, &mut kept, at_ms);
        drop(kept);
        self.wake_if(wake);
    }

    /// The grant was given back: its entry goes, and a round it has in
    /// flight is stopped (a renewal must never extend a released lock).
    pub(super) fn give_back(&self, held: &Held) {
        let mut kept = held.kept();
        kept.given_back = true;
        if let Some(due) = kept.due.take() {
            self.entries().remove(&due);
        }
        if let Some(round) = kept.round.take() {
            round.abort();
        }
    }

    /// The timer task of the client `inner`: fires every entry that falls
    /// due, until the client is gone.
    pub(super) fn run(inner: &Arc<Inner>) -> impl std::future::Future<Output = ()> + Send {
        let (weak, waker) = (Arc::downgrade(inner), inner.keeper.sooner.clone());
        Keeper::fire_when_due(weak, waker)
    }

    async fn fire_when_due(inner: Weak<Inner>, waker: Arc<Notify>) {
        loop {
            let Some(client) = inner.upgrade().map(|inner| LockClient { inner }) else {
                return;
            };
            let keeper = &client.inner.keeper;
            // Listen before looking, so an entry put in after the look
            // still wakes us.
            let sooner = waker.notified();
            tokio::pin!(sooner);
            sooner.as_mut().enable();
            let now = client.now_ms();
            let (due, next) = {
                let mut entries = keeper.entries();
                let mut due = Vec::new();
                while let Some(entry) = entries.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let (key, held) = entry.remove_entry();
                    due.push((key, held));
                }
                // An hour when nothing is kept: a new entry wakes it.
                let next = entries
                    .first_key_value()
                    .map_or(now + 3_600_000, |(k, _)| k.0);
                keeper.alarm_ms.store(next, Ordering::Relaxed);
                (due, next)
            };
            for (key, held) in due {
                client.fire(key, held);
            }
            let sleep = Duration::from_millis(next.saturating_sub(client.now_ms()));
            // Not holding the client while asleep: it may go meanwhile.
            drop(client);
            tokio::select! {
                _ = &mut sooner => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }
}

impl Held {
    pub(super) fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LockClient {
    /// Starts keeping `held`: its entry, due when the watchdog must renew
    /// (under the watchdog) or when the fixed lease runs out. With
    /// `renew_first` (a fixed-lease grant handed over inside this process),
    /// first sets the holder's own lease on the nodes, behind it.
    pub(super) fn start_keeping(&self, held: &Arc<Held>, renew_first: bool) {
        self.ensure_timer();
        if held.leased {
            if renew_first {
                let (client, behind) = (self.clone(), held.clone());
                let round = tokio::spawn(async move {
                    let set = behind.lease_set.lock().await;
                    // Not over a lease the holder set itself meanwhile.
                    if !*set {
                        let _ = client.lease_round(&behind, behind.ttl).await;
                    }
                });
                held.kept().round = Some(round);
            }
            let until = held.valid_until_ms.load(Ordering::SeqCst);
            self.inner.keeper.schedule(held, until);
        } else {
            // The first renewal when it is due for the validity the grant
            // has (ttl/3 after the last renewal), and no later than ttl/3
            // from now: a grant handed over inside the process comes with
            // the validity of the one before, and restarting the clock at
            // every hand-off would renew never; and that validity may be
            // longer than the key (a renewal of the holder before, cut off
            // by its release, may have shortened an `extend` on the nodes).
            let due = held
                .valid_until_ms
                .load(Ordering::SeqCst)
                .saturating_sub((held.ttl * 2 / 3).as_millis() as u64);
            let every = (held.ttl / 3).as_millis() as u64;
            self.inner
                .keeper
                .schedule(held, due.min(self.now_ms() + every));
        }
    }

    /// The timer task runs on the runtime the client was made in. Should
    /// that runtime be gone (its tasks dropped with it) or the task have
    /// ended, it starts again on the caller's: grants taken here must not
    /// go unrenewed.
    fn ensure_timer(&self) {
        let mut timer = self.inner.timer.lock().unwrap_or_else(|p| p.into_inner());
        if timer.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *timer = Some(runtime.spawn(Keeper::run(&self.inner)));
        }
    }

    /// An entry fell due: a fixed lease that ran out is lost (one that
    /// `extend` pushed forward is due again then); a grant under the
    /// watchdog is renewed.
    fn fire(&self, key: Due, held: Arc<Held>) {
        let mut kept = held.kept();
        if kept.given_back || kept.due != Some(key) {
            return;
        }
        kept.due = None;
        if held.leased {
            // Read and rescheduled under the lock `cap_validity`'s move
            // takes too: a validity cut meanwhile is seen here, or moves
            // the entry after.
            let until = held.valid_until_ms.load(Ordering::SeqCst);
            if self.now_ms() < until {
                let keeper = &self.inner.keeper;
                let wake = keeper.schedule_kept(&held, &mut kept, until);
                drop(kept);
                keeper.wake_if(wake);
            } else {
                drop(kept);
                metrics::counter!(m::LOCK_LOST).increment(1);
                held.lost.send_replace(true);
            }
            return;
        }
        let client = self.clone();
        let renewing = held.clone();
        kept.round = Some(tokio::spawn(async move { client.renew(&renewing).await }));
    }

    /// One watchdog renewal: the lease again on a majority, and the next
    /// renewal ttl/3 later; the loss reported when a majority did not
    /// confirm within the validity.
    async fn renew(&self, held: &Arc<Held>) {
        let key = held.mode.hold_key(&held.name);
        let credential = held.mode.credential(&held.token).into_owned();
        let ttl_s = (held.ttl.as_millis().max(1) as u64).to_string();
        // One lease round at a time per grant (an `extend` too), so the
        // validity follows the order the nodes apply them in.
        let _round = held.lease_set.lock().await;
        self.cap_validity(held, held.ttl);
        let sent = Instant::now();
        let sent_ms = self.now_ms();
        let replies = self
            .on_all_nodes(
                held.mode.extend_script(&self.inner.scripts),
                &[&key],
                &[&credential, &ttl_s],
            )
            .await;
        let confirmed = replies
            .iter()
            .filter(|r| matches!(r.as_ref().map(crate::replies::lock_done), Ok(Ok(true))))
            .count();
        let still_valid = self.now_ms() < held.valid_until_ms.load(Ordering::SeqCst);
        if confirmed >= self.quorum() && still_valid {
            let validity = held.ttl.saturating_sub(sent.elapsed() + drift(held.ttl));
            held.valid_until_ms.store(
                self.now_ms() + validity.as_millis() as u64,
                Ordering::SeqCst,
            );
            metrics::counter!(m::LOCK_RENEWALS).increment(1);
            // From this round's start, not its end: a round that waited on
            // a slow node must not push the next one past a third of the
            // lease (a holder's reaper counts on renewals that keep pace).
            let every = (held.ttl / 3).as_millis() as u64;
            self.inner.keeper.schedule(held, sent_ms + every);
            return;
        }
        if held.kept().given_back {
            return;
        }
        // The loss first: a log line can block (a stderr nobody reads),
        // and the holder must hear of the loss whatever the log does.
        held.lost.send_replace(true);
        tracing::warn!(lock = %held.name, confirmed, "lock lost: renewal not confirmed by a majority");
        metrics::counter!(m::LOCK_LOST).increment(1);
    }
}
