//! The writer loop: find every sale's streams, read a batch from each,
//! insert it into PostgreSQL in one transaction, acknowledge only after
//! COMMIT, take over entries a silent consumer left pending, and move
//! malformed entries to a dead-letter stream. Also where an engine starts
//! its writers (`Engine::spawn_order_writer`), so the handle that stops
//! them (`handle.rs`) needs nothing of the writer.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use redis::cluster_async::ClusterConnection;

use super::entry::{OrderEvent, OrderRow, RawEntry, Record};
use super::handle::{RunningWriter, Stop, WriterHandle};
use super::sql::{db_message, is_permanent, write_batch, WriteFailure};
use super::{stream, WriterConfig, WriterError, WriterReport};
use crate::db;
use crate::engine::Engine;
use crate::metrics as m;

/// State of one stream this writer drains.
pub(super) struct StreamState {
    /// Where malformed entries of this stream go (same hash tag, same slot).
    pub(super) dead_letter: String,
    pub(super) group_ready: bool,
    pub(super) last_claim: Option<Instant>,
    /// A stream that keeps coming back empty is polled less and less often
    /// (up to [`MAX_QUIET`]), so hundreds of finished sales do not cost the
    /// cluster hundreds of reads every `idle_wait`.
    pub(super) quiet_until: Option<Instant>,
    pub(super) quiet_for: Duration,
    /// The stream's slot (its master is where WAIT goes).
    pub(super) slot: u16,
    /// Entries were read (and stay pending on this consumer) but were not on
    /// a replica yet: read them again from the current master's pending list
    /// before anything new. After a failover that lost them, they are not
    /// there any more, and are never written.
    pub(super) reread_own: bool,
}

/// Longest pause between reads of a stream that had nothing.
const MAX_QUIET: Duration = Duration::from_millis(250);

