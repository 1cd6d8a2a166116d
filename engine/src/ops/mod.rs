//! What an [`Engine`](crate::Engine) does, one file per kind of operation,
//! each an `impl Engine` block over the parts `engine.rs` holds:
//!
//! - `purchase.rs`: `purchase`, and the fall-through walk across buckets;
//! - `admin.rs`: `create_sale`, `restock`, `close_sale` (and their
//!   idempotent `_op` forms), `list_sales`;
//! - `status.rs`: `sale_status`;
//! - `holds.rs`: `pay`, `cancel`, `order`, and the transition every
//!   change of a held order goes through.
//!
//! The sweepers, which finish what no caller is left to finish, are in
//! `sweepers/`.

pub mod admin;
pub mod holds;
pub mod purchase;
pub mod status;
