//! Regions (the VMA analogue) and the region tree.
//!
//! Invariants (checked by `RegionTree::validate`):
//! - regions are non-empty, sorted and never overlap;
//! - two adjacent regions that could merge are merged (as Linux's
//!   `vma_merge` does for anonymous memory), so the region count is the one
//!   Linux would have;
//! - the count never exceeds the limit the caller enforces (`max_regions`);
//! - a region's object matches its kind (`Region::validate`).
//!
//! A region's fields are private to this module: the core reads them
//! through accessors and changes them only through `Region`'s named
//! mutators (`set_prot`, `set_lock`, `set_advice`, the fault-streaming
//! and swap-copy bookkeeping), reached by `RegionTree::find_mut`; ranges
//! change only by the tree's splits and merges.

use std::collections::BTreeMap;

use crate::consts::*;
use crate::types::{PageIdx, PageRange};

/// What backs a region.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `MAP_PRIVATE|MAP_ANONYMOUS`.
    AnonPrivate,
    /// `MAP_SHARED|MAP_ANONYMOUS`: within one process it behaves as private
    /// memory, except that `MADV_DONTNEED` keeps the data (shmem semantics) and
    /// `MADV_FREE` is refused.
    AnonShared,
    /// `MAP_SHARED` of a file: read from the file on fault, written back on
    /// reclaim, msync, munmap and close.
    FileShared,
    /// `MAP_PRIVATE` of a file: read from the file on fault; written pages
    /// stay private (they go to swap, never to the file).
    FilePrivate,
}

/// The `object` of a file region: this bit plus the executor's file id.
pub const FILE_OBJECT: u64 = 1 << 63;

/// Access-pattern advice (`VM_RAND_READ` / `VM_SEQ_READ`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Advice {
    Normal,
    Random,
    Sequential,
}

/// Lock mode of a region (`VM_LOCKED`, `VM_LOCKONFAULT`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum LockMode {
    None,
    Locked,
    OnFault,
}

/// A region: its fields are private to this module, read through
/// accessors and changed only by the named mutators below (the core's
/// changes: protection, lock mode, advice, the streaming and swap-copy
/// bookkeeping of its faults); splits and merges are the tree's.
#[derive(Clone, Debug)]
pub struct Region {
    range: PageRange,
    prot: i32,
    kind: Kind,
    advice: Advice,
    noreserve: bool,
    lock: LockMode,
    /// `MADV_DONTFORK` (a forked child has no copy: Linux's `VM_DONTCOPY`)
    /// and `MADV_WIPEONFORK` (the child's copy reads zeros) until
    /// `MADV_DOFORK`/`MADV_KEEPONFORK`.
    dontfork: bool,
    wipeonfork: bool,
    /// `mseal(2)`ed (Linux's `VM_SEALED`): `munmap`, `mremap`, `mprotect`,
    /// `MAP_FIXED` over it and discarding advice on its read-only
    /// anonymous memory are `EPERM`; never cleared, kept by a fork.
    sealed: bool,
    /// Identity of the shared object (shared anonymous memory); 0 for private.
    object: u64,
    /// Offset of `range.start` in the object, in pages (smaps' offset column).
    pgoff: u64,
    /// Streaming detection: the page a sequential reader would fault next.
    next_fault: u64,
    /// Streaming detection: consecutive faults that hit `next_fault`.
    streak: u32,
    /// Read-ahead: the page where the program was last seen waiting for a
    /// page being read ahead, since its last fault that filled (it takes no
    /// fault on pages read ahead, so this and `next_fault` are all that is
    /// known of its position); 0 when none.
    reader_at: u64,
    /// Swap-in read-around: the region's last few swap-in streams (see
    /// `window::swap_in_window`).
    swap_streams: [SwapStream; SWAP_STREAMS],
    /// Whether `PROT_WRITE` may be set (false for a shared mapping of a
    /// descriptor not open for writing: mprotect says EACCES).
    may_write: bool,
    /// Its faults are resolved in the faulting thread (`UMM_MAP_INTHREAD`):
    /// a kernel-mode access to a page not resident is `EFAULT`, so its
    /// swap-ins are never installed write-protected.
    in_thread: bool,
    /// Its pages are the host's (`Core::hand_to_host`): a shared anonymous
    /// region a fork left shared, a `MAP_SHARED` mapping of host memory
    /// that no userfaultfd serves; the core keeps its attributes, no page.
    host: bool,
    /// Whether keeping swap copies pays here (`swapcache.rs`).
    copies: CopyFeedback,
}

