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
//! 38–44 µs sleeping), so such a space's store does not poll, nor does a
//! faulting thread's own read in a handler space (`UMM_MAP_INTHREAD`). A request of a
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
    /// Whether a server at `info` is reached through a `Link`: a plain TCP
    /// one (TLS and Unix sockets go through redis-rs's connection).
    pub(super) fn serves(info: &redis::ConnectionInfo) -> bool {
        matches!(info.addr, redis::ConnectionAddr::Tcp(..))
    }

    /// Connects to the server of `info` (`None` when a `Link` does not
    /// serve it: [`Link::serves`]) and logs in and selects the database as
    /// redis-rs would. `poll`: short requests' replies are polled for.
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
        let polls = self.send_only(cmd)?;
        if polls {
            self.poll_for_reply();
        }
        Ok(())
    }

    /// Sends `cmd`; returns whether its reply is to be polled for: a short
    /// request's, if `poll`. (Not for a faulting thread resolving its own
    /// fault: an `UMM_MAP_INTHREAD` region's in a space of handler
    /// threads.)
    fn send_only(&mut self, cmd: &[u8]) -> RedisResult<bool> {
        if let Err(e) = self.sock.write_all(cmd) {
            self.open = false;
            return Err(e.into());
        }
        Ok(self.poll && cmd.len() < POLLED_REQUEST && !crate::thread_role::resolving_own_fault())
    }

    /// Returns once the socket is readable, or after [`POLL_NS`]; yields
    /// the CPU on every turn (the server may be waiting for it), the first
    /// before it looks: the server, woken by the request, mostly runs on
    /// this CPU (`perf sched`: the faulting thread, the handler and the
    /// server in turn on one vCPU), so the reply is there when it has run.
    /// A probe loop like `farmem`'s round trip, two builds alternated four
    /// times: 13.44–13.53 µs against 13.68–13.83 µs looking first.
    fn poll_for_reply(&self) {
        let fd = self.sock.as_raw_fd();
        let until = usermm_sys::now_ns() + POLL_NS;
        std::thread::yield_now();
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

impl Link {
    /// `GETRANGE key start end`, its reply (a bulk string) read into `buf`
    /// with no value built: returns where in `buf` the bytes are. An error
    /// reply is an error, and leaves the connection usable.
    /// The key is `prefix` followed by `number` in decimal. (The request is
    /// written with no allocation and no `fmt`: formatting it with
    /// `write!` and `to_string` took 0.2 µs of a 12 µs round trip.)
    pub(super) fn getrange_into(
        &mut self,
        prefix: &str,
        number: u64,
        start: usize,
        end: usize,
        buf: &mut Vec<u8>,
    ) -> RedisResult<std::ops::Range<usize>> {
        let (mut d0, mut d1, mut d2, mut len) =
            (itoa::Buffer::new(), itoa::Buffer::new(), itoa::Buffer::new(), itoa::Buffer::new());
        let number = d0.format(number).as_bytes();
        let start = d1.format(start).as_bytes();
        let end = d2.format(end).as_bytes();
        buf.clear();
        buf.extend_from_slice(b"*4\r\n$8\r\nGETRANGE\r\n$");
        buf.extend_from_slice(len.format(prefix.len() + number.len()).as_bytes());
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(prefix.as_bytes());
        buf.extend_from_slice(number);
        buf.extend_from_slice(b"\r\n");
        for arg in [start, end] {
            buf.push(b'$');
            buf.extend_from_slice(len.format(arg.len()).as_bytes());
            buf.extend_from_slice(b"\r\n");
            buf.extend_from_slice(arg);
            buf.extend_from_slice(b"\r\n");
        }
        let polls = self.send_only(buf)?;
        let r = self.read_bulk(buf, polls);
        if matches!(&r, Err(e) if e.kind() != redis::ErrorKind::ResponseError) {
            self.open = false;
        }
        r
    }

    /// Reads one reply, a bulk string, into `buf`; returns the range of its
    /// bytes. (Nothing of an earlier reply is left in `parser`: every
    /// request reads all its replies.) `polls`: the reply is polled for, as
    /// `poll_for_reply` does, but each look is the read itself (`recv`
    /// with `MSG_DONTWAIT`) instead of a `poll` and then a read: one system
    /// call less a page.
    fn read_bulk(&mut self, buf: &mut Vec<u8>, polls: bool) -> RedisResult<std::ops::Range<usize>> {
        use std::io::Read;
        let protocol = |what: &'static str| RedisError::from((redis::ErrorKind::ParseError, what));
        buf.clear();
        // The header line's length, and the reply's whole length, once known.
        let mut header = None;
        let until = if polls { usermm_sys::now_ns() + POLL_NS } else { 0 };
        let mut total = usize::MAX;
        loop {
            if header.is_none() {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    let line = &buf[1..i];
                    match buf[0] {
                        b'$' => {
                            let n: i64 = std::str::from_utf8(line)
                                .ok()
                                .and_then(|t| t.parse().ok())
                                .ok_or_else(|| protocol("bad bulk length"))?;
                            header = Some(i + 2);
                            // (A nil reply, "$-1", has no bytes.)
                            total = if n < 0 { i + 2 } else { i + 2 + n as usize + 2 };
                        }
                        b'-' => {
                            let msg = String::from_utf8_lossy(line).into_owned();
                            return Err(RedisError::from((redis::ErrorKind::ResponseError, "server error", msg)));
                        }
                        _ => return Err(protocol("not a bulk string")),
                    }
                }
            }
            if let Some(h) = header {
                if buf.len() >= total {
                    if buf.len() > total {
                        return Err(protocol("more than one reply"));
                    }
                    if total == h {
                        return Ok(h..h);
                    }
                    if &buf[total - 2..] != b"\r\n" {
                        return Err(protocol("bulk string not terminated"));
                    }
                    return Ok(h..total - 2);
                }
            }
            let have = buf.len();
            let want = if total == usize::MAX { 8192 } else { total - have };
            buf.resize(have + want, 0);
            if polls && usermm_sys::now_ns() < until {
                // (The first turn yields before it looks: see
                // `poll_for_reply`.)
                std::thread::yield_now();
                match usermm_sys::uffd::recv_now(self.sock.as_raw_fd(), &mut buf[have..]) {
                    Ok(Some(0)) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                    Ok(Some(n)) => buf.truncate(have + n),
                    Ok(None) => buf.truncate(have),
                    Err(e) => return Err(std::io::Error::from_raw_os_error(e.0).into()),
                }
                continue;
            }
            match self.sock.read(&mut buf[have..]) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => buf.truncate(have + n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => buf.truncate(have),
                Err(e) => return Err(e.into()),
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A link to a loopback "server" that answers each request with the next
    /// of `replies`, each written in two pieces with a pause between them.
    fn link_to(replies: Vec<Vec<u8>>) -> (Link, std::thread::JoinHandle<Vec<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut requests = Vec::new();
            for r in replies {
                let mut req = vec![0u8; 256];
                let n = s.read(&mut req).unwrap();
                requests.push(req[..n].to_vec());
                let cut = r.len() / 2;
                s.write_all(&r[..cut]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                s.write_all(&r[cut..]).unwrap();
            }
            requests
        });
        let info = redis::RedisConnectionInfo::default();
        let link = Link::connect_tcp("127.0.0.1", port, &info, Duration::from_secs(2), true).unwrap();
        (link, server)
    }

    #[test]
    fn getrange_replies_are_read_into_the_buffer() {
        let page: Vec<u8> = (0..4128u32).map(|i| (i % 253) as u8).collect();
        let mut bulk = format!("${}\r\n", page.len()).into_bytes();
        bulk.extend_from_slice(&page);
        bulk.extend_from_slice(b"\r\n");
        let replies = vec![
            bulk,
            b"$0\r\n\r\n".to_vec(),
            b"$-1\r\n".to_vec(),
            b"-ERR wrong type\r\n".to_vec(),
            b"$3\r\nabc\r\n".to_vec(),
            b"$3\r\nabcd\r\n".to_vec(),
        ];
        let (mut link, server) = link_to(replies);
        let mut buf = Vec::new();
        let r = link.getrange_into("P", 7, 4128, 8255, &mut buf).unwrap();
        assert_eq!(&buf[r], &page[..], "a page split over two reads");
        let r = link.getrange_into("P", 8, 0, 4127, &mut buf).unwrap();
        assert!(r.is_empty(), "an empty string");
        let r = link.getrange_into("P", 8, 0, 4127, &mut buf).unwrap();
        assert!(r.is_empty(), "nil");
        let e = link.getrange_into("P", 9, 0, 1, &mut buf).unwrap_err();
        assert_eq!(e.kind(), redis::ErrorKind::ResponseError, "{e}");
        assert!(link.open, "an error reply leaves the connection usable");
        let r = link.getrange_into("P", 9, 0, 2, &mut buf).unwrap();
        assert_eq!(&buf[r], b"abc", "the reply after an error reply");
        assert!(link.getrange_into("P", 9, 0, 2, &mut buf).is_err(), "a reply longer than it says");
        assert!(!link.open, "a broken reply closes the connection");
        let requests = server.join().unwrap();
        assert_eq!(requests[0], b"*4\r\n$8\r\nGETRANGE\r\n$2\r\nP7\r\n$4\r\n4128\r\n$4\r\n8255\r\n");
        assert_eq!(requests[1], b"*4\r\n$8\r\nGETRANGE\r\n$2\r\nP8\r\n$1\r\n0\r\n$4\r\n4127\r\n");
    }
}
