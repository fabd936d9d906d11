//! Faults resolved in the faulting thread: the process-wide SIGBUS handler
//! behind `UMM_F_INTHREAD_FAULTS`.
//!
//! A space opened with that flag registers its memory with a userfaultfd
//! that has `UFFD_FEATURE_SIGBUS`: a missing-page (or write-protect) fault
//! raises SIGBUS (`si_code = BUS_ADRERR`, `si_addr` the exact address) in the
//! faulting thread instead of queueing a message for a handler thread. The
//! handler installed here finds the space whose range holds `si_addr` (a
//! fixed table of ranges, read with atomics: no lock, no allocation) and
//! calls the space's resolver, which installs the page and returns; the
//! thread then retries the access.
//!
//! Every other SIGBUS goes to the disposition the program had (saved at
//! install, or found in place of ours at a later install): a poisoned or
//! purged page (`BUS_MCEERR_AR` from a poison marker), a SIGBUS a resolver
//! queued to report a failure (`SI_QUEUE`, delivered when the handler
//! returns), a fault in no space. The program's handler runs with its own
//! `sa_mask` added to the thread's mask, but never with SIGBUS blocked: it
//! may touch space memory (regenerating a purged page), which is another
//! SIGBUS, served nested. `SIG_DFL`/`SIG_IGN` end the process as the kernel
//! would (the default action, with its core dump).
//!
//! The handler does not ask for `SA_ONSTACK`: it runs on the stack the
//! thread was using (the resolver needs more than a typical 8 KiB alternate
//! stack). A SIGBUS cannot be handled by a thread that blocks SIGBUS: the
//! kernel then kills the process (`force_sig_fault` unblocks and resets a
//! blocked synchronous signal); usermm's docs say so.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// How many spaces with in-thread faults can be open at once.
pub const MAX_SPACES: usize = 64;

/// A space's resolver, called in the faulting thread from the SIGBUS
/// handler.
pub trait Resolve: Send + Sync {
    /// Resolves the fault at `addr` (`write`: a write access; `wp`: a write
    /// to a write-protected page) of the calling thread. It must not unwind; a
    /// failure it reports is a SIGBUS or SIGSEGV it queues to `tid`
    /// What to do with the SIGBUS once the resolver has returned (it
    /// returns holding no lock).
    fn resolve(&self, addr: usize, write: bool, wp: bool) -> Outcome;
}

/// What the SIGBUS handler does after a space's resolver returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// The page is in (or the thread is to retry): return.
    Retry,
    /// The SIGBUS is the program's, as the kernel raised it (a purged or
    /// poisoned page: the kernel raises the same `BUS_ADRERR` for a poison
    /// marker as for a userfault): chain it.
    ProgramsSigbus,
    /// A failure to report as handler threads do (a swap read error, no
    /// frame): chain a SIGBUS with `si_code = SI_QUEUE` and `si_errno` the
    /// cause (see [`crate::thread::sigbus_thread`]).
    TransientSigbus { errno: i32 },
}

type Shared = std::sync::Arc<dyn Resolve>;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    /// A `Box<Shared>` (leaked while registered), or null.
    ctx: AtomicPtr<Shared>,
    /// Threads inside this slot's resolver.
    users: AtomicUsize,
    /// The fork generation ([`crate::thread::fork_generation`]) of the
    /// process that registered the range. A forked child inherits the
    /// table, but not the space (its reservation is `MADV_DONTFORK`, its
    /// locks may be held by threads that did not come along, and its
    /// userfaultfd still serves the *parent's* memory): the child's handler
    /// passes over such slots, and a child's registration reuses them (and
    /// leaks what they point to, which is the parent's).
    generation: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    ctx: AtomicPtr::new(std::ptr::null_mut()),
    users: AtomicUsize::new(0),
    generation: AtomicU64::new(0),
};
static SLOTS: [Slot; MAX_SPACES] = [EMPTY; MAX_SPACES];
/// Taken while a slot is claimed or the handler installed.
static INSTALL: InstallLock = InstallLock(std::sync::atomic::AtomicBool::new(false));

