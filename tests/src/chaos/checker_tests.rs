//! Every kind of violation the checker names, shown firing without a single
//! process: a small correct world (sales, a history, what PostgreSQL and
//! Redis hold at the end) that the checker passes, and for each [`Kind`] a
//! change to it that breaks exactly that promise. The scenario table
//! matches on [`Kind`] with no catch-all, so a kind added to the checker
//! without its scenario does not compile.

use std::collections::{BTreeMap, HashMap};

use flashsale::{Ack, LatePayment};

use super::checker::{check, DbEvent, DbOrder, EndLedger, Inputs, Kind, Verdict};
use super::history::{FaultWindow, OpRecord, Phase};
use super::protocol::{OkValue, Op, Outcome};
use super::workload::SalePlan;

/// The wall clock at the history's start (ms since the Unix epoch).
const START: i64 = 1_000_000_000;
/// The hold window of sale `h`.
const HOLD: i64 = 1_000;

/// Everything the checker reads, owned.
#[derive(Clone)]
struct World {
    ops: Vec<OpRecord>,
    sales: Vec<SalePlan>,
    end: BTreeMap<String, EndLedger>,
    rows: Vec<DbOrder>,
    reconcile: BTreeMap<String, bool>,
    negative: Vec<(String, usize)>,
    ack: Ack,
    events: HashMap<(String, i32), DbEvent>,
    redis: HashMap<String, (String, i32)>,
    windows: Vec<FaultWindow>,
}

fn plan(sku: &str, stock: u64, limit: u32, hold_ms: u64) -> SalePlan {
    SalePlan {
        sku: sku.into(),
        stock,
        buckets: 1,
        limit,
        hold_ms,
        late: LatePayment::Refuse,
    }
}

fn rec(id: u64, op: Op, outcome: Outcome, at: u64) -> OpRecord {
    OpRecord {
        id,
        process: 0,
        op,
        outcome,
        invoke_ms: at,
        complete_ms: at + 5,
        phase: Phase::Run,
        fault: None,
        lines: (0, 0),
        failover_risk: false,
    }
}

fn buy(sku: &str, user: &str, rid: &str, qty: u32) -> Op {
    Op::Purchase {
        sku: sku.into(),
        user: user.into(),
        rid: rid.into(),
        qty,
    }
}

fn order(id: &str) -> Outcome {
    Outcome::Ok {
        value: OkValue::Order {
            order_id: id.into(),
            bucket: 0,
        },
    }
}

fn row(id: &str, sku: &str, user: &str, qty: u64, status: &str) -> DbOrder {
    DbOrder {
        order_id: id.into(),
        sku: sku.into(),
        user: user.into(),
        qty,
        status: status.into(),
        payment_ref: None,
        expires_ms: None,
        version: 1,
        paid_ms: None,
        expired_ms: None,
        created_ms: None,
    }
}

/// A held order of sale `h` made at history ms `at`.
fn hold_row(id: &str, user: &str, status: &str, at: i64) -> DbOrder {
    DbOrder {
        expires_ms: Some(START + at + HOLD),
        created_ms: Some(START + at),
        ..row(id, "h", user, 1, status)
    }
}

fn event(kind: &str, at_ms: i64) -> DbEvent {
    DbEvent {
        kind: kind.into(),
        retake: false,
        at_ms: Some(at_ms),
    }
}

fn lock_op(name: &str, owner: &str, token: u64, at: u64, asked: i64) -> OpRecord {
    rec(
        0,
        Op::Lock {
            name: name.into(),
            owner: owner.into(),
            hold_ms: 50,
        },
        Outcome::Ok {
            value: OkValue::Lock {
                token,
                refused_writes: 0,
                last_write_refused: false,
                asked_unix_ms: asked,
                granted_unix_ms: asked + 10,
                released_unix_ms: asked + 100,
                valid_until_unix_ms: asked + super::worker::LOCK_LEASE.as_millis() as i64,
            },
        },
        at,
    )
}

/// The correct world: sale `s` (10 units, one sold, 5 restocked late),
/// sale `q` (a limit of 2, one sold), sale `h` (holds of 1 s, a limit of
/// 2: one order paid, one expired), and a lock taken twice in turn.
fn world() -> World {
    let mut w = World {
        ops: Vec::new(),
        sales: vec![
            plan("s", 10, 0, 0),
            plan("q", 10, 2, 0),
            plan("h", 10, 2, 1000),
        ],
        end: BTreeMap::new(),
        rows: Vec::new(),
        reconcile: BTreeMap::new(),
        negative: Vec::new(),
        ack: Ack::Replicated,
        events: HashMap::new(),
        redis: HashMap::new(),
        windows: Vec::new(),
    };
    w.ops
        .push(rec(1, buy("s", "u1", "r1", 1), order("s~0~a"), 10));
    w.rows.push(row("s~0~a", "s", "u1", 1, "paid"));
    w.ops.push(rec(
        2,
        Op::Restock {
            sku: "s".into(),
            qty: 5,
            op_id: "op1".into(),
        },
        Outcome::Ok {
            value: OkValue::Done,
        },
        5_000,
    ));
    w.end.insert(
        "s".into(),
        EndLedger {
            initial: 15,
            stocks: vec![14],
            bucket_initials: vec![15],
            ..EndLedger::default()
        },
    );
    w.ops
        .push(rec(3, buy("q", "u1", "r1", 1), order("q~0~a"), 20));
    w.rows.push(row("q~0~a", "q", "u1", 1, "paid"));
    let mut q_end = EndLedger {
        initial: 10,
        stocks: vec![9],
        bucket_initials: vec![10],
        ..EndLedger::default()
    };
    q_end.left.quotas.insert("u1".into(), 1);
    w.end.insert("q".into(), q_end);
    // Sale h: b is paid at 100 ms, c expires at its deadline.
    w.ops
        .push(rec(4, buy("h", "u2", "r1", 1), order("h~0~b"), 30));
    w.ops.push(rec(
        5,
        Op::Pay {
            order_id: "h~0~b".into(),
            payment_ref: "p1".into(),
        },
        Outcome::Ok {
            value: OkValue::Transition {
                state: "paid".into(),
                retaken: false,
            },
        },
        100,
    ));
    w.rows.push(DbOrder {
        payment_ref: Some("p1".into()),
        version: 2,
        paid_ms: Some(START + 102),
        ..hold_row("h~0~b", "u2", "paid", 30)
    });
    w.events
        .insert(("h~0~b".into(), 2), event("paid", START + 102));
    w.redis.insert("h~0~b".into(), ("paid".into(), 2));
    w.ops
        .push(rec(6, buy("h", "u3", "r1", 1), order("h~0~c"), 40));
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + 40 + HOLD + 10),
        ..hold_row("h~0~c", "u3", "expired", 40)
    });
    w.events.insert(
        ("h~0~c".into(), 2),
        event("expired", START + 40 + HOLD + 10),
    );
    w.redis.insert("h~0~c".into(), ("expired".into(), 2));
    let mut h_end = EndLedger {
        initial: 10,
        stocks: vec![9],
        bucket_initials: vec![10],
        ..EndLedger::default()
    };
    h_end.left.quotas.insert("u2".into(), 1);
    h_end.left.quotas.insert("u3".into(), 0);
    w.end.insert("h".into(), h_end);
    for sku in ["s", "q", "h"] {
        w.reconcile.insert(sku.into(), true);
    }
    w.ops.push(lock_op("L", "a", 5, 200, START + 200));
    w.ops.push(lock_op("L", "b", 6, 400, START + 400));
    w
}

