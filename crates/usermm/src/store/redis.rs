//! A page store on a Redis-protocol server (Redis, Valkey) or a Redis
//! Cluster, through redis-rs's synchronous client.
//!
//! `swap_url` is one of
//! - `redis://[user:password@]host:port[/db][?OPTIONS]`: one server;
//! - `redis+cluster://host:port[,host:port…][?OPTIONS]`: a cluster, given by
//!   seed nodes; the client reads the slot map from them, follows `MOVED` and
//!   `ASK` redirections, re-reads the map when it changes, and retries (with
//!   backoff, about 10 s in all) while a failover is under way.
//!
//! OPTIONS: `prefix=P`, `timeout_ms=T` (default 2,000), `lease_ms=L`
//! (default 30,000: below), `replicas=N`
//! (default 0: a write is acknowledged only once `WAIT` says N replicas of
//! the node have it — the issue's `swap_replicas`), `failover_ms=F` (default
//! 10,000: how long a read from a cluster keeps trying, with a fresh slot map,
//! while a replica takes over a master that stopped answering; writes do not
//! wait: a failed write only keeps its pages resident).
//! - One key per chunk of 16 consecutive slots: `P` followed by the chunk
//!   number on one server; `{P<g>}<chunk>` in a cluster, `g` being the
//!   chunk's group of 256 slots, so that a run of pages (at most 256) lies in
//!   one or two hash slots. The value holds each slot's page behind a 32-byte
//!   header (the space's random id, the slot, a checksum: `store.rs`), checked
//!   on every read; a slot never written reads as zeros and fails the check.
//!   The default prefix is `usermm:<host>:<pid>:<space id>:`, unique per open
//!   space. (A key per page costs the server a key, an allocation and a copy
//!   of each page out of its query buffer, and 16 KiB reads of the socket:
//!   values of 8 pages or more are read straight into place.)
//! - A run goes out as a `SET` of each whole chunk and a `SETRANGE` of each
//!   part of one, pipelined per group (then `WAIT` on that group's node when
//!   `replicas` > 0), and comes back as a `GETRANGE` per chunk it touches.
//! - A chunk whose slots the space has all freed (its pages came back or
//!   were dropped) is unlinked by the space's background thread, the slots
//!   reserved meanwhile (`release_granule`, `core/release.rs`).
//! - Opening the space deletes every key under the prefix (left by a space
//!   with the same prefix that crashed; a cluster's by enumerating the
//!   space's possible keys, group by group); closing it deletes them too.
//! - A space never closed has its keys deleted once its process has exited
//!   (the exit hook, [`at_exit_hook`]); a space whose process was killed
//!   outright, by the first space that opens on the server after its lease
//!   (`{usermm}lease:P`, `lease_ms`, refreshed by the background thread)
//!   has lapsed, unless a connection named after it is still open
//!   ([`RedisStore::reap_dead`]).
//! - Every command has a timeout: a node that is down, slow, out of memory
//!   (`OOM command not allowed`), short of replicas, or that returns a value
//!   that does not check out is an error — for a read, the faulting thread's
//!   transient SIGBUS; for a write, pages kept resident.
//! - Connections are pooled (one per thread doing I/O at a time); a
//!   connection that failed is dropped and a new one made on next use.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use usermm_core::Errno;

use super::{header, open_sealed, PageStore, HEADER};

mod link;
use link::Link;

/// One server, or a cluster.
enum Backend {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// A pooled connection of either kind. A single server's keeps the buffer
/// its page writes are encoded in (and, over TCP, its single-chunk reads
/// read into), reused from request to request.
enum Conn {
    /// One server over TCP: [`Link`] (polls for a read's reply; reads a
    /// single chunk's reply straight into the buffer).
    Own(Link, Vec<u8>),
    /// One server over TLS or a Unix socket: redis-rs's connection.
    Single(Box<redis::Connection>, Vec<u8>),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    fn link(&mut self) -> &mut dyn redis::ConnectionLike {
        match self {
            Conn::Own(c, _) => c,
            Conn::Single(c, _) => c.as_mut(),
            Conn::Cluster(c) => c.as_mut(),
        }
    }

