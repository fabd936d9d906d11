//! The preload library's `unsafe` half (the routing policy and its docs are
//! in `lib.rs`): the exported malloc family, the C library's own allocator
//! (`__libc_malloc` and friends) as this library's `#[global_allocator]`,
//! and the constructor that opens the space. Its parts: `calls.rs` (the
//! memory calls' exported names), `program.rs` (a program's memory calls
//! routed), `signals.rs` (SIGBUS's action), `creds.rs` (credential
//! changes: usermm's threads follow the program's), `files.rs` (the opens
//! of a memory cgroup's limit file), `libc_only.rs` (calls run on the
//! C library's memory), `init.rs` (the constructor and the exit report).
//!
//! Invariants:
//! - Nothing unwinds into C: every exported body runs under
//!   [`guard`] (`catch_unwind`; the workspace builds with `panic=unwind`),
//!   and a panic is reported as the call's failure (NULL, `ENOMEM`).
//! - No Rust allocation of this library (nor of usermm inside it) reaches
//!   the exported `malloc`: [`LibcMalloc`] calls `__libc_*` directly.
//! - A block is freed by the allocator whose addresses it lies in: the
//!   space's reservation is the heap's (`umm_free`, which checks the
//!   block's header), anything else the C library's (`__libc_free`).

#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::Relaxed};

use usermm::capi::{
    umm_aligned_alloc, umm_calloc, umm_free, umm_malloc, umm_malloc_usable_size, umm_realloc, umm_space,
};
use usermm::Space;

use crate::{
    count, pieces, place, program_call, region_at, region_sealed, route_mmap, with_space, MapRoute, Place, Why,
};
use crate::{for_block, free_cached, in_ancestors, in_space, malloc_cached, on_space, COUNTS};
use libc::c_long;
use usermm::Errno;

#[macro_use]
mod calls;
mod creds;
mod files;
mod init;
mod libc_only;
mod program;
mod signals;
pub(crate) use calls::find_own_range;
use calls::*;
use init::*;
pub(crate) use init::{keep_report_fd, write_report};
use program::*;
pub(crate) use signals::find_signal_calls;

extern "C" {
    // glibc's own allocator under its public names' feet, exported
    // (GLIBC_2.2.5) for allocators that stand in for `malloc`.
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
}

/// The alignment of every `malloc` block on x86-64 (glibc's and the space
/// heap's alike).
const MIN_ALIGN: usize = 16;
/// The host's page size, for `valloc` and `pvalloc`.
pub(crate) const PAGE: usize = 4096;

/// Runs `f`; a panic gives `fail` (and is not unwound into C).
fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            // Dropping the payload could panic again; leak it.
            std::mem::forget(payload);
            fail
        }
    }
}

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid
    // and writable for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// The C handle of a space (as `umm_default_space` makes it).
fn handle(sp: &Space) -> *mut umm_space {
    sp as *const Space as *mut umm_space
}

/// This library's own allocations (and usermm's inside it): the C
/// library's allocator, never the exported `malloc`.
struct LibcMalloc;

// SAFETY: each method forwards to glibc's allocator, which returns memory
// of at least the size asked at `MIN_ALIGN` (`__libc_malloc`, `__libc_calloc`,
// `__libc_realloc`) or at the alignment asked (`__libc_memalign`), and frees
// (`__libc_free`) any of them; `realloc` of an over-aligned block allocates,
// copies and frees, as `GlobalAlloc`'s default does.
unsafe impl GlobalAlloc for LibcMalloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls of glibc's allocator.
        unsafe {
            if l.align() <= MIN_ALIGN {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= MIN_ALIGN {
            // SAFETY: a plain call of glibc's allocator.
            return unsafe { __libc_calloc(1, l.size()) }.cast();
        }
        // SAFETY: the caller's promises (a nonzero size); a non-null result
        // is a fresh block of `l.size()` bytes, ours to write.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                p.write_bytes(0, l.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: `p` came from one of glibc's calls above (the caller's
        // promise).
        unsafe { __libc_free(p.cast()) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if l.align() <= MIN_ALIGN {
            // SAFETY: `p` is a live block of glibc's (the caller's promise).
            return unsafe { __libc_realloc(p.cast(), new_size) }.cast();
        }
        // SAFETY: the caller's promises: `p` is live with layout `l`, and
        // `new_size` with `l`'s alignment is a valid layout; the new block
        // and the old are distinct and each at least the smaller size.
        unsafe {
            let n = Layout::from_size_align_unchecked(new_size, l.align());
            let q = self.alloc(n);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                self.dealloc(p, l);
            }
            q
        }
    }
}

#[global_allocator]
static ALLOC: LibcMalloc = LibcMalloc;

/// glibc's `malloc_usable_size` (the exported name is this library's), found
/// with `dlsym(RTLD_NEXT)`: 0 until looked up, 1 when it is not there.
static LIBC_USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// The usable size of a block of the C library's, `None` if glibc's
/// `malloc_usable_size` cannot be found.
fn libc_usable_size(p: *mut c_void) -> Option<usize> {
    let mut f = LIBC_USABLE_SIZE.load(Relaxed);
    if f == 0 {
        const NAME: &[u8] = b"malloc_usable_size\0";
        // SAFETY: `NAME` is NUL-terminated; `dlsym` allocates (if at all)
        // through `calloc`, which this thread's re-entry sends to glibc.
        let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, NAME.as_ptr() as *const c_char) };
        f = if sym.is_null() { 1 } else { sym as usize };
        LIBC_USABLE_SIZE.store(f, Relaxed);
    }
    if f == 1 {
        return None;
    }
    // SAFETY: `f` is glibc's `malloc_usable_size`, of this signature; `p` is
    // a live block of glibc's (the caller's).
    let usable: unsafe extern "C" fn(*mut c_void) -> usize = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    Some(unsafe { usable(p) })
}

