//! The example of the lock module in docs/locks.md, compiled so it stays true.

use flashsale::lock::{LockClient, LockConfig, LockOptions};

async fn settle_day(nodes: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::new(nodes, LockConfig::default())?; // 1 node, or >= 3 for Redlock
    let guard = locks
        .lock("nightly-settlement", &LockOptions::new("worker-7"))
        .await?;
    let token = guard.fencing_token(); // send it with every write the lock guards
    tokio::select! {
        _ = do_the_work(token) => {}
        _ = guard.lost() => eprintln!("lock lost: stop writing"),
    }
    guard.unlock().await;
    Ok(())
}
async fn do_the_work(_token: u64) {}

fn main() {
    let _ = settle_day;
}
