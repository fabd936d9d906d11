//! The fault service: the handler threads' loop and `resolve` (one fault,
//! planned by the core and served by `serve`), and the waits for pages in
//! flight to settle.
//!
//! # Answered faults
//! A thread leaves a userfaultfd fault whenever it is woken, by a signal of any
//! kind too, and faults again at once: a second message for the same access,
//! while the first stays with the handler that read it. Two handlers could then
//! each decide a SIGBUS (no frame, an unreadable page) for one access: the
//! thread took the first, recovered from it (a handler that jumps out of the
//! access) and got the second inside another call. A thread is in one fault at
//! a time and leaves it once a signal is queued to it, so every message of it
//! read before it took that signal was for the fault the signal answered: those
//! get no signal of their own (`Inner::signal_sent`). Whether it has taken it
//! is looked up before each read (`FaultService::next_read_batch`): a message
//! read after that is a new fault (a handler that returned retries the access).
//! A message of a batch read before the look-up saw the signal taken counts as
//! answered even if it came after: the thread is woken and faults again, into a
//! later batch. The record of the signals sent is `FaultService`'s
//! (`native/service.rs`).

use super::serve::{Caller, Next, Retries};
use super::*;
use usermm_sys::inthread::Outcome;

/// How `resolve_inner` ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Resolved {
    /// Served (or its failure reported to the thread).
    Served,
    /// A busy page, and the caller would not wait.
    Busy,
    /// In-thread: the page raises SIGBUS, the program's.
    ProgramsSigbus,
}

/// The signals a resolve defers (x86-64 Linux numbers).
pub(super) const SIGBUS: i32 = 7;
pub(super) const SIGSEGV: i32 = 11;

std::thread_local! {
    /// The read batch of the fault message this handler thread serves
    /// (`u64::MAX`: none, the newest).
    static BATCH: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
    /// Inside an in-thread resolve: `Some((signal to raise once the locks
    /// are let go, its si_errno))` (signal 0: none); `None` elsewhere.
    static DEFERRED: std::cell::Cell<Option<(i32, i32)>> = const { std::cell::Cell::new(None) };
}

/// In an in-thread resolve, records `sig` (SIGBUS, SIGSEGV, with `errno` its
/// `si_errno`) for the SIGBUS
/// handler to raise after the resolve has let go of every lock (a program
/// handler delivered at once could call usermm, which needs them) and
/// returns true; elsewhere false: the caller queues it to the thread.
pub(super) fn defer_signal(sig: i32, errno: i32) -> bool {
    DEFERRED.with(|d| match d.get() {
        Some(_) => {
            d.set(Some((sig, errno)));
            true
        }
        None => false,
    })
}

/// A space's resolver for `UMM_F_INTHREAD_FAULTS`: called from the SIGBUS
/// handler in the faulting thread (`usermm_sys::inthread`).
pub(crate) struct InThread(pub Arc<Inner>);

impl usermm_sys::inthread::Resolve for InThread {
    fn resolve(&self, addr: usize, write: bool, wp: bool) -> Outcome {
        // Whatever is allocated here comes from the system allocator: the
        // thread may have faulted inside a `GlobalHeap` allocation, holding
        // the heap's lock (and SIGBUS is blocked here: a fault in the
        // heap's own memory would end the process). And the thread is
        // marked as resolving its own fault: a page store's reads then sleep
        // for their reply rather than poll.
        let _system = crate::thread_role::SystemOnly::enter();
        let _resolving = crate::thread_role::ResolvingOwnFault::enter();
        let outer = DEFERRED.with(|d| d.replace(Some((0, 0))));
        let spun = SERVES_FAULTS.with(|s| s.replace(true));
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mm = self.0.read_mm();
            let c = lock(&self.0.core);
            // (The thread id is not needed: every signal a resolve would
            // queue to the thread is deferred, see `defer_signal`.)
            self.0.resolve_inner(&mm, c, addr, write, wp, Some(0), true, true)
        }));
        // (A nested fault, from a program handler this one chained to,
        // restores the outer resolve's state.)
        let (deferred, errno) = DEFERRED.with(|d| d.replace(outer)).unwrap_or((0, 0));
        SERVES_FAULTS.with(|s| s.set(spun));
        match served {
            Ok(Resolved::ProgramsSigbus) => Outcome::ProgramsSigbus,
            Ok(_) if deferred == SIGBUS => Outcome::TransientSigbus { errno },
            Ok(_) => {
                if deferred == SIGSEGV {
                    // No lock held any more: delivered now or on return.
                    let tid = usermm_sys::thread::gettid();
                    let _ = self.0.plat.thread(Thread::Signal { tid, sig: Signal::Segv, addr });
                }
                Outcome::Retry
            }
            // Never unwind out of a signal handler.
            Err(_) => std::process::abort(),
        }
    }
}

