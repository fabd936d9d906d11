//! `fault`: first touch of a fresh region, host kernel vs usermm.
//!
//! Variants: `seq` (every page in address order), `random` (every page, in
//! one fixed-seed shuffled order, the same on both sides), `sparse` (one page
//! per stride, the region advised `MADV_RANDOM` on both sides; each touch
//! timed), each with read touches (one 8-byte read per page, summed: fresh
//! memory must read 0) and write touches (one 8-byte write per page,
//! verified untimed afterwards). Every measurement gets a fresh region, and
//! on the usermm side a fresh space whose budget holds the whole region (no
//! reclaim, no swap).

use std::hint::black_box;

use usermm::consts::MADV_RANDOM;
use usermm::Space;
use usermm_sys::host::{HostMap, SigbusFloorMap};
use usermm_sys::now_ns;

use crate::common::{config, p50_p99_max, read8, run_label, systems, tag, write8, Progress, Rng, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Table};
use crate::svg;

pub fn params(full: bool) -> Params {
    Params::default()
        .def("size_mib", Kind::Int, if full { 1024 } else { 256 }, "region size for the seq and random variants (MiB)")
        .def(
            "sparse_size_mib",
            Kind::Int,
            if full { 16384 } else { 4096 },
            "region size for the sparse variant (MiB; only one page per stride is touched)",
        )
        .def("sparse_stride_kib", Kind::Int, 2048, "distance between two touched pages in the sparse variant (KiB)")
        .def("runs", Kind::Int, 5, "measured runs per row (systems alternate run by run)")
        .def("warmup", Kind::Int, 1, "unmeasured warm-up runs before the measured ones")
        .def("seed", Kind::Int, 42, "PRNG seed of the random order")
        .def("fault_threads", Kind::Int, 0, "usermm fault handler threads (0: usermm's default)")
}

const VARIANTS: [&str; 3] = ["seq", "random", "sparse"];
/// The usermm space with `UMM_F_INTHREAD_FAULTS`.
const IN_THREAD: &str = "usermm (in-thread)";
/// The floor under `IN_THREAD`'s faults (sparse variants only): a mapping
/// whose faults raise SIGBUS in the faulting thread and are resolved by
/// usermm's SIGBUS handler with one ioctl each, no space behind it
/// (`usermm_sys::host::SigbusFloorMap`).
const FLOOR: &str = "floor (SIGBUS + one ioctl)";

/// What one pass measured.
struct Pass {
    ns: u64,
    touches: usize,
    /// Per-touch latencies in µs (sparse only).
    lat_us: Vec<f64>,
    errors: usize,
}

/// Touches `order`'s pages of `buf` once; verifies afterwards (untimed).
fn touch(buf: &mut [u8], order: &[u32], stride: usize, write: bool, time_each: bool) -> Pass {
    let mut lat_us = Vec::with_capacity(if time_each { order.len() } else { 0 });
    let mut sum = 0u64;
    let t0 = now_ns();
    if time_each {
        for &p in order {
            let off = p as usize * stride;
            let a = now_ns();
            if write {
                write8(buf, off, tag(p as usize));
            } else {
                sum = sum.wrapping_add(read8(buf, off));
            }
            lat_us.push((now_ns() - a) as f64 / 1e3);
        }
    } else if write {
        for &p in order {
            write8(buf, p as usize * stride, tag(p as usize));
        }
    } else {
        for &p in order {
            sum = sum.wrapping_add(read8(buf, p as usize * stride));
        }
    }
    let ns = now_ns() - t0;
    black_box(sum);
    let mut errors = 0;
    if write {
        for &p in order {
            errors += (read8(buf, p as usize * stride) != tag(p as usize)) as usize;
        }
    } else {
        errors += (sum != 0) as usize;
    }
    Pass { ns, touches: order.len(), lat_us, errors }
}

