//! The Redis Stream commands of the order writer, each a small function over
//! the writer's own cluster connection: group creation, reads, claims, acks,
//! dead letters, trimming and the backlog figure.

use std::cmp::Ordering;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};

use super::entry::{parse_entries, parse_xreadgroup, RawEntry};
use crate::scripts::LuaScript;

/// The consumer group every order writer joins.
pub const GROUP: &str = "flashsale-writer";

/// Creates the group at the start of the stream (MKSTREAM); an existing
/// group is fine.
pub async fn ensure_group(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
) -> Result<(), RedisError> {
    let r: Result<(), RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(key)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match r {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// Entries never delivered to any consumer of the group, up to `count`.
pub async fn read_new(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
    consumer: &str,
    count: usize,
) -> Result<Vec<RawEntry>, RedisError> {
    read_group(conn, key, group, consumer, count, ">").await
}

/// Entries pending on `consumer` itself (delivered, not acknowledged), as
/// the current master holds them.
pub async fn read_own_pending(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
    consumer: &str,
    count: usize,
) -> Result<Vec<RawEntry>, RedisError> {
    Ok(read_group(conn, key, group, consumer, count, "0")
        .await?
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .collect())
}

/// `XREADGROUP ... STREAMS key <from>`: `>` for new entries, `0` for this
/// consumer's own pending ones.
async fn read_group(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
    consumer: &str,
    count: usize,
    from: &str,
) -> Result<Vec<RawEntry>, RedisError> {
    let v: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(key)
        .arg(from)
        .query_async(conn)
        .await?;
    Ok(parse_xreadgroup(&v))
}

/// Takes over entries pending on any consumer for longer than `idle`.
pub async fn autoclaim(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
    consumer: &str,
    idle: Duration,
    count: usize,
) -> Result<Vec<RawEntry>, RedisError> {
    let v: Value = redis::cmd("XAUTOCLAIM")
        .arg(key)
        .arg(group)
        .arg(consumer)
        .arg(idle.as_millis() as u64)
        .arg("0-0")
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    match v {
        Value::Array(parts) if parts.len() >= 2 => Ok(parse_entries(&parts[1])
            .into_iter()
            .filter(|e| !e.fields.is_empty())
            .collect()),
        _ => Ok(Vec::new()),
    }
}

/// Acknowledges `ids`.
pub async fn ack(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
    ids: &[&str],
) -> Result<(), RedisError> {
    let _: i64 = redis::cmd("XACK")
        .arg(key)
        .arg(group)
        .arg(ids)
        .query_async(conn)
        .await?;
    Ok(())
}

/// The most fields of one entry a dead letter copies.
const DEAD_LETTER_FIELDS: usize = 1000;

/// Moves an entry the writers cannot write, with the reason, to `dead_key`,
/// the stream's dead-letter stream (same hash tag, so same slot), and
/// acknowledges it in `group`, in one atomic step (`lua/dead_letter.lua`):
/// an entry is dead-lettered once, however often an attempt fails around
/// it. `false` when it was not pending any more (moved already).
pub async fn dead_letter(
    conn: &mut ClusterConnection,
    script: &LuaScript,
    key: &str,
    dead_key: &str,
    group: &str,
    e: &RawEntry,
    reason: &str,
) -> Result<bool, RedisError> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha)
        .arg(2)
        .arg(key)
        .arg(dead_key)
        .arg(group)
        .arg(&e.id)
        .arg(reason);
    // The script passes the fields to XADD as arguments, and Lua unpacks at
    // most a few thousand: a hand-made entry with more keeps its first ones.
    for (f, v) in e.fields.iter().take(DEAD_LETTER_FIELDS) {
        cmd.arg(format!("orig_{f}")).arg(v);
    }
    if e.fields.len() > DEAD_LETTER_FIELDS {
        cmd.arg("fields_left_out")
            .arg(e.fields.len() - DEAD_LETTER_FIELDS);
    }
    Ok(eval(conn, script, &cmd).await? == 1)
}

/// Runs `cmd`, an EVALSHA of `script`; on NOSCRIPT (a master restarted
/// empty) loads the script on every master and runs it again.
async fn eval(
    conn: &mut ClusterConnection,
    script: &LuaScript,
    cmd: &redis::Cmd,
) -> Result<i64, RedisError> {
    match cmd.query_async::<i64>(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script.code)
                .query_async(conn)
                .await?;
            cmd.query_async::<i64>(conn).await
        }
        r => r,
    }
}

/// Orders stream ids (`ms-seq`) numerically.
pub fn cmp_ids(a: &str, b: &str) -> Ordering {
    let parse = |s: &str| {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a).cmp(&parse(b))
}

