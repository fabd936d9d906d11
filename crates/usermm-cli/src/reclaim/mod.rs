//! `reclaim`: a working set 4× usermm's budget.
//!
//! Phases, on one fresh region per run and system:
//! 1. `seq-write`: write every page in order (usermm must swap out);
//! 2. `seq-read`: read-verify every page in order (usermm must swap in);
//! 3. `hotcold`: random touches (read-verify), `hot_touch_pct`% on a hot set
//!    of `hot_pct_of_budget`% of the budget, the rest on the cold remainder;
//!    afterwards, the fraction of the hot set still resident (`mincore`);
//! 4. `uniform`: as many random touches, uniform over the working set;
//! 5. `zipfian`: as many touches drawn from a zipfian distribution
//!    (θ = 0.99, as YCSB), scrambled over the working set;
//! 6. `scan`: one pass over the whole working set (4× the budget) with a
//!    touch of the hot set after every page scanned (scan resistance);
//! 7. `fits`: 90% of the budget touched at random (4 touches a page) after
//!    one untimed warm-up pass: nothing should be evicted (its `evictions`).
//!
//! Systems, alternated run by run:
//! - `usermm`: a space with the budget and a swap file of `set + budget`
//!   in `swap_dir`;
//! - `kernel-memcg`: the kernel under the same limit (`BENCHMARKS.md`, "Same
//!   limit"; `memcg.rs`): a child process (`usermm __kernel-memcg-child
//!   reclaim …`) in a memory cgroup limited to the budget, with a swap file
//!   of the same size in `swap_dir`, running the same phases on anonymous
//!   memory. The goals compare usermm with this row;
//! - `kernel (no limit, upper bound)`: the same phases on plain anonymous
//!   memory in this process, with no limit: the whole working set stays in
//!   RAM. It shows the cost of the touches themselves; no goal uses it.
//!
//! The `disk` row is the swap directory's own sequential `O_DIRECT` write
//! bandwidth, measured in the same run; usermm's swap-out throughput is
//! compared with it.

pub mod farmem;
mod kernel;
mod table;
mod usermm;
mod workload;

use usermm_sys::host::disk_write_bandwidth;

pub use self::kernel::kernel_memcg_child;
use self::kernel::{kernel_phases, parse_child};
use self::usermm::usermm_run;
use self::workload::Phase;
use crate::common::{default_swap_dir, Progress, MIB, PAGE};
use crate::memcg::KernelLimit;
use crate::params::{Kind, Params};
use crate::report::Experiment;

pub fn params(full: bool) -> Params {
    Params::default()
        .def("budget_mib", Kind::Int, if full { 1024 } else { 64 }, "usermm's resident budget (MiB)")
        .def("set_mib", Kind::Int, if full { 4096 } else { 256 }, "working set (MiB)")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (each takes seconds)")
        .def("hot_pct_of_budget", Kind::Int, 10, "hot set size, % of the budget")
        .def("hot_touch_pct", Kind::Int, 90, "% of hot/cold touches that go to the hot set")
        .def("mix_touches_per_page", Kind::Int, 2, "hot/cold touches = this × pages of the working set")
        .def("disk_mib", Kind::Int, 256, "bytes written to measure the disk's O_DIRECT bandwidth (MiB)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of usermm's swap file and of the disk measurement")
        .def("seed", Kind::Int, 7, "PRNG seed of the hot/cold touch sequence")
}

const PHASES: [&str; 7] = ["seq-write", "seq-read", "hotcold", "uniform", "zipfian", "scan", "fits"];
const MEMCG: &str = "kernel-memcg";
const NOLIMIT: &str = "kernel (no limit, upper bound)";

/// What one run of one system measured.
struct Measured {
    phases: Vec<Phase>,
    /// (hot hit rate, wrong reads in the probe).
    hit: (f64, usize),
    hot_resident: usize,
}

/// The touches' shape, shared by every system (and passed to the child).
#[derive(Clone, Copy)]
struct Shape {
    set: usize,
    budget_pages: usize,
    hot_pages: usize,
    hot_pct: u64,
    mix: usize,
    seed: u64,
}

impl Shape {
    fn args(&self) -> Vec<String> {
        [self.set as u64, self.budget_pages as u64, self.hot_pages as u64, self.hot_pct, self.mix as u64, self.seed]
            .iter()
            .map(u64::to_string)
            .collect()
    }
    fn from_args(a: &[String]) -> Result<Shape, String> {
        let n = |i: usize| -> Result<u64, String> {
            a.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {a:?} is no number"))
        };
        Ok(Shape {
            set: n(0)? as usize,
            budget_pages: n(1)? as usize,
            hot_pages: n(2)? as usize,
            hot_pct: n(3)?,
            mix: n(4)? as usize,
            seed: n(5)?,
        })
    }
}

