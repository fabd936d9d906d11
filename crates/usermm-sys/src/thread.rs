//! Threads and signals: thread ids, SIGBUS/SIGSEGV delivery, the wake-up eventfd.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{check, last_errno, Errno};

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// `si_code` of a SIGBUS usermm sends for a *transient* failure (a swap read
/// error, no frame to be had): `SI_QUEUE`.
pub const SIGBUS_TRANSIENT_SI_CODE: i32 = -1;

/// Raises SIGBUS in thread `tid` of this process, with `si_addr = addr`,
/// `si_code = SI_QUEUE` (-1) and `si_errno = errno`, the failure's cause
/// (`ENOMEM`: no frame; `EIO`: the page could not be read; `EHWPOISON`).
///
/// # Why not `BUS_ADRERR`?
/// The kernel lets a thread queue a kernel-style (positive) `si_code` only to
/// itself (`do_rt_tgsigqueueinfo` checks the *thread* id), and the faulting
/// thread is blocked in the kernel. Permanent conditions (a poisoned or
/// purged page) therefore use a userfaultfd poison marker instead, and the
/// kernel itself raises `BUS_ADRERR`; transient ones (a swap read error, no
/// frame) use this signal, so that the access can succeed when retried.
/// `si_addr` sits at the same place for both, so a handler reads it the same
/// way. A thread waiting in a userfaultfd fault is interrupted, returns to
/// user space and takes the signal; if its handler returns, the access is
/// retried.
pub fn sigbus_thread(tid: u32, addr: usize, errno: i32) -> Result<(), Errno> {
    fault_signal_thread(tid, libc::SIGBUS, addr, errno)
}

/// Raises SIGSEGV in thread `tid`, with `si_addr = addr` and `si_code =
/// SI_QUEUE`: for a touch of unmapped memory when the page could not be made
/// `PROT_NONE` (the kernel's own SIGSEGV would say `SEGV_MAPERR`).
pub fn sigsegv_thread(tid: u32, addr: usize) -> Result<(), Errno> {
    fault_signal_thread(tid, libc::SIGSEGV, addr, 0)
}

fn fault_signal_thread(tid: u32, sig: i32, addr: usize, errno: i32) -> Result<(), Errno> {
    // SAFETY: siginfo_t is plain data; zeroed is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = sig;
    info.si_errno = errno;
    info.si_code = libc::SI_QUEUE;
    // si_addr sits at offset 16 of siginfo_t on x86-64 (the _sigfault union).
    // SAFETY: the union starts at byte 16 and the write stays inside the
    // 128-byte struct.
    unsafe {
        let p = (&mut info as *mut libc::siginfo_t as *mut u8).add(16) as *mut usize;
        p.write_unaligned(addr);
    }
    // SAFETY: `info` is a valid siginfo with a negative si_code, which any
    // thread may queue to another thread of its process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            tid as libc::pid_t,
            sig,
            &info as *const libc::siginfo_t,
        )
    };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// The signals a thread of usermm's leaves unblocked: those the kernel
/// raises in the thread that caused them (a fault, a bad instruction, a
/// trap, a refused system call). Blocking them would not keep them away: the
/// kernel forces such a signal through a blocked mask and kills the process.
/// Left unblocked, a fault of usermm's own in in-thread mode (a SIGBUS on a
/// space's page) still reaches the resolver.
pub const USERMM_THREAD_UNBLOCKED: [i32; 6] =
    [libc::SIGBUS, libc::SIGSEGV, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

/// Every signal a program can handle, blocked in the calling thread until
/// dropped (then the mask it had is back), except
/// [`USERMM_THREAD_UNBLOCKED`]. A thread started meanwhile inherits the
/// mask from its first instruction on, so no signal meant for the program
/// can ever be delivered to it: a process-directed signal that every
/// program thread blocks stays pending for the program, as without usermm.
/// (glibc keeps its own SIGCANCEL and SIGSETXID unblocked whatever the
/// mask: they act on every thread it started, `setuid` and friends.)
pub struct ProgramSignalsBlocked {
    old: libc::sigset_t,
}

impl ProgramSignalsBlocked {
    /// Blocks them; `Err` when `pthread_sigmask` fails (it does not for a
    /// valid set).
    pub fn new() -> Result<ProgramSignalsBlocked, Errno> {
        // SAFETY: sigset_t is plain data; sigfillset initialises it below.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable sigset_t; the signals are valid.
        unsafe {
            libc::sigfillset(&mut set);
            for s in USERMM_THREAD_UNBLOCKED {
                libc::sigdelset(&mut set, s);
            }
        }
        // SAFETY: `set` and `old` are valid sigset_ts.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if r != 0 {
            return Err(Errno(r));
        }
        Ok(ProgramSignalsBlocked { old })
    }
}