    /// A single server's connection and buffer (`None` for a cluster).
    fn single(&mut self) -> Option<(&mut dyn redis::ConnectionLike, &mut Vec<u8>)> {
        match self {
            Conn::Own(c, b) => Some((c, b)),
            Conn::Single(c, b) => Some((c.as_mut(), b)),
            Conn::Cluster(_) => None,
        }
    }
}

/// Pages per key group (a cluster keeps a group in one hash slot).
const GROUP: u64 = 256;
/// Pages per key (a chunk): one value holds this many consecutive slots.
const CHUNK: u64 = 16;

pub(crate) struct RedisStore {
    backend: Backend,
    pool: Mutex<Vec<Conn>>,
    prefix: String,
    /// A random id of this space: part of every stored page's header.
    space: u64,
    page: usize,
    /// Slots the space may use (a cluster's keys are deleted by
    /// enumerating them).
    slots: u64,
    timeout: Duration,
    replicas: u32,
    /// How long a read waits for a cluster to answer again (a failover).
    failover: Duration,
    /// Whether a single server's reads poll for their reply ([`Link`]).
    poll_replies: bool,
    /// Whether this store's reads poll: `poll_replies`, and a single server
    /// that a [`Link`] serves ([`PageStore::read_polls`], asked on every
    /// small swap-in).
    reads_poll: bool,
    /// How long the space's lease lasts unrefreshed (0: no lease).
    lease: Duration,
    /// When the lease is next refreshed (`usermm_sys::now_ns`; `u64::MAX`:
    /// never, no lease was taken).
    lease_next_ns: AtomicU64,
    /// Whether a refresh found the lease lapsed (said once on stderr).
    lease_lapsed: AtomicBool,
    /// The URL without credentials, for messages.
    pub(crate) shown: String,
}

/// A random 64-bit id (from the kernel's entropy; the time and pid if that
/// is unreadable).
fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).is_ok() {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ (std::process::id() as u64).rotate_left(40)
}

/// A parsed `swap_url`.
#[derive(Debug, PartialEq)]
struct Url {
    /// `redis://…` of the one server, or of each seed node of a cluster.
    nodes: Vec<String>,
    cluster: bool,
    prefix: String,
    timeout: Duration,
    replicas: u32,
    failover: Duration,
    /// How long the space's lease lasts unless refreshed (`lease_ms`);
    /// zero: no lease (the keys of a process killed outright stay).
    lease: Duration,
}

fn parse(url: &str, space: u64) -> Result<Url, Errno> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (nodes, cluster) = if let Some(rest) = base.strip_prefix("redis+cluster://") {
        let hosts = rest.trim_end_matches('/');
        let nodes: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("redis://{h}/")).collect();
        if nodes.is_empty() {
            return Err(Errno::EINVAL);
        }
        (nodes, true)
    } else if base.starts_with("redis://") || base.starts_with("rediss://") || base.starts_with("redis+unix://") {
        (vec![base.to_string()], false)
    } else {
        return Err(Errno::EINVAL);
    };
    let mut prefix = None;
    let mut timeout = Duration::from_millis(2000);
    let mut replicas = 0;
    let mut failover = Duration::from_millis(10_000);
    let mut lease = DEFAULT_LEASE;
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or(Errno::EINVAL)?;
        match k {
            "prefix" if !v.is_empty() => prefix = Some(v.to_string()),
            "timeout_ms" => timeout = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?.max(1)),
            "replicas" => replicas = v.parse::<u32>().map_err(|_| Errno::EINVAL)?,
            "failover_ms" => failover = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?),
            "lease_ms" => lease = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?),
            _ => return Err(Errno::EINVAL),
        }
    }
    let prefix = prefix.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("usermm:{}:{}:{space:016x}:", host.trim(), std::process::id())
    });
    if prefix.contains(['{', '}']) {
        // A brace would change the cluster's hash tag.
        return Err(Errno::EINVAL);
    }
    Ok(Url { nodes, cluster, prefix, timeout, replicas, failover, lease })
}

/// The cluster hash slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
fn hash_slot(key: &[u8]) -> u16 {
    let tag = match key.iter().position(|&b| b == b'{') {
        Some(i) => match key[i + 1..].iter().position(|&b| b == b'}') {
            Some(j) if j > 0 => &key[i + 1..i + 1 + j],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// `s` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            o.push('\\');
        }
        o.push(c);
    }
    o
}

/// Every failure of the server (unreachable, timed out, refusing the
/// command, out of memory) is an I/O error of the store.
fn io_error(_e: &redis::RedisError) -> Errno {
    Errno::EIO
}

impl RedisStore {
    /// Connects to the server or cluster of `url` (checking it answers),
    /// deletes the keys of dead spaces ([`RedisStore::reap_dead`]) and those
    /// a crashed space with the same prefix left behind, and takes the
    /// space's lease. `slots`: the most slots the space uses;
    /// `poll_replies`: a read waits for its reply by polling the socket for
    /// a while first ([`Link`]).
    pub(crate) fn open(url: &str, page: usize, slots: u64, poll_replies: bool) -> Result<RedisStore, Errno> {
        let space = random_id();
        let u = parse(url, space)?;
        let s = Self::build(&u, page, slots, poll_replies, space)?;
        s.with_conn(|c| redis::cmd("PING").query::<String>(c.link()).map(drop))
            .inspect_err(|_| eprintln!("usermm: swap_url {}: the server does not answer", s.shown))?;
        s.reap_dead();
        s.register();
        s.delete_all()?;
        s.track(url);
        Ok(s)
    }

