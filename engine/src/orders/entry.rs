//! A stream entry as the scripts wrote it, parsed into an [`OrderRow`] (a new
//! order, from `purchase.lua`/`take.lua`) or an [`OrderEvent`] (a held
//! order's transition, from `transition.lua`), or refused with the reason it
//! goes to the dead-letter stream. Pure parsing; no I/O.
//!
//! A new order is written as one field (`p`, or `h` when it is held), its
//! parts separated by spaces, which no SKU, order id or user id may hold:
//! each field of an `XADD` costs the master about half a microsecond (the
//! call's argument, the listpack, the AOF and the replica each take it), as
//! much as the rest of the order record. What the stream already says is
//! not repeated: the SKU and the bucket are in the order id, and the shard
//! tag is the stream's. Entries in the older form, a field per column, still
//! parse, so streams written before it drain.

use redis::Value;

use crate::order_id;

/// One raw stream entry: its id and its field/value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    /// Stream entry id (`ms-seq`).
    pub id: String,
    /// Field/value pairs in order (empty when the entry was deleted).
    pub fields: Vec<(String, String)>,
}

/// An order ready for PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRow {
    /// Primary key.
    pub order_id: String,
    /// The SKU.
    pub sku: String,
    /// The buyer.
    pub user_id: String,
    /// Units.
    pub qty: i32,
    /// Bucket that served it.
    pub bucket: i32,
    /// Shard tag of the bucket.
    pub shard_tag: String,
    /// Stream entry id it came from.
    pub stream_id: String,
    /// When the script ran, ms since the Unix epoch (Redis server time).
    pub created_ms: i64,
    /// When its hold ends (ms), for an order made held; `None`: paid at once.
    pub expires_ms: Option<i64>,
}

/// A held order's transition, ready for PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderEvent {
    /// The order.
    pub order_id: String,
    /// The order's version after it (2, 3, ...: the order writer applies an
    /// event only over a lower version, so events apply in order whatever
    /// order they are written in).
    pub version: i32,
    /// `paid`, `cancelled` or `expired`.
    pub kind: String,
    /// When it happened, ms since the Unix epoch (Redis server time).
    pub at_ms: i64,
    /// The payment reference (`paid`).
    pub payment_ref: Option<String>,
    /// The order's units.
    pub qty: i32,
    /// A late payment that took the units again (they had gone back).
    pub retake: bool,
    /// Shard tag of the bucket.
    pub shard_tag: String,
    /// Stream entry id it came from.
    pub stream_id: String,
}

impl OrderEvent {
    /// What it did to the units out of stock: cancelled and expired gave
    /// them back, a retake took them again, a payment in time changed
    /// nothing.
    pub fn units_delta(&self) -> i64 {
        match (self.kind.as_str(), self.retake) {
            ("cancelled" | "expired", _) => -i64::from(self.qty),
            ("paid", true) => i64::from(self.qty),
            _ => 0,
        }
    }
}

/// What a stream entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A new order.
    Order(OrderRow),
    /// A transition of a held order.
    Event(OrderEvent),
}

