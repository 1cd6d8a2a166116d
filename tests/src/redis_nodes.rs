//! Real `redis-server` processes for the tests: single instances and whole
//! Redis Clusters (masters, replicas, failovers) on free loopback ports in
//! temp dirs, killed on drop. Never the `ops/up` ports, never 6379.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::waiting::wait_for;

/// A free TCP port on 127.0.0.1 whose cluster-bus twin (port + 10000) is free
/// too. The listener is dropped before returning, so another process could
/// race us to it; redis-server then fails to start and the fixture panics
/// with its log, which is rare and loud rather than silent.
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().expect("local addr").port();
        if port > 55000 {
            continue;
        }
        if TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port + 10000))).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

/// One `redis-server` process.
pub struct RedisNode {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its working directory (nodes.conf, AOF, log).
    pub dir: PathBuf,
    /// The port it tells the cluster (and so clients) to use, when that is
    /// a proxy in front of it rather than `port` itself.
    pub announced: Option<u16>,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisNode {
    fn spawn(dir: &Path, port: u16, extra: &[&str]) -> RedisNode {
        let mut node = RedisNode::unstarted(dir, port, extra);
        node.start();
        node
    }

    /// The node on `port` in its own directory under `dir`, not running.
    fn unstarted(dir: &Path, port: u16, extra: &[&str]) -> RedisNode {
        let dir = dir.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("node dir");
        RedisNode {
            port,
            dir,
            announced: None,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn start(&mut self) {
        self.spawn_child();
        if !self.wait_started() {
            panic!(
                "redis on {} exited at start (port taken?): {}",
                self.port,
                self.log_tail()
            );
        }
    }

    /// Starts the process, without waiting for it.
    fn spawn_child(&mut self) {
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed? run ops/up)");
        self.child = Some(child);
    }

    /// Waits until the server this node spawned answers; false when it
    /// exited first (its port, or its bus port, was taken meanwhile by
    /// another test's process, which may well answer PING: so the answer
    /// must come from our own process id).
    fn wait_started(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let Some(child) = self.child.as_mut() else {
                return false;
            };
            if matches!(child.try_wait(), Ok(Some(_))) {
                self.child = None;
                return false;
            }
            let pid = child.id();
            if self.ping() && self.process_id() == Some(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "timed out after 10s: redis on {} did not answer: {}",
            self.port,
            self.log_tail()
        );
    }

    /// The process id of whatever server answers on this node's port.
    fn process_id(&self) -> Option<u32> {
        let mut c = redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(200))
            .ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut c).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// A node on a free port: when another process takes the port between
    /// its choice and the bind, the node is started again on another.
    fn spawn_on_a_free_port(dir: &Path, extra: &[&str]) -> RedisNode {
        for _ in 0..5 {
            let mut node = RedisNode::unstarted(dir, free_port(), extra);
            node.spawn_child();
            if node.wait_started() {
                return node;
            }
        }
        panic!("no free port held for a redis-server after 5 tries");
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A blocking connection to this node, for assertions and fault injection.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("url")
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to redis node")
    }

    fn ping(&self) -> bool {
        redis::Client::open(self.url())
            .ok()
            .and_then(|c| {
                c.get_connection_with_timeout(Duration::from_millis(200))
                    .ok()
            })
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
            .is_some()
    }

    /// Runs a command on this node.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.port))
    }

    /// kill -9: the process dies without a goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends a signal (SIGSTOP / SIGCONT) to the process.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Starts the process again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// True while the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        log.lines().rev().take(15).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A single Redis instance (lock nodes), killed on drop.
pub struct RedisServer {
    /// The process.
    pub node: RedisNode,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts one instance with no persistence.
    pub fn start() -> RedisServer {
        let dir = TempDir::new().expect("temp dir");
        let node = RedisNode::spawn_on_a_free_port(dir.path(), &["--appendonly", "no"]);
        RedisServer { node, _dir: dir }
    }

    /// Starts one instance with no persistence and `extra` arguments
    /// (e.g. another `--bind`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = TempDir::new().expect("temp dir");
        let mut args = vec!["--appendonly", "no"];
        args.extend_from_slice(extra);
        let node = RedisNode::spawn_on_a_free_port(dir.path(), &args);
        RedisServer { node, _dir: dir }
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        self.node.url()
    }
}

