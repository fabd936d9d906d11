//! A fixed table of lazily allocated chunks: `OnceLock<Box<[T]>>` per entry
//! in effect, with an entry one pointer wide and the table itself zeroed
//! memory from the allocator (`calloc`: a large table is fresh pages, so a
//! table for a 64 GiB reservation costs nothing until its entries are set).
//! A lookup is one load of the entry.

use std::alloc::Layout;
use std::sync::atomic::{AtomicPtr, Ordering};

/// `n` entries, each `None` or a chunk of `len` values of `T`, set once.
pub struct LazyChunks<T> {
    entries: Box<[AtomicPtr<T>]>,
    len: usize,
}

// SAFETY: the chunks are owned by the table and shared only as `&[T]`
// (which needs `T: Sync` to cross threads); setting one moves a `Box<[T]>`
// built by one thread into the table (`T: Send`).
unsafe impl<T: Send + Sync> Sync for LazyChunks<T> {}
// SAFETY: as above: dropping the table drops the chunks, wherever it is.
unsafe impl<T: Send> Send for LazyChunks<T> {}

impl<T> LazyChunks<T> {
    /// A table of `n` unset entries of chunks of `len` values (`len > 0`).
    pub fn new(n: usize, len: usize) -> LazyChunks<T> {
        assert!(len > 0, "a chunk holds at least one value");
        let entries = if n == 0 {
            Box::new([])
        } else {
            let layout = Layout::array::<AtomicPtr<T>>(n).expect("a table that fits the address space");
            // SAFETY: `layout` has a nonzero size; a null result is handled
            // (the allocator's error handler); the block is `n` zeroed
            // `AtomicPtr<T>`, each a valid null pointer (same layout as
            // `*mut T`), owned by the box from here on.
            unsafe {
                let p = std::alloc::alloc_zeroed(layout).cast::<AtomicPtr<T>>();
                if p.is_null() {
                    std::alloc::handle_alloc_error(layout);
                }
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n))
            }
        };
        LazyChunks { entries, len }
    }

    /// Entries in the table.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`'s chunk, if set (`None` too for `i` out of range).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&[T]> {
        let p = self.entries.get(i)?.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null entry is a chunk of `len` values leaked from a
        // `Box<[T]>` by `get_or_init`, freed only by `drop`, which `&self`
        // outlives.
        Some(unsafe { std::slice::from_raw_parts(p, self.len) })
    }

    /// Entry `i`'s chunk, made with `f` (one value at a time) if unset. Two
    /// threads may both build one; one wins, the other's is dropped.
    /// Panics for `i` out of range.
    pub fn get_or_init(&self, i: usize, f: impl FnMut() -> T) -> &[T] {
        if let Some(c) = self.get(i) {
            return c;
        }
        let chunk: Box<[T]> = std::iter::repeat_with(f).take(self.len).collect();
        let p = Box::into_raw(chunk).cast::<T>();
        match self.entries[i].compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(_) => {
                // SAFETY: `p` is the chunk leaked just above, never shared.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, self.len)) });
            }
        }
        self.get(i).expect("an entry set just now")
    }
}

impl<T> Drop for LazyChunks<T> {
    fn drop(&mut self) {
        for e in self.entries.iter() {
            let p = e.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: a chunk `get_or_init` leaked from a `Box<[T]>` of
                // `len` values; no reference to it outlives `&mut self`.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, self.len)) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn entries_are_set_once_and_dropped_with_the_table() {
        let t: LazyChunks<AtomicUsize> = LazyChunks::new(1000, 3);
        assert!(t.get(0).is_none() && t.get(999).is_none() && t.get(1000).is_none());
        let c = t.get_or_init(7, || AtomicUsize::new(5));
        c[2].store(9, Ordering::Relaxed);
        assert_eq!(t.get(7).unwrap()[2].load(Ordering::Relaxed), 9);
        assert_eq!(t.get_or_init(7, || AtomicUsize::new(0))[0].load(Ordering::Relaxed), 5);
        assert!(t.get(6).is_none());
        let racing: LazyChunks<Vec<u8>> = LazyChunks::new(1, 2);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| assert_eq!(racing.get_or_init(0, || vec![1u8; 10])[1].len(), 10));
            }
        });
        assert_eq!(LazyChunks::<u8>::new(0, 1).entries(), 0);
    }
}