/// The attributes `mmap` gives a new region ([`Region::new`]); the
/// streaming and swap-copy bookkeeping starts afresh.
#[derive(Clone, Copy, Debug)]
pub struct RegionAttrs {
    pub prot: i32,
    pub kind: Kind,
    pub noreserve: bool,
    pub lock: LockMode,
    /// Identity of the shared object (see [`Region::object`]).
    pub object: u64,
    /// Offset of the region's start in the object, in pages.
    pub pgoff: u64,
    pub may_write: bool,
    pub in_thread: bool,
}

/// What became of a region's swap copies lately: written (a WP fault, an
/// extra trip to the handler) or evicted clean (a write saved). Both halve
/// once they sum to [`CopyFeedback::WINDOW`], so that the verdict follows
/// the program's phases; `probe` counts swap-ins not protected since the
/// last one that was (see `Core::keeps_swap_copy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyFeedback {
    written: u32,
    clean: u32,
    probe: u32,
}

impl CopyFeedback {
    /// Outcomes remembered before both counts halve.
    pub const WINDOW: u32 = 1024;
    /// A copy written costs the program this many times what a copy
    /// evicted clean saves it: a WP fault is a round trip to the handler
    /// (SQLite under `usermm run`: 0.2 s for 4,700 of them, 42 µs each),
    /// a saved write is a 4 KiB share of a batched `pwritev` and the delay
    /// it adds to reads queued behind it (about 5–10 µs here).
    pub const WRITE_COST: u32 = 4;
    /// Swap-ins with copies off between two that keep them anyway, so that
    /// the verdict can change.
    pub const PROBE_EVERY: u32 = 16;

    /// Whether copies pay: no more than `WRITE_COST` written per clean
    /// eviction (true with nothing known yet).
    pub fn pays(&self) -> bool {
        self.written <= self.clean.saturating_mul(Self::WRITE_COST)
    }

    /// Whether the next swap-in keeps its swap copy: when copies pay, and
    /// for one swap-in in `PROBE_EVERY` when they do not.
    pub fn keep_next(&mut self) -> bool {
        if self.pays() || self.probe + 1 >= Self::PROBE_EVERY {
            self.probe = 0;
            true
        } else {
            self.probe += 1;
            false
        }
    }

    /// A swap copy was written (`true`) or evicted clean.
    pub fn note(&mut self, written: bool) {
        if written {
            self.written += 1;
        } else {
            self.clean += 1;
        }
        if self.written + self.clean >= Self::WINDOW {
            self.written /= 2;
            self.clean /= 2;
        }
    }
}

/// How many swap-in streams a region follows at once: a program walking
/// several structures of one heap in step (a hash table and the objects it
/// points to) interleaves their faults.
pub const SWAP_STREAMS: usize = 4;

/// One swap-in stream of a region: where its last run ended and started,
/// how many faults in a row landed just past one end, whether it runs
/// backwards, and when it was last used (`window::swap_in_window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapStream {
    next: u64,
    back: u64,
    streak: u32,
    backwards: bool,
    used: u32,
}

impl Default for SwapStream {
    fn default() -> SwapStream {
        SwapStream { next: u64::MAX, back: u64::MAX, streak: 0, backwards: false, used: 0 }
    }
}

