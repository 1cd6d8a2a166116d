//! The commands of the `flashsale` binary, one file each: each parses its
//! own arguments (clap), calls the library and prints its own output. The
//! library never depends on anything here.

/// Writes a line to stderr without ever failing or blocking the caller
/// (see [`messages`]). `eprintln!` panics when stderr is a closed pipe
/// (`flashsale lock exec ... 2>&1 | head`), which turned every exit code
/// that comes with a message into 101, and blocks when nobody reads the
/// pipe, which held a lock exec (and its renewed lock) in a write before
/// its kill and release.
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::cli::messages::say(format!($($arg)*));
    }};
}
pub(crate) use say;

/// The stderr writer thread behind [`say!`].
pub mod messages {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// Lines queued, and lines written (or given up on).
    static SENT: AtomicU64 = AtomicU64::new(0);
    static DONE: AtomicU64 = AtomicU64::new(0);
    static QUEUE: OnceLock<SyncSender<String>> = OnceLock::new();

    /// Queues `line` for stderr; dropped, never waited for, when the
    /// writer is stuck behind a full pipe and 256 lines wait already.
    pub fn say(line: String) {
        let queue = QUEUE.get_or_init(|| {
            let (tx, rx) = sync_channel::<String>(256);
            let _ = std::thread::Builder::new()
                .name("stderr".into())
                .spawn(move || {
                    for line in rx {
                        let _ = writeln!(std::io::stderr(), "{line}");
                        DONE.fetch_add(1, Ordering::SeqCst);
                    }
                });
            tx
        });
        if queue.try_send(line).is_ok() {
            SENT.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Waits up to `within` for the queued lines to be written: called
    /// once before the process exits, so its last words are not lost, and
    /// never for longer than that.
    pub fn flush(within: Duration) {
        let until = Instant::now() + within;
        while DONE.load(Ordering::SeqCst) < SENT.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

pub mod config_check;
pub mod demo;
pub mod lock_exec;
pub mod orders;
pub mod own_proc;
pub mod queue;
pub mod reconcile;
pub mod sale;
pub mod semaphore_exec;
pub mod serve;
pub mod signal_mask;
pub mod stop_signals;
pub mod supervised;
pub mod supervisor;

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
