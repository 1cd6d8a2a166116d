//! The `refused` row: what refused multi-bucket requests leave in Redis.
//!
//! Why a row of its own: an attack on `serve` found that each refused
//! multi-bucket request left about 665 B of records for `request_ttl` (a
//! day), and needs no authentication, so a flood of them filled Redis.
//! Each bucket of this row's sale holds one unit and every request asks
//! two, so every request walks every bucket and all refuse it. The row
//! gives the masters' `used_memory` per request right after the flood and
//! once twice the walk limit (`pending_timeout`) has passed since it ended,
//! when a bucket's refusal is no longer needed and only the home records
//! (which answer retries for `request_ttl`) should be left.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::report::RunResult;
use crate::strategies;

use super::*;

impl Bench {
    pub(super) async fn refused_run(&mut self) -> Result<RunResult> {
        let buckets = self.args.buckets.max(2);
        let ops = self.args.ops;
        let st = self.sale("refused", u64::from(buckets), buckets).await?;
        self.settle().await?;
        let before = used_memory(&self.engine, &mut self.conn).await?;
        let (engine, sku, run) = (
            self.engine.clone(),
            std::sync::Arc::<str>::from(st.sku.as_str()),
            std::sync::Arc::<str>::from(format!("{}-refused", self.run)),
        );
        let stats = self
            .load(format!("refused x{buckets}"), ops, None, move |i| {
                strategies::refused_op(engine.clone(), sku.clone(), run.clone(), i)
            })
            .await;
        let ended = Instant::now();
        let flooded = used_memory(&self.engine, &mut self.conn).await?;
        let walk_limit = self.engine.config().pending_timeout;
        let wait = (2 * walk_limit + Duration::from_secs(1)).saturating_sub(ended.elapsed());
        tokio::time::sleep(wait).await;
        let later = used_memory(&self.engine, &mut self.conn).await?;
        let per = |after: u64| after.saturating_sub(before) as f64 / stats.done.max(1) as f64;
        let note = format!(
            "{} requests of 2 units over {buckets} buckets of 1 unit, all refused ({} sold out, \
             {} other answers); masters' used_memory +{:.0} B/request right after, +{:.0} \
             B/request once 2 x pending_timeout ({} ms) had passed",
            stats.done,
            stats.sold_out,
            stats.done.saturating_sub(stats.sold_out),
            per(flooded),
            per(later),
            walk_limit.as_millis()
        );
        Ok(row(
            "refused",
            "engine",
            self.args.concurrency,
            &stats,
            u64::from(buckets),
            stats.confirmed,
            note,
        ))
    }
}

/// The masters' `used_memory`, summed.
async fn used_memory(
    engine: &flashsale::Engine,
    conn: &mut redis::cluster_async::ClusterConnection,
) -> Result<u64> {
    let mut total = 0u64;
    for master in engine.slot_map().await?.masters() {
        let Some((host, port)) = master.rsplit_once(':') else {
            continue;
        };
        let text = info(conn, host, port.parse()?, "memory").await?;
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}
