//! `programs`: the programs `usermm run` is tested with (CPython building a
//! dict, the SQLite shell on a database larger than the budget, a Redis
//! server loaded and read back), timed as a whole under usermm and under
//! the kernel, side by side in one run.
//!
//! Systems, for each program (the order reversed every other round, so
//! that drift hits all of them):
//! - `usermm`: `usermm run --budget B` with a swap file, B = `budget_pct`%
//!   of the program's heap peak (measured by the calibration round);
//! - `usermm-redis`: the same, swapping to a `redis-server` this benchmark
//!   starts on a loopback port (`--swap-url`);
//! - `kernel-memcg`: the same program in a memory cgroup (`memcg.rs`) with a
//!   swap file of usermm's swap size. Its limit is B plus the program's
//!   non-heap memory: the cgroup charges everything the program has
//!   (stacks, libraries, its files' page cache) while usermm's budget
//!   covers only the heap, so the limit is B + (the group's peak charge
//!   with no limit − usermm's heap peak with no pressure), both measured in
//!   the calibration round;
//! - `kernel (no limit, upper bound)`: the program in a memory cgroup with
//!   no limit (the same harness, nothing reclaimed);
//! - `usermm (budget > working set)`: `usermm run` with a budget of
//!   `fits_budget_mib`, above the heap peak: nothing is swapped; its
//!   yardstick is the unlimited kernel.
//!
//! Time: for CPython and SQLite, from the spawn of a `usermm` process to
//! the exit of the program it starts, on both sides alike (for usermm:
//! `usermm run`, which spawns the program; for the kernel: this binary's
//! cgroup helper, which joins the group and execs it; each side pays one
//! start of this binary, 2-4 ms); for Redis, from the client's
//! connection to the server's last reply (the server's start-up excluded).
//! Every run's result is checked (the dict's check line, SQLite's output
//! equal to a run without usermm, every Redis value read back): a wrong run
//! is an error.
//!
//! Swap-ins (pages read back from swap): usermm's `--stats`; for
//! `kernel-memcg`, the machine's `pswpin` across the run (machine-wide).
//!
//! Round 0 is the calibration (not recorded): the fitting usermm run gives
//! the heap peak (`resident_bytes_max` of `--stats`), the unlimited kernel
//! run the group's peak charge.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{default_swap_dir, Progress, MIB};
use crate::memcg::{self, KernelLimit};
use crate::params::{Kind, Params};
use crate::reclaim::farmem::Server;
use crate::report::{fmt_num, Experiment, Goal, Table};

const USERMM: &str = "usermm";
const USERMM_REDIS: &str = "usermm-redis";
const MEMCG: &str = "kernel-memcg";
const NOLIMIT: &str = "kernel (no limit, upper bound)";
const FITS: &str = "usermm (budget > working set)";
const SYSTEMS: [&str; 5] = [USERMM, USERMM_REDIS, MEMCG, NOLIMIT, FITS];

/// A group limit that limits nothing (cgroup v1 rounds it down to its
/// maximum).
const NO_LIMIT_BYTES: usize = 1 << 50;

pub fn params(full: bool) -> Params {
    Params::default()
        .def("programs", Kind::Text, "python,sqlite,redis", "programs to run, comma-separated (python, sqlite, redis)")
        .def("python_kib_values", Kind::Int, if full { 256 } else { 32 }, "CPython: Ki values of 1 KiB in the dict")
        .def(
            "sqlite_rows",
            Kind::Int,
            if full { 200_000 } else { 20_000 },
            "SQLite: rows of about 1.1 KiB in the database",
        )
        .def("redis_kib_values", Kind::Int, if full { 64 } else { 8 }, "Redis: Ki values of 4 KiB set and read back")
        .def("budget_pct", Kind::Int, 25, "usermm's budget, % of the program's heap peak")
        .def("fits_budget_mib", Kind::Int, if full { 8192 } else { 1024 }, "budget of the fitting usermm row (MiB)")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (after one calibration round)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the swap files")
}

/// One program, ready to run.
struct Prog {
    name: &'static str,
    argv: Vec<OsString>,
    /// What its stdout must be (CPython, SQLite); Redis is checked by the
    /// client.
    expect: Option<String>,
    /// Redis: `(port, values)`.
    redis: Option<(u16, usize)>,
}

