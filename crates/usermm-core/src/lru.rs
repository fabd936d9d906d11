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
//! popped, and the lists are compacted when stale entries dominate.

use std::collections::VecDeque;

use crate::types::PageIdx;

#[derive(Default)]
pub struct Lru {
    pub active: VecDeque<(PageIdx, u16)>,
    pub inactive: VecDeque<(PageIdx, u16)>,
    /// Pages lazily freed (MADV_FREE), in order: reclaim takes them first,
    /// since discarding a clean one costs no I/O. An entry is valid while the
    /// page still has its `LAZYFREE` flag.
    pub lazy: VecDeque<PageIdx>,
    /// Pages marked volatile while holding a frame, in order, with
    /// `UMM_F_PURGE_VOLATILE_FIRST` only: reclaim purges them first. An
    /// entry is valid while the page is volatile, not purged, and holds a
    /// frame.
    pub volatile: VecDeque<PageIdx>,
}

impl Lru {
    pub fn len(&self) -> usize {
        self.active.len() + self.inactive.len() + self.lazy.len() + self.volatile.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
