//! One attempt on every lock node, and the grant: what a lock call asks
//! the nodes for (its mode, its place in a queue, the tokens it reserves),
//! the answers counted against the majority within the lock's validity,
//! and, once granted, the fencing round and the start of its watchdog. A
//! dropped attempt gives back what it took (`Outstanding`).

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::client::*;
use super::fence;
use super::mode::Mode;
use super::{LockClient, LockOptions};

/// The result of one attempt on every node.
pub(super) enum Attempt {
    /// Granted; `everywhere` when every node granted (a queued call then
    /// left the queue on every node with its grant).
    Granted {
        held: Arc<Held>,
        everywhere: bool,
    },
    Busy {
        retry_in: Duration,
    },
    NoQuorum {
        reachable: usize,
        detail: String,
    },
}

/// What one lock call asks the nodes for.
pub(super) struct Request {
    pub(super) mode: Mode,
    /// Fair locks and writers wait in a queue on the nodes, under this entry.
    pub(super) queue: Option<QueueEntry>,
    /// A writer taking the read side: its own write token (a downgrade).
    pub(super) own_writer: Option<String>,
    /// Fencing tokens to reserve above the grant's for hand-offs inside
    /// this process (lock cohorting); 0 for none.
    pub(super) reserve: u64,
}

/// A waiter's place in a queue on the nodes.
pub(super) struct QueueEntry {
    pub(super) id: String,
    /// µs since the epoch when the call began: every node orders by it.
    pub(super) arrival_us: String,
}

impl Request {
    /// Whether this request's attempt can count the caller in itself (the
    /// plain lock's script can; the queued ones count by a round of their
    /// own).
    pub(super) fn counts_in_attempt(&self) -> bool {
        self.mode == Mode::Exclusive && self.queue.is_none()
    }

    /// The plain lock: no queue.
    pub(super) fn plain() -> Request {
        Request {
            mode: Mode::Exclusive,
            queue: None,
            own_writer: None,
            reserve: 0,
        }
    }

    pub(super) fn queued(mode: Mode) -> Request {
        let arrival_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        Request {
            mode,
            queue: Some(QueueEntry {
                id: format!("{:032x}", rand::random::<u128>()),
                arrival_us: arrival_us.to_string(),
            }),
            own_writer: None,
            reserve: 0,
        }
    }
}

/// Where a new grant's fencing token comes from.
pub(super) enum FenceSource {
    /// The single lock node already chose and stored it.
    Settled(u64),
    /// Pick it above the highest counter seen and raise a majority to it.
    Raise {
        /// Highest counter the answering nodes reported.
        highest_seen: u64,
    },
}

