//! The one plan dispatcher: `serve` carries out a `FaultPlan` for a fault
//! (a program thread's, or a read-in with nobody waiting) or a populate
//! step, one helper a plan; how pages go in and who wakes the thread is in
//! `install.rs`, the commit after the I/O in `commit.rs`.
//!
//! Every caller meets a plan the same way; the caller decides only how a
//! `Failure` is reported: a fault with a signal (or by letting the thread
//! retry), a populate with the errno the core names
//! (`Failure::populate_errno`).

use super::*;
use usermm_core::Failure;

/// Who a plan is served for.
#[derive(Clone, Copy)]
pub(super) enum Caller {
    /// A fault at `addr` by thread `tid` (None: a read-in — `MADV_WILLNEED`,
    /// a lock's reactivation — with no thread waiting).
    /// `in_thread`: resolved by the faulting thread itself, in its SIGBUS
    /// handler (nothing runs meanwhile, no thread waits to be woken).
    Fault { addr: usize, tid: Option<u32>, in_thread: bool },
    /// A populate step (`MADV_POPULATE_*`, `umm_populate`, a lock's
    /// population, a read-ahead window).
    Populate,
}

/// Whether a fill of `run` may take frames from the pool: its region is
/// plainly read-write and unlocked, as `UFFDIO_MOVE` wants of both sides
/// (the pool is such a mapping).
pub(super) fn pool_fits(c: &Core, run: PageRange) -> bool {
    c.region_at(run.start).is_some_and(|r| r.prot() == PROT_READ | PROT_WRITE && r.lock() == LockMode::None)
}

impl Caller {
    /// Whether a program thread waits in the kernel for this plan (a fault
    /// served by a handler thread).
    pub(super) fn waits(&self) -> bool {
        matches!(self, Caller::Fault { tid: Some(_), .. })
    }

    /// Whether the faulting thread resolves this fault itself.
    pub(super) fn in_thread(&self) -> bool {
        matches!(self, Caller::Fault { in_thread: true, .. })
    }
}

/// What serving a plan left.
pub(super) enum Next<'a> {
    /// The page is served (or the failure reported to the faulting thread).
    Served,
    /// Plan again, with the core lock held.
    Again(MutexGuard<'a, Core>),
    /// A populate ends with this errno.
    Failed(Errno),
}

/// What one fault or populate step carries from plan to plan.
#[derive(Default)]
pub(super) struct Retries {
    /// Reclaim rounds that freed nothing (`Core::out_of_memory`).
    reclaim_rounds: u32,
    /// A poison marker could not be placed: raise SIGBUS directly.
    poison_failed: bool,
    /// When the first reclaim for this fault or step began (ns; 0: none
    /// yet).
    since_ns: u64,
}

impl Retries {
    /// When the first reclaim for this fault or step began.
    pub(super) fn since_ns(&self) -> u64 {
        self.since_ns
    }
}

