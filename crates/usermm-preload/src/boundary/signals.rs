//! SIGBUS's action: a program's `sigaction`/`signal` for SIGBUS goes through
//! `umm_sigbus_action` while usermm's in-thread handler is installed.

use super::libc_only::next_fn;
use super::*;

// ---------------------------------------------------------------------------
// SIGBUS's action. With faults resolved in the faulting thread (`--inthread`,
// UMM_F_INTHREAD_FAULTS) every fault on the space is a SIGBUS that usermm's
// handler resolves; a program that set its own SIGBUS action with the C
// library's `sigaction` or `signal` would replace that handler, and the
// program's would then get the space's faults (a handler that returns makes
// the access fault again, one that jumps out leaves the page missing). So a
// program's SIGBUS action is set with `umm_sigbus_action`, which, while
// usermm's handler is installed, changes the handler usermm chains to for
// every SIGBUS that is not a fault to resolve (docs/design.md, "Faults in
// the faulting thread"); otherwise it is plain `sigaction`. Every other
// signal, and usermm's own calls (return address in this library: the
// handler thread's install, the handler's own `SIG_DFL` before it ends the
// process), go to the C library's functions.

pub(super) type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
pub(super) type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

/// The C library's `sigaction` and `signal` (`dlsym(RTLD_NEXT)`): 0 until
/// looked up, 1 when not there. Looked up by the constructor, so that a
/// signal handler never calls `dlsym`.
pub(super) static LIBC_SIGACTION: AtomicUsize = AtomicUsize::new(0);
pub(super) static LIBC_SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// Looks up the C library's signal functions (from the constructor).
pub(crate) fn find_signal_calls() {
    next_fn(&LIBC_SIGACTION, b"sigaction\0");
    next_fn(&LIBC_SIGNAL, b"signal\0");
}

/// The C library's `sigaction`.
///
/// # Safety
/// `sigaction(2)`'s contract.
pub(super) unsafe extern "C" fn own_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(f) = next_fn(&LIBC_SIGACTION, b"sigaction\0") else {
        return fail(libc::ENOSYS, -1);
    };
    // SAFETY: `f` is glibc's `sigaction`, of this signature.
    let real: SigactionFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(sig, act, old) }
}

/// The C library's `signal`.
///
/// # Safety
/// `signal(2)`'s contract.
pub(super) unsafe extern "C" fn own_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let Some(f) = next_fn(&LIBC_SIGNAL, b"signal\0") else {
        return fail(libc::ENOSYS, libc::SIG_ERR);
    };
    // SAFETY: `f` is glibc's `signal`, of this signature.
    let real: SignalFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(sig, handler) }
}

interpose!(
    /// `sigaction(2)`: SIGBUS's through `umm_sigbus_action` (see above).
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int
        => own_sigaction, program_sigaction
);
interpose!(
    /// `signal(2)` (glibc's: BSD semantics): SIGBUS's through
    /// `umm_sigbus_action` (see above).
    fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t => own_signal, program_signal
);

/// Whether this SIGBUS action call of the program's goes to
/// `umm_sigbus_action` (not before the space is open, nor from usermm's
/// threads or a re-entrant call).
pub(super) fn program_sigbus(sig: c_int) -> bool {
    sig == libc::SIGBUS && program_call().is_ok()
}

pub(super) unsafe extern "C" fn program_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if !program_sigbus(sig) {
        // SAFETY: the caller's promises, forwarded.
        return unsafe { own_sigaction(sig, act, old) };
    }
    // (Its allocations, if any, are the C library's.)
    let _libc = crate::LibcOnly::enter();
    // SAFETY: `act` is NULL or readable, `old` NULL or writable (the
    // caller's promises).
    unsafe { usermm::capi::umm_sigbus_action(act.cast(), old.cast()) }
}

pub(super) unsafe extern "C" fn program_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !program_sigbus(sig) {
        // SAFETY: the caller's promises, forwarded.
        return unsafe { own_signal(sig, handler) };
    }
    // glibc's `signal`: the signal blocked in its handler, interrupted
    // calls restarted.
    // SAFETY: plain data, all zeroes valid (an empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: a valid mask to add to.
    unsafe { libc::sigaddset(&mut sa.sa_mask, sig) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both point to valid sigaction structs.
    if unsafe { program_sigaction(sig, &sa, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
