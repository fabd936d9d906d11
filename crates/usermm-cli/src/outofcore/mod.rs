//! `outofcore`: reading a file 4× the budget through a file mapping.
//!
//! One file of `file_mib` (random-ish content: every 8-byte word is a hash of
//! its index) is created once in `dir` and deleted at the end. Three
//! workloads, each a fixed list of 8-byte reads at 4 KiB-aligned offsets,
//! every value read summed into a checksum that is compared with the one the
//! content implies (so no row can skip work):
//! 1. `random`: `reads` uniform random reads over the whole file;
//! 2. `hotcold`: `reads` reads, `hot_touch_pct`% to the first `hot_pct`% of
//!    the file (the hot part), the rest uniform over the remainder;
//! 3. `seq-scan`: one sequential scan reading 8 bytes of every page.
//!
//! Systems, usermm and kernel-memcg swapping places run by run, each
//! workload starting cold (the
//! file's host page cache dropped before it):
//! - `usermm`: a fresh space with a `budget_mib` budget and no swap, the file
//!   mapped `MAP_SHARED` `PROT_READ`, `MADV_RANDOM` (random, hotcold) or
//!   `MADV_SEQUENTIAL` (seq-scan) on the region (usermm reads through its
//!   own open file descriptions of the file, so `posix_fadvise` on the
//!   program's descriptor would not reach its reads);
//! - `kernel-memcg`: the kernel under the same limit (`BENCHMARKS.md`, "Same
//!   limit"; `memcg.rs`): a child process (`usermm __kernel-memcg-child
//!   outofcore …`) in a memory cgroup limited to the budget maps the file
//!   as `kernel-mmap` does and runs the same reads; the page cache it fills
//!   is charged to its group. usermm's space here has no swap, so neither
//!   has the kernel: no swap file. The throughput goals compare with it;
//! - `kernel-mmap`: the host's own `mmap` of the file, no limit (an upper
//!   bound: the page cache takes what it wants), with the same advice as
//!   `madvise` and `posix_fadvise`;
//! - `pread-cache`: a hand-written page cache of `budget_mib` (LRU, one
//!   4 KiB `pread` per miss, `POSIX_FADV_DONTNEED` on each page read so that
//!   the host keeps no second copy).

mod kernel;
mod pread;
mod report;
mod usermm;
mod workload;

use usermm_sys::now_ns;

pub use self::kernel::kernel_memcg_child;
use self::kernel::{run_kernel, run_memcg, Work};
use self::pread::run_pread;
use self::usermm::run_usermm;
use self::workload::{offsets, word, Outcome, TestFile};
use crate::common::{default_swap_dir, p50_p99_max, Progress, MIB, PAGE};
use crate::memcg::KernelLimit;
use crate::params::{Kind, Params};
use crate::report::Experiment;

pub fn params(full: bool) -> Params {
    Params::default()
        .def("file_mib", Kind::Int, if full { 4096 } else { 256 }, "file size (MiB); 4× the budget by default")
        .def("budget_mib", Kind::Int, if full { 1024 } else { 64 }, "usermm's and pread-cache's budget (MiB)")
        .def(
            "reads",
            Kind::Int,
            if full { 800_000 } else { 50_000 },
            "8-byte reads of the random and hotcold workloads",
        )
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (systems rotate run by run)")
        .def("hot_pct", Kind::Int, 10, "hot part: this % of the file, from its start")
        .def("hot_touch_pct", Kind::Int, 90, "% of hotcold reads that go to the hot part")
        .def("latency_every", Kind::Int, 16, "time every Nth read with now_ns() (1: every read)")
        .def("dir", Kind::Text, default_swap_dir(), "directory of the test file (not a tmpfs: it must have a disk)")
        .def("usermm_rdwr", Kind::Int, 0, "0: usermm's descriptor is opened O_RDONLY, as the others'; 1: O_RDWR")
        .def("seed", Kind::Int, 7, "PRNG seed of the read offsets and of the file's content")
        .def("workloads", Kind::Text, WORKLOADS.join(","), "workloads to run: random, hotcold, seq-scan")
}

const WORKLOADS: [&str; 3] = ["random", "hotcold", "seq-scan"];
const MEMCG: &str = "kernel-memcg";
/// usermm with `UMM_F_INTHREAD_FAULTS`.
pub(super) const IN_THREAD: &str = "usermm (in-thread)";

