//! Test helpers that need `unsafe`: signal dispositions for tests that check
//! how usermm reports a failed fault (SIGBUS). And one that does not, shared
//! by the tests and the benchmarks that start Redis servers:
//! [`free_cluster_port`].
//!
//! Nothing here is used by usermm itself.
//!
//! # Why tests need these
//! Rust's standard library installs its own SIGBUS (and SIGSEGV) handler at
//! start-up to report stack overflows. For any other fault address that
//! handler resets the signal to its default action and *returns*, so that the
//! faulting instruction runs again and takes the default action. Under
//! usermm the retried access is a new userfaultfd fault, which may well
//! succeed (an injected I/O error is used up). A test that wants "the first
//! SIGBUS kills the process" must therefore reset the disposition itself
//! ([`sigbus_default`]); a test that wants to observe the SIGBUS in-process
//! installs a recorder ([`SigbusRecorder`]).

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::{check, Errno};

/// Sets SIGBUS to its default action (terminate the process) for the whole
/// process.
pub fn sigbus_default() -> Result<(), Errno> {
    // SAFETY: sigaction is plain data; zeroed is a valid value (empty mask,
    // no flags), and SIG_DFL is a valid disposition.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = libc::SIG_DFL;
    // (Through usermm's in-thread handler when it is installed: the
    // default becomes what it chains to.)
    crate::inthread::sigbus_action(Some(&act), None)
}

/// Makes every SIGBUS of the process fatal *and said*: a handler (through
/// usermm's in-thread handler when that is installed, which chains to it)
/// writes the signal's `si_addr` and `si_code` to stderr, then ends the
/// process by the default action. For tests that expect no SIGBUS at all
/// (the stress test): without it, a test binary killed by one prints nothing
/// of where or why (`si_code` 2 is the kernel's `BUS_ADRERR`; -1,
/// `SI_QUEUE`, is usermm's transient failure, `si_errno` 5 (`EIO`) a read
/// error, 12 (`ENOMEM`) no frame).
pub fn sigbus_said_and_fatal() -> Result<(), Errno> {
    // SAFETY: sigaction is plain data; zeroed is a valid value.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = say_sigbus_and_die as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO;
    crate::inthread::sigbus_action(Some(&act), None)
}

extern "C" fn say_sigbus_and_die(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    use std::io::Write;
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // `si_addr` reads the _sigfault union member, which SIGBUS fills (and
    // usermm's queued SIGBUS too).
    let (addr, code, errno) = unsafe { ((*info).si_addr() as usize, (*info).si_code, (*info).si_errno) };
    let mut buf = [0u8; 160];
    let mut w = &mut buf[..];
    // (Formatting into a stack buffer allocates nothing.)
    let _ = writeln!(
        w,
        "FATAL: SIGBUS at {addr:#x}, si_code {code}, si_errno {errno} (thread {})",
        crate::thread::gettid()
    );
    let n = 160 - w.len();
    // SAFETY: write(2) of our own buffer, then the default action for the
    // signal (async-signal-safe calls only).
    unsafe {
        libc::write(2, buf.as_ptr() as *const libc::c_void, n);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

static RANGE_LO: AtomicUsize = AtomicUsize::new(0);
static RANGE_HI: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicU64 = AtomicU64::new(0);
static LAST_ADDR: AtomicUsize = AtomicUsize::new(0);
static LAST_CODE: AtomicI32 = AtomicI32::new(0);
static LAST_ERRNO: AtomicI32 = AtomicI32::new(0);
/// A `fn(usize)` called from the handler with `si_addr` (0: none).
static CALLBACK: AtomicUsize = AtomicUsize::new(0);
/// Only one recorder may be installed at a time (the disposition is
/// process-wide); tests in one binary run on parallel threads.
static INSTALLED: Mutex<()> = Mutex::new(());

/// A SIGBUS handler, installed for as long as the value lives, that records
/// the `si_addr` and `si_code` of every SIGBUS whose `si_addr` lies in
/// `[lo, hi)` and returns, so that the faulting access is retried.
///
/// A SIGBUS outside the range is not ours: the handler resets SIGBUS to its
/// default action and returns, so that the retried access (if it faults
/// again) terminates the process, as it would have without the recorder.
///
/// The handler only performs atomic loads and stores and `sigaction`, which
/// are async-signal-safe. It is sound to return from it: returning re-runs
/// the faulting instruction, which under usermm is served by the space (or
/// raises SIGBUS again).
pub struct SigbusRecorder {
    old: libc::sigaction,
    _only_one: MutexGuard<'static, ()>,
}

/// What a [`SigbusRecorder`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigbusRecord {
    /// How many SIGBUS signals in the range were caught.
    pub count: u64,
    /// `si_addr` of the last one.
    pub addr: usize,
    /// `si_code` of the last one (`BUS_ADRERR` is 2).
    pub code: i32,
    /// `si_errno` of the last one (usermm's `SI_QUEUE` SIGBUS says its
    /// cause there).
    pub errno: i32,
}

extern "C" fn record_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // `si_addr` reads the _sigfault union member, which SIGBUS fills.
    let (addr, code, errno) = unsafe { ((*info).si_addr() as usize, (*info).si_code, (*info).si_errno) };
    let lo = RANGE_LO.load(Ordering::SeqCst);
    let hi = RANGE_HI.load(Ordering::SeqCst);
    if addr >= lo && addr < hi {
        LAST_ADDR.store(addr, Ordering::SeqCst);
        LAST_CODE.store(code, Ordering::SeqCst);
        LAST_ERRNO.store(errno, Ordering::SeqCst);
        COUNT.fetch_add(1, Ordering::SeqCst);
        let cb = CALLBACK.load(Ordering::SeqCst);
        if cb != 0 {
            // SAFETY: CALLBACK only ever holds 0 or a `fn(usize)` stored by
            // `install_with`.
            let f: fn(usize) = unsafe { std::mem::transmute::<usize, fn(usize)>(cb) };
            f(addr);
        }
    } else {
        let _ = sigbus_default();
    }
}

