//! `programs`: programs people run under a memory limit, timed as a whole
//! under usermm and under the kernel, side by side in one run: CPython
//! building a dict, the SQLite shell on a database larger than the budget,
//! a Redis server loaded and read back (`python_sqlite.rs`, `redis.rs`),
//! Node.js with a large `Map` (`node.rs`), Java with a large `HashMap`
//! under the G1 and the Serial collector (`java.rs`), and git's repack,
//! fsck and `log -p` on a generated repository (`git.rs`).
//!
//! Systems, for each program (the order reversed every other round, so
//! that drift hits all of them), each of the first three at every
//! fraction of `budget_pcts` (a variant `PROGRAM at 1/2`, …):
//! - `usermm`: `usermm run --budget B` with a swap file, B = the fraction
//!   of the program's heap peak (measured by the calibration round);
//! - `usermm-redis`: the same, swapping to one `redis-server` this
//!   benchmark starts on a loopback port (`--swap-url`);
//! - `kernel-memcg`: the same program in a memory cgroup (`memcg`) with a
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
//!   yardstick is the unlimited kernel. Like that row it shows the program
//!   no memory limit (`USERMM_RUN_NO_CGROUP_VIEW=1`): a program that sizes
//!   itself by its limit works differently under one (Node.js under a
//!   limit of 1 GiB, in a memory cgroup or `usermm run`'s view, gives V8 a
//!   smaller young generation and marks more: 2.7 s and 2.5 s against 2.1
//!   s with no limit, where `usermm run` without the view takes 2.1 s).
//!
//! Time: from the spawn of a `usermm` process to the exit of the program
//! it starts, on both sides alike (for usermm: `usermm run`, which spawns
//! the program; for the kernel: this binary's cgroup helper, which joins
//! the group and execs it; each side pays one start of this binary, 2-4
//! ms); for Redis, from the client's connection to the server's last reply
//! (the server's start-up excluded). Every run's result is checked
//! (`exec::Check`): a wrong run is an error. A run still going after
//! `timeout_s` is killed with every process it started and counted as
//! timed out (the row's remaining runs are skipped); a kernel run its
//! group's OOM killer killed is counted as OOM-killed, with the reason.
//!
//! Misses: usermm's major faults, parked-page faults (`minor_faults`) and
//! swap-ins from `--stats`, summed over the run's processes; the kernel's
//! `pgmajfault` of the group's `memory.stat`, and the machine's `pswpin`
//! across the run (cgroup v1 has no swap-in count of a group). The time a
//! miss costs: the run's extra time over the same program with no pressure
//! (usermm: the fitting row; the kernel: the unlimited row), medians,
//! divided by its misses (usermm: major + parked faults; the kernel:
//! `pgmajfault`).
//!
//! Round 0 is the calibration (not recorded): the fitting usermm run gives
//! the heap peak (`resident_bytes_max` of `--stats`, the largest of the
//! run's processes), the unlimited kernel run the group's peak charge.

mod exec;
mod git;
mod java;
mod node;
mod python_sqlite;
mod redis;
mod summary;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{default_swap_dir, Progress, MIB};
use crate::memcg::KernelLimit;
use crate::params::{Kind, Params};
use crate::reclaim::farmem::Server;
use crate::report::Experiment;
pub use exec::kernel_memcg_child;
use exec::{run_kernel, run_usermm, Outcome, Prog, Sample};

const USERMM: &str = "usermm";
const USERMM_REDIS: &str = "usermm-redis";
const MEMCG: &str = "kernel-memcg";
const NOLIMIT: &str = "kernel (no limit, upper bound)";
const FITS: &str = "usermm (budget > working set)";

/// Every program, in the order they run.
const PROGRAMS: &str = "python,sqlite,redis,node,java-g1,java-serial,git-repack,git-fsck,git-log";

/// A group limit that limits nothing (cgroup v1 rounds it down to its
/// maximum).
const NO_LIMIT_BYTES: usize = 1 << 50;

