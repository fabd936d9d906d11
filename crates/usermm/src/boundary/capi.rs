//! The C ABI (`include/usermm.h`): a thin layer over [`Space`].
//!
//! Invariants of this module:
//! - Nothing panics or unwinds into C: every body runs under
//!   [`std::panic::catch_unwind`] (the crate is built with `panic=unwind`), and
//!   a panic is reported as `-1`/`EIO`.
//! - Errors are `-1` (or `MAP_FAILED` for `umm_mmap`) with `errno` set to
//!   exactly what the Rust API returned; a NULL space is `EINVAL`.
//! - Caller memory is read and written the way the kernel reads and writes
//!   user pointers: never dereferenced, only copied with
//!   [`copy_from_own_memory`] / [`copy_to_own_memory`] (`process_vm_readv` /
//!   `process_vm_writev` on our own pid), so a read-only, `PROT_NONE` or
//!   unmapped pointer is `EFAULT`, never a signal. Results are computed into
//!   an internal buffer first and copied out afterwards; the range's own
//!   errors (`EINVAL`, `ENOMEM`) come before `EFAULT`, as on Linux. On the
//!   user-mode-only fallback, caller memory in the call's own space is
//!   populated through the space before a copy is retried
//!   ([`retry_populated`]).
//! - No lock of the space is held while caller memory is read or written:
//!   this module only touches caller memory before calling the Rust API
//!   (arguments) or after it returned (results). Caller memory may itself
//!   live in the space: the copy is then a kernel-mode fault that the
//!   space's handler threads serve.
//! - A `umm_space *` is a `Box<Space>` turned into a raw pointer by
//!   `umm_open` and back by `umm_close`, except for the process-wide default
//!   space (`umm_default_space`, for `usermm_compat.h`), which lives in a
//!   leaked per-fork-generation cell and is never closed.
//! - fork: a handle of a space opened before a fork is stale in the child;
//!   every call on it is `ESTALE` at once ([`Space::check_owner`], an atomic
//!   load before any lock), and `umm_close` only forgets it.
//! - Every exported function that takes a space handle is an `unsafe extern
//!   "C" fn`: the handle is the one pointer it trusts (the header's
//!   contract); turning it into a `&Space` is the only dereference, in
//!   [`space`].

#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_uint, c_void, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use usermm_sys::ffi::{
    as_ref, c_string_from_own_memory, copy_from_own_memory, copy_to_own_memory, set_errno, write_fd,
};

use crate::{Config, Errno, PurgeReport, Space, Stats};

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

/// The space behind a C handle; `EINVAL` for NULL, `ESTALE` for a space
/// opened by the parent of a forked child (checked before anything else,
/// see [`Space::check_owner`]).
///
/// # Safety
/// `s` must be NULL or a live handle: returned by `umm_open` and not yet
/// passed to `umm_close`, or returned by `umm_default_space` (in this
/// process or, before a fork, in its parent: the handle's memory was copied
/// into the child). The space must stay open for `'a`.
unsafe fn space<'a>(s: *mut umm_space) -> Result<&'a Space, Errno> {
    // SAFETY: guaranteed by the caller; a live handle points to a `Space`,
    // which is `Sync`.
    let sp = unsafe { as_ref(s as *const Space) }.ok_or(Errno::EINVAL)?;
    sp.check_owner()?;
    Ok(sp)
}

/// Linux's `PATH_MAX`: the longest path, NUL included, `getname` accepts.
const PATH_MAX: usize = 4096;

/// Linux's `access_ok`: whether `[addr, addr + len)` lies in the user half of
/// the address space. It says nothing of what is mapped there; the copy
/// itself finds that out.
fn access_ok(addr: usize, len: usize) -> bool {
    addr.checked_add(len).is_some_and(|end| end as u64 <= usermm_core::TASK_SIZE)
}

/// The most bytes [`copy_out`] and [`copy_in`] copy at once: what a retry
/// after populating must fit in the budget.
const COPY_CHUNK: usize = 256 << 10;

