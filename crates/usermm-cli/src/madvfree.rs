//! `madvfree` (seed 001): an ebizzy-style allocator loop, host kernel vs
//! usermm.
//!
//! Each thread owns `chunks` chunks of `chunk_mib` (one region, written once
//! untimed before the clock starts, as a warmed-up allocator's arena). One
//! operation: pick a chunk at random, memset a random `min_kib`..`max_kib`
//! prefix of it (whole pages), then free that prefix with `MADV_DONTNEED`,
//! `MADV_FREE`, or not at all (`none`, the ceiling: what the loop costs
//! without any madvise). The threads run for `run_ms`; the result is
//! operations per second (all threads) and page faults per operation
//! (usermm: `Stats::faults`; kernel: the process's minor faults from
//! `getrusage`).
//!
//! The pressure rows run usermm's `MADV_FREE` loop with a budget of half the
//! threads' chunks (and swap), reporting swap-outs and lazy-free discards.

use std::sync::Barrier;

use usermm::consts::{MADV_DONTNEED, MADV_FREE};
use usermm::{Space, Stats};
use usermm_sys::host::{process_faults, HostMap};
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, run_label, systems, Progress, Rng, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};

pub fn params(full: bool) -> Params {
    Params::default()
        .def("threads", Kind::IntList, "1,2", "thread counts (one row each)")
        .def("chunks", Kind::Int, 8, "chunks per thread")
        .def("chunk_mib", Kind::Int, 2, "chunk size (MiB)")
        .def("min_kib", Kind::Int, 256, "smallest memset + free per operation (KiB)")
        .def("max_kib", Kind::Int, 2048, "largest memset + free per operation (KiB; at most the chunk)")
        .def("run_ms", Kind::Int, if full { 5000 } else { 700 }, "duration of one measurement (ms)")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs per row (systems alternate run by run)")
        .def("warmup", Kind::Int, 1, "unmeasured warm-up runs before the measured ones")
        .def("pressure", Kind::Int, 1, "1: add usermm MADV_FREE rows with a budget of half the chunks; 0: skip")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of usermm's swap file (pressure rows)")
        .def("seed", Kind::Int, 1, "PRNG seed of the chunk and length choices")
}

/// The shape of one operation stream.
#[derive(Clone, Copy)]
struct Shape {
    chunks: usize,
    chunk: usize,
    min: usize,
    max: usize,
    dur_ns: u64,
}

/// Runs operations until the deadline: `op(offset, len, value)` memsets and
/// frees. Returns `(ops, ns)`.
fn ops_loop(
    sh: Shape,
    seed: u64,
    mut op: impl FnMut(usize, usize, u8) -> Result<(), String>,
) -> Result<(u64, u64), String> {
    let mut rng = Rng::new(seed);
    let t0 = now_ns();
    let end = t0 + sh.dur_ns;
    let mut ops = 0u64;
    loop {
        let c = rng.below(sh.chunks as u64) as usize;
        let len = (sh.min + rng.below((sh.max - sh.min) as u64 + 1) as usize) / PAGE * PAGE;
        op(c * sh.chunk, len.max(PAGE), (ops as u8) | 1)?;
        ops += 1;
        let now = now_ns();
        if now >= end {
            return Ok((ops, now - t0));
        }
    }
}

/// One measurement's totals.
struct Out {
    ops_per_s: f64,
    faults: u64,
    ops: u64,
    /// usermm only: the stats delta over the timed part.
    stats: Option<(Stats, Stats)>,
}

fn advice(mode: &str) -> i32 {
    match mode {
        "dontneed" => MADV_DONTNEED,
        "free" => MADV_FREE,
        _ => 0,
    }
}

/// Runs `threads` workers; `prefault` and `snapshot` bracket the timed part:
/// every worker prefaults, then the main thread snapshots, then all run.
fn threaded<W: Send>(
    workers: Vec<W>,
    mut snapshot: impl FnMut(),
    work: impl Fn(usize, W, &Barrier) -> Result<(u64, u64), String> + Sync,
) -> Result<(u64, f64), String> {
    let n = workers.len();
    let bar = Barrier::new(n + 1);
    std::thread::scope(|sc| {
        let hs: Vec<_> = workers
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let (bar, work) = (&bar, &work);
                sc.spawn(move || work(i, w, bar))
            })
            .collect();
        bar.wait(); // every worker prefaulted
        snapshot();
        bar.wait(); // go
        let mut ops = 0u64;
        let mut rate = 0.0;
        let mut err = None;
        for h in hs {
            match h.join() {
                Ok(Ok((o, ns))) => {
                    ops += o;
                    rate += o as f64 / (ns as f64 / 1e9);
                }
                Ok(Err(m)) => err = Some(m),
                Err(_) => err = Some("worker panicked".to_string()),
            }
        }
        match err {
            Some(m) => Err(m),
            None => Ok((ops, rate)),
        }
    })
}

