//! The C ABI (`include/usermm.h`): a thin layer over [`Space`].
//!
//! Invariants of this module:
//! - Nothing panics or unwinds into C: every body runs under
//!   [`std::panic::catch_unwind`] (the crate is built with `panic=unwind`), and
//!   a panic is reported as `-1`/`EIO`.
//! - Errors are `-1` (or `MAP_FAILED` for `umm_mmap`) with `errno` set to
//!   exactly what the Rust API returned; a NULL space is `EINVAL`.
//! - No lock of the space is held while caller memory is read or written: the
//!   Rust API copies results out after releasing its locks, and this module
//!   only touches caller memory before calling it (arguments) or after it
//!   returned (results). Caller memory may itself live in the space (its
//!   faults are then served by the handler threads).
//! - A `umm_space *` is a `Box<Space>` turned into a raw pointer by
//!   `umm_open` and back by `umm_close`, except for the process-wide default
//!   space (`umm_default_space`, for `usermm_compat.h`), which lives in a
//!   static and is never closed.
//! - Every exported function that takes a pointer is an `unsafe extern "C"
//!   fn`: its contract is the header's; inside, each dereference is its own
//!   small `unsafe` block through `usermm_sys::ffi`.

#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::OnceLock;

use usermm_sys::ffi::{as_mut, as_ref, set_errno, slice_mut, write_fd};

use crate::{Config, Errno, Space, Stats};

/// The opaque `umm_space` of the C ABI (really a [`Space`]).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_space {
    _private: [u8; 0],
}

/// `struct umm_config` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umm_config {
    pub size: usize,
    pub budget_bytes: usize,
    pub reserve_bytes: usize,
    pub memlock_bytes: usize,
    pub swap_bytes: usize,
    pub swap_dir: *const c_char,
    pub max_regions: usize,
    pub page_shift: c_uint,
    pub fault_threads: c_uint,
    pub flags: c_uint,
    /// usermm's own, read only when `size` covers it.
    pub lazyfree_max_bytes: usize,
}

/// The size of `struct umm_config` as SPEC §2 defines it (up to `flags`):
/// a caller built against that struct passes this size, and usermm's own
/// fields then keep their defaults.
const SPEC_CONFIG_SIZE: usize = std::mem::offset_of!(umm_config, lazyfree_max_bytes);

/// `struct umm_purge_report` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_purge_report {
    pub purged_pages: usize,
    pub first_purged: *mut c_void,
    pub bitmap: *mut u64,
    pub bitmap_words: usize,
}

/// `struct umm_populate_report` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_populate_report {
    pub populated_bytes: usize,
    pub fail_addr: *mut c_void,
}

/// `MAP_FAILED`.
const MAP_FAILED: *mut c_void = !0usize as *mut c_void;

/// The words of `struct umm_stats` after its `size` field, in the header's
/// order. `umm_stats` copies as many of them as fit in the caller's `size`.
fn stats_words(s: &Stats) -> [u64; STATS_WORDS] {
    [
        s.budget_pages,
        s.resident_pages,
        s.resident_pages_max,
        s.locked_pages,
        s.locked_charged_pages,
        s.swapped_pages,
        s.lazyfree_pages,
        s.volatile_pages,
        s.faults,
        s.major_faults,
        s.zero_fills,
        s.swapins,
        s.swapouts,
        s.writebacks,
        s.lazyfree_discards,
        s.volatile_purges,
        s.evictions,
        s.oom_sigbus,
        s.write_lock_hold_ns_max,
        // usermm's own:
        s.inactive_pages,
        s.minor_faults,
        s.deactivations,
        s.swap_read_errors,
        s.swap_write_errors,
        s.regions,
        s.user_mode_only,
        s.swap_direct_io,
        s.host_refusals,
    ]
}

/// Fields of `struct umm_stats` after `size`.
pub const STATS_WORDS: usize = 28;
/// `sizeof(struct umm_stats)` in this library's version of the header.
pub const STATS_SIZE: usize = 8 * (1 + STATS_WORDS);

/// Runs `f`, turning an error into `errno` + `fail` and a panic into
/// `errno = EIO` + `fail`.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, Errno>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e.raw());
            fail
        }
        Err(payload) => {
            // Dropping the payload could itself panic; forgetting it leaks a
            // few bytes once per bug, which is the lesser evil at an ABI.
            std::mem::forget(payload);
            set_errno(Errno::EIO.raw());
            fail
        }
    }
}

