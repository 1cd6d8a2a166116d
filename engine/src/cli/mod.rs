//! The commands of the `flashsale` binary, one file each: each parses its
//! own arguments (clap), calls the library and prints its own output. The
//! library never depends on anything here.

/// Writes a line to stderr, ignoring a write that fails. `eprintln!`
/// panics when stderr is a closed pipe (`flashsale lock exec ... 2>&1 |
/// head`), which turned every exit code that comes with a message into 101
/// and skipped the cleanup after it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use say;

pub mod command_group;
pub mod config_check;
pub mod demo;
pub mod lock_exec;
pub mod orders;
pub mod reconcile;
pub mod sale;
pub mod semaphore_exec;
pub mod serve;

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
