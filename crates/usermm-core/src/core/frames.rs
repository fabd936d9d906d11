//! Frame and LRU accounting, and the spare metadata buffers.
//!
//! Helpers every concern calls when a page gains or loses a frame or moves
//! between LRU lists: `claim_frames` charges the budget (invariant:
//! `resident <= budget_pages`), `note_resident` locks or activates a page
//! that just became resident, `push_active`/`push_inactive` append a page
//! under a new generation (older entries for it turn stale), and
//! `maybe_compact` sweeps stale entries a few chunks at a time so that no
//! call stays long. The spares (`add_spares`) let a fault's commit run
//! without calling the allocator.

use super::{Core, Spares};
use crate::page::{pf, PState};
use crate::region::LockMode;
use crate::types::PageIdx;

/// Pushes per chunk a compaction sweeps (see `Core::sweep_stale`).
const SWEEP_EVERY_PUSHES: u32 = 64;

/// Below this many spare LRU chunks (of 8), or a quarter of the spare
/// leaves (`PageTable::spare_low`), the executor is asked to refill.
const SPARES_LOW_CHUNKS: usize = 4;

impl Core {
    /// Counts `n` frames about to be claimed (the pages that take them
    /// become busy at once, and so count as resident).
    pub(super) fn claim_frames(&mut self, n: u64) {
        self.pressure.claimed(n);
        debug_assert!(self.resident() + n <= self.cfg.budget_pages, "claim beyond budget");
    }

    /// A page just became resident: lock it if its region is locked.
    pub(super) fn note_resident(&mut self, p: PageIdx) {
        // (One lookup: this runs for every page a fault fills.)
        let (writable, locked) =
            self.regions.find(p).map_or((false, false), |r| (r.writable(), r.lock != LockMode::None));
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
        }
    }

    pub(super) fn push_active(&mut self, p: PageIdx) {
        let mut m = self.pages.get(p);
        m.gen = self.lru.next_gen(m.gen);
        self.pages.set(p, m);
        self.lru.active.push_back((p, m.gen));
        self.sweep_stale();
    }

    /// Stale entries pile up when pages cycle between the lists without
    /// reclaim popping them and without a zap compacting them (a shared
    /// file page parked, written back and faulted in again in a loop): once
    /// the lists are more than twice the resident pages plus 4096, a chunk
    /// is swept every `SWEEP_EVERY_PUSHES` pushes. Without it, a page came
    /// back to a generation one of its stale entries still had (when
    /// generations had 16 bits): a page on the active list twice, seen by
    /// `validate` after a loop of `MADV_DONTNEED` on a shared file beside a
    /// writer.
    ///
    /// Why not a chunk per push: a fault-around window's commit pushes each
    /// of its pages, under the core lock, so a 256-page window swept 256
    /// chunks (131,072 entries, 0.7 ms measured) whenever a large `munmap`
    /// had left the lists stale — every other thread's fault waited that
    /// long (`perf` of `usermm bench munmap`: the second thread's worst
    /// stalls were those commits). A pass over a list of `n` entries now
    /// takes `n / 8` pushes, which leave at most that many entries stale:
    /// the lists stay bounded.
    fn sweep_stale(&mut self) {
        self.lru.pushes = self.lru.pushes.wrapping_add(1);
        if self.lru.pushes.is_multiple_of(SWEEP_EVERY_PUSHES) {
            self.maybe_compact(1);
        }
    }

    pub(super) fn push_inactive(&mut self, p: PageIdx) {
        let mut m = self.pages.get(p);
        m.gen = self.lru.next_gen(m.gen);
        self.pages.set(p, m);
        self.lru.inactive.push_back((p, m.gen));
        self.sweep_stale();
    }

    /// How many chunks (of 512 entries) LRU compaction has been allowed to
    /// sweep since the core was made: the work the lists' upkeep did under
    /// the core lock (tests bound it per call).
    pub fn lru_sweep_work(&self) -> u64 {
        self.lru.sweep_work
    }

    /// The spare metadata buffers the core would take (see [`Spares`]).
    pub fn spares_wanted(&self) -> (usize, usize, usize) {
        (self.pages.spare_wanted(), self.lru.active.spare_wanted(), self.lru.inactive.spare_wanted())
    }

    /// Whether the spares ran low: a fault would soon call the allocator.
    pub fn spares_low(&self) -> bool {
        let (_, a, i) = self.spares_wanted();
        self.pages.spare_low() || a > SPARES_LOW_CHUNKS || i > SPARES_LOW_CHUNKS
    }

    /// Takes spare metadata buffers allocated outside the core lock: a
    /// fault's commit then never calls the allocator, whose heap growth (an
    /// `mprotect` of a thread arena) waits for the kernel's mmap lock —
    /// behind a concurrent `munmap`'s zap, for hundreds of microseconds.
    pub fn add_spares(&mut self, s: Spares) {
        self.pages.add_spare(s.leaves);
        self.lru.active.add_spare(s.active);
        self.lru.inactive.add_spare(s.inactive);
    }

    /// Drops stale LRU entries when they dominate, sweeping at most
    /// `chunks` chunks of 512 entries, so that every call stays short. A
    /// zap, which is what leaves entries stale in bulk, sweeps two chunks
    /// for every chunk's worth it zapped.
    pub(super) fn maybe_compact(&mut self, chunks: usize) {
        let live = self.resident() as usize;
        if self.lru.compacting == 0 && self.lru.len() > 2 * live + 4096 {
            self.lru.compacting = 1;
        }
        if self.lru.compacting != 0 {
            self.lru.sweep_work += chunks as u64;
        }
        let pages = &self.pages;
        let lru = &mut self.lru;
        let swept = match lru.compacting {
            0 => return,
            1 => lru.active.sweep(chunks, |(p, g)| {
                let m = pages.get(*p);
                m.gen == *g && m.state == PState::Resident
            }),
            2 => lru.inactive.sweep(chunks, |(p, g)| {
                let m = pages.get(*p);
                m.gen == *g && m.state == PState::Inactive
            }),
            3 => lru.lazy.sweep(chunks, |p| pages.get(*p).has(pf::LAZYFREE)),
            _ => lru.volatile.sweep(chunks, |p| {
                let m = pages.get(*p);
                m.has(pf::VOLATILE) && !m.has(pf::PURGED) && m.state.holds_frame()
            }),
        };
        if swept {
            lru.compacting = (lru.compacting + 1) % 5;
        }
    }
}