    /// The store of `u` for space `space`, with no I/O yet.
    fn build(u: &Url, page: usize, slots: u64, poll_replies: bool, space: u64) -> Result<RedisStore, Errno> {
        let shown = u
            .nodes
            .iter()
            .map(|n| match n.split_once('@') {
                Some((scheme_user, host)) => {
                    format!("{}://…@{host}", scheme_user.split("://").next().unwrap_or("redis"))
                }
                None => n.clone(),
            })
            .collect::<Vec<_>>()
            .join(",");
        let backend = if u.cluster {
            let c = redis::cluster::ClusterClient::builder(u.nodes.iter().map(String::as_str))
                .connection_timeout(u.timeout)
                .response_timeout(u.timeout)
                // A failover (a replica promoted after the cluster's node
                // timeout) is waited out: 10, 20, 40 … ms up to 1 s between
                // tries, about 10 s in all.
                .retries(16)
                .min_retry_wait(10)
                .max_retry_wait(1000)
                .build()
                .map_err(|_| Errno::EINVAL)?;
            Backend::Cluster(c)
        } else {
            Backend::Single(redis::Client::open(u.nodes[0].as_str()).map_err(|_| Errno::EINVAL)?)
        };
        let reads_poll =
            poll_replies && matches!(&backend, Backend::Single(c) if Link::serves(c.get_connection_info()));
        Ok(RedisStore {
            reads_poll,
            backend,
            pool: Mutex::new(Vec::new()),
            prefix: u.prefix.clone(),
            space,
            page,
            slots,
            timeout: u.timeout,
            replicas: u.replicas,
            failover: u.failover,
            poll_replies,
            lease: u.lease,
            lease_next_ns: AtomicU64::new(u64::MAX),
            lease_lapsed: AtomicBool::new(false),
            shown,
        })
    }

    fn connect(&self) -> Result<Conn, Errno> {
        match &self.backend {
            Backend::Single(client) => {
                let mut c = match Link::connect(client.get_connection_info(), self.timeout, self.poll_replies) {
                    Some(link) => Conn::Own(link.map_err(|e| io_error(&e))?, Vec::new()),
                    None => {
                        let c = client.get_connection_with_timeout(self.timeout).map_err(|e| io_error(&e))?;
                        c.set_read_timeout(Some(self.timeout)).map_err(|e| io_error(&e))?;
                        c.set_write_timeout(Some(self.timeout)).map_err(|e| io_error(&e))?;
                        Conn::Single(Box::new(c), Vec::new())
                    }
                };
                // Named after the space, so that another space reaping
                // dead ones sees this one connected ([`RedisStore::reap_dead`]);
                // a server that refuses the name only loses that check.
                let _ = redis::cmd("CLIENT").arg("SETNAME").arg(client_name(self.space)).query::<()>(c.link());
                Ok(c)
            }
            Backend::Cluster(client) => Ok(Conn::Cluster(Box::new(client.get_connection().map_err(|e| io_error(&e))?))),
        }
    }

