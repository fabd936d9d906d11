//! `fork`: what a fork of a process with memory under pressure costs, usermm
//! against the kernel under the same limit.
//!
//! Per run and system: map `set_mib`, write every page (three quarters go
//! out under a budget of a quarter), read `touches` random pages (the
//! touches before the fork: swap-ins, one in four a resident hit), then
//! `fork`; the child reads `touches` other random pages, each checked,
//! and exits. Measured: the parent's `fork` call (until it returns there),
//! the child's start (from the call to the child's first instruction after
//! it), and the child's first touches against the parent's before the fork.
//!
//! Systems: `usermm` (a space of budget B with its swap file: the child
//! reads the parent's slots in place), `kernel-memcg` (the same in a child
//! process in a memory cgroup of limit B with a swap file; its fork's child
//! is charged to the same group), `kernel (no limit, upper bound)`.

use std::time::Instant;

use usermm::Space;
use usermm_sys::host::HostMap;
use usermm_sys::now_ns;
use usermm_sys::thread::{fork_run_timed, ChildExit};

use crate::common::{config, default_swap_dir, read8, run_label, tag, write8, Progress, Rng, MIB, PAGE};
use crate::memcg::{self, KernelLimit};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};

pub fn params(full: bool) -> Params {
    Params::default()
        .def("set_mib", Kind::Int, if full { 1024 } else { 256 }, "memory touched before the fork (MiB)")
        .def("budget_pct", Kind::Int, 25, "usermm's budget and the kernel's limit, % of the set")
        .def("touches", Kind::Int, if full { 8000 } else { 2000 }, "random page reads before the fork and in the child")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (one warm-up before)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the swap files")
        .def("seed", Kind::Int, 11, "PRNG seed of the touches")
}

const MEMCG: &str = "kernel-memcg";
const NOLIMIT: &str = "kernel (no limit, upper bound)";

/// One run of one system (ns).
struct Measured {
    fork: u64,
    start: u64,
    touch: u64,
    child_touch: u64,
}

/// The workload on `buf` (see the module's documentation). `Err`: a wrong
/// byte read, in the parent or in the child, or a child that failed.
fn workload(buf: &mut [u8], touches: usize, seed: u64) -> Result<Measured, String> {
    let pages = buf.len() / PAGE;
    for p in 0..pages {
        write8(buf, p * PAGE, tag(p));
    }
    let mut rng = Rng::new(seed);
    let t = Instant::now();
    let mut bad = 0;
    for _ in 0..touches {
        let p = rng.index(pages);
        bad += usize::from(read8(buf, p * PAGE) != tag(p));
    }
    let touch = t.elapsed().as_nanos() as u64 / touches as u64;
    if bad > 0 {
        return Err(format!("{bad} wrong pages read before the fork"));
    }
    // The child's answers: its start, ns a touch, wrong pages.
    let mut out = HostMap::shared_anon(PAGE, 0).map_err(|e| format!("a shared page: {e:?}"))?;
    let buf = &*buf;
    let t0 = now_ns();
    let (exit, returned) = fork_run_timed(300, || {
        let start = now_ns();
        let mut rng = Rng::new(seed ^ 0x5eed);
        let mut bad = 0u64;
        for _ in 0..touches {
            let p = rng.index(pages);
            bad += u64::from(read8(buf, p * PAGE) != tag(p));
        }
        let per = (now_ns() - start) / touches as u64;
        write8(&mut out, 0, start);
        write8(&mut out, 8, per);
        write8(&mut out, 16, bad);
        0
    })
    .map_err(|e| format!("fork: {e:?}"))?;
    if exit != ChildExit::Exited(0) {
        return Err(format!("the forked child ended with {exit:?}"));
    }
    let bad = read8(&out, 16);
    if bad > 0 {
        return Err(format!("the forked child read {bad} wrong pages"));
    }
    Ok(Measured { fork: returned - t0, start: read8(&out, 0).saturating_sub(t0), touch, child_touch: read8(&out, 8) })
}

fn usermm_run(set: usize, budget: usize, touches: usize, seed: u64, dir: &str) -> Result<Measured, String> {
    let s = Space::open(&config(budget, set + budget, Some(dir))).map_err(|e| format!("usermm open: {e:?}"))?;
    let mut m = s.map_anon(set).map_err(|e| format!("usermm map: {e:?}"))?;
    let r = workload(&mut m, touches, seed);
    let held = s.stats();
    drop(m);
    r.map_err(|e| format!("usermm: {e} ({held:?})"))
}

fn kernel_run(set: usize, touches: usize, seed: u64) -> Result<Measured, String> {
    let mut m = HostMap::anon(set, 0).map_err(|e| format!("kernel mmap: {e:?}"))?;
    workload(&mut m, touches, seed)
}

