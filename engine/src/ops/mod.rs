//! What an [`Engine`](crate::Engine) does, one file per kind of operation,
//! each an `impl Engine` block over the parts `engine.rs` holds:
//!
//! - `purchase.rs`: `purchase`, the hot path in the buyer's home bucket;
//!   `replay.rs`, the answer to a retry of a decided request;
//!   `fall_through.rs`, the walk across the other buckets when the home
//!   bucket is short;
//! - `admin.rs`: `create_sale`, `restock`, `close_sale` (and their
//!   idempotent `_op` forms), `list_sales`;
//! - `status.rs`: `sale_status`;
//! - `holds.rs`: `pay`, `cancel`, `order`, and the transition every
//!   change of a held order goes through.
//!
//! The sweepers, which finish what no caller is left to finish, are in
//! `sweepers/`.

pub mod admin;
mod fall_through;
pub mod holds;
pub mod purchase;
mod replay;
pub mod status;
