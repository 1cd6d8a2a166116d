//! What a run prints: a table per fault kind (operations, outcomes, faults
//! injected, violations), each violation with the history lines that prove
//! it, and the `--json` summary.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::json;

use super::checker::{Verdict, KINDS};
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

/// The summary as the `--json` file holds it.
pub fn json(r: &RunResult) -> serde_json::Value {
    let (ok, fail, unknown) = outcome_counts(r);
    let faults: BTreeMap<&str, u64> = r.faults.iter().map(|(f, n)| (f.name(), *n)).collect();
    let violations: BTreeMap<&str, u64> = KINDS
        .iter()
        .map(|k| (*k, r.verdict.counts.get(k).copied().unwrap_or(0)))
        .collect();
    let evidence: Vec<serde_json::Value> = r
        .verdict
        .violations
        .iter()
        .take(50)
        .map(|v| {
            json!({
                "kind": v.kind,
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
        "by_op": by_op(r),
        "order_states": r.verdict.order_states,
        "expiry_lag_ms": lag_summary(&r.verdict.expiry_lag_ms),
        "violations": violations,
        "must_be_zero": KINDS.iter().filter(|k| Verdict::must_be_zero(k, r.options.ack)).collect::<Vec<_>>(),
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
    for (f, n) in &r.faults {
        rows.entry(f.name().to_owned()).or_default().faults += n;
    }
    for v in &r.verdict.violations {
        let row = rows
            .entry(v.fault.clone().unwrap_or_else(|| "(none)".into()))
            .or_default();
        *row.violations.entry(v.kind).or_default() += 1;
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
    let _ = writeln!(out, "checker:");
    for k in KINDS {
        let n = r.verdict.counts.get(k).copied().unwrap_or(0);
        let note = if Verdict::must_be_zero(k, r.options.ack) {
            ""
        } else {
            "  (measured: the price of ack = leader)"
        };
        let _ = writeln!(out, "  {k:<26} {n}{note}");
    }
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &r.verdict.violations {
        let n = shown.entry(v.kind).or_default();
        *n += 1;
        if *n > SHOWN_PER_KIND {
            continue;
        }
        let _ = writeln!(out, "violation {}: {}", v.kind, v.detail);
        for l in v.lines.iter().take(8) {
            if let Some(line) = r.history.line(*l) {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    let _ = writeln!(
        out,
        "{}",
        if r.verdict.valid(r.options.ack) {
            "VALID"
        } else {
            "INVALID"
        }
    );
    out
}
