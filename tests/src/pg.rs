//! A fresh PostgreSQL database per test on the machine's server
//! (127.0.0.1:5432, user postgres), dropped on drop.

use std::process::Command;

/// A throwaway database.
pub struct PgDb {
    /// Its name.
    pub name: String,
}

impl PgDb {
    /// Creates `flashsale_t_<random>`.
    pub fn create() -> PgDb {
        let name = format!("flashsale_t_{:016x}", rand_u64());
        psql("postgres", &format!("CREATE DATABASE {name}"));
        PgDb { name }
    }

    /// A tokio-postgres connection string for it.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port=5432 user=postgres dbname={}",
            self.name
        )
    }

    /// Runs SQL and returns psql's unaligned output.
    pub fn query(&self, sql: &str) -> String {
        psql(&self.name, sql)
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let drop_db = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = psql_command("postgres", &drop_db).output();
    }
}

/// `psql` on the machine's server, database `db`, running `sql`, stopping at
/// the first error, printing unaligned rows only.
fn psql_command(db: &str, sql: &str) -> Command {
    let mut c = Command::new("psql");
    c.args([
        "-h",
        "127.0.0.1",
        "-U",
        "postgres",
        "-d",
        db,
        "-v",
        "ON_ERROR_STOP=1",
        "-qAtc",
        sql,
    ]);
    c
}

fn psql(db: &str, sql: &str) -> String {
    let out = psql_command(db, sql).output().expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