/// Drains the order streams of every sale into PostgreSQL.
pub struct OrderWriter {
    pub(super) engine: Engine,
    pub(super) conn: ClusterConnection,
    pub(super) pool: Pool,
    pub(super) config: WriterConfig,
    pub(super) streams: BTreeMap<String, StreamState>,
    pub(super) report: WriterReport,
    pub(super) progress: Arc<std::sync::Mutex<WriterReport>>,
    pub(super) stop: Arc<Stop>,
    /// Per slot: whether its master has replicas, and when that was asked.
    pub(super) replica_cache: std::collections::HashMap<u16, (bool, Instant)>,
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
            .map_err(WriterError::Redis)?;
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
        WriterHandle {
            stop,
            writers: vec![self.spawn_task()],
        }
    }

    /// The writer on a task of its own, with its progress.
    pub(super) fn spawn_task(self) -> RunningWriter {
        let progress = self.progress.clone();
        let task = tokio::spawn(async move {
            let mut w = self;
            w.run_until_stopped().await
        });
        RunningWriter { progress, task }
    }

    async fn run_until_stopped(&mut self) -> Result<WriterReport, WriterError> {
        let mut last_discover: Option<Instant> = None;
        let mut last_sweep: Option<Instant> = None;
        let mut last_forget: Option<Instant> = None;
        let forget_every = (self.config.forget_idle / 10).max(Duration::from_secs(1));
        while !self.stop.asked() {
            if !self.config.forget_idle.is_zero()
                && last_forget.is_none_or(|t| t.elapsed() >= forget_every)
            {
                self.forget_dead_consumers().await;
                last_forget = Some(Instant::now());
            }
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

    /// Deletes the group's consumers that writers which stopped or died
    /// left behind with nothing pending ([`WriterConfig::forget_idle`]).
    async fn forget_dead_consumers(&mut self) {
        let keys: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| s.group_ready)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            match stream::forget_consumers(
                &mut self.conn,
                &self.engine.scripts().forget_consumers,
                &key,
                &self.config.group,
                &self.config.consumer,
                self.config.forget_idle,
            )
            .await
            {
                Ok(n) => self.report.consumers_forgotten += n.max(0) as u64,
                Err(e) => {
                    tracing::warn!(stream = %key, error = %e, "forgetting dead consumers failed")
                }
            }
        }
    }

    /// Settles fall-throughs whose process died half-way (see `sweepers/fall_through.rs`).
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
        metrics::gauge!(m::ORDER_BACKLOG).set(backlog as f64);
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
                metrics::counter!(m::ORDERS_CLAIMED).increment(claimed.len() as u64);
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
    pub(super) async fn handle_batch(
        &mut self,
        key: &str,
        entries: Vec<RawEntry>,
    ) -> Result<(), redis::RedisError> {
        let mut rows = Vec::with_capacity(entries.len());
        let mut events = Vec::new();
        let mut record_entries = Vec::with_capacity(entries.len());
        let mut event_entries = Vec::new();
        let mut dead: Vec<(&RawEntry, String)> = Vec::new();
        // An entry of the compact form takes its shard tag from its stream.
        let tag = crate::keys::stream_tag(key).unwrap_or_default();
        for e in &entries {
            match e.to_record(tag) {
                Ok(Record::Order(r)) => {
                    rows.push(r);
                    record_entries.push(e);
                }
                Ok(Record::Event(ev)) => {
                    events.push(ev);
                    event_entries.push(e);
                }
                Err(reason) => dead.push((e, reason.to_string())),
            }
        }
        if planted!(WriterAckBeforeCommit) {
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            stream::ack(&mut self.conn, key, &self.config.group, &ids).await?;
            if let Ok(n) = write_batch(&self.pool, &rows, &events).await {
                self.report.written += n;
            }
            return Ok(());
        }
        if !rows.is_empty() || !events.is_empty() {
            match self.write_with_retry(&rows, &events).await {
                Ok(inserted) => self.report.written += inserted,
                Err(WriteFailure::Stopped) => return Ok(()),
                Err(WriteFailure::Permanent(_)) => {
                    // One bad row must not hold back the rest of the batch,
                    // nor every stream after this one: write them one by one
                    // and dead-letter each row the database refuses for good.
                    let one_by_one = rows
                        .iter()
                        .map(|r| (std::slice::from_ref(r), &[][..]))
                        .zip(&record_entries)
                        .chain(
                            events
                                .iter()
                                .map(|e| (&[][..], std::slice::from_ref(e)))
                                .zip(&event_entries),
                        );
                    for ((row, event), entry) in one_by_one {
                        match self.write_with_retry(row, event).await {
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
            let moved = stream::dead_letter(
                &mut self.conn,
                &self.engine.scripts().dead_letter,
                key,
                &dead_key,
                &self.config.group,
                e,
                reason,
            )
            .await?;
            if moved {
                tracing::warn!(stream = key, id = %e.id, reason, "order entry dead-lettered");
                metrics::counter!(m::ORDERS_DEAD_LETTERED).increment(1);
                self.report.dead_lettered += 1;
            }
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        stream::ack(&mut self.conn, key, &self.config.group, &ids).await?;
        self.report.acked += ids.len() as u64;
        stream::trim_acknowledged(
            &mut self.conn,
            &self.engine.scripts().trim,
            key,
            &self.config.group,
        )
        .await?;
        Ok(())
    }

    /// Inserts `rows` in one transaction, retrying with backoff while
    /// PostgreSQL fails for a reason that may pass. Returns the rows
    /// inserted; a refusal that will not pass (bad data: SQLSTATE classes 22
    /// and 23); or `Stopped` when shutdown's grace ran out first (nothing
    /// acknowledged, nothing lost).
    async fn write_with_retry(
        &self,
        rows: &[OrderRow],
        events: &[OrderEvent],
    ) -> Result<u64, WriteFailure> {
        let mut attempt = 0u32;
        let mut stop_seen: Option<Instant> = None;
        loop {
            let started = Instant::now();
            match write_batch(&self.pool, rows, events).await {
                Ok(n) => {
                    metrics::histogram!(m::ORDER_WRITE_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    metrics::histogram!(m::ORDER_BATCH_SIZE)
                        .record((rows.len() + events.len()) as f64);
                    metrics::counter!(m::ORDERS_WRITTEN).increment(n);
                    return Ok(n);
                }
                Err(e) if is_permanent(&e) => {
                    metrics::counter!(m::ORDER_WRITE_FAILURES).increment(1);
                    return Err(WriteFailure::Permanent(db_message(&e)));
                }
                Err(e) => {
                    metrics::counter!(m::ORDER_WRITE_FAILURES).increment(1);
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
    /// Starts the order writers inside this process (`config.writers` of
    /// them, at least one), draining into `pool`.
    pub async fn spawn_order_writer(
        &self,
        pool: Pool,
        config: WriterConfig,
    ) -> Result<WriterHandle, WriterError> {
        let stop = Arc::new(Stop::default());
        let n = config.writers.max(1);
        // Every writer is made before any starts: a failure half-way leaves
        // none running that nothing could stop.
        let mut made = Vec::with_capacity(n);
        for i in 0..n {
            let mut c = config.clone();
            if n > 1 {
                c.consumer = format!("{}-{i}", config.consumer);
            }
            if i > 0 {
                // One sweeper per process is enough (any number is safe).
                c.sweep_every = Duration::ZERO;
            }
            let mut w = OrderWriter::new(self.clone(), pool.clone(), c).await?;
            w.stop = stop.clone();
            made.push(w);
        }
        let writers = made.into_iter().map(OrderWriter::spawn_task).collect();
        Ok(WriterHandle { stop, writers })
    }
}
