//! The commands of the `flashsale` binary, one file each: each parses its
//! own arguments (clap), calls the library and prints its own output. The
//! library never depends on anything here.

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
