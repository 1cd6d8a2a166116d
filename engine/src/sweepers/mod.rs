//! The sweepers: background passes that finish what no caller is left to
//! finish, each safe beside live buyers and other sweepers.
//!
//! - `fall_through.rs`: settles purchases whose process died between
//!   buckets ([`Engine::settle_abandoned`](crate::Engine::settle_abandoned));
//! - `expiry.rs`: expires held orders past their deadline
//!   ([`Engine::expire_due`](crate::Engine::expire_due)).

pub mod expiry;
pub mod fall_through;
