//! `volatile` (seed 002): the seed's test program, host kernel vs usermm.
//!
//! Each thread owns a region of `chunks` chunks of `chunk_mib` and runs
//! `rounds` rounds of:
//! - `dontneed` mode: per chunk, memset it and drop it with `MADV_DONTNEED`;
//! - `volatile` mode (usermm only; the kernel has no `mvolatile`): mark the
//!   whole region volatile, then per chunk `mnovolatile` it, memset it and
//!   mark it volatile again.
//!
//! Rows: elapsed time, page faults (usermm: `Stats::faults`; kernel: the
//! workers' own minor faults, `RUSAGE_THREAD`), faults per round after the
//! first (the steady state), and the resident peak. Plus the purge demonstration: 26 chunks of
//! 16 KiB filled with 'A'..'Z', the even ones volatile, pressure, then
//! `mnovolatile` on each even chunk reports exactly which pages were purged.

use std::sync::Barrier;

use usermm::consts::MADV_DONTNEED;
use usermm::{Mapping, Space};
use usermm_sys::host::{reset_peak_rss, rss_kib, thread_faults, HostMap};
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, run_label, systems, Progress, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};

pub fn params(full: bool) -> Params {
    Params::default()
        .def("threads", Kind::IntList, "1,2", "thread counts (one row each)")
        .def("chunks", Kind::Int, 10, "chunks per thread's region")
        .def("chunk_mib", Kind::Int, 8, "chunk size (MiB)")
        .def("rounds", Kind::Int, if full { 100 } else { 20 }, "rounds over the whole region per measurement")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs per row (systems alternate run by run)")
        .def("warmup", Kind::Int, 1, "unmeasured warm-up runs before the measured ones")
        .def(
            "budget_mib",
            Kind::Int,
            0,
            "usermm's budget for the loops (MiB); 0: twice the threads' regions + 64 MiB (below half: no aging)",
        )
        .def(
            "demo_budget_kib",
            Kind::Int,
            4096,
            "purge demonstration: usermm budget (KiB); pressure writes 8× this, twice",
        )
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the purge demonstration's swap file")
}

#[derive(Clone, Copy)]
struct Shape {
    chunks: usize,
    chunk: usize,
    rounds: usize,
}

/// What one measurement gives.
struct Out {
    elapsed_ns: u64,
    faults: u64,
    /// Faults in rounds 2.. (all threads).
    faults_steady: u64,
    /// Peak resident bytes, if known.
    peak: Option<u64>,
    purged: u64,
}

/// Where the fault count comes from.
enum Faults<'a> {
    /// One counter for the whole run (usermm's `Stats::faults`), read by the
    /// main thread between barriers.
    Shared(&'a mut dyn FnMut() -> Result<u64, String>),
    /// Each worker's own counter (the kernel's `RUSAGE_THREAD` minor
    /// faults), read by the worker itself and summed: the process's count
    /// would also take in whatever the other threads fault (a progress or
    /// signal thread, a join's stack teardown: one extra fault was seen).
    PerWorker(fn() -> Result<u64, String>),
}

