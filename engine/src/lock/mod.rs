//! Distributed locks on independent Redis instances (never the inventory
//! cluster). One node: a single-node lock. Three or more: Redlock — ask every
//! node in parallel with a small per-node timeout, hold the lock when a
//! majority granted it within its validity (ttl - elapsed - drift), release
//! everywhere otherwise and try again after a wake-up or a random delay.
//!
//! What it adds to `SET NX PX`:
//! - compare-and-act release and renewal (Lua): nobody releases or extends a
//!   lock they do not hold;
//! - a watchdog renewing the lease every ttl/3 while the guard lives, which
//!   reports the loss (`lost()`) when a majority stops confirming;
//! - reentrancy per explicit owner (tasks move between threads: no thread ids);
//! - waiters woken by pub/sub on release, with the remaining TTL as fallback;
//! - fencing tokens: see [`fence`] for why they only grow.
//!
//! What no lock can give: safety when a holder pauses (GC, SIGSTOP) past its
//! lease, or when clocks drift beyond the drift allowance. Fencing tokens are
//! the answer to the first: a resource that remembers the highest token it
//! accepted refuses the late holder's write (see `db::fenced`).

pub mod fence;
mod guard;
mod node;
mod options;
mod waiters;

pub use guard::LockGuard;
pub use options::{LockConfig, LockError, LockOptions, TokenClock};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::Value;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::scripts::LuaScript;
use node::{LockNode, NodeError};
use waiters::{Waiters, CHANNEL};

/// Metric names of the lock module.
pub mod metric {
    /// Time from `lock`/`try_lock` to the grant, seconds.
    pub const ACQUIRE_SECONDS: &str = "flashsale_lock_acquire_duration_seconds";
    /// Attempts that found the lock held and waited.
    pub const WAITS: &str = "flashsale_lock_waits_total";
    /// Watchdog renewals confirmed by a quorum.
    pub const RENEWALS: &str = "flashsale_lock_renewals_total";
    /// Grants lost (renewal failed on a quorum, or a lease ran out).
    pub const LOST: &str = "flashsale_lock_lost_total";
    /// Per-node errors and timeouts, by `node`.
    pub const NODE_ERRORS: &str = "flashsale_lock_node_errors_total";
}

/// The lock scripts.
struct LockScripts {
    acquire: LuaScript,
    fence: LuaScript,
    release: LuaScript,
    extend: LuaScript,
    waiting: LuaScript,
}

/// A lock held by this client: shared by the guards of a reentrant owner.
struct Held {
    name: String,
    owner: String,
    token: String,
    fence: u64,
    ttl: Duration,
    count: AtomicU32,
    /// Engine-independent ms timestamp (since client start) until which the
    /// grant is valid; pushed forward by the watchdog.
    valid_until_ms: AtomicU64,
    lost: watch::Sender<bool>,
    keeper: Mutex<Option<JoinHandle<()>>>,
    /// This process's gate for the name, held as long as the grant: other
    /// tasks of the process queue on it instead of on Redis.
    gate: Mutex<Option<OwnedSemaphorePermit>>,
}

struct Inner {
    nodes: Vec<LockNode>,
    scripts: LockScripts,
    config: LockConfig,
    waiters: Arc<Waiters>,
    listeners: Vec<JoinHandle<()>>,
    held: Mutex<HashMap<(String, String), Arc<Held>>>,
    /// One permit per lock name: tasks of this process wait here, in FIFO
    /// order, so only one of them at a time asks the lock nodes.
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    epoch: Instant,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.abort();
        }
    }
}

/// A handle on the lock nodes; cheap to clone.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<Inner>,
}

/// The result of one attempt on every node.
enum Attempt {
    Granted(Arc<Held>),
    Busy { retry_in: Duration },
    NoQuorum { reachable: usize, detail: String },
}

/// Where a new grant's fencing token comes from.
enum FenceSource {
    /// The single lock node already chose and stored it.
    Settled(u64),
    /// Pick it above the highest counter seen and raise a majority to it.
    Raise {
        /// Highest counter the answering nodes reported.
        highest_seen: u64,
    },
}

