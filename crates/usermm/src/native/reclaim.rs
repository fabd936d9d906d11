//! Reclaim execution: deactivation into staging, eviction to swap or file,
//! discards of lazily freed pages, drops of clean file pages, purges of
//! volatile pages.
//!
//! # A store that refuses writes
//!
//! A failed store write (the swap file's file system is full, the Redis server
//! is down or out of memory) keeps its pages resident (the page's next try
//! takes another slot), and when none of a reclaim step's writes went through
//! the store is backed off from (`StoreBackoff`, `native/backoff.rs`; a step
//! whose writes partly went, as one cluster node's failing beside the others',
//! ends the back-off instead: it is not the store that refuses writes, and each
//! run of a step is tried, within one of the store's write groups,
//! `PageStore::write_granule`): no write is tried for a
//! pause that starts at [`STORE_BACKOFF_FIRST_NS`] and doubles with each
//! failure in a row up to [`STORE_BACKOFF_MAX_NS`], and the core plans no
//! eviction that needs a write meanwhile (`Core::set_swap_writes_paused`), so
//! reclaim is hopeless unless something else can leave and a fault short of
//! frames is out of memory at once. (Retried at every reclaim round, a full 16
//! MiB swap file system took 4.0-4.7 million failing writes in two minutes.)
//! Once the pause is over the next reclaim round tries again (the background
//! thread wakes for it); the first write that goes through ends the back-off. A
//! fault short of frames waits for a retry due within [`STORE_RETRY_WAIT_NS`]
//! of its start (a store that failed a few writes and recovers costs it a few
//! milliseconds, not a SIGBUS).

use super::serve::Retries;
use super::*;

impl Inner {
    /// Reclaims up to `want` frames for a fault that found none (direct
    /// reclaim: it must make progress). The caller holds `mm` shared.
    pub fn reclaim_locked(&self, mm: &RwLockReadGuard<'_, ()>, want: u64) -> u64 {
        self.reclaim_rounds(mm, want, true)
    }

    /// Reclaim rounds. Without `direct`, a round that evicted nothing (it
    /// only deactivated) ends the call, so that freshly deactivated pages get
    /// a chance to be touched before they are evicted.
    pub(super) fn reclaim_rounds(&self, _mm: &RwLockReadGuard<'_, ()>, want: u64, direct: bool) -> u64 {
        let mut freed = 0;
        for _round in 0..4 {
            let plan = {
                let mut c = lock(&self.core);
                self.store_retry_due(&mut c);
                c.reclaim_plan(want - freed)
            };
            if plan.is_empty() {
                break;
            }
            freed += self.deactivate_all(&plan.deactivate);
            freed += self.discard_all(&plan.discard);
            freed += self.writeback_all(&plan.writeback);
            freed += self.purge_all(&plan.purge);
            freed += self.evict_all(&plan.evict);
            freed += self.drop_all(&plan.drop);
            // Stop as soon as anything was freed: another round would evict
            // the pages this one just deactivated, before the program had a
            // chance to touch them (and so to prove them hot).
            if freed > 0 || !direct || want == 0 {
                break;
            }
        }
        freed
    }