impl SigbusRecorder {
    /// Installs the recorder for SIGBUS at addresses in `[lo, hi)`. Blocks
    /// while another recorder is installed.
    pub fn install(lo: usize, hi: usize) -> Result<SigbusRecorder, Errno> {
        Self::install_inner(lo, hi, 0)
    }

    /// Like `install`, and calls `callback(si_addr)` from the handler for
    /// every SIGBUS in the range (the seed's "regenerate in the handler"
    /// model: the callback may call usermm, e.g. `mnovolatile`, since the
    /// touching thread holds no usermm lock).
    pub fn install_with(lo: usize, hi: usize, callback: fn(usize)) -> Result<SigbusRecorder, Errno> {
        Self::install_inner(lo, hi, callback as usize)
    }

    fn install_inner(lo: usize, hi: usize, callback: usize) -> Result<SigbusRecorder, Errno> {
        let guard = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        CALLBACK.store(callback, Ordering::SeqCst);
        RANGE_LO.store(lo, Ordering::SeqCst);
        RANGE_HI.store(hi, Ordering::SeqCst);
        COUNT.store(0, Ordering::SeqCst);
        LAST_ADDR.store(0, Ordering::SeqCst);
        LAST_CODE.store(0, Ordering::SeqCst);
        LAST_ERRNO.store(0, Ordering::SeqCst);
        // SAFETY: sigaction is plain data; zeroed is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = record_sigbus;
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `act.sa_mask` is a valid sigset to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // (Chained to by usermm's in-thread handler when it is installed.)
        crate::inthread::sigbus_action(Some(&act), Some(&mut old))?;
        Ok(SigbusRecorder { old, _only_one: guard })
    }

    /// What has been recorded so far.
    pub fn record(&self) -> SigbusRecord {
        SigbusRecord {
            count: COUNT.load(Ordering::SeqCst),
            addr: LAST_ADDR.load(Ordering::SeqCst),
            code: LAST_CODE.load(Ordering::SeqCst),
            errno: LAST_ERRNO.load(Ordering::SeqCst),
        }
    }
}

impl Drop for SigbusRecorder {
    fn drop(&mut self) {
        let _ = crate::inthread::sigbus_action(Some(&self.old), None);
        RANGE_LO.store(0, Ordering::SeqCst);
        RANGE_HI.store(0, Ordering::SeqCst);
        CALLBACK.store(0, Ordering::SeqCst);
    }
}

/// How a one-byte user-mode load ended ([`read_in_child`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The load returned a byte.
    Loaded,
    /// The load raised `sig` with `si_code` `code` (`SEGV_PKUERR`, 4, for an
    /// exec-only page on a host with protection keys).
    Signal { sig: i32, code: i32 },
    /// The child did not end within its time, or ended otherwise.
    Other(crate::thread::ChildExit),
}

/// Exit statuses of [`read_in_child`]'s child: a base plus the `si_code`.
const LOADED: i32 = 0;
const SEGV_BASE: i32 = 100;
const BUS_BASE: i32 = 150;