impl World {
    /// The second holder asks while the first holds the lock (released at
    /// START + 300, its lease over at START + 1_200) and gets in at
    /// `granted`.
    fn wait_for_release(&mut self, granted: i64) {
        if let Outcome::Ok {
            value:
                OkValue::Lock {
                    asked_unix_ms,
                    granted_unix_ms,
                    released_unix_ms,
                    valid_until_unix_ms,
                    ..
                },
        } = &mut self.lock_mut(6).outcome
        {
            *asked_unix_ms = START + 250;
            *granted_unix_ms = granted;
            *released_unix_ms = granted + 90;
            *valid_until_unix_ms = granted + 1_000;
        }
    }

    /// Sale h down to 2 units, so b and c take all of it and one unit
    /// counted twice over time shows.
    fn tighten_h(&mut self) {
        self.sales[2].stock = 2;
        let end = self.end("h");
        end.initial = 2;
        end.stocks = vec![1];
        end.bucket_initials = vec![2];
    }

    fn verdict(&self) -> Verdict {
        check(&Inputs {
            ops: &self.ops,
            sales: &self.sales,
            end: &self.end,
            rows: &self.rows,
            reconcile: &self.reconcile,
            negative_samples: &self.negative,
            ack: self.ack,
            db_events: &self.events,
            history_start_ms: START,
            redis_states: &self.redis,
            checked_at_ms: START + 60_000,
            fault_windows: &self.windows,
        })
    }

    fn end(&mut self, sku: &str) -> &mut EndLedger {
        self.end.entry(sku.into()).or_default()
    }

    /// One more unit of `s` sold to `user` (answered, in PostgreSQL).
    fn sell_s(&mut self, id: &str, user: &str, rid: &str, at: u64) {
        self.ops
            .push(rec(90, buy("s", user, rid, 1), order(id), at));
        self.rows.push(row(id, "s", user, 1, "paid"));
        self.end("s").stocks[0] -= 1;
    }

    fn pay(&mut self, id: &str, reference: &str, outcome: Outcome, at: u64) {
        self.ops.push(rec(
            91,
            Op::Pay {
                order_id: id.into(),
                payment_ref: reference.into(),
            },
            outcome,
            at,
        ));
    }

    fn lock_mut(&mut self, token: u64) -> &mut OpRecord {
        self.ops
            .iter_mut()
            .find(|o| matches!(o.outcome, Outcome::Ok { value: OkValue::Lock { token: t, .. } } if t == token))
            .expect("lock op")
    }
}

fn paid_ok() -> Outcome {
    Outcome::Ok {
        value: OkValue::Transition {
            state: "paid".into(),
            retaken: false,
        },
    }
}

/// A world with an order of `h` (user u4) that expired, yet whose payment
/// was answered ok.
fn payment_lost(w: &mut World) {
    w.ops
        .push(rec(7, buy("h", "u4", "r1", 1), order("h~0~d"), 50));
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + 50 + HOLD + 10),
        ..hold_row("h~0~d", "u4", "expired", 50)
    });
    w.events.insert(
        ("h~0~d".into(), 2),
        event("expired", START + 50 + HOLD + 10),
    );
    w.redis.insert("h~0~d".into(), ("expired".into(), 2));
    w.end("h").left.quotas.insert("u4".into(), 0);
    w.pay("h~0~d", "p9", paid_ok(), 60);
}

