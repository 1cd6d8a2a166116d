//! What the lock client does when a grant's entry in its keeper falls
//! due: the one timer task per client that sleeps on the keeper, the
//! watchdog's renewal round every ttl/3, and the loss of a fixed lease that
//! ran out. The schedule itself is `keeper.rs`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::client::{drift, Held, Inner};
use super::keeper::{Due, Keepable};
use super::LockClient;
use crate::metrics as m;

/// The timer task of the client `inner`: fires every entry that falls
/// due, until the client is gone.
pub(super) fn run(inner: &Arc<Inner>) -> impl std::future::Future<Output = ()> + Send {
    let (weak, waker) = (Arc::downgrade(inner), inner.keeper.sooner());
    fire_when_due(weak, waker)
}

async fn fire_when_due(inner: Weak<Inner>, waker: Arc<Notify>) {
    loop {
        let Some(client) = inner.upgrade().map(|inner| LockClient { inner }) else {
            return;
        };
        // Listen before looking, so an entry put in after the look
        // still wakes us.
        let sooner = waker.notified();
        tokio::pin!(sooner);
        sooner.as_mut().enable();
        let (due, next) = client.inner.keeper.take_due(client.now_ms());
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

    /// The timer task starts on the runtime of the first grant kept.
    /// Should that runtime be gone (its tasks dropped with it) or the task
    /// have ended, it starts again on the caller's: grants taken here must
    /// not go unrenewed.
    fn ensure_timer(&self) {
        let mut timer = self.inner.timer.lock().unwrap_or_else(|p| p.into_inner());
        if timer.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *timer = Some(runtime.spawn(run(&self.inner)));
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
            .filter(|r| matches!(r.as_ref().map(super::scripts::lock_done), Ok(Ok(true))))
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
