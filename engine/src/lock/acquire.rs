//! Acquiring a lock: the calls (`lock`, `try_lock`, the read-write sides),
//! reentry for the same owner, the per-process FIFO gate (and a grant handed
//! over through it by the task before: lock cohorting), and the wait: one
//! attempt on every node after another (`attempt.rs`) until a majority
//! grants within the lock's validity, counted among the lock's waiters
//! meanwhile (`waiter_count.rs`). The same path takes a fair lock (each
//! waiter queued on the nodes by arrival, with an entry lease it renews
//! while it lives) and either side of a read-write lock (a waiting writer
//! queues too, which keeps new readers out).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::attempt::{Attempt, Request};
use super::client::*;
use super::gate::{Gate, Pass};
use super::mode::Mode;
use super::waiter_count::{count_ttl_ms, Counted, CountedIn};
use super::{LockClient, LockError, LockGuard, LockOptions};
use crate::metrics as m;

/// Largest number of fencing tokens a grant reserves for hand-offs inside
/// its process: below 1,000, so on one node the counter stays under the
/// next millisecond's clock term (`fence.rs`).
const MAX_COHORT: u32 = 255;

/// After a pause for clients elsewhere that nobody used, how long (ms) the
/// tasks of this process stop pausing for them.
const NO_YIELD_AFTER_NOBODY_MS: u64 = 1_000;

impl LockClient {
    /// Takes `name`, waiting up to `opts.wait` while someone else holds it
    /// (in arrival order across processes when `opts.fair`).
    pub async fn lock(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        check_public_name(name)?;
        self.acquire(name, opts, opts.wait).await
    }

    /// Takes `name` if it is free now (one attempt on every node; a fair
    /// lock only if nobody is queued for it either).
    pub async fn try_lock(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        check_public_name(name)?;
        self.try_lock_any(name, opts).await
    }

    /// [`LockClient::try_lock`] of any name, those the module makes for
    /// itself included (a semaphore's permit slots).
    pub(super) async fn try_lock_any(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        none_on_timeout(self.acquire(name, opts, Duration::ZERO).await)
    }

    /// Takes the read side of the read-write lock `name`: shared with other
    /// readers, never with a writer, and not while a writer waits (so
    /// writers are not starved). Reentrant per owner; an owner holding the
    /// write side may take it too (a downgrade: release the write side
    /// after, and it keeps reading).
    pub async fn read_lock(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        check_public_name(name)?;
        self.acquire_as(name, opts, opts.wait, Mode::Read).await
    }

    /// Takes the write side of the read-write lock `name`: alone, no readers.
    /// Reentrant per owner. An owner holding the read side gets
    /// [`LockError::Upgrade`]: it would wait for itself.
    pub async fn write_lock(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        check_public_name(name)?;
        self.acquire_as(name, opts, opts.wait, Mode::Write).await
    }

    /// [`LockClient::read_lock`] without waiting.
    pub async fn try_read_lock(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        check_public_name(name)?;
        none_on_timeout(
            self.acquire_as(name, opts, Duration::ZERO, Mode::Read)
                .await,
        )
    }

    /// [`LockClient::write_lock`] without waiting.
    pub async fn try_write_lock(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        check_public_name(name)?;
        none_on_timeout(
            self.acquire_as(name, opts, Duration::ZERO, Mode::Write)
                .await,
        )
    }

    pub(super) async fn acquire(
        &self,
        name: &str,
        opts: &LockOptions,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        self.acquire_as(name, opts, wait, Mode::Exclusive).await
    }