impl Drop for ProgramSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: `old` is the mask pthread_sigmask returned.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// The calling thread's blocked-signal mask as a bit set (bit `n - 1` for
/// signal `n`, signals 1–64).
pub fn blocked_signals() -> u64 {
    // SAFETY: sigset_t is plain data; pthread_sigmask fills it.
    let mut cur: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a null new set only reads the mask into `cur`.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) };
    let mut bits = 0u64;
    for s in 1..=64 {
        // SAFETY: `cur` is a valid sigset_t; `s` a valid signal number.
        if unsafe { libc::sigismember(&cur, s) } == 1 {
            bits |= 1 << (s - 1);
        }
    }
    bits
}

/// An eventfd used to wake handler threads out of `poll`.
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd, Errno> {
        // SAFETY: eventfd takes its arguments by value.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: a new descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64.
        unsafe { libc::write(self.0.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    /// In a forked child: a new eventfd under this one's number (the
    /// inherited one is shared with the parent: a signal would wake it).
    pub fn replace_in_child(&self) -> Result<(), Errno> {
        let new = EventFd::new()?;
        crate::replace_fd(self.raw(), new.0)
    }
}

/// Whether signal `sig` is pending for thread `tid` of this process and
/// not blocked by it (`SigPnd` and `SigBlk` of
/// `/proc/self/task/<tid>/status`): a signal queued to the thread
/// (`sigbus_thread`) that it has not taken yet, though it can. `None`
/// when the thread is gone or the file cannot be read.
pub fn signal_pending_unblocked(tid: u32, sig: i32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let mask = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    let bit = 1u64 << (sig - 1);
    Some(mask("SigPnd:")? & bit != 0 && mask("SigBlk:")? & bit == 0)
}

/// Pins the calling thread to CPU `cpu` (best effort; errors are ignored by
/// callers because pinning is only a latency optimisation).
pub fn pin_to_cpu(cpu: usize) -> Result<(), Errno> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes inside `set` for cpu < CPU_SETSIZE, checked here.
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Errno::EINVAL);
    }
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    check(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) }).map(|_| ())
}

/// Gives the calling thread the `SCHED_IDLE` policy: it runs only on a CPU
/// that has nothing else to run, and any other thread that wakes there
/// preempts it at once (best effort: callers ignore an error).
pub fn set_idle_priority() -> Result<(), Errno> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; 0 is the calling thread.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) }).map(|_| ())
}

/// Gives the calling thread the `SCHED_FIFO` policy at `priority` (1..=99):
/// no `SCHED_OTHER` task preempts it. Threads it creates from then on
/// inherit the policy (glibc's default `PTHREAD_INHERIT_SCHED`). For
/// latency measurements (`usermm bench munmap`): `EPERM` without
/// `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` that allows it.
pub fn set_fifo_priority(priority: i32) -> Result<(), Errno> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid sched_param; 0 is the calling thread.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) }).map(|_| ())
}

/// Gives the calling thread the default `SCHED_OTHER` policy back.
pub fn set_normal_priority() -> Result<(), Errno> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; 0 is the calling thread.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) }).map(|_| ())
}

/// Whether the calling thread runs at `SCHED_FIFO`.
pub fn is_fifo() -> bool {
    // SAFETY: no arguments besides the calling thread (0).
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_FIFO }
}

