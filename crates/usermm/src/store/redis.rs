//! A page store on a Redis-protocol server (Redis, Valkey), a Redis Cluster
//! or the master of a group Redis Sentinel watches, through redis-rs's
//! synchronous client.
//!
//! `swap_url` is one of
//! - `redis://[user:password@]host:port[/db][?OPTIONS]`: one server
//!   (`rediss://`: over TLS, with rustls);
//! - `redis+cluster://host:port[,host:port…][?OPTIONS]` (`rediss+cluster://`
//!   over TLS): a cluster, given by
//!   seed nodes; the client reads the slot map from them, follows `MOVED` and
//!   `ASK` redirections, re-reads the map when it changes, and retries (with
//!   backoff, about 10 s in all) while a failover is under way;
//! - `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[/db][?OPTIONS]`:
//!   the master Sentinels (given by their addresses) name `MASTER`, asked
//!   again at each new connection (the login and database are the
//!   master's): after a failover a read's retry finds the new master.
//!
//! OPTIONS: `prefix=P`, `timeout_ms=T` (default 2,000), `lease_ms=L`
//! (default 30,000: below), `replicas=N`
//! (default 0: a write is acknowledged only once `WAIT`, given half of
//! `timeout_ms`, says N replicas of the node have it; a write that fails
//! says why on stderr, once until one succeeds again and at most once a
//! minute), `failover_ms=F` (default
//! 10,000: how long a read keeps trying with a fresh connection — from a
//! cluster, with a fresh slot map, while a replica takes over a master that
//! stopped answering; from one server, while it cannot be reached or is
//! loading its data after a restart; writes do not wait: a failed write only
//! keeps its pages resident, and in a cluster its group's writes then fail at
//! once for `GROUP_FAIL_FAST`, so that the pages go to other slots instead of
//! waiting on a node that cannot acknowledge them), `seal=1` (pages go out encrypted and
//! authenticated with the space's own key: `store/seal.rs`), and over TLS
//! `tls_ca=FILE` (the PEM certificate authority the server's certificate
//! must chain to; else the system's), `tls_cert=FILE` and `tls_key=FILE`
//! (the client's certificate and key, PEM, both or neither).
//! - One key per chunk of 15 consecutive slots: `P` followed by the chunk
//!   number on one server; `{P<g>}<chunk>` in a cluster, `g` being the
//!   chunk's group of 240 slots, so that a run of pages (at most 256) lies in
//!   two or three hash slots. (15: a chunk's value, 15 pages behind their
//!   headers, 61,920 bytes, fits the server allocator's 64 KiB size class.)
//!   The value holds each slot's page behind a 32-byte
//!   header (the space's random id, the slot, a checksum: `store.rs`), checked
//!   on every read; a slot never written reads as zeros and fails the check.
//!   The default prefix is `usermm:<host>:<pid>:<space id>:`, unique per open
//!   space. (A key per page costs the server a key, an allocation and a copy
//!   of each page out of its query buffer, and 16 KiB reads of the socket:
//!   values of 8 pages or more are read straight into place.)
//! - A run goes out as a `SET` of each whole chunk and a `SETRANGE` of each
//!   part of one, pipelined per group (then `WAIT` on that group's node when
//!   `replicas` > 0), and comes back as a `GETRANGE` per chunk it touches
//!   (a read-ahead's scattered pages: a `GETRANGE` per run of neighbouring
//!   slots, all in one pipeline).
//! - A chunk whose slots the space has all freed (its pages came back or
//!   were dropped) is unlinked by the space's background thread, the slots
//!   reserved meanwhile (`release_granule`, `core/release.rs`).
//! - Opening the space deletes every chunk key under the prefix (`P` and a
//!   digit: left by a space with the same prefix that crashed; a cluster's
//!   by enumerating the space's possible keys, group by group); closing it
//!   deletes them too (a forked child's keys, `Pf<id>:…`, are its own:
//!   `redis/fork.rs`).
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
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use usermm_core::Errno;

use super::{open_page, put_page, PageStore, Sealer, HEADER};

mod chunk;
mod errors;
mod fork;
mod lease;
mod link;
mod url;
use chunk::{pieces, Chunk};
use errors::{interrupted, io_error, server_errno, transient, INTERRUPTED_TRIES};
use fork::Ancestor;
use lease::client_name;
pub(crate) use lease::fork_guard;
use link::Link;
use url::{hash_slot, parse, random_id, TlsFiles, Url};