    pub(super) async fn acquire_as(
        &self,
        name: &str,
        opts: &LockOptions,
        wait: Duration,
        mode: Mode,
    ) -> Result<LockGuard, LockError> {
        validate(name, &opts.owner)?;
        if let Some(lease) = opts.lease {
            check_lease(lease)?;
        }
        self.ensure_distinct().await?;
        let started = Instant::now();
        if let Some(g) = self.reenter(mode, name, &opts.owner) {
            return Ok(g);
        }
        let request = match mode {
            Mode::Exclusive if opts.fair => Request::queued(mode),
            Mode::Exclusive => Request::plain(),
            Mode::Write => {
                if self.holding(Mode::Read, name, &opts.owner).is_some() {
                    return Err(LockError::Upgrade {
                        name: name.to_owned(),
                        owner: opts.owner.clone(),
                    });
                }
                Request::queued(mode)
            }
            Mode::Read => Request {
                mode,
                queue: None,
                own_writer: self
                    .holding(Mode::Write, name, &opts.owner)
                    .map(|h| h.token.clone()),
                reserve: 0,
            },
        };
        let timeout = || LockError::Timeout {
            name: name.to_owned(),
            waited: started.elapsed(),
        };
        // Queue behind the other tasks of this process first: only the head
        // of the queue talks to the lock nodes, and a local hand-off costs no
        // failed attempts on Redis. Not for a fair lock (every task queues
        // on the nodes, in its own arrival order) nor a read-write lock
        // (readers of one process share it).
        let mut request = request;
        let mut permit: Option<Pass<Baton>> = None;
        let mut others_first = false;
        let mut line = None;
        if mode == Mode::Exclusive && !opts.fair {
            let gate = self.gate(name);
            let mut pass = if wait.is_zero() {
                gate.try_enter().ok_or_else(timeout)?
            } else {
                match tokio::time::timeout(wait, gate.enter()).await {
                    Ok(p) => p,
                    Err(_) => return Err(timeout()),
                }
            };
            if let Some(baton) = pass.take_grant() {
                if let Some(held) = self.take_over(baton, name, opts).await {
                    *held.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(pass);
                    metrics::counter!(m::LOCK_HANDOFFS).increment(1);
                    metrics::histogram!(m::LOCK_ACQUIRE_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    return Ok(LockGuard {
                        client: self.clone(),
                        held,
                        released: false,
                    });
                }
            }
            others_first = pass.others_first && gate.yielding_pays(self.now_ms());
            // Others of this process wait too: reserve tokens for handing
            // the grant on to them.
            if pass.has_waiting() {
                request.reserve = u64::from(self.inner.config.cohort_max.min(MAX_COHORT));
            }
            permit = Some(pass);
            line = Some(gate);
        }
        let request = request;
        // Leaves the queue on every node however this call ends (granted
        // through a majority, given up, or dropped mid-wait).
        let mut dequeue = request.queue.as_ref().map(|q| Dequeue {
            client: self.clone(),
            mode,
            name: name.to_owned(),
            id: q.id.clone(),
            armed: true,
        });
        // Register before the first attempt so a release between the attempt
        // and the wait is not missed.
        let wake = self.inner.waiters.register(&mode.wake_name(name));
        // Counted out again however this call ends, a dropped wait included.
        let mut counted = CountedIn {
            client: self.clone(),
            mode,
            name: name.to_owned(),
            wait,
            state: Counted::No,
        };
        let count_ttl = count_ttl_ms(wait).to_string();
        // The pause below ran out with no release heard.
        let mut yield_unheard = false;
        if others_first && !wait.is_zero() {
            // The task before us gave the lock back to the nodes while
            // clients elsewhere waited for it (its cohort was over): let one
            // of them have it first. Count in (so their release wakes us)
            // and wait for that release, or a moment if nobody took it.
            metrics::counter!(m::LOCK_WAITS).increment(1);
            self.count_waiter_of(mode, name, 1, wait).await;
            counted.state = Counted::Everywhere;
            // Listen only now: the release before us published a wake-up
            // too, and this process hears it as well; a round trip later it
            // has come in, and what wakes us is the next release.
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Long enough for a woken client elsewhere (its wake-up, its
            // spread, its attempt) to take it even on a busy machine; short,
            // should the count be stale (then it is paid once a second).
            let pause = (self.inner.config.wake_spread * 4).max(Duration::from_millis(50));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(pause.min(wait.saturating_sub(started.elapsed()))) => {
                    yield_unheard = true;
                }
            }
        }
        let result = loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // A plain lock's attempt counts us in on every node that refuses,
            // in the same step (no release can fall between refusal and
            // count); the others count with a round of their own.
            // Not a call that will not wait (`try_lock`): it would be
            // counted out again at once, and a release in between would
            // make the holder's process pause for nobody.
            let count = (matches!(counted.state, Counted::No)
                && request.counts_in_attempt()
                && !wait.is_zero())
            .then_some(count_ttl.as_str());
            let (last, counted_on) = self.attempt(name, opts, &request, count).await;
            if !counted_on.is_empty() {
                metrics::counter!(m::LOCK_WAITS).increment(1);
                counted.state = Counted::On(counted_on);
            }
            if std::mem::take(&mut yield_unheard) && matches!(last, Attempt::Granted { .. }) {
                // We paused for clients elsewhere, nobody took the lock, and
                // it was still free: the count that made us pause is stale.
                // Do not pause again for a while (a live client elsewhere
                // still gets in by its wake-up, only not ahead of us).
                if let Some(gate) = &line {
                    gate.yielded_for_nobody(self.now_ms() + NO_YIELD_AFTER_NOBODY_MS);
                }
            }
            let remaining = wait.saturating_sub(started.elapsed());
            match last {
                Attempt::Granted { held, everywhere } => {
                    if everywhere {
                        // Each granting node took the entry out already.
                        if let Some(d) = dequeue.take() {
                            d.disarm();
                        }
                    }
                    *held.gate.lock().unwrap_or_else(|p| p.into_inner()) = permit.take();
                    metrics::histogram!(m::LOCK_ACQUIRE_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    break Ok(LockGuard {
                        client: self.clone(),
                        held,
                        released: false,
                    });
                }
                Attempt::NoQuorum { reachable, detail } if remaining.is_zero() => {
                    break Err(LockError::NoQuorum {
                        name: name.to_owned(),
                        reachable,
                        nodes: self.inner.nodes.len(),
                        quorum: self.quorum(),
                        detail,
                    });
                }
                Attempt::Busy { .. } if remaining.is_zero() => break Err(timeout()),
                Attempt::Busy { .. } if matches!(counted.state, Counted::No) => {
                    // Count ourselves among the waiters so releases publish,
                    // then look again at once: a release that came before the
                    // count published nothing.
                    metrics::counter!(m::LOCK_WAITS).increment(1);
                    self.count_waiter_of(mode, name, 1, wait).await;
                    counted.state = Counted::Everywhere;
                }
                Attempt::Busy { retry_in } => {
                    let mut pause = retry_in.min(remaining) + self.jitter();
                    if request.queue.is_some() {
                        // Renew the queue entry well within its lease.
                        pause = pause.min(self.inner.config.queue_lease / 3);
                    }
                    tokio::select! {
                        _ = &mut notified => {
                            // Every waiter hears the same release; with several
                            // nodes, rushing in together splits the vote so
                            // nobody wins a majority. Spread them out.
                            // A fair lock's waiters do not split it: only
                            // the first in the queue can win.
                            if self.inner.nodes.len() > 1 && !opts.fair {
                                tokio::time::sleep(self.inner.config.wake_spread.mul_f64(rand::random::<f64>())).await;
                            }
                        }
                        _ = tokio::time::sleep(pause.min(remaining)) => {}
                    }
                }
                Attempt::NoQuorum { .. } => {
                    tokio::time::sleep(
                        (self.inner.config.node_timeout + self.jitter()).min(remaining),
                    )
                    .await;
                }
            }
        };
        if result.is_err() {
            // A call that failed is often the last thing a process does
            // (`lock exec` exits 75): leave the queue and the waiter count
            // now, before returning, not in a task the exit would cancel.
            if let Some(d) = dequeue.take() {
                d.now().await;
            }
            self.uncount(mode, name, wait, &counted.take()).await;
            return result;
        }
        // Off the caller's path (the count only decides who gets woken):
        // `counted` counts out in a clean-up as it goes.
        drop(counted);
        result
    }

    /// The gate of `name`, created on first use.
    pub(super) fn gate(&self, name: &str) -> Arc<Gate<Baton>> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(name.to_owned()).or_default().clone()
    }