/// The lock behind `INSTALL`: a flag, so that a forked child can let go of
/// it ([`after_fork_in_child`]). A thread of the parent may hold it at the
/// fork (registering a space, `sigbus_action`); that thread does not exist
/// in the child, and a `std::sync::Mutex` would stay locked there forever:
/// the child's first in-thread space would hang in `register`. Holds are
/// short (a table update, a `sigaction`), so waiters yield.
struct InstallLock(std::sync::atomic::AtomicBool);

struct InstallGuard;

impl InstallLock {
    fn lock(&self) -> InstallGuard {
        while self.0.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        InstallGuard
    }
}

impl Drop for InstallGuard {
    fn drop(&mut self) {
        INSTALL.0.store(false, Ordering::Release);
    }
}

/// Called by the `pthread_atfork` child handler
/// ([`crate::thread::watch_forks`]): the child is single-threaded, so no
/// holder of `INSTALL` exists there (async-signal-safe: one atomic store).
pub(crate) fn after_fork_in_child() {
    INSTALL.0.store(false, Ordering::Release);
}

/// Test hook: holds `INSTALL` for `ms` milliseconds on a thread of its
/// own (as a thread registering a space holds it), returning once it is
/// held.
#[cfg(feature = "bench-helpers")]
pub fn hold_install_lock_for_test(ms: u64) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _g = INSTALL.lock();
        let _ = tx.send(());
        std::thread::sleep(std::time::Duration::from_millis(ms));
    });
    let _ = rx.recv();
}
/// The program's SIGBUS disposition, chained to: two copies, `CUR` naming
/// the one handlers read; a writer (under `INSTALL`) fills the other, then
/// flips `CUR`.
static mut OLD: [std::mem::MaybeUninit<libc::sigaction>; 2] =
    [std::mem::MaybeUninit::zeroed(), std::mem::MaybeUninit::zeroed()];
static CUR: AtomicUsize = AtomicUsize::new(0);

fn set_old(a: libc::sigaction) {
    let next = 1 - CUR.load(Ordering::Acquire);
    // SAFETY: only writers under INSTALL write OLD, and only the copy CUR
    // does not name (handlers read the one it names).
    unsafe { (*std::ptr::addr_of_mut!(OLD))[next].write(a) };
    CUR.store(next, Ordering::Release);
}

fn old() -> libc::sigaction {
    // SAFETY: the copy CUR names is initialised (zeroed at start: SIG_DFL)
    // and not being written.
    unsafe { (*std::ptr::addr_of!(OLD))[CUR.load(Ordering::Acquire)].assume_init() }
}

/// `sigaction(SIGBUS, new, old)` for a program that shares the process with
/// spaces that have in-thread faults: while usermm's handler is installed,
/// `new` becomes the disposition it chains to (and `old` receives the
/// previous one) instead of replacing it. Without in-thread spaces it is
/// plain `sigaction`.
pub fn sigbus_action(new: Option<&libc::sigaction>, old_out: Option<&mut libc::sigaction>) -> Result<(), crate::Errno> {
    let _g = INSTALL.lock();
    // SAFETY: a zeroed sigaction is valid plain data.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading the current action into a valid out-pointer.
    crate::check(unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) })?;
    if cur.sa_sigaction != on_sigbus as *const () as usize {
        let n = new.map_or(std::ptr::null(), |n| n as *const libc::sigaction);
        let o = old_out.map_or(std::ptr::null_mut(), |o| o as *mut libc::sigaction);
        // SAFETY: valid (or null) pointers to sigaction structs.
        crate::check(unsafe { libc::sigaction(libc::SIGBUS, n, o) })?;
        return Ok(());
    }
    if let Some(o) = old_out {
        *o = old();
    }
    if let Some(n) = new {
        set_old(*n);
    }
    Ok(())
}

/// A registered space range; unregisters on drop, after every thread that
/// entered the space's resolver has left it.
pub struct Registration {
    slot: usize,
    /// The fork generation it was made in.
    generation: u64,
}

