//! The anchor: `redis-benchmark` running EVALSHA of the very same
//! `lua/purchase.lua` (same SHA, same key layout) straight at the masters that
//! hold the buckets. What the engine gets close to is the speed of Redis
//! itself running this script.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use tokio::process::Command;

/// One redis-benchmark target: a master and one bucket's tag on it.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` of the master.
    pub master: String,
    /// The bucket's shard tag.
    pub tag: String,
}

/// What redis-benchmark reported, summed over targets.
#[derive(Debug, Clone, Default)]
pub struct AnchorStats {
    /// Requests sent.
    pub ops: u64,
    /// Requests per second (sum over the parallel processes).
    pub rps: f64,
    /// Median latency, ms (the worst of the processes).
    pub p50_ms: f64,
    /// 99th percentile latency, ms (the worst of the processes).
    pub p99_ms: f64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The redis-benchmark command line for one target.
pub fn command_line(t: &Target, sha: &str, clients: usize, requests: u64) -> Result<Vec<String>> {
    let (host, port) = t
        .master
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("bad master address {}", t.master))?;
    let k = |suffix: &str| format!("{{{}}}:{suffix}", t.tag);
    Ok(vec![
        "-h".into(),
        host.into(),
        "-p".into(),
        port.into(),
        "-c".into(),
        clients.to_string(),
        "-n".into(),
        requests.to_string(),
        "-r".into(),
        "1000000000".into(),
        "--csv".into(),
        // purchase.lua's KEYS and ARGV, as the engine builds them for the
        // user "bench-user" (10 bytes) and a random request id.
        "EVALSHA".into(),
        sha.into(),
        "6".into(),
        k("sale"),
        k("stock"),
        k("orders"),
        k("q:bench-user"),
        k("r:10:bench-user:__rand_int__"),
        k("pending"),
        "1".into(),
        "__rand_int__".into(),
        "bench-user".into(),
        "86400".into(),
        "0".into(),
    ])
}

/// Runs one redis-benchmark per target at once, `clients` connections and
/// `requests` requests split evenly, and sums their rates.
pub async fn run(
    targets: &[Target],
    sha: &str,
    clients: usize,
    requests: u64,
) -> Result<AnchorStats> {
    let n = targets.len().max(1);
    let started = Instant::now();
    let mut children = Vec::with_capacity(n);
    for t in targets {
        let args = command_line(t, sha, (clients / n).max(1), requests / n as u64)?;
        let child = Command::new("redis-benchmark")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning redis-benchmark (ops/up installs redis-tools)")?;
        children.push(child);
    }
    let mut stats = AnchorStats {
        ops: requests / n as u64 * n as u64,
        ..AnchorStats::default()
    };
    for c in children {
        let out = c.wait_with_output().await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let row = parse_csv(&text).ok_or_else(|| {
            anyhow!(
                "redis-benchmark printed no result: {} {}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        stats.rps += row.0;
        stats.p50_ms = stats.p50_ms.max(row.1);
        stats.p99_ms = stats.p99_ms.max(row.2);
    }
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// (rps, p50 ms, p99 ms) from redis-benchmark's `--csv` output.
pub fn parse_csv(text: &str) -> Option<(f64, f64, f64)> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = split(lines.next()?);
    let row: Vec<String> = split(lines.next()?);
    let col = |name: &str| -> Option<f64> {
        let i = header.iter().position(|h| h == name)?;
        row.get(i)?.parse().ok()
    };
    Some((col("rps")?, col("p50_latency_ms")?, col("p99_latency_ms")?))
}

fn split(line: &str) -> Vec<String> {
    line.split("\",\"")
        .map(|s| s.trim_matches('"').to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_output_of_redis_7_parses() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"EVALSHA x\",\"90909.09\",\"0.063\",\"0.016\",\"0.063\",\"0.111\",\"0.143\",\"0.511\"\n";
        assert_eq!(parse_csv(text), Some((90909.09, 0.063, 0.143)));
        assert_eq!(parse_csv("nothing"), None);
    }
}
