//! A Redis server loaded and read back: `redis_kib_values` Ki values of
//! 4 KiB set and read back by the bench's own client, in pipelines of 64,
//! every value checked. Its time runs from the client's connection to the
//! server's last reply (the server's start-up excluded).

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use super::exec::{Check, Prog};
use super::need;
use crate::params::Params;

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("no free port: {e}"))
}

pub fn prepare(p: &Params, dir: &Path) -> Result<Prog, String> {
    let port = free_port()?;
    let d = dir.join("redis");
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    let mut argv: Vec<OsString> = vec![need("redis-server")?.into()];
    let port_s = port.to_string();
    for a in ["--port", &port_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"] {
        argv.push(a.into());
    }
    argv.push("--dir".into());
    argv.push(d.into());
    let values = p.int("redis_kib_values") as usize * 1024;
    Ok(Prog { name: "redis".into(), argv, check: Check::Redis { port, values } })
}

fn redis_value(i: usize) -> Vec<u8> {
    format!("{i:08}").repeat(512).into_bytes()
}

/// The Redis client: connects (waiting up to 30 s for the server), sets
/// `n` values of 4 KiB, reads every one back and checks it, then shuts the
/// server down. Returns the seconds from the connection to the last reply.
pub fn redis_client(port: u16, n: usize) -> Result<f64, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut con = loop {
        match client.get_connection() {
            Ok(c) => break c,
            Err(e) if t0.elapsed() > Duration::from_secs(30) => {
                return Err(format!("redis-server on port {port} did not answer in 30 s: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let r = load_and_read_back(&mut con, n);
    // The server exits: its connection drops without a reply. After an
    // error the connection may be unusable: a fresh one then, so that the
    // server does not outlive the run (its parent waits for it).
    if redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut con).is_ok() || r.is_err() {
        if let Ok(mut c) = client.get_connection() {
            let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut c);
        }
    }
    r
}

fn load_and_read_back(con: &mut redis::Connection, n: usize) -> Result<f64, String> {
    let t = Instant::now();
    const BATCH: usize = 64;
    for b in (0..n).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in b..(b + BATCH).min(n) {
            pipe.cmd("SET").arg(format!("k{i}")).arg(redis_value(i)).ignore();
        }
        pipe.query::<()>(con).map_err(|e| format!("SET: {e}"))?;
    }
    for b in (0..n).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in b..(b + BATCH).min(n) {
            pipe.cmd("GET").arg(format!("k{i}"));
        }
        let vals: Vec<Vec<u8>> = pipe.query(con).map_err(|e| format!("GET: {e}"))?;
        for (j, v) in vals.iter().enumerate() {
            if *v != redis_value(b + j) {
                return Err(format!("redis: value {} read back wrong", b + j));
            }
        }
    }
    let size: usize = redis::cmd("DBSIZE").query(con).map_err(|e| format!("DBSIZE: {e}"))?;
    if size != n {
        return Err(format!("redis: DBSIZE {size}, expected {n}"));
    }
    Ok(t.elapsed().as_secs_f64())
}
