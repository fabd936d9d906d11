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
//!    one untimed warm-up pass: nothing should be evicted (its swap-outs).
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

use usermm::Space;
use usermm_sys::host::{disk_write_bandwidth, process_faults, resident_pages, HostMap};
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, read8, tag, write8, Progress, Rng, MIB, PAGE};
use crate::memcg::{self, KernelLimit};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Goal, Table};

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

struct Phase {
    ns: u64,
    touches: usize,
    errors: usize,
    swapouts: u64,
    swapins: u64,
    major_faults: u64,
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating
/// billion-record synthetic databases"), θ < 1, over `0..n`, scrambled by a
/// multiplicative permutation so that the popular items are spread over the
/// range instead of packed at its start (YCSB's "scrambled zipfian").
struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    mult: u64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2.min(n));
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        // An odd multiplier coprime with n permutes 0..n.
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        let mut mult = (0x9E37_79B9 % n.max(2)) | 1;
        while gcd(mult, n) != 1 {
            mult += 2;
        }
        Zipf { n, theta, alpha, zetan, eta, mult }
    }
    fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.next() as f64 / u64::MAX as f64;
        let uz = u * self.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            ((self.n as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        (rank.min(self.n - 1) as u128 * self.mult as u128 % self.n as u128) as u64
    }
}

/// Runs the phases on `buf` (in [`PHASES`] order); `stats` gives
/// (swapouts, swapins, major faults) so far; `after_hotcold` runs right
/// after the hot/cold phase (the hot set's probes).
fn phases(
    buf: &mut [u8],
    stats: &dyn Fn() -> (u64, u64, u64),
    sh: Shape,
    after_hotcold: &mut dyn FnMut(&mut [u8]),
) -> Vec<Phase> {
    let pages = buf.len() / PAGE;
    let (hot_pages, hot_pct, mix) = (sh.hot_pages, sh.hot_pct, sh.mix);
    let phase = |buf: &mut [u8], f: &mut dyn FnMut(&mut [u8]) -> (usize, usize)| {
        let (o0, i0, f0) = stats();
        let t0 = now_ns();
        let (touches, errors) = f(buf);
        let ns = now_ns() - t0;
        let (o1, i1, f1) = stats();
        Phase { ns, touches, errors, swapouts: o1 - o0, swapins: i1 - i0, major_faults: f1 - f0 }
    };
    let read = |buf: &[u8], p: usize| (read8(buf, p * PAGE) != tag(p)) as usize;
    let mut out = Vec::new();
    out.push(phase(buf, &mut |buf| {
        for p in 0..pages {
            write8(buf, p * PAGE, tag(p));
        }
        (pages, 0)
    }));
    out.push(phase(buf, &mut |buf| ((pages), (0..pages).map(|p| read(buf, p)).sum())));
    let mut rng = Rng::new(sh.seed);
    let cold = (pages - hot_pages).max(1) as u64;
    out.push(phase(buf, &mut |buf| {
        let mut bad = 0;
        for _ in 0..mix {
            let p = if rng.below(100) < hot_pct {
                rng.below(hot_pages as u64) as usize
            } else {
                hot_pages + rng.below(cold) as usize
            };
            bad += read(buf, p);
        }
        (mix, bad)
    }));
    after_hotcold(buf);
    // Uniform random touches over the whole working set.
    out.push(phase(buf, &mut |buf| ((mix), (0..mix).map(|_| read(buf, rng.below(pages as u64) as usize)).sum())));
    // Zipfian (θ = 0.99, as YCSB), scrambled over the working set.
    let z = Zipf::new(pages as u64, 0.99);
    out.push(phase(buf, &mut |buf| ((mix), (0..mix).map(|_| read(buf, z.next(&mut rng) as usize)).sum())));
    // Scan resistance: one pass over the whole working set (4× the budget)
    // while the hot set keeps being touched, one hot touch per page
    // scanned.
    out.push(phase(buf, &mut |buf| {
        let mut bad = 0;
        for p in 0..pages {
            bad += read(buf, p);
            bad += read(buf, rng.below(hot_pages as u64) as usize);
        }
        (2 * pages, bad)
    }));
    // Fits: 90% of the budget touched at random, after one warm-up pass
    // (untimed): nothing should be evicted.
    let fits = (sh.budget_pages * 9 / 10).clamp(1, pages);
    for p in 0..fits {
        read(buf, p);
    }
    out.push(phase(buf, &mut |buf| {
        let n = 4 * fits;
        ((n), (0..n).map(|_| read(buf, rng.below(fits as u64) as usize)).sum())
    }));
    out
}

