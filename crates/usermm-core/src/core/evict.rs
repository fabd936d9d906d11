//! Reclaim's steps page by page: the explicit range plans of `MADV_COLD`
//! and `MADV_PAGEOUT` (`deactivate_range`, `evict_pages`, `evict_range`)
//! and the commits of every reclaim step (`deactivate_done`,
//! `deactivate_lost`, `drop_done`, `evict_done`, `purge_done`,
//! `reactivate_lost`, `discard_done`). Each commit leaves the state
//! consistent on failure: the page stays resident (parked or mapped). The
//! policy that chooses the pages is in `reclaim.rs`.

use super::policy::{forget_use, touched_sampled};
use super::{Core, Deactivate, Discard, Evict, FaultPlan, ReclaimPlan, Writeback};
use crate::consts::*;
use crate::page::{pf, PState, PageMeta};
use crate::region::{Kind, LockMode};
use crate::types::{PageIdx, PageRange};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Plans the deactivation (MADV_COLD) or deactivation-then-eviction
    /// (MADV_PAGEOUT) of the resident pages of `r`.
    pub fn deactivate_range(&mut self, r: PageRange) -> Vec<Deactivate> {
        self.deactivate_range_for(r, false)
    }

    /// Plans the deactivation of the resident pages of `r` for
    /// `MADV_PAGEOUT` (then `evict_range`): as `deactivate_range`, and
    /// without swap the lazily freed pages the host can discard still go
    /// (Linux's PAGEOUT on a swapless host discards clean lazily freed
    /// pages and keeps the rest). Until `pageout_done(r)`, pressure's end
    /// leaves the parked pages of `r` parked (`unpark_plan`): the page-out
    /// evicts them next, as Linux's drops them.
    pub fn pageout_range(&mut self, r: PageRange) -> Vec<Deactivate> {
        self.zaps.pageout_begin(r);
        self.deactivate_range_for(r, true)
    }

    fn deactivate_range_for(&mut self, r: PageRange, pageout: bool) -> Vec<Deactivate> {
        let mut v = Vec::new();
        let Some(reg) = self.regions.find(r.start).cloned() else { return v };
        if reg.lock() != LockMode::None {
            return v;
        }
        // (Shared file pages go to their file: they need no swap. Lazily
        // freed pages a page-out discards need none either.)
        let lazy_only = self.swap.capacity() == 0 && reg.kind() != Kind::FileShared;
        if lazy_only && !(pageout && self.options.host_lazyfree()) {
            return v;
        }
        if reg.writable() && reg.prot() != PROT_READ | PROT_WRITE {
            return v;
        }
        let how = self.transfer_of(&reg);
        for (p, m) in self.pages.live_in(r) {
            if m.state != PState::Resident || m.has(pf::LOCKED) {
                continue;
            }
            if lazy_only && !m.has(pf::LAZYFREE) {
                continue;
            }
            let Some(slot) = self.staging.alloc() else { break };
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
                forget_use(m);
            });
            let host_free = self.options.host_lazyfree() && m.has(pf::VOLATILE);
            v.push(Deactivate { page: p, slot, how, host_free });
        }
        v
    }

    /// Plans the eviction of the given inactive pages (skipping the others).
    pub fn evict_pages(&mut self, pages: &[PageIdx]) -> Vec<Evict> {
        let mut v = Vec::new();
        for &p in pages {
            let m = self.pages.get(p);
            if m.state != PState::Inactive || m.has(pf::VOLATILE) {
                continue;
            }
            let Some((swap, clean)) = self.evict_target(p) else { break };
            self.pages.update(p, |m| m.state = PState::Evicting);
            v.push(Evict { page: p, staging: m.slot, swap, clean, zapped: self.zapped_at(p) });
        }
        v
    }

    /// Plans the eviction of every inactive page of `r` (MADV_PAGEOUT, after
    /// `pageout_range`), at most `max`: `evict`, `writeback` and `discard`
    /// of the plan.
    ///
    /// Parked pages of shared file regions go back to their files, never to
    /// swap (the second list, as reclaim plans them): a page of a file
    /// swapped here was lost to the file (munmap, msync and close write back
    /// only resident and parked pages). Lazily freed pages are discarded as
    /// reclaim discards them (`discard_done`): the host drops a clean one
    /// (no I/O; it reads back as zeros, as after Linux's PAGEOUT), and one
    /// written since goes to swap like any page, or stays parked without
    /// swap (Linux keeps it resident).
    pub fn evict_range(&mut self, r: PageRange, max: usize) -> ReclaimPlan {
        let mut plan = ReclaimPlan::default();
        for (p, m) in self.pages.live_in(r) {
            if plan.evict.len() + plan.writeback.len() + plan.discard.len() >= max {
                break;
            }
            if m.state != PState::Inactive || m.has(pf::VOLATILE) {
                continue;
            }
            if let Some(reg) = self.regions.find(p).filter(|g| g.kind() == Kind::FileShared) {
                let (file, file_page) = (reg.file().expect("file region"), reg.file_page(p));
                self.pages.update(p, |m| m.state = PState::Evicting);
                let clean = !m.has(pf::MAYBE_DIRTY);
                plan.writeback.push(Writeback { page: p, staging: Some(m.slot), file, file_page, clean });
                continue;
            }
            if m.has(pf::LAZYFREE) && self.options.host_lazyfree() {
                let swap = self.swap.alloc();
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.discard.push(Discard { page: p, staging: m.slot, swap });
                continue;
            }
            let Some((swap, clean)) = self.evict_target(p) else { break };
            self.pages.update(p, |m| m.state = PState::Evicting);
            plan.evict.push(Evict { page: p, staging: m.slot, swap, clean, zapped: self.zapped_at(p) });
        }
        plan
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// The page-out of `r` that `pageout_range(r)` began is over (its
    /// `evict_range` plans carried out): pressure's end may map back what
    /// it left parked.
    pub fn pageout_done(&mut self, r: PageRange) {
        self.zaps.pageout_end(r);
    }

    pub fn deactivate_done(&mut self, d: &Deactivate, ok: bool) {
        debug_assert_eq!(self.pages.get(d.page).state, PState::Deactivating);
        if ok {
            self.pages.update(d.page, |m| m.state = PState::Inactive);
            self.push_inactive(d.page);
            self.counters.deactivations += 1;
        } else {
            self.staging.release(d.slot);
            self.pages.update(d.page, |m| {
                m.state = PState::Resident;
                m.slot = 0;
            });
            // The region may have been locked while the page was in flight.
            self.note_resident(d.page);
        }
    }

    /// Commits a deactivation that found the page gone from the host: a
    /// lazily freed page the host discarded under its own pressure (its
    /// `MADV_FREE` was passed down). The page is discarded exactly as a
    /// discard by reclaim would leave it (reads back as zeros) and its frame
    /// is free; returns true. Any other page cannot be gone: the
    /// deactivation just failed (returns false).
    pub fn deactivate_lost(&mut self, d: &Deactivate) -> bool {
        let m = self.pages.get(d.page);
        if !m.has(pf::LAZYFREE) || m.has(pf::VOLATILE) {
            self.deactivate_done(d, false);
            return false;
        }
        debug_assert_eq!(m.state, PState::Deactivating);
        self.uncache(d.page);
        self.staging.release(d.slot);
        self.pages.update(d.page, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags &= !(pf::LAZYFREE | pf::MAYBE_DIRTY);
            forget_use(m);
        });
        self.counters.lazyfree_discards += 1;
        self.counters.evictions += 1;
        true
    }

    /// Commits the drop of a clean page of a streaming file region (see
    /// `ReclaimPlan::drop`): on success the page is gone (the next touch
    /// reads the file); otherwise it stays resident.
    pub fn drop_done(&mut self, p: PageIdx, ok: bool) {
        debug_assert_eq!(self.pages.get(p).state, PState::Zapping);
        if ok {
            self.uncache(p);
            self.pages.set(p, PageMeta::default());
        } else {
            self.pages.update(p, |m| m.state = PState::Resident);
            self.note_resident(p);
        }
    }

    /// Commits an eviction. On success the executor has written the data to
    /// swap and dropped the staging frame.
    pub fn evict_done(&mut self, e: &Evict, ok: bool) {
        debug_assert_eq!(self.pages.get(e.page).state, PState::Evicting);
        if ok {
            if e.clean {
                self.counters.clean_evictions += 1;
            } else {
                self.counters.swapouts += 1;
            }
            self.staging.release(e.staging);
            self.pages.update(e.page, |m| {
                m.state = PState::Swapped;
                m.slot = e.swap;
                m.cache = 0;
                m.flags &= !pf::LAZYFREE;
            });
            self.swap.note_evicted(e.swap, self.counters.evictions);
            self.counters.evictions += 1;
        } else {
            // The page stays resident (parked); the slot is not reused
            // blindly (a swap copy's slot stays the page's copy), nor
            // first: the page's next try takes another (a slot whose store
            // group cannot take writes would fail again).
            if !e.clean {
                self.swap.free_unwritten(e.swap);
            }
            self.pages.update(e.page, |m| m.state = PState::Inactive);
            self.push_inactive(e.page);
            self.counters.swap_write_errors += 1;
        }
    }

    /// Commits an eviction of a zapped page ([`Evict::zapped`]) that its
    /// reference scan found mapped: the program touched it since it was
    /// parked. Nothing was written; it stays, mapped (read-only if the
    /// executor write-protected it before the scan: a write is then a
    /// write-protect fault, served as any), with the passes it earned
    /// (`policy::touched_sampled`), to be zapped again by the next round and
    /// join the inactive list's tail.
    pub fn evict_touched(&mut self, e: &Evict) {
        debug_assert_eq!(self.pages.get(e.page).state, PState::Evicting);
        if !e.clean {
            self.swap.free_unwritten(e.swap);
        }
        self.staging.release(e.staging);
        self.pages.update(e.page, |m| {
            m.state = PState::Resident;
            touched_sampled(m);
        });
        self.push_active(e.page);
        self.queue_fresh(e.page);
        self.counters.scan_hits += 1;
    }

    /// Commits a purge: the executor dropped the staging frame and put a
    /// poison marker at the page's address.
    pub fn purge_done(&mut self, p: PageIdx, staging: u32) {
        debug_assert_eq!(self.pages.get(p).state, PState::Evicting);
        self.uncache(p);
        self.staging.release(staging);
        self.pages.update(p, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags = (m.flags | pf::PURGED) & !pf::LAZYFREE;
        });
        self.counters.volatile_purges += 1;
        self.counters.evictions += 1;
    }

    /// Commits a checked reactivation that found the staging slot empty: the
    /// host discarded the parked volatile page (`Reactivate { checked }`).
    /// The page is purged exactly as a purge by reclaim would leave it; the
    /// executor has dropped the slot and installed nothing.
    pub fn reactivate_lost(&mut self, plan: &FaultPlan) {
        let FaultPlan::Reactivate { page, slot, .. } = *plan else { return };
        debug_assert_eq!(self.pages.get(page).state, PState::Filling);
        self.uncache(page);
        self.staging.release(slot);
        let m = self.pages.get(page);
        let purged = if m.has(pf::VOLATILE) { pf::PURGED } else { 0 };
        self.pages.update(page, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags = (m.flags | purged) & !pf::LAZYFREE;
            forget_use(m);
        });
        if purged != 0 {
            self.counters.volatile_purges += 1;
            self.counters.host_purges += 1;
        }
    }

    /// Commits a discard attempt. `dropped`: the host dropped the clean
    /// page (no I/O); otherwise the program wrote it since `MADV_FREE`, and
    /// `written` says whether the executor wrote it to `d.swap`.
    pub fn discard_done(&mut self, d: &Discard, dropped: bool, written: bool) {
        debug_assert_eq!(self.pages.get(d.page).state, PState::Evicting);
        self.uncache(d.page);
        if dropped {
            if let Some(s) = d.swap {
                self.swap.free_slot(s);
            }
            self.staging.release(d.staging);
            self.pages.update(d.page, |m| {
                m.state = PState::Absent;
                m.slot = 0;
                m.flags &= !pf::LAZYFREE;
            });
            self.counters.lazyfree_discards += 1;
            self.counters.evictions += 1;
            return;
        }
        // Written since: an ordinary dirty page now.
        self.pages.update(d.page, |m| m.flags &= !pf::LAZYFREE);
        match (d.swap, written) {
            (Some(swap), true) => {
                self.staging.release(d.staging);
                self.pages.update(d.page, |m| {
                    m.state = PState::Swapped;
                    m.slot = swap;
                });
                self.swap.note_evicted(swap, self.counters.evictions);
                self.counters.swapouts += 1;
                self.counters.evictions += 1;
            }
            (swap, _) => {
                if let Some(s) = swap {
                    self.swap.free_slot(s);
                }
                self.pages.update(d.page, |m| m.state = PState::Inactive);
                self.push_inactive(d.page);
            }
        }
    }
}
