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
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::Relaxed};

use usermm::capi::{
    umm_aligned_alloc, umm_calloc, umm_free, umm_malloc, umm_malloc_usable_size, umm_realloc, umm_space,
};
use usermm::Space;

use crate::{for_block, free_cached, in_ancestors, in_space, malloc_cached, on_space, COUNTS};

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

/// The C library's function `name` (NUL-terminated), found with
/// `dlsym(RTLD_NEXT)` once and kept in `cache` (0: not looked up yet, 1:
/// not there). Called with [`crate::LibcOnly`] entered: `dlsym` may
/// `calloc`.
fn next_fn(cache: &AtomicUsize, name: &[u8]) -> Option<usize> {
    let mut f = cache.load(Relaxed);
    if f == 0 {
        // SAFETY: `name` is NUL-terminated (the callers' literals).
        let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
        f = if sym.is_null() { 1 } else { sym as usize };
        cache.store(f, Relaxed);
    }
    (f != 1).then_some(f)
}

/// glibc's `cookie_io_functions_t` (four function pointers), passed by value
/// to `fopencookie`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CookieIoFunctions {
    read: usize,
    write: usize,
    seek: usize,
    close: usize,
}

/// Exports a C library function that allocates memory a forked child
/// touches before it can do anything else, calling glibc's with every
/// allocation it makes coming from the C library (`$fail` when glibc has
/// no such function):
/// - the streams (`fopen` and the others that make a `FILE`): glibc's
///   `fork` walks every open stream in the child (`fresetlockfiles`,
///   before any `pthread_atfork` handler runs) and resets the lock inside
///   it; a stream on the space, which the child does not have, killed
///   every child forked while one was open (LTP's harness forks its test
///   with a `setmntent` stream open). A stream's buffer, allocated at its
///   first read or write, stays the program's;
/// - the environment (`setenv`, `putenv`, `unsetenv`, `clearenv`): a
///   changed environment is an array glibc allocates, which `getenv` and
///   `execvp` in the child read (LTP's harness `putenv`s before it forks).
macro_rules! libc_only {
    ($fail:expr; $(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's own contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let _libc = crate::LibcOnly::enter();
            let Some(f) = next_fn(&NEXT, concat!(stringify!($name), "\0").as_bytes()) else {
                set_errno(libc::ENOSYS);
                return $fail;
            };
            // SAFETY: `f` is the C library's function of this name, of
            // this signature (its header's).
            let real: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller's promises, forwarded.
            unsafe { real($($arg),*) }
        }
    };
}

