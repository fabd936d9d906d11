//! `munmap` (seed 003): unmap a populated region while a second thread keeps
//! working, host kernel vs usermm.
//!
//! Per run, size and system: map the region, write every page (untimed),
//! start the second thread on its own region, let it run for `settle_ms`,
//! then unmap the big region (timed). The second thread either
//! - `fault`: writes fresh pages of its own `second_mib` region one after
//!   another, timing each touch (when it reaches the end it drops its pages
//!   with `MADV_DONTNEED` and starts over; that call is not timed), or
//! - `mapunmap`: maps and unmaps `mapunmap_kib` of fresh memory in a loop,
//!   timing each pair.
//!
//! usermm runs twice: with handler threads (`usermm`) and with
//! `UMM_F_INTHREAD_FAULTS` (`usermm (in-thread)`).
//!
//! Its *stall* is the duration of an operation that overlaps the unmap
//! (started before the unmap ended and ended after it started). usermm's
//! exclusive hold is `write_lock_hold_ns_max` of a fresh space per run; it is
//! the maximum over every exclusive section of that run (the mmaps included),
//! so an upper bound on the munmap's own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use usermm::consts::{MADV_DONTNEED, MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, UMM_F_INTHREAD_FAULTS};
use usermm::Space;
use usermm_sys::host::{map_unmap_pair, HostMap};
use usermm_sys::now_ns;

use crate::common::{config, p50_p99_max, systems, tag, write8, Progress, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};
use crate::svg;

pub fn params(full: bool) -> Params {
    Params::default()
        .def(
            "sizes_mib",
            Kind::IntList,
            if full { "1024,2048,4096,8192" } else { "1024,2048,4096" },
            "sizes of the unmapped region (MiB)",
        )
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs per size and mode (each populates the region)")
        .def("modes", Kind::Text, "fault,mapunmap", "second-thread modes: fault, mapunmap")
        .def("second_mib", Kind::Int, 32, "the second thread's own region in fault mode (MiB)")
        .def("mapunmap_kib", Kind::Int, 64, "the second thread's map/unmap size in mapunmap mode (KiB)")
        .def("settle_ms", Kind::Int, 50, "second thread's run time before the unmap starts (ms)")
        .def(
            "fifo",
            Kind::Int,
            1,
            "1: also run the largest size's fault mode with every thread at SCHED_FIFO (kernel, usermm, spinner); 0: not",
        )
}

/// One run's measurements.
struct Out {
    unmap_ns: u64,
    hold_ns: Option<u64>,
    /// Durations (ns) of the second thread's operations that overlap the unmap.
    stalls: Vec<u64>,
}

/// The second thread's work, one timed operation at a time; returns
/// `(start_ns, duration_ns)` per operation.
fn second_thread(
    stop: &AtomicBool,
    started: &AtomicBool,
    mut op: impl FnMut() -> Result<u64, String>,
) -> Result<Vec<(u64, u64)>, String> {
    let mut v = Vec::with_capacity(1 << 20);
    started.store(true, Ordering::Release);
    while !stop.load(Ordering::Acquire) {
        let t = now_ns();
        let d = op()?;
        if d != u64::MAX {
            v.push((t, d));
        }
    }
    Ok(v)
}

/// Runs the second thread around `unmap`, which returns the unmap's
/// `(start, end)` timestamps.
fn around(
    settle: Duration,
    op: impl FnMut() -> Result<u64, String> + Send,
    unmap: impl FnOnce() -> Result<(u64, u64), String>,
) -> Result<(u64, Vec<u64>), String> {
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    if usermm_sys::thread::is_fifo() {
        std::thread::sleep(RT_PERIOD);
    }
    std::thread::scope(|sc| {
        let h = sc.spawn(|| second_thread(&stop, &started, op));
        while !started.load(Ordering::Acquire) && !h.is_finished() {
            std::thread::yield_now();
        }
        std::thread::sleep(settle);
        let res = unmap();
        std::thread::sleep(settle / 2);
        stop.store(true, Ordering::Release);
        let ops = h.join().map_err(|_| "second thread panicked".to_string())??;
        let (t0, t1) = res?;
        let stalls = ops.iter().filter(|&&(s, d)| s < t1 && s + d > t0).map(|&(_, d)| d).collect();
        Ok((t1 - t0, stalls))
    })
}

fn populate(buf: &mut [u8]) {
    for p in 0..buf.len() / PAGE {
        write8(buf, p * PAGE, tag(p));
    }
}

