//! Optional parts are features: a service that embeds flashsale for
//! purchases and locks only (`default-features = false`) builds neither the
//! PostgreSQL crates nor the HTTP ones.

use std::process::Command;

#[test]
fn without_default_features_flashsale_pulls_in_no_postgres_or_http_crates() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let tree = |args: &[&str]| -> String {
        let out = Command::new(env!("CARGO"))
            .args([
                "tree",
                "-p",
                "flashsale",
                "-e",
                "normal",
                "--prefix",
                "none",
            ])
            .args(args)
            .current_dir(root)
            .output()
            .expect("run cargo tree");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let crates = |tree: &str, name: &str| tree.lines().any(|l| l.starts_with(&format!("{name} v")));
    let lean = tree(&["--no-default-features"]);
    for name in ["tokio-postgres", "deadpool-postgres", "axum", "hyper"] {
        assert!(!crates(&lean, name), "{name} in the lean build:\n{lean}");
    }
    assert!(
        crates(&lean, "redis"),
        "the lean build still has redis:\n{lean}"
    );
    // The check can fail: the default build does have them.
    let full = tree(&[]);
    for name in ["tokio-postgres", "axum", "hyper"] {
        assert!(crates(&full, name), "{name} missing from the default build");
    }
}
