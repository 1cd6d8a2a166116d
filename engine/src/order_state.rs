//! The order-state model: where a held order is in its life (the four
//! states the scripts, the engine's answers and PostgreSQL all name the
//! same way), and the answers that show it (a transition's, a lookup's).
//! Its own module so that the reply decoders and the errors can name a
//! state without importing the transitions that change it (`ops/holds.rs`)
//! or the sweeper that expires it (`sweepers/expiry.rs`).

use serde::Serialize;

/// Where a held order is in its life.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderState {
    /// Confirmed, its units taken, waiting for payment until its deadline.
    Held,
    /// Paid: final.
    Paid,
    /// Cancelled by the shop; its units went back on sale.
    Cancelled,
    /// Its deadline passed unpaid; its units went back on sale.
    Expired,
}

impl OrderState {
    /// The state as the scripts and PostgreSQL name it.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderState::Held => "held",
            OrderState::Paid => "paid",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
        }
    }

    /// The state named `s`, if it is one.
    pub fn parse(s: &str) -> Option<OrderState> {
        Some(match s {
            "held" => OrderState::Held,
            "paid" => OrderState::Paid,
            "cancelled" => OrderState::Cancelled,
            "expired" => OrderState::Expired,
            _ => return None,
        })
    }
}

impl std::fmt::Display for OrderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to a payment or a cancel.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// The order.
    pub order_id: String,
    /// Its state now.
    pub state: OrderState,
    /// When its hold ended or ends (ms since the Unix epoch, Redis time).
    pub expires_at_ms: u64,
    /// True when this exact transition happened before (a retry).
    pub replayed: bool,
    /// True when a late payment took a unit again (`late_payment = "retake"`).
    pub retaken: bool,
}

/// A held order as [`Engine::order`](crate::Engine::order) reads it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderView {
    /// The order.
    pub order_id: String,
    /// Its sale.
    pub sku: String,
    /// The buyer.
    pub user: String,
    /// Units.
    pub qty: u64,
    /// Its state.
    pub state: OrderState,
    /// When its hold ends or ended (ms since the Unix epoch).
    pub expires_at_ms: u64,
}
