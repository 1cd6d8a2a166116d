//! The order writer: drains every shard's order stream into PostgreSQL
//! exactly once. One consumer group per stream, a consumer name unique to the
//! process; each batch is inserted in one transaction with `ON CONFLICT
//! (order_id) DO NOTHING` and acknowledged (XACK) only after COMMIT, so a crash
//! anywhere re-delivers rather than loses, and a re-delivery cannot duplicate.
//! Entries left pending by a dead consumer are taken over with XAUTOCLAIM.
//! It never writes stock and never answers buyers.
//!
//! The files: `writer.rs` the loop, `handle.rs` the handle and its stop,
//! `sql.rs` the SQL, `stream.rs` the stream reads, `entry.rs` the decoding
//! of an entry, `durable.rs` the replica check before a batch is written.

mod durable;
pub mod entry;
mod handle;
mod sql;
mod stream;
mod writer;

use std::time::Duration;

use crate::config::Backoff;
use crate::db::DbError;

pub use handle::WriterHandle;
pub use sql::write_batch;
pub use stream::cmp_ids as stream_cmp_ids;
pub use stream::GROUP;
pub use stream::{stream_info, StreamInfo};
pub use writer::OrderWriter;

/// Knobs of the order writer.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Consumer group name (shared by every writer).
    pub group: String,
    /// This writer's consumer name; unique per process.
    pub consumer: String,
    /// Most entries read and written per batch.
    pub batch: usize,
    /// Writers [`Engine::spawn_order_writer`](crate::Engine::spawn_order_writer) starts, as consumers of the
    /// one group (`<consumer>-<i>`), each on its own connections, so one
    /// stream's insert does not hold back the others'. Only the first runs
    /// the sweeper. Exactly-once holds for any number: each entry is read by
    /// one consumer, acknowledged only after its COMMIT, and inserted with
    /// `ON CONFLICT DO NOTHING`.
    pub writers: usize,
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
    /// ([`Engine::settle_abandoned`](crate::Engine::settle_abandoned)); zero turns the sweeper off.
    pub sweep_every: Duration,
    /// Longest WAIT for a replica before a batch is written (it stays
    /// pending and is asked again next round, never written unreplicated).
    pub replica_wait: Duration,
    /// A consumer of the group with nothing pending and not heard from for
    /// this long (a writer process that stopped or died) is deleted, so the
    /// group does not keep one consumer per writer ever started; zero
    /// keeps them all. Checked every tenth of it (at least every second).
    pub forget_idle: Duration,
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
            batch: 2000,
            writers: 2,
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
            forget_idle: Duration::from_secs(600),
        }
    }
}

/// Why the writer stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriterError {
    /// The migrations could not be applied.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The writer's own cluster connection could not be opened.
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    /// The writer's task ended without a report (it panicked or was
    /// aborted).
    #[error("writer task: {0}")]
    Task(tokio::task::JoinError),
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
    /// Dead consumers of the group deleted ([`WriterConfig::forget_idle`]).
    pub consumers_forgotten: u64,
}

impl WriterReport {
    /// Adds `other`'s counts to these (the writers of one handle).
    pub fn add(&mut self, other: &WriterReport) {
        self.written += other.written;
        self.acked += other.acked;
        self.dead_lettered += other.dead_lettered;
        self.claimed += other.claimed;
        self.held_unreplicated += other.held_unreplicated;
        self.rejected += other.rejected;
        self.settled_abandoned += other.settled_abandoned;
        self.consumers_forgotten += other.consumers_forgotten;
    }
}
