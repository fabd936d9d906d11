//! Introspection: `umm_mincore`, `umm_page_state` (and the checks they make
//! before the walk), `umm_stats` (`struct umm_stats`'s words), `umm_smaps`,
//! and the `umm_debug_inject_swap_errors` test hook.

use std::ffi::{c_int, c_uint, c_void};

use usermm_sys::ffi::write_fd;

use super::copy::{access_ok, copy_out, copy_out_sized_words};
use super::{guard, space, umm_space};
use crate::{Errno, Space, Stats};

/// The fields of `struct umm_stats` after its `size` field, in the header's
/// order (`stats_fields_match_the_header` checks them against
/// include/usermm.h); each names a [`Stats`] field.
pub(super) const STATS_FIELDS: [&str; STATS_WORDS] = [
    "budget_pages",
    "resident_pages",
    "resident_pages_max",
    "locked_pages",
    "locked_charged_pages",
    "swapped_pages",
    "lazyfree_pages",
    "volatile_pages",
    "faults",
    "major_faults",
    "zero_fills",
    "swapins",
    "swapouts",
    "writebacks",
    "lazyfree_discards",
    "volatile_purges",
    "evictions",
    "oom_sigbus",
    "write_lock_hold_ns_max",
    // usermm's own:
    "inactive_pages",
    "minor_faults",
    "deactivations",
    "swap_read_errors",
    "swap_write_errors",
    "regions",
    "user_mode_only",
    "swap_direct_io",
    "host_refusals",
    "swap_write_fails",
    "swap_backoff_ms",
];

/// The words of `struct umm_stats` after its `size` field, in the header's
/// order. `umm_stats` copies as many of them as fit in the caller's `size`.
pub(super) fn stats_words(s: &Stats) -> [u64; STATS_WORDS] {
    STATS_FIELDS.map(|name| s.get(name).unwrap_or(0))
}

/// Fields of `struct umm_stats` after `size`.
pub const STATS_WORDS: usize = 30;
/// `sizeof(struct umm_stats)` in this library's version of the header.
pub const STATS_SIZE: usize = 8 * (1 + STATS_WORDS);

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
        let (bytes, r) = sp.mincore_walk(addr as usize, len)?;
        if !bytes.is_empty() {
            copy_out(Some(sp), vec as usize, &bytes)?;
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
        copy_out_sized_words(sp, out as usize, &stats_words(&sp.stats()))?;
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
