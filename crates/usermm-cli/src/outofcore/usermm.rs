//! The `usermm` system of `outofcore`: the file mapped shared and read-only
//! in a fresh space with the budget and no swap, with the workload's advice.

use std::os::fd::AsRawFd;

use usermm::consts::{MADV_RANDOM, MADV_SEQUENTIAL, MAP_SHARED, PROT_READ};
use usermm::Space;
use usermm_sys::host::peek_u64;

use super::workload::drive;
use super::{Measured, Setup};
use crate::common::config;

/// One workload in a fresh space.
/// `flags`: `UMM_F_*` of the space (the in-thread row).
pub(super) fn run_usermm(s: &Setup, workload: &str, offs: &[usize], flags: u32) -> Result<Measured, String> {
    let f = s.file.open_cold(s.usermm_rdwr)?;
    let mut cfg = config(s.budget, 0, None);
    cfg.flags |= flags;
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let a = space.mmap(0, s.len, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let advice = if workload == "seq-scan" { MADV_SEQUENTIAL } else { MADV_RANDOM };
    space.madvise(a, s.len, advice).map_err(|e| format!("usermm madvise({advice}): {e:?}"))?;
    let st0 = space.stats();
    let out = drive(offs, s.every, |off| peek_u64(a + off));
    let st1 = space.stats();
    let unmapped = space.munmap(a, s.len);
    let st2 = space.stats();
    if let Err(e) = unmapped {
        return Err(format!("usermm munmap: {e:?} (an O_RDONLY descriptor? see --usermm-rdwr)"));
    }
    let page = space.page_size() as f64;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Measured {
        out,
        peak: st1.resident_pages_max as f64 * page,
        misses: st1.faults - st0.faults,
        writebacks: st2.writebacks - st0.writebacks,
        pct: None,
        pages_read: None,
        oom_kills: 0,
    })
}
