//! The LRU: an active and an inactive FIFO of page indices.
//!
//! userfaultfd reports only the first touch of a page, which is why umap and
//! FluidMem degrade to FIFO. usermm gets real recency by *deactivating*: a page
//! leaving the active list is moved out of the program's range into the
//! staging area (still resident, still counted against the budget). If the
//! program touches it again before reclaim reaches it, the touch is a cheap
//! minor fault that maps it back and puts it at the tail of the active list
//! with its referenced bit set. Only pages that stay untouched for a whole
//! trip through the inactive list are evicted — Linux's two-list design,
//! with the missing-PTE fault as the accessed bit.
//!
//! Entries are `(page, gen)`; an entry is valid only while the page's `gen`
//! matches and its state is the list's state. Stale entries are dropped when
//! popped, and the lists are compacted when stale entries dominate — a
//! chunk at a time, so that no single call (a fault's commit, under the core
//! lock) pays for a sweep of the whole list, and a chunk per 64 pushes, so
//! that a fault-around window's commit does not sweep a chunk per page. A large `munmap` leaves every
//! page of its range stale at once; sweeping 262,144 entries in one go held
//! the core lock for up to 0.8 ms and stalled other threads' faults.

use std::collections::{HashMap, VecDeque};

use crate::page::{pf, PState, PageTable};
use crate::types::PageIdx;

/// Entries per chunk of a [`Fifo`].
const CHUNK: usize = 512;

/// A FIFO kept as a deque of chunks, so that compaction can proceed a chunk
/// at a time ([`Fifo::sweep`]) while keeping the order of the entries.
pub struct Fifo<T> {
    chunks: VecDeque<VecDeque<T>>,
    len: usize,
    /// The chunk the next [`Fifo::sweep`] step compacts.
    cursor: usize,
    /// Emptied chunks kept for reuse, so that a steady flow of pushes and
    /// pops does not call the allocator (see `page::SPARE_LEAVES_MAX`).
    spare: Vec<VecDeque<T>>,
}

/// Spare chunks a [`Fifo`] keeps (emptied ones, and new ones the executor
/// allocates outside its locks and hands over with [`Fifo::add_spare`]).
const SPARE_CHUNKS_MAX: usize = 8;

/// A list's chunk, as [`Fifo::add_spare`] takes it.
pub type Chunk<T> = VecDeque<T>;

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo { chunks: VecDeque::new(), len: 0, cursor: 0, spare: Vec::new() }
    }
}

impl<T: Copy> Fifo<T> {
    /// A new, empty chunk (allocated by the caller, outside any lock).
    pub fn alloc_chunk() -> Chunk<T> {
        VecDeque::with_capacity(CHUNK)
    }

    /// How many spare chunks the list would take to be full.
    pub fn spare_wanted(&self) -> usize {
        SPARE_CHUNKS_MAX.saturating_sub(self.spare.len())
    }

    /// Adds empty chunks to the spares (beyond `SPARE_CHUNKS_MAX`, they
    /// are freed).
    pub fn add_spare(&mut self, chunks: Vec<Chunk<T>>) {
        for c in chunks {
            self.recycle(c);
        }
    }

    fn new_chunk(&mut self) -> VecDeque<T> {
        self.spare.pop().unwrap_or_else(|| VecDeque::with_capacity(CHUNK))
    }