    /// Parks the pages of `ds` in their staging slots and commits; returns
    /// the frames freed meanwhile: lazily freed pages the host turned out
    /// to have discarded (a move finds no page: `deactivate_lost`).
    pub(super) fn deactivate_all(&self, ds: &[Deactivate]) -> u64 {
        let mut oks = vec![false; ds.len()];
        let can_move = self.plat.caps().can_move;
        // Readable pages of non-writable regions: copied, then dropped in
        // one batch (a drop a page cost a TLB flush each, ~14 µs while the
        // program runs on the other CPU).
        let copies: Vec<usize> =
            (0..ds.len()).filter(|&i| matches!(ds[i].how, Transfer::Copy { readable: true })).collect();
        if !copies.is_empty() {
            let pairs: Vec<(usize, u32)> = copies.iter().map(|&i| (self.addr(ds[i].page), ds[i].slot)).collect();
            for (&i, ok) in copies.iter().zip(self.plat.pages_to_slots_copy(&pairs)) {
                oks[i] = ok;
            }
        }
        let mut i = 0;
        while i < ds.len() {
            if matches!(ds[i].how, Transfer::Copy { readable: true }) {
                i += 1;
                continue;
            }
            // A run of neighbouring pages going to neighbouring slots moves
            // with one ioctl.
            let mut j = i + 1;
            if can_move && ds[i].how == Transfer::Move {
                while j < ds.len()
                    && ds[j].how == Transfer::Move
                    && ds[j].page.0 == ds[j - 1].page.0 + 1
                    && ds[j].slot == ds[j - 1].slot + 1
                {
                    j += 1;
                }
                let moved = self.plat.pages_to_slots_move(self.addr(ds[i].page), ds[i].slot, j - i).unwrap_or(0);
                for ok in &mut oks[i..i + moved] {
                    *ok = true;
                }
            } else {
                oks[i] = self.transfer_out(&ds[i]);
            }
            i = j;
        }
        // A page a move did not report may have moved all the same: the
        // host's count is wrong now and then (an `EEXIST` for a run whose
        // pages had gone to their slots; taken at its word, 1 to 47 pages
        // of the free-and-reuse test read back as zeros in 1 run of 100-400).
        // Looked up page by page; only ever after a failure.
        for (d, ok) in ds.iter().zip(&mut oks) {
            if !*ok
                && can_move
                && d.how == Transfer::Move
                && matches!(
                    self.plat.staging(Staging::MovedUnreported { src: self.addr(d.page), slot: d.slot }),
                    Ok(true)
                )
            {
                self.counters.unreported_move();
                *ok = true;
            }
        }
        // A page a fork left shared with the other process does not move
        // (`EBUSY`, until a write fault makes it this process's own again:
        // `native/fork.rs`): its swap copy is dropped (the protection that
        // keeps it exact goes), it is write-faulted in place and moved
        // again. (Not a page the host may have dropped: its write fault
        // would wait for this very deactivation.)
        if self.forked_since_open() {
            let ps = self.page_size;
            for (d, ok) in ds.iter().zip(&mut oks) {
                if *ok || !can_move || d.how != Transfer::Move {
                    continue;
                }
                let a = self.addr(d.page);
                if self.settings.host_lazyfree() && !matches!(self.plat.range(Range::Gone, a, ps), Ok(false)) {
                    continue;
                }
                lock(&self.core).unshare_for_move(d.page);
                let _ = self.plat.range(Range::Unprotect, a, ps);
                if self.plat.range(Range::PopulateWrite, a, ps).is_ok()
                    && matches!(self.plat.pages_to_slots_move(a, d.slot, 1), Ok(1))
                {
                    *ok = true;
                }
            }
        }
        // Parked volatile pages may be purged by the host under its own
        // pressure (found out when they are mapped back). Before the commit,
        // while the slots are surely still theirs. (The host only takes
        // pages on its LRU lists: a page still in a CPU's batch would stay
        // unpurgeable, so flush the batches first.)
        if ds.iter().zip(&oks).any(|(d, ok)| *ok && d.host_free) {
            self.plat.upkeep(Upkeep::DrainLru);
        }
        for (d, ok) in ds.iter().zip(&oks) {
            if *ok && d.host_free {
                let _ = self.plat.staging(Staging::HostFree { slot: d.slot });
            }
        }
        // A page that would not move may be a lazily freed page the host
        // discarded (its MADV_FREE was passed down): no page at all there.
        let gone: Vec<bool> = ds
            .iter()
            .zip(&oks)
            .map(|(d, ok)| {
                !ok && self.settings.host_lazyfree()
                    && matches!(self.plat.range(Range::Gone, self.addr(d.page), self.page_size), Ok(true))
            })
            .collect();
        let mut c = lock(&self.core);
        let mut freed = 0;
        for ((d, ok), gone) in ds.iter().zip(&oks).zip(gone) {
            if gone {
                freed += u64::from(c.deactivate_lost(d));
            } else {
                c.deactivate_done(d, *ok);
            }
        }
        self.settled.notify_all();
        freed
    }