/// Deletes entries that every consumer group of the stream is done with, in
/// one atomic step (`lua/trim.lua`, which says how the bound is found): below
/// the oldest entry any group still has pending, and never past what any
/// group has been delivered, so another group on the stream (an audit
/// reader, say, even one created while this runs) never loses an entry it
/// has not read. Nothing is trimmed unless the writers' `group` is on the
/// stream. Loads the script on every master if a node lacks it (a master
/// restarted empty).
pub async fn trim_acknowledged(
    conn: &mut ClusterConnection,
    script: &LuaScript,
    key: &str,
    group: &str,
) -> Result<(), RedisError> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(1).arg(key).arg(group);
    eval(conn, script, &cmd).await.map(|_| ())
}

/// Deletes the consumers of `group` on `key` that have nothing pending and
/// have been idle at least `idle`, but `own`, in one atomic step
/// (`lua/forget_consumers.lua`, which says why nothing pending is lost).
/// Returns how many went.
pub async fn forget_consumers(
    conn: &mut ClusterConnection,
    script: &LuaScript,
    key: &str,
    group: &str,
    own: &str,
    idle: Duration,
) -> Result<i64, RedisError> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha)
        .arg(1)
        .arg(key)
        .arg(group)
        .arg(own)
        .arg(idle.as_millis().min(i64::MAX as u128) as i64);
    eval(conn, script, &cmd).await
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// One consumer group as `XINFO GROUPS` describes it.
struct GroupInfo(Vec<(String, Value)>);

impl GroupInfo {
    /// The value of field `name` (`name`, `pending`, `lag`, ...).
    fn get(&self, name: &str) -> Option<Value> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Every consumer group of `key` (none when the stream has none).
async fn groups(conn: &mut ClusterConnection, key: &str) -> Result<Vec<GroupInfo>, RedisError> {
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await?;
    let Value::Array(groups) = groups else {
        return Ok(Vec::new());
    };
    Ok(groups
        .into_iter()
        .map(|g| GroupInfo(info_fields(g)))
        .collect())
}

/// What `XINFO STREAM` says of a stream that the ledger and the bench need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The last id the stream ever generated ("0-0" when none).
    pub last_generated_id: String,
    /// Entries ever added; trimming never lowers it.
    pub entries_added: u64,
}

/// `XINFO STREAM key`. A stream that does not exist (an error reply) reads
/// as one that never had an entry.
pub async fn stream_info(conn: &mut ClusterConnection, key: &str) -> StreamInfo {
    let mut info = StreamInfo {
        last_generated_id: "0-0".into(),
        entries_added: 0,
    };
    let Ok(reply) = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query_async::<Value>(conn)
        .await
    else {
        return info;
    };
    for (k, v) in info_fields(reply) {
        match (k.as_str(), v) {
            ("last-generated-id", v) => {
                if let Some(id) = text(&v) {
                    info.last_generated_id = id;
                }
            }
            ("entries-added", Value::Int(n)) => info.entries_added = n.max(0) as u64,
            _ => {}
        }
    }
    info
}

/// The fields of an `XINFO` reply (a stream, or one group), whatever the
/// protocol's shape.
fn info_fields(g: Value) -> Vec<(String, Value)> {
    match g {
        Value::Array(kv) => kv
            .chunks(2)
            .filter_map(|c| match (&c[0], c.get(1)) {
                (Value::BulkString(k), Some(v)) => {
                    Some((String::from_utf8_lossy(k).into_owned(), v.clone()))
                }
                (Value::SimpleString(k), Some(v)) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, v)| match k {
                Value::BulkString(k) => Some((String::from_utf8_lossy(&k).into_owned(), v)),
                Value::SimpleString(k) => Some((k, v)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Entries of `key` not yet written: undelivered (lag) plus pending.
pub async fn backlog(
    conn: &mut ClusterConnection,
    key: &str,
    group: &str,
) -> Result<u64, RedisError> {
    for info in groups(conn, key).await? {
        let get = |name: &str| info.get(name);
        let is_ours =
            matches!(get("name"), Some(Value::BulkString(ref n)) if n == group.as_bytes());
        if !is_ours {
            continue;
        }
        let pending = match get("pending") {
            Some(Value::Int(n)) => n.max(0) as u64,
            _ => 0,
        };
        let lag = match get("lag") {
            Some(Value::Int(n)) => n.max(0) as u64,
            _ => {
                let len: u64 = redis::cmd("XLEN").arg(key).query_async(conn).await?;
                len.saturating_sub(pending)
            }
        };
        return Ok(pending + lag);
    }
    // No group yet: nothing was ever read, everything is backlog.
    redis::cmd("XLEN").arg(key).query_async(conn).await
}
