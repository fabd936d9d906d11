//! The per-thread caches of small blocks: per size class, a stack of block
//! addresses and a held slab, all of one heap's, flushed back when the
//! thread ends.

use std::cell::RefCell;
use std::mem::ManuallyDrop;

use super::*;

#[derive(Clone, Copy)]
pub(super) struct CacheBin {
    pub(super) n: u32,
    pub(super) blocks: [usize; CACHE_MAX],
}

/// One thread's cached blocks, all of one heap's (`owner`).
pub(super) struct Cache {
    /// `ManuallyDrop` so that [`LOCAL`] has no destructor; [`ExitFlush`]
    /// takes the `Arc` out at the thread's exit.
    pub(super) owner: ManuallyDrop<Option<Arc<Shared>>>,
    pub(super) bins: [CacheBin; NCLASSES],
    /// The slab of each class this cache holds (`NIL`: none; see
    /// [`Shared::take`]).
    pub(super) held: [u32; NCLASSES],
}

impl Cache {
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
        for (class, bin) in self.bins.iter_mut().enumerate() {
            if bin.n > 0 {
                owner.give(class, &bin.blocks[..bin.n as usize]);
                bin.n = 0;
            }
            owner.unhold(class, std::mem::replace(&mut self.held[class], NIL));
        }
    }
}

/// Gives the thread's cache back when the thread exits. A thread-local of
/// its own: [`LOCAL`] has no destructor, so that reading it never
/// registers one (which allocates, and would come back into the heap
/// before the thread's depth could say where that allocation goes).
struct ExitFlush;

impl Drop for ExitFlush {
    fn drop(&mut self) {
        let _system = SystemOnly::enter();
        let _ = LOCAL.try_with(|l| {
            if let Ok(mut c) = l.try_borrow_mut() {
                c.flush();
                *c.owner = None;
            }
        });
    }
}

thread_local! {
    static EXIT: ExitFlush = const { ExitFlush };
    /// The thread's cache (no destructor: see [`ExitFlush`]).
    pub(super) static LOCAL: RefCell<Cache> = const {
        RefCell::new(Cache {
            owner: ManuallyDrop::new(None),
            bins: [CacheBin { n: 0, blocks: [0; CACHE_MAX] }; NCLASSES],
            held: [NIL; NCLASSES],
        })
    };
}
