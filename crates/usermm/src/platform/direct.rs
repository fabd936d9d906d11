//! File windows mapped from the page cache: the ranges of a space where the
//! pages of a read-only shared file region, locked or read sequentially,
//! are the kernel's own page-cache pages instead of usermm's copies (see
//! docs/design.md, "File windows from the page cache").

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::ranges::{self, Parts};

/// The file windows of a space mapped from the page cache: `start -> end`
/// of each run of them (adjacent windows of one file merge into one host
/// mapping, as they do here).
pub(crate) struct DirectWindows {
    ranges: Mutex<BTreeMap<usize, usize>>,
    /// How many runs there are (read without the lock: most spaces have
    /// none, and every zap asks).
    runs: AtomicUsize,
    /// The most runs a space keeps (each is a host mapping, and splits the
    /// reservation's around it: `vm.max_map_count` bounds them all).
    cap: usize,
    /// The host refused such a mapping once (a lock limit, the map
    /// count): the space copies from then on, rather than asking again at
    /// every fault.
    refused: AtomicBool,
}

impl DirectWindows {
    pub(crate) fn new() -> DirectWindows {
        // A third of the process's mappings: a run and the gap after it
        // are two, and the rest of the process keeps room.
        let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(65_530);
        DirectWindows {
            ranges: Mutex::new(BTreeMap::new()),
            runs: AtomicUsize::new(0),
            cap: max / 3,
            refused: AtomicBool::new(false),
        }
    }

    fn ranges(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        self.ranges.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any window is mapped.
    pub(super) fn any(&self) -> bool {
        !self.ranges().is_empty()
    }

    /// Whether one more window may be mapped.
    pub(super) fn room(&self) -> bool {
        self.runs.load(Ordering::Relaxed) < self.cap && !self.refused.load(Ordering::Relaxed)
    }

    /// The host refused a mapping: no more are tried.
    pub(super) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }

    /// The windows' parts in `[a, a+l)`.
    pub(super) fn inside(&self, a: usize, l: usize) -> Parts {
        if self.runs.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        ranges::inside(&self.ranges(), a, a.saturating_add(l))
    }

    /// The parts of `[a, a+l)` not in the set.
    pub(super) fn outside(&self, a: usize, l: usize) -> Parts {
        let e = a.saturating_add(l);
        if self.runs.load(Ordering::Acquire) == 0 {
            return vec![(a, e)];
        }
        ranges::outside(&self.ranges(), a, e)
    }

    /// Records `[a, a+l)` as mapped from the page cache (`on`) or not.
    pub(super) fn record(&self, a: usize, l: usize, on: bool) {
        let mut m = self.ranges();
        ranges::record(&mut m, a, a.saturating_add(l), on);
        self.runs.store(m.len(), Ordering::Release);
    }
}
