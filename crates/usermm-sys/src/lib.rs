//! The platform layer: the only place in usermm with `unsafe` code.
//!
//! Every syscall and ioctl usermm makes is wrapped here in a typed function
//! that returns `Result<_, Errno>`; every `unsafe` block carries a
//! `// SAFETY:` comment naming the invariants it relies on.
//!
//! # Why define the userfaultfd ABI here?
//! Debian 12's headers (and the `libc` crate) stop at Linux 6.1; this machine
//! runs 6.18. The constants and structs below are copied from the kernel's
//! `include/uapi/linux/userfaultfd.h` and `fs.h` and checked against the
//! kernel at run time (`UFFDIO_API` reports what it supports).
//!
//! # Fallbacks, probed once
//! - `/dev/userfaultfd` (needs read/write access to the device) →
//!   `userfaultfd(2)` → `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` (what an
//!   unprivileged process gets when `vm.unprivileged_userfaultfd` is 0).
//!   `Uffd::mode` says which one was had.
//! - A swap file is created with `O_TMPFILE` (never has a name) and falls back
//!   to a 0600 file unlinked at once; `O_DIRECT` is tried first and dropped if
//!   the file system refuses it.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod arena;
pub mod creds;
pub mod exit;
pub mod ffi;
pub mod file;
#[cfg(feature = "bench-helpers")]
pub mod host;
pub mod inthread;
#[cfg(feature = "bench-helpers")]
pub mod kernel;
pub mod lazy;
pub mod lend;
pub mod mem;
#[cfg(feature = "bench-helpers")]
pub mod process;
pub mod ring;
pub mod sampled;
pub mod secret;
pub mod sync;
#[cfg(feature = "bench-helpers")]
pub mod testing;
pub mod thread;
pub mod uffd;

pub use usermm_core::Errno;

/// The calling thread's `errno`.
pub fn last_errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

/// Returns `Err(last_errno())` when `r == -1`.
fn check(r: libc::c_int) -> Result<libc::c_int, Errno> {
    if r == -1 {
        Err(last_errno())
    } else {
        Ok(r)
    }
}

fn check_isize(r: isize) -> Result<usize, Errno> {
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(r as usize)
    }
}

/// Puts `new` in place of descriptor `old` (`dup3`, close-on-exec), so that
/// whatever holds `old`'s number now uses `new`'s file; `new` is closed.
/// For a forked child, whose inherited descriptors of `/proc/self/*` and
/// userfaultfd still refer to its parent.
pub fn replace_fd(old: std::os::fd::RawFd, new: std::os::fd::OwnedFd) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: dup3 takes its arguments by value; `old` is a descriptor the
    // caller owns (it stays open, now on `new`'s file).
    check(unsafe { libc::dup3(new.as_raw_fd(), old, libc::O_CLOEXEC) })?;
    Ok(())
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Physical memory of the machine in bytes.
pub fn phys_mem_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages.max(0) as u64) * (ps.max(0) as u64)
}

/// Number of online CPUs.
pub fn ncpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}
