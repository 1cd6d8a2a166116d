//! `--cost-purchases N`: N purchases on a fresh one-bucket sale of N units,
//! each by a new buyer, `--concurrency` in flight (1 for one purchase per
//! script call), and nothing else; `bench/cost` counts the instructions the
//! engine process and redis-server spend around two such runs of different
//! N, and divides the difference by the difference in purchases. An
//! instruction count does not move with a busy machine's noise, so a change
//! to the hot path is judged by it where a rate on 2 shared cores cannot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Result};
use flashsale::{Config, Engine, PurchaseRequest, SaleSpec};

/// Runs the purchases; prints `confirmed <n>` (and fails unless every one
/// was confirmed: a count over refusals would measure another path).
pub async fn purchases(config: Config, n: u64, concurrency: usize) -> Result<String> {
    let engine = Engine::connect(Config {
        lock_nodes: Vec::new(),
        ..config
    })
    .await?;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let sku = format!("cost-{run}");
    engine
        .create_sale(SaleSpec {
            buckets: 1,
            ..SaleSpec::new(&sku, n)
        })
        .await?;
    let next = Arc::new(AtomicU64::new(0));
    let confirmed = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (engine, next, confirmed, sku) =
                (engine.clone(), next.clone(), confirmed.clone(), sku.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let user = format!("u{i}");
                    let answer = engine
                        .purchase(PurchaseRequest {
                            sku: &sku,
                            user: &user,
                            qty: 1,
                            request_id: &user,
                        })
                        .await;
                    if answer.is_ok() {
                        confirmed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    let confirmed = confirmed.load(Ordering::Relaxed);
    if confirmed != n {
        return Err(anyhow!("{confirmed} of {n} purchases confirmed"));
    }
    Ok(format!("confirmed {confirmed}"))
}