/// Runs one worker per region; the fault counter is snapshot before the
/// first round, after the first round and at the end (barriers around each
/// snapshot). `round(r, region)` runs round `r` and returns the pages it
/// found purged. The regions are dropped (unmapped) at the end.
fn threaded<W: Send>(
    regions: Vec<W>,
    sh: Shape,
    mut faults: Faults<'_>,
    round: impl Fn(usize, &mut W) -> Result<u64, String> + Sync,
) -> Result<(u64, [u64; 3], u64), String> {
    let n = regions.len();
    let bar = Barrier::new(n + 1);
    std::thread::scope(|sc| {
        let hs: Vec<_> = regions
            .into_iter()
            .map(|mut w| {
                let (bar, round) = (&bar, &round);
                let own = match faults {
                    Faults::PerWorker(f) => Some(f),
                    Faults::Shared(_) => None,
                };
                sc.spawn(move || -> Result<(u64, u64, [u64; 3], W), String> {
                    let mut snaps = [0u64; 3];
                    let snap = |s: &mut u64| own.map_or(Ok(()), |f| f().map(|v| *s = v));
                    bar.wait();
                    let mut res = snap(&mut snaps[0]);
                    bar.wait();
                    let t0 = now_ns();
                    let mut purged = 0;
                    for r in 0..sh.rounds {
                        if res.is_ok() {
                            match round(r, &mut w) {
                                Ok(p) => purged += p,
                                Err(m) => res = Err(m),
                            }
                        }
                        if r == 0 {
                            if res.is_ok() {
                                res = snap(&mut snaps[1]);
                            }
                            bar.wait();
                            bar.wait();
                        }
                    }
                    let elapsed = now_ns() - t0;
                    res?;
                    snap(&mut snaps[2])?;
                    Ok((elapsed, purged, snaps, w))
                })
            })
            .collect();
        let mut snaps = [0u64; 3];
        let mut shared = |s: &mut u64| match &mut faults {
            Faults::Shared(f) => f().map(|v| *s = v),
            Faults::PerWorker(_) => Ok(()),
        };
        bar.wait();
        let mut err = shared(&mut snaps[0]).err();
        bar.wait();
        bar.wait(); // first round done everywhere
        if let Err(m) = shared(&mut snaps[1]) {
            err = Some(m);
        }
        bar.wait();
        let mut elapsed = 0;
        let mut purged = 0;
        for h in hs {
            match h.join() {
                Ok(Ok((ns, p, own, _w))) => {
                    elapsed = elapsed.max(ns);
                    purged += p;
                    // Per-worker counts: summed as deltas from snaps[0] = 0.
                    snaps[1] += own[1] - own[0];
                    snaps[2] += own[2] - own[0];
                }
                Ok(Err(m)) => err = Some(m),
                Err(_) => err = Some("worker panicked".to_string()),
            }
        }
        if let Err(m) = shared(&mut snaps[2]) {
            err = Some(m);
        }
        match err {
            Some(m) => Err(m),
            None => Ok((elapsed, snaps, purged)),
        }
    })
}

fn fill_value(r: usize, c: usize) -> u8 {
    (r as u8).wrapping_mul(16).wrapping_add(c as u8) | 1
}

fn kernel_run(threads: usize, sh: Shape) -> Result<Out, String> {
    let len = sh.chunks * sh.chunk;
    let maps: Vec<HostMap> = (0..threads)
        .map(|_| HostMap::anon(len, 0))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("kernel mmap: {e:?}"))?;
    let rss0 = reset_peak_rss().and_then(|_| rss_kib()).ok().map(|(rss, _)| rss);
    let faults = Faults::PerWorker(|| thread_faults().map(|f| f.0).map_err(|e| format!("getrusage: {e:?}")));
    let (elapsed_ns, s, _) = threaded(maps, sh, faults, |r, m: &mut HostMap| {
        for c in 0..sh.chunks {
            let off = c * sh.chunk;
            m[off..off + sh.chunk].fill(fill_value(r, c));
            m.madvise_range(off, sh.chunk, MADV_DONTNEED).map_err(|e| format!("kernel madvise: {e:?}"))?;
        }
        Ok(0)
    })?;
    let peak = match (rss0, rss_kib().ok()) {
        (Some(rss0), Some((_, hwm))) => Some(hwm.saturating_sub(rss0) * 1024),
        _ => None,
    };
    Ok(Out { elapsed_ns, faults: s[2] - s[0], faults_steady: s[2] - s[1], peak, purged: 0 })
}

fn usermm_run(threads: usize, sh: Shape, volatile: bool, budget: usize) -> Result<Out, String> {
    let len = sh.chunks * sh.chunk;
    let budget = if budget == 0 { 2 * threads * len + 64 * MIB } else { budget };
    let space = Space::open(&config(budget, 0, None)).map_err(|e| format!("usermm open: {e:?}"))?;
    let maps = (0..threads)
        .map(|_| space.map_anon(len))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("usermm mmap: {e:?}"))?;
    let sp = &space;
    let mut faults = || Ok(sp.stats().faults);
    let (elapsed_ns, s, purged) = threaded(maps, sh, Faults::Shared(&mut faults), |r, m: &mut Mapping<'_>| {
        let mut purged = 0u64;
        if volatile {
            // SAFETY: a chunk is borrowed only between its mnovolatile
            // below and the mvolatile that follows.
            #[allow(unsafe_code)]
            let v = unsafe { m.mvolatile(0, len) };
            v.map_err(|e| format!("usermm mvolatile: {e:?}"))?;
        }
        for c in 0..sh.chunks {
            let off = c * sh.chunk;
            if volatile {
                let (_, rep) = m.mnovolatile(off, sh.chunk).map_err(|e| format!("usermm mnovolatile: {e:?}"))?;
                purged += rep.purged_pages as u64;
            }
            m[off..off + sh.chunk].fill(fill_value(r, c));
            if volatile {
                // SAFETY: as above: not borrowed again before its mnovolatile.
                #[allow(unsafe_code)]
                let v = unsafe { m.mvolatile(off, sh.chunk) };
                v.map_err(|e| format!("usermm mvolatile: {e:?}"))?;
            } else {
                m.advise_range(off, sh.chunk, MADV_DONTNEED).map_err(|e| format!("usermm madvise: {e:?}"))?;
            }
        }
        Ok(purged)
    })?;
    let peak = space.stats().resident_pages_max * PAGE as u64;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Out { elapsed_ns, faults: s[2] - s[0], faults_steady: s[2] - s[1], peak: Some(peak), purged })
}

