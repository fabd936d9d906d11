//! Fault-around window policy: how many pages a fault fills or swaps in
//! around the touched one.
//!
//! `Core::fault_in` (`fault.rs`) asks these functions, per page state, and
//! grows the run it claims with `grow_run`. The rules: a populate takes the
//! largest window; a random or locked region, a shared anonymous one or
//! `exact_faults` take the touched page alone; a sequential region takes the
//! largest window; a normal one takes one page until three faults in a row
//! land where the last run ended (a streak), then blocks of `BLOCK_PAGES`
//! doubling up to `MAX_WINDOW_PAGES`, and any fills a whole block on a
//! second fault in it (`dense_block`); an anonymous write fault the
//! faulting thread resolves itself stops at `IN_THREAD_ZERO_WINDOW_PAGES`
//! (`Core::fault_in_thread`). A swap-in clusters up to
//! `SWAP_CLUSTER_PAGES` consecutive slots (and a stream reads ahead from
//! any slots, `swap_ahead.rs`). A read fault in a locked file
//! region maps Linux's fault-around window (`file_fault_around_block`).
//! Every window is bounded by the free frames, the region (or the populate
//! range), and any chunk being zapped.

use super::Core;
use crate::page::{PState, PageMeta, PageTable};
use crate::region::{Advice, LockMode, Region};
use crate::types::{PageIdx, PageRange};

/// Largest fault-around window, in pages.
pub const MAX_WINDOW_PAGES: u64 = 256;

/// Largest zero-fill window of an anonymous write fault the faulting thread
/// resolves itself (`Core::fault_in_thread`), in pages: half the largest,
/// because that thread fills all of it before the program goes on (a
/// handler wakes the program after the first piece). The full window made
/// every 256th page of a sequential writer a 0.25-0.6 ms stall while a
/// 4 GiB unmap ran beside it (docs/design.md, "Faults in the faulting thread").
pub const IN_THREAD_ZERO_WINDOW_PAGES: u64 = 128;

/// How far past the end of one of a region's swap-in streams a fault still
/// continues its stream, in pages: a walk over a structure part of which
/// stayed resident faults only on its swapped pages (a hash table dropped
/// at exit under 4× pressure: one page in eleven, gaps past 32 one in
/// twenty), and a page the stream skips (one whose swap copy kept its old
/// slot) is read on its own. Random faults land that near a stream's end
/// now and then; one that continues no stream takes a step off every
/// streak (`Region::follow_swap_stream`), so they seldom build one.
pub const STREAM_GAP_PAGES: u64 = 32;

/// Swap-in cluster for `MADV_NORMAL` regions, in pages.
pub const SWAP_CLUSTER_PAGES: u64 = 32;

/// Fault-around block for dense access in large regions, in pages.
pub const BLOCK_PAGES: u64 = 64;

/// Linux's `fault_around_bytes` (default 64 KiB): the aligned window a read
/// fault in a file mapping maps, and so locks in a lock-on-fault region.
pub const FAULT_AROUND_BYTES: u64 = 64 << 10;

/// Regions at least this large (pages) get blocks of `BLOCK_PAGES` on dense
/// access; smaller ones blocks of `SMALL_BLOCK_PAGES`.
pub const BLOCK_MIN_REGION_PAGES: u64 = 8192;

/// Dense-access block of a region smaller than `BLOCK_MIN_REGION_PAGES`, in
/// pages (64 KiB, Linux's `fault_around_bytes` and a 64 KiB mTHP): an
/// allocator's arena (CPython's pools of 16 KiB, a heap's slabs) touches a
/// page here and there in a block, then the rest of it; a fault per page
/// was most of what `usermm run` added to a program's start (CPython: 163
/// of 310 handler faults in its own arenas, 2 a block with the rule).
pub const SMALL_BLOCK_PAGES: u64 = 16;

/// Grows `run` backwards and forwards over untouched pages, within `block`
/// and up to `max` pages.
pub(super) fn grow_run(pages: &PageTable, run: &mut PageRange, block: PageRange, max: u64) {
    while run.start > block.start && run.pages() < max && pages.get(PageIdx(run.start.0 - 1)) == PageMeta::default() {
        run.start.0 -= 1;
    }
    while run.end < block.end && run.pages() < max && pages.get(run.end) == PageMeta::default() {
        run.end.0 += 1;
    }
}

