//! What a run prints: a table per fault kind (operations, outcomes, faults
//! injected, violations), each violation with the history lines that prove
//! it, and the `--json` summary.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::json;

use super::checker::{Kind, Verdict};
use super::protocol::Outcome;
use super::RunResult;

/// Most violations printed with their lines, per kind.
const SHOWN_PER_KIND: usize = 3;

#[derive(Default)]
struct Row {
    ops: u64,
    ok: u64,
    fail: u64,
    unknown: u64,
    faults: u64,
    violations: BTreeMap<&'static str, u64>,
}

/// One fault kind asked for by `--faults`: how often it was tried,
/// injected and landed where it was aimed, and how many operations
/// completed while it was in force.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FaultTally {
    /// Attempts (an attempt that could not inject counts here only).
    pub attempted: u64,
    /// Attempts that injected the fault.
    pub injected: u64,
    /// Injections that landed where they were aimed (`kill`: with
    /// confirmations at risk; `pg-down`: while orders reached the writer).
    pub landed: u64,
    /// Operations that completed while it was in force.
    pub ops_in_force: u64,
}

/// The tally of every fault kind asked for.
pub fn fault_tally(r: &RunResult) -> BTreeMap<&'static str, FaultTally> {
    let mut out: BTreeMap<&'static str, FaultTally> = r
        .options
        .faults
        .iter()
        .map(|f| (f.name(), FaultTally::default()))
        .collect();
    for w in &r.windows {
        let Some(t) = out.get_mut(w.fault.as_str()) else {
            continue;
        };
        t.attempted += 1;
        if w.injected {
            t.injected += 1;
            t.landed += u64::from(w.landed);
            t.ops_in_force += r
                .ops
                .iter()
                .filter(|o| o.complete_ms >= w.start_ms && o.complete_ms <= w.end_ms)
                .count() as u64;
        }
    }
    out
}

/// Why a run tested nothing it was asked to (empty when it did): no
/// operation confirmed, a fault kind asked for never injected, a `kill`
/// that never found confirmations at risk, or, with a planted bug, an
/// aimed fault that never landed. Such a run exits 2, whatever its verdict.
pub fn vacuous(r: &RunResult) -> Vec<String> {
    let mut why = Vec::new();
    // Status reads, restocks and locks answer ok too: what must have been
    // confirmed is a purchase (an engine answering sold_out to every one
    // would otherwise pass), and, when the workload took locks, a lock.
    let confirmed = |name: &str| {
        r.ops
            .iter()
            .any(|o| o.op.name() == name && matches!(o.outcome, Outcome::Ok { .. }))
    };
    if !confirmed("purchase") {
        why.push("no purchase was confirmed".to_owned());
    }
    if r.ops.iter().any(|o| o.op.name() == "lock") && !confirmed("lock") {
        why.push("no lock was granted".to_owned());
    }
    for (name, t) in fault_tally(r) {
        if t.injected == 0 {
            why.push(format!(
                "fault {name} was asked for but never injected ({} attempts failed)",
                t.attempted
            ));
        } else if t.landed == 0
            && (name == "kill" || (name == "pg-down" && r.options.plant.is_some()))
        {
            why.push(format!(
                "fault {name} was injected {} times but never landed where it was aimed",
                t.injected
            ));
        }
    }
    why
}

