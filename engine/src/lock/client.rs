//! The lock client and its quorum: the nodes, the scripts, the state of
//! what this process holds, and the one place a script runs on every node
//! in parallel under the per-node timeout.

use crate::tls::Certificates;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::gate::{Gate, Pass};
use super::keeper::{Keepable, Keeper, Kept};
use super::mode::{lock_key, Mode};
use super::node::{LockNode, NodeError};
use super::scripts::LockScripts;
use super::waiters::Waiters;
use super::{LockConfig, LockError};
use crate::lua::LuaScript;
use crate::metrics as m;

/// A lock held by this client: shared by the guards of a reentrant owner.
pub(super) struct Held {
    pub(super) mode: Mode,
    pub(super) name: String,
    pub(super) owner: String,
    pub(super) token: String,
    pub(super) fence: u64,
    /// The last token reserved for this grant (see `fence`): hand-offs
    /// inside this process take the tokens above `fence` up to it.
    pub(super) fence_last: u64,
    /// When the grant was taken from the nodes (ms since client start); a
    /// hand-off keeps it, and hands on only while the cohort is young.
    pub(super) cohort_since_ms: u64,
    /// A fixed lease (no watchdog).
    pub(super) leased: bool,
    pub(super) ttl: Duration,
    pub(super) count: AtomicU32,
    /// Engine-independent ms timestamp (since client start) until which the
    /// grant is valid; pushed forward by the watchdog.
    pub(super) valid_until_ms: AtomicU64,
    pub(super) lost: watch::Sender<bool>,
    /// Its entry in the client's keeper, and its lease round in flight.
    pub(super) kept: Mutex<Kept>,
    /// This process's pass for the name, held as long as the grant: other
    /// tasks of the process queue for it instead of on Redis.
    pub(super) gate: Mutex<Option<Pass<Baton>>>,
    /// Held while a lease is set on the nodes; true once the holder set its
    /// own (`extend`), which a lease set behind a hand-off must not undo.
    pub(super) lease_set: tokio::sync::Mutex<bool>,
}

/// A live grant on its way from one task of this process to the next.
/// Dropped untaken, it is released on the nodes.
pub(super) struct Baton {
    client: LockClient,
    held: Option<Arc<Held>>,
}

impl Baton {
    pub(super) fn new(client: LockClient, held: Arc<Held>) -> Baton {
        Baton {
            client,
            held: Some(held),
        }
    }

    /// The grant being handed over.
    pub(super) fn held(&self) -> Option<&Arc<Held>> {
        self.held.as_ref()
    }

    /// The grant is the receiver's now: nothing to release on drop.
    pub(super) fn taken(mut self) {
        self.held = None;
    }

    /// The grant back, to be released by the caller (nobody took it).
    pub(super) fn into_held(mut self) -> Option<Arc<Held>> {
        self.held.take()
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        // Drop cannot wait; without a runtime (shutting down) the lease is
        // the way back, as for a crashed process.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            client
                .release_token(held.mode, &held.name, &held.token, None)
                .await;
        });
    }
}

impl Keepable for Held {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) struct Inner {
    pub(super) nodes: Vec<LockNode>,
    pub(super) scripts: LockScripts,
    pub(super) config: LockConfig,
    pub(super) waiters: Arc<Waiters>,
    pub(super) listeners: Vec<JoinHandle<()>>,
    /// What this client holds, by kind, name and owner (reentrancy).
    /// By lock name (a few holds each: the kinds and owners that hold it),
    /// so a look-up borrows the name instead of building a key.
    pub(super) held: Mutex<HashMap<String, Vec<Arc<Held>>>>,
    /// One gate per lock name: tasks of this process wait here, in FIFO
    /// order, so only one of them at a time asks the lock nodes.
    pub(super) gates: Mutex<HashMap<String, Arc<Gate<Baton>>>>,
    /// When each live grant must be renewed, or its fixed lease runs out.
    pub(super) keeper: Keeper<Held>,
    /// The keeper's timer task.
    pub(super) timer: Mutex<Option<JoinHandle<()>>>,
    pub(super) epoch: Instant,
    /// Clean-ups started where a caller could not wait for them (a dropped
    /// call leaving a fair queue, a dropped guard releasing): what
    /// [`LockClient::settle`] waits for before a process exits.
    pub(super) cleanups: Mutex<Vec<JoinHandle<()>>>,
    /// Every node has answered the marker check and none is another.
    pub(super) distinct: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.abort();
        }
        if let Some(t) = self.timer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

