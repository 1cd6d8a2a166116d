//! The checker: after every fault is healed, every `unknown` resent until
//! decided and the writer drained, it holds the recorded history against
//! what PostgreSQL and Redis hold, and counts each broken promise with the
//! history lines that prove it. It trusts nothing the engine says about
//! itself except where it checks exactly that (reconcile's verdict).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::history::{FaultWindow, OpRecord, Phase};
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
    /// Units ever put in each bucket (creation plus restocks), by Redis'
    /// count: `initial` bucket by bucket.
    pub bucket_initials: Vec<u64>,
    /// Each bucket's share of each restock (operation id -> units), by
    /// Redis' record in the bucket's sale hash.
    pub bucket_restocks: Vec<BTreeMap<String, u64>>,
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
    /// Every fault the nemesis tried, with its window.
    pub fault_windows: &'a [FaultWindow],
}

/// How long before a kill or pause began a write may still be lost with
/// it: the replica may not have received what the master confirmed just
/// before the link was cut.
const RISK_LEAD_MS: u64 = 1_000;

/// Marks the operations in flight while a master was killed or paused
/// (from [`RISK_LEAD_MS`] before the fault began to its heal): the only
/// ones whose writes a failover may take back, and so the only ones
/// `ack = leader` excuses.
fn mark_risk(ops: &[OpRecord], windows: &[FaultWindow]) -> Vec<OpRecord> {
    let failovers: Vec<(u64, u64, Option<&[String]>)> = windows
        .iter()
        .filter(|w| w.injected && matches!(w.fault.as_str(), "kill" | "pause"))
        .map(|w| {
            let on_master = w.skus.as_deref();
            (w.start_ms.saturating_sub(RISK_LEAD_MS), w.end_ms, on_master)
        })
        .collect();
    ops.iter()
        .map(|o| {
            let mut o = o.clone();
            // From the windows only: the fault named at invoke is the one
            // started, which may have failed to inject. And only for a
            // sale with a bucket on the master stopped (a failover takes
            // back nothing another master wrote; from the attack on the
            // checker: every operation in the window was excused, a third
            // of a 10-minute leader run's); an operation of no sale, or a
            // window not aimed at one master, as before.
            let sku = sku_of(&o.op);
            o.failover_risk = failovers.iter().any(|&(s, e, on_master)| {
                o.invoke_ms <= e
                    && o.complete_ms >= s
                    && match (on_master, sku) {
                        (Some(skus), Some(sku)) => skus.iter().any(|x| x == sku),
                        _ => true,
                    }
            });
            o
        })
        .collect()
}

/// The sale an operation acts on: named, or the first part of its order
/// id (`<sku>~<bucket>~<nonce>`); None for a lock.
fn sku_of(op: &Op) -> Option<&str> {
    match op {
        Op::Purchase { sku, .. }
        | Op::Restock { sku, .. }
        | Op::Close { sku }
        | Op::Status { sku } => Some(sku),
        Op::Pay { order_id, .. } | Op::Cancel { order_id } => order_id.rsplitn(3, '~').nth(2),
        Op::Lock { .. } => None,
    }
}

/// Declares [`Kind`]: every kind of violation, with the name reports and
/// the JSON use, in report order.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// Every kind of violation the checker names. Each has a unit test
        /// that shows it firing on a small history (`tests` below: the
        /// scenario table matches on this enum with no catch-all, so a kind
        /// added without its scenario does not compile).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($(#[$doc])* $variant,)*
        }

        impl Kind {
            /// Every kind, in report order.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            /// The kind's name in reports and JSON.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// More units in orders than were ever put in, at the end.
    OversoldUnits = "oversold_units",
    /// A confirmation whose order is in neither PostgreSQL nor a stream.
    LostConfirmed = "lost_confirmed",
    /// A confirmed order still in its stream after draining.
    UnwrittenOrders = "unwritten_orders",
    /// initial != remaining + units in orders.
    LedgerUnbalanced = "ledger_unbalanced",
    /// One request with two orders in PostgreSQL.
    DuplicateOrders = "duplicate_orders",
    /// One request answered differently (two orders, ok then refused,
    /// another request's order).
    RequestAnswerChanged = "request_answer_changed",
    /// Under `leader`, a request whose record a failover took back.
    FailoverDuplicates = "failover_duplicates",
    /// A buyer keeps more units than the per-user limit.
    LimitExceeded = "limit_exceeded",
    /// A purchase refused for the limit while the buyer kept fewer units.
    RefusedBelowLimit = "refused_below_limit",
    /// reconcile's verdict differs from the checker's sums.
    ReconcileWrong = "reconcile_wrong",
    /// reconcile gave no verdict for a sale.
    ReconcileSilent = "reconcile_silent",
    /// A stock key seen or left below zero.
    NegativeStock = "negative_stock",
    /// At a confirmation, more units confirmed so far than were put in by
    /// then (units given back by then counted as put in again).
    OversoldInTime = "oversold_in_time",
    /// The same, bucket by bucket: a bucket's confirmations against what
    /// was put in that bucket by then (its creation share, restock shares,
    /// units its orders gave back).
    BucketOversoldInTime = "bucket_oversold_in_time",
    /// An order in PostgreSQL no answer named.
    OrphanOrders = "orphan_orders",
    /// A request still `unknown` after healing.
    Unresolved = "unresolved",
    /// A purchase confirmed after its sale's close had completed.
    SoldAfterClose = "sold_after_close",
    /// A request first answered "sold out" while more units surely
    /// remained than its sale's buckets could hold in pieces too small for
    /// it (an undersell: a stock check off by one, a sold-out flag that a
    /// restock never clears).
    SoldOutWithStock = "sold_out_with_stock",
    /// A grant of a lock whose token is not above a grant of the same lock
    /// that ended before it began.
    LockTokenRegressed = "lock_token_regressed",
    /// Two holders of one lock inside their critical sections at once, both
    /// writing, without the earlier one's later write refused.
    LockOverlap = "lock_overlap",
    /// A waiter that was waiting when a holder gave the lock back inside
    /// its lease got in only once that lease was over, with no fault on the
    /// lock nodes and no other holder between: the release freed nothing,
    /// or woke no one.
    LockReleaseIgnored = "lock_release_ignored",
    /// Redis counts more units put in than creates and restocks add.
    RestockOverapplied = "restock_overapplied",
    /// A confirmed restock missing from Redis' count.
    LostRestocks = "lost_restocks",
    /// A payment or cancel answered ok that PostgreSQL does not show.
    TransitionLost = "transition_lost",
    /// An order paid under two references, or paid and cancelled.
    TransitionConflict = "transition_conflict",
    /// A transition's retry answered otherwise than its first `ok`.
    TransitionAnswerChanged = "transition_answer_changed",
    /// A payment accepted after the deadline where the sale refuses them.
    LatePaymentAccepted = "late_payment_accepted",
    /// A payment or cancel refused before the hold's deadline.
    RefusedInTime = "refused_in_time",
    /// A hold expired before its deadline.
    ExpiredEarly = "expired_early",
    /// A hold's deadline is not its sale's window after its creation.
    HoldDeadlineWrong = "hold_deadline_wrong",
    /// A transition missing from PostgreSQL's order_events.
    UnwrittenTransitions = "unwritten_transitions",
    /// Stream entries dead-lettered, never written.
    DeadLetters = "dead_letters",
    /// A hold still held well past its deadline.
    HoldsNotExpired = "holds_not_expired",
    /// Redis' order record and PostgreSQL's row disagree.
    OrderStateMismatch = "order_state_mismatch",
    /// An order of a sale with holds whose Redis record is gone, well
    /// inside its TTL (the request TTL): its state can no longer be kept.
    RecordMissing = "record_missing",
    /// A buyer's quota differs from the units they keep.
    QuotaMismatch = "quota_mismatch",
    /// Under `leader`, a transition a failover took back.
    TransitionFailover = "transition_failover",
    /// Under `leader`, a confirmation, an order's answer or a restock a
    /// failover took back (operations in flight during a kill or pause).
    FailoverLost = "failover_lost",
    /// Under `leader`, a quota a failover parted from its orders.
    LimitAfterFailover = "limit_after_failover",
}

