//! The heap on a space from C: `umm_malloc`, `umm_calloc`, `umm_realloc`,
//! `umm_aligned_alloc`, `umm_free`, `umm_malloc_usable_size`,
//! `umm_heap_owns` (the heap itself is `heap.rs` and `boundary/heap.rs`).
//!
//! Small blocks (up to `SMALL_MAX_BYTES`, at the default alignment) come
//! from the heap's slabs, which tell a block's size class and whether it is
//! live from a side table indexed by address: no header, and a free (or a
//! double free, refused) reads and writes nothing of the block. Usable size:
//! the class's size.
//!
//! Every other block (aligned ones, medium, large) carries a 16-byte header
//! right before the pointer returned: the size asked for and a check word
//! (the alignment, mixed with the size and a constant). A header is read
//! only under the heap's lock and only where the heap holds memory mapped
//! (an arena, or a live large allocation's region): a freed large block's
//! region is unmapped, so its header must not be read. A pointer outside
//! that memory, or whose check word is wrong (not from `umm_malloc`, or
//! freed already: a free clears it), is refused: a message on stderr,
//! nothing freed, nothing corrupted. Unlike the other calls of the ABI,
//! these read and write the header directly (as `free(3)` does): a pointer
//! into an arena that no call here returned is undefined behaviour, as it
//! is for `free(3)`.

use std::alloc::Layout;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::copy::copy_out_sized_words;
use super::{guard, space, umm_space};
use crate::heap::small::{Cached, SmallFree};
use crate::heap::{CachedMalloc, HeapStats};
use crate::{Errno, GlobalHeap, Space};

const HEADER: usize = 16;
/// The smallest alignment handed out (as glibc's `malloc` on x86-64).
const MIN_ALIGN: usize = 16;
/// The largest alignment `umm_aligned_alloc` takes.
const MAX_ALIGN: usize = 1 << 30;
const MAGIC: usize = 0x756d_6d5f_6865_6170; // "umm_heap"

fn check_word(size: usize, align: usize) -> usize {
    MAGIC ^ size.rotate_left(21) ^ align
}

/// The underlying allocation of a C allocation of `size` at `align`
/// (`align` ≥ [`MIN_ALIGN`]): the header fits in the `align` bytes before
/// the pointer returned.
fn outer(size: usize, align: usize) -> Result<Layout, Errno> {
    let total = size.checked_add(align).ok_or(Errno::ENOMEM)?;
    Layout::from_size_align(total, align).map_err(|_| Errno::ENOMEM)
}

fn alloc(sp: &Space, size: usize, align: usize, zeroed: bool) -> Result<*mut c_void, Errno> {
    if align <= MIN_ALIGN {
        if let Some(p) = sp.heap.alloc_small(sp, size, zeroed) {
            return p.map(|p| p.as_ptr() as *mut c_void).ok_or(Errno::ENOMEM);
        }
    }
    let align = align.max(MIN_ALIGN);
    let l = outer(size, align)?;
    let base = sp.heap.alloc_headed(sp, l, zeroed).ok_or(Errno::ENOMEM)?;
    let user = base.as_ptr() as usize + align;
    // SAFETY: `[base, base + align + size)` is a new allocation, ours to
    // write; the header's 16 bytes lie in its first `align` (≥ 16) bytes,
    // 8-aligned.
    unsafe {
        let h = (user - HEADER) as *mut usize;
        h.write(size);
        h.add(1).write(check_word(size, align));
    }
    Ok(user as *mut c_void)
}

/// The `(size, align)` in `p`'s header, `None` if the check word is wrong.
///
/// # Safety
/// The 16 bytes before `p` are mapped: the heap holds them (an arena, or a
/// live large allocation) and its lock is held ([`HeapCore::with_held`],
/// [`HeapCore::dealloc_checked`]).
///
/// [`HeapCore::with_held`]: crate::boundary::heap::HeapCore::with_held
/// [`HeapCore::dealloc_checked`]: crate::boundary::heap::HeapCore::dealloc_checked
unsafe fn header(p: usize) -> Option<(usize, usize)> {
    // SAFETY: the caller's.
    let (size, check) = unsafe {
        let h = (p - HEADER) as *const usize;
        (h.read(), h.add(1).read())
    };
    let align = check ^ MAGIC ^ size.rotate_left(21);
    let ok = align.is_power_of_two() && (MIN_ALIGN..=MAX_ALIGN).contains(&align) && p.is_multiple_of(align);
    ok.then_some((size, align))
}

static WARNED: AtomicBool = AtomicBool::new(false);

#[cold]
fn refuse(what: &str, p: usize) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("usermm: {what}({p:#x}): not a live allocation of this space's heap (bad or double free); ignored");
    }
}

/// Whether `p` lies inside the reservation.
fn in_space(sp: &Space, p: usize) -> bool {
    let (base, len) = sp.reservation();
    p.wrapping_sub(base) < len
}

/// Whether `p` may be a block with a header: inside the reservation, at
/// least a header past its start.
fn may_have_header(sp: &Space, p: usize) -> bool {
    in_space(sp, p) && p - sp.reservation().0 >= HEADER
}