/// The space behind a C handle; `EINVAL` for NULL.
///
/// # Safety
/// `s` must be NULL or a live handle: returned by `umm_open` and not yet
/// passed to `umm_close`, or returned by `umm_default_space`. The space must
/// stay open for `'a`.
unsafe fn space<'a>(s: *mut umm_space) -> Result<&'a Space, Errno> {
    // SAFETY: guaranteed by the caller; a live handle points to a `Space`,
    // which is `Sync`.
    unsafe { as_ref(s as *const Space) }.ok_or(Errno::EINVAL)
}

/// A C string as a path (any bytes but NUL, not only UTF-8).
///
/// # Safety
/// `p` must be non-null and point to a NUL-terminated string.
unsafe fn c_path(p: *const c_char) -> PathBuf {
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    PathBuf::from(OsStr::from_bytes(bytes))
}

fn config_to_c(c: &Config) -> umm_config {
    umm_config {
        size: std::mem::size_of::<umm_config>(),
        budget_bytes: c.budget_bytes,
        reserve_bytes: c.reserve_bytes,
        memlock_bytes: c.memlock_bytes,
        swap_bytes: c.swap_bytes,
        swap_dir: std::ptr::null(),
        max_regions: c.max_regions,
        page_shift: c.page_shift,
        fault_threads: c.fault_threads,
        flags: c.flags,
        lazyfree_max_bytes: c.lazyfree_max_bytes,
    }
}

/// `umm_config_init`: fills `*cfg` with `Config::default()`.
///
/// # Safety
/// `cfg` must be NULL or point to a writable `struct umm_config`.
#[no_mangle]
pub unsafe extern "C" fn umm_config_init(cfg: *mut umm_config) {
    guard((), || {
        // SAFETY: the caller passes a writable `struct umm_config` (or NULL,
        // which is ignored: the call has no way to report an error).
        if let Some(out) = unsafe { as_mut(cfg) } {
            *out = config_to_c(&Config::default());
        }
        Ok(())
    })
}

/// `umm_open`: NULL + errno on error; `cfg` NULL means the defaults.
///
/// # Safety
/// `cfg` must be NULL or point to a `struct umm_config` of `cfg->size` bytes
/// whose `swap_dir` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn umm_open(cfg: *const umm_config) -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let config = if cfg.is_null() {
            Config::default()
        } else {
            // Read the size first: an older caller's struct may be shorter
            // than ours, and then the rest must not be read.
            // SAFETY: a non-null `cfg` points to a `struct umm_config`, whose
            // first field is a `size_t`.
            let size = *unsafe { as_ref(cfg as *const usize) }.ok_or(Errno::EINVAL)?;
            if size < SPEC_CONFIG_SIZE {
                return Err(Errno::EINVAL);
            }
            let c = if size >= std::mem::size_of::<umm_config>() {
                // SAFETY: the caller says the struct holds `size` bytes, at
                // least all of ours.
                *unsafe { as_ref(cfg) }.ok_or(Errno::EINVAL)?
            } else {
                // A SPEC-sized struct: read its fields, default ours.
                let mut full = config_to_c(&Config::default());
                // SAFETY: the caller's struct holds at least SPEC_CONFIG_SIZE
                // bytes, a prefix of ours with the same layout.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        cfg as *const u8,
                        &mut full as *mut umm_config as *mut u8,
                        SPEC_CONFIG_SIZE,
                    )
                };
                full
            };
            let swap_dir = if c.swap_dir.is_null() {
                None
            } else {
                // SAFETY: a non-null `swap_dir` is a NUL-terminated string
                // (the header's contract).
                Some(unsafe { c_path(c.swap_dir) })
            };
            Config {
                budget_bytes: c.budget_bytes,
                reserve_bytes: c.reserve_bytes,
                memlock_bytes: c.memlock_bytes,
                swap_bytes: c.swap_bytes,
                swap_dir,
                max_regions: c.max_regions,
                page_shift: c.page_shift,
                fault_threads: c.fault_threads,
                flags: c.flags,
                lazyfree_max_bytes: c.lazyfree_max_bytes,
            }
        };
        let s = Space::open(&config)?;
        Ok(Box::into_raw(Box::new(s)) as *mut umm_space)
    })
}

