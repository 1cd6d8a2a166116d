//! Wake-ups for lock waiters: one pub/sub connection per lock node (however
//! many locks are waited on) subscribed to one channel on which every release
//! publishes the lock's name; each waiter waits on a `Notify` for its name.
//! A lost connection is re-opened in the background; waiters fall back to
//! the lock's remaining TTL, so a missed message delays, never blocks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The channel every release publishes on.
pub const CHANNEL: &str = "flashsale:lock:released";

/// Notifies for the lock names someone waits on.
#[derive(Default)]
pub struct Waiters {
    by_name: Mutex<HashMap<String, Weak<Notify>>>,
}

impl Waiters {
    /// The `Notify` for `name`, shared by every waiter of that name. Hold the
    /// returned `Arc` while waiting; the entry goes when the last one drops.
    pub fn register(&self, name: &str) -> Arc<Notify> {
        let mut map = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get(name).and_then(Weak::upgrade) {
            return n;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Notify::new());
        map.insert(name.to_owned(), Arc::downgrade(&n));
        n
    }

    fn wake(&self, name: &str) {
        let n = {
            let map = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
            map.get(name).and_then(Weak::upgrade)
        };
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    /// Starts the listener of one node; it lives until the returned task is
    /// aborted or `waiters` is dropped.
    pub fn listen(waiters: &Arc<Waiters>, client: redis::Client) -> JoinHandle<()> {
        let weak = Arc::downgrade(waiters);
        tokio::spawn(async move {
            loop {
                if weak.strong_count() == 0 {
                    return;
                }
                if let Ok(mut pubsub) = client.get_async_pubsub().await {
                    if pubsub.subscribe(CHANNEL).await.is_ok() {
                        let mut messages = pubsub.on_message();
                        while let Some(msg) = messages.next().await {
                            let Some(w) = weak.upgrade() else { return };
                            if let Ok(name) = std::str::from_utf8(msg.get_payload_bytes()) {
                                w.wake(name);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }
}