/// The systems of run `r`: usermm and kernel-memcg swap places every run
/// (A B, B A, …); the unlimited kernel goes last.
fn order(r: usize) -> [&'static str; 3] {
    if r.is_multiple_of(2) {
        ["usermm", MEMCG, NOLIMIT]
    } else {
        [MEMCG, "usermm", NOLIMIT]
    }
}

/// The parameters of one `reclaim` experiment, checked.
struct Opts {
    budget: usize,
    set: usize,
    runs: usize,
    hot_pages: usize,
    hot_pct: u64,
    hot_pct_of_budget: u64,
    mix: usize,
    disk: u64,
    dir: String,
    swap_bytes: usize,
    sh: Shape,
}

fn opts(p: &Params) -> Result<Opts, String> {
    let budget = p.int("budget_mib") as usize * MIB;
    let set = p.int("set_mib") as usize * MIB;
    let runs = p.int("runs").max(1) as usize;
    let hot_pages = (budget / PAGE * p.int("hot_pct_of_budget") as usize / 100).max(1);
    let hot_pct = p.int("hot_touch_pct").min(100);
    let pages = set / PAGE;
    let mix = pages * p.int("mix_touches_per_page") as usize;
    let disk = p.int("disk_mib") * MIB as u64;
    let dir = p.text("swap_dir");
    let seed = p.int("seed");
    if budget < PAGE || pages <= hot_pages {
        return Err("reclaim: need budget_mib ≥ 1 and a working set larger than the hot set".into());
    }
    let sh = Shape { set, budget_pages: budget / PAGE, hot_pages, hot_pct, mix, seed };
    let hot_pct_of_budget = p.int("hot_pct_of_budget");
    Ok(Opts { budget, set, runs, hot_pages, hot_pct, hot_pct_of_budget, mix, disk, dir, swap_bytes: set + budget, sh })
}

/// What the runs leave for the notes.
#[derive(Default)]
struct Totals {
    errors: Vec<String>,
    /// Whether usermm's swap file uses O_DIRECT (`None`: no usermm run).
    direct_io: Option<bool>,
    /// The kernel-memcg group's (peak charge, limit hits) per run.
    peaks: Vec<(u64, u64)>,
    /// kernel-memcg children the OOM killer killed (each run again).
    oom_kills: u32,
}

/// One run of `kernel-memcg`: `None` when the child failed (then `limit`
/// holds why, and the system is not run again). A child the OOM killer
/// killed every try is a result, not an error: the kernel could not run
/// the workload under the limit (row `all`/`oom_killed_children` in `e`).
fn memcg_run(
    sh: Shape,
    limit: &mut Result<KernelLimit, String>,
    t: &mut Totals,
    r: usize,
    prog: &Progress,
    e: &mut Experiment,
) -> Option<Measured> {
    let Ok(l) = &*limit else { return None };
    let mut args = vec!["reclaim".to_string()];
    args.extend(sh.args());
    match l.run_child(&args).and_then(|c| parse_child(&c.stdout).map(|m| (m, c))) {
        Ok((m, c)) => {
            t.peaks.push((c.peak_charge_bytes, c.failcnt));
            if c.oom_kills > 0 {
                prog.say(&format!("{MEMCG} run {}: the OOM killer killed {} child(ren) first", r + 1, c.oom_kills));
            }
            t.oom_kills += c.oom_kills;
            Some(m)
        }
        Err(why) if why.starts_with(crate::memcg::OOM_FAILURE) => {
            let msg = format!("{MEMCG} run {}: {why}", r + 1);
            prog.say(&format!("{msg}: not measured"));
            e.add(MEMCG, "all", "oom_killed_children", "children", crate::memcg::OOM_TRIES as f64);
            *limit = Err(format!("{msg}; the kernel could not run this workload under the limit"));
            None
        }
        Err(why) => {
            let msg = format!("{MEMCG} run {}: {why}", r + 1);
            prog.say(&format!("ERROR: {msg}"));
            t.errors.push(msg.clone());
            *limit = Err(msg);
            None
        }
    }
}