/// `umm_close`: closes and frees the space. `EINVAL` for NULL or the default
/// space (which lives in a static).
///
/// # Safety
/// `s` must be NULL or a live handle; it is dangling after this call.
#[no_mangle]
pub unsafe extern "C" fn umm_close(s: *mut umm_space) -> c_int {
    guard(-1, || {
        if s.is_null() {
            return Err(Errno::EINVAL);
        }
        if let Some(Ok(d)) = DEFAULT_SPACE.get() {
            if std::ptr::eq(d, s as *const Space) {
                return Err(Errno::EINVAL);
            }
        }
        // SAFETY: a non-null handle other than the default space came from
        // `Box::into_raw` in `umm_open` and, by the ABI's contract, has not
        // been closed yet; it is not used again after this call.
        let space = unsafe { Box::from_raw(s as *mut Space) };
        space.close()?;
        Ok(0)
    })
}

/// `umm_mmap`: `MAP_FAILED` + errno on error.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mmap(
    s: *mut umm_space,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(MAP_FAILED, || {
        let a = sp?.mmap(addr as usize, len, prot, flags, fd, off)?;
        Ok(a as *mut c_void)
    })
}

/// `umm_munmap`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_munmap(s: *mut umm_space, addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munmap(addr as usize, len).map(|()| 0))
}

/// `umm_mprotect`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mprotect(s: *mut umm_space, addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mprotect(addr as usize, len, prot).map(|()| 0))
}

/// `umm_msync`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_msync(s: *mut umm_space, addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        sp?.msync(addr as usize, len, flags)?;
        Ok(0)
    })
}

/// `umm_mlock`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mlock(s: *mut umm_space, addr: *const c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlock(addr as usize, len).map(|()| 0))
}

/// `umm_mlock2`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mlock2(s: *mut umm_space, addr: *const c_void, len: usize, flags: c_uint) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlock2(addr as usize, len, flags).map(|()| 0))
}

/// `umm_munlock`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_munlock(s: *mut umm_space, addr: *const c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munlock(addr as usize, len).map(|()| 0))
}

/// `umm_mlockall`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mlockall(s: *mut umm_space, flags: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlockall(flags).map(|()| 0))
}

/// `umm_munlockall`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_munlockall(s: *mut umm_space) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munlockall().map(|()| 0))
}

/// `umm_madvise`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_madvise(s: *mut umm_space, addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.madvise(addr as usize, len, advice).map(|()| 0))
}

/// `umm_mvolatile`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mvolatile(s: *mut umm_space, addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        sp?.mvolatile(addr as usize, len)?;
        Ok(0)
    })
}

/// `umm_mnovolatile`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mnovolatile(
    s: *mut umm_space,
    addr: *mut c_void,
    len: usize,
    out: *mut umm_purge_report,
) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    // SAFETY: `out` is NULL or a valid report (this function's contract).
    let out = unsafe { as_mut(out) };
    guard(-1, || {
        let (purged, report) = sp?.mnovolatile(addr as usize, len)?;
        if let Some(out) = out {
            out.purged_pages = report.purged_pages;
            out.first_purged = report.first_purged as *mut c_void;
            // SAFETY: the caller's bitmap is NULL or valid for
            // `bitmap_words` words (usermm.h).
            if let Some(words) = unsafe { slice_mut(out.bitmap, out.bitmap_words) } {
                let n = words.len().min(report.bitmap.len());
                words[..n].copy_from_slice(&report.bitmap[..n]);
                words[n..].fill(0);
            }
        }
        Ok(c_int::from(purged))
    })
}

/// The error of a range of `pages` pages from `addr` that cannot fit in the
/// space's reservation: `EINVAL` for an unaligned `addr`, `ENOMEM` otherwise
/// (memory outside the space counts as unmapped, and an overflowing range is
/// `ENOMEM` for mincore on Linux, as in the core). Checked
/// before the Rust API sizes buffers by the page count, so that a huge length
/// is an errno, not a huge allocation.
fn oversized_range(sp: &Space, addr: usize, pages: usize) -> Result<(), Errno> {
    let ps = sp.page_size();
    let (_, reserve_len) = sp.reservation();
    if pages <= reserve_len / ps {
        return Ok(());
    }
    if !addr.is_multiple_of(ps) {
        return Err(Errno::EINVAL);
    }
    Err(Errno::ENOMEM)
}

