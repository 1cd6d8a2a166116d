//! flashsale: a flash-sale inventory engine on Redis Cluster.
//!
//! A seckill service embeds an [`Engine`] and calls [`Engine::purchase`] for
//! every buyer; each call answers with a confirmed order or a typed reason
//! ([`PurchaseError`]), and never sells a unit that is not there.
//!
//! # Map of the crate
//!
//! | module | owns |
//! | --- | --- |
//! | [`config`] | [`Config`]: nodes, durability (`ack`), retry policy |
//! | [`placement`] | CRC16 slots, the cluster slot map, shard tags on distinct masters |
//! | [`keys`] | every key name (hash-tagged per bucket) |
//! | [`scripts`] | the Lua scripts of `lua/`, compiled in, with their SHA1 |
//! | [`engine`] | [`Engine`]: connection, script loading, EVALSHA with NOSCRIPT reload and retries |
//! | [`sale`] | the sale spec, the cached sale handle, status |
//! | [`admin`] | create, restock, close, repair: exactly once, never half-done |
//! | [`purchase`] | the hot path, and the fall-through walk over buckets |
//! | [`replies`] | every script's reply, decoded once into an enum |
//! | `sweeper` | settles fall-throughs whose process died half-way |
//! | `replication` | group commit of `ack = replicated` (one WAIT per batch) |
//! | [`orders`] | the order writer: streams into PostgreSQL exactly once |
//! | [`ledger`] | reconcile: initial = remaining + pending + written |
//! | [`lock`] | distributed locks on separate Redis nodes: Redlock, watchdog, fencing |
//! | [`db`] | PostgreSQL pool and versioned migrations |
//! | [`ratelimit`] | in-process token buckets for the service's door |
//! | [`validate`] | input checks before anything reaches Redis |
//! | [`redact`] | secrets out of labels, errors and printed config |
//! | [`error`] | typed errors and the one classification of Redis errors |
//! | [`metrics`] | metric names (`flashsale_*`) |
//!
//! # Path of a purchase
//!
//! [`Engine::purchase`] validates the request; while every bucket was seen
//! empty recently it reads only the request's own record (a request Redis
//! never saw is answered "sold out" from that process-local flag); otherwise
//! it runs `purchase.lua` with EVALSHA in the buyer's *home bucket* (picked
//! from the user id). That script checks the request record (a retry gets
//! the first answer; the same request with another qty is refused), the
//! window, the user's quota and the stock, and in one atomic step decrements
//! the stock and XADDs the order to the bucket's stream. When the home bucket
//! is short, the script reserves the quota and marks the request pending; the
//! engine then walks the other buckets in one fixed order with `take.lua`
//! (each bucket's answer is final for the request) and closes the pending
//! record with `settle.lua`. Every reply is decoded once, in [`replies`].
//! Fall-throughs whose process died half-way are settled by the sweeper
//! ([`Engine::settle_abandoned`]).
#![warn(missing_docs)]

pub mod admin;
mod batch;
mod cluster;
pub mod config;
#[cfg(feature = "postgres")]
pub mod db;
pub mod engine;
pub mod error;
pub mod hold;
pub mod keys;
#[cfg(feature = "postgres")]
pub mod ledger;
pub mod lock;
pub mod metrics;
pub mod order_id;
pub mod order_state;
#[cfg(feature = "postgres")]
pub mod orders;
pub mod placement;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod purchase;
pub mod ratelimit;
pub mod redact;
mod replication;
pub mod replies;
pub mod sale;
pub mod scripts;
#[cfg(feature = "settings")]
pub mod settings;
pub mod status;
mod sweeper;
pub mod validate;

pub use config::{Ack, Backoff, Config, OrderRecord};
pub use engine::Engine;
pub use error::{
    AdminError, ConfigError, ConnectError, HoldError, InvalidInput, NotReady, PurchaseError,
    Unavailable,
};
pub use hold::{ExpiryReport, OrderView, Transition};
pub use metrics::Stats;
pub use order_state::OrderState;
#[cfg(feature = "postgres")]
pub use orders::{OrderWriter, WriterConfig, WriterHandle, WriterReport};
pub use purchase::{Confirmed, PurchaseRequest};
pub use sale::{LatePayment, SaleSpec};
#[cfg(feature = "settings")]
pub use settings::{ServerConfig, Settings, SettingsError};
pub use status::{BucketStatus, SaleStatus};
pub use sweeper::SweepReport;