pub fn params(full: bool) -> Params {
    let q = |quick: u64, f: u64| if full { f } else { quick };
    Params::default()
        .def("programs", Kind::Text, PROGRAMS, "programs to run, comma-separated (python, sqlite, redis, node, java-g1, java-serial, git-repack, git-fsck, git-log)")
        .def("python_kib_values", Kind::Int, q(256, 1024), "CPython: Ki values of 1 KiB in the dict")
        .def("sqlite_rows", Kind::Int, q(240_000, 1_000_000), "SQLite: rows of about 1.1 KiB in the database")
        .def("redis_kib_values", Kind::Int, q(64, 256), "Redis: Ki values of 4 KiB set and read back")
        .def("node_objects", Kind::Int, q(500_000, 2_000_000), "Node.js: objects in the Map (about 570 bytes each)")
        .def("java_objects", Kind::Int, q(1_000_000, 4_000_000), "Java: records in the HashMap (about 220 bytes each)")
        .def("java_heap_mib", Kind::Int, q(384, 1536), "Java: -Xms and -Xmx (MiB)")
        .def("git_mib", Kind::Int, q(256, 1024), "git: MiB of 1 KiB text files in the generated repository's history")
        .def("budget_pcts", Kind::IntList, "50,25", "usermm's budgets, % of the program's heap peak (one variant each)")
        .def("fits_budget_mib", Kind::Int, q(1024, 8192), "budget of the fitting usermm row (MiB)")
        .def("timeout_s", Kind::Int, q(300, 1200), "a run still going after this many seconds is killed and reported as timed out")
        .def("runs", Kind::Int, q(3, 5), "measured runs (after one calibration round)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the swap files")
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

/// Builds the program `name` (its data and expected output made here,
/// without usermm).
fn prepare(name: &str, p: &Params, dir: &Path) -> Result<Prog, String> {
    match name {
        "python" => python_sqlite::python(p, dir),
        "sqlite" => python_sqlite::sqlite(p, dir),
        "redis" => redis::prepare(p, dir),
        "node" => node::prepare(p, dir),
        "java-g1" | "java-serial" => java::prepare(name, p, dir),
        "git-repack" | "git-fsck" | "git-log" => git::prepare(name, p, dir),
        other => Err(format!("unknown program '{other}' ({PROGRAMS})")),
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

/// `50` → `1/2`, `25` → `1/4`, else `N%`.
fn fraction(pct: u64) -> String {
    match pct {
        100 => "1/1".into(),
        50 => "1/2".into(),
        25 => "1/4".into(),
        20 => "1/5".into(),
        10 => "1/10".into(),
        _ => format!("{pct}%"),
    }
}

/// The variant of program `name` at budget fraction `pct`.
fn variant(name: &str, pct: u64) -> String {
    format!("{name} at {}", fraction(pct))
}

/// What the whole bench shares.
struct Bench<'a> {
    p: &'a Params,
    say: &'a Progress,
    dir: PathBuf,
    runs: usize,
    swap_dir: String,
    fits_budget: usize,
    timeout: Duration,
    store_url: String,
    nolimit: Result<KernelLimit, String>,
}

pub fn run(p: &Params, say: &Progress) -> Result<Experiment, String> {
    let mut e = Experiment::new(
        "programs",
        "real programs under usermm run vs the kernel under the same limit (CPython, SQLite, Redis, Node.js, Java, git)",
        p.pairs(),
    );
    let dir = std::env::temp_dir().join(format!("usermm-programs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let store = Server::start(&[]).map_err(|e| format!("the Redis page store: {e}"));
    let r = store.and_then(|store| {
        // (No prefix of its own: each process of a program, the server and
        // its client, gets the default one, unique per space; a prefix is
        // one space's.)
        let swap_dir = p.text("swap_dir");
        let nolimit = KernelLimit::setup(NO_LIMIT_BYTES, 0, &swap_dir);
        if let Err(why) = &nolimit {
            say.say(&format!("kernel rows: not measured: {why}"));
            e.notes.push(format!("{MEMCG} and {NOLIMIT}: not measured: {why}."));
        }
        let b = Bench {
            p,
            say,
            dir: dir.clone(),
            runs: p.int("runs").max(1) as usize,
            swap_dir,
            fits_budget: p.int("fits_budget_mib") as usize * MIB,
            timeout: Duration::from_secs(p.int("timeout_s").max(1)),
            store_url: format!("redis://127.0.0.1:{}/", store.port),
            nolimit,
        };
        let mut limits = Vec::new();
        for name in p.text("programs").split(',').map(str::trim).filter(|s| !s.is_empty()) {
            limits.push(b.program(&mut e, name)?);
        }
        summary::finish(&mut e, &b, &limits);
        drop(store);
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
    r?;
    Ok(e)
}

/// One row of a round: a system, at a budget fraction (the rows with no
/// pressure have none).
#[derive(Clone, Copy, PartialEq)]
struct Slot {
    sys: &'static str,
    pct: Option<u64>,
}

/// A program's limits, from its calibration round.
struct Limits {
    heap_peak: usize,
    /// `(pct, budget, memory-cgroup limit)`.
    budgets: Vec<(u64, usize, usize)>,
    swap_bytes: usize,
}

impl Bench<'_> {
    /// Calibrates, then measures program `name`; says its limits.
    fn program(&self, e: &mut Experiment, name: &str) -> Result<String, String> {
        let prog = prepare(name, self.p, &self.dir)?;
        if name.starts_with("git-") {
            e.notes.push(format!("git's repository: {} of packs.", mib(git::pack_bytes(&self.dir))));
        }
        self.say.say(&format!("{name}: calibration (not recorded)"));
        let lim = self.calibrate(e, &prog)?;
        let mut limit = match &self.nolimit {
            Ok(_) => KernelLimit::setup(NO_LIMIT_BYTES, lim.swap_bytes, &self.swap_dir),
            Err(_) => Err("the kernel rows are not measured".into()),
        };
        if let Err(why) = &limit {
            self.say.say(&format!("{MEMCG}: not measured: {why}"));
        }
        let mut slots = Vec::new();
        for &(pct, _, _) in &lim.budgets {
            for sys in [USERMM, USERMM_REDIS, MEMCG] {
                slots.push(Slot { sys, pct: Some(pct) });
            }
        }
        slots.extend([Slot { sys: NOLIMIT, pct: None }, Slot { sys: FITS, pct: None }]);
        let mut timed_out: Vec<Slot> = Vec::new();
        for r in 0..self.runs {
            let mut order = slots.clone();
            if r % 2 == 1 {
                order.reverse();
            }
            for slot in order {
                if timed_out.contains(&slot) {
                    continue;
                }
                let v = slot.pct.map_or(name.to_string(), |pct| variant(name, pct));
                self.say.say(&format!("{v} {}, run {}/{}", slot.sys, r + 1, self.runs));
                let Some(out) = self.run_slot(&prog, &lim, slot, limit.as_mut())? else { continue };
                if record(e, slot.sys, &v, out, self.timeout) {
                    timed_out.push(slot);
                }
            }
        }
        drop(limit);
        summary::program(e, name, &lim.budgets);
        Ok(format!(
            "{name}: heap peak {}, swap {}; {}",
            mib(lim.heap_peak as u64),
            mib(lim.swap_bytes as u64),
            lim.budgets
                .iter()
                .map(|&(pct, b, l)| format!(
                    "at {}: budget {}, memory-cgroup limit {}",
                    fraction(pct),
                    mib(b as u64),
                    mib(l as u64)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// The calibration round: the heap peak with no pressure, the group's
    /// charge with no limit; the budgets and limits from them.
    fn calibrate(&self, e: &mut Experiment, prog: &Prog) -> Result<Limits, String> {
        let name = &prog.name;
        let done = |o: Outcome, what: &str| match o {
            Outcome::Done(s) => Ok(s),
            Outcome::OomKilled(why) => Err(format!("{name}: the calibration's {what} run was OOM-killed: {why}")),
            Outcome::TimedOut => Err(format!("{name}: the calibration's {what} run timed out")),
        };
        let fits = run_usermm(prog, FITS, self.fits_budget, &self.fits_swap(), self.timeout)?;
        let heap_peak = done(fits, FITS)?.heap_peak_bytes as usize;
        if heap_peak >= self.fits_budget {
            return Err(format!("{name}: heap peak {} is not below --fits-budget-mib", mib(heap_peak as u64)));
        }
        let charge_peak = match &self.nolimit {
            Ok(l) => done(run_kernel(prog, NOLIMIT, l, self.timeout)?, NOLIMIT)?.charge_peak_bytes as usize,
            Err(_) => 0,
        };
        let non_heap = charge_peak.saturating_sub(heap_peak);
        e.add("calibration", name, "heap_peak", "MiB", heap_peak as f64 / MIB as f64);
        e.add("calibration", name, "non_heap_charge", "MiB", non_heap as f64 / MIB as f64);
        let mut budgets = Vec::new();
        for pct in self.p.list("budget_pcts") {
            let pct = pct.clamp(1, 100);
            let budget = (heap_peak * pct as usize / 100).max(MIB).next_multiple_of(4096);
            let v = variant(name, pct);
            e.add("calibration", &v, "budget", "MiB", budget as f64 / MIB as f64);
            e.add("calibration", &v, "memcg_limit", "MiB", (budget + non_heap) as f64 / MIB as f64);
            budgets.push((pct, budget, budget + non_heap));
        }
        let swap_bytes = (2 * heap_peak + 64 * MIB).next_multiple_of(MIB);
        let l = Limits { heap_peak, budgets, swap_bytes };
        self.say.say(&format!(
            "{name}: heap peak {}, group peak charge with no limit {}",
            mib(heap_peak as u64),
            mib(charge_peak as u64)
        ));
        Ok(l)
    }

    fn fits_swap(&self) -> [String; 2] {
        [format!("--swap-bytes={}", 64 * MIB), format!("--swap-dir={}", self.swap_dir)]
    }

    /// One run of `slot`; `None` where the system is not measured here.
    fn run_slot(
        &self,
        prog: &Prog,
        lim: &Limits,
        slot: Slot,
        limit: Result<&mut KernelLimit, &mut String>,
    ) -> Result<Option<Outcome>, String> {
        let budget = lim.budgets.iter().find(|b| Some(b.0) == slot.pct).copied();
        let file_swap = [format!("--swap-bytes={}", lim.swap_bytes), format!("--swap-dir={}", self.swap_dir)];
        let redis_swap = [format!("--swap-bytes={}", lim.swap_bytes), format!("--swap-url={}", self.store_url)];
        let (t, sys) = (self.timeout, slot.sys);
        Ok(Some(match (sys, budget) {
            (USERMM, Some((_, b, _))) => run_usermm(prog, sys, b, &file_swap, t)?,
            (USERMM_REDIS, Some((_, b, _))) => run_usermm(prog, sys, b, &redis_swap, t)?,
            (MEMCG, Some((_, _, l))) => match limit {
                Ok(k) => {
                    k.set_limit(l);
                    run_kernel(prog, sys, k, t)?
                }
                Err(_) => return Ok(None),
            },
            (NOLIMIT, _) => match &self.nolimit {
                Ok(k) => run_kernel(prog, sys, k, t)?,
                Err(_) => return Ok(None),
            },
            _ => run_usermm(prog, FITS, self.fits_budget, &self.fits_swap(), t)?,
        }))
    }
}

/// Records one run's outcome; whether it timed out.
fn record(e: &mut Experiment, sys: &str, v: &str, out: Outcome, timeout: Duration) -> bool {
    let s: Sample = match out {
        Outcome::Done(s) => s,
        Outcome::OomKilled(why) => {
            e.add(sys, v, "oom_killed", "runs", 1.0);
            e.notes.push(format!("{sys} {v}: a run OOM-killed: {why}."));
            return false;
        }
        Outcome::TimedOut => {
            e.add(sys, v, "timed_out", "runs", 1.0);
            e.notes.push(format!(
                "{sys} {v}: a run timed out (still going after {} s; the row's remaining runs were skipped).",
                timeout.as_secs()
            ));
            return true;
        }
    };
    e.add(sys, v, "time", "s", s.secs);
    if sys == USERMM || sys == USERMM_REDIS {
        e.add(sys, v, "major_faults", "faults", s.major_faults as f64);
        e.add(sys, v, "parked_faults", "faults", s.parked_faults as f64);
        e.add(sys, v, "swapins", "pages", s.swapins as f64);
        e.add(sys, v, "swapouts", "pages", s.swapouts as f64);
    }
    if sys == MEMCG {
        e.add(sys, v, "pgmajfault", "faults", s.pgmajfault as f64);
        e.add(sys, v, "pswpin", "pages", s.pswpin as f64);
    }
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_check_line_is_what_node_and_java_print() {
        // Printed by `node map.js N` and `java MapBench N` (node.rs, java.rs).
        assert_eq!(super::node::check_line(500_000), "ok 500000 2689486176\n");
        assert_eq!(super::node::check_line(1_000_000), "ok 1000000 1777183904\n");
    }
}