/// Runs `copy` (of caller memory `[addr, addr + len)`), retrying an `EFAULT`
/// after populating the part of `[addr, addr + len)` that lies in `sp`, when
/// `sp` runs on the user-mode-only userfaultfd fallback.
///
/// # Why?
/// That fallback does not serve faults the kernel takes on the program's
/// behalf (README, "Privileges"), and `process_vm_readv`/`writev` take
/// exactly those: caller memory in an untouched page of the space would be
/// `EFAULT` where a plain store worked. A populate is served by usermm
/// itself. A few retries, because reclaim may evict the pages again in
/// between; a range that cannot be populated (read-only, a hole) stays
/// `EFAULT`.
fn retry_populated(
    sp: Option<&Space>,
    addr: usize,
    len: usize,
    write: bool,
    mut copy: impl FnMut() -> Result<(), Errno>,
) -> Result<(), Errno> {
    let mut tries = 0;
    loop {
        let e = match copy() {
            Err(e) if e == Errno::EFAULT && tries < 3 => e,
            r => return r,
        };
        let Some(sp) = sp.filter(|sp| sp.uffd_mode() == crate::UffdMode::UserModeOnly) else {
            return Err(e);
        };
        let (base, reserve_len) = sp.reservation();
        let ps = sp.page_size();
        let lo = addr.max(base) / ps * ps;
        let hi = addr.saturating_add(len).min(base + reserve_len).div_ceil(ps) * ps;
        if lo >= hi {
            return Err(e);
        }
        let advice = if write { crate::consts::MADV_POPULATE_WRITE } else { crate::consts::MADV_POPULATE_READ };
        if sp.populate(lo, hi - lo, advice).1.is_err() {
            return Err(e);
        }
        tries += 1;
    }
}

/// Copies `src` to caller memory at `dst` (`EFAULT` if it cannot be
/// written), in chunks; `sp` is the space of the call, if any (see
/// [`retry_populated`]).
fn copy_out(sp: Option<&Space>, dst: usize, src: &[u8]) -> Result<(), Errno> {
    for (i, chunk) in src.chunks(COPY_CHUNK).enumerate() {
        let at = dst.checked_add(i * COPY_CHUNK).ok_or(Errno::EFAULT)?;
        retry_populated(sp, at, chunk.len(), true, || copy_to_own_memory(at, chunk))?;
    }
    Ok(())
}

/// Fills `buf` from caller memory at `src` (`EFAULT` if it cannot be read);
/// `sp` as for [`copy_out`].
fn copy_in(sp: Option<&Space>, buf: &mut [u8], src: usize) -> Result<(), Errno> {
    for (i, chunk) in buf.chunks_mut(COPY_CHUNK).enumerate() {
        let at = src.checked_add(i * COPY_CHUNK).ok_or(Errno::EFAULT)?;
        retry_populated(sp, at, chunk.len(), false, || copy_from_own_memory(chunk, at))?;
    }
    Ok(())
}

/// Writes `head` at `dst` (caller memory), then zeros up to `total` bytes
/// (`head` past `total` is cut). `EFAULT` if any of it cannot be written.
fn copy_out_zero_padded(sp: Option<&Space>, dst: usize, head: &[u8], total: usize) -> Result<(), Errno> {
    let n = head.len().min(total);
    copy_out(sp, dst, &head[..n])?;
    let zeros = [0u8; 4096];
    let mut at = n;
    while at < total {
        let k = (total - at).min(zeros.len());
        copy_out(sp, dst.checked_add(at).ok_or(Errno::EFAULT)?, &zeros[..k])?;
        at += k;
    }
    Ok(())
}

fn read_usize(sp: Option<&Space>, addr: usize) -> Result<usize, Errno> {
    let mut b = [0u8; 8];
    copy_in(sp, &mut b, addr)?;
    Ok(usize::from_ne_bytes(b))
}

/// `sizeof(struct umm_config)`.
const CONFIG_SIZE: usize = std::mem::size_of::<umm_config>();

/// The bytes of `struct umm_config` (padding zeroed), field by field.
fn config_to_bytes(c: &umm_config) -> [u8; CONFIG_SIZE] {
    use std::mem::offset_of;
    let mut b = [0u8; CONFIG_SIZE];
    let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    put(offset_of!(umm_config, size), &c.size.to_ne_bytes());
    put(offset_of!(umm_config, budget_bytes), &c.budget_bytes.to_ne_bytes());
    put(offset_of!(umm_config, reserve_bytes), &c.reserve_bytes.to_ne_bytes());
    put(offset_of!(umm_config, memlock_bytes), &c.memlock_bytes.to_ne_bytes());
    put(offset_of!(umm_config, swap_bytes), &c.swap_bytes.to_ne_bytes());
    put(offset_of!(umm_config, swap_dir), &(c.swap_dir as usize).to_ne_bytes());
    put(offset_of!(umm_config, max_regions), &c.max_regions.to_ne_bytes());
    put(offset_of!(umm_config, page_shift), &c.page_shift.to_ne_bytes());
    put(offset_of!(umm_config, fault_threads), &c.fault_threads.to_ne_bytes());
    put(offset_of!(umm_config, flags), &c.flags.to_ne_bytes());
    put(offset_of!(umm_config, lazyfree_max_bytes), &c.lazyfree_max_bytes.to_ne_bytes());
    b
}