/// Changes the correct world so that `kind` is broken; returns the kinds
/// the change breaks with it (when one cannot break alone).
fn scenario(kind: Kind, w: &mut World) -> Vec<Kind> {
    use Kind::*;
    match kind {
        OversoldUnits => {
            // 15 more units sold than the 15 put in, stock left at -1.
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 15), order("s~0~z"), 6_000));
            w.rows.push(row("s~0~z", "s", "u7", 15, "paid"));
            w.end("s").stocks = vec![-1];
            vec![NegativeStock, OversoldInTime]
        }
        LostConfirmed => {
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 1), order("s~0~gone"), 50));
            vec![]
        }
        UnwrittenOrders => {
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 1), order("s~0~late"), 50));
            w.end("s").in_streams.push(("s~0~late".into(), 1));
            w.end("s").stocks = vec![13];
            vec![]
        }
        LedgerUnbalanced => {
            w.end("s").stocks = vec![13];
            w.reconcile.insert("s".into(), false);
            vec![]
        }
        DuplicateOrders => {
            w.sell_s("s~0~dup", "u1", "r1", 60);
            vec![RequestAnswerChanged]
        }
        RequestAnswerChanged => {
            w.ops.push(rec(
                8,
                buy("s", "u1", "r1", 1),
                Outcome::fail("sold_out"),
                80,
            ));
            vec![]
        }
        FailoverDuplicates => {
            // The first confirmation (at 10 ms) was in flight in a kill.
            w.ack = Ack::Leader;
            w.sell_s("s~0~dup", "u1", "r1", 60);
            w.windows.push(injected("kill", 1_005, 1_010));
            vec![]
        }
        LimitExceeded => {
            for (id, rid) in [("q~0~b", "r2"), ("q~0~c", "r3")] {
                w.ops.push(rec(8, buy("q", "u1", rid, 1), order(id), 60));
                w.rows.push(row(id, "q", "u1", 1, "paid"));
            }
            w.end("q").stocks = vec![7];
            w.end("q").left.quotas.insert("u1".into(), 3);
            vec![]
        }
        RefusedBelowLimit => {
            w.ops.push(rec(
                8,
                buy("q", "u5", "r1", 1),
                Outcome::fail("limit_exceeded"),
                60,
            ));
            vec![]
        }
        ReconcileWrong => {
            w.reconcile.insert("s".into(), false);
            vec![]
        }
        ReconcileSilent => {
            w.reconcile.remove("s");
            vec![]
        }
        NegativeStock => {
            w.negative.push(("s: bucket 0 stock -1".into(), 1));
            vec![]
        }
        OversoldInTime => {
            // 10 more units confirmed before the restock was even asked
            // for: 11 taken of the 10 there were; the end sums balance.
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 10), order("s~0~big"), 60));
            w.rows.push(row("s~0~big", "s", "u7", 10, "paid"));
            w.end("s").stocks = vec![4];
            vec![]
        }
        BucketOversoldInTime => {
            two_bucket_sale(w, 3);
            vec![]
        }
        OrphanOrders => {
            w.rows.push(row("s~0~orphan", "s", "u7", 1, "paid"));
            w.end("s").stocks = vec![13];
            vec![]
        }
        Unresolved => {
            w.ops.push(rec(
                8,
                buy("s", "u7", "r1", 1),
                Outcome::fail("sold_out"),
                60,
            ));
            w.ops.push(rec(
                9,
                buy("s", "u7", "r1", 1),
                Outcome::unknown("timeout"),
                70,
            ));
            // The refusal at 60 came with 9 units there.
            vec![SoldOutWithStock]
        }
        SoldOutWithStock => {
            // Sale s had 9 units left when u8's first attempt was told
            // it was sold out.
            w.ops.push(rec(
                8,
                buy("s", "u8", "r1", 1),
                Outcome::fail("sold_out"),
                60,
            ));
            vec![]
        }
        SoldAfterClose => {
            w.ops.push(rec(
                8,
                Op::Close { sku: "s".into() },
                Outcome::Ok {
                    value: OkValue::Done,
                },
                3_000,
            ));
            w.sell_s("s~0~after", "u7", "r1", 3_100);
            vec![]
        }
        LockTokenRegressed => {
            if let Outcome::Ok {
                value: OkValue::Lock { token, .. },
            } = &mut w.lock_mut(6).outcome
            {
                *token = 4;
            }
            vec![]
        }
        LockOverlap => {
            if let Outcome::Ok {
                value:
                    OkValue::Lock {
                        asked_unix_ms,
                        granted_unix_ms,
                        released_unix_ms,
                        ..
                    },
            } = &mut w.lock_mut(6).outcome
            {
                // Granted while the first holder was still inside, its
                // lease far from over.
                *asked_unix_ms = START + 205;
                *granted_unix_ms = START + 250;
                *released_unix_ms = START + 350;
            }
            vec![]
        }
        LockReleaseIgnored => {
            w.wait_for_release(START + 1_200);
            vec![]
        }
        RestockOverapplied => {
            w.end("s").initial = 20;
            w.end("s").stocks = vec![19];
            w.end("s").bucket_initials = vec![20];
            vec![]
        }
        LostRestocks => {
            w.end("s").initial = 10;
            w.end("s").stocks = vec![9];
            w.end("s").bucket_initials = vec![10];
            vec![]
        }
        TransitionLost => {
            payment_lost(w);
            vec![]
        }
        TransitionConflict => {
            w.pay("h~0~b", "p2", paid_ok(), 120);
            vec![]
        }
        TransitionAnswerChanged => {
            // After the deadline (so not a refusal in time): the retry of
            // the payment that was answered ok is refused.
            w.pay("h~0~b", "p1", Outcome::fail("hold_expired"), 5_000);
            vec![]
        }
        LatePaymentAccepted => {
            if let Some(r) = w.rows.iter_mut().find(|r| r.order_id == "h~0~b") {
                r.paid_ms = Some(START + 30 + HOLD + 100);
            }
            vec![]
        }
        RefusedInTime => {
            w.pay("h~0~c", "p3", Outcome::fail("hold_expired"), 100);
            vec![]
        }
        ExpiredEarly => {
            if let Some(r) = w.rows.iter_mut().find(|r| r.order_id == "h~0~c") {
                r.expired_ms = Some(START + 40 + HOLD - 100);
            }
            vec![]
        }
        HoldDeadlineWrong => {
            if let Some(r) = w.rows.iter_mut().find(|r| r.order_id == "h~0~b") {
                r.created_ms = Some(START + 31);
            }
            vec![]
        }
        UnwrittenTransitions => {
            w.events.remove(&("h~0~b".to_owned(), 2));
            vec![]
        }
        DeadLetters => {
            w.end("h").left.dead_letters = 1;
            vec![]
        }
        HoldsNotExpired => {
            w.ops
                .push(rec(8, buy("h", "u6", "r1", 1), order("h~0~e"), 60));
            w.rows.push(hold_row("h~0~e", "u6", "held", 60));
            w.redis.insert("h~0~e".into(), ("held".into(), 1));
            w.end("h").left.quotas.insert("u6".into(), 1);
            w.end("h").stocks = vec![8];
            vec![]
        }
        OrderStateMismatch => {
            w.redis.insert("h~0~b".into(), ("held".into(), 1));
            vec![]
        }
        RecordMissing => {
            w.redis.remove("h~0~c");
            vec![]
        }
        QuotaMismatch => {
            w.end("h").left.quotas.insert("u2".into(), 2);
            vec![]
        }
        TransitionFailover => {
            w.ack = Ack::Leader;
            payment_lost(w);
            w.windows.push(injected("pause", 1_060, 1_070));
            vec![]
        }
        LimitAfterFailover => {
            w.ack = Ack::Leader;
            w.end("h").left.quotas.insert("u2".into(), 2);
            w.windows.push(FaultWindow {
                fault: "kill".into(),
                start_ms: 20,
                end_ms: 40,
                injected: true,
                landed: true,
                detail: String::new(),
                skus: None,
            });
            vec![]
        }
        FailoverLost => {
            w.ack = Ack::Leader;
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 1), order("s~0~gone"), 50));
            w.windows.push(FaultWindow {
                fault: "kill".into(),
                start_ms: 40,
                end_ms: 900,
                injected: true,
                landed: true,
                detail: String::new(),
                skus: None,
            });
            vec![]
        }
    }
}

/// An injected fault of `kind` in force from history ms `from` to `to`.
fn injected(kind: &str, from: u64, to: u64) -> FaultWindow {
    FaultWindow {
        fault: kind.into(),
        start_ms: from,
        end_ms: to,
        injected: true,
        landed: true,
        detail: String::new(),
        skus: None,
    }
}

/// The kinds a verdict counted.
fn fired(v: &Verdict) -> Vec<Kind> {
    v.counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| *k)
        .collect()
}

#[test]
fn the_correct_world_breaks_nothing() {
    let v = world().verdict();
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);
    assert!(v.valid(Ack::Replicated) && v.valid(Ack::Leader));
}

