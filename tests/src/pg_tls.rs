//! A PostgreSQL server of the test's own that takes TLS connections only:
//! `initdb` into a temp dir, `ssl = on` with the certificates of a
//! [`Pki`], a free port on 127.0.0.1 and 127.0.0.2 (the second address is
//! one the certificate does not name), and a `pg_hba.conf` that rejects
//! plain text. The database `mtls` also asks for a client certificate
//! signed by the PKI's CA. Why apart from `pg`: that one is the machine's
//! plain-text server, shared by every test.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::tls::Pki;
use crate::{free_port, wait_for};

/// A running TLS-only PostgreSQL, shut down and removed on drop.
pub struct TlsPostgres {
    /// Its port (on 127.0.0.1 and 127.0.0.2).
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

/// The Debian server's programs (the machine's PostgreSQL major version).
fn pg_bin(program: &str) -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql").expect("PostgreSQL is installed");
    let mut found: Vec<PathBuf> = versions
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(program)))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found
        .pop()
        .expect("initdb and postgres under /usr/lib/postgresql")
}

/// The uid and gid of the `postgres` user, which the server must run as
/// (it refuses root).
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id postgres");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

impl TlsPostgres {
    /// Starts the server with `pki`'s server certificate and CA.
    pub fn start(pki: &Pki) -> TlsPostgres {
        let (uid, gid) = postgres_ids();
        let dir = std::env::temp_dir().join(format!(
            "flashsale-pg-tls-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("pg dir");
        let data = dir.join("data");
        for (from, to) in [
            (&pki.cert, "server.crt"),
            (&pki.key, "server.key"),
            (&pki.ca, "ca.crt"),
        ] {
            std::fs::copy(from, dir.join(to)).expect("copy a certificate");
        }
        let mut perms = std::fs::metadata(dir.join("server.key"))
            .expect("key")
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
        std::fs::set_permissions(dir.join("server.key"), perms).expect("chmod key");
        let chown = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .expect("chown");
        assert!(chown.success(), "chown the pg dir");
        let init = Command::new(pg_bin("initdb"))
            .uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-N"])
            .stdout(Stdio::null())
            .output()
            .expect("initdb");
        assert!(
            init.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl mtls all 127.0.0.0/8 trust clientcert=verify-ca\n\
             hostssl all all 127.0.0.0/8 trust\n\
             hostnossl all all 0.0.0.0/0 reject\n\
             local all all trust\n",
        )
        .expect("pg_hba.conf");
        let port = free_port();
        let file = |f: &str| dir.join(f).display().to_string();
        let child = Command::new(pg_bin("postgres"))
            .uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1,127.0.0.2"])
            .args(["-c", &format!("unix_socket_directories={}", dir.display())])
            .args(["-c", "ssl=on"])
            .args(["-c", &format!("ssl_cert_file={}", file("server.crt"))])
            .args(["-c", &format!("ssl_key_file={}", file("server.key"))])
            .args(["-c", &format!("ssl_ca_file={}", file("ca.crt"))])
            .args(["-c", "fsync=off", "-c", "max_connections=40"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log")).expect("log"))
            .spawn()
            .expect("spawn postgres");
        let pg = TlsPostgres { port, child, dir };
        wait_for(
            Duration::from_secs(60),
            || {
                Command::new(pg_bin("pg_isready"))
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                    .status()
                    .is_ok_and(|s| s.success())
            },
            || format!("the TLS PostgreSQL on {port} did not start"),
        );
        pg.psql("postgres", "CREATE DATABASE mtls");
        pg
    }

    /// A connection string to `dbname` on `host`, with `tls` (libpq's
    /// options, `sslmode=...`) appended.
    pub fn url(&self, host: &str, dbname: &str, tls: &str) -> String {
        format!(
            "host={host} port={} user=postgres dbname={dbname} {tls}",
            self.port
        )
    }

    /// Runs `sql` through the server's Unix socket (no TLS needed there).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-qAtc", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server's log (for a failing test).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Where the server's files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, the postmaster takes its backends
        // with it (SIGKILL would leave them behind).
        let _ = Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
