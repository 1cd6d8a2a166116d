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
    /// Checks the values that cannot be right; names the field that is not.
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster_nodes.is_empty() {
            return Err("cluster_nodes: at least one seed node is needed".into());
        }
        for n in self.cluster_nodes.iter().chain(&self.lock_nodes) {
            if !n.starts_with("redis://") {
                return Err(format!("node {n:?}: must start with redis://"));
            }
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
    /// Bearer token for the admin routes (create, restock, close). Unset:
    /// admin routes answer 401.
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
        }
    }
}

impl ServerConfig {
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
        if self.max_in_flight == 0 {
            return Err("server.max_in_flight: must be >= 1".into());
        }
        if self.admin_token.as_deref().is_some_and(|t| t.len() < 8) {
            return Err("server.admin_token: use at least 8 characters".into());
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
