//! A waiting room's settings, as a sale is created with them and as the
//! sale's plan keeps them (one field, `room`, of the metadata hash).

use serde::{Deserialize, Serialize};

/// Shortest admission window: a second.
pub const MIN_WINDOW_MS: u64 = 1_000;
/// Longest admission window: a day.
pub const MAX_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// Largest overbooking factor.
pub const MAX_OVERBOOK: f64 = 100.0;
/// Fastest fixed admission rate.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;
/// Slowest fixed admission rate: one an hour (slower would wait past any
/// window anyone keeps a tab open for, and the gate's clock arithmetic
/// needs the credit of one admission to fit in its time).
pub const MIN_RATE_PER_S: f64 = 1.0 / 3600.0;

/// How fast people are let in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueueRate {
    /// At most this many admissions per second (and never past the
    /// stock's bound).
    PerSecond(f64),
    /// As fast as places free up: the stock's bound alone, so the rate
    /// follows the measured purchase rate (each purchase, refusal or
    /// window that passes frees a place).
    Auto,
}

/// Who goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// Arrival order.
    #[default]
    Fifo,
    /// Everyone who joined before the sale's start gets a random place at
    /// the start (arriving early or refreshing buys nothing); arrival order
    /// after it.
    ShuffleAtStart,
}

/// A sale's waiting room ([`crate::SaleSpec::queue`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueSpec {
    /// Admission rate.
    pub rate: QueueRate,
    /// How long an admitted user may buy, ms.
    pub window_ms: u64,
    /// Fifo, or shuffled at the start.
    pub order: QueueOrder,
    /// Admitted and not yet done never exceed `overbook x (remaining +
    /// held)`; at least 1.
    pub overbook: f64,
}

/// Why a room's settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueSpecError {
    /// The rate is not a number in (0, 1,000,000].
    #[error("queue.rate_per_s must be \"auto\" or a number in [1/3600, {MAX_RATE_PER_S}]")]
    Rate,
    /// The window is out of range.
    #[error("queue.window_ms must be {MIN_WINDOW_MS}..={MAX_WINDOW_MS}")]
    Window,
    /// The overbooking factor is out of range.
    #[error("queue.overbook must be a number in [1, {MAX_OVERBOOK}]")]
    Overbook,
    /// A room's admission buys at most the per-user limit: it needs one.
    #[error(
        "a sale with a queue needs per_user_limit >= 1 (one admission buys at most the limit)"
    )]
    NeedsLimit,
}

impl QueueSpec {
    /// Checks the ranges (not the sale's limit: [`QueueSpec::check_with`]).
    pub fn check(&self) -> Result<(), QueueSpecError> {
        if let QueueRate::PerSecond(r) = self.rate {
            if !(r.is_finite() && (MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&r)) {
                return Err(QueueSpecError::Rate);
            }
        }
        if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&self.window_ms) {
            return Err(QueueSpecError::Window);
        }
        if !(self.overbook.is_finite() && (1.0..=MAX_OVERBOOK).contains(&self.overbook)) {
            return Err(QueueSpecError::Overbook);
        }
        Ok(())
    }

    /// [`QueueSpec::check`], and the sale's per-user limit is set.
    pub fn check_with(&self, per_user_limit: u32) -> Result<(), QueueSpecError> {
        self.check()?;
        if per_user_limit == 0 {
            return Err(QueueSpecError::NeedsLimit);
        }
        Ok(())
    }

    /// The rate sent to `admit.lua`: 0 for auto.
    pub(crate) fn rate_arg(&self) -> f64 {
        match self.rate {
            QueueRate::PerSecond(r) => r,
            QueueRate::Auto => 0.0,
        }
    }

    /// The plan's field: `rate=<n|auto>;window=<ms>;order=<o>;overbook=<f>`.
    pub(crate) fn encode(&self) -> String {
        let rate = match self.rate {
            QueueRate::PerSecond(r) => r.to_string(),
            QueueRate::Auto => "auto".into(),
        };
        let order = match self.order {
            QueueOrder::Fifo => "fifo",
            QueueOrder::ShuffleAtStart => "shuffle_at_start",
        };
        format!(
            "rate={rate};window={};order={order};overbook={}",
            self.window_ms, self.overbook
        )
    }

    /// The plan's field read back; `None` when it does not parse.
    pub(crate) fn decode(text: &str) -> Option<QueueSpec> {
        let (mut rate, mut window, mut order, mut overbook) = (None, None, None, None);
        for part in text.split(';') {
            let (k, v) = part.split_once('=')?;
            match k {
                "rate" if v == "auto" => rate = Some(QueueRate::Auto),
                "rate" => rate = Some(QueueRate::PerSecond(v.parse().ok()?)),
                "window" => window = Some(v.parse().ok()?),
                "order" if v == "fifo" => order = Some(QueueOrder::Fifo),
                "order" if v == "shuffle_at_start" => order = Some(QueueOrder::ShuffleAtStart),
                "overbook" => overbook = Some(v.parse().ok()?),
                _ => return None,
            }
        }
        let spec = QueueSpec {
            rate: rate?,
            window_ms: window?,
            order: order?,
            overbook: overbook?,
        };
        spec.check().ok().map(|()| spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_room_spec_reads_back_as_written_and_bad_ones_are_refused() {
        let spec = QueueSpec {
            rate: QueueRate::PerSecond(250.5),
            window_ms: 60_000,
            order: QueueOrder::ShuffleAtStart,
            overbook: 1.5,
        };
        assert_eq!(QueueSpec::decode(&spec.encode()), Some(spec));
        let auto = QueueSpec {
            rate: QueueRate::Auto,
            order: QueueOrder::Fifo,
            ..spec
        };
        assert_eq!(QueueSpec::decode(&auto.encode()), Some(auto));
        for bad in [
            QueueSpec {
                overbook: 0.99,
                ..spec
            },
            QueueSpec {
                overbook: f64::NAN,
                ..spec
            },
            QueueSpec {
                window_ms: 999,
                ..spec
            },
            QueueSpec {
                rate: QueueRate::PerSecond(0.0),
                ..spec
            },
            QueueSpec {
                rate: QueueRate::PerSecond(f64::INFINITY),
                ..spec
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert_eq!(spec.check_with(0), Err(QueueSpecError::NeedsLimit));
        assert_eq!(QueueSpec::decode("rate=auto;window=60000"), None);
        assert_eq!(
            QueueSpec::decode("rate=x;window=1000;order=fifo;overbook=1"),
            None
        );
    }
}
