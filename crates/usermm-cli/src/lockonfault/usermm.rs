//! The usermm side of `lockonfault`: a fresh space per run whose budget holds
//! the file, the file mapped shared and read-only, `Space::mlock` or
//! `Space::mlock2(MLOCK_ONFAULT)` over it, and the space's `Stats` around the
//! reads.

use std::os::fd::AsRawFd;

use usermm::consts::{MAP_SHARED, MLOCK_ONFAULT, PROT_READ, UMM_F_INTHREAD_FAULTS, UMM_F_KEEP_FILE_CACHE};
use usermm::{Config, Space};
use usermm_sys::now_ns;

use super::{read_all, Ctx, Method, Sample};

/// One run of a usermm row (`in_thread`: with `UMM_F_INTHREAD_FAULTS`).
pub(super) fn run_usermm(cx: &Ctx, method: Method, in_thread: bool) -> Result<Sample, String> {
    let len = cx.file.len;
    let f = cx.file.open()?;
    let cfg = Config {
        budget_bytes: cx.budget,
        memlock_bytes: cx.budget,
        swap_bytes: 0,
        flags: UMM_F_KEEP_FILE_CACHE | if in_thread { UMM_F_INTHREAD_FAULTS } else { 0 },
        ..Config::default()
    };
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let mut s = Sample::default();
    let t0 = now_ns();
    let a = space.mmap(0, len, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let locked = match method {
        Method::MlockAll => space.mlock(a, len),
        Method::OnFault => space.mlock2(a, len, MLOCK_ONFAULT),
        _ => Ok(()),
    };
    s.setup_ns = now_ns() - t0;
    if let Err(e) = locked {
        s.failure = Some(format!("Space::mlock{} failed: {}", if method == Method::OnFault { "2" } else { "" }, e));
    } else {
        let st0 = space.stats();
        (s.proc_ns, s.sum) = read_all(a, cx.offs);
        let st1 = space.stats();
        s.locked_pages = st1.locked_pages as f64;
        s.resident_pages = st1.resident_pages as f64;
        s.faults = (st1.faults - st0.faults) as f64;
        s.extra.push(("major_faults", (st1.major_faults - st0.major_faults) as f64));
        s.extra.push(("evictions", (st1.evictions - st0.evictions) as f64));
    }
    space.munmap(a, len).map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(s)
}
