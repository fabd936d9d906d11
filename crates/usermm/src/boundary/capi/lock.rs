//! Locks: `umm_mlock`, `umm_mlock2`, `umm_munlock`, `umm_mlockall`,
//! `umm_munlockall`.

use std::ffi::{c_int, c_uint, c_void};

use super::{guard, space, umm_space};

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
