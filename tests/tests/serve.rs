//! `flashsale serve` end to end: HTTP against a real cluster and PostgreSQL,
//! every error code from a real request, a real Prometheus scraping it, the
//! shipped alert rules, and SIGTERM under load.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flashsale_tests::{
    create_sale, free_port, http_client, kill_on_drop, PgDb, RedisCluster, ServeProcess,
    ADMIN_TOKEN,
};
use serde_json::{json, Value};

fn http() -> reqwest::Client {
    http_client()
}

async fn create(c: &reqwest::Client, base: &str, body: Value) -> (u16, Value) {
    create_sale(c, base, body).await
}

async fn buy(
    c: &reqwest::Client,
    base: &str,
    sku: &str,
    user: &str,
    qty: i64,
    rid: &str,
) -> (u16, Value) {
    let r = c
        .post(format!("{base}/v1/sales/{sku}/purchase"))
        .json(&json!({"user": user, "qty": qty, "request_id": rid}))
        .send()
        .await
        .expect("purchase request");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn db_ids(pg: &PgDb, sku: &str) -> HashSet<String> {
    let out = pg.query(&format!("SELECT order_id FROM orders WHERE sku = '{sku}'"));
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

async fn wait_db(pg: &PgDb, sku: &str, n: usize) -> HashSet<String> {
    let start = Instant::now();
    loop {
        let ids = db_ids(pg, sku).await;
        if ids.len() >= n || start.elapsed() > Duration::from_secs(60) {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_stampede_sells_exactly_the_stock_and_nothing_fails() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let server = ServeProcess::start(&cluster, &pg, "", "");
    let (base, c) = (server.base(), http());
    let (status, _) = create(
        &c,
        &base,
        json!({"sku": "web", "stock": 1000, "buckets": 3}),
    )
    .await;
    assert_eq!(status, 201);

    let sem = Arc::new(tokio::sync::Semaphore::new(100));
    let mut tasks = Vec::new();
    for i in 0..5000 {
        let permit = sem.clone().acquire_owned().await.expect("sem");
        let (c, base) = (c.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let r = buy(&c, &base, "web", &format!("u{i}"), 1, &format!("r{i}")).await;
            drop(permit);
            r
        }));
    }
    let mut ok = HashSet::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.expect("task") {
            (200, body) => {
                ok.insert(body["order_id"].as_str().expect("order_id").to_owned());
            }
            (409, body) => {
                assert_eq!(body["error"], "sold_out");
                conflicts += 1;
            }
            (s, body) => panic!("unexpected {s}: {body}"),
        }
    }
    assert_eq!((ok.len(), conflicts), (1000, 4000));
    assert_eq!(
        wait_db(&pg, "web", 1000).await,
        ok,
        "exactly the confirmed orders reach PostgreSQL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_comes_from_a_real_request() {
    let mut cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    // A burst of 3 refilled once per 100 s: the limit below does not depend
    // on how fast a busy machine sends the requests.
    let server = ServeProcess::start(&cluster, &pg, "", "per_user_rps = 0.01\nper_user_burst = 3");
    let (base, c) = (server.base(), http());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;

    assert_eq!(
        c.get(format!("{base}/healthz"))
            .send()
            .await
            .expect("healthz")
            .status(),
        200
    );
    assert_eq!(
        c.get(format!("{base}/readyz"))
            .send()
            .await
            .expect("readyz")
            .status(),
        200
    );

    // 401: no token, wrong token.
    let r = c
        .post(format!("{base}/v1/sales"))
        .json(&json!({"sku": "x", "stock": 1}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "unauthorized"
    );
    let r = c
        .post(format!("{base}/v1/sales"))
        .bearer_auth("wrong-token")
        .json(&json!({"sku": "x", "stock": 1}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 401);

    assert_eq!(
        create(
            &c,
            &base,
            json!({"sku": "one", "stock": 1, "per_user_limit": 1})
        )
        .await
        .0,
        201
    );
    assert_eq!(
        create(
            &c,
            &base,
            json!({"sku": "lim", "stock": 10, "per_user_limit": 1})
        )
        .await
        .0,
        201
    );
    assert_eq!(
        create(
            &c,
            &base,
            json!({"sku": "later", "stock": 1, "starts_at_ms": now_ms + 3_600_000})
        )
        .await
        .0,
        201
    );
    // A sale cannot be created already over (422); "over" ends in 1.5 s,
    // and the cases below run once the clock has passed its end.
    let (s, b) = create(
        &c,
        &base,
        json!({"sku": "past", "stock": 1, "ends_at_ms": now_ms - 3_600_000}),
    )
    .await;
    assert_eq!((s, b["error"].as_str()), (422, Some("invalid")), "{b}");
    let over_ends = now_ms + 1_500;
    assert_eq!(
        create(
            &c,
            &base,
            json!({"sku": "over", "stock": 1, "ends_at_ms": over_ends})
        )
        .await
        .0,
        201
    );
    assert_eq!(
        create(&c, &base, json!({"sku": "shut", "stock": 1}))
            .await
            .0,
        201
    );
    let r = c
        .post(format!("{base}/v1/sales/shut/close"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("close");
    assert_eq!(r.status(), 200);

    let (s, b) = create(&c, &base, json!({"sku": "one", "stock": 1})).await;
    assert_eq!((s, b["error"].as_str()), (409, Some("already_exists")));
    let (s, b) = create(&c, &base, json!({"sku": "bad{sku}", "stock": 1})).await;
    assert_eq!((s, b["error"].as_str()), (422, Some("invalid")));

    while (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64)
        <= over_ends + 50
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cases: Vec<(&str, &str, i64, &str, u16, &str)> = vec![
        ("one", "a", 1, "a1", 200, ""),
        ("one", "b", 1, "b1", 409, "sold_out"),
        ("one", "c", 0, "c1", 422, "invalid"),
        ("nosuch", "d", 1, "d1", 404, "unknown_sale"),
        ("later", "e", 1, "e1", 409, "not_started"),
        ("over", "f", 1, "f1", 409, "ended"),
        ("shut", "g", 1, "g1", 409, "closed"),
        ("lim", "h", 1, "h1", 200, ""),
        ("lim", "h", 1, "h2", 429, "limit_exceeded"),
    ];
    for (sku, user, qty, rid, status, code) in cases {
        let (s, body) = buy(&c, &base, sku, user, qty, rid).await;
        assert_eq!(s, status, "{sku}/{user}: {body}");
        if !code.is_empty() {
            assert_eq!(body["error"], code, "{sku}/{user}");
            assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
    // Malformed JSON and unknown fields: 422 with a JSON body.
    let r = c
        .post(format!("{base}/v1/sales/lim/purchase"))
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 422);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "invalid");
    let (s, _) = {
        let r = c
            .post(format!("{base}/v1/sales/lim/purchase"))
            .json(&json!({"user": "u", "qty": 1, "request_id": "r", "price": 0}))
            .send()
            .await
            .expect("req");
        (r.status().as_u16(), ())
    };
    assert_eq!(s, 422);
    let r = c
        .get(format!("{base}/v1/sales/nosuch"))
        .send()
        .await
        .expect("status");
    assert_eq!(r.status(), 404);

    // 429 rate_limited: one user hammering (burst 3, no refill in time).
    let mut limited = 0;
    for i in 0..8 {
        let (s, body) = buy(&c, &base, "lim", "hammer", 1, &format!("hammer-{i}")).await;
        if s == 429 && body["error"] == "rate_limited" {
            limited += 1;
        }
    }
    assert_eq!(
        limited, 5,
        "the per-user rate limit answers 429 rate_limited past the burst of 3"
    );

    // 503 unavailable: the whole cluster gone.
    for n in cluster.nodes.iter_mut() {
        n.kill();
    }
    let (s, body) = buy(&c, &base, "lim", "late", 1, "late-1").await;
    assert_eq!(
        (s, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    let r = c
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(r.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_purchase_metrics_it_was_sent() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let server = ServeProcess::start(&cluster, &pg, "", "");
    let (base, c) = (server.base(), http());
    assert_eq!(
        create(&c, &base, json!({"sku": "prom", "stock": 30, "buckets": 2}))
            .await
            .0,
        201
    );
    for i in 0..50 {
        buy(&c, &base, "prom", &format!("p{i}"), 1, &format!("p{i}")).await;
    }

    // ops/prometheus.yml, pointed at the test's port, scraping every second.
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops");
    let dir = tempfile::TempDir::new().expect("dir");
    let shipped = std::fs::read_to_string(ops.join("prometheus.yml")).expect("ops/prometheus.yml");
    assert!(
        shipped.contains("127.0.0.1:8080"),
        "the shipped config targets the default port"
    );
    let cfg = shipped
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{}", server.port))
        .replace("scrape_interval: 5s", "scrape_interval: 1s")
        .replace("evaluation_interval: 5s", "evaluation_interval: 1s");
    std::fs::write(dir.path().join("prometheus.yml"), cfg).expect("write");
    std::fs::copy(ops.join("alerts.yml"), dir.path().join("alerts.yml")).expect("copy alerts");
    let prom_port = free_port();
    let prom = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus (installed by ops/up --deps-only)");
    let _prom = kill_on_drop(prom);

    let query = |q: &str| {
        format!(
            "http://127.0.0.1:{prom_port}/api/v1/query?query={}",
            urlencode(q)
        )
    };
    let value = |v: &Value| {
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
    };
    let start = Instant::now();
    let (mut confirmed, mut sold_out, mut conserved) = (None, None, None);
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(r) = c
            .get(query(
                "sum(flashsale_purchases_total{result=\"confirmed\"})",
            ))
            .send()
            .await
        {
            confirmed = r.json::<Value>().await.ok().as_ref().and_then(value);
        }
        if let Ok(r) = c
            .get(query("sum(flashsale_purchases_total{result=\"sold_out\"})"))
            .send()
            .await
        {
            sold_out = r.json::<Value>().await.ok().as_ref().and_then(value);
        }
        if let Ok(r) = c.get(query("min(flashsale_ledger_conserved)")).send().await {
            conserved = r.json::<Value>().await.ok().as_ref().and_then(value);
        }
        if confirmed == Some(30.0) && sold_out == Some(20.0) && conserved == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        (confirmed, sold_out, conserved),
        (Some(30.0), Some(20.0), Some(1.0)),
        "Prometheus sees what was sent"
    );
    let rules: Value = c
        .get(format!("http://127.0.0.1:{prom_port}/api/v1/rules"))
        .send()
        .await
        .expect("rules")
        .json()
        .await
        .expect("json");
    assert!(
        rules.to_string().contains("FlashsaleLedgerNotConserved"),
        "the alert rules are loaded"
    );
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn promtool_accepts_the_shipped_rules_and_config() {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops");
    let rules = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(ops.join("alerts.yml"))
        .output()
        .expect("promtool");
    assert!(
        rules.status.success(),
        "{}",
        String::from_utf8_lossy(&rules.stdout)
    );
    assert!(String::from_utf8_lossy(&rules.stdout).contains("11 rules found"));
    let config = Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(ops.join("prometheus.yml"))
        .output()
        .expect("promtool");
    assert!(
        config.status.success(),
        "{}",
        String::from_utf8_lossy(&config.stdout)
    );
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(ops.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("valid JSON");
    let text = dash.to_string();
    for metric in [
        "flashsale_purchases_total",
        "flashsale_purchase_duration_seconds_bucket",
        "flashsale_stock_remaining_units",
        "flashsale_order_backlog_entries",
        "flashsale_lock_lost_total",
        "flashsale_room_waiting",
        "flashsale_room_admission_rate",
    ] {
        assert!(text.contains(metric), "dashboard shows {metric}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_confirmed_order() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let mut server = ServeProcess::start(&cluster, &pg, "", "");
    let (base, c) = (server.base(), http());
    assert_eq!(
        create(
            &c,
            &base,
            json!({"sku": "term", "stock": 100000, "buckets": 3})
        )
        .await
        .0,
        201
    );

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let load = {
        let (c, base) = (c.clone(), base.clone());
        tokio::spawn(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(50));
            for i in 0..20_000 {
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    break;
                };
                let (c, base, tx) = (c.clone(), base.clone(), tx.clone());
                tokio::spawn(async move {
                    let r = c
                        .post(format!("{base}/v1/sales/term/purchase"))
                        .json(&json!({"user": format!("t{i}"), "qty": 1, "request_id": format!("t{i}")}))
                        .send()
                        .await;
                    let answer = match r {
                        Ok(r) if r.status() == 200 => r
                            .json::<Value>()
                            .await
                            .ok()
                            .and_then(|b| b["order_id"].as_str().map(str::to_owned)),
                        _ => None,
                    };
                    let _ = tx.send(answer);
                    drop(permit);
                });
                if i % 100 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut confirmed = HashSet::new();
    let mut answers = 0;
    while answers < 500 {
        if let Some(Some(id)) = rx.recv().await {
            confirmed.insert(id);
        }
        answers += 1;
    }
    server.terminate();
    let exit = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = server.child.try_wait() {
                return (s, server);
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .expect("join");
    assert!(
        exit.0.success(),
        "serve exits 0 after SIGTERM: {:?}",
        exit.0
    );
    load.abort();
    while let Ok(Some(a)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        if let Some(id) = a {
            confirmed.insert(id);
        }
    }
    assert!(
        confirmed.len() >= 400,
        "most requests confirmed before the stop"
    );
    let in_db = db_ids(&pg, "term").await;
    let missing: Vec<_> = confirmed.difference(&in_db).collect();
    assert!(
        missing.is_empty(),
        "{} answered 200 but are not in PostgreSQL: {:?}",
        missing.len(),
        missing.first()
    );
}

/// The hold routes end to end through `flashsale serve`: a purchase answers
/// `held` with its deadline; pay and cancel are admin routes with typed
/// errors; the server's own sweeper expires an unpaid hold (its units back
/// on sale); the hold metrics are on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_routes_pay_cancel_and_the_servers_sweeper_expire() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let server = ServeProcess::start(&cluster, &pg, "hold_sweep_ms = 50", "");
    let base = server.base();
    let c = http();
    let (s, _) = create(
        &c,
        &base,
        json!({"sku": "holdy", "stock": 2, "hold_ms": 1500, "late_payment": "refuse"}),
    )
    .await;
    assert_eq!(s, 201);
    let (s, a) = buy(&c, &base, "holdy", "ann", 1, "r1").await;
    assert_eq!((s, a["state"].as_str()), (200, Some("held")), "{a}");
    assert!(a["expires_at_ms"].as_u64().is_some(), "{a}");
    let (_, b) = buy(&c, &base, "holdy", "bob", 1, "r1").await;
    let (a, b) = (
        a["order_id"].as_str().expect("id").to_owned(),
        b["order_id"].as_str().expect("id").to_owned(),
    );
    let send = |path: String, token: bool, body: Option<Value>| {
        let c = c.clone();
        async move {
            let mut r = c.post(path);
            if token {
                r = r.bearer_auth(ADMIN_TOKEN);
            }
            if let Some(b) = body {
                r = r.json(&b);
            }
            let r = r.send().await.expect("request");
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let pay = |id: &str| format!("{base}/v1/orders/{id}/pay");
    let (s, _) = send(pay(&a), false, Some(json!({"payment_ref": "p1"}))).await;
    assert_eq!(s, 401, "pay is an admin route");
    let (s, t) = send(pay(&a), true, Some(json!({"payment_ref": "p1"}))).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("paid")), "{t}");
    let (s, t) = send(pay(&a), true, Some(json!({"payment_ref": "p2"}))).await;
    assert_eq!(
        (s, t["error"].as_str()),
        (409, Some("payment_conflict")),
        "{t}"
    );
    let (s, t) = send(format!("{base}/v1/orders/{a}/cancel"), true, None).await;
    assert_eq!(
        (s, t["error"].as_str()),
        (409, Some("already_final")),
        "{t}"
    );
    let unknown = format!("holdy~0~{}", "0".repeat(32));
    let (s, t) = send(format!("{base}/v1/orders/{unknown}/cancel"), true, None).await;
    assert_eq!(
        (s, t["error"].as_str()),
        (404, Some("unknown_order")),
        "{t}"
    );
    let (s, t) = send(pay("nonsense"), true, Some(json!({"payment_ref": "p"}))).await;
    assert_eq!((s, t["error"].as_str()), (422, Some("invalid")), "{t}");
    // Bob never pays: the server's sweeper expires his hold.
    let start = Instant::now();
    loop {
        let r = c
            .get(format!("{base}/v1/orders/{b}"))
            .send()
            .await
            .expect("order");
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if v["state"] == "expired" {
            assert_eq!(
                (v["user"].as_str(), v["qty"].as_u64()),
                (Some("bob"), Some(1))
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never expired: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, t) = send(pay(&b), true, Some(json!({"payment_ref": "late"}))).await;
    assert_eq!((s, t["error"].as_str()), (409, Some("hold_expired")), "{t}");
    let (s, again) = buy(&c, &base, "holdy", "cy", 1, "r1").await;
    assert_eq!(s, 200, "bob's unit is back on sale: {again}");
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for name in [
        "flashsale_hold_transitions_total",
        "flashsale_holds_expired_total",
        "flashsale_hold_expiry_lag_seconds_bucket",
        "flashsale_holds_held",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

/// From the attack on serve: `/metrics` and the probes sat on the public
/// listener, outside `max_in_flight` and without a token, so a flood of
/// scrapes raised purchase p99 to 490 ms. With `server.metrics_listen` they
/// have a listener of their own; the public one keeps `/healthz` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_probes_move_to_a_listener_of_their_own() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let port = free_port();
    let server = ServeProcess::start(
        &cluster,
        &pg,
        "",
        &format!("metrics_listen = \"127.0.0.1:{port}\""),
    );
    let base = server.base();
    let probes = format!("http://127.0.0.1:{port}");
    let c = http();
    let (s, b) = create(&c, &base, json!({"sku": "m1", "stock": 3})).await;
    assert_eq!(s, 201, "{b}");
    let r = c
        .post(format!("{base}/v1/sales/m1/purchase"))
        .json(&json!({"user": "u1", "qty": 1, "request_id": "r1"}))
        .send()
        .await
        .expect("purchase");
    assert_eq!(r.status(), 200);
    for (url, want) in [
        (format!("{base}/healthz"), 200),
        (format!("{base}/metrics"), 404),
        (format!("{base}/readyz"), 404),
        (format!("{probes}/healthz"), 200),
        (format!("{probes}/v1/sales/m1"), 404),
    ] {
        let r = c.get(&url).send().await.expect("get");
        assert_eq!(r.status().as_u16(), want, "{url}");
    }
    let ready = c
        .get(format!("{probes}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert!(
        [200, 503].contains(&ready.status().as_u16()),
        "readyz answers there: {}",
        ready.status()
    );
    let metrics = c
        .get(format!("{probes}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("flashsale_http_requests_total"),
        "the public listener's requests are counted there: {metrics}"
    );
}
