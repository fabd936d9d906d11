//! `validate`: walks the whole state and asserts every invariant (Linux's
//! `validate_mm()`); tests call it after each step.
//!
//! It checks each part on its own (the region tree, the held ranges, the
//! page table, the staging slots), then every counter the core keeps
//! against a recount from the pages (`resident`, `inactive`, `swapped`,
//! `locked_pages`, `volatile_pages`, `lazyfree_pages`, the swap slots in
//! use: `SwapSpace::validate`) and the regions (the lock charge:
//! `Locks::validate`; the pages per file: `FileTable::validate`), allowing
//! for pages in flight (`Filling`, `Evicting`, `Zapping`) that still count
//! where they came from.

use super::Core;
use crate::page::{pf, PState};
use crate::region::LockMode;
use crate::types::PageRange;

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Walks the whole state and asserts every invariant.
    pub fn validate(&self) {
        self.regions.validate(self.cfg.reserve_pages);
        assert!(self.regions.len() <= self.cfg.max_regions, "region limit");
        self.zaps.validate(&self.regions);
        self.pages.validate();
        self.staging.validate();
        self.lru.validate();
        self.validate_page_states();
        self.validate_locks();
        self.files.validate(&self.regions);
        self.validate_lru();
    }

    /// Every page's state against its region and slots, and the slot
    /// counts against a recount (the page counts are the page table's,
    /// recounted exactly by `PageTable::validate`).
    fn validate_page_states(&self) {
        let all = PageRange::new(0, self.cfg.reserve_pages);
        let (mut sw, mut staged, mut evicting, mut zapping, mut filling) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut swap_seen = std::collections::HashSet::new();
        let mut staging_seen = std::collections::HashSet::new();
        let mut cached = 0u64;
        self.pages.for_each_live(all, |p, m| {
            if m.cache != 0 {
                // A swap copy: only beside a frame, in a slot of its own.
                cached += 1;
                assert!(m.state.holds_frame(), "swap copy of {p:?} in state {:?}", m.state);
                assert!(!m.has(pf::LAZYFREE), "swap copy of lazily freed {p:?}");
                assert!(self.swap.is_used(m.cache - 1), "swap copy slot of {p:?}");
                assert!(swap_seen.insert(m.cache - 1), "swap copy slot shared");
            }
            if m.state != PState::Absent {
                assert!(
                    self.regions.find(p).is_some() || self.zaps.is_held(p),
                    "page {p:?} ({:?}) outside every region",
                    m.state
                );
            }
            match m.state {
                PState::Inactive | PState::Deactivating | PState::Evicting => {
                    staged += 1;
                    assert!(self.staging.is_used(m.slot), "staging slot of {p:?}");
                    assert!(staging_seen.insert(m.slot), "staging slot shared");
                    if m.state == PState::Evicting {
                        evicting += 1;
                    }
                }
                PState::Swapped => {
                    sw += 1;
                    assert!(self.swap.is_used(m.slot), "swap slot of {p:?}");
                    assert!(swap_seen.insert(m.slot), "swap slot shared");
                }
                PState::Zapping => zapping += 1,
                PState::Filling => filling += 1,
                _ => {}
            }
        });
        let n = self.pages.census();
        assert_eq!(cached, n.swap_cached, "swap copies count");
        assert!(self.resident() <= self.cfg.budget_pages, "over budget");
        assert!(self.pages.resident_max() <= self.cfg.budget_pages, "max over budget");
        self.swap.validate(cached, sw, evicting + filling);
        let used = self.staging.used() as u64;
        assert!(used >= staged && used <= staged + zapping + filling, "staging slots in use");
    }

    /// The lock charge against the locked regions, and every locked page
    /// inside one (or in a held range).
    fn validate_locks(&self) {
        let all = PageRange::new(0, self.cfg.reserve_pages);
        self.locks.validate(&self.regions);
        let mut lp = 0;
        self.pages.for_each_live(all, |p, m| {
            if m.has(pf::LOCKED) {
                lp += 1;
                assert!(
                    self.regions.find(p).is_some_and(|r| r.lock() != LockMode::None) || self.zaps.is_held(p),
                    "locked page {p:?} outside a locked region"
                );
                // A locked page is never evicted: a swap copy would only
                // keep its data in swap (`swapcache.rs`).
                assert_eq!(m.cache, 0, "locked page {p:?} keeps a swap copy");
            }
        });
        assert_eq!(lp, self.pages.census().locked, "locked pages count");
    }

    /// Every resident unlocked page is on the active list, every parked
    /// page on the inactive list, each exactly once (by a valid entry: its
    /// generation matches the page's); a locked page at most once (until
    /// reclaim drops its entry); no valid entry names any other page.
    /// A page missing from its list would never be reclaimed; one on it
    /// twice would be aged twice as fast.
    fn validate_lru(&self) {
        let mut on = self.lru.valid_entries(&self.pages);
        let all = PageRange::new(0, self.cfg.reserve_pages);
        self.pages.for_each_live(all, |p, m| {
            let (a, i) = on.remove(&p).unwrap_or_default();
            if self.regions.find(p).is_none() {
                // Detached, being unmapped: reclaim drops its entries as it
                // meets them (the zap frees the page).
                assert!(a <= 1 && i <= 1, "detached page {p:?} ({m:?}) on the LRU lists {a}x and {i}x");
                return;
            }
            match m.state {
                PState::Resident if !m.has(pf::LOCKED) => {
                    assert!(a == 1 && i == 0, "resident unlocked page {p:?} ({m:?}): on the active list {a}x")
                }
                // A page locked since it was queued keeps its entry until
                // reclaim pops it and drops it (off the LRU until unlocked).
                PState::Resident => assert!(a <= 1 && i == 0, "locked page {p:?} ({m:?}): on the active list {a}x"),
                PState::Inactive => {
                    assert!(a == 0 && i == 1, "parked page {p:?} ({m:?}): on the inactive list {i}x")
                }
                _ => assert_eq!((a, i), (0, 0), "page {p:?} ({m:?}) on an LRU list"),
            }
        });
        assert!(on.is_empty(), "LRU entries of pages the page table does not hold: {on:?}");
    }
}
