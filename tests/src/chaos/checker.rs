//! The checker: after every fault is healed, every `unknown` resent until
//! decided and the writer drained, it holds the recorded history against
//! what PostgreSQL and Redis hold, and counts each broken promise with the
//! history lines that prove it. It trusts nothing the engine says about
//! itself except where it checks exactly that (reconcile's verdict).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::history::{OpRecord, Phase};
use super::protocol::{OkValue, Op, Outcome};
use super::workload::SalePlan;

/// One order row in PostgreSQL.
#[derive(Debug, Clone)]
pub struct DbOrder {
    /// Order id.
    pub order_id: String,
    /// SKU.
    pub sku: String,
    /// Buyer.
    pub user: String,
    /// Units.
    pub qty: u64,
    /// `held`, `paid`, `cancelled` or `expired`.
    pub status: String,
    /// The payment reference of a paid order of a sale with holds.
    pub payment_ref: Option<String>,
    /// The deadline of a held order (ms since the Unix epoch).
    pub expires_ms: Option<i64>,
    /// The order's version (1, plus one per transition).
    pub version: i32,
    /// When it was paid (a held order), by the master's clock.
    pub paid_ms: Option<i64>,
    /// When it expired, by the master's clock.
    pub expired_ms: Option<i64>,
    /// When it was made, by the master's clock.
    pub created_ms: Option<i64>,
}

/// One transition in PostgreSQL's `order_events`.
#[derive(Debug, Clone)]
pub struct DbEvent {
    /// `paid`, `cancelled` or `expired`.
    pub kind: String,
    /// A late payment that took units back from stock.
    pub retake: bool,
    /// When, by the master's clock (ms since the Unix epoch).
    pub at_ms: Option<i64>,
}

impl DbOrder {
    /// True when the order keeps its units (not cancelled, not expired).
    pub fn keeps_units(&self) -> bool {
        matches!(self.status.as_str(), "held" | "paid")
    }
}

/// One SKU's side of the ledger in Redis at the end of a run.
#[derive(Debug, Clone, Default)]
pub struct EndLedger {
    /// Units ever put in (creation plus restocks), by Redis' count.
    pub initial: u64,
    /// Each bucket's stock.
    pub stocks: Vec<i64>,
    /// Orders still in the buckets' streams: (order id, units).
    pub in_streams: Vec<(String, u64)>,
    /// Transitions still in the buckets' streams: (order id, version).
    pub events_in_streams: Vec<(String, i32)>,
    /// What holds left behind.
    pub left: HoldsLeft,
}

/// What a SKU's holds left in Redis at the end.
#[derive(Debug, Clone, Default)]
pub struct HoldsLeft {
    /// Orders whose quota another bucket still owes back.
    pub owed: u64,
    /// Deadline index entries more than a second overdue.
    pub overdue_in_index: u64,
    /// Entries in the dead-letter streams.
    pub dead_letters: u64,
    /// Each buyer's quota, summed over the buckets (sales with a limit).
    pub quotas: BTreeMap<String, i64>,
    /// Purchases still walking other buckets (pending fall-throughs).
    pub pending_walks: u64,
}

/// What the checker reads besides the history.
pub struct Inputs<'a> {
    /// Every operation.
    pub ops: &'a [OpRecord],
    /// The sales as created.
    pub sales: &'a [SalePlan],
    /// Per SKU, what Redis holds at the end.
    pub end: &'a BTreeMap<String, EndLedger>,
    /// Every order in PostgreSQL.
    pub rows: &'a [DbOrder],
    /// Per SKU, reconcile's verdict at the end.
    pub reconcile: &'a BTreeMap<String, bool>,
    /// Stock keys seen below zero while the run went on (detail, line).
    pub negative_samples: &'a [(String, usize)],
    /// The ack mode of the run.
    pub ack: flashsale::Ack,
    /// Every transition in PostgreSQL: (order id, version).
    pub db_events: &'a HashMap<(String, i32), DbEvent>,
    /// The history's start by the wall clock (ms since the Unix epoch), to
    /// set its times beside the masters' (the same machine's clock).
    pub history_start_ms: i64,
    /// The state and version of each held order's record still in Redis.
    pub redis_states: &'a HashMap<String, (String, i32)>,
    /// When the checker's reads were made (ms since the Unix epoch): every
    /// hold whose deadline is well before it must have ended.
    pub checked_at_ms: i64,
}