    /// Moves a resident page out of the program's range into its staging
    /// slot when `deactivate_all` neither moves it nor copies it in a batch:
    /// a writable page without `UFFDIO_MOVE` stays (a copy would race with
    /// the program's writes); an unreadable one (`PROT_NONE`) is copied
    /// through `/proc/self/mem`, then dropped — race-free because nothing
    /// can write it in between.
    pub(super) fn transfer_out(&self, d: &Deactivate) -> bool {
        match d.how {
            Transfer::Copy { readable: false } => {
                let src = self.addr(d.page);
                self.plat.staging(Staging::FromPageCopy { src, slot: d.slot, unreadable: true }).is_ok()
            }
            // (Readable copies went in `deactivate_all`'s batch.)
            Transfer::Move | Transfer::Copy { readable: true } => false,
            // No region is backed for sampling here (the core's
            // `set_sampled_refs` is off): a zap would lose the page.
            Transfer::Zap => false,
        }
    }

    /// Discards lazily freed parked pages: the host drops the clean ones
    /// (no I/O); the ones written since `MADV_FREE` are swapped normally.
    pub(super) fn discard_all(&self, ds: &[Discard]) -> u64 {
        if ds.is_empty() {
            return 0;
        }
        let mut outcome = Vec::with_capacity(ds.len());
        let mut tried = StoreTried::default();
        self.plat.upkeep(Upkeep::DrainLru);
        for d in ds {
            if matches!(self.plat.staging(Staging::Discard { slot: d.staging }), Ok(true)) {
                outcome.push((true, false));
                continue;
            }
            let written = match d.swap {
                Some(slot) => {
                    self.store_write(&[d.staging], self.swap_off(slot), &mut tried)
                        && self.plat.staging(Staging::Drop { slot: d.staging, n: 1 }).is_ok()
                }
                _ => false,
            };
            outcome.push((false, written));
        }
        let mut c = lock(&self.core);
        self.store_tried(&mut c, tried);
        let mut freed = 0;
        for (d, &(dropped, written)) in ds.iter().zip(&outcome) {
            c.discard_done(d, dropped, written);
            freed += u64::from(dropped || written);
        }
        self.settled.notify_all();
        freed
    }

