//! Group commit for `ack = replicated`: a purchase is confirmed only once one
//! replica has it (`WAIT 1`). WAIT covers every write made earlier on the
//! same connection, and all purchases of a slot share one multiplexed
//! connection to its master, so one WAIT sent after a purchase's reply covers
//! that purchase and every other one answered before it. Purchases of a slot
//! therefore queue for the next WAIT instead of sending one each (which would
//! also stall the shared connection once per purchase).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::engine::Engine;

/// How long one WAIT may take before the batch is told "not replicated".
const WAIT_TIMEOUT_MS: u64 = 1000;

/// Answer of one WAIT to everyone in its batch: replicated, or why not.
type WaitAnswer = Result<bool, String>;

/// Per slot: whether a WAIT driver runs, and who waits for the next WAIT.
#[derive(Default)]
struct SlotWaits {
    driving: bool,
    next_batch: Vec<oneshot::Sender<WaitAnswer>>,
}

/// The batches of every slot. A std mutex: held only to push or take.
#[derive(Default)]
pub(crate) struct WaitBatches {
    slots: Mutex<HashMap<u16, SlotWaits>>,
}

impl WaitBatches {
    /// The per-slot state; a poisoned lock is still usable (plain data).
    fn lock(&self) -> MutexGuard<'_, HashMap<u16, SlotWaits>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Engine {
    /// Resolves once a WAIT sent after this call returns: true when a replica
    /// acknowledged every write made before it on the slot's master.
    pub(crate) async fn replicated(&self, slot: u16) -> WaitAnswer {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut slots = self.inner.waits.lock();
            let s = slots.entry(slot).or_default();
            s.next_batch.push(tx);
            !std::mem::replace(&mut s.driving, true)
        };
        if start_driver {
            let engine = self.clone();
            tokio::spawn(async move { engine.drive_waits(slot).await });
        }
        rx.await
            .unwrap_or_else(|_| Err("replication wait abandoned".into()))
    }

    /// Sends WAITs for `slot` while anyone is queued, one per batch.
    async fn drive_waits(&self, slot: u16) {
        loop {
            let batch = {
                let mut slots = self.inner.waits.lock();
                let Some(s) = slots.get_mut(&slot) else {
                    return;
                };
                if s.next_batch.is_empty() {
                    s.driving = false;
                    return;
                }
                std::mem::take(&mut s.next_batch)
            };
            let answer = self
                .wait_replicated(slot, WAIT_TIMEOUT_MS)
                .await
                .map_err(|e| e.to_string());
            for tx in batch {
                let _ = tx.send(answer.clone());
            }
        }
    }
}
