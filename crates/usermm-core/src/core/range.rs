//! The one range walker: every call that works on `[addr, addr+len)` over
//! regions with holes (madvise, mlock, mprotect, msync, populate, the
//! volatile calls, mincore and page_state) gets the range's mapped pieces,
//! in address order, from [`Core::walk`], and decides per piece; what
//! differs between the calls (which errno a hole is, whether they go on
//! past one, what a piece's protection allows) stays in each call, as in
//! Linux's `madvise_walk_vmas`.
//!
//! Invariant: the pieces are disjoint, inside the walked range, in order,
//! and each lies inside one region (a snapshot: the caller may change the
//! regions as it goes).

use super::*;
use crate::region::Region;

/// One mapped piece of a walked range.
pub(super) struct Piece {
    /// The region (as it was when the walk was taken).
    pub reg: Region,
    /// The part of the walked range inside it.
    pub seg: PageRange,
    /// Whether an unmapped gap of the range lies just before it.
    pub hole_before: bool,
}

/// A range's mapped pieces and its holes.
pub(super) struct Walk {
    pub pieces: Vec<Piece>,
    /// Whether the range ends in an unmapped gap (also when it has no piece).
    pub hole_after: bool,
    /// Whether part of the range lies outside the reservation (unmapped for
    /// Linux).
    pub outside: bool,
}

impl Walk {
    /// Whether any part of the range is unmapped.
    pub fn has_hole(&self) -> bool {
        self.outside || self.hole_after || self.pieces.iter().any(|p| p.hole_before)
    }
}

impl Core {
    /// `addr + pages` pages, or `None` when it overflows.
    pub(super) fn range_end(&self, addr: u64, pages: u64) -> Option<u64> {
        pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b))
    }

    /// The page count of an advice's range (`madvise`, and populate, which
    /// is an advice): `EINVAL` for an unaligned start, a length that
    /// rounds past the top, or a range that overflows, as Linux's
    /// `madvise` checks them before looking at any mapping.
    pub(super) fn advice_pages(&self, addr: u64, len: u64) -> Result<u64, Errno> {
        if !self.aligned(addr) {
            return bad(Errno::EINVAL);
        }
        let pages = self.len_pages(len).ok_or(Errno::EINVAL)?;
        if len != 0 && pages == 0 {
            return bad(Errno::EINVAL);
        }
        self.range_end(addr, pages).ok_or(Errno::EINVAL)?;
        Ok(pages)
    }

    /// The mapped pieces of `pages` pages from `addr` (clipped to the
    /// reservation; the part outside is a hole).
    pub(super) fn walk(&self, addr: u64, pages: u64) -> Walk {
        let mut w = self.walk_range(self.clip(addr, pages));
        w.outside = !self.in_reservation(addr, pages);
        w
    }

    /// The mapped pieces of `r`, a range inside the reservation.
    pub(super) fn walk_range(&self, r: PageRange) -> Walk {
        let mut at = r.start;
        let pieces = self
            .regions
            .overlapping(r)
            .into_iter()
            .map(|reg| {
                let seg = reg.range().intersect(&r);
                let hole_before = seg.start > at;
                at = seg.end;
                Piece { reg, seg, hole_before }
            })
            .collect();
        Walk { pieces, hole_after: at < r.end, outside: false }
    }
}
