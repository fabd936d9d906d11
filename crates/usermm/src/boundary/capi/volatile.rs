//! Volatile ranges and populate: `umm_mvolatile`, `umm_mnovolatile` (and its
//! `struct umm_purge_report`), `umm_populate` (and its
//! `struct umm_populate_report`).

use std::ffi::{c_int, c_void};

use super::copy::{copy_out, copy_out_zero_padded, read_usize};
use super::{guard, space, umm_populate_report, umm_purge_report, umm_space};
use crate::{Errno, PurgeReport, Space};

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

/// `umm_sigbus_action`: `sigaction(SIGBUS, act, oldact)` that, while
/// usermm's in-thread fault handler is installed, changes the handler it
/// chains to instead of replacing it (see `usermm_sys::inthread`).
///
/// # Safety
/// `act` must be NULL or point to a readable `struct sigaction`, `oldact`
/// NULL or point to a writable one.
#[no_mangle]
pub unsafe extern "C" fn umm_sigbus_action(act: *const c_void, oldact: *mut c_void) -> c_int {
    guard(-1, || {
        // SAFETY: this function's contract.
        unsafe { usermm_sys::inthread::sigbus_action_raw(act, oldact) }?;
        Ok(0)
    })
}