/// One server, a cluster, or the master of a Sentinel-watched group.
enum Backend {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    /// Asked for the master's address at each new connection: after a
    /// failover, a read's retry (`with_retry`) connects to the new one.
    Sentinel(Mutex<redis::sentinel::SentinelClient>),
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

/// Pages per key group (a cluster keeps a group in one hash slot): a
/// whole number of chunks.
const GROUP: u64 = 16 * CHUNK;
/// Pages per key (a chunk): one value holds this many consecutive slots,
/// each behind its header — as many as fit jemalloc's 64 KiB size class
/// (the server's allocator; module documentation).
const CHUNK: u64 = 15;
/// The least time between two messages of a failed write (ns).
const SAY_AGAIN_NS: u64 = 60_000_000_000;
/// How long writes to a cluster group whose write failed fail at once.
const GROUP_FAIL_FAST: Duration = Duration::from_secs(5);

/// The certificates of `files` (`tls_ca`, `tls_cert`, `tls_key`), read
/// now: a file that cannot be read fails the open with its errno, said on
/// stderr. Without `tls_ca` the system's authorities are trusted.
fn tls_certificates(files: &TlsFiles, shown: &str) -> Result<redis::TlsCertificates, Errno> {
    let read = |what: &str, path: &String| {
        std::fs::read(path).map_err(|e| {
            eprintln!("usermm: swap_url {shown}: {what} {path}: {e}");
            e.raw_os_error().map_or(Errno::EIO, Errno)
        })
    };
    let client_tls = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => {
            Some(redis::ClientTlsConfig { client_cert: read("tls_cert", c)?, client_key: read("tls_key", k)? })
        }
        _ => None,
    };
    let root_cert = files.ca.as_ref().map(|c| read("tls_ca", c)).transpose()?;
    Ok(redis::TlsCertificates { client_tls, root_cert })
}