    /// Drops clean pages of streaming file regions where they are, a run of
    /// consecutive pages per `MADV_DONTNEED`; returns how many went.
    pub(super) fn drop_all(&self, pages: &[PageIdx]) -> u64 {
        if pages.is_empty() {
            return 0;
        }
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        let mut ok = Vec::with_capacity(sorted.len());
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j].0 == sorted[j - 1].0 + 1 {
                j += 1;
            }
            let (a, l) = (self.addr(sorted[i]), (j - i) * self.page_size);
            let windows = self.plat.runs(Runs::FileWindows, a, l);
            let r = self.plat.range(Range::Dontneed, a, l).is_ok();
            if r && !windows.is_empty() {
                self.drop_window_cache(&windows);
            }
            ok.extend(std::iter::repeat_n(r, j - i));
            i = j;
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (&p, &ok) in sorted.iter().zip(&ok) {
            c.drop_done(p, ok);
            freed += u64::from(ok);
        }
        self.settled.notify_all();
        freed
    }

    /// After windows from the page cache were dropped (`runs`, program
    /// addresses): their pages leave the host's page cache too, as a copy's
    /// do once read (`MappedFile::drop_cache`), so that what usermm let go
    /// does not stay in memory outside its budget.
    fn drop_window_cache(&self, runs: &[(usize, usize)]) {
        let ps = self.page_size;
        for &(s, t) in runs {
            let p = PageIdx(((s - self.base) / ps) as u64);
            let at = lock(&self.core).region_at(p).and_then(|g| Some((g.file()?, g.file_page(p))));
            if let Some(f) = at.and_then(|(file, _)| self.files.get(file)) {
                let off = at.map_or(0, |(_, fp)| fp) * ps as u64;
                f.drop_cache(off, t - s);
            }
        }
    }

    /// Purges volatile pages: drops their staging frames and puts a poison
    /// marker at their addresses (a touch raises SIGBUS). No I/O.
    pub(super) fn purge_all(&self, purges: &[(PageIdx, u32)]) -> u64 {
        if purges.is_empty() {
            return 0;
        }
        for &(p, slot) in purges {
            let _ = self.plat.staging(Staging::Drop { slot, n: 1 });
            let _ = self.plat.range(Range::Poison, self.addr(p), self.page_size);
        }
        let mut c = lock(&self.core);
        for &(p, slot) in purges {
            c.purge_done(p, slot);
        }
        self.settled.notify_all();
        purges.len() as u64
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the host kernel reclaims the staging area as its memory
    /// pressure would (clean lazily freed slots are discarded).
    pub fn host_reclaim_staging(&self) {
        self.plat.upkeep(Upkeep::ReclaimStaging);
    }

    /// Writes the evictions to swap (runs of consecutive slots in one call;
    /// a clean one, whose swap copy is exact, writes nothing), drops their
    /// staging frames, and commits. Returns frames freed.
    pub(super) fn evict_all(&self, evs: &[Evict]) -> u64 {
        if evs.is_empty() {
            return 0;
        }
        let mut ok = vec![false; evs.len()];
        let mut clean: Vec<usize> = (0..evs.len()).filter(|&i| evs[i].clean).collect();
        clean.sort_by_key(|&i| evs[i].staging);
        self.drop_staging(evs, &clean, &mut ok);
        let mut order: Vec<usize> = (0..evs.len()).filter(|&i| !evs[i].clean).collect();
        order.sort_by_key(|&i| evs[i].swap);
        let mut tried = StoreTried::default();
        // A run stays within one of the store's write groups (a cluster's
        // hash slot): a group that fails keeps only its own pages.
        let group = self.plat.caps().swap_write_granule;
        let mut i = 0;
        while i < order.len() {
            let mut j = i + 1;
            while j < order.len()
                && evs[order[j]].swap == evs[order[j - 1]].swap + 1
                && (group == 0 || evs[order[j]].swap / group == evs[order[i]].swap / group)
                && j - i < 256
            {
                j += 1;
            }
            let slots: Vec<u32> = order[i..j].iter().map(|&k| evs[k].staging).collect();
            // (Every run of the round is tried: a failed one only keeps its
            // own pages; the back-off follows the round as a whole.)
            let written = self.store_write(&slots, self.swap_off(evs[order[i]].swap), &mut tried);
            // The simulation's injected bug: a failed swap write taken for
            // a successful one (the page's data is lost).
            let written = written || self.hooks.loses_swap_write();
            if written {
                self.drop_staging(evs, &order[i..j], &mut ok);
            }
            i = j;
        }
        let mut c = lock(&self.core);
        self.store_tried(&mut c, tried);
        let mut freed = 0;
        for (e, ok) in evs.iter().zip(&ok) {
            c.evict_done(e, *ok);
            freed += *ok as u64;
        }
        self.settled.notify_all();
        freed
    }

    /// Drops the staging frames of the evictions `idx` (runs of consecutive
    /// staging slots in one call); `ok[k]` says whether eviction `k`'s went.
    fn drop_staging(&self, evs: &[Evict], idx: &[usize], ok: &mut [bool]) {
        let mut a = 0;
        while a < idx.len() {
            let mut b = a + 1;
            while b < idx.len() && evs[idx[b]].staging == evs[idx[b - 1]].staging + 1 {
                b += 1;
            }
            let dropped = self.plat.staging(Staging::Drop { slot: evs[idx[a]].staging, n: b - a }).is_ok();
            for &k in &idx[a..b] {
                ok[k] = dropped;
            }
            a = b;
        }
    }
}

