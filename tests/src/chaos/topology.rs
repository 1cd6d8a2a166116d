//! The processes a chaos run starts and owns: a Redis Cluster of 3 masters
//! with a replica each, every node behind a TCP proxy it announces (so the
//! nemesis can cut engines and replicas off one master), 3 lock nodes, a
//! fenced resource for lock holders, and a fresh PostgreSQL database behind
//! a proxy of its own (so "PostgreSQL down" never touches the real server).
//! Everything is on loopback and is stopped when dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{free_port, PgDb, RedisCluster, RedisServer, TcpProxy};

/// The engines' `pending_timeout`: short, so the sweeper settles abandoned
/// fall-throughs within a run (the checker reads it too).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(3);

/// Masters in the chaos cluster.
pub const MASTERS: usize = 3;

/// Everything one run talks to.
pub struct Topology {
    /// The inventory cluster (shared with the nemesis's blocking calls).
    pub cluster: Arc<Mutex<RedisCluster>>,
    /// The proxy in front of each node, by the port it announces.
    pub proxies: HashMap<u16, TcpProxy>,
    /// Lock nodes.
    pub lock_nodes: Vec<RedisServer>,
    /// Where lock holders write with their fencing tokens.
    pub resource: RedisServer,
    /// The run's database.
    pub pg: PgDb,
    /// The proxy the writer reaches PostgreSQL through.
    pub pg_proxy: TcpProxy,
    /// Logs of the child processes.
    pub dir: tempfile::TempDir,
}

impl Topology {
    /// Starts it all and waits until the cluster is healthy.
    pub async fn start() -> anyhow::Result<Topology> {
        let (cluster, proxies) = Self::start_cluster().await?;
        let (lock_nodes, resource, pg) = tokio::task::spawn_blocking(|| {
            std::panic::catch_unwind(|| {
                let locks: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
                (locks, RedisServer::start(), PgDb::create())
            })
        })
        .await?
        .map_err(|_| anyhow::anyhow!("lock nodes or the database did not start"))?;
        let pg_proxy = TcpProxy::start("127.0.0.1:5432").await;
        Ok(Topology {
            cluster: Arc::new(Mutex::new(cluster)),
            proxies,
            lock_nodes,
            resource,
            pg,
            pg_proxy,
            dir: tempfile::TempDir::new()?,
        })
    }

    /// The cluster behind a proxy per node. Each node's port is chosen free
    /// before the proxies start (they must know it), so something else can
    /// take it before the node binds it (a proxy's own port, a client's
    /// ephemeral port: CI lost two runs of one test to "Address already in
    /// use"); the whole cluster is then started again on other ports.
    async fn start_cluster() -> anyhow::Result<(RedisCluster, HashMap<u16, TcpProxy>)> {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut ports = Vec::new();
            let mut proxies = HashMap::new();
            for _ in 0..MASTERS * 2 {
                let real = free_port();
                let proxy = TcpProxy::start(&format!("127.0.0.1:{real}")).await;
                ports.push((real, Some(proxy.port)));
                proxies.insert(proxy.port, proxy);
            }
            let started = tokio::task::spawn_blocking(move || {
                std::panic::catch_unwind(|| RedisCluster::start_on(MASTERS, 1, ports))
            })
            .await?;
            match started {
                Ok(cluster) => return Ok((cluster, proxies)),
                Err(_) if attempt < ATTEMPTS => {
                    eprintln!(
                        "the Redis Cluster did not start (attempt {attempt}); again on other ports"
                    );
                }
                Err(_) => break,
            }
        }
        anyhow::bail!("the Redis Cluster did not start in {ATTEMPTS} attempts")
    }

    /// The engines' configuration: the cluster through its proxies, the
    /// lock nodes, PostgreSQL through its proxy.
    pub fn engine_config(&self, ack: flashsale::Ack) -> flashsale::Config {
        let seeds = self.cluster.lock().map(|c| c.seeds()).unwrap_or_default();
        let mut c = flashsale::Config {
            cluster_nodes: seeds,
            lock_nodes: self.lock_nodes.iter().map(RedisServer::url).collect(),
            postgres_url: format!(
                "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=2",
                self.pg_proxy.port, self.pg.name
            ),
            ack,
            // Short, so abandoned fall-throughs are settled within a run.
            pending_timeout: PENDING_TIMEOUT,
            ..flashsale::Config::default()
        };
        // An answer within the controller's timeout, failover or not.
        c.retry.deadline = Duration::from_secs(4);
        c
    }

    /// A connection string to the run's database that bypasses the proxy
    /// (for the checker).
    pub fn pg_direct_url(&self) -> String {
        self.pg.url()
    }

    /// Runs `f` on the cluster in a blocking task; a panic in a fixture call
    /// (a node that will not come back, say) becomes an error.
    pub async fn with_cluster<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut RedisCluster) -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = cluster
                .lock()
                .map_err(|_| anyhow::anyhow!("cluster lock poisoned"))?;
            let c: &mut RedisCluster = &mut guard;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)))
                .map_err(|p| anyhow::anyhow!(panic_text(&p)))
        })
        .await?
    }
}

/// The text of a caught panic.
pub fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}
