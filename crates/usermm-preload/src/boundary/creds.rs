//! Credential changes: the C library's `set*id` and `setgroups` run the
//! call in every thread it started, usermm's included, and abort the
//! process when one fails where the caller succeeded. Before each, the
//! space's threads are made to carry the caller's own credentials
//! (`usermm::threads_follow_credentials`: started again from the caller
//! when its capabilities, securebits or keep-caps differ from theirs), and
//! after it they are recorded as changed alike. `capset` and `prctl` change
//! the calling thread alone: after one succeeds, the space's threads follow
//! at once (so that a `setgroups` the C library makes inside `initgroups`,
//! which does not come through here, finds them equal).

use super::libc_only::next_fn;
use super::*;

/// Calls the C library's `$name` with usermm's threads following the
/// caller's credentials around it.
macro_rules! setxid {
    ($(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* )) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's own contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let Some(f) = libc_fn(&NEXT, concat!(stringify!($name), "\0").as_bytes()) else { return -1 };
            guard((), usermm::threads_follow_credentials);
            // SAFETY: `f` is the C library's function of this name and
            // signature.
            let real: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller's promises, forwarded.
            let r = unsafe { real($($arg),*) };
            let e = errno();
            guard((), usermm::credentials_changed_everywhere);
            set_errno(e);
            r
        }
    };
}

setxid!(
    /// `setuid(2)`.
    setuid(uid: libc::uid_t)
);
setxid!(
    /// `setgid(2)`.
    setgid(gid: libc::gid_t)
);
setxid!(
    /// `seteuid(2)`.
    seteuid(uid: libc::uid_t)
);
setxid!(
    /// `setegid(2)`.
    setegid(gid: libc::gid_t)
);
setxid!(
    /// `setreuid(2)`.
    setreuid(r: libc::uid_t, e: libc::uid_t)
);
setxid!(
    /// `setregid(2)`.
    setregid(r: libc::gid_t, e: libc::gid_t)
);
setxid!(
    /// `setresuid(2)`.
    setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t)
);
setxid!(
    /// `setresgid(2)`.
    setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t)
);
setxid!(
    /// `setgroups(2)`.
    setgroups(n: usize, list: *const libc::gid_t)
);

/// The C library's `capset` and `prctl` (0: not looked up, 1: not there).
static LIBC_CAPSET: AtomicUsize = AtomicUsize::new(0);
static LIBC_PRCTL: AtomicUsize = AtomicUsize::new(0);

type CapsetFn = unsafe extern "C" fn(*mut c_void, *const c_void) -> c_int;
type PrctlFn = unsafe extern "C" fn(c_int, libc::c_ulong, libc::c_ulong, libc::c_ulong, libc::c_ulong) -> c_int;

/// The C library's `capset`.
///
/// # Safety
/// `capset(2)`'s contract.
pub(super) unsafe extern "C" fn own_capset(header: *mut c_void, data: *const c_void) -> c_int {
    let Some(f) = libc_fn(&LIBC_CAPSET, b"capset\0") else { return -1 };
    // SAFETY: `f` is glibc's `capset`, of this signature.
    let real: CapsetFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(header, data) }
}

/// The C library's `prctl` (variadic: five integer words in registers, as
/// every option takes at most).
///
/// # Safety
/// `prctl(2)`'s contract.
pub(super) unsafe extern "C" fn own_prctl(
    option: c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> c_int {
    let Some(f) = libc_fn(&LIBC_PRCTL, b"prctl\0") else { return -1 };
    // SAFETY: `f` is glibc's `prctl`; its variadic arguments are read from
    // the same registers.
    let real: PrctlFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(option, a2, a3, a4, a5) }
}

/// After a call that changed the calling thread's own credentials (`r` its
/// result), usermm's threads follow them.
fn followed(r: c_int) -> c_int {
    if r >= 0 {
        let e = errno();
        guard((), usermm::threads_follow_credentials);
        set_errno(e);
    }
    r
}

/// A program's `capset`: see the module's documentation.
///
/// # Safety
/// `capset(2)`'s contract.
pub(super) unsafe extern "C" fn program_capset(header: *mut c_void, data: *const c_void) -> c_int {
    // SAFETY: forwarded.
    followed(unsafe { own_capset(header, data) })
}

/// A program's `prctl`: see the module's documentation.
///
/// # Safety
/// `prctl(2)`'s contract.
pub(super) unsafe extern "C" fn program_prctl(
    option: c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> c_int {
    // SAFETY: forwarded.
    let r = unsafe { own_prctl(option, a2, a3, a4, a5) };
    // (Only the options that change credentials: `PR_SET_NAME` and the
    // others cost nothing more.)
    const CRED_OPTIONS: [c_int; 4] =
        [libc::PR_SET_KEEPCAPS, libc::PR_SET_SECUREBITS, libc::PR_CAPBSET_DROP, libc::PR_CAP_AMBIENT];
    if CRED_OPTIONS.contains(&option) {
        followed(r)
    } else {
        r
    }
}

interpose!(
    /// `capset(2)`.
    fn capset(header: *mut c_void, data: *const c_void) -> c_int => own_capset, program_capset
);
interpose!(
    /// `prctl(2)`.
    fn prctl(option: c_int, a2: libc::c_ulong, a3: libc::c_ulong, a4: libc::c_ulong, a5: libc::c_ulong) -> c_int
        => own_prctl, program_prctl
);

/// The C library's function `name` ([`next_fn`], looked up on the C
/// library's memory); `None` with `errno` `ENOSYS` when it has none.
fn libc_fn(cache: &AtomicUsize, name: &[u8]) -> Option<usize> {
    let f = {
        let _libc = crate::LibcOnly::enter();
        next_fn(cache, name)
    };
    if f.is_none() {
        set_errno(libc::ENOSYS);
    }
    f
}

/// The calling thread's `errno`.
fn errno() -> c_int {
    // SAFETY: `__errno_location` returns the calling thread's errno.
    unsafe { *libc::__errno_location() }
}