fn kernel_run(size: usize, mode: &str, p: &Params) -> Result<Out, String> {
    let settle = Duration::from_millis(p.int("settle_ms"));
    let mut big = HostMap::anon(size, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
    populate(&mut big);
    let unmap = move || {
        let t0 = now_ns();
        big.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
        Ok((t0, now_ns()))
    };
    let (unmap_ns, stalls) = if mode == "fault" {
        let second = HostMap::anon(p.int("second_mib") as usize * MIB, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
        let mut ks = KernelSecond { map: Some(second), next: 0 };
        around(settle, move || ks.op(), unmap)?
    } else {
        let len = p.int("mapunmap_kib") as usize * 1024;
        around(
            settle,
            move || {
                let t = now_ns();
                map_unmap_pair(len).map_err(|e| format!("kernel mmap/munmap pair: {e:?}"))?;
                Ok(now_ns() - t)
            },
            unmap,
        )?
    };
    Ok(Out { unmap_ns, hold_ns: None, stalls })
}

/// The kernel side's fault-mode second thread: its region, and the next
/// page to write.
struct KernelSecond {
    map: Option<HostMap>,
    next: usize,
}

impl KernelSecond {
    fn op(&mut self) -> Result<u64, String> {
        let m = self.map.as_mut().expect("present");
        if self.next == m.len() / PAGE {
            self.next = 0;
            m.madvise(MADV_DONTNEED).map_err(|e| format!("kernel madvise: {e:?}"))?;
            return Ok(u64::MAX);
        }
        let t = now_ns();
        write8(m, self.next * PAGE, tag(self.next));
        let d = now_ns() - t;
        self.next += 1;
        Ok(d)
    }
}

/// `usermm (in-thread)`: the same space with `UMM_F_INTHREAD_FAULTS` (the
/// second thread's faults resolved in that thread).
const IN_THREAD: &str = "usermm (in-thread)";

/// `spinner`: the kernel's unmap beside a second thread that only reads the
/// clock in a loop (no faults, no system calls): the gaps it sees are the
/// machine's floor under any stall (this VM stops every vCPU for 1–4 ms
/// now and then while a process frees or faults in gigabytes).
const SPINNER: &str = "spinner (kernel unmap)";

/// The same spinner beside usermm's unmap (a space with handler threads):
/// the floor under the `usermm` rows' stalls, which a sliced zap may lower.
const SPINNER_USERMM: &str = "spinner (usermm unmap)";

/// The largest size's fault mode again with every thread of the run at
/// `SCHED_FIFO` (the benchmark's thread is switched before the run; the
/// second thread, the spinner and the space's threads inherit it): no
/// `SCHED_OTHER` task preempts them, so these rows' stalls are the memory
/// manager's own, not other tasks' time slices (on this VM a `kdamond` runs
/// 2 ms every ~0.5 s and lands in most unmaps).
const FIFO_KERNEL: &str = "kernel (SCHED_FIFO)";
const FIFO_USERMM: &str = "usermm (SCHED_FIFO)";
const FIFO_SPINNER: &str = "spinner (kernel unmap, SCHED_FIFO)";
/// The lowest real-time priority: above every `SCHED_OTHER` task, below
/// the kernel's own real-time threads.
const FIFO_PRIORITY: i32 = 1;
/// Before a `SCHED_FIFO` run's timed part: one period of the kernel's
/// real-time throttling (`sched_rt_period_us`, 1 s), so that the untimed
/// populate's CPU time does not count against the unmap's period (a
/// throttled CPU would stop the run's threads for 50 ms).
const RT_PERIOD: Duration = Duration::from_millis(1000);

/// Runs `f` with the calling thread at `SCHED_FIFO` (what it creates
/// inherits it), then gives it `SCHED_OTHER` back.
fn at_fifo<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    usermm_sys::thread::set_fifo_priority(FIFO_PRIORITY)
        .map_err(|e| format!("sched_setscheduler(SCHED_FIFO): {e:?}"))?;
    let r = f();
    let _ = usermm_sys::thread::set_normal_priority();
    r
}

/// The gaps over 1 µs between two clock reads of a thread that does
/// nothing else, `(start, length)`, until `stop`.
fn spin_gaps(stop: &AtomicBool, started: &AtomicBool) -> Vec<(u64, u64)> {
    let mut v = Vec::with_capacity(1 << 16);
    started.store(true, Ordering::Release);
    let mut last = now_ns();
    while !stop.load(Ordering::Relaxed) {
        let t = now_ns();
        if t - last > 1000 {
            v.push((last, t - last));
        }
        last = t;
    }
    v
}

/// A spinner run: the kernel (`on_usermm` false) or a usermm space (true,
/// with handler threads) unmaps a populated `size` bytes; the gaps of
/// [`spin_gaps`] that overlap the unmap are its stalls.
fn spinner_run(size: usize, p: &Params, on_usermm: bool) -> Result<Out, String> {
    if on_usermm {
        let space = Space::open(&config(size + 64 * MIB, 0, None)).map_err(|e| format!("usermm open: {e:?}"))?;
        let mut big = space.map_anon(size).map_err(|e| format!("usermm mmap: {e:?}"))?;
        populate(&mut big);
        let out = spin_around(p, move || big.unmap().map_err(|e| format!("usermm munmap: {e:?}")))?;
        space.close().map_err(|e| format!("usermm close: {e:?}"))?;
        return Ok(out);
    }
    let mut big = HostMap::anon(size, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
    populate(&mut big);
    spin_around(p, move || big.unmap().map_err(|e| format!("kernel munmap: {e:?}")))
}

/// Runs `unmap` beside a thread that only reads the clock ([`spin_gaps`]).
fn spin_around(p: &Params, unmap: impl FnOnce() -> Result<(), String>) -> Result<Out, String> {
    let settle = Duration::from_millis(p.int("settle_ms"));
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    if usermm_sys::thread::is_fifo() {
        std::thread::sleep(RT_PERIOD);
    }
    let (gaps, t0, t1) = std::thread::scope(|sc| {
        let h = sc.spawn(|| spin_gaps(&stop, &started));
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(settle);
        let t0 = now_ns();
        let r = unmap();
        let t1 = now_ns();
        std::thread::sleep(settle / 2);
        stop.store(true, Ordering::Release);
        let gaps = h.join().map_err(|_| "spinner thread panicked".to_string())?;
        r.map(|_| (gaps, t0, t1))
    })?;
    let stalls = gaps.iter().filter(|&&(s, d)| s < t1 && s + d > t0).map(|&(_, d)| d).collect();
    Ok(Out { unmap_ns: t1 - t0, hold_ns: None, stalls })
}

fn usermm_run(size: usize, mode: &str, p: &Params, flags: u32) -> Result<Out, String> {
    let settle = Duration::from_millis(p.int("settle_ms"));
    let mut cfg = config(size + 64 * MIB, 0, None);
    cfg.flags |= flags;
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let mut big = space.map_anon(size).map_err(|e| format!("usermm mmap: {e:?}"))?;
    populate(&mut big);
    let unmap = move || {
        let t0 = now_ns();
        big.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
        Ok((t0, now_ns()))
    };
    let (unmap_ns, stalls) = if mode == "fault" {
        let second = space.map_anon(p.int("second_mib") as usize * MIB).map_err(|e| format!("usermm mmap: {e:?}"))?;
        let pages = second.len() / PAGE;
        let mut second = second;
        let mut next = 0usize;
        around(
            settle,
            move || {
                if next == pages {
                    next = 0;
                    second.advise(MADV_DONTNEED).map_err(|e| format!("usermm madvise: {e:?}"))?;
                    return Ok(u64::MAX);
                }
                let t = now_ns();
                write8(&mut second, next * PAGE, tag(next));
                let d = now_ns() - t;
                next += 1;
                Ok(d)
            },
            unmap,
        )?
    } else {
        let len = p.int("mapunmap_kib") as usize * 1024;
        let sp = &space;
        around(
            settle,
            move || {
                let t = now_ns();
                let a = sp
                    .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                    .map_err(|e| format!("usermm mmap (second thread): {e:?}"))?;
                sp.munmap(a, len).map_err(|e| format!("usermm munmap (second thread): {e:?}"))?;
                Ok(now_ns() - t)
            },
            unmap,
        )?
    };
    let hold = space.stats().write_lock_hold_ns_max;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Out { unmap_ns, hold_ns: Some(hold), stalls })
}

/// The variant name of a `size` MiB region with the second thread in `mode`.
fn variant(size: u64, mode: &str) -> String {
    format!("{size}MiB-{mode}")
}

/// Adds one run's numbers to the experiment.
fn record(e: &mut Experiment, sys: &str, v: &str, out: Out) {
    e.add(sys, v, "unmap_time", "ms", out.unmap_ns as f64 / 1e6);
    if let Some(h) = out.hold_ns {
        e.add(sys, v, "hold_max", "µs", h as f64 / 1e3);
    }
    let mut st: Vec<f64> = out.stalls.iter().map(|&d| d as f64 / 1e3).collect();
    let n = st.len();
    // (None over the unmap — a spinner that saw no gap over 1 µs during a
    // short one — is no stall: 0, not a NaN that reads as no row.)
    let (_, p99, max) = if n == 0 { (0.0, 0.0, 0.0) } else { p50_p99_max(&mut st) };
    e.add(sys, v, "stall_max", "µs", max);
    e.add(sys, v, "stall_p99", "µs", p99);
    e.add(sys, v, "ops_during_unmap", "ops", n as f64);
}

/// The goals: usermm's exclusive hold per size and mode, its growth with
/// size, fault stalls against the kernel's, the map/unmap loop's worst stall.
fn goals(e: &mut Experiment, sizes: &[u64], modes: &[String]) {
    let (small, large) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
    let hold_mode = if modes.iter().any(|m| m == "fault") { "fault" } else { modes[0].as_str() };
    for mode in modes {
        for &size in sizes {
            let v = variant(size, mode);
            let why = if mode == "mapunmap" { " (incl. the second thread's mmaps)" } else { "" };
            e.goals.push(Goal {
                what: format!("exclusive hold, {size} MiB, {mode}{why}"),
                how: format!("usermm hold_max, {v}"),
                value: e.med("usermm", &v, "hold_max") / 1e3,
                unit: " ms".into(),
                at_least: false,
                threshold: 1.0,
                goal: 1.0,
            });
        }
    }
    if sizes.len() > 1 {
        let (a, b) = (variant(small, hold_mode), variant(large, hold_mode));
        e.goals.push(Goal {
            what: "hold not growing with size".into(),
            how: format!("usermm hold_max {large} MiB / {small} MiB"),
            value: e.med("usermm", &b, "hold_max") / e.med("usermm", &a, "hold_max"),
            unit: "×".into(),
            at_least: false,
            threshold: 2.0,
            goal: 1.5,
        });
    }
    if modes.iter().any(|m| m == "fault") {
        for &size in sizes {
            e.ratio_goal(
                &format!("fault stall ≤ kernel's, {size} MiB"),
                &variant(size, "fault"),
                "stall_max",
                false,
                1.0,
                1.0,
            );
        }
    }
    if modes.iter().any(|m| m == "fault") {
        // The second thread's fault stall while the largest region goes:
        // p99 ≤ 50 µs and worst ≤ 0.5 ms, in both fault modes and at
        // SCHED_FIFO.
        let v = variant(large, "fault");
        for sys in ["usermm", IN_THREAD, FIFO_USERMM] {
            for (what, metric, goal) in [("p99", "stall_p99", 50.0), ("worst", "stall_max", 500.0)] {
                e.goals.push(Goal {
                    what: format!("{sys}: second thread's fault stall {what}, {large} MiB unmap"),
                    how: format!("{sys} {metric}, {v}"),
                    value: e.med(sys, &v, metric),
                    unit: " µs".into(),
                    at_least: false,
                    threshold: goal,
                    goal,
                });
            }
        }
    }
    if modes.iter().any(|m| m == "mapunmap") {
        let v = variant(large, "mapunmap");
        e.goals.push(Goal {
            what: format!("map/unmap loop worst stall, {large} MiB unmap"),
            how: format!("usermm stall_max, {v}"),
            value: e.med("usermm", &v, "stall_max") / 1e3,
            unit: " ms".into(),
            at_least: false,
            threshold: 10.0,
            goal: 1.0,
        });
    }
}

/// The ratio goal and the note of the `SCHED_FIFO` rows (`why_not`: why
/// they were not measured; their stall goals are `goals`').
fn fifo_goals_and_notes(e: &mut Experiment, sizes: &[u64], why_not: Option<&str>) {
    let large = sizes.iter().max().copied().unwrap_or(0);
    let v = variant(large, "fault");
    if let Some(why) = why_not {
        e.notes.push(format!("{FIFO_KERNEL}, {FIFO_USERMM} and {FIFO_SPINNER} not measured: {why}."));
    }
    e.goals.push(Goal {
        what: format!("fault stall ≤ kernel's, {large} MiB, both at SCHED_FIFO"),
        how: format!("{FIFO_USERMM}/{FIFO_KERNEL}, {v} stall_max"),
        value: e.med(FIFO_USERMM, &v, "stall_max") / e.med(FIFO_KERNEL, &v, "stall_max"),
        unit: "×".into(),
        at_least: false,
        threshold: 1.0,
        goal: 1.0,
    });
    e.notes.push(format!(
        "`{FIFO_KERNEL}`, `{FIFO_USERMM}`, `{FIFO_SPINNER}` (the largest size, fault mode): the same runs with every \
         thread of the run at SCHED_FIFO priority {FIFO_PRIORITY} (the benchmark's thread, and what it starts: the \
         second thread, the spinner, the space's handler and reclaim threads; the populate is followed by a 1 s pause, \
         one period of the kernel's real-time throttling). No SCHED_OTHER task preempts them, so their stalls are the \
         memory manager's and the machine's (the spinner's row), not other tasks' time slices: on this VM a `kdamond` \
         runs for 2 ms every ~0.5 s, which the SCHED_OTHER rows' worst stalls catch in most runs."
    ));
}

/// The notes: the setup, the counters, the seed's numbers.
fn notes(e: &mut Experiment, sizes: &[u64], mapunmap_kib: u64) {
    e.notes.push(format!(
        "Sizes {} MiB{}. Every page of the region is written before the unmap (untimed). usermm: a fresh space per run, \
         budget = size + 64 MiB, no swap; the second thread works in the same space. kernel: plain mmap/munmap, the \
         second thread in the same process. `hold_max` is usermm's longest exclusive (write) hold of its region lock in \
         that run (mmaps included, so an upper bound on the munmap's own). `stall_max`/`stall_p99` are over the second \
         thread's operations that overlap the unmap (`ops_during_unmap` of them); in fault mode one operation is one \
         8-byte write to a fresh page, in mapunmap mode one mmap+munmap pair of {} KiB. The kernel's own mmap_lock hold \
         cannot be observed from user space, so it has no hold row. On a 2-vCPU machine the second thread shares the \
         CPUs with the unmapping thread (and, for usermm, its fault and reclaim threads), so worst stalls include \
         scheduling delays and vary widely run to run: read them with their [min..max]. `{IN_THREAD}`: the same \
         space with `UMM_F_INTHREAD_FAULTS` (the second thread's faults resolved in the faulting thread, no handler \
         thread). `{SPINNER}` (the largest size, fault mode's runs): the kernel's unmap beside a second thread that \
         only reads the clock in a loop, no faults and no system calls; its `stall_max` is the longest gap between \
         two of its clock reads during the unmap (`ops_during_unmap`: gaps over 1 µs), the floor under every stall \
         row on this machine (a VM that stops its vCPUs for milliseconds while gigabytes are freed). \
         `{SPINNER_USERMM}`: the same spinner beside usermm's unmap of the same size (a space with handler threads, \
         nothing else running in it): the floor under the `usermm` rows.",
        sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        if sizes.iter().all(|&s| s < 4096) { " (quick scale: 4 GiB left out, pass --sizes-mib to add it)" } else { "" },
        mapunmap_kib,
    ));
    e.notes.push(
        "Seed 003's published numbers (measured on other hardware — 32 cores of E5-2680 @ 2.70GHz, unmapping 80 GB — \
         and never used in a ratio): exclusive mmap_sem hold in `do_munmap` 2,165,433 µs without the patches, \
         35,148.923 µs with them; `SyS_munmap` total 2,165,369 µs without, 2,166,535 µs with."
            .into(),
    );
}

/// The two plots over region size: worst stalls; unmap time and hold.
fn plots(e: &mut Experiment, sizes: &[u64], modes: &[String]) {
    let gib = |s: u64| s as f64 / 1024.0;
    let mut stall_series = Vec::new();
    let mut time_series = Vec::new();
    for mode in modes {
        for sys in ["kernel", "usermm", IN_THREAD] {
            let pts = |m: &str| sizes.iter().map(|&s| (gib(s), e.med(sys, &variant(s, mode), m))).collect::<Vec<_>>();
            stall_series.push(svg::Series { name: format!("{sys} {mode} worst"), points: pts("stall_max") });
            let ms = pts("unmap_time");
            time_series.push(svg::Series { name: format!("{sys} unmap ({mode})"), points: ms });
            if sys != "kernel" {
                let h = pts("hold_max").into_iter().map(|(x, y)| (x, y / 1e3)).collect();
                time_series.push(svg::Series { name: format!("{sys} hold ({mode})"), points: h });
            }
        }
    }
    let plot = |title, y_label| svg::Plot {
        title,
        x_label: "region size (GiB)",
        y_label,
        log_x: false,
        log_y: true,
        markers: true,
    };
    e.plots.push((
        "munmap-stall.svg".into(),
        svg::render(
            &plot("munmap: second thread's worst stall during the unmap (median of runs)", "stall (µs)"),
            &stall_series,
        ),
    ));
    e.plots.push((
        "munmap-time.svg".into(),
        svg::render(
            &plot("munmap: unmap time and usermm's exclusive hold (median of runs)", "time (ms)"),
            &time_series,
        ),
    ));
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let sizes = p.list("sizes_mib");
    let runs = p.int("runs").max(1) as usize;
    let modes: Vec<String> = p.text("modes").split(',').map(|s| s.trim().to_string()).collect();
    if let Some(m) = modes.iter().find(|m| *m != "fault" && *m != "mapunmap") {
        return Err(format!("munmap: unknown mode '{m}' (fault, mapunmap)"));
    }
    if sizes.contains(&0) {
        return Err("munmap: sizes must be ≥ 1 MiB".into());
    }
    let mut e =
        Experiment::new("munmap", "seed 003: unmap a large populated region beside a busy second thread", p.pairs());
    // Why the SCHED_FIFO rows are not measured, if they are not.
    let mut fifo = (p.int("fifo") == 0).then(|| "--fifo=0".to_string());
    for &size in &sizes {
        for mode in &modes {
            for r in 0..runs {
                let [a, b] = systems(r);
                let syss = if r.is_multiple_of(2) { [a, b, IN_THREAD] } else { [IN_THREAD, a, b] };
                for sys in syss {
                    prog.say(&format!("{size} MiB, second thread {mode}, {sys} run {}/{runs}", r + 1));
                    let bytes = size as usize * MIB;
                    let out = match sys {
                        "kernel" => kernel_run(bytes, mode, p)?,
                        IN_THREAD => usermm_run(bytes, mode, p, UMM_F_INTHREAD_FAULTS)?,
                        _ => usermm_run(bytes, mode, p, 0)?,
                    };
                    record(&mut e, sys, &variant(size, mode), out);
                }
                if mode == "fault" && size == *sizes.iter().max().unwrap_or(&size) {
                    prog.say(&format!("{size} MiB, spinner beside the kernel's unmap, run {}/{runs}", r + 1));
                    let out = spinner_run(size as usize * MIB, p, false)?;
                    record(&mut e, SPINNER, &variant(size, mode), out);
                    prog.say(&format!("{size} MiB, spinner beside usermm's unmap, run {}/{runs}", r + 1));
                    let out = spinner_run(size as usize * MIB, p, true)?;
                    record(&mut e, SPINNER_USERMM, &variant(size, mode), out);
                    if fifo.is_none() {
                        let bytes = size as usize * MIB;
                        let order = if r.is_multiple_of(2) {
                            [FIFO_KERNEL, FIFO_USERMM, FIFO_SPINNER]
                        } else {
                            [FIFO_SPINNER, FIFO_USERMM, FIFO_KERNEL]
                        };
                        for sys in order {
                            prog.say(&format!("{size} MiB, second thread {mode}, {sys} run {}/{runs}", r + 1));
                            let out = at_fifo(|| match sys {
                                FIFO_KERNEL => kernel_run(bytes, mode, p),
                                FIFO_USERMM => usermm_run(bytes, mode, p, 0),
                                _ => spinner_run(bytes, p, false),
                            });
                            match out {
                                Ok(out) => record(&mut e, sys, &variant(size, mode), out),
                                // (Refused before anything ran: no privilege.)
                                Err(why) if why.starts_with("sched_setscheduler") => {
                                    prog.say(&format!("SCHED_FIFO rows not measured: {why}"));
                                    fifo = Some(why);
                                    break;
                                }
                                Err(why) => return Err(why),
                            }
                        }
                    }
                }
            }
        }
    }
    goals(&mut e, &sizes, &modes);
    if modes.iter().any(|m| m == "fault") {
        fifo_goals_and_notes(&mut e, &sizes, fifo.as_deref());
    }
    notes(&mut e, &sizes, p.int("mapunmap_kib"));
    plots(&mut e, &sizes, &modes);
    Ok(e)
}
