//! A semaphore with leased permits on the lock nodes (Redisson's
//! `RPermitExpirableSemaphore`, across processes, on one node or a majority
//! of N).
//!
//! Why permits are slots: a counter decremented on a majority of nodes does
//! not bound the holders. Two majorities of three nodes share only one node,
//! so with K permits each node counts K holders while up to 3K/2 holders
//! each hold a majority. Here permit `i` (for `i < K`) is the lock
//! `sem\0<name>\0<i>` (a NUL byte no caller's lock name may hold, so no
//! lock anyone can name is a slot), taken like any lock (one node, or Redlock on a
//! majority): one holder per slot, so at most K holders at once. Each slot
//! then has what a lock has: a lease (fixed, or renewed by the watchdog
//! while the holder lives, so a crashed holder's permit comes back within
//! its lease), a release that only the holder's token can do (a release is
//! never a permit added: releasing twice, or an expired permit, gives
//! nothing back), pub/sub wake-ups, and a fencing token per slot.
//!
//! The total K is a setting on the nodes (`lua/semaphore_permits.lua`),
//! versioned by the clock, read from a majority (highest version wins).
//! Raising it lets waiters take the new slots at once; lowering it stops new
//! grants of the slots above, while their holders keep them until they
//! release (so for a while more than the new K may hold).

use std::pin::Pin;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;

use super::client::validate;
use super::{LockClient, LockError, LockGuard, LockOptions};

/// Most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1000;

/// Longest pause between two looks when no release was heard (a permit
/// whose holder died comes back when its lease ends, without a message).
const POLL: Duration = Duration::from_millis(200);

/// A semaphore on the lock nodes; cheap to clone.
#[derive(Clone)]
pub struct Semaphore {
    client: LockClient,
    name: String,
}

/// How to take permits.
#[derive(Debug, Clone)]
pub struct PermitOptions {
    /// Who takes them (each permit gets its own id under this owner).
    pub owner: String,
    /// Fixed lease of each permit: it ends then unless extended. `None` (the
    /// default) renews it with the watchdog while the holder lives.
    pub lease: Option<Duration>,
    /// How long `acquire` waits for enough permits.
    pub wait: Duration,
}

impl PermitOptions {
    /// Options for `owner`: watchdog on, wait up to 10 s.
    pub fn new(owner: impl Into<String>) -> Self {
        PermitOptions {
            owner: owner.into(),
            lease: None,
            wait: Duration::from_secs(10),
        }
    }

    /// A fixed lease instead of the watchdog.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long `acquire` waits.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

/// One permit held: a slot of the semaphore.
pub struct Permit {
    guard: LockGuard,
    slot: u32,
    id: String,
}

impl Permit {
    /// The permit's id: its slot and its grant's random token.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The slot (0 to permits - 1).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's fencing token: larger than every earlier grant of this
    /// slot (not of the whole semaphore: K holders write at once).
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// True once the permit is known lost (lease over, renewal failed).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when the permit is lost.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Gives the lease `lease` from now ([`LockError::Expired`] once the
    /// permit ran out: an expired permit is not revived).
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.guard.extend(lease).await
    }

    /// The guard of the permit's slot, for code that runs under a lock guard
    /// (`flashsale semaphore exec` supervises its command with it).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Gives the permit back. A permit whose lease had run out is
    /// [`LockError::Expired`], never a success: nothing came back from it.
    pub async fn release(self) -> Result<(), LockError> {
        let name = self.guard.name().to_owned();
        let lost = self.guard.is_lost();
        let released = self.guard.unlock().await;
        if lost || !released {
            return Err(LockError::Expired { name });
        }
        Ok(())
    }
}

impl LockClient {
    /// The semaphore `name` (1-180 bytes).
    pub fn semaphore(&self, name: &str) -> Result<Semaphore, LockError> {
        if name.is_empty() || name.len() > 180 {
            return Err(LockError::Invalid("semaphore name (1-180 bytes)"));
        }
        super::client::check_public_name(name)?;
        Ok(Semaphore {
            client: self.clone(),
            name: name.to_owned(),
        })
    }
}

impl Semaphore {
    fn permits_key(&self) -> String {
        format!("flashsale:sem:{}:permits", self.name)
    }

    fn slot_name(&self, slot: u32) -> String {
        let sep = super::client::RESERVED;
        format!("sem{sep}{}{sep}{slot}", self.name)
    }

    /// Checks what [`Semaphore::acquire`] would be asked (`n` permits with
    /// `opts`) without writing anything: a caller that sets the total first
    /// (`set_permits`) checks here, so bad input changes nothing.
    pub fn check(&self, n: u32, opts: &PermitOptions) -> Result<(), LockError> {
        validate(&self.name, &opts.owner)?;
        // Each permit's owner is `<owner>#<16 hex>`, itself at most 200.
        if opts.owner.len() > 183 {
            return Err(LockError::Invalid("semaphore owner (1-183 bytes)"));
        }
        if n == 0 {
            return Err(LockError::Invalid("permits asked (at least 1)"));
        }
        if let Some(lease) = opts.lease {
            super::client::check_lease(lease)?;
        }
        Ok(())
    }

