//! A count-down latch on the lock nodes: `wait` returns once `count`
//! distinct count-downs happened, woken by pub/sub, across processes.
//!
//! Why a set of ids and not a counter: a counter decremented on a majority
//! of N nodes can end with no majority at zero (3 nodes, count 2: one
//! count-down reaches A and B, the other B and C; A and C still say 1). Each
//! node here keeps the ids of the count-downs it saw, and a reader takes the
//! union over a majority: every count-down that reached a majority is in it
//! (two majorities share a node), so the latch opens exactly when `count`
//! count-downs succeeded, and never earlier. An id makes a count-down
//! idempotent: a retry after a timeout is not a second count-down.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis::Value;

use super::node::NodeError;
use super::waiters::CHANNEL;
use super::{LockClient, LockError};

/// Longest pause between two looks when no opening was heard.
const POLL: Duration = Duration::from_millis(200);

/// Longest lifetime [`Latch::set_count_for`] takes.
const MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// A count-down latch; cheap to clone.
#[derive(Clone)]
pub struct Latch {
    client: LockClient,
    name: String,
}

impl LockClient {
    /// The latch `name` (1-180 bytes).
    pub fn latch(&self, name: &str) -> Result<Latch, LockError> {
        if name.is_empty() || name.len() > 180 {
            return Err(LockError::Invalid("latch name (1-180 bytes)"));
        }
        Ok(Latch {
            client: self.clone(),
            name: name.to_owned(),
        })
    }
}

/// One node's answer: its count (None: never set) and what came with it.
struct NodeView {
    count: Option<u64>,
    rest: Value,
    /// `read` only: when the count ends (ms since the epoch; -1 never).
    ends: Option<i64>,
}

impl Latch {
    fn keys(&self) -> [String; 2] {
        [
            format!("flashsale:latch:{}:count", self.name),
            format!("flashsale:latch:{}:downs", self.name),
        ]
    }

    fn topic(&self) -> String {
        format!("latch:{}", self.name)
    }

    async fn call(&self, args: &[&str]) -> Result<Vec<NodeView>, LockError> {
        let [count_key, downs_key] = self.keys();
        let replies = self
            .client
            .on_all_nodes(
                &self.client.inner.scripts.latch,
                &[&count_key, &downs_key],
                args,
            )
            .await;
        self.views(replies)
    }

    /// The answers of a majority, or `NoQuorum`.
    fn views(&self, replies: Vec<Result<Value, NodeError>>) -> Result<Vec<NodeView>, LockError> {
        let nodes = replies.len();
        let mut views = Vec::new();
        let mut detail = String::new();
        for r in replies {
            match r {
                Ok(Value::Array(mut parts)) if parts.len() == 2 || parts.len() == 3 => {
                    let ends = if parts.len() == 3 {
                        parts
                            .pop()
                            .and_then(|e| redis::from_redis_value::<i64>(e).ok())
                    } else {
                        None
                    };
                    let rest = parts.pop().unwrap_or(Value::Nil);
                    let count = parts
                        .pop()
                        .and_then(|c| redis::from_redis_value::<String>(c).ok())
                        .and_then(|c| c.parse().ok());
                    views.push(NodeView { count, rest, ends });
                }
                Ok(other) => detail = format!("unexpected reply {other:?}"),
                Err(e) => detail = e.to_string(),
            }
        }
        if views.len() < self.client.quorum() {
            return Err(LockError::NoQuorum {
                name: self.name.clone(),
                reachable: views.len(),
                nodes,
                quorum: self.client.quorum(),
                detail,
            });
        }
        Ok(views)
    }

    fn not_set() -> LockError {
        LockError::Invalid("latch: no count set (set_count first)")
    }

    /// The one count the answering nodes hold: `None` when none has one,
    /// an error when they differ (a `set_count` with another count reached
    /// some of them): no reader may then take one count and another reader
    /// another, so the latch says so rather than open for some.
    fn agreed(views: &[NodeView]) -> Result<Option<u64>, LockError> {
        let mut counts = views.iter().filter_map(|v| v.count);
        let first = counts.next();
        if counts.any(|c| Some(c) != first) {
            return Err(LockError::Invalid(
                "latch: its nodes hold different counts (set_count was called with two counts); use a new name",
            ));
        }
        // The same for when it ends (`read` answers say): setters that
        // raced with different lifetimes (or none) would otherwise leave
        // some nodes holding the count after the others dropped it.
        let mut ends = views
            .iter()
            .filter(|v| v.count.is_some())
            .filter_map(|v| v.ends);
        let first_end = ends.next();
        if ends.any(|e| Some(e) != first_end) {
            return Err(LockError::Invalid(
                "latch: its nodes end it at different times (setters raced with different lifetimes); use a new name",
            ));
        }
        Ok(first)
    }

    /// Sets the count (1 to 10,000) if the latch has none yet, on a
    /// majority; returns the count in force. A count already set on any
    /// node that answers is kept and copied to the nodes that lack it.
    /// A new latch set this way never expires: use
    /// [`Latch::set_count_for`] for one that should leave nothing behind.
    pub async fn set_count(&self, count: u64) -> Result<u64, LockError> {
        self.init(count, None).await
    }

