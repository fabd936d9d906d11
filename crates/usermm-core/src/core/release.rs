//! Freed swap slots given back to the page store: the executor's side of
//! the swap space's release and scrub plans (the state and its invariants
//! are `SwapSpace`'s, in `swap.rs`).
//!
//! A store that can give memory back only a granule of slots at a time (a
//! Redis server) asks for the granules wholly free now; the slots of pages
//! that came back into a locked region are scrubbed, their stored copies
//! overwritten with zeros, so that a locked page's data does not stay in
//! swap.

use super::Core;

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Up to `max` freed swap slots whose stored copy is to be overwritten
    /// (the copies of pages now locked: `swapcache.rs`, `fill_done`),
    /// reserved until `swap_scrub_done` so that no eviction writes there
    /// meanwhile. A slot allocated again since is left out: its new page's
    /// write overwrites it.
    pub fn swap_scrub_plan(&mut self, max: usize) -> Vec<u32> {
        self.swap.scrub_plan(max)
    }

    /// Up to `max` granules whose slots are all free, reserved until
    /// `swap_release_done`: `(first slot, slots)` each. Granules logged but
    /// in use again are forgotten (their slots will be freed, and logged,
    /// again).
    pub fn swap_release_plan(&mut self, max: usize) -> Vec<(u32, u32)> {
        self.swap.release_plan(max)
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// The slots of a `swap_scrub_plan` are overwritten in the store
    /// (`ok`) or not: either way they are free again, and their granules
    /// logged for `swap_release_plan`, which deletes a wholly free one. A
    /// failed scrub is kept for the next plan (unless a page takes the
    /// slot first), without counting as pending work.
    pub fn swap_scrub_done(&mut self, slots: &[u32], ok: bool) {
        self.swap.scrub_done(slots, ok);
    }

    /// The granules of a `swap_release_plan` are deleted from the store (or
    /// not: either way their slots are free again).
    pub fn swap_release_done(&mut self, granules: &[(u32, u32)]) {
        self.swap.release_done(granules);
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether granules with freed slots wait for `swap_release_plan`, or
    /// slots for `swap_scrub_plan`.
    pub fn swap_release_pending(&self) -> bool {
        self.swap.release_pending()
    }
}

/// Configuration (see "Methods by kind" in `core.rs`).
impl Core {
    /// Logs freed swap slots by granules of `granule` slots from now on
    /// (0: not at all).
    pub fn set_swap_release_granule(&mut self, granule: u32) {
        self.swap.set_release_granule(granule);
    }
}
