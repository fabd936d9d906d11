//! `farmem`: the `reclaim` phases with the space's swap on the local swap
//! file and on a Redis server (`swap_url`), side by side in one run.
//!
//! Systems, alternated run by run:
//! - `usermm (swap file)`: as `reclaim`'s usermm row;
//! - `usermm (redis)`: the same space with `swap_url` naming a
//!   `redis-server` this benchmark starts on a loopback port (no
//!   persistence) and stops at the end;
//! - `usermm (redis, sealed)`: the same with `seal=1` (every page
//!   encrypted and authenticated with ChaCha20-Poly1305: what sealing
//!   costs, `sealed / redis` in the table);
//! - `usermm (redis, TLS)`: the same server through its TLS port
//!   (`rediss://`, a certificate authority and a server certificate made
//!   with the `openssl` command for the run): what TLS costs;
//! - `usermm (redis, in-thread)`: the same with `UMM_F_INTHREAD_FAULTS`
//!   (faults resolved in the faulting thread: the round trip has no
//!   hand-off to a handler thread);
//! - `usermm (redis cluster)`: the same with `swap_url` naming a 3-master
//!   Redis Cluster (no replicas) the benchmark makes with `redis-cli`;
//! - `redis GET (interleaved, handler)` and `redis GET (interleaved,
//!   in-thread)` (latency only; the yardsticks of the round-trip goals):
//!   `GET`s of random values of one stored page's size, out of as many as
//!   the working set has pages, on the same server through a client of
//!   its own, one at a time, timed in blocks alternated with the blocks of
//!   `usermm (redis)`'s probes and of `usermm (redis, in-thread)`'s;
//! - `redis GET` (latency only): the same GETs alone, after the spaces
//!   (`roundtrip`), and the same 64 values over and over (`roundtrip-hot`:
//!   all in the CPU's caches, which no probe sees).
//!
//! Besides the phases' throughput: the page round trip (after the phases,
//! every page is paged out, a pause of 0.5 s and `probes`/4 untimed touches
//! of pages in the first quarter, then `probes` random pages of the rest are
//! touched one at a time, each timed: a fault, a read from the store, the
//! install; the GETs get the same pause and warm-up; where GETs are
//! interleaved, each of the `BLOCKS` blocks of probes and of GETs follows a
//! pause of 3 ms and 8 untimed operations), its p50
//! and p99, and the bytes on the wire (the server's
//! `total_net_input_bytes`/`total_net_output_bytes`, per page swapped).
//! - `kernel-memcg`: the kernel under the same limit, swapping to a swap
//!   file of the same size (`reclaim`'s row: its child runs the same
//!   phases; root only). Phases only: no round-trip probe.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usermm::consts::MADV_PAGEOUT;
use usermm::Space;
use usermm_sys::now_ns;

use super::workload::phases;
use super::{memcg_run, Shape, Totals, MEMCG, PHASES};
use crate::common::{config, default_swap_dir, p50_p99_max, Progress, Rng, MIB, PAGE};
use crate::memcg::KernelLimit;
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Table};

const FILE: &str = "usermm (swap file)";
const REDIS: &str = "usermm (redis)";
const REDIS_IT: &str = "usermm (redis, in-thread)";
const CLUSTER: &str = "usermm (redis cluster)";
/// `usermm (redis)` with `seal=1`: every page encrypted and authenticated.
const SEALED: &str = "usermm (redis, sealed)";
/// `usermm (redis)` over TLS (`rediss://`) to the same server.
const TLS: &str = "usermm (redis, TLS)";
const GET: &str = "redis GET";
/// The GETs interleaved with `usermm (redis)`'s probes, and with
/// `usermm (redis, in-thread)`'s: the yardsticks of the round-trip goals.
const GET_H: &str = "redis GET (interleaved, handler)";
const GET_IT: &str = "redis GET (interleaved, in-thread)";
/// The pause before the round trips and the GETs are measured.
const SETTLE: Duration = Duration::from_millis(500);
/// The timed probes and the interleaved GETs come in this many blocks of
/// each, alternated.
const BLOCKS: usize = 8;
/// Between two blocks: longer than a handler thread spins for its next
/// fault (`SPIN_NS`, 0.1 ms), so that no GET runs beside a spinning handler.
const BLOCK_PAUSE: Duration = Duration::from_millis(3);
/// Untimed operations at the start of each block (after the pause).
const BLOCK_WARMUP: usize = 8;