/// `struct umm_config` from its bytes (the inverse of [`config_to_bytes`]).
fn config_from_bytes(b: &[u8; CONFIG_SIZE]) -> umm_config {
    use std::mem::offset_of;
    let word = |off: usize| usize::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"));
    let half = |off: usize| u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"));
    umm_config {
        size: word(offset_of!(umm_config, size)),
        budget_bytes: word(offset_of!(umm_config, budget_bytes)),
        reserve_bytes: word(offset_of!(umm_config, reserve_bytes)),
        memlock_bytes: word(offset_of!(umm_config, memlock_bytes)),
        swap_bytes: word(offset_of!(umm_config, swap_bytes)),
        swap_dir: word(offset_of!(umm_config, swap_dir)) as *const c_char,
        max_regions: word(offset_of!(umm_config, max_regions)),
        page_shift: half(offset_of!(umm_config, page_shift)),
        fault_threads: half(offset_of!(umm_config, fault_threads)),
        flags: half(offset_of!(umm_config, flags)),
        lazyfree_max_bytes: word(offset_of!(umm_config, lazyfree_max_bytes)),
    }
}

/// Reads the caller's `struct umm_config` at `addr` (non-null): `EFAULT`
/// for unreadable memory (the struct or its `swap_dir` string),
/// `ENAMETOOLONG` for a `swap_dir` with no NUL in `PATH_MAX` bytes,
/// `EINVAL` for a `size` too small.
fn read_config(addr: usize) -> Result<Config, Errno> {
    // Read the size first: an older caller's struct may be shorter than
    // ours, and then the rest must not be read.
    let size = read_usize(None, addr)?;
    if size < SPEC_CONFIG_SIZE {
        return Err(Errno::EINVAL);
    }
    // A SPEC-sized struct: read its fields, default ours (same layout, a
    // prefix of ours).
    let mut b = config_to_bytes(&config_to_c(&Config::default()));
    let n = if size >= CONFIG_SIZE { CONFIG_SIZE } else { SPEC_CONFIG_SIZE };
    copy_in(None, &mut b[..n], addr)?;
    let c = config_from_bytes(&b);
    let swap_dir = if c.swap_dir.is_null() {
        None
    } else {
        let bytes = c_string_from_own_memory(c.swap_dir as usize, PATH_MAX)?;
        Some(PathBuf::from(OsStr::from_bytes(&bytes)))
    };
    Ok(Config {
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
    })
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

/// `umm_config_init`: fills `*cfg` with `Config::default()`. NULL is
/// ignored; memory that cannot be written sets `errno` to `EFAULT` (the call
/// returns nothing).
#[no_mangle]
pub extern "C" fn umm_config_init(cfg: *mut umm_config) {
    guard((), || {
        if cfg.is_null() {
            return Ok(());
        }
        copy_out(None, cfg as usize, &config_to_bytes(&config_to_c(&Config::default())))
    })
}

/// `umm_open`: NULL + errno on error; `cfg` NULL means the defaults. A `cfg`
/// (or its `swap_dir`) that cannot be read is `EFAULT`.
#[no_mangle]
pub extern "C" fn umm_open(cfg: *const umm_config) -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let config = if cfg.is_null() { Config::default() } else { read_config(cfg as usize)? };
        let s = Space::open(&config)?;
        Ok(Box::into_raw(Box::new(s)) as *mut umm_space)
    })
}

/// `umm_close`: closes and frees the space. `EINVAL` for NULL or the default
/// space (which lives in a static). In a forked child, a space of the parent
/// (the default one included) is only forgotten: 0, and nothing of it is
/// touched.
///
/// # Safety
/// `s` must be NULL or a live handle; it is dangling after this call.
#[no_mangle]
pub unsafe extern "C" fn umm_close(s: *mut umm_space) -> c_int {
    guard(-1, || {
        // SAFETY: `s` is NULL or a live handle (this function's contract).
        match unsafe { space(s) } {
            Err(e) if e == Errno::ESTALE => return Ok(0),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if let Some(Ok(d)) = default_cell().get() {
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
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
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
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_munmap(s: *mut umm_space, addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munmap(addr as usize, len).map(|()| 0))
}

/// `umm_mprotect`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_mprotect(s: *mut umm_space, addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mprotect(addr as usize, len, prot).map(|()| 0))
}

/// `umm_msync`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
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
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_mlock(s: *mut umm_space, addr: *const c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlock(addr as usize, len).map(|()| 0))
}

/// `umm_mlock2`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_mlock2(s: *mut umm_space, addr: *const c_void, len: usize, flags: c_uint) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlock2(addr as usize, len, flags).map(|()| 0))
}

/// `umm_munlock`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_munlock(s: *mut umm_space, addr: *const c_void, len: usize) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munlock(addr as usize, len).map(|()| 0))
}