/// One pass of `sys` over a fresh region of `region` bytes: the touches of
/// `order` (page numbers × `stride`); a sparse pass advises `MADV_RANDOM`
/// and times every touch.
fn one_pass(
    sys: &str,
    region: usize,
    order: &[u32],
    stride: usize,
    write: bool,
    sparse_v: bool,
    threads: u32,
) -> Result<Pass, String> {
    Ok(if sys == FLOOR {
        let mut m = SigbusFloorMap::new(region).map_err(|e| format!("floor map: {e:?}"))?;
        m.madvise(MADV_RANDOM).map_err(|e| format!("floor madvise: {e:?}"))?;
        touch(&mut m, order, stride, write, sparse_v)
    } else if sys == "kernel" {
        let mut m = HostMap::anon(region, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
        if sparse_v {
            m.madvise(MADV_RANDOM).map_err(|e| format!("kernel madvise: {e:?}"))?;
        }
        let pass = touch(&mut m, order, stride, write, sparse_v);
        m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
        pass
    } else {
        let mut cfg = config(region + 64 * MIB, 0, None);
        cfg.fault_threads = threads;
        if sys == IN_THREAD {
            cfg.flags |= usermm::consts::UMM_F_INTHREAD_FAULTS;
        }
        let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
        let mut m = space.map_anon(region).map_err(|e| format!("usermm mmap: {e:?}"))?;
        if sparse_v {
            m.advise(MADV_RANDOM).map_err(|e| format!("usermm madvise: {e:?}"))?;
        }
        let pass = touch(&mut m, order, stride, write, sparse_v);
        m.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
        space.close().map_err(|e| format!("usermm close: {e:?}"))?;
        pass
    })
}

/// Adds a measured pass to the experiment; a sparse pass's latencies also
/// go to `lat_pool` (per system and variant, for the CDF plot).
fn record(
    e: &mut Experiment,
    lat_pool: &mut Vec<(String, Vec<f64>)>,
    sys: &str,
    variant: &str,
    pass: Pass,
    sparse_v: bool,
) {
    e.add(sys, variant, "throughput", "pages/s", pass.touches as f64 / (pass.ns as f64 / 1e9));
    if sparse_v {
        let mut l = pass.lat_us;
        let (p50, p99, max) = p50_p99_max(&mut l);
        e.add(sys, variant, "p50", "µs", p50);
        e.add(sys, variant, "p99", "µs", p99);
        e.add(sys, variant, "max", "µs", max);
        let key = format!("{sys} {variant}");
        match lat_pool.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.extend(l),
            None => lat_pool.push((key, l)),
        }
    }
}