    /// Takes over a grant handed on by the task before (lock cohorting):
    /// the same keys on the nodes, the next reserved fencing token, this
    /// caller's owner and lease. `None` (and the grant released on the
    /// nodes) when it is no longer valid, or a fixed lease could not be set
    /// on a majority.
    pub(super) async fn take_over(
        &self,
        baton: Baton,
        name: &str,
        opts: &LockOptions,
    ) -> Option<Arc<Held>> {
        let before = baton.held()?.clone();
        let until = before.valid_until_ms.load(Ordering::SeqCst);
        if *before.lost.borrow()
            || self.now_ms() >= until
            || before.fence >= before.fence_last
            || before.name != name
        {
            return None;
        }
        let ttl = opts.lease.unwrap_or(self.inner.config.watchdog_ttl);
        let left_ms = until.saturating_sub(self.now_ms());
        // A fixed lease runs from this grant, so it is set again on the
        // nodes. When that only lengthens what is left there, and at least
        // half of the new lease is left, it happens behind the new holder
        // (its validity is what the nodes have until they confirm the new
        // lease, and nodes that miss it keep at least that); otherwise
        // (shorter, or little left) before it holds.
        // Under the watchdog the lease goes on as it was.
        let as_it_was = opts.lease.is_none() && !before.leased && before.ttl == ttl;
        let renew_behind = !as_it_was
            && opts.lease.is_some()
            && u128::from(left_ms) * 2 >= ttl.as_millis()
            // ... and with the drift allowance below the new lease, so a
            // node that misses the round keeps the key past the validity.
            && u128::from(left_ms) + drift(ttl).as_millis() <= ttl.as_millis();
        let (lost, _) = watch::channel(false);
        let held = Arc::new(Held {
            mode: Mode::Exclusive,
            name: name.to_owned(),
            owner: opts.owner.clone(),
            token: before.token.clone(),
            fence: before.fence + 1,
            fence_last: before.fence_last,
            cohort_since_ms: before.cohort_since_ms,
            leased: opts.lease.is_some(),
            ttl,
            count: AtomicU32::new(1),
            valid_until_ms: AtomicU64::new(until),
            lost,
            kept: Mutex::default(),
            gate: Mutex::new(None),
            lease_set: tokio::sync::Mutex::new(false),
        });
        if !as_it_was && !renew_behind {
            // The new lease on a majority before it holds (the baton still
            // releases the grant if this fails or is cancelled).
            self.lease_round(&held, ttl).await.ok()?;
            if self.now_ms() >= held.valid_until_ms.load(Ordering::SeqCst) {
                return None;
            }
        }
        baton.taken();
        self.keep(&held, renew_behind);
        Some(held)
    }

