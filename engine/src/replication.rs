//! Group commit for `ack = replicated`: a purchase is confirmed only once one
//! replica has it (`WAIT 1`). WAIT covers every write made earlier on the
//! same connection, and all purchases of a slot share one multiplexed
//! connection to its master, so one WAIT sent after a purchase's reply covers
//! that purchase and every other one answered before it. Purchases of a slot
//! therefore queue for the next WAIT instead of sending one each (which would
//! also stall the shared connection once per purchase).
//!
//! A WAIT alone proves nothing about *which* writes it covers: when the
//! slot's master is down the client library sends it to any connected node
//! (another master answers `WAIT 1` with 1), a fresh connection's WAIT
//! covers none of the writes made on the old one, and after a failover the
//! promoted replica may never have had the write, or may hold another
//! attempt's record under the same key. So each batch is one pipeline on one
//! connection: `lua/ack.lua` (a probe write in the slot, which moves this
//! connection's replication offset past every earlier write on that node,
//! then a read of each waiter's record) and `WAIT 1`. A waiter is acked only
//! when the WAIT saw a replica and the node holds the very outcome the
//! waiter made or saw ([`Expect`]). Found by `flashsale-chaos --seed
//! 20261122` and its review.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisError, Value};
use tokio::sync::oneshot;

use crate::cluster::Cluster;
use crate::error::{classify, Recovery, Unavailable};
use crate::scripts::record::RequestRecord;

/// How long one WAIT may take before the batch is told "not replicated".
const WAIT_TIMEOUT_MS: u64 = 1000;

/// Answer of one WAIT to everyone in its batch: replicated, or why not.
type WaitAnswer = Result<bool, Unavailable>;

/// What a waiting purchase's record must say on the node that answers its
/// WAIT: the outcome this attempt made or saw there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Confirmed with this order.
    Confirmed(String),
    /// Pending (a home reservation before the walk).
    Pending,
    /// Refused by a bucket of a walk (`take.lua`'s `X:` record).
    Refused,
    /// A restock's `op:<id>` field with these units (Lua writes numbers
    /// past 10^14 in exponent form, so compared as numbers).
    Units(u64),
    /// A field with exactly this text (a sale's `state` = `closed`).
    Text(&'static str),
}

impl Expect {
    /// True when `record` (a record's text, "" when missing) is this outcome.
    pub(crate) fn held_by(&self, record: &str) -> bool {
        match self {
            Expect::Refused => record.starts_with("X:"),
            Expect::Units(units) => record.parse::<f64>().ok() == Some(*units as f64),
            Expect::Text(text) => record == *text,
            Expect::Pending => matches!(
                RequestRecord::parse(record),
                Some(RequestRecord::Pending { .. })
            ),
            Expect::Confirmed(id) => matches!(
                RequestRecord::parse(record),
                Some(RequestRecord::Confirmed { ref order_id, .. }) if order_id == id
            ),
        }
    }
}

/// One purchase waiting for the next WAIT of its slot.
struct Waiter {
    record: String,
    field: String,
    expect: Expect,
    tx: oneshot::Sender<WaitAnswer>,
}

/// Per slot: whether a WAIT driver runs, and who waits for the next WAIT.
#[derive(Default)]
struct SlotWaits {
    driving: bool,
    next_batch: Vec<Waiter>,
    probe: Option<String>,
}

/// The batches of every slot, and the connection their WAITs go out on.
#[derive(Clone)]
pub(crate) struct WaitBatches {
    cluster: Arc<Cluster>,
    /// A std mutex: held only to push or take.
    slots: Arc<Mutex<HashMap<u16, SlotWaits>>>,
}

impl WaitBatches {
    /// Batches whose WAITs go out on `cluster`'s shared connection (the one
    /// the purchases wrote on).
    pub(crate) fn new(cluster: Arc<Cluster>) -> Self {
        WaitBatches {
            cluster,
            slots: Arc::default(),
        }
    }

