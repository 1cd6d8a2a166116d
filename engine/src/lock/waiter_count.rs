//! A lock call's place among the lock's waiters: releases publish a
//! wake-up only while someone waits, so a call counts itself in on the
//! nodes while it waits and out again however it ends (`CountedIn`, whose
//! drop counts it out off the caller's path).

use std::time::Duration;

use super::client::*;
use super::mode::Mode;
use super::LockClient;

/// How long a waiter count lives (ms): a little past the longest wait, and
/// never past a day (a wait of `Duration::MAX` means "as long as it takes").
pub(super) fn count_ttl_ms(wait: Duration) -> u128 {
    (wait.min(MAX_LEASE) + Duration::from_secs(5)).as_millis()
}

/// Where a lock call counted itself among the lock's waiters (so that
/// releases wake it), to be counted out of again.
pub(super) enum Counted {
    No,
    /// On every node, by a round of its own.
    Everywhere,
    /// On these nodes, by the attempt they refused.
    On(Vec<usize>),
}

/// A call's place in the waiter counts: dropped (the call ended, or its
/// future was dropped mid-wait), it counts the call out in a clean-up
/// [`LockClient::settle`] waits for, so a waiter stopped by a signal does
/// not leave releases publishing to nobody until the count's lease ends.
pub(super) struct CountedIn {
    pub(super) client: LockClient,
    pub(super) mode: Mode,
    pub(super) name: String,
    pub(super) wait: Duration,
    pub(super) state: Counted,
}

impl CountedIn {
    /// Where it counted in, leaving nothing for the drop to count out.
    pub(super) fn take(&mut self) -> Counted {
        std::mem::replace(&mut self.state, Counted::No)
    }
}

impl Drop for CountedIn {
    fn drop(&mut self) {
        let counted = self.take();
        if matches!(counted, Counted::No) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, mode, wait) = (self.client.clone(), self.mode, self.wait);
        let name = std::mem::take(&mut self.name);
        self.client.spawn_cleanup(&runtime, async move {
            client.uncount(mode, &name, wait, &counted).await
        });
    }
}

impl LockClient {
    /// Takes this call out of the waiter count where it counted itself in.
    pub(super) async fn uncount(&self, mode: Mode, name: &str, wait: Duration, counted: &Counted) {
        let only = match counted {
            Counted::No => return,
            Counted::Everywhere => None,
            Counted::On(nodes) => Some(nodes.as_slice()),
        };
        self.count_round(mode, name, -1, wait, only).await;
    }

    /// Tasks of this client waiting in its own line for the plain lock
    /// `name` (behind the one that holds it or asks the nodes for it).
    pub fn queued(&self, name: &str) -> usize {
        let gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.get(name).map_or(0, |g| g.queued())
    }

    /// Adds `delta` to the waiter count of the lock `name` on every node.
    pub(super) async fn count_waiter(&self, name: &str, delta: i64, wait: Duration) {
        self.count_waiter_of(Mode::Exclusive, name, delta, wait)
            .await
    }

    /// Adds `delta` to the waiter count of `name` (of the kind `mode`) on
    /// every node; the count expires a little after the longest wait, so a
    /// waiter that died only costs extra wake-ups until then.
    pub(super) async fn count_waiter_of(&self, mode: Mode, name: &str, delta: i64, wait: Duration) {
        self.count_round(mode, name, delta, wait, None).await;
    }

    /// Adds `delta` to the waiter count on every node, or on `only`.
    pub(super) async fn count_round(
        &self,
        mode: Mode,
        name: &str,
        delta: i64,
        wait: Duration,
        only: Option<&[usize]>,
    ) {
        let key = mode.waiters_key(name);
        let ttl = count_ttl_ms(wait).to_string();
        let delta = delta.to_string();
        self.on_nodes(&self.inner.scripts.waiting, &[&key], &[&delta, &ttl], only)
            .await;
    }
}
