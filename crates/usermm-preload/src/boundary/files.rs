//! The opens that may read a memory cgroup's limit file (`crate::cgroup`):
//! `open`, `open64`, `openat`, `openat64`, `fopen`, `fopen64`. A read-only
//! open of the process's own limit file gets a memfd holding the view;
//! every other open is the C library's, untouched.
//!
//! `open` and `openat` are variadic in C; on x86-64 a variadic argument
//! travels in the register a fixed one would, so `mode` is read as a third
//! (fourth) parameter, as the C library's own definitions read it, and only
//! passed on.

use std::ffi::CStr;

use super::libc_only::next_fn;
use super::*;

/// A descriptor of a new memfd holding `bytes`, at offset 0; `None` if
/// one could not be made.
fn view_fd(bytes: &[u8], cloexec: bool) -> Option<c_int> {
    const NAME: &[u8] = b"usermm-cgroup-view\0";
    let flags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: `NAME` is NUL-terminated.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr().cast(), flags) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `bytes` is valid for its length; `fd` is the memfd just made.
    let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    // SAFETY: a seek of the memfd just made.
    if written != bytes.len() as isize || unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } != 0 {
        // SAFETY: closes the memfd just made, which nothing else holds.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// The view's descriptor for an open of `path` with `flags`, if `path` is
/// the process's own memory limit file and the budget is below its limit.
fn cgroup_view(path: *const c_char, flags: c_int) -> Option<c_int> {
    if path.is_null() {
        return None;
    }
    // SAFETY: an `open` path: NUL-terminated (the caller's promise).
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    if !crate::cgroup::may_view(p, flags) {
        return None;
    }
    let bytes = crate::cgroup::view(p, crate::budget_bytes()?)?;
    view_fd(&bytes, flags & libc::O_CLOEXEC != 0)
}

/// Exports an `open`-like function `$name($($arg),*)`, whose path is
/// `$path` and flags `$flags`: the view's descriptor, or the C library's
/// function of that name.
macro_rules! open_view {
    ($(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* ), $path:ident, $flags:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's own contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            if let Some(fd) = guard(None, || cgroup_view($path, $flags)) {
                return fd;
            }
            let f = {
                let _libc = crate::LibcOnly::enter();
                next_fn(&NEXT, concat!(stringify!($name), "\0").as_bytes())
            };
            let Some(f) = f else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: `f` is the C library's function of this name, of
            // this signature (its header's, the variadic mode a fixed
            // parameter: see the module docs).
            let real: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller's promises, forwarded.
            unsafe { real($($arg),*) }
        }
    };
}

open_view!(
    /// `open(2)`, the C library's, or a view of the memory limit.
    open(path: *const c_char, flags: c_int, mode: c_uint), path, flags
);
open_view!(
    /// `open64`, the C library's, or a view of the memory limit.
    open64(path: *const c_char, flags: c_int, mode: c_uint), path, flags
);
open_view!(
    /// `openat(2)`, the C library's, or a view of the memory limit (an
    /// absolute path: the directory descriptor does not matter).
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint), path, flags
);
open_view!(
    /// `openat64`, the C library's, or a view of the memory limit.
    openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint), path, flags
);

/// The view's stream for an `fopen` of `path` in `mode` (`"r"`, `"re"`):
/// `None` opens the real file.
pub(super) fn fopen_view(path: *const c_char, mode: *const c_char) -> Option<*mut libc::FILE> {
    if mode.is_null() {
        return None;
    }
    // SAFETY: an `fopen` mode: NUL-terminated (the caller's promise).
    let m = unsafe { CStr::from_ptr(mode) }.to_bytes();
    if m.first() != Some(&b'r') || m.contains(&b'+') {
        return None;
    }
    let fd = guard(None, || cgroup_view(path, libc::O_RDONLY | if m.contains(&b'e') { libc::O_CLOEXEC } else { 0 }))?;
    // SAFETY: `fd` is the view's memfd, `mode` the caller's.
    let f = unsafe { super::libc_only::fdopen(fd, mode) };
    if f.is_null() {
        // SAFETY: closes the memfd made above, which nothing else holds.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(f)
}
