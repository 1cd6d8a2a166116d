//! The targets a bench run is judged by, and the per-row medians over
//! repetitions. Pure functions of the figures: nothing here runs anything.

use crate::lockbench;
use crate::report::{RunResult, Target};
use crate::strategies::{UNBATCHED, UNBATCHED_10};

/// The row of `scenario` and `strategy`.
pub fn find<'a>(rs: &'a [RunResult], scenario: &str, strategy: &str) -> Option<&'a RunResult> {
    rs.iter()
        .find(|r| r.scenario == scenario && r.strategy == strategy)
}

/// The figure each target judges, from one repetition, in `TARGETS` order.
fn target_figures(
    results: &[RunResult],
    locks: &[lockbench::LockResult],
) -> [Option<f64>; N_TARGETS] {
    // Rates compared only between rows on the one clock, with nothing
    // wrong (a row whose stock never ran out kept its own clock).
    let tp = |sc: &str, st: &str| {
        find(results, sc, st)
            .filter(|r| r.stock_clock && r.errors == 0 && r.oversold == 0)
            .map(|r| r.throughput)
    };
    let us = |sc: &str, st: &str| find(results, sc, st).and_then(|r| r.redis_us_per_op);
    let p99 = |sc: &str, st: &str| find(results, sc, st).map(|r| r.p99_ms);
    // A row with errors or oversold units has no cost to judge either.
    let per_confirmed = |sc: &str, st: &str| {
        find(results, sc, st)
            .filter(|r| r.errors == 0 && r.oversold == 0)
            .and_then(|r| r.master_us_per_confirmed)
    };
    let client_per_confirmed = |sc: &str, st: &str| {
        find(results, sc, st)
            .filter(|r| r.errors == 0 && r.oversold == 0)
            .and_then(|r| r.client_us_per_confirmed)
    };
    let ratio =
        |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
    // An orders row that lost, duplicated or oversold an order has no rate
    // to judge.
    let clean_tp = |st: &str| {
        find(results, "hot1", st)
            .filter(|r| r.errors == 0 && r.oversold == 0)
            .map(|r| r.throughput)
    };
    // Contended rows only (the uncontended pair is bounded by what a fenced
    // take costs the node, see `bench/lock-node-floor`: reported, not
    // judged), against rslock with its retry tuned.
    let contended: Vec<Option<f64>> = locks
        .iter()
        .filter(|l| l.implementation == "flashsale" && l.tasks > 1)
        .filter_map(|l| {
            locks
                .iter()
                .find(|r| {
                    r.implementation == lockbench::RSLOCK_TUNED
                        && r.nodes == l.nodes
                        && r.tasks == l.tasks
                })
                .map(|r| clean_ratio(l, r))
        })
        .collect();
    let lock_ratio = contended
        .iter()
        .copied()
        .collect::<Option<Vec<f64>>>()
        .filter(|xs| !xs.is_empty())
        .map(|xs| xs.into_iter().fold(f64::INFINITY, f64::min));
    let (xproc_ratio, xproc_wait) = xproc_figures(locks, "flashsale x-proc");
    let watchdog_row = format!("{} x-proc", lockbench::WATCHDOG);
    let (watchdog_ratio, watchdog_wait) = xproc_figures(locks, &watchdog_row);
    let shared = shared_ratio(locks, "flashsale");
    let shared_watchdog = shared_ratio(locks, lockbench::WATCHDOG);
    let handoff = locks
        .iter()
        .filter(|l| l.implementation == "flashsale")
        .filter_map(|l| l.handoff_p99_ms)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    [
        ratio(tp("hot1", "engine"), tp("hot1", "anchor")),
        ratio(tp("hot1", "engine"), tp("hot1", "anchor P16")),
        ratio(per_confirmed("hot1", "engine"), us("hot1", "floor")),
        ratio(
            per_confirmed("hot1", "engine"),
            per_confirmed("hot1", "anchor"),
        ),
        ratio(
            per_confirmed("hot1", "engine"),
            per_confirmed("hot1", UNBATCHED),
        ),
        ratio(tp("many", "engine"), tp("many", "anchor")),
        ratio(p99("hot1", "engine@10%"), p99("hot1", UNBATCHED_10)),
        find(results, "hot1", "engine@80%").map(|r| r.p99_ms),
        ratio(
            clean_tp("orders drain"),
            find(results, "hot1", "orders drain").and_then(|r| r.engine_per_s),
        ),
        find(results, "hot1", "engine hold").and_then(|r| r.expiry_lag_p99_ms),
        ratio(
            client_per_confirmed("http", "serve"),
            client_per_confirmed("hot1", "engine"),
        ),
        ratio(per_confirmed("hot1", "orders"), us("hot1", "floor")),
        ratio(
            find(results, "hot1", "orders drain")
                .filter(|r| r.errors == 0 && r.oversold == 0)
                .and_then(|r| Some(r.client_us_per_confirmed? + r.db_us_per_order?)),
            client_per_confirmed("hot1", "engine")
                .zip(per_confirmed("hot1", "engine"))
                .map(|(c, m)| c + m),
        ),
        lock_ratio,
        handoff,
        xproc_ratio,
        xproc_wait,
        watchdog_ratio,
        watchdog_wait,
        shared,
        shared_watchdog,
        unsafe_lock_rows(locks).map(|n| n as f64),
    ]
}