    fn recycle(&mut self, c: VecDeque<T>) {
        if self.spare.len() < SPARE_CHUNKS_MAX && c.is_empty() && c.capacity() >= CHUNK {
            self.spare.push(c);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries, oldest first (for `validate`).
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    pub fn push_back(&mut self, x: T) {
        match self.chunks.back_mut() {
            Some(c) if c.len() < CHUNK => c.push_back(x),
            _ => {
                let mut c = self.new_chunk();
                c.push_back(x);
                self.chunks.push_back(c);
            }
        }
        self.len += 1;
    }

    pub fn push_front(&mut self, x: T) {
        match self.chunks.front_mut() {
            Some(c) if c.len() < CHUNK => c.push_front(x),
            _ => {
                let mut c = self.new_chunk();
                c.push_back(x);
                self.chunks.push_front(c);
                self.cursor += 1;
            }
        }
        self.len += 1;
    }

    pub fn pop_front(&mut self) -> Option<T> {
        loop {
            let c = self.chunks.front_mut()?;
            let x = c.pop_front();
            if c.is_empty() {
                if let Some(c) = self.chunks.pop_front() {
                    self.recycle(c);
                }
                self.cursor = self.cursor.saturating_sub(1);
            }
            if let Some(x) = x {
                self.len -= 1;
                return Some(x);
            }
        }
    }

    /// Asserts that `len` counts the entries and the cursor is inside the
    /// list.
    pub fn validate(&self) {
        assert_eq!(self.len, self.chunks.iter().map(|c| c.len()).sum::<usize>(), "list length");
        assert!(self.cursor <= self.chunks.len(), "sweep cursor beyond the list");
    }

    /// Compacts up to `max_chunks` chunks, from where the last call stopped,
    /// keeping the entries `keep` accepts (in order). Returns true when the
    /// sweep reached the end of the list (the next call starts over).
    pub fn sweep(&mut self, max_chunks: usize, mut keep: impl FnMut(&T) -> bool) -> bool {
        for _ in 0..max_chunks {
            let Some(c) = self.chunks.get_mut(self.cursor) else {
                self.cursor = 0;
                return true;
            };
            let before = c.len();
            c.retain(|x| keep(x));
            self.len -= before - c.len();
            if c.is_empty() {
                if let Some(c) = self.chunks.remove(self.cursor) {
                    self.recycle(c);
                }
            } else {
                self.cursor += 1;
            }
        }
        false
    }
}

/// An entry of the active or inactive list: a page and the generation it
/// was queued under.
pub type Entry = (PageIdx, u32);

/// Pushes per chunk a compaction sweeps (see [`Lru::add_active`]).
const SWEEP_EVERY_PUSHES: u32 = 64;

/// The lists, and the bookkeeping of their incremental compaction.
///
/// Reclaim takes entries from a list's head (`isolate_*`) and either drops
/// them (stale, or leaving the LRU), returns them to the head where they
/// were (`putback_*`), or moves them to the tail (`rotate_*`); a page that
/// becomes resident or parked is added under a new generation
/// (`add_active`, `add_inactive`), which makes its older entries stale.
pub struct Lru {
    /// Resident pages not yet proved in use: new fills, and pages mapped
    /// back with no use counted. Aging takes them first.
    active: Fifo<Entry>,
    /// Resident pages proved in use (touched while parked, or read back
    /// from swap soon after their eviction: `core/policy.rs`). Aging takes
    /// them only when they outgrow their share or no unproved page is
    /// left (`Core::plan_refill_inactive`), so that a stream of new pages
    /// passes them by, as Linux's new pages start on the inactive list.
    proven: Fifo<Entry>,
    inactive: Fifo<Entry>,
    /// Pages lazily freed (MADV_FREE), in order: reclaim takes them first,
    /// since discarding a clean one costs no I/O. An entry is valid while the
    /// page still has its `LAZYFREE` flag.
    lazy: Fifo<PageIdx>,
    /// Pages marked volatile while holding a frame, in order, with
    /// `UMM_F_PURGE_VOLATILE_FIRST` only: reclaim purges them first. An
    /// entry is valid while the page is volatile, not purged, and holds a
    /// frame.
    volatile: Fifo<PageIdx>,
    /// The list an incremental compaction is sweeping, or `None`
    /// (see [`Lru::compact`]).
    compacting: Option<List>,
    /// Pushes so far, wrapping: one in `SWEEP_EVERY_PUSHES` sweeps a chunk.
    pushes: u32,
    /// Chunks compaction steps were allowed to sweep so far (a bound on the
    /// work they did; [`Lru::sweep_work`]).
    sweep_work: u64,
    /// Where a page whose metadata starts afresh (generation 0: new, or
    /// reset by a zap) starts its generations, so that an old entry of
    /// the page still in a list does not become valid again (advanced by an
    /// odd stride at each use). 32 bits: with 16, a stale entry a few
    /// generations ahead of a fresh start becomes valid again after as many
    /// pushes (1 in 65,536 a reset) — the likely cause of a page found on
    /// the active list twice in one of 15 stress-test runs.
    fresh_gen: u32,
}

/// The lists, in the order a compaction sweeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Active,
    Proven,
    Inactive,
    Lazy,
    Volatile,
}

impl Default for Lru {
    fn default() -> Lru {
        Lru {
            active: Fifo::default(),
            proven: Fifo::default(),
            inactive: Fifo::default(),
            lazy: Fifo::default(),
            volatile: Fifo::default(),
            compacting: None,
            pushes: 0,
            sweep_work: 0,
            fresh_gen: 1,
        }
    }
}

impl Lru {
    /// The generation of a page's next entry, after its generation `gen`
    /// (0: the page's metadata starts afresh). Never 0.
    fn next_gen(&mut self, gen: u32) -> u32 {
        if gen != 0 {
            return gen.wrapping_add(1).max(1);
        }
        self.fresh_gen = self.fresh_gen.wrapping_add(0x9E37_79B9).max(1);
        self.fresh_gen
    }

