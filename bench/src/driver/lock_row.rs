//! The seeds' lock pattern as a row: a plain SET NX PX lock on one Redis
//! around each GET and DECR, not flashsale's own lock (which would measure
//! its fencing and FIFO gate instead of the pattern).

use anyhow::Result;

use crate::report::RunResult;
use crate::strategies;

use super::*;

impl Bench {
    pub(super) async fn lock_run(&mut self) -> Result<Option<RunResult>> {
        if self.lock_nodes.is_empty() {
            return Ok(None);
        }
        let ops = self.args.lock_ops;
        let stock = ops / 2;
        let key = self.plain_stock("lock", stock).await?;
        // The seeds' pattern: a plain SET NX PX lock on one Redis, not
        // flashsale's own lock (which would measure its fencing and FIFO
        // gate instead of the pattern).
        let node = redis::Client::open(self.lock_nodes[0].as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let conn = self.conn.clone();
        let k = key.clone();
        let stats = self
            .load(
                "hot1 lock (SET NX PX,GET,DECR)".into(),
                ops,
                None,
                move |i| strategies::lock_op(node.clone(), conn.clone(), k.clone(), i),
            )
            .await;
        let left: i64 = redis::cmd("GET")
            .arg(&*key)
            .query_async(&mut self.conn)
            .await?;
        let sold = (stock as i64 - left).max(0) as u64;
        let oversold = left.min(0).unsigned_abs() + stats.confirmed.abs_diff(sold);
        Ok(Some(row(
            "hot1",
            "lock",
            self.args.concurrency,
            &stats,
            stock,
            oversold,
            format!(
                "SET NX PX lock on {}, GET, DECR, compare-and-delete",
                flashsale::redact::host_port(&self.lock_nodes[0])
            ),
        )))
    }
}