/// The fork generation of this process: 0 in the process that first loaded
/// usermm, bumped in the child of every `fork` after [`watch_forks`] ran.
///
/// # Why?
/// A space belongs to one process: its opener's, or a forked child's that
/// took a copy of it over. In a child that did not, its handler threads do
/// not exist and its locks may have been held by a parent thread at the
/// moment of the fork (so a child taking one would wait forever). A space
/// records the generation of the process it belongs to, and every call
/// compares it with this counter first: an atomic load, no `getpid`
/// syscall on the hot path.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The `pthread_atfork` child handler. It runs in the child, single-threaded,
/// right after `fork` returns there, before any other code of the child.
/// It also lets go of the in-thread handler table's lock, which a parent
/// thread may have held at the fork (`inthread::after_fork_in_child`), and
/// marks the handler registered: it runs only if it is (a parent thread may
/// have been between `pthread_atfork` and marking it, see [`watch_forks`]).
extern "C" fn on_fork_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
    WATCH.store(WATCHED, Ordering::Release);
    crate::inthread::after_fork_in_child();
    if let Some(h) = fork_hooks_now() {
        (h.child)();
    }
}

thread_local! {
    /// Set while this thread forks with [`fork_quietly`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, whose forks run no hook ([`ForkHooks`]): their children get
/// no copy of any space (their memory is there, unserved: such a child
/// must not touch it). For the processes usermm forks for itself
/// (`exit::run_after`), which only make system calls and exit.
pub fn fork_quietly<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            let was = self.0;
            QUIET.with(|q| q.set(was));
        }
    }
    let _reset = Reset(QUIET.with(|q| q.replace(true)));
    f()
}

/// The hooks to run at this fork: none in a quiet one ([`fork_quietly`]).
fn fork_hooks_now() -> Option<&'static ForkHooks> {
    fork_hooks().filter(|_| !QUIET.with(|q| q.get()))
}

/// The `pthread_atfork` prepare handler: the hooks' `prepare` (the library
/// above takes every lock a fork must not split).
extern "C" fn on_fork_prepare() {
    if let Some(h) = fork_hooks_now() {
        (h.prepare)();
    }
}

/// The `pthread_atfork` parent handler: the hooks' `parent`.
extern "C" fn on_fork_parent() {
    if let Some(h) = fork_hooks_now() {
        (h.parent)();
    }
}

/// What the library above runs at every fork once it set them
/// ([`set_fork_hooks`]): `prepare` in the forking thread before the fork,
/// then `parent` in it after, and `child` in the child (after the
/// generation moved on), each single-threaded with respect to the others.
pub struct ForkHooks {
    pub prepare: fn(),
    pub parent: fn(),
    pub child: fn(),
}

static HOOKS: std::sync::atomic::AtomicPtr<ForkHooks> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Sets the fork hooks (the last call wins; call [`watch_forks`] too, which
/// registers the handlers that run them).
pub fn set_fork_hooks(h: &'static ForkHooks) {
    HOOKS.store(h as *const ForkHooks as *mut ForkHooks, Ordering::Release);
}

fn fork_hooks() -> Option<&'static ForkHooks> {
    let p = HOOKS.load(Ordering::Acquire);
    // SAFETY: `HOOKS` only ever holds null or a `&'static ForkHooks`
    // (`set_fork_hooks`).
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Anything, as a lock guard kept across a fork ([`keep_across_fork`]).
pub trait Kept {}
impl<T: ?Sized> Kept for T {}

/// A guard kept across a fork with the owner of the lock it holds.
struct KeptGuard {
    /// Dropped first (declaration order): it borrows from `_owner`'s pointee.
    guard: Option<Box<dyn Kept>>,
    _owner: Box<dyn Kept>,
    /// Never let go in the child (see [`keep_across_fork`]).
    forget_in_child: bool,
}

thread_local! {
    /// The guards the forking thread keeps from the prepare handler to the
    /// parent's or the child's (the child's one thread is its copy).
    static KEPT: std::cell::RefCell<Vec<KeptGuard>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps the guard `take` returns — a lock of `*owner` — held by this
/// thread until [`release_kept`]: a fork's prepare handler takes the locks
/// a fork must not split, and its parent and child handlers let them go.
/// `forget_in_child`: the child never lets this one go (a lock whose
/// unlock may hand it to a parent thread parked on it, which does not exist
/// in the child; the child uses another).
pub fn keep_across_fork<O: Send + Sync + 'static>(
    owner: std::sync::Arc<O>,
    take: impl for<'a> FnOnce(&'a O) -> Box<dyn Kept + 'a>,
    forget_in_child: bool,
) {
    let guard = take(&owner);
    // SAFETY: `guard` borrows only from `*owner` (the closure's signature
    // gives it no other lifetime), which the `Arc` keeps at its address for
    // as long as the `Arc` lives; the `Arc` is kept beside the guard and
    // dropped after it (`KeptGuard`'s field order), and the guard is never
    // given out. So the guard never outlives what it borrows.
    let guard: Box<dyn Kept + 'static> = unsafe { std::mem::transmute::<Box<dyn Kept + '_>, Box<dyn Kept>>(guard) };
    KEPT.with(|k| k.borrow_mut().push(KeptGuard { guard: Some(guard), _owner: Box::new(owner), forget_in_child }));
}