impl RawEntry {
    fn get(&self, k: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(f, _)| f == k)
            .map(|(_, v)| v.as_str())
    }

    /// Parses the entry of the stream of shard tag `tag`, or says why it
    /// cannot be an order or a transition.
    pub fn to_record(&self, tag: &str) -> Result<Record, BadEntry> {
        match self.get("kind") {
            None => self.to_order(tag).map(Record::Order),
            Some(kind) => self.to_event(kind).map(Record::Event),
        }
    }

    fn to_event(&self, kind: &str) -> Result<OrderEvent, BadEntry> {
        if !matches!(kind, "paid" | "cancelled" | "expired") {
            return Err(BadEntry::UnknownKind(kind.to_owned()));
        }
        let order_id = match self.get("order_id") {
            Some(v) if !v.is_empty() => v.to_owned(),
            _ => return Err(BadEntry::Missing("order_id")),
        };
        let int = |k: &'static str| -> Result<i64, BadEntry> {
            self.get(k)
                .ok_or(BadEntry::Missing(k))?
                .parse::<i64>()
                .map_err(|_| BadEntry::NotInteger(k))
        };
        let version = int("v")?;
        if !(2..=i64::from(i32::MAX)).contains(&version) {
            return Err(BadEntry::OutOfRange("v", version));
        }
        let payment_ref = self
            .get("pay_ref")
            .filter(|r| !r.is_empty())
            .map(str::to_owned);
        if kind == "paid" && payment_ref.is_none() {
            return Err(BadEntry::Missing("pay_ref"));
        }
        let qty = int("qty")?;
        if !(1..=i64::from(i32::MAX)).contains(&qty) {
            return Err(BadEntry::OutOfRange("qty", qty));
        }
        let shard_tag = match self.get("tag") {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => return Err(BadEntry::Missing("tag")),
        };
        Ok(OrderEvent {
            order_id,
            version: version as i32,
            kind: kind.to_owned(),
            at_ms: int("ts")?,
            payment_ref,
            qty: qty as i32,
            retake: self.get("retake") == Some("1"),
            shard_tag,
            stream_id: self.id.clone(),
        })
    }

    /// Parses the entry of the stream of shard tag `tag`, or says why it
    /// cannot be an order.
    pub fn to_order(&self, tag: &str) -> Result<OrderRow, BadEntry> {
        if let Some(paid) = self.get("p") {
            return self.compact_order(tag, paid, false);
        }
        if let Some(held) = self.get("h") {
            return self.compact_order(tag, held, true);
        }
        self.field_per_column_order()
    }

    /// `p`: `<qty> <ts> <order_id> <user>`; `h`: `<qty> <ts> <expires_ms>
    /// <order_id> <user>` (the user last, so nothing after it could be
    /// misread). `ts` is the script's clock, the one a hold's deadline is
    /// counted from: not the entry id, whose time steps on through a batch
    /// and stays ahead after the clock steps back.
    fn compact_order(&self, tag: &str, record: &str, held: bool) -> Result<OrderRow, BadEntry> {
        let field = if held { "h" } else { "p" };
        let mut parts = record.splitn(if held { 5 } else { 4 }, ' ');
        let mut next = || parts.next().filter(|p| !p.is_empty());
        let (Some(qty), Some(ts)) = (next(), next()) else {
            return Err(BadEntry::Malformed(field));
        };
        let expires_ms = if held {
            let e = next().ok_or(BadEntry::Malformed(field))?;
            Some(
                e.parse::<i64>()
                    .map_err(|_| BadEntry::NotInteger("expires_ms"))?,
            )
        } else {
            None
        };
        let (Some(order_id), Some(user)) = (next(), next()) else {
            return Err(BadEntry::Malformed(field));
        };
        let qty = qty
            .parse::<i64>()
            .map_err(|_| BadEntry::NotInteger("qty"))?;
        if !(1..=i64::from(i32::MAX)).contains(&qty) {
            return Err(BadEntry::OutOfRange("qty", qty));
        }
        let created_ms = ts.parse::<i64>().map_err(|_| BadEntry::NotInteger("ts"))?;
        let route = order_id::route(order_id).map_err(|_| BadEntry::Malformed("order_id"))?;
        let bucket = i32::try_from(route.bucket)
            .map_err(|_| BadEntry::OutOfRange("bucket", i64::from(route.bucket)))?;
        if tag.is_empty() {
            return Err(BadEntry::Missing("tag"));
        }
        Ok(OrderRow {
            order_id: order_id.to_owned(),
            sku: route.sku.to_owned(),
            user_id: user.to_owned(),
            qty: qty as i32,
            bucket,
            shard_tag: tag.to_owned(),
            stream_id: self.id.clone(),
            created_ms,
            expires_ms,
        })
    }

    /// The older form: a field per column.
    fn field_per_column_order(&self) -> Result<OrderRow, BadEntry> {
        let text = |k: &'static str| -> Result<String, BadEntry> {
            match self.get(k) {
                Some(v) if !v.is_empty() => Ok(v.to_owned()),
                _ => Err(BadEntry::Missing(k)),
            }
        };
        let int = |k: &'static str| -> Result<i64, BadEntry> {
            text(k)?.parse::<i64>().map_err(|_| BadEntry::NotInteger(k))
        };
        let qty = int("qty")?;
        if !(1..=i64::from(i32::MAX)).contains(&qty) {
            return Err(BadEntry::OutOfRange("qty", qty));
        }
        let bucket = int("bucket")?;
        if !(0..=i64::from(i32::MAX)).contains(&bucket) {
            return Err(BadEntry::OutOfRange("bucket", bucket));
        }
        let expires_ms = match self.get("status") {
            None | Some("paid") => None,
            Some("held") => Some(int("expires_ms")?),
            Some(other) => return Err(BadEntry::UnknownKind(other.to_owned())),
        };
        Ok(OrderRow {
            order_id: text("order_id")?,
            sku: text("sku")?,
            user_id: text("user")?,
            qty: qty as i32,
            bucket: bucket as i32,
            shard_tag: text("tag")?,
            stream_id: self.id.clone(),
            created_ms: int("ts")?,
            expires_ms,
        })
    }
}