pub fn params(full: bool) -> Params {
    Params::default()
        .def("budget_mib", Kind::Int, if full { 1024 } else { 32 }, "usermm's resident budget (MiB)")
        .def("set_mib", Kind::Int, if full { 4096 } else { 128 }, "working set (MiB)")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs")
        .def("mix_touches_per_page", Kind::Int, 1, "random touches per phase = this × pages of the working set")
        .def("probes", Kind::Int, 2000, "timed single-page round trips per run (and GETs)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the swap file")
        .def("seed", Kind::Int, 7, "PRNG seed")
}

/// A `redis-server` on a free loopback port; stopped on drop, and, in a
/// process group of its own, by the benchmark's teardown on SIGINT/SIGTERM
/// (which ends the process without running drops).
pub(crate) struct Server {
    pub(crate) port: u16,
    child: Child,
    dir: PathBuf,
    group: Option<crate::memcg::ProcessGroupGuard>,
}

impl Server {
    /// On a free port whose cluster bus port (+10,000) is free too; again on
    /// another if the server exits at once (the port was taken meanwhile).
    pub(crate) fn start(extra: &[&str]) -> Result<Server, String> {
        let mut last = String::new();
        for _ in 0..20 {
            let port = usermm_sys::testing::free_cluster_port().map_err(|e| format!("no free port: {e}"))?;
            match Self::start_on(port, extra) {
                Ok(s) => return Ok(s),
                Err((why, true)) => last = why,
                Err((why, false)) => return Err(why),
            }
        }
        Err(last)
    }

    /// `Err((why, worth another port))`.
    fn start_on(port: u16, extra: &[&str]) -> Result<Server, (String, bool)> {
        let dir = std::env::temp_dir().join(format!("usermm-farmem-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| (format!("mkdir {}: {e}", dir.display()), false))?;
        use std::os::unix::process::CommandExt;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| (format!("cannot start redis-server ({e}): apt-get install redis-server"), false))?;
        let group = Some(crate::memcg::ProcessGroupGuard::new(child.id() as i32));
        let mut s = Server { port, child, dir, group };
        let t0 = Instant::now();
        while s.conn().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c)).is_err() {
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err((format!("redis-server on port {port} exited at start ({st})"), true));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err((format!("redis-server on port {port} did not answer in 10 s"), false));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(s)
    }

    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    /// The server's `used_memory` (bytes its allocator holds for data,
    /// keys and buffers).
    fn used_memory(&self) -> u64 {
        let info: String =
            self.conn().and_then(|mut c| redis::cmd("INFO").arg("memory").query(&mut c)).unwrap_or_default();
        info.lines().find_map(|l| l.strip_prefix("used_memory:").and_then(|v| v.trim().parse().ok())).unwrap_or(0)
    }

    /// `(total_net_input_bytes, total_net_output_bytes)` of the server.
    fn net_bytes(&self) -> (u64, u64) {
        let info: String =
            self.conn().and_then(|mut c| redis::cmd("INFO").arg("stats").query(&mut c)).unwrap_or_default();
        let field =
            |n: &str| info.lines().find_map(|l| l.strip_prefix(n).and_then(|v| v.trim().parse().ok())).unwrap_or(0);
        (field("total_net_input_bytes:"), field("total_net_output_bytes:"))
    }
}

