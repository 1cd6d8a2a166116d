//! The engine's configuration: where the inventory cluster, the lock nodes and
//! PostgreSQL are, and the knobs of the hot path. Plain data with defaults that
//! point at the `ops/up` topology; reading files and environment lives in the
//! binary. Never opens a connection.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// ([`crate::Engine::settle_abandoned`], run by the order writer).
    #[serde(with = "millis", rename = "pending_timeout_ms")]
    pub pending_timeout: Duration,
    /// Largest quantity one purchase may ask for.
    pub max_qty: u32,
    /// Retry policy for Redis errors that may pass (failover, reshard).
    pub retry: Backoff,
    /// Settings of `flashsale serve` (ignored by the library itself).
    pub server: ServerConfig,
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
            max_qty: 100,
            retry: Backoff::default(),
            server: ServerConfig::default(),
        }
    }
}

impl Config {
    /// This config with every secret replaced, for printing: node passwords,
    /// the PostgreSQL password, and the admin token (shown as `<set>`).
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
        c.server.admin_token = c.server.admin_token().map(|_| "<set>".into());
        c
    }

    /// Checks the values that cannot be right; names the field that is not.
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster_nodes.is_empty() {
            return Err("cluster_nodes: at least one seed node is needed".into());
        }
        for n in &self.cluster_nodes {
            check_redis_url("cluster_nodes", n)?;
        }
        for n in &self.lock_nodes {
            check_redis_url("lock_nodes", n)?;
        }
        if self.lock_nodes.len() == 2 {
            return Err(
                "lock_nodes: 2 nodes cannot form a majority that survives one failure; \
                 use 1 (a single-node lock) or 3 or more (Redlock)"
                    .into(),
            );
        }
        if self.postgres_url.trim().is_empty() {
            return Err("postgres_url: must not be empty".into());
        }
        if self.max_qty == 0 {
            return Err("max_qty: must be at least 1".into());
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
        if self.pending_timeout >= self.request_ttl {
            return Err(
                "pending_timeout_ms: must be shorter than request_ttl_ms, or an abandoned \
                 request's record expires before the sweeper settles it"
                    .into(),
            );
        }
        if self.retry.initial.is_zero() || self.retry.max < self.retry.initial {
            return Err("retry: need 0 < initial_ms <= max_ms".into());
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
        self.server.validate()
    }
}

/// Checks a `redis://` URL has a host (and a valid port when it gives one);
/// the error names the field and shows the node without its password.
fn check_redis_url(field: &str, url: &str) -> Result<(), String> {
    let shown = crate::redact::redis_url(url);
    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
        return Err(format!("{field}: {shown:?} must start with redis://"));
    }
    let hp = crate::redact::host_port(url);
    let (host, port) = match hp.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
        _ => (hp.as_str(), None),
    };
    if host.is_empty() {
        return Err(format!("{field}: {shown:?} has no host"));
    }
    if let Some(p) = port {
        if !p.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(format!("{field}: {shown:?} has no valid port"));
        }
    }
    Ok(())
}

/// Longest `request_ttl`: 30 days. Request records live this long in Redis,
/// and the scripts take it in whole seconds below 2^31.
pub const MAX_REQUEST_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Checks that a duration field lies in `[min, max]`, naming the field.
pub(crate) fn within(field: &str, d: Duration, min: Duration, max: Duration) -> Result<(), String> {
    if d < min || d > max {
        return Err(format!(
            "{field}: {} is out of range {}..={}",
            d.as_millis(),
            min.as_millis(),
            max.as_millis()
        ));
    }
    Ok(())
}

