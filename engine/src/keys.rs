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
            prefix: format!("{{{tag}}}:"),
        }
    }

    /// `{tag}:r:<request_id>`, the record of one request in this bucket.
    pub fn request(&self, request_id: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 2 + request_id.len());
        k.push_str(&self.prefix);
        k.push_str("r:");
        k.push_str(request_id);
        k
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

/// The order stream of a shard tag.
pub fn orders_stream(tag: &str) -> String {
    format!("{{{tag}}}:orders")
}

/// The dead-letter stream of a shard tag (malformed order entries).
pub fn dead_letter_stream(tag: &str) -> String {
    format!("{{{tag}}}:orders:dead")
}
