//! The [`Engine`]: one handle on the inventory that a seckill service clones
//! into every task. It holds the parts that own the state, and hands each
//! call to them:
//!
//! - `Cluster`: the connection, the scripts, the retry loop;
//! - `SaleCache`: the sales this process has seen;
//! - `PurchaseBatches`: purchases sent to their home bucket in batches;
//! - `WaitBatches`: group commit of `ack = replicated`;
//! - the lock client for admin operations, when lock nodes are configured.
//!
//! The operations live in `ops/`, one file per kind, and the background
//! passes in `sweepers/`; each is an `impl Engine` block that reaches the
//! parts only through the accessors here. Which method lives where:
//!
//! | file | methods |
//! | --- | --- |
//! | `engine.rs` | `connect`, `config`, `locks`, `stats`, `readiness`, `dedicated_connection`, `slot_map`, `load_scripts` |
//! | `ops/purchase.rs` | `purchase`, `check`, `purchase_checked` |
//! | `ops/admin.rs` | `create_sale`, `create_sale_op`, `repair_sale`, `restock`, `restock_op`, `close_sale` |
//! | `ops/status.rs` | `sale_status`, `list_sales` |
//! | `ops/holds.rs` | `pay`, `cancel`, `order` |
//! | `sweepers/fall_through.rs` | `settle_abandoned` |
//! | `sweepers/expiry.rs` | `expire_due`, `spawn_hold_sweeper` |
//! | `orders/writer.rs` | `spawn_order_writer` |
//! | `room/ops.rs` | `join_queue`, `queue_status`, `room_status`, `admit_round`, `spawn_room_admitter` (and the purchase's admission check) |
//!
//! (`ledger::reconcile` takes an engine; it is not a method.)
//! It never talks to PostgreSQL (the order writer and the ledger do).

use std::sync::Arc;
use std::time::Instant;

use redis::cluster_async::ClusterConnection;
use redis::RedisError;

use crate::admission::PassKeys;
use crate::batch::PurchaseBatches;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{AdminError, ConnectError, NotReady, PurchaseError};
use crate::lock::{LockClient, LockConfig};
use crate::metrics::{self as m, Stats};
use crate::placement::SlotMap;
use crate::replication::WaitBatches;
use crate::sale::{SaleCache, SaleHandle};
use crate::scripts::Scripts;
use crate::tls::Certificates;

/// A cheap-to-clone handle on the inventory cluster.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: Arc<Cluster>,
    sales: SaleCache,
    batches: PurchaseBatches,
    waits: WaitBatches,
    locks: Option<LockClient>,
    /// The waiting room's signing keys (`[room]`), when set.
    passes: Option<PassKeys>,
    config: Config,
    stats: Arc<Stats>,
    epoch: Instant,
}

