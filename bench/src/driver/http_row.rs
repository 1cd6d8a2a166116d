//! The `http` row: `flashsale serve` driven as an operator would drive it,
//! by a real HTTP load generator (`wrk`, Debian's package) posting
//! purchases of new users for a fixed window, every answer counted by
//! status, every 200 checked against the units sold, the orders queued
//! and, once drained, the rows in PostgreSQL; with serve's own CPU per
//! request (from /proc) beside the masters'.
//!
//! Why a separate process and a separate load generator: most operators run
//! `serve`, and the library rows measure neither its HTTP stack nor its
//! JSON. The stock is larger than the window can sell, so every request is
//! a purchase and none is answered from the sold-out flag.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};

use crate::report::RunResult;

use super::orders_rows::{order_counts, order_rows};
use super::*;

/// wrk's script: each request buys one unit for a user no request used
/// before; each thread counts answers by status, and `done` prints them
/// with the latency percentiles, one `key value` per line.
const WRK_LUA: &str = r#"
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  sku = args[1]
  run = args[2]
  n = 0
  codes = {}
end
function request()
  n = n + 1
  local body = '{"user":"' .. run .. '-t' .. tid .. '-' .. n .. '","qty":1,"request_id":"r' .. n .. '"}'
  return wrk.format("POST", "/v1/sales/" .. sku .. "/purchase",
    {["Content-Type"] = "application/json"}, body)
end
function response(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("codes")) do all[k] = (all[k] or 0) + v end
  end
  for k, v in pairs(all) do io.write(string.format("status_%d %d\n", k, v)) end
  local e = summary.errors
  io.write(string.format("requests %d\nduration_us %d\n", summary.requests, summary.duration))
  io.write(string.format("socket_errors %d\n", e.connect + e.read + e.write + e.timeout))
  io.write(string.format("p50_us %d\np99_us %d\np999_us %d\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"#;

/// What wrk printed, read.
#[derive(Debug, Default, PartialEq)]
pub(super) struct WrkFigures {
    pub(super) ok: u64,
    pub(super) other_status: u64,
    pub(super) socket_errors: u64,
    pub(super) requests: u64,
    pub(super) duration: Duration,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) p999_ms: f64,
}

/// Reads the `key value` lines of [`WRK_LUA`]'s `done`.
pub(super) fn wrk_figures(text: &str) -> Option<WrkFigures> {
    let mut f = WrkFigures::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<u64>() else {
            continue;
        };
        match key {
            "status_200" => f.ok += v,
            k if k.starts_with("status_") => f.other_status += v,
            "requests" => (f.requests, seen) = (v, seen + 1),
            "duration_us" => (f.duration, seen) = (Duration::from_micros(v), seen + 1),
            "socket_errors" => f.socket_errors = v,
            "p50_us" => f.p50_ms = v as f64 / 1000.0,
            "p99_us" => f.p99_ms = v as f64 / 1000.0,
            "p999_us" => f.p999_ms = v as f64 / 1000.0,
            _ => {}
        }
    }
    (seen == 2).then_some(f)
}

/// The `flashsale` binary: FLASHSALE_BIN, else beside this one.
fn flashsale_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FLASHSALE_BIN") {
        return Ok(p.into());
    }
    let me = std::env::current_exe()?;
    let dir = me.parent().ok_or_else(|| anyhow!("{me:?} has no folder"))?;
    Ok(dir.join("flashsale"))
}