extern "C" fn exit_with_code(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    let base = if sig == libc::SIGSEGV { SEGV_BASE } else { BUS_BASE };
    // SAFETY: `_exit` is async-signal-safe and ends the child at once.
    unsafe { libc::_exit(base + code.clamp(0, 49)) };
}

/// Loads the byte at `addr` with a user-mode load in a forked child (up to
/// `timeout_s` seconds) and says how the load ended: the signal and its
/// `si_code` the host raised, exactly, without this process taking it.
/// The child's handler ends it on SIGSEGV or SIGBUS (through usermm's
/// in-thread handler when that is installed, which chains to it).
pub fn read_in_child(addr: usize, timeout_s: u32) -> Result<LoadOutcome, Errno> {
    let exit = crate::thread::fork_run(timeout_s, || {
        // SAFETY: sigaction is plain data; zeroed is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = exit_with_code;
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: installing a handler in the child only, which exits.
        unsafe { libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()) };
        if crate::inthread::sigbus_action(Some(&act), None).is_err() {
            return 1;
        }
        let _ = crate::kernel::peek(addr);
        LOADED
    })?;
    Ok(match exit {
        crate::thread::ChildExit::Exited(LOADED) => LoadOutcome::Loaded,
        crate::thread::ChildExit::Exited(s) if (SEGV_BASE..BUS_BASE).contains(&s) => {
            LoadOutcome::Signal { sig: libc::SIGSEGV, code: s - SEGV_BASE }
        }
        crate::thread::ChildExit::Exited(s) if (BUS_BASE..BUS_BASE + 50).contains(&s) => {
            LoadOutcome::Signal { sig: libc::SIGBUS, code: s - BUS_BASE }
        }
        other => LoadOutcome::Other(other),
    })
}

/// A word of kernel memory shared with every process this one forks from
/// now on (a `MAP_SHARED` anonymous page, never unmapped): for tests whose
/// parent and children wait on each other.
pub fn shared_word() -> &'static std::sync::atomic::AtomicU32 {
    let m = crate::host::HostMap::shared_anon(4096, 0).expect("a shared anonymous page");
    let addr = m.addr();
    std::mem::forget(m);
    // SAFETY: a fresh page-aligned, zero-filled mapping of ours, never
    // unmapped (its owner is forgotten above): a valid `AtomicU32` for as
    // long as the process lives.
    unsafe { &*(addr as *const std::sync::atomic::AtomicU32) }
}

/// Lowers this process's soft `RLIMIT_NOFILE` to `soft` (the hard limit
/// stays), as a user's session commonly sets it (1,024).
pub fn lower_nofile(soft: u64) -> Result<(), Errno> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is ours and writable.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) })?;
    rl.rlim_cur = rl.rlim_cur.min(soft);
    // SAFETY: `rl` is ours and readable.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) })?;
    Ok(())
}

/// Makes the host kernel reclaim `[addr, addr+len)` now (`MADV_PAGEOUT`), as
/// host memory pressure would: on a host without swap, clean lazily freed
/// pages are dropped. For tests of usermm's handling of host discards.
pub fn host_pageout(addr: usize, len: usize) -> Result<(), Errno> {
    // Drain every CPU's pending LRU batches first (mlock does), as the
    // host's own reclaim effectively does over time.
    let dummy = crate::mem::map_rw(4096)?;
    if crate::mem::mlock2(dummy, 4096, 0).is_ok() {
        let _ = crate::mem::munlock(dummy, 4096);
    }
    // SAFETY: `dummy` is our own page, no longer used.
    unsafe {
        let _ = crate::mem::unmap(dummy, 4096);
    }
    // SAFETY: MADV_PAGEOUT is advisory: it never changes what a page holds
    // except by dropping a clean lazily freed page, which the caller wants.
    check(unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_PAGEOUT) })?;
    Ok(())
}

/// A raw `madvise(MADV_DONTNEED)` of `[addr, addr+len)` behind usermm's
/// back, as a program compiled against `usermm_compat.h` makes with
/// `syscall(__NR_madvise, …)`: the host drops the pages usermm holds.
///
/// # Safety
/// No Rust reference may point into the range: its bytes become zeros.
pub unsafe fn raw_dontneed(addr: usize, len: usize) -> Result<(), Errno> {
    // SAFETY: the caller's contract.
    check(unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) })?;
    Ok(())
}

extern "C" fn ignore_nudge(_sig: libc::c_int) {}