/// How many consecutive swap slots a fault on swapped page `p` of `reg`
/// reads, and whether the run grows backwards from `p` (a populate takes
/// the largest window, forwards). Under normal advice the read-around pays
/// for itself: a fault just past either end of the region's last swap-in
/// run (within `STREAM_GAP_PAGES`: a stream, forwards or backwards) doubles
/// the window, 2, 4, … up to
/// `SWAP_CLUSTER_PAGES`, in the stream's direction; any other fault reads
/// the page alone, so random access reads no neighbour it will not use (a
/// fixed 32-slot cluster read 9.2× the kernel's pages on the `reclaim`
/// hot/cold workload). A program that walks its objects backwards (frees a
/// list from its end, say) streams as well as one that walks them forwards,
/// as the kernel's swap read-ahead follows the direction of the faults. A
/// region follows `SWAP_STREAMS` streams at once (a fault that continues
/// none starts one in place of the least recently used): CPython walking a
/// dict walks its table, its keys and its values in step. Returns the
/// stream, whose run the caller records (`Region::end_swap_stream`); past
/// `AHEAD_STREAK` the executor also reads ahead (`swap_ahead.rs`).
pub(super) fn swap_in_window(reg: &mut Region, p: PageIdx, populate: bool) -> (u64, bool, Option<usize>) {
    if populate {
        (MAX_WINDOW_PAGES, false, None)
    } else if reg.advice() == Advice::Random || reg.lock() != LockMode::None {
        (1, false, None)
    } else if reg.advice() == Advice::Sequential {
        (MAX_WINDOW_PAGES, false, None)
    } else {
        let (i, streak, backwards) = reg.follow_swap_stream(p, STREAM_GAP_PAGES);
        ((1u64 << streak.min(6)).min(SWAP_CLUSTER_PAGES), backwards, Some(i))
    }
}

/// How many untouched pages from `p` a fault in `reg` fills (a populate
/// takes the largest window; `exact` takes the page alone). Under normal
/// advice it advances the region's sequential streak: a fault where the
/// last run ended extends it, any other resets it.
pub(super) fn fault_around_window(reg: &mut Region, p: PageIdx, populate: bool, exact: bool) -> u64 {
    if populate {
        MAX_WINDOW_PAGES
    } else if exact || reg.lock() != LockMode::None {
        1
    } else {
        match reg.advice() {
            Advice::Random => 1,
            Advice::Sequential => MAX_WINDOW_PAGES,
            Advice::Normal => {
                let streak = reg.note_fault(p);
                if streak >= 3 {
                    (BLOCK_PAGES << (streak - 3).min(4)).min(MAX_WINDOW_PAGES)
                } else {
                    1
                }
            }
        }
    }
}

/// Dense access: a second fault in an aligned block (`BLOCK_PAGES` in a
/// large region, `SMALL_BLOCK_PAGES` in another) fills the block, as an
/// mTHP would. Returns the block around `p`, within `region`, if a page of
/// it is already live. (A first fault fills no more, even where the memory
/// below is live: a program's mapping that the space merged with its
/// neighbour must keep the kernel's residency after one touch — the
/// kernel's `mlock2-tests` check it.)
pub(super) fn dense_block(pages: &PageTable, p: PageIdx, region: PageRange) -> Option<PageRange> {
    let n = if region.pages() >= BLOCK_MIN_REGION_PAGES { BLOCK_PAGES } else { SMALL_BLOCK_PAGES };
    let b0 = (p.0 / n) * n;
    let block = PageRange::new(b0, b0 + n).intersect(&region);
    let mut seen = false;
    pages.for_each_live(block, |_, _| seen = true);
    seen.then_some(block)
}

/// The window Linux maps around a read fault at `p` in a file mapping
/// (`do_fault_around()`): it starts at the `FAULT_AROUND_BYTES`-aligned
/// block or the region's start, whichever is later, and keeps its length up
/// to the region's end or the page table's (512 entries).
pub(super) fn file_fault_around_block(p: PageIdx, region: PageRange, page_shift: u32) -> PageRange {
    let n = (FAULT_AROUND_BYTES >> page_shift).max(1);
    let from = ((p.0 / n) * n).max(region.start.0);
    let table_end = (p.0 / 512 + 1) * 512;
    PageRange::new(from, (from + n).min(table_end).min(region.end.0))
}

