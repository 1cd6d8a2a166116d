//! The engine's configuration: where the inventory cluster, the lock nodes and
//! PostgreSQL are, and the knobs of the hot path. Plain data with defaults that
//! point at the `ops/up` topology; reading files and environment lives in the
//! binary. Never opens a connection.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most purchases one batch may hold (`batch_max`'s bound: a batch is one
/// script run, and Redis serves nobody else while it runs).
pub const MAX_BATCH: u32 = 1000;

/// Most batches a bucket may have in flight at once (`batch_in_flight`'s
/// bound; with `batch_max = 1` and this, every purchase is its own call,
/// all in flight at once, as before batching).
pub const MAX_IN_FLIGHT: u32 = 1024;

/// Everything [`crate::Engine::connect`] needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Seed nodes of the inventory Redis Cluster (`redis://host:port`).
    pub cluster_nodes: Vec<String>,
    /// Independent Redis instances for locks, never part of the cluster.
    pub lock_nodes: Vec<String>,
    /// PostgreSQL connection string for the order writer and reconcile.
    pub postgres_url: String,
    /// When a purchase counts as confirmed.
    pub ack: Ack,
    /// How long a process trusts its own "sold out" flag before asking Redis
    /// again; bounds how late a restock is seen by other processes.
    #[serde(with = "millis", rename = "sold_out_recheck_ms")]
    pub sold_out_recheck: Duration,
    /// How long request records and user quotas are kept in Redis; retries of
    /// a request_id later than this are treated as new requests.
    #[serde(with = "millis", rename = "request_ttl_ms")]
    pub request_ttl: Duration,
    /// A fall-through left pending longer than this (its process died
    /// between buckets and nobody retried) is settled by the sweeper
    /// ([`crate::Engine::settle_abandoned`], run by the order writer). It is
    /// also the walk's limit: no bucket takes for a walk older than this,
    /// so the other buckets keep a refusal only twice as long.
    #[serde(with = "millis", rename = "pending_timeout_ms")]
    pub pending_timeout: Duration,
    /// How often the hold sweeper (run by `flashsale serve`, see
    /// [`crate::Engine::spawn_hold_sweeper`]) expires the holds whose
    /// deadline passed; it bounds how late their units go back on sale.
    #[serde(with = "millis", rename = "hold_sweep_ms")]
    pub hold_sweep: Duration,
    /// Largest quantity one purchase may ask for.
    pub max_qty: u32,
    /// Most purchases sent to one bucket in one script call. Purchases queue
    /// per bucket while a call is in flight and go together when it returns
    /// (no timer: at low load each goes alone). 1 = one call per purchase.
    pub batch_max: u32,
    /// Most calls in flight to one bucket at once, each with its batch.
    pub batch_in_flight: u32,
    /// Calls a bucket may have in flight beyond `batch_in_flight` while
    /// they carry fewer purchases than this in all, so that at light load a
    /// purchase does not wait a round trip behind another's call; 0 = off.
    pub batch_light_load: u32,
    /// The form of a new order's stream entry: `compact` (one field, the
    /// default) or `fields` (a field per column), which order writers from
    /// before the compact form read: run every process with `fields` while
    /// any older one still runs (its writer would dead-letter the compact
    /// form), then switch to `compact`.
    pub order_record: OrderRecord,
    /// Retry policy for Redis errors that may pass (failover, reshard).
    pub retry: Backoff,
    /// The files of TLS to `rediss://` nodes, cluster and lock nodes alike
    /// (the `[tls]` table; needs the `tls` feature).
    pub tls: crate::tls::TlsFiles,
    /// The waiting room's signing keys (the `[room]` table).
    pub room: crate::admission::RoomKeysConfig,
}

/// How the purchase scripts write a new order on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderRecord {
    /// One field, `p`/`h`: about 2.5 µs less master time per order.
    #[default]
    Compact,
    /// A field per column, as before the compact form.
    Fields,
}

impl OrderRecord {
    /// The scripts' argument for it.
    pub(crate) fn script_arg(self) -> &'static str {
        match self {
            OrderRecord::Compact => "compact",
            OrderRecord::Fields => "fields",
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cluster_nodes: (7001..=7006)
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            lock_nodes: (7101..=7103)
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            postgres_url: "host=127.0.0.1 port=5432 user=postgres dbname=flashsale".into(),
            ack: Ack::Leader,
            sold_out_recheck: Duration::from_millis(500),
            request_ttl: Duration::from_secs(24 * 3600),
            pending_timeout: Duration::from_secs(30),
            hold_sweep: Duration::from_millis(100),
            max_qty: 100,
            batch_max: 64,
            batch_in_flight: 1,
            batch_light_load: 0,
            order_record: OrderRecord::Compact,
            retry: Backoff::default(),
            tls: crate::tls::TlsFiles::default(),
            room: crate::admission::RoomKeysConfig::default(),
        }
    }
}

