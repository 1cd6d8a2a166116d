//! TLS on real TLS-only servers: Redis (`tests/src/tls.rs`) and a
//! PostgreSQL of the test's own (`tests/src/pg_tls.rs`). Purchases, the
//! order writer, reconcile, a failover and locks over `rediss://` and
//! `sslmode=verify-full`, `serve` and `lock exec` as an operator runs
//! them, and the ways a connection must fail at connect with a clear
//! error rather than hang or retry: a CA that signed nothing the server
//! shows, an expired server certificate, a host name the certificate does
//! not hold, a missing client certificate, and plain text to a TLS port.

use std::time::{Duration, Instant};

use flashsale::lock::{LockClient, LockConfig, LockOptions};
use flashsale::{Certificates, Config, ConnectError, Engine, PurchaseRequest, SaleSpec};
use flashsale_tests::pg_tls::TlsPostgres;
use flashsale_tests::serve::{create_sale, http_client, ServeProcess};
use flashsale_tests::tls::{ServerCert, TlsRedis};
use flashsale_tests::{db_order_ids, fast_writer, wait_for_db_orders};

fn config(redis: &TlsRedis, ca: &std::path::Path) -> Config {
    Config {
        cluster_nodes: redis.seeds(),
        lock_nodes: redis.lock_urls(),
        tls: redis.pki.trusting(ca),
        ..Config::default()
    }
}

fn buy<'a>(sku: &'a str, user: &'a str, rid: &'a str) -> PurchaseRequest<'a> {
    PurchaseRequest {
        sku,
        user,
        qty: 1,
        request_id: rid,
    }
}

/// Over TLS only: sales are made and sold, every order reaches
/// PostgreSQL through the order writer, reconcile balances, and a lock on
/// a TLS lock node is taken and given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_orders_and_locks_work_over_tls() {
    let redis = TlsRedis::start(3, 0, 1, false);
    let engine = Engine::connect(config(&redis, &redis.pki.ca))
        .await
        .expect("the engine connects over TLS");
    engine
        .create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("tls-sale", 30)
        })
        .await
        .expect("create over TLS");
    for i in 0..40 {
        let (user, rid) = (format!("u{i}"), format!("r{i}"));
        let answer = engine.purchase(buy("tls-sale", &user, &rid)).await;
        if i < 30 {
            answer.expect("confirmed over TLS");
        } else {
            assert!(
                matches!(answer, Err(flashsale::PurchaseError::SoldOut)),
                "{answer:?}"
            );
        }
    }
    // PostgreSQL over TLS too, its certificate and host name verified.
    let pg = TlsPostgres::start(&redis.pki);
    let pool = flashsale::db::pool(
        &pg.url(
            "127.0.0.1",
            "postgres",
            &format!(
                "sslmode=verify-full sslrootcert='{}'",
                redis.pki.ca.display()
            ),
        ),
        4,
    )
    .expect("pool");
    flashsale::db::migrate(&pool)
        .await
        .expect("migrate over TLS");
    let writer = engine
        .spawn_order_writer(pool.clone(), fast_writer(Duration::from_secs(5)))
        .await
        .expect("writer over TLS");
    wait_for_db_orders(&pool, "tls-sale", 30, Duration::from_secs(60)).await;
    assert_eq!(db_order_ids(&pool, "tls-sale").await.len(), 30);
    writer.shutdown().await.expect("writer stops");
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &["tls-sale".to_owned()])
        .await
        .expect("reconcile over TLS");
    assert!(ledger.iter().all(|r| r.conserved), "{ledger:?}");

    let locks = engine.locks().expect("lock nodes configured");
    let guard = locks
        .lock("tls-lock", &LockOptions::new("tls-test"))
        .await
        .expect("lock over TLS");
    assert!(guard.unlock().await, "released over TLS");
}