#[test]
fn every_kind_fires_on_the_history_that_breaks_it_and_only_there() {
    let mut wrong = Vec::new();
    for kind in Kind::ALL {
        let mut w = world();
        let mut expected = scenario(*kind, &mut w);
        expected.push(*kind);
        expected.sort();
        let v = w.verdict();
        let got = fired(&v);
        if got != expected {
            wrong.push(format!(
                "{}: expected {:?}, got {:?}: {:#?}",
                kind.name(),
                expected,
                got,
                v.violations
            ));
        }
        // Whatever the mode, the kind makes the run invalid where it must
        // be zero.
        if Verdict::must_be_zero(*kind, w.ack) && v.valid(w.ack) {
            wrong.push(format!("{}: counted, yet the run is valid", kind.name()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `ack = leader` excuses only what a failover can take back: the same
/// lost confirmation under another fault, or none, is a violation.
#[test]
fn under_leader_ack_only_a_kill_or_pause_excuses_a_loss() {
    for (fault, was_injected, excused) in [
        (None, false, false),
        (Some("migrate"), true, false),
        (Some("pg-down"), true, false),
        // Started, but never injected: no failover, no excuse.
        (Some("kill"), false, false),
        (Some("kill"), true, true),
        (Some("pause"), true, true),
    ] {
        let mut w = world();
        w.ack = Ack::Leader;
        let mut lost = rec(8, buy("s", "u7", "r1", 1), order("s~0~gone"), 50);
        lost.fault = fault.map(str::to_owned);
        w.ops.push(lost);
        if let Some(f) = fault {
            w.windows.push(FaultWindow {
                injected: was_injected,
                ..injected(f, 40, 900)
            });
        }
        let v = w.verdict();
        let want = if excused {
            Kind::FailoverLost
        } else {
            Kind::LostConfirmed
        };
        assert_eq!(
            fired(&v),
            vec![want],
            "under {fault:?} (injected {was_injected})"
        );
        assert_eq!(v.valid(Ack::Leader), excused, "under {fault:?}");
    }
}

/// From the attack on the checker: a kill or pause takes back only what
/// its own master held, so it excuses only the sales with a bucket there;
/// a loss in a sale served wholly by other masters is a lost confirmation.
#[test]
fn a_failover_excuses_only_losses_of_the_sales_on_its_master() {
    for (on_master, excused) in [(vec!["q", "h"], false), (vec!["s"], true)] {
        for fault in ["kill", "pause"] {
            let mut w = world();
            w.ack = Ack::Leader;
            w.ops
                .push(rec(8, buy("s", "u7", "r1", 1), order("s~0~gone"), 50));
            w.windows.push(FaultWindow {
                skus: Some(on_master.iter().map(|s| s.to_string()).collect()),
                ..injected(fault, 40, 900)
            });
            let v = w.verdict();
            let want = if excused {
                Kind::FailoverLost
            } else {
                Kind::LostConfirmed
            };
            assert_eq!(
                fired(&v),
                vec![want],
                "{fault} of the master of {on_master:?}"
            );
        }
    }
}

/// A holder frozen past its lease is not holding: the next grant after the
/// lease ran out is no overlap, and fencing refused its late write.
#[test]
fn a_holder_whose_lease_ran_out_is_not_an_overlap() {
    let mut w = world();
    let lease = super::worker::LOCK_LEASE.as_millis() as i64;
    let first_asked = START + 200;
    if let Outcome::Ok {
        value:
            OkValue::Lock {
                released_unix_ms,
                last_write_refused,
                refused_writes,
                ..
            },
    } = &mut w.lock_mut(5).outcome
    {
        // Frozen from just after its first write to well past its lease.
        *released_unix_ms = first_asked + lease * 3;
        *last_write_refused = true;
        *refused_writes = 1;
    }
    let next_granted = first_asked + lease + 5;
    if let Outcome::Ok {
        value:
            OkValue::Lock {
                asked_unix_ms,
                granted_unix_ms,
                released_unix_ms,
                ..
            },
    } = &mut w.lock_mut(6).outcome
    {
        *asked_unix_ms = next_granted - 5;
        *granted_unix_ms = next_granted;
        *released_unix_ms = next_granted + 100;
    }
    let v = w.verdict();
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);
}

/// A grant that waited longer than a lease before it was granted is still
/// checked: its lease runs from its last attempt (the client's reckoning,
/// recorded at the grant), not from when it was asked, so a grant inside
/// another holder's critical section is an overlap.
#[test]
fn a_grant_that_waited_longer_than_a_lease_is_still_checked_for_overlap() {
    let mut w = world();
    let lease = super::worker::LOCK_LEASE.as_millis() as i64;
    if let Outcome::Ok {
        value:
            OkValue::Lock {
                asked_unix_ms,
                granted_unix_ms,
                released_unix_ms,
                valid_until_unix_ms,
                ..
            },
    } = &mut w.lock_mut(6).outcome
    {
        // Asked long before, granted while the first holder was inside.
        *asked_unix_ms = START + 200 - 3 * lease;
        *granted_unix_ms = START + 250;
        *released_unix_ms = START + 350;
        *valid_until_unix_ms = START + 240 + lease;
    }
    let v = w.verdict();
    assert_eq!(fired(&v), vec![Kind::LockOverlap], "{:#?}", v.violations);
}

/// From the review of the checker: a request first sent before the close
/// and confirmed after it (the resend of an `unknown` that had bought) is a
/// replay, not a sale after the close.
#[test]
fn a_replay_after_the_close_is_not_a_sale_after_it() {
    let mut w = world();
    w.ops.push(rec(
        8,
        buy("s", "u7", "r1", 1),
        Outcome::unknown("stall"),
        1_000,
    ));
    w.ops.push(rec(
        9,
        Op::Close { sku: "s".into() },
        Outcome::Ok {
            value: OkValue::Done,
        },
        2_000,
    ));
    w.sell_s("s~0~x", "u7", "r1", 3_000);
    assert_eq!(fired(&w.verdict()), vec![]);
}

/// From the review: a walk that failed held its quota until it was
/// refused; a refusal for the limit meanwhile is right.
#[test]
fn a_refusal_while_a_failing_walk_held_the_quota_is_right() {
    let mut w = world();
    // Sale q down to the 2 units u1's one leaves 1 of: u9's purchase of
    // 2 is rightly refused for stock.
    w.sales[1].stock = 2;
    w.end("q").initial = 2;
    w.end("q").stocks = vec![1];
    w.end("q").bucket_initials = vec![2];
    w.ops.push(rec(
        8,
        buy("q", "u9", "r1", 2),
        Outcome::fail("sold_out"),
        100,
    ));
    if let Some(o) = w.ops.last_mut() {
        o.complete_ms = 160;
    }
    w.ops.push(rec(
        9,
        buy("q", "u9", "r2", 1),
        Outcome::fail("limit_exceeded"),
        120,
    ));
    assert_eq!(fired(&w.verdict()), vec![]);
}

/// From the review: a cancel's units are back from its first attempt,
/// even when a replay of it answered first.
#[test]
fn units_given_back_count_from_the_first_attempt_of_the_cancel() {
    let mut w = world();
    // Sale q: 10 units, u1 holds 1. u8 buys the other 9, cancels them
    // (first attempt at 200, answered late; a replay at 400 answers
    // first), and u10 buys one unit at 300.
    w.ops
        .push(rec(8, buy("q", "u8", "r1", 9), order("q~0~n"), 100));
    w.rows.push(row("q~0~n", "q", "u8", 9, "cancelled"));
    let cancel = |id, at, done| {
        let mut o = rec(
            id,
            Op::Cancel {
                order_id: "q~0~n".into(),
            },
            paid_ok(),
            at,
        );
        o.complete_ms = done;
        o
    };
    w.ops.push(cancel(9, 400, 405));
    w.ops.push(cancel(10, 200, 4_000));
    w.ops
        .push(rec(11, buy("q", "u10", "r1", 1), order("q~0~m"), 300));
    w.rows.push(row("q~0~m", "q", "u10", 1, "paid"));
    w.end("q").stocks = vec![8];
    w.end("q").left.quotas.insert("u8".into(), 0);
    w.end("q").left.quotas.insert("u10".into(), 1);
    let v = w.verdict();
    assert!(
        !fired(&v).contains(&Kind::OversoldInTime),
        "{:#?}",
        v.violations
    );
}

/// From the review: under `leader`, a second order is excused only when
/// the first confirmation (whose record a failover could take) was at
/// risk, not when only the retry was.
#[test]
fn a_duplicate_whose_first_confirmation_was_safe_is_not_excused() {
    let mut w = world();
    w.ack = Ack::Leader;
    w.sell_s("s~0~dup", "u1", "r1", 3_000);
    w.windows.push(injected("kill", 3_000, 3_100));
    let v = w.verdict();
    assert!(
        fired(&v).contains(&Kind::DuplicateOrders),
        "{:#?}",
        v.violations
    );
    assert!(!v.valid(Ack::Leader));
}

/// A multi-bucket sale's refusal for stock, answered by Redis' scripts
/// (settled into the request's record), stays final: a confirmation of the
/// same request after it is a changed answer. The same refusal from the
/// engine's sold-out flag (not recorded), or in a one-bucket sale, is not.
#[test]
fn a_multi_bucket_refusal_from_the_scripts_stays_final() {
    let refused = |from_scripts: bool| Outcome::Fail {
        code: "sold_out".into(),
        from_scripts,
    };
    let with = |buckets: u32, from_scripts: bool| {
        let mut w = world();
        w.sales[0].buckets = buckets;
        // One unit, which the request took: the refusal for stock is right
        // at the time (else `sold_out_with_stock` fires too).
        w.sales[0].stock = 1;
        if let Some(end) = w.end.get_mut("s") {
            end.initial = 6;
            end.stocks = vec![5];
            end.bucket_initials = vec![6];
            end.stocks.resize(buckets as usize, 0);
            end.bucket_initials.resize(buckets as usize, 0);
        }
        w.ops
            .push(rec(7, buy("s", "u1", "r1", 1), refused(from_scripts), 2));
        w.verdict()
    };
    let v = with(2, true);
    assert_eq!(
        fired(&v),
        vec![Kind::RequestAnswerChanged],
        "{:#?}",
        v.violations
    );
    for (buckets, from_scripts) in [(2, false), (1, true)] {
        let v = with(buckets, from_scripts);
        assert_eq!(
            fired(&v),
            vec![],
            "{buckets} {from_scripts}: {:#?}",
            v.violations
        );
    }
}

/// Issue 33, item 7: the sale's sums balanced while one bucket sold a unit
/// it never had and another lost one (an oversell covered by a loss). Each
/// bucket's own ledger shows it, whatever the sale-wide sums say.
#[test]
fn an_oversold_bucket_covered_by_a_loss_in_another_is_unbalanced() {
    let two_buckets = |stocks: Vec<i64>| {
        let mut w = world();
        w.sales[0].buckets = 2;
        let end = w.end("s");
        end.bucket_initials = vec![8, 7];
        end.stocks = stocks;
        w.verdict()
    };
    // s~0~a took its unit in bucket 0: 8 - 1 and 7 left.
    let v = two_buckets(vec![7, 7]);
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);
    // The same sale-wide sums, with bucket 0 untouched and bucket 1 short.
    let v = two_buckets(vec![8, 6]);
    assert_eq!(
        fired(&v),
        vec![Kind::LedgerUnbalanced],
        "{:#?}",
        v.violations
    );
    assert_eq!(v.violations.len(), 2, "one per bucket: {:#?}", v.violations);
}

/// From the recorded run of seed 20261127 (replicated, all faults): a late
/// payment of a hold past its deadline but not yet swept answers `retaken`
/// though it takes no units (the hold still had them), and was counted as
/// units taken again: a false `oversold_in_time`. Only a retake PostgreSQL
/// records took units.
#[test]
fn a_late_payment_of_an_unswept_hold_takes_no_units_again() {
    let mut w = world();
    // Sale h down to 2 units: b and c take both.
    w.tighten_h();
    if let Outcome::Ok {
        value: OkValue::Transition { retaken, .. },
    } = &mut w.ops[4].outcome
    {
        *retaken = true;
    }
    let v = w.verdict();
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);
    // The same payment recorded as a retake did take a unit again.
    if let Some(e) = w.events.get_mut(&("h~0~b".to_string(), 2)) {
        e.retake = true;
    }
    let v = w.verdict();
    assert!(
        fired(&v).contains(&Kind::OversoldInTime),
        "{:#?}",
        v.violations
    );
}

/// From the recorded leader run of seed 20261128: an order expired at its
/// deadline, and a cancel sent long after (answered `unknown`, then
/// `already_final`) made the checker credit its units only at the cancel,
/// so a sell-out in between looked like an oversell. Units come back once,
/// when PostgreSQL says they did.
#[test]
fn a_late_cancel_of_an_expired_hold_does_not_hide_its_expiry() {
    let mut w = world();
    // Sale h down to 2 units: b (paid) and c (expires at 40 + HOLD + 10).
    w.tighten_h();
    // After c expired, u4 buys the unit it gave back (and lets it expire).
    let after: i64 = 40 + HOLD + 100;
    w.ops.push(rec(
        8,
        buy("h", "u4", "r1", 1),
        order("h~0~d"),
        after as u64,
    ));
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + after + HOLD + 10),
        ..hold_row("h~0~d", "u4", "expired", after)
    });
    w.events.insert(
        ("h~0~d".into(), 2),
        event("expired", START + after + HOLD + 10),
    );
    w.redis.insert("h~0~d".into(), ("expired".into(), 2));
    w.end("h").left.quotas.insert("u4".into(), 0);
    // A cancel of c sent much later, answered unknown.
    w.ops.push(rec(
        9,
        Op::Cancel {
            order_id: "h~0~c".into(),
        },
        Outcome::unknown("timed out"),
        after as u64 + 5_000,
    ));
    let v = w.verdict();
    assert!(
        !fired(&v).contains(&Kind::OversoldInTime),
        "{:#?}",
        v.violations
    );
}