fn free(sp: &Space, p: usize) {
    if p == 0 || free_small(sp, p) {
        return;
    }
    if !may_have_header(sp, p) {
        return refuse("umm_free", p);
    }
    // The header is read, checked and cleared under the same hold of the
    // heap's lock as the free, and only if the heap holds its memory.
    let block = || {
        // SAFETY: `dealloc_checked` runs this under the lock, the header's
        // memory held.
        let (size, align) = unsafe { header(p) }?;
        let l = outer(size, align).ok()?;
        // SAFETY: as above; clearing the check word makes a second free
        // fail the check.
        unsafe { ((p - HEADER) as *mut usize).add(1).write(0) };
        Some(((p - align) as *mut u8, l))
    };
    // SAFETY: the header checked out: `p - align` is a live allocation of
    // `l` (a large one is checked against the heap's set of them).
    if !unsafe { sp.heap.dealloc_checked(sp, p - HEADER, block) } {
        refuse("umm_free", p);
    }
}

/// Frees `p` if it lies in a slab: whether it did (or refused it, with
/// the message); `false` for any other pointer, left to [`free`].
#[inline]
pub(crate) fn free_small(sp: &Space, p: usize) -> bool {
    match sp.heap.free_small(sp, p) {
        SmallFree::Freed(_) => true,
        SmallFree::Refused => {
            refuse("umm_free", p);
            true
        }
        SmallFree::NotSmall => false,
    }
}

/// `p`'s header, read under the heap's lock if the heap holds its memory.
fn held_header(sp: &Space, p: usize) -> Option<(usize, usize)> {
    if !may_have_header(sp, p) {
        return None;
    }
    // SAFETY: `with_held` runs this under the lock, the header's memory held.
    sp.heap.with_held(p - HEADER, || unsafe { header(p) }).flatten()
}

fn realloc(sp: &Space, p: usize, size: usize) -> Result<*mut c_void, Errno> {
    if p == 0 {
        return alloc(sp, size, MIN_ALIGN, false);
    }
    match sp.heap.small_usable(p) {
        Ok(usable) => {
            // Kept when the new size has the same class; moved otherwise.
            if sp.heap.alloc_small_class(sp, size) == sp.heap.alloc_small_class(sp, usable) {
                return Ok(p as *mut c_void);
            }
            let q = alloc(sp, size, MIN_ALIGN, false)?;
            // SAFETY: both live, distinct, each at least the smaller size.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, usable.min(size)) };
            free(sp, p);
            return Ok(q);
        }
        Err(SmallFree::Refused) => {
            refuse("umm_realloc", p);
            return Err(Errno::EINVAL);
        }
        Err(_) => {}
    }
    let Some((old, align)) = held_header(sp, p) else {
        refuse("umm_realloc", p);
        return Err(Errno::EINVAL);
    };
    let new_outer = outer(size, align)?;
    if align == MIN_ALIGN {
        // SAFETY: the header checked out: `p - align` is a live allocation
        // of `outer(old, align)`.
        let base = unsafe { sp.heap.realloc_headed(sp, (p - align) as *mut u8, outer(old, align)?, new_outer.size()) }
            .ok_or(Errno::ENOMEM)?;
        let user = base.as_ptr() as usize + align;
        // SAFETY: the (possibly moved) allocation's header, ours to write.
        unsafe {
            let h = (user - HEADER) as *mut usize;
            h.write(size);
            h.add(1).write(check_word(size, align));
        }
        return Ok(user as *mut c_void);
    }
    let q = alloc(sp, size, align, false)?;
    // SAFETY: both live, distinct, each at least the smaller size.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size)) };
    free(sp, p);
    Ok(q)
}

/// `umm_malloc`: `size` bytes from the space's heap, 16-byte aligned
/// (`size` 0 gives a unique pointer). NULL + `ENOMEM` when the space has no
/// room left (its reservation, region limit); `EINVAL` for a NULL space.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
#[no_mangle]
pub unsafe extern "C" fn umm_malloc(s: *mut umm_space, size: usize) -> *mut c_void {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(std::ptr::null_mut(), || alloc(sp?, size, MIN_ALIGN, false))
}

/// `umm_calloc`: `n * size` zeroed bytes; `ENOMEM` when the product
/// overflows.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
#[no_mangle]
pub unsafe extern "C" fn umm_calloc(s: *mut umm_space, n: usize, size: usize) -> *mut c_void {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(std::ptr::null_mut(), || {
        let sp = sp?;
        alloc(sp, n.checked_mul(size).ok_or(Errno::ENOMEM)?, MIN_ALIGN, true)
    })
}

/// `umm_aligned_alloc`: `size` bytes aligned to `align`, a power of two up
/// to 1 GiB (`EINVAL` otherwise, as glibc's `aligned_alloc`).
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
#[no_mangle]
pub unsafe extern "C" fn umm_aligned_alloc(s: *mut umm_space, align: usize, size: usize) -> *mut c_void {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(std::ptr::null_mut(), || {
        let sp = sp?;
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Errno::EINVAL);
        }
        alloc(sp, size, align, false)
    })
}

