//! Key names. Every key of a bucket carries the bucket's shard tag in braces,
//! so every key one script touches hashes to one slot; every name is built
//! here and passed to scripts in KEYS (never assembled inside Lua).

/// Prefix of every key the engine owns outside bucket tags.
const NS: &str = "fs";

/// Hash of a sale's metadata (buckets' tags, limits, window).
pub fn sale_meta(sku: &str) -> String {
    format!("{{{NS}:{sku}}}:meta")
}

/// Set of every SKU that has a sale, read by the order writer and reconcile.
pub fn sale_index() -> &'static str {
    "{fs}:skus"
}

/// The fixed keys of one bucket, built once when the sale is loaded.
#[derive(Debug, Clone)]
pub struct BucketKeys {
    /// `{tag}:sale`, the hash the scripts read the sale's state from.
    pub sale: String,
    /// `{tag}:stock`, units left.
    pub stock: String,
    /// `{tag}:orders`, the order stream.
    pub orders: String,
    /// `{tag}:pending`, the sorted set of this bucket's pending fall-throughs
    /// (member [`pending_member`], score: ms when it became pending).
    pub pending: String,
    /// `{tag}:holds`, the deadline index of this bucket's held orders
    /// (member: order id, score: ms when the hold expires).
    pub holds: String,
    /// `{tag}:owed`, orders of this bucket whose units came back while the
    /// buyer's quota, in another bucket, is still to be given back
    /// (member: order id, score: ms).
    pub owed: String,
    /// `{tag}:` prefix of per-request and per-user keys.
    prefix: String,
}

impl BucketKeys {
    /// The keys of the bucket whose shard tag is `tag`.
    pub fn new(tag: &str) -> Self {
        BucketKeys {
            sale: format!("{{{tag}}}:sale"),
            stock: format!("{{{tag}}}:stock"),
            orders: format!("{{{tag}}}:orders"),
            pending: format!("{{{tag}}}:pending"),
            holds: format!("{{{tag}}}:holds"),
            owed: format!("{{{tag}}}:owed"),
            prefix: format!("{{{tag}}}:"),
        }
    }

    /// `{tag}:r:<n>:<user>:<request_id>`, the record of one request in
    /// this bucket. A request is (sku, user, request_id): the tag names the
    /// sale, and the user's length `n` keeps `("a:b", "c")` and `("a", "b:c")`
    /// apart.
    pub fn request(&self, user: &str, request_id: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 8 + user.len() + request_id.len());
        k.push_str(&self.prefix);
        k.push_str("r:");
        push_member(&mut k, user, request_id);
        k
    }

    /// `{tag}:o:<order_id>`, the hash of a held order (sales with
    /// `hold_ms > 0`): its state, buyer, units and deadline.
    pub fn order(&self, order_id: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 2 + order_id.len());
        k.push_str(&self.prefix);
        k.push_str("o:");
        k.push_str(order_id);
        k
    }

    /// `{tag}:u:<order_id>`, in the buyer's home bucket: set once the quota
    /// of an order served by another bucket was given back, so it is given
    /// back once.
    pub fn quota_returned(&self, order_id: &str) -> String {
        format!("{}u:{order_id}", self.prefix)
    }

    /// `{tag}:q:<user>`, units a user bought or reserved (home bucket only).
    pub fn quota(&self, user: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 2 + user.len());
        k.push_str(&self.prefix);
        k.push_str("q:");
        k.push_str(user);
        k
    }
}

/// `<n>:<user>:<request_id>`: how a request is named inside its bucket,
/// both in its record's key and in the pending index.
pub fn pending_member(user: &str, request_id: &str) -> String {
    let mut m = String::with_capacity(8 + user.len() + request_id.len());
    push_member(&mut m, user, request_id);
    m
}

/// Splits a [`pending_member`] back into (user, request_id).
pub fn parse_pending_member(m: &str) -> Option<(&str, &str)> {
    let (n, rest) = m.split_once(':')?;
    let n: usize = n.parse().ok()?;
    let user = rest.get(..n)?;
    let request_id = rest.get(n..)?.strip_prefix(':')?;
    Some((user, request_id))
}

fn push_member(k: &mut String, user: &str, request_id: &str) {
    use std::fmt::Write;
    let _ = write!(k, "{}:", user.len());
    k.push_str(user);
    k.push(':');
    k.push_str(request_id);
}

/// The order stream of a shard tag.
pub fn orders_stream(tag: &str) -> String {
    format!("{{{tag}}}:orders")
}

/// The shard tag of an order stream's key (`{tag}:orders` -> `tag`).
pub fn stream_tag(stream: &str) -> Option<&str> {
    stream.strip_prefix('{')?.strip_suffix("}:orders")
}

/// The dead-letter stream of a shard tag (malformed order entries).
pub fn dead_letter_stream(tag: &str) -> String {
    format!("{{{tag}}}:orders:dead")
}

/// `{fs:<sku>}:room`, the waiting room's gate (cursor, counts, rounds), in
/// the slot of the sale's metadata (`room/`, `lua/admit.lua`).
pub fn room_gate(sku: &str) -> String {
    format!("{{{NS}:{sku}}}:room")
}

/// `{fs:<sku>}:rounds`, the admission rounds not yet past their window.
pub fn room_rounds(sku: &str) -> String {
    format!("{{{NS}:{sku}}}:rounds")
}

/// `{fs:<sku>}:done`, the users whose admission was used.
pub fn room_done(sku: &str) -> String {
    format!("{{{NS}:{sku}}}:done")
}

/// The channel a room's sold-out flips are published on.
pub fn room_channel(sku: &str) -> String {
    format!("{NS}:room:{sku}")
}

/// `{tag}:line`, one shard of a sale's waiting line (member user, score
/// place), in its bucket's slot.
pub fn line(tag: &str) -> String {
    format!("{{{tag}}}:line")
}

/// `{tag}:lineh`, that shard's floor and histogram of places.
pub fn line_hist(tag: &str) -> String {
    format!("{{{tag}}}:lineh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_named_by_user_and_request_id_without_ambiguity() {
        let k = BucketKeys::new("t");
        assert_eq!(k.request("alice", "r1"), "{t}:r:5:alice:r1");
        assert_ne!(k.request("a:b", "c"), k.request("a", "b:c"));
        for (u, r) in [("a:b", "c"), ("a", "b:c"), ("u", "")] {
            assert_eq!(parse_pending_member(&pending_member(u, r)), Some((u, r)));
        }
        assert_eq!(parse_pending_member("9:short:x"), None);
        assert_eq!(parse_pending_member("x:y"), None);
    }
}
