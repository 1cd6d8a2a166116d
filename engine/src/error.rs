//! Typed errors of the library, one enum per kind of call, so a caller can
//! branch on what happened (`PurchaseError::SoldOut`) instead of parsing text.
//! Every Redis error is classified once, in [`classify`], into what the engine
//! does about it. Nothing here touches the network.

use std::fmt;
use std::sync::Arc;

use redis::RedisError;

use crate::lock::LockError;
use crate::lua::BadReply;

/// Why a purchase did not confirm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PurchaseError {
    /// Every bucket of the SKU lacks the requested quantity.
    #[error("sold out")]
    SoldOut,
    /// The buyer would go past the sale's per-user limit.
    #[error("per-user limit of {limit} exceeded ({already} already bought)")]
    LimitExceeded {
        /// The sale's per-user limit.
        limit: u32,
        /// Units the user already holds or has reserved.
        already: u32,
    },
    /// The sale's window has not opened yet.
    #[error("sale not started")]
    NotStarted,
    /// The sale's window is over.
    #[error("sale ended")]
    Ended,
    /// The sale was closed by an operator.
    #[error("sale closed")]
    Closed,
    /// No sale exists for this SKU.
    #[error("unknown sale {0:?}")]
    UnknownSale(String),
    /// The request itself is malformed; nothing was changed.
    #[error("invalid request: {0}")]
    Invalid(InvalidInput),
    /// This (sku, user, request_id) was first sent with another quantity;
    /// nothing was changed. A request id names one request, as an
    /// idempotency key does: send new parameters under a new id.
    #[error("request id was used before with other parameters")]
    RequestMismatch,
    /// The order this request made was lost with a master that died before
    /// its replica had it (possible under `ack = leader` once the request
    /// was confirmed, under `replicated` only before it was): no bucket holds
    /// it, and this request id will never make another. Final: buy again
    /// under a new request id.
    #[error("order {order_id} was lost in a failover; buy again under a new request id")]
    OrderLost {
        /// The order the request's record names.
        order_id: String,
    },
    /// The inventory cluster could not answer within the retry budget, or
    /// the engine could not confirm the answer safely. A retry with the same
    /// request id is always safe.
    #[error("inventory unavailable: {0}")]
    Unavailable(Unavailable),
    /// The sale has a waiting room and this purchase brought no admission
    /// for its user that is valid now (none, a ticket instead, or one past
    /// its window); nothing was changed.
    #[error("not admitted: buy with an admission token from the sale's queue")]
    NotAdmitted,
    /// The admission token does not verify (forged, altered, another
    /// sale's or user's, or signed with a retired key); nothing was changed.
    #[error("invalid admission token: {0}")]
    InvalidTicket(crate::admission::PassError),
}

/// Why the inventory could not answer. The error itself is kept, not its
/// text, so a caller can still ask redis-rs what happened (`Redis(e)` then
/// `e.kind()`). Its text is part of the message; like every error of this
/// crate that shows its cause in its message, it does not repeat the cause
/// as a `source()`, so a printed chain says each thing once.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// Redis answered with an error, or could not be reached, past the
    /// retry budget.
    #[error("{0}")]
    Redis(Arc<RedisError>),
    /// A script replied in a shape the engine does not know.
    #[error(transparent)]
    Reply(#[from] BadReply),
    /// Redis answered, but the engine cannot confirm the answer: no replica
    /// acknowledged it in time, the connection was renewed mid-purchase, or a
    /// failover took back an unconfirmed order.
    #[error("{0}")]
    Unconfirmed(String),
}

impl Unavailable {
    /// An [`Unavailable::Unconfirmed`] with this reason.
    pub fn unconfirmed(why: impl Into<String>) -> Self {
        Unavailable::Unconfirmed(why.into())
    }
}

impl From<RedisError> for Unavailable {
    fn from(e: RedisError) -> Self {
        Unavailable::Redis(Arc::new(e))
    }
}