/// Names of the counts, in report order.
pub const KINDS: [&str; 29] = [
    "oversold_units",
    "lost_confirmed",
    "unwritten_orders",
    "ledger_unbalanced",
    "duplicate_orders",
    "request_answer_changed",
    "failover_duplicates",
    "limit_exceeded",
    "reconcile_wrong",
    "negative_stock",
    "orphan_orders",
    "unresolved",
    "lock_token_regressed",
    "restock_overapplied",
    "lost_restocks",
    "transition_lost",
    "transition_conflict",
    "transition_answer_changed",
    "late_payment_accepted",
    "refused_in_time",
    "expired_early",
    "hold_deadline_wrong",
    "unwritten_transitions",
    "dead_letters",
    "holds_not_expired",
    "order_state_mismatch",
    "quota_mismatch",
    "transition_failover",
    "limit_after_failover",
];

/// One broken promise and its proof.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which count it adds to.
    pub kind: &'static str,
    /// What is wrong.
    pub detail: String,
    /// History lines that prove it.
    pub lines: Vec<usize>,
    /// The fault in force when the first cited operation was invoked.
    pub fault: Option<String>,
}

/// The checker's findings.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Count per kind (every kind present).
    pub counts: BTreeMap<&'static str, u64>,
    /// Each violation.
    pub violations: Vec<Violation>,
    /// Orders in PostgreSQL by final status (`paid`, `expired`, ...).
    pub order_states: BTreeMap<String, u64>,
    /// Each expiry's lag, deadline to expired (ms, sorted).
    pub expiry_lag_ms: Vec<i64>,
}

impl Verdict {
    fn add(&mut self, kind: &'static str, n: u64, detail: String, ops: &[&OpRecord]) {
        if n == 0 {
            return;
        }
        *self.counts.entry(kind).or_default() += n;
        let mut lines: Vec<usize> = ops.iter().flat_map(|o| [o.lines.0, o.lines.1]).collect();
        lines.sort_unstable();
        lines.dedup();
        self.violations.push(Violation {
            kind,
            detail,
            lines,
            fault: ops.first().and_then(|o| o.fault.clone()),
        });
    }

    /// The kinds that must be zero for the run to be valid under `ack`:
    /// under `leader`, lost confirmations, and the second orders and changed
    /// answers of requests whose record a failover took back (a retry is
    /// then a new purchase), are the measured price of the mode; so are,
    /// for orders touched while a master was killed or paused, a payment or
    /// cancel a failover took back (`transition_failover`), and, for buyers
    /// who bought, paid or cancelled then, a quota a failover parted from
    /// their orders (`limit_after_failover`; README: what `ack = leader`
    /// does not guarantee).
    pub fn must_be_zero(kind: &str, ack: flashsale::Ack) -> bool {
        !(ack == flashsale::Ack::Leader
            && matches!(
                kind,
                "lost_confirmed"
                    | "orphan_orders"
                    | "failover_duplicates"
                    | "lost_restocks"
                    | "transition_failover"
                    | "limit_after_failover"
            ))
    }

    /// True when every count that must be zero is zero.
    pub fn valid(&self, ack: flashsale::Ack) -> bool {
        self.counts
            .iter()
            .all(|(k, n)| *n == 0 || !Verdict::must_be_zero(k, ack))
    }
}

type Key<'a> = (&'a str, &'a str, &'a str);