impl Inner {
    /// A handler thread's life: waits for fault messages, serves them,
    /// and spins for the next while they keep coming, until shutdown.
    pub(super) fn handler_loop(&self) {
        SERVES_FAULTS.with(|s| s.set(true));
        let mut msgs = [UffdMsg::default(); 32];
        while !self.threads_stop() {
            if self.plat.wait_events(&self.wake_fd, HANDLER_POLL_MS) == Ok(true) {
                self.serve_and_spin(&mut msgs);
            }
        }
    }

    /// Serves batches of fault messages, then spins briefly for the next
    /// ([`HANDLER_SPIN_NS`]) if no other handler does. The spin yields the
    /// CPU on every turn, so that a runnable thread queued on its CPU (the
    /// program) runs first.
    fn serve_and_spin(&self, msgs: &mut [UffdMsg]) {
        let mut spin_until = 0;
        loop {
            if self.serve_batch(msgs) > 0 {
                // Become the spinner unless this thread already is or
                // another one is.
                if spin_until == 0 && !self.service.start_spinning() {
                    break;
                }
                spin_until = now_ns() + HANDLER_SPIN_NS;
                continue;
            }
            if spin_until == 0 || now_ns() >= spin_until {
                break;
            }
            std::thread::yield_now();
        }
        if spin_until != 0 {
            self.service.stop_spinning();
        }
    }

    /// Reads one batch of fault messages and serves each; returns how many
    /// were read.
    fn serve_batch(&self, msgs: &mut [UffdMsg]) -> usize {
        let batch = self.service.next_read_batch(&self.plat);
        BATCH.with(|b| b.set(batch));
        let n = self.plat.read_events(msgs).unwrap_or(0);
        for m in &msgs[..n] {
            self.serve_message(m, batch);
        }
        n
    }

    /// Serves one fault message of read batch `batch`.
    fn serve_message(&self, m: &UffdMsg, batch: u64) {
        if m.event != UFFD_EVENT_PAGEFAULT {
            return;
        }
        if self.service.answered(m.ptid, batch) {
            // Its fault was answered by a signal the thread has not taken:
            // no second one. (A wake-up in case it has meanwhile: it faults
            // again.)
            let _ = self.plat.range(Range::Wake, m.address as usize & !(self.page_size - 1), self.page_size);
            return;
        }
        if m.flags & UFFD_PAGEFAULT_FLAG_WP != 0 {
            self.resolve_wp(m.address as usize, Some(m.ptid));
        } else {
            self.resolve(m.address as usize, m.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0, Some(m.ptid));
        }
    }

    /// Records that thread `tid` is sent `sig` for the fault of the message
    /// being served, and returns true; false when an earlier signal
    /// answers that fault (see `answered`): it is not sent.
    pub(super) fn signal_sent(&self, tid: u32, sig: i32) -> bool {
        self.service.signal_sent(tid, sig, BATCH.with(|b| b.get()))
    }

    /// Resolves a fault at `addr` (or a read-in when `tid` is None): plans
    /// under the core lock, and serves the plan (`serve`) until one serves
    /// the fault.
    pub fn resolve(&self, addr: usize, write: bool, tid: Option<u32>) {
        let mm = self.read_mm();
        let c = lock(&self.core);
        self.resolve_locked(&mm, c, addr, write, false, tid, true);
    }

    /// Resolves a WP fault at `addr`: the first write to a page installed
    /// write-protected (see `Core::wp_fault`).
    pub fn resolve_wp(&self, addr: usize, tid: Option<u32>) {
        let mm = self.read_mm();
        let c = lock(&self.core);
        self.resolve_locked(&mm, c, addr, true, true, tid, true);
    }

