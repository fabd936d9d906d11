//! The preload library's `unsafe` half (the routing policy and its docs are
//! in `lib.rs`): the exported malloc family, the C library's own allocator
//! (`__libc_malloc` and friends) as this library's `#[global_allocator]`,
//! and the constructor that opens the space.
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
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::Relaxed};

use usermm::capi::{
    umm_aligned_alloc, umm_calloc, umm_free, umm_malloc, umm_malloc_usable_size, umm_realloc, umm_space,
};
use usermm::Space;

use crate::{for_block, in_space, on_space, COUNTS};

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
const PAGE: usize = 4096;

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
    COUNTS.space.fetch_add(1, Relaxed);
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
        if in_space(p as usize) {
            // SAFETY: `h` is a live handle; `p` lies in its reservation, so
            // the heap handed it out (the caller's promise).
            if for_block(|sp| unsafe { umm_free(handle(sp), p) }).is_none() {
                // A forked child: the parent's block is not here to free.
                COUNTS.child_frees.fetch_add(1, Relaxed);
            }
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
        if in_space(p as usize) {
            // SAFETY: as in `free`.
            return for_block(|sp| unsafe { umm_realloc(handle(sp), p, size) }).unwrap_or_else(|| {
                // A forked child: the parent's block cannot be read.
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

/// glibc's `pthread_create` (the exported name is this library's): 0 until
/// looked up, 1 when it is not there.
static LIBC_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

/// `pthread_create(3)`, glibc's, with every allocation it makes coming from
/// the C library: the new thread's TLS vector (`dtv`, which glibc `calloc`s
/// here) is read by every `__tls_get_addr`, also by usermm's own code while
/// it holds the space's locks; on the space, an evicted `dtv` page would make
/// that access fault while the fault handler waits for those locks.
///
/// # Safety
/// `pthread_create(3)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let mut f = LIBC_PTHREAD_CREATE.load(Relaxed);
    if f == 0 {
        const NAME: &[u8] = b"pthread_create\0";
        // SAFETY: `NAME` is NUL-terminated.
        let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, NAME.as_ptr() as *const c_char) };
        f = if sym.is_null() { 1 } else { sym as usize };
        LIBC_PTHREAD_CREATE.store(f, Relaxed);
    }
    if f == 1 {
        return libc::ENOSYS;
    }
    // SAFETY: `f` is glibc's `pthread_create`, of this signature.
    let real: PthreadCreate = unsafe { std::mem::transmute(f) };
    let _libc = crate::LibcOnly::enter();
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(thread, attr, start, arg) }
}

/// `malloc_usable_size(3)`: for a block of the space's, the size asked for.
///
/// # Safety
/// `p` is NULL or a live block of this malloc family's.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    guard(0, || {
        if p.is_null() {
            return 0;
        }
        if in_space(p as usize) {
            // SAFETY: as in `free`.
            return for_block(|sp| unsafe { umm_malloc_usable_size(handle(sp), p) }).unwrap_or(0);
        }
        libc_usable_size(p).unwrap_or(0)
    })
}

/// The copy of stderr the exit report goes to (-1: none, use fd 2).
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

/// The lowest descriptor the copy may take: far above the ones a program
/// opens first (some count on getting 3, 4, …).
const REPORT_FD_MIN: c_int = 500;

/// Keeps a copy of stderr (close-on-exec) for the exit report.
pub(crate) fn keep_stderr() {
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` only makes a new descriptor.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, REPORT_FD_MIN) };
    REPORT_FD.store(fd, Relaxed);
}

/// Writes `text` to the copy of stderr (or to stderr) in as few writes as
/// it takes.
pub(crate) fn write_report(text: &str) {
    let fd = match REPORT_FD.load(Relaxed) {
        -1 => 2,
        fd => fd,
    };
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is valid for reads of its length.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// The SIGSEGV action a forked child had before [`child_segv`] (a leaked
/// `sigaction`; NULL: none saved).
static OLD_SEGV: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// Appends `n` in decimal (`base` 10) or hex (16) to `buf` at `*at`.
fn put_num(buf: &mut [u8], at: &mut usize, mut n: usize, base: usize) {
    let mut digits = [0u8; 20];
    let mut k = 0;
    loop {
        digits[k] = b"0123456789abcdef"[n % base];
        k += 1;
        n /= base;
        if n == 0 {
            break;
        }
    }
    while k > 0 && *at < buf.len() {
        k -= 1;
        buf[*at] = digits[k];
        *at += 1;
    }
}

fn put(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    let n = s.len().min(buf.len() - *at);
    buf[*at..*at + n].copy_from_slice(&s[..n]);
    *at += n;
}

/// A forked child's first SIGSEGV: if it is a touch of the parent's heap
/// (not inherited: the space is not), says so on stderr; then puts the
/// child's own SIGSEGV action back and returns, so the access faults again
/// under it (by default: death by SIGSEGV, as without this handler).
/// Async-signal-safe: atomics, `write`, `sigaction`, no allocation.
extern "C" fn child_segv(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if in_space(addr) {
        let mut buf = [0u8; 256];
        let mut at = 0;
        put(&mut buf, &mut at, b"usermm run: pid ");
        // SAFETY: getpid has no preconditions.
        put_num(&mut buf, &mut at, unsafe { libc::getpid() } as usize, 10);
        put(&mut buf, &mut at, b": a forked child touched its parent's heap at 0x");
        put_num(&mut buf, &mut at, addr, 16);
        put(&mut buf, &mut at, b" (SIGSEGV): a child gets no space; it must exec before touching the heap\n");
        // SAFETY: `buf[..at]` is valid for reads.
        unsafe { libc::write(2, buf.as_ptr().cast(), at) };
    }
    let old = OLD_SEGV.load(Relaxed);
    // SAFETY: `old` is NULL or the leaked action saved by `after_fork_child`;
    // resetting to SIG_DFL has no preconditions.
    unsafe {
        if old.is_null() {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        } else {
            libc::sigaction(libc::SIGSEGV, old, std::ptr::null_mut());
        }
    }
}

/// `pthread_atfork`'s child handler: when the parent had a space, the
/// child's first SIGSEGV goes through [`child_segv`].
extern "C" fn after_fork_child() {
    guard((), || {
        if !crate::had_space() {
            return;
        }
        // SAFETY: plain-data structs, initialised before use; `old` is
        // leaked (once per fork) so the handler may read it at any time.
        unsafe {
            let old: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = child_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGSEGV, &sa, old) == 0 {
                OLD_SEGV.store(old, Relaxed);
            }
        }
    });
}

extern "C" fn constructor() {
    let report = guard(false, crate::init);
    // SAFETY: `at_exit` and `after_fork_child` are plain `extern "C"`
    // functions that never unwind.
    unsafe {
        if report {
            libc::atexit(at_exit);
        }
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
}

extern "C" fn at_exit() {
    guard((), crate::report);
}

/// Runs when the dynamic loader initialises the library: after the C
/// library, before the program's own constructors and `main`.
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
