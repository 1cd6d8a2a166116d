//! The naive row: GET then DECRBY from the client, no script, to show the
//! oversell the engine's scripts prevent.

use std::sync::Arc;

use anyhow::Result;

use crate::report::RunResult;
use crate::strategies;

use super::*;

impl Bench {
    pub(super) async fn naive_run(&mut self) -> Result<RunResult> {
        let ops = self.args.ops;
        let stock = ops / 2;
        let key = self.plain_stock("naive", stock).await?;
        let conn = self.conn.clone();
        let k = key.clone();
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let stats = self
            .load("hot1 naive (GET, DECR)".into(), ops, None, move |_| {
                strategies::naive_op(conn.clone(), k.clone())
            })
            .await;
        let after = master_time(&self.engine, &mut self.conn).await?;
        let left: i64 = redis::cmd("GET")
            .arg(&*key)
            .query_async(&mut self.conn)
            .await?;
        Ok(with_master_time(
            row(
                "hot1",
                "naive",
                self.args.concurrency,
                &stats,
                stock,
                stats.confirmed.saturating_sub(stock),
                format!("stock {stock}, left {left} (below zero = oversold)"),
            ),
            &before,
            &after,
        ))
    }

    /// Loads `code` on every master; returns its SHA.
    pub(super) async fn load_on_masters(&mut self, code: &str) -> Result<String> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        self.conn
            .route_command(
                redis::cmd("SCRIPT").arg("LOAD").arg(code).clone(),
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                )),
            )
            .await?;
        Ok(redis::Script::new(code).get_hash().to_owned())
    }

    pub(super) async fn plain_stock(&mut self, name: &str, stock: u64) -> Result<Arc<str>> {
        let key = format!("{{bench-{}-{name}}}:stock", self.run);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(stock)
            .query_async(&mut self.conn)
            .await?;
        self.plain_keys.push(key.clone());
        Ok(key.into())
    }
}