impl Region {
    /// A new region over `range`.
    pub fn new(range: PageRange, a: RegionAttrs) -> Region {
        Region {
            range,
            prot: a.prot,
            kind: a.kind,
            advice: Advice::Normal,
            dontfork: false,
            wipeonfork: false,
            sealed: false,
            noreserve: a.noreserve,
            lock: a.lock,
            object: a.object,
            pgoff: a.pgoff,
            next_fault: u64::MAX,
            streak: 0,
            reader_at: 0,
            swap_streams: Default::default(),
            may_write: a.may_write,
            in_thread: a.in_thread,
            host: false,
            copies: Default::default(),
        }
    }

    pub fn range(&self) -> PageRange {
        self.range
    }
    pub fn prot(&self) -> i32 {
        self.prot
    }
    pub fn kind(&self) -> Kind {
        self.kind
    }
    pub fn advice(&self) -> Advice {
        self.advice
    }
    pub fn noreserve(&self) -> bool {
        self.noreserve
    }
    pub fn lock(&self) -> LockMode {
        self.lock
    }
    /// Identity of the shared object (shared anonymous memory, or
    /// `FILE_OBJECT` and the file id); 0 for private anonymous memory.
    pub fn object(&self) -> u64 {
        self.object
    }
    /// Offset of the region's start in its object, in pages.
    pub fn pgoff(&self) -> u64 {
        self.pgoff
    }
    /// Whether `PROT_WRITE` may be set.
    pub fn may_write(&self) -> bool {
        self.may_write
    }
    /// Whether its faults are resolved in the faulting thread.
    pub fn in_thread(&self) -> bool {
        self.in_thread
    }
    /// Whether its pages are the host's (shared with a forked process).
    pub fn host(&self) -> bool {
        self.host
    }
    /// Its pages become the host's (`Core::hand_to_host`).
    pub(crate) fn set_host(&mut self) {
        self.host = true;
    }
    /// Consecutive faults that hit where the last run ended (streaming
    /// detection, normal advice).
    pub fn streak(&self) -> u32 {
        self.streak
    }
    /// Where the program was last seen in the region: its last fault that
    /// filled, or a wait on a page being read ahead.
    pub fn last_seen(&self) -> u64 {
        self.next_fault.max(self.reader_at)
    }
    /// What became of the region's swap copies lately.
    pub fn copies(&self) -> CopyFeedback {
        self.copies
    }

    pub(crate) fn set_prot(&mut self, prot: i32) {
        self.prot = prot;
    }
    /// Sets the lock mode; returns the old one.
    pub(crate) fn set_lock(&mut self, mode: LockMode) -> LockMode {
        std::mem::replace(&mut self.lock, mode)
    }
    /// `MADV_DONTFORK` (`dontfork`, true) or `MADV_WIPEONFORK` (false)
    /// set or cleared (`on`).
    pub(crate) fn set_fork_advice(&mut self, dontfork: bool, on: bool) {
        if dontfork {
            self.dontfork = on;
        } else {
            self.wipeonfork = on;
        }
    }

    /// Whether a forked child gets no copy of the region (`MADV_DONTFORK`).
    pub fn dontfork(&self) -> bool {
        self.dontfork
    }

    /// Whether a forked child's copy reads zeros (`MADV_WIPEONFORK`).
    pub fn wipeonfork(&self) -> bool {
        self.wipeonfork
    }

    /// Whether the region is sealed (`mseal`).
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    /// Seals the region (`mseal`; irreversible).
    pub(crate) fn seal(&mut self) {
        self.sealed = true;
    }

    /// Sets the advice; the sequential streak starts over.
    pub(crate) fn set_advice(&mut self, advice: Advice) {
        self.advice = advice;
        self.streak = 0;
    }

