//! The random workload: which operation comes next, drawn from the seed
//! alone (so one seed gives one sequence of operations), and the sales it
//! starts with. Small stock and steady restocks keep every sale swinging
//! between selling and sold out; retries and reused ids test the request
//! record under every fault.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::protocol::Op;

/// One sale of the run, as created.
#[derive(Debug, Clone)]
pub struct SalePlan {
    /// SKU.
    pub sku: String,
    /// Stock at creation.
    pub stock: u64,
    /// Buckets (1 to 4).
    pub buckets: u32,
    /// Per-user limit (0: none).
    pub limit: u32,
    /// Payment window of its orders (0: paid when confirmed).
    pub hold_ms: u64,
    /// What a payment after the window gets.
    pub late: flashsale::LatePayment,
}

/// What the driver sends next.
#[derive(Debug, Clone)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// Engine process it goes to.
    pub process: usize,
    /// Also sent at once to the next process (a concurrent retry).
    pub twice: bool,
    /// Resent once under the same id if it ends `unknown`.
    pub retry_on_unknown: bool,
}

/// The seeded generator.
pub struct Workload {
    rng: StdRng,
    /// The sales, fixed at the start.
    pub sales: Vec<SalePlan>,
    users: usize,
    engines: usize,
    requests: Vec<(String, String, String, u32)>,
    next_rid: u64,
    restocks: Vec<(String, u64, String)>,
    closed: bool,
    locks: u64,
}

/// Buyer `i`'s id. One in ten is hostile but valid, as a real client's
/// may be: separators of the engine's own keys (`:`), braces that would
/// move a hash tag, non-ASCII, the longest id allowed, glob and escape
/// characters. A key built from them ambiguously (user `a:b` + request `c`
/// against user `a` + request `b:c`) or hashed by the wrong tag shows as
/// another buyer's order, a lost quota or a lost record.
fn user_name(i: usize) -> String {
    match i % 50 {
        3 => format!("u:{i}:r"),
        13 => format!("u{{{i}}}"),
        23 => format!("ü{i}✓"),
        33 => format!("{:x<120}{i:03}", "u"),
        43 => format!("u%{i}*?[\\"),
        _ => format!("u{i}"),
    }
}

/// Request `n`'s id; one in ten hostile, as for [`user_name`]: ids that
/// end like another buyer's name with a separator, or hold a hash tag.
fn request_id(n: u64) -> String {
    match n % 20 {
        7 => format!("{n}:r"),
        17 => format!("r{{{n}}}:"),
        _ => format!("r{n}"),
    }
}

/// Buyers in a run: few enough that per-user limits bind late in a run,
/// many enough that they do not answer most purchases.
const USERS: usize = 150;

impl Workload {
    /// The workload of `seed` for `engines` engine processes.
    pub fn new(seed: u64, engines: usize) -> Workload {
        let mut rng = StdRng::seed_from_u64(seed);
        let sales = (0..3)
            .map(|i| SalePlan {
                sku: format!("chaos-{i}"),
                stock: rng.random_range(20..=120),
                buckets: rng.random_range(1..=4),
                limit: [0, 0, 5, 8][rng.random_range(0..4)],
                // Sale 0 always holds orders, so every run has holds to
                // pay, cancel and expire; windows short enough that many
                // end inside a run, and some payments come too late.
                hold_ms: match (i, rng.random_range(0..3)) {
                    (0, w) | (_, w @ 1..) => [800, 1500, 3000][w as usize],
                    _ => 0,
                },
                late: if rng.random_bool(0.5) {
                    flashsale::LatePayment::Retake
                } else {
                    flashsale::LatePayment::Refuse
                },
            })
            .collect();
        Workload {
            rng,
            sales,
            users: USERS,
            engines: engines.max(1),
            requests: Vec::new(),
            next_rid: 0,
            restocks: Vec::new(),
            closed: false,
            locks: 0,
        }
    }