/// How many windows a streaming file region's read-in runs ahead of the
/// program's last fault (it takes no fault on windows read ahead, so that
/// is as far as its position is known).
pub const READAHEAD_DEPTH: u64 = 4;

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// A fault found page `p` busy. When `p` is being read in by a stream's
    /// read-ahead (a shared or private file region, sequential advice or a
    /// sequential streak, not locked), the window a handler thread may read
    /// instead of waiting idle for `p`: `[start, end)` from the next
    /// untouched page of the stream. Two windows are then read at once (the
    /// background thread's and this one), one per CPU. Notes where the
    /// program is (`reader_at`), which lets the read-ahead run on (the
    /// program takes no fault that fills in a stream read ahead of it).
    pub fn readahead_instead_of_wait(&mut self, p: PageIdx) -> Option<(PageIdx, PageIdx)> {
        if self.pages.get(p).state != PState::Filling {
            return None;
        }
        let reg = self.regions.find_mut(p)?;
        reg.file()?;
        let streaming = reg.advice() == Advice::Sequential || (reg.advice() == Advice::Normal && reg.streak() >= 3);
        if !streaming || reg.lock() != LockMode::None {
            return None;
        }
        reg.note_reader_at(p);
        let r = self.regions.find(p)?;
        let q = self.stream_next(r, PageIdx(p.0 + 1))?;
        Some((q, PageIdx(q.0 + self.readahead_window(q))))
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether page `p` is an untouched page of a region of `file`: where a
    /// streaming read of that file goes on.
    pub fn file_continues(&self, p: PageIdx, file: u32) -> bool {
        self.region_at(p).is_some_and(|r| r.file() == Some(file)) && self.page(p) == crate::page::PageMeta::default()
    }

    /// After a fault's file read of `run` (`installed` pages): where the
    /// background thread reads the next window, when a full window of a
    /// stream was read and the file goes on past it (the read-ahead
    /// pipeline: the next window is read while the program consumes this
    /// one).
    pub fn readahead_after_fault(&self, run: PageRange, installed: u64, file: u32) -> Option<PageIdx> {
        (installed == run.pages() && installed >= BLOCK_PAGES && self.file_continues(run.end, file)).then_some(run.end)
    }

    /// The pages of a background read-in window from `p`: up to
    /// `MAX_WINDOW_PAGES`, never past its region (the next one may be
    /// anonymous, or another file's) nor into a page read or being read
    /// (another thread's window: the read-in never waits for it).
    pub fn readahead_window(&self, p: PageIdx) -> u64 {
        let n = self.region_at(p).map_or(MAX_WINDOW_PAGES, |r| MAX_WINDOW_PAGES.min(r.range().end.0 - p.0));
        (0..n).find(|&i| i > 0 && self.pages.get(PageIdx(p.0 + i)) != PageMeta::default()).unwrap_or(n)
    }

    /// After a background read-in window `[here, next)` read in full: where
    /// the next window starts, if the stream goes on — the first untouched
    /// page of the same region from `next` on (a window read meanwhile by a
    /// handler, see `readahead_instead_of_wait`, is skipped), no more than
    /// `READAHEAD_DEPTH` windows past where the program was last seen.
    pub fn readahead_chains(&self, here: PageIdx, next: PageIdx) -> Option<PageIdx> {
        let r = self.region_at(here)?;
        r.file()?;
        self.stream_next(r, next)
    }

    /// The first untouched page of `r` from `from` on, skipping pages being
    /// read or already read, within `READAHEAD_DEPTH` windows of where the
    /// program was last seen in the region (its last fault, or a fault on
    /// a page being read ahead).
    fn stream_next(&self, r: &Region, from: PageIdx) -> Option<PageIdx> {
        let seen = r.last_seen();
        let limit = seen.saturating_add(READAHEAD_DEPTH * MAX_WINDOW_PAGES).min(r.range().end.0);
        let mut q = from.0;
        while q < limit {
            let m = self.pages.get(PageIdx(q));
            if m == PageMeta::default() {
                return Some(PageIdx(q));
            }
            if !matches!(m.state, PState::Filling | PState::Resident) {
                return None;
            }
            q += 1;
        }
        None
    }
}
