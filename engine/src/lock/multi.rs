//! A multi-lock: several names taken all or none, in one global order (the
//! names sorted), so two multi-locks over overlapping names never deadlock:
//! whoever holds the smallest shared name goes on, the other waits for it
//! holding nothing it needs. One fencing token per name.

use std::time::Instant;

use super::{LockClient, LockError, LockGuard, LockOptions};

/// Most names in one multi-lock.
pub const MAX_NAMES: usize = 64;

/// Several locks held together.
pub struct MultiGuard {
    /// In name order.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// Each name with its grant's fencing token, in name order.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// The fencing token of `name`, if it is one of the names held.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .map(|g| g.fencing_token())
    }

    /// True once any of the grants is known lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(|g| g.is_lost())
    }

    /// How much longer every grant is valid (the shortest of them).
    pub fn valid_for(&self) -> std::time::Duration {
        self.guards
            .iter()
            .map(|g| g.valid_for())
            .min()
            .unwrap_or_default()
    }

    /// Resolves when any of the grants is lost.
    pub async fn lost(&self) {
        futures_util::future::select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// Releases every lock, in reverse order; true when each was still held.
    pub async fn unlock(self) -> bool {
        let mut all = true;
        for g in self.guards.into_iter().rev() {
            all &= g.unlock().await;
        }
        all
    }
}

impl LockClient {
    /// Takes every lock in `names` (duplicates count once; 1 to
    /// [`MAX_NAMES`]), in sorted order, all or none, waiting up to
    /// `opts.wait` in all. On failure the ones taken are released before it
    /// returns.
    pub async fn lock_all(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<MultiGuard, LockError> {
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() || sorted.len() > MAX_NAMES {
            return Err(LockError::Invalid("multi-lock names (1-64)"));
        }
        for name in &sorted {
            super::client::check_public_name(name)?;
        }
        let started = Instant::now();
        let mut guards: Vec<LockGuard> = Vec::with_capacity(sorted.len());
        for name in sorted {
            let left = opts.wait.saturating_sub(started.elapsed());
            // Past the budget this is one attempt, as `try_lock` makes.
            let taken = self.acquire(name, opts, left).await;
            match taken {
                Ok(g) => guards.push(g),
                Err(e) => {
                    for g in guards.into_iter().rev() {
                        g.unlock().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(MultiGuard { guards })
    }
}