    /// Runs `f` on a pooled connection; a connection that failed is dropped.
    fn with_conn<R>(&self, f: impl FnOnce(&mut Conn) -> redis::RedisResult<R>) -> Result<R, Errno> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut c = match pooled {
            Some(c) => c,
            None => self.connect()?,
        };
        match f(&mut c) {
            Ok(r) => {
                self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                Ok(r)
            }
            Err(e) => Err(io_error(&e)),
        }
    }

    /// [`RedisStore::with_conn`], tried again with backoff (with a fresh
    /// connection, and so a fresh slot map) for up to `failover` in a
    /// cluster: the client does not wait for a replica to take over a
    /// master that stopped answering (a refused connection is retried at
    /// once, 16 times in a few milliseconds), so the store does.
    fn with_retry<R>(&self, mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>) -> Result<R, Errno> {
        let t0 = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match self.with_conn(&mut f) {
                Ok(r) => return Ok(r),
                Err(e) if !self.cluster() || t0.elapsed() + pause > self.failover => return Err(e),
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    /// The key of chunk `chunk` (slots `chunk × CHUNK` …).
    fn key(&self, chunk: u64) -> String {
        self.key_of(&self.prefix, chunk)
    }

    /// The key of chunk `chunk` of the space with prefix `prefix`.
    fn key_of(&self, prefix: &str, chunk: u64) -> String {
        if self.cluster() {
            format!("{{{}{}}}{chunk}", prefix, chunk * CHUNK / GROUP)
        } else {
            format!("{prefix}{chunk}")
        }
    }

    /// Bytes a slot takes in its chunk's value: the header and the page.
    fn stride(&self) -> usize {
        HEADER + self.page
    }

    /// Deletes every key under the prefix.
    fn delete_all(&self) -> Result<(), Errno> {
        self.delete_prefix(&self.prefix, self.slots)
    }

    /// Deletes every key of the space with prefix `prefix` and `slots`
    /// slots.
    fn delete_prefix(&self, prefix: &str, slots: u64) -> Result<(), Errno> {
        if self.cluster() {
            // No cluster-wide SCAN: every key the space can have, a group
            // (one hash slot) per command.
            let chunks = slots.div_ceil(CHUNK);
            for g in 0..slots.div_ceil(GROUP) {
                let per = GROUP / CHUNK;
                let keys: Vec<String> =
                    (g * per..((g + 1) * per).min(chunks)).map(|k| self.key_of(prefix, k)).collect();
                self.with_conn(|c| redis::cmd("UNLINK").arg(&keys).query::<u64>(c.link()))?;
            }
            return Ok(());
        }
        let pattern = format!("{}*", glob_escape(prefix));
        self.with_conn(|c| {
            let c = c.link();
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) =
                    redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).query(c)?;
                if !keys.is_empty() {
                    redis::cmd("UNLINK").arg(&keys).query::<u64>(c)?;
                }
                if next == 0 {
                    return Ok(());
                }
                cursor = next;
            }
        })
    }

    /// Takes the space's lease (`{usermm}lease:P`, expiring after `lease`)
    /// and enters the space in the registry (`{usermm}spaces`: prefix →
    /// slots and space id), in that order, so that a space reaping dead
    /// ones never finds this one registered without its lease. A lease held
    /// by a reaper of an earlier space with the same prefix is waited for
    /// (up to 10 s). Best effort: a server that refuses (an ACL confined to
    /// the prefix) only loses the clean-up after a crash, said on stderr.
    fn register(&self) {
        if self.lease.is_zero() {
            return;
        }
        let ms = self.lease.as_millis() as u64;
        let lease = lease_key(&self.prefix);
        let t0 = std::time::Instant::now();
        let r = self.with_conn(|c| {
            loop {
                let took: Option<String> =
                    redis::cmd("SET").arg(&lease).arg(self.space).arg("PX").arg(ms).arg("NX").query(c.link())?;
                if took.is_some() {
                    break;
                }
                let holder: Option<String> = redis::cmd("GET").arg(&lease).query(c.link())?;
                if holder.as_deref() != Some(REAPING) || t0.elapsed() > Duration::from_secs(10) {
                    // Another space with this prefix (one at a time, the
                    // docs say), or a reaper that took too long.
                    redis::cmd("SET").arg(&lease).arg(self.space).arg("PX").arg(ms).query::<()>(c.link())?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            redis::cmd("HSET")
                .arg(REGISTRY)
                .arg(&self.prefix)
                .arg(format!("{} {:016x}", self.slots, self.space))
                .query::<u64>(c.link())
                .map(drop)
        });
        match r {
            Ok(()) => self.lease_next_ns.store(usermm_sys::now_ns() + refresh_ns(self.lease), Ordering::Relaxed),
            Err(e) => eprintln!(
                "usermm: swap_url {}: cannot take the space's lease ({e}); its keys outlive a crash of the process",
                self.shown
            ),
        }
    }

    /// Leaves the registry and gives the lease up (after the keys are gone:
    /// a process that dies in between leaves its entry to the next reaper).
    fn unregister(&self) {
        if self.lease.is_zero() {
            return;
        }
        let _ = self.with_conn(|c| {
            redis::cmd("HDEL").arg(REGISTRY).arg(&self.prefix).query::<u64>(c.link())?;
            redis::cmd("DEL").arg(lease_key(&self.prefix)).query::<u64>(c.link()).map(drop)
        });
    }

    /// Deletes the keys of every registered space that is dead: its lease
    /// lapsed (it was not refreshed for `lease_ms`) and, on one server, no
    /// connection named after it is open (`CLIENT LIST`: a process stopped
    /// longer than its lease still has its connections, and keeps its
    /// pages). A dead space's lease is taken (`NX`, marked as a reaper's)
    /// while its keys are deleted, so that two reapers, or a reaper and a
    /// new space with the same prefix, do not meet. Best effort: a failure
    /// leaves the dead space to the next open.
    fn reap_dead(&self) {
        let _ = self.with_conn(|c| {
            let entries: Vec<(String, String)> = redis::cmd("HGETALL").arg(REGISTRY).query(c.link())?;
            if entries.is_empty() {
                return Ok(());
            }
            // (Asked once, and only if a lease has lapsed.)
            let mut connected: Option<Option<String>> = None;
            for (prefix, v) in entries {
                if prefix == self.prefix {
                    continue;
                }
                let (slots, id) = v.split_once(' ').unwrap_or((&v, ""));
                let Ok(slots) = slots.parse::<u64>() else { continue };
                let lease = lease_key(&prefix);
                if redis::cmd("EXISTS").arg(&lease).query::<u64>(c.link())? > 0 {
                    continue;
                }
                let name = format!("name={}", client_name(u64::from_str_radix(id, 16).unwrap_or(0)));
                let connected = connected.get_or_insert_with(|| {
                    if self.cluster() {
                        None
                    } else {
                        redis::cmd("CLIENT").arg("LIST").query(c.link()).ok()
                    }
                });
                if connected.as_deref().is_some_and(|l| l.split_whitespace().any(|f| f == name)) {
                    continue;
                }
                let took: Option<String> =
                    redis::cmd("SET").arg(&lease).arg(REAPING).arg("PX").arg(60_000).arg("NX").query(c.link())?;
                if took.is_none() {
                    continue;
                }
                // (On another connection: this one is held.)
                if self.delete_prefix(&prefix, slots).is_ok() {
                    redis::cmd("HDEL").arg(REGISTRY).arg(&prefix).query::<u64>(c.link())?;
                }
                redis::cmd("DEL").arg(&lease).query::<u64>(c.link())?;
            }
            Ok(())
        });
    }

    /// Whether the lease is due for a refresh (a clock read).
    pub(crate) fn lease_due(&self) -> bool {
        usermm_sys::now_ns() >= self.lease_next_ns.load(Ordering::Relaxed)
    }

    /// Refreshes the lease (every third of `lease_ms`, from the space's
    /// background thread). A lease found lapsed — the process was stopped
    /// or starved for longer than `lease_ms`, or the server lost it — is
    /// said on stderr (once) and taken again; if a reaper deleted the
    /// space's pages meanwhile, they read as errors (SIGBUS).
    pub(crate) fn refresh_lease(&self) {
        self.lease_next_ns.store(usermm_sys::now_ns() + refresh_ns(self.lease), Ordering::Relaxed);
        let ms = self.lease.as_millis() as u64;
        let r = self.with_conn(|c| {
            redis::cmd("SET").arg(lease_key(&self.prefix)).arg(self.space).arg("PX").arg(ms).arg("XX").query(c.link())
        });
        if let Ok(None::<String>) = r {
            if !self.lease_lapsed.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "usermm: swap_url {}: the space's lease had lapsed (not refreshed for lease_ms={ms}); taken again",
                    self.shown
                );
            }
            self.register();
        }
    }

    /// Enters this store in the list that the exit hook reaps
    /// ([`at_exit_hook`]), registering the hook once.
    fn track(&self, url: &str) {
        // (Allocated from the system allocator: the reaper, a forked copy
        // of the process, has no space memory.)
        let _system = crate::thread_role::SystemOnly::enter();
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            if let Err(e) = usermm_sys::exit::at_exit(at_exit_hook) {
                eprintln!("usermm: cannot register the page stores' exit hook ({e})");
            }
        });
        let r = Reap {
            space: self.space,
            url: url.to_string(),
            prefix: self.prefix.clone(),
            slots: self.slots,
            page: self.page,
            generation: usermm_sys::thread::fork_generation(),
        };
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    /// The writes of `pages` as slots `first`, `first + 1`, … (each behind
    /// its header), in the protocol's encoding, into `buf`: a `SET` of each
    /// whole chunk, a `SETRANGE` of each part of one. Returns the number of
    /// commands.
    fn encode_writes(&self, buf: &mut Vec<u8>, first: u64, pages: &[&[u8]]) -> usize {
        use std::io::Write;
        buf.clear();
        let mut n = 0;
        for (slot, run) in pieces(first, pages) {
            let key = self.key(slot / CHUNK);
            let len = run.len() * self.stride();
            // (Writing into a Vec cannot fail.)
            if run.len() as u64 == CHUNK {
                let _ = write!(buf, "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${len}\r\n", key.len());
            } else {
                let off = ((slot % CHUNK) as usize * self.stride()).to_string();
                let _ = write!(
                    buf,
                    "*4\r\n$8\r\nSETRANGE\r\n${}\r\n{key}\r\n${}\r\n{off}\r\n${len}\r\n",
                    key.len(),
                    off.len()
                );
            }
            for (j, p) in run.iter().enumerate() {
                buf.extend_from_slice(&header(self.space, slot + j as u64, p));
                buf.extend_from_slice(p);
            }
            buf.extend_from_slice(b"\r\n");
            n += 1;
        }
        n
    }

    /// Opens slots `from..to` out of `v` (their chunk's `GETRANGE` reply)
    /// into their pages of `buf`, whose first page is slot `first`. False
    /// unless every one checks out: a chunk that is not there reads as
    /// nothing, a slot never written in one as zeros, and neither opens.
    fn open_run(&self, first: u64, from: u64, to: u64, v: &[u8], buf: &mut [u8]) -> bool {
        let stride = self.stride();
        if v.len() != (to - from) as usize * stride {
            return false;
        }
        (from..to).all(|s| {
            let i = (s - first) as usize;
            let at = (s - from) as usize * stride;
            open_sealed(self.space, s, &v[at..at + stride], &mut buf[i * self.page..(i + 1) * self.page])
        })
    }

    /// `WAIT replicas timeout` on the node that holds `key` (its group's
    /// hash slot); an error unless that many replicas acknowledged.
    fn wait_replicas(&self, c: &mut Conn, key: &str) -> redis::RedisResult<()> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(self.timeout.as_millis() as u64);
        let acked: u64 = match c {
            Conn::Own(..) | Conn::Single(..) => cmd.query(c.link())?,
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::new(hash_slot(key.as_bytes()), SlotAddr::Master);
                let v = c.route_command(&cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))?;
                redis::from_redis_value(&v)?
            }
        };
        if acked < self.replicas as u64 {
            return Err(redis::RedisError::from((redis::ErrorKind::ResponseError, "WAIT: too few replicas")));
        }
        Ok(())
    }
}