/// Interrupts thread `tid` of this process with a signal whose handler does
/// nothing (SIGUSR2, installed here without `SA_RESTART`): a thread blocked
/// in a userfaultfd fault leaves it and faults again, as any signal makes
/// it (a timer's, a profiler's).
pub fn nudge_thread(tid: u32) -> Result<(), Errno> {
    // SAFETY: sigaction is plain data; zeroed is a valid value (empty mask,
    // no flags); the handler does nothing, which is async-signal-safe.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int) = ignore_nudge;
    act.sa_sigaction = handler as usize;
    // SAFETY: `act` is valid; the old disposition is not wanted.
    check(unsafe { libc::sigaction(libc::SIGUSR2, &act, std::ptr::null_mut()) })?;
    // SAFETY: tgkill takes its arguments by value.
    check(unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::c_long, libc::SIGUSR2) } as i32)?;
    Ok(())
}

/// Kills the calling process with SIGKILL at once (for crash-consistency
/// tests: nothing after this point runs, no destructor, no flush).
pub fn kill_self() -> ! {
    // SAFETY: kill takes its arguments by value; SIGKILL cannot be caught.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned")
}

static ALT_FN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn run_alt(_sig: libc::c_int) {
    let f = ALT_FN.load(Ordering::SeqCst);
    if f != 0 {
        // SAFETY: ALT_FN only holds 0 or a `fn()` stored by
        // `run_on_alt_stack`.
        let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(f) };
        f();
    }
}

/// Runs `f` in a SIGUSR1 handler on an alternate signal stack of
/// `stack_bytes` (`SA_ONSTACK`), in the calling thread, and returns when
/// the handler has returned: for tests of what code running on an
/// alternate stack may touch. Not reentrant (one at a time per process).
pub fn run_on_alt_stack(stack_bytes: usize, f: fn()) -> Result<(), Errno> {
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let stack = crate::mem::map_rw(stack_bytes)?;
    ALT_FN.store(f as usize, Ordering::SeqCst);
    // SAFETY: stack_t/sigaction are plain data; the stack is a fresh
    // mapping of `stack_bytes` that outlives the handler's run (it is
    // disabled before it is unmapped); `run_alt` has the plain handler
    // signature; tgkill targets this thread, whose handler runs before the
    // call returns (SIGUSR1 is not blocked: it is unblocked here).
    let r = unsafe {
        let ss = libc::stack_t { ss_sp: stack as *mut libc::c_void, ss_flags: 0, ss_size: stack_bytes };
        let mut old_ss: libc::stack_t = std::mem::zeroed();
        check(libc::sigaltstack(&ss, &mut old_ss))?;
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = run_alt as *const () as usize;
        act.sa_flags = libc::SA_ONSTACK;
        let mut old: libc::sigaction = std::mem::zeroed();
        check(libc::sigaction(libc::SIGUSR1, &act, &mut old))?;
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        let mut old_mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old_mask);
        let r = libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::syscall(libc::SYS_gettid), libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
        libc::sigaction(libc::SIGUSR1, &old, std::ptr::null_mut());
        libc::sigaltstack(&old_ss, std::ptr::null_mut());
        r
    };
    ALT_FN.store(0, Ordering::SeqCst);
    // SAFETY: the mapping made above, no longer the alternate stack and
    // referenced by nothing.
    let _ = unsafe { crate::mem::unmap(stack, stack_bytes) };
    if r < 0 {
        return Err(crate::last_errno());
    }
    Ok(())
}

/// Runs `f` with every signal but the synchronous ones
/// ([`crate::thread::USERMM_THREAD_UNBLOCKED`]) blocked in the calling
/// thread, then restores the mask: a worker thread as many servers make
/// them.
pub fn with_async_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    let _mask = crate::thread::ProgramSignalsBlocked::new();
    f()
}

static TAKEN_BY: AtomicUsize = AtomicUsize::new(0);

extern "C" fn record_taker(_sig: libc::c_int) {
    TAKEN_BY.store(crate::thread::gettid() as usize, Ordering::SeqCst);
}

/// Blocks `sig` in the calling thread, sends it to the whole process, waits
/// 200 ms and then unblocks it: `Ok(true)` when the handler ran only after
/// the unblocking, in this thread (as the kernel does when no other thread
/// of the process can take it); `Ok(false)` when another thread took it
/// meanwhile, or none did. The disposition and mask are restored.
pub fn signal_waits_for_unblock(sig: i32) -> Result<bool, Errno> {
    TAKEN_BY.store(0, Ordering::SeqCst);
    // SAFETY: sigaction and sigset_t are plain data; zeroed is a valid
    // value; the handler stores to an atomic, which is async-signal-safe.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int) = record_taker;
    act.sa_sigaction = handler as usize;
    // SAFETY: as above.
    let mut old_act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `act` and `old_act` are valid sigaction structs.
    check(unsafe { libc::sigaction(sig, &act, &mut old_act) })?;
    // SAFETY: sigset_t is plain data, initialised by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid, writable sigsets; `sig` is a valid signal.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
    }
    // SAFETY: kill takes its arguments by value.
    let sent = check(unsafe { libc::kill(libc::getpid(), sig) });
    std::thread::sleep(std::time::Duration::from_millis(200));
    let early = TAKEN_BY.load(Ordering::SeqCst);
    // SAFETY: `set` is valid; a pending `sig` is delivered here on return.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    let late = TAKEN_BY.load(Ordering::SeqCst);
    // SAFETY: restoring what was there before.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        libc::sigaction(sig, &old_act, std::ptr::null_mut());
    }
    sent?;
    Ok(early == 0 && late == crate::thread::gettid() as usize)
}

