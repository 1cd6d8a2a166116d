//! Waiting for an event, not a clock: poll a condition until it holds or a
//! generous deadline passes, then fail loudly with what was awaited. Tests
//! that pass alone must pass on a loaded machine too.

use std::time::{Duration, Instant};

/// Polls `ok` every 50 ms until it holds, or panics with `why()` after `timeout`.
pub fn wait_for(timeout: Duration, mut ok: impl FnMut() -> bool, why: impl FnOnce() -> String) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?}: {}", why());
}

/// Polls `ok` every 50 ms until it holds or `timeout` passes; async twin of
/// [`wait_for`] for conditions that need the runtime.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if ok().await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