/// What one run measured.
struct Sample {
    secs: f64,
    /// From usermm's `--stats`.
    swapouts: u64,
    /// Pages read back from swap: usermm's `--stats`; for the kernel, the
    /// machine's `pswpin` across the run.
    swapins: u64,
    heap_peak_bytes: u64,
    /// From the memory group.
    charge_peak_bytes: u64,
}

fn need(prog: &str) -> Result<PathBuf, String> {
    for p in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let c = Path::new(p).join(prog);
        if c.is_file() {
            return Ok(c);
        }
    }
    Err(format!("{prog} is not installed (scripts/install-deps.sh installs it)"))
}

const PY_SCRIPT: &str = r#"
import sys
n = int(sys.argv[1]) * 1024
d = {i: (b"%08d" % i) * 128 for i in range(n)}
lst = [d[i] for i in range(0, n, 2)]
ok = all(d[i][:8] == b"%08d" % i and len(d[i]) == 1024 for i in range(n))
ok = ok and all(v[:8] == b"%08d" % (2 * j) for j, v in enumerate(lst))
print("ok" if ok else "BAD", len(d), len(lst))
"#;

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("no free port: {e}"))
}

/// Builds the program `name` (the SQLite database and the expected output
/// made here, without usermm).
fn prepare(name: &str, p: &Params, dir: &Path) -> Result<Prog, String> {
    match name {
        "python" => {
            let n = p.int("python_kib_values");
            let script = dir.join("dict.py");
            std::fs::write(&script, PY_SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
            Ok(Prog {
                name: "python",
                argv: vec![need("python3")?.into(), script.into(), n.to_string().into()],
                expect: Some(format!("ok {} {}\n", n * 1024, n * 512)),
                redis: None,
            })
        }
        "sqlite" => {
            let sqlite = need("sqlite3")?;
            let db = dir.join("t.db");
            let rows = p.int("sqlite_rows").max(10);
            let make = format!(
                "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
                 WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < {rows})
                 INSERT INTO t SELECT i, printf('key%08d', (i*7919) % {rows}), zeroblob(1000) || randomblob(100) FROM c;
                 CREATE INDEX tk ON t(k);"
            );
            let out = Command::new(&sqlite).arg(&db).arg(make).output().map_err(|e| format!("sqlite3: {e}"))?;
            if !out.status.success() {
                return Err(format!("sqlite3 could not make the database: {}", String::from_utf8_lossy(&out.stderr)));
            }
            let db_kib = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) / 1024;
            // A page cache twice the database: all of it ends up in the heap.
            let query = format!(
                "PRAGMA cache_size=-{};
                 PRAGMA integrity_check;
                 SELECT count(*), sum(length(v)), min(k), max(k), hex(md5) FROM t, (SELECT sum(id * length(v)) AS md5 FROM t);
                 SELECT k, hex(substr(v, 1001, 4)) FROM t ORDER BY k LIMIT 3 OFFSET {};
                 SELECT count(*) FROM t a JOIN t b ON a.k = b.k WHERE a.id % 3 = 0;
                 SELECT sum(length(v)) FROM t WHERE id % 2 = 0;",
                2 * db_kib + 1024,
                rows / 2
            );
            let argv: Vec<OsString> = vec![sqlite.into(), db.into(), query.into()];
            let plain = Command::new(&argv[0]).args(&argv[1..]).output().map_err(|e| format!("sqlite3: {e}"))?;
            let expect = String::from_utf8_lossy(&plain.stdout).into_owned();
            if !plain.status.success() || !expect.starts_with(&format!("ok\n{rows}|")) {
                return Err(format!("sqlite3 without usermm: {:?}: {expect}", plain.status));
            }
            Ok(Prog { name: "sqlite", argv, expect: Some(expect), redis: None })
        }
        "redis" => {
            let port = free_port()?;
            let d = dir.join("redis");
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            let mut argv: Vec<OsString> = vec![need("redis-server")?.into()];
            for a in [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--loglevel",
                "warning",
                "--dir",
            ] {
                argv.push(a.into());
            }
            argv.push(d.into());
            Ok(Prog {
                name: "redis",
                argv,
                expect: None,
                redis: Some((port, p.int("redis_kib_values") as usize * 1024)),
            })
        }
        other => Err(format!("unknown program '{other}' (python, sqlite, redis)")),
    }
}

