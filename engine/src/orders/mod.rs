//! The order writer: drains every shard's order stream into PostgreSQL
//! exactly once. One consumer group per stream, a consumer name unique to the
//! process; each batch is inserted in one transaction with `ON CONFLICT
//! (order_id) DO NOTHING` and acknowledged (XACK) only after COMMIT, so a crash
//! anywhere re-delivers rather than loses, and a re-delivery cannot duplicate.
//! Entries left pending by a dead consumer are taken over with XAUTOCLAIM.
//! It never writes stock and never answers buyers.

mod durable;
pub mod entry;
mod sql;
mod stream;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use redis::cluster_async::ClusterConnection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::Backoff;
use crate::db::{self, DbError};
use crate::engine::Engine;
use entry::{OrderRow, RawEntry};
use sql::{db_message, is_permanent, WriteFailure};

pub use sql::write_batch;
pub use stream::cmp_ids as stream_cmp_ids;
pub use stream::GROUP;

/// Metric names of the order path.
pub mod metric {
    /// Orders inserted (new rows; a re-delivered duplicate is not counted).
    pub const WRITTEN: &str = "flashsale_orders_written_total";
    /// Entries per batch.
    pub const BATCH_SIZE: &str = "flashsale_order_batch_size";
    /// Time to insert and commit one batch, seconds.
    pub const WRITE_SECONDS: &str = "flashsale_order_write_duration_seconds";
    /// Failed batch writes (PostgreSQL unreachable or refusing).
    pub const WRITE_FAILURES: &str = "flashsale_order_write_failures_total";
    /// Entries in the streams not yet written (undelivered + pending).
    pub const BACKLOG: &str = "flashsale_order_backlog_entries";
    /// Malformed entries moved to a dead-letter stream.
    pub const DEAD_LETTERED: &str = "flashsale_orders_dead_lettered_total";
    /// Entries taken over from consumers that went quiet.
    pub const CLAIMED: &str = "flashsale_orders_claimed_total";
}

/// Knobs of the order writer.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Consumer group name (shared by every writer).
    pub group: String,
    /// This writer's consumer name; unique per process.
    pub consumer: String,
    /// Most entries read and written per batch.
    pub batch: usize,
    /// Pause after a round that found nothing.
    pub idle_wait: Duration,
    /// Entries pending longer than this on another consumer are taken over.
    pub claim_idle: Duration,
    /// How often the list of streams (sales) is refreshed.
    pub discover_every: Duration,
    /// Backoff while PostgreSQL is unreachable.
    pub backoff: Backoff,
    /// How long to keep retrying the batch in hand after shutdown was asked.
    pub shutdown_grace: Duration,
    /// How often abandoned fall-throughs are settled
    /// ([`Engine::settle_abandoned`]); zero turns the sweeper off.
    pub sweep_every: Duration,
    /// Longest WAIT for a replica before a batch is written (it stays
    /// pending and is asked again next round, never written unreplicated).
    pub replica_wait: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            group: GROUP.to_owned(),
            consumer: format!(
                "writer-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            batch: 500,
            idle_wait: Duration::from_millis(20),
            claim_idle: Duration::from_secs(30),
            discover_every: Duration::from_secs(1),
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_secs(2),
                deadline: Duration::MAX,
            },
            shutdown_grace: Duration::from_secs(5),
            sweep_every: Duration::from_secs(1),
            replica_wait: Duration::from_millis(200),
        }
    }
}

/// Why the writer stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriterError {
    /// The migrations could not be applied.
    #[error("database: {0}")]
    Db(#[from] DbError),
    /// The writer's own cluster connection could not be opened.
    #[error("redis: {0}")]
    Redis(String),
}

/// What a writer did, returned when it stops.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriterReport {
    /// Rows inserted.
    pub written: u64,
    /// Entries acknowledged (written, duplicates and dead letters).
    pub acked: u64,
    /// Entries moved to dead-letter streams.
    pub dead_lettered: u64,
    /// Entries taken over from other consumers.
    pub claimed: u64,
    /// Times a batch was held back because no replica had it yet.
    pub held_unreplicated: u64,
    /// Entries PostgreSQL refused for good (dead-lettered with its message).
    pub rejected: u64,
    /// Abandoned fall-throughs the writer's sweeper settled.
    pub settled_abandoned: u64,
}

/// A writer running on a tokio task; stop it with [`WriterHandle::shutdown`].
pub struct WriterHandle {
    stop: Arc<Stop>,
    progress: Arc<std::sync::Mutex<WriterReport>>,
    task: JoinHandle<Result<WriterReport, WriterError>>,
}