/// `sold_out_with_stock` judges only what was sure: a replay that repeats
/// a refusal after a restock, a refusal answered from the sold-out flag
/// just after a restock, a refusal while another request of the sale was
/// still unanswered, and stock left in pieces too small for the purchase
/// across a sale's buckets are all right; the same refusal with the units
/// surely there is not.
#[test]
fn sold_out_is_judged_only_on_units_surely_there() {
    // Sale s: 10 units, u1 has 1; a restock of 5 answered at 5,005 ms.
    let sold_out = |w: &mut World, user: &str, qty: u32, at: u64| {
        w.ops.push(rec(
            8,
            buy("s", user, "r1", qty),
            Outcome::fail("sold_out"),
            at,
        ));
    };
    let only = |w: World| fired(&w.verdict());
    // All 9 left are taken (by a request not yet answered when u8 asks).
    let mut w = world();
    w.ops.push(rec(
        20,
        buy("s", "u9", "r1", 9),
        Outcome::unknown("timeout"),
        50,
    ));
    sold_out(&mut w, "u8", 1, 60);
    assert!(!only(w).contains(&Kind::SoldOutWithStock));
    // u8's request refused when nothing was left, replayed after the
    // restock: the same answer.
    let mut w = world();
    w.ops.push(rec(
        20,
        buy("s", "u9", "r1", 9),
        Outcome::unknown("timeout"),
        50,
    ));
    sold_out(&mut w, "u8", 1, 60);
    sold_out(&mut w, "u8", 1, 6_000);
    assert!(!only(w).contains(&Kind::SoldOutWithStock));
    // Asked within the sold-out flag's time after the restock, which
    // another engine process answered (its own restock clears a process's
    // flag at once: `a_flag_cleared_by_the_process_s_own_restock_...`).
    let mut w = world();
    for o in w.ops.iter_mut() {
        if matches!(o.op, Op::Restock { .. }) {
            o.process = 1;
        }
    }
    w.ops.push(rec(
        20,
        buy("s", "u9", "r1", 9),
        Outcome::unknown("timeout"),
        50,
    ));
    sold_out(&mut w, "u8", 1, 5_300);
    assert!(!only(w).contains(&Kind::SoldOutWithStock));
    // ... and well after it, with the 5 restocked units there.
    let mut w = world();
    w.ops.push(rec(
        20,
        buy("s", "u9", "r1", 9),
        Outcome::unknown("timeout"),
        50,
    ));
    sold_out(&mut w, "u8", 1, 6_000);
    assert!(only(w).contains(&Kind::SoldOutWithStock));
    // From the flag: u7's purchase in the same process was refused for
    // stock before the restock and answered after it (its acks were slow),
    // so its flag rightly answers u8 a while later; a flag with no such
    // purchase behind it is judged as the scripts' answer.
    for (setter, wrong) in [(true, false), (false, true)] {
        let mut w = world();
        w.ops.push(rec(
            20,
            buy("s", "u9", "r1", 9),
            Outcome::unknown("timeout"),
            50,
        ));
        if setter {
            let mut p = rec(
                21,
                buy("s", "u7", "r1", 1),
                Outcome::fail("sold_out"),
                4_000,
            );
            p.complete_ms = 7_000;
            w.ops.push(p);
        }
        sold_out(&mut w, "u8", 1, 7_300);
        let v = w.verdict();
        assert_eq!(
            fired(&v).contains(&Kind::SoldOutWithStock),
            wrong,
            "setter {setter}: {:#?}",
            v.violations
        );
    }
    // One id sent with two quantities: either may have reached Redis
    // first, so the larger is counted (counting the first sent was a
    // possible cause of the one `sold_out_with_stock` a real run reported,
    // seed 63334533, which its rerun did not repeat).
    let mut w = world();
    w.ops.push(rec(
        20,
        buy("s", "u9", "r1", 6),
        Outcome::unknown("timeout"),
        50,
    ));
    w.ops.push(rec(
        21,
        buy("s", "u9", "r1", 8),
        Outcome::fail("request_mismatch"),
        55,
    ));
    sold_out(&mut w, "u8", 2, 60);
    assert!(!only(w).contains(&Kind::SoldOutWithStock));
    // A first attempt that lasted the engines' pending_timeout may have
    // been closed by the sweeper, which refuses whatever the stock (from
    // the attack on this check): not judged.
    for (took, wrong) in [(3_000, false), (2_000, true)] {
        let mut w = world();
        w.ops.push(rec(
            20,
            buy("s", "u9", "r1", 9),
            Outcome::unknown("timeout"),
            50,
        ));
        let mut slow = rec(8, buy("s", "u8", "r1", 1), Outcome::fail("sold_out"), 6_000);
        slow.complete_ms = 6_000 + took;
        w.ops.push(slow);
        let v = w.verdict();
        assert_eq!(
            fired(&v).contains(&Kind::SoldOutWithStock),
            wrong,
            "took {took} ms: {:#?}",
            v.violations
        );
    }
    // 9 units over 4 buckets may be 2 + 2 + 2 + 3: a purchase of 4 may
    // find none that holds it; of 3 it must.
    for (qty, wrong) in [(4, false), (3, true)] {
        let mut w = world();
        w.sales[0].buckets = 4;
        if let Some(end) = w.end.get_mut("s") {
            end.stocks.resize(4, 0);
            end.bucket_initials.resize(4, 0);
        }
        sold_out(&mut w, "u8", qty, 60);
        let v = w.verdict();
        assert_eq!(
            fired(&v).contains(&Kind::SoldOutWithStock),
            wrong,
            "qty {qty}: {:#?}",
            v.violations
        );
    }
}