impl PageStore for RedisStore {
    fn outage_wait(&self) -> Option<Duration> {
        // A replica is promoted within the cluster's node timeout; reads
        // wait as long (`read_retrying`).
        (self.cluster() && self.replicas > 0).then_some(self.failover)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let first = off / self.page as u64;
        let n = buf.len() / self.page;
        let stride = self.stride();
        let last = first + n as u64;
        if n > 0 && first / CHUNK == (last - 1) / CHUNK && matches!(self.backend, Backend::Single(_)) {
            // One chunk from one server over TCP: the reply read straight
            // into the connection's buffer and opened from there (building
            // a `Cmd` and parsing its reply into a fresh value cost 1.9 µs
            // a page, a tenth of the round trip).
            let start = (first % CHUNK) as usize * stride;
            let mut opened = false;
            let fast = self.with_conn(|c| {
                let Conn::Own(link, scratch) = c else { return Ok(false) };
                // (`key`'s form for a single server.)
                let got = link.getrange_into(&self.prefix, first / CHUNK, start, start + n * stride - 1, scratch)?;
                opened = self.open_run(first, first, last, &scratch[got], buf);
                Ok(true)
            })?;
            if fast {
                return if opened { Ok(()) } else { Err(Errno::EIO) };
            }
        }
        // One GETRANGE per chunk the run touches (one, mostly: a single
        // page is a GETRANGE of its stride).
        let mut cmds = Vec::new();
        let mut slot = first;
        while slot < last {
            let end = ((slot / CHUNK + 1) * CHUNK).min(last);
            let start = (slot % CHUNK) as usize * stride;
            let mut cmd = redis::cmd("GETRANGE");
            cmd.arg(self.key(slot / CHUNK)).arg(start).arg(start + (end - slot) as usize * stride - 1);
            cmds.push((slot, end, cmd));
            slot = end;
        }
        let values: Vec<Vec<u8>> = if let [(_, _, cmd)] = &cmds[..] {
            vec![self.with_retry(|c| cmd.query(c.link()))?]
        } else {
            self.with_retry(|c| match c {
                Conn::Own(..) | Conn::Single(..) => {
                    let mut p = redis::pipe();
                    for (_, _, cmd) in &cmds {
                        p.add_command(cmd.clone());
                    }
                    p.query(c.link())
                }
                Conn::Cluster(link) => {
                    let mut p = redis::cluster::cluster_pipe();
                    for (_, _, cmd) in &cmds {
                        p.add_command(cmd.clone());
                    }
                    p.query(link)
                }
            })?
        };
        if values.len() != cmds.len() {
            return Err(Errno::EIO);
        }
        for ((from, to, _), v) in cmds.iter().zip(&values) {
            if !self.open_run(first, *from, *to, v, buf) {
                return Err(Errno::EIO);
            }
        }
        Ok(())
    }

    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno> {
        let first = off / self.page as u64;
        // The commands of one group (one hash slot in a cluster) at a time,
        // pipelined, then WAIT there.
        let mut i = 0;
        while i < pages.len() {
            let slot = first + i as u64;
            let end = (((slot / GROUP) + 1) * GROUP - first).min(pages.len() as u64) as usize;
            let run = &pages[i..end];
            let key = self.key(slot / CHUNK);
            self.with_conn(|c| {
                match c {
                    // Encoded straight into the connection's buffer (one
                    // copy of each page, into memory already faulted in: a
                    // pipeline built of `Cmd`s copies every page twice into
                    // fresh allocations of up to a megabyte, whose page
                    // faults cost more than the copies).
                    Conn::Own(..) | Conn::Single(..) => {
                        let (link, buf) = c.single().expect("a single server's connection");
                        let n = self.encode_writes(buf, slot, run);
                        for v in link.req_packed_commands(buf, 0, n)? {
                            v.extract_error()?;
                        }
                    }
                    Conn::Cluster(link) => {
                        let mut p = redis::cluster::cluster_pipe();
                        for (s, part) in pieces(slot, run) {
                            let value = Chunk { space: self.space, first: s, pages: part };
                            if part.len() as u64 == CHUNK {
                                p.cmd("SET").arg(self.key(s / CHUNK)).arg(value).ignore();
                            } else {
                                let off = (s % CHUNK) as usize * self.stride();
                                p.cmd("SETRANGE").arg(self.key(s / CHUNK)).arg(off).arg(value).ignore();
                            }
                        }
                        p.query::<()>(link)?;
                    }
                }
                if self.replicas > 0 {
                    self.wait_replicas(c, &key)?;
                }
                Ok(())
            })?;
            i = end;
        }
        Ok(())
    }

