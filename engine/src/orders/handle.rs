//! A running writer as its owner sees it: [`WriterHandle`] to read its
//! progress and stop it (at once, or after draining), and the stop flags the
//! writer loop polls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{OrderWriter, WriterConfig, WriterError, WriterReport};
use crate::engine::Engine;

/// A writer running on a tokio task; stop it with [`WriterHandle::shutdown`].
pub struct WriterHandle {
    pub(super) stop: Arc<Stop>,
    pub(super) progress: Arc<std::sync::Mutex<WriterReport>>,
    pub(super) task: JoinHandle<Result<WriterReport, WriterError>>,
}

impl WriterHandle {
    /// Asks the writer to stop after the batch in hand, and waits for it.
    pub async fn shutdown(self) -> Result<WriterReport, WriterError> {
        self.stop.request();
        self.task
            .await
            .unwrap_or_else(|e| Err(WriterError::Task(e)))
    }

    /// Writes everything queued now, then stops: the writer keeps going until
    /// a full pass over every stream finds nothing, or `max` has passed (then
    /// it stops after the batch in hand; what is left stays in the streams).
    pub async fn drain(self, max: Duration) -> Result<WriterReport, WriterError> {
        self.stop.request_drain();
        let stop = self.stop.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(max).await;
            stop.request();
        });
        let r = self
            .task
            .await
            .unwrap_or_else(|e| Err(WriterError::Task(e)));
        timer.abort();
        r
    }

    /// What the writer has done so far (updated after every round).
    pub fn progress(&self) -> WriterReport {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Kills the task where it stands, as a crash would (tests, emergencies).
    pub fn abort(self) {
        self.task.abort();
    }
}

/// The stop flags and the wake-up for idle sleeps.
#[derive(Default)]
pub(super) struct Stop {
    asked: AtomicBool,
    drain: AtomicBool,
    pub(super) wake: Notify,
}

impl Stop {
    pub(super) fn request(&self) {
        self.asked.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    pub(super) fn request_drain(&self) {
        self.drain.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    pub(super) fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    pub(super) fn draining(&self) -> bool {
        self.drain.load(Ordering::SeqCst)
    }
}

impl Engine {
    /// Starts an order writer inside this process, draining into `pool`.
    pub async fn spawn_order_writer(
        &self,
        pool: Pool,
        config: WriterConfig,
    ) -> Result<WriterHandle, WriterError> {
        Ok(OrderWriter::new(self.clone(), pool, config).await?.spawn())
    }
}