    /// The next step; `progress` is the share of the run already gone
    /// (closes happen only late, so most of a run sells); `held` is every
    /// order of a sale with holds confirmed so far, oldest first (payments
    /// and cancels pick from it).
    pub fn next(&mut self, progress: f64, held: &[String]) -> Step {
        let roll: u32 = self.rng.random_range(0..100);
        let process = self.rng.random_range(0..self.engines);
        let step = |op: Op, twice: bool, retry: bool| Step {
            op,
            process,
            twice,
            retry_on_unknown: retry,
        };
        match roll {
            0..=14 if !self.requests.is_empty() => {
                // Mostly a recent request, so the retry often lands while
                // its first attempt is still between scripts.
                let n = self.requests.len();
                let i = if self.rng.random_bool(0.7) {
                    n - 1 - self.rng.random_range(0..n.min(8))
                } else {
                    self.rng.random_range(0..n)
                };
                let (sku, user, rid, qty) = self.requests[i].clone();
                let twice = self.rng.random_bool(0.2);
                step(
                    Op::Purchase {
                        sku,
                        user,
                        rid,
                        qty,
                    },
                    twice,
                    true,
                )
            }
            15..=18 if !self.requests.is_empty() => {
                let i = self.rng.random_range(0..self.requests.len());
                let (sku, user, rid, qty) = self.requests[i].clone();
                let op = if self.rng.random_bool(0.5) {
                    // The same id with another quantity.
                    let other = 1 + (qty % 3);
                    Op::Purchase {
                        sku,
                        user,
                        rid,
                        qty: other,
                    }
                } else {
                    // The same id from another user: never their order.
                    let other = user_name(self.rng.random_range(0..self.users));
                    Op::Purchase {
                        sku,
                        user: other,
                        rid,
                        qty,
                    }
                };
                step(op, false, false)
            }
            19..=20 => {
                let sku = self.sku();
                if !self.restocks.is_empty() && self.rng.random_bool(0.15) {
                    let i = self.rng.random_range(0..self.restocks.len());
                    let (sku, qty, op_id) = self.restocks[i].clone();
                    return step(Op::Restock { sku, qty, op_id }, false, true);
                }
                let qty = self.rng.random_range(5..=30);
                let op_id = format!("restock-{}", self.restocks.len());
                self.restocks.push((sku.clone(), qty, op_id.clone()));
                step(Op::Restock { sku, qty, op_id }, false, true)
            }
            24 if progress > 0.7 && !self.closed => {
                self.closed = true;
                let sku = self.sku();
                step(Op::Close { sku }, false, true)
            }
            25..=30 => {
                let sku = self.sku();
                step(Op::Status { sku }, false, false)
            }
            34..=45 if !held.is_empty() => {
                let order_id = self.pick(held);
                // Mostly the shop's one reference for the order (its
                // retries replay); now and then another (a conflict).
                let payment_ref = if self.rng.random_bool(0.9) {
                    format!("pay-{order_id}")
                } else {
                    format!("alt-{}", self.rng.random_range(0..1000))
                };
                let twice = self.rng.random_bool(0.1);
                step(
                    Op::Pay {
                        order_id,
                        payment_ref,
                    },
                    twice,
                    true,
                )
            }
            46..=50 if !held.is_empty() => {
                let order_id = self.pick(held);
                let twice = self.rng.random_bool(0.2);
                step(Op::Cancel { order_id }, twice, true)
            }
            31..=33 => {
                self.locks += 1;
                let name = format!("chaos-lock-{}", self.rng.random_range(0..2));
                let owner = format!("holder-{}", self.locks);
                step(
                    Op::Lock {
                        name,
                        owner,
                        hold_ms: 300,
                    },
                    false,
                    false,
                )
            }
            _ => {
                let sku = self.sku();
                let user = user_name(self.rng.random_range(0..self.users));
                self.next_rid += 1;
                let rid = request_id(self.next_rid);
                let qty = self.rng.random_range(1..=3);
                self.requests
                    .push((sku.clone(), user.clone(), rid.clone(), qty));
                let twice = self.rng.random_bool(0.1);
                let retry = self.rng.random_bool(0.7);
                step(
                    Op::Purchase {
                        sku,
                        user,
                        rid,
                        qty,
                    },
                    twice,
                    retry,
                )
            }
        }
    }

    /// Mostly a recent order (still in its window, often paid or cancelled
    /// already: a retry), else any (often past its window: late).
    fn pick(&mut self, held: &[String]) -> String {
        let n = held.len();
        let i = if self.rng.random_bool(0.7) {
            n - 1 - self.rng.random_range(0..n.min(16))
        } else {
            self.rng.random_range(0..n)
        };
        held[i].clone()
    }

    /// Every buyer's name.
    pub fn users(&self) -> Vec<String> {
        (0..self.users).map(user_name).collect()
    }

    /// True when `sku`'s orders wait for payment.
    pub fn holds(&self, sku: &str) -> bool {
        self.sales.iter().any(|s| s.sku == sku && s.hold_ms > 0)
    }

    /// The longest payment window of any sale.
    pub fn longest_hold(&self) -> std::time::Duration {
        let ms = self.sales.iter().map(|s| s.hold_ms).max().unwrap_or(0);
        std::time::Duration::from_millis(ms)
    }

    fn sku(&mut self) -> String {
        let i = self.rng.random_range(0..self.sales.len());
        self.sales[i].sku.clone()
    }

    /// The generator's own random source, for the nemesis's schedule (a
    /// separate stream derived from the same seed).
    pub fn fork(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
}
