//! The guard a caller holds while it owns a lock: its fencing token, the
//! loss signal, and release on unlock or drop (never a lock it does not hold).

use std::sync::Arc;
use std::time::Duration;

use super::client::Held;
use super::{LockClient, LockError};

/// A held lock. Unlock it with [`LockGuard::unlock`]; dropping it releases
/// it in the background.
pub struct LockGuard {
    pub(super) client: LockClient,
    pub(super) held: Arc<Held>,
    pub(super) released: bool,
}

impl LockGuard {
    /// The grant's fencing token: larger than every earlier grant's. Pass it
    /// with every write the lock guards (see `db::fenced`).
    pub fn fencing_token(&self) -> u64 {
        self.held.fence
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// True once the grant is known lost (renewal failed, or lease over),
    /// or its validity has run out by this client's clock.
    pub fn is_lost(&self) -> bool {
        *self.held.lost.borrow()
            || self.client.now_ms()
                >= self
                    .held
                    .valid_until_ms
                    .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How much longer the grant is valid by this client's clock (zero once
    /// it has run out): the time a holder may still rely on it. Renewals
    /// (the watchdog, [`LockGuard::extend`]) move it on.
    pub fn valid_for(&self) -> Duration {
        let until = self
            .held
            .valid_until_ms
            .load(std::sync::atomic::Ordering::SeqCst);
        Duration::from_millis(until.saturating_sub(self.client.now_ms()))
    }

    /// Resolves when the grant is lost, so the holder can stop its work.
    pub async fn lost(&self) {
        let mut rx = self.held.lost.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// Sets the lease to `lease` from now, on a majority of the nodes (a
    /// fixed-lease grant then lasts that much longer; under the watchdog the
    /// next renewal sets the watchdog's lease again). A grant already lost
    /// is [`LockError::Expired`].
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.client.extend_held(&self.held, lease).await
    }

    /// Releases this hold (the last hold of a reentrant owner releases the
    /// lock). Returns false when the lock had already expired or been taken.
    pub async fn unlock(mut self) -> bool {
        self.released = true;
        self.client.release_held(&self.held).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (client, held) = (self.client.clone(), self.held.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let releasing = client.clone();
            releasing.spawn_cleanup(&rt, async move {
                client.release_held(&held).await;
            });
        }
    }
}