/// The systems of run `r`: usermm and kernel-memcg swap places every run
/// (A B, B A, …), and so do the others.
fn order(r: usize) -> [&'static str; 5] {
    if r.is_multiple_of(2) {
        ["usermm", MEMCG, "kernel-mmap", "pread-cache", IN_THREAD]
    } else {
        [IN_THREAD, MEMCG, "usermm", "pread-cache", "kernel-mmap"]
    }
}

/// What one (system, workload) run measured.
struct Measured {
    out: Outcome,
    /// Resident peak in bytes (see the notes for each system's meaning).
    peak: f64,
    /// usermm: faults (`Stats::faults`); kernel-mmap: the process's major faults;
    /// pread-cache: misses (preads).
    misses: u64,
    writebacks: u64,
    /// kernel-memcg: (p50, p99) of the timed reads, worked out by the child
    /// (its `out.lat` is empty).
    pct: Option<(f64, f64)>,
    /// kernel-memcg: pages read from the disk (`read_bytes` of the child's
    /// `/proc/self/io` / 4 KiB).
    pages_read: Option<u64>,
    /// kernel-memcg: children the OOM killer killed first (each run again).
    oom_kills: u32,
}

struct Setup<'a> {
    file: &'a TestFile,
    len: usize,
    budget: usize,
    every: usize,
    usermm_rdwr: bool,
}

/// The parameters of one `outofcore` experiment, checked.
struct Opts {
    len: usize,
    budget: usize,
    reads: usize,
    runs: usize,
    every: usize,
    hot_touch: u64,
    hot_pct: u64,
    dir: String,
    seed: u64,
    pages: usize,
    hot_pages: usize,
    usermm_rdwr: bool,
}

fn opts(p: &Params) -> Result<Opts, String> {
    let len = p.int("file_mib") as usize * MIB;
    let budget = p.int("budget_mib") as usize * MIB;
    let reads = p.int("reads") as usize;
    let runs = p.int("runs").max(1) as usize;
    let every = p.int("latency_every").max(1) as usize;
    let hot_touch = p.int("hot_touch_pct").min(100);
    let dir = p.text("dir");
    let seed = p.int("seed");
    let pages = len / PAGE;
    let hot_pages = (pages * p.int("hot_pct").min(100) as usize / 100).max(1);
    if budget < PAGE || len == 0 || reads == 0 || hot_pages >= pages {
        return Err(
            "outofcore: need file_mib ≥ 1, budget_mib ≥ 1, reads ≥ 1 and a hot part smaller than the file".into()
        );
    }
    let (hot_pct, usermm_rdwr) = (p.int("hot_pct"), p.int("usermm_rdwr") != 0);
    Ok(Opts { len, budget, reads, runs, every, hot_touch, hot_pct, dir, seed, pages, hot_pages, usermm_rdwr })
}

/// The workloads of `wanted`, in `WORKLOADS`' order: (name, offsets, the
/// checksum their reads must give).
fn workloads(o: &Opts, wanted: &[&str]) -> Vec<(&'static str, Vec<usize>, u64)> {
    WORKLOADS
        .iter()
        .filter(|w| wanted.contains(w))
        .map(|w| {
            let offs = offsets(w, o.pages, o.reads, o.hot_pages, o.hot_touch, o.seed);
            let want = offs.iter().fold(0u64, |a, &off| a.wrapping_add(word((off / 8) as u64, o.seed)));
            (*w, offs, want)
        })
        .collect()
}

/// What the runs leave for the goals and the notes.
#[derive(Default)]
struct Totals {
    errors: Vec<String>,
    usermm_peak_max: f64,
    writebacks: u64,
    memcg_peak_max: f64,
    memcg_oom_kills: u32,
}