fn kernel_run(threads: usize, mode: &str, sh: Shape, seed: u64) -> Result<Out, String> {
    let len = sh.chunks * sh.chunk;
    let maps: Vec<HostMap> = (0..threads)
        .map(|_| HostMap::anon(len, 0))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("kernel mmap: {e:?}"))?;
    let adv = advice(mode);
    let mut f0 = 0;
    let mut snap_err = None;
    let (ops, rate) = threaded(
        maps,
        || match process_faults() {
            Ok((minor, _)) => f0 = minor,
            Err(e) => snap_err = Some(format!("getrusage: {e:?}")),
        },
        |i, mut m, bar| {
            m.fill(1);
            bar.wait();
            bar.wait();
            let r = ops_loop(sh, seed + i as u64, |off, len, v| {
                m[off..off + len].fill(v);
                if adv != 0 {
                    m.madvise_range(off, len, adv).map_err(|e| format!("kernel madvise: {e:?}"))?;
                }
                Ok(())
            });
            m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
            r
        },
    )?;
    if let Some(m) = snap_err {
        return Err(m);
    }
    let f1 = process_faults().map_err(|e| format!("getrusage: {e:?}"))?.0;
    Ok(Out { ops_per_s: rate, faults: f1.saturating_sub(f0), ops, stats: None })
}

fn usermm_run(threads: usize, mode: &str, sh: Shape, seed: u64, pressure: Option<&str>) -> Result<Out, String> {
    let total = threads * sh.chunks * sh.chunk;
    let cfg = match pressure {
        Some(dir) => config(total / 2, total * 4, Some(dir)),
        None => config(total + 64 * MIB, 0, None),
    };
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let maps = (0..threads)
        .map(|_| space.map_anon(sh.chunks * sh.chunk))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("usermm mmap: {e:?}"))?;
    let adv = advice(mode);
    let mut s0 = Stats::default();
    let sp = &space;
    let (ops, rate) = threaded(
        maps,
        || s0 = sp.stats(),
        |i, mut m, bar| {
            m.fill(1);
            bar.wait();
            bar.wait();
            let r = ops_loop(sh, seed + i as u64, |off, len, v| {
                m[off..off + len].fill(v);
                if adv != 0 {
                    // SAFETY: every range is written (filled) before it is
                    // borrowed again; nothing reads a freed range.
                    #[allow(unsafe_code)]
                    let r = unsafe { m.advise_unchecked(off, len, adv) };
                    r.map_err(|e| format!("usermm madvise: {e:?}"))?;
                }
                Ok(())
            });
            m.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
            r
        },
    )?;
    let s1 = space.stats();
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Out { ops_per_s: rate, faults: s1.faults - s0.faults, ops, stats: Some((s0, s1)) })
}

/// The variant name of `t` threads in `mode`.
fn v(t: u64, mode: &str) -> String {
    format!("{t}t-{mode}")
}

/// Adds a measured pressure row (usermm `free` with a budget of half the
/// chunks and swap) to the experiment.
fn record_pressure(e: &mut Experiment, pv: &str, out: &Out, s0: &Stats, s1: &Stats) {
    e.add("usermm", pv, "ops_per_s", "ops/s", out.ops_per_s);
    e.add("usermm", pv, "faults_per_op", "faults/op", out.faults as f64 / out.ops.max(1) as f64);
    e.add("usermm", pv, "swapouts", "pages", (s1.swapouts - s0.swapouts) as f64);
    e.add("usermm", pv, "swapins", "pages", (s1.swapins - s0.swapins) as f64);
    e.add("usermm", pv, "lazyfree_discards", "pages", (s1.lazyfree_discards - s0.lazyfree_discards) as f64);
}

/// The goals, per thread count: usermm's MADV_FREE against the kernel's and
/// its own MADV_DONTNEED, and its faults per op.
fn goals(e: &mut Experiment, threads: &[u64]) {
    for &t in threads {
        e.ratio_goal(&format!("MADV_FREE ops/s vs kernel, {t} thread(s)"), &v(t, "free"), "ops_per_s", true, 0.8, 1.0);
    }
    for &t in threads {
        e.goals.push(Goal {
            what: format!("usermm MADV_FREE vs its own MADV_DONTNEED, {t} thread(s)"),
            how: format!("usermm ops/s, {} / {}", v(t, "free"), v(t, "dontneed")),
            value: e.med("usermm", &v(t, "free"), "ops_per_s") / e.med("usermm", &v(t, "dontneed"), "ops_per_s"),
            unit: "×".into(),
            at_least: true,
            threshold: 3.0,
            goal: 3.0,
        });
    }
    for &t in threads {
        e.goals.push(Goal {
            what: format!("usermm MADV_FREE faults per op, no pressure, {t} thread(s)"),
            how: format!("usermm faults_per_op, {}", v(t, "free")),
            value: e.med("usermm", &v(t, "free"), "faults_per_op"),
            unit: "".into(),
            at_least: false,
            threshold: 0.01,
            goal: 0.0,
        });
    }
}