    fn direct_io(&self) -> bool {
        // Nothing of the pages stays in this host's page cache.
        true
    }

    fn read_polls(&self) -> bool {
        self.reads_poll
    }

    fn release_granule(&self) -> u32 {
        CHUNK as u32
    }

    fn keep_alive_due(&self) -> bool {
        self.lease_due()
    }

    fn keep_alive(&self) {
        self.refresh_lease()
    }

    fn release(&self, runs: &[(u64, u64)]) -> Result<(), Errno> {
        // The chunks wholly inside the runs, unlinked per group (one hash
        // slot in a cluster), up to 1,024 keys per command.
        let chunk_bytes = CHUNK * self.page as u64;
        let mut chunks: Vec<u64> =
            runs.iter().flat_map(|&(off, len)| off.div_ceil(chunk_bytes)..(off + len) / chunk_bytes).collect();
        chunks.sort_unstable();
        chunks.dedup();
        let per_group = GROUP / CHUNK;
        for batch in chunks.chunk_by(|a, b| !self.cluster() || a / per_group == b / per_group) {
            for keys in batch.chunks(1024) {
                let keys: Vec<String> = keys.iter().map(|&k| self.key(k)).collect();
                self.with_conn(|c| redis::cmd("UNLINK").arg(&keys).query::<u64>(c.link()))?;
            }
        }
        Ok(())
    }
}