    /// A fault at `p` under normal advice: the streak grows when `p` is
    /// where the last run ended, and starts over otherwise. Returns it.
    pub(crate) fn note_fault(&mut self, p: PageIdx) -> u32 {
        if p.0 == self.next_fault {
            self.streak = self.streak.saturating_add(1);
        } else {
            self.streak = 0;
        }
        self.streak
    }
    /// A fault (not a populate) filled `run`: a sequential reader faults
    /// next at its end; the program is no longer waiting on read-ahead.
    pub(crate) fn note_filled(&mut self, run: PageRange) {
        self.next_fault = run.end.0;
        self.reader_at = 0;
    }
    /// The program waits for page `p`, being read ahead.
    pub(crate) fn note_reader_at(&mut self, p: PageIdx) {
        self.reader_at = p.0;
    }

    /// The swap-in stream a fault on swapped page `p` continues (one whose
    /// last run ends within `gap` pages of `p`, forwards or backwards), or
    /// a new one in place of the least recently used. Returns the stream's
    /// index, its streak (faults in a row that continued it) and whether
    /// it runs backwards; `end_swap_stream` records the run it reads.
    pub(crate) fn follow_swap_stream(&mut self, p: PageIdx, gap: u64) -> (usize, u32, bool) {
        let clock = self.swap_streams.iter().map(|s| s.used).max().unwrap_or(0).wrapping_add(1);
        let continues = |s: &SwapStream| {
            let forwards = p.0 >= s.next && p.0 - s.next < gap;
            let backwards = s.back != u64::MAX && p.0 < s.back && s.back - p.0 <= gap;
            (forwards, backwards)
        };
        let found = self.swap_streams.iter().position(|s| {
            let (f, b) = continues(s);
            f || b
        });
        let i = found.unwrap_or_else(|| (0..SWAP_STREAMS).min_by_key(|&i| self.swap_streams[i].used).unwrap_or(0));
        if found.is_none() {
            // A fault that continues no stream takes one from every
            // streak: random faults that now and then land just past a
            // stream's end (the gap is wide) never build one up, while a
            // walk whose faults (nearly) all continue one of the region's
            // streams keeps its own.
            for o in self.swap_streams.iter_mut() {
                o.streak = o.streak.saturating_sub(1);
            }
        }
        let s = &mut self.swap_streams[i];
        let (forwards, backwards) = continues(s);
        if found.is_some() {
            s.streak = s.streak.saturating_add(1);
            s.backwards = backwards && !forwards;
        } else {
            *s = SwapStream::default();
        }
        s.used = clock;
        (i, s.streak, s.backwards)
    }
    /// The swap-in stream whose last run was `run` (it ended there going
    /// forwards, or started there going backwards): its index, streak and
    /// direction (`true`: backwards).
    pub(crate) fn swap_stream_of(&self, run: PageRange) -> Option<(usize, u32, bool)> {
        let i =
            self.swap_streams.iter().position(
                |s| {
                    if s.backwards {
                        s.back == run.start.0
                    } else {
                        s.next == run.end.0
                    }
                },
            )?;
        let s = &self.swap_streams[i];
        Some((i, s.streak, s.backwards))
    }
    /// Stream `i` (`follow_swap_stream`) read `run`.
    pub(crate) fn end_swap_stream(&mut self, i: usize, run: PageRange) {
        self.swap_streams[i].next = run.end.0;
        self.swap_streams[i].back = run.start.0;
    }

    /// Whether the next swap-in keeps its swap copy (`CopyFeedback::keep_next`).
    /// Whether the region's swap copies pay (`CopyFeedback::pays`), without
    /// counting a probe.
    pub(crate) fn copies_pay(&self) -> bool {
        self.copies.pays()
    }
    pub(crate) fn keep_copy(&mut self) -> bool {
        self.copies.keep_next()
    }
    /// One of the region's swap copies was written (`true`) or evicted clean.
    pub(crate) fn note_copy(&mut self, written: bool) {
        self.copies.note(written);
    }

