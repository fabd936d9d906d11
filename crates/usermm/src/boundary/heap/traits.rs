//! The allocator traits over the heap: [`GlobalAlloc`] for [`GlobalHeap`]
//! (a program's, or usermm's own, global allocator) and `allocator_api2`'s
//! `Allocator` for [`Heap`].

use super::*;

// SAFETY: every method forwards to the heap of the space `self.space()`
// returns, which serves the `GlobalAlloc` contract: fresh memory of at least
// the layout's size and alignment, freed only through `dealloc` with the
// layout it was allocated (or reallocated) with, which the caller of these
// methods promises. Allocations the heap cannot take (usermm's own threads,
// the heap's own slow path, no space) go to `System`, and a pointer is
// freed (or resized) by the allocator whose address range it lies in: the
// space's reservation is the heap's, anything else `System`'s.
unsafe impl GlobalAlloc for GlobalHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !system_only() {
            if let Some(sp) = self.space().filter(|sp| !sp.threads_starting()) {
                return sp.heap.alloc(sp, layout).map_or(std::ptr::null_mut(), NonNull::as_ptr);
            }
        }
        // SAFETY: forwarded with the caller's promises.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !system_only() {
            if let Some(sp) = self.space().filter(|sp| !sp.threads_starting()) {
                return sp.heap.alloc_zeroed(sp, layout).map_or(std::ptr::null_mut(), NonNull::as_ptr);
            }
        }
        // SAFETY: forwarded with the caller's promises.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.owns(ptr as usize) {
            if let Some(sp) = self.space() {
                // SAFETY: the caller's promises; the pointer is in the
                // space's reservation, so the heap allocated it.
                unsafe { sp.heap.dealloc(sp, ptr, layout) };
            }
            // No space: a forked child, which cannot free into the parent's
            // heap; the memory is not there anyway.
            return;
        }
        // SAFETY: forwarded; outside the reservation, `System` allocated it.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.owns(ptr as usize) {
            return match self.space() {
                Some(sp) => {
                    // SAFETY: as in `dealloc`.
                    unsafe { sp.heap.realloc(sp, ptr, layout, new_size) }.map_or(std::ptr::null_mut(), NonNull::as_ptr)
                }
                None => std::ptr::null_mut(),
            };
        }
        // SAFETY: forwarded; outside the reservation, `System` allocated it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

// SAFETY: `allocate` returns fresh memory of the layout from the space's
// heap (valid until deallocated; the `Heap` borrows the space, so the space
// outlives it), `deallocate`/`grow`/`shrink` take only what the heap handed
// out with its layout (the caller's promise), and copies of a `Heap` share
// one heap (they all name the same space).
unsafe impl Allocator for Heap<'_> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = self.space.heap.alloc(self.space, layout).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = self.space.heap.alloc_zeroed(self.space, layout).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's promises.
        unsafe { self.space.heap.dealloc(self.space, ptr.as_ptr(), layout) }
    }

    unsafe fn grow(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: the caller's promises (`new` is at least `old`).
        unsafe { self.resize(ptr, old, new) }
    }

    unsafe fn shrink(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: the caller's promises (`new` is at most `old`).
        unsafe { self.resize(ptr, old, new) }
    }
}

impl Heap<'_> {
    /// `grow` and `shrink`: `realloc` when the alignment stays, otherwise
    /// a new allocation and a copy.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this heap with layout `old`.
    unsafe fn resize(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let (sp, heap) = (self.space, &self.space.heap);
        let p = if new.align() == old.align() {
            // SAFETY: the caller's promises.
            unsafe { heap.realloc(sp, ptr.as_ptr(), old, new.size()) }.ok_or(AllocError)?
        } else {
            let p = heap.alloc(sp, new).ok_or(AllocError)?;
            // SAFETY: both live and distinct, each at least the smaller size.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr.as_ptr(), p.as_ptr(), old.size().min(new.size()));
                heap.dealloc(sp, ptr.as_ptr(), old);
            }
            p
        };
        Ok(NonNull::slice_from_raw_parts(p, new.size()))
    }
}