/// From the attack on `sold_out_with_stock`: a request whose first attempt
/// ended unknown and whose retry was refused for stock by the scripts took
/// nothing (under `replicated` the refusal is final in its record), yet it
/// was counted as taken for the rest of the run; five of them hid an
/// undersell of the five restocked units.
#[test]
fn a_request_refused_for_good_after_an_unknown_attempt_counts_as_taking_nothing() {
    let mut w = world();
    // u9 takes the 9 units left (s had 10, u1 took 1).
    w.ops
        .push(rec(20, buy("s", "u9", "r1", 9), order("s~0~n"), 50));
    w.rows.push(row("s~0~n", "s", "u9", 9, "paid"));
    w.end("s").stocks = vec![5];
    let from_scripts = || Outcome::Fail {
        code: "sold_out".into(),
        from_scripts: true,
    };
    for i in 0..5u64 {
        let user = format!("u{}", 40 + i);
        w.ops.push(rec(
            21,
            buy("s", &user, "r1", 1),
            Outcome::unknown("timeout"),
            100 + i,
        ));
        w.ops
            .push(rec(22, buy("s", &user, "r1", 1), from_scripts(), 300 + i));
    }
    // The 5 restocked units (answered at 5,005) are there; u8 is refused.
    w.ops
        .push(rec(23, buy("s", "u8", "r1", 1), from_scripts(), 7_000));
    let v = w.verdict();
    assert!(
        fired(&v).contains(&Kind::SoldOutWithStock),
        "{:#?}",
        v.violations
    );
    // Under `leader` a failover may take the refusal back: counted whole.
    w.ack = Ack::Leader;
    let v = w.verdict();
    assert!(
        !fired(&v).contains(&Kind::SoldOutWithStock),
        "{:#?}",
        v.violations
    );
}

