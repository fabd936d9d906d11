//! `reclaim`: a working set 4× usermm's budget.
//!
//! Phases, on one fresh region per run and system:
//! 1. `seq-write`: write every page in order (usermm must swap out);
//! 2. `seq-read`: read-verify every page in order (usermm must swap in);
//! 3. `hotcold`: random touches (read-verify), `hot_touch_pct`% on a hot set
//!    of `hot_pct_of_budget`% of the budget, the rest on the cold remainder;
//!    afterwards, the fraction of the hot set still resident (`mincore`).
//!
//! The kernel row runs the same phases on plain anonymous memory. This host
//! has no swap, so the whole working set fits in RAM there: the kernel row
//! is an upper bound with no budget, not a like-for-like reclaim.
//! The `disk` row is the swap directory's own sequential `O_DIRECT` write
//! bandwidth, measured in the same run; usermm's swap-out throughput is
//! compared with it.

use usermm::Space;
use usermm_sys::host::{disk_write_bandwidth, HostMap};
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, read8, systems, tag, write8, Progress, Rng, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};

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

struct Phase {
    ns: u64,
    touches: usize,
    errors: usize,
    swapouts: u64,
    swapins: u64,
    major_faults: u64,
}

/// Runs the three phases on `buf`; `stats` gives (swapouts, swapins) so far.
fn phases(
    buf: &mut [u8],
    stats: &dyn Fn() -> (u64, u64, u64),
    hot_pages: usize,
    hot_pct: u64,
    mix: usize,
    seed: u64,
) -> [Phase; 3] {
    let pages = buf.len() / PAGE;
    let phase = |f: &mut dyn FnMut() -> (usize, usize)| {
        let (o0, i0, f0) = stats();
        let t0 = now_ns();
        let (touches, errors) = f();
        let ns = now_ns() - t0;
        let (o1, i1, f1) = stats();
        Phase { ns, touches, errors, swapouts: o1 - o0, swapins: i1 - i0, major_faults: f1 - f0 }
    };
    let w = phase(&mut || {
        for p in 0..pages {
            write8(buf, p * PAGE, tag(p));
        }
        (pages, 0)
    });
    let r = phase(&mut || {
        let mut bad = 0;
        for p in 0..pages {
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
        }
        (pages, bad)
    });
    let mut rng = Rng::new(seed);
    let cold = (pages - hot_pages).max(1) as u64;
    let h = phase(&mut || {
        let mut bad = 0;
        for _ in 0..mix {
            let p = if rng.below(100) < hot_pct {
                rng.below(hot_pages as u64) as usize
            } else {
                hot_pages + rng.below(cold) as usize
            };
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
        }
        (mix, bad)
    });
    [w, r, h]
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
    let mut e = Experiment::new("reclaim", "working set 4× the budget: LRU reclaim and swap", p.pairs());
    let mut errors = Vec::new();
    let mut direct_io = None;
    for r in 0..runs {
        for sys in systems(r) {
            prog.say(&format!("{sys} run {}/{runs}", r + 1));
            let hit: (f64, usize);
            let (res, hot_resident) = if sys == "kernel" {
                let mut m = HostMap::anon(set, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
                let res = phases(&mut m, &|| (0, 0, 0), hot_pages, hot_pct, mix, seed);
                hit = hot_hit_rate(&m, &|| 0, hot_pages, hot_pct, mix, seed);
                let inc = m.mincore().map_err(|e| format!("kernel mincore: {e:?}"))?;
                let hot = inc[..hot_pages].iter().filter(|b| *b & 1 == 1).count();
                m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
                (res, hot)
            } else {
                let cfg = config(budget, set + budget, Some(&dir));
                let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
                direct_io = Some(space.stats().swap_direct_io == 1);
                let mut m = space.map_anon(set).map_err(|e| format!("usermm mmap: {e:?}"))?;
                let st = || {
                    let s = space.stats();
                    (s.swapouts, s.swapins, s.major_faults)
                };
                let res = phases(&mut m, &st, hot_pages, hot_pct, mix, seed);
                hit = hot_hit_rate(&m, &|| space.stats().swapins, hot_pages, hot_pct, mix, seed);
                let mut inc = vec![0u8; hot_pages];
                space.mincore(m.addr(), hot_pages * PAGE, &mut inc).map_err(|e| format!("usermm mincore: {e:?}"))?;
                let hot = inc.iter().filter(|b| *b & 1 == 1).count();
                m.unmap().map_err(|e| format!("usermm munmap: {e:?}"))?;
                space.close().map_err(|e| format!("usermm close: {e:?}"))?;
                (res, hot)
            };
            for (name, ph) in ["seq-write", "seq-read", "hotcold"].iter().zip(&res) {
                if ph.errors > 0 {
                    let msg = format!("{sys} {name}: {} touches read back wrong data", ph.errors);
                    prog.say(&format!("ERROR: {msg}"));
                    errors.push(msg);
                }
                let unit = if *name == "hotcold" { "touches/s" } else { "pages/s" };
                e.add(sys, name, "throughput", unit, ph.touches as f64 / (ph.ns as f64 / 1e9));
                if sys == "usermm" {
                    e.add(sys, name, "swapouts", "pages", ph.swapouts as f64);
                    e.add(sys, name, "swapins", "pages", ph.swapins as f64);
                    e.add(sys, name, "major_faults", "faults", ph.major_faults as f64);
                }
            }
            let w = &res[0];
            if sys == "usermm" {
                let mib_s = (w.swapouts as f64 * PAGE as f64 / MIB as f64) / (w.ns as f64 / 1e9);
                e.add(sys, "seq-write", "swapout_throughput", "MiB/s", mib_s);
            }
            e.add(sys, "hotcold", "hot_resident", "fraction", hot_resident as f64 / hot_pages as f64);
            e.add(sys, "hotcold", "hot_hit_rate", "fraction", hit.0);
            if hit.1 > 0 {
                let msg = format!("{sys} hot-hit probe: {} touches read back wrong data", hit.1);
                prog.say(&format!("ERROR: {msg}"));
                errors.push(msg);
            }
        }
        prog.say(&format!("disk bandwidth run {}/{runs}", r + 1));
        let d = disk_write_bandwidth(&dir, disk, MIB).map_err(|e| format!("disk bandwidth in {dir}: {e:?}"))?;
        let variant = if d.direct { "o_direct-seq-write" } else { "buffered-seq-write+fsync" };
        e.add("disk", variant, "bandwidth", "MiB/s", d.bytes as f64 / MIB as f64 / (d.ns as f64 / 1e9));
    }
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
    e.notes.push(format!(
        "Working set {} MiB, usermm budget {} MiB (swap file in `{dir}`, O_DIRECT: {}). Hot set: {} pages ({}% of the \
         budget) taking {}% of {} hot/cold touches; `hot_resident` is the fraction of the hot set `mincore` reports \
         resident right after the hot/cold phase; `hot_hit_rate` is 1 − (swap-ins during hot \
         touches)/(hot touches), measured over a second, untimed run of {} hot/cold touches in which every hot touch \
         is bracketed by `Space::stats()` (the kernel has no swap: 1 by construction). Every touch is one 8-byte access; reads are verified against what \
         the write phase stored. swap-outs/swap-ins (pages) and major faults are deltas of `Space::stats()` over each phase; \
         `swapout_throughput` = pages swapped out during seq-write × 4 KiB / duration of seq-write.",
        set / MIB,
        budget / MIB,
        direct_io.map_or("?".into(), |d| d.to_string()),
        hot_pages,
        p.int("hot_pct_of_budget"),
        hot_pct,
        mix,
        mix,
    ));
    e.notes.push(
        "**kernel rows are an upper bound**: this host has no swap, so the kernel keeps the whole working set in RAM \
         (no budget, no reclaim). They show the cost of the touches themselves, not a kernel reclaiming under the \
         same limit."
            .into(),
    );
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    Ok(e)
}
