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
}

/// Names of the counts, in report order.
pub const KINDS: [&str; 15] = [
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
    /// then a new purchase), are the measured price of the mode.
    pub fn must_be_zero(kind: &str, ack: flashsale::Ack) -> bool {
        !(ack == flashsale::Ack::Leader
            && matches!(
                kind,
                "lost_confirmed" | "orphan_orders" | "failover_duplicates" | "lost_restocks"
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

    check_stock(&mut v, inp);
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
        let sold: u64 = rows.iter().map(|r| r.qty).sum::<u64>() + unwritten;
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
            for r in &rows {
                *per_user.entry(r.user.as_str()).or_default() += r.qty;
            }
            for (user, units) in per_user {
                if units > u64::from(plan.limit) {
                    let ops: Vec<&OpRecord> = inp
                        .ops
                        .iter()
                        .filter(|o| matches!(&o.op, Op::Purchase { sku: s, user: u, .. } if s == sku && u == user))
                        .filter(|o| order_id(o).is_some())
                        .collect();
                    v.add(
                        "limit_exceeded",
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
