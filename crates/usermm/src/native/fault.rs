//! The fault service: the handler threads' loop, `resolve` (one fault from plan
//! to wake-up), and the commit and wake-up of a fill.

use super::*;

/// A fault being resolved: where, how, and whose.
struct Fault {
    addr: usize,
    page_addr: usize,
    write: bool,
    /// The faulting thread (None: a read-in with no thread waiting).
    tid: Option<u32>,
}

/// What carrying out a plan left: the fault is served, or it plans again
/// (with the core lock held).
enum Next<'a> {
    Served,
    Again(MutexGuard<'a, Core>),
}

impl Inner {
    pub(super) fn handler_loop(&self) {
        let mut msgs = [UffdMsg::default(); 32];
        while !self.shutdown.load(Ordering::Relaxed) {
            match self.plat.wait_events(&self.wake_fd, 200) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => continue,
            }
            // Serve, then spin briefly for the next message: a program that
            // faults in a loop faults again a few microseconds after it is
            // woken, and catching that without a wake-up of this thread saves
            // most of a round trip. Only one handler spins at a time, never
            // for long, and it yields the CPU on every turn, so that a
            // runnable thread queued on its CPU (the program) runs first.
            let mut spin_until = 0;
            loop {
                let n = self.plat.read_events(&mut msgs).unwrap_or(0);
                if n > 0 {
                    for m in &msgs[..n] {
                        if m.event == UFFD_EVENT_PAGEFAULT {
                            self.resolve(m.address as usize, m.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0, Some(m.ptid));
                        }
                    }
                    // Become the spinner unless this thread already is or
                    // another one is.
                    if spin_until == 0
                        && self.spinning.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_err()
                    {
                        break;
                    }
                    spin_until = now_ns() + SPIN_NS;
                    continue;
                }
                if spin_until == 0 || now_ns() >= spin_until {
                    break;
                }
                std::thread::yield_now();
            }
            if spin_until != 0 {
                self.spinning.store(false, Ordering::Release);
            }
        }
    }

    /// Resolves a fault at `addr` (or a WILLNEED read-in when `tid` is None):
    /// plans under the core lock, and carries the plan out (one method per
    /// kind of plan below) until one serves the fault.
    pub fn resolve(&self, addr: usize, write: bool, tid: Option<u32>) {
        let f = Fault { addr, page_addr: addr & !(self.page_size - 1), write, tid };
        let mm = self.read_mm();
        let mut c = lock(&self.core);
        let mut reclaim_rounds = 0;
        let mut poison_failed = false;
        loop {
            let plan = c.fault(Addr(f.page_addr as u64), write);
            let next = match plan {
                FaultPlan::Wake => {
                    drop(c);
                    let _ = self.plat.wake(f.page_addr, self.page_size);
                    Next::Served
                }
                FaultPlan::Segv { gap } => self.serve_segv(c, gap, &f),
                FaultPlan::Busy => Next::Again(self.settled.wait(c).unwrap_or_else(|e| e.into_inner())),
                FaultPlan::Reclaim { want } => self.serve_reclaim(c, &mm, want, &mut reclaim_rounds, &f),
                FaultPlan::Refill { page } => {
                    self.refill(&mut c, &plan, page);
                    drop(c);
                    let _ = self.plat.wake(f.page_addr, self.page_size);
                    Next::Served
                }
                FaultPlan::Sigbus => self.serve_sigbus(c, &mut poison_failed, &f),
                FaultPlan::FileRead { run, file, file_page } => {
                    drop(c);
                    self.serve_file_read(&plan, run, file, file_page, &f)
                }
                FaultPlan::ZeroFill { run } if run.pages() <= SMALL_FILL_PAGES => {
                    self.serve_small_zero_fill(c, &plan, run, &f)
                }
                FaultPlan::ZeroFill { run } => {
                    drop(c);
                    // A large run is a fault-around window, which only
                    // unlocked regions get: its pieces wake their waiters
                    // as they go in (see zero_fill_pieces).
                    let n = if write { self.zero_fill_pieces(run) } else { self.zero_map(run) };
                    drop(self.commit_fill(&plan, n));
                    // Wake the rest only after the commit: the woken thread
                    // must see the page's final state, never a fill in
                    // flight.
                    self.wake_run(run, f.page_addr);
                    Next::Served
                }
                FaultPlan::SwapIn { run, .. } => {
                    drop(c);
                    self.serve_swap_in(&plan, run, &f)
                }
                FaultPlan::Reactivate { .. } => {
                    drop(c);
                    match self.reactivate_io(&plan) {
                        Some(n) => {
                            drop(self.commit_fill(&plan, n));
                            let _ = self.plat.wake(f.page_addr, self.page_size);
                            Next::Served
                        }
                        // The host purged the parked volatile page: plan
                        // again (a SIGBUS, as for any purged page).
                        None => Next::Again(lock(&self.core)),
                    }
                }
            };
            match next {
                Next::Served => return,
                Next::Again(g) => c = g,
            }
        }
    }

    /// A fault in a hole: the gap becomes `PROT_NONE` in the host and the
    /// thread retries into the kernel's SIGSEGV.
    fn serve_segv(&self, c: MutexGuard<'_, Core>, gap: PageRange, f: &Fault) -> Next<'_> {
        drop(c);
        let protected = self.plat.protect(self.addr(gap.start), gap.pages() as usize * self.page_size, PROT_NONE);
        if protected.is_err() {
            // The host refused (out of its map count): the signal itself,
            // or the thread would fault forever.
            if let Some(t) = f.tid {
                let _ = self.plat.sigsegv(t, f.addr);
            }
            return Next::Served;
        }
        let _ = self.plat.wake(f.page_addr, self.page_size);
        Next::Served
    }

    /// No free frame: direct reclaim, or, when reclaim is hopeless (or has
    /// made no progress for long), SIGBUS.
    fn serve_reclaim<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        mm: &RwLockReadGuard<'_, ()>,
        want: u64,
        rounds: &mut u32,
        f: &Fault,
    ) -> Next<'a> {
        if c.out_of_memory(*rounds) {
            // Everything resident is unevictable (or swap is full): the
            // kernel would OOM-kill; we raise SIGBUS. (Pages merely in
            // flight settle: only a much longer wait with no progress
            // counts then.) Decided on a plan made under this hold of the
            // core lock, and raised before it is let go: the page is
            // neither resident nor being filled, so the thread is still in
            // this fault (or will fault here again) and the signal cannot
            // reach it anywhere else.
            if let Some(t) = f.tid {
                c.fault_oom();
                let _ = self.plat.sigbus(t, f.addr);
            }
            return Next::Served;
        }
        let want = want.max(c.direct_reclaim_batch());
        drop(c);
        let freed = self.reclaim_locked(mm, want);
        let mut c = lock(&self.core);
        if freed == 0 && c.free_frames() == 0 {
            // Nothing freed this time, but other reclaim may be in flight
            // (the pages it holds are busy, so this plan could not take
            // them): wait for it to settle before trying again. Only no
            // progress for a while is out of memory.
            *rounds += 1;
            c = self.wait_settled(c);
        }
        Next::Again(c)
    }

    /// A page that must raise SIGBUS (purged, poisoned): a poison marker,
    /// so that the kernel raises it in the touching thread with the exact
    /// address (and for every later touch).
    fn serve_sigbus<'a>(&'a self, c: MutexGuard<'a, Core>, poison_failed: &mut bool, f: &Fault) -> Next<'a> {
        if *poison_failed {
            // Still to be raised, and no marker can be placed: the signal
            // itself, under the core lock (see `serve_reclaim`).
            if let Some(t) = f.tid {
                let _ = self.plat.sigbus(t, f.addr);
            }
            return Next::Served;
        }
        drop(c);
        // The marker also wakes the thread.
        if self.plat.poison(f.page_addr, self.page_size).is_ok() {
            return Next::Served;
        }
        // The page may have been filled meanwhile (the thread then went on,
        // and a signal now would reach it elsewhere): plan again.
        *poison_failed = true;
        Next::Again(lock(&self.core))
    }

    /// A file read into `run`; SIGBUS past the end of the file; the next
    /// window of a stream queued for the background thread.
    fn serve_file_read(&self, plan: &FaultPlan, run: PageRange, file: u32, file_page: u64, f: &Fault) -> Next<'_> {
        let (n, drop_due) = self.file_in(run, file, file_page, true).unwrap_or((0, None));
        let c = self.commit_fill(plan, n);
        // Read-ahead pipeline (the core decides): the next window read by
        // the background thread while the program consumes this one.
        let ahead = c.readahead_after_fault(run, n, file);
        if n == 0 {
            // Past the end of the file (or the read failed): SIGBUS, as
            // Linux raises for a mapping past EOF. Under the core lock,
            // before the wake: the thread is still in this fault.
            if let Some(t) = f.tid {
                let _ = self.plat.sigbus(t, f.addr);
            }
        }
        drop(c);
        // Wake only after the commit (the pages were copied in without
        // waking): the woken thread must see them committed (e.g. locked),
        // never a fill in flight.
        self.wake_run(run, f.page_addr);
        // Then what the woken thread need not wait for: the deferred
        // page-cache drop. (No POSIX_FADV_WILLNEED hint for the host's
        // read-ahead: the kernel's own read-ahead on our sequential 1 MiB
        // preads keeps ahead better; the hint blocks 0.23 ms a MiB in the
        // caller and halved the streaming scan's throughput.)
        if let Some(fl) = drop_due {
            let ps = self.page_size as u64;
            fl.drop_cache(file_page * ps, (n * ps) as usize);
        }
        if let Some(next) = ahead {
            lock(&self.willneed).push(self.addr(next));
            let _c = lock(&self.core);
            self.reclaim_wanted.notify_all();
        }
        Next::Served
    }

    /// A small zero fill: install, wake and commit under the core lock. The
    /// woken thread can observe nothing before the commit (every observer
    /// takes this lock), no zap can interleave, and its wake-up overlaps
    /// our commit instead of waiting for a separate wake ioctl. The install
    /// never waits on anything that needs this lock.
    fn serve_small_zero_fill(
        &self,
        mut c: MutexGuard<'_, Core>,
        plan: &FaultPlan,
        run: PageRange,
        f: &Fault,
    ) -> Next<'_> {
        let a = self.addr(run.start);
        let len = run.pages() as usize * self.page_size;
        let done = if f.write {
            self.plat.zero_fill_wake(a, len, true)
        } else {
            self.plat.zero_map_wake(a, len, true).or_else(|_| self.plat.zero_fill_wake(a, len, true))
        };
        let n = (done.unwrap_or(0) / self.page_size) as u64;
        c.fill_done(plan, n);
        self.after_fill(&mut c);
        drop(c);
        if n < run.pages() {
            let _ = self.plat.wake(f.page_addr, self.page_size);
        }
        Next::Served
    }

    /// A swap-in of `run`; a transient SIGBUS when the faulting page could
    /// not be read.
    fn serve_swap_in(&self, plan: &FaultPlan, run: PageRange, f: &Fault) -> Next<'_> {
        let n = self.fill_io(plan, f.write);
        let c = self.commit_fill(plan, n);
        let p = Addr(f.page_addr as u64);
        let faulted_in = n > 0 && (p.0 - self.addr(run.start) as u64) / (self.page_size as u64) < n;
        if !faulted_in {
            // Signal first, under the core lock: a thread woken before its
            // SIGBUS is queued would retry the fault instead, and the page
            // cannot be filled meanwhile.
            if let Some(t) = f.tid {
                #[cfg(feature = "test-hooks")]
                {
                    let stall = self.inject_signal_stall_ms.load(Ordering::Relaxed);
                    if stall > 0 {
                        std::thread::sleep(std::time::Duration::from_millis(stall.into()));
                    }
                }
                let _ = self.plat.sigbus(t, f.addr);
            }
        }
        drop(c);
        self.wake_run(run, f.page_addr);
        Next::Served
    }

    /// The I/O of a fill plan, with no lock held: returns how many pages of
    /// the plan (a prefix) were installed.
    pub(super) fn fill_io(&self, plan: &FaultPlan, write: bool) -> u64 {
        match *plan {
            FaultPlan::ZeroFill { run } if write => self.zero_fill(run),
            // A read maps the zero page (Linux does too).
            FaultPlan::ZeroFill { run } => self.zero_map(run),
            FaultPlan::FileRead { run, file, file_page } => {
                self.file_in(run, file, file_page, false).map_or(0, |(n, _)| n)
            }
            FaultPlan::SwapIn { run, slot } => self.swap_in(run, slot),
            // (Checked reactivations go through `reactivate_io`, which also
            // commits a loss.)
            FaultPlan::Reactivate { page, slot, how, checked: false } => u64::from(self.reactivate(page, slot, how)),
            _ => 0,
        }
    }

    /// A reactivation's I/O: `Some(pages installed)`, or `None` when a
    /// checked reactivation found that the host discarded the parked page
    /// (the loss is committed: the page is purged).
    pub(super) fn reactivate_io(&self, plan: &FaultPlan) -> Option<u64> {
        let FaultPlan::Reactivate { page, slot, checked, .. } = *plan else { return Some(0) };
        if !checked {
            return Some(self.fill_io(plan, false));
        }
        let dst = self.addr(page);
        let r = self.plat.slot_to_page_checked(slot, dst);
        match r {
            Ok(true) => Some(1),
            Ok(false) => {
                let mut c = lock(&self.core);
                c.reactivate_lost(plan);
                self.settled.notify_all();
                None
            }
            _ => Some(0),
        }
    }

    /// Commits a fill and tells the threads waiting on the core; returns the
    /// core, still locked.
    pub(super) fn commit_fill(&self, plan: &FaultPlan, installed: u64) -> MutexGuard<'_, Core> {
        let mut c = lock(&self.core);
        c.fill_done(plan, installed);
        self.after_fill(&mut c);
        c
    }

    /// Wakes the threads waiting on `run` (and on `fault_addr`'s page,
    /// which a failed fill did not cover).
    pub(super) fn wake_run(&self, run: PageRange, fault_addr: usize) {
        let a = self.addr(run.start);
        let l = run.pages() as usize * self.page_size;
        let _ = self.plat.wake(a, l);
        if fault_addr < a || fault_addr >= a + l {
            let _ = self.plat.wake(fault_addr, self.page_size);
        }
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

    /// Carries out a `Refill` plan under the core lock: a lazily freed page
    /// the host dropped reads zeros (or, if the fault raced with nothing
    /// gone, the copy finds the page there and installs nothing).
    pub(super) fn refill(&self, c: &mut MutexGuard<'_, Core>, plan: &FaultPlan, page: PageIdx) {
        let a = self.addr(page);
        let n = self.plat.zero_fill_wake(a, self.page_size, true).unwrap_or(0);
        c.fill_done(plan, u64::from(n == self.page_size));
        self.after_fill(c);
    }

    pub(super) fn after_fill(&self, c: &mut MutexGuard<'_, Core>) {
        self.fills.fetch_add(1, Ordering::Relaxed);
        self.settled.notify_all();
        if c.free_frames() < self.low_watermark || c.spares_low() {
            self.reclaim_wanted.notify_one();
        }
    }

    /// Tops up the core's spare metadata buffers, allocated here with no
    /// lock held (see `Core::add_spares`).
    pub(super) fn refill_spares(&self) {
        let wanted = lock(&self.core).spares_wanted();
        let spares = usermm_core::Spares::alloc(wanted);
        lock(&self.core).add_spares(spares);
    }
}
