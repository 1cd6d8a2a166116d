//! A `flashsale serve` process for HTTP tests: its own config file in a temp
//! dir, a free port, killed on drop if still running.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{flashsale_bin, free_port, wait_for, PgDb, RedisCluster};

/// The admin bearer token every test server uses.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A running `flashsale serve`.
pub struct ServeProcess {
    /// The process.
    pub child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its config file.
    pub config: PathBuf,
    _dir: TempDir,
}

impl ServeProcess {
    /// Starts `flashsale serve` on `cluster` and `pg`. `top` adds top-level
    /// TOML keys, `server` adds keys of the `[server]` table; the retry
    /// deadline is 1.5 s so an unreachable cluster answers 503 quickly.
    pub fn start(cluster: &RedisCluster, pg: &PgDb, top: &str, server: &str) -> ServeProcess {
        ServeProcess::start_on(&cluster.seeds(), &pg.url(), top, server)
    }

    /// As [`ServeProcess::start`], on any seed nodes and PostgreSQL
    /// connection string (the TLS tests give `rediss://` seeds and a
    /// `sslmode=verify-full` string).
    pub fn start_on(seeds: &[String], postgres_url: &str, top: &str, server: &str) -> ServeProcess {
        let dir = TempDir::new().expect("dir");
        let port = free_port();
        let seeds: Vec<String> = seeds.iter().map(|s| format!("{s:?}")).collect();
        let config = dir.path().join("flashsale.toml");
        // `top` may set lock_nodes itself; otherwise there are none.
        let locks = if top.contains("lock_nodes") {
            ""
        } else {
            "lock_nodes = []\n"
        };
        let text = format!(
            "cluster_nodes = [{seeds}]\n{locks}postgres_url = {pg:?}\n{top}\n\n\
             [server]\nlisten = \"127.0.0.1:{port}\"\nadmin_token = {token:?}\nreconcile_every_ms = 500\n{server}\n\n\
             [retry]\ndeadline_ms = 1500\n",
            seeds = seeds.join(", "),
            pg = postgres_url,
            token = ADMIN_TOKEN,
        );
        std::fs::write(&config, text).expect("write config");
        let child = Command::new(flashsale_bin())
            .env_remove("FLASHSALE_ADMIN_TOKEN")
            .env_remove("FLASHSALE_CLUSTER_NODES")
            .env_remove("FLASHSALE_LOCK_NODES")
            .env_remove("FLASHSALE_POSTGRES_URL")
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn flashsale serve");
        let p = ServeProcess {
            child,
            port,
            config,
            _dir: dir,
        };
        wait_for(
            Duration::from_secs(30),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            || "flashsale serve did not listen".into(),
        );
        p
    }

    /// `http://127.0.0.1:port`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client for a `serve` under test: every request bounded.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// `POST /v1/sales` with the admin token: the status and the JSON answer
/// (null if it was not JSON).
pub async fn create_sale(
    c: &reqwest::Client,
    base: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c
        .post(format!("{base}/v1/sales"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("create");
    (
        r.status().as_u16(),
        r.json().await.unwrap_or(serde_json::Value::Null),
    )
}
