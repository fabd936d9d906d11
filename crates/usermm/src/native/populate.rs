//! The lock calls (`mlock2`, `munlock`, `mlockall`) and populate
//! (`MADV_POPULATE_*`, `umm_populate`, the population a lock does).

use super::serve::{Caller, Next, Retries};
use super::*;

impl Inner {
    /// Locks (`mode` Locked/OnFault) or unlocks (None) a range in the host
    /// kernel too, so that locked pages never reach the host's swap. Always
    /// `MLOCK_ONFAULT` in the host: usermm populates itself (a host populate
    /// would fault into our own handlers while we hold the region lock).
    pub(super) fn host_lock(&self, r: PageRange, mode: LockMode) -> Result<(), Errno> {
        if mode == LockMode::None {
            // (Windows from the page cache live only in locked regions.)
            self.unmap_file_windows(r);
        }
        let a = self.addr(r.start);
        let l = r.pages() as usize * self.page_size;
        self.plat.range(Range::Lock(mode != LockMode::None), a, l).map(drop)
    }

    /// Carries out a lock decision made by `decide` under the exclusive
    /// lock: host locks, the budget check for full locks, then (under the
    /// shared lock) mapping parked pages back and populating full locks.
    /// Anything that fails undoes the whole call (a full lock that the budget
    /// cannot hold is `EAGAIN` and locks nothing new).
    pub fn lock_call(&self, decide: impl FnOnce(&mut Core) -> LockPlan) -> Result<(), Errno> {
        let mm = self.mm().write();
        let t0 = now_ns();
        let (plan, modes) = {
            let mut c = lock(&self.core);
            let plan = decide(&mut c);
            let modes: Vec<LockMode> = plan
                .changed
                .iter()
                .map(|&(seg, _)| c.region_at(seg.start).map(|r| r.lock()).unwrap_or(LockMode::None))
                .collect();
            (plan, modes)
        };
        let full = self.lock_host_apply(&plan, &modes);
        self.note_hold(t0);
        let full = full?;
        drop(mm);
        if !plan.reactivate.is_empty() {
            // (Whatever the region's protection: a parked page of a
            // `PROT_NONE` region is resident, and a lock keeps it so.)
            let mm = self.read_mm();
            for &p in &plan.reactivate {
                self.reactivate_parked(&mm, p);
            }
        }
        let populated = if plan.result.is_ok() { self.lock_populate(&plan, &full) } else { Ok(()) };
        // The pages swapped back in (or locked with a swap copy) have left
        // swap when the call returns: their stored copies are overwritten.
        self.scrub_swap();
        populated?;
        plan.result
    }

    /// `lock_call`'s host locks (the new `modes` of `plan.changed`) and the
    /// budget check of its full locks, under the exclusive region lock: the
    /// fully locked segments, or the error after every host lock and the
    /// core's plan were undone.
    fn lock_host_apply(&self, plan: &LockPlan, modes: &[LockMode]) -> Result<Vec<PageRange>, Errno> {
        // The host locks, with no core lock held: the region lock, held
        // exclusively, keeps every other call, fault and reclaim out.
        let mut full = Vec::new();
        let mut done = Vec::new();
        let mut failed = None;
        for (&(seg, old), &new) in plan.changed.iter().zip(modes) {
            if let Err(e) = self.host_lock(seg, new) {
                failed = Some(e);
                break;
            }
            done.push((seg, old));
            if new == LockMode::Locked {
                full.push(seg);
            }
        }
        if failed.is_none() && !full.is_empty() && !lock(&self.core).lock_fits(&full) {
            failed = Some(Errno::EAGAIN);
        }
        if let Some(e) = failed {
            for &(seg, old) in done.iter().rev() {
                let _ = self.host_lock(seg, old);
            }
            lock(&self.core).lock_revert(plan);
            return Err(e);
        }
        Ok(full)
    }

    /// `lock_call`'s populate (under the shared region lock) of
    /// `plan.populate`, or else of the fully locked segments `full`.
    fn lock_populate(&self, plan: &LockPlan, full: &[PageRange]) -> Result<(), Errno> {
        let populate = if plan.populate.is_empty() { full } else { &plan.populate[..] };
        for seg in populate {
            let prot = lock(&self.core).region_at(seg.start).map(|r| r.prot()).unwrap_or(PROT_NONE);
            // Linux populates what it can reach (FOLL_FORCE): not
            // PROT_NONE (ENOMEM), nor exec-only memory, for which builds of
            // Linux 6.18 answer ENOMEM or 0 (measured on this machine's
            // kernels): the host is asked once.
            let r = if prot & (PROT_READ | PROT_WRITE) == 0 {
                // (Exec-only: as the host answers, see
                // `Caps::mlock_exec_only`; nothing is populated either way.)
                if prot & PROT_EXEC != 0 && self.plat.caps().mlock_exec_only {
                    Ok(())
                } else {
                    Err(Errno::EFAULT)
                }
            } else {
                self.populate(self.addr(seg.start), seg.pages() as usize * self.page_size, prot & PROT_WRITE != 0).1
            };
            match r {
                Ok(()) => {}
                Err(Errno::ENOMEM) => {
                    // The budget cannot hold the pages: EAGAIN, and
                    // nothing new stays locked (usermm's improvement on
                    // Linux, which leaves the range locked).
                    let _mm = self.mm().write();
                    for &(seg, old) in plan.changed.iter().rev() {
                        let _ = self.host_lock(seg, old);
                    }
                    lock(&self.core).lock_revert(plan);
                    return Err(Errno::EAGAIN);
                }
                // mlockall ignores the others (Linux's ignore_errors);
                // mlock reports them as Linux's
                // __mlock_posix_error_return does (EFAULT, and an
                // unreadable range, is ENOMEM) and stays locked.
                Err(_) if plan.populate_best_effort => {}
                // The first failure ends the populate, as in Linux's
                // __mm_populate: what follows stays unpopulated.
                Err(e) => return Err(usermm_core::lock_populate_errno(e)),
            }
        }
        Ok(())
    }

