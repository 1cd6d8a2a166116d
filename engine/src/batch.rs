//! Natural batching per bucket. Invoking a script costs Redis more than the
//! few commands a purchase runs inside it, and each call costs the client a
//! round trip; so while a call to a bucket is in flight, the purchases whose
//! home is that bucket queue up, and when it returns, up to `batch_max` of
//! them go as one `EVALSHA` of `purchase.lua`, which decides each on its own,
//! in order. There is no timer: at low load every batch holds one purchase,
//! and latency is what it was.
//!
//! Under `ack = replicated`, the batch's `WAIT 1` goes in the same pipeline
//! as its script: one round trip confirms the whole batch on a replica.
//!
//! A batch that fails as a whole (NOSCRIPT, MOVED, a timeout, a failover) is
//! retried as a whole by [`Cluster::call`]: safe, because every purchase in
//! it is idempotent by its request record. A purchase whose caller went away
//! is still decided (as a single call already sent would be); its record
//! answers the caller's retry.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::cluster::Cluster;
use crate::config::{Ack, Config};
use crate::error::Unavailable;
use crate::keys::BucketKeys;
use crate::lua::BadReply;
use crate::metrics::{self as m, Stats};
pub(crate) use crate::scripts::purchase::HomePurchase;
use crate::scripts::purchase::{self, BatchArgs, HomeBucketKeys, PurchaseReply};

/// How long the WAIT sent with a batch under `ack = replicated` waits for a
/// replica before the batch's purchases are left to wait on their own
/// (`replication.rs`).
const WAIT_MS: u64 = 1000;

/// What the home bucket said of one purchase.
pub(crate) struct HomeReply {
    pub(crate) reply: PurchaseReply,
    /// Under `ack = replicated`: a replica acknowledged the batch's writes
    /// (the WAIT went in the same pipeline, on the same connection, right
    /// after the script, see [`Cluster::call_then_wait`]), so what the reply
    /// says of the home bucket needs no WAIT of its own.
    pub(crate) replicated: bool,
}

/// A purchase waiting for its batch, and where its answer goes.
struct Queued {
    purchase: HomePurchase,
    answer: oneshot::Sender<Result<HomeReply, Unavailable>>,
    queued_at: Instant,
}

/// The queue of one bucket: its fixed keys, and who waits.
pub(crate) struct BucketQueue {
    slot: u16,
    keys: BucketKeys,
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    waiting: VecDeque<Queued>,
    /// Batches of this bucket being sent now (each by its own task).
    in_flight: u32,
    /// Purchases in those batches.
    purchases_in_flight: usize,
}

impl std::fmt::Debug for BucketQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("BucketQueue")
            .field("slot", &self.slot)
            .field("waiting", &s.waiting.len())
            .field("in_flight", &s.in_flight)
            .field("purchases_in_flight", &s.purchases_in_flight)
            .finish()
    }
}

impl BucketQueue {
    /// The queue of the bucket with these keys, in `slot`.
    pub(crate) fn new(slot: u16, keys: &BucketKeys) -> Self {
        BucketQueue {
            slot,
            keys: keys.clone(),
            state: Mutex::default(),
        }
    }

