//! flashsale: a flash-sale inventory engine on Redis Cluster.
//!
//! A seckill service embeds an [`Engine`] and calls [`Engine::purchase`] for
//! every buyer; each call answers with a confirmed order or a typed reason
//! ([`PurchaseError`]), and never sells a unit that is not there.
//!
//! Where each part lives, which way calls go, and the path of a purchase
//! through the code are in `ARCHITECTURE.md` at the root of the repository,
//! the one map of the code (a second one here had already drifted from it);
//! what is promised, and its limits, in `docs/`.
#![warn(missing_docs)]

/// True when the planted bug `Name` ([`planted::Plant`]) is active; false,
/// and the hook compiled out, without the `planted-bugs` feature. Each
/// hook is then one line: `if planted!(SkipWait) { ... }`.
#[cfg(feature = "planted-bugs")]
macro_rules! planted {
    ($plant:ident) => {
        $crate::planted::active($crate::planted::Plant::$plant)
    };
}
#[cfg(not(feature = "planted-bugs"))]
macro_rules! planted {
    ($plant:ident) => {
        false
    };
}

/// The Rust examples of the README and of `docs/`, compiled as doctests
/// (`cargo test --doc`, run by `ops/test`): a page whose example stops
/// compiling fails the suite.
#[cfg(doctest)]
mod doc_examples {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../../docs/locks.md")]
    struct Locks;
    #[doc = include_str!("../../docs/orders.md")]
    struct Orders;
    #[doc = include_str!("../../docs/service.md")]
    struct Service;
    #[doc = include_str!("../../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../../docs/waiting-room.md")]
    struct WaitingRoom;
}

// What an embedder needs is public: the `Engine` and its requests and
// answers, errors, config, locks, the order writer, settings. A few
// internals stay public for a named user: `scripts` (the bench runs the
// very purchase script beside the engine), `keys` and `placement` (the
// tests, the bench and an operator's tooling read a sale's keys and a
// buyer's home bucket), `redact` (the bench prints URLs without their
// secrets), `validate` and `ratelimit` (the `flashsale` binary's `serve`
// is a crate of its own). `replies` and `lua` have no user outside.
pub mod acl;
pub mod admission;
mod batch;
mod cluster;
pub mod config;
#[cfg(feature = "postgres")]
pub mod db;
pub mod engine;
pub mod error;
pub mod keys;
#[cfg(feature = "postgres")]
pub mod ledger;
pub mod lock;
mod lua;
pub mod metrics;
pub mod ops;
pub mod order_id;
pub mod order_state;
#[cfg(feature = "postgres")]
pub mod orders;
#[cfg(feature = "postgres")]
pub mod pg_tls;
pub mod placement;
#[cfg(feature = "planted-bugs")]
#[doc(hidden)]
pub mod planted;
pub mod ratelimit;
pub mod redact;
mod replication;
pub mod room;
pub mod sale;
pub mod scripts;
#[cfg(feature = "settings")]
pub mod settings;
mod sweepers;
pub mod tls;
pub mod validate;

pub use config::{Ack, Backoff, Config, OrderRecord};
pub use engine::Engine;
pub use error::{
    AdminError, ConfigError, ConnectError, HoldError, InvalidInput, NotReady, PurchaseError,
    Unavailable,
};
pub use lua::BadReply;
pub use metrics::Stats;
pub use ops::{admin, holds, purchase, status};
pub use order_state::OrderState;
pub use order_state::{OrderView, Transition};
#[cfg(feature = "postgres")]
pub use orders::{OrderWriter, WriterConfig, WriterHandle, WriterReport};
pub use purchase::{CheckedPurchase, Confirmed, PurchaseRequest};
pub use room::{QueueError, QueueOrder, QueueRate, QueueSpec, QueueState, QueueStatus, RoomStatus};
pub use sale::{LatePayment, SaleSpec};
#[cfg(feature = "settings")]
pub use settings::{ServerConfig, Settings, SettingsError};
pub use status::{BucketStatus, SaleStatus};
pub use sweepers::expiry::ExpiryReport;
pub use sweepers::fall_through::SweepReport;
pub use tls::{Certificates, TlsFileError, TlsFiles};
