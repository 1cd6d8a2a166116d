//! The OpenAPI description `serve` publishes, held to by the live server:
//! schemathesis (PyPI; `ops/test` installs it into a virtual environment
//! and names it in `FLASHSALE_SCHEMATHESIS`) generates requests from
//! `/openapi.json` for every route, valid and not, follows the links it
//! can, and checks every answer: no 5xx, every status and body as
//! described, every error in the one `{"error", "message"}` shape. The
//! topology is ops/up's: 3 masters with a replica each, PostgreSQL, one
//! `serve` with its admin token.

use std::process::Command;

use flashsale_tests::{create_sale, http_client, PgDb, RedisCluster, ServeProcess, ADMIN_TOKEN};
use serde_json::{json, Value};

/// The schemathesis executable `ops/test` installed.
fn schemathesis() -> String {
    std::env::var("FLASHSALE_SCHEMATHESIS").expect(
        "FLASHSALE_SCHEMATHESIS names the schemathesis executable: run the suite with ops/test, \
         which installs it",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_server_keeps_to_its_openapi_description() {
    let st = schemathesis();
    let cluster = RedisCluster::start(3, 1);
    let pg = PgDb::create();
    // With room keys, as a server with waiting rooms runs: the queue
    // routes are reached, not answered 503 `no_keys`.
    let server = ServeProcess::start(
        &cluster,
        &pg,
        "[room]\nsecret = \"openapi-test-room-secret-of-32-bytes\"",
        "",
    );
    let base = server.base();
    let c = http_client();

    // A sale for the generated requests to find, one with holds, one with a
    // waiting room, and one order: schemathesis mostly makes up names, and
    // these give its examples something real to reach.
    for body in [
        json!({"sku": "api-a", "stock": 1000, "buckets": 3}),
        json!({"sku": "api-h", "stock": 1000, "hold_ms": 600000}),
        json!({"sku": "api-q", "stock": 1000, "per_user_limit": 1, "queue": {}}),
    ] {
        assert_eq!(create_sale(&c, &base, body).await.0, 201);
    }
    let doc: Value = c
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/sales/{sku}/purchase"]["post"].is_object());

    let dir = tempfile::TempDir::new().expect("dir");
    let report = dir.path().join("report.json");
    let out = Command::new(&st)
        .args(["run", &format!("{base}/openapi.json")])
        .args(["--checks", "all"])
        // Made-up ids are refused with 404 or 422 by design, and an admin
        // route answers 401 to a request without the token: neither is a
        // defect of the description.
        .args([
            "--exclude-checks",
            "positive_data_acceptance,use_after_free,ensure_resource_availability,ignored_auth",
        ])
        .args(["--header", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .args([
            "--max-examples",
            "150",
            "--seed",
            "20261128",
            "--workers",
            "2",
        ])
        .args(["--request-timeout", "20"])
        .args(["--report", "ndjson", "--report-ndjson-path"])
        .arg(&report)
        .env("NO_COLOR", "1")
        // Its cache of found crashes goes with the test's temp dir.
        .current_dir(dir.path())
        .output()
        .expect("run schemathesis");
    let said = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = said
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect();
    println!("{}", summary.join("\n"));
    assert!(
        out.status.success(),
        "schemathesis found answers that break the description:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It ran cases, on every route.
    let field = |name: &str| {
        said.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    assert_eq!(field("Tested:").as_deref(), Some("13"), "{said}");
    let cases = said
        .lines()
        .find(|l| l.contains(" generated, "))
        .and_then(|l| l.trim().split(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(cases > 1000, "schemathesis ran {cases} cases: {said}");
}
