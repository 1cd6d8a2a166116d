//! Where keys live: the CRC16-XMODEM slot of a hash tag, the cluster's slot
//! map as read from `CLUSTER SLOTS`, and the choice of shard tags so that the
//! buckets of one SKU sit on distinct masters. Pure functions plus one parser;
//! never sends a command itself.

use redis::Value;

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster slot of a key: CRC16-XMODEM of its hash tag (the part between
/// the first `{` and the next `}`, when not empty) or of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

/// The slot that every key tagged `{tag}` maps to.
pub fn tag_slot(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// One contiguous range of slots and the master that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot of the range.
    pub start: u16,
    /// Last slot of the range (inclusive).
    pub end: u16,
    /// `host:port` of the master.
    pub master: String,
    /// `host:port` of each replica.
    pub replicas: Vec<String>,
}

/// The cluster's slot map at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// Ranges sorted by start slot.
    pub ranges: Vec<SlotRange>,
}

impl SlotMap {
    /// Parses a `CLUSTER SLOTS` reply. Returns `None` when the reply does not
    /// have the documented shape.
    pub fn from_cluster_slots(reply: &Value) -> Option<SlotMap> {
        let Value::Array(items) = reply else {
            return None;
        };
        let mut ranges = Vec::with_capacity(items.len());
        for item in items {
            let Value::Array(parts) = item else {
                return None;
            };
            if parts.len() < 3 {
                return None;
            }
            let start = as_int(&parts[0])?;
            let end = as_int(&parts[1])?;
            let master = node_addr(&parts[2])?;
            let replicas = parts[3..].iter().filter_map(node_addr).collect();
            ranges.push(SlotRange {
                start: u16::try_from(start).ok()?,
                end: u16::try_from(end).ok()?,
                master,
                replicas,
            });
        }
        ranges.sort_by_key(|r| r.start);
        Some(SlotMap { ranges })
    }

    /// The master serving `slot`, if any range covers it.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .map(|r| r.master.as_str())
    }

    /// Distinct masters, sorted, so every process sees the same order.
    pub fn masters(&self) -> Vec<String> {
        let mut m: Vec<String> = self.ranges.iter().map(|r| r.master.clone()).collect();
        m.sort();
        m.dedup();
        m
    }

    /// True when every slot is served.
    pub fn covers_all_slots(&self) -> bool {
        let mut next = 0u32;
        for r in &self.ranges {
            if u32::from(r.start) != next {
                return false;
            }
            next = u32::from(r.end) + 1;
        }
        next == u32::from(SLOTS)
    }
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn node_addr(v: &Value) -> Option<String> {
    let Value::Array(node) = v else {
        return None;
    };
    let host = match node.first()? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let port = as_int(node.get(1)?)?;
    Some(format!("{host}:{port}"))
}

/// Picks one shard tag per bucket of `sku` so that bucket `b` lands on master
/// `(offset + b) % masters`, where the offset comes from the SKU itself: the
/// buckets of one SKU spread over distinct masters (as many as there are),
/// and different SKUs start on different masters.
///
/// Tags look like `sku#b.k`; `k` is the first counter whose slot belongs to
/// the wanted master. Returns `None` when the slot map has no masters.
pub fn pick_tags(sku: &str, buckets: u32, map: &SlotMap) -> Option<Vec<String>> {
    let masters = map.masters();
    if masters.is_empty() {
        return None;
    }
    let offset = usize::from(tag_slot(sku)) % masters.len();
    let mut tags = Vec::with_capacity(buckets as usize);
    for b in 0..buckets as usize {
        let wanted = &masters[(offset + b) % masters.len()];
        // A master owns at least 1/16384 of the slots, so a few thousand
        // candidates find one with overwhelming probability; bounded anyway.
        let tag = (0u32..200_000)
            .map(|k| format!("{sku}#{b}.{k}"))
            .find(|t| map.master_of(tag_slot(t)) == Some(wanted.as_str()))?;
        tags.push(tag);
    }
    Some(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % SLOTS
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    fn three_masters() -> SlotMap {
        SlotMap {
            ranges: vec![
                SlotRange {
                    start: 0,
                    end: 5460,
                    master: "a:1".into(),
                    replicas: vec![],
                },
                SlotRange {
                    start: 5461,
                    end: 10922,
                    master: "b:1".into(),
                    replicas: vec![],
                },
                SlotRange {
                    start: 10923,
                    end: 16383,
                    master: "c:1".into(),
                    replicas: vec![],
                },
            ],
        }
    }

    #[test]
    fn buckets_of_one_sku_land_on_distinct_masters() {
        let map = three_masters();
        assert!(map.covers_all_slots());
        let tags = pick_tags("phone-x", 3, &map).expect("tags");
        let mut masters: Vec<_> = tags
            .iter()
            .map(|t| map.master_of(tag_slot(t)).unwrap())
            .collect();
        masters.sort();
        masters.dedup();
        assert_eq!(masters.len(), 3);
    }

    #[test]
    fn gaps_in_the_slot_map_are_seen() {
        let mut map = three_masters();
        map.ranges.remove(1);
        assert!(!map.covers_all_slots());
    }
}
