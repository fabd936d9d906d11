//! The calls on a range's mapping: `umm_mmap`, `umm_munmap`,
//! `umm_mprotect`, `umm_msync`, `umm_madvise`, `umm_mseal`.

use std::ffi::{c_int, c_void};

use super::{guard, space, umm_space, MAP_FAILED};

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

/// `umm_mseal`.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). Other pointers need
/// not be valid: they are only copied through.
#[no_mangle]
pub unsafe extern "C" fn umm_mseal(
    s: *mut umm_space,
    addr: *mut c_void,
    len: usize,
    flags: std::ffi::c_ulong,
) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || sp?.mseal(addr as usize, len, flags).map(|()| 0))
}