/// Settings of the HTTP service (`flashsale serve`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// Bearer token for the admin routes (create, restock, close); at least
    /// 16 characters. Unset, empty or blank: the admin routes are off (401).
    pub admin_token: Option<String>,
    /// Purchases per second one user may make (token bucket); 0 = no limit.
    pub per_user_rps: f64,
    /// Burst of the per-user bucket.
    pub per_user_burst: u32,
    /// Purchases per second the whole service accepts; 0 = no limit.
    pub global_rps: f64,
    /// Burst of the global bucket.
    pub global_burst: u32,
    /// Requests handled at once; more wait for a slot.
    pub max_in_flight: usize,
    /// Run the order writer inside the service.
    pub order_writer: bool,
    /// How often the service reconciles the ledger (and exports the gauges).
    #[serde(with = "millis", rename = "reconcile_every_ms")]
    pub reconcile_every: Duration,
    /// A client must send a request's headers within this.
    #[serde(with = "millis", rename = "header_read_timeout_ms")]
    pub header_read_timeout: Duration,
    /// A client must send a request's body within this.
    #[serde(with = "millis", rename = "body_read_timeout_ms")]
    pub body_read_timeout: Duration,
    /// A request is answered (503 `unavailable`) within this, counted from
    /// when its body was read: the wait for a slot and the handler. Admin
    /// operations still run to the end.
    #[serde(with = "millis", rename = "request_timeout_ms")]
    pub request_timeout: Duration,
    /// A client must take each part of an answer within this, or its
    /// connection is closed (a client that never reads cannot hold one).
    #[serde(with = "millis", rename = "write_timeout_ms")]
    pub write_timeout: Duration,
    /// Largest request head (request line and headers) a connection buffers,
    /// in bytes; larger heads are refused. Bounds memory per connection.
    pub max_header_bytes: usize,
    /// On SIGTERM, requests in flight get this long before their connections
    /// are closed; then the order writer drains and the process exits 0.
    #[serde(with = "millis", rename = "shutdown_grace_ms")]
    pub shutdown_grace: Duration,
    /// Largest request body, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Most client connections open at once; more wait to be accepted.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            admin_token: None,
            per_user_rps: 5.0,
            per_user_burst: 5,
            global_rps: 0.0,
            global_burst: 1000,
            max_in_flight: 4096,
            order_writer: true,
            reconcile_every: Duration::from_secs(15),
            header_read_timeout: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            max_connections: 10_000,
        }
    }
}

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN: usize = 16;

impl ServerConfig {
    /// The admin token, or `None` when the admin routes are off (unset,
    /// empty or blank: one rule for `config check` and `serve`).
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.trim().is_empty())
    }

    fn validate(&self) -> Result<(), String> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "server.listen: {:?} is not an address like 127.0.0.1:8080",
                self.listen
            ));
        }
        if !(self.per_user_rps >= 0.0 && self.global_rps >= 0.0) {
            return Err("server.per_user_rps / global_rps: must be >= 0".into());
        }
        if self.per_user_rps > 0.0 && self.per_user_burst == 0 {
            return Err("server.per_user_burst: must be >= 1 when per_user_rps is set".into());
        }
        if self.global_rps > 0.0 && self.global_burst == 0 {
            return Err("server.global_burst: must be >= 1 when global_rps is set".into());
        }
        if !(1..=1_000_000).contains(&self.max_in_flight) {
            return Err("server.max_in_flight: must be 1..=1000000".into());
        }
        // Counted without blanks: fifteen spaces and a letter are a
        // one-letter secret.
        if self
            .admin_token()
            .is_some_and(|t| t.chars().filter(|c| !c.is_whitespace()).count() < MIN_ADMIN_TOKEN)
        {
            return Err(format!(
                "server.admin_token: use at least {MIN_ADMIN_TOKEN} non-blank characters \
                 (or leave it unset to turn the admin routes off)"
            ));
        }
        let second = Duration::from_secs(1);
        let hour = Duration::from_secs(3600);
        within(
            "server.header_read_timeout_ms",
            self.header_read_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        within(
            "server.body_read_timeout_ms",
            self.body_read_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        within(
            "server.request_timeout_ms",
            self.request_timeout,
            second,
            hour,
        )?;
        within(
            "server.shutdown_grace_ms",
            self.shutdown_grace,
            Duration::ZERO,
            hour,
        )?;
        within(
            "server.write_timeout_ms",
            self.write_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        // hyper's own floor is 8 KiB.
        if !(8192..=1024 * 1024).contains(&self.max_header_bytes) {
            return Err("server.max_header_bytes: must be 8192..=1048576".into());
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err("server.max_body_bytes: must be 1024..=67108864".into());
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err("server.max_connections: must be 1..=1000000".into());
        }
        within(
            "server.reconcile_every_ms",
            self.reconcile_every,
            Duration::from_millis(100),
            Duration::from_secs(24 * 3600),
        )?;
        Ok(())
    }
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
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}