/// Whether a lock row's rate may be judged: every pair succeeded and no
/// grant overlapped another holder.
fn clean(l: &lockbench::LockResult) -> bool {
    l.errors == 0 && l.overlaps == 0
}

/// `ours` over `theirs` in pairs/s, None unless both rows are clean.
fn clean_ratio(ours: &lockbench::LockResult, theirs: &lockbench::LockResult) -> Option<f64> {
    (clean(ours) && clean(theirs))
        .then(|| ours.pairs_per_second / theirs.pairs_per_second.max(1e-9))
}

/// flashsale's lock rows (every kind) with a failed pair or an overlap;
/// None when no lock row ran (nothing was checked: not a 0).
fn unsafe_lock_rows(locks: &[lockbench::LockResult]) -> Option<usize> {
    let ours: Vec<&lockbench::LockResult> = locks
        .iter()
        .filter(|l| l.implementation.starts_with("flashsale"))
        .collect();
    (!ours.is_empty()).then(|| ours.iter().filter(|l| !clean(l)).count())
}

/// `implementation`'s pairs/s over tuned rslock's with
/// [`lockbench::SHARED_WORKERS`] workers on one client sharing one name
/// (scenario C), worst of 1 and 3 nodes; None unless both were run and
/// every row compared is clean.
fn shared_ratio(locks: &[lockbench::LockResult], implementation: &str) -> Option<f64> {
    let ours = format!("{implementation} C");
    let theirs = format!("{} C", lockbench::RSLOCK_TUNED);
    worst_clean_ratio(locks, &ours, &theirs, 2)
}

/// The worst ratio of row `ours` over row `theirs` across node counts;
/// None unless `pairs` pairs of rows were found, all clean.
fn worst_clean_ratio(
    locks: &[lockbench::LockResult],
    ours: &str,
    theirs: &str,
    pairs: usize,
) -> Option<f64> {
    let mut ratios = Vec::new();
    for l in locks.iter().filter(|l| l.implementation == ours) {
        if let Some(r) = locks
            .iter()
            .find(|r| r.implementation == theirs && r.nodes == l.nodes)
        {
            ratios.push(clean_ratio(l, r)?);
        }
    }
    (ratios.len() == pairs).then(|| ratios.into_iter().fold(f64::INFINITY, f64::min))
}

/// The cross-process figures of the row `label`: acquisitions/s over
/// tuned rslock's (worst of 1 and 3 nodes, None unless every row is clean)
/// and the longest wait (worst).
fn xproc_figures(locks: &[lockbench::LockResult], label: &str) -> (Option<f64>, Option<f64>) {
    let theirs = format!("{} x-proc", lockbench::RSLOCK_TUNED);
    let n = locks.iter().filter(|l| l.implementation == label).count();
    let worst_ratio = worst_clean_ratio(locks, label, &theirs, n.max(1));
    let longest = locks
        .iter()
        .filter(|l| l.implementation == label)
        .filter_map(|l| l.longest_wait_ms)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    (worst_ratio, longest)
}

/// A target: its name, its goal as text, and the test of a measured figure.
type TargetSpec = (&'static str, &'static str, fn(f64) -> bool);