/// The CDF plot of the sparse touches' latencies, all runs pooled.
fn latency_plot(lat_pool: &mut [(String, Vec<f64>)]) -> String {
    let series: Vec<svg::Series> = lat_pool
        .iter_mut()
        .map(|(k, v)| {
            v.sort_by(f64::total_cmp);
            svg::Series { name: k.clone(), points: svg::cdf(v, 400) }
        })
        .collect();
    let plot = svg::Plot {
        title: "fault: sparse first-touch latency (CDF, all runs)",
        x_label: "latency per touch (µs)",
        y_label: "fraction of touches ≤ x",
        log_x: true,
        log_y: false,
        markers: false,
    };
    svg::render(&plot, &series)
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let size = p.int("size_mib") as usize * MIB;
    let sparse_size = p.int("sparse_size_mib") as usize * MIB;
    let stride_sparse = (p.int("sparse_stride_kib") as usize * 1024).max(PAGE) / PAGE * PAGE;
    let runs = p.int("runs").max(1) as usize;
    let warmup = p.int("warmup") as usize;
    let threads = p.int("fault_threads") as u32;
    if size < PAGE || sparse_size < stride_sparse {
        return Err("fault: size_mib must be ≥ 1 and sparse_size_mib ≥ the stride".into());
    }
    let pages = size / PAGE;
    let seq: Vec<u32> = (0..pages as u32).collect();
    let random = Rng::new(p.int("seed")).permutation(pages);
    let sparse: Vec<u32> = (0..(sparse_size / stride_sparse) as u32).collect();

    let mut e = Experiment::new("fault", "first touch of a fresh region", p.pairs());
    let mut lat_pool: Vec<(String, Vec<f64>)> = Vec::new();
    let mut errors = Vec::new();
    let mut floor_error: Option<String> = None;
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        for v in VARIANTS {
            for write in [false, true] {
                let variant = format!("{v}-{}", if write { "write" } else { "read" });
                let (order, stride, region) = match v {
                    "seq" => (&seq, PAGE, size),
                    "random" => (&random, PAGE, size),
                    _ => (&sparse, stride_sparse, sparse_size),
                };
                let sparse_v = v == "sparse";
                let [a, b] = systems(r);
                let mut syss = if r.is_multiple_of(2) { vec![a, b, IN_THREAD] } else { vec![IN_THREAD, a, b] };
                if sparse_v && floor_error.is_none() {
                    syss.insert(if r.is_multiple_of(2) { 0 } else { 3 }, FLOOR);
                }
                for sys in syss {
                    prog.say(&format!("{variant} {sys} {}", run_label(r, warmup, runs)));
                    let pass = match one_pass(sys, region, order, stride, write, sparse_v, threads) {
                        // (The floor is context, not a system under test:
                        // where it cannot be set up, its rows say why.)
                        Err(why) if sys == FLOOR => {
                            prog.say(&format!("{FLOOR}: not measured: {why}"));
                            floor_error = Some(why);
                            continue;
                        }
                        r => r?,
                    };
                    if pass.errors > 0 {
                        let msg = format!("{sys} {variant}: {} pages read back wrong", pass.errors);
                        prog.say(&format!("ERROR: {msg}"));
                        errors.push(msg);
                    }
                    if !measured {
                        continue;
                    }
                    record(&mut e, &mut lat_pool, sys, &variant, pass, sparse_v);
                }
            }
        }
    }
    for w in ["read", "write"] {
        e.ratio_goal(&format!("sequential {w} throughput"), &format!("seq-{w}"), "throughput", true, 0.8, 1.0);
    }
    for w in ["read", "write"] {
        e.ratio_goal(&format!("random-order {w} throughput"), &format!("random-{w}"), "throughput", true, 0.5, 0.8);
    }
    for w in ["read", "write"] {
        e.ratio_goal(&format!("sparse {w} p50 latency"), &format!("sparse-{w}"), "p50", false, 6.0, 3.0);
    }
    for w in ["read", "write"] {
        let v = format!("sparse-{w}");
        let value = e.med(IN_THREAD, &v, "p50") / e.med("kernel", &v, "p50");
        e.goals.push(crate::report::Goal {
            what: format!("sparse {w} p50 latency, faults resolved in the faulting thread"),
            how: format!("{IN_THREAD}/kernel, {v} p50"),
            value,
            unit: "×".into(),
            at_least: false,
            threshold: 4.0,
            goal: 4.0,
        });
    }
    match &floor_error {
        None => floor_table(&mut e),
        Some(why) => e.notes.push(format!("`{FLOOR}`: not measured ({why}).")),
    }
    e.notes.push(format!(
        "`{FLOOR}` (sparse variants): the mechanism under `{IN_THREAD}` with nothing of usermm's on top — an \
         anonymous mapping registered (missing pages) with a userfaultfd of its own that has `UFFD_FEATURE_SIGBUS`, \
         whose faults usermm's SIGBUS handler resolves with one ioctl (`UFFDIO_ZEROPAGE` for a read, `UFFDIO_COPY` \
         of a zero page for a write) and returns: no plan, no lock, no commit, no budget. Any design that resolves \
         a fault in the faulting thread pays at least this; the table beside the goals says how much of the \
         in-thread ratio it already is."
    ));
    e.notes.push(format!(
        "`{IN_THREAD}`: the same space with `UMM_F_INTHREAD_FAULTS` (no handler thread: each fault is resolved by \
         the faulting thread's SIGBUS handler)."
    ));
    e.notes.push(format!(
        "Each measurement maps a fresh region ({} MiB for seq/random, {} MiB for sparse with one page touched every {} KiB \
         = {} touches). usermm: a fresh space per measurement, budget = region + 64 MiB, no swap. kernel: plain \
         `mmap(MAP_PRIVATE|MAP_ANONYMOUS)` (transparent huge pages: `{}`). A read touch is one 8-byte read (summed; \
         fresh memory must read 0), a write touch one 8-byte write (verified afterwards, untimed). Throughput is \
         touches / wall time of the pass; sparse latencies are per-touch `CLOCK_MONOTONIC` differences, p50/p99/max \
         per run, then median over runs.",
        size / MIB,
        sparse_size / MIB,
        stride_sparse / 1024,
        sparse.len(),
        thp_setting()
    ));
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    e.plots.push(("fault-sparse-latency.svg".into(), latency_plot(&mut lat_pool)));
    Ok(e)
}

/// The in-thread sparse rows against their floor and the kernel (medians
/// of the runs).
fn floor_table(e: &mut Experiment) {
    let mut rows = Vec::new();
    for w in ["read", "write"] {
        let v = format!("sparse-{w}");
        let (k, f, it) = (e.med("kernel", &v, "p50"), e.med(FLOOR, &v, "p50"), e.med(IN_THREAD, &v, "p50"));
        rows.push(vec![
            v.clone(),
            fmt_num(k),
            fmt_num(f),
            fmt_num(it),
            format!("{}×", fmt_num(f / k)),
            format!("{}×", fmt_num(it / k)),
            format!("{}×", fmt_num(it / f)),
        ]);
    }
    e.tables.push(Table {
        title: "sparse fault p50 resolved in the faulting thread: usermm against the mechanism's floor (µs, medians)"
            .into(),
        head: [
            "variant",
            "kernel",
            "floor",
            "usermm (in-thread)",
            "floor / kernel",
            "in-thread / kernel",
            "in-thread / floor",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
}

/// The host's transparent huge page mode (the bracketed word).
pub fn thp_setting() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| s.split('[').nth(1).and_then(|t| t.split(']').next()).map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}
