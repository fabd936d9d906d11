//! `redis-server` processes for the far-memory tests (`farmem.rs`,
//! `stress.rs`): a single server, or a cluster of masters and replicas, on
//! free loopback ports, stopped (and their directories removed) on drop.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port, in a directory of its own,
/// with no persistence; killed and removed on drop.
pub struct Server {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        // A port that is free and whose cluster bus port (+10,000) is too;
        // a server that exits at once (the port was taken meanwhile) is
        // started again on another.
        for _ in 0..20 {
            let port = usermm_sys::testing::free_cluster_port().expect("a free loopback port");
            let dir = std::env::temp_dir().join(format!("usermm-farmem-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut s = Server { port, child: None, dir, extra: extra.iter().map(|s| s.to_string()).collect() };
            if s.try_start() {
                return s;
            }
        }
        panic!("redis-server did not start on any of 20 free ports");
    }

    /// Starts the server (again, after [`Server::kill`]: same port, same
    /// directory, so a cluster node rejoins with its `nodes.conf`).
    /// A start that fails (the server exits at once: its port or bus port
    /// is held for a moment by a socket of the old process or of a client)
    /// is tried again for up to 10 s; then the panic quotes its log.
    pub fn restart(&mut self) {
        let t0 = Instant::now();
        while !self.try_start() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server on port {} exited at start for 10 s; its log ends with:\n{}",
                self.port,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of the server's log file.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Starts the server; false if it exited before answering.
    fn try_start(&mut self) -> bool {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&self.extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): install it (apt-get install redis-server; scripts/test.sh does)"
                )
            });
        self.child = Some(child);
        let t0 = Instant::now();
        while self.client().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c)).is_err() {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer in 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    pub fn url(&self, prefix: &str) -> String {
        format!("redis://127.0.0.1:{}/?prefix={prefix}&timeout_ms=1000", self.port)
    }

    pub fn client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.client().unwrap();
        redis::cmd("KEYS").arg(pattern).query(&mut c).unwrap()
    }

    pub fn dbsize(&self) -> u64 {
        let mut c = self.client().unwrap();
        redis::cmd("DBSIZE").query(&mut c).unwrap()
    }

    /// `INFO replication`'s `role:` line.
    pub fn role(&self) -> String {
        self.info_replication().lines().find_map(|l| l.strip_prefix("role:")).unwrap_or("?").trim().to_string()
    }

    /// `INFO replication`.
    pub fn info_replication(&self) -> String {
        let mut c = self.client().unwrap();
        redis::cmd("INFO").arg("replication").query(&mut c).unwrap()
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster on loopback: `masters` masters with `replicas` replicas
/// each, a 1 s node timeout (failover within a few seconds).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        let args =
            ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"];
        let nodes: Vec<Server> = (0..masters * (1 + replicas)).map(|_| Server::start(&args)).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (Debian's redis-tools, installed with redis-server)");
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let c = Cluster { nodes };
        c.wait_ok(Duration::from_secs(30));
        // Every replica linked to its master (a `WAIT` counts only those).
        let t0 = Instant::now();
        while replicas > 0
            && !c.nodes.iter().all(|n| {
                let mut cl = n.client().unwrap();
                let info: String = redis::cmd("INFO").arg("replication").query(&mut cl).unwrap_or_default();
                info.contains("role:master") && info.contains(&format!("connected_slaves:{replicas}"))
                    || info.contains("role:slave") && info.contains("master_link_status:up")
            })
        {
            assert!(t0.elapsed() < Duration::from_secs(30), "the replicas did not link up in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// Waits until every running node says `cluster_state:ok` and the
    /// cluster has as many masters with slots as it was made with.
    pub fn wait_ok(&self, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let ok = self.nodes.iter().filter(|n| n.running()).all(|n| {
                n.client()
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(t0.elapsed() < limit, "the cluster is not ok after {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills master `victim` and waits (up to `limit`) until one of its
    /// replicas has taken over its slots; returns how long that took. A
    /// master without persistence that came back before that would come
    /// back empty and still a master, and its replica would copy the empty
    /// data set: the lost pages would be Redis's doing, not the space's.
    /// Panics, quoting the replica's log, if no replica took over.
    pub fn fail_over(&mut self, victim: usize, limit: Duration) -> Duration {
        let replicas: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| i != victim && self.nodes[i].running())
            .filter(|&i| self.nodes[i].info_replication().contains(&format!("master_port:{}", self.nodes[victim].port)))
            .collect();
        assert!(!replicas.is_empty(), "master on port {} has no replica to fail over to", self.nodes[victim].port);
        self.nodes[victim].kill();
        let t0 = Instant::now();
        loop {
            if replicas.iter().any(|&i| self.nodes[i].role() == "master") {
                return t0.elapsed();
            }
            if t0.elapsed() >= limit {
                let r = replicas[0];
                let msg = format!(
                    "no replica of port {} took over in {limit:?}; replica on port {}: {}\nits log ends with:\n{}",
                    self.nodes[victim].port,
                    self.nodes[r].port,
                    self.nodes[r].info_replication().replace("\r\n", " "),
                    self.nodes[r].log_tail()
                );
                eprintln!("{msg}");
                panic!("{msg}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self, prefix: &str, replicas: u32) -> String {
        self.url_timeout(prefix, replicas, 1000)
    }

    /// `url` with the store's `timeout_ms` (`WAIT` gets half of it).
    pub fn url_timeout(&self, prefix: &str, replicas: u32, timeout_ms: u32) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}/?prefix={prefix}&timeout_ms={timeout_ms}&replicas={replicas}", seeds.join(","))
    }

    /// Indices of the running masters.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].running() && self.nodes[i].role() == "master").collect()
    }

    /// Keys on every running master.
    pub fn total_keys(&self) -> u64 {
        self.masters().iter().map(|&i| self.nodes[i].dbsize()).sum()
    }
}

/// A group Redis Sentinel watches: a master, a replica of it, and one
/// Sentinel (quorum 1) that promotes the replica 1 s after the master
/// stops answering. Stopped (and its directory removed) on drop.
pub struct SentinelGroup {
    pub name: String,
    pub master: Server,
    pub replica: Server,
    pub sentinel_port: u16,
    sentinel: Option<Child>,
    dir: PathBuf,
}

impl SentinelGroup {
    pub fn start(name: &str) -> SentinelGroup {
        let master = Server::start(&[]);
        let mport = master.port.to_string();
        let replica = Server::start(&["--replicaof", "127.0.0.1", &mport]);
        let t0 = Instant::now();
        while !replica.info_replication().contains("master_link_status:up") {
            assert!(t0.elapsed() < Duration::from_secs(20), "the replica never linked to its master");
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = usermm_sys::testing::free_cluster_port().expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("usermm-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\nsentinel monitor {name} 127.0.0.1 {mport} 1\n\
                 sentinel down-after-milliseconds {name} 1000\nsentinel failover-timeout {name} 10000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir.display(),
                dir.join("sentinel.log").display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server --sentinel ({e})"));
        let g =
            SentinelGroup { name: name.to_string(), master, replica, sentinel_port: port, sentinel: Some(child), dir };
        let t0 = Instant::now();
        while g.master_port() != Some(g.master.port) {
            assert!(t0.elapsed() < Duration::from_secs(20), "the Sentinel never named the master");
            std::thread::sleep(Duration::from_millis(50));
        }
        g
    }

    /// The store's URL for the group's master, under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{}?prefix={prefix}&timeout_ms=1000", self.sentinel_port, self.name)
    }

    /// The master's port, as the Sentinel names it now.
    pub fn master_port(&self) -> Option<u16> {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.sentinel_port)).ok()?;
        let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        let addr: Vec<String> =
            redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(&self.name).query(&mut c).ok()?;
        addr.get(1)?.parse().ok()
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        if let Some(mut c) = self.sentinel.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