    /// Queues page `p` at the tail of the active list under a new
    /// generation (set in `pages`), and sweeps stale entries a chunk at a
    /// time (`add_inactive` likewise, for the inactive list).
    ///
    /// Stale entries pile up when pages cycle between the lists without
    /// reclaim popping them and without a zap compacting them (a shared
    /// file page parked, written back and faulted in again in a loop): once
    /// the lists are more than twice the resident pages plus 4096, a chunk
    /// is swept every `SWEEP_EVERY_PUSHES` pushes. Without it, a page came
    /// back to a generation one of its stale entries still had (when
    /// generations had 16 bits): a page on the active list twice, seen by
    /// `validate` after a loop of `MADV_DONTNEED` on a shared file beside a
    /// writer.
    ///
    /// Why not a chunk per push: a fault-around window's commit pushes each
    /// of its pages, under the core lock, so a 256-page window swept 256
    /// chunks (131,072 entries, 0.7 ms measured) whenever a large `munmap`
    /// had left the lists stale — every other thread's fault waited that
    /// long (`perf` of `usermm bench munmap`: the second thread's worst
    /// stalls were those commits). A pass over a list of `n` entries now
    /// takes `n / 8` pushes, which leave at most that many entries stale:
    /// the lists stay bounded.
    pub fn add_active(&mut self, pages: &mut PageTable, p: PageIdx) {
        let e = self.new_entry(pages, p);
        self.active.push_back(e);
        self.sweep_stale(pages);
    }

    /// Queues page `p` at the tail of the proven list under a new
    /// generation (see [`Lru::add_active`]).
    pub fn add_proven(&mut self, pages: &mut PageTable, p: PageIdx) {
        let e = self.new_entry(pages, p);
        self.proven.push_back(e);
        self.sweep_stale(pages);
    }

    /// Queues page `p` at the head of the active list (first in line for
    /// deactivation) under a new generation: a parked page mapped back in
    /// bulk, which earned no use (`core/unpark.rs`).
    pub fn add_active_front(&mut self, pages: &mut PageTable, p: PageIdx) {
        let e = self.new_entry(pages, p);
        self.active.push_front(e);
        self.sweep_stale(pages);
    }

    /// Queues page `p` at the tail of the inactive list under a new
    /// generation (see [`Lru::add_active`]).
    pub fn add_inactive(&mut self, pages: &mut PageTable, p: PageIdx) {
        let e = self.new_entry(pages, p);
        self.inactive.push_back(e);
        self.sweep_stale(pages);
    }

    /// Gives page `p` its next generation: its entry.
    fn new_entry(&mut self, pages: &mut PageTable, p: PageIdx) -> Entry {
        let mut m = pages.get(p);
        m.gen = self.next_gen(m.gen);
        pages.set(p, m);
        (p, m.gen)
    }

    fn sweep_stale(&mut self, pages: &PageTable) {
        self.pushes = self.pushes.wrapping_add(1);
        if self.pushes.is_multiple_of(SWEEP_EVERY_PUSHES) {
            self.compact(pages, 1);
        }
    }

    /// Queues lazily freed page `p` at the tail of the lazy list.
    pub fn add_lazy(&mut self, p: PageIdx) {
        self.lazy.push_back(p);
    }

    /// Queues volatile page `p` at the tail of the volatile list.
    pub fn add_volatile(&mut self, p: PageIdx) {
        self.volatile.push_back(p);
    }

