//! Multi-locks (`LockClient::lock_all`, `flashsale lock exec --name A
//! --name B`) against real, independent redis-server lock nodes: all or
//! none, no deadlock between opposite orders, one fencing token per name.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashsale::lock::{LockClient, LockConfig, LockError, LockOptions};
use flashsale_tests::{flashsale_cmd, RedisServer};

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(s: &[RedisServer]) -> Vec<String> {
    s.iter().map(|s| s.url()).collect()
}

fn client(s: &[RedisServer]) -> LockClient {
    LockClient::new(&urls(s), LockConfig::default()).expect("lock client")
}

/// Two clients (as two processes) take {a, b} given in opposite orders, 100
/// times each, on 3 nodes: no deadlock (each call has a 20 s budget and
/// must succeed), and never two holders of either name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_and_never_share_a_name() {
    let nodes = servers(3);
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = [["a", "b"], ["b", "a"]]
        .into_iter()
        .enumerate()
        .map(|(i, names)| {
            let locks = client(&nodes);
            let inside = inside.clone();
            tokio::spawn(async move {
                let opts = LockOptions::new(format!("p{i}")).wait(Duration::from_secs(20));
                for _ in 0..100 {
                    let guard = locks.lock_all(&names, &opts).await.expect("both, in time");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "one holder");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let tokens = guard.fencing_tokens();
                    assert_eq!(
                        tokens.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
                        ["a", "b"],
                        "taken in name order"
                    );
                    assert!(guard.unlock().await, "both still held at unlock");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_elsewhere_fails_the_whole_multi_lock_and_leaves_nothing_held() {
    let nodes = servers(3);
    let other = client(&nodes);
    let held = other
        .lock("c", &LockOptions::new("other"))
        .await
        .expect("c held by another owner");
    let locks = client(&nodes);
    let opts = LockOptions::new("me").wait(Duration::from_millis(500));
    let err = locks
        .lock_all(&["a", "c", "b"], &opts)
        .await
        .err()
        .expect("c is held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    // a and b were taken before c (sorted) and given back.
    for key in ["flashsale:lock:a", "flashsale:lock:b"] {
        for n in &nodes {
            assert_eq!(n.node.cmd::<i64>(&["EXISTS", key]), 0, "{key} left held");
        }
    }
    held.unlock().await;
    let guard = locks
        .lock_all(&["a", "c", "b", "a"], &opts)
        .await
        .expect("all free now");
    assert_eq!(guard.fencing_tokens().len(), 3, "duplicates count once");
    assert!(guard.fencing_token("c").is_some());
    guard.unlock().await;
    assert!(matches!(
        locks.lock_all(&[], &opts).await,
        Err(LockError::Invalid(_))
    ));
}

#[test]
fn lock_exec_with_several_names_gives_one_token_per_name() {
    let nodes = servers(3);
    let out = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock", "exec", "--name", "zeta", "--name", "alpha", "--", "sh", "-c",
            "echo $FLASHSALE_LOCK_NAME_0=$FLASHSALE_FENCING_TOKEN_0 $FLASHSALE_LOCK_NAME_1=$FLASHSALE_FENCING_TOKEN_1; exit 3",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3), "exit code passed through");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let pairs: Vec<(&str, u64)> = line
        .split(' ')
        .filter_map(|p| {
            let (n, t) = p.split_once('=')?;
            Some((n, t.parse().ok()?))
        })
        .collect();
    assert_eq!(pairs.len(), 2, "{line}");
    assert_eq!(
        (pairs[0].0, pairs[1].0),
        ("zeta", "alpha"),
        "numbered as given: {line}"
    );
    assert!(pairs.iter().all(|(_, t)| *t > 0), "real tokens: {line}");
    for key in ["flashsale:lock:zeta", "flashsale:lock:alpha"] {
        assert_eq!(nodes[0].node.cmd::<i64>(&["EXISTS", key]), 0, "released");
    }
}
