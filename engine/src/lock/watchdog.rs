//! A held lock's lease and its release: `extend`, the lease round that it,
//! the watchdog (`keeper.rs`) and a hand-off share, and release: to the
//! next task of this process while the cohort lasts, otherwise on the
//! nodes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::*;
use super::mode::Mode;
use super::waiters::CHANNEL;
use super::{LockClient, LockError};

impl LockClient {
    /// Sets the lease of a live grant to `lease` from now, on a majority.
    /// Refused once the grant is lost: a lease that ran out is not revived,
    /// even where a node still has the key.
    pub(super) async fn extend_held(
        &self,
        held: &Arc<Held>,
        lease: Duration,
    ) -> Result<(), LockError> {
        check_lease(lease)?;
        let mut set = held.lease_set.lock().await;
        *set = true;
        self.lease_round(held, lease).await
    }

    /// Before a round that sets `lease` from now: whether it reaches a node
    /// or not (a timeout, a cancelled future), no node will keep the key
    /// for less than this or than what it had, so the validity must not
    /// promise more until a majority confirms. A round may shorten the
    /// lease (an `extend` to less, a watchdog renewal after an `extend`).
    pub(super) fn cap_validity(&self, held: &Arc<Held>, lease: Duration) {
        let cap = self.now_ms() + lease.saturating_sub(drift(lease)).as_millis() as u64;
        held.valid_until_ms.fetch_min(cap, Ordering::SeqCst);
        if held.leased {
            // A fixed lease is lost when the validity runs out: now sooner.
            self.inner.keeper.no_later_than(held, cap);
        }
    }

    /// One round setting `lease` from now on a majority; the validity
    /// follows what they confirmed.
    pub(super) async fn lease_round(
        &self,
        held: &Arc<Held>,
        lease: Duration,
    ) -> Result<(), LockError> {
        let expired = || LockError::Expired {
            name: held.name.clone(),
        };
        if *held.lost.borrow() || self.now_ms() >= held.valid_until_ms.load(Ordering::SeqCst) {
            return Err(expired());
        }
        self.cap_validity(held, lease);
        let sent = Instant::now();
        let lease_ms = (lease.as_millis().max(1) as u64).to_string();
        let replies = self
            .on_all_nodes(
                held.mode.extend_script(&self.inner.scripts),
                &[&held.mode.hold_key(&held.name)],
                &[&held.mode.credential(&held.token), &lease_ms],
            )
            .await;
        let confirmed = replies
            .iter()
            .filter(|r| matches!(r.as_ref().map(super::scripts::lock_done), Ok(Ok(true))))
            .count();
        if confirmed < self.quorum() {
            return Err(expired());
        }
        let validity = lease.saturating_sub(sent.elapsed() + drift(lease));
        held.valid_until_ms.store(
            self.now_ms() + validity.as_millis() as u64,
            Ordering::SeqCst,
        );
        Ok(())
    }

    /// Releases one reentrant hold; the last one stops the watchdog (first,
    /// so it never renews a released lock) and releases on every node.
    /// Returns false when no node still had this grant.
    pub(super) async fn release_held(&self, held: &Arc<Held>) -> bool {
        // Whether the grant was still ours, judged before anything is given
        // back: a lease that ended is not reported released, even if a node
        // that ran our acquire late still has it.
        let valid =
            !*held.lost.borrow() && self.now_ms() < held.valid_until_ms.load(Ordering::SeqCst);
        {
            // The count and the map change together, under the map's lock,
            // where `reenter` counts in: a reentry either comes before the
            // last release (and keeps the hold) or finds no hold to re-enter.
            let mut map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.count.fetch_sub(1, Ordering::SeqCst) > 1 {
                return valid;
            }
            if let Some(holds) = map.get_mut(&held.name) {
                holds.retain(|h| !Arc::ptr_eq(h, held));
                if holds.is_empty() {
                    map.remove(&held.name);
                }
            }
        }
        self.inner.keeper.give_back(held);
        let mut pass = held.gate.lock().unwrap_or_else(|p| p.into_inner()).take();
        if valid && self.cohort_goes_on(held) {
            if let Some(p) = pass.as_mut() {
                // Lock cohorting: the next task of this process takes the
                // grant as it is, with the next reserved token. If no waiter
                // is left to take it, it is released below, before returning.
                match p.hand_over(Baton::new(self.clone(), held.clone())) {
                    Ok(()) => return true,
                    Err(baton) => drop(baton.into_held()),
                }
            }
        }
        let released = self
            .release_on_nodes(held.mode, &held.name, &held.token, None)
            .await;
        // Only now may the next task of this process go.
        if let Some(pass) = pass {
            pass.release(released.others_wait);
        }
        self.forget_gate(&held.name);
        valid && released.count >= self.quorum()
    }

    /// Whether a grant may still pass to another task of this process: a
    /// reserved token is left, and the cohort is younger than its window.
    fn cohort_goes_on(&self, held: &Held) -> bool {
        held.fence < held.fence_last
            && self.now_ms().saturating_sub(held.cohort_since_ms)
                < self.inner.config.cohort_window.as_millis() as u64
    }

    /// Compare-and-delete of `token` on every node (or only on `only`);
    /// returns how many released.
    pub(super) async fn release_token(
        &self,
        mode: Mode,
        name: &str,
        token: &str,
        only: Option<&[usize]>,
    ) -> usize {
        self.release_on_nodes(mode, name, token, only).await.count
    }

    /// [`LockClient::release_token`], and whether any node said others wait.
    async fn release_on_nodes(
        &self,
        mode: Mode,
        name: &str,
        token: &str,
        only: Option<&[usize]>,
    ) -> Released {
        use super::scripts::LockRelease;
        let (key, wkey) = (mode.hold_key(name), mode.waiters_key(name));
        let replies = self
            .on_nodes(
                mode.release_script(&self.inner.scripts),
                &[&key, &wkey],
                &[&mode.credential(token), CHANNEL, &mode.wake_name(name)],
                only,
            )
            .await;
        let mut out = Released {
            count: 0,
            others_wait: false,
        };
        for r in &replies {
            match r.as_ref().map(super::scripts::lock_release) {
                Ok(Ok(LockRelease::Released)) => out.count += 1,
                Ok(Ok(LockRelease::ReleasedToWaiters)) => {
                    out.count += 1;
                    out.others_wait = true;
                }
                _ => {}
            }
        }
        out
    }
}

/// What a release on the nodes did.
struct Released {
    /// Nodes that released.
    count: usize,
    /// Some node woke clients waiting for the lock.
    others_wait: bool,
}