/// `umm_mlockall`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_mlockall(s: *mut umm_space, flags: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mlockall(flags).map(|()| 0))
}

/// `umm_munlockall`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_munlockall(s: *mut umm_space) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.munlockall().map(|()| 0))
}

/// `umm_madvise`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_madvise(s: *mut umm_space, addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.madvise(addr as usize, len, advice).map(|()| 0))
}

/// `umm_mvolatile`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
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
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_mnovolatile(
    s: *mut umm_space,
    addr: *mut c_void,
    len: usize,
    out: *mut umm_purge_report,
) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        let (purged, report) = sp.mnovolatile(addr as usize, len)?;
        if !out.is_null() {
            write_purge_report(sp, out as usize, &report)?;
        }
        Ok(c_int::from(purged))
    })
}

/// Fills the caller's `struct umm_purge_report` at `out` (non-null): reads
/// its `bitmap` and `bitmap_words`, writes the count, the first purged
/// address and, when `bitmap` is not NULL, `bitmap_words` words (the bits of
/// the range, then zeros). `EFAULT` if any of it cannot be read or written.
fn write_purge_report(sp: &Space, out: usize, report: &PurgeReport) -> Result<(), Errno> {
    let sp = Some(sp);
    use std::mem::offset_of;
    let bitmap = read_usize(sp, out + offset_of!(umm_purge_report, bitmap))?;
    let words = read_usize(sp, out + offset_of!(umm_purge_report, bitmap_words))?;
    let mut head = [0u8; 16];
    head[..8].copy_from_slice(&report.purged_pages.to_ne_bytes());
    head[8..].copy_from_slice(&report.first_purged.to_ne_bytes());
    const { assert!(offset_of!(umm_purge_report, first_purged) == 8) };
    copy_out(sp, out + offset_of!(umm_purge_report, purged_pages), &head)?;
    if bitmap != 0 {
        let bytes: Vec<u8> = report.bitmap.iter().flat_map(|w| w.to_ne_bytes()).collect();
        copy_out_zero_padded(sp, bitmap, &bytes, words.checked_mul(8).ok_or(Errno::EFAULT)?)?;
    }
    Ok(())
}

/// The byte a results buffer starts with: mincore and page_state write
/// other values only (a byte is 0 or 1, a word has no more than the
/// `UMM_PAGE_*` bits), so the first one left says where the walk stopped.
const UNFILLED: u8 = 0xff;

/// The checks `mincore(2)` makes before it walks the range, in Linux's
/// order: `EINVAL` unaligned `addr`, `ENOMEM` a range past the user address
/// space, `EFAULT` an output buffer (`out_bytes` long) that is not in it.
fn introspect_checks(
    sp: &Space,
    addr: usize,
    range_bytes: Option<usize>,
    out: usize,
    out_bytes: Option<usize>,
) -> Result<(), Errno> {
    if !addr.is_multiple_of(sp.page_size()) {
        return Err(Errno::EINVAL);
    }
    if !range_bytes.is_some_and(|l| access_ok(addr, l)) {
        return Err(Errno::ENOMEM);
    }
    if !out_bytes.is_some_and(|l| access_ok(out, l)) {
        return Err(Errno::EFAULT);
    }
    Ok(())
}

/// `umm_mincore`: Linux's order of errors: `EINVAL` (unaligned), `ENOMEM`
/// (past the address space), `EFAULT` (`vec` outside it), then the walk:
/// the bytes up to the first hole are copied to `vec` (`EFAULT` if they
/// cannot be: NULL, read-only, unmapped), then the hole is `ENOMEM`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
#[no_mangle]
pub unsafe extern "C" fn umm_mincore(s: *mut umm_space, addr: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        let ps = sp.page_size();
        let pages = len.div_ceil(ps);
        introspect_checks(sp, addr as usize, Some(len), vec as usize, Some(pages))?;
        // Never more than the reservation has pages: a longer range ends in
        // a hole (ENOMEM) after at most that many.
        let mut tmp = vec![UNFILLED; pages.min(sp.reservation().1 / ps)];
        let r = sp.mincore(addr as usize, len, &mut tmp);
        let filled = tmp.iter().position(|&b| b == UNFILLED).unwrap_or(tmp.len());
        if filled > 0 {
            copy_out(Some(sp), vec as usize, &tmp[..filled])?;
        }
        r.map(|()| 0)
    })
}

