//! The commit after a fill's I/O: the core's `fill_done`, the failure
//! reported to the faulting thread or the populate, the wake-ups, and the
//! read-ahead and refill that follow.

use super::serve::{Caller, Next};
use super::*;
use usermm_core::Failure;

impl Inner {
    /// After a fill's I/O installed `n` pages (a prefix) of `run`: the
    /// commit; for a file read by a fault, the read-ahead the core decides
    /// on (`file`); a failure reported while the core lock is held (before
    /// the wake-up: a faulting thread is surely still in the fault); then
    /// the wake-up of every waiter.
    pub(super) fn finish_fill(
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
            self.reclaimer.queue([self.addr(next)]);
            let _c = lock(&self.core);
            self.reclaimer.notify();
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
    pub(super) fn outcome<'a>(
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
    pub(super) fn outcome_or<'a>(
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
    pub(super) fn covers(&self, run: PageRange, n: u64, page_addr: usize) -> bool {
        let a = self.addr(run.start);
        page_addr >= a && ((page_addr - a) / self.page_size) < n as usize
    }

    /// Reports `failure` for `caller`, with the core lock held: a fault's
    /// signal (none for a read-in, which nobody waits on, nor for a fill
    /// the thread may retry), a populate's errno.
    pub(super) fn report<'a>(&self, c: &mut MutexGuard<'a, Core>, caller: Caller, failure: Failure) -> Next<'a> {
        let Caller::Fault { addr, tid, .. } = caller else {
            return Next::Failed(failure.populate_errno());
        };
        let Some(t) = tid else { return Next::Served };
        match failure {
            Failure::NotFilled => {}
            Failure::Gone => {
                if !super::fault::defer_signal(super::fault::SIGSEGV, 0) && self.signal_sent(t, super::fault::SIGSEGV) {
                    let _ = self.plat.thread(Thread::Signal { tid: t, sig: Signal::Segv, addr });
                }
            }
            Failure::OutOfMemory | Failure::Poisoned | Failure::Unreadable => {
                if matches!(failure, Failure::Unreadable | Failure::OutOfMemory) {
                    self.hooks.stall_signal();
                }
                let errno = failure.signal_errno();
                let deferred = super::fault::defer_signal(super::fault::SIGBUS, errno.0);
                // (Not when a signal sent before answers this fault.)
                let sent = deferred || self.signal_sent(t, super::fault::SIGBUS);
                if sent && failure == Failure::OutOfMemory {
                    // The kernel would OOM-kill; we raise SIGBUS.
                    c.fault_oom();
                }
                if sent && !deferred {
                    let _ = self.plat.thread(Thread::Signal { tid: t, sig: Signal::Bus(errno), addr });
                }
            }
        }
        Next::Served
    }

    /// Maps back the parked pages of `plans` (never checked reactivations,
    /// for which `reactivate_io` gives a count), each with what went in:
    /// neighbouring pages parked in neighbouring slots (as parking moved
    /// them, a run at a time) with one move, the others (and what a move
    /// left) one by one. The slots a copy emptied are dropped together at
    /// the end, before any can be used again: one TLB flush for the batch
    /// instead of one per page (`Arena::drop_slot_list`; 14 µs a page one
    /// at a time while the program runs on the other CPU).
    pub(super) fn reactivate_all(&self, plans: Vec<FaultPlan>) -> Vec<(FaultPlan, u64)> {
        let mut done: Vec<(FaultPlan, u64)> = Vec::with_capacity(plans.len());
        let mut copied: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < plans.len() {
            let run = self.move_run_at(&plans[i..]);
            let moved = if run > 1 {
                let (page, slot) = move_target(&plans[i]).expect("a run's first plan moves");
                self.plat.slots_to_pages_move(slot, self.addr(page), run).unwrap_or(0)
            } else {
                0
            };
            for (k, p) in plans[i..i + run.max(1)].iter().enumerate() {
                let n = match *p {
                    _ if k < moved => 1,
                    FaultPlan::Reactivate { page, slot, how, checked: false, wp } => {
                        let n = u64::from(self.reactivate(page, slot, how, wp, false));
                        if n > 0 {
                            copied.push(slot);
                        }
                        n
                    }
                    _ => self.reactivate_io(p).unwrap_or(0),
                };
                done.push((p.clone(), n));
            }
            i += run.max(1);
        }
        if !copied.is_empty() && self.plat.staging(Staging::DropList { slots: &copied }).is_err() {
            // (Each page is mapped back all the same; a slot still holding
            // a frame is emptied on its own.)
            for &s in &copied {
                let _ = self.plat.staging(Staging::Drop { slot: s, n: 1 });
            }
        }
        done
    }

    /// How many plans from the first of `plans` map back neighbouring pages
    /// from neighbouring slots by a plain move (0 if the first does not).
    fn move_run_at(&self, plans: &[FaultPlan]) -> usize {
        if !self.plat.caps().can_move {
            return 0;
        }
        let Some((page, slot)) = plans.first().and_then(move_target) else { return 0 };
        plans
            .iter()
            .enumerate()
            .take_while(|(k, p)| move_target(p) == Some((PageIdx(page.0 + *k as u64), slot + *k as u32)))
            .count()
    }

    /// A reactivation's I/O: `Some(pages installed)`, or `None` when a
    /// checked reactivation found that the host discarded the parked page
    /// (the loss is committed: the page is purged).
    pub(super) fn reactivate_io(&self, plan: &FaultPlan) -> Option<u64> {
        let FaultPlan::Reactivate { page, slot, how, checked, wp } = *plan else { return Some(0) };
        if !checked {
            return Some(u64::from(self.reactivate(page, slot, how, wp, true)));
        }
        let dst = self.addr(page);
        let r = self.plat.staging(Staging::ToPageChecked { slot, dst });
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
        let _ = self.plat.range(Range::Wake, a, l);
        if fault_addr < a || fault_addr >= a + l {
            let _ = self.plat.range(Range::Wake, fault_addr, self.page_size);
        }
    }

    /// Carries out a `Refill` plan under the core lock: a lazily freed page
    /// the host dropped reads zeros (or, if the fault raced with nothing
    /// gone, the copy finds the page there and installs nothing).
    pub(super) fn refill(&self, c: &mut MutexGuard<'_, Core>, plan: &FaultPlan, page: PageIdx) {
        let a = self.addr(page);
        let n = self.plat.fill(Fill::Zero { how: Zero::Fill, wake: true }, a, self.page_size).unwrap_or(0);
        c.fill_done(plan, u64::from(n == self.page_size));
        self.after_fill(c);
    }

    pub(super) fn after_fill(&self, c: &mut MutexGuard<'_, Core>) {
        self.counters.filled();
        self.settled.notify_all();
        self.reclaimer.after_fill(c);
    }
}

/// The page and slot of a reactivation a plain move carries out (not
/// checked, not write-protected, a region a move may serve).
fn move_target(plan: &FaultPlan) -> Option<(PageIdx, u32)> {
    match *plan {
        FaultPlan::Reactivate { page, slot, how: Transfer::Move, checked: false, wp: false } => Some((page, slot)),
        _ => None,
    }
}