/// A 3-master Redis Cluster (no replicas) on loopback.
fn start_cluster() -> Result<Vec<Server>, String> {
    let args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"];
    let nodes = (0..3).map(|_| Server::start(&args)).collect::<Result<Vec<_>, _>>()?;
    let mut create = Command::new("redis-cli");
    create.args(["--cluster", "create"]);
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    let out = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .map_err(|e| format!("cannot run redis-cli ({e}): apt-get install redis-tools"))?;
    if !out.status.success() {
        return Err(format!("redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout)));
    }
    let t0 = Instant::now();
    while !nodes.iter().all(|n| {
        n.conn()
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
            .is_ok_and(|i| i.contains("cluster_state:ok"))
    }) {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("the cluster was not ok after 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(nodes)
}

/// The bytes in and out of all of `servers`.
fn net_bytes(servers: &[Server]) -> (u64, u64) {
    servers.iter().map(Server::net_bytes).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(g) = self.group.take() {
            g.release();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A certificate authority and a server certificate it signed for
/// 127.0.0.1, made with the `openssl` command in `dir`: `(ca, server
/// certificate, server key)`.
fn tls_files(dir: &std::path::Path) -> Result<[String; 3], String> {
    usermm_sys::testing::make_certificates(dir, false)?;
    Ok(["ca.crt", "server.crt", "server.key"].map(|f| dir.join(f).display().to_string()))
}

/// One run of the phases and the round-trip probe in a fresh space.
#[allow(clippy::too_many_arguments)]
fn space_run(
    e: &mut Experiment,
    sys: &str,
    sh: Shape,
    budget: usize,
    url: Option<String>,
    dir: &str,
    probes: usize,
    servers: &[Server],
    flags: u32,
    get: Option<(&Server, &str)>,
) -> Result<(), String> {
    let mut cfg = config(budget, sh.set + budget, Some(dir));
    cfg.swap_url = url;
    cfg.flags |= flags;
    let space = Space::open(&cfg).map_err(|e| format!("{sys} open: {e}"))?;
    let mut m = space.map_anon(sh.set).map_err(|e| format!("{sys} mmap: {e:?}"))?;
    let st = || {
        let s = space.stats();
        (s.swapouts, s.swapins, s.major_faults, s.evictions, s.minor_faults)
    };
    let used = || servers.iter().map(Server::used_memory).sum::<u64>();
    let mem0 = used();
    let net0 = (!servers.is_empty()).then(|| net_bytes(servers));
    let ph = phases(&mut m, &st, sh, &mut |_| {});
    let net1 = (!servers.is_empty()).then(|| net_bytes(servers));
    if !servers.is_empty() {
        // What the store holds for the pages swapped out now (the space's
        // keys: chunk values with their headers, the lease), against their
        // bytes.
        let swapped = space.stats().swapped_pages * PAGE as u64;
        let held = used().saturating_sub(mem0);
        e.add(sys, "all", "store_bytes_per_swapped_byte", "×", held as f64 / swapped.max(1) as f64);
        // The same over every page the store holds: the swapped ones and
        // the swap copies of resident pages (Linux's swap used, which
        // counts its swap cache): the layout's own overhead.
        let slots = swapped + space.stats().swap_cached_pages * PAGE as u64;
        e.add(sys, "all", "store_bytes_per_slot_byte", "×", held as f64 / slots.max(1) as f64);
    }
    let mut errors = 0;
    for (name, p) in PHASES.iter().zip(&ph) {
        errors += p.errors;
        let unit = if matches!(*name, "seq-write" | "seq-read") { "pages/s" } else { "touches/s" };
        e.add(sys, name, "throughput", unit, p.touches as f64 / (p.ns as f64 / 1e9));
    }
    let (outs, ins): (u64, u64) =
        ph.iter().map(|p| (p.swapouts, p.swapins)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    if let (Some((i0, o0)), Some((i1, o1))) = (net0, net1) {
        e.add(sys, "all", "wire_bytes_per_page_out", "bytes", (i1 - i0) as f64 / outs.max(1) as f64);
        e.add(sys, "all", "wire_bytes_per_page_in", "bytes", (o1 - o0) as f64 / ins.max(1) as f64);
    }
    // Round trips: everything out, then single pages back, one at a time.
    // Like the GET row, after a pause and an untimed warm-up: right after
    // the phases' burst of I/O this VM wakes idle vCPUs slowly for a few
    // hundred milliseconds (a GET then takes 48–80 µs instead of 17), which
    // would measure the machine, not the path. The warm-up touches pages of
    // the first quarter, the timed probes the rest (each a real round trip).
    // With `get`, GETs of values of the same size on the same server are
    // timed in blocks alternated with the probes' (`BLOCKS`): a probe and a
    // GET then meet the same placement of the program and the server on
    // this VM's two vCPUs, which changes from run to run (a GET 19 µs with
    // both on one vCPU, 61–67 µs on two) and otherwise decides the ratio.
    m.advise(MADV_PAGEOUT).map_err(|e| format!("{sys} pageout: {e:?}"))?;
    let pages = sh.set / PAGE;
    let quarter = (pages / 4).max(1);
    let mut rng = Rng::new(sh.seed ^ 0xfa);
    let mut gets = match get {
        Some((server, _)) => Some(GetValues::write(server, pages)?),
        None => None,
    };
    std::thread::sleep(SETTLE);
    for _ in 0..probes / 4 {
        std::hint::black_box(m[rng.below(quarter as u64) as usize * PAGE]);
        if let Some(g) = &mut gets {
            g.get(rng.below(quarter as u64) as usize)?;
        }
    }
    let mut lat = Vec::with_capacity(probes);
    let mut get_lat = Vec::with_capacity(probes);
    // Pages read and major faults of the timed probes only.
    let (mut read, mut major) = (0, 0);
    for b in 0..BLOCKS {
        let n = probes * (b + 1) / BLOCKS - probes * b / BLOCKS;
        if gets.is_some() {
            std::thread::sleep(BLOCK_PAUSE);
            for _ in 0..BLOCK_WARMUP {
                std::hint::black_box(m[(quarter + rng.below((pages - quarter) as u64) as usize) * PAGE]);
            }
        }
        let s0 = space.stats();
        for _ in 0..n {
            let p = quarter + rng.below((pages - quarter) as u64) as usize;
            let t0 = now_ns();
            let v = m[p * PAGE];
            lat.push((now_ns() - t0) as f64 / 1000.0);
            std::hint::black_box(v);
        }
        let s1 = space.stats();
        (read, major) = (read + s1.swapins - s0.swapins, major + s1.major_faults - s0.major_faults);
        if let Some(g) = &mut gets {
            std::thread::sleep(BLOCK_PAUSE);
            for _ in 0..BLOCK_WARMUP {
                g.get(quarter + rng.below((pages - quarter) as u64) as usize)?;
            }
            for _ in 0..n {
                get_lat.push(g.get(quarter + rng.below((pages - quarter) as u64) as usize)?);
            }
        }
    }
    let (p50, p99, _) = p50_p99_max(&mut lat);
    e.add(sys, "roundtrip", "p50", "µs", p50);
    e.add(sys, "roundtrip", "p99", "µs", p99);
    if let (Some((_, row)), false) = (get, get_lat.is_empty()) {
        let (p50, p99, _) = p50_p99_max(&mut get_lat);
        e.add(row, "roundtrip", "p50", "µs", p50);
        e.add(row, "roundtrip", "p99", "µs", p99);
    }
    if let Some(g) = gets {
        g.remove()?;
    }
    let s = space.stats();
    e.add(sys, "roundtrip", "pages_read_per_probe", "pages", read as f64 / probes as f64);
    e.add(sys, "roundtrip", "major_faults_per_probe", "faults", major as f64 / probes as f64);
    drop(m);
    space.close().map_err(|e| format!("{sys} close: {e:?}"))?;
    if errors > 0 || s.swap_read_errors + s.swap_write_errors > 0 {
        return Err(format!(
            "{sys}: {errors} touches read wrong data, {} read and {} write errors",
            s.swap_read_errors, s.swap_write_errors
        ));
    }
    Ok(())
}

/// Values of a stored page's size on a server, as many as the working set
/// has pages (the same data the space stores), read with `GET` one at a
/// time through one connection; deleted again on `remove`.
struct GetValues {
    conn: redis::Connection,
    value: Vec<u8>,
    pages: usize,
}

impl GetValues {
    fn key(k: usize) -> String {
        format!("bench-get:{k}")
    }

    fn write(server: &Server, pages: usize) -> Result<GetValues, String> {
        let mut conn = server.conn().map_err(|e| format!("connect: {e}"))?;
        let value = vec![0x5au8; PAGE + 32];
        for first in (0..pages).step_by(512) {
            let mut p = redis::pipe();
            for k in first..(first + 512).min(pages) {
                p.cmd("SET").arg(Self::key(k)).arg(&value).ignore();
            }
            p.query::<()>(&mut conn).map_err(|e| format!("SET: {e}"))?;
        }
        Ok(GetValues { conn, value, pages })
    }

    /// One timed `GET` of value `k`, in µs; checks the value's length.
    fn get(&mut self, k: usize) -> Result<f64, String> {
        let t0 = now_ns();
        let v: Vec<u8> = redis::cmd("GET").arg(Self::key(k)).query(&mut self.conn).map_err(|e| e.to_string())?;
        let ns = now_ns() - t0;
        if v.len() != self.value.len() {
            return Err(format!("GET {}: {} bytes, {} stored", Self::key(k), v.len(), self.value.len()));
        }
        Ok(ns as f64 / 1000.0)
    }

    fn remove(mut self) -> Result<(), String> {
        for first in (0..self.pages).step_by(512) {
            let mut p = redis::pipe();
            for k in first..(first + 512).min(self.pages) {
                p.cmd("UNLINK").arg(Self::key(k)).ignore();
            }
            p.query::<()>(&mut self.conn).map_err(|e| format!("UNLINK: {e}"))?;
        }
        Ok(())
    }
}

/// `GET` latency of a stored page's size on `server`, one at a time and
/// alone (no space open), in two variants (each after the same pause and
/// warm-up as the round trips):
/// - `roundtrip`: random values out of as many as the working set has
///   pages; the warm-up reads values of the first quarter, the timed GETs
///   random values of the rest, as the probes touch pages.
/// - `roundtrip-hot`: the same 64 values over and over (all in the CPU's
///   caches): a lower bound no probe of a paged-out working set sees.
///
/// The goals compare with the GETs interleaved with the probes
/// (`space_run`); these rows show what a GET costs with nothing else
/// running.
fn get_latency(e: &mut Experiment, server: &Server, probes: usize, pages: usize, seed: u64) -> Result<(), String> {
    let mut g = GetValues::write(server, pages)?;
    let quarter = (pages / 4).max(1);
    let mut rng = Rng::new(seed ^ 0x6e7);
    std::thread::sleep(SETTLE);
    for _ in 0..probes / 4 {
        g.get(rng.below(quarter as u64) as usize)?;
    }
    let mut lat = Vec::with_capacity(probes);
    for _ in 0..probes {
        lat.push(g.get(quarter + rng.below((pages - quarter).max(1) as u64) as usize)?);
    }
    let (p50, p99, _) = p50_p99_max(&mut lat);
    e.add(GET, "roundtrip", "p50", "µs", p50);
    e.add(GET, "roundtrip", "p99", "µs", p99);
    std::thread::sleep(SETTLE);
    for i in 0..probes / 4 {
        g.get(i % 64)?;
    }
    lat.clear();
    for i in 0..probes {
        lat.push(g.get(i % 64)?);
    }
    let (p50, p99, _) = p50_p99_max(&mut lat);
    e.add(GET, "roundtrip-hot", "p50", "µs", p50);
    e.add(GET, "roundtrip-hot", "p99", "µs", p99);
    g.remove()
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let budget = p.int("budget_mib") as usize * MIB;
    let set = p.int("set_mib") as usize * MIB;
    let runs = p.int("runs").max(1) as usize;
    let pages = set / PAGE;
    if budget < PAGE || set <= budget {
        return Err("farmem: need a working set larger than the budget".into());
    }
    let hot_pages = (budget / PAGE / 10).max(1);
    let sh = Shape {
        set,
        budget_pages: budget / PAGE,
        hot_pages,
        hot_pct: 90,
        mix: pages * p.int("mix_touches_per_page").max(1) as usize,
        seed: p.int("seed"),
    };
    let (dir, probes) = (p.text("swap_dir"), p.int("probes").max(1) as usize);
    let mut e =
        Experiment::new("farmem", "far memory: the reclaim phases swapping to a file and to a Redis server", p.pairs());
    // The server also listens on a TLS port when certificates could be made.
    let tls_dir = std::env::temp_dir().join(format!("usermm-farmem-bench-tls-{}", std::process::id()));
    let tls = tls_files(&tls_dir).and_then(|files| {
        let port = usermm_sys::testing::free_cluster_port().map_err(|e| format!("no free port: {e}"))?;
        Ok((port, files))
    });
    let tls_args: Vec<String> = match &tls {
        Ok((port, [ca, crt, key])) => [
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            crt,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
            "--tls-auth-clients",
            "no",
        ]
        .map(String::from)
        .to_vec(),
        Err(why) => {
            prog.say(&format!("{TLS}: not measured: {why}"));
            e.notes.push(format!("{TLS} not measured: {why}"));
            Vec::new()
        }
    };
    let server = match Server::start(&tls_args.iter().map(String::as_str).collect::<Vec<_>>()) {
        Ok(s) => Some(s),
        Err(why) => {
            prog.say(&format!("{REDIS}: not measured: {why}"));
            e.notes.push(format!("{REDIS} and {GET} not measured: {why}"));
            None
        }
    };
    let cluster = match start_cluster() {
        Ok(c) => Some(c),
        Err(why) => {
            prog.say(&format!("{CLUSTER}: not measured: {why}"));
            e.notes.push(format!("{CLUSTER} not measured: {why}"));
            None
        }
    };
    prog.say(&format!(
        "{MEMCG}: setting up a {} MiB swap file in {dir}, {} MiB memory groups",
        (set + budget) / MIB,
        budget / MIB
    ));
    let mut limit = KernelLimit::setup(budget, set + budget, &dir);
    if let Err(why) = &limit {
        prog.say(&format!("{MEMCG}: not measured: {why}"));
        e.notes.push(format!("{MEMCG} not measured: {why}"));
    }
    let mut totals = Totals::default();
    for r in 0..runs {
        if let Some(m) = memcg_run(sh, &mut limit, &mut totals, r, prog, &mut e) {
            for (name, p) in PHASES.iter().zip(&m.phases) {
                let unit = if matches!(*name, "seq-write" | "seq-read") { "pages/s" } else { "touches/s" };
                e.add(MEMCG, name, "throughput", unit, p.touches as f64 / (p.ns as f64 / 1e9));
            }
        }
        let order = if r.is_multiple_of(2) {
            [FILE, REDIS, SEALED, TLS, REDIS_IT, CLUSTER]
        } else {
            [CLUSTER, REDIS_IT, TLS, SEALED, REDIS, FILE]
        };
        for sys in order {
            let (url, servers): (Option<String>, &[Server]) = match sys {
                FILE => (None, &[]),
                REDIS | REDIS_IT | SEALED => match &server {
                    Some(s) => {
                        let seal = if sys == SEALED { "&seal=1" } else { "" };
                        (Some(format!("redis://127.0.0.1:{}/?prefix=farmem:{seal}", s.port)), std::slice::from_ref(s))
                    }
                    None => continue,
                },
                TLS => match (&server, &tls) {
                    (Some(s), Ok((port, [ca, ..]))) => (
                        Some(format!("rediss://127.0.0.1:{port}/?prefix=farmem:&tls_ca={ca}")),
                        std::slice::from_ref(s),
                    ),
                    _ => continue,
                },
                _ => match &cluster {
                    Some(c) => {
                        let seeds: Vec<String> = c.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
                        (Some(format!("redis+cluster://{}/?prefix=farmem:", seeds.join(","))), &c[..])
                    }
                    None => continue,
                },
            };
            prog.say(&format!("{sys}, run {}/{runs}", r + 1));
            let flags = if sys == REDIS_IT { usermm::consts::UMM_F_INTHREAD_FAULTS } else { 0 };
            let get = match (sys, &server) {
                (REDIS, Some(s)) => Some((s, GET_H)),
                (REDIS_IT, Some(s)) => Some((s, GET_IT)),
                _ => None,
            };
            space_run(&mut e, sys, sh, budget, url, &dir, probes, servers, flags, get)?;
        }
        if let Some(s) = &server {
            prog.say(&format!("{GET}, run {}/{runs}", r + 1));
            get_latency(&mut e, s, probes, pages, sh.seed)?;
        }
    }
    let measured = server.is_some();
    drop(server);
    let _ = std::fs::remove_dir_all(&tls_dir);
    drop(cluster);
    drop(limit);
    if !totals.errors.is_empty() {
        e.notes.push(format!("{MEMCG} errors: {}", totals.errors.join("; ")));
    }
    let mut rows = Vec::new();
    for ph in PHASES.iter().chain(["roundtrip"].iter()) {
        let metric = if *ph == "roundtrip" { "p50" } else { "throughput" };
        let (f, r, c) = (e.med(FILE, ph, metric), e.med(REDIS, ph, metric), e.med(CLUSTER, ph, metric));
        let (k, ri, sd) = (e.med(MEMCG, ph, metric), e.med(REDIS_IT, ph, metric), e.med(SEALED, ph, metric));
        let t = e.med(TLS, ph, metric);
        rows.push(vec![
            ph.to_string(),
            fmt_num(f),
            fmt_num(r),
            fmt_num(sd),
            fmt_num(t),
            fmt_num(ri),
            fmt_num(c),
            fmt_num(k),
            fmt_num(r / f),
            fmt_num(sd / r),
            fmt_num(t / r),
            fmt_num(c / f),
        ]);
    }
    e.tables.push(Table {
        title: "medians: throughput per phase (pages or touches/s), round trip p50 (µs)".into(),
        head: [
            "phase",
            FILE,
            REDIS,
            SEALED,
            TLS,
            REDIS_IT,
            CLUSTER,
            MEMCG,
            "redis / file",
            "sealed / redis",
            "TLS / redis",
            "cluster / file",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
    if !measured {
        return Ok(e);
    }
    let mut goal = |what: &str, sys: &str, base: &str, variant: &str, metric: &str, at_least: bool, bound: f64| {
        let value = e.med(sys, variant, metric) / e.med(base, variant, metric);
        e.goals.push(crate::report::Goal {
            what: what.into(),
            how: format!("{sys}/{base}, {variant} {metric}"),
            value,
            unit: "×".into(),
            at_least,
            threshold: bound,
            goal: bound,
        });
    };
    goal(
        "sequential swap-out throughput to one Redis server vs the local swap file",
        REDIS,
        FILE,
        "seq-write",
        "throughput",
        true,
        0.5,
    );
    goal(
        "sequential swap-in throughput from one Redis server vs the local swap file",
        REDIS,
        FILE,
        "seq-read",
        "throughput",
        true,
        0.5,
    );
    goal(
        "page round trip p50 vs a single GET of the same size on the same server",
        REDIS,
        GET_H,
        "roundtrip",
        "p50",
        false,
        1.5,
    );
    goal(
        "page round trip p50 with faults resolved in the faulting thread (UMM_F_INTHREAD_FAULTS) vs a single GET",
        REDIS_IT,
        GET_IT,
        "roundtrip",
        "p50",
        false,
        1.5,
    );
    goal("page round trip p50 with sealed pages vs without", SEALED, REDIS, "roundtrip", "p50", false, 1.2);
    e.goals.push(crate::report::Goal {
        what: "store memory per byte swapped out to one Redis server (its used_memory)".into(),
        how: format!("{REDIS} all store_bytes_per_swapped_byte"),
        value: e.med(REDIS, "all", "store_bytes_per_swapped_byte"),
        unit: "×".into(),
        at_least: false,
        threshold: 1.3,
        goal: 1.3,
    });
    let (cold, hot) = (e.med(GET, "roundtrip", "p50"), e.med(GET, "roundtrip-hot", "p50"));
    let (gh, git) = (e.med(GET_H, "roundtrip", "p50"), e.med(GET_IT, "roundtrip", "p50"));
    let (rh, rit) = (e.med(REDIS, "roundtrip", "p50"), e.med(REDIS_IT, "roundtrip", "p50"));
    e.notes.push(format!(
        "The round-trip goals compare each space's probes with GETs of random values of a stored page's size (out \
         of as many as the working set has pages) timed in {BLOCKS} blocks alternated with the probes' blocks, on \
         the same server in the same run: {gh:.2} µs p50 beside {REDIS}, {git:.2} µs beside {REDIS_IT}. The same \
         GETs alone, after the spaces: {cold:.2} µs (round trip ÷ that: {:.2}× through a handler thread, {:.2}× \
         in-thread); the same 64 values over and over: {hot:.2} µs ({:.2}×, {:.2}×).",
        rh / cold,
        rit / cold,
        rh / hot,
        rit / hot
    ));
    e.notes.push(format!(
        "Budget {} MiB, working set {} MiB; the Redis server is Debian's redis-server on loopback, no persistence. \
         Bytes on the wire: the server's total_net_input_bytes per page swapped out and total_net_output_bytes per \
         page swapped in (keys, 32-byte headers and protocol included). Store memory: the growth of the \
         servers' used_memory over the phases ÷ the bytes the space has swapped out at their end (a full chunk's \
         value, 15 pages behind their headers, 61,920 bytes, takes jemalloc's 64 KiB size class: 1.07×; a slot \
         freed while others of its chunk are in use keeps its bytes until it is written again, which the next \
         eviction does first, or the chunk is wholly free). store_bytes_per_slot_byte divides by every page the \
         store holds, the swap copies of resident pages included (kept so that evicting a page only read since \
         its swap-in writes nothing; Linux's swap used counts its swap cache the same way).",
        budget / MIB,
        set / MIB
    ));
    Ok(e)
}