/// Equal when of the same kind with the same message (a `RedisError` has no
/// equality of its own).
impl PartialEq for Unavailable {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for Unavailable {}

impl From<Unavailable> for PurchaseError {
    fn from(e: Unavailable) -> Self {
        PurchaseError::Unavailable(e)
    }
}

impl From<RedisError> for PurchaseError {
    fn from(e: RedisError) -> Self {
        PurchaseError::Unavailable(e.into())
    }
}

/// Why a held order's payment, cancel or lookup did not go through
/// (`Engine::pay`, `Engine::cancel`, `Engine::order`). Every refusal changed
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HoldError {
    /// The order id, or the payment reference, is malformed.
    #[error("invalid request: {0}")]
    Invalid(InvalidInput),
    /// No such order: its id names no sale, no bucket of the sale, or no
    /// order in that bucket (never made, or its record is gone).
    #[error("unknown order {0:?}")]
    UnknownOrder(String),
    /// The order's sale does not hold orders (`hold_ms = 0`): its orders
    /// are paid when confirmed, so there is nothing to pay or cancel.
    #[error("sale {0:?} does not hold orders: its orders are paid when confirmed")]
    NoHolds(String),
    /// A payment came after the hold ended (expired or cancelled): the unit
    /// was not kept for the buyer, and the order is not paid.
    #[error("the hold ended ({state}): the unit was not kept")]
    HoldExpired {
        /// `expired` or `cancelled`.
        state: crate::order_state::OrderState,
    },
    /// A cancel of an order that is already final (paid, or expired).
    #[error("the order is already {state}")]
    AlreadyFinal {
        /// The state it is in.
        state: crate::order_state::OrderState,
    },
    /// A payment of an order already paid under another payment reference.
    #[error("the order was paid with another payment reference")]
    PaymentConflict,
    /// The inventory could not answer or the answer could not be confirmed;
    /// a retry is safe (every transition answers its retry the same).
    #[error("inventory unavailable: {0}")]
    Unavailable(Unavailable),
}

impl HoldError {
    /// A short, stable name of the error (metrics labels, HTTP `error`).
    pub fn code(&self) -> &'static str {
        match self {
            HoldError::Invalid(_) => "invalid",
            HoldError::UnknownOrder(_) => "unknown_order",
            HoldError::NoHolds(_) => "no_holds",
            HoldError::HoldExpired { .. } => "hold_expired",
            HoldError::AlreadyFinal { .. } => "already_final",
            HoldError::PaymentConflict => "payment_conflict",
            HoldError::Unavailable(_) => "unavailable",
        }
    }
}

impl From<Unavailable> for HoldError {
    fn from(e: Unavailable) -> Self {
        HoldError::Unavailable(e)
    }
}

impl From<RedisError> for HoldError {
    fn from(e: RedisError) -> Self {
        HoldError::Unavailable(e.into())
    }
}

impl PurchaseError {
    /// A short, stable name of the error: the `result` label of the purchase
    /// metrics and the `error` field of the HTTP answer.
    pub fn code(&self) -> &'static str {
        match self {
            PurchaseError::SoldOut => "sold_out",
            PurchaseError::LimitExceeded { .. } => "limit_exceeded",
            PurchaseError::NotStarted => "not_started",
            PurchaseError::Ended => "ended",
            PurchaseError::Closed => "closed",
            PurchaseError::UnknownSale(_) => "unknown_sale",
            PurchaseError::Invalid(_) => "invalid",
            PurchaseError::RequestMismatch => "request_mismatch",
            PurchaseError::OrderLost { .. } => "order_lost",
            PurchaseError::Unavailable(_) => "unavailable",
            PurchaseError::NotAdmitted => "not_admitted",
            PurchaseError::InvalidTicket(_) => "invalid_ticket",
        }
    }
}

/// Why an input was refused before it reached Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A quantity below 1.
    #[error("qty must be at least 1, got {0}")]
    QtyNotPositive(i64),
    /// A quantity above the sale's limit or the engine's maximum.
    #[error("qty {qty} is above the maximum of {max}")]
    QtyTooLarge {
        /// What was asked.
        qty: i64,
        /// The largest accepted.
        max: u32,
    },
    /// An identifier is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// An identifier is longer than allowed.
    #[error("{field} is {len} bytes, the maximum is {max}")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The maximum length in bytes.
        max: usize,
    },
    /// An identifier holds a character that is not allowed.
    #[error("{field} holds a character that is not allowed ({reason})")]
    BadChar {
        /// Which field.
        field: &'static str,
        /// What is allowed.
        reason: &'static str,
    },
    /// A value that is not in the shape its field must have.
    #[error("{field} is malformed: {expected}")]
    Malformed {
        /// Which field.
        field: &'static str,
        /// The shape it must have.
        expected: &'static str,
    },
    /// A sale specification that cannot be created.
    #[error("{0}")]
    Spec(String),
}

/// Why an admin operation (create, restock, close, status) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The input was refused; nothing was changed.
    #[error("invalid input: {0}")]
    Invalid(InvalidInput),
    /// A sale with this SKU already exists.
    #[error("sale {0:?} already exists")]
    AlreadyExists(String),
    /// No sale exists for this SKU.
    #[error("unknown sale {0:?}")]
    UnknownSale(String),
    /// The sale is closed and cannot be restocked.
    #[error("sale {0:?} is closed")]
    Closed(String),
    /// The inventory cluster could not answer.
    #[error("inventory unavailable: {0}")]
    Unavailable(Unavailable),
    /// The admin lock could not be taken.
    #[error("admin lock: {0}")]
    Lock(LockError),
    /// This operation id was used before with other parameters; nothing was
    /// changed.
    #[error("operation id {0:?} was used before with other parameters")]
    OperationMismatch(String),
}

impl From<Unavailable> for AdminError {
    fn from(e: Unavailable) -> Self {
        AdminError::Unavailable(e)
    }
}

impl From<RedisError> for AdminError {
    fn from(e: RedisError) -> Self {
        AdminError::Unavailable(e.into())
    }
}

