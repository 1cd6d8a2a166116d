//! The door rows: what one check costs at the door, the service's
//! in-process rate limiter against the seeds' Redis rate-limit script, one
//! check per request.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use redis::Value;

use crate::load;
use crate::report::RunResult;

use super::*;

impl Bench {
    /// "Which costs less at the door": the service's in-process rate limiter
    /// against the seeds' Redis rate-limit script, one check per request.
    pub(super) async fn door_runs(&mut self) -> Result<Vec<RunResult>> {
        let ops = self.args.ops;
        let limiter = Arc::new(flashsale::ratelimit::RateLimiter::new(5.0, 5, 0.0, 0));
        let stats = self
            .load("door in-process limiter".into(), ops, None, move |i| {
                let limiter = limiter.clone();
                async move {
                    if limiter.allow(&format!("door-u{}", i % 10_000)) {
                        load::Outcome::Confirmed
                    } else {
                        load::Outcome::SoldOut
                    }
                }
            })
            .await;
        let mut out = vec![checks_row(row(
            "door",
            "in-process limiter",
            self.args.concurrency,
            &stats,
            0,
            0,
            "token bucket per user, no I/O".into(),
        ))];

        let script = redis::Script::new(include_str!("../../../lua/rate_limit.lua"));
        let sha = script.get_hash().to_owned();
        let _: Value = self
            .conn
            .route_command(
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(include_str!("../../../lua/rate_limit.lua"))
                    .clone(),
                redis::cluster_routing::RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
                )),
            )
            .await?;
        let (conn, run) = (self.conn.clone(), self.run.clone());
        let stats = self
            .load("door redis rate_limit.lua".into(), ops, None, move |i| {
                let (mut conn, sha, run) = (conn.clone(), sha.clone(), run.clone());
                async move {
                    let window = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let key = format!("{{rl:{run}-door-u{}}}:{window}", i % 10_000);
                    match redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(&key)
                        .arg(5)
                        .arg(1000)
                        .query_async::<i64>(&mut conn)
                        .await
                    {
                        Ok(1) => load::Outcome::Confirmed,
                        Ok(_) => load::Outcome::SoldOut,
                        Err(_) => load::Outcome::Error,
                    }
                }
            })
            .await;
        out.push(checks_row(row(
            "door",
            "redis rate_limit.lua",
            self.args.concurrency,
            &stats,
            0,
            0,
            "fixed window, one EVALSHA per check".into(),
        )));
        Ok(out)
    }
}