    /// The executor's file id, for a file region.
    pub fn file(&self) -> Option<u32> {
        matches!(self.kind, Kind::FileShared | Kind::FilePrivate).then_some((self.object & !FILE_OBJECT) as u32)
    }
    /// The file page that backs page `p` of the region.
    pub fn file_page(&self, p: PageIdx) -> u64 {
        self.pgoff + (p.0 - self.range.start.0)
    }
}

impl Region {
    /// Whether `self` followed by `next` may become one region.
    pub fn can_merge(&self, next: &Region) -> bool {
        self.range.end == next.range.start
            && self.prot == next.prot
            && self.kind == next.kind
            && self.advice == next.advice
            && self.dontfork == next.dontfork
            && self.wipeonfork == next.wipeonfork
            && self.sealed == next.sealed
            && self.noreserve == next.noreserve
            && self.lock == next.lock
            && self.in_thread == next.in_thread
            && self.host == next.host
            && self.object == next.object
            && (self.object == 0 || self.pgoff + self.range.pages() == next.pgoff)
    }

    fn split_off(&mut self, at: PageIdx) -> Region {
        debug_assert!(self.range.start < at && at < self.range.end);
        let mut tail = self.clone();
        tail.range.start = at;
        tail.pgoff = self.pgoff + (at.0 - self.range.start.0);
        self.range.end = at;
        tail
    }

    pub fn writable(&self) -> bool {
        self.prot & PROT_WRITE != 0
    }

    /// Asserts the region's own invariants: private anonymous memory has
    /// no object, shared anonymous memory one of its own, and a file
    /// region its file's (`FILE_OBJECT` and the file id).
    fn validate(&self) {
        let file = matches!(self.kind, Kind::FileShared | Kind::FilePrivate);
        assert_eq!(self.object == 0, self.kind == Kind::AnonPrivate, "object of {:?} {:?}", self.kind, self.range);
        assert_eq!(self.object & FILE_OBJECT != 0, file, "object of {:?} {:?}", self.kind, self.range);
    }
}

pub struct RegionTree {
    map: BTreeMap<u64, Region>,
    /// The identity the next shared anonymous object gets (never 0, which
    /// is private memory's `object`).
    next_object: u64,
}

impl Default for RegionTree {
    fn default() -> RegionTree {
        RegionTree { map: BTreeMap::new(), next_object: 1 }
    }
}