fn redis_value(i: usize) -> Vec<u8> {
    format!("{i:08}").repeat(512).into_bytes()
}

/// The Redis client: connects (waiting up to 30 s for the server), sets
/// `n` values of 4 KiB, reads every one back and checks it, then shuts the
/// server down. Returns the seconds from the connection to the last reply.
fn redis_client(port: u16, n: usize) -> Result<f64, String> {
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
    let work = |con: &mut redis::Connection| -> Result<f64, String> {
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
    };
    let r = work(&mut con);
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

/// The `key=value` pairs of `usermm run --stats`'s line.
fn stats(stderr: &str, key: &str) -> Result<u64, String> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("usermm run: pid ") && l.contains("): stats: "))
        .ok_or_else(|| format!("no stats line on stderr:\n{stderr}"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {key} in: {line}"))
}

fn check_stdout(prog: &Prog, sys: &str, stdout: &str) -> Result<(), String> {
    match &prog.expect {
        Some(want) if stdout != want => Err(format!("{sys} {}: wrong output:\n{stdout}\nexpected:\n{want}", prog.name)),
        _ => Ok(()),
    }
}

/// `usermm run --budget … -- PROGRAM`, with `swap` its swap options.
fn run_usermm(prog: &Prog, sys: &str, budget: usize, swap: &[String]) -> Result<Sample, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut c = Command::new(exe);
    c.arg("run").arg(format!("--budget={budget}")).args(swap).arg("--stats").arg("--").args(&prog.argv);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let child = c.spawn().map_err(|e| format!("usermm run: {e}"))?;
    let client = prog.redis.map(|(port, n)| redis_client(port, n));
    let out = child.wait_with_output().map_err(|e| format!("usermm run: {e}"))?;
    let mut secs = t0.elapsed().as_secs_f64();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(format!("{sys} {}: usermm run ended with {:?}:\n{stderr}", prog.name, out.status));
    }
    if let Some(r) = client {
        secs = r.map_err(|e| format!("{sys}: {e}"))?;
    }
    check_stdout(prog, sys, &stdout)?;
    Ok(Sample {
        secs,
        swapouts: stats(&stderr, "swapouts")?,
        swapins: stats(&stderr, "swapins")?,
        heap_peak_bytes: stats(&stderr, "resident_bytes_max")?,
        charge_peak_bytes: 0,
    })
}

/// The program in a memory group of `limit` (the child execs it).
fn run_kernel(prog: &Prog, sys: &str, limit: &KernelLimit) -> Result<Sample, String> {
    let mut args = vec!["programs".to_string()];
    args.extend(prog.argv.iter().map(|a| a.to_string_lossy().into_owned()));
    let (_, pswpin0, _) = memcg::vmstat_reclaim();
    let (child, client) = std::thread::scope(|s| {
        let client = prog.redis.map(|(port, n)| s.spawn(move || redis_client(port, n)));
        let child = limit.run_child(&args);
        (child, client.map(|h| h.join().unwrap_or_else(|_| Err("the Redis client panicked".into()))))
    });
    let c = child.map_err(|e| format!("{sys} {}: {e}", prog.name))?;
    let stdout: String = c.stdout.lines().filter(|l| !l.starts_with("cgroup ")).map(|l| format!("{l}\n")).collect();
    let secs = match client {
        Some(r) => r.map_err(|e| format!("{sys}: {e}"))?,
        None => c.elapsed_ns as f64 / 1e9,
    };
    check_stdout(prog, sys, &stdout)?;
    let (_, pswpin1, _) = memcg::vmstat_reclaim();
    Ok(Sample {
        secs,
        swapouts: 0,
        swapins: pswpin1.saturating_sub(pswpin0),
        heap_peak_bytes: 0,
        charge_peak_bytes: c.peak_charge_bytes,
    })
}

/// `usermm __kernel-memcg-child programs PROGRAM ARGS…`: waits for the go
/// byte, then becomes the program (in the group the parent put it in).
pub fn kernel_memcg_child(args: &[String]) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let (prog, rest) = args.split_first().ok_or("no program")?;
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let _ = std::io::stdout().flush();
    let e = Command::new(prog).args(rest).exec();
    Err(format!("exec {prog}: {e}"))
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