/// Runs every check.
pub fn check(inp: &Inputs<'_>) -> Verdict {
    let mut v = Verdict::default();
    for k in KINDS {
        v.counts.insert(k, 0);
    }
    let in_db: HashMap<&str, &DbOrder> =
        inp.rows.iter().map(|r| (r.order_id.as_str(), r)).collect();
    let leader = inp.ack == flashsale::Ack::Leader;

    // Purchases per request key, and every order id an answer named.
    let mut by_key: BTreeMap<Key<'_>, Vec<&OpRecord>> = BTreeMap::new();
    let mut answered: HashMap<&str, Vec<&OpRecord>> = HashMap::new();
    for o in inp.ops {
        if let Op::Purchase { sku, user, rid, .. } = &o.op {
            by_key.entry((sku, user, rid)).or_default().push(o);
            if let Some(id) = order_id(o) {
                answered.entry(id).or_default().push(o);
            }
        }
    }

    // No lost confirmation: every order an `ok` named is in PostgreSQL. One
    // still in a stream after draining is the writer's failure, whatever the
    // ack mode; one gone from Redis too was taken back by a failover (the
    // price of `ack = leader`, a violation under `replicated`).
    let in_streams: HashSet<&str> = inp
        .end
        .values()
        .flat_map(|e| e.in_streams.iter().map(|(id, _)| id.as_str()))
        .collect();
    for (id, ops) in &answered {
        if in_db.contains_key(id) {
            continue;
        }
        if in_streams.contains(id) {
            v.add(
                "unwritten_orders",
                1,
                format!("order {id} was confirmed, is still in its stream, and never reached PostgreSQL"),
                ops,
            );
        } else {
            v.add(
                "lost_confirmed",
                1,
                format!("order {id} was confirmed but is not in PostgreSQL"),
                ops,
            );
        }
    }
    // One order answers one request: never a second request's answer.
    for (id, ops) in &answered {
        let keys: HashSet<Key<'_>> = ops
            .iter()
            .filter_map(|o| match &o.op {
                Op::Purchase { sku, user, rid, .. } => {
                    Some((sku.as_str(), user.as_str(), rid.as_str()))
                }
                _ => None,
            })
            .collect();
        if keys.len() > 1 {
            v.add(
                "request_answer_changed",
                (keys.len() - 1) as u64,
                format!(
                    "order {id} was the answer to {} different requests",
                    keys.len()
                ),
                ops,
            );
        }
    }
    // A status read never shows stock below zero.
    for o in inp.ops {
        if let (
            Op::Status { sku },
            Outcome::Ok {
                value: OkValue::Status { remaining },
            },
        ) = (&o.op, &o.outcome)
        {
            if *remaining < 0 {
                v.add(
                    "negative_stock",
                    1,
                    format!("{sku}: a status read showed {remaining} units left"),
                    &[o],
                );
            }
        }
    }

    for (key, ops) in &by_key {
        check_request(&mut v, key, ops, &in_db, leader);
    }

    // Every order in PostgreSQL belongs to a request whose answer named it.
    for r in inp.rows {
        if !answered.contains_key(r.order_id.as_str()) {
            let near: Vec<&OpRecord> = by_key
                .iter()
                .filter(|((s, u, _), _)| *s == r.sku && *u == r.user)
                .flat_map(|(_, ops)| ops.iter().copied())
                .filter(|o| matches!(o.outcome, Outcome::Unknown { .. }))
                .collect();
            v.add(
                "orphan_orders",
                1,
                format!(
                    "order {} ({} x{} for {}) is in PostgreSQL but no answer named it",
                    r.order_id, r.sku, r.qty, r.user
                ),
                &near,
            );
        }
    }

    for r in inp.rows {
        *v.order_states.entry(r.status.clone()).or_default() += 1;
    }
    check_stock(&mut v, inp);
    check_transitions(&mut v, inp, &in_db);
    check_locks(&mut v, inp.ops);
    v
}

fn order_id(o: &OpRecord) -> Option<&str> {
    match &o.outcome {
        Outcome::Ok {
            value: OkValue::Order { order_id, .. },
        } => Some(order_id),
        _ => None,
    }
}

fn qty_of(o: &OpRecord) -> u32 {
    match o.op {
        Op::Purchase { qty, .. } => qty,
        _ => 0,
    }
}

/// One request key: one order, the same answer every time, and decided.
fn check_request(
    v: &mut Verdict,
    key: &Key<'_>,
    ops: &[&OpRecord],
    in_db: &HashMap<&str, &DbOrder>,
    leader: bool,
) {
    let (sku, user, rid) = *key;
    // Under `leader` a confirmation may be lost with its record; its retry
    // is then a new purchase. Only orders that survived are compared.
    let oks: Vec<&OpRecord> = ops
        .iter()
        .copied()
        .filter(|o| order_id(o).is_some_and(|id| !leader || in_db.contains_key(id)))
        .collect();
    let ids: HashSet<&str> = oks.iter().filter_map(|o| order_id(o)).collect();
    // Under `leader`, a request confirmed while a master was failing over
    // may lose its record with the failover: counted apart, as the price.
    let failover = leader
        && oks
            .iter()
            .any(|o| matches!(o.fault.as_deref(), Some("kill" | "pause")));
    let (changed, duplicate) = if failover {
        ("failover_duplicates", "failover_duplicates")
    } else {
        ("request_answer_changed", "duplicate_orders")
    };
    if ids.len() > 1 {
        v.add(
            changed,
            (ids.len() - 1) as u64,
            format!(
                "request ({sku}, {user}, {rid}) was confirmed as {} different orders",
                ids.len()
            ),
            &oks,
        );
    }
    let stored = ids.iter().filter(|id| in_db.contains_key(*id)).count();
    if stored > 1 {
        v.add(
            duplicate,
            (stored - 1) as u64,
            format!("request ({sku}, {user}, {rid}) has {stored} orders in PostgreSQL"),
            &oks,
        );
    }
    for o in &oks {
        if let Some(row) = order_id(o).and_then(|id| in_db.get(id)) {
            if row.user != user || row.sku != sku || row.qty != u64::from(qty_of(o)) {
                v.add(
                    "request_answer_changed",
                    1,
                    format!(
                        "request ({sku}, {user}, {rid}) x{} was answered with order {} of ({}, {}) x{}",
                        qty_of(o), row.order_id, row.sku, row.user, row.qty
                    ),
                    &[o],
                );
            }
        }
    }
    // A confirmed request is never refused afterwards with the same qty. (A
    // refusal followed by a confirmation is allowed: refusals of a sold-out
    // bucket are not recorded, so a retry after a restock is a new try.)
    // Under `leader`, a record lost in a failover makes the retry a new
    // purchase, which may be refused: the mode's price, counted apart.
    for f in ops
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Fail { .. }))
    {
        if let Some(ok) = oks
            .iter()
            .find(|o| qty_of(o) == qty_of(f) && o.complete_ms < f.invoke_ms)
        {
            v.add(
                changed,
                1,
                format!("request ({sku}, {user}, {rid}) was confirmed and also refused"),
                &[ok, f],
            );
        }
    }
    // Every `unknown` was decided by a later resend.
    let last = ops
        .iter()
        .max_by_key(|o| (o.phase == Phase::Final, o.complete_ms));
    if let Some(last) = last {
        if matches!(last.outcome, Outcome::Unknown { .. }) && oks.is_empty() {
            let decided = ops
                .iter()
                .any(|o| matches!(o.outcome, Outcome::Fail { .. }) && qty_of(o) == qty_of(last));
            if !decided {
                v.add(
                    "unresolved",
                    1,
                    format!("request ({sku}, {user}, {rid}) is still unknown after healing"),
                    &[last],
                );
            }
        }
    }
}

