//! A running writer as its owner sees it: [`WriterHandle`] to read its
//! progress and stop it (at once, or after draining), and the stop flags the
//! writer loop polls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{WriterError, WriterReport};

/// The writers of one [`crate::Engine::spawn_order_writer`], each on its own tokio
/// task, stopped together (they share one stop flag); stop them with
/// [`WriterHandle::shutdown`]. Reports are the sum over the writers.
pub struct WriterHandle {
    pub(super) stop: Arc<Stop>,
    pub(super) writers: Vec<RunningWriter>,
}

/// One writer's task and progress.
pub(super) struct RunningWriter {
    pub(super) progress: Arc<std::sync::Mutex<WriterReport>>,
    pub(super) task: JoinHandle<Result<WriterReport, WriterError>>,
}

impl WriterHandle {
    /// Asks the writers to stop after the batch in hand, and waits for them.
    pub async fn shutdown(self) -> Result<WriterReport, WriterError> {
        self.stop.request();
        self.join().await
    }

    /// Waits for every writer; the first error wins, after all have ended.
    async fn join(self) -> Result<WriterReport, WriterError> {
        let mut total = WriterReport::default();
        let mut failed = None;
        for w in self.writers {
            match w.task.await.unwrap_or_else(|e| Err(WriterError::Task(e))) {
                Ok(r) => total.add(&r),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(total),
        }
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
        let r = self.join().await;
        timer.abort();
        r
    }

    /// What the writers have done so far (updated after every round).
    pub fn progress(&self) -> WriterReport {
        let mut total = WriterReport::default();
        for w in &self.writers {
            total.add(&w.progress.lock().unwrap_or_else(|p| p.into_inner()));
        }
        total
    }

    /// Kills the tasks where they stand, as a crash would (tests,
    /// emergencies).
    pub fn abort(self) {
        for w in self.writers {
            w.task.abort();
        }
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
