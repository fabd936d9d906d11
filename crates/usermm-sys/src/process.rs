//! Processes and termination signals, for a benchmark that sets up system
//! state (a memory cgroup, an active swap file) and must tear it down on
//! SIGINT/SIGTERM as well as on success and error.
//!
//! The scheme: the main thread blocks SIGINT and SIGTERM before any other
//! thread exists ([`block_termination_signals`]; every thread it starts
//! inherits the mask; so do children started with `std::process::Command`,
//! which must unblock them, [`unblock_termination_signals`]),
//! and one thread waits for them with `sigwait` ([`wait_termination_signal`]),
//! cleans up in ordinary (not async-signal) context, and ends the process
//! with the same signal ([`die_by_signal`]).

use crate::thread::ChildExit;
use crate::{check, Errno};

fn term_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t; the signals are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread
/// it starts afterwards). Call it first thing in `main`.
pub fn block_termination_signals() -> Result<(), Errno> {
    let set = term_set();
    // SAFETY: `set` is a valid sigset_t; the old mask is not wanted.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(Errno(r));
    }
    Ok(())
}

/// Unblocks SIGINT and SIGTERM in the calling thread: a child started by a
/// process that blocked them inherits the mask through `exec`
/// (`std::process::Command` does not reset it), and calls this to get their
/// default behaviour back.
pub fn unblock_termination_signals() -> Result<(), Errno> {
    let set = term_set();
    // SAFETY: `set` is a valid sigset_t; the old mask is not wanted.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(Errno(r));
    }
    Ok(())
}

/// Waits until SIGINT or SIGTERM is pending for the process (they must be
/// blocked in every thread, see [`block_termination_signals`]) and returns
/// which one, consuming it.
pub fn wait_termination_signal() -> i32 {
    let set = term_set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is a valid sigset_t, `sig` a valid, writable int.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            return sig;
        }
    }
}

/// Ends the process as signal `sig` would by default (so that the parent
/// sees "killed by SIGINT/SIGTERM"): resets its disposition, unblocks it in
/// this thread and raises it here. Falls back to `exit(128 + sig)`.
pub fn die_by_signal(sig: i32) -> ! {
    // SAFETY: resetting a disposition to SIG_DFL has no memory-safety
    // preconditions.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    // SAFETY: sigset_t is plain data; sigemptyset initialises it below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t; the old mask is not wanted.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: kill has no memory-safety preconditions.
    check(unsafe { libc::kill(pid, sig) }).map(|_| ())
}

/// Waits for child `pid` to end (reaping it) and says how it ended; ECHILD
/// when it is no child of this process or was reaped already.
pub fn wait_child(pid: i32) -> Result<ChildExit, Errno> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid, writable int.
        match check(unsafe { libc::waitpid(pid, &mut status, 0) }) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Err(e),
            Ok(_) if libc::WIFSIGNALED(status) => return Ok(ChildExit::Signaled(libc::WTERMSIG(status))),
            Ok(_) => return Ok(ChildExit::Exited(libc::WEXITSTATUS(status))),
        }
    }
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Kills child `pid` (SIGKILL) and reaps it; a child already reaped (ECHILD)
/// or gone (ESRCH) is no error.
pub fn kill_and_reap(pid: i32) -> Result<(), Errno> {
    match kill(pid, libc::SIGKILL) {
        Ok(()) | Err(Errno(libc::ESRCH)) => {}
        Err(e) => return Err(e),
    }
    match wait_child(pid) {
        Ok(_) | Err(Errno(libc::ECHILD)) => Ok(()),
        Err(e) => Err(e),
    }
}