impl WriterHandle {
    /// Asks the writer to stop after the batch in hand, and waits for it.
    pub async fn shutdown(self) -> Result<WriterReport, WriterError> {
        self.stop.request();
        self.task
            .await
            .unwrap_or_else(|e| Err(WriterError::Redis(format!("writer task: {e}"))))
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
            .unwrap_or_else(|e| Err(WriterError::Redis(format!("writer task: {e}"))));
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
struct Stop {
    asked: AtomicBool,
    drain: AtomicBool,
    wake: Notify,
}

impl Stop {
    fn request(&self) {
        self.asked.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    fn request_drain(&self) {
        self.drain.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    fn draining(&self) -> bool {
        self.drain.load(Ordering::SeqCst)
    }
}

/// State of one stream this writer drains.
struct StreamState {
    /// Where malformed entries of this stream go (same hash tag, same slot).
    dead_letter: String,
    group_ready: bool,
    last_claim: Option<Instant>,
    /// A stream that keeps coming back empty is polled less and less often
    /// (up to [`MAX_QUIET`]), so hundreds of finished sales do not cost the
    /// cluster hundreds of reads every `idle_wait`.
    quiet_until: Option<Instant>,
    quiet_for: Duration,
    /// The stream's slot (its master is where WAIT goes).
    slot: u16,
    /// Entries were read (and stay pending on this consumer) but were not on
    /// a replica yet: read them again from the current master's pending list
    /// before anything new. After a failover that lost them, they are not
    /// there any more, and are never written.
    reread_own: bool,
}

/// Longest pause between reads of a stream that had nothing.
const MAX_QUIET: Duration = Duration::from_millis(250);

/// Drains the order streams of every sale into PostgreSQL.
pub struct OrderWriter {
    engine: Engine,
    conn: ClusterConnection,
    pool: Pool,
    config: WriterConfig,
    streams: BTreeMap<String, StreamState>,
    report: WriterReport,
    progress: Arc<std::sync::Mutex<WriterReport>>,
    stop: Arc<Stop>,
    /// Per slot: whether its master has replicas, and when that was asked.
    replica_cache: std::collections::HashMap<u16, (bool, Instant)>,
}

impl OrderWriter {
    /// A writer over `engine`'s sales writing to `pool`; applies migrations
    /// and opens its own cluster connection (so its reads never queue behind
    /// or in front of purchases on the engine's connection).
    pub async fn new(
        engine: Engine,
        pool: Pool,
        config: WriterConfig,
    ) -> Result<OrderWriter, WriterError> {
        db::migrate(&pool).await?;
        let conn = engine
            .dedicated_connection()
            .await
            .map_err(|e| WriterError::Redis(e.to_string()))?;
        Ok(OrderWriter {
            engine,
            conn,
            pool,
            config,
            streams: BTreeMap::new(),
            report: WriterReport::default(),
            progress: Arc::default(),
            stop: Arc::new(Stop::default()),
            replica_cache: Default::default(),
        })
    }

    /// Runs until `shutdown` resolves, then finishes the batch in hand.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<WriterReport, WriterError> {
        let stop = self.stop.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            stop.request();
        });
        let result = self.run_until_stopped().await;
        watcher.abort();
        result
    }

    /// Starts the writer on a task.
    pub fn spawn(self) -> WriterHandle {
        let stop = self.stop.clone();
        let progress = self.progress.clone();
        let task = tokio::spawn(async move {
            let mut w = self;
            w.run_until_stopped().await
        });
        WriterHandle {
            stop,
            progress,
            task,
        }
    }

    async fn run_until_stopped(&mut self) -> Result<WriterReport, WriterError> {
        let mut last_discover: Option<Instant> = None;
        let mut last_sweep: Option<Instant> = None;
        while !self.stop.asked() {
            if last_discover.is_none_or(|t| t.elapsed() >= self.config.discover_every) {
                self.discover().await;
                last_discover = Some(Instant::now());
            }
            if !self.config.sweep_every.is_zero()
                && last_sweep.is_none_or(|t| t.elapsed() >= self.config.sweep_every)
            {
                self.sweep().await;
                last_sweep = Some(Instant::now());
            }
            let draining = self.stop.draining();
            if draining {
                // Pick up streams of sales created since the last discovery.
                self.discover().await;
            }
            let moved = self.round().await;
            *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = self.report.clone();
            if moved == 0 && draining {
                break;
            }
            if moved == 0 && !self.stop.asked() {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.idle_wait) => {}
                    _ = self.stop.wake.notified() => {}
                }
            }
        }
        Ok(self.report.clone())
    }

    /// Settles fall-throughs whose process died half-way (see `sweeper.rs`).
    async fn sweep(&mut self) {
        match self.engine.settle_abandoned().await {
            Ok(r) => self.report.settled_abandoned += r.settled,
            Err(e) => tracing::warn!(error = %e, "sweeper pass failed"),
        }
    }

    /// Refreshes the list of streams from the sale index and publishes the
    /// backlog gauge.
    async fn discover(&mut self) {
        let skus = match self.engine.list_sales().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "order writer cannot list sales");
                return;
            }
        };
        for sku in skus {
            if let Ok(sale) = self.engine.sale(&sku).await {
                for b in &sale.buckets {
                    self.streams
                        .entry(b.keys.orders.clone())
                        .or_insert_with(|| StreamState {
                            dead_letter: crate::keys::dead_letter_stream(&b.tag),
                            group_ready: false,
                            last_claim: None,
                            quiet_until: None,
                            quiet_for: Duration::ZERO,
                            slot: b.slot,
                            reread_own: false,
                        });
                }
            }
        }
        let mut backlog = 0u64;
        for key in self.streams.keys() {
            backlog += stream::backlog(&mut self.conn, key, &self.config.group)
                .await
                .unwrap_or(0);
        }
        metrics::gauge!(metric::BACKLOG).set(backlog as f64);
    }

    /// One pass over every stream; returns the entries handled.
    async fn round(&mut self) -> usize {
        // A drain must look at every stream, quiet or not.
        let now = Instant::now();
        let draining = self.stop.draining();
        let keys: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| draining || s.quiet_until.is_none_or(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        let mut moved = 0;
        for key in keys {
            if self.stop.asked() {
                break;
            }
            let n = match self.drain_once(&key).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(stream = %key, error = %e, "order stream read failed");
                    0
                }
            };
            moved += n;
            if let Some(s) = self.streams.get_mut(&key) {
                if n == 0 {
                    s.quiet_for = (s.quiet_for * 2).max(self.config.idle_wait).min(MAX_QUIET);
                    s.quiet_until = Some(Instant::now() + s.quiet_for);
                } else {
                    s.quiet_for = Duration::ZERO;
                    s.quiet_until = None;
                }
            }
        }
        moved
    }

    /// Reads one batch (claimed entries first) from `key` and handles it.
    async fn drain_once(&mut self, key: &str) -> Result<usize, redis::RedisError> {
        let group = self.config.group.clone();
        let consumer = self.config.consumer.clone();
        let Some(state) = self.streams.get_mut(key) else {
            return Ok(0);
        };
        if !state.group_ready {
            stream::ensure_group(&mut self.conn, key, &group).await?;
            state.group_ready = true;
        }
        let slot = state.slot;
        // Which node the batch is read from: the WAIT must be answered by
        // the same one, or a failover in between could pass off the new
        // master's replication for entries only the old one had.
        let read_from = self.master_id(slot).await?;
        if self.streams.get(key).is_some_and(|s| s.reread_own) {
            let own =
                stream::read_own_pending(&mut self.conn, key, &group, &consumer, self.config.batch)
                    .await?;
            if own.is_empty() {
                if let Some(s) = self.streams.get_mut(key) {
                    s.reread_own = false;
                }
            } else {
                return self.write_if_replicated(key, slot, &read_from, own).await;
            }
        }
        let Some(state) = self.streams.get_mut(key) else {
            return Ok(0);
        };
        let mut entries = Vec::new();
        let claim_due = state
            .last_claim
            .is_none_or(|t| t.elapsed() >= self.config.claim_idle / 2);
        if claim_due {
            state.last_claim = Some(Instant::now());
            let claimed = stream::autoclaim(
                &mut self.conn,
                key,
                &group,
                &consumer,
                self.config.claim_idle,
                self.config.batch,
            )
            .await?;
            if !claimed.is_empty() {
                metrics::counter!(metric::CLAIMED).increment(claimed.len() as u64);
                self.report.claimed += claimed.len() as u64;
                tracing::info!(stream = key, n = claimed.len(), "took over pending orders");
            }
            entries = claimed;
        }
        if entries.len() < self.config.batch {
            let fresh = stream::read_new(
                &mut self.conn,
                key,
                &group,
                &consumer,
                self.config.batch - entries.len(),
            )
            .await;
            match fresh {
                Ok(f) => entries.extend(f),
                Err(e) if e.code() == Some("NOGROUP") => {
                    if let Some(s) = self.streams.get_mut(key) {
                        s.group_ready = false;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if entries.is_empty() {
            return Ok(0);
        }
        self.write_if_replicated(key, slot, &read_from, entries)
            .await
    }

    /// Writes the good entries, dead-letters the bad, then acknowledges all
    /// and trims what is acknowledged. Gives up (leaving everything pending
    /// for a later claim) only when shutdown was asked and the grace ran out.
    async fn handle_batch(
        &mut self,
        key: &str,
        entries: Vec<RawEntry>,
    ) -> Result<(), redis::RedisError> {
        let mut rows = Vec::with_capacity(entries.len());
        let mut row_entries = Vec::with_capacity(entries.len());
        let mut dead: Vec<(&RawEntry, String)> = Vec::new();
        for e in &entries {
            match e.to_order() {
                Ok(r) => {
                    rows.push(r);
                    row_entries.push(e);
                }
                Err(reason) => dead.push((e, reason.to_string())),
            }
        }
        #[cfg(feature = "planted-bugs")]
        if crate::planted::active(crate::planted::Plant::WriterAckBeforeCommit) {
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            stream::ack(&mut self.conn, key, &self.config.group, &ids).await?;
            if let Ok(n) = write_batch(&self.pool, &rows).await {
                self.report.written += n;
            }
            return Ok(());
        }
        if !rows.is_empty() {
            match self.write_with_retry(&rows).await {
                Ok(inserted) => self.report.written += inserted,
                Err(WriteFailure::Stopped) => return Ok(()),
                Err(WriteFailure::Permanent(_)) => {
                    // One bad row must not hold back the rest of the batch,
                    // nor every stream after this one: write them one by one
                    // and dead-letter each row the database refuses for good.
                    for (row, entry) in rows.iter().zip(&row_entries) {
                        match self.write_with_retry(std::slice::from_ref(row)).await {
                            Ok(n) => self.report.written += n,
                            Err(WriteFailure::Stopped) => return Ok(()),
                            Err(WriteFailure::Permanent(msg)) => {
                                self.report.rejected += 1;
                                dead.push((*entry, format!("refused by PostgreSQL: {msg}")));
                            }
                        }
                    }
                }
            }
        }
        let dead_key = self
            .streams
            .get(key)
            .map(|s| s.dead_letter.clone())
            .unwrap_or_default();
        for (e, reason) in &dead {
            stream::dead_letter(&mut self.conn, &dead_key, e, reason).await?;
            tracing::warn!(stream = key, id = %e.id, reason, "order entry dead-lettered");
        }
        if !dead.is_empty() {
            metrics::counter!(metric::DEAD_LETTERED).increment(dead.len() as u64);
            self.report.dead_lettered += dead.len() as u64;
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        stream::ack(&mut self.conn, key, &self.config.group, &ids).await?;
        self.report.acked += ids.len() as u64;
        if let Some(last) = ids.iter().max_by(|a, b| stream::cmp_ids(a, b)) {
            stream::trim_acknowledged(&mut self.conn, key, &self.config.group, last).await?;
        }
        Ok(())
    }

    /// Inserts `rows` in one transaction, retrying with backoff while
    /// PostgreSQL fails for a reason that may pass. Returns the rows
    /// inserted; a refusal that will not pass (bad data: SQLSTATE classes 22
    /// and 23); or `Stopped` when shutdown's grace ran out first (nothing
    /// acknowledged, nothing lost).
    async fn write_with_retry(&self, rows: &[OrderRow]) -> Result<u64, WriteFailure> {
        let mut attempt = 0u32;
        let mut stop_seen: Option<Instant> = None;
        loop {
            let started = Instant::now();
            match write_batch(&self.pool, rows).await {
                Ok(n) => {
                    metrics::histogram!(metric::WRITE_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    metrics::histogram!(metric::BATCH_SIZE).record(rows.len() as f64);
                    metrics::counter!(metric::WRITTEN).increment(n);
                    return Ok(n);
                }
                Err(e) if is_permanent(&e) => {
                    metrics::counter!(metric::WRITE_FAILURES).increment(1);
                    return Err(WriteFailure::Permanent(db_message(&e)));
                }
                Err(e) => {
                    metrics::counter!(metric::WRITE_FAILURES).increment(1);
                    tracing::warn!(error = %e, attempt, "order batch write failed; will retry");
                }
            }
            if self.stop.asked() {
                let t = *stop_seen.get_or_insert_with(Instant::now);
                if t.elapsed() >= self.config.shutdown_grace {
                    tracing::warn!(
                        n = rows.len(),
                        "stopping with a batch unwritten; it stays pending"
                    );
                    return Err(WriteFailure::Stopped);
                }
            }
            tokio::time::sleep(self.config.backoff.delay(attempt)).await;
            attempt = attempt.saturating_add(1);
        }
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
