//! TLS-only Redis for the TLS tests: a certificate authority and its
//! certificates made with `openssl` in the test's temp dir, and Redis
//! Cluster nodes and lock nodes that listen on a TLS port only
//! (`--port 0 --tls-port`, `tls-cluster yes`, `tls-replication yes`).
//! Why apart from `redis_nodes`: every fixture there talks plain text to
//! its nodes; here even the fixture's own checks go through `redis-cli
//! --tls`, so nothing reaches these nodes unencrypted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{free_port, wait_for};

/// The files of a small PKI: a CA, a server certificate for 127.0.0.1
/// signed by it (also good as a client certificate), an expired one, and
/// a second CA that signed nothing the servers use.
pub struct Pki {
    /// The CA that signed `cert`.
    pub ca: PathBuf,
    /// Server (and client) certificate for 127.0.0.1 and localhost.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// A certificate for the same key and names, expired yesterday.
    pub expired: PathBuf,
    /// A certificate for the same key naming `localhost` only: a seed
    /// reached as localhost verifies, the slot map's 127.0.0.1 does not.
    pub localhost_only: PathBuf,
    /// Another CA, which signed none of the above.
    pub other_ca: PathBuf,
}

impl Pki {
    /// Makes the files in `dir`.
    pub fn make(dir: &Path) -> Pki {
        let p = |f: &str| dir.join(f);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("run openssl (ops/lib.sh installs it)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let new_ca = |name: &str, cn: &str| {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
            ]);
        };
        new_ca("ca", "flashsale test CA");
        new_ca("other-ca", "flashsale other CA");
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "node.key",
            "-out",
            "node.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            p("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write ext.cnf");
        for (out, days) in [("node.crt", "2"), ("expired.crt", "-1")] {
            openssl(&[
                "x509",
                "-req",
                "-in",
                "node.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                days,
                "-sha256",
                "-extfile",
                "ext.cnf",
                "-out",
                out,
            ]);
        }
        std::fs::write(
            p("ext-localhost.cnf"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write ext-localhost.cnf");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "node.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-sha256",
            "-extfile",
            "ext-localhost.cnf",
            "-out",
            "localhost-only.crt",
        ]);
        Pki {
            localhost_only: p("localhost-only.crt"),
            ca: p("ca.crt"),
            cert: p("node.crt"),
            key: p("node.key"),
            expired: p("expired.crt"),
            other_ca: p("other-ca.crt"),
        }
    }

    /// The `[tls]` files of a client that trusts `ca`.
    pub fn trusting(&self, ca: &Path) -> flashsale::TlsFiles {
        flashsale::TlsFiles {
            ca_file: Some(ca.to_path_buf()),
            ..flashsale::TlsFiles::default()
        }
    }
}

/// Which of the PKI's certificates the servers show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// For 127.0.0.1 and localhost.
    Good,
    /// Expired yesterday.
    Expired,
    /// For localhost only (the slot map says 127.0.0.1).
    LocalhostOnly,
}

/// One TLS-only `redis-server`, killed on drop.
pub struct TlsNode {
    /// Its TLS port on 127.0.0.1.
    pub port: u16,
    child: Child,
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TLS-only Redis: cluster nodes and single lock nodes sharing one PKI.
pub struct TlsRedis {
    /// The PKI the servers use.
    pub pki: Pki,
    /// Cluster nodes, masters first as created.
    pub nodes: Vec<TlsNode>,
    /// Single lock nodes.
    pub lock_nodes: Vec<TlsNode>,
    /// The servers show the expired certificate (the fixture's own checks
    /// then skip verification: `redis-cli --insecure`).
    expired: bool,
    dir: TempDir,
}

impl TlsRedis {
    /// A cluster of `masters` masters with `replicas` replicas each, and
    /// `locks` lock nodes, every one TLS-only, serving `cert` (or the
    /// expired certificate, with `expired`: then with no cluster, whose
    /// nodes could not verify each other).
    pub fn start(masters: usize, replicas: usize, locks: usize, expired: bool) -> TlsRedis {
        let cert = if expired {
            ServerCert::Expired
        } else {
            ServerCert::Good
        };
        TlsRedis::start_with(masters, replicas, locks, cert)
    }

