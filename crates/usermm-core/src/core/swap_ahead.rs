//! Swap read-ahead of a stream: after a fault's swap-in that continues a
//! forward stream (`swap_in_window`), the swapped pages of the window past
//! it are read too, from whatever slots they sit in, while the program goes
//! on — Linux's VMA-based swap read-ahead (`swap_vma_readahead`), which
//! reads the swap entries of the page-table neighbours rather than the
//! slot neighbours.
//!
//! Why: pages of one structure are evicted at different times, so their
//! slots scatter; a walk over it (a hash table dropped at exit, a list
//! traversed) faults on every swapped page one at a time, a fault and a
//! read (~100 µs) each, while the consecutive-slot cluster reads nothing
//! more. The read-ahead reads the window's swapped pages in one batch after
//! the faulting thread is woken (the executor's `swap_ahead`).
//!
//! Bounds: only a region with normal advice and no lock, only after
//! `AHEAD_STREAK` faults in a row continued the stream (random access
//! reads nothing ahead), at most half the free frames (a read-ahead never
//! makes reclaim run), and no page being worked on.

use super::window::SWAP_CLUSTER_PAGES;
use super::{Core, FaultPlan};
use crate::page::{pf, PState};
use crate::region::{Advice, LockMode};
use crate::types::{PageIdx, PageRange};

/// A stream reads ahead from this streak on (faults in a row that continued
/// it: the third fault of a walk).
pub const AHEAD_STREAK: u32 = 3;

/// The widest read-ahead window, in pages scanned: 4 MiB, ~90 swapped
/// pages of a hash table one page in eleven of which is swapped (each
/// window costs the program one fault, on its marker).
pub const AHEAD_MAX_PAGES: u64 = 256;

/// The pages a read-ahead claimed (`Filling`), each with its slot, in
/// address order; `keep`: they keep their swap copies (installed
/// write-protected); `backwards`: the stream runs downwards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapAhead {
    pub pages: Vec<(PageIdx, u32)>,
    pub keep: bool,
    pub backwards: bool,
    /// The window's parked pages, each claimed as a `Reactivate` plan: the
    /// executor maps them back with a move (`Core::swap_ahead_unparked`),
    /// instead of a fault each as the walk reaches them.
    pub parked: Vec<FaultPlan>,
}