/// Decoded reply of `lock_acquire.lua`.
struct AcquireReply {
    granted: bool,
    pttl: i64,
    fence: u64,
}

fn decode_acquire(v: &Value) -> Option<AcquireReply> {
    let Value::Array(p) = v else { return None };
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let fence = match p.get(2)? {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok()?,
        Value::Int(i) => u64::try_from(*i).ok()?,
        _ => return None,
    };
    Some(AcquireReply {
        granted: int(p.first()?)? == 1,
        pttl: int(p.get(1)?)?,
        fence,
    })
}

fn lock_key(name: &str) -> String {
    format!("flashsale:lock:{name}")
}

fn waiters_key(name: &str) -> String {
    format!("flashsale:waiters:{name}")
}

fn fence_key(name: &str) -> String {
    format!("flashsale:fence:{name}")
}

fn validate(name: &str, owner: &str) -> Result<(), LockError> {
    if name.is_empty() || name.len() > 200 {
        return Err(LockError::Invalid("lock name (1-200 bytes)"));
    }
    if owner.is_empty() || owner.len() > 200 {
        return Err(LockError::Invalid("owner (1-200 bytes)"));
    }
    Ok(())
}

impl LockClient {
    /// A client over `urls` (`redis://host:port`, independent instances).
    /// Connections open on first use, so a node that is down now does not
    /// stop the others from serving a majority. Needs a tokio runtime.
    pub fn new(urls: &[String], config: LockConfig) -> Result<LockClient, LockError> {
        if urls.is_empty() {
            return Err(LockError::Config("no lock nodes configured".into()));
        }
        let nodes: Vec<LockNode> = urls
            .iter()
            .map(|u| LockNode::new(u))
            .collect::<Result<_, _>>()
            .map_err(LockError::Config)?;
        let waiters = Arc::new(Waiters::default());
        let listeners = nodes
            .iter()
            .map(|n| Waiters::listen(&waiters, n.client().clone()))
            .collect();
        Ok(LockClient {
            inner: Arc::new(Inner {
                nodes,
                scripts: LockScripts {
                    acquire: LuaScript::new(
                        "lock_acquire",
                        include_str!("../../../lua/lock_acquire.lua"),
                    ),
                    fence: LuaScript::new(
                        "lock_fence",
                        include_str!("../../../lua/lock_fence.lua"),
                    ),
                    release: LuaScript::new(
                        "lock_release",
                        include_str!("../../../lua/lock_release.lua"),
                    ),
                    extend: LuaScript::new(
                        "lock_extend",
                        include_str!("../../../lua/lock_extend.lua"),
                    ),
                    waiting: LuaScript::new(
                        "lock_waiting",
                        include_str!("../../../lua/lock_waiting.lua"),
                    ),
                },
                config,
                waiters,
                listeners,
                held: Mutex::new(HashMap::new()),
                gates: Mutex::new(HashMap::new()),
                epoch: Instant::now(),
            }),
        })
    }

    /// Nodes needed for a grant: a majority.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    /// Takes `name`, waiting up to `opts.wait` while someone else holds it.
    pub async fn lock(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.acquire(name, opts, opts.wait).await
    }

