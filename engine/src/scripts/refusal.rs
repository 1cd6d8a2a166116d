//! Why a purchase was refused, as purchase.lua, take.lua and settle.lua
//! answer it and as request records store it: the codes, named once, and
//! the enum the engine reads them into. A file of its own because three
//! scripts and the request record share it.

/// Not enough stock.
pub const SOLD_OUT: i64 = -1;
/// The sale's window is over.
pub const ENDED: i64 = -4;
/// The sale was closed.
pub const CLOSED: i64 = -5;

/// Why a bucket, or a whole request, was refused. The numbers are the
/// scripts' codes, stored in request records as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not enough stock (code -1).
    SoldOut,
    /// The sale's window is over (code -4).
    Ended,
    /// The sale was closed (code -5).
    Closed,
}

impl Refusal {
    /// The script code of this refusal.
    pub fn code(self) -> i64 {
        match self {
            Refusal::SoldOut => SOLD_OUT,
            Refusal::Ended => ENDED,
            Refusal::Closed => CLOSED,
        }
    }

    pub(crate) fn from_code(code: i64) -> Option<Refusal> {
        match code {
            SOLD_OUT => Some(Refusal::SoldOut),
            ENDED => Some(Refusal::Ended),
            CLOSED => Some(Refusal::Closed),
            _ => None,
        }
    }

    /// The stronger of two refusals, for a walk over buckets: a closed sale
    /// says more than an ended window, which says more than an empty bucket.
    pub fn max(self, other: Refusal) -> Refusal {
        let rank = |r: Refusal| match r {
            Refusal::SoldOut => 0,
            Refusal::Ended => 1,
            Refusal::Closed => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}