/// A free loopback port whose Redis Cluster bus port (+10,000) is free too
/// (a test or benchmark server binds both), both below the host's ephemeral
/// range (`net.ipv4.ip_local_port_range`).
///
/// Below it, because a server may be killed and started again on the same
/// ports (a cluster node rejoining): while it is down, every `connect` on
/// the machine (the other nodes calling its bus, clients reconnecting) takes
/// a local port from the ephemeral range, and one that lands on the node's
/// port or bus port makes the restart fail with "address in use". That
/// happened in CI. Ports are handed out from a cursor that starts at a
/// place drawn from the pid and the clock, so processes and calls do not
/// pick the same one; a host whose ephemeral range leaves no room below it
/// gets ports from the kernel (as before: restarts may then collide).
pub fn free_cluster_port() -> std::io::Result<u16> {
    use std::sync::atomic::AtomicU32;
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    const BUS: u32 = 10_000;
    const FIRST: u32 = 10_000;
    let ephemeral_first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|w| w.parse::<u32>().ok()))
        .unwrap_or(32_768);
    let free = |port: u32| {
        std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", (port + BUS) as u16)).is_ok()
    };
    if ephemeral_first >= FIRST + BUS + 1_000 {
        let n = ephemeral_first - BUS - FIRST;
        if CURSOR.load(Ordering::Relaxed) == u32::MAX {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % n;
            let _ = CURSOR.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
        }
        for _ in 0..n {
            let port = FIRST + CURSOR.fetch_add(1, Ordering::Relaxed) % n;
            if free(port) {
                return Ok(port as u16);
            }
        }
    }
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = u32::from(l.local_addr()?.port());
        drop(l);
        if port + BUS <= 65_535 && free(port) {
            return Ok(port as u16);
        }
    }
}

/// Makes, with the `openssl` command in `dir`, the files of a TLS setup for
/// 127.0.0.1 (shared by the tests and the benchmarks that start Redis
/// servers with TLS): a certificate authority (`ca.crt`, `ca.key`) and a
/// server certificate it signed (`server.crt`, `server.key`); with
/// `clients`, a client certificate it signed too (`client.crt`,
/// `client.key`) and a second authority that signed nothing
/// (`other-ca.crt`, `other-ca.key`). P-256 keys, two days.
pub fn make_certificates(dir: &std::path::Path, clients: bool) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let run = |args: &[&str]| -> Result<(), String> {
        let out =
            std::process::Command::new("openssl").args(args).current_dir(dir).output().map_err(|e| {
                format!("cannot run openssl ({e}): apt-get install openssl (scripts/install-deps.sh does)")
            })?;
        if !out.status.success() {
            return Err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(())
    };
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("write {}: {e}", dir.join(name).display()))
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let cas: &[&str] = if clients { &["ca", "other-ca"] } else { &["ca"] };
    for &ca in cas {
        let (key, crt, subj) = (format!("{ca}.key"), format!("{ca}.crt"), format!("/CN=usermm {ca}"));
        let mut a = vec!["req", "-x509", "-days", "2", "-subj", &subj];
        a.extend(ec);
        a.extend(["-keyout", &key, "-out", &crt]);
        run(&a)?;
    }
    write("server.ext", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")?;
    write("client.ext", "extendedKeyUsage=clientAuth\n")?;
    let whos: &[&str] = if clients { &["server", "client"] } else { &["server"] };
    for &who in whos {
        let (key, csr, crt, ext) =
            (format!("{who}.key"), format!("{who}.csr"), format!("{who}.crt"), format!("{who}.ext"));
        let subj = format!("/CN=usermm {who}");
        let mut a = vec!["req", "-new", "-subj", &subj];
        a.extend(ec);
        a.extend(["-keyout", &key, "-out", &csr]);
        run(&a)?;
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ])?;
    }
    Ok(())
}