/// Keeps a guard that borrows nothing but statics (a static lock's).
pub fn keep_static_across_fork(guard: Box<dyn Kept>) {
    KEPT.with(|k| k.borrow_mut().push(KeptGuard { guard: Some(guard), _owner: Box::new(()), forget_in_child: false }));
}

/// Lets go of every guard kept by this thread, the last kept first; in the
/// child of the fork (`in_child`), those kept with `forget_in_child` are
/// forgotten instead (their locks stay held there).
pub fn release_kept(in_child: bool) {
    let kept = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    for mut g in kept.into_iter().rev() {
        if in_child && g.forget_in_child {
            std::mem::forget(g.guard.take());
        }
        drop(g);
    }
}

/// A forked child's tie to its parent: a pipe whose write end, close-on-exec,
/// only the child holds (and the processes it forks in turn), so that the
/// parent's read end reads end-of-file once every one of them has exited
/// (`kill -9` included) or exec'd — from then on none reads what the
/// parent shared with it at the fork.
pub struct ChildTie {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

impl ChildTie {
    /// Before the fork (the prepare handler).
    pub fn new() -> Result<ChildTie, Errno> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for two descriptors.
        check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
        // SAFETY: two new descriptors we own.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(ChildTie { read, write: Some(write) })
    }

    /// In the parent after the fork: its copy of the write end closed.
    pub fn in_parent(mut self) -> ChildTie {
        self.write = None;
        self
    }

    /// In the child after the fork: the read end closed, the write end kept
    /// open until the child exits or execs.
    pub fn in_child(self) {
        let ChildTie { read, write } = self;
        drop(read);
        if let Some(w) = write {
            let _ = w.into_raw_fd();
        }
    }