    /// Sets the total of permits (1 to [`MAX_PERMITS`]) on a majority of the
    /// nodes; the latest setting by the clock wins.
    pub async fn set_permits(&self, permits: u32) -> Result<(), LockError> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(LockError::Invalid("permits (1-1000)"));
        }
        self.client.ensure_distinct().await?;
        // Above every setting a majority has, so two settings in the same
        // millisecond still order (the later call wins).
        let key = self.permits_key();
        let seen = self
            .client
            .on_all_nodes(&self.client.inner.scripts.permits, &[&key], &["get"])
            .await;
        let highest = self.quorum_of(&seen)?.map_or(0, |(v, _)| v);
        let version = super::fence::next_token(highest, super::TokenClock::System.since_epoch());
        let (version, permits) = (version.to_string(), permits.to_string());
        let replies = self
            .client
            .on_all_nodes(
                &self.client.inner.scripts.permits,
                &[&key],
                &["set", &version, &permits],
            )
            .await;
        self.quorum_of(&replies).map(|_| ())
    }

    /// The total of permits, as a majority of the nodes has it.
    pub async fn permits(&self) -> Result<u32, LockError> {
        let key = self.permits_key();
        let replies = self
            .client
            .on_all_nodes(&self.client.inner.scripts.permits, &[&key], &["get"])
            .await;
        match self.quorum_of(&replies)? {
            Some((_, permits)) => Ok(permits),
            None => Err(LockError::Invalid(
                "semaphore: no permits set (set_permits first)",
            )),
        }
    }

    /// The newest setting among the answers, if a majority answered.
    fn quorum_of(
        &self,
        replies: &[Result<redis::Value, super::node::NodeError>],
    ) -> Result<Option<(u64, u32)>, LockError> {
        let mut answered = 0;
        let mut newest: Option<(u64, u32)> = None;
        let mut detail = String::new();
        for r in replies {
            match r {
                Ok(v) => {
                    answered += 1;
                    let text: String = redis::from_redis_value(v.clone()).unwrap_or_default();
                    let mut parts = text.split(' ');
                    let parsed = parts
                        .next()
                        .and_then(|v| v.parse::<u64>().ok())
                        .zip(parts.next().and_then(|p| p.parse::<u32>().ok()));
                    if let Some(p) = parsed {
                        if newest.is_none_or(|n| p.0 > n.0) {
                            newest = Some(p);
                        }
                    }
                }
                Err(e) => detail = e.to_string(),
            }
        }
        if answered < self.client.quorum() {
            return Err(LockError::NoQuorum {
                name: self.name.clone(),
                reachable: answered,
                nodes: replies.len(),
                quorum: self.client.quorum(),
                detail,
            });
        }
        Ok(newest)
    }

    /// Takes `n` permits, all or none, waiting up to `opts.wait`.
    pub async fn acquire(&self, n: u32, opts: &PermitOptions) -> Result<Vec<Permit>, LockError> {
        self.take(n, opts, opts.wait).await
    }

    /// Takes `n` permits if they are free now, all or none.
    pub async fn try_acquire(
        &self,
        n: u32,
        opts: &PermitOptions,
    ) -> Result<Option<Vec<Permit>>, LockError> {
        match self.take(n, opts, Duration::ZERO).await {
            Ok(p) => Ok(Some(p)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn take(
        &self,
        n: u32,
        opts: &PermitOptions,
        wait: Duration,
    ) -> Result<Vec<Permit>, LockError> {
        self.check(n, opts)?;
        self.client.ensure_distinct().await?;
        let started = Instant::now();
        // Counted out of every slot's waiters however this call ends, a
        // dropped wait included (a `semaphore exec` stopped by a signal).
        let mut counted = SlotsCounted {
            client: self.client.clone(),
            wait,
            slots: Vec::new(),
        };
        let result = loop {
            let total = match self.permits().await {
                Ok(t) => t,
                Err(e @ LockError::NoQuorum { .. }) => {
                    // A majority may answer again within the wait (a node
                    // restarting, paused, or slow on a busy machine).
                    if self.pause_for_quorum(started, wait).await {
                        continue;
                    }
                    break Err(e);
                }
                Err(e) => break Err(e),
            };
            if n > total {
                break Err(LockError::Invalid(
                    "permits asked: more than the semaphore has",
                ));
            }
            let slots: Vec<String> = (0..total).map(|s| self.slot_name(s)).collect();
            // Listen before looking, so a release between the look and the
            // wait is not missed.
            let notifies: Vec<_> = slots
                .iter()
                .map(|s| self.client.inner.waiters.register(s))
                .collect();
            let mut heard: Vec<Pin<Box<tokio::sync::futures::Notified<'_>>>> =
                notifies.iter().map(|n| Box::pin(n.notified())).collect();
            for h in &mut heard {
                h.as_mut().enable();
            }
            match self.try_slots(total, n, opts).await {
                Ok(Some(permits)) => break Ok(permits),
                Ok(None) => {}
                Err(e @ LockError::NoQuorum { .. }) => {
                    if self.pause_for_quorum(started, wait).await {
                        continue;
                    }
                    break Err(e);
                }
                Err(e) => break Err(e),
            }
            let remaining = wait.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                break Err(LockError::Timeout {
                    name: self.name.clone(),
                    waited: started.elapsed(),
                });
            }
            // Count ourselves among every slot's waiters so releases
            // publish, then look again at once.
            let uncounted: Vec<&String> = slots
                .iter()
                .filter(|s| !counted.slots.contains(s))
                .collect();
            if !uncounted.is_empty() {
                futures_util::future::join_all(
                    uncounted
                        .iter()
                        .map(|s| self.client.count_waiter(s, 1, wait)),
                )
                .await;
                counted.slots.extend(uncounted.into_iter().cloned());
                continue;
            }
            let pause = POLL.min(remaining) + self.client.jitter();
            tokio::select! {
                _ = futures_util::future::select_all(heard.iter_mut()) => {}
                _ = tokio::time::sleep(pause) => {}
            }
        };
        // Off the caller's path: the count only decides who gets woken.
        drop(counted);
        result
    }

    /// After a call no majority answered: waits a moment and says whether
    /// the caller's wait (from `started`) leaves time to ask again.
    async fn pause_for_quorum(&self, started: Instant, wait: Duration) -> bool {
        let remaining = wait.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            return false;
        }
        tokio::time::sleep((POLL + self.client.jitter()).min(remaining)).await;
        true
    }

    /// One look at every slot, in random order (so holders spread and two
    /// takers do not fight over slot 0), until `n` are taken; fewer than `n`
    /// are given back at once (all or none).
    async fn try_slots(
        &self,
        total: u32,
        n: u32,
        opts: &PermitOptions,
    ) -> Result<Option<Vec<Permit>>, LockError> {
        let mut order = self.free_slots(total).await?;
        order.shuffle(&mut rand::rng());
        let mut taken: Vec<Permit> = Vec::new();
        for slot in order {
            // Each permit its own owner: a slot is never re-entered, so two
            // permits are always two slots.
            let owner = format!("{}#{:016x}", opts.owner, rand::random::<u64>());
            let lock_opts = LockOptions {
                owner,
                lease: opts.lease,
                wait: Duration::ZERO,
                fair: false,
            };
            match self
                .client
                .try_lock_any(&self.slot_name(slot), &lock_opts)
                .await
            {
                Ok(Some(guard)) => {
                    let id = format!("{slot}:{}", guard.held.token);
                    taken.push(Permit { guard, slot, id });
                    if taken.len() == n as usize {
                        return Ok(Some(taken));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    give_back(taken).await;
                    return Err(e);
                }
            }
        }
        give_back(taken).await;
        Ok(None)
    }
}

impl Semaphore {
    /// The slots free on a majority of the nodes that answered (one call
    /// per node): the only ones worth a lock attempt.
    async fn free_slots(&self, total: u32) -> Result<Vec<u32>, LockError> {
        let keys: Vec<String> = (0..total)
            .map(|s| super::mode::lock_key(&self.slot_name(s)))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let replies = self
            .client
            .on_all_nodes(&self.client.inner.scripts.free_slots, &key_refs, &[])
            .await;
        let mut free_on = vec![0usize; total as usize];
        let mut answered = 0;
        for r in replies.iter().flatten() {
            let Ok(flags) = redis::from_redis_value::<Vec<i64>>(r.clone()) else {
                continue;
            };
            answered += 1;
            for (slot, flag) in flags.iter().enumerate().take(total as usize) {
                if *flag == 1 {
                    free_on[slot] += 1;
                }
            }
        }
        if answered < self.client.quorum() {
            return Err(LockError::NoQuorum {
                name: self.name.clone(),
                reachable: answered,
                nodes: replies.len(),
                quorum: self.client.quorum(),
                detail: "free slots".into(),
            });
        }
        Ok((0..total)
            .filter(|s| free_on[*s as usize] >= self.client.quorum())
            .collect())
    }
}

/// The slots a take counted itself in as a waiter of: dropped, it counts
/// out of them in a clean-up [`LockClient::settle`] waits for.
struct SlotsCounted {
    client: LockClient,
    wait: Duration,
    slots: Vec<String>,
}

impl Drop for SlotsCounted {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, wait) = (self.client.clone(), self.wait);
        let slots = std::mem::take(&mut self.slots);
        self.client.spawn_cleanup(&runtime, async move {
            futures_util::future::join_all(slots.iter().map(|s| client.count_waiter(s, -1, wait)))
                .await;
        });
    }
}

async fn give_back(permits: Vec<Permit>) {
    for p in permits {
        let _ = p.guard.unlock().await;
    }
}