    /// The per-slot state; a poisoned lock is still usable (plain data).
    fn lock(&self) -> MutexGuard<'_, HashMap<u16, SlotWaits>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once a WAIT sent after this call returns: true when a
    /// replica acknowledged every write made before it on the slot's master
    /// and that master's `record` (a string key when `field` is empty, else
    /// that hash field) says `expect`.
    pub(crate) async fn replicated(
        &self,
        slot: u16,
        record: &str,
        field: &str,
        expect: Expect,
    ) -> WaitAnswer {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut slots = self.lock();
            let s = slots.entry(slot).or_default();
            s.next_batch.push(Waiter {
                record: record.to_owned(),
                field: field.to_owned(),
                expect,
                tx,
            });
            !std::mem::replace(&mut s.driving, true)
        };
        if start_driver {
            let batches = self.clone();
            tokio::spawn(async move { batches.drive(slot).await });
        }
        rx.await
            .unwrap_or_else(|_| Err(Unavailable::unconfirmed("replication wait abandoned")))
    }

    /// Sends WAITs for `slot` while anyone is queued, one per batch.
    async fn drive(&self, slot: u16) {
        loop {
            let (batch, probe) = {
                let mut slots = self.lock();
                let Some(s) = slots.get_mut(&slot) else {
                    return;
                };
                if s.next_batch.is_empty() {
                    s.driving = false;
                    return;
                }
                let probe = s.probe.get_or_insert_with(|| probe_key(slot)).clone();
                (std::mem::take(&mut s.next_batch), probe)
            };
            let keys: Vec<(&str, &str)> = batch
                .iter()
                .map(|w| (w.record.as_str(), w.field.as_str()))
                .collect();
            match self.wait_round(slot, &probe, &keys).await {
                Ok((acked, records)) => {
                    for (w, record) in batch.into_iter().zip(records) {
                        let _ = w.tx.send(Ok(acked && w.expect.held_by(&record)));
                    }
                }
                Err(e) => {
                    let e = Unavailable::from(e);
                    for w in batch {
                        let _ = w.tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// One group-commit round for `slot`: `lua/ack.lua` (probe write, then
    /// each record read) and `WAIT 1 timeout`, pipelined on one connection
    /// to the slot's master. `records` are (key, hash field or ""). Returns
    /// whether a replica acknowledged everything written on that node before
    /// the WAIT, and each value on that node ("" if missing).
    async fn wait_round(
        &self,
        slot: u16,
        probe: &str,
        records: &[(&str, &str)],
    ) -> Result<(bool, Vec<String>), RedisError> {
        let script = &self.cluster.scripts().ack;
        let mut pipe = redis::pipe();
        let eval = pipe
            .cmd("EVALSHA")
            .arg(&script.sha)
            .arg(1 + records.len())
            .arg(probe);
        for (key, _) in records {
            eval.arg(*key);
        }
        eval.arg(60_000);
        for (_, field) in records {
            eval.arg(*field);
        }
        pipe.cmd("WAIT").arg(1).arg(WAIT_TIMEOUT_MS);
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        let replies = match self.cluster.conn().route_pipeline(pipe, 0, 2, route).await {
            Ok(r) => r,
            Err(e) => {
                if classify(&e) == Recovery::ReloadScript {
                    // The caller retries; the script is there by then.
                    let _ = self.cluster.reload_on(script, slot).await;
                }
                return Err(e);
            }
        };
        // An error comes back inline in a pipeline: NOSCRIPT (a promoted
        // replica never had the script) is reloaded for the caller's next
        // round; any other error, or anything but the records, acks nobody.
        if let Some(Value::ServerError(e)) = replies.first() {
            let e = RedisError::from(e.clone());
            if classify(&e) == Recovery::ReloadScript {
                let _ = self.cluster.reload_on(script, slot).await;
            }
            return Err(e);
        }
        let values: Vec<String> = match replies.first() {
            Some(Value::Array(items)) if items.len() == records.len() => items
                .iter()
                .map(|v| match v {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    _ => String::new(),
                })
                .collect(),
            _ => return Ok((false, vec![String::new(); records.len()])),
        };
        let acked = matches!(replies.get(1), Some(Value::Int(n)) if *n >= 1);
        Ok((acked, values))
    }
}

/// A key in `slot` that no sale uses: the batch's probe write lands there.
fn probe_key(slot: u16) -> String {
    (0u32..)
        .map(|i| format!("ack{i}"))
        .find(|tag| crate::placement::tag_slot(tag) == slot)
        .map(|tag| format!("{{{tag}}}:ack-probe"))
        .unwrap_or_default()
}
