//! One builder for the setup most order-path tests share: a Redis Cluster,
//! a fresh PostgreSQL database and a pool on it, an engine on the cluster,
//! and optionally a sale. Everything is owned by the [`Fixture`], so it all
//! goes away (processes killed, database dropped) when the test ends.

use deadpool_postgres::Pool;
use flashsale::{Engine, SaleSpec, SaleStatus};

use crate::pg::PgDb;
use crate::RedisCluster;

/// A cluster, a database, a pool, an engine, and the sale made at build.
pub struct Fixture {
    /// The inventory cluster.
    pub cluster: RedisCluster,
    /// The test's own database (dropped with the fixture).
    pub pg: PgDb,
    /// A pool on `pg`.
    pub pool: Pool,
    /// An engine on `cluster`.
    pub engine: Engine,
    /// The sale created at build, when one was asked for.
    pub sale: Option<SaleStatus>,
}

/// What [`Fixture::builder`] builds.
pub struct FixtureBuilder {
    masters: usize,
    replicas: usize,
    pool_size: usize,
    sale: Option<SaleSpec>,
}

impl Fixture {
    /// Three masters without replicas, a pool of 4, no sale.
    pub fn builder() -> FixtureBuilder {
        FixtureBuilder {
            masters: 3,
            replicas: 0,
            pool_size: 4,
            sale: None,
        }
    }
}

impl FixtureBuilder {
    /// Masters and replicas per master of the cluster.
    pub fn cluster(mut self, masters: usize, replicas: usize) -> Self {
        self.masters = masters;
        self.replicas = replicas;
        self
    }

    /// Connections in the pool.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// A sale to create once the engine is up.
    pub fn sale(mut self, spec: SaleSpec) -> Self {
        self.sale = Some(spec);
        self
    }

    /// Starts everything; panics (failing the test) when a part cannot.
    pub async fn build(self) -> Fixture {
        let cluster = RedisCluster::start(self.masters, self.replicas);
        let pg = PgDb::create();
        let pool = flashsale::db::pool(&pg.url(), self.pool_size).expect("pool");
        let engine = crate::engine_on(&cluster).await;
        let sale = match self.sale {
            Some(spec) => Some(engine.create_sale(spec).await.expect("create sale")),
            None => None,
        };
        Fixture {
            cluster,
            pg,
            pool,
            engine,
            sale,
        }
    }
}
