//! The usermm side of `reclaim`: a space with the budget and a swap file of
//! `set + budget`, the phases on an anonymous region of it, and the hot
//! set's residency through `Space::mincore`.

use usermm::Space;

use super::workload::{hot_hit_rate, phases};
use super::{Measured, Shape};
use crate::common::{config, PAGE};

/// One run of the phases in a fresh space; `direct_io` is set to whether its
/// swap file uses O_DIRECT.
pub(super) fn usermm_run(
    sh: Shape,
    budget: usize,
    dir: &str,
    direct_io: &mut Option<bool>,
) -> Result<Measured, String> {
    let cfg = config(budget, sh.set + budget, Some(dir));
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    *direct_io = Some(space.stats().swap_direct_io == 1);
    let mut m = space.map_anon(sh.set).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let st = || {
        let s = space.stats();
        (s.swapouts, s.swapins, s.major_faults, s.evictions, s.minor_faults)
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