/// `umm_mincore`: `vec` NULL is `EFAULT`, reported after the range's own
/// errors (`EINVAL`, `ENOMEM`), as Linux does.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_mincore(s: *mut umm_space, addr: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        let pages = len.div_ceil(sp.page_size());
        oversized_range(sp, addr as usize, pages)?;
        // SAFETY: a non-null `vec` holds `ceil(len / page size)` writable
        // bytes (mincore(2)'s contract); NULL gives `None`.
        match unsafe { slice_mut(vec, pages) } {
            Some(v) => sp.mincore(addr as usize, len, v)?,
            // The empty buffer makes the Rust API return `EFAULT` once the
            // range itself is valid.
            None => sp.mincore(addr as usize, len, &mut [])?,
        }
        Ok(0)
    })
}

/// `umm_page_state`: `states` NULL is `EFAULT`, after the range's errors.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_page_state(
    s: *mut umm_space,
    addr: *const c_void,
    npages: usize,
    states: *mut u32,
) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        oversized_range(sp, addr as usize, npages)?;
        // SAFETY: a non-null `states` holds `npages` writable words (the
        // header's contract); NULL gives `None`.
        match unsafe { slice_mut(states, npages) } {
            Some(v) => sp.page_state(addr as usize, npages, v)?,
            None => sp.page_state(addr as usize, npages, &mut [])?,
        }
        Ok(0)
    })
}

/// `umm_populate`: `madvise(MADV_POPULATE_*)` that also fills `*out` (when
/// not NULL), on failure as well.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_populate(
    s: *mut umm_space,
    addr: *mut c_void,
    len: usize,
    advice: c_int,
    out: *mut umm_populate_report,
) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let (report, r) = sp?.populate(addr as usize, len, advice);
        // The report is written on failure too: it says how far it got.
        // SAFETY: `out` is NULL or a writable `struct umm_populate_report`.
        if let Some(o) = unsafe { as_mut(out) } {
            o.populated_bytes = report.populated_bytes;
            o.fail_addr = report.fail_addr as *mut c_void;
        }
        r.map(|()| 0)
    })
}

/// `umm_stats`: fills the whole fields that fit in `out->size`; fields past
/// this library's struct (a newer caller's) are zeroed; `size` itself is left
/// as the caller set it.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_stats(s: *mut umm_space, out: *mut c_void) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        // SAFETY: a non-null `out` points to a `struct umm_stats`, whose first
        // field is a `size_t`.
        let size = *unsafe { as_ref(out as *const usize) }.ok_or(Errno::EINVAL)?;
        if size < 8 {
            return Err(Errno::EINVAL);
        }
        let words = stats_words(&sp.stats());
        // SAFETY: the caller vouches that `out` holds `size` writable bytes;
        // `struct umm_stats` is 8-aligned (its fields are `size_t`/`uint64_t`).
        let dst = unsafe { slice_mut(out as *mut u64, size / 8) }.ok_or(Errno::EINVAL)?;
        for (i, w) in dst.iter_mut().enumerate().skip(1) {
            *w = words.get(i - 1).copied().unwrap_or(0);
        }
        Ok(0)
    })
}

/// `umm_smaps`: writes the smaps text to `fd`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_smaps(s: *mut umm_space, fd: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let text = sp?.smaps();
        write_fd(fd, text.as_bytes())?;
        Ok(0)
    })
}

/// `umm_debug_inject_swap_errors` (test hook): the next `reads` swap reads
/// and `writes` swap writes fail with `EIO`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`); pointer arguments must
/// be NULL or valid for what `usermm.h` says the call reads or writes.
#[no_mangle]
pub unsafe extern "C" fn umm_debug_inject_swap_errors(s: *mut umm_space, reads: c_uint, writes: c_uint) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        sp?.inject_swap_errors(reads, writes);
        Ok(0)
    })
}

/// The process-wide default space of `usermm_compat.h`; the error is kept so
/// that every call reports it.
static DEFAULT_SPACE: OnceLock<Result<Space, Errno>> = OnceLock::new();

