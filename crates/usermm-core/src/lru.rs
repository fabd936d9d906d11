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

use std::collections::VecDeque;

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

pub struct Lru {
    pub active: Fifo<(PageIdx, u32)>,
    pub inactive: Fifo<(PageIdx, u32)>,
    /// Pages lazily freed (MADV_FREE), in order: reclaim takes them first,
    /// since discarding a clean one costs no I/O. An entry is valid while the
    /// page still has its `LAZYFREE` flag.
    pub lazy: Fifo<PageIdx>,
    /// Pages marked volatile while holding a frame, in order, with
    /// `UMM_F_PURGE_VOLATILE_FIRST` only: reclaim purges them first. An
    /// entry is valid while the page is volatile, not purged, and holds a
    /// frame.
    pub volatile: Fifo<PageIdx>,
    /// The list an incremental compaction is sweeping (1: active,
    /// 2: inactive, 3: lazy, 4: volatile), or 0 (see `Core::maybe_compact`).
    pub compacting: u8,
    /// Pushes so far, wrapping: one in `SWEEP_EVERY_PUSHES` sweeps a chunk
    /// (`Core::sweep_stale`).
    pub pushes: u32,
    /// Chunks compaction steps were allowed to sweep so far (a bound on the
    /// work they did; `Core::lru_sweep_work`).
    pub sweep_work: u64,
    /// Where a page whose metadata starts afresh (generation 0: new, or
    /// reset by a zap) starts its generations, so that an old entry of
    /// the page still in a list does not become valid again (advanced by an
    /// odd stride at each use). 32 bits: with 16, a stale entry a few
    /// generations ahead of a fresh start becomes valid again after as many
    /// pushes (1 in 65,536 a reset) — the likely cause of a page found on
    /// the active list twice in one of 15 stress-test runs.
    fresh_gen: u32,
}

impl Default for Lru {
    fn default() -> Lru {
        Lru {
            active: Fifo::default(),
            inactive: Fifo::default(),
            lazy: Fifo::default(),
            volatile: Fifo::default(),
            compacting: 0,
            pushes: 0,
            sweep_work: 0,
            fresh_gen: 1,
        }
    }
}

impl Lru {
    /// The generation of a page's next entry, after its generation `gen`
    /// (0: the page's metadata starts afresh). Never 0.
    pub(crate) fn next_gen(&mut self, gen: u32) -> u32 {
        if gen != 0 {
            return gen.wrapping_add(1).max(1);
        }
        self.fresh_gen = self.fresh_gen.wrapping_add(0x9E37_79B9).max(1);
        self.fresh_gen
    }

    pub fn len(&self) -> usize {
        self.active.len() + self.inactive.len() + self.lazy.len() + self.volatile.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
