//! Freed swap slots given back to the page store.
//!
//! A store that holds swapped pages on another machine (a Redis server) can
//! give their memory back, but only a whole *granule* of slots at a time
//! (one value holds a granule's pages). The core logs the granules in which
//! slots were freed; the executor asks for the ones wholly free now
//! (`swap_release_plan`), which stay reserved — allocated to no page, so no
//! eviction writes into them while the store deletes them — until
//! `swap_release_done`. The swap file wants none of this (granule 0: nothing
//! is logged).
//!
//! Separately, the slots of pages that came back into a locked region are
//! *scrubbed*: their stored copies overwritten with a page of zeros
//! (`swap_scrub_plan`), in every store, so that a locked page's data does
//! not stay readable in swap (on a Redis server, for good after a crash).

use super::*;

impl Core {
    /// Logs freed swap slots by granules of `granule` slots from now on
    /// (0: not at all).
    pub fn set_swap_release_granule(&mut self, granule: u32) {
        self.release_granule = granule;
        self.release_log.clear();
    }

    /// Frees swap slot `s` (and logs its granule).
    pub(super) fn free_swap_slot(&mut self, s: u32) {
        self.swap.release(s);
        if let Some(g) = s.checked_div(self.release_granule) {
            self.release_log.push(g);
            // Bounded: at most one entry per granule once deduplicated.
            if self.release_log.len() as u64 > 2 * u64::from(self.swap.capacity().div_ceil(self.release_granule)) + 64 {
                self.release_log.sort_unstable();
                self.release_log.dedup();
            }
        }
    }

    /// Whether granules with freed slots wait for `swap_release_plan`, or
    /// slots for `swap_scrub_plan`.
    pub fn swap_release_pending(&self) -> bool {
        !self.release_log.is_empty() || !self.scrub_log.is_empty()
    }

    /// Up to `max` freed swap slots whose stored copy is to be overwritten
    /// (the copies of pages now locked: `swapcache.rs`, `fill_done`),
    /// reserved until `swap_scrub_done` so that no eviction writes there
    /// meanwhile. A slot allocated again since is left out: its new page's
    /// write overwrites it.
    pub fn swap_scrub_plan(&mut self, max: usize) -> Vec<u32> {
        self.scrub_log.append(&mut self.scrub_retry);
        self.scrub_log.sort_unstable();
        self.scrub_log.dedup();
        let take = self.scrub_log.len().min(max);
        let mut out = Vec::new();
        for s in self.scrub_log.drain(..take) {
            if !self.swap.is_used(s) {
                self.swap.take(s);
                self.swap_reserved += 1;
                out.push(s);
            }
        }
        out
    }

    /// The slots of a `swap_scrub_plan` are overwritten in the store
    /// (`ok`) or not: either way they are free again, and their granules
    /// logged for `swap_release_plan`, which deletes a wholly free one. A
    /// failed scrub is kept for the next plan (unless a page takes the
    /// slot first), without counting as pending work.
    pub fn swap_scrub_done(&mut self, slots: &[u32], ok: bool) {
        for &s in slots {
            self.swap_reserved -= 1;
            self.free_swap_slot(s);
        }
        if !ok {
            self.scrub_retry.extend_from_slice(slots);
        }
    }

    /// Up to `max` granules whose slots are all free, reserved until
    /// `swap_release_done`: `(first slot, slots)` each. Granules logged but
    /// in use again are forgotten (their slots will be freed, and logged,
    /// again).
    pub fn swap_release_plan(&mut self, max: usize) -> Vec<(u32, u32)> {
        let g = self.release_granule;
        let mut out = Vec::new();
        if g == 0 {
            return out;
        }
        self.release_log.sort_unstable();
        self.release_log.dedup();
        let cap = self.swap.capacity();
        let take = self.release_log.len().min(max);
        for k in self.release_log.drain(..take) {
            let first = k * g;
            let n = g.min(cap - first);
            if (first..first + n).all(|s| !self.swap.is_used(s)) {
                for s in first..first + n {
                    self.swap.take(s);
                }
                self.swap_reserved += u64::from(n);
                out.push((first, n));
            }
        }
        out
    }

    /// The granules of a `swap_release_plan` are deleted from the store (or
    /// not: either way their slots are free again).
    pub fn swap_release_done(&mut self, granules: &[(u32, u32)]) {
        for &(first, n) in granules {
            for s in first..first + n {
                self.swap.release(s);
            }
            self.swap_reserved -= u64::from(n);
        }
    }
}
