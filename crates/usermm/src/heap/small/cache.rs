//! The per-thread caches of small blocks: per size class, a stack of block
//! addresses, all of one heap's, flushed back when the thread ends.

use super::*;

#[derive(Clone, Copy)]
pub(super) struct CacheBin {
    pub(super) n: u32,
    pub(super) blocks: [usize; CACHE_MAX],
}

/// One thread's cached blocks, all of one heap's (`owner`).
pub(super) struct Cache {
    pub(super) owner: Option<Arc<Shared>>,
    pub(super) bins: [CacheBin; NCLASSES],
}

impl Cache {
    /// Makes `shared` the cache's heap, giving another heap's blocks back.
    #[inline]
    pub(super) fn adopt(&mut self, shared: &Arc<Shared>) {
        if self.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, shared)) {
            return;
        }
        let _system = SystemOnly::enter();
        self.flush();
        self.owner = Some(Arc::clone(shared));
    }

    /// Gives every cached block back to its slabs (their pages are lazily
    /// freed by the heap's next call that has its space).
    pub(super) fn flush(&mut self) {
        let Some(owner) = &self.owner else { return };
        for (class, bin) in self.bins.iter_mut().enumerate() {
            if bin.n > 0 {
                owner.give(class, &bin.blocks[..bin.n as usize]);
                bin.n = 0;
            }
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _system = SystemOnly::enter();
        self.flush();
        self.owner = None;
    }
}

thread_local! {
    pub(super) static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache { owner: None, bins: [CacheBin { n: 0, blocks: [0; CACHE_MAX] }; NCLASSES] })
    };
}
