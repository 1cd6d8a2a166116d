//! The anchor: `redis-benchmark` running EVALSHA of the very same
//! `lua/purchase.lua` (same SHA, same key layout) straight at the masters that
//! hold the buckets. What the engine gets close to is the speed of Redis
//! itself running this script.
//!
//! redis-benchmark never shows us its replies, so a run is judged by what it
//! left behind (the driver reads each bucket's stock and stream afterwards),
//! and its figures are put together here the honest way: one target per
//! bucket with requests and clients split as the engine's placement spreads
//! buyers, throughput over our own wall time, and the latency percentiles of
//! all processes merged from their distributions (not the worst of them).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use tokio::process::Command;

/// One redis-benchmark process: a bucket, the master holding it, and its
/// share of the clients and requests.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` of the master.
    pub master: String,
    /// The bucket's shard tag.
    pub tag: String,
    /// Connections of this process.
    pub clients: usize,
    /// Requests this process sends.
    pub requests: u64,
}

/// `total` split into `n` shares that differ by at most one and add up.
pub fn shares(total: u64, n: usize) -> Vec<u64> {
    let n = n.max(1) as u64;
    (0..n)
        .map(|i| total / n + u64::from(i < total % n))
        .collect()
}

/// `total` split in proportion to `weights` (largest remainder), adding up
/// exactly.
pub fn weighted(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u64 = weights.iter().sum::<u64>().max(1);
    let mut out: Vec<u64> = weights.iter().map(|w| total * w / sum).collect();
    let mut rest: Vec<(u64, usize)> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| (total * w % sum, i))
        .collect();
    rest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let short = total.saturating_sub(out.iter().sum());
    for (_, i) in rest.into_iter().take(short as usize) {
        out[i] += 1;
    }
    out
}

/// What the redis-benchmark processes did, put together.
#[derive(Debug)]
pub struct AnchorStats {
    /// Requests sent.
    pub requests: u64,
    /// The longest run any process reported ("requests completed in X
    /// seconds": its own clock, without our spawn time).
    pub elapsed: Duration,
    /// Latency of every request, µs, merged over processes.
    pub latency_us: Histogram<u64>,
}

/// What an anchor run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// `lua/purchase.lua`, a batch of one purchase, in the engine's shapes.
    Purchase,
    /// [`FLOOR_LUA`]: the least any Lua purchase can cost.
    Floor,
}

/// The `floor` row's script: read the stock, compare, take one unit. No
/// request record, no quota, no order: a lower bound on what a purchase
/// script costs the master, not a purchase.
///
/// KEYS[1] {tag}:stock. Returns the units left, or -1 when none were.
pub const FLOOR_LUA: &str = "local s = tonumber(redis.call('GET', KEYS[1]) or '0')\n\
if s < 1 then return -1 end\n\
return redis.call('DECRBY', KEYS[1], 1)\n";

/// The redis-benchmark command line for one target, `pipeline` requests in
/// flight per connection (1 = one call at a time).
pub fn command_line(t: &Target, script: Script, sha: &str, pipeline: usize) -> Result<Vec<String>> {
    let (host, port) = t
        .master
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("bad master address {}", t.master))?;
    let k = |suffix: &str| format!("{{{}}}:{suffix}", t.tag);
    // Tags are `<sku>#<bucket>.<k>`; the order id names the sale and bucket
    // as the engine's do, so a writer could route it.
    let sale_and_bucket = t
        .tag
        .split_once('#')
        .and_then(|(sku, rest)| Some(format!("{sku}~{}", rest.split_once('.')?.0)))
        .ok_or_else(|| anyhow!("bad shard tag {}", t.tag))?;
    let mut line: Vec<String> = vec![
        "-h".into(),
        host.into(),
        "-p".into(),
        port.into(),
        "-c".into(),
        t.clients.max(1).to_string(),
        "-n".into(),
        t.requests.to_string(),
        "-P".into(),
        pipeline.max(1).to_string(),
        "-r".into(),
        "1000000000".into(),
    ];
    if script == Script::Floor {
        line.extend(["EVALSHA".into(), sha.into(), "1".into(), k("stock")]);
        return Ok(line);
    }
    line.extend([
        // purchase.lua's KEYS and ARGV in the engine's shapes, a batch of
        // one purchase: a user id as long as the engine's bench users (30
        // bytes), a random request id, an order id of the engine's shape
        // (32 hex digits after the sale and bucket), the bench's 600 s
        // request TTL, the default compact order record.
        "EVALSHA".into(),
        sha.into(),
        "7".into(),
        k("sale"),
        k("stock"),
        k("orders"),
        k("pending"),
        k("holds"),
        k(&format!("q:{USER}")),
        k(&format!("r:{}:{USER}:__rand_int__", USER.len())),
        "600".into(),
        "0".into(),
        "compact".into(),
        "1".into(),
        format!("{sale_and_bucket}~00000000000000000000__rand_int__"),
        USER.into(),
    ]);
    Ok(line)
}