    /// `MADV_POPULATE_READ/WRITE` and `umm_populate`: returns the bytes
    /// populated (from `addr`, a prefix of the range) and the result. The
    /// pages it swapped into a locked region have left swap when it returns
    /// (their stored copies overwritten: `scrub_swap`).
    pub fn populate(&self, addr: usize, len: usize, write: bool) -> (usize, Result<(), Errno>) {
        let r = self.populate_range(addr, len, write);
        self.scrub_swap();
        r
    }

    fn populate_range(&self, addr: usize, len: usize, write: bool) -> (usize, Result<(), Errno>) {
        let mut mm = self.read_mm();
        let (segs, check) = lock(&self.core).populate_check(addr as u64, len as u64, write);
        let mut populated = 0usize;
        let mut retries = Retries::default();
        for seg in segs {
            let (a, l) = (self.addr(seg.start), seg.pages() as usize * self.page_size);
            // (A segment is one region's part: a region handed to the host
            // is wholly in its shared ranges. An atomic load when there
            // are none.)
            if !self.plat.runs(Runs::Shared, a, l).is_empty() {
                // The host's pages (shared with a forked process): the
                // host populates them.
                let advice = if write { MADV_POPULATE_WRITE } else { MADV_POPULATE_READ };
                if let Err(e) = self.plat.range(Range::Advise(advice), a, l) {
                    return (populated, Err(e));
                }
                populated += l;
                continue;
            }
            let mut p = seg.start;
            let mut skipped = false;
            while p < seg.end {
                // Interrupted: the space is closing (or the test hook).
                let stop = self.hooks.populate_stop();
                if self.shutdown.load(Ordering::Relaxed) || p.0 == stop {
                    self.hooks.populate_interrupted();
                    return (populated, Err(Errno::EINTR));
                }
                // (A step never runs past the interruption point.)
                let end = if stop > p.0 { PageIdx(seg.end.0.min(stop)) } else { seg.end };
                let mut c = lock(&self.core);
                let Some(plan) = c.populate_step(p, end, write) else {
                    drop(c);
                    skipped = true;
                    p.0 += 1;
                    populated += self.page_size;
                    continue;
                };
                // The loop plans the page again: a filled page is skipped.
                match self.serve(c, &plan, self.addr(p), write, Caller::Populate, &mm, &mut retries) {
                    Next::Failed(e) => return (populated, Err(e)),
                    Next::Served | Next::Again(_) => {}
                }
                // A range larger than the budget cannot be resident at once.
                let c = lock(&self.core);
                let budget = c.config().budget_pages;
                let seg_done = p.0 - seg.start.0;
                if seg_done > budget {
                    return (populated, Err(Errno::ENOMEM));
                }
            }
            if write && skipped {
                mm = self.populate_write_skipped(seg, mm);
            }
        }
        drop(mm);
        (populated, check)
    }

    /// After a write populate's segment: resident pages a read mapped to
    /// the zero page are allocated (a WRITE populate never leaves the zero
    /// page), and lazily freed pages are dirtied by the host's write
    /// populate, so that they are kept, as Linux's populate does
    /// (`FOLL_WRITE`); one the host already dropped faults into our
    /// handlers and is refilled. Returns the region lock, taken again.
    fn populate_write_skipped<'a>(&'a self, seg: PageRange, mm: RwLockReadGuard<'a, ()>) -> RwLockReadGuard<'a, ()> {
        let a = self.addr(seg.start);
        let mut ranges = self.zero_pfn_ranges(a, seg.pages() as usize * self.page_size);
        let lazy = lock(&self.core).lazyfree_runs(seg);
        ranges.extend(lazy.iter().map(|r| (self.addr(r.start), self.addr(r.end))));
        if ranges.is_empty() {
            return mm;
        }
        // The host call can fault into our own handlers, which take the
        // region lock: never hold it across one (a writer waiting for it
        // would block the handler, and the handler this call). Without the
        // lock the range may be unmapped meanwhile: the host populate then
        // fails or populates the new region's pages through our handlers,
        // which changes no byte.
        drop(mm);
        for (z, e) in ranges {
            let _ = self.plat.range(Range::PopulateWrite, z, e - z);
        }
        self.read_mm()
    }
}