/// Name, goal and test of each target, in `target_figures` order.
const TARGETS: [TargetSpec; N_TARGETS] = [
    // Natural batching (issue 13).
    ("batching: hot1 engine / anchor", ">= 2.0", |x| x >= 2.0),
    ("batching: hot1 engine / anchor P16", ">= 1.0", |x| x >= 1.0),
    // What a purchase costs the masters (issue 35): figures that carry
    // over to any machine, where throughput on 2 shared cores does not.
    (
        "cost: hot1 master µs per confirmed purchase, engine / the floor script (GET, compare, DECRBY) per call",
        "<= 1.0",
        |x| x <= 1.0,
    ),
    (
        "cost: hot1 master µs per confirmed purchase, engine / anchor (the same purchase script, one call each)",
        "<= 0.35",
        |x| x <= 0.35,
    ),
    (
        "cost: hot1 master µs per confirmed purchase, engine / engine batch_max=1 (same engine, same flag)",
        "<= 0.5",
        |x| x <= 0.5,
    ),
    ("batching: many engine / anchor", ">= 1.5", |x| x >= 1.5),
    (
        "batching: p99 at 10% of peak, batched / batch_max=1",
        "<= 1.1 (no worse, within noise)",
        |x| x <= 1.1,
    ),
    ("p99 ms at 80% of peak (hot1 engine@80%)", "< 5", |x| {
        x < 5.0
    }),
    (
        "orders: writers draining a backlog alone, orders/s into PostgreSQL / the engine's purchases/s selling that backlog alone (same row, same size, each with the machine to itself)",
        ">= 1.0",
        |x| x >= 1.0,
    ),
    // Holds (issue 14).
    (
        "holds: expiry lag p99 ms, deadline to units back (hot1 engine hold: under load, and 10,000 holds due within about a second)",
        "< 1000",
        |x| x < 1000.0,
    ),
    // serve (issue 35): what an HTTP purchase costs the process serving it,
    // against what the library and its load generator cost per purchase.
    (
        "cost: serve CPU µs per purchase request (http serve, wrk) / hot1 engine process CPU µs per confirmed purchase",
        "<= 2.0",
        |x| x <= 2.0,
    ),
    (
        "cost: master µs per order end to end (hot1 orders: the sale and the writers' reads, acks, trims, claims) / the floor script per call",
        "<= 1.5",
        |x| x <= 1.5,
    ),
    (
        "cost: CPU µs per order written, writers + PostgreSQL (orders drain) / CPU µs per purchase, engine process + masters (hot1 engine)",
        "<= 1.0",
        |x| x <= 1.0,
    ),
    // Locks (issues 15, 35): contended rows against rslock with its retry
    // tuned; the uncontended pair is reported, not judged.
    (
        "lock pairs/s, contended: flashsale / rslock with its retry tuned (worst of 1 and 3 nodes)",
        ">= 2",
        |x| x >= 2.0,
    ),
    (
        "lock hand-off p99 ms (flashsale, worst)",
        "well under the 10 s TTL (< 100 ms)",
        |x| x < 100.0,
    ),
    (
        "lock x-proc acquisitions/s, 4 processes x 4 workers on one name: flashsale / tuned rslock (worst of 1 and 3 nodes)",
        ">= 2",
        |x| x >= 2.0,
    ),
    (
        "lock x-proc longest wait of any worker, ms (flashsale, worst)",
        "< 100",
        |x| x < 100.0,
    ),
    (
        "lock x-proc, watchdog instead of a fixed lease: flashsale / tuned rslock (worst of 1 and 3 nodes)",
        ">= 2",
        |x| x >= 2.0,
    ),
    (
        "lock x-proc longest wait, watchdog, ms (flashsale, worst)",
        "< 100",
        |x| x < 100.0,
    ),
    (
        "lock, 16 workers on one client sharing one name (C): flashsale / tuned rslock pairs/s (worst of 1 and 3 nodes)",
        ">= 2",
        |x| x >= 2.0,
    ),
    (
        "lock, 16 workers on one client sharing one name (C), watchdog instead of a fixed lease: flashsale / tuned rslock (worst of 1 and 3 nodes)",
        ">= 2",
        |x| x >= 2.0,
    ),
    (
        "lock rows of flashsale with a failed pair or two holders at once (worst repetition)",
        "= 0",
        |x| x == 0.0,
    ),
];

/// How many targets there are.
const N_TARGETS: usize = 22;

/// The batch size at quantile `q` of `counts` (element `n` counts the
/// batches of `n` purchases); None when there were no batches.
pub fn size_at(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (n, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(n as f64);
        }
    }
    None
}