/// Registers `[start, end)` with `resolver`, installing the SIGBUS handler
/// if it is not (or no longer) installed. The registration keeps `resolver`
/// alive until it is dropped. `ENOSPC`: `MAX_SPACES` spaces already have
/// in-thread faults.
pub fn register(start: usize, end: usize, resolver: Shared) -> Result<Registration, crate::Errno> {
    let generation = crate::thread::watch_forks()?;
    let _g = INSTALL.lock();
    install()?;
    for (i, s) in SLOTS.iter().enumerate() {
        let free = s.ctx.load(Ordering::Acquire).is_null() && s.users.load(Ordering::SeqCst) == 0;
        // (A slot of the parent's, in a forked child: its resolver is the
        // parent's, left alone, and the threads counted in `users` did not
        // come along. The handler already passes over it.)
        let parents = s.generation.load(Ordering::SeqCst) != generation;
        if free || parents {
            if parents {
                // (Only here: in a slot of this process, a handler may be
                // counting itself in at this moment; in the parent's, the
                // child's handlers pass over it until `generation` is set
                // below.)
                s.ctx.store(std::ptr::null_mut(), Ordering::SeqCst);
                s.users.store(0, Ordering::SeqCst);
            }
            s.start.store(start, Ordering::Relaxed);
            s.end.store(end, Ordering::Relaxed);
            s.generation.store(generation, Ordering::SeqCst);
            s.ctx.store(Box::into_raw(Box::new(resolver)), Ordering::Release);
            return Ok(Registration { slot: i, generation });
        }
    }
    Err(crate::Errno(libc::ENOSPC))
}

/// Puts usermm's SIGBUS handler back in front if a plain `sigaction` has
/// replaced it since (that handler becomes the one chained to), as a
/// `register` does.
pub fn reinstall() -> Result<(), crate::Errno> {
    let _g = INSTALL.lock();
    install()
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _g = INSTALL.lock();
        if crate::thread::fork_generation() != self.generation {
            // A forked child dropping the parent's registration: the slot
            // is passed over here and may be a child's own by now.
            return;
        }
        let s = &SLOTS[self.slot];
        let p = s.ctx.swap(std::ptr::null_mut(), Ordering::SeqCst);
        while s.users.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        s.start.store(0, Ordering::Relaxed);
        s.end.store(0, Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: `p` came from Box::into_raw in `register`, was taken
            // out of the slot by the swap above (no handler can load it any
            // more), and every handler that had loaded it has left.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// Installs `on_sigbus` unless it is the current SIGBUS handler; whatever
/// was there becomes the disposition chained to. Called under `INSTALL`.
fn install() -> Result<(), crate::Errno> {
    // SAFETY: a zeroed sigaction is valid plain data.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sigaction with a null new action only reads the current one
    // into `cur`, a valid out-pointer.
    crate::check(unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) })?;
    if cur.sa_sigaction == on_sigbus as *const () as usize {
        return Ok(());
    }
    set_old(cur);
    // SAFETY: a zeroed sigaction is valid plain data.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigbus as *const () as usize;
    // SIGBUS itself stays unblocked (SA_NODEFER, and not in the mask): the
    // program's SIGBUS handler, chained from here, may touch the space (to
    // regenerate a purged page), and each such fault is another SIGBUS,
    // served nested. Async signals wait until the page is in: a program
    // handler that touches space memory then never finds the resolver
    // half-way.
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER;
    // SAFETY: sigfillset on a valid set.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    for s in [libc::SIGBUS, libc::SIGSEGV, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP] {
        // (Synchronous signals cannot wait: a blocked one kills.)
        // SAFETY: sigdelset on a valid, initialised set.
        unsafe { libc::sigdelset(&mut sa.sa_mask, s) };
    }
    // SAFETY: `sa` is a valid action for SIGBUS; `on_sigbus` has the
    // SA_SIGINFO signature.
    crate::check(unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) })?;
    Ok(())
}