/// Why a stream entry cannot be an order (it is dead-lettered with this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    /// A field is missing or empty.
    #[error("missing field {0}")]
    Missing(&'static str),
    /// A field that must be an integer is not.
    #[error("field {0} is not an integer")]
    NotInteger(&'static str),
    /// An integer field is out of its range.
    #[error("{0} {1} out of range")]
    OutOfRange(&'static str, i64),
    /// A field that must hold parts in a fixed form does not.
    #[error("field {0} is not in its form")]
    Malformed(&'static str),
    /// A transition or status the writer does not know.
    #[error("unknown kind or status {0:?}")]
    UnknownKind(String),
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Parses a list of entries (`[[id, [f, v, ...]], ...]`), the shape of
/// XRANGE, of one stream in XREADGROUP, and of XAUTOCLAIM's second element.
pub fn parse_entries(v: &Value) -> Vec<RawEntry> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(parts) = item else {
                return None;
            };
            let id = text(parts.first()?)?;
            let fields = match parts.get(1) {
                Some(Value::Array(kv)) => kv
                    .chunks(2)
                    .filter_map(|c| Some((text(&c[0])?, text(c.get(1)?)?)))
                    .collect(),
                _ => Vec::new(),
            };
            Some(RawEntry { id, fields })
        })
        .collect()
}

/// The entries of the one stream in an XREADGROUP reply (`[[key, entries]]`,
/// or nil when nothing is there).
pub fn parse_xreadgroup(v: &Value) -> Vec<RawEntry> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .flat_map(|s| match s {
                Value::Array(kv) if kv.len() == 2 => parse_entries(&kv[1]),
                _ => Vec::new(),
            })
            .collect(),
        Value::Map(m) => m.iter().flat_map(|(_, e)| parse_entries(e)).collect(),
        _ => Vec::new(),
    }
}