/// A master killed over TLS: its replica takes over (the cluster bus and
/// replication are TLS too), and the engine follows it over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_over_tls_keeps_selling() {
    let mut redis = TlsRedis::start(3, 1, 0, false);
    let engine = Engine::connect(config(&redis, &redis.pki.ca))
        .await
        .expect("the engine connects over TLS");
    let status = engine
        .create_sale(SaleSpec::new("tls-failover", 100))
        .await
        .expect("create");
    engine
        .purchase(buy("tls-failover", "before", "r1"))
        .await
        .expect("confirmed before the kill");
    let master = status.buckets[0]
        .master
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .expect("the bucket's master port");
    redis.kill(master);
    // Retries of one request until its answer is confirmed: the engine
    // rides the failover, whatever it takes on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(90);
    let confirmed = loop {
        match engine.purchase(buy("tls-failover", "after", "r2")).await {
            Ok(c) => break c,
            Err(e) => assert!(
                Instant::now() < deadline,
                "no confirmation over TLS within 90 s of the kill: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!confirmed.order_id.is_empty());
    let after = engine.sale_status("tls-failover").await.expect("status");
    assert_ne!(after.buckets[0].master, status.buckets[0].master);
    assert_eq!(after.remaining, 98, "both purchases kept");
}

/// Connecting with a CA that signed nothing the servers show, to servers
/// whose certificate expired, or in plain text to a TLS port, fails at
/// connect with an error that says so, within seconds (no hang, no retry
/// storm), and never shows a certificate or key's contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_an_expired_certificate_and_plain_text_fail_at_connect() {
    let redis = TlsRedis::start(3, 0, 1, false);
    let expired = TlsRedis::start(0, 0, 1, true);
    let key_text = std::fs::read_to_string(&redis.pki.key).expect("key");
    let key_line = key_text.lines().nth(1).expect("a key line").to_owned();
    let plain = Config {
        cluster_nodes: redis
            .seeds()
            .iter()
            .map(|s| s.replace("rediss://", "redis://"))
            .collect(),
        lock_nodes: Vec::new(),
        ..Config::default()
    };
    let cases = [
        (
            "wrong CA",
            Config {
                lock_nodes: Vec::new(),
                ..config(&redis, &redis.pki.other_ca)
            },
        ),
        (
            "expired",
            Config {
                cluster_nodes: expired.lock_urls(),
                lock_nodes: Vec::new(),
                tls: expired.pki.trusting(&expired.pki.ca),
                ..Config::default()
            },
        ),
        ("plain text", plain),
    ];
    for (what, config) in cases {
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(30), Engine::connect(config)).await;
        let took = started.elapsed();
        let Ok(result) = result else {
            panic!("{what}: connect hung for 30 s");
        };
        let e = match result {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => e,
        };
        match what {
            "plain text" => assert!(
                matches!(e, ConnectError::PlainTextRefused(_)),
                "{what}: {e:?}"
            ),
            _ => assert!(matches!(e, ConnectError::Certificate(_)), "{what}: {e:?}"),
        }
        let text = format!("{e} {e:?}");
        eprintln!("{what} ({took:?}): {e}");
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
        assert!(!text.contains(&key_line), "{what}: key material in {text}");
        assert!(!text.contains("BEGIN"), "{what}: PEM in {text}");
        if what != "plain text" {
            assert!(
                text.to_lowercase().contains("certificate"),
                "{what}: says it is the certificate: {e}"
            );
        }
    }
    // A lock node with a CA that signed nothing it shows: the lock call
    // fails with an error, within its node timeout, not a hang.
    let certificates = Certificates::load(&redis.pki.trusting(&redis.pki.other_ca)).expect("load");
    let client =
        LockClient::with_certificates(&redis.lock_urls(), LockConfig::default(), &certificates)
            .expect("client");
    let started = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(30),
        client.try_lock("x", &LockOptions::new("t")),
    )
    .await
    .expect("no hang");
    match got {
        Ok(Some(_)) => panic!("locked through a server its CA never signed"),
        Ok(None) => {}
        Err(e) => eprintln!("lock node, wrong CA: {e}"),
    }
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// `flashsale config check` takes `rediss://` nodes and says what their
/// connections will verify; a `[tls]` file it cannot read fails the check,
/// naming the key, with nothing of the files in the output.
#[test]
fn config_check_takes_rediss_and_says_what_it_will_verify() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let pki = flashsale_tests::tls::Pki::make(dir.path());
    let key_text = std::fs::read_to_string(&pki.key).expect("key");
    let key_line = key_text.lines().nth(1).expect("a key line").to_owned();
    let file = dir.path().join("flashsale.toml");
    let run = |ca: &std::path::Path| {
        let pg = format!(
            "host=db.internal user=fs password=PgS3cretPw sslmode=verify-full sslrootcert='{}' \
             sslcert='{}' sslkey='{}'",
            ca.display(),
            pki.cert.display(),
            pki.key.display()
        );
        std::fs::write(
            &file,
            format!(
                "cluster_nodes = [\"rediss://:S3cretPw@127.0.0.1:7001\"]\n\
                 lock_nodes = [\"rediss://127.0.0.1:7101\"]\n\
                 postgres_url = {pg:?}\n\
                 [tls]\nca_file = {ca:?}\ncert_file = {:?}\nkey_file = {:?}\n",
                pki.cert, pki.key
            ),
        )
        .expect("write config");
        let out = flashsale_tests::flashsale_cmd(None, None, &[])
            .env_remove("FLASHSALE_LOCK_NODES")
            .arg("--config")
            .arg(&file)
            .args(["config", "check"])
            .output()
            .expect("run flashsale config check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains("S3cretPw"), "{text}");
        assert!(!text.contains("PgS3cretPw"), "{text}");
        assert!(!text.contains(&key_line), "{text}");
        (out.status.success(), text)
    };
    let (ok, text) = run(&pki.ca);
    assert!(ok, "{text}");
    assert!(
        text.contains("verifies each server's certificate"),
        "{text}"
    );
    assert!(text.contains(&pki.ca.display().to_string()), "{text}");
    assert!(text.contains("presents the client certificate"), "{text}");
    assert!(
        text.contains(
            "PostgreSQL: sslmode=verify-full: TLS; verifies the server's certificate and host name"
        ),
        "{text}"
    );
    assert!(
        text.contains("sslmode=verify-full\""),
        "the redacted url keeps its mode: {text}"
    );
    let (ok, text) = run(&dir.path().join("absent-ca.pem"));
    assert!(!ok, "{text}");
    assert!(text.contains("tls.ca_file"), "{text}");
    // A client key that is not the certificate's: refused by the check,
    // not at the first handshake (the CA's key beside the node's cert).
    let ca_key = dir.path().join("ca.key");
    for (table, names) in [
        (
            format!(
                "[tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {ca_key:?}\n",
                pki.ca, pki.cert
            ),
            "tls.key_file",
        ),
        (
            format!("[tls]\nca_file = {:?}\n", pki.ca),
            "sslkey is not the key of sslcert",
        ),
    ] {
        let pg = format!(
            "host=db sslmode=verify-full sslrootcert='{}' sslcert='{}' sslkey='{}'",
            pki.ca.display(),
            pki.cert.display(),
            ca_key.display()
        );
        std::fs::write(
            &file,
            format!(
                "cluster_nodes = [\"rediss://127.0.0.1:7001\"]\nlock_nodes = []\n\
                 postgres_url = {pg:?}\n{table}"
            ),
        )
        .expect("write config");
        let out = flashsale_tests::flashsale_cmd(None, None, &[])
            .env_remove("FLASHSALE_LOCK_NODES")
            .env_remove("FLASHSALE_POSTGRES_URL")
            .arg("--config")
            .arg(&file)
            .args(["config", "check"])
            .output()
            .expect("run flashsale config check");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{names}: {text}");
        assert!(text.contains(names), "{text}");
    }
    // The [tls] files right, PostgreSQL's root certificate absent.
    std::fs::write(
        &file,
        format!(
            "cluster_nodes = [\"rediss://127.0.0.1:7001\"]\nlock_nodes = []\n\
             postgres_url = \"host=db sslmode=verify-full sslrootcert=/absent/root.crt\"\n\
             [tls]\nca_file = {:?}\n",
            pki.ca
        ),
    )
    .expect("write config");
    let out = flashsale_tests::flashsale_cmd(None, None, &[])
        .env_remove("FLASHSALE_LOCK_NODES")
        .env_remove("FLASHSALE_POSTGRES_URL")
        .arg("--config")
        .arg(&file)
        .args(["config", "check"])
        .output()
        .expect("run flashsale config check");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("sslrootcert \"/absent/root.crt\" could not be read"),
        "{text}"
    );
}