/// The median of `xs`: the middle value, or the mean of the two middle
/// values of an even count (never the upper one).
pub fn median_of(xs: &[f64]) -> Option<f64> {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// Whether the target `name` judges a tail (a p99, a longest wait): those
/// are judged on their worst repetition, never on a median that can hide a
/// bad one (a "p99 at 80 % 4.09 ms, met" had repetitions of 334.8, 4.09
/// and 4.01 ms).
fn is_tail(name: &str) -> bool {
    name.contains("p99") || name.contains("longest wait") || name.contains("worst repetition")
}

/// The figure a target is judged on: the worst repetition (the largest)
/// for a tail, else the median.
fn judged_figure(name: &str, xs: &[f64]) -> Option<f64> {
    if is_tail(name) {
        xs.iter().copied().max_by(f64::total_cmp)
    } else {
        median_of(xs)
    }
}

/// Each target judged on its figure over repetitions (the worst for a
/// tail, else the median: [`judged_figure`]), each figure computed within
/// one repetition (so a ratio compares runs made minutes apart, not the
/// medians of different moments). Every repetition's figure is kept, so
/// the verdict can be recomputed.
pub fn targets(runs: &[(Vec<RunResult>, Vec<lockbench::LockResult>)]) -> Vec<Target> {
    let per_rep: Vec<[Option<f64>; N_TARGETS]> =
        runs.iter().map(|(r, l)| target_figures(r, l)).collect();
    TARGETS
        .iter()
        .enumerate()
        .map(|(k, (name, goal, ok))| {
            let xs: Vec<f64> = per_rep.iter().filter_map(|f| f[k]).collect();
            // A repetition without the figure (an orders row that lost or
            // duplicated an order gives none) leaves the target unjudged:
            // the others must not meet it on its behalf.
            let measured = if xs.len() == per_rep.len() {
                judged_figure(name, &xs)
            } else {
                None
            };
            Target {
                name: (*name).into(),
                measured,
                goal: (*goal).into(),
                met: measured.map(ok),
                per_repetition: xs,
            }
        })
        .collect()
}

/// Per row (scenario and strategy; lock implementation, nodes and tasks),
/// the repetition with the median throughput.
pub fn medians(
    runs: Vec<(Vec<RunResult>, Vec<lockbench::LockResult>)>,
) -> (Vec<RunResult>, Vec<lockbench::LockResult>) {
    fn median<T: Clone>(mut xs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
        xs.sort_by(|a, b| key(a).total_cmp(&key(b)));
        xs.get(xs.len() / 2).cloned()
    }
    let Some((first_r, first_l)) = runs.first().cloned() else {
        return (Vec::new(), Vec::new());
    };
    let results = first_r
        .iter()
        .filter_map(|r| {
            let same: Vec<RunResult> = runs
                .iter()
                .filter_map(|(rs, _)| {
                    rs.iter()
                        .find(|x| x.scenario == r.scenario && x.strategy == r.strategy)
                        .cloned()
                })
                .collect();
            // Never let the median hide a bad repetition: oversell is the
            // worst seen, errors are all of them. The row's other figures
            // are those of the median repetition; its throughput is the
            // true median, and every repetition's is kept.
            let oversold = same.iter().map(|x| x.oversold).max().unwrap_or(0);
            let errors = same.iter().map(|x| x.errors).sum();
            // Forks are counted over every repetition, so a disturbed one
            // shows even when it is not the median (unknown when any
            // repetition's is).
            let forks: Option<u64> = same.iter().map(|x| x.persistence_forks).sum();
            let reps: Vec<f64> = same.iter().map(|x| x.throughput).collect();
            let mid = median_of(&reps);
            let reps_n = same.len();
            median(same, |x| x.throughput).map(|m| RunResult {
                oversold,
                errors,
                persistence_forks: forks,
                note: match forks {
                    Some(n) if n > 0 => {
                        format!("{}; {n} fork(s) over the {reps_n} repetitions", m.note)
                    }
                    _ => m.note.clone(),
                },
                throughput: mid.unwrap_or(m.throughput),
                throughput_min: reps.iter().copied().fold(f64::INFINITY, f64::min),
                throughput_max: reps.iter().copied().fold(0.0, f64::max),
                repetitions: reps,
                ..m
            })
        })
        .collect();
    let locks = first_l
        .iter()
        .filter_map(|l| {
            let same: Vec<lockbench::LockResult> = runs
                .iter()
                .filter_map(|(_, ls)| {
                    ls.iter()
                        .find(|x| {
                            x.implementation == l.implementation
                                && x.nodes == l.nodes
                                && x.tasks == l.tasks
                        })
                        .cloned()
                })
                .collect();
            // As for oversell: the median never hides a bad repetition.
            let errors = same.iter().map(|x| x.errors).sum();
            let overlaps = same.iter().map(|x| x.overlaps).sum();
            median(same, |x| x.pairs_per_second).map(|m| lockbench::LockResult {
                errors,
                overlaps,
                ..m
            })
        })
        .collect();
    (results, locks)
}

#[cfg(test)]
mod tests {
    use super::{judged_figure, median_of, size_at, target_figures, TARGETS};
    use crate::lockbench::{LockResult, RSLOCK_TUNED};

    fn lock_row(implementation: &str, pairs_per_second: f64, overlaps: u64) -> LockResult {
        LockResult {
            implementation: implementation.into(),
            nodes: 1,
            tasks: 8,
            pairs: 1_000,
            pairs_per_second,
            handoff_p50_ms: None,
            handoff_p99_ms: None,
            errors: 0,
            overlaps,
            longest_wait_ms: None,
        }
    }

    /// The cost targets divide per confirmed purchase, and a row that
    /// oversold or erred has no cost to judge.
    #[test]
    fn a_row_with_errors_has_no_cost_to_judge() {
        let k = TARGETS
            .iter()
            .position(|(n, _, _)| {
                n.starts_with("cost: hot1 master µs per confirmed purchase, engine / anchor")
            })
            .expect("the cost target");
        let row = |strategy: &str, us: f64, errors: u64| crate::report::RunResult {
            scenario: "hot1".into(),
            strategy: strategy.into(),
            master_us_per_confirmed: Some(us),
            errors,
            ..Default::default()
        };
        let clean = [row("engine", 10.0, 0), row("anchor", 40.0, 0)];
        assert_eq!(target_figures(&clean, &[])[k], Some(0.25));
        let erred = [row("engine", 10.0, 5), row("anchor", 40.0, 0)];
        assert_eq!(target_figures(&erred, &[])[k], None);
    }

    /// A lock row that let two holders in at once has no rate to judge,
    /// and counts against the safety target, however fast it was.
    #[test]
    fn a_lock_row_with_two_holders_at_once_is_never_judged_fast() {
        let k = TARGETS
            .iter()
            .position(|(n, _, _)| n.starts_with("lock pairs/s, contended"))
            .expect("the contended target");
        let safety = TARGETS.len() - 1;
        let clean = [
            lock_row("flashsale", 9_000.0, 0),
            lock_row(RSLOCK_TUNED, 1_000.0, 0),
        ];
        let figures = target_figures(&[], &clean);
        assert_eq!(figures[k], Some(9.0));
        assert_eq!(figures[safety], Some(0.0));
        let broken = [
            lock_row("flashsale", 9_000.0, 3),
            lock_row(RSLOCK_TUNED, 1_000.0, 0),
        ];
        let figures = target_figures(&[], &broken);
        assert_eq!(figures[k], None, "no rate for a row that broke exclusion");
        assert_eq!(figures[safety], Some(1.0));
        assert!(!(TARGETS[safety].2)(1.0));
    }

    /// The house rule: a tail is judged on its worst repetition.
    #[test]
    fn a_tail_is_judged_on_its_worst_repetition_not_the_median() {
        let p99 = "p99 ms at 80% of peak (hot1 engine@80%)";
        assert_eq!(judged_figure(p99, &[334.8, 4.09, 4.01]), Some(334.8));
        let wait = "lock x-proc longest wait of any worker, ms (flashsale, worst)";
        assert_eq!(judged_figure(wait, &[99.1, 135.4, 81.9]), Some(135.4));
        let ratio = "hot1: engine / anchor";
        assert_eq!(judged_figure(ratio, &[1.0, 3.0, 2.0]), Some(2.0));
        // Every target that names a tail is judged so.
        let tails = TARGETS
            .iter()
            .filter(|(n, _, _)| n.contains("p99") || n.contains("longest"))
            .count();
        assert!(tails >= 5, "{tails}");
    }

    #[test]
    fn batch_size_quantiles_come_from_the_counts_by_size() {
        assert_eq!(size_at(&[0, 0, 0], 0.5), None);
        // 98 batches of 1, 2 of 64.
        let mut counts = vec![0u64; 65];
        counts[1] = 98;
        counts[64] = 2;
        assert_eq!(size_at(&counts, 0.5), Some(1.0));
        assert_eq!(size_at(&counts, 0.99), Some(64.0));
        assert_eq!(size_at(&counts, 0.98), Some(1.0));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median_of(&[]), None);
        assert_eq!(median_of(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median_of(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
