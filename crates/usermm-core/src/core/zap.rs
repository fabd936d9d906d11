//! Zap: dropping the pages of a range (munmap's second phase, a `MAP_FIXED`
//! replacement, `MADV_DONTNEED` and friends).
//!
//! `zap_begin` claims every page of the range (`Zapping`) and records the
//! chunk as being zapped (`Zaps`, `zaps.rs`), so that a fault in it waits
//! instead of filling a page the host is about to drop; it refuses
//! (`Err(Busy)`) while a page is busy. The executor drops the frames, then
//! `zap_end` forgets the pages, releases their slots and uncharges them.
//! Invariant: every page of a chunk being zapped is settled or `Zapping`.
//! A zap cannot fail by construction: it only drops.

use super::{Busy, Core, ZapClaim};
use crate::page::{pf, PState, PageMeta};
use crate::types::PageRange;

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Claims the pages of `r` for dropping, or `Err(Busy)`: a page is
    /// busy, wait and call again.
    pub fn zap_begin(&mut self, r: PageRange) -> Result<ZapClaim, Busy> {
        let live = self.pages.live_in(r);
        if live.iter().any(|(_, m)| m.state.busy()) {
            return Err(Busy);
        }
        self.zaps.begin(r);
        let mut claim = ZapClaim { range: r, staging: Vec::new(), mapped: false };
        for (p, m) in live {
            if m.has(pf::POISONED) || m.has(pf::PURGED) {
                // The poison marker must go with the page.
                claim.mapped = true;
            }
            match m.state {
                PState::Resident => {
                    claim.mapped = true;
                    self.pages.update(p, |m| m.state = PState::Zapping);
                }
                PState::Inactive => {
                    claim.staging.push(m.slot);
                    self.pages.update(p, |m| m.state = PState::Zapping);
                }
                _ => {}
            }
        }
        Ok(claim)
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Drops the pages of a claim: the executor has dropped the frames.
    pub fn zap_end(&mut self, c: &ZapClaim) {
        self.zaps.end(c.range);
        for (p, m) in self.pages.live_in(c.range) {
            self.uncache(p);
            match m.state {
                PState::Zapping | PState::Absent => {}
                PState::Swapped => self.swap.free_slot(m.slot),
                s => panic!("zap_end: page {p:?} in state {s:?}"),
            }
            self.pages.set(p, PageMeta::default());
        }
        self.maybe_compact(2 * c.range.pages().div_ceil(512) as usize);
        for &s in &c.staging {
            self.staging.release(s);
        }
    }
}