    /// Starts keeping `held` (see `keeper`; with `renew_first`, a fixed
    /// lease handed over is first set again on the nodes, behind the
    /// holder) and records it as this client's.
    pub(super) fn keep(&self, held: &Arc<Held>, renew_first: bool) {
        self.start_keeping(held, renew_first);
        let mut map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(&held.name) {
            Some(holds) => {
                // In place of a hold of the same kind and owner (one lost,
                // not yet given back), else beside the others.
                match holds
                    .iter_mut()
                    .find(|h| h.mode == held.mode && h.owner == held.owner)
                {
                    Some(old) => *old = held.clone(),
                    None => holds.push(held.clone()),
                }
            }
            None => {
                map.insert(held.name.clone(), vec![held.clone()]);
            }
        }
    }

    /// Drops the gate of `name` when nobody holds or waits on it (every
    /// permit and waiter keeps a clone, and clones are made under this lock).
    pub(super) fn forget_gate(&self, name: &str) {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        if gates.get(name).is_some_and(|g| Arc::strong_count(g) == 1) {
            gates.remove(name);
        }
    }

    pub(super) fn jitter(&self) -> Duration {
        self.inner
            .config
            .retry_jitter
            .mul_f64(rand::random::<f64>())
    }

    /// The live hold of `owner` on `name` of the kind `mode`, if any.
    pub(super) fn holding(&self, mode: Mode, name: &str, owner: &str) -> Option<Arc<Held>> {
        let map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        self.live(&map, mode, name, owner)
    }

    pub(super) fn live(
        &self,
        map: &std::collections::HashMap<String, Vec<Arc<Held>>>,
        mode: Mode,
        name: &str,
        owner: &str,
    ) -> Option<Arc<Held>> {
        let held = map
            .get(name)?
            .iter()
            .find(|h| h.mode == mode && h.owner == owner)?;
        let valid =
            !*held.lost.borrow() && self.now_ms() < held.valid_until_ms.load(Ordering::SeqCst);
        valid.then(|| held.clone())
    }

    /// The same owner taking a lock it holds: count it, no network trip.
    pub(super) fn reenter(&self, mode: Mode, name: &str, owner: &str) -> Option<LockGuard> {
        // Under the map's lock, where the last release counts out and
        // removes the hold: never a guard on a hold already given back.
        let map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let held = self.live(&map, mode, name, owner)?;
        held.count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                (c > 0).then_some(c + 1)
            })
            .ok()?;
        drop(map);
        Some(LockGuard {
            client: self.clone(),
            held,
            released: false,
        })
    }
}

/// A queued call's entry on the nodes: dropped (however the call ended), it
/// takes the entry out of the queue on every node, off the caller's path. A
/// node that misses it drops the entry when its lease ends.
struct Dequeue {
    client: LockClient,
    mode: Mode,
    name: String,
    id: String,
    armed: bool,
}

impl Dequeue {
    /// Nothing to take out: every node dropped the entry with its grant.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    /// Takes the entry out on every node before returning.
    pub(super) async fn now(mut self) {
        self.armed = false;
        let (qkey, xkey) = self.mode.queue_keys(&self.name);
        let scripts = &self.client.inner.scripts;
        self.client
            .on_all_nodes(&scripts.dequeue, &[&qkey, &xkey], &[&self.id])
            .await;
    }
}

impl Drop for Dequeue {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, mode) = (self.client.clone(), self.mode);
        let (name, id) = (std::mem::take(&mut self.name), std::mem::take(&mut self.id));
        let leaving = client.clone();
        leaving.spawn_cleanup(&runtime, async move {
            let (qkey, xkey) = mode.queue_keys(&name);
            client
                .on_all_nodes(&client.inner.scripts.dequeue, &[&qkey, &xkey], &[&id])
                .await;
        });
    }
}

/// `try_*`: a lock held by someone else is `None`, not an error.
fn none_on_timeout(r: Result<LockGuard, LockError>) -> Result<Option<LockGuard>, LockError> {
    match r {
        Ok(g) => Ok(Some(g)),
        Err(LockError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
