//! Carrying out an advice the core planned (`AdviceOp`).

use super::*;

impl Inner {
    /// Carries out one page advice; the caller holds `mm` shared.
    pub(super) fn advice_op(&self, _mm: &RwLockReadGuard<'_, ()>, op: &AdviceOp) -> Result<(), Errno> {
        match *op {
            AdviceOp::Host(r, advice) => return self.host_advice(r, advice),
            AdviceOp::PunchZap { range, file, file_page } => self.punch_zap(range, file, file_page)?,
            AdviceOp::Zap(r) => self.zap_range(r),
            AdviceOp::WritebackZap(r) => {
                // Linux's MADV_DONTNEED on a shared file only unmaps: the
                // page cache keeps every write, also one made by another
                // thread during the call. So the pages are not written back
                // and then zapped (a write between the two was lost): they
                // are parked first — out of the program's reach, so that a
                // concurrent write faults and waits — then the dirty ones
                // are written to the file from their parked copies and all
                // are dropped, as MADV_PAGEOUT does. A page that cannot be
                // parked is written back and stays mapped (reads the same).
                self.pageout_range(r);
                let _ = self.writeback_range(r, &[]);
            }
            AdviceOp::Cold(r) => {
                let ds = lock(&self.core).deactivate_range(r);
                self.deactivate_all(&ds);
            }
            AdviceOp::Pageout(r) => self.pageout_range(r),
            AdviceOp::Free(r) => self.lazy_free(r),
            AdviceOp::Poison(r) => {
                self.zap_range(r);
                lock(&self.core).set_poison(r);
                let _ = self.plat.range(Range::Poison, self.addr(r.start), r.pages() as usize * self.page_size);
            }
            AdviceOp::WillNeed(r) => self.will_need(r),
        }
        Ok(())
    }

    /// `AdviceOp::Host`: passes the advice down to the host kernel on `r`
    /// (noting the first guard and `MADV_DONTDUMP`).
    fn host_advice(&self, r: PageRange, advice: i32) -> Result<(), Errno> {
        self.counters.advised(advice);
        self.plat.range(Range::Advise(advice), self.addr(r.start), r.pages() as usize * self.page_size).map(drop)
    }

    /// `AdviceOp::PunchZap` (`MADV_REMOVE` on a shared file): frees the
    /// file's blocks under `range`, then drops the pages without write-back.
    fn punch_zap(&self, range: PageRange, file: u32, file_page: u64) -> Result<(), Errno> {
        let f = self.files.get(file).ok_or(Errno::EIO)?;
        let ps = self.page_size as u64;
        // The first punch answers whether the file system can
        // (EOPNOTSUPP leaves everything as it was, as on Linux).
        f.punch_hole(file_page * ps, range.pages() * ps)?;
        // Then drop our copies, dirty or not, with no write-back —
        // and punch each chunk again while it is claimed: a
        // write-back in flight at the first punch (reclaim's, in
        // another thread) has landed by then, and none can start.
        self.zap_range_and(range, &mut |chunk| {
            let at = file_page + (chunk.start.0 - range.start.0);
            let _ = f.punch_hole(at * ps, chunk.pages() * ps);
        });
        Ok(())
    }

    /// `AdviceOp::Free` (`MADV_FREE`): the core marks the pages lazily
    /// freed; with the host's lazy free, the host is told too, and the pages
    /// past the space's bound are discarded at once.
    fn lazy_free(&self, r: PageRange) {
        if !self.settings.host_lazyfree() {
            lock(&self.core).lazyfree(r);
            return;
        }
        // Reuse costs nothing: the pages stay mapped, a write
        // cancels the host's lazy free, and only under pressure
        // (ours or the host's) is a clean page dropped.
        //
        // The host's MADV_FREE skips a page still waiting in a
        // CPU's LRU batch (it drains only the calling CPU's, and
        // our handlers install pages on the others): such a page
        // would never be discarded. Drain every CPU's batches
        // first, when pages were installed since the last drain
        // (a free-and-reuse loop installs none, and pays
        // nothing).
        if self.counters.drain_due() {
            self.plat.upkeep(Upkeep::DrainLru);
        }
        {
            // The parked pages' slots are passed down under the core
            // lock, as `mvolatile` does: once it is let go, reclaim may
            // evict such a page, free its slot and park another page
            // there — a page written since, whose dirty bit a late
            // MADV_FREE would clear, and which the host would then
            // drop as clean.
            let mut c = lock(&self.core);
            for s in c.lazyfree(r) {
                let _ = self.plat.staging(Staging::HostFree { slot: s });
            }
        }
        let _ = self.plat.range(Range::Free, self.addr(r.start), r.pages() as usize * self.page_size);
        // Past the space's bound, discard the oldest at once.
        for _ in 0..64 {
            let plan = lock(&self.core).lazyfree_trim_plan();
            if plan.is_empty() {
                break;
            }
            self.deactivate_all(&plan.deactivate);
            self.discard_all(&plan.discard);
        }
    }

    /// `AdviceOp::WillNeed`: queues the swapped-out pages of `r` for the
    /// reclaim thread to read in.
    fn will_need(&self, r: PageRange) {
        let pages = lock(&self.core).swapped_in(r);
        if !pages.is_empty() {
            self.reclaimer.queue(pages.into_iter().map(|p| self.addr(p)));
            let _c = lock(&self.core);
            self.reclaimer.notify();
        }
    }

    /// Deactivates the mapped pages of `r`, then evicts every parked page of
    /// the range (also those parked before): shared file pages go to their
    /// file, lazily freed ones are discarded (or swapped, if written since),
    /// the others go to swap.
    fn pageout_range(&self, r: PageRange) {
        let ds = lock(&self.core).pageout_range(r);
        self.deactivate_all(&ds);
        loop {
            let plan = lock(&self.core).evict_range(r, 1024);
            if plan.is_empty() {
                break;
            }
            let freed =
                self.discard_all(&plan.discard) + self.evict_all(&plan.evict) + self.writeback_all(&plan.writeback);
            if freed == 0 {
                break;
            }
        }
        lock(&self.core).pageout_done(r);
    }
}
