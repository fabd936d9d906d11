//! Fault-around window policy: how many pages a fault fills or swaps in
//! around the touched one.
//!
//! The window itself is decided in `Core::fault_in` (`fault.rs`), per page
//! state and region advice; this module holds its bounds and the run-growing
//! helper. The rules: a populate takes the largest window; a random or
//! locked region, a shared anonymous one or `exact_faults` take the touched
//! page alone; a sequential region takes the largest window; a normal one
//! takes one page until three faults in a row land where the last run ended
//! (a streak), then blocks of `BLOCK_PAGES` doubling up to
//! `MAX_WINDOW_PAGES`. A swap-in clusters up to `SWAP_CLUSTER_PAGES`
//! consecutive slots. Every window is bounded by the free frames, the region
//! (or the populate range), and any chunk being zapped.

use crate::page::{PageMeta, PageTable};
use crate::types::{PageIdx, PageRange};

/// Largest fault-around window, in pages.
pub const MAX_WINDOW_PAGES: u64 = 256;

/// Swap-in cluster for `MADV_NORMAL` regions, in pages.
pub const SWAP_CLUSTER_PAGES: u64 = 32;

/// Fault-around block for dense access in large regions, in pages.
pub const BLOCK_PAGES: u64 = 64;

/// Linux's `fault_around_bytes` (default 64 KiB): the aligned window a read
/// fault in a file mapping maps, and so locks in a lock-on-fault region.
pub const FAULT_AROUND_BYTES: u64 = 64 << 10;

/// Regions at least this large (pages) get block fault-around on dense access.
pub const BLOCK_MIN_REGION_PAGES: u64 = 8192;

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