impl SwapAhead {
    /// The plan in two: the `n` pages nearest the fault that started it,
    /// which the program reaches first, and the rest (each committed on
    /// its own, `Core::swap_ahead_done`).
    pub fn split_nearest(mut self, n: usize) -> (SwapAhead, SwapAhead) {
        let n = n.min(self.pages.len());
        let (near, far) = if self.backwards {
            let near = self.pages.split_off(self.pages.len() - n);
            (near, std::mem::take(&mut self.pages))
        } else {
            let far = self.pages.split_off(n);
            (std::mem::take(&mut self.pages), far)
        };
        let part = |pages| SwapAhead { pages, keep: self.keep, backwards: self.backwards, parked: Vec::new() };
        (part(near), part(far))
    }
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// After a fault's swap-in of `run` (installed in full): the swapped
    /// pages to read ahead past it, claimed, and the window's parked pages,
    /// if the swap-in continued a stream (either way) long enough. The
    /// window scanned is `SWAP_CLUSTER_PAGES` at `AHEAD_STREAK`, doubling
    /// with the streak up to `AHEAD_MAX_PAGES`, past the run in the
    /// stream's direction.
    pub fn swap_ahead_plan(&mut self, run: PageRange) -> SwapAhead {
        let mut a = SwapAhead::default();
        let room = self.free_frames() / 2;
        let Some(reg) = self.regions.find_mut(run.start) else { return a };
        if reg.advice() != Advice::Normal || reg.lock() != LockMode::None {
            return a;
        }
        let Some((i, streak, backwards)) = reg.swap_stream_of(run) else { return a };
        if streak < AHEAD_STREAK {
            return a;
        }
        let window = (SWAP_CLUSTER_PAGES << (streak - AHEAD_STREAK).min(3)).min(AHEAD_MAX_PAGES);
        let (span, kind, prot) = (reg.range(), reg.kind(), reg.prot());
        let how = self.transfer_by(kind, prot);
        let ahead = if backwards {
            PageRange { start: PageIdx(run.start.0.saturating_sub(window).max(span.start.0)), end: run.start }
        } else {
            PageRange { start: run.end, end: PageIdx((run.end.0 + window).min(span.end.0)) }
        };
        // Scanned from the run outwards; `reach`: where the stream goes on
        // (the first swapped page past the room, else the window's end).
        let mut reach = if backwards { ahead.start.0 } else { ahead.end.0 };
        let mut parked = Vec::new();
        let order: Box<dyn Iterator<Item = u64>> =
            if backwards { Box::new((ahead.start.0..ahead.end.0).rev()) } else { Box::new(ahead.start.0..ahead.end.0) };
        for q in order {
            let p = PageIdx(q);
            let m = self.pages.get(p);
            if m.state == PState::Swapped && !self.in_flight(p, &m) {
                if a.pages.len() as u64 >= room {
                    reach = if backwards { q + 1 } else { q };
                    break;
                }
                a.pages.push((p, m.slot));
            }
            // (As pressure's end takes them: `unpark_plan`.)
            if m.state == PState::Inactive
                && m.flags & (pf::LOCKED | pf::VOLATILE | pf::LAZYFREE) == 0
                && !self.zaps.zapping_at(p)
                && !self.zaps.paging_out_at(p)
            {
                parked.push((p, m));
            }
        }
        if backwards {
            a.pages.reverse();
        }
        // The marker: the middle page of those found stays swapped, and the
        // program's fault there continues the stream and reads the next
        // window while the program uses the rest of this one (Linux's
        // `PG_readahead`). With fewer than two pages, the stream goes on
        // past what was scanned.
        let marker = (a.pages.len() >= 2).then(|| a.pages.remove(a.pages.len() / 2).0);
        if a.pages.is_empty() && parked.is_empty() {
            return a;
        }
        let seen = match (marker, backwards) {
            (Some(m), false) => PageRange { start: run.start, end: m },
            (Some(m), true) => PageRange { start: PageIdx(m.0 + 1), end: run.end },
            (None, false) => PageRange { start: run.start, end: PageIdx(reach) },
            (None, true) => PageRange { start: PageIdx(reach), end: run.end },
        };
        if let Some(reg) = self.regions.find_mut(run.start) {
            reg.end_swap_stream(i, seen);
        }
        a.backwards = backwards;
        for (p, m) in parked {
            self.pages.update(p, |m| m.state = PState::Filling);
            // A page with a swap copy comes back write-protected, as a read
            // fault would bring it.
            let wp = m.cache != 0;
            a.parked.push(FaultPlan::Reactivate { page: p, slot: m.slot, how, checked: false, wp });
        }
        let Some(&(first, _)) = a.pages.first() else { return a };
        // Read ahead, the pages keep their copies where the region's do pay
        // (the faults' probes keep that verdict current; a read-ahead,
        // one for many pages, takes no probe of its own).
        a.keep = self.may_keep_swap_copy(first) && self.regions.find(first).is_some_and(|r| r.copies_pay());
        self.claim_frames(a.pages.len() as u64);
        for &(p, _) in &a.pages {
            self.pages.update(p, |m| m.state = PState::Filling);
        }
        a
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Commits a read-ahead: `installed[i]` says whether page `i` of the
    /// plan went in; the others are swapped as before (a read error here is
    /// nobody's fault yet: a touch of the page reads it again, and reports).
    pub fn swap_ahead_done(&mut self, a: &SwapAhead, installed: &[bool]) {
        let mut n = 0;
        for (k, &(p, slot)) in a.pages.iter().enumerate() {
            if installed.get(k).copied().unwrap_or(false) {
                self.commit_swapped_in(p, slot, a.keep);
                n += 1;
            } else {
                self.pages.update(p, |m| m.state = PState::Swapped);
            }
        }
        self.counters.swapins += n;
        self.counters.swap_ahead += n;
    }

    /// Commits the parked pages of a read-ahead (`SwapAhead::parked`),
    /// each with the pages its move installed (0 or 1): a page mapped back
    /// is resident again, as a swap-in would leave it, with no use counted
    /// (counted in `unparked`); one not mapped back stays parked.
    pub fn swap_ahead_unparked(&mut self, done: &[(FaultPlan, u64)]) {
        for (plan, installed) in done {
            let FaultPlan::Reactivate { page, slot, wp, .. } = *plan else { continue };
            if !self.mapped_back(page, slot, wp, *installed) {
                continue;
            }
            self.note_resident(page);
            self.counters.unparked += 1;
        }
    }
}