    /// As [`TlsRedis::start`], the servers showing `cert`.
    pub fn start_with(masters: usize, replicas: usize, locks: usize, cert: ServerCert) -> TlsRedis {
        let expired = cert == ServerCert::Expired;
        assert!(!expired || masters == 0, "an expired cluster cannot form");
        let dir = TempDir::new().expect("temp dir");
        let pki = Pki::make(dir.path());
        let cert = match cert {
            ServerCert::Good => &pki.cert,
            ServerCert::Expired => &pki.expired,
            ServerCert::LocalhostOnly => &pki.localhost_only,
        };
        let spawn = |cluster: bool| -> TlsNode {
            // A port whose cluster bus port (+10000) is free too.
            let port = loop {
                let p = free_port();
                if p < 55535 && std::net::TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
                    break p;
                }
            };
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", ""])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(&pki.key)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca)
                .args(["--tls-auth-clients", "optional"])
                .arg("--dir")
                .arg(&node_dir)
                .arg("--logfile")
                .arg(node_dir.join("redis.log"));
            if cluster {
                cmd.args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                    "--appendonly",
                    "yes",
                    "--cluster-replica-validity-factor",
                    "0",
                ]);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            TlsNode { port, child }
        };
        let nodes: Vec<TlsNode> = (0..masters * (1 + replicas)).map(|_| spawn(true)).collect();
        let lock_nodes: Vec<TlsNode> = (0..locks).map(|_| spawn(false)).collect();
        let redis = TlsRedis {
            pki,
            nodes,
            lock_nodes,
            expired,
            dir,
        };
        for n in redis.nodes.iter().chain(&redis.lock_nodes) {
            wait_for(
                Duration::from_secs(20),
                || redis.cli(n.port, &["PING"]).is_some_and(|r| r == "PONG"),
                || format!("TLS redis on {} did not answer", n.port),
            );
        }
        if !redis.nodes.is_empty() {
            let mut create = redis.cli_command(redis.nodes[0].port);
            create.arg("--cluster").arg("create");
            for n in &redis.nodes {
                create.arg(format!("127.0.0.1:{}", n.port));
            }
            let out = create
                .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
                .output()
                .expect("redis-cli --cluster create");
            assert!(
                out.status.success(),
                "TLS cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            wait_for(
                Duration::from_secs(60),
                || redis.healthy(),
                || "the TLS cluster did not become healthy".into(),
            );
        }
        redis
    }

    /// `redis-cli --tls` to `port`, trusting the PKI's CA.
    fn cli_command(&self, port: u16) -> Command {
        let mut c = Command::new("redis-cli");
        if self.expired {
            c.arg("--insecure");
        }
        c.arg("--tls").arg("--cacert").arg(&self.pki.ca).args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        c
    }

    /// One command's reply through `redis-cli --tls`, or None when it
    /// could not be run.
    pub fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let out = self
            .cli_command(port)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Every node says `cluster_state:ok`, and every replica has synced.
    fn healthy(&self) -> bool {
        self.nodes.iter().all(|n| {
            let info = self.cli(n.port, &["CLUSTER", "INFO"]).unwrap_or_default();
            let repl = self
                .cli(n.port, &["INFO", "replication"])
                .unwrap_or_default();
            info.contains("cluster_state:ok")
                && (!repl.contains("role:slave") || repl.contains("master_link_status:up"))
        })
    }

    /// `rediss://` seed URLs of the cluster.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("rediss://127.0.0.1:{}", n.port))
            .collect()
    }

    /// `rediss://` URLs of the lock nodes.
    pub fn lock_urls(&self) -> Vec<String> {
        self.lock_nodes
            .iter()
            .map(|n| format!("rediss://127.0.0.1:{}", n.port))
            .collect()
    }

    /// kill -9 of the cluster node on `port`.
    pub fn kill(&mut self, port: u16) {
        for n in self.nodes.iter_mut().filter(|n| n.port == port) {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }

    /// Where the servers keep their files (logs, for a failing test).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