/// `umm_page_state`: errors as `umm_mincore` (`states` NULL, read-only or
/// unmapped is `EFAULT`, after the range's own errors).
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
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
        let ps = sp.page_size();
        introspect_checks(sp, addr as usize, npages.checked_mul(ps), states as usize, npages.checked_mul(4))?;
        let unfilled = u32::from_ne_bytes([UNFILLED; 4]);
        let mut tmp = vec![unfilled; npages.min(sp.reservation().1 / ps)];
        let r = sp.page_state(addr as usize, npages, &mut tmp);
        let filled = tmp.iter().position(|&w| w == unfilled).unwrap_or(tmp.len());
        if filled > 0 {
            let bytes: Vec<u8> = tmp[..filled].iter().flat_map(|w| w.to_ne_bytes()).collect();
            copy_out(Some(sp), states as usize, &bytes)?;
        }
        r.map(|()| 0)
    })
}

/// `umm_populate`: `madvise(MADV_POPULATE_*)` that also fills `*out` (when
/// not NULL), on failure as well.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
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
        let sp = sp?;
        let (report, r) = sp.populate(addr as usize, len, advice);
        // The report is written on failure too: it says how far it got. The
        // populate's own error comes first; a report that cannot be written
        // after a populate that succeeded is EFAULT (the range stays
        // populated).
        let written = if out.is_null() {
            Ok(())
        } else {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&report.populated_bytes.to_ne_bytes());
            b[8..].copy_from_slice(&report.fail_addr.to_ne_bytes());
            const { assert!(std::mem::size_of::<umm_populate_report>() == 16) };
            copy_out(Some(sp), out as usize, &b)
        };
        r?;
        written.map(|()| 0)
    })
}

/// `umm_stats`: fills the whole fields that fit in `out->size`; fields past
/// this library's struct (a newer caller's) are zeroed; `size` itself is left
/// as the caller set it.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_stats(s: *mut umm_space, out: *mut c_void) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        let size = read_usize(Some(sp), out as usize)?;
        if size < 8 {
            return Err(Errno::EINVAL);
        }
        let bytes: Vec<u8> = stats_words(&sp.stats()).iter().flat_map(|w| w.to_ne_bytes()).collect();
        // The whole words after `size` that fit in it.
        copy_out_zero_padded(Some(sp), out as usize + 8, &bytes, (size / 8 - 1) * 8)?;
        Ok(0)
    })
}

/// `umm_smaps`: writes the smaps text to `fd`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
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
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_debug_inject_swap_errors(s: *mut umm_space, reads: c_uint, writes: c_uint) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        sp?.inject_swap_errors(reads, writes);
        Ok(0)
    })
}

/// The process-wide default space of `usermm_compat.h` for one fork
/// generation; the error is kept so that every call reports it.
struct DefaultCell {
    fork_generation: u64,
    space: OnceLock<Result<Space, Errno>>,
}

/// The default space's cell of the current fork generation: a forked child
/// gets a fresh cell (and so a fresh space, opened by its first call) and
/// never waits on the parent's, whose `OnceLock` a parent thread may have
/// been initialising at the fork. Cells are leaked, never freed: one per
/// generation that called `umm_default_space`.
static DEFAULT_CELL: AtomicPtr<DefaultCell> = AtomicPtr::new(std::ptr::null_mut());

fn default_cell() -> &'static OnceLock<Result<Space, Errno>> {
    let generation = usermm_sys::thread::fork_generation();
    let mut cur = DEFAULT_CELL.load(Ordering::Acquire);
    loop {
        // SAFETY: DEFAULT_CELL holds NULL or a pointer from `Box::leak`
        // below, never freed, so it is valid for 'static.
        if let Some(cell) = unsafe { cur.as_ref() } {
            if cell.fork_generation == generation {
                return &cell.space;
            }
        }
        let new: &'static mut DefaultCell =
            Box::leak(Box::new(DefaultCell { fork_generation: generation, space: OnceLock::new() }));
        match DEFAULT_CELL.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return &new.space,
            // Another thread installed a cell first: use it if it is this
            // generation's (ours stays leaked, a few bytes, at most once per
            // racing thread).
            Err(other) => cur = other,
        }
    }
}

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
/// once, on stderr). It is never closed. A forked child's first call opens
/// the child's own default space (the parent's is stale there).
#[no_mangle]
pub extern "C" fn umm_default_space() -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let r = default_cell().get_or_init(|| {
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