/// A waiter let in at once after a release is what a release is for; one
/// let in only after the lease, while a lock node was paused, may have
/// missed the release or its wake-up with the node: neither is reported.
#[test]
fn a_waiter_is_judged_late_only_when_nothing_excuses_it() {
    let mut w = world();
    w.wait_for_release(START + 305);
    assert_eq!(fired(&w.verdict()), vec![]);
    let mut w = world();
    w.wait_for_release(START + 1_200);
    w.windows.push(injected("lock-pause", 250, 900));
    assert_eq!(fired(&w.verdict()), vec![]);
    let mut w = world();
    w.wait_for_release(START + 1_200);
    w.windows.push(injected("kill", 250, 900));
    assert_eq!(fired(&w.verdict()), vec![Kind::LockReleaseIgnored]);
}

/// Units an expiry gave back are there for a later buyer: a "sold out"
/// well after the expiry, with nothing else to explain it, is an
/// undersell; one within the sold-out flag's time after it is not judged.
#[test]
fn units_given_back_by_an_expiry_are_there_for_a_later_buyer() {
    for (at, wrong) in [(1_300, false), (2_500, true)] {
        let mut w = world();
        // u9's 8 units take all that b and c left of h's 10.
        w.ops.push(rec(
            20,
            buy("h", "u9", "r1", 8),
            Outcome::unknown("timeout"),
            50,
        ));
        w.ops.push(rec(
            21,
            buy("h", "u8", "r1", 1),
            Outcome::fail("sold_out"),
            at,
        ));
        assert_eq!(
            fired(&w.verdict()).contains(&Kind::SoldOutWithStock),
            wrong,
            "asked at {at}"
        );
    }
}

/// From the attack on the checker: a release that kept the lock longer
/// than any wait (PERSIST, a long PEXPIRE) lets nobody in; its waiters only
/// give up. One that gave up long after a release inside the lease, with
/// nobody let in meanwhile, is reported; one that gave up at once is not.
#[test]
fn a_waiter_that_gave_up_while_the_lock_was_free_is_reported() {
    for (gave_up_at, wrong) in [(3_250, true), (600, false)] {
        let mut w = world();
        // The second holder comes only after the waiter gave up.
        if let Outcome::Ok {
            value:
                OkValue::Lock {
                    asked_unix_ms,
                    granted_unix_ms,
                    released_unix_ms,
                    valid_until_unix_ms,
                    ..
                },
        } = &mut w.lock_mut(6).outcome
        {
            *asked_unix_ms = START + 4_000;
            *granted_unix_ms = START + 4_010;
            *released_unix_ms = START + 4_100;
            *valid_until_unix_ms = START + 5_010;
        }
        let mut waiter = rec(
            9,
            Op::Lock {
                name: "L".into(),
                owner: "c".into(),
                hold_ms: 50,
            },
            Outcome::fail("lock_timeout"),
            250,
        );
        waiter.complete_ms = gave_up_at;
        w.ops.push(waiter);
        let v = w.verdict();
        assert_eq!(
            fired(&v).contains(&Kind::LockReleaseIgnored),
            wrong,
            "gave up at {gave_up_at}: {:#?}",
            v.violations
        );
    }
}

/// From the attack on the checker: a process that answered a restock (or
/// a cancel) cleared its own sold-out flag; a "sold out" it answered from
/// the flag afterwards needs a purchase refused for stock after that clear
/// to have set it again. With none, the restocked units were there.
#[test]
fn a_flag_cleared_by_the_process_s_own_restock_is_not_an_excuse() {
    for (reset_after_clear, wrong) in [(false, true), (true, false)] {
        let mut w = world();
        // u9's 9 units take all that is left of s's 10 (u1 has 1).
        w.ops.push(rec(
            20,
            buy("s", "u9", "r1", 9),
            Outcome::unknown("timeout"),
            50,
        ));
        // Refused for stock by the scripts before the restock (at 5,000).
        w.ops.push(rec(
            21,
            buy("s", "u8", "r1", 1),
            Outcome::Fail {
                code: "sold_out".into(),
                from_scripts: true,
            },
            4_800,
        ));
        if reset_after_clear {
            w.ops.push(rec(
                22,
                buy("s", "u6", "r1", 1),
                Outcome::Fail {
                    code: "sold_out".into(),
                    from_scripts: true,
                },
                5_100,
            ));
        }
        // From the flag, 300 ms after the restock was answered.
        w.ops.push(rec(
            23,
            buy("s", "u7", "r1", 1),
            Outcome::fail("sold_out"),
            5_300,
        ));
        let v = w.verdict();
        let judged: Vec<_> = v
            .violations
            .iter()
            .filter(|x| x.kind == Kind::SoldOutWithStock)
            .collect();
        assert_eq!(!judged.is_empty(), wrong, "{judged:#?}");
    }
}

/// From the recorded leader run of seed 20261202: where late payments
/// retake, a cancel answered `ok`, then a payment that retook the order
/// and the cancel's resend, both sent and answered in the same
/// millisecond: the resend's `already_final` is right (the order was paid
/// since), not a changed answer.
#[test]
fn a_cancel_resent_as_a_retake_pays_the_order_may_find_it_final() {
    for (paid_at_the_same_ms, wrong) in [(true, false), (false, true)] {
        let mut w = world();
        if let Some(h) = w.sales.iter_mut().find(|s| s.sku == "h") {
            h.late = LatePayment::Retake;
        }
        w.ops.push(rec(
            30,
            Op::Cancel {
                order_id: "h~0~c".into(),
            },
            Outcome::Ok {
                value: OkValue::Transition {
                    state: "cancelled".into(),
                    retaken: false,
                },
            },
            200,
        ));
        let mut resend = rec(
            31,
            Op::Cancel {
                order_id: "h~0~c".into(),
            },
            Outcome::fail("already_final"),
            300,
        );
        resend.complete_ms = 300;
        w.ops.push(resend);
        if paid_at_the_same_ms {
            let mut pay = rec(
                32,
                Op::Pay {
                    order_id: "h~0~c".into(),
                    payment_ref: "p9".into(),
                },
                Outcome::Ok {
                    value: OkValue::Transition {
                        state: "paid".into(),
                        retaken: true,
                    },
                },
                300,
            );
            pay.complete_ms = 300;
            w.ops.push(pay);
        }
        let v = w.verdict();
        assert_eq!(
            fired(&v).contains(&Kind::TransitionAnswerChanged),
            wrong,
            "{:#?}",
            v.violations
        );
    }
}

/// Sale m: 4 units over two buckets (2 + 2) and a restock of 2 (1 + 1)
/// first sent at 5 s. Bucket 0 confirms `qty` units at 60 ms, before the
/// restock: more than 2 is more than bucket 0 had, though the sale had 4
/// and every sum balances at the end (the restock covered the bucket).
fn two_bucket_sale(w: &mut World, qty: u32) {
    w.sales.push(SalePlan {
        buckets: 2,
        ..plan("m", 4, 0, 0)
    });
    w.ops
        .push(rec(30, buy("m", "u7", "r1", qty), order("m~0~x"), 60));
    w.rows.push(row("m~0~x", "m", "u7", u64::from(qty), "paid"));
    w.ops.push(rec(
        31,
        Op::Restock {
            sku: "m".into(),
            qty: 2,
            op_id: "opm".into(),
        },
        Outcome::Ok {
            value: OkValue::Done,
        },
        5_000,
    ));
    w.end.insert(
        "m".into(),
        EndLedger {
            initial: 6,
            stocks: vec![3 - i64::from(qty), 3],
            bucket_initials: vec![3, 3],
            bucket_restocks: vec![BTreeMap::from([("opm".to_owned(), 1)]); 2],
            ..EndLedger::default()
        },
    );
    w.reconcile.insert("m".into(), true);
}