/// A byte count from the environment: decimal or `0x` hex, with an optional
/// binary suffix `k`, `m`, `g`, `t`; `unlimited` (or `max`) is `SIZE_MAX`.
/// Unset or empty: `None`.
fn env_size(name: &str) -> Result<Option<usize>, Errno> {
    let Some(v) = std::env::var_os(name) else {
        return Ok(None);
    };
    let v = v.to_str().ok_or(Errno::EINVAL)?.trim().to_ascii_lowercase();
    if v.is_empty() {
        return Ok(None);
    }
    if v == "unlimited" || v == "max" {
        return Ok(Some(usize::MAX));
    }
    let (num, shift) = match v.as_bytes()[v.len() - 1] {
        b'k' => (&v[..v.len() - 1], 10),
        b'm' => (&v[..v.len() - 1], 20),
        b'g' => (&v[..v.len() - 1], 30),
        b't' => (&v[..v.len() - 1], 40),
        _ => (&v[..], 0),
    };
    let n = match num.strip_prefix("0x") {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => num.parse::<usize>(),
    }
    .map_err(|_| Errno::EINVAL)?;
    n.checked_mul(1usize << shift).map(Some).ok_or(Errno::EINVAL)
}

fn env_u32(name: &str) -> Result<Option<u32>, Errno> {
    match env_size(name)? {
        Some(n) => u32::try_from(n).map(Some).map_err(|_| Errno::EINVAL),
        None => Ok(None),
    }
}

/// The default space's configuration, from the `USERMM_*` variables
/// documented in `usermm_compat.h`.
fn config_from_env() -> Result<Config, Errno> {
    let d = Config::default();
    Ok(Config {
        budget_bytes: env_size("USERMM_BUDGET_BYTES")?.unwrap_or(d.budget_bytes),
        reserve_bytes: env_size("USERMM_RESERVE_BYTES")?.unwrap_or(d.reserve_bytes),
        memlock_bytes: env_size("USERMM_MEMLOCK_BYTES")?.unwrap_or(d.memlock_bytes),
        swap_bytes: env_size("USERMM_SWAP_BYTES")?.unwrap_or(d.swap_bytes),
        swap_dir: std::env::var_os("USERMM_SWAP_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
        max_regions: env_size("USERMM_MAX_REGIONS")?.unwrap_or(d.max_regions),
        page_shift: env_u32("USERMM_PAGE_SHIFT")?.unwrap_or(d.page_shift),
        fault_threads: env_u32("USERMM_FAULT_THREADS")?.unwrap_or(d.fault_threads),
        flags: env_u32("USERMM_FLAGS")?.unwrap_or(d.flags),
        lazyfree_max_bytes: env_size("USERMM_LAZYFREE_MAX_BYTES")?.unwrap_or(d.lazyfree_max_bytes),
    })
}

/// `umm_default_space`: the process-wide default space, opened once (the
/// first caller opens it; concurrent callers wait) from the `USERMM_*`
/// environment. NULL + errno if it could not be opened (a message says why,
/// once, on stderr). It is never closed.
#[no_mangle]
pub extern "C" fn umm_default_space() -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let r = DEFAULT_SPACE.get_or_init(|| {
            let r = config_from_env().and_then(|c| Space::open(&c));
            if let Err(e) = &r {
                eprintln!("usermm: cannot open the default space (USERMM_* environment): {e}");
            }
            r
        });
        match r {
            Ok(sp) => Ok(sp as *const Space as *mut umm_space),
            Err(e) => Err(*e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_layout_matches_header() {
        // The header's struct: size_t size + 19 SPEC fields + 8 of usermm's.
        assert_eq!(STATS_WORDS, 19 + 9);
        assert_eq!(stats_words(&Stats::default()).len(), STATS_WORDS);
        // SPEC §2's struct is 72 bytes on x86-64; usermm's own field follows.
        assert_eq!(SPEC_CONFIG_SIZE, 72);
        assert_eq!(std::mem::size_of::<umm_config>(), 80);
    }

    #[test]
    fn null_space_is_einval() {
        // SAFETY: NULL is a valid argument (EINVAL).
        let r = unsafe { umm_munmap(std::ptr::null_mut(), std::ptr::null_mut(), 4096) };
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EINVAL.raw()));
        // SAFETY: as above.
        assert_eq!(unsafe { umm_close(std::ptr::null_mut()) }, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EINVAL.raw()));
    }

    #[test]
    fn panic_becomes_eio() {
        let r: c_int = guard(-1, || panic!("boom"));
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EIO.raw()));
    }
}