libc_only!(std::ptr::null_mut();
    /// `fopen(3)`, the C library's (see `libc_only!`).
    fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `fopen64(3)`, the C library's.
    fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `fdopen(3)`, the C library's.
    fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `popen(3)`, the C library's.
    popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `fopencookie(3)`, the C library's.
    fopencookie(cookie: *mut c_void, mode: *const c_char, funcs: CookieIoFunctions) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `fmemopen(3)`, the C library's (the stream; a buffer it allocates
    /// for a NULL `buf` too).
    fmemopen(buf: *mut c_void, size: usize, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `open_memstream(3)`, the C library's (the stream; the buffer it
    /// grows is the C library's too, and the program frees it by address).
    open_memstream(ptr: *mut *mut c_char, size: *mut usize) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `setmntent(3)`, the C library's (its `fopen` inside glibc does not
    /// come through this library's).
    setmntent(file: *const c_char, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `tmpfile(3)`, the C library's.
    tmpfile() -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut();
    /// `tmpfile64(3)`, the C library's.
    tmpfile64() -> *mut libc::FILE
);

libc_only!(-1;
    /// `setenv(3)`, the C library's (see `libc_only!`).
    setenv(name: *const c_char, value: *const c_char, overwrite: c_int) -> c_int
);
libc_only!(-1;
    /// `putenv(3)`, the C library's.
    putenv(string: *mut c_char) -> c_int
);
libc_only!(-1;
    /// `unsetenv(3)`, the C library's.
    unsetenv(name: *const c_char) -> c_int
);
libc_only!(-1;
    /// `clearenv(3)`, the C library's.
    clearenv() -> c_int
);

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
    if in_ancestors(addr) {
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

/// `pthread_atfork`'s child handler: the child is a generation further
/// (`lib.rs`); the reservations of its parent's space and its ancestors'
/// get a mapping with no access each, so nothing else is placed there; and
/// when the parent had a space, the child's first SIGSEGV goes through
/// [`child_segv`].
extern "C" fn after_fork_child() {
    guard((), || {
        let ranges = crate::after_fork_child();
        for &(base, end) in &ranges {
            // SAFETY: a fresh mapping with no access over a range that holds
            // no mapping in the child (the reservation is `MADV_DONTFORK`),
            // or the ancestors' placeholders already there (then
            // `MAP_FIXED_NOREPLACE` fails with `EEXIST` and changes nothing).
            unsafe {
                sys(
                    libc::SYS_mmap,
                    base,
                    end - base,
                    libc::PROT_NONE as usize,
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE)
                        as usize,
                    usize::MAX,
                    0,
                )
            };
        }
        if ranges.is_empty() {
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
            if libc::sigaction(libc::SIGSEGV, &sa, old) == 0 && old.sa_sigaction != sa.sa_sigaction {
                // A parent that was a forked child itself may still have
                // its own one-shot handler in place: then the action to
                // put back is the one it saved (`OLD_SEGV`, inherited), not
                // this handler again (which would catch the same fault
                // forever).
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

// ---------------------------------------------------------------------------
// The memory calls. Each exported name is a naked trampoline that looks at
// its return address: a call from this library's own code (usermm's host
// calls, Rust's std — e.g. a new thread's signal stack) goes straight to the
// kernel (`own_*`, a raw system call), anything else through the routing
// policy of `lib.rs` (`program_*`). usermm's code calls `mmap`, `madvise`,
// `syscall`… by their plain names, which now resolve to these: without the
// check a handler thread's zap of its own reservation would come back into
// the space it serves. The policy also sends usermm's threads and re-entrant
// calls to the kernel (belt and braces, for a tail call whose return
// address is outside).

use crate::{count, pieces, place, program_call, region_at, route_mmap, with_space, MapRoute, Place, Why};
use libc::c_long;
use usermm::Errno;

/// `[OWN_LO, OWN_HI)`: this library's mapping (its code and data), found by
/// [`find_own_range`]. Both 0 until then: no call is "ours", and every call
/// goes through the policy, which sends it to the kernel until the space
/// is open.
static OWN_LO: AtomicUsize = AtomicUsize::new(0);
static OWN_HI: AtomicUsize = AtomicUsize::new(0);

/// Finds this library's mapping from its ELF program headers.
pub(crate) fn find_own_range() {
    // SAFETY: plain data, filled by `dladdr` (which does not allocate).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address of one of this library's functions.
    if unsafe { libc::dladdr(constructor as *const () as *const c_void, &mut info) } == 0 || info.dli_fbase.is_null() {
        return;
    }
    let base = info.dli_fbase as usize;
    // SAFETY: the dynamic loader maps an object's ELF header and program
    // headers at its base (the first `PT_LOAD` segment of the file, as the
    // linker lays out a shared object); they stay mapped while it is loaded.
    let eh = unsafe { &*(base as *const libc::Elf64_Ehdr) };
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for i in 0..eh.e_phnum as usize {
        let at = base + eh.e_phoff as usize + i * eh.e_phentsize as usize;
        // SAFETY: as above: the `e_phnum` headers from `e_phoff`.
        let ph = unsafe { &*(at as *const libc::Elf64_Phdr) };
        if ph.p_type == libc::PT_LOAD {
            lo = lo.min(ph.p_vaddr as usize);
            hi = hi.max((ph.p_vaddr + ph.p_memsz) as usize);
        }
    }
    if lo < hi {
        OWN_LO.store(base + lo, Relaxed);
        OWN_HI.store(base + hi, Relaxed);
    }
}

/// A raw system call: the kernel's result (`-errno` on failure).
///
/// # Safety
/// The system call's own contract (e.g. `munmap` must not remove memory
/// that Rust code still refers to).
#[allow(clippy::too_many_arguments)]
unsafe fn sys(nr: c_long, a1: usize, a2: usize, a3: usize, a4: usize, a5: usize, a6: usize) -> c_long {
    let r: c_long;
    // SAFETY: the x86-64 system call convention (rax number and result,
    // rdi rsi rdx r10 r8 r9 arguments, rcx and r11 clobbered); the rest is
    // the caller's promise.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => r,
            in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    r
}

/// `syscall(2)`'s convention: -1 with errno set for a failure.
fn ret(r: c_long) -> c_long {
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

fn fail<T>(e: c_int, v: T) -> T {
    set_errno(e);
    v
}

macro_rules! interpose {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) -> $r:ty => $own:ident, $program:ident) => {
        $(#[$m])*
        ///
        /// # Safety
        /// The C function's contract.
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            // A call whose return address lies in this library is usermm's
            // own: `own_*`; any other goes through the policy. Only r11 (a
            // scratch register of the C convention) is used, so the
            // arguments reach either function untouched.
            std::arch::naked_asm!(
                "mov r11, qword ptr [rsp]",
                "cmp r11, qword ptr [rip + {lo}]",
                "jb 2f",
                "cmp r11, qword ptr [rip + {hi}]",
                "jae 2f",
                "jmp {own}",
                "2:",
                "jmp {program}",
                lo = sym OWN_LO,
                hi = sym OWN_HI,
                own = sym $own,
                program = sym $program,
            )
        }
    };
}

interpose!(
    /// `mmap(2)`.
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void
        => own_mmap, program_mmap
);
interpose!(
    /// `mmap64(2)` (the same as `mmap` on x86-64).
    fn mmap64(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void
        => own_mmap, program_mmap
);
interpose!(
    /// `munmap(2)`.
    fn munmap(addr: *mut c_void, len: usize) -> c_int => own_munmap, program_munmap
);
interpose!(
    /// `mprotect(2)`.
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int => own_mprotect, program_mprotect
);
interpose!(
    /// `madvise(2)`.
    fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int => own_madvise, program_madvise
);
interpose!(
    /// `posix_madvise(3)`: returns the error number, leaves errno alone.
    fn posix_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int
        => own_posix_madvise, program_posix_madvise
);
interpose!(
    /// `mlock(2)`.
    fn mlock(addr: *const c_void, len: usize) -> c_int => own_mlock, program_mlock
);
interpose!(
    /// `mlock2(2)`.
    fn mlock2(addr: *const c_void, len: usize, flags: c_uint) -> c_int => own_mlock2, program_mlock2
);
interpose!(
    /// `munlock(2)`.
    fn munlock(addr: *const c_void, len: usize) -> c_int => own_munlock, program_munlock
);
interpose!(
    /// `mlockall(2)`.
    fn mlockall(flags: c_int) -> c_int => own_mlockall, program_mlockall
);
interpose!(
    /// `munlockall(2)`.
    fn munlockall() -> c_int => own_munlockall, program_munlockall
);
interpose!(
    /// `mincore(2)`.
    fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int => own_mincore, program_mincore
);
interpose!(
    /// `msync(2)`.
    fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int => own_msync, program_msync
);
interpose!(
    /// `mremap(2)` (variadic in C: the fifth argument, `new_address`, is
    /// read only with `MREMAP_FIXED`, and sits in r8 either way).
    fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void
        => own_mremap, program_mremap
);
interpose!(
    /// `syscall(2)` (variadic in C: six `long` arguments are read, as
    /// glibc's does; the x86-64 convention passes them the same way).
    fn syscall(nr: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long
        => own_syscall, program_syscall
);

// usermm's own calls: the kernel's, as glibc makes them.

unsafe extern "C" fn own_mmap(a: *mut c_void, l: usize, p: c_int, f: c_int, fd: c_int, o: i64) -> *mut c_void {
    // SAFETY: the caller's (usermm's) promises.
    kernel_mmap(a as usize, l, p, f, fd, o)
}

unsafe extern "C" fn own_munmap(a: *mut c_void, l: usize) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_munmap, a as usize, l, 0, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mprotect(a: *mut c_void, l: usize, p: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_mprotect, a as usize, l, p as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_madvise, a as usize, l, adv as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_posix_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    // glibc ignores POSIX_MADV_DONTNEED (it would be MADV_DONTNEED, which
    // drops data POSIX says to keep).
    if adv == libc::POSIX_MADV_DONTNEED {
        return 0;
    }
    // SAFETY: the caller's promises.
    -(unsafe { sys(libc::SYS_madvise, a as usize, l, adv as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mlock(a: *const c_void, l: usize) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlock, a as usize, l, 0, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mlock2(a: *const c_void, l: usize, f: c_uint) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlock2, a as usize, l, f as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_munlock(a: *const c_void, l: usize) -> c_int {
    // SAFETY: unlocking changes no memory.
    ret(unsafe { sys(libc::SYS_munlock, a as usize, l, 0, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mlockall(f: c_int) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlockall, f as usize, 0, 0, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_munlockall() -> c_int {
    // SAFETY: unlocking changes no memory.
    ret(unsafe { sys(libc::SYS_munlockall, 0, 0, 0, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mincore(a: *mut c_void, l: usize, v: *mut u8) -> c_int {
    // SAFETY: the caller's promises (`v` holds a byte per page).
    ret(unsafe { sys(libc::SYS_mincore, a as usize, l, v as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_msync(a: *mut c_void, l: usize, f: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_msync, a as usize, l, f as usize, 0, 0, 0) }) as c_int
}

unsafe extern "C" fn own_mremap(o: *mut c_void, ol: usize, nl: usize, f: c_int, n: *mut c_void) -> *mut c_void {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_mremap, o as usize, ol, nl, f as usize, n as usize, 0) }) as *mut c_void
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn own_syscall(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(nr, a1 as usize, a2 as usize, a3 as usize, a4 as usize, a5 as usize, a6 as usize) })
}

fn kernel_mmap(a: usize, l: usize, p: c_int, f: c_int, fd: c_int, o: i64) -> *mut c_void {
    // SAFETY: a new mapping replaces memory only with MAP_FIXED, which the
    // program asked for (the policy never sends a MAP_FIXED inside the
    // reservation here while the space is open).
    ret(unsafe { sys(libc::SYS_mmap, a, l, p as usize, f as usize, fd as usize, o as usize) }) as *mut c_void
}

/// A kernel range call's result as an errno (0: success).
fn kernel_errno(r: c_long) -> c_int {
    if (-4095..0).contains(&r) {
        -r as c_int
    } else {
        0
    }
}

// The program's calls: the policy of `lib.rs`.

extern "C" fn program_mmap(a: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void {
    guard(libc::MAP_FAILED, || {
        let a = a as usize;
        let why = match program_call() {
            Err(w) => w,
            Ok(()) => match route_mmap(a, len, flags) {
                MapRoute::Space => match with_space(|sp| sp.mmap(a, len, prot, flags, fd, off)) {
                    Ok(Ok(p)) => {
                        count(Why::Space);
                        return p as *mut c_void;
                    }
                    Ok(Err(e)) if e == Errno::ENOMEM && flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == 0 => {
                        Why::Refused
                    }
                    Ok(Err(e)) => {
                        count(Why::Space);
                        return fail(e.0, libc::MAP_FAILED);
                    }
                    Err(w) => w,
                },
                MapRoute::Kernel(w) => w,
                MapRoute::Fail(e, w) => {
                    count(w);
                    return fail(e, libc::MAP_FAILED);
                }
            },
        };
        count(why);
        kernel_mmap(a, len, prot, flags, fd, off)
    })
}

/// A range call: the pieces of `[addr, addr + len)` outside the reservation
/// go to the kernel (`kernel`, which returns the raw result), the piece
/// inside to the space (`space`), in address order. With `all`, every
/// piece is acted on whatever the others gave (as Linux's `munmap` and
/// `madvise` act on every mapped part), otherwise the first failure stops
/// the rest (as Linux's `mprotect` and `mlock` stop at a hole). In a forked
/// child a range that overlaps its parent's memory is a hole: 0 with
/// `hole_ok` (`munmap`), `ENOMEM` otherwise. A call that fails before
/// looking at the range (an unaligned address, a zero or overflowing
/// length) goes to the kernel whole, which says so.
fn range_call(
    addr: usize,
    len: usize,
    all: bool,
    hole_ok: bool,
    kernel: impl Fn(usize, usize) -> c_long,
    space: impl Fn(&Space, usize, usize) -> Result<(), Errno>,
) -> c_int {
    if let Err(w) = program_call() {
        count(w);
        return ret(kernel(addr, len)) as c_int;
    }
    if len == 0 || addr.checked_add(len).is_none() || !addr.is_multiple_of(PAGE) {
        count(Why::Invalid);
        return ret(kernel(addr, len)) as c_int;
    }
    if crate::overlaps_ancestors(addr, len) {
        // A forked child's call on its parent's memory, which is not here:
        // a hole (`munmap` of one is fine, every other call `ENOMEM`). The
        // placeholder there must stay (`after_fork_child`).
        count(Why::Child);
        return if hole_ok { 0 } else { fail(libc::ENOMEM, -1) };
    }
    if place(addr, len) == Place::Outside {
        count(Why::Outside);
        return ret(kernel(addr, len)) as c_int;
    }
    let mut first = 0;
    for (a, l, inside) in pieces(addr, len) {
        let e = if inside {
            match with_space(|sp| space(sp, a, l)) {
                Ok(r) => {
                    count(Why::Space);
                    r.err().map_or(0, |e| e.0)
                }
                Err(w) => {
                    count(w);
                    kernel_errno(kernel(a, l))
                }
            }
        } else {
            count(Why::Outside);
            kernel_errno(kernel(a, l))
        };
        if e != 0 {
            if first == 0 {
                first = e;
            }
            if !all {
                break;
            }
        }
    }
    if first != 0 {
        fail(first, -1)
    } else {
        0
    }
}

extern "C" fn program_munmap(a: *mut c_void, len: usize) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            true,
            true,
            // SAFETY: the program's own unmap of memory outside the
            // reservation (the pieces never reach into it).
            |a, l| unsafe { sys(libc::SYS_munmap, a, l, 0, 0, 0, 0) },
            |sp, a, l| sp.munmap(a, l),
        )
    })
}

extern "C" fn program_mprotect(a: *mut c_void, len: usize, prot: c_int) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            false,
            false,
            // SAFETY: as in `program_munmap`.
            |a, l| unsafe { sys(libc::SYS_mprotect, a, l, prot as usize, 0, 0, 0) },
            |sp, a, l| sp.mprotect(a, l, prot),
        )
    })
}

fn madvise_call(a: usize, len: usize, advice: c_int) -> c_int {
    range_call(
        a,
        len,
        true,
        false,
        // SAFETY: as in `program_munmap`.
        |a, l| unsafe { sys(libc::SYS_madvise, a, l, advice as usize, 0, 0, 0) },
        |sp, a, l| sp.madvise(a, l, advice),
    )
}

extern "C" fn program_madvise(a: *mut c_void, len: usize, advice: c_int) -> c_int {
    guard(-1, || madvise_call(a as usize, len, advice))
}

extern "C" fn program_posix_madvise(a: *mut c_void, len: usize, advice: c_int) -> c_int {
    guard(libc::ENOMEM, || {
        if advice == libc::POSIX_MADV_DONTNEED {
            return 0;
        }
        let saved = errno();
        let r = madvise_call(a as usize, len, advice);
        let e = if r == 0 { 0 } else { errno() };
        set_errno(saved);
        e
    })
}

/// The mlock family's range: the address rounded down to a page, the length
/// widened to match (Linux's rule).
fn lock_range(a: *const c_void, len: usize) -> (usize, usize) {
    let a = a as usize;
    let start = a & !(PAGE - 1);
    (start, len.saturating_add(a - start))
}

extern "C" fn program_mlock(a: *const c_void, len: usize) -> c_int {
    program_mlock2(a, len, 0)
}

extern "C" fn program_mlock2(a: *const c_void, len: usize, flags: c_uint) -> c_int {
    guard(-1, || {
        let (a, len) = lock_range(a, len);
        range_call(
            a,
            len,
            false,
            false,
            // SAFETY: locking changes no memory.
            |a, l| unsafe { sys(libc::SYS_mlock2, a, l, flags as usize, 0, 0, 0) },
            |sp, a, l| sp.mlock2(a, l, flags),
        )
    })
}

extern "C" fn program_munlock(a: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        let (a, len) = lock_range(a, len);
        range_call(
            a,
            len,
            false,
            false,
            // SAFETY: unlocking changes no memory.
            |a, l| unsafe { sys(libc::SYS_munlock, a, l, 0, 0, 0, 0) },
            |sp, a, l| sp.munlock(a, l),
        )
    })
}

extern "C" fn program_mincore(a: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    guard(-1, || {
        let base = a as usize;
        range_call(
            base,
            len,
            false,
            false,
            // SAFETY: `vec` holds a byte per page of the whole range (the
            // program's promise), so from the piece's page on too.
            |a, l| unsafe { sys(libc::SYS_mincore, a, l, vec.add((a - base) / PAGE) as usize, 0, 0, 0) },
            |sp, a, l| {
                // Into a buffer of ours first: a bad `vec` is `EFAULT`, as
                // the kernel's copy to the program gives, never a SIGSEGV
                // here.
                let mut v = vec![0u8; l.div_ceil(PAGE)];
                sp.mincore(a, l, &mut v)?;
                copy_to_program(sp, vec.wrapping_add((a - base) / PAGE), &v)
            },
        )
    })
}

/// Copies `src` to the program's `dst` as the kernel copies a system
/// call's result out: `EFAULT` when `dst` is not mapped writable. The
/// kernel writes it (`process_vm_writev` to this process), so a bad address
/// is an error, not a fault in this library; inside the reservation, where
/// the kernel cannot fault a page in for itself when the space resolves
/// faults in the faulting thread, the space's own regions say whether
/// `dst` is writable and this thread writes it.
fn copy_to_program(sp: &Space, dst: *mut u8, src: &[u8]) -> Result<(), Errno> {
    let local = libc::iovec { iov_base: src.as_ptr() as *mut c_void, iov_len: src.len() };
    let remote = libc::iovec { iov_base: dst.cast(), iov_len: src.len() };
    // SAFETY: the kernel reads `src` (ours, `src.len()` bytes) and writes
    // the program's range only if it is mapped writable, else fails.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == src.len() as isize {
        return Ok(());
    }
    let at = dst as usize;
    if place(at, src.len()) == Place::Inside {
        if let Some((prot, _, end)) = region_at(&sp.smaps(), at) {
            if prot & libc::PROT_WRITE != 0 && at + src.len() <= end {
                // SAFETY: the space maps `dst..dst + len` writable (its
                // faults are served, in this thread or a handler's).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
                return Ok(());
            }
        }
    }
    Err(Errno::EFAULT)
}

extern "C" fn program_msync(a: *mut c_void, len: usize, flags: c_int) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            false,
            false,
            // SAFETY: msync changes no memory.
            |a, l| unsafe { sys(libc::SYS_msync, a, l, flags as usize, 0, 0, 0) },
            |sp, a, l| sp.msync(a, l, flags),
        )
    })
}

/// `mlockall`: the space's regions through the space (`umm_mlockall`), every
/// other mapping of the process through the kernel, one `mlock2` per line of
/// `/proc/self/maps` (the kernel's own `mlockall(MCL_CURRENT)` would lock
/// and populate the space's reservation behind usermm's back, and
/// `MCL_FUTURE` would lock usermm's own later host mappings). So
/// `MCL_FUTURE` holds for the space's later regions only.
extern "C" fn program_mlockall(flags: c_int) -> c_int {
    guard(-1, || {
        if let Err(w) = program_call() {
            count(w);
            // SAFETY: locking changes no memory.
            return ret(unsafe { sys(libc::SYS_mlockall, flags as usize, 0, 0, 0, 0, 0) }) as c_int;
        }
        let r = with_space(|sp| {
            sp.mlockall(flags)?;
            if flags & libc::MCL_CURRENT == 0 {
                return Ok(());
            }
            let onfault = if flags & libc::MCL_ONFAULT != 0 { libc::MLOCK_ONFAULT as usize } else { 0 };
            let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| Errno::ENOMEM)?;
            for line in maps.lines() {
                let Some((range, rest)) = line.split_once(' ') else { continue };
                let Some((a, b)) = range.split_once('-') else { continue };
                let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
                // Inaccessible mappings (guard pages, other reservations)
                // are locked by Linux but never populated: left alone.
                if place(a, b - a) != Place::Outside || rest.starts_with("---") || line.ends_with("[vsyscall]") {
                    continue;
                }
                // SAFETY: locking changes no memory.
                let e = kernel_errno(unsafe { sys(libc::SYS_mlock2, a, b - a, onfault, 0, 0, 0) });
                if e != 0 && e != libc::ENOMEM {
                    return Err(Errno(e));
                }
            }
            Ok(())
        });
        match r {
            Ok(Ok(())) => {
                count(Why::Space);
                0
            }
            Ok(Err(e)) => {
                count(Why::Space);
                fail(e.0, -1)
            }
            Err(w) => {
                count(w);
                // SAFETY: locking changes no memory.
                ret(unsafe { sys(libc::SYS_mlockall, flags as usize, 0, 0, 0, 0, 0) }) as c_int
            }
        }
    })
}

extern "C" fn program_munlockall() -> c_int {
    guard(-1, || {
        // SAFETY: unlocking changes no memory; the space's own host locks
        // go too, and the space's call below clears every lock they stood
        // for.
        let r = ret(unsafe { sys(libc::SYS_munlockall, 0, 0, 0, 0, 0, 0) }) as c_int;
        if program_call().is_err() {
            return r;
        }
        match with_space(|sp| sp.munlockall()) {
            Ok(Err(e)) => fail(e.0, -1),
            _ => r,
        }
    })
}

extern "C" fn program_mremap(o: *mut c_void, ol: usize, nl: usize, flags: c_int, n: *mut c_void) -> *mut c_void {
    guard(libc::MAP_FAILED, || {
        let (o, n) = (o as usize, n as usize);
        // SAFETY: the program's own mremap of memory outside the
        // reservation (checked below before this runs).
        let kernel = || ret(unsafe { sys(libc::SYS_mremap, o, ol, nl, flags as usize, n, 0) }) as *mut c_void;
        if let Err(w) = program_call() {
            count(w);
            return kernel();
        }
        let fixed = flags & libc::MREMAP_FIXED != 0;
        if crate::overlaps_ancestors(o, ol.max(1)) || (fixed && crate::overlaps_ancestors(n, nl.max(1))) {
            // A forked child's call on its parent's memory, which is not
            // here (`range_call`): the old range is not mapped.
            count(Why::Child);
            return fail(
                if crate::overlaps_ancestors(o, ol.max(1)) { libc::EFAULT } else { libc::EINVAL },
                libc::MAP_FAILED,
            );
        }
        match place(o, ol) {
            Place::Outside if fixed && place(n, nl) != Place::Outside => {
                count(Why::Straddling);
                fail(libc::EINVAL, libc::MAP_FAILED)
            }
            Place::Outside => {
                count(Why::Outside);
                kernel()
            }
            // Linux: the old range must lie in one mapping.
            Place::Straddling => {
                count(Why::Straddling);
                fail(libc::EFAULT, libc::MAP_FAILED)
            }
            Place::Inside if fixed && place(n, nl) != Place::Inside => {
                count(Why::Straddling);
                fail(libc::EINVAL, libc::MAP_FAILED)
            }
            Place::Inside => match with_space(|sp| space_mremap(sp, o, ol, nl, flags, n)) {
                Ok(r) => {
                    count(Why::Space);
                    r.map_or_else(|e| fail(e.0, libc::MAP_FAILED), |a| a as *mut c_void)
                }
                Err(w) => {
                    count(w);
                    kernel()
                }
            },
        }
    })
}

/// `mremap` of a space region, which the space has no call for: a shrink
/// unmaps the tail; a grow maps the pages right after the region
/// (`MAP_FIXED_NOREPLACE`) when they are free; otherwise (with
/// `MREMAP_MAYMOVE`, or `MREMAP_FIXED`) a new region is mapped, the bytes
/// copied (faulting in the old pages, each through the budget) and the old
/// range unmapped. Only anonymous regions of one protection are moved; a
/// lock on the old range is not carried over; `old_len == 0` is `EINVAL`.
/// `MREMAP_DONTUNMAP` (Linux's rules: with `MREMAP_MAYMOVE`, same length)
/// always moves, and then leaves the old range mapped, unlocked and empty
/// (its pages dropped, reading as zeros), as Linux leaves a private one;
/// on a shared region it is `EINVAL`: the new region could not share the
/// old one's pages.
fn space_mremap(
    sp: &Space,
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    to: usize,
) -> Result<usize, Errno> {
    let page = sp.page_size();
    let (maymove, fixed) = (flags & libc::MREMAP_MAYMOVE != 0, flags & libc::MREMAP_FIXED != 0);
    let dontunmap = flags & libc::MREMAP_DONTUNMAP != 0;
    if flags & !(libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0
        || !old.is_multiple_of(page)
        || (fixed && (!maymove || !to.is_multiple_of(page)))
    {
        return Err(Errno::EINVAL);
    }
    let round = |n: usize| n.checked_next_multiple_of(page).ok_or(Errno::EINVAL);
    let (old_len, new_len) = (round(old_len)?, round(new_len)?);
    if old_len == 0 || new_len == 0 || (dontunmap && (!maymove || old_len != new_len)) {
        return Err(Errno::EINVAL);
    }
    if fixed && to < old + old_len && old < to + new_len {
        return Err(Errno::EINVAL);
    }
    let (prot, shared, end) = region_at(&sp.smaps(), old).ok_or(Errno::EFAULT)?;
    if old + old_len > end {
        return Err(Errno::EFAULT);
    }
    if dontunmap && shared {
        return Err(Errno::EINVAL);
    }
    let kind = if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } | libc::MAP_ANONYMOUS;
    if !fixed && !dontunmap {
        if new_len <= old_len {
            if new_len < old_len {
                sp.munmap(old + new_len, old_len - new_len)?;
            }
            return Ok(old);
        }
        let grow = new_len - old_len;
        if old + old_len == end && sp.mmap(end, grow, prot, kind | libc::MAP_FIXED_NOREPLACE, -1, 0).is_ok() {
            return Ok(old);
        }
        if !maymove {
            return Err(Errno::ENOMEM);
        }
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let new = sp.mmap(to, new_len, rw, kind | if fixed { libc::MAP_FIXED } else { 0 }, -1, 0)?;
    if prot & libc::PROT_READ == 0 {
        sp.mprotect(old, old_len, prot | libc::PROT_READ)?;
    }
    // SAFETY: both ranges are mapped regions of the space, readable (old)
    // and writable (new), and disjoint (a fresh region, or a fixed target
    // checked above); their pages fault in through the space's handler.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_len.min(new_len)) };
    if prot != rw {
        sp.mprotect(new, new_len, prot)?;
    }
    if dontunmap {
        // Linux clears the old range's lock and moves its pages away: what
        // stays is an empty mapping of the old protection.
        sp.munlock(old, old_len)?;
        sp.madvise(old, old_len, libc::MADV_DONTNEED)?;
        if prot & libc::PROT_READ == 0 {
            sp.mprotect(old, old_len, prot)?;
        }
        return Ok(new);
    }
    sp.munmap(old, old_len)?;
    Ok(new)
}

#[allow(clippy::too_many_arguments)]
extern "C" fn program_syscall(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let p = |v: c_long| v as *mut c_void;
    match nr {
        libc::SYS_mmap => program_mmap(p(a1), a2 as usize, a3 as c_int, a4 as c_int, a5 as c_int, a6) as c_long,
        libc::SYS_mprotect => program_mprotect(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_munmap => program_munmap(p(a1), a2 as usize) as c_long,
        libc::SYS_mremap => program_mremap(p(a1), a2 as usize, a3 as usize, a4 as c_int, p(a5)) as c_long,
        libc::SYS_msync => program_msync(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_mincore => program_mincore(p(a1), a2 as usize, a3 as *mut u8) as c_long,
        libc::SYS_madvise => program_madvise(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_mlock => program_mlock(p(a1), a2 as usize) as c_long,
        libc::SYS_munlock => program_munlock(p(a1), a2 as usize) as c_long,
        libc::SYS_mlockall => program_mlockall(a1 as c_int) as c_long,
        libc::SYS_munlockall => program_munlockall() as c_long,
        libc::SYS_mlock2 => program_mlock2(p(a1), a2 as usize, a3 as c_uint) as c_long,
        // SAFETY: the program's own call, passed on as glibc's `syscall`
        // would.
        _ => ret(unsafe { sys(nr, a1 as usize, a2 as usize, a3 as usize, a4 as usize, a5 as usize, a6 as usize) }),
    }
}

// ---------------------------------------------------------------------------
// SIGBUS's action. With faults resolved in the faulting thread (`--inthread`,
// UMM_F_INTHREAD_FAULTS) every fault on the space is a SIGBUS that usermm's
// handler resolves; a program that set its own SIGBUS action with the C
// library's `sigaction` or `signal` would replace that handler, and the
// program's would then get the space's faults (a handler that returns makes
// the access fault again, one that jumps out leaves the page missing). So a
// program's SIGBUS action is set with `umm_sigbus_action`, which, while
// usermm's handler is installed, changes the handler usermm chains to for
// every SIGBUS that is not a fault to resolve (docs/design.md, "Faults in
// the faulting thread"); otherwise it is plain `sigaction`. Every other
// signal, and usermm's own calls (return address in this library: the
// handler thread's install, the handler's own `SIG_DFL` before it ends the
// process), go to the C library's functions.

type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

/// The C library's `sigaction` and `signal` (`dlsym(RTLD_NEXT)`): 0 until
/// looked up, 1 when not there. Looked up by the constructor, so that a
/// signal handler never calls `dlsym`.
static LIBC_SIGACTION: AtomicUsize = AtomicUsize::new(0);
static LIBC_SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name` (NUL-terminated) after this library's,
/// cached in `cache`.
fn next_symbol(cache: &AtomicUsize, name: &[u8]) -> Option<usize> {
    let mut f = cache.load(Relaxed);
    if f == 0 {
        // SAFETY: `name` is NUL-terminated.
        let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
        f = if sym.is_null() { 1 } else { sym as usize };
        cache.store(f, Relaxed);
    }
    (f != 1).then_some(f)
}

/// Looks up the C library's signal functions (from the constructor).
pub(crate) fn find_signal_calls() {
    next_symbol(&LIBC_SIGACTION, b"sigaction\0");
    next_symbol(&LIBC_SIGNAL, b"signal\0");
}

/// The C library's `sigaction`.
///
/// # Safety
/// `sigaction(2)`'s contract.
unsafe extern "C" fn own_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let Some(f) = next_symbol(&LIBC_SIGACTION, b"sigaction\0") else {
        return fail(libc::ENOSYS, -1);
    };
    // SAFETY: `f` is glibc's `sigaction`, of this signature.
    let real: SigactionFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(sig, act, old) }
}

/// The C library's `signal`.
///
/// # Safety
/// `signal(2)`'s contract.
unsafe extern "C" fn own_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let Some(f) = next_symbol(&LIBC_SIGNAL, b"signal\0") else {
        return fail(libc::ENOSYS, libc::SIG_ERR);
    };
    // SAFETY: `f` is glibc's `signal`, of this signature.
    let real: SignalFn = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(sig, handler) }
}

interpose!(
    /// `sigaction(2)`: SIGBUS's through `umm_sigbus_action` (see above).
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int
        => own_sigaction, program_sigaction
);
interpose!(
    /// `signal(2)` (glibc's: BSD semantics): SIGBUS's through
    /// `umm_sigbus_action` (see above).
    fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t => own_signal, program_signal
);

/// Whether this SIGBUS action call of the program's goes to
/// `umm_sigbus_action` (not before the space is open, nor from usermm's
/// threads or a re-entrant call).
fn program_sigbus(sig: c_int) -> bool {
    sig == libc::SIGBUS && program_call().is_ok()
}

unsafe extern "C" fn program_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    if !program_sigbus(sig) {
        // SAFETY: the caller's promises, forwarded.
        return unsafe { own_sigaction(sig, act, old) };
    }
    // (Its allocations, if any, are the C library's.)
    let _libc = crate::LibcOnly::enter();
    // SAFETY: `act` is NULL or readable, `old` NULL or writable (the
    // caller's promises).
    unsafe { usermm::capi::umm_sigbus_action(act.cast(), old.cast()) }
}

unsafe extern "C" fn program_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !program_sigbus(sig) {
        // SAFETY: the caller's promises, forwarded.
        return unsafe { own_signal(sig, handler) };
    }
    // glibc's `signal`: the signal blocked in its handler, interrupted
    // calls restarted.
    // SAFETY: plain data, all zeroes valid (an empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: a valid mask to add to.
    unsafe { libc::sigaddset(&mut sa.sa_mask, sig) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both point to valid sigaction structs.
    if unsafe { program_sigaction(sig, &sa, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