/// What the store writes of one reclaim step did.
#[derive(Default, Clone, Copy)]
pub(super) struct StoreTried {
    /// A write went through.
    ok: bool,
    /// A write was tried and failed.
    failed: bool,
    /// A write was not tried: the store was backed off from (another
    /// thread's step failed meanwhile). Not a failure of the store's: it
    /// must not lengthen the pause (steps skipped so doubled it past a
    /// fault's wait, `STORE_RETRY_WAIT_NS`: an out-of-memory SIGBUS after
    /// four failed writes, `tests/swap_errors.rs`).
    skipped: bool,
}

impl Inner {
    /// Writes the staging slots `slots` to the store at `off`, unless the
    /// store is backed off from ("A store that refuses writes", above);
    /// records the outcome in `tried` and, for a failure, starts or
    /// lengthens the back-off.
    fn store_write(&self, slots: &[u32], off: u64, tried: &mut StoreTried) -> bool {
        if !self.plat.caps().has_swap {
            return false;
        }
        if self.backoff.backing_off() {
            // Another thread's write failed since this round was planned
            // (the pause was over then): the pause holds for this round too,
            // so that a fault short of frames waits for the store's next try
            // (`store_retry_wait`) instead of counting rounds that could
            // not free anything toward out-of-memory.
            tried.skipped = true;
            return false;
        }
        let ok = self.plat.store(Store::Write { slots, off }).is_ok();
        if ok {
            tried.ok = true;
        } else {
            tried.failed = true;
            self.backoff.count_failure();
        }
        ok
    }

    /// Tells the back-off and the core what a reclaim step's store writes
    /// found: a step whose writes all failed starts or lengthens the
    /// back-off and pauses the planning of writes (as does one that tried
    /// none, for a pause another thread's step started); one whose writes went
    /// through, even beside failed ones (a cluster node that cannot
    /// acknowledge, the others can), ends both: pausing every write for one
    /// failing group stalled a whole space behind one node (530 s for 0.7 s
    /// of work, touches held 80 s).
    fn store_tried(&self, c: &mut Core, tried: StoreTried) {
        if tried.ok {
            self.backoff.write_ok();
        } else if tried.failed {
            self.backoff.write_failed();
        }
        if (tried.failed || tried.skipped) && self.backoff.engaged() {
            c.set_swap_writes_paused(true);
        } else if tried.ok {
            c.set_swap_writes_paused(false);
        }
    }

    /// Ends the core's pause of store writes once the back-off's pause is
    /// over, so that the next reclaim round tries the store again; returns
    /// whether writes are still paused.
    pub(super) fn store_retry_due(&self, c: &mut Core) -> bool {
        if c.swap_writes_paused() && !self.backoff.backing_off() {
            c.set_swap_writes_paused(false);
        }
        c.swap_writes_paused()
    }

    /// For a fault or populate the core finds out of memory (`c`): whether
    /// only the store's back-off stands in the way and its next try is due
    /// within `STORE_RETRY_WAIT_NS` of the fault's start (`st`); then how
    /// long to wait for it.
    pub(super) fn store_retry_wait(&self, c: &Core, st: &Retries) -> Option<std::time::Duration> {
        if !(c.swap_writes_paused() || self.backoff.backing_off()) || !c.reclaim_possible_but_for_store() {
            return None;
        }
        let at = self.backoff.retry_at_ns();
        let wait_ns = self
            .plat
            .caps()
            .swap_outage_wait
            .map_or(STORE_RETRY_WAIT_NS, |d| (d.as_nanos() as u64).max(STORE_RETRY_WAIT_NS));
        (at <= st.since_ns() + wait_ns).then(|| self.backoff.retry_in()).flatten()
    }
}