    /// A std mutex: held only to push or take, never across an await; a
    /// poisoned lock is still usable (plain data).
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends the batches of every bucket of one engine.
#[derive(Clone)]
pub(crate) struct PurchaseBatches {
    cluster: Arc<Cluster>,
    stats: Arc<Stats>,
    batch_max: usize,
    in_flight_max: u32,
    /// `purchase.lua`'s ARGV[1] and ARGV[2], fixed by the config.
    request_ttl_secs: u64,
    replicated_flag: &'static str,
    /// `purchase.lua`'s ARGV[3], the form of the order record.
    order_record: &'static str,
    /// `ack = replicated`: a WAIT goes with each batch.
    replicated: bool,
    /// The retry deadline: the most a purchase may wait, queue included.
    deadline: Duration,
    /// `batch_light_load`: calls a bucket may have in flight, whatever
    /// `batch_in_flight` says, while they carry fewer purchases than this
    /// in all (0 = off). At light load a purchase then goes at once instead
    /// of waiting a round trip behind a lone purchase's call; it also makes
    /// batches smaller at middling load, which is why it is off by default.
    light_load: u32,
}

impl PurchaseBatches {
    /// Batches as `config` says (`batch_max`, `batch_in_flight`,
    /// `batch_light_load`, the ack mode, the request TTL and the retry
    /// deadline), sent on `cluster`.
    pub(crate) fn new(cluster: Arc<Cluster>, stats: Arc<Stats>, config: &Config) -> Self {
        PurchaseBatches {
            cluster,
            stats,
            batch_max: config.batch_max.max(1) as usize,
            in_flight_max: config.batch_in_flight.max(1),
            request_ttl_secs: config.request_ttl_secs(),
            replicated_flag: config.replicated_flag(),
            order_record: config.order_record.script_arg(),
            replicated: config.ack == Ack::Replicated,
            deadline: config.retry.deadline,
            light_load: config.batch_light_load,
        }
    }

    /// Runs `purchase` in its home bucket, in the next batch of `queue`, and
    /// answers with its own reply.
    pub(crate) async fn purchase(
        &self,
        queue: &Arc<BucketQueue>,
        purchase: HomePurchase,
    ) -> Result<HomeReply, Unavailable> {
        let (answer, reply) = oneshot::channel();
        self.stats.purchases_queued.fetch_add(1, Ordering::Relaxed);
        let start_sender = {
            let mut s = queue.lock();
            s.waiting.push_back(Queued {
                purchase,
                answer,
                queued_at: Instant::now(),
            });
            let light =
                s.in_flight < self.light_load && s.purchases_in_flight < self.light_load as usize;
            let start = s.in_flight < self.in_flight_max || light;
            if start {
                s.in_flight += 1;
            }
            start
        };
        if start_sender {
            let batches = self.clone();
            let queue = queue.clone();
            tokio::spawn(async move { batches.send_while_queued(&queue).await });
        }
        reply
            .await
            .unwrap_or_else(|_| Err(Unavailable::unconfirmed("purchase batch abandoned")))
    }

    /// Sends batches of `queue` until nobody waits. The sender stops only
    /// under the lock that saw the queue empty, so a purchase queued after
    /// that starts a sender of its own.
    async fn send_while_queued(&self, queue: &BucketQueue) {
        let mut sending = Sending {
            queue,
            stopped: false,
            purchases: 0,
        };
        loop {
            let (batch, expired) = {
                let mut s = queue.lock();
                // The batch just answered leaves the count under the same
                // lock that takes the next, so its buyers' next purchases,
                // queued meanwhile, see a loaded bucket, not an idle one.
                s.purchases_in_flight -= std::mem::take(&mut sending.purchases);
                if s.waiting.is_empty() {
                    s.in_flight -= 1;
                    sending.stopped = true;
                    return;
                }
                let (batch, expired) = self.next_batch(&mut s.waiting);
                s.purchases_in_flight += batch.len();
                sending.purchases = batch.len();
                (batch, expired)
            };
            if !expired.is_empty() {
                answer_all(
                    expired,
                    &Unavailable::unconfirmed(
                        "queued behind calls to this bucket that kept failing, past the \
                         retry deadline; it was never sent, retry",
                    ),
                );
            }
            if !batch.is_empty() {
                self.send(queue, batch).await;
            }
        }
    }

    /// Takes the next batch from the front of `waiting`. A purchase whose
    /// caller is gone is dropped unsent (it was never run, so nothing is
    /// left half-done), and one queued longer than the retry deadline
    /// (behind calls that kept failing) is returned apart, to be answered
    /// unsent: a purchase waits no longer than it would have retried alone.
    fn next_batch(&self, waiting: &mut VecDeque<Queued>) -> (Vec<Queued>, Vec<Queued>) {
        let mut batch = Vec::with_capacity(waiting.len().min(self.batch_max));
        let mut expired = Vec::new();
        while batch.len() < self.batch_max {
            let Some(q) = waiting.pop_front() else {
                break;
            };
            if q.answer.is_closed() {
                self.unsent("caller_gone");
            } else if q.queued_at.elapsed() >= self.deadline {
                self.unsent("queued_past_deadline");
                expired.push(q);
            } else {
                batch.push(q);
            }
        }
        (batch, expired)
    }