impl Config {
    /// This config with every secret replaced, for printing: node passwords
    /// and the PostgreSQL password.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.cluster_nodes = c
            .cluster_nodes
            .iter()
            .map(|u| crate::redact::redis_url(u))
            .collect();
        c.lock_nodes = c
            .lock_nodes
            .iter()
            .map(|u| crate::redact::redis_url(u))
            .collect();
        c.postgres_url = crate::redact::postgres_url(&c.postgres_url);
        c.room = c.room.redacted();
        c
    }

    /// How long a fall-through walk may take bucket stock, ms, counted from
    /// its start (`take.lua`'s ARGV[10]): `pending_timeout`, the age at which
    /// the sweeper closes a walk as abandoned, so no bucket takes for a walk
    /// the sweeper may be closing, and a bucket's refusal is kept only
    /// twice as long (a refused multi-bucket request no longer leaves its
    /// records for `request_ttl`).
    pub(crate) fn walk_limit_ms(&self) -> u64 {
        (self.pending_timeout.as_millis() as u64).clamp(1, 1 << 31)
    }

    /// Seconds the scripts keep request records (their TTL argument).
    pub(crate) fn request_ttl_secs(&self) -> u64 {
        self.request_ttl.as_secs().max(1)
    }

    /// The scripts' replicated argument: "1" when the engine will WAIT for a
    /// replica, so replays re-propagate their record.
    pub(crate) fn replicated_flag(&self) -> &'static str {
        match self.ack {
            Ack::Replicated => "1",
            Ack::Leader => "0",
        }
    }

    /// Whether any node, of the cluster or the locks, is `rediss://`: only
    /// then are the `[tls]` files read (`flashsale config check` says they
    /// are unused otherwise, and every command agrees).
    pub fn uses_tls(&self) -> bool {
        self.cluster_nodes
            .iter()
            .chain(&self.lock_nodes)
            .any(|n| n.starts_with("rediss://"))
    }

    /// Checks the values that cannot be right; names the field that is not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cluster_nodes.is_empty() {
            return Err(ConfigError::new(
                "cluster_nodes",
                "at least one seed node is needed",
            ));
        }
        for n in &self.cluster_nodes {
            check_redis_url("cluster_nodes", n)?;
        }
        for n in &self.lock_nodes {
            check_redis_url("lock_nodes", n)?;
        }
        // The cluster client speaks TLS to every node or to none: a slot
        // map names nodes by address only, so a mix cannot be honoured.
        let tls_seeds = self
            .cluster_nodes
            .iter()
            .filter(|n| n.starts_with("rediss://"))
            .count();
        if tls_seeds != 0 && tls_seeds != self.cluster_nodes.len() {
            return Err(ConfigError::new(
                "cluster_nodes",
                "every seed node is rediss:// or none is: the cluster is reached \
                 the same way on every node",
            ));
        }
        self.tls.validate().map_err(ConfigError::from)?;
        if let Err(e) = self.room.keys() {
            return Err(ConfigError::new("room", e.to_string()));
        }
        if self.lock_nodes.len() == 2 {
            return Err(ConfigError::new(
                "lock_nodes",
                "2 nodes cannot form a majority that survives one failure; \
                 use 1 (a single-node lock) or 3 or more (Redlock)",
            ));
        }
        if self.postgres_url.trim().is_empty() {
            return Err(ConfigError::new("postgres_url", "must not be empty"));
        }
        // The TLS options (sslmode, sslrootcert, ...) are checked now; the
        // files they name are read when the pool is made.
        #[cfg(feature = "postgres")]
        if let Err(crate::pg_tls::PgTlsError(why)) = crate::pg_tls::PgTls::split(&self.postgres_url)
        {
            return Err(ConfigError::new("postgres_url", why));
        }
        // The orders table's qty is a 32-bit integer: a larger purchase would
        // be confirmed, then dead-lettered by the order writer.
        if !(1..=i32::MAX as u32).contains(&self.max_qty) {
            return Err(ConfigError::new("max_qty", "must be 1..=2147483647"));
        }
        if !(1..=MAX_BATCH).contains(&self.batch_max) {
            return Err(ConfigError::new(
                "batch_max",
                format!("must be 1..={}", MAX_BATCH),
            ));
        }
        if self.batch_light_load > 64 {
            return Err(ConfigError::new("batch_light_load", "must be 0..=64"));
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.batch_in_flight) {
            return Err(ConfigError::new(
                "batch_in_flight",
                format!("must be 1..={}", MAX_IN_FLIGHT),
            ));
        }
        within(
            "request_ttl_ms",
            self.request_ttl,
            Duration::from_secs(1),
            MAX_REQUEST_TTL,
        )?;
        within(
            "sold_out_recheck_ms",
            self.sold_out_recheck,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
        within(
            "pending_timeout_ms",
            self.pending_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        within(
            "hold_sweep_ms",
            self.hold_sweep,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        if self.pending_timeout >= self.request_ttl {
            return Err(ConfigError::new(
                "pending_timeout_ms",
                "must be shorter than request_ttl_ms, or an abandoned \
                 request's record expires before the sweeper settles it",
            ));
        }
        if self.retry.initial.is_zero() || self.retry.max < self.retry.initial {
            return Err(ConfigError::new("retry", "need 0 < initial_ms <= max_ms"));
        }
        within(
            "retry.max_ms",
            self.retry.max,
            Duration::ZERO,
            Duration::from_secs(60),
        )?;
        within(
            "retry.deadline_ms",
            self.retry.deadline,
            Duration::ZERO,
            Duration::from_secs(600),
        )?;
        Ok(())
    }
}

/// Checks a `redis://` URL has a host (and a valid port when it gives one);
/// the error names the field and shows the node without its password.
fn check_redis_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let shown = crate::redact::redis_url(url);
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        // Refused here, with a reason, instead of failing (or panicking:
        // no crypto provider) at connect time.
        return Err(ConfigError::new(
            field,
            format!(
                "{shown:?}: this build has no TLS (rediss://); build flashsale with \
                 its `tls` feature, or use redis:// over a trusted link"
            ),
        ));
    }
    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
        return Err(ConfigError::new(
            field,
            format!("{shown:?} must start with redis:// or rediss://"),
        ));
    }
    // Read as redis-rs reads it (the url crate): a host, and a port the
    // parser took (it refuses one that is not a number up to 65535).
    let parsed = url::Url::parse(url)
        .map_err(|e| ConfigError::new(field, format!("{shown:?} is not a valid URL: {e}")))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(field, format!("{shown:?} has no host")));
    }
    if parsed.port() == Some(0) {
        return Err(ConfigError::new(
            field,
            format!("{shown:?} has no valid port"),
        ));
    }
    Ok(())
}

