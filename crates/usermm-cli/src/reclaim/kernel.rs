//! The kernel side of `reclaim`: the phases on anonymous memory the kernel
//! maps (`kernel (no limit, upper bound)` in this process, `kernel-memcg` in
//! a child process in a memory cgroup), the child's entry point and the
//! parent's reading of its output.

use usermm_sys::host::{process_faults, resident_pages, HostMap};

use super::workload::{hot_hit_rate, phases, Phase};
use super::{Measured, Shape, PHASES};
use crate::common::PAGE;
use crate::memcg;

/// The phases on anonymous memory mapped by the kernel; `stats` as for
/// [`phases`], `majflt` the process's major faults so far.
pub(super) fn kernel_phases(
    sh: Shape,
    stats: &dyn Fn() -> (u64, u64, u64, u64, u64),
    majflt: &dyn Fn() -> u64,
) -> Result<Measured, String> {
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

pub(super) fn majflt() -> u64 {
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
        let (o, i, e) = memcg::vmstat_reclaim();
        (o, i, majflt(), e, 0)
    };
    let m = kernel_phases(sh, &stats, &majflt)?;
    for (name, ph) in PHASES.iter().zip(&m.phases) {
        println!(
            "phase {name} {} {} {} {} {} {} {}",
            ph.ns, ph.touches, ph.errors, ph.swapouts, ph.swapins, ph.major_faults, ph.evictions
        );
    }
    println!("hit {} {}", m.hit.0, m.hit.1);
    println!("hot_resident {}", m.hot_resident);
    Ok(())
}

/// Reads the child's lines back.
pub(super) fn parse_child(out: &str) -> Result<Measured, String> {
    let bad = || format!("unexpected output of the kernel-memcg child:\n{out}");
    let mut phases: Vec<Phase> = Vec::new();
    let (mut hit, mut hot_resident) = (None, None);
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.first().copied() {
            Some("phase") if w.len() == 9 && w[1] == PHASES[phases.len().min(PHASES.len() - 1)] => {
                let n: Vec<u64> = w[2..].iter().map(|x| x.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
                phases.push(Phase {
                    ns: n[0],
                    touches: n[1] as usize,
                    errors: n[2] as usize,
                    swapouts: n[3],
                    swapins: n[4],
                    major_faults: n[5],
                    evictions: n[6],
                    parked_faults: 0,
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