    /// The read end (readable, or hung up, once [`ChildTie::gone`]).
    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Whether every holder of the write end has exited or exec'd (asks
    /// the kernel without waiting).
    pub fn gone(&self) -> bool {
        let mut p = libc::pollfd { fd: self.read.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r == 1 && p.revents & (libc::POLLHUP | libc::POLLIN | libc::POLLERR) != 0
    }
}

/// Whether the fork handler is registered: [`WATCHED`], 0 (not yet), or
/// `pid << 2 | REGISTERING` while a thread of process `pid` registers it.
/// Not a `OnceLock`: a fork while a parent thread is inside its
/// initialisation leaves the child's copy "running" forever, and the
/// child's first space would wait for it (the thread that would finish it
/// did not come along). Here the child sees another process's pid, and
/// registers the handler itself unless it ran in the child (then the
/// registration happened before the fork: glibc holds its `atfork` lock
/// across `fork`, and the handler marked it [`WATCHED`]).
static WATCH: AtomicU64 = AtomicU64::new(0);
const REGISTERING: u64 = 1;
const WATCHED: u64 = 2;

/// Test hook: how long a registration pauses with [`WATCH`] marked
/// registering, before its `pthread_atfork` (index 0) and after it (1), in
/// ms (0: none). See [`hold_fork_watch_registration_for_test`].
#[cfg(feature = "bench-helpers")]
static HOLD_MS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// Set while a registration pauses for the test hook.
#[cfg(feature = "bench-helpers")]
static HOLDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The test hook's pause at point `i` of a registration (see [`HOLD_MS`]).
#[cfg(feature = "bench-helpers")]
fn hold_for_test(i: usize) {
    let ms = HOLD_MS[i].swap(0, Ordering::Relaxed);
    if ms > 0 {
        HOLDING.store(true, Ordering::Release);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        HOLDING.store(false, Ordering::Release);
    }
}

/// Registers the fork handler (once per process) and returns the current
/// fork generation. Call it before recording the generation of a new space,
/// so that every later fork is counted. Fails only if `pthread_atfork` does
/// (`ENOMEM`; a later call tries again).
pub fn watch_forks() -> Result<u64, Errno> {
    loop {
        let w = WATCH.load(Ordering::Acquire);
        if w == WATCHED {
            return Ok(fork_generation());
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        if w != 0 && w >> 2 == pid {
            // Another thread of this process is registering it.
            std::thread::yield_now();
            continue;
        }
        // Not registered, or a thread of the parent was registering it at
        // the fork and had not yet when it forked (else the handler ran
        // here): register it.
        let me = pid << 2 | REGISTERING;
        if WATCH.compare_exchange(w, me, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            continue;
        }
        #[cfg(feature = "bench-helpers")]
        hold_for_test(0);
        // SAFETY: the three handlers are `extern "C" fn()`s of this library,
        // which lives as long as the library is loaded (glibc's
        // `pthread_atfork` registers them against this object's
        // `__dso_handle`, so an unload unregisters them); they catch no
        // unwinding (the hooks they call are the library's own, which do
        // not panic). `on_fork_child` first performs atomic adds and stores
        // only; the hooks it then runs are the library's (see
        // `ForkHooks`).
        let r = unsafe { libc::pthread_atfork(Some(on_fork_prepare), Some(on_fork_parent), Some(on_fork_child)) };
        #[cfg(feature = "bench-helpers")]
        hold_for_test(1);
        if r != 0 {
            WATCH.store(0, Ordering::Release);
            return Err(Errno(r));
        }
        // (A fork since `pthread_atfork` returned ran the handler in the
        // child, which marked it there.)
        WATCH.store(WATCHED, Ordering::Release);
        return Ok(fork_generation());
    }
}

/// Test hook: registers the fork handler on a thread of its own, which
/// stays `ms` milliseconds inside the registration — before its
/// `pthread_atfork` if `after_atfork` is false, after it otherwise —
/// and returns once that thread is inside (a no-op wait if the handler is
/// registered already). A test forks meanwhile: the child must not wait for
/// a registration that no thread of its own is making.
#[cfg(feature = "bench-helpers")]
pub fn hold_fork_watch_registration_for_test(ms: u64, after_atfork: bool) -> std::thread::JoinHandle<()> {
    HOLD_MS[after_atfork as usize].store(ms, Ordering::Relaxed);
    let h = std::thread::spawn(|| {
        let _ = watch_forks();
    });
    while !HOLDING.load(Ordering::Acquire) && !h.is_finished() {
        std::thread::yield_now();
    }
    h
}

/// The current fork generation (see [`watch_forks`]).
#[inline]
pub fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::Relaxed)
}

/// How a forked probe child ended.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum ProbeOutcome {
    /// The child read the byte and exited with it as its status.
    Read(u8),
    /// The child was killed by this signal.
    Signaled(i32),
}

/// Forks a child that reads the byte at `addr` and exits with it; reports
/// what happened to the child. The child runs only async-signal-safe code (a
/// volatile load and `_exit`), so forking a multithreaded process is fine.
/// This is how tests check what a forked child sees of a space's memory.
pub fn fork_probe_read(addr: usize) -> Result<ProbeOutcome, Errno> {
    // SAFETY: fork has no memory-safety preconditions; the child below only
    // performs a load and _exit, both async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(last_errno());
    }
    if pid == 0 {
        // SAFETY: in the child: the load either succeeds or raises a signal
        // that kills the child (default disposition is restored below); no
        // Rust state is touched.
        unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
            let v = std::ptr::read_volatile(addr as *const u8);
            libc::_exit(v as i32);
        }
    }
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(last_errno());
    }
    if libc::WIFSIGNALED(status) {
        Ok(ProbeOutcome::Signaled(libc::WTERMSIG(status)))
    } else {
        Ok(ProbeOutcome::Read(libc::WEXITSTATUS(status) as u8))
    }
}

/// How a forked child of [`fork_run`] ended.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum ChildExit {
    /// The child returned this status.
    Exited(i32),
    /// The child was killed by this signal (`SIGALRM`: it ran out of time).
    Signaled(i32),
}