    fn unsent(&self, reason: &'static str) {
        metrics::counter!(m::PURCHASES_UNSENT, "reason" => reason).increment(1);
        self.stats.purchases_unsent.fetch_add(1, Ordering::Relaxed);
    }

    /// One `EVALSHA` of `purchase.lua` for `batch`, each reply to its own
    /// purchase; a batch that fails as a whole answers each with the error.
    async fn send(&self, queue: &BucketQueue, batch: Vec<Queued>) {
        let n = batch.len();
        let k = &queue.keys;
        let bucket = HomeBucketKeys {
            sale: &k.sale,
            stock: &k.stock,
            orders: &k.orders,
            pending: &k.pending,
            holds: &k.holds,
        };
        let args = BatchArgs {
            record_ttl_secs: self.request_ttl_secs,
            replicated: self.replicated_flag,
            order_record: self.order_record,
        };
        let call = args.call(
            &self.cluster.scripts().purchase,
            queue.slot,
            &bucket,
            batch.iter().map(|q| &q.purchase),
        );
        self.count(n);
        // The retry budget runs from when the oldest purchase was queued,
        // so no purchase is retried past the deadline (plus one response
        // timeout; under `ack = replicated` also the one pipelined attempt
        // before it, and the purchase's own WAIT rounds after).
        let since = batch
            .iter()
            .map(|q| q.queued_at)
            .min()
            .unwrap_or_else(Instant::now);
        let waited = if self.replicated && !planted!(SkipWait) {
            self.cluster
                .call_then_wait(&call, purchase::decode_batch, WAIT_MS)
                .await
        } else {
            None
        };
        let result = match waited {
            Some((replies, replicated)) => Ok((replies, replicated)),
            None => self
                .cluster
                .call_since(&call, purchase::decode_batch, since)
                .await
                .map(|replies| (replies, false)),
        };
        match result {
            Ok((replies, replicated)) if replies.len() == n => {
                for (q, reply) in batch.into_iter().zip(replies) {
                    let _ = q.answer.send(Ok(HomeReply { reply, replicated }));
                }
            }
            Ok((replies, _)) => {
                let e = Unavailable::Reply(BadReply {
                    script: "purchase",
                    detail: format!("{} replies to a batch of {n}", replies.len()),
                });
                answer_all(batch, &e);
            }
            Err(e) => answer_all(batch, &Unavailable::from(e)),
        }
    }

    fn count(&self, n: usize) {
        metrics::histogram!(m::PURCHASE_BATCH_SIZE).record(n as f64);
        self.stats.purchase_batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .largest_purchase_batch
            .fetch_max(n as u64, Ordering::Relaxed);
        self.stats.purchase_batch_sizes.record(n);
    }
}

fn answer_all(batch: Vec<Queued>, e: &Unavailable) {
    for q in batch {
        let _ = q.answer.send(Err(e.clone()));
    }
}

/// A running sender of one queue. Should its task end any other way than
/// by seeing the queue empty (a panic), it gives its place back, and when
/// no sender is left, answers whoever still waits instead of leaving them
/// waiting forever.
struct Sending<'a> {
    queue: &'a BucketQueue,
    stopped: bool,
    /// Purchases of the batch this sender has in flight.
    purchases: usize,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let stranded: Vec<Queued> = {
            let mut s = self.queue.lock();
            s.in_flight = s.in_flight.saturating_sub(1);
            s.purchases_in_flight = s.purchases_in_flight.saturating_sub(self.purchases);
            if s.in_flight > 0 {
                return;
            }
            s.waiting.drain(..).collect()
        };
        answer_all(
            stranded,
            &Unavailable::unconfirmed("the purchase batch sender stopped"),
        );
    }
}