/// Names of the counts, in report order.
pub fn kind_names() -> impl Iterator<Item = &'static str> {
    Kind::ALL.iter().map(|k| k.name())
}

/// One broken promise and its proof.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which count it adds to.
    pub kind: Kind,
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
    pub counts: BTreeMap<Kind, u64>,
    /// Each violation.
    pub violations: Vec<Violation>,
    /// Orders in PostgreSQL by final status (`paid`, `expired`, ...).
    pub order_states: BTreeMap<String, u64>,
    /// Each expiry's lag, deadline to expired (ms, sorted).
    pub expiry_lag_ms: Vec<i64>,
}

impl Verdict {
    fn add(&mut self, kind: Kind, n: u64, detail: String, ops: &[&OpRecord]) {
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

    /// The kinds that must be zero for the run to be valid under `ack`.
    /// Under `leader`, what a failover can take back is the measured price
    /// of the mode, and only that: the `failover_*` kinds and
    /// `limit_after_failover` count only writes of operations in flight
    /// while a master was killed or paused ([`Risk`]), never under any other
    /// fault or none (README: what `ack = leader` does not guarantee).
    pub fn must_be_zero(kind: Kind, ack: flashsale::Ack) -> bool {
        !(ack == flashsale::Ack::Leader
            && matches!(
                kind,
                Kind::FailoverLost
                    | Kind::FailoverDuplicates
                    | Kind::TransitionFailover
                    | Kind::LimitAfterFailover
            ))
    }

    /// True when every count that must be zero is zero.
    pub fn valid(&self, ack: flashsale::Ack) -> bool {
        self.counts
            .iter()
            .all(|(k, n)| *n == 0 || !Verdict::must_be_zero(*k, ack))
    }
}

type Key<'a> = (&'a str, &'a str, &'a str);

