//! The recorded history of a run: every operation as an `invoke` line and a
//! completion line (`ok`, `fail` or `unknown`), and every fault as nemesis
//! lines, in the order they happened, as JSONL. The checker reads the typed
//! records; a violation cites the lines that prove it.

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use super::protocol::{OkValue, Op, Outcome};

/// When an operation ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// While the workload and the nemesis ran.
    Run,
    /// After healing: resending what ended `unknown` until it is decided.
    Final,
}

/// One operation, from invoke to completion.
#[derive(Debug, Clone)]
pub struct OpRecord {
    /// Operation id.
    pub id: u64,
    /// The engine process it went to.
    pub process: usize,
    /// What was asked.
    pub op: Op,
    /// What came back.
    pub outcome: Outcome,
    /// Milliseconds since the run started, at invoke and at completion.
    pub invoke_ms: u64,
    /// See `invoke_ms`.
    pub complete_ms: u64,
    /// Run or final.
    pub phase: Phase,
    /// The fault in force when it was invoked, if any.
    pub fault: Option<String>,
    /// Line numbers (from 1) of its invoke and completion lines.
    pub lines: (usize, usize),
    /// In flight while a master was killed or paused (set by the checker
    /// from the fault windows): under `ack = leader` a failover may have
    /// taken its writes back.
    pub failover_risk: bool,
}

impl OpRecord {
    /// The sale an operation of a sale names.
    pub fn op_sku(&self) -> Option<&str> {
        match &self.op {
            Op::Purchase { sku, .. }
            | Op::Restock { sku, .. }
            | Op::Close { sku }
            | Op::Status { sku } => Some(sku),
            _ => None,
        }
    }
}

/// The history, shared by every task of the controller.
pub struct History {
    start: Instant,
    start_unix_ms: i64,
    lines: Mutex<Vec<String>>,
    ops: Mutex<Vec<OpRecord>>,
    fault: Mutex<Option<String>>,
    windows: Mutex<Vec<FaultWindow>>,
}

/// One fault the nemesis tried: when (history ms) and whether it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultWindow {
    /// The fault's `--faults` name.
    pub fault: String,
    /// When it started and when it was healed.
    pub start_ms: u64,
    /// See `start_ms`.
    pub end_ms: u64,
    /// It was injected (an attempt that failed is kept, as not injected).
    pub injected: bool,
    /// It landed where it was aimed (a kill with confirmations at risk, a
    /// lock pause that froze a process holding or taking a lock, a
    /// cut while the writer held a batch); false for a fault not aimed.
    pub landed: bool,
    /// What the nemesis said of it.
    pub detail: String,
    /// The sales with a bucket on the master it stopped (`kill`,
    /// `pause`): the only ones whose writes a failover it caused can take
    /// back. None: not aimed at one master.
    pub skus: Option<Vec<String>>,
}

impl History {
    /// An empty history starting now.
    pub fn new() -> History {
        History {
            start: Instant::now(),
            start_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            lines: Mutex::new(Vec::new()),
            ops: Mutex::new(Vec::new()),
            fault: Mutex::new(None),
            windows: Mutex::new(Vec::new()),
        }
    }

    /// The wall clock at the start (ms since the Unix epoch): a history
    /// time `t_ms` is at about `start_unix_ms + t_ms`.
    pub fn start_unix_ms(&self) -> i64 {
        self.start_unix_ms
    }

    /// Milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn push(&self, mut line: serde_json::Value) -> usize {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let n = lines.len() + 1;
        line["line"] = json!(n);
        lines.push(line.to_string());
        n
    }

    /// Records an invoke; returns its line and the fault in force.
    pub fn invoke(&self, id: u64, process: usize, op: &Op) -> (usize, u64, Option<String>) {
        let t = self.now_ms();
        let fault = self.current_fault();
        let line = self.push(json!({
            "t_ms": t, "process": process, "type": "invoke", "id": id, "op": op,
        }));
        (line, t, fault)
    }

    /// Records a completion and the whole operation.
    #[allow(clippy::too_many_arguments)]
    pub fn complete(
        &self,
        id: u64,
        process: usize,
        op: Op,
        outcome: Outcome,
        invoke: (usize, u64, Option<String>),
        phase: Phase,
    ) -> OpRecord {
        let t = self.now_ms();
        let kind = match &outcome {
            Outcome::Ok { .. } => "ok",
            Outcome::Fail { .. } => "fail",
            Outcome::Unknown { .. } => "unknown",
        };
        let line = self.push(json!({
            "t_ms": t, "process": process, "type": kind, "id": id, "outcome": outcome,
        }));
        let rec = OpRecord {
            id,
            process,
            op,
            outcome,
            invoke_ms: invoke.1,
            complete_ms: t,
            phase,
            fault: invoke.2,
            lines: (invoke.0, line),
            failover_risk: false,
        };
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(rec.clone());
        rec
    }

    /// Records a nemesis event and sets the fault in force (`None` when healed).
    pub fn nemesis(&self, fault: &str, phase: &str, detail: &str) {
        let t = self.now_ms();
        self.push(json!({
            "t_ms": t, "process": "nemesis", "type": "info", "fault": fault,
            "phase": phase, "detail": detail,
        }));
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = match phase {
            "start" => Some(fault.to_owned()),
            _ => None,
        };
    }

    /// Records the end of the fault that started at `start_ms`: whether it
    /// was injected and landed where it was aimed.
    pub fn fault_window(
        &self,
        fault: &str,
        start_ms: u64,
        injected: bool,
        landed: bool,
        detail: &str,
        skus: Option<Vec<String>>,
    ) {
        let w = FaultWindow {
            fault: fault.to_owned(),
            start_ms,
            end_ms: self.now_ms(),
            injected,
            landed,
            detail: detail.to_owned(),
            skus,
        };
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(w);
    }

    /// Every fault tried so far.
    pub fn fault_windows(&self) -> Vec<FaultWindow> {
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a note from the controller (a reconcile, a stock sample).
    pub fn info(&self, what: &str, detail: serde_json::Value) -> usize {
        let t = self.now_ms();
        self.push(json!({
            "t_ms": t, "process": "controller", "type": "info", "what": what, "detail": detail,
        }))
    }

    /// The fault in force now.
    pub fn current_fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every completed operation so far.
    pub fn ops(&self) -> Vec<OpRecord> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many purchases of a bucket in `buckets` (sale, index) were both
    /// asked and confirmed at or after `since_ms`.
    pub fn orders_confirmed_since(&self, since_ms: u64, buckets: &[(String, u32)]) -> usize {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        // Completions are pushed nearly, not strictly, in time order (the
        // time is read before the lock): look a second further back.
        ops.iter()
            .rev()
            .take_while(|o| o.complete_ms + 1000 >= since_ms)
            .filter(|o| o.invoke_ms >= since_ms)
            .filter(|o| match (&o.op, &o.outcome) {
                (
                    Op::Purchase { sku, .. },
                    Outcome::Ok {
                        value: OkValue::Order { bucket, .. },
                    },
                ) => buckets.iter().any(|(s, i)| s == sku && i == bucket),
                _ => false,
            })
            .count()
    }

    /// Line `n` (from 1).
    pub fn line(&self, n: usize) -> Option<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(n.wrapping_sub(1))
            .cloned()
    }

    /// Writes every line to `path`.
    pub fn write_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for l in self.lines.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            writeln!(f, "{l}")?;
        }
        f.flush()
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}