/// The anchor's buyer: as long as the engine's bench user ids.
const USER: &str = "bench-anchor-user-000000000000";

/// Runs one redis-benchmark per target at once and merges what they report.
pub async fn run(
    targets: &[Target],
    script: Script,
    sha: &str,
    pipeline: usize,
) -> Result<AnchorStats> {
    let mut children = Vec::with_capacity(targets.len());
    for t in targets.iter().filter(|t| t.requests > 0) {
        let child = Command::new("redis-benchmark")
            .args(command_line(t, script, sha, pipeline)?)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning redis-benchmark (ops/up installs redis-tools)")?;
        children.push(child);
    }
    let spawned = Instant::now();
    let mut elapsed = Duration::ZERO;
    let mut latency_us = histogram();
    for c in children {
        let out = c.wait_with_output().await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let points = percentile_distribution(&text);
        if points.is_empty() {
            return Err(anyhow!(
                "redis-benchmark printed no latency distribution: {} {}",
                text.chars().take(400).collect::<String>(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if let Some(secs) = completed_in(&text) {
            elapsed = elapsed.max(Duration::from_secs_f64(secs));
        }
        let mut seen = 0u64;
        for (ms, cumulative) in points {
            let n = cumulative.saturating_sub(seen);
            seen = seen.max(cumulative);
            if n > 0 {
                let us = ((ms * 1000.0).round() as u64).max(1);
                let _ = latency_us.record_n(us, n);
            }
        }
    }
    Ok(AnchorStats {
        requests: targets.iter().map(|t| t.requests).sum(),
        elapsed: if elapsed.is_zero() {
            spawned.elapsed()
        } else {
            elapsed
        },
        latency_us,
    })
}

/// "50000 requests completed in 1.62 seconds": the seconds.
fn completed_in(text: &str) -> Option<f64> {
    text.split("requests completed in ")
        .last()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant figures; the bounds are constants.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}

/// The "Latency by percentile distribution" of redis-benchmark's report, as
/// (latency ms, cumulative count) points in order.
pub fn percentile_distribution(text: &str) -> Vec<(f64, u64)> {
    let Some(section) = text.split("Latency by percentile distribution:").nth(1) else {
        return Vec::new();
    };
    section
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| l.contains("% <= "))
        .filter_map(|l| {
            // "50.000% <= 0.711 milliseconds (cumulative count 1144)"
            let (_, rest) = l.split_once("<= ")?;
            let (ms, rest) = rest.split_once(" milliseconds")?;
            let count = rest
                .split("cumulative count ")
                .nth(1)?
                .trim_end_matches(')')
                .trim();
            Some((ms.trim().parse().ok()?, count.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_distribution_of_redis_7_parses() {
        let text = "  2000 requests completed in 0.05 seconds\n\nLatency by percentile distribution:\n0.000% <= 0.015 milliseconds (cumulative count 4)\n50.000% <= 0.047 milliseconds (cumulative count 1144)\n100.000% <= 6.951 milliseconds (cumulative count 2000)\n\nCumulative distribution of latencies:\n97.550% <= 0.103 milliseconds (cumulative count 1951)\n";
        assert_eq!(
            percentile_distribution(text),
            vec![(0.015, 4), (0.047, 1144), (6.951, 2000)]
        );
        assert!(percentile_distribution("nothing").is_empty());
        assert_eq!(completed_in(text), Some(0.05));
    }

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        assert_eq!(shares(64, 12).iter().sum::<u64>(), 64);
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(5, 1), vec![5]);
        assert_eq!(weighted(10, &[1, 1, 2]), vec![3, 2, 5]);
        assert_eq!(weighted(64, &[334, 333, 333]).iter().sum::<u64>(), 64);
    }
}
