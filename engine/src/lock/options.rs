//! The lock module's plain types: errors, client-wide settings, and the
//! options of one `lock` call. No I/O.

use std::time::Duration;

/// Why a lock call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed held by someone else for the whole wait.
    #[error("lock {name:?} still held by another owner after waiting {waited:?}")]
    Timeout {
        /// The lock.
        name: String,
        /// How long it waited.
        waited: Duration,
    },
    /// Too few nodes answered to form a majority.
    #[error("lock {name:?}: only {reachable} of {nodes} lock nodes reachable, {quorum} needed ({detail})")]
    NoQuorum {
        /// The lock.
        name: String,
        /// Nodes that answered on the last attempt.
        reachable: usize,
        /// Nodes configured.
        nodes: usize,
        /// Majority.
        quorum: usize,
        /// The last node error seen.
        detail: String,
    },
    /// The grant or permit had already run out (its lease ended, or a
    /// majority no longer holds it): nothing was released or extended.
    #[error("{name:?}: the lease had already run out")]
    Expired {
        /// The lock, or the semaphore's permit slot.
        name: String,
    },
    /// A reader asked for the write side of the same read-write lock: it
    /// would wait for itself to stop reading, forever. Release the read
    /// side first (a writer may take the read side: that is a downgrade).
    #[error(
        "read-write lock {name:?}: {owner:?} holds the read side and may not upgrade to write"
    )]
    Upgrade {
        /// The lock.
        name: String,
        /// The owner holding the read side.
        owner: String,
    },
    /// A name or owner that is empty or too long.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// The configuration has no lock nodes or a bad URL.
    #[error("lock config: {0}")]
    Config(String),
}

/// Client-wide settings.
#[derive(Debug, Clone, Copy)]
pub struct LockConfig {
    /// How long one node may take to answer one call.
    pub node_timeout: Duration,
    /// Lease the watchdog keeps renewing when no lease is given.
    pub watchdog_ttl: Duration,
    /// Largest random pause between attempts when no release was heard.
    pub retry_jitter: Duration,
    /// Largest random pause after a release was heard, before trying (only
    /// with several nodes, where simultaneous attempts split the vote).
    pub wake_spread: Duration,
    /// Where the clock term of fencing tokens comes from (see `fence`).
    pub token_clock: TokenClock,
    /// Lease of a queued waiter's entry (fair locks, waiting writers):
    /// renewed while the waiter lives, so one that died stops blocking the
    /// queue within this.
    pub queue_lease: Duration,
    /// Lock cohorting: how many times in a row a plain lock released while
    /// another task of this process waits for it passes straight to that
    /// task, with no trip to the nodes (0: never). Each grant from the
    /// nodes reserves this many fencing tokens above its own, so the tokens
    /// of hand-offs still grow and stay below every later grant's. At most
    /// 255 are used.
    pub cohort_max: u32,
    /// ... and for how long after the grant from the nodes: past either
    /// bound the lock goes back to the nodes, and when clients elsewhere
    /// wait, the next task of this process lets them go first.
    pub cohort_window: Duration,
}

/// The clock that fencing tokens never fall below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenClock {
    /// The system clock (ms since the Unix epoch): tokens keep growing even
    /// if every node lost its counters.
    #[default]
    System,
    /// A fixed time since the epoch: tokens then come from the nodes'
    /// counters alone. For tests and simulations that must see the counters
    /// and the majority at work, not the clock.
    Fixed(Duration),
}

impl TokenClock {
    /// Time since the Unix epoch by this clock.
    pub fn since_epoch(self) -> Duration {
        match self {
            TokenClock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            TokenClock::Fixed(d) => d,
        }
    }
}

impl Default for LockConfig {
    fn default() -> Self {
        LockConfig {
            node_timeout: Duration::from_millis(100),
            watchdog_ttl: Duration::from_secs(30),
            retry_jitter: Duration::from_millis(50),
            wake_spread: Duration::from_millis(3),
            token_clock: TokenClock::System,
            queue_lease: Duration::from_secs(2),
            cohort_max: 64,
            cohort_window: Duration::from_millis(2),
        }
    }
}

/// How to take one lock.
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// Who takes it; the same owner may take it again (reentrancy).
    pub owner: String,
    /// Fixed lease: the lock expires after it and nothing renews it. `None`
    /// (the default) turns the watchdog on.
    pub lease: Option<Duration>,
    /// How long `lock` waits for a held lock (`try_lock` does not wait).
    pub wait: Duration,
    /// A fair lock: grants go in arrival order across processes (each waiter
    /// queues on the nodes). Plain `lock` calls of the same name do not
    /// queue, so use one or the other for a name.
    pub fair: bool,
}

impl LockOptions {
    /// Options for `owner`: watchdog on, wait up to 10 s.
    pub fn new(owner: impl Into<String>) -> Self {
        LockOptions {
            owner: owner.into(),
            lease: None,
            wait: Duration::from_secs(10),
            fair: false,
        }
    }

    /// Take the lock fairly: in arrival order, across processes.
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// A fixed lease instead of the watchdog.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long `lock` waits.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}
