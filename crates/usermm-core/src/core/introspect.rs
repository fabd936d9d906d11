//! Introspection: `mincore`, `umm_page_state`, `umm_stats`, smaps' per-region
//! usage, and the busy-page query the executor waits on.
//!
//! Read-only: nothing here changes the state. `mincore` and `page_state`
//! walk the regions in address order and stop with `ENOMEM` at the first
//! hole, as Linux's `mincore` does, after filling the entries before it.

use super::{bad, Core, Stats, TASK_SIZE};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::{pf, PState, PageMeta};
use crate::types::{Addr, PageIdx, PageRange};

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether any page of the `pages` pages from `a` is being filled (or,
    /// with `any_busy`, is busy in any way).
    pub fn any_filling(&self, a: Addr, pages: u64, any_busy: bool) -> bool {
        let Some(p) = self.page_of(a) else { return false };
        let end = p.0.saturating_add(pages).min(self.cfg.reserve_pages);
        let mut busy = false;
        self.pages.for_each_live(PageRange::new(p.0, end), |_, m| {
            busy |= m.state == PState::Filling || (any_busy && m.state.busy())
        });
        busy
    }

    fn introspect_range(&self, addr: u64, pages: u64) -> Result<PageRange, Errno> {
        if !self.aligned(addr) {
            return bad(Errno::EINVAL);
        }
        if self.range_end(addr, pages).is_none_or(|e| e > TASK_SIZE) {
            return bad(Errno::ENOMEM);
        }
        Ok(self.clip(addr, pages))
    }

    /// `mincore`: one byte per page (bit 0: resident) up to the first hole,
    /// where it stops with `ENOMEM`. `out` must hold `ceil(len/page)` bytes.
    pub fn mincore(&self, addr: u64, len: u64, out: &mut [u8]) -> Result<(), Errno> {
        let pages = self.len_pages(len).ok_or(Errno::ENOMEM)?;
        // A poisoned page counts as present, as Linux's hwpoison entries do.
        self.walk_pages(addr, pages, |i, m| {
            out[i] = u8::from(m.state.holds_frame() || m.has(pf::POISONED));
        })
    }

    /// `umm_page_state`: one word of `UMM_PAGE_*` bits per page.
    pub fn page_state(&self, addr: u64, npages: u64, out: &mut [u32]) -> Result<(), Errno> {
        self.walk_pages(addr, npages, |i, m| out[i] = state_bits(m))
    }

    fn walk_pages(&self, addr: u64, pages: u64, mut f: impl FnMut(usize, PageMeta)) -> Result<(), Errno> {
        let r = self.introspect_range(addr, pages)?;
        if pages == 0 {
            return Ok(());
        }
        if r.is_empty() || self.addr_of(r.start).0 != addr {
            return bad(Errno::ENOMEM);
        }
        let mut i = 0usize;
        for p in self.walk_range(r).pieces {
            if p.hole_before {
                return bad(Errno::ENOMEM);
            }
            for q in p.seg.start.0..p.seg.end.0 {
                f(i, self.pages.get(PageIdx(q)));
                i += 1;
            }
        }
        if (i as u64) < pages {
            return bad(Errno::ENOMEM);
        }
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let n = self.pages.census();
        Stats {
            budget_pages: self.cfg.budget_pages,
            resident_pages: n.resident,
            resident_pages_max: self.pages.resident_max(),
            inactive_pages: n.inactive,
            locked_pages: n.locked,
            locked_charged_pages: self.locks.charged(),
            swapped_pages: n.swapped,
            lazyfree_pages: n.lazyfree,
            volatile_pages: n.volatile,
            swap_cached_pages: n.swap_cached,
            swap_fork_held_pages: self.swap.deferred(),
            regions: self.regions.len() as u64,
            counters: self.counters.clone(),
        }
    }

    /// Per-region page counts for smaps: (resident, swapped, lazily freed
    /// and resident, locked).
    pub fn region_usage(&self, r: PageRange) -> (u64, u64, u64, u64) {
        let (mut res, mut sw, mut lazy, mut locked) = (0, 0, 0, 0);
        self.pages.for_each_live(r, |_, m| {
            if m.state.holds_frame() {
                res += 1;
                lazy += u64::from(m.has(pf::LAZYFREE));
                locked += u64::from(m.has(pf::LOCKED));
            }
            if m.state == PState::Swapped {
                sw += 1;
            }
        });
        (res, sw, lazy, locked)
    }
}

/// The `UMM_PAGE_*` bits of a page.
pub fn state_bits(m: PageMeta) -> u32 {
    let mut b = 0;
    if m.state.holds_frame() {
        b |= UMM_PAGE_RESIDENT;
    }
    if m.state == PState::Inactive {
        b |= UMM_PAGE_INACTIVE;
    }
    if m.state == PState::Swapped {
        b |= UMM_PAGE_SWAPPED;
    }
    if m.has(pf::LOCKED) {
        b |= UMM_PAGE_LOCKED;
    }
    if m.has(pf::LAZYFREE) {
        b |= UMM_PAGE_LAZYFREE;
    }
    if m.has(pf::VOLATILE) {
        b |= UMM_PAGE_VOLATILE;
    }
    if m.has(pf::PURGED) {
        b |= UMM_PAGE_PURGED;
    }
    if m.has(pf::POISONED) {
        b |= UMM_PAGE_POISONED;
    }
    if m.state.holds_frame() {
        // Anonymous pages are dirty from their first fill (never backed by a
        // file); a clean-swap-cache optimisation would refine this.
        b |= UMM_PAGE_DIRTY;
    }
    b
}
