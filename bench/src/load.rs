//! The load generator: `concurrency` workers pull operation numbers from a
//! shared counter until `ops` are done or the time cap passes, optionally
//! paced to a target rate (open loop), and record each operation's latency in
//! an HDR histogram. A paced operation's latency runs from when it was due,
//! not from when a worker got to it, so queueing behind schedule counts.
//! Knows nothing about what an operation does.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;

/// What one operation ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A unit was sold (or a lock pair completed).
    Confirmed,
    /// The answer was "sold out".
    SoldOut,
    /// Anything else.
    Error,
}

/// Figures of one load run.
pub struct LoadStats {
    /// Operations completed.
    pub done: u64,
    /// Confirmed ones.
    pub confirmed: u64,
    /// Sold-out answers.
    pub sold_out: u64,
    /// Errors.
    pub errors: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// From the start to the last confirmation: the selling phase. Past
    /// it only sold-out answers come, which cost the strategies very
    /// different amounts (a local flag, a GET, a whole script), so
    /// throughput is counted over this span.
    pub selling: Duration,
    /// Latency of the confirmed operations, µs (sold-out answers and errors
    /// are not in it: they are cheap, and would dilute the percentiles).
    pub latency_us: Histogram<u64>,
}

impl LoadStats {
    /// Confirmed purchases (or lock pairs) per second of the selling
    /// phase: the figure every row is compared on.
    pub fn throughput(&self) -> f64 {
        self.confirmed as f64 / self.selling.as_secs_f64().max(1e-9)
    }

    /// Answers of any kind per second of wall time.
    pub fn answers_per_s(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// A latency percentile in milliseconds.
    pub fn pct_ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant figures; the bounds are constants.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}

/// Runs `op(i)` for i in 0..ops with `concurrency` workers.
pub async fn run<F, Fut>(
    ops: u64,
    concurrency: usize,
    cap: Duration,
    rate: Option<f64>,
    bar: &ProgressBar,
    op: F,
) -> LoadStats
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (next, op, bar) = (next.clone(), op.clone(), bar.clone());
            tokio::spawn(async move {
                let mut h = histogram();
                let mut counts = [0u64; 3];
                let mut last_confirmed = Duration::ZERO;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= ops || started.elapsed() >= cap {
                        break;
                    }
                    let t0 = match rate {
                        Some(r) => {
                            let due = started + Duration::from_secs_f64(i as f64 / r);
                            tokio::time::sleep_until(due.into()).await;
                            due
                        }
                        None => Instant::now(),
                    };
                    let outcome = op(i).await;
                    // Every purchase's latency, an error's or a timeout's
                    // too (they must reach p99); a sold-out answer is no
                    // purchase and is left out.
                    if outcome != Outcome::SoldOut {
                        h.saturating_record((t0.elapsed().as_micros() as u64).max(1));
                    }
                    if outcome == Outcome::Confirmed {
                        last_confirmed = started.elapsed();
                    }
                    counts[outcome as usize] += 1;
                    bar.inc(1);
                }
                (h, counts, last_confirmed)
            })
        })
        .collect();
    let mut stats = LoadStats {
        done: 0,
        confirmed: 0,
        sold_out: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        selling: Duration::ZERO,
        latency_us: histogram(),
    };
    for w in workers {
        if let Ok((h, c, last)) = w.await {
            stats.selling = stats.selling.max(last);
            let _ = stats.latency_us.add(&h);
            stats.confirmed += c[0];
            stats.sold_out += c[1];
            stats.errors += c[2];
        }
    }
    stats.elapsed = started.elapsed();
    stats.done = stats.confirmed + stats.sold_out + stats.errors;
    stats
}