/// Forks a child that runs `child` under `alarm(timeout_s)` and exits with
/// its return value; waits for it and reports how it ended. A child that
/// blocks is killed by `SIGALRM` (default disposition, restored in the
/// child). This is how tests check that a forked child never hangs.
///
/// `child` runs in the child of a possibly multithreaded process: only the
/// calling thread exists there, so it must not wait for another thread or
/// for a lock another thread may have held (stdio, for one); glibc's
/// `malloc` is safe. The child leaves with `_exit`: no destructor, no exit
/// handler of the parent's runs twice.
pub fn fork_run(timeout_s: u32, child: impl FnOnce() -> i32) -> Result<ChildExit, Errno> {
    fork_run_timed(timeout_s, child).map(|r| r.0)
}

/// [`fork_run`], also saying when `fork` returned in the parent
/// ([`crate::now_ns`]: the child can say when it started, and both are
/// measured from a `now_ns` taken just before the call).
pub fn fork_run_timed(timeout_s: u32, child: impl FnOnce() -> i32) -> Result<(ChildExit, u64), Errno> {
    // SAFETY: fork has no memory-safety preconditions; the child runs only
    // `child` (whose constraints are this function's contract) and `_exit`.
    let pid = unsafe { libc::fork() };
    let returned = crate::now_ns();
    if pid < 0 {
        return Err(last_errno());
    }
    if pid == 0 {
        // SAFETY: in the child: restoring SIGALRM's default disposition and
        // arming the alarm take no pointer; `_exit` never returns and runs
        // no Rust or C destructor.
        unsafe {
            libc::signal(libc::SIGALRM, libc::SIG_DFL);
            libc::alarm(timeout_s);
        }
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut status, 0) } >= 0 {
            break;
        }
        let e = last_errno();
        if e != Errno::EINTR {
            return Err(e);
        }
    }
    if libc::WIFSIGNALED(status) {
        Ok((ChildExit::Signaled(libc::WTERMSIG(status)), returned))
    } else {
        Ok((ChildExit::Exited(libc::WEXITSTATUS(status)), returned))
    }
}

/// Writes `msg` to file descriptor 2 with `write(2)` calls, taking no lock
/// (std's `eprintln!` takes stderr's, which in a forked child may be held
/// for good by a parent thread that was printing at the fork). Errors are
/// ignored, as `eprintln!`'s would panic, which this must not.
pub fn write_stderr_unlocked(msg: &str) {
    let mut b = msg.as_bytes();
    while !b.is_empty() {
        // SAFETY: `b` is a valid byte slice for the call's duration.
        let n = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
        if n > 0 {
            b = &b[n as usize..];
        } else if n < 0 && last_errno() == Errno::EINTR {
            continue;
        } else {
            return;
        }
    }
}

/// Sleeps while `*word == val` (`FUTEX_WAIT`, private): returns at once if
/// it differs, on a [`futex_wake`], on a signal or spuriously; the caller
/// checks the word again.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, val: u32) {
    // SAFETY: `word` is a valid, aligned u32 for the call; no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wakes the threads sleeping in [`futex_wait`] on `word`.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    futex_wake_n(word, i32::MAX);
}

/// Wakes at most `n` of the threads sleeping in [`futex_wait`] on `word`.
pub fn futex_wake_n(word: &std::sync::atomic::AtomicU32, n: i32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE only reads its address.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n) };
}

/// The CPU the calling thread runs on (`sched_getcpu`; glibc reads it from
/// the thread's rseq area or the vDSO: no system call). `None` if unknown.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: no arguments; returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// Where other threads of this process last ran: field 39 (`processor`)
/// of `/proc/self/task/TID/stat`, read through a file kept open for each
/// of the last [`ThreadCpu::THREADS`] threads asked about (a program's
/// faulting threads take turns: one file for all would be opened again at
/// every turn). A read costs about 1 µs on this VM (a `pread` that formats
/// the whole line), so an answer younger than the caller's bound is given
/// again instead.
#[derive(Default)]
pub struct ThreadCpu {
    /// The threads asked about, in the order they were first asked about.
    threads: Vec<Watched>,
    buf: Vec<u8>,
}

