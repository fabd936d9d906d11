//! Frame and LRU accounting, and the spare metadata buffers.
//!
//! Helpers every concern calls when a page gains or loses a frame or moves
//! between LRU lists: `claim_frames` charges the budget (invariant:
//! `resident <= budget_pages`), `note_resident` locks or activates a page
//! that just became resident, `push_active`/`push_inactive` append a page
//! under a new generation (older entries for it turn stale), and
//! `maybe_compact` sweeps stale entries a few chunks at a time so that no
//! call stays long (the lists and their compaction are `Lru`'s). The spares (`add_spares`) let a fault's commit run
//! without calling the allocator.

use super::{Core, Spares};
use crate::page::pf;
use crate::region::LockMode;
use crate::types::PageIdx;

/// Below this many spare LRU chunks (of 8), or a quarter of the spare
/// leaves (`PageTable::spare_low`), the executor is asked to refill.
const SPARES_LOW_CHUNKS: usize = 4;

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Takes spare metadata buffers allocated outside the core lock: a
    /// fault's commit then never calls the allocator, whose heap growth (an
    /// `mprotect` of a thread arena) waits for the kernel's mmap lock —
    /// behind a concurrent `munmap`'s zap, for hundreds of microseconds.
    pub fn add_spares(&mut self, s: Spares) {
        self.pages.add_spare(s.leaves);
        self.lru.add_spare(s.active, s.inactive);
    }

    /// Drops stale LRU entries when they dominate, sweeping at most
    /// `chunks` chunks of 512 entries (`Lru::compact`). A zap, which is
    /// what leaves entries stale in bulk, sweeps two chunks for every
    /// chunk's worth it zapped.
    pub(super) fn maybe_compact(&mut self, chunks: usize) {
        self.lru.compact(&self.pages, chunks);
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Counts `n` frames about to be claimed (the pages that take them
    /// become busy at once, and so count as resident).
    pub(super) fn claim_frames(&mut self, n: u64) {
        self.pressure.claimed(n, super::policy::PARKED_TOUCHES_PER_CLAIM);
        debug_assert!(self.resident() + n <= self.cfg.budget_pages, "claim beyond budget");
    }

    /// A page just became resident: lock it if its region is locked.
    pub(super) fn note_resident(&mut self, p: PageIdx) {
        // (One lookup: this runs for every page a fault fills.)
        let (writable, locked, sampled) = self
            .regions
            .find(p)
            .map_or((false, false, false), |r| (r.writable(), r.lock() != LockMode::None, self.sampled(r)));
        if writable {
            self.pages.update(p, |m| m.flags |= pf::MAYBE_DIRTY);
        }
        if locked {
            if !self.pages.get(p).has(pf::LOCKED) {
                self.pages.update(p, |m| m.flags |= pf::LOCKED);
            }
            // (A reactivated page, or a swap-in planned before the lock.)
            self.uncache_locked(p);
        } else {
            self.push_active(p);
            if sampled {
                self.queue_fresh(p);
            }
        }
    }

    /// Under pressure, queues page `p` of a sampled region, just put on the
    /// active list, for the next reclaim round to zap (`plan_fresh`): a
    /// mapped page's touches are invisible, a zapped one's are not.
    pub(super) fn queue_fresh(&mut self, p: PageIdx) {
        if self.pressure.under() && self.fresh.len() < self.cfg.budget_pages as usize {
            self.fresh.push((p, self.pages.get(p).gen));
        }
    }

    /// Queues resident page `p` on the proven list if its use is proved
    /// (`policy::proved`), on the active list otherwise (see
    /// `Lru::add_active`).
    pub(super) fn push_active(&mut self, p: PageIdx) {
        if super::policy::proved(&self.pages.get(p)) {
            self.lru.add_proven(&mut self.pages, p);
        } else {
            self.lru.add_active(&mut self.pages, p);
        }
    }

    /// Queues page `p` on the inactive list (see `Lru::add_active`).
    pub(super) fn push_inactive(&mut self, p: PageIdx) {
        self.lru.add_inactive(&mut self.pages, p);
    }

    /// How many chunks (of 512 entries) LRU compaction has been allowed to
    /// sweep since the core was made: the work the lists' upkeep did under
    /// the core lock (tests bound it per call).
    pub fn lru_sweep_work(&self) -> u64 {
        self.lru.sweep_work()
    }

    /// The spare metadata buffers the core would take (see [`Spares`]).
    pub fn spares_wanted(&self) -> (usize, usize, usize) {
        let (active, inactive) = self.lru.spare_wanted();
        (self.pages.spare_wanted(), active, inactive)
    }

    /// Whether the spares ran low: a fault would soon call the allocator.
    pub fn spares_low(&self) -> bool {
        let (_, a, i) = self.spares_wanted();
        self.pages.spare_low() || a > SPARES_LOW_CHUNKS || i > SPARES_LOW_CHUNKS
    }
}