pub fn run(p: &Params, prog_out: &Progress) -> Result<Experiment, String> {
    let runs = p.int("runs").max(1) as usize;
    let swap_dir = p.text("swap_dir");
    let fits_budget = p.int("fits_budget_mib") as usize * MIB;
    let mut e = Experiment::new(
        "programs",
        "real programs under usermm run vs the kernel under the same limit (CPython, SQLite, Redis)",
        p.pairs(),
    );
    let dir = std::env::temp_dir().join(format!("usermm-programs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let r = run_all(p, prog_out, &mut e, &dir, runs, &swap_dir, fits_budget);
    let _ = std::fs::remove_dir_all(&dir);
    r?;
    Ok(e)
}

#[allow(clippy::too_many_arguments)]
fn run_all(
    p: &Params,
    say: &Progress,
    e: &mut Experiment,
    dir: &Path,
    runs: usize,
    swap_dir: &str,
    fits_budget: usize,
) -> Result<(), String> {
    let store = Server::start(&[]).map_err(|e| format!("the Redis page store: {e}"))?;
    // (No prefix of its own: each process of a program, the server and its
    // client, gets the default one, unique per space; a prefix is one
    // space's.)
    let store_url = format!("redis://127.0.0.1:{}/", store.port);
    let nolimit = KernelLimit::setup(NO_LIMIT_BYTES, 0, swap_dir);
    if let Err(why) = &nolimit {
        say.say(&format!("kernel rows: not measured: {why}"));
        e.notes.push(format!("{MEMCG} and {NOLIMIT}: not measured: {why}."));
    }
    let mut limits_rows = Vec::new();
    let mut summary = Vec::new();
    for name in p.text("programs").split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let prog = prepare(name, p, dir)?;
        // Calibration: the heap peak with no pressure, the group's charge
        // with no limit.
        say.say(&format!("{name}: calibration (not recorded)"));
        let fits_swap = [format!("--swap-bytes={}", 64 * MIB), format!("--swap-dir={swap_dir}")];
        let heap_peak = run_usermm(&prog, FITS, fits_budget, &fits_swap)?.heap_peak_bytes as usize;
        if heap_peak >= fits_budget {
            return Err(format!("{name}: heap peak {} is not below --fits-budget-mib", mib(heap_peak as u64)));
        }
        let charge_peak = match &nolimit {
            Ok(l) => run_kernel(&prog, NOLIMIT, l)?.charge_peak_bytes as usize,
            Err(_) => 0,
        };
        let budget = (heap_peak * p.int("budget_pct").clamp(1, 100) as usize / 100).max(MIB).next_multiple_of(4096);
        let non_heap = charge_peak.saturating_sub(heap_peak);
        let limit_bytes = budget + non_heap;
        let swap_bytes = (2 * heap_peak + 64 * MIB).next_multiple_of(MIB);
        limits_rows.push(format!(
            "{name}: heap peak {}, group peak charge with no limit {}, non-heap {}; budget {}, memory-cgroup limit {}, swap {}",
            mib(heap_peak as u64),
            mib(charge_peak as u64),
            mib(non_heap as u64),
            mib(budget as u64),
            mib(limit_bytes as u64),
            mib(swap_bytes as u64)
        ));
        say.say(limits_rows.last().unwrap());
        for (k, v) in [("heap_peak", heap_peak), ("budget", budget), ("memcg_limit", limit_bytes)] {
            e.add("calibration", name, k, "MiB", v as f64 / MIB as f64);
        }
        let mut limit =
            if nolimit.is_ok() { KernelLimit::setup(limit_bytes, swap_bytes, swap_dir) } else { nolimit_err() };
        if let Err(why) = &limit {
            say.say(&format!("{MEMCG}: not measured: {why}"));
        }
        let file_swap = [format!("--swap-bytes={swap_bytes}"), format!("--swap-dir={swap_dir}")];
        let redis_swap = [format!("--swap-bytes={swap_bytes}"), format!("--swap-url={store_url}")];
        for r in 0..runs {
            let mut order = SYSTEMS;
            if r % 2 == 1 {
                order.reverse();
            }
            for sys in order {
                say.say(&format!("{name} {sys}, run {}/{runs}", r + 1));
                let s = match sys {
                    USERMM => run_usermm(&prog, sys, budget, &file_swap)?,
                    USERMM_REDIS => run_usermm(&prog, sys, budget, &redis_swap)?,
                    FITS => run_usermm(&prog, sys, fits_budget, &fits_swap)?,
                    MEMCG => match &limit {
                        Ok(l) => match run_kernel(&prog, sys, l) {
                            Ok(s) => s,
                            // The kernel could not run the program at this
                            // limit (its OOM killer took the child every
                            // try): said, counted, no comparison with it.
                            Err(why) if why.contains(memcg::OOM_FAILURE) => {
                                say.say(&format!("{MEMCG}: not measured: {why}"));
                                e.add(MEMCG, name, "oom_killed_children", "children", memcg::OOM_TRIES as f64);
                                e.notes.push(format!("{MEMCG} {name} not measured: {why}"));
                                limit = Err(why);
                                continue;
                            }
                            Err(why) => return Err(why),
                        },
                        Err(_) => continue,
                    },
                    _ => match &nolimit {
                        Ok(l) => run_kernel(&prog, sys, l)?,
                        Err(_) => continue,
                    },
                };
                e.add(sys, name, "time", "s", s.secs);
                if sys == USERMM || sys == USERMM_REDIS {
                    e.add(sys, name, "swapouts", "pages", s.swapouts as f64);
                }
                if sys == USERMM || sys == USERMM_REDIS || sys == MEMCG {
                    e.add(sys, name, "swapins", "pages", s.swapins as f64);
                }
            }
        }
        drop(limit);
        let t = |sys: &str| e.med(sys, name, "time");
        summary.push(vec![
            name.to_string(),
            fmt_num(t(USERMM)),
            fmt_num(t(USERMM_REDIS)),
            fmt_num(t(MEMCG)),
            fmt_num(t(NOLIMIT)),
            fmt_num(t(FITS)),
            format!("{}×", fmt_num(t(MEMCG) / t(USERMM))),
            format!("{}×", fmt_num(t(MEMCG) / t(USERMM_REDIS))),
            format!("{}×", fmt_num(t(NOLIMIT) / t(USERMM))),
            format!("{}×", fmt_num(t(NOLIMIT) / t(FITS))),
        ]);
        goal(e, name, USERMM, MEMCG, "under the same limit vs the kernel (memory cgroup + swap file)", 0.8, 1.0);
        goal(e, name, FITS, NOLIMIT, "with the budget above the working set vs the unlimited kernel", 0.9, 1.0);
    }
    drop(store);
    e.tables.push(Table {
        title: "seconds a run (medians) and throughput ratios (kernel time / usermm time)".into(),
        head: [
            "program",
            USERMM,
            USERMM_REDIS,
            MEMCG,
            "kernel no limit",
            "usermm fits",
            "usermm/kernel-memcg",
            "usermm-redis/kernel-memcg",
            "usermm/unlimited",
            "fits: usermm/unlimited",
        ]
        .map(String::from)
        .to_vec(),
        rows: summary,
    });
    e.notes.push(format!(
        "Limits (calibration round, not recorded): {}. The memory cgroup charges all of the program's memory \
         (stacks, libraries, page cache of its files) while usermm's budget covers only its heap, so the \
         cgroup's limit is usermm's budget plus the program's non-heap memory: the group's peak charge with \
         no limit minus usermm's heap peak (resident_bytes_max) with no pressure. The kernel rows run in the \
         same harness (a child in a memory group that execs the program); usermm's time includes the start \
         of `usermm run` itself. Redis: time from the client's connection to the last reply; values of 4 KiB \
         set and read back in pipelines of 64, every one checked. usermm-redis swaps to one redis-server on \
         loopback (not the program's). Ratios are throughput ratios, kernel time / usermm time.",
        limits_rows.join("; ")
    ));
    Ok(())
}

fn nolimit_err() -> Result<KernelLimit, String> {
    Err("the kernel rows are not measured".into())
}

/// A PASS/FAIL line on `base time / sys time` for program `name`.
fn goal(e: &mut Experiment, name: &str, sys: &str, base: &str, what: &str, threshold: f64, goal: f64) {
    let value = e.med(base, name, "time") / e.med(sys, name, "time");
    e.goals.push(Goal {
        what: format!("{name}: {what}"),
        how: format!("{base} time / {sys} time"),
        value,
        unit: "×".into(),
        at_least: true,
        threshold,
        goal,
    });
}