/// Oversell, per-user limits, negative stock and reconcile's verdict.
fn check_stock(v: &mut Verdict, inp: &Inputs<'_>) {
    let restocked = applied_restocks(inp.ops);
    let excused = failover_excused(inp);
    for plan in inp.sales {
        let sku = plan.sku.as_str();
        let rows: Vec<&DbOrder> = inp.rows.iter().filter(|r| r.sku == sku).collect();
        let end = inp.end.get(sku).cloned().unwrap_or_default();
        // Orders the writer has not written (still in a stream, not in
        // PostgreSQL) are units sold too.
        let db_ids: HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
        let unwritten: u64 = end
            .in_streams
            .iter()
            .filter(|(id, _)| !db_ids.contains(id.as_str()))
            .map(|(_, q)| q)
            .sum();
        // Cancelled and expired orders gave their units back.
        let sold: u64 = rows
            .iter()
            .filter(|r| r.keeps_units())
            .map(|r| r.qty)
            .sum::<u64>()
            + unwritten;
        let (confirmed, maybe) = restocked.get(sku).copied().unwrap_or((0, 0));
        // A restock that ended `unknown` and was refused on resend (the
        // sale closed meanwhile) may still have been applied.
        let allowed = plan.stock + maybe;
        let (initial, stocks) = (end.initial, end.stocks);
        let existed = allowed.min(initial);
        if initial > allowed {
            v.add(
                "restock_overapplied",
                initial - allowed,
                format!(
                    "{sku}: Redis counts {initial} units put on sale; created {} plus restocks that may have applied {maybe}",
                    plan.stock
                ),
                &[],
            );
        }
        if initial < plan.stock + confirmed {
            v.add(
                "lost_restocks",
                1,
                format!(
                    "{sku}: Redis counts {initial} units put on sale; created {} plus confirmed restocks {confirmed}",
                    plan.stock
                ),
                &[],
            );
        }
        if sold > existed {
            v.add(
                "oversold_units",
                sold - existed,
                format!(
                    "{sku}: {sold} units in orders, {allowed} put on sale ({initial} by Redis' count)"
                ),
                &[],
            );
        }
        if plan.limit > 0 {
            let mut per_user: BTreeMap<&str, u64> = BTreeMap::new();
            for r in rows.iter().filter(|r| r.keeps_units()) {
                *per_user.entry(r.user.as_str()).or_default() += r.qty;
            }
            for (user, units) in per_user {
                if units > u64::from(plan.limit) {
                    // Under `leader`, a failover can take back a cancel
                    // whose quota was already given back in another bucket.
                    let kind = if inp.ack == flashsale::Ack::Leader && excused(sku, user) {
                        "limit_after_failover"
                    } else {
                        "limit_exceeded"
                    };
                    let ops: Vec<&OpRecord> = inp
                        .ops
                        .iter()
                        .filter(|o| matches!(&o.op, Op::Purchase { sku: s, user: u, .. } if s == sku && u == user))
                        .filter(|o| order_id(o).is_some())
                        .collect();
                    v.add(
                        kind,
                        1,
                        format!(
                            "{sku}: {user} holds {units} units, the limit is {}",
                            plan.limit
                        ),
                        &ops,
                    );
                }
            }
        }
        for (i, s) in stocks.iter().enumerate() {
            if *s < 0 {
                v.add(
                    "negative_stock",
                    1,
                    format!("{sku}: bucket {i} ends with stock {s}"),
                    &[],
                );
            }
        }
        let remaining: i64 = stocks.iter().sum();
        let balanced = initial as i64 == remaining + sold as i64;
        if !balanced {
            v.add(
                "ledger_unbalanced",
                1,
                format!(
                    "{sku}: {initial} units put in, {remaining} left, {sold} in orders ({unwritten} of them only in streams)"
                ),
                &[],
            );
        }
        if let Some(&said) = inp.reconcile.get(sku) {
            if said != balanced {
                v.add(
                    "reconcile_wrong",
                    1,
                    format!(
                        "{sku}: reconcile said conserved={said}; initial {initial}, remaining {remaining}, in orders {sold} ({unwritten} only in streams)"
                    ),
                    &[],
                );
            }
        }
    }
    for (detail, line) in inp.negative_samples {
        *v.counts.entry("negative_stock").or_default() += 1;
        v.violations.push(Violation {
            kind: "negative_stock",
            detail: detail.clone(),
            lines: vec![*line],
            fault: None,
        });
    }
}