/// Issue 33, item 7, per bucket: a bucket that confirmed more than it had,
/// covered by its own later restock, is caught though the sale never went
/// short; two units (all bucket 0 had) are not; nor are three once the
/// restock was sent first; and a record of the restocks' shares for some
/// buckets only is reported.
#[test]
fn a_bucket_oversold_while_another_had_units_is_caught_in_time() {
    let mut w = world();
    two_bucket_sale(&mut w, 3);
    let v = w.verdict();
    assert_eq!(
        fired(&v),
        vec![Kind::BucketOversoldInTime],
        "{:#?}",
        v.violations
    );
    assert_eq!(v.counts.get(&Kind::BucketOversoldInTime), Some(&1));

    let mut w = world();
    two_bucket_sale(&mut w, 2);
    let v = w.verdict();
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);

    let mut w = world();
    two_bucket_sale(&mut w, 3);
    if let Some(r) = w.ops.iter_mut().find(|o| o.id == 31) {
        r.invoke_ms = 20;
        r.complete_ms = 25;
    }
    let v = w.verdict();
    assert_eq!(fired(&v), vec![], "restock sent first: {:#?}", v.violations);

    let mut w = world();
    two_bucket_sale(&mut w, 2);
    w.end("m").bucket_restocks.truncate(1);
    let v = w.verdict();
    assert_eq!(
        fired(&v),
        vec![Kind::LedgerUnbalanced],
        "{:#?}",
        v.violations
    );
}

/// From the attack on the per-bucket check: a purchase that ended
/// `unknown` during the run, whose held order really took the last unit
/// early and expired, is confirmed only by the resolve phase after the run.
/// Counting its take at that answer but its give-back at the expiry lent
/// the sale a unit for the whole run, and hid a real oversell (here b and
/// c each took a unit after a had taken one of the two). Its take counts
/// from when its master made it, and a give-back never before its take.
#[test]
fn a_take_confirmed_only_after_the_run_is_counted_from_when_its_master_made_it() {
    let mut w = world();
    w.tighten_h();
    w.ops.push(rec(
        20,
        buy("h", "u4", "r9", 1),
        Outcome::unknown("timeout"),
        5,
    ));
    let mut resolved = rec(21, buy("h", "u4", "r9", 1), order("h~0~a"), 90_000);
    resolved.phase = Phase::Final;
    w.ops.push(resolved);
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + 10 + HOLD + 10),
        ..hold_row("h~0~a", "u4", "expired", 10)
    });
    w.events.insert(
        ("h~0~a".into(), 2),
        event("expired", START + 10 + HOLD + 10),
    );
    w.redis.insert("h~0~a".into(), ("expired".into(), 2));
    w.end("h").left.quotas.insert("u4".into(), 0);
    let v = w.verdict();
    assert_eq!(fired(&v), vec![Kind::OversoldInTime], "{:#?}", v.violations);

    // The same order made after c's unit came back (at 1,050 ms) took a
    // unit that was there: nothing to report.
    let mut w = world();
    w.tighten_h();
    w.ops.push(rec(
        20,
        buy("h", "u4", "r9", 1),
        Outcome::unknown("timeout"),
        1_100,
    ));
    let mut resolved = rec(21, buy("h", "u4", "r9", 1), order("h~0~a"), 90_000);
    resolved.phase = Phase::Final;
    w.ops.push(resolved);
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + 1_200 + HOLD + 10),
        ..hold_row("h~0~a", "u4", "expired", 1_200)
    });
    w.events.insert(
        ("h~0~a".into(), 2),
        event("expired", START + 1_200 + HOLD + 10),
    );
    w.redis.insert("h~0~a".into(), ("expired".into(), 2));
    w.end("h").left.quotas.insert("u4".into(), 0);
    let v = w.verdict();
    assert_eq!(fired(&v), vec![], "{:#?}", v.violations);
}

/// From the second attack on the over-time check: a late payment that
/// retook its expired hold's unit, whose answer was lost (`unknown`) and
/// whose retry was answered by the replay (`retaken: false`), took the
/// unit all the same; PostgreSQL records the retake. Counting it only on
/// an answer that said `retaken` left the unit lent to the sale for good,
/// hiding d's oversell (here covered by a later restock).
#[test]
fn a_retake_whose_answer_was_lost_is_counted_from_postgresql_s_record() {
    let mut w = world();
    w.tighten_h();
    if let Some(h) = w.sales.iter_mut().find(|s| s.sku == "h") {
        h.late = LatePayment::Retake;
    }
    // c expired at 1,050 ms; its late payment retook the unit at 1,105.
    w.pay("h~0~c", "p7", Outcome::unknown("timeout"), 1_100);
    w.pay("h~0~c", "p7", paid_ok(), 1_200);
    if let Some(c) = w.rows.iter_mut().find(|r| r.order_id == "h~0~c") {
        c.status = "paid".into();
        c.version = 3;
        c.payment_ref = Some("p7".into());
        c.paid_ms = Some(START + 1_105);
    }
    w.events.insert(
        ("h~0~c".into(), 3),
        DbEvent {
            retake: true,
            ..event("paid", START + 1_105)
        },
    );
    w.redis.insert("h~0~c".into(), ("paid".into(), 3));
    w.end("h").left.quotas.insert("u3".into(), 1);
    // d is confirmed with no unit left, then a restock covers it.
    w.ops
        .push(rec(40, buy("h", "u5", "r1", 1), order("h~0~d"), 1_300));
    w.rows.push(DbOrder {
        version: 2,
        expired_ms: Some(START + 1_300 + HOLD + 10),
        ..hold_row("h~0~d", "u5", "expired", 1_300)
    });
    w.events.insert(
        ("h~0~d".into(), 2),
        event("expired", START + 1_300 + HOLD + 10),
    );
    w.redis.insert("h~0~d".into(), ("expired".into(), 2));
    w.end("h").left.quotas.insert("u5".into(), 0);
    w.ops.push(rec(
        41,
        Op::Restock {
            sku: "h".into(),
            qty: 1,
            op_id: "oph".into(),
        },
        Outcome::Ok {
            value: OkValue::Done,
        },
        2_000,
    ));
    let end = w.end("h");
    end.initial = 3;
    end.bucket_initials = vec![3];
    let v = w.verdict();
    assert_eq!(fired(&v), vec![Kind::OversoldInTime], "{:#?}", v.violations);
}