impl Inner {
    /// Carries out `plan`, made under `c` for the page at `page_addr`
    /// (`write`: a write access) on behalf of `caller`, with the region lock
    /// `mm` held shared: the dispatcher, one arm a plan.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        page_addr: usize,
        write: bool,
        caller: Caller,
        mm: &RwLockReadGuard<'_, ()>,
        st: &mut Retries,
    ) -> Next<'a> {
        // The pool's frames count in the budget: never more of them than the
        // free frames this plan leaves (it may just have charged some).
        if self.settings.frame_pool() {
            self.plat.upkeep(Upkeep::PoolTrim { max: c.free_frames() });
        }
        match *plan {
            FaultPlan::Wake => self.serve_wake(c, page_addr),
            FaultPlan::Segv { gap } => self.serve_segv(c, gap, page_addr, caller),
            FaultPlan::Busy => Next::Again(self.settled.wait(c).unwrap_or_else(|e| e.into_inner())),
            FaultPlan::Reclaim { want } => self.serve_reclaim(c, mm, want, caller, st),
            FaultPlan::Refill { page } => self.serve_refill(c, plan, page, page_addr),
            FaultPlan::Sigbus => self.serve_sigbus(c, page_addr, caller, st),
            FaultPlan::ZeroFill { run } => self.serve_zero_fill(c, plan, run, page_addr, write, caller),
            FaultPlan::FileRead { run, file, file_page } => {
                self.serve_file_read(c, plan, run, file, file_page, page_addr, caller)
            }
            FaultPlan::SwapIn { run, slot, keep } => {
                let next = self.serve_swap_in(c, plan, run, slot, keep, page_addr, caller);
                // (Not in the faulting thread: it would wait for the batch.)
                if matches!(next, Next::Served) && caller.waits() && !caller.in_thread() {
                    self.swap_ahead(run);
                }
                next
            }
            FaultPlan::Unprotect { .. } => self.serve_unprotect(c, plan, page_addr),
            FaultPlan::Reactivate { page, .. } => self.serve_reactivate(c, plan, page, page_addr, caller),
        }
    }

    /// Nothing to do but wake the thread (the page is there).
    fn serve_wake<'a>(&'a self, c: MutexGuard<'a, Core>, page_addr: usize) -> Next<'a> {
        drop(c);
        let _ = self.plat.range(Range::Wake, page_addr, self.page_size);
        Next::Served
    }

    /// A parked page mapped back at `page`.
    fn serve_reactivate<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        page: PageIdx,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        if matches!(*plan, FaultPlan::Reactivate { checked: false, .. }) {
            return self.serve_small_reactivate(c, plan, page, page_addr, caller);
        }
        drop(c);
        match self.reactivate_io(plan) {
            Some(n) => self.finish_fill(plan, PageRange::new(page.0, page.0 + 1), n, page_addr, caller, None),
            // The host purged the parked volatile page: plan again (a
            // SIGBUS, as for any purged page).
            None => Next::Again(lock(&self.core)),
        }
    }

    /// A parked page (an unchecked reactivation) mapped back as a small
    /// swap-in goes in: under the core lock `c`, with the commit under it,
    /// the faulting thread's CPU kept awake meanwhile and its wake-up
    /// handed to the wake-ahead thread there (`hand_off_wake`). Woken from
    /// this handler's CPU, the thread waited 12-13 µs more to run again
    /// (`perf sched timehist`: the interrupt to the other vCPU): a
    /// parked-page fault's median 33 µs, 21 µs handed off.
    fn serve_small_reactivate<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        page: PageIdx,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        let _awake = self.service.wake_ahead().guard_brief(caller.waits() && !caller.in_thread());
        let delegate = self.delegates_wake(caller);
        let a = self.addr(page);
        // (Unchecked: always `Some`, the pages installed.)
        let bytes = self.reactivate_io(plan).unwrap_or(0) as usize * self.page_size;
        let handed = if bytes > 0 && delegate {
            self.hand_off_wake(a, bytes)
        } else {
            if bytes > 0 {
                let _ = self.plat.range(Range::Wake, a, bytes);
            }
            None
        };
        let r = self.commit_small(c, plan, PageRange::new(page.0, page.0 + 1), bytes, page_addr, caller);
        self.settle_wake(handed, a, bytes);
        r
    }

    /// A page held resident that the host dropped: filled again with zeros.
    fn serve_refill<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        page: PageIdx,
        page_addr: usize,
    ) -> Next<'a> {
        self.refill(&mut c, plan, page);
        drop(c);
        let _ = self.plat.range(Range::Wake, page_addr, self.page_size);
        Next::Served
    }

    /// A zero fill: a small run under the core lock with its commit, a
    /// fault-around window in pieces that wake their waiters as they go in.
    fn serve_zero_fill<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        page_addr: usize,
        write: bool,
        caller: Caller,
    ) -> Next<'a> {
        let pooled = write && self.settings.frame_pool() && pool_fits(&c, run);
        if run.pages() <= SMALL_FILL_PAGES {
            return self.serve_small_zero_fill(c, plan, run, page_addr, write, pooled, caller);
        }
        drop(c);
        // A large run is a fault-around window, which only unlocked
        // regions get: its pieces wake their waiters as they go in
        // (see zero_fill_pieces).
        let n = if write { self.zero_fill_pieces(run, pooled) } else { self.zero_map(run) };
        self.finish_fill(plan, run, n, page_addr, caller, None)
    }

    /// A file read: a window of the page cache mapped where that is how the
    /// region's pages are kept, else a copy (a small one installed head
    /// first; a large one, then the deferred drop of the host's copy).
    #[allow(clippy::too_many_arguments)]
    fn serve_file_read<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        file: u32,
        file_page: u64,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        let small = run.pages() <= SMALL_FILL_PAGES;
        // (An in-thread fault wants the wake-ahead thread only to take half
        // of a small install: see `may_split`.)
        let waits = caller.waits()
            && (!caller.in_thread() || small && self.splittable(&c, run, run.pages() as usize * self.page_size));
        let window = self.file_window(&c, run);
        drop(c);
        let _awake = self.service.wake_ahead().guard(waits);
        if let Some(locked) = window {
            if let Some(next) = self.serve_file_map(plan, run, file, file_page, page_addr, caller, locked) {
                return next;
            }
        }
        if small {
            return self.serve_small_file_read(plan, run, file, file_page, page_addr, caller);
        }
        let (n, drop_due) = self.file_in(run, file, file_page, true).unwrap_or((0, None));
        let r = self.finish_fill(plan, run, n, page_addr, caller, Some(file));
        // Then what the woken thread need not wait for: the deferred
        // page-cache drop. (No POSIX_FADV_WILLNEED hint for the host's
        // read-ahead: the kernel's own read-ahead on our sequential 1 MiB
        // preads keeps ahead better; the hint blocks 0.23 ms a MiB in the
        // caller and halved the streaming scan's throughput.)
        if let Some(fl) = drop_due {
            let ps = self.page_size as u64;
            fl.drop_cache(file_page * ps, (n * ps) as usize);
        }
        r
    }

    /// A swap-in: a small run read outside the core lock and installed
    /// with its commit under it, a larger (read-around) run read and
    /// installed at once.
    #[allow(clippy::too_many_arguments)]
    fn serve_swap_in<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        slot: u32,
        keep: bool,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        if run.pages() > SMALL_FILL_PAGES {
            drop(c);
            // (No wake-ahead for a read-around run: see below.)
            let n = self.swap_in(run, slot, keep);
            return self.finish_fill(plan, run, n, page_addr, caller, None);
        }
        let pooled = !keep && self.settings.frame_pool() && pool_fits(&c, run);
        drop(c);
        // (Not while the read polls for its reply: see
        // `serve_small_swap_in`. Nor for a read-around run: its read takes
        // longer than the spin pays for, and the spinner then holds the CPU
        // the reclaimer's writes want: CPython's and SQLite's streams under
        // usermm run took 10-15% longer with it.)
        let polls = self.plat.caps().swap_read_polls;
        let single = run.pages() == 1;
        let _awake = self.service.wake_ahead().guard(caller.waits() && !caller.in_thread() && !polls && single);
        self.serve_small_swap_in(plan, run, slot, keep, pooled, page_addr, caller)
    }

    /// The first write to a page swapped in write-protected: its swap copy
    /// is dropped (the core did) and the page unprotected.
    fn serve_unprotect<'a>(&'a self, c: MutexGuard<'a, Core>, plan: &FaultPlan, page_addr: usize) -> Next<'a> {
        drop(c);
        // (An error leaves the page protected: the writer faults again and
        // is served again.)
        let _ = self.plat.range(Range::Unprotect, page_addr, self.page_size);
        // (Not `commit_fill`: nothing was installed, so neither the host's
        // LRU drain count nor reclaim has news.)
        lock(&self.core).fill_done(plan, 1);
        self.settled.notify_all();
        Next::Served
    }

    /// A fault in a hole: the gap becomes `PROT_NONE` in the host and the
    /// thread retries into the kernel's SIGSEGV. (A populate fails.)
    fn serve_segv<'a>(&'a self, c: MutexGuard<'a, Core>, gap: PageRange, page_addr: usize, caller: Caller) -> Next<'a> {
        let Caller::Fault { addr, tid, .. } = caller else { return Next::Failed(Failure::Gone.populate_errno()) };
        drop(c);
        let protected =
            self.plat.range(Range::Protect(PROT_NONE), self.addr(gap.start), gap.pages() as usize * self.page_size);
        if protected.is_err() {
            // The host refused (out of its map count): the signal itself,
            // or the thread would fault forever.
            if let Some(t) = tid {
                if !super::fault::defer_signal(super::fault::SIGSEGV, 0) && self.signal_sent(t, super::fault::SIGSEGV) {
                    let _ = self.plat.thread(Thread::Signal { tid: t, sig: Signal::Segv, addr });
                }
            }
            return Next::Served;
        }
        let _ = self.plat.range(Range::Wake, page_addr, self.page_size);
        Next::Served
    }

    /// No free frame: direct reclaim, or, when the core says the caller is
    /// out of memory, `Failure::OutOfMemory`.
    fn serve_reclaim<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        mm: &RwLockReadGuard<'_, ()>,
        want: u64,
        caller: Caller,
        st: &mut Retries,
    ) -> Next<'a> {
        if st.since_ns == 0 {
            st.since_ns = now_ns();
        }
        self.store_retry_due(&mut c);
        if c.out_of_memory(st.reclaim_rounds) {
            if let Some(d) = self.store_retry_wait(&c, st) {
                // Only the store's back-off stands in the way, and it is
                // tried again soon: wait for that (see `native/reclaim.rs`,
                // "A store that refuses writes").
                let c = self.settled.wait_timeout(c, d).unwrap_or_else(|e| e.into_inner()).0;
                // The rounds the pause left empty do not count against the
                // store's next try (else a fault that waited for it gives up
                // right after, untried: the in-thread stress test's SIGBUS
                // while a cluster failed over). The wait stays bounded by
                // the fault's start (`store_retry_wait`).
                st.reclaim_rounds = 0;
                return Next::Again(c);
            }
            // Decided on a plan made under this hold of the core lock, and
            // reported before it is let go: the page is neither resident nor
            // being filled, so a faulting thread is still in this fault (or
            // will fault here again) and the signal cannot reach it anywhere
            // else.
            return self.report(&mut c, caller, Failure::OutOfMemory);
        }
        drop(c);
        let freed = self.reclaim_locked(mm, want);
        let mut c = lock(&self.core);
        if freed == 0 && c.free_frames() == 0 {
            // Nothing freed this time. Work in flight elsewhere (pages
            // other reclaim holds busy, which this plan could not take, or
            // fills and zaps that may give frames back) is waited for, a
            // settle at a time; with none, the core decides at once on the
            // next plan (`Core::out_of_memory`).
            st.reclaim_rounds += 1;
            if c.reclaim_in_flight() {
                c = self.wait_settled(c);
            }
        }
        Next::Again(c)
    }

    /// A page that must raise SIGBUS (purged, poisoned): a poison marker,
    /// so that the kernel raises it in the touching thread with the exact
    /// address (and for every later touch). (A populate fails.)
    fn serve_sigbus<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        page_addr: usize,
        caller: Caller,
        st: &mut Retries,
    ) -> Next<'a> {
        let Caller::Fault { addr, tid, .. } = caller else { return Next::Failed(Failure::Poisoned.populate_errno()) };
        if st.poison_failed {
            // Still to be raised, and no marker can be placed: the signal
            // itself, under the core lock (see `serve_reclaim`).
            return self.report(&mut c, Caller::Fault { addr, tid, in_thread: false }, Failure::Poisoned);
        }
        drop(c);
        // The marker also wakes the thread.
        if self.plat.range(Range::Poison, page_addr, self.page_size).is_ok() {
            return Next::Served;
        }
        // The page may have been filled meanwhile (the thread then went on,
        // and a signal now would reach it elsewhere): plan again.
        st.poison_failed = true;
        Next::Again(lock(&self.core))
    }

    /// A small zero fill: install, wake and commit under the core lock. The
    /// woken thread can observe nothing before the commit (every observer
    /// takes this lock), no zap can interleave, and its wake-up overlaps
    /// our commit instead of waiting for a separate wake ioctl. The install
    /// never waits on anything that needs this lock.
    #[allow(clippy::too_many_arguments)]
    fn serve_small_zero_fill<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        page_addr: usize,
        write: bool,
        pooled: bool,
        caller: Caller,
    ) -> Next<'a> {
        let a = self.addr(run.start);
        let len = run.pages() as usize * self.page_size;
        // The faulting thread's CPU kept awake while the page goes in, and
        // the wake-up done there when the thread waits on another CPU than
        // this handler's (docs/design.md, "Wake-ahead"): `usermm bench
        // fault`, three interleaved pairs, sparse read p50 17.9-19.3 µs
        // without, 4.9-7.4 µs with (write 18.5-19.6 against 6.2-6.6).
        let _awake = self.service.wake_ahead().guard_brief(caller.waits() && !caller.in_thread());
        let delegate = self.delegates_wake(caller);
        let done = if pooled {
            self.plat.fill(Fill::Zero { how: Zero::Pooled, wake: !delegate }, a, len)
        } else if write {
            self.plat.fill(Fill::Zero { how: Zero::Fill, wake: !delegate }, a, len)
        } else {
            self.plat
                .fill(Fill::Zero { how: Zero::Map, wake: !delegate }, a, len)
                .or_else(|_| self.plat.fill(Fill::Zero { how: Zero::Fill, wake: !delegate }, a, len))
        };
        let done = done.unwrap_or(0);
        let handed = if delegate && done > 0 { self.hand_off_wake(a, done) } else { None };
        let r = self.commit_small(c, plan, run, done, page_addr, caller);
        self.settle_wake(handed, a, done);
        r
    }

    /// The end of a small fill, its install done under the core lock `c`
    /// with the wake-up (`bytes` installed, a prefix of `run`): the commit,
    /// a failure reported while the lock is held, and, for what was not
    /// installed (so not woken), the wake-up of every waiter on the run,
    /// which then plans again, as after `finish_fill`.
    pub(super) fn commit_small<'a>(
        &'a self,
        c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        bytes: usize,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        self.commit_small_or(c, plan, run, bytes, page_addr, caller, plan.unfilled())
    }

    /// `commit_small`, with `unfilled` the failure when nothing went in.
    #[allow(clippy::too_many_arguments)]
    fn commit_small_or<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        bytes: usize,
        page_addr: usize,
        caller: Caller,
        unfilled: Failure,
    ) -> Next<'a> {
        let n = (bytes / self.page_size) as u64;
        c.fill_done(plan, n);
        self.after_fill(&mut c);
        let r = self.outcome_or(&mut c, run, n, page_addr, caller, unfilled);
        drop(c);
        if n < run.pages() {
            self.wake_run(run, page_addr);
        }
        r
    }

    /// A small swap-in: the read outside the core lock, then, as a small
    /// zero fill does, the install with its wake-up and the commit under
    /// it (see `serve_small_zero_fill`): the woken thread's wake-up overlaps
    /// the commit instead of waiting for a separate wake ioctl after it.
    /// When the wake-ahead thread spins, the wake-up is handed to it
    /// (`hand_off_wake`) and done on the faulting thread's CPU while the
    /// handler commits: the swap file's round trip (`farmem`, two
    /// interleaved pairs) 49.3/44.4 → 39.2/39.2 µs. The wake-ahead thread is
    /// not started for a read that polls for its reply (a Redis server over
    /// TCP): the faulting thread, the handler and the server then share one
    /// CPU, and the spinner on the other made the round trip 15.9–16.4 µs
    /// instead of 14.3–15.3 (docs/design.md, "Wake-ahead").
    #[allow(clippy::too_many_arguments)]
    fn serve_small_swap_in(
        &self,
        plan: &FaultPlan,
        run: PageRange,
        slot: u32,
        keep: bool,
        pooled: bool,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'_> {
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        let read = self.plat.caps().has_swap && self.plat.swap_read(self.swap_off(slot), len, pooled).is_ok();
        let c = lock(&self.core);
        let a = self.addr(run.start);
        // (In-thread faults: no thread waits, nothing to hand off.)
        let delegate = self.delegates_wake(caller);
        let bytes =
            if read { self.plat.fill(Fill::SwapRead { wp: keep, wake: !delegate }, a, len).unwrap_or(0) } else { 0 };
        // (The commit below wakes what was not installed.)
        let handed = if delegate && bytes > 0 { self.hand_off_wake(a, bytes) } else { None };
        // A read that went through but whose install the host refused (a
        // bounded `EAGAIN`, no frame in the host) is not a read error: the
        // page is still in swap, and the thread faults again.
        let unfilled = if read { Failure::NotFilled } else { plan.unfilled() };
        let r = self.commit_small_or(c, plan, run, bytes, page_addr, caller, unfilled);
        self.settle_wake(handed, a, bytes);
        r
    }

    /// A small file read (a single page, a lock-on-fault window): the read
    /// outside the core lock, the install with its wake-up and the commit
    /// under it, as `serve_small_swap_in`; then the deferred drop of the
    /// host's page-cache copy. (Read-ahead never follows a run this small:
    /// `Core::readahead_after_fault` wants a whole block.)
    fn serve_small_file_read(
        &self,
        plan: &FaultPlan,
        run: PageRange,
        file: u32,
        file_page: u64,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'_> {
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        let off = file_page * ps as u64;
        let f = self.files.get(file);
        let read = match &f {
            Some(f) => self.plat.file_read(f, off, len).ok(),
            None => None,
        };
        let c = lock(&self.core);
        let bytes = match read {
            Some((b, _)) if b > 0 && caller.in_thread() && self.may_split(&c, run, b.min(len)) => {
                self.install_split(&c, run, b.min(len))
            }
            Some((b, _)) if b > 0 => self.install_head_first(run, b.min(len), page_addr, caller),
            _ => 0,
        };
        let r = self.commit_small(c, plan, run, bytes, page_addr, caller);
        if let (Some(f), Some((_, true))) = (&f, read) {
            if bytes > 0 {
                f.drop_cache(off, bytes);
            }
        }
        r
    }
}
