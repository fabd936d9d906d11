//! The per-thread caches of small blocks: per size class, a stack of block
//! addresses and a held slab, all of one heap's, flushed back when the
//! thread ends.

use std::mem::ManuallyDrop;

use super::*;
use crate::thread_role::THREAD;

/// One thread's cached blocks, all of one heap's (`owner`): per class, a
/// stack of addresses (`blocks[class][..n[class]]`). The counts of every
/// class come first, on one line that every `malloc` and `free` reads (in a
/// per-class struct, a count and its stack's top were two lines to miss).
#[repr(C)]
pub(crate) struct Cache {
    pub(super) n: [u8; NCLASSES],
    /// `ManuallyDrop` so that [`THREAD`] has no destructor; [`ExitFlush`]
    /// takes the `Arc` out at the thread's exit.
    pub(super) owner: ManuallyDrop<Option<Arc<Shared>>>,
    /// The slab of each class this cache holds (`NIL`: none; see
    /// [`Shared::take`]).
    pub(super) held: [u32; NCLASSES],
    pub(super) blocks: [[usize; CACHE_MAX]; NCLASSES],
}

impl Cache {
    /// A cache of no heap.
    pub(crate) const EMPTY: Cache = Cache {
        owner: ManuallyDrop::new(None),
        n: [0; NCLASSES],
        blocks: [[0; CACHE_MAX]; NCLASSES],
        held: [NIL; NCLASSES],
    };

    #[inline]
    pub(super) fn owned_by(&self, shared: &Arc<Shared>) -> bool {
        self.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, shared))
    }

    /// Makes `shared` the cache's heap, giving another heap's blocks back;
    /// `false` (and nothing changed) when the thread is past the point
    /// where its cache could still be given back at its exit.
    #[inline]
    pub(super) fn adopt(&mut self, shared: &Arc<Shared>) -> bool {
        if self.owned_by(shared) {
            return true;
        }
        let _system = SystemOnly::enter();
        // The first adoption registers the flush at the thread's exit (its
        // registration may allocate: from the system allocator, as the
        // thread is system-only meanwhile).
        if EXIT.try_with(|_| ()).is_err() {
            return false;
        }
        self.flush();
        *self.owner = Some(Arc::clone(shared));
        true
    }

    /// Gives every cached block back to its slabs (their pages are lazily
    /// freed by the heap's next call that has its space).
    pub(super) fn flush(&mut self) {
        let Some(owner) = &*self.owner else { return };
        for class in 0..NCLASSES {
            if self.n[class] > 0 {
                owner.give(class, &self.blocks[class][..self.n[class] as usize]);
                self.n[class] = 0;
            }
            owner.unhold(class, std::mem::replace(&mut self.held[class], NIL));
        }
    }
}

/// Gives the thread's cache back when the thread exits. A thread-local of
/// its own: [`THREAD`] has no destructor, so that reading it never
/// registers one (which allocates, and would come back into the heap
/// before the thread's depth could say where that allocation goes).
struct ExitFlush;

impl Drop for ExitFlush {
    fn drop(&mut self) {
        let _system = SystemOnly::enter();
        let _ = THREAD.try_with(|t| {
            if let Ok(mut c) = t.heap_cache.try_borrow_mut() {
                c.flush();
                *c.owner = None;
            }
        });
    }
}

thread_local! {
    static EXIT: ExitFlush = const { ExitFlush };
}
