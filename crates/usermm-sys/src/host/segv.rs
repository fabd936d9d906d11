//! [`SegvBatchLocker`]: the seed's "PROT_NONE + SIGSEGV handler that
//! mprotects and mlocks a batch of pages", over one [`HostFileMap`].

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::HostFileMap;
use crate::{check, Errno};

static SEGV_BASE: AtomicUsize = AtomicUsize::new(0);
static SEGV_LEN: AtomicUsize = AtomicUsize::new(0);
static SEGV_BATCH_BYTES: AtomicUsize = AtomicUsize::new(0);
static SEGV_PAGE: AtomicUsize = AtomicUsize::new(4096);
static SEGV_FAULTS: AtomicU64 = AtomicU64::new(0);
/// The first errno an `mprotect` or `mlock` in the handler failed with (0:
/// none).
static SEGV_ERRNO: AtomicI32 = AtomicI32::new(0);
/// One locker at a time: the SIGSEGV disposition is process-wide.
static SEGV_INSTALLED: Mutex<()> = Mutex::new(());

/// Sets SIGSEGV to its default action from inside a handler.
fn segv_default() {
    // SAFETY: sigaction is plain data; zeroed is a valid value (empty mask,
    // no flags), and SIG_DFL is a valid disposition.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = libc::SIG_DFL;
    // SAFETY: `act` is a valid sigaction; a null old-action pointer is
    // allowed; sigaction is async-signal-safe.
    unsafe { libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()) };
}

/// The seed's user-space lock on fault: on a SIGSEGV inside the mapping,
/// `mprotect(PROT_READ)` and `mlock` the faulting page and the `batch - 1`
/// pages after it, clipped to the mapping's end.
///
/// Only raw syscalls (`mprotect`, `mlock`, `sigaction`) and atomics, all
/// async-signal-safe; `errno` is saved and restored around them.
extern "C" fn segv_batch_lock(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; the location is valid for this thread.
    let saved_errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // `si_addr` reads the _sigfault member, which SIGSEGV fills.
    let addr = unsafe { (*info).si_addr() } as usize;
    let base = SEGV_BASE.load(Ordering::SeqCst);
    let end = base + SEGV_LEN.load(Ordering::SeqCst);
    if addr < base || addr >= end {
        // Not ours: let the retried access take the default action.
        segv_default();
    } else {
        SEGV_FAULTS.fetch_add(1, Ordering::Relaxed);
        let page = addr & !(SEGV_PAGE.load(Ordering::Relaxed) - 1);
        let len = SEGV_BATCH_BYTES.load(Ordering::Relaxed).min(end - page);
        let record = || {
            // SAFETY: as above.
            let e = unsafe { *libc::__errno_location() };
            let _ = SEGV_ERRNO.compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst);
        };
        // SAFETY: `[page, page+len)` lies inside the locker's mapping (the
        // bounds are checked above), which the locker's borrow keeps mapped;
        // it is read-only, so PROT_READ exposes no writable memory.
        if unsafe { libc::mprotect(page as *mut libc::c_void, len, libc::PROT_READ) } != 0 {
            record();
            // Typically ENOMEM: splitting the mapping would pass
            // vm.max_map_count. Make the whole mapping readable (no split:
            // it covers whole VMAs) so that the program finishes; the
            // recorded errno marks the run as failed.
            // SAFETY: as above, for the whole mapping.
            if unsafe { libc::mprotect(base as *mut libc::c_void, end - base, libc::PROT_READ) } != 0 {
                segv_default();
            }
        // SAFETY: locking changes no memory.
        } else if unsafe { libc::mlock(page as *const libc::c_void, len) } != 0 {
            record();
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// A SIGSEGV handler, installed for as long as the value lives, that does
/// the seed's "PROT_NONE + SIGSEGV handler that mprotects and mlocks a
/// batch of pages" over one [`HostFileMap`] opened `PROT_NONE`.
///
/// Unlike the seed's handler, which locked the faulting page first and then
/// speculatively tried the `batch - 1` pages after it (it did not know where
/// the mapping ended, and could crash past it), this one knows the mapping's
/// bounds (global atomics set by `install`) and clips the batch to them: one
/// `mprotect` + one `mlock` per fault.
///
/// A SIGSEGV outside the mapping is not ours: the handler resets SIGSEGV to
/// its default action and returns, so that the retried access terminates
/// the process as it would have without the locker. If `mprotect` fails
/// (`ENOMEM` past `vm.max_map_count`), the handler records the errno and
/// makes the whole mapping readable, so that the run ends and can be
/// reported as failed instead of looping; an `mlock` failure is recorded
/// too. Dropping the locker restores the previous SIGSEGV disposition.
pub struct SegvBatchLocker<'m> {
    old: libc::sigaction,
    _map: std::marker::PhantomData<&'m HostFileMap>,
    _only_one: MutexGuard<'static, ()>,
}

impl<'m> SegvBatchLocker<'m> {
    /// Installs the handler for `map` with batches of `batch_pages` host
    /// pages (≥ 1). Blocks while another locker is installed.
    pub fn install(map: &'m HostFileMap, batch_pages: usize) -> Result<SegvBatchLocker<'m>, Errno> {
        if batch_pages == 0 {
            return Err(Errno::EINVAL);
        }
        let guard = SEGV_INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        SEGV_PAGE.store(page, Ordering::SeqCst);
        SEGV_BATCH_BYTES.store(batch_pages * page, Ordering::SeqCst);
        SEGV_FAULTS.store(0, Ordering::SeqCst);
        SEGV_ERRNO.store(0, Ordering::SeqCst);
        SEGV_BASE.store(map.addr, Ordering::SeqCst);
        SEGV_LEN.store(map.len, Ordering::SeqCst);
        // SAFETY: sigaction is plain data; zeroed is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = segv_batch_lock;
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `act.sa_mask` is a valid sigset to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid sigaction structs; the handler is
        // an `extern "C"` function with the SA_SIGINFO signature.
        if let Err(e) = check(unsafe { libc::sigaction(libc::SIGSEGV, &act, &mut old) }) {
            SEGV_LEN.store(0, Ordering::SeqCst);
            return Err(e);
        }
        Ok(SegvBatchLocker { old, _map: std::marker::PhantomData, _only_one: guard })
    }

    /// SIGSEGVs handled in the mapping so far.
    pub fn faults(&self) -> u64 {
        SEGV_FAULTS.load(Ordering::SeqCst)
    }

    /// The first errno an `mprotect` or `mlock` of the handler failed with.
    pub fn error(&self) -> Option<Errno> {
        match SEGV_ERRNO.load(Ordering::SeqCst) {
            0 => None,
            e => Some(Errno(e)),
        }
    }
}

impl Drop for SegvBatchLocker<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.old` is the disposition sigaction returned.
        unsafe { libc::sigaction(libc::SIGSEGV, &self.old, std::ptr::null_mut()) };
        SEGV_BASE.store(0, Ordering::SeqCst);
        SEGV_LEN.store(0, Ordering::SeqCst);
    }
}