/// True when `o` was sent while a fault that fails a master over (`kill`,
/// `pause`) was in force: under `ack = leader` its write may be taken back.
fn at_risk(o: &OpRecord) -> bool {
    matches!(o.fault.as_deref(), Some("kill" | "pause"))
}

/// A payment's reference and its answer's `retaken`, when it was `ok`.
fn pay_ok(o: &OpRecord) -> Option<(&str, bool)> {
    match (&o.op, &o.outcome) {
        (
            Op::Pay { payment_ref, .. },
            Outcome::Ok {
                value: OkValue::Transition { retaken, .. },
            },
        ) => Some((payment_ref, *retaken)),
        _ => None,
    }
}

fn fail_code(o: &OpRecord) -> Option<&str> {
    match &o.outcome {
        Outcome::Fail { code } => Some(code),
        _ => None,
    }
}

/// Payments and cancels of held orders, and the hold records themselves.
/// Per order, from the history: every `ok` stuck (PostgreSQL ends with the
/// order paid under the reference that paid it, or cancelled, or retaken
/// after the cancel by a late payment); no order is paid under two
/// references, or cancelled after it was paid, or (where late payments are
/// refused) both; a retry never gets another answer than its first `ok`; a
/// retake happens only where the sale allows it and before its close. From
/// PostgreSQL and Redis: no payment after the deadline where late payments
/// are refused, no expiry before the deadline, every transition written
/// (versions 2..v, nothing dead-lettered), no hold outlives its deadline,
/// Redis' record matches PostgreSQL's, and each buyer's quota equals the
/// units they keep.
fn check_transitions(v: &mut Verdict, inp: &Inputs<'_>, in_db: &HashMap<&str, &DbOrder>) {
    let leader = inp.ack == flashsale::Ack::Leader;
    let plans: HashMap<&str, &SalePlan> = inp.sales.iter().map(|s| (s.sku.as_str(), s)).collect();
    let mut by_order: BTreeMap<&str, Vec<&OpRecord>> = BTreeMap::new();
    let mut closed_at: HashMap<&str, u64> = HashMap::new();
    for o in inp.ops {
        match &o.op {
            Op::Pay { order_id, .. } | Op::Cancel { order_id } => {
                by_order.entry(order_id).or_default().push(o);
            }
            Op::Close { sku } if matches!(o.outcome, Outcome::Ok { .. }) => {
                let t = closed_at.entry(sku).or_insert(o.complete_ms);
                *t = (*t).min(o.complete_ms);
            }
            _ => {}
        }
    }
    let mut events: HashMap<&str, Vec<&DbEvent>> = HashMap::new();
    for ((id, _), e) in inp.db_events {
        events.entry(id).or_default().push(e);
    }
    for (id, ops) in &by_order {
        let Some(row) = in_db.get(id) else { continue };
        let Some(plan) = plans.get(row.sku.as_str()) else {
            continue;
        };
        let order = OrderFacts {
            row,
            plan,
            events: events.get(id).map(Vec::as_slice).unwrap_or_default(),
            closed_at: closed_at.get(row.sku.as_str()).copied(),
            history_start_ms: inp.history_start_ms,
        };
        check_order(v, &order, ops, leader);
    }
    check_hold_records(v, inp, &plans, leader);
    check_quotas(v, inp, leader);
}

/// What the checker knows of one order besides its operations.
struct OrderFacts<'a> {
    row: &'a DbOrder,
    plan: &'a SalePlan,
    /// Its transitions in PostgreSQL.
    events: &'a [&'a DbEvent],
    /// When its sale's close completed (history ms), if it did.
    closed_at: Option<u64>,
    history_start_ms: i64,
}

