//! Threads and signals: thread ids, SIGBUS/SIGSEGV delivery, the wake-up eventfd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::{check, last_errno, Errno};

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// `si_code` of a SIGBUS usermm sends for a *transient* failure (a swap read
/// error, no frame to be had): `SI_QUEUE`.
pub const SIGBUS_TRANSIENT_SI_CODE: i32 = -1;

/// Raises SIGBUS in thread `tid` of this process, with `si_addr = addr` and
/// `si_code = SI_QUEUE` (-1).
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
pub fn sigbus_thread(tid: u32, addr: usize) -> Result<(), Errno> {
    fault_signal_thread(tid, libc::SIGBUS, addr)
}

/// Raises SIGSEGV in thread `tid`, with `si_addr = addr` and `si_code =
/// SI_QUEUE`: for a touch of unmapped memory when the page could not be made
/// `PROT_NONE` (the kernel's own SIGSEGV would say `SEGV_MAPERR`).
pub fn sigsegv_thread(tid: u32, addr: usize) -> Result<(), Errno> {
    fault_signal_thread(tid, libc::SIGSEGV, addr)
}

fn fault_signal_thread(tid: u32, sig: i32, addr: usize) -> Result<(), Errno> {
    // SAFETY: siginfo_t is plain data; zeroed is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = sig;
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
