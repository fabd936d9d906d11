//! The kernel side of `lockonfault`: a host `mmap` of the test file per run,
//! the lock call of each row (`mlock`, `mlock2(MLOCK_ONFAULT)`, `mlock` per
//! access, the SIGSEGV batch locker), `vm.max_map_count` raised for the rows
//! that split the mapping, and the process's `Rss`/`Locked` before and after.

use usermm::consts::{MLOCK_ONFAULT, PROT_NONE, PROT_READ};
use usermm_sys::host::{peek_u8, process_faults, HostFileMap, SegvBatchLocker};
use usermm_sys::{now_ns, Errno};

use super::file::io;
use super::{read_all, Ctx, Method, Sample};
use crate::common::PAGE;

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

fn max_map_count() -> Result<u64, String> {
    let s = std::fs::read_to_string(MAX_MAP_COUNT).map_err(|e| io(MAX_MAP_COUNT, e))?;
    s.trim().parse().map_err(|e| io(MAX_MAP_COUNT, e))
}

/// `vm.max_map_count` raised for one run; the old value is written back on
/// drop (also when the run fails).
struct MapCountRaise {
    old: u64,
}

impl MapCountRaise {
    /// Raises `vm.max_map_count` to `want` if it is lower. `Ok(None)`: it
    /// already was high enough.
    fn to(want: u64) -> Result<Option<MapCountRaise>, String> {
        let old = max_map_count()?;
        if old >= want {
            return Ok(None);
        }
        std::fs::write(MAX_MAP_COUNT, want.to_string())
            .map_err(|e| format!("cannot raise vm.max_map_count from {old} to {want}: {e}"))?;
        Ok(Some(MapCountRaise { old }))
    }
}

impl Drop for MapCountRaise {
    fn drop(&mut self) {
        let _ = std::fs::write(MAX_MAP_COUNT, self.old.to_string());
    }
}

/// `(Rss, Locked)` of the whole process in KiB, from `/proc/self/smaps_rollup`.
fn rss_locked_kib() -> Result<(u64, u64), String> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").map_err(|e| io("smaps_rollup", e))?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| format!("smaps_rollup: no {name}"))
    };
    Ok((field("Rss:")?, field("Locked:")?))
}

/// The timed loop with an `mlock` of the page before every read. Returns
/// `(ns, sum, first failure as (read index, errno))`.
#[inline(never)]
fn read_all_mlock_each(m: &HostFileMap, offs: &[usize]) -> (u64, u64, Option<(usize, Errno)>) {
    let base = m.addr();
    let mut sum = 0u64;
    let mut err = None;
    let t0 = now_ns();
    for (i, &o) in offs.iter().enumerate() {
        if let Err(e) = m.mlock(o & !(PAGE - 1), PAGE) {
            err.get_or_insert((i, e));
        }
        sum = sum.wrapping_add(peek_u8(base + o) as u64);
    }
    (now_ns() - t0, sum, err)
}

/// `vm.max_map_count` raised for the rows that split the mapping (up to one
/// VMA per locked island of pages); what was done is logged in `cx` once.
fn raise_map_count(cx: &mut Ctx, method: Method) -> Option<MapCountRaise> {
    if !matches!(method, Method::MlockEachAccess | Method::Segv(_)) {
        return None;
    }
    let want = 2 * (cx.file.len / PAGE) as u64 + 1000;
    match MapCountRaise::to(want) {
        Ok(r) => {
            if let Some(r) = &r {
                let msg = format!("raised vm.max_map_count from {} to {want} (restored after the run)", r.old);
                if !cx.map_count_log.contains(&msg) {
                    cx.map_count_log.push(msg);
                }
            }
            r
        }
        Err(m) => {
            if !cx.map_count_log.contains(&m) {
                cx.map_count_log.push(m);
            }
            None
        }
    }
}

/// The timed reads of one kernel row over the mapping `m`, into `s`.
fn process(m: &HostFileMap, offs: &[usize], method: Method, s: &mut Sample) -> Result<(), String> {
    match method {
        Method::Segv(batch) => {
            let locker = SegvBatchLocker::install(m, batch).map_err(|e| format!("sigaction: {e:?}"))?;
            (s.proc_ns, s.sum) = read_all(m.addr(), offs);
            s.extra.push(("sigsegv", locker.faults() as f64));
            if let Some(e) = locker.error() {
                s.failure = Some(format!("mprotect/mlock in the SIGSEGV handler failed: {}", e));
            }
        }
        Method::MlockEachAccess => {
            let (ns, sum, err) = read_all_mlock_each(m, offs);
            (s.proc_ns, s.sum) = (ns, sum);
            if let Some((i, e)) = err {
                s.failure = Some(format!("mlock failed with {} from read {i} on", e));
            }
        }
        _ => (s.proc_ns, s.sum) = read_all(m.addr(), offs),
    }
    Ok(())
}

/// One run of a kernel row: a host mapping of the file, the lock call of
/// `method` (setup), the reads (processing).
pub(super) fn run_kernel(cx: &mut Ctx, method: Method) -> Result<Sample, String> {
    let len = cx.file.len;
    let f = cx.file.open()?;
    let _raise = raise_map_count(cx, method);
    let (rss0, locked0) = rss_locked_kib()?;
    let prot = if matches!(method, Method::Segv(_)) { PROT_NONE } else { PROT_READ };
    let mut s = Sample::default();
    let t0 = now_ns();
    let m = HostFileMap::open_prot(&f, len, prot).map_err(|e| format!("kernel mmap: {e:?}"))?;
    let locked = match method {
        Method::MlockAll => m.mlock(0, len),
        Method::OnFault => m.mlock2(0, len, MLOCK_ONFAULT),
        _ => Ok(()),
    };
    s.setup_ns = now_ns() - t0;
    if let Err(e) = locked {
        s.failure = Some(format!(
            "{} failed: {}",
            if method == Method::OnFault { "mlock2(MLOCK_ONFAULT)" } else { "mlock" },
            e
        ));
        m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
        return Ok(s);
    }
    let (min0, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    process(&m, cx.offs, method, &mut s)?;
    let (min1, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    s.faults = ((min1 - min0) + (maj1 - maj0)) as f64;
    let (rss1, locked1) = rss_locked_kib()?;
    s.resident_pages = (rss1.saturating_sub(rss0) * 1024 / PAGE as u64) as f64;
    s.locked_pages = (locked1.saturating_sub(locked0) * 1024 / PAGE as u64) as f64;
    // Untimed: with up to one VMA per page this takes a while.
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok(s)
}