    /// Takes `name` if it is free now (one attempt on every node).
    pub async fn try_lock(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        match self.acquire(name, opts, Duration::ZERO).await {
            Ok(g) => Ok(Some(g)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn acquire(
        &self,
        name: &str,
        opts: &LockOptions,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        validate(name, &opts.owner)?;
        let started = Instant::now();
        if let Some(g) = self.reenter(name, &opts.owner) {
            return Ok(g);
        }
        let timeout = || LockError::Timeout {
            name: name.to_owned(),
            waited: started.elapsed(),
        };
        // Queue behind the other tasks of this process first: only the head
        // of the queue talks to the lock nodes, and a local hand-off costs no
        // failed attempts on Redis.
        let gate = self.gate(name);
        let mut permit = Some(if wait.is_zero() {
            gate.try_acquire_owned().map_err(|_| timeout())?
        } else {
            match tokio::time::timeout(wait, gate.acquire_owned()).await {
                Ok(Ok(p)) => p,
                _ => return Err(timeout()),
            }
        });
        // Register before the first attempt so a release between the attempt
        // and the wait is not missed.
        let wake = self.inner.waiters.register(name);
        let mut counted = false;
        let result = loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let last = self.attempt(name, opts).await;
            let remaining = wait.saturating_sub(started.elapsed());
            match last {
                Attempt::Granted(held) => {
                    *held.gate.lock().unwrap_or_else(|p| p.into_inner()) = permit.take();
                    metrics::histogram!(metric::ACQUIRE_SECONDS)
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
                Attempt::Busy { .. } if !counted => {
                    // Count ourselves among the waiters so releases publish,
                    // then look again at once: a release that came before the
                    // count published nothing.
                    metrics::counter!(metric::WAITS).increment(1);
                    self.count_waiter(name, 1, wait).await;
                    counted = true;
                }
                Attempt::Busy { retry_in } => {
                    let pause = retry_in.min(remaining) + self.jitter();
                    tokio::select! {
                        _ = &mut notified => {
                            // Every waiter hears the same release; with several
                            // nodes, rushing in together splits the vote so
                            // nobody wins a majority. Spread them out.
                            if self.inner.nodes.len() > 1 {
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
        if counted {
            // Off the caller's path: the count only decides who gets woken.
            let (client, name) = (self.clone(), name.to_owned());
            tokio::spawn(async move { client.count_waiter(&name, -1, wait).await });
        }
        result
    }

    /// Adds `delta` to the waiter count of `name` on every node; the count
    /// expires a little after the longest wait, so a waiter that died only
    /// costs extra wake-ups until then.
    async fn count_waiter(&self, name: &str, delta: i64, wait: Duration) {
        let key = waiters_key(name);
        let ttl = (wait + Duration::from_secs(5)).as_millis().to_string();
        let delta = delta.to_string();
        self.on_all_nodes(&self.inner.scripts.waiting, &[&key], &[&delta, &ttl])
            .await;
    }

    /// The gate of `name`, created on first use.
    fn gate(&self, name: &str) -> Arc<Semaphore> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone()
    }

    /// Drops the gate of `name` when nobody holds or waits on it (every
    /// permit and waiter keeps a clone, and clones are made under this lock).
    fn forget_gate(&self, name: &str) {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        if gates.get(name).is_some_and(|g| Arc::strong_count(g) == 1) {
            gates.remove(name);
        }
    }

    fn jitter(&self) -> Duration {
        self.inner
            .config
            .retry_jitter
            .mul_f64(rand::random::<f64>())
    }

    /// The same owner taking a lock it holds: count it, no network trip.
    fn reenter(&self, name: &str, owner: &str) -> Option<LockGuard> {
        let map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let held = map.get(&(name.to_owned(), owner.to_owned()))?.clone();
        drop(map);
        let valid =
            !*held.lost.borrow() && self.now_ms() < held.valid_until_ms.load(Ordering::SeqCst);
        if !valid {
            return None;
        }
        held.count.fetch_add(1, Ordering::SeqCst);
        Some(LockGuard {
            client: self.clone(),
            held,
            released: false,
        })
    }

    /// One Redlock round: SET NX PX on every node in parallel; on a majority
    /// within validity, raise the fencing counters and keep the grant;
    /// otherwise release what was taken.
    async fn attempt(&self, name: &str, opts: &LockOptions) -> Attempt {
        let ttl = opts.lease.unwrap_or(self.inner.config.watchdog_ttl);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let token = format!("{:032x}", rand::random::<u128>());
        let started = Instant::now();
        let (lkey, fkey) = (lock_key(name), fence_key(name));
        let ttl_s = ttl_ms.to_string();
        let single = self.inner.nodes.len() == 1;
        let clock = fence::next_token(0, self.inner.config.token_clock.since_epoch()).to_string();
        let replies = self
            .on_all_nodes(
                &self.inner.scripts.acquire,
                &[&lkey, &fkey],
                &[&token, &ttl_s, if single { "1" } else { "0" }, &clock],
            )
            .await;
        let mut granted = Vec::new();
        let mut reachable = 0;
        let mut highest_fence = 0u64;
        let mut shortest_pttl: Option<i64> = None;
        let mut detail = String::new();
        for (i, r) in replies.iter().enumerate() {
            match r.as_ref().map(decode_acquire) {
                Ok(Some(a)) => {
                    reachable += 1;
                    highest_fence = highest_fence.max(a.fence);
                    if a.granted {
                        granted.push(i);
                    } else if a.pttl > 0 {
                        shortest_pttl = Some(shortest_pttl.map_or(a.pttl, |p| p.min(a.pttl)));
                    }
                }
                Ok(None) => detail = "unexpected reply".into(),
                Err(e) => detail = format!("{}: {e}", self.inner.nodes[i].addr),
            }
        }
        if granted.len() >= self.quorum() {
            // On a single node the script settled the token in the same step.
            let fence = if single {
                FenceSource::Settled(highest_fence)
            } else {
                FenceSource::Raise {
                    highest_seen: highest_fence,
                }
            };
            if let Some(held) = self
                .grant(name, opts, token.clone(), ttl, started, fence)
                .await
            {
                return Attempt::Granted(held);
            }
            self.release_token(name, &token, None).await;
        } else if !granted.is_empty() {
            // Give back the minority we got; nodes that refused hold nothing of ours.
            self.release_token(name, &token, Some(&granted)).await;
        }
        if reachable < self.quorum() {
            return Attempt::NoQuorum { reachable, detail };
        }
        let retry_in = Duration::from_millis(shortest_pttl.unwrap_or(10).max(1) as u64);
        Attempt::Busy { retry_in }
    }

    /// Completes a majority grant: picks the fencing token, raises the
    /// counters of a majority to it, and checks the validity left.
    async fn grant(
        &self,
        name: &str,
        opts: &LockOptions,
        token: String,
        ttl: Duration,
        started: Instant,
        fence: FenceSource,
    ) -> Option<Arc<Held>> {
        let fence = match fence {
            FenceSource::Settled(f) => f,
            FenceSource::Raise { highest_seen } => {
                let fence =
                    fence::next_token(highest_seen, self.inner.config.token_clock.since_epoch());
                let fkey = fence_key(name);
                let fence_s = fence.to_string();
                let raised = self
                    .on_all_nodes(&self.inner.scripts.fence, &[&fkey], &[&fence_s])
                    .await;
                if raised.iter().filter(|r| r.is_ok()).count() < self.quorum() {
                    return None;
                }
                fence
            }
        };
        let drift = ttl / 100 + Duration::from_millis(2);
        let validity = ttl.checked_sub(started.elapsed() + drift)?;
        if validity.is_zero() {
            return None;
        }
        let (lost, _) = watch::channel(false);
        let held = Arc::new(Held {
            name: name.to_owned(),
            owner: opts.owner.clone(),
            token,
            fence,
            ttl,
            count: AtomicU32::new(1),
            valid_until_ms: AtomicU64::new(self.now_ms() + validity.as_millis() as u64),
            lost,
            keeper: Mutex::new(None),
            gate: Mutex::new(None),
        });
        let keeper = if opts.lease.is_some() {
            self.spawn_lease_timer(held.clone())
        } else {
            self.spawn_watchdog(held.clone())
        };
        *held.keeper.lock().unwrap_or_else(|p| p.into_inner()) = Some(keeper);
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((held.name.clone(), held.owner.clone()), held.clone());
        Some(held)
    }

    /// Renews every ttl/3 while the grant lives; reports the loss when a
    /// majority stops confirming or the validity runs out first.
    fn spawn_watchdog(&self, held: Arc<Held>) -> JoinHandle<()> {
        let client = self.clone();
        tokio::spawn(async move {
            let every = held.ttl / 3;
            let key = lock_key(&held.name);
            let ttl_s = (held.ttl.as_millis().max(1) as u64).to_string();
            loop {
                tokio::time::sleep(every).await;
                let sent = Instant::now();
                let replies = client
                    .on_all_nodes(
                        &client.inner.scripts.extend,
                        &[&key],
                        &[&held.token, &ttl_s],
                    )
                    .await;
                let confirmed = replies
                    .iter()
                    .filter(|r| matches!(r, Ok(Value::Int(1))))
                    .count();
                let drift = held.ttl / 100 + Duration::from_millis(2);
                let still_valid = client.now_ms() < held.valid_until_ms.load(Ordering::SeqCst);
                if confirmed >= client.quorum() && still_valid {
                    let validity = held.ttl.saturating_sub(sent.elapsed() + drift);
                    held.valid_until_ms.store(
                        client.now_ms() + validity.as_millis() as u64,
                        Ordering::SeqCst,
                    );
                    metrics::counter!(metric::RENEWALS).increment(1);
                    continue;
                }
                tracing::warn!(lock = %held.name, confirmed, "lock lost: renewal not confirmed by a majority");
                metrics::counter!(metric::LOST).increment(1);
                let _ = held.lost.send(true);
                return;
            }
        })
    }

    /// With a fixed lease, reports the loss when the lease runs out.
    fn spawn_lease_timer(&self, held: Arc<Held>) -> JoinHandle<()> {
        let client = self.clone();
        tokio::spawn(async move {
            let left = held
                .valid_until_ms
                .load(Ordering::SeqCst)
                .saturating_sub(client.now_ms());
            tokio::time::sleep(Duration::from_millis(left)).await;
            metrics::counter!(metric::LOST).increment(1);
            let _ = held.lost.send(true);
        })
    }

    /// Releases one reentrant hold; the last one stops the watchdog (first,
    /// so it never renews a released lock) and releases on every node.
    /// Returns false when no node still had this grant.
    async fn release_held(&self, held: &Arc<Held>) -> bool {
        if held.count.fetch_sub(1, Ordering::SeqCst) > 1 {
            return true;
        }
        {
            let mut map = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            let key = (held.name.clone(), held.owner.clone());
            if map.get(&key).is_some_and(|h| Arc::ptr_eq(h, held)) {
                map.remove(&key);
            }
        }
        if let Some(k) = held.keeper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            k.abort();
        }
        let released = self.release_token(&held.name, &held.token, None).await > 0;
        // Only now may the next task of this process go.
        drop(held.gate.lock().unwrap_or_else(|p| p.into_inner()).take());
        self.forget_gate(&held.name);
        released
    }

    /// Compare-and-delete of `token` on every node (or only on `only`);
    /// returns how many released.
    async fn release_token(&self, name: &str, token: &str, only: Option<&[usize]>) -> usize {
        let (key, wkey) = (lock_key(name), waiters_key(name));
        self.on_nodes(
            &self.inner.scripts.release,
            &[&key, &wkey],
            &[token, CHANNEL, name],
            only,
        )
        .await
        .iter()
        .filter(|r| matches!(r, Ok(Value::Int(1))))
        .count()
    }

    async fn on_all_nodes(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> Vec<Result<Value, NodeError>> {
        self.on_nodes(script, keys, args, None).await
    }

    /// Runs `script` on every node (or only the nodes at the indexes in
    /// `only`) in parallel, each within the per-node timeout, counting errors.
    async fn on_nodes(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
        only: Option<&[usize]>,
    ) -> Vec<Result<Value, NodeError>> {
        let timeout = self.inner.config.node_timeout;
        let chosen: Vec<&LockNode> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| only.is_none_or(|o| o.contains(i)))
            .map(|(_, n)| n)
            .collect();
        let replies = join_all(chosen.iter().map(|n| n.eval(script, keys, args, timeout))).await;
        for (n, r) in chosen.iter().zip(&replies) {
            if r.is_err() {
                metrics::counter!(metric::NODE_ERRORS, "node" => n.addr.clone()).increment(1);
            }
        }
        replies
    }
}