/// `umm_realloc`: as `realloc(3)`: NULL `p` is `umm_malloc`; `size` 0 frees
/// `p` and returns NULL; on failure `p` is untouched (NULL + `ENOMEM`). The
/// alignment of a `umm_aligned_alloc` block is kept.
///
/// # Safety
/// `s` must be NULL or a live handle, and `p` NULL or a live allocation of
/// the space's heap.
#[no_mangle]
pub unsafe extern "C" fn umm_realloc(s: *mut umm_space, p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(std::ptr::null_mut(), || {
        let sp = sp?;
        if size == 0 && !p.is_null() {
            free(sp, p as usize);
            return Ok(std::ptr::null_mut());
        }
        realloc(sp, p as usize, size)
    })
}

/// `umm_free`: frees what the heap calls returned (NULL: nothing). A
/// pointer that is not a live allocation is refused with a message, once.
///
/// # Safety
/// `s` must be NULL or a live handle, and `p` NULL or a live allocation of
/// the space's heap.
#[no_mangle]
pub unsafe extern "C" fn umm_free(s: *mut umm_space, p: *mut c_void) {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard((), || {
        free(sp?, p as usize);
        Ok(())
    })
}

/// `umm_malloc_usable_size`: a small block's class size, another block's
/// size asked for (0 for NULL or a pointer that is not a live allocation).
///
/// # Safety
/// As for [`umm_free`].
#[no_mangle]
pub unsafe extern "C" fn umm_malloc_usable_size(s: *mut umm_space, p: *mut c_void) -> usize {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(0, || {
        let (sp, p) = (sp?, p as usize);
        Ok(match sp.heap.small_usable(p) {
            Ok(usable) => usable,
            Err(SmallFree::Refused) => 0,
            Err(_) => held_header(sp, p).map_or(0, |(size, _)| size),
        })
    })
}

/// `umm_heap_owns`: 1 if `p` lies in the space's reservation (so a free of
/// it belongs to `umm_free`), 0 otherwise (also for a NULL or stale space).
/// `usermm_compat.h`'s `free` uses it to hand other pointers to the C
/// library's.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`).
#[no_mangle]
pub unsafe extern "C" fn umm_heap_owns(s: *mut umm_space, p: *const c_void) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(0, || Ok(sp.is_ok_and(|sp| in_space(sp, p as usize)) as c_int))
}

/// The C allocator's common cases on a [`GlobalHeap`] (the `usermm run`
/// preload library's `malloc` and `free`).
impl GlobalHeap {
    /// `malloc(size)`'s common case for a C allocator on this heap (the
    /// `usermm run` preload library): a small block from the calling
    /// thread's cache, with one thread-local lookup and no lock. A block
    /// from here is freed as `umm_free` frees it (by address, no header).
    #[inline]
    pub fn malloc_cached(&self, size: usize) -> CachedMalloc {
        let Some(sp) = self.space_if_open() else { return CachedMalloc::Slow };
        match sp.heap.alloc_small_cached(size) {
            Cached::System => CachedMalloc::System,
            Cached::Miss => CachedMalloc::Slow,
            Cached::Block(p) => CachedMalloc::Block(p),
        }
    }

    /// `free(p)`'s common case for a C allocator on this heap: whether `p`
    /// was a small block's address, which is then freed, or refused with
    /// `umm_free`'s message (a double free, or not a block's start).
    /// `false`: not in a slab (or the space is not open): free it with
    /// `umm_free`.
    #[inline]
    pub fn free_small(&self, p: usize) -> bool {
        match self.space_if_open() {
            Some(sp) => free_small(sp, p),
            None => false,
        }
    }
}

/// `struct umm_heap_stats`'s words after `size`, in the header's order.
pub(crate) fn heap_stats_words(h: &HeapStats) -> [u64; 7] {
    [h.arena_bytes, h.arenas, h.large_bytes, h.large_regions, h.live_bytes, h.live_allocations, h.lazily_freed_bytes]
}

/// `umm_heap_stats`: the heap's counters ([`HeapStats`]) into `*out`, as
/// many whole words after `out->size` as it says fit (the rest of a larger
/// struct zeroed). `EINVAL` for NULL or `size < 8`, `EFAULT` for an `out`
/// that cannot be read or written.
///
/// # Safety
/// `s` must be NULL or a live handle (see `usermm.h`). `out` need not be
/// valid: it is only copied through (`EFAULT` when bad).
#[no_mangle]
pub unsafe extern "C" fn umm_heap_stats(s: *mut umm_space, out: *mut c_void) -> c_int {
    // SAFETY: `s` is NULL or a live handle (this function's contract).
    let sp = unsafe { space(s) };
    guard(-1, || {
        let sp = sp?;
        copy_out_sized_words(sp, out as usize, &heap_stats_words(&sp.heap().stats()))?;
        Ok(0)
    })
}