/// All runs: every system in `order(r)`, then the disk's bandwidth.
fn measure(
    o: &Opts,
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
            let measured = match sys {
                "usermm" => usermm_run(o.sh, o.budget, &o.dir, &mut t.direct_io)?,
                NOLIMIT => kernel_phases(o.sh, &|| (0, 0, 0, 0, 0), &|| 0)?,
                _ => match memcg_run(o.sh, limit, &mut t, r, prog, e) {
                    Some(m) => m,
                    None => continue,
                },
            };
            add_rows(e, sys, &measured, o.hot_pages, &mut t.errors, prog);
        }
        prog.say(&format!("disk bandwidth run {}/{}", r + 1, o.runs));
        let dir = &o.dir;
        let d = disk_write_bandwidth(dir, o.disk, MIB).map_err(|e| format!("disk bandwidth in {dir}: {e:?}"))?;
        let variant = if d.direct { "o_direct-seq-write" } else { "buffered-seq-write+fsync" };
        e.add("disk", variant, "bandwidth", "MiB/s", d.bytes as f64 / MIB as f64 / (d.ns as f64 / 1e9));
    }
    Ok(t)
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let o = opts(p)?;
    let mut e = Experiment::new("reclaim", "working set 4× the budget: LRU reclaim and swap", p.pairs());
    // The kernel under the same limit: set up once (the swap file), a fresh
    // memory group per run; torn down when `limit` drops (or on a signal).
    prog.say(&format!(
        "{MEMCG}: setting up a {} MiB swap file in {}, {} MiB memory groups",
        o.swap_bytes / MIB,
        o.dir,
        o.budget / MIB
    ));
    let mut limit = match KernelLimit::setup(o.budget, o.swap_bytes, &o.dir) {
        Ok(l) => Ok(l),
        Err(why) => {
            prog.say(&format!("{MEMCG}: not measured: {why}"));
            Err(why)
        }
    };
    let t = measure(&o, &mut limit, &mut e, prog)?;
    let memcg_note = table::memcg_note(&limit, &o, &t.peaks, t.oom_kills);
    let measured = limit.is_ok();
    drop(limit);
    table::summary_table(&mut e);
    table::goals(&mut e, measured);
    table::notes(&mut e, &o, memcg_note, t);
    Ok(e)
}

fn add_rows(e: &mut Experiment, sys: &str, m: &Measured, hot_pages: usize, errors: &mut Vec<String>, prog: &Progress) {
    for (name, ph) in PHASES.iter().zip(&m.phases) {
        if ph.errors > 0 {
            let msg = format!("{sys} {name}: {} touches read back wrong data", ph.errors);
            prog.say(&format!("ERROR: {msg}"));
            errors.push(msg);
        }
        let unit = if matches!(*name, "seq-write" | "seq-read") { "pages/s" } else { "touches/s" };
        e.add(sys, name, "throughput", unit, ph.touches as f64 / (ph.ns as f64 / 1e9));
        let per_1k = |n: u64| n as f64 * 1000.0 / ph.touches.max(1) as f64;
        let (outs, ins) = match sys {
            "usermm" => ("swapouts", "swapins"),
            MEMCG => ("pswpout", "pswpin"),
            _ => continue,
        };
        e.add(sys, name, outs, "pages", ph.swapouts as f64);
        e.add(sys, name, ins, "pages", ph.swapins as f64);
        e.add(sys, name, "major_faults", "faults", ph.major_faults as f64);
        e.add(sys, name, "evictions", "pages", ph.evictions as f64);
        e.add(sys, name, "page_reads_per_1k_touches", "pages", per_1k(ph.swapins));
        e.add(sys, name, "page_writes_per_1k_touches", "pages", per_1k(ph.swapouts));
        e.add(sys, name, "major_faults_per_1k_touches", "faults", per_1k(ph.major_faults));
        if sys == "usermm" {
            e.add(sys, name, "parked_faults_per_1k_touches", "faults", per_1k(ph.parked_faults));
        }
    }
    let w = &m.phases[0];
    if sys == "usermm" {
        let mib_s = (w.swapouts as f64 * PAGE as f64 / MIB as f64) / (w.ns as f64 / 1e9);
        e.add(sys, "seq-write", "swapout_throughput", "MiB/s", mib_s);
    }
    e.add(sys, "hotcold", "hot_resident", "fraction", m.hot_resident as f64 / hot_pages as f64);
    e.add(sys, "hotcold", "hot_hit_rate", "fraction", m.hit.0);
    if m.hit.1 > 0 {
        let msg = format!("{sys} hot-hit probe: {} touches read back wrong data", m.hit.1);
        prog.say(&format!("ERROR: {msg}"));
        errors.push(msg);
    }
}
