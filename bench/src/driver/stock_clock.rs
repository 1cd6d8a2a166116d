//! The one clock every inventory row is timed by, the anchor's and the
//! engine's alike: a watcher that reads the row's stock keys off the masters
//! every millisecond and notes when the first unit went and when the last
//! did, and reads the masters' CPU at that moment.
//!
//! Why its own clock: the anchor's processes (redis-benchmark) show nothing
//! until they exit, and the engine's load generator sees only its own
//! answers. Timing each side by what it alone can see gave the engine the
//! shorter span (its clock started with its connections open; the anchor's
//! before its processes had started). Read off Redis, both rows start at the
//! first decrement and end at the stock's zero, with the same polling error
//! (up to one poll, about 1 ms, at each end) on both. And the CPU read at the
//! zero is what the confirmed purchases cost, before the sold-out answers that
//! follow (a whole script call each for the anchor, a local flag for the
//! engine) are added to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale::Engine;

use super::nodes::{cpu_us, info, process_cpu_us, MasterTime};
use crate::report::RunResult;

/// How often the stock is read. A read is one GET per bucket still holding
/// stock, on its own connection: about 1,000 small commands a second, the
/// same for every row.
const POLL: Duration = Duration::from_millis(1);

/// What the watcher saw.
#[derive(Debug, Default, Clone)]
pub(super) struct Watched {
    /// The first read in which some bucket held less than it was given.
    pub(super) first_taken: Option<Instant>,
    /// The first read in which every bucket was at 0 (or below).
    pub(super) sold_out: Option<Instant>,
    /// Per master (`host:port`), its CPU µs (`INFO cpu`) read right after
    /// `sold_out`: None when the stock never ran out or a master did not
    /// answer.
    pub(super) cpu_at_sold_out: Option<std::collections::BTreeMap<String, u64>>,
    /// This process's CPU µs (getrusage) at `sold_out`: the engine rows'
    /// client CPU per confirmed purchase is counted to the zero too, so
    /// the sold-out answers after it are not charged to the purchases.
    pub(super) process_cpu_at_sold_out: Option<u64>,
}

impl Watched {
    /// The selling span on Redis's side: from the first unit taken to the
    /// last, when both were seen.
    pub(super) fn selling(&self) -> Option<Duration> {
        let (a, b) = (self.first_taken?, self.sold_out?);
        Some(b.saturating_duration_since(a)).filter(|d| !d.is_zero())
    }
}

/// A running watcher; [`StockClock::stop`] ends it and returns what it saw.
pub(super) struct StockClock {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Watched>,
}

impl StockClock {
    /// Starts watching `keys` (each bucket's stock key and what it was
    /// given). Call it before the row sends its first request.
    pub(super) async fn start(engine: &Engine, keys: Vec<(String, i64)>) -> anyhow::Result<Self> {
        let mut conn = engine.dedicated_connection().await?;
        let masters: Vec<String> = engine.slot_map().await?.masters();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Watched::default();
            // Buckets not yet at 0; stock in these rows only goes down.
            let mut left: Vec<(String, i64)> = keys;
            while !flag.load(Ordering::Relaxed) {
                let mut taken = false;
                let mut i = 0;
                while i < left.len() {
                    let v: Option<i64> = match redis::cmd("GET")
                        .arg(&left[i].0)
                        .query_async(&mut conn)
                        .await
                    {
                        Ok(v) => v,
                        // A failed read says nothing: keep the bucket.
                        Err(_) => Some(left[i].1),
                    };
                    let now = v.unwrap_or(0);
                    taken |= now < left[i].1;
                    if now <= 0 {
                        left.swap_remove(i);
                        taken = true;
                    } else {
                        i += 1;
                    }
                }
                let at = Instant::now();
                if taken && seen.first_taken.is_none() {
                    seen.first_taken = Some(at);
                }
                if left.is_empty() {
                    seen.sold_out = Some(at);
                    seen.process_cpu_at_sold_out = Some(process_cpu_us());
                    seen.cpu_at_sold_out = cpu_of(&mut conn, &masters).await;
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
            seen
        });
        Ok(Self { stop, task })
    }

    /// Stops the watcher (if the stock has not run out) and returns what
    /// it saw.
    pub(super) async fn stop(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Every master's CPU µs now; None if one does not answer.
async fn cpu_of(
    conn: &mut redis::cluster_async::ClusterConnection,
    masters: &[String],
) -> Option<std::collections::BTreeMap<String, u64>> {
    let mut out = std::collections::BTreeMap::new();
    for m in masters {
        let (host, port) = m.rsplit_once(':')?;
        let text = info(conn, host, port.parse().ok()?, "cpu").await.ok()?;
        out.insert(m.clone(), cpu_us(&text));
    }
    Some(out)
}

/// The row timed by the stock clock: its throughput is its confirmed
/// purchases over the span Redis saw them taken in, and its master CPU per
/// confirmed purchase counts up to the stock's zero. When the stock never
/// ran out, the row keeps its own clock and its whole-row CPU, and says so.
pub(super) fn with_clock(mut row: RunResult, before: &MasterTime, seen: &Watched) -> RunResult {
    match seen.selling() {
        Some(span) => {
            let rate = row.confirmed as f64 / span.as_secs_f64();
            row = row.with_rate(rate);
            row.stock_clock = true;
            row.note
                .push_str("; timed off the stock keys, first unit to last");
        }
        None => row
            .note
            .push_str("; the stock never ran out: timed by the row's own clock"),
    }
    if let Some(us) = cpu_to_sold_out(before, seen).filter(|_| row.confirmed > 0) {
        row.master_us_per_confirmed = Some(us as f64 / row.confirmed as f64);
    } else if seen.sold_out.is_some() {
        row.note.push_str(
            "; master CPU per confirmed over the whole row (a master was not read at the zero)",
        );
    }
    row
}

/// The masters' CPU µs from `before` to the stock's zero, summed; None
/// when the zero's reading is missing.
pub(super) fn cpu_to_sold_out(before: &MasterTime, seen: &Watched) -> Option<u64> {
    let at = seen.cpu_at_sold_out.as_ref()?;
    let mut sum = 0u64;
    for (m, &(_, us0)) in &before.masters {
        sum += at.get(m)?.saturating_sub(us0);
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_needs_both_ends_and_a_positive_length() {
        let t = Instant::now();
        let mut w = Watched::default();
        assert_eq!(w.selling(), None);
        w.first_taken = Some(t);
        assert_eq!(w.selling(), None);
        w.sold_out = Some(t);
        assert_eq!(w.selling(), None, "a zero span would divide by nothing");
        w.sold_out = Some(t + Duration::from_millis(250));
        assert_eq!(w.selling(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn cpu_to_the_zero_is_missing_when_a_master_was_not_read() {
        let mut before = MasterTime::default();
        before.masters.insert("a:1".into(), (0, 100));
        before.masters.insert("b:2".into(), (0, 200));
        let mut w = Watched::default();
        assert_eq!(cpu_to_sold_out(&before, &w), None);
        let mut at = std::collections::BTreeMap::new();
        at.insert("a:1".into(), 150);
        w.cpu_at_sold_out = Some(at.clone());
        assert_eq!(cpu_to_sold_out(&before, &w), None, "b:2 was not read");
        at.insert("b:2".into(), 260);
        w.cpu_at_sold_out = Some(at);
        assert_eq!(cpu_to_sold_out(&before, &w), Some(110));
    }
}
