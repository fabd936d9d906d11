//! What the calling thread is to usermm: one of usermm's own threads, a
//! thread inside code whose allocations must come from the system allocator,
//! or a faulting thread resolving its own fault in its SIGBUS handler.
//!
//! Thread-local marks that the executor and the page stores set and the heap
//! and the stores read; kept apart from all of them so that none needs the
//! others to know what the thread is doing.

use std::cell::{Cell, RefCell};

use crate::heap::small::cache::Cache;

/// The calling thread's marks and its heap cache, in one thread-local: a
/// `malloc` reads both the system-only mark and the cache, and in a shared
/// library (the `usermm run` preload) each thread-local is a call of
/// `__tls_get_addr` (a malloc+free pair made three of them, a quarter of
/// its time). No destructor (the cache is flushed by a thread-local of its
/// own, `heap/small/cache.rs`'s `ExitFlush`), so it is never torn down.
pub(crate) struct Thread {
    /// How deep this thread is in code whose allocations must not come from
    /// a `GlobalHeap`: its slow path, and every thread usermm starts.
    system_only: Cell<u32>,
    /// How many in-thread resolves (this thread's own fault, in its SIGBUS
    /// handler) this thread is inside.
    resolving_own_fault: Cell<u32>,
    /// The thread's cache of small blocks.
    pub(crate) heap_cache: RefCell<Cache>,
}

impl Thread {
    /// Whether this thread's allocations must come from the system allocator.
    #[inline]
    pub(crate) fn system_only(&self) -> bool {
        self.system_only.get() > 0
    }
}

thread_local! {
    pub(crate) static THREAD: Thread = const {
        Thread { system_only: Cell::new(0), resolving_own_fault: Cell::new(0), heap_cache: RefCell::new(Cache::EMPTY) }
    };
}

/// While alive, this thread's allocations through a `GlobalHeap` come from
/// the system allocator.
pub struct SystemOnly(());

impl SystemOnly {
    /// Makes the calling thread system-only until the guard drops; nests.
    #[inline]
    pub fn enter() -> SystemOnly {
        THREAD.with(|t| t.system_only.set(t.system_only.get() + 1));
        SystemOnly(())
    }
}

impl Drop for SystemOnly {
    #[inline]
    fn drop(&mut self) {
        THREAD.with(|t| t.system_only.set(t.system_only.get() - 1));
    }
}

/// Marks the calling thread as one of usermm's own for its whole life: its
/// allocations never come from a `GlobalHeap` (a fault handler that faulted
/// on the heap would wait on itself).
pub(crate) fn mark_usermm_thread() {
    THREAD.with(|t| t.system_only.set(t.system_only.get() + 1));
}

/// Whether this thread's allocations must come from the system allocator.
#[inline]
pub(crate) fn system_only() -> bool {
    // A thread tearing down its thread-locals counts as system-only.
    THREAD.try_with(Thread::system_only).unwrap_or(true)
}

/// While alive, this thread is resolving its own fault in its SIGBUS
/// handler (an in-thread resolve: `native/fault.rs`'s `InThread`).
pub(crate) struct ResolvingOwnFault(());

impl ResolvingOwnFault {
    #[inline]
    pub(crate) fn enter() -> ResolvingOwnFault {
        THREAD.with(|t| t.resolving_own_fault.set(t.resolving_own_fault.get() + 1));
        ResolvingOwnFault(())
    }
}

impl Drop for ResolvingOwnFault {
    #[inline]
    fn drop(&mut self) {
        THREAD.with(|t| t.resolving_own_fault.set(t.resolving_own_fault.get() - 1));
    }
}

/// Whether this thread is inside an in-thread resolve (its own fault, in its
/// SIGBUS handler): the store's reads then sleep for their reply rather than
/// poll (`store/redis/link.rs`), also in a space of handler threads with
/// `UMM_MAP_INTHREAD` regions.
#[inline]
pub(crate) fn resolving_own_fault() -> bool {
    THREAD.with(|t| t.resolving_own_fault.get() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_only_nests() {
        assert!(!system_only());
        {
            let _a = SystemOnly::enter();
            let _b = SystemOnly::enter();
            assert!(system_only());
        }
        assert!(!system_only());
    }

    #[test]
    fn resolving_own_fault_nests() {
        assert!(!resolving_own_fault());
        {
            let _outer = ResolvingOwnFault::enter();
            {
                let _nested = ResolvingOwnFault::enter();
                assert!(resolving_own_fault());
            }
            assert!(resolving_own_fault());
        }
        assert!(!resolving_own_fault());
    }
}
