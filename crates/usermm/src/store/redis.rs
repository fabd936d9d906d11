//! A page store on a Redis-protocol server (Redis, Valkey), through
//! redis-rs's synchronous client.
//!
//! `swap_url` is `redis://[user:password@]host:port[/db][?prefix=P&timeout_ms=T]`.
//! - Keys are `P` followed by the slot number, one key per page; the value
//!   is the page behind a 32-byte header (the space's random id, the slot,
//!   a checksum: `store.rs`), checked on every read. The default prefix is
//!   `usermm:<host>:<pid>:<space id>:`, unique per open space.
//! - A run of pages goes out as one `MSET` and comes back as one `MGET`
//!   (one round trip each).
//! - Opening the space deletes every key under the prefix (left by a space
//!   with the same prefix that crashed); closing it deletes them too.
//! - Every command has a timeout (`timeout_ms`, default 2,000): a node that
//!   is down, slow, out of memory (`OOM command not allowed`) or that returns
//!   a value that does not check out is an error — for a read, the faulting
//!   thread's transient SIGBUS; for a write, pages kept resident.
//! - Connections are pooled (one per thread doing I/O at a time); a
//!   connection that failed is dropped and a new one made on next use.

use std::sync::Mutex;
use std::time::Duration;

use usermm_core::Errno;

use super::{open_sealed, seal, PageStore};

pub(crate) struct RedisStore {
    client: redis::Client,
    pool: Mutex<Vec<redis::Connection>>,
    prefix: String,
    /// A random id of this space: part of every stored page's header.
    space: u64,
    page: usize,
    timeout: Duration,
    /// The URL without credentials, for messages and `smaps`.
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

/// `(server URL, prefix, timeout)` of a `swap_url`.
fn parse(url: &str, space: u64) -> Result<(String, String, Duration), Errno> {
    if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("redis+unix://")) {
        return Err(Errno::EINVAL);
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut prefix = None;
    let mut timeout = Duration::from_millis(2000);
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or(Errno::EINVAL)?;
        match k {
            "prefix" if !v.is_empty() => prefix = Some(v.to_string()),
            "timeout_ms" => timeout = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?.max(1)),
            _ => return Err(Errno::EINVAL),
        }
    }
    let prefix = prefix.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("usermm:{}:{}:{space:016x}:", host.trim(), std::process::id())
    });
    Ok((base.to_string(), prefix, timeout))
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
    /// Connects to the server of `url` (checking it answers) and deletes the
    /// keys a crashed space with the same prefix left behind.
    pub(crate) fn open(url: &str, page: usize) -> Result<RedisStore, Errno> {
        let space = random_id();
        let (base, prefix, timeout) = parse(url, space)?;
        let client = redis::Client::open(base.as_str()).map_err(|_| Errno::EINVAL)?;
        let shown = match base.split_once('@') {
            Some((scheme_user, host)) => format!("{}://…@{host}", scheme_user.split("://").next().unwrap_or("redis")),
            None => base.clone(),
        };
        let s = RedisStore { client, pool: Mutex::new(Vec::new()), prefix, space, page, timeout, shown };
        s.with_conn(|c| redis::cmd("PING").query::<String>(c).map(drop))
            .inspect_err(|_| eprintln!("usermm: swap_url {}: the server does not answer", s.shown))?;
        s.delete_all()?;
        Ok(s)
    }

    fn connect(&self) -> Result<redis::Connection, Errno> {
        let c = self.client.get_connection_with_timeout(self.timeout).map_err(|e| io_error(&e))?;
        c.set_read_timeout(Some(self.timeout)).map_err(|e| io_error(&e))?;
        c.set_write_timeout(Some(self.timeout)).map_err(|e| io_error(&e))?;
        Ok(c)
    }

    /// Runs `f` on a pooled connection; a connection that failed is dropped.
    fn with_conn<R>(&self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<R>) -> Result<R, Errno> {
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

    fn key(&self, slot: u64) -> String {
        format!("{}{slot}", self.prefix)
    }

    /// Deletes every key under the prefix.
    fn delete_all(&self) -> Result<(), Errno> {
        let pattern = format!("{}*", glob_escape(&self.prefix));
        self.with_conn(|c| {
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
}

impl PageStore for RedisStore {
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let first = off / self.page as u64;
        let n = buf.len() / self.page;
        let keys: Vec<String> = (0..n as u64).map(|i| self.key(first + i)).collect();
        let values: Vec<Option<Vec<u8>>> = self.with_conn(|c| redis::cmd("MGET").arg(&keys).query(c))?;
        if values.len() != n {
            return Err(Errno::EIO);
        }
        for (i, v) in values.iter().enumerate() {
            let out = &mut buf[i * self.page..(i + 1) * self.page];
            match v {
                Some(v) if open_sealed(self.space, first + i as u64, v, out) => {}
                _ => return Err(Errno::EIO),
            }
        }
        Ok(())
    }

    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno> {
        let first = off / self.page as u64;
        let mut cmd = redis::cmd("MSET");
        for (i, p) in pages.iter().enumerate() {
            let slot = first + i as u64;
            cmd.arg(self.key(slot)).arg(seal(self.space, slot, p));
        }
        self.with_conn(|c| cmd.query::<()>(c))
    }

    fn direct_io(&self) -> bool {
        // Nothing of the pages stays in this host's page cache.
        true
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Err(e) = self.delete_all() {
            eprintln!("usermm: swap_url {}: could not delete the space's keys at close ({e})", self.shown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_their_options() {
        let (b, p, t) = parse("redis://127.0.0.1:6379/?prefix=abc:&timeout_ms=50", 7).unwrap();
        assert_eq!((b.as_str(), p.as_str(), t), ("redis://127.0.0.1:6379/", "abc:", Duration::from_millis(50)));
        let (_, p, t) = parse("redis://h:1", 0xab).unwrap();
        assert!(p.starts_with("usermm:") && p.ends_with(":00000000000000ab:"), "{p}");
        assert_eq!(t, Duration::from_millis(2000));
        assert_eq!(parse("http://h:1", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?colour=red", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?timeout_ms=x", 0).err(), Some(Errno::EINVAL));
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