/// Offset of `si_addr` in x86-64's siginfo_t (the `_sigfault` union).
const SI_ADDR_OFFSET: usize = 16;
/// Bits of x86's page-fault error code (`REG_ERR` in the signal context).
const PF_PROT: i64 = 1;
const PF_WRITE: i64 = 2;

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext for an
    // SA_SIGINFO handler; si_addr sits inside the 128-byte siginfo.
    let (code, addr) =
        unsafe { ((*info).si_code, ((info as *const u8).add(SI_ADDR_OFFSET) as *const usize).read_unaligned()) };
    if code == libc::BUS_ADRERR {
        let generation = crate::thread::fork_generation();
        for s in &SLOTS {
            if addr < s.start.load(Ordering::Relaxed) || addr >= s.end.load(Ordering::Relaxed) {
                continue;
            }
            if s.generation.load(Ordering::SeqCst) != generation {
                // The parent's space, in a forked child (see `Slot`).
                continue;
            }
            s.users.fetch_add(1, Ordering::SeqCst);
            let ctx = s.ctx.load(Ordering::SeqCst);
            if !ctx.is_null() && addr >= s.start.load(Ordering::Relaxed) && addr < s.end.load(Ordering::Relaxed) {
                // SAFETY: a valid ucontext (above); gregs[REG_ERR] is the
                // page-fault error code the kernel stored for this fault.
                let err = unsafe { (*(uc as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
                // SAFETY: a non-null ctx is a live Box<Shared>: the
                // registration frees it only after `users` is back to 0,
                // and we counted ourselves in before loading it.
                let r = unsafe { &*ctx };
                let wp = err & (PF_PROT | PF_WRITE) == PF_PROT | PF_WRITE;
                let outcome = r.resolve(addr, err & PF_WRITE != 0, wp);
                s.users.fetch_sub(1, Ordering::SeqCst);
                match outcome {
                    Outcome::Retry => {}
                    Outcome::ProgramsSigbus => chain(sig, info, uc),
                    Outcome::TransientSigbus { errno } => {
                        // SAFETY: a copy of the kernel's siginfo (plain
                        // data), with the code usermm's handler threads use.
                        let mut q = unsafe { *info };
                        q.si_code = libc::SI_QUEUE;
                        q.si_errno = errno;
                        chain(sig, &mut q, uc);
                    }
                }
                return;
            }
            s.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
    chain(sig, info, uc);
}

/// Hands a SIGBUS that is not a space's fault to the program's disposition.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let old = old();
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // The default action, as the kernel would take it: for a fault
        // (si_code > 0) the access is retried after we return and faults
        // again; a queued SIGBUS is queued again (blocked until we return).
        // SAFETY: a zeroed sigaction with SIG_DFL is valid.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    crate::thread::gettid() as libc::pid_t,
                    sig,
                    info,
                );
            }
        }
        return;
    }
    // The program's handler, with its mask added to the thread's mask (as
    // the kernel would have set it up), except SIGBUS: it may touch the
    // space, and each fault there is a SIGBUS (with SIGBUS blocked, the
    // kernel would end the process instead).
    // SAFETY: sigset operations on valid, initialised sets; the handler
    // pointer was installed by the program with the signature its
    // SA_SIGINFO flag says.
    unsafe {
        let ucx = &*(uc as *const libc::ucontext_t);
        let mut mask = ucx.uc_sigmask;
        for s in 1..=64 {
            if libc::sigismember(&old.sa_mask, s) == 1 {
                libc::sigaddset(&mut mask, s);
            }
        }
        libc::sigdelset(&mut mask, sig);
        let mut prev: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut prev);
        if old.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(h);
            f(sig, info, uc);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &prev, std::ptr::null_mut());
    }
}

/// [`sigbus_action`] for the C ABI: `new` and `old` are NULL or point to a
/// `struct sigaction`.
///
/// # Safety
/// `new`, when not NULL, must point to a readable `struct sigaction`; `old`,
/// when not NULL, to a writable one.
pub unsafe fn sigbus_action_raw(new: *const std::ffi::c_void, old: *mut std::ffi::c_void) -> Result<(), crate::Errno> {
    // SAFETY: the caller's contract; read_unaligned copes with any alignment.
    let n = (!new.is_null()).then(|| unsafe { (new as *const libc::sigaction).read_unaligned() });
    // SAFETY: a zeroed sigaction is valid plain data.
    let mut o: libc::sigaction = unsafe { std::mem::zeroed() };
    sigbus_action(n.as_ref(), if old.is_null() { None } else { Some(&mut o) })?;
    if !old.is_null() {
        // SAFETY: the caller's contract.
        unsafe { (old as *mut libc::sigaction).write_unaligned(o) };
    }
    Ok(())
}