    /// As [`Latch::set_count`], and the latch ends `lives` (1 ms to 365
    /// days, whole ms) from now: its count and its count-downs then expire
    /// on every node at one deadline (ms since the epoch, from this
    /// process's wall clock: unlike the locks' relative leases, this needs
    /// this process's and the nodes' clocks to agree within a margin small
    /// beside `lives`), so a latch per job leaves no keys behind.
    /// The deadline comes with the count: a latch that has a count already
    /// keeps its own deadline (or none), and a node that lacked the count
    /// gets the latch's deadline, not a new one. Once the deadline passes
    /// the latch is gone: `wait` waits for a new count and `count_down`
    /// finds none.
    pub async fn set_count_for(&self, count: u64, lives: Duration) -> Result<u64, LockError> {
        if lives < Duration::from_millis(1) || lives > MAX_LIFETIME {
            return Err(LockError::Invalid("latch lifetime (1 ms to 365 days)"));
        }
        self.init(count, Some(lives)).await
    }

    /// Sets the count, ending `lives` from now when given and the latch
    /// has no count yet.
    async fn init(&self, count: u64, lives: Option<Duration>) -> Result<u64, LockError> {
        if !(1..=10_000).contains(&count) {
            return Err(LockError::Invalid("latch count (1-10000)"));
        }
        let views = self.call(&["read"]).await?;
        let existing = Latch::agreed(&views)?;
        let ends_ms = match existing {
            Some(_) => Latch::inherited_deadline(&views),
            None => lives.map_or(0, |l| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                (now + l).as_millis() as u64
            }),
        };
        let count = existing.unwrap_or(count);
        let views = self
            .call(&["init", &count.to_string(), &ends_ms.to_string()])
            .await?;
        match Latch::agreed(&views)? {
            Some(count) => Ok(count),
            // Every node dropped the count at once: its deadline had passed.
            None if ends_ms > 0 => Err(LockError::Invalid(
                "latch: its deadline passed before the count was set (are this process's and the nodes' clocks apart?)",
            )),
            None => Err(Latch::not_set()),
        }
    }

    /// The deadline a node that lacks the count gets: the one the nodes
    /// holding it have ([`Latch::agreed`] refused them if they differ), or
    /// 0 (never) when they hold it for good (a latch set by `set_count`) or
    /// an answer carries no end (a script from before lifetimes).
    fn inherited_deadline(views: &[NodeView]) -> u64 {
        let mut earliest: Option<u64> = None;
        for v in views.iter().filter(|v| v.count.is_some()) {
            match v.ends {
                Some(e) if e > 0 => {
                    let e = e as u64;
                    earliest = Some(earliest.map_or(e, |x| x.min(e)));
                }
                _ => return 0,
            }
        }
        earliest.unwrap_or(0)
    }

    /// Counts down once (a fresh id).
    pub async fn count_down(&self) -> Result<(), LockError> {
        self.count_down_as(&format!("{:032x}", rand::random::<u128>()))
            .await
    }

    /// Counts down as `id` (1-200 bytes): however often the same id is sent,
    /// it counts once, so a retry after a timeout is safe.
    pub async fn count_down_as(&self, id: &str) -> Result<(), LockError> {
        if id.is_empty() || id.len() > 200 {
            return Err(LockError::Invalid("count-down id (1-200 bytes)"));
        }
        let topic = self.topic();
        let views = self.call(&["down", id, CHANNEL, &topic]).await?;
        let counted = views
            .iter()
            .filter(|v| v.count.is_some() && !matches!(v.rest, Value::Int(-1)))
            .count();
        if counted < self.client.quorum() {
            return Err(Latch::not_set());
        }
        Ok(())
    }

    /// Count-downs still missing before the latch opens.
    pub async fn remaining(&self) -> Result<u64, LockError> {
        let views = self.call(&["read"]).await?;
        let count = Latch::agreed(&views)?.ok_or_else(Latch::not_set)?;
        // One node that saw them all is enough (the union holds at least
        // its ids): the common case costs no id list.
        let most = views
            .iter()
            .filter_map(|v| redis::from_redis_value::<u64>(v.rest.clone()).ok())
            .max()
            .unwrap_or(0);
        if most >= count {
            return Ok(0);
        }
        let views = self.call(&["members"]).await?;
        let mut seen: HashSet<String> = HashSet::new();
        for v in views {
            if let Ok(ids) = redis::from_redis_value::<Vec<String>>(v.rest) {
                seen.extend(ids);
            }
        }
        Ok(count.saturating_sub(seen.len() as u64))
    }

    /// Waits until the latch is open, at most `timeout`
    /// ([`LockError::Timeout`] then).
    pub async fn wait(&self, timeout: Duration) -> Result<(), LockError> {
        let started = Instant::now();
        let wake = self.client.inner.waiters.register(&self.topic());
        loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.remaining().await {
                Ok(0) => return Ok(()),
                // Not set yet, or no majority for a moment: not open yet.
                Ok(_) | Err(LockError::NoQuorum { .. }) => {}
                Err(e) if e == Latch::not_set() => {}
                Err(e) => return Err(e),
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(LockError::Timeout {
                    name: self.name.clone(),
                    waited: started.elapsed(),
                });
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(POLL.min(left)) => {}
            }
        }
    }
}
