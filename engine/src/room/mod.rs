//! The waiting room (issue #39): an optional line in front of a sale that
//! knows the stock. People join and get a signed ticket with a place; an
//! admitter moves a cursor over the line as fast as the rate allows and
//! never past `overbook x (remaining + held)` admitted-and-not-done; an
//! admitted user's status read hands them an admission token, which the
//! purchase checks without a Redis trip; when the stock reaches 0 one state
//! change makes every ticket read `sold_out`.
//!
//! Where it lives: the line is split into one shard per stock bucket, in
//! that bucket's slot (so the shards sit on the sale's distinct masters and
//! a million joins do not land on one key); the gate (cursor, counts,
//! admission rounds) is one hash in the sale's own slot, written only by
//! admission rounds and used admissions. The files: `spec.rs` (a room's
//! settings), `place.rs` (places: shuffled or arrival order), `view.rs`
//! (one process's snapshot of the gate and what a ticket reads from it),
//! `ops.rs` (join, status, purchase check, admission rounds).

mod ops;
mod place;
mod spec;
mod view;

pub use ops::{QueueError, QueueStatus, RoomStatus};
pub use place::arrival_place;
pub use spec::{QueueOrder, QueueRate, QueueSpec, QueueSpecError};
pub use view::QueueState;

pub(crate) use view::Room;