/// The notes: the loop, the counters, pressure, the seed's numbers.
fn notes(e: &mut Experiment, sh: Shape, run_ms: u64, swap_dir: &str) {
    e.notes.push(format!(
        "Per thread: {} chunks of {} MiB in one region, written once before the clock starts. One operation picks a \
         chunk at random, memsets a random {}..{} KiB prefix (whole pages) and frees that prefix with the row's advice \
         (`none`: no madvise, the ceiling). Each measurement runs {} ms, threads start together; ops/s is the sum over \
         threads. Faults per op: usermm `Stats::faults` delta; kernel: the process's minor faults (`getrusage` \
         `ru_minflt`) over the timed part. One usermm fault may map several pages at once (it counts userfaultfd \
         faults served, not pages), so usermm rows also give `zero_fills_per_op`: pages zero-filled per operation, \
         the page-level cost comparable with the kernel's per-page minor faults. usermm: a fresh space per measurement, budget = chunks + 64 MiB, no swap. \
         Pressure rows: budget = half the threads' chunks, swap = 4× the chunks in `{}`; swap-outs, swap-ins and \
         lazy-free discards are per measurement.",
        sh.chunks,
        sh.chunk / MIB,
        sh.min / 1024,
        sh.max / 1024,
        run_ms,
        swap_dir
    ));
    e.notes.push(
        "usermm passes `MADV_FREE` down to the host kernel, so reusing a lazily freed page costs no fault at all; \
         under usermm's own budget pressure, reclaim parks lazily freed pages first and asks the host to drop them \
         (`MADV_PAGEOUT` on the parked copy): a clean one is discarded with no I/O (`lazyfree_discards`), one written \
         since the free is swapped like any dirty page. The pressure rows show how many went each way."
            .into(),
    );
    e.notes.push(
        "Seed 001's ebizzy numbers (jemalloc, `ebizzy -S 10 -n 512`, 12-CPU KVM guest — other hardware and a \
         different workload; for reference only, never in a ratio), records/s avg: 1 thread 2961.90 (MADV_DONTNEED) \
         vs 12069.70 (MADV_FREE); 2 threads 5020.00 vs 17827.00. KERNEL-FACTS records this host kernel with this \
         loop (5 s): 1 thread 14.7k FREE vs 1.5k DONTNEED ops/s (no madvise 38.7k); 2 threads 20.6k vs 2.8k."
            .into(),
    );
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let threads = p.list("threads");
    let runs = p.int("runs").max(1) as usize;
    let warmup = p.int("warmup") as usize;
    let sh = Shape {
        chunks: p.int("chunks").max(1) as usize,
        chunk: (p.int("chunk_mib") as usize * MIB).max(PAGE),
        min: p.int("min_kib") as usize * 1024,
        max: p.int("max_kib") as usize * 1024,
        dur_ns: p.int("run_ms").max(1) * 1_000_000,
    };
    if sh.min < PAGE || sh.min > sh.max || sh.max > sh.chunk {
        return Err("madvfree: need 4 ≤ min_kib ≤ max_kib ≤ chunk_mib × 1024".into());
    }
    if threads.contains(&0) {
        return Err("madvfree: thread counts must be ≥ 1".into());
    }
    let pressure = p.int("pressure") != 0;
    let swap_dir = p.text("swap_dir");
    let seed = p.int("seed");
    let mut e = Experiment::new("madvfree", "seed 001: ebizzy-style memset + free loop (operations/s)", p.pairs());
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        let which = run_label(r, warmup, runs);
        for &t in &threads {
            for sys in systems(r) {
                let modes: &[&str] =
                    if sys == "kernel" { &["dontneed", "free", "none"] } else { &["dontneed", "free"] };
                for mode in modes {
                    prog.say(&format!("{t} thread(s), {sys} {mode}, {which}"));
                    let s = seed + (r as u64) * 1000;
                    let out = if sys == "kernel" {
                        kernel_run(t as usize, mode, sh, s)?
                    } else {
                        usermm_run(t as usize, mode, sh, s, None)?
                    };
                    if !measured {
                        continue;
                    }
                    e.add(sys, &v(t, mode), "ops_per_s", "ops/s", out.ops_per_s);
                    e.add(sys, &v(t, mode), "faults_per_op", "faults/op", out.faults as f64 / out.ops.max(1) as f64);
                    if let Some((s0, s1)) = &out.stats {
                        let z = (s1.zero_fills - s0.zero_fills) as f64 / out.ops.max(1) as f64;
                        e.add(sys, &v(t, mode), "zero_fills_per_op", "pages/op", z);
                    }
                }
            }
            if pressure {
                prog.say(&format!("{t} thread(s), usermm free under pressure, {which}"));
                let out = usermm_run(t as usize, "free", sh, seed + (r as u64) * 1000, Some(&swap_dir))?;
                let (s0, s1) = out.stats.as_ref().expect("usermm");
                if !measured {
                    continue;
                }
                record_pressure(&mut e, &v(t, "free-pressure"), &out, s0, s1);
            }
        }
    }
    goals(&mut e, &threads);
    notes(&mut e, sh, p.int("run_ms"), &swap_dir);
    Ok(e)
}