impl LockClient {
    /// One Redlock round: SET NX PX on every node in parallel; on a majority
    /// within validity, raise the fencing counters and keep the grant;
    /// otherwise release what was taken. With `count` (the count's ttl, ms),
    /// every node that refuses counts the caller among the lock's waiters;
    /// returns those nodes too.
    pub(super) async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        req: &Request,
        count: Option<&str>,
    ) -> (Attempt, Vec<usize>) {
        let token = format!("{:032x}", rand::random::<u128>());
        // From the first write on, this attempt owns keys on the nodes; if
        // the caller drops it half-way (a timeout around `lock()`), the
        // guard gives them back.
        let outstanding = Outstanding {
            client: self,
            mode: req.mode,
            name,
            token: &token,
            armed: true,
        };
        let result = self.attempt_with(name, opts, req, &token, count).await;
        outstanding.disarm();
        result
    }

    /// One attempt with `token`: ask every node, then grant, or give back
    /// whatever nodes may hold of it.
    pub(super) async fn attempt_with(
        &self,
        name: &str,
        opts: &LockOptions,
        req: &Request,
        token: &str,
        count: Option<&str>,
    ) -> (Attempt, Vec<usize>) {
        let ttl = opts.lease.unwrap_or(self.inner.config.watchdog_ttl);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let started = Instant::now();
        let mode = req.mode;
        let ttl_s = ttl_ms.to_string();
        let single = self.inner.nodes.len() == 1;
        let since_epoch = self.inner.config.token_clock.since_epoch();
        // One node settles the token itself; on several, each granting node
        // raises its counter to this proposal in the same step.
        let proposal = fence::proposal(since_epoch);
        let clock = if single {
            fence::next_token(0, since_epoch)
        } else {
            proposal
        };
        let replies = self
            .ask_nodes(name, req, token, &ttl_s, single, clock, count)
            .await;
        let reserve = req.reserve;
        // Nodes that refused and so counted us in (when asked to).
        let mut counted = Vec::new();
        let mut granted = Vec::new();
        // Nodes that did not answer (timed out, broken link, a reply we could
        // not read): they may still run, or have run, our SET NX.
        let mut unanswered = Vec::new();
        let mut reachable = 0;
        let mut highest_fence = 0u64;
        // Highest counter a granting node had before our call.
        let mut highest_granting = 0u64;
        let mut shortest_pttl: Option<i64> = None;
        let mut detail = String::new();
        for (i, r) in replies.iter().enumerate() {
            match r.as_ref().map(super::scripts::lock_acquire) {
                Ok(Ok(a)) => {
                    reachable += 1;
                    highest_fence = highest_fence.max(a.fence);
                    if a.granted {
                        granted.push(i);
                        highest_granting = highest_granting.max(a.fence);
                    } else {
                        if count.is_some() {
                            counted.push(i);
                        }
                        if a.pttl > 0 {
                            shortest_pttl = Some(shortest_pttl.map_or(a.pttl, |p| p.min(a.pttl)));
                        }
                    }
                }
                Ok(Err(e)) => {
                    unanswered.push(i);
                    detail = e.to_string();
                }
                Err(e) => {
                    unanswered.push(i);
                    detail = format!("{}: {e}", self.inner.nodes[i].addr);
                }
            }
        }
        if granted.len() >= self.quorum() {
            // On a single node the script settled the token in the same step.
            let fence = if single {
                FenceSource::Settled(highest_fence)
            } else if highest_granting < proposal && granted.len() == self.inner.nodes.len() {
                // Every node granted, was below the proposal and holds it
                // now (see `fence`). When only a majority granted, the
                // second round raises the others too: a granting node that
                // restarts empty must leave the token on a majority.
                FenceSource::Settled(proposal)
            } else {
                FenceSource::Raise {
                    highest_seen: highest_fence,
                }
            };
            if let Some(held) = self
                .grant(
                    name,
                    opts,
                    mode,
                    token.to_owned(),
                    ttl,
                    started,
                    fence,
                    reserve,
                )
                .await
            {
                let everywhere = granted.len() == self.inner.nodes.len();
                return (Attempt::Granted { held, everywhere }, counted);
            }
            self.release_token(mode, name, token, None).await;
        } else if !granted.is_empty() || !unanswered.is_empty() {
            // Give back the minority we got, and ask every node that did not
            // answer too: a node that timed out still runs our SET NX when it
            // gets to it (the release follows it on the same connection), and
            // would otherwise keep our token for the whole lease, blocking
            // the next majority. Nodes that refused hold nothing of ours.
            let ours: Vec<usize> = granted.iter().chain(&unanswered).copied().collect();
            self.release_token(mode, name, token, Some(&ours)).await;
        }
        if reachable < self.quorum() {
            return (Attempt::NoQuorum { reachable, detail }, counted);
        }
        let retry_in = match shortest_pttl {
            Some(ms) => Duration::from_millis(ms.max(1) as u64),
            // Free, but someone queued goes first (or, for a reader, a
            // writer waits): the release that follows their grant wakes us.
            None if req.queue.is_some() || mode == Mode::Read => self.inner.config.queue_lease / 3,
            None => Duration::from_millis(10),
        };
        (Attempt::Busy { retry_in }, counted)
    }

    /// One attempt's script on every node: the lock's own SET NX, the fair
    /// lock's (first in the queue only), or a read-write lock's side.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn ask_nodes(
        &self,
        name: &str,
        req: &Request,
        token: &str,
        ttl_s: &str,
        single: bool,
        clock: u64,
        count: Option<&str>,
    ) -> Vec<Result<redis::Value, super::node::NodeError>> {
        let mode = req.mode;
        let clock_s = clock.to_string();
        let (hkey, fkey) = (mode.hold_key(name), mode.fence_key(name));
        let single = if single { "1" } else { "0" };
        // Only the queued calls send the queue lease.
        let lease = || (self.inner.config.queue_lease.as_millis().max(1) as u64).to_string();
        let scripts = &self.inner.scripts;
        match (mode, &req.queue) {
            (Mode::Exclusive, None) => {
                let reserve = req.reserve.to_string();
                // What the counter becomes when the clock is above it: added
                // here, as the script formats no number.
                let raised = clock.saturating_add(req.reserve).to_string();
                let wkey = mode.waiters_key(name);
                self.on_all_nodes(
                    &scripts.acquire,
                    &[&hkey, &fkey, &wkey],
                    &[
                        token,
                        ttl_s,
                        single,
                        &clock_s,
                        &reserve,
                        count.unwrap_or("0"),
                        &raised,
                    ],
                )
                .await
            }
            (Mode::Exclusive, Some(q)) => {
                let (qkey, xkey) = mode.queue_keys(name);
                let lease = lease();
                self.on_all_nodes(
                    &scripts.fair_acquire,
                    &[&hkey, &fkey, &qkey, &xkey],
                    &[token, ttl_s, single, &clock_s, &q.id, &q.arrival_us, &lease],
                )
                .await
            }
            (Mode::Read | Mode::Write, q) => {
                let (qkey, _) = mode.queue_keys(name);
                let side = if mode == Mode::Read { "r" } else { "w" };
                let id = q.as_ref().map_or("-", |q| q.id.as_str());
                let own = req.own_writer.as_deref().unwrap_or("");
                let lease = lease();
                self.on_all_nodes(
                    &scripts.rw_acquire,
                    &[&hkey, &qkey, &fkey],
                    &[token, ttl_s, single, &clock_s, side, id, &lease, own],
                )
                .await
            }
        }
    }

    /// Completes a majority grant: picks the fencing token, raises the
    /// counters of a majority to it (plus the `reserve` tokens above it that
    /// hand-offs inside this process may take), and checks the validity left.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn grant(
        &self,
        name: &str,
        opts: &LockOptions,
        mode: Mode,
        token: String,
        ttl: Duration,
        started: Instant,
        fence: FenceSource,
        reserve: u64,
    ) -> Option<Arc<Held>> {
        let fence = match fence {
            FenceSource::Settled(f) => f,
            FenceSource::Raise { highest_seen } => {
                let fence =
                    fence::next_token(highest_seen, self.inner.config.token_clock.since_epoch());
                let fkey = mode.fence_key(name);
                let fence_s = fence.saturating_add(reserve).to_string();
                let raised = self
                    .on_all_nodes(&self.inner.scripts.fence, &[&fkey], &[&fence_s])
                    .await;
                if raised.iter().filter(|r| r.is_ok()).count() < self.quorum() {
                    return None;
                }
                fence
            }
        };
        let validity = ttl.checked_sub(started.elapsed() + drift(ttl))?;
        if validity.is_zero() {
            return None;
        }
        let (lost, _) = watch::channel(false);
        let now_ms = self.now_ms();
        let held = Arc::new(Held {
            mode,
            name: name.to_owned(),
            owner: opts.owner.clone(),
            token,
            fence,
            fence_last: fence.saturating_add(reserve),
            cohort_since_ms: now_ms,
            leased: opts.lease.is_some(),
            ttl,
            count: AtomicU32::new(1),
            valid_until_ms: AtomicU64::new(now_ms + validity.as_millis() as u64),
            lost,
            kept: Mutex::default(),
            gate: Mutex::new(None),
            lease_set: tokio::sync::Mutex::new(false),
        });
        self.keep(&held, false);
        Some(held)
    }
}

/// The keys of an attempt in flight. Dropped while armed (the attempt's
/// future was dropped before it finished), it releases the token on every
/// node, so a cancelled `lock()` leaves nothing held: without it, the nodes
/// that granted keep the key, with no guard and no watchdog, until the lease
/// runs out.
struct Outstanding<'a> {
    client: &'a LockClient,
    mode: Mode,
    name: &'a str,
    token: &'a str,
    armed: bool,
}

impl Outstanding<'_> {
    /// The attempt finished: what it holds is a guard's now, or was given
    /// back already.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Drop cannot wait: a task releases. Without a runtime (it is shutting
        // down) the lease is the only way back, as for a crashed process.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, mode) = (self.client.clone(), self.mode);
        let (name, token) = (self.name.to_owned(), self.token.to_owned());
        let releasing = client.clone();
        releasing.spawn_cleanup(&runtime, async move {
            client.release_token(mode, &name, &token, None).await;
        });
    }
}
