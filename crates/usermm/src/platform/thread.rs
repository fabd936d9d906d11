//! `Platform::thread` on the host kernel: signals queued to threads and
//! looked up in `/proc`, where threads run, the scheduling policy, and the
//! SIGBUS handler's table for faults resolved in the faulting thread
//! (`usermm_sys::thread`, `usermm_sys::inthread`).

use std::sync::Arc;

use usermm_core::Errno;
use usermm_sys::inthread::Resolve;
use usermm_sys::thread::ThreadCpu;

use super::{Native, Signal, ThreadOps};

thread_local! {
    /// This thread's reader of where other threads run (`shares_cpu`): a
    /// handler thread asks about the threads whose faults it serves.
    static THREAD_CPU: std::cell::RefCell<ThreadCpu> = std::cell::RefCell::default();
}

/// A thread's own credentials (`native/creds.rs`).
pub(crate) use usermm_sys::creds::ThreadCreds;

/// The calling thread's own credentials, if they can be read.
pub(crate) fn thread_creds() -> Option<ThreadCreds> {
    ThreadCreds::current().ok()
}

/// Every signal a program can handle blocked in the calling thread while
/// the guard lives: the threads it starts meanwhile inherit the mask
/// (`usermm_sys::thread::ProgramSignalsBlocked`).
pub(crate) fn program_signals_blocked() -> Result<usermm_sys::thread::ProgramSignalsBlocked, Errno> {
    usermm_sys::thread::ProgramSignalsBlocked::new().map_err(|e| Errno(e.0))
}

/// Registers this module's thread-locals in the calling thread now
/// (`platform::warm_thread_locals`).
pub(super) fn warm_thread_locals() {
    THREAD_CPU.with(|_| ());
}

impl ThreadOps for Native {
    fn signal(&self, tid: u32, sig: Signal, addr: usize) -> Result<(), Errno> {
        match sig {
            Signal::Bus(errno) => usermm_sys::thread::sigbus_thread(tid, addr, errno.0),
            Signal::Segv => usermm_sys::thread::sigsegv_thread(tid, addr),
        }
    }
    fn signal_pending(&self, tid: u32, sig: i32) -> Result<bool, Errno> {
        usermm_sys::thread::signal_pending_unblocked(tid, sig).ok_or(Errno::ENOENT)
    }
    fn shares_cpu(&self, tid: u32, max_age_ns: u64) -> Result<bool, Errno> {
        // (This thread's own CPU first: no `/proc` read when it is unknown.)
        let mine = usermm_sys::thread::current_cpu().ok_or(Errno::ENOENT)?;
        let theirs = THREAD_CPU.with(|t| t.borrow_mut().of(tid, max_age_ns)).ok_or(Errno::ENOENT)?;
        Ok(theirs == mine)
    }
    fn idle_priority(&self) -> Result<(), Errno> {
        usermm_sys::thread::set_idle_priority()
    }
    fn in_thread_on(&self, start: usize, end: usize, resolver: Arc<dyn Resolve>) -> Result<(), Errno> {
        let mut entry = self.in_thread_entry.lock().unwrap_or_else(|e| e.into_inner());
        if entry.is_some() {
            // A handler a program installed since with plain sigaction is
            // put behind usermm's.
            return usermm_sys::inthread::reinstall();
        }
        *entry = Some(usermm_sys::inthread::register(start, end, resolver)?);
        Ok(())
    }
    fn in_thread_off(&self) {
        // (Out of the lock before the drop, which waits for the threads
        // inside the resolver: one of them could be asking for the entry.)
        let entry = self.in_thread_entry.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(entry);
    }
}