/// Runs every check.
pub fn check(inp: &Inputs<'_>) -> Verdict {
    let marked = mark_risk(inp.ops, inp.fault_windows);
    let inp = &Inputs {
        ops: &marked,
        ..*inp
    };
    let mut v = Verdict::default();
    for k in Kind::ALL {
        v.counts.insert(*k, 0);
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
                Kind::UnwrittenOrders,
                1,
                format!("order {id} was confirmed, is still in its stream, and never reached PostgreSQL"),
                ops,
            );
        } else {
            let kind = if leader && ops.iter().any(|o| at_risk(o)) {
                Kind::FailoverLost
            } else {
                Kind::LostConfirmed
            };
            v.add(
                kind,
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
                Kind::RequestAnswerChanged,
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
                    Kind::NegativeStock,
                    1,
                    format!("{sku}: a status read showed {remaining} units left"),
                    &[o],
                );
            }
        }
    }

    let multi_bucket: HashSet<&str> = inp
        .sales
        .iter()
        .filter(|s| s.buckets > 1)
        .map(|s| s.sku.as_str())
        .collect();
    for (key, ops) in &by_key {
        check_request(&mut v, key, ops, &in_db, leader);
        if multi_bucket.contains(key.0) {
            check_refusal_final(&mut v, key, ops, leader);
        }
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
            let kind = if leader && near.iter().any(|o| at_risk(o)) {
                Kind::FailoverLost
            } else {
                Kind::OrphanOrders
            };
            v.add(
                kind,
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
    check_over_time(&mut v, inp, &in_db, &in_streams);
    check_sold_out_refusals(&mut v, inp, &by_key, &in_db);
    check_transitions(&mut v, inp, &in_db);
    check_locks(&mut v, inp);
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

/// In a sale of more than one bucket a refusal for stock that came from
/// Redis' scripts is settled into the request's record (`settle.lua`), and
/// every retry replays it: the request is never confirmed after it, even
/// once a restock came in. (A refusal from the engine's sold-out flag is
/// not recorded, and the worker marks which is which; a one-bucket sale
/// records no refusal.) Under `leader` a refusal in flight while its
/// master failed over may lose its record: counted apart.
fn check_refusal_final(v: &mut Verdict, key: &Key<'_>, ops: &[&OpRecord], leader: bool) {
    let (sku, user, rid) = *key;
    let settled = ops.iter().filter(
        |o| matches!(&o.outcome, Outcome::Fail { code, from_scripts: true } if code == "sold_out"),
    );
    for f in settled {
        let later_ok = ops.iter().find(|o| {
            order_id(o).is_some() && qty_of(o) == qty_of(f) && o.invoke_ms > f.complete_ms
        });
        if let Some(ok) = later_ok {
            let kind = if leader && at_risk(f) {
                Kind::FailoverDuplicates
            } else {
                Kind::RequestAnswerChanged
            };
            v.add(
                kind,
                1,
                format!(
                    "request ({sku}, {user}, {rid}) of a multi-bucket sale was refused as sold out, then confirmed"
                ),
                &[f, ok],
            );
            return;
        }
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
    // Only the earliest confirmation can have lost its record (a later one
    // is the retry that found none): that one must have been at risk.
    let failover = leader
        && oks
            .iter()
            .min_by_key(|o| o.complete_ms)
            .is_some_and(|o| at_risk(o));
    let (changed, duplicate) = if failover {
        (Kind::FailoverDuplicates, Kind::FailoverDuplicates)
    } else {
        (Kind::RequestAnswerChanged, Kind::DuplicateOrders)
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
                    Kind::RequestAnswerChanged,
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
        // A refusal before the last `unknown` decides nothing: the retry
        // that ended unknown may have bought (a restock came in between).
        if matches!(last.outcome, Outcome::Unknown { .. }) && oks.is_empty() {
            v.add(
                Kind::Unresolved,
                1,
                format!("request ({sku}, {user}, {rid}) is still unknown after healing"),
                &[last],
            );
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
        let (initial, stocks) = (end.initial, end.stocks.clone());
        let existed = allowed.min(initial);
        if initial > allowed {
            v.add(
                Kind::RestockOverapplied,
                initial - allowed,
                format!(
                    "{sku}: Redis counts {initial} units put on sale; created {} plus restocks that may have applied {maybe}",
                    plan.stock
                ),
                &[],
            );
        }
        if initial < plan.stock + confirmed {
            let risky_restock = inp.ack == flashsale::Ack::Leader
                && inp.ops.iter().any(|o| {
                    at_risk(o)
                        && matches!(o.outcome, Outcome::Ok { .. })
                        && matches!(&o.op, Op::Restock { sku: s, .. } if s == sku)
                });
            v.add(
                if risky_restock {
                    Kind::FailoverLost
                } else {
                    Kind::LostRestocks
                },
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
                Kind::OversoldUnits,
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
                        Kind::LimitAfterFailover
                    } else {
                        Kind::LimitExceeded
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
                    Kind::NegativeStock,
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
                Kind::LedgerUnbalanced,
                1,
                format!(
                    "{sku}: {initial} units put in, {remaining} left, {sold} in orders ({unwritten} of them only in streams)"
                ),
                &[],
            );
        }
        check_buckets(v, sku, &end, &rows, &db_ids);
        let Some(&said) = inp.reconcile.get(sku) else {
            v.add(
                Kind::ReconcileSilent,
                1,
                format!("{sku}: reconcile gave no verdict"),
                &[],
            );
            continue;
        };
        {
            if said != balanced {
                v.add(
                    Kind::ReconcileWrong,
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
        *v.counts.entry(Kind::NegativeStock).or_default() += 1;
        v.violations.push(Violation {
            kind: Kind::NegativeStock,
            detail: detail.clone(),
            lines: vec![*line],
            fault: None,
        });
    }
}

/// Each bucket's own ledger: units put in it = units left in it + units its
/// orders keep (an order's id names the bucket that took its units, and a
/// cancel, an expiry or a retake moves units in that bucket only). The
/// sale's sums can balance while one bucket sold units it never had and
/// another lost as many; this cannot. A bucket count missing, or an order
/// id that names no bucket of the sale, is reported, not skipped.
fn check_buckets(
    v: &mut Verdict,
    sku: &str,
    end: &EndLedger,
    rows: &[&DbOrder],
    db_ids: &HashSet<&str>,
) {
    let n = end.stocks.len();
    if end.bucket_initials.len() != n {
        v.add(
            Kind::LedgerUnbalanced,
            1,
            format!(
                "{sku}: units put in are known for {} of its {n} buckets",
                end.bucket_initials.len()
            ),
            &[],
        );
        return;
    }
    let mut kept = vec![0u64; n];
    let mut unrouted = Vec::new();
    let units = rows
        .iter()
        .filter(|r| r.keeps_units())
        .map(|r| (r.order_id.as_str(), r.qty))
        .chain(
            end.in_streams
                .iter()
                .filter(|(id, _)| !db_ids.contains(id.as_str()))
                .map(|(id, q)| (id.as_str(), *q)),
        );
    for (id, qty) in units {
        let bucket = bucket_of(id)
            .filter(|(s, _)| *s == sku)
            .and_then(|(_, b)| kept.get_mut(b));
        match bucket {
            Some(k) => *k += qty,
            None => unrouted.push(id.to_owned()),
        }
    }
    for id in unrouted {
        v.add(
            Kind::LedgerUnbalanced,
            1,
            format!("{sku}: order {id} names no bucket of the sale"),
            &[],
        );
    }
    for (b, ((put, left), sold)) in end
        .bucket_initials
        .iter()
        .zip(&end.stocks)
        .zip(&kept)
        .enumerate()
    {
        if *put as i64 != left + *sold as i64 {
            v.add(
                Kind::LedgerUnbalanced,
                1,
                format!("{sku}: bucket {b}: {put} units put in, {left} left, {sold} in its orders"),
                &[],
            );
        }
    }
}

/// The sale and bucket an order id names (`<sku>~<bucket>~<nonce>`, see
/// `flashsale::order_id`; the nonce is not checked here).
fn bucket_of(order_id: &str) -> Option<(&str, usize)> {
    let mut parts = order_id.rsplitn(3, '~');
    let _nonce = parts.next()?;
    let bucket = parts.next()?.parse().ok()?;
    Some((parts.next()?, bucket))
}

/// What the end-of-run sums cannot see: at every confirmation, the units
/// taken so far never exceed the units that could have been put in by then
/// (creates, restocks asked for before it, units given back by cancels
/// asked for and expiries recorded before it), so a sale that went below
/// zero and was covered by a later restock is still caught; no purchase
/// is confirmed after its sale's close completed; and no purchase is
/// refused for the per-user limit while the buyer could not have reached
/// it (every request of theirs that might have bought, counted whole).
fn check_over_time(
    v: &mut Verdict,
    inp: &Inputs<'_>,
    in_db: &HashMap<&str, &DbOrder>,
    in_streams: &HashSet<&str>,
) {
    // Each order's transitions in PostgreSQL.
    let mut events_of: HashMap<&str, Vec<&DbEvent>> = HashMap::new();
    for ((id, _), e) in inp.db_events {
        events_of.entry(id.as_str()).or_default().push(e);
    }
    // Orders a late payment took units back for, by PostgreSQL's record.
    let retaken_orders: HashSet<&str> = inp
        .db_events
        .iter()
        .filter(|(_, e)| e.kind == "paid" && e.retake)
        .map(|((order, _), _)| order.as_str())
        .collect();
    for plan in inp.sales {
        let sku = plan.sku.as_str();
        let real = |id: &str| in_db.contains_key(id) || in_streams.contains(id);
        // (time, units): units possibly put in or given back, by when first
        // asked (a replay may complete before the attempt that did it).
        let mut supply: Vec<(u64, u64)> = vec![(0, plan.stock)];
        let mut restock_ids = HashSet::new();
        // The first send of a cancel that did not fail, per order.
        let mut cancel_sent: HashMap<&str, u64> = HashMap::new();
        let mut first_asked: HashMap<String, u64> = HashMap::new();
        for o in inp.ops {
            let key = match &o.op {
                Op::Restock { op_id, .. } => format!("r:{op_id}"),
                Op::Cancel { order_id } => format!("c:{order_id}"),
                _ => continue,
            };
            let t = first_asked.entry(key).or_insert(o.invoke_ms);
            *t = (*t).min(o.invoke_ms);
        }
        let asked = |key: String, at: u64| first_asked.get(&key).copied().unwrap_or(at);
        let retook = |id: &str| retaken_orders.contains(id);
        // (time, units, op, order): units surely taken, by when answered.
        let mut taken: Vec<(u64, u64, &OpRecord, &str)> = Vec::new();
        // (time, units, order): units given back, by when first asked.
        let mut returned: Vec<(u64, u64, &str)> = Vec::new();
        let mut seen_orders = HashSet::new();
        let mut retakes_seen = HashSet::new();
        let mut closed_at: Option<u64> = None;
        for o in inp.ops {
            match (&o.op, &o.outcome) {
                (Op::Restock { sku: s, qty, op_id }, outcome)
                    if s == sku
                        && !matches!(outcome, Outcome::Fail { .. })
                        && restock_ids.insert(op_id) =>
                {
                    supply.push((asked(format!("r:{op_id}"), o.invoke_ms), *qty));
                }
                (Op::Cancel { order_id }, outcome) => {
                    let ours = in_db.get(order_id.as_str()).is_some_and(|r| r.sku == sku);
                    if ours && !matches!(outcome, Outcome::Fail { .. }) {
                        cancel_sent
                            .entry(order_id.as_str())
                            .or_insert_with(|| asked(format!("c:{order_id}"), o.invoke_ms));
                    }
                }
                (Op::Close { sku: s }, Outcome::Ok { .. }) if s == sku => {
                    closed_at = Some(closed_at.map_or(o.complete_ms, |t| t.min(o.complete_ms)));
                }
                (
                    Op::Purchase { sku: s, qty, .. },
                    Outcome::Ok {
                        value: OkValue::Order { order_id, .. },
                    },
                ) if s == sku && real(order_id) && seen_orders.insert(order_id.as_str()) => {
                    // From when its master made it (plus a margin for two
                    // processes' clocks), if that was before the answer: a
                    // purchase that ended `unknown` is confirmed only by
                    // the resolve phase after the run, and its take counted
                    // there hid every oversell in between (from the attack
                    // on the per-bucket check).
                    let made = in_db
                        .get(order_id.as_str())
                        .and_then(|r| r.created_ms)
                        .map(|at| (at - inp.history_start_ms).max(0) as u64 + 50);
                    let at = made.map_or(o.complete_ms, |m| m.min(o.complete_ms));
                    taken.push((at, u64::from(*qty), o, order_id.as_str()));
                }
                (Op::Pay { order_id, .. }, _) => {
                    // A late payment took units again only when its hold
                    // had given them back, as PostgreSQL records (a hold
                    // past its deadline but not yet swept still had them,
                    // and its payment takes none); once per order, at its
                    // first payment whatever the answer: a retake whose
                    // answer was lost is answered by the replay with
                    // `retaken: false` (from the second attack on the
                    // over-time check), and took the units all the same.
                    // From when the master recorded it, else the answer.
                    if let Some(row) = in_db.get(order_id.as_str()) {
                        if row.sku == sku
                            && retook(order_id)
                            && retakes_seen.insert(order_id.as_str())
                        {
                            let recorded = events_of
                                .get(order_id.as_str())
                                .and_then(|es| es.iter().find(|e| e.kind == "paid" && e.retake))
                                .and_then(|e| e.at_ms)
                                .map(|at| (at - inp.history_start_ms).max(0) as u64 + 50);
                            let at = recorded.unwrap_or(o.complete_ms);
                            taken.push((at, row.qty, o, order_id.as_str()));
                        }
                    }
                }
                _ => {}
            }
        }
        // Units given back, once per order, and only where PostgreSQL shows
        // them given back: a cancel it records as cancelled, from the
        // cancel's first send; else an expiry, from when the master
        // recorded it (less a margin for two processes' clocks). A cancel
        // that failed, was taken back or came after the order had expired
        // (from the recorded leader run of seed 20261128: an `unknown`
        // cancel at 455 s hid an expiry at 16 s, a false `oversold_in_time`)
        // gives back nothing of its own.
        // A give-back counts no earlier than the take it undoes, and not at
        // all for an order whose take is not counted (never answered ok:
        // an orphan, reported as such): else it lends the sale units.
        let mut taken_at: HashMap<&str, u64> = HashMap::new();
        for (t, _, _, id) in &taken {
            let e = taken_at.entry(id).or_insert(*t);
            *e = (*e).min(*t);
        }
        for (id, row) in in_db.iter().filter(|(_, r)| r.sku == sku) {
            let Some(&took) = taken_at.get(id) else {
                continue;
            };
            let events = events_of.get(id).map(Vec::as_slice).unwrap_or_default();
            let recorded =
                |kind: &str| events.iter().find(|e| e.kind == kind).and_then(|e| e.at_ms);
            let cancelled =
                row.status == "cancelled" || events.iter().any(|e| e.kind == "cancelled");
            let by_master =
                |at: i64| ((at - inp.history_start_ms).max(0) as u64).saturating_sub(50);
            let at = match (cancelled, cancel_sent.get(id)) {
                (true, Some(sent)) => *sent,
                (true, None) => match recorded("cancelled") {
                    Some(at) => by_master(at),
                    None => continue,
                },
                (false, _) => match row.expired_ms.or_else(|| recorded("expired")) {
                    Some(at) => by_master(at),
                    None => continue,
                },
            };
            returned.push((at.max(took), row.qty, id));
        }
        supply.extend(returned.iter().map(|(t, q, _)| (*t, *q)));
        taken.sort_unstable_by_key(|(t, ..)| *t);
        let all: Vec<(u64, u64, &OpRecord)> =
            taken.iter().map(|(t, q, o, _)| (*t, *q, *o)).collect();
        if let Some((excess, o)) = first_excess(supply, &all) {
            v.add(
                Kind::OversoldInTime,
                excess,
                format!("{sku}: at this confirmation {excess} more units were taken than could have been put in by then"),
                &[o],
            );
        }
        if plan.buckets > 1 {
            if let Some(end) = inp.end.get(sku) {
                let restocked_at = |op: &str| asked(format!("r:{op}"), 0);
                check_buckets_over_time(v, sku, end, &taken, &returned, restocked_at);
            }
        }
        if let Some(closed) = closed_at {
            // A request first sent before the close may be confirmed after
            // it (a replay of what it bought): only one first sent after the
            // close must never be.
            let mut first_sent: HashMap<(&str, &str), u64> = HashMap::new();
            for o in inp.ops {
                if let Op::Purchase {
                    sku: s, user, rid, ..
                } = &o.op
                {
                    if s == sku {
                        let t = first_sent.entry((user, rid)).or_insert(o.invoke_ms);
                        *t = (*t).min(o.invoke_ms);
                    }
                }
            }
            let sent_after = |o: &OpRecord| match &o.op {
                Op::Purchase { user, rid, .. } => first_sent
                    .get(&(user.as_str(), rid.as_str()))
                    .is_some_and(|t| *t > closed),
                _ => false,
            };
            for (_, _, o, _) in taken.iter().filter(|(_, _, o, _)| sent_after(o)) {
                {
                    v.add(
                        Kind::SoldAfterClose,
                        1,
                        format!(
                            "{sku}: a purchase asked for after the close completed was confirmed"
                        ),
                        &[o],
                    );
                }
            }
        }
        if plan.limit > 0 {
            check_limit_refusals(v, inp, plan);
        }
    }
}

/// The largest excess of units taken over units put in, at any taking
/// (`taken` sorted by time): supply counts only what came strictly before.
fn first_excess<'a>(
    mut supply: Vec<(u64, u64)>,
    taken: &[(u64, u64, &'a OpRecord)],
) -> Option<(u64, &'a OpRecord)> {
    supply.sort_unstable_by_key(|(t, _)| *t);
    let (mut j, mut put_in, mut so_far) = (0, 0u64, 0u64);
    let mut worst: Option<(u64, &OpRecord)> = None;
    for (t, units, o) in taken {
        while j < supply.len() && supply[j].0 < *t {
            put_in += supply[j].1;
            j += 1;
        }
        so_far += units;
        if so_far > put_in && worst.is_none_or(|(w, _)| so_far - put_in > w) {
            worst = Some((so_far - put_in, o));
        }
    }
    worst
}

/// Issue 33, item 7, per bucket: the sale-wide count over time cannot see
/// a bucket that sold units it did not have while another bucket had them
/// spare, once a later restock of that bucket covered it (its ledger then
/// balances at the end). Each bucket's confirmations (its orders name it)
/// are held against what was put in that bucket by then: its share of the
/// creation, each restock's share as Redis recorded it (`op:<id>` in the
/// bucket's sale hash) from the restock's first send, and units its own
/// orders gave back. Without Redis' record of the shares (a history made
/// by hand), every restock counts in full from the start: looser, never
/// wrong. A record for some buckets only is reported, not skipped.
fn check_buckets_over_time(
    v: &mut Verdict,
    sku: &str,
    end: &EndLedger,
    taken: &[(u64, u64, &OpRecord, &str)],
    returned: &[(u64, u64, &str)],
    restocked_at: impl Fn(&str) -> u64,
) {
    let n = end.bucket_initials.len();
    if !end.bucket_restocks.is_empty() && end.bucket_restocks.len() != n {
        v.add(
            Kind::LedgerUnbalanced,
            1,
            format!(
                "{sku}: restocks per bucket are known for {} of its {n} buckets",
                end.bucket_restocks.len()
            ),
            &[],
        );
        return;
    }
    let in_bucket = |id: &str, b: usize| bucket_of(id).is_some_and(|(s, i)| s == sku && i == b);
    for (b, put_in) in end.bucket_initials.iter().enumerate() {
        let shares = end.bucket_restocks.get(b);
        let restocked: u64 = shares.map_or(0, |m| m.values().sum());
        let mut supply = vec![(0, put_in.saturating_sub(restocked))];
        for (op, units) in shares.into_iter().flatten() {
            supply.push((restocked_at(op), *units));
        }
        supply.extend(
            returned
                .iter()
                .filter(|(_, _, id)| in_bucket(id, b))
                .map(|(t, q, _)| (*t, *q)),
        );
        let mine: Vec<(u64, u64, &OpRecord)> = taken
            .iter()
            .filter(|(_, _, _, id)| in_bucket(id, b))
            .map(|(t, q, o, _)| (*t, *q, *o))
            .collect();
        if let Some((excess, o)) = first_excess(supply, &mine) {
            v.add(
                Kind::BucketOversoldInTime,
                excess,
                format!("{sku}: bucket {b}: at this confirmation {excess} more units were taken from it than could have been put in it by then"),
                &[o],
            );
        }
    }
}

/// How long an engine answers "sold out" from its own flag after it saw
/// its sale sold out: `sold_out_recheck_ms`, the default the chaos workers
/// run with, and a margin for the workers' clocks.
const SOLD_OUT_FLAG_MS: u64 = 500 + 100;

/// Refusal codes that say the purchase took nothing, for sure.
const TOOK_NOTHING: &[&str] = &[
    "sold_out",
    "limit_exceeded",
    "not_started",
    "ended",
    "closed",
    "unknown_sale",
    "invalid",
    "request_mismatch",
];

/// No request is first answered "sold out" while its sale surely had the
/// units. A request's answer is decided once (a replay after a restock
/// rightly repeats it), so only its first answer is judged, and only when
/// that answer came to its first attempt (an attempt that timed out may
/// leave the request to the sweeper, which closes it as refused whatever
/// the stock). Surely there: the units created, plus restocks answered
/// `ok` before the request was first sent (less the engine's sold-out flag
/// time; under `ack = leader` not one sent in a failover, which may be
/// lost). Surely not taken: every request of the sale first sent before
/// the refusal was answered counts whole unless it was refused for good,
/// and late payments that took units again count too; units given back
/// (cancels, expiries) count once surely back ([`units_given_back`]), from
/// the same horizon as restocks. A sale of n buckets may hold up to n * (qty - 1) units in
/// pieces too small for a purchase of qty: only more than that is a
/// violation.
fn check_sold_out_refusals(
    v: &mut Verdict,
    inp: &Inputs<'_>,
    by_key: &BTreeMap<Key<'_>, Vec<&OpRecord>>,
    in_db: &HashMap<&str, &DbOrder>,
) {
    let leader = inp.ack == flashsale::Ack::Leader;
    for plan in inp.sales {
        let sku = plan.sku.as_str();
        // Restocks surely applied, by when they were answered.
        let mut restocks: Vec<(u64, u64)> = Vec::new();
        let mut restock_ids = HashSet::new();
        for o in inp.ops {
            if let (Op::Restock { sku: s, qty, op_id }, Outcome::Ok { .. }) = (&o.op, &o.outcome) {
                if s == sku && !(leader && at_risk(o)) && restock_ids.insert(op_id) {
                    restocks.push((o.complete_ms, *qty));
                }
            }
        }
        // Each request of the sale: when first sent, its units, and
        // whether it surely took nothing: every answer a refusal, or (under
        // `replicated`, where no failover takes a record back) none
        // confirmed and one a refusal for stock from the scripts, which
        // are final in the request's record.
        let requests: Vec<(u64, u64, bool)> = by_key
            .iter()
            .filter(|((s, _, _), _)| *s == sku)
            .map(|(_, ops)| {
                let first = ops.iter().map(|o| o.invoke_ms).min().unwrap_or(0);
                let refused = |o: &&OpRecord| {
                    matches!(&o.outcome, Outcome::Fail { code, from_scripts: true } if code == "sold_out")
                };
                let nothing = ops
                    .iter()
                    .all(|o| fail_code(o).is_some_and(|c| TOOK_NOTHING.contains(&c)))
                    || (!leader && ops.iter().any(refused) && ops.iter().all(|o| order_id(o).is_none()));
                // The workload sends one id with another quantity too, and
                // either may reach Redis first: the larger is counted.
                let qty = ops.iter().map(|o| qty_of(o)).max().unwrap_or(0);
                (first, u64::from(qty), nothing)
            })
            .collect();
        let returns = units_given_back(inp, in_db, sku);
        let flags = FlagHistory::new(inp.ops, sku);
        let retakes: Vec<(u64, u64)> = inp
            .ops
            .iter()
            .filter_map(|o| match (&o.op, pay_ok(o)) {
                (Op::Pay { order_id, .. }, Some((_, true))) => in_db
                    .get(order_id.as_str())
                    .filter(|r| r.sku == sku)
                    .map(|r| (o.invoke_ms, r.qty)),
                _ => None,
            })
            .collect();
        let mut worst: Option<(u64, &OpRecord)> = None;
        for ((s, _, _), ops) in by_key.iter() {
            if *s != sku {
                continue;
            }
            let Some(first) = ops.iter().min_by_key(|o| o.invoke_ms) else {
                continue;
            };
            if fail_code(first) != Some("sold_out") {
                continue;
            }
            // An attempt pending as long as the engines' `pending_timeout`
            // may have been closed by the sweeper, which refuses where
            // nothing was decided, whatever the stock (`take.lua`'s
            // "refuse"): the price of settling abandoned requests.
            let took_ms = first.complete_ms.saturating_sub(first.invoke_ms);
            if took_ms + 100 >= super::topology::PENDING_TIMEOUT.as_millis() as u64 {
                continue;
            }
            let qty = u64::from(qty_of(first));
            let horizon = sold_out_horizon(&flags, first);
            let put_in = plan.stock
                + restocks
                    .iter()
                    .filter(|(t, _)| *t < horizon)
                    .map(|(_, q)| q)
                    .sum::<u64>()
                + returns
                    .iter()
                    .filter(|(t, _)| *t < horizon)
                    .map(|(_, q)| q)
                    .sum::<u64>();
            let taken: u64 = requests
                .iter()
                .filter(|(sent, _, nothing)| *sent < first.complete_ms && !nothing)
                .map(|(_, q, _)| q)
                .sum::<u64>()
                + retakes
                    .iter()
                    .filter(|(t, _)| *t < first.complete_ms)
                    .map(|(_, q)| q)
                    .sum::<u64>();
            let in_pieces = plan.buckets as u64 * qty.saturating_sub(1);
            let spare = put_in.saturating_sub(taken);
            if spare > in_pieces && worst.is_none_or(|(w, _)| spare > w) {
                worst = Some((spare, first));
            }
        }
        if let Some((spare, o)) = worst {
            v.add(
                Kind::SoldOutWithStock,
                1,
                format!(
                    "{sku}: a request was first answered sold out while at least {spare} units \
                     surely remained ({} buckets)",
                    plan.buckets
                ),
                &[o],
            );
        }
    }
}

/// Units of `sku`'s orders given back, once per order, by when they surely
/// were back: the answer of an `ok` cancel of an order PostgreSQL shows
/// cancelled (not one a failover may have taken back, under `leader`), or
/// the master's record of the cancel or expiry, whichever is earlier (the
/// master's time plus a margin for two processes' clocks).
fn units_given_back(
    inp: &Inputs<'_>,
    in_db: &HashMap<&str, &DbOrder>,
    sku: &str,
) -> Vec<(u64, u64)> {
    let leader = inp.ack == flashsale::Ack::Leader;
    let mut recorded: HashMap<&str, i64> = HashMap::new();
    let mut cancelled: HashSet<&str> = HashSet::new();
    for ((id, _), e) in inp.db_events {
        if e.kind == "cancelled" {
            cancelled.insert(id.as_str());
        }
        if let (true, Some(at)) = (matches!(e.kind.as_str(), "cancelled" | "expired"), e.at_ms) {
            let t = recorded.entry(id.as_str()).or_insert(at);
            *t = (*t).min(at);
        }
    }
    let mut answered: HashMap<&str, u64> = HashMap::new();
    for o in inp.ops {
        if let (Op::Cancel { order_id }, Outcome::Ok { .. }) = (&o.op, &o.outcome) {
            if !(leader && at_risk(o)) {
                let t = answered.entry(order_id.as_str()).or_insert(o.complete_ms);
                *t = (*t).min(o.complete_ms);
            }
        }
    }
    let by_master = |at: i64| ((at - inp.history_start_ms).max(0) as u64) + 50;
    in_db
        .iter()
        .filter(|(_, r)| r.sku == sku)
        .filter_map(|(id, r)| {
            let was_cancelled = r.status == "cancelled" || cancelled.contains(id);
            let by_answer = answered.get(id).copied().filter(|_| was_cancelled);
            let by_record = recorded
                .get(id)
                .copied()
                .or(r.expired_ms.filter(|_| r.status == "expired"))
                .map(by_master);
            let at = match (by_answer, by_record) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b)?,
            };
            Some((at, r.qty))
        })
        .collect()
}

/// Restocks answered before this time were in Redis when `refusal` was
/// decided. From the scripts: when it was sent (less the flag time, as a
/// margin). From the engine's sold-out flag (not marked as from the
/// scripts): the flag was set by a purchase of the same process that was
/// refused for stock and ended at most the flag time before; what that
/// purchase saw is the horizon, from when it was sent. No such purchase:
/// the flag was stale, and the refusal is judged as one from the scripts.
/// A process that gave units back itself (answered an `ok` cancel of the
/// sale's order, or an `ok` restock of it) cleared its flag then: only a
/// purchase that ended after that clear can have set it again, and with
/// none, the refusal came from the scripts, which saw everything given back
/// before it was sent (the attack on the checker: a flag a cancel does not
/// clear answered "sold out" for half a second over units just returned).
fn sold_out_horizon(flags: &FlagHistory, refusal: &OpRecord) -> u64 {
    let own = refusal.invoke_ms.saturating_sub(SOLD_OUT_FLAG_MS);
    if matches!(
        refusal.outcome,
        Outcome::Fail {
            from_scripts: true,
            ..
        }
    ) {
        return own;
    }
    let cleared = flags.cleared_before(refusal.process, refusal.invoke_ms);
    let lo = (refusal.invoke_ms.saturating_sub(SOLD_OUT_FLAG_MS)).max(cleared.unwrap_or(0));
    let setter = flags.earliest_setter(refusal.process, lo, refusal.complete_ms, refusal.id);
    match (setter, cleared) {
        (Some(setter), _) => own.min(setter),
        (None, Some(_)) => refusal.invoke_ms,
        (None, None) => own,
    }
}

/// Per engine process, for one sale: its purchases refused for stock (which
/// may set its sold-out flag) and its `ok` cancels and restocks (which clear
/// it), indexed so that [`sold_out_horizon`] answers each refusal in
/// O(log n): a scan of the whole history per refusal took more than ten
/// minutes on a 10-minute leader run.
struct FlagHistory {
    /// Per process: (complete, invoke, id) of purchases refused `sold_out`,
    /// by complete; and the least invoke (with its id, and the second
    /// least) of each suffix.
    setters: HashMap<usize, Setters>,
    /// Per process: (complete, invoke) of `ok` cancels and restocks, by
    /// complete; and the greatest invoke of each prefix.
    clears: HashMap<usize, Clears>,
}

/// A process's purchases refused for stock, (complete, invoke, id) by
/// complete, with the least invokes of each suffix.
type Setters = (Vec<(u64, u64, u64)>, Vec<SuffixMin>);

/// A process's clears of its flag, (complete, invoke) by complete, with the
/// greatest invoke of each prefix.
type Clears = (Vec<(u64, u64)>, Vec<u64>);

/// The least invoke of a suffix, its op id, and the next least invoke.
#[derive(Clone, Copy)]
struct SuffixMin {
    least: (u64, u64),
    next: u64,
}

impl FlagHistory {
    fn new(ops: &[OpRecord], sku: &str) -> FlagHistory {
        let mut setters: HashMap<usize, Vec<(u64, u64, u64)>> = HashMap::new();
        let mut clears: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for o in ops {
            match &o.op {
                Op::Purchase { sku: s, .. } if s == sku && fail_code(o) == Some("sold_out") => {
                    setters
                        .entry(o.process)
                        .or_default()
                        .push((o.complete_ms, o.invoke_ms, o.id));
                }
                Op::Cancel { order_id }
                    if matches!(o.outcome, Outcome::Ok { .. })
                        && bucket_of(order_id).is_some_and(|(s, _)| s == sku) =>
                {
                    clears
                        .entry(o.process)
                        .or_default()
                        .push((o.complete_ms, o.invoke_ms));
                }
                Op::Restock { sku: s, .. }
                    if s == sku && matches!(o.outcome, Outcome::Ok { .. }) =>
                {
                    clears
                        .entry(o.process)
                        .or_default()
                        .push((o.complete_ms, o.invoke_ms));
                }
                _ => {}
            }
        }
        let setters = setters
            .into_iter()
            .map(|(p, mut v)| {
                v.sort_unstable();
                let mut mins = vec![
                    SuffixMin {
                        least: (u64::MAX, u64::MAX),
                        next: u64::MAX,
                    };
                    v.len() + 1
                ];
                for i in (0..v.len()).rev() {
                    let (_, invoke, id) = v[i];
                    let m = mins[i + 1];
                    mins[i] = if invoke < m.least.0 {
                        SuffixMin {
                            least: (invoke, id),
                            next: m.least.0,
                        }
                    } else {
                        SuffixMin {
                            least: m.least,
                            next: m.next.min(invoke),
                        }
                    };
                }
                (p, (v, mins))
            })
            .collect();
        let clears = clears
            .into_iter()
            .map(|(p, mut v)| {
                v.sort_unstable();
                let mut most = Vec::with_capacity(v.len());
                let mut m = 0;
                for (_, invoke) in &v {
                    m = m.max(*invoke);
                    most.push(m);
                }
                (p, (v, most))
            })
            .collect();
        FlagHistory { setters, clears }
    }

    /// The latest invoke of a clear by `process` answered by `by`.
    fn cleared_before(&self, process: usize, by: u64) -> Option<u64> {
        let (v, most) = self.clears.get(&process)?;
        let n = v.partition_point(|(complete, _)| *complete <= by);
        n.checked_sub(1).map(|i| most[i])
    }

    /// The earliest invoke of a purchase by `process` refused for stock,
    /// ended at or after `lo`, sent by `hi`, and not op `not`: the least
    /// invoke over every one that ended at or after `lo` is the answer when
    /// it was sent by `hi`, and none qualifies otherwise.
    fn earliest_setter(&self, process: usize, lo: u64, hi: u64, not: u64) -> Option<u64> {
        let (v, mins) = self.setters.get(&process)?;
        let i = v.partition_point(|(complete, _, _)| *complete < lo);
        let m = mins[i];
        let least = if m.least.1 == not { m.next } else { m.least.0 };
        (least <= hi).then_some(least)
    }
}

/// A purchase refused for the per-user limit although every request of
/// that buyer that might have bought by then, counted whole, leaves room
/// for it.
fn check_limit_refusals(v: &mut Verdict, inp: &Inputs<'_>, plan: &SalePlan) {
    let sku = plan.sku.as_str();
    // Each buyer's purchases of this sale, indexed once: a run has tens of
    // thousands of limit refusals, and scanning every operation for each
    // (as this did) kept a 10-minute run's check busy for over ten minutes.
    let mut by_user: HashMap<&str, Vec<&OpRecord>> = HashMap::new();
    for o in inp.ops.iter() {
        if let Op::Purchase { sku: s, user, .. } = &o.op {
            if s == sku {
                by_user.entry(user.as_str()).or_default().push(o);
            }
        }
    }
    for f in by_user.values().flatten().copied() {
        let (Op::Purchase { user, rid, qty, .. }, Some("limit_exceeded")) = (&f.op, fail_code(f))
        else {
            continue;
        };
        // Per other request, the most it may have held then: any attempt
        // sent before the refusal answered, unless it was refused before
        // the refusal was sent (a walk that failed held its quota until it
        // was refused).
        let mut counted: HashMap<&str, u64> = HashMap::new();
        for o in by_user.get(user.as_str()).into_iter().flatten().copied() {
            let refused_before =
                matches!(o.outcome, Outcome::Fail { .. }) && o.complete_ms < f.invoke_ms;
            if o.invoke_ms >= f.complete_ms || refused_before {
                continue;
            }
            if let Op::Purchase { rid: r, qty: q, .. } = &o.op {
                if r != rid {
                    let most = counted.entry(r).or_default();
                    *most = (*most).max(u64::from(*q));
                }
            }
        }
        let could_have: u64 = counted.values().sum();
        if could_have + u64::from(*qty) <= u64::from(plan.limit) {
            v.add(
                Kind::RefusedBelowLimit,
                1,
                format!(
                    "{sku}: {user} was refused {qty} for the limit {}, having at most {could_have}",
                    plan.limit
                ),
                &[f],
            );
        }
    }
}

/// True when `o` was sent while a fault that fails a master over (`kill`,
/// `pause`) was in force: under `ack = leader` its write may be taken back.
fn at_risk(o: &OpRecord) -> bool {
    o.failover_risk
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
        Outcome::Fail { code, .. } => Some(code),
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
    let excused = |kind: Kind| {
        if leader && ops.iter().any(|o| at_risk(o)) {
            Kind::TransitionFailover
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
            excused(Kind::TransitionConflict),
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
            excused(Kind::TransitionLost),
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
            excused(Kind::TransitionLost),
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
                excused(Kind::TransitionConflict),
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
                // Under retake, a late payment may have paid it since: one
                // sent by the time the resend was answered, the same
                // millisecond included (the recorded leader run of seed
                // 20261202: both sent and answered at 333,904 ms).
                let paid_since = retake
                    && ops
                        .iter()
                        .any(|o| matches!(o.op, Op::Pay { .. }) && o.invoke_ms <= f.complete_ms);
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
                excused(Kind::TransitionAnswerChanged),
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
                Kind::LatePaymentAccepted,
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
            Kind::LatePaymentAccepted,
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
                excused(Kind::RefusedInTime),
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
                    Kind::HoldDeadlineWrong,
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
                Kind::LatePaymentAccepted,
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
                    Kind::ExpiredEarly,
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
                Kind::HoldsNotExpired,
                1,
                format!(
                    "order {} is still held {} ms past its deadline",
                    r.order_id,
                    inp.checked_at_ms - deadline
                ),
                &[],
            );
        }
        let Some((state, version)) = inp.redis_states.get(&r.order_id) else {
            // Records live for the request TTL (a day by default; a run
            // lasts minutes): gone means lost, by a failover under `leader`
            // (an order in flight while a master was killed or paused) or
            // by a bug. Never a silent skip.
            v.add(
                if leader && risky.contains(r.order_id.as_str()) {
                    Kind::FailoverLost
                } else {
                    Kind::RecordMissing
                },
                1,
                format!("order {}: its record is gone from Redis", r.order_id),
                &[],
            );
            continue;
        };
        {
            if *state != r.status || *version != r.version {
                let kind = if leader && risky.contains(r.order_id.as_str()) {
                    Kind::TransitionFailover
                } else {
                    Kind::OrderStateMismatch
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
            Kind::UnwrittenTransitions,
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
            Kind::UnwrittenTransitions,
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
        Kind::DeadLetters,
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
                Kind::LimitAfterFailover
            } else {
                Kind::QuotaMismatch
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

/// One lock grant the workload used.
struct Grant<'a> {
    op: &'a OpRecord,
    name: &'a str,
    token: u64,
    last_write_refused: bool,
    asked: i64,
    granted: i64,
    released: i64,
    valid_until: i64,
}

impl Grant<'_> {
    /// When the holder surely held the lock (wall-clock ms): from the
    /// moment it knew it was granted to the earlier of its release and the
    /// earliest its lease could end: the end its client reckoned at the
    /// grant (a grant that waited has its lease from its last attempt on),
    /// or, in older histories, a lease from when it was asked.
    fn surely_held(&self) -> (i64, i64) {
        (
            self.granted,
            self.released.min(self.lease_end() - CLOCK_MARGIN_MS),
        )
    }

    /// The earliest its lease could end (wall-clock ms).
    fn lease_end(&self) -> i64 {
        let lease = super::worker::LOCK_LEASE.as_millis() as i64;
        if self.valid_until > 0 {
            self.valid_until
        } else {
            self.asked + lease
        }
    }
}

/// Slack for reading one wall clock in two processes (ms).
const CLOCK_MARGIN_MS: i64 = 2;

/// Per lock name: fencing tokens only grow (a grant that began after
/// another grant of the same name ended has a larger token), and no two
/// holders surely held it at once ([`Grant::surely_held`]; a holder whose
/// lease ran out while it was frozen is not holding, and fencing is what
/// stops its late write). The resource's refusals are read too: a holder
/// whose last write was refused although its whole critical section lay
/// inside its lease met another holder's write inside that lease.
fn check_locks(v: &mut Verdict, inp: &Inputs<'_>) {
    let mut by_name: BTreeMap<&str, Vec<Grant<'_>>> = BTreeMap::new();
    for o in inp.ops {
        if let (
            Op::Lock { name, .. },
            Outcome::Ok {
                value:
                    OkValue::Lock {
                        token,
                        last_write_refused,
                        asked_unix_ms,
                        granted_unix_ms,
                        released_unix_ms,
                        valid_until_unix_ms,
                        ..
                    },
            },
        ) = (&o.op, &o.outcome)
        {
            by_name.entry(name).or_default().push(Grant {
                op: o,
                name,
                token: *token,
                last_write_refused: *last_write_refused,
                asked: *asked_unix_ms,
                granted: *granted_unix_ms,
                released: *released_unix_ms,
                valid_until: *valid_until_unix_ms,
            });
        }
    }
    for grants in by_name.values_mut() {
        check_tokens_grow(v, grants);
        check_no_overlap(v, grants);
        check_releases_free(v, grants, inp);
    }
}

/// How long after a release inside its lease a waiter may still be let in
/// without the release counting as ignored (ms): a wake-up's round trips on
/// a loaded machine. A release that frees nothing lets the waiter in only
/// once the lease is over, about 700 ms after the release in the workload
/// (a lease of 1 s, a hold of 300 ms).
const WAKE_UP_MS: i64 = 500;

/// Liveness of the locks: a holder that gives the lock back well inside
/// its lease frees it for whoever waits. A waiter asked before the release
/// and let in only once the releasing holder's lease was over (or that gave
/// up, `lock_timeout`, more than [`WAKE_UP_MS`] after it), with nobody
/// let in between, no fault on the lock nodes meanwhile (a paused node
/// loses wake-ups and may miss the release), and no lock operation of
/// unknown end in flight (it may have held the lock in between), saw a
/// release that freed nothing (the script deleted nothing) or woke no one
/// (no wake-up published, or one not heard).
fn check_releases_free(v: &mut Verdict, grants: &mut [Grant<'_>], inp: &Inputs<'_>) {
    grants.sort_by_key(|g| g.granted);
    let history_ms = |unix: i64| (unix - inp.history_start_ms).max(0) as u64;
    let lock_fault = |from: i64, to: i64| {
        let (from, to) = (history_ms(from), history_ms(to));
        inp.fault_windows
            .iter()
            .any(|w| w.injected && w.fault == "lock-pause" && w.start_ms <= to && w.end_ms >= from)
    };
    // A lock operation refused (`lock_timeout`) never held the lock: only
    // one of unknown end may have.
    let unknown_in_flight = |name: &str, from: i64, to: i64| {
        let (from, to) = (history_ms(from), history_ms(to));
        inp.ops.iter().any(|o| {
            matches!(&o.op, Op::Lock { name: n, .. } if n == name)
                && matches!(o.outcome, Outcome::Unknown { .. })
                && o.invoke_ms <= to
                && o.complete_ms >= from
        })
    };
    // Waiters that gave up (`lock_timeout`): a release that kept the lock
    // for longer than a wait (PERSIST, a long PEXPIRE) lets nobody in, and
    // leaves only these.
    let timed_out: Vec<&OpRecord> = inp
        .ops
        .iter()
        .filter(|o| {
            matches!(&o.op, Op::Lock { name, .. } if grants.first().is_some_and(|g| g.name == name))
                && fail_code(o) == Some("lock_timeout")
        })
        .collect();
    for (i, a) in grants.iter().enumerate() {
        let lease_end = a.lease_end() - CLOCK_MARGIN_MS;
        if a.released >= lease_end {
            continue;
        }
        let released = history_ms(a.released);
        let next_grant = grants[i + 1..]
            .iter()
            .find(|b| b.granted >= a.released)
            .map(|b| history_ms(b.granted));
        let gave_up = timed_out.iter().find(|r| {
            r.invoke_ms < released
                && r.complete_ms >= released + WAKE_UP_MS as u64
                && next_grant.is_none_or(|g| g > r.complete_ms)
        });
        if let Some(r) = gave_up {
            let until = inp.history_start_ms + r.complete_ms as i64;
            if !lock_fault(a.released, until) && !unknown_in_flight(a.name, a.released, until) {
                v.add(
                    Kind::LockReleaseIgnored,
                    1,
                    format!(
                        "lock {}: released by token {} {} ms inside its lease, yet a waiter gave up {} ms later with nobody let in",
                        a.name,
                        a.token,
                        lease_end - a.released,
                        r.complete_ms - released
                    ),
                    &[a.op, r],
                );
                continue;
            }
        }
        // The first let in after the release.
        let Some(b) = grants[i + 1..].iter().find(|b| b.granted >= a.released) else {
            continue;
        };
        let waiting = b.asked < a.released;
        let late = b.granted >= lease_end && b.granted - a.released >= WAKE_UP_MS;
        if waiting
            && late
            && !lock_fault(a.released, b.granted)
            && !unknown_in_flight(a.name, a.released, b.granted)
        {
            v.add(
                Kind::LockReleaseIgnored,
                1,
                format!(
                    "lock {}: released by token {} {} ms inside its lease, yet a waiter (token {}) got in only {} ms later, after that lease",
                    a.name,
                    a.token,
                    lease_end - a.released,
                    b.token,
                    b.granted - a.released
                ),
                &[a.op, b.op],
            );
        }
    }
}

/// A grant that began (was asked for) after another of the same name
/// ended (answered) has a larger token.
fn check_tokens_grow(v: &mut Verdict, grants: &mut [Grant<'_>]) {
    let mut by_end: Vec<(&OpRecord, u64)> = grants.iter().map(|g| (g.op, g.token)).collect();
    by_end.sort_by_key(|(o, _)| o.complete_ms);
    grants.sort_by_key(|g| g.op.invoke_ms);
    let mut i = 0;
    let mut highest: Option<(&OpRecord, u64)> = None;
    for g in grants.iter() {
        while i < by_end.len() && by_end[i].0.complete_ms < g.op.invoke_ms {
            if highest.is_none_or(|(_, t)| by_end[i].1 > t) {
                highest = Some(by_end[i]);
            }
            i += 1;
        }
        if let Some((a, t)) = highest {
            if t >= g.token {
                v.add(
                    Kind::LockTokenRegressed,
                    1,
                    format!(
                        "lock {}: a grant with token {} began after a grant with token {t} ended",
                        g.name, g.token
                    ),
                    &[a, g.op],
                );
            }
        }
    }
}

/// No two holders of one name surely held it at once, and no holder's
/// last write was refused inside its own lease.
fn check_no_overlap(v: &mut Verdict, grants: &mut [Grant<'_>]) {
    grants.sort_by_key(|g| g.granted);
    for (i, a) in grants.iter().enumerate() {
        let (a_from, a_to) = a.surely_held();
        if a.last_write_refused && a_to == a.released {
            v.add(
                Kind::LockOverlap,
                1,
                format!(
                    "lock {}: the holder with token {} had its last write refused inside its lease",
                    a.name, a.token
                ),
                &[a.op],
            );
        }
        for b in &grants[i + 1..] {
            let (b_from, b_to) = b.surely_held();
            if b_from >= a_to {
                continue;
            }
            if b_to > a_from && b_from < a_to && a_from < a_to && b_from < b_to {
                v.add(
                    Kind::LockOverlap,
                    1,
                    format!(
                        "lock {}: holders with tokens {} and {} both held it for {} ms",
                        a.name,
                        a.token,
                        b.token,
                        a_to.min(b_to) - b_from.max(a_from)
                    ),
                    &[a.op, b.op],
                );
            }
        }
    }
}