/// A handle on the lock nodes; cheap to clone.
#[derive(Clone)]
pub struct LockClient {
    pub(super) inner: Arc<Inner>,
}

/// Longest lease a grant may ask for: a day. Redis takes leases in
/// milliseconds, and the client's own clock must not overflow either.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// The clock-drift allowance of a lease: 1 % of it plus 2 ms, taken off
/// every validity (Redlock's drift factor).
pub(super) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// A lease from 1 ms to [`MAX_LEASE`].
pub(super) fn check_lease(lease: Duration) -> Result<(), LockError> {
    if lease < Duration::from_millis(1) || lease > MAX_LEASE {
        return Err(LockError::Invalid("lease (1 ms to 24 h)"));
    }
    Ok(())
}

/// Separates the parts of a name the lock module makes for itself (a
/// semaphore's permit slots): names given by callers may not contain it, so
/// no lock anyone can name is a slot of a semaphore.
pub(super) const RESERVED: char = '\0';

/// A name given by a caller (a lock, a semaphore): no [`RESERVED`] byte.
pub(super) fn check_public_name(name: &str) -> Result<(), LockError> {
    if name.contains(RESERVED) {
        return Err(LockError::Invalid("name: the NUL byte is reserved"));
    }
    Ok(())
}

/// What is wrong when `a` and `b` are one lock node.
pub(super) fn same_node_problem(a: &str, b: &str) -> String {
    format!(
        "lock nodes {a} and {b} are the same lock node: each must be a separate Redis \
         (a majority of one server counted twice protects nothing)"
    )
}