/// The pieces of the run `pages` starting at slot `first` that lie in one
/// chunk each: `(first slot, pages)`.
fn pieces<'a, 'b>(first: u64, pages: &'b [&'a [u8]]) -> impl Iterator<Item = (u64, &'b [&'a [u8]])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= pages.len() {
            return None;
        }
        let slot = first + i as u64;
        let end = ((slot / CHUNK + 1) * CHUNK - first).min(pages.len() as u64) as usize;
        let piece = (slot, &pages[i..end]);
        i = end;
        Some(piece)
    })
}

/// Consecutive pages, each behind its header, as one argument, written
/// straight into the command's buffer (no sealed copy of the pages first).
struct Chunk<'a, 'b> {
    space: u64,
    first: u64,
    pages: &'b [&'a [u8]],
}

impl redis::ToRedisArgs for Chunk<'_, '_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        let mut w = out.writer_for_next_arg();
        // (Writing into the command's Vec cannot fail.)
        for (j, p) in self.pages.iter().enumerate() {
            let _ = w.write_all(&header(self.space, self.first + j as u64, p));
            let _ = w.write_all(p);
        }
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Err(e) = self.delete_all() {
            eprintln!("usermm: swap_url {}: could not delete the space's keys at close ({e})", self.shown);
        }
        self.unregister();
        let _system = crate::thread_role::SystemOnly::enter();
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|r| r.space != self.space);
    }
}

/// The registry of spaces on a server: a hash, prefix → "slots id".
/// (Braces: no prefix has any, so no space's keys can match these names,
/// and in a cluster they share one hash slot.)
const REGISTRY: &str = "{usermm}spaces";
/// A lease's value while a reaper deletes the keys of its dead space.
const REAPING: &str = "reaping";
/// `lease_ms`'s default: the bound on how long the keys of a process killed
/// outright stay before the next space opened on the server deletes them.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The lease key of the space with prefix `prefix`.
fn lease_key(prefix: &str) -> String {
    format!("{{usermm}}lease:{prefix}")
}

/// How often a lease of `lease` is refreshed: three times per lease.
fn refresh_ns(lease: Duration) -> u64 {
    (lease.as_nanos() / 3).min(u64::MAX as u128) as u64
}

/// The name of space `space`'s connections (`CLIENT SETNAME`).
fn client_name(space: u64) -> String {
    format!("usermm-{space:016x}")
}