    /// `resolve` (`resolve_wp` with `wp`) with the locks taken; with
    /// `wait_busy` false, gives up (returns false) at a busy page instead of
    /// waiting for it to settle.
    #[allow(clippy::too_many_arguments)]
    fn resolve_locked<'a>(
        &'a self,
        mm: &RwLockReadGuard<'_, ()>,
        c: MutexGuard<'a, Core>,
        addr: usize,
        write: bool,
        wp: bool,
        tid: Option<u32>,
        wait_busy: bool,
    ) -> bool {
        self.resolve_inner(mm, c, addr, write, wp, tid, wait_busy, false) != Resolved::Busy
    }

    /// `resolve_locked`; with `in_thread` (the caller is the faulting
    /// thread's SIGBUS handler), a page that must raise SIGBUS (purged,
    /// poisoned) is left to the handler, which hands the SIGBUS on to the
    /// program as the kernel raised it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resolve_inner<'a>(
        &'a self,
        mm: &RwLockReadGuard<'_, ()>,
        mut c: MutexGuard<'a, Core>,
        addr: usize,
        write: bool,
        wp: bool,
        tid: Option<u32>,
        wait_busy: bool,
        in_thread: bool,
    ) -> Resolved {
        let page_addr = addr & !(self.page_size - 1);
        let caller = Caller::Fault { addr, tid, in_thread };
        let mut retries = Retries::default();
        loop {
            let a = Addr(page_addr as u64);
            let plan = if wp {
                c.wp_fault(a)
            } else if in_thread {
                // (This thread fills the whole window before it returns.)
                c.fault_in_thread(a, write)
            } else {
                c.fault(a, write)
            };
            if matches!(plan, FaultPlan::Busy) && !in_thread && tid.is_some() {
                // A handler would wait idle for a page a stream's read-ahead
                // is reading: it reads the stream's next window meanwhile.
                // (The simulation's second thread, which may not wait,
                // does the same.)
                match self.read_ahead_instead(c, page_addr, mm) {
                    Ok(g) => {
                        c = g;
                        continue;
                    }
                    Err(g) => c = g,
                }
            }
            if !wait_busy && matches!(plan, FaultPlan::Busy) {
                return Resolved::Busy;
            }
            if in_thread && matches!(plan, FaultPlan::Sigbus) {
                return Resolved::ProgramsSigbus;
            }
            match self.serve(c, &plan, page_addr, write, caller, mm, &mut retries) {
                Next::Again(g) => c = g,
                // (A fault reports its failures itself: `Failed` is a
                // populate's.)
                Next::Served | Next::Failed(_) => return Resolved::Served,
            }
        }
    }

    /// A handler's fault found the page at `page_addr` busy: if a stream's
    /// read-ahead is reading it, reads the stream's next window now
    /// (`Core::readahead_instead_of_wait`) and returns the core locked again
    /// for the fault to be planned anew; else gives `c` back untouched.
    fn read_ahead_instead<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        page_addr: usize,
        mm: &RwLockReadGuard<'_, ()>,
    ) -> Result<MutexGuard<'a, Core>, MutexGuard<'a, Core>> {
        let Some(p) = c.page_of(Addr(page_addr as u64)) else { return Err(c) };
        let Some((q, end)) = c.readahead_instead_of_wait(p) else { return Err(c) };
        // A window that would need reclaim first, or that a zap holds, is
        // left alone (neither plan claims anything: the fault waits as
        // before); any other plan is served (it may have claimed pages).
        match c.populate_step(q, end, false) {
            None | Some(FaultPlan::Reclaim { .. } | FaultPlan::Busy) => Err(c),
            Some(plan) => {
                match self.serve(c, &plan, self.addr(q), false, Caller::Populate, mm, &mut Retries::default()) {
                    Next::Again(g) => Ok(g),
                    Next::Served | Next::Failed(_) => Ok(lock(&self.core)),
                }
            }
        }
    }

    /// A fault of another program thread, for the simulation's preemption
    /// points: served now if nothing the preempted thread holds would block
    /// it (the core lock, the region lock held exclusively) and no page it
    /// needs is busy (the thread holding it cannot run meanwhile); else
    /// false, and the thread has not run yet.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn resolve_unblocked(&self, addr: usize, write: bool, wp: bool, tid: u32) -> bool {
        let Ok(c) = self.core.try_lock() else { return false };
        drop(c);
        let Some(mm) = self.mm().try_read() else { return false };
        let c = lock(&self.core);
        self.resolve_locked(&mm, c, addr, write, wp, Some(tid), false)
    }

    /// Waits until no page of `[addr, addr+len)` is being filled, and returns
    /// the core locked, so that introspection and advice see the fills other
    /// threads' faults have in flight as committed.
    pub fn settled_core(&self, addr: usize, len: usize) -> MutexGuard<'_, Core> {
        self.settled_core_all(addr, len, false)
    }

    /// `settled_core`; with `all`, waits for every busy page of the range
    /// (evictions too), for advice that must see every page where it rests.
    pub fn settled_core_all(&self, addr: usize, len: usize, all: bool) -> MutexGuard<'_, Core> {
        let mut c = lock(&self.core);
        let ps = self.page_size as u64;
        let pages = (len as u64).div_ceil(ps).min(c.config().reserve_pages);
        while c.any_filling(Addr(addr as u64), pages, all) {
            c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        c
    }

    /// Tops up the core's spare metadata buffers, allocated here with no
    /// lock held (see `Core::add_spares`), [`SPARE_LEAVES_BATCH`] leaves at
    /// a time: a fault that finds no spare leaf allocates one itself
    /// (zeroed: 8 KiB of fresh memory, two page faults), and
    /// a program that faults one page per leaf (a sparse touch, one page
    /// per 2 MiB) uses a leaf every few microseconds — the first leaves
    /// must reach the core before the whole top-up is made.
    pub(super) fn refill_spares(&self) {
        let (mut leaves, active, inactive) = lock(&self.core).spares_wanted();
        let mut chunks = (active, inactive);
        loop {
            let n = leaves.min(SPARE_LEAVES_BATCH);
            let spares = usermm_core::Spares::alloc((n, chunks.0, chunks.1));
            lock(&self.core).add_spares(spares);
            leaves -= n;
            chunks = (0, 0);
            if leaves == 0 {
                return;
            }
        }
    }
}