pub(super) fn validate(name: &str, owner: &str) -> Result<(), LockError> {
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
    /// stop the others from serving a majority. Needs a tokio runtime, and
    /// runs its timer (watchdog renewals, leases running out) and its
    /// pub/sub listeners on it: make the client on a runtime that outlives
    /// its use (should it end, the next lock call restarts the timer on its
    /// own runtime; grants held meanwhile go unrenewed).
    pub fn new(urls: &[String], config: LockConfig) -> Result<LockClient, LockError> {
        LockClient::with_certificates(urls, config, &Certificates::default())
    }

    /// [`LockClient::new`] for nodes that may be `rediss://`: their
    /// connections trust and present what `certificates` holds (the
    /// config's `[tls]` files, [`Certificates::load`]).
    pub fn with_certificates(
        urls: &[String],
        config: LockConfig,
        certificates: &Certificates,
    ) -> Result<LockClient, LockError> {
        if urls.is_empty() {
            return Err(LockError::Config("no lock nodes configured".into()));
        }
        if let Some((a, b)) = super::node::same_node(urls, false) {
            return Err(LockError::Config(same_node_problem(&a, &b)));
        }
        let nodes: Vec<LockNode> = urls
            .iter()
            .map(|u| LockNode::new(u, certificates))
            .collect::<Result<_, _>>()?;
        let waiters = Arc::new(Waiters::default());
        let listeners = nodes
            .iter()
            .map(|n| Waiters::listen(&waiters, n.client().clone()))
            .collect();
        let client = LockClient {
            inner: Arc::new(Inner {
                nodes,
                scripts: LockScripts::new(),
                config,
                waiters,
                listeners,
                held: Mutex::new(HashMap::new()),
                gates: Mutex::new(HashMap::new()),
                keeper: Keeper::default(),
                timer: Mutex::new(None),
                epoch: Instant::now(),
                cleanups: Mutex::new(Vec::new()),
                distinct: AtomicBool::new(urls.len() == 1),
            }),
        };
        // The keeper's timer task starts with the first grant it keeps
        // (`renewal.rs`), on the runtime that took it.
        Ok(client)
    }

    /// Starts `work` on `runtime` as a clean-up [`LockClient::settle`] waits
    /// for (finished ones are forgotten as new ones come).
    pub(super) fn spawn_cleanup(
        &self,
        runtime: &tokio::runtime::Handle,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = runtime.spawn(work);
        let mut cleanups = self
            .inner
            .cleanups
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cleanups.retain(|h| !h.is_finished());
        cleanups.push(handle);
    }

    /// Waits until what dropped calls and guards left to do on the nodes
    /// (leave a fair queue, count out as a waiter, release) is done. A
    /// process about to exit calls it, so an interrupted wait leaves no
    /// queue entry behind for the next waiter to wait out.
    pub async fn settle(&self) {
        loop {
            let pending: Vec<JoinHandle<()>> = std::mem::take(
                &mut *self
                    .inner
                    .cleanups
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            );
            if pending.is_empty() {
                return;
            }
            for h in pending {
                let _ = h.await;
            }
        }
    }

    /// Refuses to go on when two of the nodes are one server: two URLs
    /// that reach one Redis (another address of its host, a proxy) pass any
    /// look at the URLs, and its one answer would count twice in every
    /// majority. Each node gets a marker key of this client's and is asked
    /// which markers it has; a node that has another node's marker is that
    /// node. Needs only the key commands the locks use (no INFO, which an
    /// ACL may refuse). Asked until every node has answered once; after
    /// that, free.
    pub(super) async fn ensure_distinct(&self) -> Result<(), LockError> {
        if self.inner.distinct.load(Ordering::Acquire) {
            return Ok(());
        }
        let timeout = self.inner.config.node_timeout;
        let nonce: u64 = rand::random();
        // Under the locks' own key prefix, with the NUL no caller's lock
        // name holds: an ACL that lets the locks work lets this work.
        let markers: Vec<String> = (0..self.inner.nodes.len())
            .map(|i| lock_key(&format!("{RESERVED}node-mark{RESERVED}{nonce:016x}:{i}")))
            .collect();
        let set = join_all(self.inner.nodes.iter().zip(&markers).map(|(n, m)| {
            let mut set = redis::cmd("SET");
            set.arg(m).arg(1).arg("PX").arg(60_000);
            n.query::<()>(set, timeout)
        }))
        .await;
        // GET each (the lock scripts' own command; MGET may be refused).
        let seen = join_all(self.inner.nodes.iter().map(|n| async {
            let mut found = Vec::with_capacity(markers.len());
            for m in &markers {
                let mut get = redis::cmd("GET");
                get.arg(m);
                found.push(n.query::<Option<u8>>(get, timeout).await?);
            }
            Ok::<_, NodeError>(found)
        }))
        .await;
        let _ = join_all(self.inner.nodes.iter().zip(&markers).map(|(n, m)| {
            let mut del = redis::cmd("DEL");
            del.arg(m);
            n.query::<()>(del, timeout)
        }))
        .await;
        for (j, found) in seen.iter().enumerate() {
            let Ok(found) = found else { continue };
            for (i, has) in found.iter().enumerate() {
                if i != j && has.is_some() {
                    let (x, y) = (&self.inner.nodes[i].addr, &self.inner.nodes[j].addr);
                    return Err(LockError::Config(same_node_problem(x, y)));
                }
            }
        }
        if set.iter().all(Result::is_ok) && seen.iter().all(Result::is_ok) {
            self.inner.distinct.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Nodes needed for a grant: a majority.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    pub(super) async fn on_all_nodes(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> Vec<Result<Value, NodeError>> {
        self.on_nodes(script, keys, args, None).await
    }

    /// Runs `script` on every node (or only the nodes at the indexes in
    /// `only`) in parallel, each within the per-node timeout, counting errors.
    pub(super) async fn on_nodes(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
        only: Option<&[usize]>,
    ) -> Vec<Result<Value, NodeError>> {
        let timeout = self.inner.config.node_timeout;
        if let ([node], None) = (self.inner.nodes.as_slice(), only) {
            // One node: no fan-out to set up.
            let reply = node.eval(script, keys, args, timeout).await;
            count_error(node, &reply);
            return vec![reply];
        }
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
            count_error(n, r);
        }
        replies
    }
}

/// Counts a node that did not answer usefully, by node.
fn count_error(node: &LockNode, reply: &Result<Value, NodeError>) {
    if reply.is_err() {
        metrics::counter!(m::LOCK_NODE_ERRORS, "node" => node.addr.clone()).increment(1);
    }
}