/// One order's payments and cancels against each other and its row.
fn check_order(v: &mut Verdict, f: &OrderFacts<'_>, ops: &[&OpRecord], leader: bool) {
    let (row, plan) = (f.row, f.plan);
    let id = row.order_id.as_str();
    let retake = plan.late == flashsale::LatePayment::Retake;
    // Under `leader`, a failover may take back any of this order's writes.
    let excused = |kind: &'static str| {
        if leader && ops.iter().any(|o| at_risk(o)) {
            "transition_failover"
        } else {
            kind
        }
    };
    let pays: Vec<(&OpRecord, &str, bool)> = ops
        .iter()
        .filter_map(|o| pay_ok(o).map(|(r, t)| (*o, r, t)))
        .collect();
    let cancels: Vec<&OpRecord> = ops
        .iter()
        .copied()
        .filter(|o| matches!(o.op, Op::Cancel { .. }) && matches!(o.outcome, Outcome::Ok { .. }))
        .collect();
    let refs: HashSet<&str> = pays.iter().map(|(_, r, _)| *r).collect();
    let pay_ops: Vec<&OpRecord> = pays.iter().map(|(o, _, _)| *o).collect();
    if refs.len() > 1 {
        v.add(
            excused("transition_conflict"),
            (refs.len() - 1) as u64,
            format!(
                "order {id} was paid under {} different payment references",
                refs.len()
            ),
            &pay_ops,
        );
    }
    let paid_as_answered =
        row.status == "paid" && row.payment_ref.as_deref().is_some_and(|r| refs.contains(r));
    if !pays.is_empty() && !paid_as_answered {
        v.add(
            excused("transition_lost"),
            1,
            format!(
                "order {id}: a payment was answered ok, PostgreSQL has it {} (payment ref {:?})",
                row.status, row.payment_ref
            ),
            &pay_ops,
        );
    }
    let cancel_stuck = row.status == "cancelled" || (retake && row.status == "paid");
    if !cancels.is_empty() && !cancel_stuck {
        v.add(
            excused("transition_lost"),
            1,
            format!(
                "order {id}: a cancel was answered ok, PostgreSQL has it {}",
                row.status
            ),
            &cancels,
        );
    }
    // Paid is final: no cancel succeeds after a payment did; and where late
    // payments are refused, a cancelled order is never paid.
    for c in &cancels {
        let before = pays.iter().find(|(p, _, _)| p.complete_ms < c.invoke_ms);
        let both = pays.first().filter(|_| !retake);
        if let Some((p, _, _)) = before.or(both) {
            v.add(
                excused("transition_conflict"),
                1,
                format!("order {id} was answered both paid and cancelled"),
                &[p, c],
            );
            break;
        }
    }
    // A retry answers as the first `ok` did.
    for f in ops.iter().filter(|o| fail_code(o).is_some()) {
        let code = fail_code(f).unwrap_or_default();
        let changed = match &f.op {
            Op::Pay { payment_ref, .. } => pays
                .iter()
                .find(|(p, r, _)| r == payment_ref && p.complete_ms < f.invoke_ms)
                .map(|(p, _, _)| *p),
            Op::Cancel { .. } if code == "already_final" => {
                // Under retake, a late payment may have paid it since.
                let paid_since = retake
                    && ops
                        .iter()
                        .any(|o| matches!(o.op, Op::Pay { .. }) && o.invoke_ms < f.complete_ms);
                cancels
                    .iter()
                    .find(|c| c.complete_ms < f.invoke_ms)
                    .filter(|_| !paid_since)
                    .copied()
            }
            _ => None,
        };
        if let Some(first) = changed {
            v.add(
                excused("transition_answer_changed"),
                1,
                format!(
                    "order {id}: a retry was refused ({code}) after the same call was answered ok"
                ),
                &[first, f],
            );
        }
    }
    // A retake (units taken back from stock, by PostgreSQL's record) only
    // where the sale allows it, and only while it sells.
    let retook = f.events.iter().any(|e| e.retake);
    for (p, _, retaken) in &pays {
        let after_close = f.closed_at.is_some_and(|t| t < p.invoke_ms);
        if *retaken && retook && (!retake || after_close) {
            v.add(
                "late_payment_accepted",
                1,
                format!(
                    "order {id}: a late payment retook units {}",
                    if retake {
                        "after the sale closed"
                    } else {
                        "where late payments are refused"
                    }
                ),
                &[p],
            );
        }
    }
    if retook && !retake {
        v.add(
            "late_payment_accepted",
            1,
            format!("order {id}: PostgreSQL records a retake where late payments are refused"),
            &[],
        );
    }
    // Refusals answered before the deadline (by the one clock of this
    // machine): a payment refused as late though no cancel ended the hold,
    // a cancel refused as final though no payment did.
    let deadline = row.expires_ms.unwrap_or(i64::MAX);
    let had = |kind: &str| f.events.iter().any(|e| e.kind == kind);
    for o in ops {
        let done_at = f.history_start_ms + o.complete_ms as i64;
        if done_at + 50 >= deadline {
            continue;
        }
        let wrong = match (&o.op, fail_code(o)) {
            (Op::Pay { .. }, Some("hold_expired")) => !had("cancelled"),
            (Op::Cancel { .. }, Some("already_final")) => !had("paid"),
            _ => false,
        };
        if wrong {
            v.add(
                excused("refused_in_time"),
                1,
                format!(
                    "order {id}: {} refused {} ms before its deadline",
                    o.op.name(),
                    deadline - done_at
                ),
                &[o],
            );
        }
    }
}

