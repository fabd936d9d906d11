//! Pressure's end: the pages reclaim parked go back in bulk.
//!
//! While the budget is under pressure, reclaim parks pages (moves them out
//! of the program's range to staging slots) so that a touch shows as a
//! fault: that is the only reference bit userfaultfd gives (`policy.rs`).
//! Once pressure is over (`Core::ease_if_calm`), that sampling only costs:
//! each parked page would take a fault when next touched, for no eviction
//! to come. So the executor maps them back, oldest first, with moves and no
//! fault (`unpark_plan`, `unpark_done`), and they join the active list's
//! head in the order they had: the next pressure parks them first again.
//! A parked page that earned nothing is no younger for having come back.
//!
//! Not mapped back: volatile pages (their slots may be the host's to
//! discard: a purge must stay exact), lazily freed ones (on their way to a
//! discard), locked ones (a lock call maps those back itself), pages an
//! explicit `MADV_PAGEOUT` is paging out (it evicts them next), and pages
//! in flight.

use super::{Core, FaultPlan};
use crate::page::{pf, PState};
use crate::region::LockMode;

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Up to `max` parked pages to map back, oldest first, each claimed
    /// (`Filling`) as a [`FaultPlan::Reactivate`]; empty when none is left
    /// or pressure came back (the budget ran out since it eased).
    pub fn unpark_plan(&mut self, max: usize) -> Vec<FaultPlan> {
        let mut plans = Vec::new();
        if self.pressure.under() {
            return plans;
        }
        let mut kept = Vec::new();
        let mut scanned = 0;
        let scan_max = self.lru.inactive_len();
        while plans.len() < max && scanned < scan_max {
            scanned += 1;
            let Some((p, g)) = self.lru.isolate_inactive() else { break };
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Inactive {
                continue; // stale
            }
            let Some(reg) = self.regions.find(p) else {
                continue; // being unmapped: the zap frees it
            };
            let how = self.transfer_of(reg);
            let stays = reg.lock() != LockMode::None
                || m.flags & (pf::LOCKED | pf::VOLATILE | pf::LAZYFREE) != 0
                || self.zaps.zapping_at(p)
                || self.zaps.paging_out_at(p);
            if stays {
                kept.push((p, g));
                continue;
            }
            self.pages.update(p, |m| m.state = PState::Filling);
            // A page with a swap copy comes back write-protected, as a read
            // fault would bring it.
            let wp = m.cache != 0;
            plans.push(FaultPlan::Reactivate { page: p, slot: m.slot, how, checked: false, wp });
        }
        for e in kept {
            self.lru.rotate_inactive(e);
        }
        plans
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Commits the plans of one `unpark_plan`, each with the pages its
    /// transfer installed (0 or 1): a page mapped back is resident again,
    /// at the active list's head in the order the plans came (the oldest
    /// first in line), with no use counted; one not mapped back stays
    /// parked.
    pub fn unpark_done(&mut self, done: &[(FaultPlan, u64)]) {
        for (plan, installed) in done.iter().rev() {
            let FaultPlan::Reactivate { page, slot, wp, .. } = *plan else { continue };
            debug_assert_eq!(self.pages.get(page).state, PState::Filling);
            if !self.mapped_back(page, slot, wp, *installed) {
                continue;
            }
            if self.regions.find(page).is_some_and(|r| r.writable()) {
                self.pages.update(page, |m| m.flags |= pf::MAYBE_DIRTY);
            }
            self.lru.add_active_front(&mut self.pages, page);
            self.counters.unparked += 1;
        }
    }
}
