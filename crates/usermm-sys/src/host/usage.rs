//! The process's own counters: page faults (`getrusage`), and the resident
//! set and its peak (`/proc/self/status`, reset through
//! `/proc/self/clear_refs`).

use crate::{check, Errno};

/// The process's `(minor, major)` page faults so far: `ru_minflt` and
/// `ru_majflt` of `getrusage(RUSAGE_SELF)` (every thread, live and exited).
pub fn process_faults() -> Result<(u64, u64), Errno> {
    faults_of(libc::RUSAGE_SELF)
}

/// The calling thread's `(minor, major)` page faults so far: `ru_minflt`
/// and `ru_majflt` of `getrusage(RUSAGE_THREAD)`. A count that other threads
/// (a progress reporter, a signal handler thread, stack growth elsewhere)
/// cannot add to.
pub fn thread_faults() -> Result<(u64, u64), Errno> {
    faults_of(libc::RUSAGE_THREAD)
}

/// `(ru_minflt, ru_majflt)` of `getrusage(who)`.
fn faults_of(who: libc::c_int) -> Result<(u64, u64), Errno> {
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    check(unsafe { libc::getrusage(who, &mut ru) })?;
    Ok((ru.ru_minflt.max(0) as u64, ru.ru_majflt.max(0) as u64))
}

/// Resets the process's resident peak (`VmHWM`) to its current RSS by
/// writing "5" to `/proc/self/clear_refs`.
pub fn reset_peak_rss() -> Result<(), Errno> {
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// `(VmRSS, VmHWM)` of this process in KiB, from `/proc/self/status`.
pub fn rss_kib() -> Result<(u64, u64), Errno> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
    let field = |name: &str| -> Result<u64, Errno> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or(Errno::EINVAL)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}