/// Every held order's row and record: deadlines kept, transitions written,
/// Redis and PostgreSQL agreeing, nothing dead-lettered.
fn check_hold_records(
    v: &mut Verdict,
    inp: &Inputs<'_>,
    plans: &HashMap<&str, &SalePlan>,
    leader: bool,
) {
    let mut risky: HashSet<&str> = HashSet::new();
    for o in inp.ops.iter().filter(|o| at_risk(o)) {
        match &o.op {
            Op::Pay { order_id, .. } | Op::Cancel { order_id } => {
                risky.insert(order_id);
            }
            _ => {
                if let Some(id) = order_id(o) {
                    risky.insert(id);
                }
            }
        }
    }
    let mut lags = Vec::new();
    let mut missing_versions = 0u64;
    let mut first_missing = None;
    for r in inp.rows {
        let Some(plan) = plans.get(r.sku.as_str()).filter(|p| p.hold_ms > 0) else {
            continue;
        };
        let deadline = r.expires_ms.unwrap_or(i64::MAX);
        if let (Some(made), Some(due)) = (r.created_ms, r.expires_ms) {
            if due - made != plan.hold_ms as i64 {
                v.add(
                    "hold_deadline_wrong",
                    1,
                    format!(
                        "order {}: held {} ms, the sale's window is {} ms",
                        r.order_id,
                        due - made,
                        plan.hold_ms
                    ),
                    &[],
                );
            }
        }
        if plan.late == flashsale::LatePayment::Refuse
            && r.status == "paid"
            && r.paid_ms.is_some_and(|t| t >= deadline)
        {
            v.add(
                "late_payment_accepted",
                1,
                format!(
                    "order {} was paid {} ms after its deadline; late payments are refused",
                    r.order_id,
                    r.paid_ms.unwrap_or(0) - deadline
                ),
                &[],
            );
        }
        if let Some(t) = r.expired_ms {
            if t < deadline {
                v.add(
                    "expired_early",
                    1,
                    format!(
                        "order {} expired {} ms before its deadline",
                        r.order_id,
                        deadline - t
                    ),
                    &[],
                );
            }
            lags.push(t - deadline);
        }
        for version in 2..=r.version {
            if !inp.db_events.contains_key(&(r.order_id.clone(), version)) {
                missing_versions += 1;
                first_missing.get_or_insert((r.order_id.clone(), version));
            }
        }
        if r.status == "held" && r.expires_ms.is_some_and(|e| e + 5_000 < inp.checked_at_ms) {
            v.add(
                "holds_not_expired",
                1,
                format!(
                    "order {} is still held {} ms past its deadline",
                    r.order_id,
                    inp.checked_at_ms - deadline
                ),
                &[],
            );
        }
        if let Some((state, version)) = inp.redis_states.get(&r.order_id) {
            if *state != r.status || *version != r.version {
                let kind = if leader && risky.contains(r.order_id.as_str()) {
                    "transition_failover"
                } else {
                    "order_state_mismatch"
                };
                v.add(
                    kind,
                    1,
                    format!(
                        "order {}: Redis has it {state} (version {version}), PostgreSQL {} (version {})",
                        r.order_id, r.status, r.version
                    ),
                    &[],
                );
            }
        }
    }
    if let Some((id, version)) = first_missing {
        v.add(
            "unwritten_transitions",
            missing_versions,
            format!("{missing_versions} transitions are missing from order_events (first: order {id} version {version})"),
            &[],
        );
    }
    let unwritten: Vec<&(String, i32)> = inp
        .end
        .values()
        .flat_map(|e| e.events_in_streams.iter())
        .filter(|e| !inp.db_events.contains_key(*e))
        .collect();
    if let Some((id, version)) = unwritten.first() {
        v.add(
            "unwritten_transitions",
            unwritten.len() as u64,
            format!(
                "{} transitions are in their streams and never reached PostgreSQL (first: order {id} version {version})",
                unwritten.len()
            ),
            &[],
        );
    }
    let dead: u64 = inp.end.values().map(|e| e.left.dead_letters).sum();
    v.add(
        "dead_letters",
        dead,
        format!("{dead} stream entries were dead-lettered, never written"),
        &[],
    );
    lags.sort_unstable();
    v.expiry_lag_ms = lags;
}

