//! What the chaos controller asks of an engine process and what it answers,
//! one JSON object per line over the child's stdin/stdout. The same types
//! are the operations and results of the recorded history.

use serde::{Deserialize, Serialize};

/// One operation a client of flashsale performs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Op {
    /// `Engine::purchase`.
    Purchase {
        /// SKU.
        sku: String,
        /// Buyer.
        user: String,
        /// Request id (the idempotency key, with sku and user).
        rid: String,
        /// Units.
        qty: u32,
    },
    /// `Engine::restock_op` under an operation id.
    Restock {
        /// SKU.
        sku: String,
        /// Units added.
        qty: u64,
        /// Operation id: applied once however often it is sent.
        op_id: String,
    },
    /// `Engine::close_sale`.
    Close {
        /// SKU.
        sku: String,
    },
    /// `Engine::sale_status`.
    Status {
        /// SKU.
        sku: String,
    },
    /// `Engine::pay` of a held order.
    Pay {
        /// The order (an id a confirmed purchase answered).
        order_id: String,
        /// The shop's payment reference.
        payment_ref: String,
    },
    /// `Engine::cancel` of a held order.
    Cancel {
        /// The order.
        order_id: String,
    },
    /// Take a lock, write to a fenced resource twice with the grant's
    /// token (holding it `hold_ms` in between), release.
    Lock {
        /// Lock name.
        name: String,
        /// Owner id of this attempt.
        owner: String,
        /// How long the lock is held between the two writes.
        hold_ms: u64,
    },
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    /// It happened.
    Ok {
        /// What it returned.
        value: OkValue,
    },
    /// A definite refusal: it did not happen.
    Fail {
        /// The error code (`PurchaseError::code()` and the like).
        code: String,
        /// A purchase refused by Redis' scripts, not by the engine's
        /// sold-out flag (its process answered no request from the flag
        /// while this one was in flight). In a sale of more than one
        /// bucket such a refusal is settled into the request's record, so
        /// it is final. Absent (false) in older histories.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_scripts: bool,
    },
    /// No answer that says either way (timeout, unavailable, process died).
    Unknown {
        /// Why.
        why: String,
    },
}

/// The value of an `ok` outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OkValue {
    /// A purchase was confirmed.
    Order {
        /// Order id.
        order_id: String,
        /// Bucket that served it.
        bucket: u32,
    },
    /// An admin operation was applied.
    Done,
    /// A status read.
    Status {
        /// Units left over all buckets.
        remaining: i64,
    },
    /// A payment or a cancel was applied (or had been: a replay).
    Transition {
        /// The order's state after the call.
        state: String,
        /// A late payment took a unit again (`late_payment = "retake"`).
        retaken: bool,
    },
    /// A lock was granted, used and released.
    Lock {
        /// The grant's fencing token.
        token: u64,
        /// Fenced writes the resource refused (a newer token got there first).
        refused_writes: u32,
        /// Whether the second (last) write was refused: the holder learnt
        /// it had lost the lock before it left its critical section.
        #[serde(default)]
        last_write_refused: bool,
        /// When the lock was asked for, by the engine process's wall clock
        /// (ms since the Unix epoch; one machine, one clock): the lease
        /// began after it.
        #[serde(default)]
        asked_unix_ms: i64,
        /// When the grant came back.
        #[serde(default)]
        granted_unix_ms: i64,
        /// When the holder left its critical section (before the release).
        #[serde(default)]
        released_unix_ms: i64,
        /// The earliest the grant's lease can have ended, by the client's
        /// own reckoning at the grant (0 in histories from before it was
        /// recorded: then the lease is taken to start when it was asked).
        #[serde(default)]
        valid_until_unix_ms: i64,
    },
}

/// A call from the controller.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Call {
    /// Operation id in the history.
    pub id: u64,
    /// The operation.
    pub op: Op,
}

/// An engine process's answer to a [`Call`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The call's id.
    pub id: u64,
    /// What happened.
    pub outcome: Outcome,
}

impl Op {
    /// The operation's kind, as the history's `f` field names it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Purchase { .. } => "purchase",
            Op::Restock { .. } => "restock",
            Op::Close { .. } => "close",
            Op::Status { .. } => "status",
            Op::Pay { .. } => "pay",
            Op::Cancel { .. } => "cancel",
            Op::Lock { .. } => "lock",
        }
    }
}

impl Outcome {
    /// `unknown` with a reason.
    pub fn unknown(why: impl Into<String>) -> Outcome {
        Outcome::Unknown { why: why.into() }
    }

    /// `fail` with a code.
    pub fn fail(code: impl Into<String>) -> Outcome {
        Outcome::Fail {
            code: code.into(),
            from_scripts: false,
        }
    }
}
