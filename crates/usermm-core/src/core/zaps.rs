//! The ranges whose pages are being dropped: those `munmap` detached
//! (*held* until the executor has zapped them and calls `unhold`), and the
//! chunks being zapped (between `zap_begin` and `zap_end`), and the ranges
//! an explicit `MADV_PAGEOUT` is paging out (between `pageout_range` and
//! `pageout_done`: neither pressure's end nor a swap read-ahead maps their
//! parked pages back, so that the eviction that follows finds them).
//!
//! A held range is not reused: a new mapping goes elsewhere, and a
//! `MAP_FIXED` one over it waits. A fault or populate step in a chunk being
//! zapped waits, and no fill window reaches into one (`clear_of`), so that
//! no page is filled while the host drops the chunk's pages (the fill would
//! be dropped with them, or an old swapped page brought back after the
//! call).
//!
//! Invariants: no region lies in a held range (`validate`); every page of a
//! chunk being zapped is settled or `Zapping` (`zap.rs` claims them all
//! before `begin`).

use crate::region::RegionTree;
use crate::types::{PageIdx, PageRange};

#[derive(Default)]
pub(super) struct Zaps {
    /// Ranges detached by munmap whose pages are still being zapped.
    held: Vec<PageRange>,
    /// Chunks being zapped.
    zapping: Vec<PageRange>,
    /// Ranges an explicit `MADV_PAGEOUT` is paging out.
    paging_out: Vec<PageRange>,
}

impl Zaps {
    /// The held ranges.
    pub(super) fn held(&self) -> &[PageRange] {
        &self.held
    }

    /// Holds detached `ranges` until `unhold`.
    pub(super) fn hold(&mut self, ranges: &[PageRange]) {
        self.held.extend(ranges.iter().copied());
    }

    /// Lets held range `r` be reused; it must be held.
    pub(super) fn unhold(&mut self, r: PageRange) {
        let i = self.held.iter().position(|h| *h == r).expect("held range");
        self.held.swap_remove(i);
    }

    /// Whether any held range overlaps `r`.
    pub(super) fn held_overlaps(&self, r: &PageRange) -> bool {
        self.held.iter().any(|h| h.overlaps(r))
    }

    /// Whether page `p` is in a held range.
    pub(super) fn is_held(&self, p: PageIdx) -> bool {
        self.held.iter().any(|h| h.contains(p))
    }

    /// Chunk `r` is being zapped (its pages claimed).
    pub(super) fn begin(&mut self, r: PageRange) {
        self.zapping.push(r);
    }

    /// Chunk `r` is zapped.
    pub(super) fn end(&mut self, r: PageRange) {
        if let Some(i) = self.zapping.iter().position(|z| *z == r) {
            self.zapping.swap_remove(i);
        }
    }

    /// The chunks being zapped.
    pub(super) fn zapping(&self) -> &[PageRange] {
        &self.zapping
    }

    /// Whether any chunk is being zapped.
    pub(super) fn any_zapping(&self) -> bool {
        !self.zapping.is_empty()
    }

    /// Whether page `p` is in a chunk being zapped.
    pub(super) fn zapping_at(&self, p: PageIdx) -> bool {
        self.zapping.iter().any(|z| z.contains(p))
    }

    /// Range `r` is being paged out.
    pub(super) fn pageout_begin(&mut self, r: PageRange) {
        self.paging_out.push(r);
    }

    /// Range `r` is paged out.
    pub(super) fn pageout_end(&mut self, r: PageRange) {
        if let Some(i) = self.paging_out.iter().position(|z| *z == r) {
            self.paging_out.swap_remove(i);
        }
    }

    /// Whether page `p` is in a range being paged out.
    pub(super) fn paging_out_at(&self, p: PageIdx) -> bool {
        self.paging_out.iter().any(|z| z.contains(p))
    }

    /// `region` narrowed around page `p` so that a window never reaches
    /// into a chunk being zapped.
    pub(super) fn clear_of(&self, mut region: PageRange, p: PageIdx) -> PageRange {
        for z in &self.zapping {
            if z.end <= p && z.end > region.start {
                region.start = z.end;
            }
            if z.start > p && z.start < region.end {
                region.end = z.start;
            }
        }
        region
    }

    /// No region in a held range.
    pub(super) fn validate(&self, regions: &RegionTree) {
        for h in &self.held {
            assert!(!regions.any_in(*h), "held range {h:?} has regions");
        }
    }
}
