//! PostgreSQL: the connection pool and the versioned migrations in
//! `engine/migrations/`, applied at start under an advisory lock so two
//! processes starting together do not race. Never touches Redis.

pub use deadpool_postgres::Pool;
use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};
use tokio_postgres::NoTls;

/// Migrations in order; the number is the version recorded once applied.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "orders", include_str!("../migrations/0001_orders.sql")),
    (2, "fencing", include_str!("../migrations/0002_fencing.sql")),
    (3, "holds", include_str!("../migrations/0003_holds.sql")),
];

/// Advisory lock key held while migrating ("flashsal" in ASCII).
const MIGRATION_LOCK: i64 = 0x666c_6173_6873_616c;

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The connection string does not parse.
    #[error("postgres_url: {0}")]
    Url(String),
    /// The TLS options of the connection string (`sslmode`, `sslrootcert`,
    /// `sslcert`, `sslkey`) cannot be used: which, and why (never what a
    /// file holds).
    #[error("postgres_url: {0}")]
    Tls(String),
    /// No connection could be had from the pool.
    #[error("postgres unreachable: {0}")]
    Unreachable(String),
    /// A statement failed.
    #[error("postgres: {}", with_causes(.0))]
    Query(#[from] tokio_postgres::Error),
    /// A fenced write carried a token lower than one the resource accepted.
    #[error("stale fencing token {token} for {resource:?}")]
    StaleToken {
        /// The resource.
        resource: String,
        /// The refused token.
        token: u64,
    },
}

impl From<crate::pg_tls::PgTlsError> for DbError {
    fn from(e: crate::pg_tls::PgTlsError) -> Self {
        DbError::Tls(e.0)
    }
}

/// How long the server lets a flashsale write transaction sit idle before
/// it ends the session (`idle_in_transaction_session_timeout`, set with
/// `SET LOCAL` by [`begin`]). Each of them runs its statements back to
/// back.
pub const IDLE_IN_TRANSACTION: &str = "30s";

/// A pool of connections to `url` (a libpq connection string, key=value or
/// URL; its TLS options are read by [`crate::pg_tls`]). No connection is
/// opened until one is needed; a broken one is replaced. The TLS files are
/// read here, so a wrong one fails before any connection.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    let (driver_url, tls) = crate::pg_tls::PgTls::split(url)?;
    let mut pg: tokio_postgres::Config = driver_url
        .parse()
        .map_err(|e: tokio_postgres::Error| DbError::Url(e.to_string()))?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(std::time::Duration::from_secs(2));
    }
    // libpq ignores sslmode on a Unix socket (nothing to encrypt); the
    // driver would refuse it ("server does not support TLS"). Not when a
    // hostaddr is given: the driver then connects over TCP to it, whatever
    // the host says.
    let all_unix = !pg.get_hosts().is_empty()
        && pg.get_hostaddrs().is_empty()
        && pg
            .get_hosts()
            .iter()
            .all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)));
    if all_unix {
        pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    let config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls_connector(&tls)? {
        Some(connector) => Manager::from_config(pg, connector, config),
        None => Manager::from_config(pg, NoTls, config),
    };
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .map_err(|e| DbError::Url(e.to_string()))
}

#[cfg(feature = "postgres-tls")]
fn tls_connector(
    tls: &crate::pg_tls::PgTls,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, DbError> {
    Ok(tls.connector()?)
}

/// A build without `postgres-tls` connects in plain text only: a string
/// that asks for TLS is refused rather than quietly sent in clear.
#[cfg(not(feature = "postgres-tls"))]
fn tls_connector(tls: &crate::pg_tls::PgTls) -> Result<Option<NoTls>, DbError> {
    if tls.mode == crate::pg_tls::SslMode::Disable {
        return Ok(None);
    }
    Err(DbError::Tls(
        "sslmode asks for TLS, and this build has no TLS to PostgreSQL \
         (the postgres-tls feature)"
            .into(),
    ))
}

/// Starts a write transaction on `c` that the server ends if it sits idle
/// for [`IDLE_IN_TRANSACTION`]: a process stopped between its INSERT and
/// its COMMIT (SIGSTOP, a long pause) would otherwise hold its rows' locks
/// for good, and an order writer that took its entries over would wait on
/// them with every other stream behind it. `SET LOCAL`, not a startup
/// option or a session `SET`: nothing outlives the transaction, which a
/// pooler in transaction mode (PgBouncer) needs, and older PgBouncers
/// refuse connections with startup options.
pub async fn begin(
    c: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, DbError> {
    let tx = c.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
    ))
    .await?;
    Ok(tx)
}

/// An error and every cause under it, as one line. tokio-postgres shows a
/// server's refusal as "db error" alone, its message (`no pg_hba.conf entry
/// ... no encryption`, `password authentication failed`) one source below,
/// and a TLS failure's reason likewise: without them an operator is told
/// nothing. Server messages and rustls reasons name no secret.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// A connection from the pool.
pub async fn client(pool: &Pool) -> Result<deadpool_postgres::Object, DbError> {
    pool.get()
        .await
        .map_err(|e| DbError::Unreachable(with_causes(&e)))
}

/// Applies every migration not yet recorded in `flashsale_migrations`.
pub async fn migrate(pool: &Pool) -> Result<(), DbError> {
    let mut c = client(pool).await?;
    let tx = begin(&mut c).await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS flashsale_migrations (
             version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    for (version, name, sql) in MIGRATIONS {
        let done = tx
            .query_opt(
                "SELECT 1 FROM flashsale_migrations WHERE version = $1",
                &[version],
            )
            .await?
            .is_some();
        if !done {
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO flashsale_migrations (version, name) VALUES ($1, $2)",
                &[version, name],
            )
            .await?;
            tracing::info!(version, name, "migration applied");
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Inside `tx`, claims `resource` for fencing token `token`: refused with
/// [`DbError::StaleToken`] when the resource already accepted a higher token
/// (the transaction is then aborted and must be rolled back). Call it first
/// in every transaction a lock guards.
pub async fn fenced(
    tx: &deadpool_postgres::Transaction<'_>,
    resource: &str,
    token: u64,
) -> Result<(), DbError> {
    let t = i64::try_from(token).map_err(|_| DbError::StaleToken {
        resource: resource.to_owned(),
        token,
    })?;
    match tx
        .execute(
            "SELECT flashsale_fence($1::text, $2::int8)",
            &[&resource, &t],
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code().map(|c| c.code()) == Some("FS001") => Err(DbError::StaleToken {
            resource: resource.to_owned(),
            token,
        }),
        Err(e) => Err(DbError::Query(e)),
    }
}