    /// Takes the entry at the head of the active list.
    pub fn isolate_active(&mut self) -> Option<Entry> {
        self.active.pop_front()
    }
    /// Returns an isolated entry to the head of the active list.
    pub fn putback_active(&mut self, e: Entry) {
        self.active.push_front(e);
    }
    /// Moves an isolated entry to the tail of the active list.
    pub fn rotate_active(&mut self, e: Entry) {
        self.active.push_back(e);
    }

    /// Takes the entry at the head of the proven list.
    pub fn isolate_proven(&mut self) -> Option<Entry> {
        self.proven.pop_front()
    }
    /// Returns an isolated entry to the head of the proven list.
    pub fn putback_proven(&mut self, e: Entry) {
        self.proven.push_front(e);
    }
    /// Moves an isolated entry to the tail of the proven list.
    pub fn rotate_proven(&mut self, e: Entry) {
        self.proven.push_back(e);
    }

    /// Takes the entry at the head of the inactive list.
    pub fn isolate_inactive(&mut self) -> Option<Entry> {
        self.inactive.pop_front()
    }
    /// Returns an isolated entry to the head of the inactive list.
    pub fn putback_inactive(&mut self, e: Entry) {
        self.inactive.push_front(e);
    }
    /// Moves an isolated entry to the tail of the inactive list.
    pub fn rotate_inactive(&mut self, e: Entry) {
        self.inactive.push_back(e);
    }

    /// Takes the page at the head of the lazy list.
    pub fn isolate_lazy(&mut self) -> Option<PageIdx> {
        self.lazy.pop_front()
    }
    /// Returns an isolated page to the head of the lazy list.
    pub fn putback_lazy(&mut self, p: PageIdx) {
        self.lazy.push_front(p);
    }
    /// Moves an isolated page to the tail of the lazy list.
    pub fn rotate_lazy(&mut self, p: PageIdx) {
        self.lazy.push_back(p);
    }

    /// Takes the page at the head of the volatile list.
    pub fn isolate_volatile(&mut self) -> Option<PageIdx> {
        self.volatile.pop_front()
    }
    /// Returns an isolated page to the head of the volatile list.
    pub fn putback_volatile(&mut self, p: PageIdx) {
        self.volatile.push_front(p);
    }
    /// Moves an isolated page to the tail of the volatile list.
    pub fn rotate_volatile(&mut self, p: PageIdx) {
        self.volatile.push_back(p);
    }

    /// Entries on the active list, valid or stale.
    pub fn active_len(&self) -> usize {
        self.active.len()
    }
    /// Entries on the proven list, valid or stale.
    pub fn proven_len(&self) -> usize {
        self.proven.len()
    }
    /// Entries on the inactive list, valid or stale.
    pub fn inactive_len(&self) -> usize {
        self.inactive.len()
    }
    /// Entries on the lazy list, valid or stale.
    pub fn lazy_len(&self) -> usize {
        self.lazy.len()
    }
    /// Entries on the volatile list, valid or stale.
    pub fn volatile_len(&self) -> usize {
        self.volatile.len()
    }