impl Engine {
    /// Connects to the inventory cluster, checks that every slot is served,
    /// and loads every script on every master.
    pub async fn connect(config: Config) -> Result<Engine, ConnectError> {
        config.validate()?;
        let certificates = if config.uses_tls() {
            Certificates::load(&config.tls).map_err(crate::config::ConfigError::from)?
        } else {
            Certificates::default()
        };
        let stats = Arc::new(Stats::default());
        let cluster = Arc::new(
            Cluster::connect(
                &config.cluster_nodes,
                config.retry,
                stats.clone(),
                &certificates,
            )
            .await?,
        );
        m::describe();
        let locks = if config.lock_nodes.is_empty() {
            None
        } else {
            Some(
                LockClient::with_certificates(
                    &config.lock_nodes,
                    LockConfig::default(),
                    &certificates,
                )
                .map_err(ConnectError::Lock)?,
            )
        };
        // The seeds answered; the slot map's nodes are reached now, and a
        // TLS name they fail on is told apart here.
        let tls_cluster = config
            .cluster_nodes
            .iter()
            .any(|n| n.starts_with("rediss://"));
        let at_connect = |e| ConnectError::at_connect(e, tls_cluster);
        let map = cluster.slot_map().await.map_err(at_connect)?;
        if !map.covers_all_slots() {
            return Err(ConnectError::SlotsUncovered);
        }
        cluster.load_scripts().await.map_err(at_connect)?;
        let batches = PurchaseBatches::new(cluster.clone(), stats.clone(), &config);
        // Checked by validate: a bad key never gets this far.
        let passes = config
            .room
            .keys()
            .map_err(|e| crate::config::ConfigError::new("room", e.to_string()))?;
        Ok(Engine {
            inner: Arc::new(Inner {
                batches,
                waits: WaitBatches::new(cluster.clone()),
                cluster,
                sales: SaleCache::default(),
                locks,
                passes,
                config,
                stats,
                epoch: Instant::now(),
            }),
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The lock client over `lock_nodes`, when any are configured.
    pub fn locks(&self) -> Option<&LockClient> {
        self.inner.locks.as_ref()
    }

    /// The waiting room's signing keys, when `[room]` sets them.
    pub fn pass_keys(&self) -> Option<&PassKeys> {
        self.inner.passes.as_ref()
    }

    /// Counters of retries, reloads and local sold-out answers.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The connection, scripts and retry loop.
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.inner.cluster
    }

    /// The scripts of this build.
    pub(crate) fn scripts(&self) -> &Scripts {
        self.inner.cluster.scripts()
    }

    /// The sales this process has seen.
    pub(crate) fn sales(&self) -> &SaleCache {
        &self.inner.sales
    }

    /// Purchases in their home bucket, batched per bucket.
    pub(crate) fn batches(&self) -> &PurchaseBatches {
        &self.inner.batches
    }

    /// Group commit of `ack = replicated`.
    pub(crate) fn waits(&self) -> &WaitBatches {
        &self.inner.waits
    }

    /// Milliseconds since this engine was created; 0 is never returned, so 0
    /// can mean "unset" in atomics.
    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The cached handle of a sale, loading its metadata on first use.
    pub(crate) async fn sale(&self, sku: &str) -> Result<Arc<SaleHandle>, PurchaseError> {
        self.sales()
            .get(self.cluster(), sku)
            .await?
            .ok_or_else(|| PurchaseError::UnknownSale(sku.to_owned()))
    }

    /// The cached sale handle, with errors as admin errors.
    pub(crate) async fn admin_sale(&self, sku: &str) -> Result<Arc<SaleHandle>, AdminError> {
        self.sales()
            .get(self.cluster(), sku)
            .await?
            .ok_or_else(|| AdminError::UnknownSale(sku.to_owned()))
    }

    /// A new cluster connection of its own, for long-running readers (the
    /// order writer, reconcile) that must not share the purchase path's.
    pub async fn dedicated_connection(&self) -> Result<ClusterConnection, RedisError> {
        self.inner.cluster.dedicated_connection().await
    }

    /// Reads the cluster's slot map with `CLUSTER SLOTS`.
    pub async fn slot_map(&self) -> Result<SlotMap, RedisError> {
        self.inner.cluster.slot_map().await
    }

    /// Loads every script on every master (`SCRIPT LOAD`).
    pub async fn load_scripts(&self) -> Result<(), RedisError> {
        self.inner.cluster.load_scripts().await
    }

    /// Readiness: every slot is served and every script is loaded on every
    /// master (a master that lacks them gets them now). Says what is wrong
    /// otherwise.
    pub async fn readiness(&self) -> Result<(), NotReady> {
        let cluster = &self.inner.cluster;
        let map = cluster.slot_map().await.map_err(NotReady::Unreachable)?;
        if !map.covers_all_slots() {
            return Err(NotReady::SlotsUncovered);
        }
        for master in map.masters() {
            let Some((host, port)) = master.rsplit_once(':') else {
                return Err(NotReady::BadMaster(master.to_owned()));
            };
            let Ok(port) = port.parse::<u16>() else {
                return Err(NotReady::BadMaster(master.to_owned()));
            };
            let scripts = |error| NotReady::Scripts {
                master: master.to_owned(),
                error,
            };
            if !cluster
                .scripts_loaded_on(host, port)
                .await
                .map_err(scripts)?
            {
                // Not fatal for buyers (NOSCRIPT reloads), but fix it now.
                cluster.load_scripts().await.map_err(scripts)?;
            }
        }
        Ok(())
    }
}