/// Why [`crate::Engine::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration is not usable.
    #[error("config: {0}")]
    Config(ConfigError),
    /// The lock nodes cannot be used.
    #[error("lock nodes: {0}")]
    Lock(LockError),
    /// The cluster could not be reached.
    #[error("redis cluster: {0}")]
    Redis(RedisError),
    /// A `rediss://` node's certificate was refused: signed by no CA this
    /// client trusts, expired, or for another host name.
    #[error("redis cluster: the server's TLS certificate was refused: {0}")]
    Certificate(RedisError),
    /// A `redis://` node closed the connection at once, as a TLS-only port
    /// does when spoken to in plain text.
    #[error(
        "redis cluster: {0} (the node closed a plain-text connection: if it is \
         TLS-only, use rediss://)"
    )]
    PlainTextRefused(RedisError),
    /// Over TLS, the seeds answered and the nodes of the slot map could
    /// not be reached ("No connections found"): nodes down, or, most often
    /// when they are up, certificates that name the seeds' host names but
    /// not the addresses the cluster announces.
    #[error(
        "redis cluster: {0} (over TLS the seed nodes answered and the nodes of the \
         cluster's slot map did not: if they are up, their certificates must name the \
         addresses the cluster announces (CLUSTER SHARDS), as IP subject alternative \
         names or with cluster-announce-hostname; see docs/configuration.md, TLS to Redis)"
    )]
    TlsNodeNames(RedisError),
    /// The cluster answers but some slot has no master.
    #[error("redis cluster: not every slot is served")]
    SlotsUncovered,
}

impl From<ConfigError> for ConnectError {
    fn from(e: ConfigError) -> Self {
        ConnectError::Config(e)
    }
}

impl ConnectError {
    pub(crate) fn redis(e: RedisError) -> Self {
        ConnectError::Redis(e)
    }

    /// The first connection's error, told apart where TLS explains it.
    pub(crate) fn at_connect(e: RedisError, tls: bool) -> Self {
        // rustls names a refused certificate "invalid peer certificate";
        // redis-rs keeps the I/O error's text, not its kind, through the
        // cluster's initial connections.
        let text = e.to_string();
        if tls && text.contains("invalid peer certificate") {
            ConnectError::Certificate(e)
        } else if tls && e.kind() == redis::ErrorKind::ClusterConnectionNotFound {
            ConnectError::TlsNodeNames(e)
        } else if !tls
            && (text.contains("Connection reset") || text.contains("unexpected end of file"))
        {
            ConnectError::PlainTextRefused(e)
        } else {
            ConnectError::Redis(e)
        }
    }
}

pub use crate::config::ConfigError;

/// Why [`crate::Engine::readiness`] says the engine is not ready.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The cluster did not answer.
    #[error("cluster unreachable: {0}")]
    Unreachable(RedisError),
    /// Some slot has no master.
    #[error("cluster: not every slot is served")]
    SlotsUncovered,
    /// A master lacked scripts and loading them failed.
    #[error("{master}: scripts: {error}")]
    Scripts {
        /// `host:port` of the master.
        master: String,
        /// What Redis said.
        error: RedisError,
    },
    /// The slot map names a master whose address cannot be read.
    #[error("cluster: master address {0:?} cannot be read")]
    BadMaster(String),
}

/// What the engine does about a Redis error. Computed once per error by
/// [`classify`] so every call site treats the same error the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The script cache of that node lacks the script: load it, retry once.
    ReloadScript,
    /// The cluster moved or is moving slots, or a node is failing over:
    /// refresh, wait a little, retry within the budget.
    RetryLater,
    /// The connection broke; the client reconnects; retry within the budget.
    Reconnect,
    /// Retrying will not help (a bug, a bad reply, a refused command).
    GiveUp,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Recovery::ReloadScript => "reload_script",
            Recovery::RetryLater => "retry_later",
            Recovery::Reconnect => "reconnect",
            Recovery::GiveUp => "give_up",
        };
        f.write_str(s)
    }
}

/// Classifies a Redis error into what the engine does about it.
///
/// redis-rs marks its enums `#[non_exhaustive]`, so a kind added in a later
/// release falls to the last arm, which gives up: the safe default, because a
/// purchase that is retried blindly could wait forever on a permanent error.
pub fn classify(err: &redis::RedisError) -> Recovery {
    use redis::{ErrorKind, RetryMethod, ServerErrorKind};
    if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
        return Recovery::ReloadScript;
    }
    if err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal() {
        return Recovery::Reconnect;
    }
    match err.retry_method() {
        RetryMethod::MovedRedirect
        | RetryMethod::AskRedirect
        | RetryMethod::WaitAndRetry
        | RetryMethod::RefreshSlotsAndRetry => Recovery::RetryLater,
        RetryMethod::Reconnect
        | RetryMethod::ReconnectFromInitialConnections
        | RetryMethod::RetryImmediately => Recovery::Reconnect,
        RetryMethod::NoRetry => Recovery::GiveUp,
        _ => Recovery::GiveUp,
    }
}