/// EVALSHA calls a node has run so far (`INFO commandstats`): how tests see
/// that a script call did, or did not, reach a node.
pub fn evalsha_calls(node: &RedisServer) -> u64 {
    let info: String = node.node.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A Redis Cluster of `masters` masters with `replicas` replicas each.
pub struct RedisCluster {
    /// Every node, masters first as created (roles change on failover).
    pub nodes: Vec<RedisNode>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Spawns the nodes, joins them with `redis-cli --cluster create`, and
    /// waits until every node reports `cluster_state:ok` with a full slot map.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        // Port 0: each node on a free port of its own (see `start_on`).
        let ports = (0..masters * (1 + replicas)).map(|_| (0, None));
        RedisCluster::start_on(masters, replicas, ports.collect())
    }

    /// Like [`RedisCluster::start`], on the given ports (0: a free port of
    /// its own, chosen again if another process takes it first, as
    /// `start` does; only with no proxy); a node paired with
    /// `Some(p)` announces `p` (a proxy in front of it) as its address, so
    /// clients and replicas reach it only through `p`. The cluster bus keeps
    /// its own port, so gossip and failover do not go through the proxy.
    pub fn start_on(
        masters: usize,
        replicas: usize,
        ports: Vec<(u16, Option<u16>)>,
    ) -> RedisCluster {
        assert_eq!(ports.len(), masters * (1 + replicas), "one port per node");
        let dir = TempDir::new().expect("temp dir");
        let nodes: Vec<RedisNode> = ports
            .into_iter()
            .map(|(port, announced)| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--appendonly",
                    "yes",
                    "--cluster-replica-validity-factor",
                    "0",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if let Some(a) = announced {
                    args.extend([
                        "--cluster-announce-port".into(),
                        a.to_string(),
                        "--cluster-announce-bus-port".into(),
                        (port + 10000).to_string(),
                    ]);
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut node = if port == 0 {
                    RedisNode::spawn_on_a_free_port(dir.path(), &args)
                } else {
                    RedisNode::spawn(dir.path(), port, &args)
                };
                node.announced = announced;
                node
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes, _dir: dir };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Seed URLs for `Config::cluster_nodes`.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.announced.unwrap_or(n.port)))
            .collect()
    }

    /// Waits until every running node says `cluster_state:ok`, every replica
    /// has finished its initial sync, and all running nodes agree on the masters.
    pub fn wait_healthy(&self, timeout: Duration) {
        wait_for(
            timeout,
            || self.is_healthy(),
            || "cluster did not become healthy".into(),
        );
    }

    fn is_healthy(&self) -> bool {
        let running: Vec<&RedisNode> = self.nodes.iter().filter(|n| n.is_running()).collect();
        let mut views = Vec::new();
        for n in &running {
            let Ok(mut c) = redis::Client::open(n.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
            else {
                return false;
            };
            let info: String = match redis::cmd("CLUSTER").arg("INFO").query(&mut c) {
                Ok(i) => i,
                Err(_) => return false,
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut c)
                .unwrap_or_default();
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return false;
            }
            let mut masters: Vec<String> =
                match redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) {
                    Ok(nodes) => nodes
                        .lines()
                        .filter(|l| {
                            l.contains("master") && !l.contains("fail") && l.split(' ').count() > 8
                        })
                        .filter_map(|l| {
                            l.split(' ')
                                .nth(1)
                                .map(|a| a.split('@').next().unwrap_or("").to_owned())
                        })
                        .collect(),
                    Err(_) => return false,
                };
            masters.sort();
            views.push(masters);
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// The node listening on `port` (or announcing it).
    pub fn node(&self, port: u16) -> &RedisNode {
        self.nodes
            .iter()
            .find(|n| n.port == port || n.announced == Some(port))
            .expect("node with that port")
    }

    /// Mutable access to the node listening on `port` (or announcing it).
    pub fn node_mut(&mut self, port: u16) -> &mut RedisNode {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port || n.announced == Some(port))
            .expect("node with that port")
    }

    /// Ports of the nodes that are masters now (asked of a running node).
    pub fn master_ports(&self) -> Vec<u16> {
        let n = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
        let mut ports: Vec<u16> = nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| l.split(' ').nth(1))
            .filter_map(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok())
            .collect();
        ports.sort();
        ports
    }

    /// The port of a replica of the master on `master` (asked of that master).
    pub fn replica_of(&self, master: u16) -> u16 {
        let nodes: String = self.node(master).cmd(&["CLUSTER", "NODES"]);
        let master_id = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split(' ').next())
            .expect("the master's own id")
            .to_owned();
        nodes
            .lines()
            .find(|l| l.contains(&format!("slave {master_id}")))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok())
            .expect("a replica of the master")
    }

    /// Moves every key of `slot` from the master on `from` to the master on `to`
    /// the way `redis-cli --cluster reshard` does: IMPORTING/MIGRATING, MIGRATE
    /// in batches, then SETSLOT NODE on every master.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) -> Vec<String> {
        self.migrate_slot_paced(slot, from, to, 100, Duration::ZERO)
    }

    /// [`RedisCluster::migrate_slot`], `batch` keys per MIGRATE with `pause`
    /// between batches, so clients meet the slot half moved (ASK, MOVED).
    ///
    /// Returns the keys that were on both nodes (moved with REPLACE).
    pub fn migrate_slot_paced(
        &self,
        slot: u16,
        from: u16,
        to: u16,
        batch: usize,
        pause: Duration,
    ) -> Vec<String> {
        let batch = batch.max(1).to_string();
        let mut on_both = Vec::new();
        let id = |port: u16| -> String { self.node(port).cmd(&["CLUSTER", "MYID"]) };
        let (from_id, to_id) = (id(from), id(to));
        let s = slot.to_string();
        let _: () = self
            .node(to)
            .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        let _: () = self
            .node(from)
            .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
        loop {
            let keys: Vec<String> = self
                .node(from)
                .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, &batch]);
            if keys.is_empty() {
                break;
            }
            // The node's own port: a MIGRATE never goes through a proxy.
            let port = self.node(to).port.to_string();
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                port.as_str(),
                "",
                "0",
                "5000",
                "KEYS",
            ];
            args.extend(keys.iter().map(String::as_str));
            let mut conn = self.node(from).conn();
            let mut migrate = redis::cmd(args[0]);
            for a in &args[1..] {
                migrate.arg(*a);
            }
            match migrate.query::<String>(&mut conn) {
                Ok(_) => {}
                Err(e) if e.to_string().contains("BUSYKEY") => {
                    // A key of the slot is on both nodes. Identical copies
                    // are harmless (the source's is moved over the other);
                    // different ones mean the slot's data is split, which
                    // no replace can repair: that is a failure, with both.
                    for k in &keys {
                        let mut one = redis::cmd("MIGRATE");
                        one.arg("127.0.0.1").arg(&port).arg(k).arg(0).arg(5000);
                        if let Err(e) = one.query::<String>(&mut conn) {
                            if !e.to_string().contains("BUSYKEY") {
                                panic!("MIGRATE {k} on {from}: {e}");
                            }
                            let dump = |p: u16| -> Option<Vec<u8>> {
                                redis::cmd("DUMP")
                                    .arg(k)
                                    .query(&mut self.node(p).conn())
                                    .ok()
                            };
                            let (here, there) = (dump(from), dump(to));
                            assert!(
                                here == there,
                                "key {k} of slot {slot} differs on {from} and {to}: the slot's data is split"
                            );
                            one.arg("REPLACE");
                            let _: String = one
                                .query(&mut conn)
                                .unwrap_or_else(|e| panic!("MIGRATE {k} REPLACE on {from}: {e}"));
                            on_both.push(k.clone());
                        }
                    }
                }
                Err(e) => panic!("{args:?} on {from}: {e}"),
            }
            std::thread::sleep(pause);
        }
        // The target first, then the source, then the rest (as redis-cli
        // does): never a moment when each of the two points at the other.
        let mut order = vec![to, from];
        order.extend(
            self.master_ports()
                .into_iter()
                .filter(|p| *p != to && *p != from),
        );
        for port in order {
            let _: () = self
                .node(port)
                .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
        on_both
    }

    /// Slots some running node still shows as migrating or importing
    /// (`[slot->-id]` / `[slot-<-id]` in CLUSTER NODES).
    pub fn open_slots(&self) -> Vec<String> {
        let mut open = Vec::new();
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let Ok(nodes) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query::<String>(&mut n.conn())
            else {
                continue;
            };
            for l in nodes.lines().filter(|l| l.contains("myself")) {
                open.extend(
                    l.split(' ')
                        .filter(|f| f.contains("->-") || f.contains("-<-"))
                        .map(|f| format!("{}: {f}", n.port)),
                );
            }
        }
        open
    }

    /// The port of the master serving `slot` now.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let n = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
        for l in nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
        {
            let f: Vec<&str> = l.split(' ').collect();
            for range in f.iter().skip(8) {
                let (a, b) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>(), b.parse::<u16>()),
                    None => (range.parse::<u16>(), range.parse::<u16>()),
                };
                if let (Ok(a), Ok(b)) = (a, b) {
                    if a <= slot && slot <= b {
                        return f[1]
                            .split('@')
                            .next()
                            .and_then(|x| x.rsplit(':').next())
                            .and_then(|p| p.parse().ok())
                            .expect("port");
                    }
                }
            }
        }
        panic!("no master serves slot {slot}");
    }
}

impl RedisNode {
    /// Keys matching `pattern` on this node (tests only: KEYS is O(n)).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cmd(&["KEYS", pattern])
    }

    /// `connected_clients` from `INFO clients` (this call's own connection
    /// included).
    pub fn connected_clients(&self) -> usize {
        let info: String = self.cmd(&["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}