/// What the exit hook needs of a store that is still open: all of it
/// allocated from the system allocator.
struct Reap {
    space: u64,
    url: String,
    prefix: String,
    slots: u64,
    page: usize,
    /// The fork generation that opened it: a forked child's exit must not
    /// reap its parent's spaces.
    generation: u64,
}

/// The stores open in this process (for the exit hook).
static LIVE: Mutex<Vec<Reap>> = Mutex::new(Vec::new());

/// At exit (`atexit`): the keys of every store this process opened and
/// never closed — `usermm_compat.h`'s default space, a `GlobalHeap`'s, any
/// space leaked — are deleted by a process of their own once this one has
/// gone (`usermm_sys::exit::run_after_exit`), not now: other exit
/// handlers, thread-local destructors and threads still running may touch
/// pages that are swapped out, and those must still read back. If no such
/// process can be made, the keys go when the lease lapses.
extern "C" fn at_exit_hook() {
    let _ = std::panic::catch_unwind(|| {
        let _system = crate::thread_role::SystemOnly::enter();
        let generation = usermm_sys::thread::fork_generation();
        let mine: Vec<Reap> = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .filter(|r| r.generation == generation)
            .collect();
        if mine.is_empty() {
            return;
        }
        if let Err(e) = usermm_sys::exit::run_after_exit(|| mine.iter().for_each(reap_after_exit)) {
            eprintln!("usermm: cannot delete the page store's keys after exit ({e}): they go when the lease lapses");
        }
    });
}

/// In the process that outlives the one that opened it: deletes the keys of
/// the store `r` and its registry entry, on connections of its own (the
/// pool's lock may have been held by another thread at the fork).
fn reap_after_exit(r: &Reap) {
    let Ok(mut u) = parse(&r.url, r.space) else { return };
    u.prefix = r.prefix.clone();
    let Ok(s) = RedisStore::build(&u, r.page, r.slots, false, r.space) else { return };
    if s.delete_all().is_ok() {
        s.unregister();
    }
    // (Not dropped: its `Drop` would delete the keys again and take the
    // list's lock.)
    std::mem::forget(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_their_options() {
        let u = parse("redis://127.0.0.1:6379/?prefix=abc:&timeout_ms=50&replicas=1", 7).unwrap();
        assert_eq!(u.nodes, ["redis://127.0.0.1:6379/"]);
        assert_eq!(
            (u.cluster, u.prefix.as_str(), u.timeout, u.replicas),
            (false, "abc:", Duration::from_millis(50), 1)
        );
        let u = parse("redis://h:1", 0xab).unwrap();
        assert!(u.prefix.starts_with("usermm:") && u.prefix.ends_with(":00000000000000ab:"), "{}", u.prefix);
        assert_eq!((u.timeout, u.replicas, u.lease), (Duration::from_millis(2000), 0, DEFAULT_LEASE));
        assert_eq!(parse("redis://h:1?lease_ms=250", 0).unwrap().lease, Duration::from_millis(250));
        assert_eq!(parse("redis://h:1?lease_ms=0", 0).unwrap().lease, Duration::ZERO);
        assert_eq!(parse("redis://h:1?lease_ms=soon", 0).err(), Some(Errno::EINVAL));
        assert_ne!(lease_key("usermm:h:1:ab:"), "usermm:h:1:ab:lease", "a lease must not match its prefix");
        assert!(!lease_key("p:").starts_with("p:") && !REGISTRY.starts_with("usermm:"));
        let u = parse("redis+cluster://a:1,b:2,c:3/?prefix=p:", 0).unwrap();
        assert_eq!(u.nodes, ["redis://a:1/", "redis://b:2/", "redis://c:3/"]);
        assert!(u.cluster);
        assert_eq!(parse("redis+cluster://", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("http://h:1", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?colour=red", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?timeout_ms=x", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?prefix=a{b", 0).err(), Some(Errno::EINVAL));
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }

    #[test]
    fn a_run_splits_at_chunk_boundaries() {
        let page = [0u8; 8];
        let pages: Vec<&[u8]> = vec![&page; 40];
        let got: Vec<(u64, usize)> = pieces(13, &pages).map(|(s, p)| (s, p.len())).collect();
        assert_eq!(got, [(13, 3), (16, 16), (32, 16), (48, 5)]);
        let got: Vec<(u64, usize)> = pieces(32, &pages[..16]).map(|(s, p)| (s, p.len())).collect();
        assert_eq!(got, [(32, 16)]);
        assert_eq!(pieces(0, &pages[..0]).count(), 0);
    }

    #[test]
    fn hash_slots_are_the_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(hash_slot(b"123456789"), 0x31c3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_eq!(hash_slot(b"{p:3}17"), hash_slot(b"p:3"));
    }
}
