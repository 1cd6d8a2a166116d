//! Distributed locks on independent Redis instances (never the inventory
//! cluster). One node: a single-node lock. Three or more: Redlock — ask every
//! node in parallel with a small per-node timeout, hold the lock when a
//! majority granted it within its validity (ttl - elapsed - drift), release
//! everywhere otherwise and try again after a wake-up or a random delay.
//!
//! What it adds to `SET NX PX`:
//! - compare-and-act release and renewal (Lua): nobody releases or extends a
//!   lock they do not hold;
//! - a watchdog renewing the lease every ttl/3 while the guard lives, which
//!   reports the loss (`lost()`) when a majority stops confirming;
//! - reentrancy per explicit owner (tasks move between threads: no thread ids);
//! - waiters woken by pub/sub on release, with the remaining TTL as fallback;
//! - fencing tokens: see [`fence`] for why they only grow.
//!
//! What no lock can give: safety when a holder pauses (GC, SIGSTOP) past its
//! lease, or when clocks drift beyond the drift allowance. Fencing tokens are
//! the answer to the first: a resource that remembers the highest token it
//! accepted refuses the late holder's write (see `db::fenced`).
//!
//! The files: `client.rs` the client, its nodes and the quorum call;
//! `acquire.rs` reentry, attempts, the grant and hand-offs inside a
//! process; `gate.rs` the FIFO line of a process's tasks for one name;
//! `keeper.rs` the schedule of every grant's renewal or lease end, one
//! per client; `renewal.rs` its timer task and the renewal round; `watchdog.rs` extend, the lease round and release; `guard.rs` what a
//! holder keeps; `mode.rs` the keys and scripts of the lock and of a
//! read-write lock's two sides (fair locks and writers queue on the nodes);
//! `semaphore.rs` leased permits as slots of locks; `latch.rs` a count-down latch; `multi.rs` several names all or none; `fence.rs` the tokens; `waiters.rs` the pub/sub wake-ups.

mod acquire;
mod attempt;
mod client;
pub mod fence;
mod gate;
mod guard;
mod keeper;
pub mod latch;
mod mode;
pub mod multi;
mod node;
mod options;
mod renewal;
mod scripts;
pub mod semaphore;
mod waiter_count;
mod waiters;
mod watchdog;

pub use client::{LockClient, MAX_LEASE};
pub use guard::LockGuard;
pub use latch::Latch;
pub use multi::MultiGuard;
pub use node::same_node;
pub use options::{LockConfig, LockError, LockOptions, TokenClock};
pub use semaphore::{Permit, PermitOptions, Semaphore};
