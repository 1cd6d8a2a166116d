//! Modules of the `flashsale` binary only: config loading and the commands.
//! The library never depends on anything here.

pub mod demo;
pub mod lock_exec;
pub mod serve;
pub mod settings;