/// The purge demonstration's outcome.
struct Demo {
    /// Markdown table rows: chunk, letter, volatile, purged pages, bitmap, check.
    table: Vec<Vec<String>>,
    purged_total: u64,
    volatile_purges: u64,
    swapouts: u64,
    /// Pages (of any chunk) that read back other than the report says.
    mismatches: u64,
    odd_intact: u64,
}

const DEMO_CHUNK: usize = 16 << 10;

/// Checks demo chunk `i` against what `mnovolatile` reports (even chunks)
/// or its letter (odd ones), and adds its line to `d.table`.
fn check_chunk(m: &mut Mapping<'_>, i: usize, d: &mut Demo) -> Result<(), String> {
    let pages_per = DEMO_CHUNK / PAGE;
    let base = i * DEMO_CHUNK;
    let letter = b'A' + i as u8;
    let chunk_ok = |m: &[u8], purged_bit: &dyn Fn(usize) -> bool| -> u64 {
        (0..pages_per)
            .filter(|&p| {
                let pg = &m[base + p * PAGE..base + (p + 1) * PAGE];
                let want = if purged_bit(p) { 0 } else { letter };
                pg.iter().any(|&b| b != want)
            })
            .count() as u64
    };
    if i.is_multiple_of(2) {
        let (purged, rep) = m.mnovolatile(base, DEMO_CHUNK).map_err(|e| format!("usermm mnovolatile: {e:?}"))?;
        let word = rep.bitmap.first().copied().unwrap_or(0);
        let bad = chunk_ok(m, &|p| word >> p & 1 == 1) + u64::from(purged != (rep.purged_pages > 0));
        d.mismatches += bad;
        d.purged_total += rep.purged_pages as u64;
        let bits: String = (0..pages_per).map(|p| if word >> p & 1 == 1 { '1' } else { '0' }).collect();
        d.table.push(vec![
            i.to_string(),
            (letter as char).to_string(),
            "yes".into(),
            format!("{}/{pages_per}", rep.purged_pages),
            format!("`{bits}`"),
            if bad == 0 { "matches the report".into() } else { format!("**{bad} pages differ**") },
        ]);
    } else {
        let bad = chunk_ok(m, &|_| false);
        d.mismatches += bad;
        d.odd_intact += u64::from(bad == 0);
        d.table.push(vec![
            i.to_string(),
            (letter as char).to_string(),
            "no".into(),
            "—".into(),
            "—".into(),
            if bad == 0 { "intact".into() } else { format!("**{bad} pages differ**") },
        ]);
    }
    Ok(())
}

fn purge_demo(budget: usize, swap_dir: &str) -> Result<Demo, String> {
    let space = Space::open(&config(budget, 64 * budget.max(MIB), Some(swap_dir)))
        .map_err(|e| format!("usermm open: {e:?}"))?;
    let mut m = space.map_anon(26 * DEMO_CHUNK).map_err(|e| format!("usermm mmap: {e:?}"))?;
    for i in 0..26 {
        m[i * DEMO_CHUNK..(i + 1) * DEMO_CHUNK].fill(b'A' + i as u8);
    }
    for i in (0..26).step_by(2) {
        // SAFETY: the even chunks are read only after their mnovolatile
        // below.
        #[allow(unsafe_code)]
        let v = unsafe { m.mvolatile(i * DEMO_CHUNK, DEMO_CHUNK) };
        v.map_err(|e| format!("usermm mvolatile: {e:?}"))?;
    }
    let before = space.stats();
    {
        let mut p = space.map_anon(8 * budget).map_err(|e| format!("usermm mmap (pressure): {e:?}"))?;
        for round in 1..=2u8 {
            for c in p.chunks_mut(PAGE) {
                c[0] = round;
            }
        }
        p.unmap().map_err(|e| format!("usermm munmap (pressure): {e:?}"))?;
    }
    let after = space.stats();
    let mut d = Demo {
        table: Vec::new(),
        purged_total: 0,
        volatile_purges: after.volatile_purges - before.volatile_purges,
        swapouts: after.swapouts - before.swapouts,
        mismatches: 0,
        odd_intact: 0,
    };
    for i in 0..26 {
        check_chunk(&mut m, i, &mut d)?;
    }
    if d.purged_total != d.volatile_purges {
        d.mismatches += 1;
    }
    m.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(d)
}

