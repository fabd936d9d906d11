//! A connection to one Redis-protocol server over TCP that can wait for the
//! reply to a short request (a read of pages) by polling its socket for a
//! while before it sleeps in `read`.
//!
//! Why: a page that comes back from the store is on the path of a fault.
//! Through a handler thread the round trip wakes the server, the handler
//! again for the reply, and the faulting thread; each wake-up of a vCPU that
//! went idle costs this VM 5–40 µs and more (`docs/design.md`, "Page
//! stores"). A handler that polls for the reply is not woken for it: the
//! round trip measured 56–57 µs instead of 128–131 µs in two interleaved
//! runs of `usermm bench farmem`. A faulting thread that resolves its own
//! fault (`UMM_F_INTHREAD_FAULTS`) measured the other way (42–73 µs polling,
//! 38–44 µs sleeping), so such a space's store does not poll. A request of a
//! page or more (a write of pages) is always waited for by sleeping: the
//! server needs the CPU for it more than the waiter does.
//!
//! The replies are parsed by redis-rs's own parser; everything else (the
//! commands, pipelines, their replies as values) is redis-rs's through
//! [`redis::ConnectionLike`]. `rediss://` and `redis+unix://` servers are
//! reached through redis-rs's own connection instead.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

use redis::{RedisError, RedisResult, Value};

/// How long a short request's reply is polled for before the waiter sleeps
/// in `read` (a 4 KiB `GETRANGE` on loopback is answered in 15–40 µs).
const POLL_NS: u64 = 200_000;

/// A request shorter than this is polled for (its reply is awaited on the
/// path of a fault); a longer one carries pages out.
const POLLED_REQUEST: usize = 1024;

pub(super) struct Link {
    sock: TcpStream,
    parser: redis::Parser,
    db: i64,
    open: bool,
    /// Whether a short request's reply is polled for.
    poll: bool,
}

impl Link {
    /// Connects to the TCP server of `info` (`None` when it is not one: TLS,
    /// a Unix socket) and logs in and selects the database as redis-rs
    /// would. `poll`: short requests' replies are polled for.
    pub(super) fn connect(info: &redis::ConnectionInfo, timeout: Duration, poll: bool) -> Option<RedisResult<Link>> {
        let redis::ConnectionAddr::Tcp(host, port) = &info.addr else {
            return None;
        };
        Some(Self::connect_tcp(host, *port, &info.redis, timeout, poll))
    }

    fn connect_tcp(
        host: &str,
        port: u16,
        r: &redis::RedisConnectionInfo,
        timeout: Duration,
        poll: bool,
    ) -> RedisResult<Link> {
        let mut last = None;
        let mut sock = None;
        for a in (host, port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = match (sock, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(std::io::Error::from(std::io::ErrorKind::NotFound).into()),
        };
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let mut link = Link { sock, parser: redis::Parser::new(), db: r.db, open: true, poll };
        if let Some(password) = &r.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &r.username {
                auth.arg(user);
            }
            auth.arg(password).exec(&mut link)?;
        }
        if r.db != 0 {
            redis::cmd("SELECT").arg(r.db).exec(&mut link)?;
        }
        Ok(link)
    }

    /// Sends `cmd`; a short one's reply is then polled for (if `poll`).
    fn send(&mut self, cmd: &[u8]) -> RedisResult<()> {
        if let Err(e) = self.sock.write_all(cmd) {
            self.open = false;
            return Err(e.into());
        }
        if self.poll && cmd.len() < POLLED_REQUEST {
            self.poll_for_reply();
        }
        Ok(())
    }

    /// Returns once the socket is readable, or after [`POLL_NS`]; yields
    /// the CPU on every turn (the server may be waiting for it).
    fn poll_for_reply(&self) {
        let fd = self.sock.as_raw_fd();
        let until = usermm_sys::now_ns() + POLL_NS;
        loop {
            match usermm_sys::uffd::poll2(fd, -1, 0) {
                Ok(true) | Err(_) => return,
                Ok(false) if usermm_sys::now_ns() >= until => return,
                Ok(false) => std::thread::yield_now(),
            }
        }
    }

    fn read(&mut self) -> RedisResult<Value> {
        let r = self.parser.parse_value(&mut self.sock);
        if r.is_err() {
            // A timeout or a broken stream: whatever is left of the reply
            // would be read as the next one's.
            self.open = false;
        }
        r
    }
}

impl redis::ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send(cmd)?;
        self.read()
    }

    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.send(cmd)?;
        let mut values = Vec::with_capacity(count);
        let mut first_err: Option<RedisError> = None;
        for i in 0..offset + count {
            // Every reply is read, so that none is left for the next
            // request; the first error (of the skipped ones, or of reading)
            // is the result.
            match self.read() {
                Ok(Value::ServerError(e)) if i < offset => {
                    first_err.get_or_insert(e.into());
                }
                Ok(v) if i >= offset => values.push(v),
                Ok(_) => {}
                Err(e) => return Err(first_err.unwrap_or(e)),
            }
        }
        first_err.map_or(Ok(values), Err)
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}