/// The id just after `id` (`ms-seq` -> `ms-(seq+1)`), for XTRIM MINID.
pub fn next_id(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let seq: u64 = seq.parse().ok()?;
    let ms: u64 = ms.parse().ok()?;
    Some(match seq.checked_add(1) {
        Some(s) => format!("{ms}-{s}"),
        // The last id there is has no next one: None, never a wrap to 0-0.
        None => format!("{}-0", ms.checked_add(1)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> RawEntry {
        RawEntry {
            id: "5-1".into(),
            fields: fields
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_script_entry_parses_and_poison_gets_a_reason() {
        let good = entry(&[
            ("order_id", "o1"),
            ("sku", "s"),
            ("user", "u"),
            ("qty", "2"),
            ("bucket", "1"),
            ("tag", "s#1.0"),
            ("ts", "1700000000000"),
        ]);
        let row = good.to_order("s#1.0").expect("parses");
        assert_eq!((row.qty, row.bucket, row.stream_id.as_str()), (2, 1, "5-1"));
        assert_eq!(
            entry(&[("junk", "1")])
                .to_order("s#1.0")
                .unwrap_err()
                .to_string(),
            "missing field qty"
        );
        let bad_qty = entry(&[("order_id", "o"), ("qty", "many")]);
        assert_eq!(
            bad_qty.to_order("s#1.0").unwrap_err(),
            BadEntry::NotInteger("qty")
        );
    }

    fn compact(id: &str, field: &str, record: &str) -> RawEntry {
        RawEntry {
            id: id.into(),
            fields: vec![(field.into(), record.into())],
        }
    }

    const ORDER: &str = "phone-x:red~2~0123456789abcdef0123456789abcdef";

    #[test]
    fn a_compact_order_takes_sku_and_bucket_from_its_id_and_tag_from_its_stream() {
        let paid = compact(
            "1800000000000-4",
            "p",
            &format!("3 1700000000123 {ORDER} user:é#1"),
        );
        let row = paid.to_order("phone-x:red#2.7").expect("parses");
        assert_eq!(
            row,
            OrderRow {
                order_id: ORDER.into(),
                sku: "phone-x:red".into(),
                user_id: "user:é#1".into(),
                qty: 3,
                bucket: 2,
                shard_tag: "phone-x:red#2.7".into(),
                stream_id: "1800000000000-4".into(),
                created_ms: 1_700_000_000_123,
                expires_ms: None,
            }
        );
        let held = compact(
            "5-0",
            "h",
            &format!("1 1700000000000 1700000900000 {ORDER} u"),
        );
        let row = held.to_order("t").expect("parses");
        assert_eq!(
            (
                row.qty,
                row.expires_ms,
                row.user_id.as_str(),
                row.created_ms
            ),
            (1, Some(1_700_000_900_000), "u", 1_700_000_000_000)
        );
    }

    #[test]
    fn a_compact_order_that_is_not_in_its_form_gets_a_reason() {
        let bad = |field: &str, record: &str| compact("5-1", field, record).to_order("t");
        let malformed = |f| Err(BadEntry::Malformed(f));
        assert_eq!(bad("p", "1 17 only-three"), malformed("p"));
        assert_eq!(bad("p", "1"), malformed("p"));
        assert_eq!(bad("p", ""), malformed("p"));
        assert_eq!(bad("p", &format!("1 17  {ORDER} u")), malformed("p"));
        let not_integer = |f| Err(BadEntry::NotInteger(f));
        assert_eq!(bad("p", &format!("lots 17 {ORDER} u")), not_integer("qty"));
        assert_eq!(bad("p", &format!("1 soon {ORDER} u")), not_integer("ts"));
        assert_eq!(
            bad("h", &format!("1 17 {ORDER} u")),
            not_integer("expires_ms")
        );
        assert_eq!(
            bad("p", &format!("0 17 {ORDER} u")),
            Err(BadEntry::OutOfRange("qty", 0))
        );
        assert_eq!(
            bad("p", &format!("4294967296 17 {ORDER} u")),
            Err(BadEntry::OutOfRange("qty", 4_294_967_296))
        );
        assert_eq!(bad("p", "1 17 not-an-order-id u"), malformed("order_id"));
        assert_eq!(bad("h", "1 17 18"), malformed("h"));
        assert_eq!(
            compact("5-1", "p", &format!("1 17 {ORDER} u")).to_order(""),
            Err(BadEntry::Missing("tag"))
        );
    }

    #[test]
    fn a_transition_parses_and_a_bad_one_gets_a_reason() {
        let paid = entry(&[
            ("kind", "paid"),
            ("order_id", "s~0~x"),
            ("v", "2"),
            ("ts", "17"),
            ("pay_ref", "p1"),
            ("qty", "2"),
            ("retake", "0"),
            ("tag", "s#0"),
        ]);
        match paid.to_record("s#0") {
            Ok(Record::Event(e)) => {
                assert_eq!(
                    (e.version, e.kind.as_str(), e.payment_ref.as_deref()),
                    (2, "paid", Some("p1"))
                )
            }
            other => panic!("{other:?}"),
        }
        let no_ref = entry(&[("kind", "paid"), ("order_id", "o"), ("v", "2"), ("ts", "1")]);
        assert_eq!(no_ref.to_record("s#0"), Err(BadEntry::Missing("pay_ref")));
        let v1 = entry(&[
            ("kind", "expired"),
            ("order_id", "o"),
            ("v", "1"),
            ("ts", "1"),
        ]);
        assert_eq!(v1.to_record("s#0"), Err(BadEntry::OutOfRange("v", 1)));
        let odd = entry(&[("kind", "refunded"), ("order_id", "o")]);
        assert!(matches!(
            odd.to_record("s#0"),
            Err(BadEntry::UnknownKind(_))
        ));
    }

    #[test]
    fn next_id_steps_past_an_entry() {
        assert_eq!(next_id("17-3").as_deref(), Some("17-4"));
        assert_eq!(next_id("oops"), None);
        assert_eq!(
            next_id("18446744073709551615-18446744073709551615"),
            None,
            "the largest id has no next"
        );
    }
}
