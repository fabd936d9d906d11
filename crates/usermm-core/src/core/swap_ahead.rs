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

use super::window::{MAX_WINDOW_PAGES, SWAP_CLUSTER_PAGES};
use super::Core;
use crate::page::PState;
use crate::region::{Advice, LockMode};
use crate::types::{PageIdx, PageRange};

/// A stream reads ahead from this streak on (faults in a row that continued
/// it: the third fault of a walk).
pub const AHEAD_STREAK: u32 = 3;

/// The pages a read-ahead claimed (`Filling`), each with its slot, in
/// address order; `keep`: they keep their swap copies (installed
/// write-protected).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapAhead {
    pub pages: Vec<(PageIdx, u32)>,
    pub keep: bool,
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// After a fault's swap-in of `run` (installed in full): the swapped
    /// pages to read ahead past it, claimed, if the swap-in continued a
    /// forward stream long enough. The window scanned is
    /// `SWAP_CLUSTER_PAGES` at `AHEAD_STREAK`, doubling with the streak up
    /// to `MAX_WINDOW_PAGES`, past the run in the stream's direction.
    pub fn swap_ahead_plan(&mut self, run: PageRange) -> SwapAhead {
        let mut a = SwapAhead::default();
        let room = self.free_frames() / 2;
        let Some(reg) = self.regions.find_mut(run.start) else { return a };
        if room == 0 || reg.advice() != Advice::Normal || reg.lock() != LockMode::None {
            return a;
        }
        let Some((i, streak, backwards)) = reg.swap_stream_of(run) else { return a };
        if streak < AHEAD_STREAK {
            return a;
        }
        let window = (SWAP_CLUSTER_PAGES << (streak - AHEAD_STREAK).min(3)).min(MAX_WINDOW_PAGES);
        let span = reg.range();
        let ahead = if backwards {
            PageRange { start: PageIdx(run.start.0.saturating_sub(window).max(span.start.0)), end: run.start }
        } else {
            PageRange { start: run.end, end: PageIdx((run.end.0 + window).min(span.end.0)) }
        };
        // Scanned from the run outwards, up to the room; `reach`: the first
        // page past what was scanned, in the stream's direction.
        let mut reach = if backwards { ahead.end.0 } else { ahead.start.0 };
        let mut at = |q: u64| {
            let p = PageIdx(q);
            let m = self.pages.get(p);
            if m.state == PState::Swapped && !self.in_flight(p, &m) {
                a.pages.push((p, m.slot));
            }
            (a.pages.len() as u64) < room
        };
        if backwards {
            for q in (ahead.start.0..ahead.end.0).rev() {
                reach = q;
                if !at(q) {
                    break;
                }
            }
            a.pages.reverse();
        } else {
            for q in ahead.start.0..ahead.end.0 {
                reach = q + 1;
                if !at(q) {
                    break;
                }
            }
        }
        // The marker: the middle page of those found stays swapped, and the
        // program's fault there continues the stream and reads the next
        // window while the program uses the rest of this one (Linux's
        // `PG_readahead`). With fewer than two pages, the stream goes on
        // past what was scanned.
        let marker = (a.pages.len() >= 2).then(|| a.pages.remove(a.pages.len() / 2).0);
        let seen = match (marker, backwards) {
            (Some(m), false) => PageRange { start: run.start, end: m },
            (Some(m), true) => PageRange { start: PageIdx(m.0 + 1), end: run.end },
            (None, false) => PageRange { start: run.start, end: PageIdx(reach) },
            (None, true) => PageRange { start: PageIdx(reach), end: run.end },
        };
        if let Some(reg) = self.regions.find_mut(run.start) {
            reg.end_swap_stream(i, seen);
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
}
