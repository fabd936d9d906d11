//! The kernel systems of `outofcore`: `kernel-mmap` (the host's own `mmap`
//! of the file, no limit) and `kernel-memcg` (a child process in a memory
//! cgroup limited to the budget, which runs the same reads; its side is
//! [`kernel_memcg_child`]).

use std::fs::File;

use usermm::consts::{MADV_RANDOM, MADV_SEQUENTIAL};
use usermm_sys::host::{
    fadvise, process_faults, reset_peak_rss, rss_kib, HostFileMap, POSIX_FADV_DONTNEED, POSIX_FADV_RANDOM,
    POSIX_FADV_SEQUENTIAL,
};

use super::workload::{drive, offsets, Outcome};
use super::{Measured, Setup};
use crate::common::{p50_p99_max, PAGE};
use crate::memcg::{self, KernelLimit};

/// One workload on a host mapping of the file, no limit.
pub(super) fn run_kernel(s: &Setup, workload: &str, offs: &[usize]) -> Result<Measured, String> {
    let f = s.file.open_cold(false)?;
    let (madv, fadv) = if workload == "seq-scan" {
        (MADV_SEQUENTIAL, POSIX_FADV_SEQUENTIAL)
    } else {
        (MADV_RANDOM, POSIX_FADV_RANDOM)
    };
    fadvise(&f, 0, 0, fadv).map_err(|e| format!("kernel fadvise: {e:?}"))?;
    let m = HostFileMap::open(&f, s.len).map_err(|e| format!("kernel mmap: {e:?}"))?;
    m.madvise(madv).map_err(|e| format!("kernel madvise: {e:?}"))?;
    reset_peak_rss().map_err(|e| format!("clear_refs: {e:?}"))?;
    let (rss0, _) = rss_kib().map_err(|e| format!("rss: {e:?}"))?;
    let (_, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let out = drive(offs, s.every, |off| m.read_u64(off));
    let (_, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let (_, hwm) = rss_kib().map_err(|e| format!("rss: {e:?}"))?;
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    let _ = fadvise(&f, 0, 0, POSIX_FADV_DONTNEED);
    Ok(Measured {
        out,
        peak: hwm.saturating_sub(rss0) as f64 * 1024.0,
        misses: maj1 - maj0,
        writebacks: 0,
        pct: None,
        pages_read: None,
        oom_kills: 0,
    })
}

/// The workload's shape, passed to the kernel-memcg child, which works out
/// the same offsets.
pub(super) struct Work<'a> {
    pub(super) workload: &'a str,
    pub(super) pages: usize,
    pub(super) reads: usize,
    pub(super) hot_pages: usize,
    pub(super) hot_touch: u64,
    pub(super) seed: u64,
}

pub(super) fn run_memcg(s: &Setup, limit: &KernelLimit, w: &Work) -> Result<Measured, String> {
    // The file's page cache dropped: the child starts cold, as the others.
    drop(s.file.open_cold(false)?);
    let mut args = vec!["outofcore".to_string(), s.file.path.clone(), w.workload.to_string()];
    args.extend(
        [s.len as u64, w.pages as u64, w.reads as u64, w.hot_pages as u64, w.hot_touch, w.seed, s.every as u64]
            .map(|v| v.to_string()),
    );
    let c = limit.run_child(&args)?;
    let bad = || format!("unexpected output of the kernel-memcg child:\n{}", c.stdout);
    let line = c.stdout.lines().find_map(|l| l.strip_prefix("result ")).ok_or_else(bad)?;
    let v: Vec<&str> = line.split_whitespace().collect();
    if v.len() != 6 {
        return Err(bad());
    }
    let int = |i: usize| v[i].parse::<u64>().map_err(|_| bad());
    let float = |i: usize| v[i].parse::<f64>().map_err(|_| bad());
    Ok(Measured {
        out: Outcome { ns: int(0)?, sum: int(1)?, lat: Vec::new() },
        peak: c.peak_charge_bytes as f64,
        misses: int(4)?,
        writebacks: 0,
        pct: Some((float(2)?, float(3)?)),
        pages_read: Some(int(5)? / PAGE as u64),
        oom_kills: c.oom_kills,
    })
}

/// `read_bytes` of `/proc/self/io`: bytes this process caused to be read
/// from storage (its faults' reads and read-ahead).
pub(super) fn io_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `usermm __kernel-memcg-child outofcore PATH WORKLOAD LEN PAGES READS
/// HOT_PAGES HOT_TOUCH SEED EVERY`: works out the workload's offsets (before
/// it joins its memory group: the other systems' offset lists live outside
/// their budgets too), waits for the go byte, then maps the file and reads
/// as `kernel-mmap` does. Prints `result NS SUM P50 P99 MAJFLT READ_BYTES`.
pub fn kernel_memcg_child(a: &[String]) -> Result<(), String> {
    let n = |i: usize| -> Result<u64, String> {
        a.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {a:?} is no number"))
    };
    let (path, workload) = match a {
        [p, w, ..] => (p, w.as_str()),
        _ => return Err(format!("bad arguments {a:?}")),
    };
    let (len, pages, reads, hot_pages, hot_touch, seed, every) =
        (n(2)? as usize, n(3)? as usize, n(4)? as usize, n(5)? as usize, n(6)?, n(7)?, n(8)?.max(1) as usize);
    let offs = offsets(workload, pages, reads, hot_pages, hot_touch, seed);
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let f = File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let (madv, fadv) = if workload == "seq-scan" {
        (MADV_SEQUENTIAL, POSIX_FADV_SEQUENTIAL)
    } else {
        (MADV_RANDOM, POSIX_FADV_RANDOM)
    };
    fadvise(&f, 0, 0, fadv).map_err(|e| format!("fadvise: {e:?}"))?;
    let m = HostFileMap::open(&f, len).map_err(|e| format!("mmap: {e:?}"))?;
    m.madvise(madv).map_err(|e| format!("madvise: {e:?}"))?;
    let (_, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let io0 = io_read_bytes();
    let out = drive(&offs, every, |off| m.read_u64(off));
    let (_, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let io1 = io_read_bytes();
    m.unmap().map_err(|e| format!("munmap: {e:?}"))?;
    let mut lat = out.lat;
    let (p50, p99, _) = p50_p99_max(&mut lat);
    println!("result {} {} {p50} {p99} {} {}", out.ns, out.sum, maj1 - maj0, io1 - io0);
    Ok(())
}
