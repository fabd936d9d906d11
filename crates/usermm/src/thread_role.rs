//! What the calling thread is to usermm: one of usermm's own threads, a
//! thread inside code whose allocations must come from the system allocator,
//! or a faulting thread resolving its own fault in its SIGBUS handler.
//!
//! Thread-local marks that the executor and the page stores set and the heap
//! and the stores read; kept apart from all of them so that none needs the
//! others to know what the thread is doing.

use std::cell::Cell;

thread_local! {
    /// How deep this thread is in code whose allocations must not come from
    /// a `GlobalHeap`: its slow path, and every thread usermm starts.
    static SYSTEM_ONLY: Cell<u32> = const { Cell::new(0) };
    /// How many in-thread resolves (this thread's own fault, in its SIGBUS
    /// handler) this thread is inside.
    static RESOLVING_OWN_FAULT: Cell<u32> = const { Cell::new(0) };
}

/// While alive, this thread's allocations through a `GlobalHeap` come from
/// the system allocator.
pub struct SystemOnly(());

impl SystemOnly {
    /// Makes the calling thread system-only until the guard drops; nests.
    #[inline]
    pub fn enter() -> SystemOnly {
        SYSTEM_ONLY.with(|d| d.set(d.get() + 1));
        SystemOnly(())
    }
}

impl Drop for SystemOnly {
    #[inline]
    fn drop(&mut self) {
        SYSTEM_ONLY.with(|d| d.set(d.get() - 1));
    }
}

/// Marks the calling thread as one of usermm's own for its whole life: its
/// allocations never come from a `GlobalHeap` (a fault handler that faulted
/// on the heap would wait on itself).
pub(crate) fn mark_usermm_thread() {
    SYSTEM_ONLY.with(|d| d.set(d.get() + 1));
}

/// Whether this thread's allocations must come from the system allocator.
#[inline]
pub(crate) fn system_only() -> bool {
    // A thread tearing down its thread-locals counts as system-only.
    SYSTEM_ONLY.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// While alive, this thread is resolving its own fault in its SIGBUS
/// handler (an in-thread resolve: `native/fault.rs`'s `InThread`).
pub(crate) struct ResolvingOwnFault(());

impl ResolvingOwnFault {
    #[inline]
    pub(crate) fn enter() -> ResolvingOwnFault {
        RESOLVING_OWN_FAULT.with(|d| d.set(d.get() + 1));
        ResolvingOwnFault(())
    }
}

impl Drop for ResolvingOwnFault {
    #[inline]
    fn drop(&mut self) {
        RESOLVING_OWN_FAULT.with(|d| d.set(d.get() - 1));
    }
}

/// Whether this thread is inside an in-thread resolve (its own fault, in its
/// SIGBUS handler): the store's reads then sleep for their reply rather than
/// poll (`store/redis/link.rs`), also in a space of handler threads with
/// `UMM_MAP_INTHREAD` regions.
#[inline]
pub(crate) fn resolving_own_fault() -> bool {
    RESOLVING_OWN_FAULT.with(|d| d.get() > 0)
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