impl RegionTree {
    /// A new identity for a shared anonymous object (a region's `object`):
    /// regions of different objects never merge.
    pub(crate) fn new_object(&mut self) -> u64 {
        let o = self.next_object;
        self.next_object += 1;
        o
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Region> {
        self.map.values()
    }

    /// The region containing `p`.
    pub fn find(&self, p: PageIdx) -> Option<&Region> {
        self.map.range(..=p.0).next_back().map(|(_, r)| r).filter(|r| r.range.contains(p))
    }

    /// The region containing `p`, to change through its mutators.
    pub(crate) fn find_mut(&mut self, p: PageIdx) -> Option<&mut Region> {
        self.map.range_mut(..=p.0).next_back().map(|(_, r)| r).filter(|r| r.range.contains(p))
    }

    /// The regions overlapping `r`, in address order.
    pub fn overlapping(&self, r: PageRange) -> Vec<Region> {
        let mut v = Vec::new();
        if let Some(first) = self.find(r.start) {
            if first.range.start < r.start {
                v.push(first.clone());
            }
        }
        v.extend(self.map.range(r.start.0..r.end.0).map(|(_, reg)| reg.clone()));
        v
    }

    /// How many regions a split at `at` would add (0 or 1).
    pub fn split_cost(&self, at: PageIdx) -> usize {
        match self.find(at) {
            Some(r) if r.range.start < at => 1,
            _ => 0,
        }
    }

    /// Splits the region containing `at` so that a region starts at `at`.
    pub fn split_at(&mut self, at: PageIdx) {
        let key = match self.find(at) {
            Some(r) if r.range.start < at => r.range.start.0,
            _ => return,
        };
        let tail = self.map.get_mut(&key).expect("found").split_off(at);
        self.map.insert(at.0, tail);
    }

    /// Removes and returns the regions inside `r` (the caller split first).
    pub fn remove_range(&mut self, r: PageRange) -> Vec<Region> {
        let keys: Vec<u64> = self.map.range(r.start.0..r.end.0).map(|(k, _)| *k).collect();
        keys.into_iter()
            .map(|k| {
                let reg = self.map.remove(&k).expect("key");
                debug_assert!(reg.range.end <= r.end);
                reg
            })
            .collect()
    }

    pub fn insert(&mut self, reg: Region) {
        debug_assert!(!reg.range.is_empty());
        let prev = self.map.insert(reg.range.start.0, reg);
        debug_assert!(prev.is_none());
    }

    /// Merges every mergeable neighbour pair that touches `r` (including the
    /// regions just outside it).
    pub fn merge_around(&mut self, r: PageRange) {
        let lo = self.map.range(..r.start.0).next_back().map(|(k, _)| *k).unwrap_or(r.start.0);
        let mut key = lo;
        loop {
            let Some(cur) = self.map.get(&key) else {
                match self.map.range(key..).next() {
                    Some((k, _)) if *k <= r.end.0 => {
                        key = *k;
                        continue;
                    }
                    _ => return,
                }
            };
            let end = cur.range.end.0;
            if end > r.end.0 {
                return;
            }
            match self.map.get(&end) {
                Some(next) if cur.can_merge(next) => {
                    let next = self.map.remove(&end).expect("next");
                    let cur = self.map.get_mut(&key).expect("cur");
                    cur.range.end = next.range.end;
                }
                Some(_) => key = end,
                None => match self.map.range(end..).next() {
                    Some((k, _)) if *k <= r.end.0 => key = *k,
                    _ => return,
                },
            }
        }
    }

    /// Whether any region overlaps `r`.
    pub fn any_in(&self, r: PageRange) -> bool {
        self.find(r.start).is_some() || self.map.range(r.start.0..r.end.0).next().is_some()
    }

    /// The unmapped range around `p` (which no region contains): from the
    /// end of the region before it (or 0) to the start of the next one (or
    /// `limit`).
    pub fn gap_around(&self, p: PageIdx, limit: u64) -> PageRange {
        let start = self.map.range(..=p.0).next_back().map_or(0, |(_, r)| r.range.end.0);
        let end = self.map.range(p.0 + 1..).next().map_or(limit, |(k, _)| *k);
        PageRange::new(start, end)
    }

    /// Lowest gap of `pages` pages in `[from, limit)` that avoids every region
    /// and every range in `held`.
    pub fn find_gap(&self, pages: u64, from: u64, limit: u64, held: &[PageRange]) -> Option<u64> {
        let mut cand = from;
        loop {
            if cand.checked_add(pages)? > limit {
                return None;
            }
            let want = PageRange::new(cand, cand + pages);
            if let Some(r) = self.find(want.start) {
                cand = r.range.end.0;
                continue;
            }
            if let Some((_, r)) = self.map.range(want.start.0..want.end.0).next() {
                cand = r.range.end.0;
                continue;
            }
            if let Some(h) = held.iter().find(|h| h.overlaps(&want)) {
                cand = h.end.0;
                continue;
            }
            return Some(cand);
        }
    }

    pub fn validate(&self, limit: u64) {
        let mut prev: Option<&Region> = None;
        for (k, r) in &self.map {
            assert_eq!(*k, r.range.start.0, "key");
            assert!(!r.range.is_empty(), "empty region");
            assert!(r.range.end.0 <= limit, "region beyond reservation");
            r.validate();
            if let Some(p) = prev {
                assert!(p.range.end <= r.range.start, "overlap {:?} {:?}", p.range, r.range);
                assert!(!p.can_merge(r), "unmerged neighbours {:?} {:?}", p.range, r.range);
            }
            prev = Some(r);
        }
    }
}