/// A thread [`ThreadCpu`] keeps a file for: its id, its stat file, and the
/// last answer (its CPU and when it was read).
type Watched = (u32, std::fs::File, Option<(u32, u64)>);

impl ThreadCpu {
    /// How many threads' files are kept open.
    pub const THREADS: usize = 8;

    /// The CPU thread `tid` last ran on, read at most `max_age_ns` ago;
    /// `None` when unknown (no such thread, or `/proc` not mounted).
    pub fn of(&mut self, tid: u32, max_age_ns: u64) -> Option<u32> {
        use std::os::unix::fs::FileExt;
        let now = crate::now_ns();
        let i = match self.threads.iter().position(|t| t.0 == tid) {
            Some(i) => i,
            None => {
                let f = std::fs::File::open(format!("/proc/self/task/{tid}/stat")).ok()?;
                if self.threads.len() == Self::THREADS {
                    self.threads.remove(0);
                }
                self.threads.push((tid, f, None));
                self.threads.len() - 1
            }
        };
        if let Some((cpu, at)) = self.threads[i].2 {
            if now.saturating_sub(at) < max_age_ns {
                return Some(cpu);
            }
        }
        self.buf.resize(1024, 0);
        let read = self.threads[i].1.read_at(&mut self.buf, 0).ok().and_then(|n| parse_stat_cpu(&self.buf[..n]));
        let Some(cpu) = read else {
            // (The thread is gone: its file with it.)
            self.threads.remove(i);
            return None;
        };
        self.threads[i].2 = Some((cpu, now));
        Some(cpu)
    }
}

/// Field 39 of a `/proc/.../stat` line (the comm, field 2, may hold spaces
/// and parentheses: the fields after it start past its last `)`).
fn parse_stat_cpu(line: &[u8]) -> Option<u32> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    // Field 3 (the state) is the first after the comm: 39 - 3 = 36.
    rest.split_ascii_whitespace().nth(36)?.parse().ok()
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn stat_cpu_field() {
        let l = b"123 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 7 0 0\n";
        assert_eq!(parse_stat_cpu(l), Some(7));
        assert_eq!(parse_stat_cpu(b"123 (x) S 1 2"), None);
    }

    #[test]
    fn own_thread_cpu_matches() {
        let mut t = ThreadCpu::default();
        let me = gettid();
        // (The thread may migrate between the two reads: retried.)
        let same = (0..100).any(|_| {
            let a = current_cpu();
            let b = t.of(me, 0);
            a.is_some() && a == b && current_cpu() == a
        });
        assert!(same, "the stat file's processor never matched sched_getcpu");
        assert_eq!(t.of(u32::MAX, u64::MAX), None);
        // (A recent answer is given again, a stale one read again.)
        let c = t.of(me, 0);
        assert_eq!(t.of(me, u64::MAX), c);
        // Threads taking turns each keep their file: at most `THREADS`.
        let others: Vec<u32> =
            (0..ThreadCpu::THREADS + 2).map(|_| std::thread::spawn(gettid)).map(|h| h.join().unwrap()).collect();
        for &o in &others {
            // (Gone threads: no answer, and nothing kept for them. A joined
            // thread's task leaves `/proc` a little after `join` returns:
            // the C library's join wakes on the thread's cleared tid, before
            // the kernel has released it.)
            let task = format!("/proc/self/task/{o}");
            for _ in 0..2000 {
                if !std::path::Path::new(&task).exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(t.of(o, 0), None);
        }
        assert_eq!(t.threads.len(), 1);
        // Two live threads asked about in turns: each keeps its own file.
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::Barrier::new(3));
        let live: Vec<_> = (0..2)
            .map(|_| {
                let (tx, stop) = (tx.clone(), stop.clone());
                std::thread::spawn(move || {
                    tx.send(gettid()).unwrap();
                    stop.wait();
                })
            })
            .collect();
        let tids = [rx.recv().unwrap(), rx.recv().unwrap()];
        for _ in 0..3 {
            for &o in &tids {
                assert!(t.of(o, 0).is_some());
            }
        }
        assert_eq!(t.threads.len(), 3);
        stop.wait();
        live.into_iter().for_each(|h| h.join().unwrap());
    }
}
