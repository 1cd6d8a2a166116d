//! A request's record in its home bucket, as purchase.lua, take.lua and
//! settle.lua write it and a replay reads it back: parsed once here.

use super::refusal::Refusal;

/// A request record in its home bucket, as stored (see `purchase.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestRecord {
    /// Confirmed with this order.
    Confirmed {
        /// Units.
        qty: u64,
        /// The bucket that took.
        bucket: u32,
        /// The order.
        order_id: String,
    },
    /// Still pending.
    Pending {
        /// Units.
        qty: u64,
    },
    /// Every bucket refused.
    Refused {
        /// Units.
        qty: u64,
        /// Why.
        why: Refusal,
    },
    /// No record (never made, or expired).
    Missing,
}

impl RequestRecord {
    /// Parses a record's text; `None` for text no script writes.
    pub fn parse(s: &str) -> Option<RequestRecord> {
        if s.is_empty() {
            return Some(RequestRecord::Missing);
        }
        let mut parts = s.splitn(3, ':');
        let kind = parts.next()?;
        let qty: u64 = parts.next()?.parse().ok()?;
        let rest = parts.next();
        match (kind, rest) {
            ("P", None) => Some(RequestRecord::Pending { qty }),
            ("C", Some(rest)) => {
                let (bucket, order_id) = rest.split_once(':')?;
                Some(RequestRecord::Confirmed {
                    qty,
                    bucket: bucket.parse().ok()?,
                    order_id: order_id.to_owned(),
                })
            }
            ("S", Some(code)) => Some(RequestRecord::Refused {
                qty,
                why: Refusal::from_code(code.parse().ok()?)?,
            }),
            _ => None,
        }
    }
}