/// The summary as the `--json` file holds it.
pub fn json(r: &RunResult) -> serde_json::Value {
    let (ok, fail, unknown) = outcome_counts(r);
    let tally = fault_tally(r);
    let faults: BTreeMap<&str, u64> = tally.iter().map(|(f, t)| (*f, t.injected)).collect();
    let violations: BTreeMap<&str, u64> = Kind::ALL
        .iter()
        .map(|k| (k.name(), r.verdict.counts.get(k).copied().unwrap_or(0)))
        .collect();
    let evidence: Vec<serde_json::Value> = r
        .verdict
        .violations
        .iter()
        .take(50)
        .map(|v| {
            json!({
                "kind": v.kind.name(),
                "detail": v.detail,
                "fault": v.fault,
                "lines": v.lines.iter().filter_map(|l| r.history.line(*l)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "seed": r.options.seed,
        "duration_s": (r.duration_s * 10.0).round() / 10.0,
        "ack": ack_name(r.options.ack),
        "engines": r.options.engines,
        "plant": r.options.plant,
        "ops": r.ops.len(),
        "ok": ok,
        "fail": fail,
        "unknown": unknown,
        "faults": faults,
        "fault_tally": tally,
        "vacuous": vacuous(r),
        "by_op": by_op(r),
        "order_states": r.verdict.order_states,
        "expiry_lag_ms": lag_summary(&r.verdict.expiry_lag_ms),
        "violations": violations,
        "must_be_zero": Kind::ALL.iter().filter(|k| Verdict::must_be_zero(**k, r.options.ack)).map(|k| k.name()).collect::<Vec<_>>(),
        "valid": r.verdict.valid(r.options.ack),
        "evidence": evidence,
    })
}

/// Outcomes per kind of operation (`purchase`, `pay`, ...), so a run shows
/// that every kind was exercised.
fn by_op(r: &RunResult) -> BTreeMap<&'static str, BTreeMap<&'static str, u64>> {
    let mut out: BTreeMap<&'static str, BTreeMap<&'static str, u64>> = BTreeMap::new();
    for o in &r.ops {
        let outcome = match o.outcome {
            Outcome::Ok { .. } => "ok",
            Outcome::Fail { .. } => "fail",
            Outcome::Unknown { .. } => "unknown",
        };
        *out.entry(o.op.name())
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
    out
}

/// Expiry lag (deadline to expired, ms): count, p50, p99 and max.
fn lag_summary(sorted: &[i64]) -> serde_json::Value {
    let at = |q: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    json!({ "n": sorted.len(), "p50": at(0.5), "p99": at(0.99), "max": sorted.last() })
}

fn ack_name(a: flashsale::Ack) -> &'static str {
    match a {
        flashsale::Ack::Leader => "leader",
        _ => "replicated",
    }
}

fn outcome_counts(r: &RunResult) -> (u64, u64, u64) {
    let mut c = (0, 0, 0);
    for o in &r.ops {
        match o.outcome {
            Outcome::Ok { .. } => c.0 += 1,
            Outcome::Fail { .. } => c.1 += 1,
            Outcome::Unknown { .. } => c.2 += 1,
        }
    }
    c
}

/// The human-readable report.
pub fn text(r: &RunResult) -> String {
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for o in &r.ops {
        let row = rows
            .entry(o.fault.clone().unwrap_or_else(|| "(none)".into()))
            .or_default();
        row.ops += 1;
        match o.outcome {
            Outcome::Ok { .. } => row.ok += 1,
            Outcome::Fail { .. } => row.fail += 1,
            Outcome::Unknown { .. } => row.unknown += 1,
        }
    }
    let tally = fault_tally(r);
    for (f, t) in &tally {
        rows.entry((*f).to_owned()).or_default().faults += t.injected;
    }
    for v in &r.verdict.violations {
        let row = rows
            .entry(v.fault.clone().unwrap_or_else(|| "(none)".into()))
            .or_default();
        *row.violations.entry(v.kind.name()).or_default() += 1;
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "seed {} · {:.0} s · ack {} · {} engines{}",
        r.options.seed,
        r.duration_s,
        ack_name(r.options.ack),
        r.options.engines,
        r.options
            .plant
            .as_ref()
            .map(|p| format!(" · planted bug {p}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "{:<12} {:>8} {:>8} {:>8} {:>8} {:>7}  violations",
        "fault", "ops", "ok", "fail", "unknown", "faults"
    );
    for (name, row) in &rows {
        let v: Vec<String> = row
            .violations
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<12} {:>8} {:>8} {:>8} {:>8} {:>7}  {}",
            name,
            row.ops,
            row.ok,
            row.fail,
            row.unknown,
            row.faults,
            if v.is_empty() {
                "-".into()
            } else {
                v.join(" ")
            }
        );
    }
    let _ = writeln!(
        out,
        "{:<12} {:>9} {:>8} {:>7} {:>12}",
        "fault", "attempted", "injected", "landed", "ops in force"
    );
    for (f, t) in &tally {
        let _ = writeln!(
            out,
            "{:<12} {:>9} {:>8} {:>7} {:>12}",
            f, t.attempted, t.injected, t.landed, t.ops_in_force
        );
    }
    let _ = writeln!(out, "checker:");
    for k in Kind::ALL {
        let n = r.verdict.counts.get(k).copied().unwrap_or(0);
        let k = *k;
        let note = if Verdict::must_be_zero(k, r.options.ack) {
            ""
        } else {
            "  (measured: the price of ack = leader)"
        };
        let _ = writeln!(out, "  {:<26} {n}{note}", k.name());
    }
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &r.verdict.violations {
        let n = shown.entry(v.kind.name()).or_default();
        *n += 1;
        if *n > SHOWN_PER_KIND {
            continue;
        }
        let _ = writeln!(out, "violation {}: {}", v.kind.name(), v.detail);
        for l in v.lines.iter().take(8) {
            if let Some(line) = r.history.line(*l) {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    for why in vacuous(r) {
        let _ = writeln!(out, "tested nothing: {why}");
    }
    let _ = writeln!(
        out,
        "{}",
        if !vacuous(r).is_empty() {
            "NOT A TEST (exit 2)"
        } else if r.verdict.valid(r.options.ack) {
            "VALID"
        } else {
            "INVALID"
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::history::{FaultWindow, History, OpRecord, Phase};
    use super::super::nemesis::Fault;
    use super::super::protocol::{OkValue, Op, Outcome};
    use super::super::{Options, RunResult};
    use super::*;

    fn run(faults: Vec<Fault>, windows: Vec<FaultWindow>, confirmed: bool) -> RunResult {
        let outcome = if confirmed {
            Outcome::Ok {
                value: OkValue::Order {
                    order_id: "s~0~a".into(),
                    bucket: 0,
                },
            }
        } else {
            Outcome::fail("sold_out")
        };
        RunResult {
            options: Options {
                seed: 1,
                duration: std::time::Duration::from_secs(60),
                ack: flashsale::Ack::Replicated,
                faults,
                engines: 2,
                plant: None,
                history: None,
            },
            duration_s: 60.0,
            ops: vec![OpRecord {
                id: 1,
                process: 0,
                op: Op::Purchase {
                    sku: "s".into(),
                    user: "u".into(),
                    rid: "r".into(),
                    qty: 1,
                },
                outcome,
                invoke_ms: 10,
                complete_ms: 20,
                phase: Phase::Run,
                fault: None,
                lines: (1, 2),
                failover_risk: false,
            }],
            faults: Vec::new(),
            windows,
            verdict: Verdict::default(),
            history: Arc::new(History::new()),
        }
    }

    fn window(fault: &str, injected: bool, landed: bool) -> FaultWindow {
        FaultWindow {
            fault: fault.into(),
            start_ms: 0,
            end_ms: 100,
            injected,
            landed,
            detail: String::new(),
            skus: None,
        }
    }

    #[test]
    fn a_run_that_tested_nothing_says_why() {
        let all_in = run(
            vec![Fault::Kill, Fault::Flush],
            vec![window("kill", true, true), window("flush", true, false)],
            true,
        );
        assert!(vacuous(&all_in).is_empty(), "{:?}", vacuous(&all_in));
        let tally = fault_tally(&all_in);
        assert_eq!((tally["kill"].injected, tally["kill"].ops_in_force), (1, 1));

        let nothing_confirmed = run(Vec::new(), Vec::new(), false);
        assert_eq!(vacuous(&nothing_confirmed).len(), 1);

        let flush_failed = run(
            vec![Fault::Kill, Fault::Flush],
            vec![window("kill", true, true), window("flush", false, false)],
            true,
        );
        assert!(vacuous(&flush_failed)[0].contains("flush"));

        let kill_at_nothing = run(vec![Fault::Kill], vec![window("kill", true, false)], true);
        assert!(vacuous(&kill_at_nothing)[0].contains("never landed"));
    }
}