    /// Entries on all lists, valid or stale.
    pub fn len(&self) -> usize {
        self.active.len() + self.proven.len() + self.inactive.len() + self.lazy.len() + self.volatile.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The spare chunks the active and proven lists, and the inactive
    /// list, would take.
    pub fn spare_wanted(&self) -> (usize, usize) {
        (self.active.spare_wanted() + self.proven.spare_wanted(), self.inactive.spare_wanted())
    }

    /// Takes spare chunks for the active and proven lists (the proven
    /// list's wants first), and for the inactive list (allocated outside
    /// the core lock).
    pub fn add_spare(&mut self, mut active: Vec<Chunk<Entry>>, inactive: Vec<Chunk<Entry>>) {
        let rest = active.split_off(self.proven.spare_wanted().min(active.len()));
        self.proven.add_spare(active);
        self.active.add_spare(rest);
        self.inactive.add_spare(inactive);
    }

    /// How many chunks (of 512 entries) compaction has been allowed to
    /// sweep so far.
    pub fn sweep_work(&self) -> u64 {
        self.sweep_work
    }

    /// Drops stale entries when they dominate (the lists hold more than
    /// twice the resident pages plus 4096), sweeping at most `chunks`
    /// chunks of 512 entries, so that every call stays short. A pass
    /// sweeps each list in turn (active, proven, inactive, lazy,
    /// volatile), from where the last call stopped.
    pub fn compact(&mut self, pages: &PageTable, chunks: usize) {
        let live = pages.census().resident as usize;
        if self.compacting.is_none() && self.len() > 2 * live + 4096 {
            self.compacting = Some(List::Active);
        }
        let Some(list) = self.compacting else { return };
        self.sweep_work += chunks as u64;
        let swept = match list {
            List::Active => self.active.sweep(chunks, |e| valid(pages, e, PState::Resident)),
            List::Proven => self.proven.sweep(chunks, |e| valid(pages, e, PState::Resident)),
            List::Inactive => self.inactive.sweep(chunks, |e| valid(pages, e, PState::Inactive)),
            List::Lazy => self.lazy.sweep(chunks, |p| pages.get(*p).has(pf::LAZYFREE)),
            List::Volatile => self.volatile.sweep(chunks, |p| {
                let m = pages.get(*p);
                m.has(pf::VOLATILE) && !m.has(pf::PURGED) && m.state.holds_frame()
            }),
        };
        if swept {
            self.compacting = match list {
                List::Active => Some(List::Proven),
                List::Proven => Some(List::Inactive),
                List::Inactive => Some(List::Lazy),
                List::Lazy => Some(List::Volatile),
                List::Volatile => None,
            };
        }
    }

    /// How many valid entries of each page the active and proven lists
    /// together, and the inactive list, hold (an entry is valid while its
    /// generation is the page's and the page is in the list's state):
    /// `validate` checks every page's counts.
    pub fn valid_entries(&self, pages: &PageTable) -> HashMap<PageIdx, (u32, u32)> {
        let mut on = HashMap::<PageIdx, (u32, u32)>::new();
        for e in self.active.iter().chain(self.proven.iter()).filter(|e| valid(pages, e, PState::Resident)) {
            on.entry(e.0).or_default().0 += 1;
        }
        for e in self.inactive.iter().filter(|e| valid(pages, e, PState::Inactive)) {
            on.entry(e.0).or_default().1 += 1;
        }
        on
    }

    /// Asserts the lists' own invariants: each list's length is its
    /// entries' count.
    pub fn validate(&self) {
        self.active.validate();
        self.proven.validate();
        self.inactive.validate();
        self.lazy.validate();
        self.volatile.validate();
    }
}

/// Whether entry `e` of the list of pages in state `state` is valid.
fn valid(pages: &PageTable, &(p, gen): &Entry, state: PState) -> bool {
    let m = pages.get(p);
    m.gen == gen && m.state == state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_keeps_order_across_chunks_and_sweeps() {
        let mut f = Fifo::default();
        for i in 0..5000u32 {
            f.push_back(i);
        }
        f.push_front(9999);
        // Sweep in small steps: drop the odd entries.
        let mut steps = 0;
        while !f.sweep(2, |x| x % 2 == 0) {
            steps += 1;
            // Concurrent use between steps keeps the FIFO consistent.
            f.push_back(10_000 + steps * 2);
        }
        assert!(steps > 2, "the sweep went in steps");
        let mut out = Vec::new();
        while let Some(x) = f.pop_front() {
            out.push(x);
        }
        assert_eq!(out.len(), 1 + 2500 + steps as usize, "every kept entry once");
        assert_eq!(out[0], 9999);
        let evens: Vec<u32> = (0..5000).filter(|x| x % 2 == 0).collect();
        assert_eq!(&out[1..2501], &evens[..]);
        assert!(out[2501..].windows(2).all(|w| w[0] < w[1]));
        assert!(f.is_empty());
    }

    #[test]
    fn fifo_sweep_and_pop_through_emptied_chunks() {
        let mut f = Fifo::default();
        for i in 0..2000u32 {
            f.push_back(i);
        }
        assert!(f.sweep(usize::MAX, |x| *x >= 1900));
        assert_eq!(f.len(), 100);
        assert_eq!(f.pop_front(), Some(1900));
        assert!(f.sweep(usize::MAX, |_| false));
        assert!(f.is_empty());
        assert_eq!(f.pop_front(), None);
    }
}