/// `usermm __kernel-memcg-child fork SET TOUCHES SEED`: the workload in a
/// memory cgroup (the parent put it there before the go byte); prints
/// `fork FORK START TOUCH CHILD_TOUCH` (ns).
pub fn kernel_memcg_child(args: &[String]) -> Result<(), String> {
    let n = |i: usize| -> Result<u64, String> {
        args.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {args:?} is no number"))
    };
    let (set, touches, seed) = (n(0)? as usize, n(1)? as usize, n(2)?);
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let m = kernel_run(set, touches, seed)?;
    println!("fork {} {} {} {}", m.fork, m.start, m.touch, m.child_touch);
    Ok(())
}

fn parse_child(out: &str) -> Result<Measured, String> {
    let l = out.lines().find(|l| l.starts_with("fork ")).ok_or_else(|| format!("no result from the child: {out}"))?;
    let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    match v[..] {
        [fork, start, touch, child_touch] => Ok(Measured { fork, start, touch, child_touch }),
        _ => Err(format!("unexpected output of the child: {l}")),
    }
}

fn add(e: &mut Experiment, sys: &str, m: &Measured) {
    e.add(sys, "fork", "parent_returns", "ms", m.fork as f64 / 1e6);
    e.add(sys, "fork", "child_runs", "ms", m.start as f64 / 1e6);
    e.add(sys, "touch", "before_fork", "µs", m.touch as f64 / 1e3);
    e.add(sys, "touch", "child_first", "µs", m.child_touch as f64 / 1e3);
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let set = p.int("set_mib") as usize * MIB;
    let budget = (set / 100 * p.int("budget_pct") as usize) / PAGE * PAGE;
    let touches = p.int("touches").max(1) as usize;
    let runs = p.int("runs").max(1) as usize;
    let (seed, dir) = (p.int("seed"), p.text("swap_dir"));
    if budget < PAGE || budget >= set {
        return Err("fork: need 0 < budget_pct < 100 and a set of at least a few pages".into());
    }
    let mut e = Experiment::new("fork", "fork of a process with memory under pressure", p.pairs());
    prog.say(&format!(
        "{MEMCG}: a {} MiB swap file in {dir}, {} MiB memory groups",
        (set + budget) / MIB,
        budget / MIB
    ));
    let limit = KernelLimit::setup(budget, set + budget, &dir);
    if let Err(why) = &limit {
        prog.say(&format!("{MEMCG}: not measured: {why}"));
    }
    for r in 0..=runs {
        let order = if r.is_multiple_of(2) { ["usermm", MEMCG, NOLIMIT] } else { [MEMCG, "usermm", NOLIMIT] };
        for sys in order {
            let m = match (sys, &limit) {
                ("usermm", _) => usermm_run(set, budget, touches, seed + r as u64, &dir)?,
                (NOLIMIT, _) => kernel_run(set, touches, seed + r as u64)?,
                (_, Ok(l)) => {
                    let args =
                        ["fork".to_string(), set.to_string(), touches.to_string(), (seed + r as u64).to_string()];
                    parse_child(&l.run_child(&args)?.stdout)?
                }
                (_, Err(_)) => continue,
            };
            prog.say(&format!(
                "{sys} {}: fork {:.2} ms, child runs after {:.2} ms, touches {:.1} µs before, {:.1} µs in the child",
                run_label(r, 1, runs),
                m.fork as f64 / 1e6,
                m.start as f64 / 1e6,
                m.touch as f64 / 1e3,
                m.child_touch as f64 / 1e3
            ));
            if r > 0 {
                add(&mut e, sys, &m);
            }
        }
    }
    drop(limit);
    e.ratio_goal_vs(MEMCG, "fork returns in the parent", "fork", "parent_returns", false, 2.0, 1.0);
    e.ratio_goal_vs(MEMCG, "the child runs", "fork", "child_runs", false, 2.0, 1.0);
    let own = e.med("usermm", "touch", "child_first") / e.med("usermm", "touch", "before_fork");
    e.goals.push(Goal {
        what: "the child's first touches against a touch before the fork".into(),
        how: "usermm, touch child_first / before_fork".into(),
        value: own,
        unit: "×".into(),
        at_least: false,
        threshold: 2.0,
        goal: 1.0,
    });
    let k = e.med(MEMCG, "touch", "child_first") / e.med(MEMCG, "touch", "before_fork");
    e.notes.push(format!(
        "{} MiB written, then {touches} random page reads before the fork and as many in the child (every page \
         checked); budget and limit {} MiB. The kernel-memcg child's first touches cost {:.2}× its touches before \
         the fork. usermm's child reads the parent's swap slots in place (docs/design.md, \"fork\").",
        set / MIB,
        budget / MIB,
        k
    ));
    Ok(e)
}