/// A free loopback port (bound, then let go for serve to take).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The status code of `GET path` on `addr`, or None.
async fn get_status(addr: &str, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.ok()?;
    let head = std::str::from_utf8(&buf[..n]).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

/// A `serve` process, killed on drop.
struct Serve(tokio::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

impl Bench {
    /// The `http` row; None (with the reason on stderr) when wrk or
    /// PostgreSQL is missing.
    pub(super) async fn http_run(&mut self) -> Result<Option<RunResult>> {
        if std::process::Command::new("wrk")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("http row skipped: wrk is not installed (ops/up installs it)");
            return Ok(None);
        }
        let pool = match flashsale::db::pool(&self.postgres_url, 4) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("http row skipped: {e}");
                return Ok(None);
            }
        };
        if let Err(e) = flashsale::db::migrate(&pool).await {
            eprintln!("http row skipped: PostgreSQL: {e}");
            return Ok(None);
        }
        let window = Duration::from_secs_f64(self.args.http_seconds.max(1.0));
        // More than the window can sell at any rate this machine reaches.
        let st = self.sale("http", 100_000_000, 1).await?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let mut cmd = tokio::process::Command::new(flashsale_bin()?);
        if let Some(c) = &self.args.config {
            cmd.arg("--config").arg(c);
        }
        let child = cmd
            .args(["serve", "--no-order-writer", "--listen", &addr])
            // The engine rows' settings: leader ack, quiet logs.
            .env("FLASHSALE_ACK", "leader")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("spawning flashsale serve")?;
        let serve = Serve(child);
        let pid = serve
            .0
            .id()
            .ok_or_else(|| anyhow!("serve exited at once"))?;
        let ready_by = Instant::now() + Duration::from_secs(60);
        while get_status(&addr, "/readyz").await != Some(200) {
            if Instant::now() > ready_by {
                return Err(anyhow!("flashsale serve on {addr} not ready in 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let script = std::env::temp_dir().join(format!("flashsale-bench-{}.lua", self.run));
        std::fs::write(&script, WRK_LUA)?;
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let serve_before = proc_cpu_us(pid);
        let out = tokio::process::Command::new("wrk")
            .args(["-t", "2", "-c"])
            .arg(self.args.concurrency.to_string())
            .arg("-d")
            .arg(format!("{}s", window.as_secs()))
            .arg("--timeout")
            .arg("10s")
            .arg("-s")
            .arg(&script)
            .arg(format!("http://{addr}"))
            .arg("--")
            .arg(&st.sku)
            .arg(format!("{}-http", self.run))
            .output()
            .await
            .context("running wrk")?;
        let serve_us = proc_cpu_us(pid)
            .zip(serve_before)
            .map(|(a, b)| a.saturating_sub(b));
        let after = master_time(&self.engine, &mut self.conn).await?;
        drop(serve);
        let _ = std::fs::remove_file(&script);
        let text = String::from_utf8_lossy(&out.stdout);
        let w = wrk_figures(&text).ok_or_else(|| {
            anyhow!(
                "wrk printed no figures: {} {}",
                text.chars().take(400).collect::<String>(),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        // Every 200 against what Redis and then PostgreSQL hold.
        let status = self.engine.sale_status(&st.sku).await?;
        let sold = status.initial - status.remaining;
        let mut queued = 0;
        for b in &status.buckets {
            queued += flashsale::orders::stream_info(&mut self.conn, &b.stream)
                .await
                .entries_added;
        }
        self.drain_into_postgres(&pool, &st.sku, queued).await?;
        // Every request was a new user's: more rows than users is a
        // purchase answered once and ordered twice.
        let (written, users) = order_counts(&pool, &st.sku).await?;
        let duplicated = written.saturating_sub(users);
        // wrk stops at its deadline with up to one request per connection
        // in flight: serve may have sold those units, but no 200 reached
        // wrk. More 200s than units, or more units than 200s plus one per
        // connection, is a fault.
        let in_flight = sold.saturating_sub(w.ok);
        let connections = self.args.concurrency as u64;
        let oversold = w.ok.saturating_sub(sold)
            + in_flight.saturating_sub(connections)
            + queued.abs_diff(sold)
            + written.abs_diff(sold)
            + duplicated;
        let errors = w.other_status + w.socket_errors;
        let secs = w.duration.as_secs_f64().max(1e-9);
        let throughput = w.ok as f64 / secs;
        let mut r = RunResult {
            scenario: "http".into(),
            strategy: "serve".into(),
            ops: w.requests,
            concurrency: self.args.concurrency,
            answers_per_s: w.requests as f64 / secs,
            stock: status.initial,
            client_us_per_confirmed: serve_us
                .filter(|_| w.ok > 0)
                .map(|us| us as f64 / w.ok as f64),
            p50_ms: w.p50_ms,
            p99_ms: w.p99_ms,
            p999_ms: Some(w.p999_ms),
            confirmed: w.ok,
            oversold,
            errors,
            note: format!(
                "wrk, 2 threads, {} connections, {} s, a new user per request, to `flashsale serve --no-order-writer`; client µs is serve's CPU per 200 (/proc); each 200 checked against units sold ({sold}; {in_flight} sold in flight when wrk stopped, at most one per connection), orders queued ({queued}) and rows in PostgreSQL ({written}, one per user: {duplicated} duplicated)",
                self.args.concurrency,
                window.as_secs()
            ),
            ..RunResult::default()
        }
        .with_rate(throughput);
        r = with_master_time(r, &before, &after);
        let _ = flashsale::db::client(&pool)
            .await?
            .execute("DELETE FROM orders WHERE sku = $1", &[&st.sku])
            .await;
        Ok(Some(r))
    }

    /// Runs an order writer until PostgreSQL holds `expected` orders of
    /// `sku` (or the cap passes). The writer
    /// drains every sale in the index: the row runs after the cleanup, when
    /// its sale is the only one (else it would write every earlier row's
    /// orders into PostgreSQL, and leave them there).
    async fn drain_into_postgres(
        &self,
        pool: &flashsale::db::Pool,
        sku: &str,
        expected: u64,
    ) -> Result<()> {
        let writer = self
            .engine
            .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
            .await?;
        let deadline = Instant::now() + self.cap();
        let mut written = order_rows(pool, sku).await?;
        while written < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            written = order_rows(pool, sku).await?;
        }
        writer.shutdown().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_s_figures_are_read_and_every_other_status_is_an_error() {
        let text = "Running 2s test\nstatus_200 900\nstatus_503 7\nstatus_422 3\nrequests 910\nduration_us 2000000\nsocket_errors 2\np50_us 1500\np99_us 9000\np999_us 20000\n";
        let f = wrk_figures(text).expect("figures");
        assert_eq!(
            f,
            WrkFigures {
                ok: 900,
                other_status: 10,
                socket_errors: 2,
                requests: 910,
                duration: Duration::from_secs(2),
                p50_ms: 1.5,
                p99_ms: 9.0,
                p999_ms: 20.0,
            }
        );
        assert_eq!(wrk_figures("Running 2s test\n"), None, "no summary: no row");
    }
}