/// The hot set's hit rate: another `mix` hot/cold touches (continuing the
/// same sequence), untimed, each hot touch bracketed by `swapins()`: the
/// fraction of hot touches that caused no swap-in.
fn hot_hit_rate(
    buf: &[u8],
    swapins: &dyn Fn() -> u64,
    hot_pages: usize,
    hot_pct: u64,
    mix: usize,
    seed: u64,
) -> (f64, usize) {
    let pages = buf.len() / PAGE;
    let cold = (pages - hot_pages).max(1) as u64;
    let mut rng = Rng::new(seed ^ 0x5EED);
    let (mut hot, mut missed, mut bad) = (0usize, 0u64, 0usize);
    for _ in 0..mix {
        if rng.below(100) < hot_pct {
            let p = rng.below(hot_pages as u64) as usize;
            let before = swapins();
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
            missed += swapins() - before;
            hot += 1;
        } else {
            let p = hot_pages + rng.below(cold) as usize;
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
        }
    }
    (1.0 - missed as f64 / hot.max(1) as f64, bad)
}

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

/// The phases on anonymous memory mapped by the kernel; `stats` as for
/// [`phases`], `majflt` the process's major faults so far.
fn kernel_phases(sh: Shape, stats: &dyn Fn() -> (u64, u64, u64), majflt: &dyn Fn() -> u64) -> Result<Measured, String> {
    let mut m = HostMap::anon(sh.set, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
    let (mut hit, mut hot_resident) = ((0.0, 0), 0);
    let mut probe = |buf: &mut [u8]| {
        hit = hot_hit_rate(buf, majflt, sh.hot_pages, sh.hot_pct, sh.mix, sh.seed);
        hot_resident = resident_pages(buf.as_ptr() as usize, sh.hot_pages * PAGE).unwrap_or(0);
    };
    let phases = phases(&mut m, stats, sh, &mut probe);
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok(Measured { phases, hit, hot_resident })
}

fn majflt() -> u64 {
    process_faults().map_or(0, |f| f.1)
}

/// `usermm __kernel-memcg-child reclaim SET HOT_PAGES HOT_PCT MIX SEED`: runs
/// in a memory cgroup (the parent put it there before sending the go byte)
/// and prints what it measured, one line per phase (see [`parse_child`]).
/// Swap traffic is `/proc/vmstat`'s pswpout/pswpin, read around each phase.
pub fn kernel_memcg_child(args: &[String]) -> Result<(), String> {
    let sh = Shape::from_args(args)?;
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let stats = || {
        let (o, i) = memcg::vmstat_swap();
        (o, i, majflt())
    };
    let m = kernel_phases(sh, &stats, &majflt)?;
    for (name, ph) in PHASES.iter().zip(&m.phases) {
        println!(
            "phase {name} {} {} {} {} {} {}",
            ph.ns, ph.touches, ph.errors, ph.swapouts, ph.swapins, ph.major_faults
        );
    }
    println!("hit {} {}", m.hit.0, m.hit.1);
    println!("hot_resident {}", m.hot_resident);
    Ok(())
}

/// Reads the child's lines back.
fn parse_child(out: &str) -> Result<Measured, String> {
    let bad = || format!("unexpected output of the kernel-memcg child:\n{out}");
    let mut phases: Vec<Phase> = Vec::new();
    let (mut hit, mut hot_resident) = (None, None);
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.first().copied() {
            Some("phase") if w.len() == 8 && w[1] == PHASES[phases.len().min(PHASES.len() - 1)] => {
                let n: Vec<u64> = w[2..].iter().map(|x| x.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
                phases.push(Phase {
                    ns: n[0],
                    touches: n[1] as usize,
                    errors: n[2] as usize,
                    swapouts: n[3],
                    swapins: n[4],
                    major_faults: n[5],
                });
            }
            Some("hit") if w.len() == 3 => {
                hit = Some((w[1].parse().map_err(|_| bad())?, w[2].parse().map_err(|_| bad())?));
            }
            Some("hot_resident") if w.len() == 2 => hot_resident = Some(w[1].parse().map_err(|_| bad())?),
            _ => {}
        }
    }
    if phases.len() != PHASES.len() {
        return Err(bad());
    }
    Ok(Measured { phases, hit: hit.ok_or_else(bad)?, hot_resident: hot_resident.ok_or_else(bad)? })
}

fn usermm_run(sh: Shape, budget: usize, dir: &str, direct_io: &mut Option<bool>) -> Result<Measured, String> {
    let cfg = config(budget, sh.set + budget, Some(dir));
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    *direct_io = Some(space.stats().swap_direct_io == 1);
    let mut m = space.map_anon(sh.set).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let st = || {
        let s = space.stats();
        (s.swapouts, s.swapins, s.major_faults)
    };
    let (mut hit, mut hot_resident, mut probe_err) = ((0.0, 0), 0, None);
    let mut probe = |buf: &mut [u8]| {
        hit = hot_hit_rate(buf, &|| space.stats().swapins, sh.hot_pages, sh.hot_pct, sh.mix, sh.seed);
        let mut inc = vec![0u8; sh.hot_pages];
        match space.mincore(buf.as_ptr() as usize, sh.hot_pages * PAGE, &mut inc) {
            Ok(()) => hot_resident = inc.iter().filter(|b| *b & 1 == 1).count(),
            Err(e) => probe_err = Some(format!("usermm mincore: {e:?}")),
        }
    };
    let phases = phases(&mut m, &st, sh, &mut probe);
    if let Some(e) = probe_err {
        return Err(e);
    }
    m.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Measured { phases, hit, hot_resident })
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

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
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
    let mut e = Experiment::new("reclaim", "working set 4× the budget: LRU reclaim and swap", p.pairs());
    let mut errors = Vec::new();
    let mut direct_io = None;
    // The kernel under the same limit: set up once (the swap file), a fresh
    // memory group per run; torn down when `limit` drops (or on a signal).
    let swap_bytes = set + budget;
    prog.say(&format!(
        "{MEMCG}: setting up a {} MiB swap file in {dir}, {} MiB memory groups",
        swap_bytes / MIB,
        budget / MIB
    ));
    let mut limit = match KernelLimit::setup(budget, swap_bytes, &dir) {
        Ok(l) => Ok(l),
        Err(why) => {
            prog.say(&format!("{MEMCG}: not measured: {why}"));
            Err(why)
        }
    };
    let mut peaks = Vec::new();
    for r in 0..runs {
        for sys in order(r) {
            if sys == MEMCG && limit.is_err() {
                continue;
            }
            prog.say(&format!("{sys} run {}/{runs}", r + 1));
            let measured = match sys {
                "usermm" => usermm_run(sh, budget, &dir, &mut direct_io)?,
                NOLIMIT => kernel_phases(sh, &|| (0, 0, 0), &|| 0)?,
                _ => {
                    let Ok(l) = &limit else { continue };
                    let mut args = vec!["reclaim".to_string()];
                    args.extend(sh.args());
                    match l.run_child(&args).and_then(|c| parse_child(&c.stdout).map(|m| (m, c))) {
                        Ok((m, c)) => {
                            peaks.push((c.peak_charge_bytes, c.failcnt));
                            m
                        }
                        Err(why) => {
                            let msg = format!("{MEMCG} run {}: {why}", r + 1);
                            prog.say(&format!("ERROR: {msg}"));
                            errors.push(msg.clone());
                            limit = Err(msg);
                            continue;
                        }
                    }
                }
            };
            add_rows(&mut e, sys, &measured, hot_pages, &mut errors, prog);
        }
        prog.say(&format!("disk bandwidth run {}/{runs}", r + 1));
        let d = disk_write_bandwidth(&dir, disk, MIB).map_err(|e| format!("disk bandwidth in {dir}: {e:?}"))?;
        let variant = if d.direct { "o_direct-seq-write" } else { "buffered-seq-write+fsync" };
        e.add("disk", variant, "bandwidth", "MiB/s", d.bytes as f64 / MIB as f64 / (d.ns as f64 / 1e9));
    }
    let memcg_note = match &limit {
        Ok(l) => format!(
            "**{MEMCG}**: a child process (`usermm {} reclaim …`, the same phases, touches and checks on anonymous \
             memory) in a cgroup v1 memory group `{}<pid>-<n>` with `memory.limit_in_bytes` = the budget ({} MiB; \
             swap use not limited), put into the group (`cgroup.procs`) before it maps anything; swap: a {} MiB file \
             `{}` (fallocate, mkswap, swapon) on the swap directory's file system. Both made by the benchmark and \
             removed after it (and on error, SIGINT, SIGTERM). The group's peak charge per run: {} MiB (limit hits: {}). \
             Its swap-outs/swap-ins are `pswpout`/`pswpin` of `/proc/vmstat` (machine-wide: swap traffic of \
             other processes in the same moments would be counted too; the machine has no other swap), its major \
             faults the child's `ru_majflt` (a major fault may read up to 8 pages: `vm.page-cluster` = 3). Its \
             `hot_hit_rate` counts major faults during hot touches (usermm's counts swap-ins). \
             The kernel reclaims with MGLRU here.",
            memcg::CHILD_CMD,
            memcg::CGROUP_PREFIX,
            budget / MIB,
            swap_bytes / MIB,
            l.swap_path().map_or("?".into(), |p| p.display().to_string()),
            peaks.iter().map(|(b, _)| fmt_num(*b as f64 / MIB as f64)).collect::<Vec<_>>().join(", "),
            peaks.iter().map(|(_, f)| f.to_string()).collect::<Vec<_>>().join(", "),
        ),
        Err(why) => format!("**{MEMCG} not measured**: {why}. Its goals read \"not measured\"."),
    };
    let measured = limit.is_ok();
    drop(limit);
    summary_table(&mut e);
    goals(&mut e, measured);
    e.notes.push(format!(
        "Working set {} MiB, usermm budget {} MiB (swap file of {} MiB in `{dir}`, O_DIRECT: {}). Hot set: {} pages ({}% \
         of the budget) taking {}% of {} hot/cold touches; `hot_resident` is the fraction of the hot set `mincore` \
         reports resident right after the hot/cold phase; `hot_hit_rate` is 1 − (page reads during hot \
         touches)/(hot touches), measured over a second, untimed run of {} hot/cold touches in which every hot touch \
         is bracketed by the counters. Every touch is one 8-byte access; reads are verified against what the write \
         phase stored. usermm's swap-outs/swap-ins (pages) and major faults are deltas of `Space::stats()` over each \
         phase; `page_reads_per_1k_touches` and `page_writes_per_1k_touches` are swap-ins and swap-outs (usermm) or \
         pswpin and pswpout (kernel-memcg) per 1,000 touches of the phase; `swapout_throughput` = pages swapped out \
         during seq-write × 4 KiB / duration of seq-write. Systems run in the order usermm, {MEMCG}, then \
         {MEMCG}, usermm on the next run, and so on; the unlimited kernel last.",
        set / MIB,
        budget / MIB,
        swap_bytes / MIB,
        direct_io.map_or("?".into(), |d| d.to_string()),
        hot_pages,
        p.int("hot_pct_of_budget"),
        hot_pct,
        mix,
        mix,
    ));
    e.notes.push(memcg_note);
    e.notes.push(format!(
        "**`{NOLIMIT}`**: the same phases on plain anonymous memory in the benchmark's own process, with no limit: \
         the kernel keeps the whole working set in RAM (no reclaim, no swap). It shows the cost of the touches \
         themselves; no goal uses it (its `hot_hit_rate` is 1 by construction)."
    ));
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
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
        e.add(sys, name, "page_reads_per_1k_touches", "pages", per_1k(ph.swapins));
        e.add(sys, name, "page_writes_per_1k_touches", "pages", per_1k(ph.swapouts));
        e.add(sys, name, "major_faults_per_1k_touches", "faults", per_1k(ph.major_faults));
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

/// Per phase, the medians side by side: throughput and page traffic per
/// 1,000 touches of every system.
fn summary_table(e: &mut Experiment) {
    let mut rows = Vec::new();
    for ph in PHASES {
        for sys in ["usermm", MEMCG, NOLIMIT] {
            let cell = |metric: &str| fmt_num(e.med(sys, ph, metric));
            let thr = e.row(sys, ph, "throughput");
            let Some(thr) = thr else { continue };
            rows.push(vec![
                ph.to_string(),
                sys.to_string(),
                format!("{} [{}..{}] {}", fmt_num(thr.median()), fmt_num(thr.min()), fmt_num(thr.max()), thr.unit),
                cell("page_reads_per_1k_touches"),
                cell("page_writes_per_1k_touches"),
                cell("major_faults_per_1k_touches"),
            ]);
        }
    }
    e.tables.push(Table {
        title: format!(
            "per phase (medians; page reads/writes: usermm swap-ins/-outs, {MEMCG} pswpin/pswpout; n/a: no swap)"
        ),
        head: [
            "phase",
            "system",
            "throughput [min..max]",
            "page reads/1k touches",
            "page writes/1k",
            "major faults/1k",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
}

/// The goals, every one against `kernel-memcg` (`measured`: it could be
/// set up and every run of it succeeded; otherwise they read "not measured").
fn goals(e: &mut Experiment, measured: bool) {
    let disk_bw = e.rows.iter().find(|r| r.system == "disk").map_or(f64::NAN, |r| r.median());
    e.goals.push(Goal {
        what: "swap-out throughput vs the disk".into(),
        how: "usermm seq-write swapout_throughput / disk bandwidth".into(),
        value: e.med("usermm", "seq-write", "swapout_throughput") / disk_bw,
        unit: "×".into(),
        at_least: true,
        threshold: 0.5,
        goal: 0.5,
    });
    let base = if measured { MEMCG } else { "(kernel-memcg not measured)" };
    e.ratio_goal_vs(
        base,
        "sequential write throughput vs the kernel under the same limit",
        "seq-write",
        "throughput",
        true,
        1.0,
        1.0,
    );
    e.ratio_goal_vs(
        base,
        "sequential read throughput vs the kernel under the same limit",
        "seq-read",
        "throughput",
        true,
        1.0,
        1.0,
    );
    e.ratio_goal_vs(
        base,
        "hot/cold throughput vs the kernel under the same limit",
        "hotcold",
        "throughput",
        true,
        0.8,
        1.0,
    );
    e.ratio_goal_vs(
        base,
        "hot/cold page reads per 1,000 touches vs the kernel under the same limit",
        "hotcold",
        "page_reads_per_1k_touches",
        false,
        1.1,
        1.1,
    );
    e.ratio_goal_vs(
        base,
        "uniform random throughput vs the kernel under the same limit",
        "uniform",
        "throughput",
        true,
        0.8,
        1.0,
    );
    e.ratio_goal_vs(
        base,
        "uniform random page reads per 1,000 touches vs the kernel under the same limit",
        "uniform",
        "page_reads_per_1k_touches",
        false,
        1.1,
        1.1,
    );
    e.ratio_goal_vs(
        base,
        "zipfian throughput vs the kernel under the same limit",
        "zipfian",
        "throughput",
        true,
        1.2,
        1.5,
    );
    e.ratio_goal_vs(
        base,
        "scan resistance (a scan of 4× the budget beside a hot set) throughput vs the kernel under the same limit",
        "scan",
        "throughput",
        true,
        1.2,
        1.5,
    );
    e.goals.push(Goal {
        what: "fits: page writes while a working set of 90% of the budget is touched (after warm-up)".into(),
        how: "usermm fits swapouts (median)".into(),
        value: e.med("usermm", "fits", "swapouts"),
        unit: "pages".into(),
        at_least: false,
        threshold: 0.0,
        goal: 0.0,
    });
}