/// The variant name of `t` threads in `mode`.
fn v(t: u64, mode: &str) -> String {
    format!("{t}t-{mode}")
}

/// Adds one measured run of variant `var` to the experiment; `rounds` is
/// the number of rounds after the first (over all threads).
fn record(e: &mut Experiment, sys: &str, var: &str, out: &Out, rounds: f64) {
    e.add(sys, var, "elapsed", "ms", out.elapsed_ns as f64 / 1e6);
    e.add(sys, var, "faults", "faults", out.faults as f64);
    e.add(sys, var, "faults_per_round_after_first", "faults/round", out.faults_steady as f64 / rounds);
    if let Some(pk) = out.peak {
        let unit = if sys == "kernel" { "MiB (process VmHWM growth)" } else { "MiB (space peak)" };
        e.add(sys, var, "peak_resident", unit, pk as f64 / MIB as f64);
    }
    if var.ends_with("-volatile") {
        e.add(sys, var, "purged_pages", "pages", out.purged as f64);
    }
}

/// Adds the purge demonstration's counts to the experiment.
fn record_demo(e: &mut Experiment, d: &Demo) {
    e.add("usermm", "purge-demo", "purged_pages_reported", "pages", d.purged_total as f64);
    e.add("usermm", "purge-demo", "volatile_purges", "pages", d.volatile_purges as f64);
    e.add("usermm", "purge-demo", "swapouts", "pages", d.swapouts as f64);
    e.add("usermm", "purge-demo", "odd_chunks_intact", "chunks", d.odd_intact as f64);
    e.add("usermm", "purge-demo", "mismatches", "pages", d.mismatches as f64);
}

/// The goals: the volatile loop against the kernel's MADV_DONTNEED loop and
/// its faults per round, per thread count; the purge demo's exactness.
fn goals(e: &mut Experiment, threads: &[u64], d: &Demo) {
    for &t in threads {
        e.goals.push(Goal {
            what: format!("volatile loop vs kernel MADV_DONTNEED loop, {t} thread(s)"),
            how: format!("kernel {} elapsed / usermm {} elapsed", v(t, "dontneed"), v(t, "volatile")),
            value: e.med("kernel", &v(t, "dontneed"), "elapsed") / e.med("usermm", &v(t, "volatile"), "elapsed"),
            unit: "×".into(),
            at_least: true,
            threshold: 3.0,
            goal: 5.0,
        });
    }
    for &t in threads {
        e.goals.push(Goal {
            what: format!("volatile loop faults per round (after the first), {t} thread(s)"),
            how: format!("usermm {} faults_per_round_after_first", v(t, "volatile")),
            value: e.med("usermm", &v(t, "volatile"), "faults_per_round_after_first"),
            unit: "".into(),
            at_least: false,
            threshold: 1.0,
            goal: 0.0,
        });
    }
    e.goals.push(Goal {
        what: "purge demo: reports exact, odd chunks intact".into(),
        how: "pages that read back other than reported (+1 if the total ≠ volatile_purges)".into(),
        value: d.mismatches as f64,
        unit: "".into(),
        at_least: false,
        threshold: 0.0,
        goal: 0.0,
    });
}