/// Longest `request_ttl`: 30 days. Request records live this long in Redis,
/// and the scripts take it in whole seconds below 2^31.
pub const MAX_REQUEST_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Checks that a duration field lies in `[min, max]`, naming the field.
pub(crate) fn within(
    field: &str,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if d < min || d > max {
        return Err(ConfigError::new(
            field,
            format!(
                "{} is out of range {}..={}",
                d.as_millis(),
                min.as_millis(),
                max.as_millis()
            ),
        ));
    }
    Ok(())
}

/// When a purchase is confirmed to the buyer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Ack {
    /// As soon as the bucket's master ran the script (fastest).
    #[default]
    Leader,
    /// After one replica has the write too (`WAIT 1`), so a master crash
    /// cannot take back a confirmed order.
    Replicated,
}

/// Exponential backoff with jitter, bounded by a deadline.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Backoff {
    /// First delay.
    #[serde(with = "millis", rename = "initial_ms")]
    pub initial: Duration,
    /// Longest single delay.
    #[serde(with = "millis", rename = "max_ms")]
    pub max: Duration,
    /// Give up once this much time has passed since the first attempt.
    #[serde(with = "millis", rename = "deadline_ms")]
    pub deadline: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(500),
            deadline: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): doubling from
    /// `initial` up to `max`, then scaled by a random factor in [0.5, 1) so
    /// that a crowd of retrying buyers does not return in lockstep.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        base.mul_f64(0.5 + rand::random::<f64>() * 0.5)
    }
}

/// Durations as whole milliseconds in config files (`*_ms` fields).
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the `tls` feature refuses a `rediss://` node when the
    /// config is checked, naming the field, never at connect time (where it
    /// panicked: no crypto provider). A build with it takes the node, but
    /// not a cluster reached by TLS on some seeds and not on others.
    #[test]
    fn a_tls_node_url_is_refused_with_a_reason_not_at_connect() {
        for (nodes, locks, field) in [
            (
                vec!["rediss://:pw@127.0.0.1:7001".to_owned()],
                vec![],
                "cluster_nodes",
            ),
            (
                vec!["redis://127.0.0.1:7001".to_owned()],
                vec!["rediss://127.0.0.1:7101".to_owned()],
                "lock_nodes",
            ),
        ] {
            let c = Config {
                cluster_nodes: nodes,
                lock_nodes: locks,
                ..Config::default()
            };
            if cfg!(feature = "tls") {
                assert_eq!(c.validate(), Ok(()));
                continue;
            }
            let e = c.validate().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.problem.contains("TLS"), "{e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
        let mixed = Config {
            cluster_nodes: vec![
                "rediss://:pw@127.0.0.1:7001".to_owned(),
                "redis://:pw@127.0.0.1:7002".to_owned(),
            ],
            lock_nodes: vec![],
            ..Config::default()
        };
        let e = mixed.validate().unwrap_err();
        assert_eq!(e.field, "cluster_nodes");
        assert!(!e.to_string().contains("pw@"), "{e}");
    }
}

/// A configuration value that cannot be right: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// The field, as it is spelled in the config file.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl From<crate::tls::TlsFileError> for ConfigError {
    fn from(e: crate::tls::TlsFileError) -> Self {
        ConfigError::new(e.field, e.problem)
    }
}

impl ConfigError {
    /// `field` is wrong because of `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