/// A block from the space's heap (`Some(NULL)`: the space refused it), or
/// `None` when the allocation is not the space's (see `lib.rs`).
fn space_alloc(f: impl FnOnce(*mut umm_space) -> *mut c_void) -> Option<*mut c_void> {
    let p = on_space(|sp| f(handle(sp)))?;
    if p.is_null() {
        COUNTS.refused.fetch_add(1, Relaxed);
        return None;
    }
    if crate::counting_space() {
        COUNTS.space.fetch_add(1, Relaxed);
    }
    Some(p)
}

/// An aligned block: the space's, or glibc's `memalign`. `align` is a power
/// of two (rounded up here if not, as glibc's `memalign` does).
fn aligned(align: usize, size: usize) -> *mut c_void {
    let align = align.max(MIN_ALIGN).checked_next_power_of_two().unwrap_or(0);
    if align == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: `h` is a live handle (the space `on_space` lends).
    if let Some(p) = space_alloc(|h| unsafe { umm_aligned_alloc(h, align, size) }) {
        return p;
    }
    // SAFETY: a plain call of glibc's allocator.
    unsafe { __libc_memalign(align, size) }
}

/// `malloc(3)`.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if let Some(p) = malloc_cached(size) {
            return p as *mut c_void;
        }
        // SAFETY: `h` is a live handle (the space `on_space` lends).
        if let Some(p) = space_alloc(|h| unsafe { umm_malloc(h, size) }) {
            return p;
        }
        // SAFETY: a plain call of glibc's allocator.
        unsafe { __libc_malloc(size) }
    })
}

/// `calloc(3)`.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if n.checked_mul(size).is_none() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        // SAFETY: `h` is a live handle (the space `on_space` lends).
        if let Some(p) = space_alloc(|h| unsafe { umm_calloc(h, n, size) }) {
            return p;
        }
        // SAFETY: a plain call of glibc's allocator.
        unsafe { __libc_calloc(n, size) }
    })
}

/// `free(3)`: by address (see the module docs).
///
/// # Safety
/// `p` is NULL or a live block of this malloc family's (`free(3)`'s
/// contract).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    guard((), || {
        if p.is_null() {
            return;
        }
        if in_ancestors(p as usize) {
            // A forked child: the parent's block is not here to free.
            COUNTS.child_frees.fetch_add(1, Relaxed);
            return;
        }
        if in_space(p as usize) {
            if free_cached(p as usize) {
                return;
            }
            // SAFETY: `h` is a live handle; `p` lies in its reservation, so
            // the heap handed it out (the caller's promise).
            for_block(|sp| unsafe { umm_free(handle(sp), p) });
            return;
        }
        // SAFETY: outside the reservation, the block is glibc's (the
        // caller's promise that it is live).
        unsafe { __libc_free(p) }
    })
}

/// `realloc(3)`: a block of the space's is resized there, a block of the C
/// library's by the C library (never moved onto the space: glibc grows a
/// thread's TLS vector with `realloc`, and that must stay off the space).
///
/// # Safety
/// As for [`free`].
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if p.is_null() {
            return malloc(size);
        }
        if in_ancestors(p as usize) {
            // A forked child: the parent's block cannot be read.
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        if in_space(p as usize) {
            // SAFETY: as in `free`.
            return for_block(|sp| unsafe { umm_realloc(handle(sp), p, size) }).unwrap_or_else(|| {
                set_errno(libc::ENOMEM);
                std::ptr::null_mut()
            });
        }
        // SAFETY: outside the reservation, the block is glibc's.
        unsafe { __libc_realloc(p, size) }
    })
}

/// `reallocarray(3)`.
///
/// # Safety
/// As for [`free`].
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: the caller's promises, forwarded.
        Some(bytes) => unsafe { realloc(p, bytes) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// `posix_memalign(3)`: `EINVAL` for an alignment that is not a power of
/// two multiple of `sizeof(void *)`, `ENOMEM` when there is no memory.
///
/// # Safety
/// `out` must be valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    guard(libc::ENOMEM, || {
        if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
            return libc::EINVAL;
        }
        let p = aligned(align, size);
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller's promise.
        unsafe { out.write(p) };
        0
    })
}

/// `aligned_alloc(3)` (glibc 2.36's: `memalign`'s rules).
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || aligned(align, size))
}

/// `memalign(3)`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || aligned(align, size))
}

/// `valloc(3)`: page-aligned.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || aligned(PAGE, size))
}

/// `pvalloc(3)`: page-aligned, the size rounded up to whole pages.
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    guard(std::ptr::null_mut(), || match size.max(1).checked_next_multiple_of(PAGE) {
        Some(n) => aligned(PAGE, n),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    })
}

/// `malloc_usable_size(3)`: for a block of the space's, the size asked for.
///
/// # Safety
/// `p` is NULL or a live block of this malloc family's.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    guard(0, || {
        if p.is_null() || in_ancestors(p as usize) {
            return 0;
        }
        if in_space(p as usize) {
            // SAFETY: as in `free`.
            return for_block(|sp| unsafe { umm_malloc_usable_size(handle(sp), p) }).unwrap_or(0);
        }
        libc_usable_size(p).unwrap_or(0)
    })
}