pub(crate) struct RedisStore {
    /// Set once the open got through (a forked child's store: once it
    /// registered, before its first write): a store whose open failed has
    /// nothing on the server to delete when it is dropped.
    opened: AtomicBool,
    /// A forked child's store that has not registered yet (`fork.rs`:
    /// before its first write), and the lock of that registration.
    unregistered: AtomicBool,
    registering: Mutex<()>,
    backend: Backend,
    pool: Mutex<Vec<Conn>>,
    prefix: String,
    /// A random id of this space: part of every stored page's header.
    space: u64,
    /// The space's key when pages go out sealed (`seal=1`).
    sealer: Option<std::sync::Arc<Sealer>>,
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
    /// Whether writes fail since the last that went through (said once on
    /// stderr: `say_write_failed`).
    write_failing: AtomicBool,
    /// Cluster groups whose last write failed, and until when a write
    /// there fails at once (`GROUP_FAIL_FAST`) instead of waiting out its
    /// `WAIT` again: the page then takes another slot, most likely of a
    /// group on another node (a node that lost its replicas cost every
    /// eviction into it half of `timeout_ms`, and stalled the space).
    failing_groups: Mutex<Vec<(u64, std::time::Instant)>>,
    /// When a failed write was last said (`usermm_sys::now_ns`; 0: never).
    write_said_ns: AtomicU64,
    /// The URL without credentials, for messages.
    pub(crate) shown: String,
    /// The URL as given (a forked child builds its store from it).
    url: String,
    /// In a forked child: the store of the child's own, which serves every
    /// call from then on (this one, the parent's, is kept only to be
    /// forgotten: its keys and connections are the parent's).
    child: OnceLock<Box<RedisStore>>,
    /// The stores of the processes this one was forked from, whose keys
    /// still hold slots it reads (`fork.rs`), the oldest first.
    ancestors: Vec<Ancestor>,
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
        let mut s = Self::build(&u, page, slots, poll_replies, space)?;
        let mut access = s.check_access();
        for _ in 0..INTERRUPTED_TRIES {
            match &access {
                Err(e) if interrupted(e) => access = s.check_access(),
                _ => break,
            }
        }
        access.map_err(|e| {
            if e.kind() == redis::ErrorKind::IoError {
                eprintln!("usermm: swap_url {}: no connection to the server ({e})", s.shown);
            } else {
                eprintln!("usermm: swap_url {}: the server refuses: {e}", s.shown);
            }
            server_errno(&e)
        })?;
        s.url = url.to_string();
        s.reap_dead();
        s.register()?;
        *s.opened.get_mut() = true;
        s.delete_all()?;
        s.track(url, false);
        Ok(s)
    }

    /// Whether the server answers and lets this login write, read and
    /// delete a key of the prefix (a key of its own, gone at once): what
    /// the server says when it does not (`WRONGPASS`, `NOPERM`, `OOM`, …),
    /// so that `open` fails with it rather than the first swap-out or
    /// swap-in.
    fn check_access(&self) -> redis::RedisResult<()> {
        let key = format!("{}probe:{:x}", self.prefix, self.space);
        let run = |c: &mut dyn redis::ConnectionLike| -> redis::RedisResult<()> {
            redis::cmd("PING").query::<String>(c)?;
            redis::cmd("SET").arg(&key).arg(b"usermm".as_slice()).arg("PX").arg(60_000).exec(c)?;
            let _: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(c)?;
            redis::cmd("DEL").arg(&key).exec(c)
        };
        match &self.backend {
            Backend::Single(_) | Backend::Sentinel(_) => {
                let client = self.master()?;
                let mut c = client.get_connection_with_timeout(self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                run(&mut c)
            }
            Backend::Cluster(client) => run(&mut client.get_connection()?),
        }
    }

    /// The client of the one server: the URL's, or the master Sentinel
    /// names now. (Not for a cluster.)
    fn master(&self) -> redis::RedisResult<redis::Client> {
        match &self.backend {
            Backend::Single(client) => Ok(client.clone()),
            Backend::Sentinel(s) => s.lock().unwrap_or_else(|e| e.into_inner()).get_client(),
            Backend::Cluster(_) => Err(redis::RedisError::from((redis::ErrorKind::ClientError, "a cluster"))),
        }
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
        let certs = match &u.tls {
            Some(files) => Some(tls_certificates(files, &shown)?),
            None => None,
        };
        let backend = if u.cluster {
            let mut b = redis::cluster::ClusterClient::builder(u.nodes.iter().map(String::as_str));
            if let Some(c) = certs {
                b = b.certs(c);
            }
            let c = b
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
        } else if let Some(m) = &u.sentinel {
            use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
            let login = redis::RedisConnectionInfo {
                db: m.db,
                username: m.username.clone(),
                password: m.password.clone(),
                ..Default::default()
            };
            let node = SentinelNodeConnectionInfo { tls_mode: None, redis_connection_info: Some(login) };
            let nodes: Vec<&str> = u.nodes.iter().map(String::as_str).collect();
            let c = SentinelClient::build(nodes, m.name.clone(), Some(node), SentinelServerType::Master)
                .map_err(|_| Errno::EINVAL)?;
            Backend::Sentinel(Mutex::new(c))
        } else {
            let c = match certs {
                Some(certs) => redis::Client::build_with_tls(u.nodes[0].as_str(), certs),
                None => redis::Client::open(u.nodes[0].as_str()),
            };
            Backend::Single(c.map_err(|e| {
                eprintln!("usermm: swap_url {shown}: {e}");
                Errno::EINVAL
            })?)
        };
        // (A Sentinel's masters are plain TCP servers, which a `Link` serves.)
        let reads_poll = poll_replies
            && match &backend {
                Backend::Single(c) => Link::serves(c.get_connection_info()),
                Backend::Sentinel(_) => true,
                Backend::Cluster(_) => false,
            };
        let sealer = match u.seal {
            false => None,
            true => Some(std::sync::Arc::new(Sealer::new(slots).inspect_err(|e| {
                eprintln!("usermm: swap_url {shown}: seal=1: no key page could be made and locked ({e:?})");
            })?)),
        };
        Ok(RedisStore {
            reads_poll,
            backend,
            pool: Mutex::new(Vec::new()),
            prefix: u.prefix.clone(),
            space,
            sealer,
            page,
            slots,
            timeout: u.timeout,
            replicas: u.replicas,
            failover: u.failover,
            poll_replies,
            lease: u.lease,
            lease_next_ns: AtomicU64::new(u64::MAX),
            lease_lapsed: AtomicBool::new(false),
            write_failing: AtomicBool::new(false),
            failing_groups: Mutex::new(Vec::new()),
            write_said_ns: AtomicU64::new(0),
            shown,
            opened: AtomicBool::new(false),
            unregistered: AtomicBool::new(false),
            registering: Mutex::new(()),
            url: String::new(),
            child: OnceLock::new(),
            ancestors: Vec::new(),
        })
    }

    fn connect(&self) -> Result<Conn, Errno> {
        match &self.backend {
            Backend::Single(_) | Backend::Sentinel(_) => {
                let client = self.master().map_err(|e| io_error(&e))?;
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
    /// A call a signal interrupted is made again (`INTERRUPTED_TRIES`
    /// times at most) on a fresh connection.
    fn with_conn<R>(&self, mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>) -> Result<R, Errno> {
        let mut tries = 0;
        loop {
            match self.try_conn(&mut f) {
                Err((_, _, true)) if tries < INTERRUPTED_TRIES => tries += 1,
                r => return r.map_err(|(e, ..)| e),
            }
        }
    }

    /// [`RedisStore::with_conn`], its error with whether it is transient:
    /// no connection could be made, or the one in use broke, timed out, or
    /// was told to come back (`LOADING`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// `MASTERDOWN`) — a server restarting, or a failover.
    /// The error also says whether a signal interrupted the call.
    fn try_conn<R>(&self, f: impl FnOnce(&mut Conn) -> redis::RedisResult<R>) -> Result<R, (Errno, bool, bool)> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut c = match pooled {
            Some(c) => c,
            None => self.connect().map_err(|e| (e, true, false))?,
        };
        match f(&mut c) {
            Ok(r) => {
                self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                Ok(r)
            }
            Err(e) => Err((io_error(&e), transient(&e), interrupted(&e))),
        }
    }

    /// [`RedisStore::with_conn`], tried again with backoff (with a fresh
    /// connection, and so a fresh slot map) for up to `failover`: in a
    /// cluster after any error (the client does not wait for a replica to
    /// take over a master that stopped answering: a refused connection is
    /// retried at once, 16 times in a few milliseconds, so the store does);
    /// on one server after a transient one (`try_conn`: a server restarted
    /// with its data serves the read once it is back and loaded).
    fn with_retry<R>(&self, mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>) -> Result<R, Errno> {
        let t0 = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match self.try_conn(&mut f) {
                Ok(r) => return Ok(r),
                Err((e, again, _)) if !(self.cluster() || again) || t0.elapsed() + pause > self.failover => {
                    return Err(e)
                }
                Err((_, _, true)) => {}
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

    /// Whether group `g`'s last write failed less than `GROUP_FAIL_FAST`
    /// ago (forgetting the groups whose time is up).
    fn group_failing(&self, g: u64) -> bool {
        let mut f = self.failing_groups.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_empty() {
            return false;
        }
        let now = std::time::Instant::now();
        f.retain(|&(_, until)| until > now);
        f.iter().any(|&(k, _)| k == g)
    }

    /// The key of chunk `chunk` (slots `chunk × CHUNK` …).
    fn key(&self, chunk: u64) -> String {
        self.key_of(&self.prefix, chunk)
    }

    /// The prefix and space id of the keys that hold slot `slot`'s bytes
    /// (`fork.rs`): an ancestor's, or this store's.
    fn owner(&self, slot: u64) -> (&str, u64) {
        match self.ancestors.iter().find(|a| a.has(slot)) {
            Some(a) => (&a.prefix, a.space),
            None => (&self.prefix, self.space),
        }
    }

    /// The end of the run of slots from `slot` (before `end`) whose bytes
    /// the same keys hold.
    fn same_owner_until(&self, slot: u64, end: u64) -> u64 {
        if self.ancestors.is_empty() {
            return end;
        }
        let o = self.owner(slot).1;
        (slot + 1..end).find(|&s| self.owner(s).1 != o).unwrap_or(end)
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
                put_page(self.sealer.as_deref(), self.space, slot + j as u64, p, buf);
            }
            buf.extend_from_slice(b"\r\n");
            n += 1;
        }
        n
    }

    /// The values of `cmds` (`GETRANGE`s, with the slots each reads), in
    /// one pipeline (a single command alone), retried as a read is.
    fn getranges(&self, cmds: &[(u64, u64, u64, redis::Cmd)]) -> Result<Vec<Vec<u8>>, Errno> {
        let values: Vec<Vec<u8>> = if let [(_, _, _, cmd)] = cmds {
            vec![self.with_retry(|c| cmd.query(c.link()))?]
        } else {
            self.with_retry(|c| match c {
                Conn::Own(..) | Conn::Single(..) => {
                    let mut p = redis::pipe();
                    for (_, _, _, cmd) in cmds {
                        p.add_command(cmd.clone());
                    }
                    p.query(c.link())
                }
                Conn::Cluster(link) => {
                    let mut p = redis::cluster::cluster_pipe();
                    for (_, _, _, cmd) in cmds {
                        p.add_command(cmd.clone());
                    }
                    p.query(link)
                }
            })?
        };
        if values.len() != cmds.len() {
            return Err(Errno::EIO);
        }
        Ok(values)
    }

    /// Opens slots `from..to` of space `space` out of `v` (their chunk's
    /// `GETRANGE` reply) into their pages of `buf`, whose first page is
    /// slot `first`. False unless every one checks out: a chunk that is not
    /// there reads as nothing, a slot never written in one as zeros, and
    /// neither opens.
    fn open_run(&self, space: u64, first: u64, from: u64, to: u64, v: &[u8], buf: &mut [u8]) -> bool {
        let stride = self.stride();
        if v.len() != (to - from) as usize * stride {
            return false;
        }
        // (An ancestor's pages open with its key: `fork.rs`.)
        let sealer = match self.ancestors.iter().find(|a| a.space == space) {
            Some(a) => a.sealer.as_deref(),
            None => self.sealer.as_deref(),
        };
        (from..to).all(|s| {
            let i = (s - first) as usize;
            let at = (s - from) as usize * stride;
            open_page(sealer, space, s, &v[at..at + stride], &mut buf[i * self.page..(i + 1) * self.page])
        })
    }

    /// Writes `run` (slots `slot…`, within one group) as the pipelined
    /// `SET`s and `SETRANGE`s of its chunks on `c`, then `WAIT`s for the
    /// replicas asked for.
    fn write_group(&self, c: &mut Conn, slot: u64, run: &[&[u8]], key: &str) -> redis::RedisResult<()> {
        match c {
            // Encoded straight into the connection's buffer (one copy of
            // each page, into memory already faulted in: a pipeline built
            // of `Cmd`s copies every page twice into fresh allocations of up
            // to a megabyte, whose page faults cost more than the copies).
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
                    let value = Chunk { sealer: self.sealer.as_deref(), space: self.space, first: s, pages: part };
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
            self.wait_replicas(c, key)?;
        }
        Ok(())
    }

    /// Says on stderr why a page write failed, once until a write succeeds
    /// again (`write_failing`) and at most once a minute (`write_said_ns`:
    /// with one cluster node failing beside healthy ones, writes succeed
    /// and fail in turn, and it was said 193 times in 20 s): the pages stay
    /// resident meanwhile, and the write is tried again with back-off.
    fn say_write_failed(&self, why: &str) {
        let now = usermm_sys::now_ns();
        let was_failing = self.write_failing.swap(true, Ordering::Relaxed);
        if say_again(was_failing, self.write_said_ns.load(Ordering::Relaxed), now) {
            self.write_said_ns.store(now, Ordering::Relaxed);
            eprintln!(
                "usermm: swap_url {}: a page write failed ({why}); its pages stay resident and writes are tried \
                 again with back-off (umm_stats swap_write_fails counts them)",
                self.shown
            );
        }
    }

    /// `WAIT replicas T` on the node that holds `key` (its group's hash
    /// slot), `T` half the command timeout (with the whole of it, the
    /// socket timed out just before the server's answer, and the write
    /// failed as a broken connection); an error unless that many replicas
    /// acknowledged.
    fn wait_replicas(&self, c: &mut Conn, key: &str) -> redis::RedisResult<()> {
        let wait_ms = (self.timeout.as_millis() as u64 / 2).max(1);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(wait_ms);
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
            let detail = format!("{acked} of {} replicas acknowledged within {wait_ms} ms", self.replicas);
            return Err(redis::RedisError::from((redis::ErrorKind::ResponseError, "WAIT", detail)));
        }
        Ok(())
    }
}

impl PageStore for RedisStore {
    fn outage_wait(&self) -> Option<Duration> {
        if let Some(c) = self.child.get() {
            return c.outage_wait();
        }
        // A replica is promoted within the cluster's node timeout; reads
        // wait as long (`read_retrying`).
        (self.cluster() && self.replicas > 0).then_some(self.failover)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
        if let Some(c) = self.child.get() {
            return c.read(off, buf);
        }
        let first = off / self.page as u64;
        let n = buf.len() / self.page;
        let stride = self.stride();
        let last = first + n as u64;
        if n > 0 && first / CHUNK == (last - 1) / CHUNK && !self.cluster() && self.same_owner_until(first, last) == last
        {
            // One chunk from one server over TCP: the reply read straight
            // into the connection's buffer and opened from there (building
            // a `Cmd` and parsing its reply into a fresh value cost 1.9 µs
            // a page, a tenth of the round trip).
            let start = (first % CHUNK) as usize * stride;
            let mut opened = false;
            let fast = self.with_retry(|c| {
                let Conn::Own(link, scratch) = c else { return Ok(false) };
                let (prefix, space) = self.owner(first);
                // (`key`'s form for a single server.)
                let got = link.getrange_into(prefix, first / CHUNK, start, start + n * stride - 1, scratch)?;
                opened = self.open_run(space, first, first, last, &scratch[got], buf);
                Ok(true)
            })?;
            if fast {
                return if opened { Ok(()) } else { Err(Errno::EIO) };
            }
        }
        // One GETRANGE per chunk the run touches (one, mostly: a single
        // page is a GETRANGE of its stride), and per owner of its slots in
        // a forked child.
        let mut cmds = Vec::new();
        let mut slot = first;
        while slot < last {
            let end = self.same_owner_until(slot, ((slot / CHUNK + 1) * CHUNK).min(last));
            let start = (slot % CHUNK) as usize * stride;
            let (prefix, space) = self.owner(slot);
            let mut cmd = redis::cmd("GETRANGE");
            cmd.arg(self.key_of(prefix, slot / CHUNK)).arg(start).arg(start + (end - slot) as usize * stride - 1);
            cmds.push((slot, end, space, cmd));
            slot = end;
        }
        let values = self.getranges(&cmds)?;
        for ((from, to, space, _), v) in cmds.iter().zip(&values) {
            if !self.open_run(*space, first, *from, *to, v, buf) {
                return Err(Errno::EIO);
            }
        }
        Ok(())
    }

    fn read_pages(&self, offs: &[u64], buf: &mut [u8]) -> Vec<bool> {
        if let Some(c) = self.child.get() {
            return c.read_pages(offs, buf);
        }
        // One GETRANGE per run of neighbouring slots within a chunk, all in
        // one pipeline: one round trip for a read-ahead's pages.
        let (ps, stride) = (self.page, self.stride());
        let mut cmds = Vec::new();
        let mut at = Vec::new();
        let mut i = 0;
        while i < offs.len() {
            let slot = offs[i] / ps as u64;
            let (prefix, space) = self.owner(slot);
            let mut j = i + 1;
            while j < offs.len()
                && offs[j] / ps as u64 == slot + (j - i) as u64
                && (slot + (j - i) as u64) / CHUNK == slot / CHUNK
                && self.owner(slot + (j - i) as u64).1 == space
            {
                j += 1;
            }
            let start = (slot % CHUNK) as usize * stride;
            let mut cmd = redis::cmd("GETRANGE");
            cmd.arg(self.key_of(prefix, slot / CHUNK)).arg(start).arg(start + (j - i) * stride - 1);
            cmds.push((slot, slot + (j - i) as u64, space, cmd));
            at.push(i);
            i = j;
        }
        let mut ok = vec![false; offs.len()];
        let Ok(values) = self.getranges(&cmds) else { return ok };
        for (((from, to, space, _), v), &i) in cmds.iter().zip(&values).zip(&at) {
            let k = (to - from) as usize;
            let good = self.open_run(*space, *from, *from, *to, v, &mut buf[i * ps..(i + k) * ps]);
            ok[i..i + k].fill(good);
        }
        ok
    }

    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno> {
        if let Some(c) = self.child.get() {
            return c.write(off, pages);
        }
        if self.unregistered.load(Ordering::Acquire) {
            self.register_before_write()?;
        }
        let first = off / self.page as u64;
        // (These slots' bytes are this store's from now on; nobody reads
        // them while they are written.)
        for a in &self.ancestors {
            (first..first + pages.len() as u64).for_each(|s| a.clear(s));
        }
        // The commands of one group (one hash slot in a cluster) at a time,
        // pipelined, then WAIT there.
        let mut i = 0;
        while i < pages.len() {
            let slot = first + i as u64;
            let end = (((slot / GROUP) + 1) * GROUP - first).min(pages.len() as u64) as usize;
            let run = &pages[i..end];
            let key = self.key(slot / CHUNK);
            if self.group_failing(slot / GROUP) {
                return Err(Errno::EIO);
            }
            // (The server's words, for the message: `with_conn` keeps only
            // the errno.)
            let mut why = None;
            let r = self.with_conn(|c| self.write_group(c, slot, run, &key).inspect_err(|e| why = Some(e.to_string())));
            if let Err(e) = r {
                self.say_write_failed(why.as_deref().unwrap_or("no connection could be made"));
                if self.cluster() {
                    let mut f = self.failing_groups.lock().unwrap_or_else(|e| e.into_inner());
                    f.retain(|&(g, _)| g != slot / GROUP);
                    f.push((slot / GROUP, std::time::Instant::now() + GROUP_FAIL_FAST));
                }
                return Err(e);
            }
            i = end;
        }
        self.write_failing.store(false, Ordering::Relaxed);
        Ok(())
    }

    fn direct_io(&self) -> bool {
        // Nothing of the pages stays in this host's page cache.
        true
    }

    fn read_polls(&self) -> bool {
        if let Some(c) = self.child.get() {
            return c.read_polls();
        }
        self.reads_poll
    }

    fn release_granule(&self) -> u32 {
        if let Some(c) = self.child.get() {
            return c.release_granule();
        }
        CHUNK as u32
    }

    fn write_granule(&self) -> u32 {
        if let Some(c) = self.child.get() {
            return c.write_granule();
        }
        if self.cluster() {
            GROUP as u32
        } else {
            0
        }
    }

    fn keep_alive_due(&self) -> bool {
        if let Some(c) = self.child.get() {
            return c.keep_alive_due();
        }
        self.lease_due()
    }

    fn keep_alive(&self) {
        if let Some(c) = self.child.get() {
            return c.keep_alive();
        }
        if self.unregistered.load(Ordering::Acquire) {
            // (Nothing of its own to keep yet: its ancestors' leases only.)
            self.lease_next_ns.store(usermm_sys::now_ns() + lease::refresh_ns(self.lease), Ordering::Relaxed);
        } else {
            self.refresh_lease();
        }
        self.refresh_ancestors();
    }

    fn forks(&self) -> bool {
        true
    }

    fn fork_child(&self, runs: &[(u64, u64)]) -> Result<(), Errno> {
        if let Some(c) = self.child.get() {
            return c.fork_child(runs);
        }
        let child = self.for_child(runs)?;
        let _ = self.child.set(Box::new(child));
        Ok(())
    }

    fn child_tie(&self, tie: &std::sync::Arc<crate::platform::fork::ChildTie>) {
        if let Some(c) = self.child.get() {
            return c.child_tie(tie);
        }
        self.keep_for(tie);
    }

    fn release(&self, runs: &[(u64, u64)]) -> Result<(), Errno> {
        if let Some(c) = self.child.get() {
            return c.release(runs);
        }
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

/// Whether a failed write is said on stderr (`RedisStore::say_write_failed`):
/// not while writes keep failing (`was_failing`), and not within
/// `SAY_AGAIN_NS` of the last time (`said_ns`, 0: never) even after writes
/// went through in between.
fn say_again(was_failing: bool, said_ns: u64, now_ns: u64) -> bool {
    !was_failing && (said_ns == 0 || now_ns.saturating_sub(said_ns) >= SAY_AGAIN_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_said_once_a_failure_and_at_most_once_a_minute() {
        let t0 = 5_000_000_000;
        // The first failure ever is said; the failures after it are not.
        assert!(say_again(false, 0, t0));
        assert!(!say_again(true, t0, t0 + 1));
        assert!(!say_again(true, t0, t0 + 2 * SAY_AGAIN_NS));
        // Writes went through, then fail again: not said within the minute…
        assert!(!say_again(false, t0, t0 + SAY_AGAIN_NS - 1));
        // …said after it.
        assert!(say_again(false, t0, t0 + SAY_AGAIN_NS));
    }
}
