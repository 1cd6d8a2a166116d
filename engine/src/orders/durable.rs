//! The order writer's durability check: a batch is written to PostgreSQL
//! only once a replica of the stream's master has it (or the master has no
//! replica at all), and only if that master is the one the batch was read
//! from. Entries not yet replicated stay pending on the writer and are read
//! again from the current master, so entries a failover took back are never
//! written. Never writes stock, never answers buyers.

use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::entry::RawEntry;
use super::OrderWriter;

impl OrderWriter {
    /// The cluster id of the master serving `slot` now.
    pub(super) async fn master_id(&mut self, slot: u16) -> Result<String, redis::RedisError> {
        let v = self
            .conn
            .route_command(
                redis::cmd("CLUSTER").arg("MYID").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot,
                    SlotAddr::Master,
                ))),
            )
            .await?;
        Ok(match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::SimpleString(s) => s,
            other => format!("{other:?}"),
        })
    }

    /// Writes `entries` once a replica has them; otherwise leaves them
    /// pending on this consumer, to be read again next round.
    pub(super) async fn write_if_replicated(
        &mut self,
        key: &str,
        slot: u16,
        read_from: &str,
        entries: Vec<RawEntry>,
    ) -> Result<usize, redis::RedisError> {
        // Never write what a failover could take back.
        if !self.replicated(key, slot).await? || self.master_id(slot).await? != read_from {
            if let Some(s) = self.streams.get_mut(key) {
                s.reread_own = true;
            }
            return Ok(0);
        }
        let n = entries.len();
        self.handle_batch(key, entries).await?;
        Ok(n)
    }

    /// True when the cluster knows a replica of `slot`'s master, connected or
    /// not: a replica that is down now may come back stale and be promoted,
    /// so only a master with no replica at all can skip the WAIT. Asked of
    /// the master itself (`CLUSTER NODES`), at most once a second per slot.
    async fn master_has_replicas(&mut self, slot: u16) -> Result<bool, redis::RedisError> {
        if let Some((known, at)) = self.replica_cache.get(&slot) {
            if at.elapsed() < Duration::from_secs(1) {
                return Ok(*known);
            }
        }
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            slot,
            SlotAddr::Master,
        )));
        let nodes = self
            .conn
            .route_command(redis::cmd("CLUSTER").arg("NODES").clone(), route)
            .await?;
        let text = match nodes {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            redis::Value::SimpleString(s) => s,
            _ => String::new(),
        };
        let me = text
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split(' ').next());
        // Unknown shape: assume replicas, so nothing is written unwaited.
        let known = me.is_none_or(|id| {
            text.lines()
                .any(|l| l.split(' ').nth(3) == Some(id) && l.contains("slave"))
        });
        self.replica_cache.insert(slot, (known, Instant::now()));
        Ok(known)
    }

    /// True when a replica of `slot`'s master has every write that master
    /// made up to now (so every entry just read from it), or when that
    /// master has no replica to fail over to.
    ///
    /// WAIT counts only the writes of its own connection, and a read of the
    /// stream may not be one (re-reading pending entries is not), so a small
    /// write in the stream's slot goes first: its offset is the master's
    /// offset now, past every entry read.
    async fn replicated(&mut self, key: &str, slot: u16) -> Result<bool, redis::RedisError> {
        let route = || {
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )))
        };
        let has_replicas = self.master_has_replicas(slot).await?;
        if !has_replicas {
            return Ok(true);
        }
        let _: i64 = redis::cmd("INCR")
            .arg(format!("{key}:writer-fence"))
            .query_async(&mut self.conn)
            .await?;
        let acked = self
            .conn
            .route_command(
                redis::cmd("WAIT")
                    .arg(1)
                    .arg(self.config.replica_wait.as_millis() as u64)
                    .clone(),
                route(),
            )
            .await?;
        if matches!(acked, redis::Value::Int(n) if n >= 1) {
            return Ok(true);
        }
        self.report.held_unreplicated += 1;
        tracing::debug!(slot, "order batch held: no replica has it yet");
        Ok(false)
    }
}