/// All runs: every system (`order(r)`) runs every workload; a failing
/// `kernel-memcg` child turns `limit` into the error and is not run again.
fn measure(
    o: &Opts,
    setup: &Setup,
    work: &[(&str, Vec<usize>, u64)],
    limit: &mut Result<KernelLimit, String>,
    e: &mut Experiment,
    prog: &Progress,
) -> Result<Totals, String> {
    let mut t = Totals::default();
    for r in 0..o.runs {
        for sys in order(r) {
            if sys == MEMCG && limit.is_err() {
                continue;
            }
            prog.say(&format!("{sys} run {}/{}", r + 1, o.runs));
            for (w, offs, want) in work {
                let m = match sys {
                    "usermm" => run_usermm(setup, w, offs, 0)?,
                    IN_THREAD => run_usermm(setup, w, offs, ::usermm::consts::UMM_F_INTHREAD_FAULTS)?,
                    "kernel-mmap" => run_kernel(setup, w, offs)?,
                    MEMCG => {
                        let Ok(l) = &*limit else { break };
                        let shape = Work {
                            workload: w,
                            pages: o.pages,
                            reads: o.reads,
                            hot_pages: o.hot_pages,
                            hot_touch: o.hot_touch,
                            seed: o.seed,
                        };
                        match run_memcg(setup, l, &shape) {
                            Ok(m) => m,
                            Err(why) => {
                                let msg = format!("{MEMCG} {w} run {}: {why}", r + 1);
                                prog.say(&format!("ERROR: {msg}"));
                                t.errors.push(msg.clone());
                                *limit = Err(msg);
                                break;
                            }
                        }
                    }
                    _ => run_pread(setup, w, offs)?,
                };
                if m.out.sum != *want {
                    let msg = format!("{sys} {w} run {}: checksum {:#x}, expected {want:#x}", r + 1, m.out.sum);
                    prog.say(&format!("ERROR: {msg}"));
                    t.errors.push(msg);
                }
                record(e, &mut t, sys, w, offs.len(), m);
            }
        }
    }
    Ok(t)
}

/// Adds one (system, workload) run's numbers to the experiment and `t`.
fn record(e: &mut Experiment, t: &mut Totals, sys: &str, w: &str, reads: usize, m: Measured) {
    let mut lat = m.out.lat;
    let (p50, p99) = m.pct.unwrap_or_else(|| {
        let (p50, p99, _) = p50_p99_max(&mut lat);
        (p50, p99)
    });
    e.add(sys, w, "throughput", "reads/s", reads as f64 / (m.out.ns as f64 / 1e9));
    e.add(sys, w, "p50", "ns", p50);
    e.add(sys, w, "p99", "ns", p99);
    e.add(sys, w, "resident_peak", "MiB", m.peak / MIB as f64);
    let miss = match sys {
        "usermm" | IN_THREAD => "faults",
        "kernel-mmap" | MEMCG => "major_faults",
        _ => "misses",
    };
    e.add(sys, w, miss, "count", m.misses as f64);
    e.add(sys, w, &format!("{miss}_per_1k_reads"), "count", m.misses as f64 * 1000.0 / reads as f64);
    if let Some(pr) = m.pages_read {
        e.add(sys, w, "pages_read", "pages", pr as f64);
        e.add(sys, w, "pages_read_per_1k_reads", "pages", pr as f64 * 1000.0 / reads as f64);
    }
    if sys == MEMCG {
        t.memcg_peak_max = t.memcg_peak_max.max(m.peak);
        t.memcg_oom_kills += m.oom_kills;
    }
    if sys == "usermm" || sys == IN_THREAD {
        e.add(sys, w, "writebacks", "pages", m.writebacks as f64);
        t.usermm_peak_max = t.usermm_peak_max.max(m.peak);
        t.writebacks += m.writebacks;
    }
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let o = opts(p)?;
    let mut e = Experiment::new("outofcore", "a file 4× the budget: random, hot/cold and sequential reads", p.pairs());
    prog.say(&format!("creating a {} MiB file in {}", o.len / MIB, o.dir));
    let t = now_ns();
    let file = TestFile::create(&o.dir, o.len, o.seed)?;
    prog.say(&format!("file written in {:.1} s", (now_ns() - t) as f64 / 1e9));
    let wanted = p.text("workloads");
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
    if let Some(w) = wanted.iter().find(|w| !WORKLOADS.contains(w)) {
        return Err(format!("outofcore: unknown workload {w:?} (known: {})", WORKLOADS.join(", ")));
    }
    let work = workloads(&o, &wanted);
    let setup = Setup { file: &file, len: o.len, budget: o.budget, every: o.every, usermm_rdwr: o.usermm_rdwr };
    // The kernel under the same limit: a fresh memory group per child (one
    // child per workload and run); no swap file (usermm's space has none).
    let mut limit = KernelLimit::setup(o.budget, 0, &o.dir);
    if let Err(why) = &limit {
        prog.say(&format!("{MEMCG}: not measured: {why}"));
    }
    let totals = measure(&o, &setup, &work, &mut limit, &mut e, prog)?;
    drop(file);
    let memcg_note = report::memcg_note(&limit, o.budget, totals.memcg_peak_max, totals.memcg_oom_kills);
    let base = if limit.is_ok() { MEMCG } else { "(kernel-memcg not measured)" };
    drop(limit);
    report::goals(&mut e, &wanted, base, o.budget, totals.usermm_peak_max);
    report::notes(&mut e, &o, memcg_note, totals);
    Ok(e)
}
