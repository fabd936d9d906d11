//! The one plan dispatcher: `serve` carries out a `FaultPlan` for a fault
//! (a program thread's, or a read-in with nobody waiting) or a populate
//! step, and the fill mechanics' commit and wake-up around it.
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
fn pool_fits(c: &Core, run: PageRange) -> bool {
    c.region_at(run.start).is_some_and(|r| r.prot == PROT_READ | PROT_WRITE && r.lock == LockMode::None)
}

/// Whether no thread can write to `run`'s region (see `Inner::may_split`).
fn read_only(c: &Core, run: PageRange) -> bool {
    c.region_at(run.start).is_some_and(|r| r.prot & PROT_WRITE == 0)
}

impl Caller {
    /// Whether a program thread waits in the kernel for this plan (a fault
    /// served by a handler thread).
    pub(super) fn waits(&self) -> bool {
        matches!(self, Caller::Fault { tid: Some(_), .. })
    }

    /// Whether the faulting thread resolves this fault itself.
    fn in_thread(&self) -> bool {
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

/// How old an answer of where a faulting thread runs may be
/// (`Inner::delegates_wake`): a thread moves between CPUs far less often
/// than it faults, and a read of it costs about 1 µs.
const THREAD_CPU_AGE_NS: u64 = 100_000;

thread_local! {
    /// A handler thread's reader of where faulting threads run
    /// (`Inner::delegates_wake`).
    static THREAD_CPU: std::cell::RefCell<usermm_sys::thread::ThreadCpu> = std::cell::RefCell::default();
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
        if self.frame_pool {
            self.plat.pool_trim(c.free_frames());
        }
        match *plan {
            FaultPlan::Wake => {
                drop(c);
                let _ = self.plat.wake(page_addr, self.page_size);
                Next::Served
            }
            FaultPlan::Segv { gap } => match caller {
                Caller::Fault { addr, tid, .. } => self.serve_segv(c, gap, page_addr, addr, tid),
                Caller::Populate => Next::Failed(Failure::Gone.populate_errno()),
            },
            FaultPlan::Busy => Next::Again(self.settled.wait(c).unwrap_or_else(|e| e.into_inner())),
            FaultPlan::Reclaim { want } => self.serve_reclaim(c, mm, want, caller, st),
            FaultPlan::Refill { page } => self.serve_refill(c, plan, page, page_addr),
            FaultPlan::Sigbus => match caller {
                Caller::Fault { addr, tid, .. } => self.serve_sigbus(c, page_addr, addr, tid, st),
                Caller::Populate => Next::Failed(Failure::Poisoned.populate_errno()),
            },
            FaultPlan::ZeroFill { run } => self.serve_zero_fill(c, plan, run, page_addr, write, caller),
            FaultPlan::FileRead { run, file, file_page } => {
                self.serve_file_read(c, plan, run, file, file_page, page_addr, caller)
            }
            FaultPlan::SwapIn { run, slot, keep } => self.serve_swap_in(c, plan, run, slot, keep, page_addr, caller),
            FaultPlan::Unprotect { .. } => self.serve_unprotect(c, plan, page_addr),
            FaultPlan::Reactivate { page, .. } => {
                drop(c);
                match self.reactivate_io(plan) {
                    Some(n) => self.finish_fill(plan, PageRange::new(page.0, page.0 + 1), n, page_addr, caller, None),
                    // The host purged the parked volatile page: plan again
                    // (a SIGBUS, as for any purged page).
                    None => Next::Again(lock(&self.core)),
                }
            }
        }
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
        let _ = self.plat.wake(page_addr, self.page_size);
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
        let pooled = write && self.frame_pool && pool_fits(&c, run);
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
        let map = self.maps_file_window(&c, run);
        drop(c);
        let _awake = self.wake_ahead.guard(waits);
        if map {
            if let Some(next) = self.serve_file_map(plan, run, file, file_page, page_addr, caller) {
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
        let pooled = !keep && self.frame_pool && pool_fits(&c, run);
        drop(c);
        // (Not while the read polls for its reply: see
        // `serve_small_swap_in`. Nor for a read-around run: its read takes
        // longer than the spin pays for, and the spinner then holds the CPU
        // the reclaimer's writes want: CPython's and SQLite's streams under
        // usermm run took 10-15% longer with it.)
        let polls = self.plat.swap_read_polls();
        let single = run.pages() == 1;
        let _awake = self.wake_ahead.guard(caller.waits() && !caller.in_thread() && !polls && single);
        self.serve_small_swap_in(plan, run, slot, keep, pooled, page_addr, caller)
    }

    /// The first write to a page swapped in write-protected: its swap copy
    /// is dropped (the core did) and the page unprotected.
    fn serve_unprotect<'a>(&'a self, c: MutexGuard<'a, Core>, plan: &FaultPlan, page_addr: usize) -> Next<'a> {
        drop(c);
        // (An error leaves the page protected: the writer faults again and
        // is served again.)
        let _ = self.plat.unprotect(page_addr, self.page_size);
        // (Not `commit_fill`: nothing was installed, so neither the host's
        // LRU drain count nor reclaim has news.)
        lock(&self.core).fill_done(plan, 1);
        self.settled.notify_all();
        Next::Served
    }

    /// A fault in a hole: the gap becomes `PROT_NONE` in the host and the
    /// thread retries into the kernel's SIGSEGV.
    fn serve_segv(
        &self,
        c: MutexGuard<'_, Core>,
        gap: PageRange,
        page_addr: usize,
        addr: usize,
        tid: Option<u32>,
    ) -> Next<'_> {
        drop(c);
        let protected = self.plat.protect(self.addr(gap.start), gap.pages() as usize * self.page_size, PROT_NONE);
        if protected.is_err() {
            // The host refused (out of its map count): the signal itself,
            // or the thread would fault forever.
            if let Some(t) = tid {
                if !super::fault::defer_signal(super::fault::SIGSEGV) && self.signal_sent(t, super::fault::SIGSEGV) {
                    let _ = self.plat.sigsegv(t, addr);
                }
            }
            return Next::Served;
        }
        let _ = self.plat.wake(page_addr, self.page_size);
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
    /// address (and for every later touch).
    fn serve_sigbus<'a>(
        &'a self,
        mut c: MutexGuard<'a, Core>,
        page_addr: usize,
        addr: usize,
        tid: Option<u32>,
        st: &mut Retries,
    ) -> Next<'a> {
        if st.poison_failed {
            // Still to be raised, and no marker can be placed: the signal
            // itself, under the core lock (see `serve_reclaim`).
            return self.report(&mut c, Caller::Fault { addr, tid, in_thread: false }, Failure::Poisoned);
        }
        drop(c);
        // The marker also wakes the thread.
        if self.plat.poison(page_addr, self.page_size).is_ok() {
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
        let _awake = self.wake_ahead.guard_brief(caller.waits() && !caller.in_thread());
        let delegate = self.delegates_wake(caller);
        let done = if pooled {
            self.plat.zero_fill_pooled(a, len, !delegate)
        } else if write {
            self.plat.zero_fill_wake(a, len, !delegate)
        } else {
            self.plat.zero_map_wake(a, len, !delegate).or_else(|_| self.plat.zero_fill_wake(a, len, !delegate))
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
        let read = self.plat.has_swap()
            && !take_one(&self.inject_read_errors)
            && self.plat.swap_read(self.swap_off(slot), len, pooled).is_ok();
        let c = lock(&self.core);
        let a = self.addr(run.start);
        // (In-thread faults: no thread waits, nothing to hand off.)
        let delegate = self.delegates_wake(caller);
        let bytes = if read { self.plat.swap_install(a, len, keep, !delegate).unwrap_or(0) } else { 0 };
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
        let f = lock(&self.files).get(&file).cloned();
        let read = match &f {
            Some(f) if !take_one(&self.inject_read_errors) => self.plat.file_read(f, off, len).ok(),
            _ => None,
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

    /// Installs the first `len` bytes of a small file read for `run` (the
    /// core lock held), waking the waiters: the part through the faulting
    /// page first, then the rest. The faulting thread runs again while the
    /// rest is copied, on another CPU (what it waits for is the head's
    /// copy, not the run's). The head's wake-up is handed to the
    /// wake-ahead thread when it spins (`hand_off_wake`): it runs on the
    /// faulting thread's CPU, where the wake-up needs no inter-processor
    /// interrupt, while the handler copies the rest. `lockonfault`'s
    /// usermm row, two interleaved triples: 1.26/1.40 s as one copy,
    /// 1.21/1.27 s head first, 1.06/1.11 s head first with the wake-up
    /// handed off (the kernel's MLOCK_ONFAULT: 0.28–0.31 s). Returns the
    /// bytes installed (a prefix). (At once when no thread waits: a
    /// populate, an in-thread fault.)
    fn install_head_first(&self, run: PageRange, len: usize, page_addr: usize, caller: Caller) -> usize {
        let (a, ps) = (self.addr(run.start), self.page_size);
        let waits = caller.waits() && !caller.in_thread() && page_addr >= a && page_addr < a + len;
        let head = if waits { page_addr - a + ps } else { len };
        if head == len {
            return self.plat.file_install(a, 0, len, true).unwrap_or(0);
        }
        let delegate = self.delegates_wake(caller);
        let n = self.plat.file_install(a, 0, head, !delegate).unwrap_or(0);
        if n < head {
            // (The commit wakes the whole run.)
            return n;
        }
        let handed = if delegate { self.hand_off_wake(a, head) } else { None };
        let m = self.plat.file_install(a, head, len - head, true).unwrap_or(0);
        self.settle_wake(handed, a, head);
        head + m
    }

    /// Whether a small file read's `len` bytes for `run` are installed in
    /// two halves at once (`install_split`): an in-thread fault (the
    /// faulting thread copies; no handler does), of at least
    /// `SPLIT_MIN_PAGES`, while the wake-ahead thread spins to take the
    /// other half, in a region no thread can write (the undo of a half
    /// installed beside a failed one drops it: a write there would be lost).
    fn may_split(&self, c: &Core, run: PageRange, len: usize) -> bool {
        self.splittable(c, run, len) && self.wake_ahead.spinning()
    }

    /// `may_split` but for the spinning helper: also what decides whether
    /// an in-thread file read starts the wake-ahead thread at all.
    fn splittable(&self, c: &Core, run: PageRange, len: usize) -> bool {
        len >= SPLIT_MIN_PAGES * self.page_size && read_only(c, run)
    }

    /// Installs the first `len` bytes of a small file read for `run` (the
    /// core lock `c` held) in two halves at once: the second by the
    /// wake-ahead thread, spinning on the other CPU, while the faulting
    /// thread copies the first (`Platform::file_install_split`). An
    /// in-thread fault copies its whole window itself, and a window's 16
    /// fresh frames are most of its cost. `lockonfault`'s in-thread row,
    /// two interleaved pairs: 1.10/1.08 s in one copy, 0.96/0.89 s in two
    /// halves (the SIGSEGV batch-16 handler: 1.47/1.29 s). Returns the
    /// bytes installed (a prefix): a second half in beside a short first
    /// one is dropped again.
    fn install_split(&self, c: &Core, run: PageRange, len: usize) -> usize {
        let (a, ps) = (self.addr(run.start), self.page_size);
        let mid = (len / 2) & !(ps - 1);
        #[cfg(feature = "test-hooks")]
        self.split_installs.fetch_add(1, Ordering::SeqCst);
        let (head, tail) = if self.split_fails() {
            (0, self.plat.file_install(a, mid, len - mid, false).unwrap_or(0))
        } else {
            self.plat.file_install_split(a, mid, len)
        };
        if head == mid {
            return mid + tail;
        }
        if tail > 0 {
            // (Its pages are neither committed nor written: dropped as a
            // zap drops them; a locked region's host lock stays.)
            let (prot, locked) =
                c.region_at(run.start).map_or((PROT_NONE, false), |r| (r.prot & PROT_MASK, r.lock != LockMode::None));
            let _ = self.plat.zap(a + mid, tail, prot);
            if locked {
                let _ = self.plat.host_lock(a + mid, tail, true);
            }
        }
        head
    }

    /// Test hook: whether this split's first half is to fail
    /// (`inject_split_failures`).
    fn split_fails(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return take_one(&self.inject_split_failures);
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// Hands the wake-up of `[a, a + len)` (installed without one) to the
    /// spinning wake-ahead thread (`WakeAhead::post`), or does it now if
    /// the thread would not take it. What it returns goes to
    /// [`Inner::settle_wake`] once the caller's other work is done.
    pub(super) fn hand_off_wake(&self, a: usize, len: usize) -> Option<u64> {
        let post = self.wake_ahead.post(a, len / self.page_size);
        if post.is_none() {
            let _ = self.plat.wake(a, len);
        }
        post
    }

    /// Whether the wake-up of the thread waiting for `caller`'s fault is
    /// to be handed to the wake-ahead thread (`hand_off_wake`): it spins,
    /// and the faulting thread waits on another CPU than this handler's.
    /// Where the two share a CPU (the handler ran there once the thread
    /// slept), the handler's own wake-up needs no interrupt and the thread
    /// preempts it at once, while the wake-ahead thread, on the other CPU,
    /// would have to interrupt this one. The thread's CPU is read from
    /// `/proc` (`ThreadCpu`, about 1 µs).
    pub(super) fn delegates_wake(&self, caller: Caller) -> bool {
        let Caller::Fault { tid: Some(tid), in_thread: false, .. } = caller else { return false };
        if !self.wake_ahead.spinning() {
            return false;
        }
        let mine = usermm_sys::thread::current_cpu();
        mine.is_none() || THREAD_CPU.with(|t| t.borrow_mut().of(tid, THREAD_CPU_AGE_NS)) != mine
    }

    /// Takes back a handed-off wake-up the wake-ahead thread has not taken
    /// (it may not be running) and does it: never a wake-up left undone.
    pub(super) fn settle_wake(&self, handed: Option<u64>, a: usize, len: usize) {
        if handed.is_some_and(|p| self.wake_ahead.unpost(p)) {
            let _ = self.plat.wake(a, len);
        }
    }

    /// After a fill's I/O installed `n` pages (a prefix) of `run`: the
    /// commit; for a file read by a fault, the read-ahead the core decides
    /// on (`file`); a failure reported while the core lock is held (before
    /// the wake-up: a faulting thread is surely still in the fault); then
    /// the wake-up of every waiter.
    fn finish_fill(
        &self,
        plan: &FaultPlan,
        run: PageRange,
        n: u64,
        page_addr: usize,
        caller: Caller,
        file: Option<u32>,
    ) -> Next<'_> {
        let mut c = self.commit_fill(plan, n);
        // Read-ahead pipeline (the core decides): the next window read by
        // the background thread while the program consumes this one. A
        // populate (read-ahead windows are populates) chains its own.
        let ahead = match (caller, file) {
            (Caller::Fault { .. }, Some(f)) => c.readahead_after_fault(run, n, f),
            _ => None,
        };
        let r = self.outcome(&mut c, plan, run, n, page_addr, caller);
        drop(c);
        // Wake only after the commit (the pages were installed without
        // waking): the woken thread must see them committed (e.g. locked),
        // never a fill in flight.
        self.wake_run(run, page_addr);
        if let Some(next) = ahead {
            lock(&self.willneed).push(self.addr(next));
            let _c = lock(&self.core);
            self.reclaim_wanted.notify_all();
        }
        r
    }

    /// What a fill of `n` pages (a prefix of `run`) did for the page at
    /// `page_addr`: served if it covers it; else a failure to report — the
    /// plan's own (a read error) when nothing went in, but a retry when some
    /// pages did: the read succeeded, and the install stopped short of the
    /// page (a backward swap-in run ends at the faulting page, and a copy
    /// the host cut short, its memory map changing, installs a prefix).
    /// The page was given back to its old state by the commit; the thread
    /// faults again.
    fn outcome<'a>(
        &self,
        c: &mut MutexGuard<'a, Core>,
        plan: &FaultPlan,
        run: PageRange,
        n: u64,
        page_addr: usize,
        caller: Caller,
    ) -> Next<'a> {
        self.outcome_or(c, run, n, page_addr, caller, plan.unfilled())
    }

    /// `outcome`, with `unfilled` the failure when nothing went in.
    fn outcome_or<'a>(
        &self,
        c: &mut MutexGuard<'a, Core>,
        run: PageRange,
        n: u64,
        page_addr: usize,
        caller: Caller,
        unfilled: Failure,
    ) -> Next<'a> {
        if self.covers(run, n, page_addr) {
            Next::Served
        } else if n > 0 {
            self.report(c, caller, Failure::NotFilled)
        } else {
            self.report(c, caller, unfilled)
        }
    }

    /// Whether `n` pages installed from `run.start` cover the page at
    /// `page_addr`.
    fn covers(&self, run: PageRange, n: u64, page_addr: usize) -> bool {
        let a = self.addr(run.start);
        page_addr >= a && ((page_addr - a) / self.page_size) < n as usize
    }

    /// Reports `failure` for `caller`, with the core lock held: a fault's
    /// signal (none for a read-in, which nobody waits on, nor for a fill
    /// the thread may retry), a populate's errno.
    fn report<'a>(&self, c: &mut MutexGuard<'a, Core>, caller: Caller, failure: Failure) -> Next<'a> {
        let Caller::Fault { addr, tid, .. } = caller else {
            return Next::Failed(failure.populate_errno());
        };
        let Some(t) = tid else { return Next::Served };
        match failure {
            Failure::NotFilled => {}
            Failure::Gone => {
                if !super::fault::defer_signal(super::fault::SIGSEGV) && self.signal_sent(t, super::fault::SIGSEGV) {
                    let _ = self.plat.sigsegv(t, addr);
                }
            }
            Failure::OutOfMemory | Failure::Poisoned | Failure::Unreadable => {
                #[cfg(feature = "test-hooks")]
                {
                    let stall = self.inject_signal_stall_ms.load(Ordering::Relaxed);
                    if stall > 0 && matches!(failure, Failure::Unreadable | Failure::OutOfMemory) {
                        std::thread::sleep(std::time::Duration::from_millis(stall.into()));
                    }
                }
                let deferred = super::fault::defer_signal(super::fault::SIGBUS);
                // (Not when a signal sent before answers this fault.)
                let sent = deferred || self.signal_sent(t, super::fault::SIGBUS);
                if sent && failure == Failure::OutOfMemory {
                    // The kernel would OOM-kill; we raise SIGBUS.
                    c.fault_oom();
                }
                if sent && !deferred {
                    let _ = self.plat.sigbus(t, addr);
                }
            }
        }
        Next::Served
    }

    /// A reactivation's I/O: `Some(pages installed)`, or `None` when a
    /// checked reactivation found that the host discarded the parked page
    /// (the loss is committed: the page is purged).
    pub(super) fn reactivate_io(&self, plan: &FaultPlan) -> Option<u64> {
        let FaultPlan::Reactivate { page, slot, how, checked, wp } = *plan else { return Some(0) };
        if !checked {
            return Some(u64::from(self.reactivate(page, slot, how, wp)));
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
        if (c.free_frames() < self.low_watermark || c.spares_low()) && !self.bg_poked.swap(true, Ordering::Relaxed) {
            self.reclaim_wanted.notify_one();
        }
    }
}