/// Whether the pool's connections are encrypted, as the server sees them.
async fn server_says_ssl(pool: &flashsale::db::Pool) -> Result<bool, String> {
    let c = flashsale::db::client(pool)
        .await
        .map_err(|e| e.to_string())?;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get::<_, bool>(0))
}

/// A PostgreSQL that takes TLS only (its own server: `tests/src/pg_tls.rs`)
/// is reached under `verify-full`, `verify-ca`, `require` and with a
/// client certificate, each connection encrypted; and refused, with an
/// error that says why within seconds and shows no key, in plain text,
/// under `verify-full` at an address its certificate does not name, with
/// a CA that signed nothing it shows, and without the client certificate
/// a database asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_requires_tls_is_reached_under_each_sslmode_and_refuses_the_rest() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let pki = flashsale_tests::tls::Pki::make(dir.path());
    let pg = TlsPostgres::start(&pki);
    let key_text = std::fs::read_to_string(&pki.key).expect("key");
    let key_line = key_text.lines().nth(1).expect("a key line").to_owned();
    let ca = format!("sslrootcert='{}'", pki.ca.display());
    let client_cert = format!(
        "sslcert='{}' sslkey='{}'",
        pki.cert.display(),
        pki.key.display()
    );
    let good = [
        pg.url(
            "127.0.0.1",
            "postgres",
            &format!("sslmode=verify-full {ca}"),
        ),
        pg.url(
            "localhost",
            "postgres",
            &format!("sslmode=verify-full {ca}"),
        ),
        // 127.0.0.2 is not in the certificate: verify-ca does not ask.
        pg.url("127.0.0.2", "postgres", &format!("sslmode=verify-ca {ca}")),
        pg.url("127.0.0.2", "postgres", "sslmode=require"),
        pg.url(
            "127.0.0.1",
            "mtls",
            &format!("sslmode=verify-full {ca} {client_cert}"),
        ),
    ];
    // A Unix socket: libpq ignores sslmode there, and so does flashsale.
    let socket = pg.url(
        &pg.dir().display().to_string(),
        "postgres",
        &format!("sslmode=verify-full {ca}"),
    );
    let pool = flashsale::db::pool(&socket, 1).expect("pool");
    assert_eq!(server_says_ssl(&pool).await, Ok(false), "{socket}");
    // From the second attack: a socket path as host with a TCP hostaddr
    // is a TCP connection (the driver goes to hostaddr); sslmode holds
    // there, and nothing is sent in plain text.
    let tcp_by_hostaddr = format!(
        "host=/nonexistent hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full {ca}",
        pg.port
    );
    let pool = flashsale::db::pool(&tcp_by_hostaddr, 1).expect("pool");
    match server_says_ssl(&pool).await {
        Ok(ssl) => assert!(ssl, "{tcp_by_hostaddr}: connected in plain text"),
        Err(e) => assert!(
            !e.contains("no encryption"),
            "{tcp_by_hostaddr}: tried plain text: {e}"
        ),
    }
    for url in good {
        let pool = flashsale::db::pool(&url, 1).expect("pool");
        flashsale::db::migrate(&pool)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}\n{}", pg.log()));
        assert_eq!(server_says_ssl(&pool).await, Ok(true), "{url}");
    }
    let bad = [
        (
            "plain text",
            pg.url("127.0.0.1", "postgres", ""),
            "no encryption",
        ),
        (
            "a name the certificate does not hold",
            pg.url(
                "127.0.0.2",
                "postgres",
                &format!("sslmode=verify-full {ca}"),
            ),
            "not valid for name",
        ),
        (
            "wrong CA",
            pg.url(
                "127.0.0.1",
                "postgres",
                &format!(
                    "sslmode=verify-full sslrootcert='{}'",
                    pki.other_ca.display()
                ),
            ),
            "UnknownIssuer",
        ),
        (
            "no client certificate",
            pg.url("127.0.0.1", "mtls", &format!("sslmode=verify-full {ca}")),
            "certificate",
        ),
    ];
    for (what, url, says) in bad {
        let pool = flashsale::db::pool(&url, 1).expect("pool");
        let started = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(30), server_says_ssl(&pool))
            .await
            .unwrap_or_else(|_| panic!("{what}: hung for 30 s"))
            .expect_err(what);
        let took = started.elapsed();
        eprintln!("{what} ({took:?}): {e}");
        assert!(e.contains(says), "{what}: {e}");
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
        assert!(
            !e.contains(&key_line) && !e.contains("BEGIN"),
            "{what}: {e}"
        );
    }
    // A root certificate that cannot be read fails when the pool is made,
    // naming the option and the path.
    let e = flashsale::db::pool(
        &pg.url(
            "127.0.0.1",
            "postgres",
            "sslmode=verify-full sslrootcert=/absent/ca.crt",
        ),
        1,
    )
    .expect_err("an absent sslrootcert");
    assert!(matches!(e, flashsale::db::DbError::Tls(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("\"/absent/ca.crt\" could not be read"),
        "{e}"
    );
    // A key file given as the root certificate: refused, its text not shown.
    let e = flashsale::db::pool(
        &pg.url(
            "127.0.0.1",
            "postgres",
            &format!("sslmode=verify-full sslrootcert='{}'", pki.key.display()),
        ),
        1,
    )
    .expect_err("a key as a CA");
    assert!(!e.to_string().contains(&key_line), "{e}");
}

/// `flashsale serve` and `flashsale lock exec`, as an operator runs them,
/// over TLS only: rediss:// seeds and lock nodes, the `[tls]` CA, and
/// PostgreSQL under `sslmode=verify-full`. A sale is made and sold over
/// HTTP, its orders reach PostgreSQL through serve's order writer, and a
/// command runs under a lock taken on the TLS lock node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_lock_exec_work_over_tls() {
    let redis = TlsRedis::start(3, 0, 1, false);
    let pg = TlsPostgres::start(&redis.pki);
    let pg_url = pg.url(
        "127.0.0.1",
        "postgres",
        &format!(
            "sslmode=verify-full sslrootcert='{}'",
            redis.pki.ca.display()
        ),
    );
    let tls_table = format!("[tls]\nca_file = {:?}\n", redis.pki.ca);
    let server = ServeProcess::start_on(&redis.seeds(), &pg_url, &tls_table, "");
    let (base, c) = (server.base(), http_client());
    let (status, body) = create_sale(
        &c,
        &base,
        serde_json::json!({"sku": "tls-web", "stock": 5, "buckets": 3}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let mut confirmed = 0;
    for i in 0..8 {
        let r = c
            .post(format!("{base}/v1/sales/tls-web/purchase"))
            .json(&serde_json::json!({"user": format!("u{i}"), "qty": 1, "request_id": format!("r{i}")}))
            .send()
            .await
            .expect("purchase over serve");
        match r.status().as_u16() {
            200 => confirmed += 1,
            409 => {}
            s => panic!("purchase {i}: {s} {:?}", r.text().await),
        }
    }
    assert_eq!(confirmed, 5);
    let rows = wait_for_event(Duration::from_secs(60), || {
        let n = pg.psql(
            "postgres",
            "SELECT count(*) FROM orders WHERE sku = 'tls-web'",
        );
        (n == "5").then_some(n)
    });
    assert_eq!(
        rows.as_deref(),
        Some("5"),
        "serve's writer over verify-full"
    );

    let config = server.config.clone();
    let lock_config = config.with_extension("locks.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &lock_config,
        text.replacen(
            "lock_nodes = []",
            &format!("lock_nodes = [{:?}]", redis.lock_urls()[0]),
            1,
        ),
    )
    .expect("lock config");
    let out = flashsale_tests::flashsale_cmd(None, None, &[])
        .env_remove("FLASHSALE_LOCK_NODES")
        .arg("--config")
        .arg(&lock_config)
        .args(["lock", "exec", "--name", "tls-job", "--ttl", "5s", "--"])
        .args(["sh", "-c", "echo ran-under-the-lock"])
        .output()
        .expect("flashsale lock exec");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("ran-under-the-lock"),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        redis.cli(
            redis.lock_nodes[0].port,
            &["EXISTS", "flashsale:lock:tls-job"]
        ),
        Some("0".to_owned()),
        "the lock was given back"
    );
}

/// Polls `f` until it gives a value or `limit` passes.
fn wait_for_event<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Seeds reached by a name their certificate holds (localhost), nodes
/// announced in the slot map at an address it does not (127.0.0.1): the
/// seeds connect, the rest cannot, and redis-rs says only "No connections
/// found". The error says what to check instead, at connect, in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_certificates_miss_the_slot_map_addresses_say_so_at_connect() {
    let redis = TlsRedis::start_with(3, 0, 0, ServerCert::LocalhostOnly);
    let seeds = redis
        .seeds()
        .iter()
        .map(|s| s.replace("127.0.0.1", "localhost"))
        .collect();
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        Engine::connect(Config {
            cluster_nodes: seeds,
            lock_nodes: Vec::new(),
            tls: redis.pki.trusting(&redis.pki.ca),
            ..Config::default()
        }),
    )
    .await
    .expect("no hang");
    let e = match result {
        Ok(_) => panic!("connected to nodes whose certificates do not name them"),
        Err(e) => e,
    };
    eprintln!("({:?}) {e}", started.elapsed());
    assert!(
        matches!(e, ConnectError::TlsNodeNames(_)),
        "a typed error, not a bare ClusterConnectionNotFound: {e:?}"
    );
    assert!(e.to_string().contains("slot map"), "{e}");
}