/// The notes: the loop and its counters, the default budget, the seed's
/// numbers, the purge demonstration's table.
fn notes(e: &mut Experiment, sh: Shape, demo_budget: usize, d: &Demo) {
    let region_mib = sh.chunks * sh.chunk / MIB;
    e.notes.push(format!(
        "Per thread: a region of {} chunks of {} MiB ({region_mib} MiB), {} rounds per measurement, threads start \
         together; `elapsed` is the slowest thread's. The seed memsets each chunk with its byte offset cast to int \
         (always 0 for 8 MiB chunks); here the value is non-zero and changes per round and chunk. usermm: a fresh space \
         per measurement, budget = 2 × regions + 64 MiB unless `budget_mib` says otherwise, no swap (nothing is ever purged: `purged_pages` counts what \
         `mnovolatile` reported). `faults`: usermm `Stats::faults` delta; kernel: the worker threads' own minor faults \
         (`getrusage(RUSAGE_THREAD)`, summed). `faults_per_round_after_first` = faults in rounds 2.. / (threads × (rounds − 1)). \
         `peak_resident`: usermm `resident_pages_max` of the space; kernel: the growth of the whole process's \
         `VmHWM` over its `VmRSS` at the start (reset by `/proc/self/clear_refs` 5), so it includes anything else \
         the process touched meanwhile.",
        sh.chunks, sh.chunk / MIB, sh.rounds
    ));
    e.notes.push(
        "Why the default budget is twice the regions: usermm ages its LRU in the background whenever volatile pages \
         exist (they are purgeable even without swap) and resident ≥ half the budget. With budget = regions + 64 MiB \
         (1 thread: 144 MiB for an 80 MiB region, `--budget-mib=144`) that aging kept deactivating the pages the loop \
         was about to touch: measured here at ~16,000 usermm faults per round and 5.8 s for the 1-thread volatile \
         loop (3 runs, 4.4–7.2 s), against ~0 faults per round and ~0.55 s with the default budget. The kernel only \
         ages anonymous memory under real memory pressure."
            .into(),
    );
    e.notes.push(
        "Seed 002's numbers (other hardware: 8-core KVM and 12-core x86-64, 2 GiB, the seed's own kernel patch; \
         for reference only, never in a ratio) — KVM: VOLATILE 6.04 s elapsed, 164,050 minor faults, 2,624,096 KiB \
         max resident; DONTNEED 33.10 s, 16,384,210 minor faults, 213,088 KiB. x86-64: VOLATILE 2.87 s, 245,989 \
         faults, 3,935,008 KiB; DONTNEED 5.80 s, 387,776 KiB."
            .into(),
    );
    let mut demo = format!(
        "Purge demonstration: a space with a {} KiB budget and swap; 26 chunks of 16 KiB filled with 'A'..'Z', the \
         even ones marked volatile; then a private region of 8× the budget written twice (pressure: {} swap-outs, \
         {} volatile purges). `mnovolatile` on each even chunk reports the purged pages (bitmap: page 0 first, 1 = \
         purged); every page is checked against the report (purged reads zero, the rest its letter), and the odd \
         chunks must be intact.\n\n| chunk | letter | volatile | purged pages | bitmap | check |\n|---|---|---|---|---|---|\n",
        demo_budget / 1024,
        d.swapouts,
        d.volatile_purges
    );
    for row in &d.table {
        demo += &format!("| {} |\n", row.join(" | "));
    }
    e.notes.push(demo.trim_end().to_string());
    if d.mismatches > 0 {
        e.notes.push(format!("**ERROR**: the purge demonstration found {} mismatches", d.mismatches));
    }
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let threads = p.list("threads");
    let runs = p.int("runs").max(1) as usize;
    let warmup = p.int("warmup") as usize;
    let sh = Shape {
        chunks: p.int("chunks").max(1) as usize,
        chunk: (p.int("chunk_mib") as usize * MIB).max(PAGE),
        rounds: p.int("rounds").max(1) as usize,
    };
    if threads.contains(&0) {
        return Err("volatile: thread counts must be ≥ 1".into());
    }
    let demo_budget = (p.int("demo_budget_kib") as usize * 1024).max(64 * PAGE) / PAGE * PAGE;
    let swap_dir = p.text("swap_dir");
    let mut e = Experiment::new("volatile", "seed 002: fill-and-drop loop, mvolatile vs MADV_DONTNEED", p.pairs());
    let round_count = |t: u64| (t as usize * sh.rounds.saturating_sub(1)).max(1) as f64;
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        let which = run_label(r, warmup, runs);
        for &t in &threads {
            for sys in systems(r) {
                let modes: &[&str] = if sys == "kernel" { &["dontneed"] } else { &["dontneed", "volatile"] };
                for mode in modes {
                    prog.say(&format!("{t} thread(s), {sys} {mode}, {which}"));
                    let out = if sys == "kernel" {
                        kernel_run(t as usize, sh)?
                    } else {
                        usermm_run(t as usize, sh, *mode == "volatile", p.int("budget_mib") as usize * MIB)?
                    };
                    if !measured {
                        continue;
                    }
                    record(&mut e, sys, &v(t, mode), &out, round_count(t));
                }
            }
        }
    }
    prog.say("purge demonstration");
    let d = purge_demo(demo_budget, &swap_dir)?;
    record_demo(&mut e, &d);
    goals(&mut e, &threads, &d);
    notes(&mut e, sh, demo_budget, &d);
    Ok(e)
}