/// Under `ack = leader`, whether a buyer's quota or limit may have been
/// parted from their orders by a failover: they bought, paid or cancelled
/// while a master was killed or paused. (A failover that undid only a
/// sweeper's expiry is not in the history; it is not excused.)
fn failover_excused<'a>(inp: &'a Inputs<'_>) -> impl Fn(&str, &str) -> bool + 'a {
    let owner: HashMap<&str, (&str, &str)> = inp
        .rows
        .iter()
        .map(|r| (r.order_id.as_str(), (r.sku.as_str(), r.user.as_str())))
        .collect();
    let mut risky: HashSet<(&str, &str)> = HashSet::new();
    for o in inp.ops.iter().filter(|o| at_risk(o)) {
        match &o.op {
            Op::Purchase { sku, user, .. } => {
                risky.insert((sku, user));
            }
            Op::Pay { order_id, .. } | Op::Cancel { order_id } => {
                if let Some(k) = owner.get(order_id.as_str()) {
                    risky.insert(*k);
                }
            }
            _ => {}
        }
    }
    move |sku: &str, user: &str| risky.contains(&(sku, user))
}

/// Each buyer's quota in a sale with a limit equals the units they keep,
/// once nothing is pending or owed.
fn check_quotas(v: &mut Verdict, inp: &Inputs<'_>, leader: bool) {
    let excused = failover_excused(inp);
    for plan in inp.sales.iter().filter(|p| p.limit > 0) {
        let Some(end) = inp.end.get(&plan.sku) else {
            continue;
        };
        let mut kept: BTreeMap<&str, i64> = BTreeMap::new();
        for r in inp
            .rows
            .iter()
            .filter(|r| r.sku == plan.sku && r.keeps_units())
        {
            *kept.entry(&r.user).or_default() += r.qty as i64;
        }
        for (user, quota) in &end.left.quotas {
            let units = kept.get(user.as_str()).copied().unwrap_or(0);
            if *quota == units {
                continue;
            }
            let kind = if leader && excused(&plan.sku, user) {
                "limit_after_failover"
            } else {
                "quota_mismatch"
            };
            v.add(
                kind,
                1,
                format!(
                    "{}: {user}'s quota counts {quota} units, they keep {units}",
                    plan.sku
                ),
                &[],
            );
        }
    }
}

/// Units added per SKU by restocks: (confirmed, confirmed or undecided at
/// some point), each operation id counted once.
fn applied_restocks(ops: &[OpRecord]) -> HashMap<String, (u64, u64)> {
    let mut confirmed = HashSet::new();
    let mut maybe = HashSet::new();
    let mut out: HashMap<String, (u64, u64)> = HashMap::new();
    for o in ops {
        if let Op::Restock { sku, qty, op_id } = &o.op {
            let e = out.entry(sku.clone()).or_default();
            match o.outcome {
                Outcome::Ok { .. } => {
                    if confirmed.insert(op_id.clone()) {
                        e.0 += qty;
                    }
                    if maybe.insert(op_id.clone()) {
                        e.1 += qty;
                    }
                }
                Outcome::Unknown { .. } => {
                    if maybe.insert(op_id.clone()) {
                        e.1 += qty;
                    }
                }
                Outcome::Fail { .. } => {}
            }
        }
    }
    out
}

/// Fencing tokens only grow: a grant that began after another grant ended
/// has a larger token.
fn check_locks(v: &mut Verdict, ops: &[OpRecord]) {
    let mut grants: Vec<(&OpRecord, u64)> = ops
        .iter()
        .filter_map(|o| match (&o.op, &o.outcome) {
            (
                Op::Lock { .. },
                Outcome::Ok {
                    value: OkValue::Lock { token, .. },
                },
            ) => Some((o, *token)),
            _ => None,
        })
        .collect();
    let mut by_end = grants.clone();
    by_end.sort_by_key(|(o, _)| o.complete_ms);
    grants.sort_by_key(|(o, _)| o.invoke_ms);
    let mut i = 0;
    let mut highest: Option<(&OpRecord, u64)> = None;
    for (b, token) in grants {
        while i < by_end.len() && by_end[i].0.complete_ms < b.invoke_ms {
            if highest.is_none_or(|(_, t)| by_end[i].1 > t) {
                highest = Some(by_end[i]);
            }
            i += 1;
        }
        if let Some((a, t)) = highest {
            if t >= token {
                v.add(
                    "lock_token_regressed",
                    1,
                    format!("a grant with token {token} began after a grant with token {t} ended"),
                    &[a, b],
                );
            }
        }
    }
}
