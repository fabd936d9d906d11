//! Calls that must run on the C library's memory: `pthread_create` (a
//! thread's start), `fopencookie` and the calls of `libc_only!`.

use super::*;

/// glibc's `pthread_create` (the exported name is this library's): 0 until
/// looked up, 1 when it is not there.
pub(super) static LIBC_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

pub(super) type PthreadCreate = unsafe extern "C" fn(
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
    if crate::has_ancestors() {
        // SAFETY: reads the current locale; no preconditions.
        std::hint::black_box(unsafe { __ctype_get_mb_cur_max() });
    }
    // SAFETY: `f` is glibc's `pthread_create`, of this signature.
    let real: PthreadCreate = unsafe { std::mem::transmute(f) };
    let _libc = crate::LibcOnly::enter();
    // SAFETY: the caller's promises, forwarded.
    unsafe { real(thread, attr, start, arg) }
}

extern "C" {
    /// glibc's `MB_CUR_MAX`: reads the current locale's `LC_CTYPE` data.
    ///
    /// In a forked child, [`pthread_create`] calls it first: the C library's
    /// `start_thread` reads that same data in every new thread before
    /// anything else, with every signal blocked, so a locale that
    /// `setlocale` allocated on the parent's heap (CPython's, any program's
    /// that calls `setlocale(LC_ALL, "")`) kills the process there with no
    /// handler run. Read here first, the touch raises SIGSEGV in the calling
    /// thread, where [`child_segv`] says what happened.
    fn __ctype_get_mb_cur_max() -> usize;
}

/// The C library's function `name` (NUL-terminated), found with
/// `dlsym(RTLD_NEXT)` once and kept in `cache` (0: not looked up yet, 1:
/// not there). Called with [`crate::LibcOnly`] entered: `dlsym` may
/// `calloc`.
pub(super) fn next_fn(cache: &AtomicUsize, name: &[u8]) -> Option<usize> {
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
///
/// With `first F;`, `F` (an `Option` of the return value) is asked before
/// the C library: `Some` answers the call.
macro_rules! libc_only {
    ($fail:expr; $(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        libc_only!($fail; first None; $(#[$doc])* $name($($arg: $ty),*) -> $ret);
    };
    ($fail:expr; first $first:expr; $(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's own contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            if let Some(r) = $first {
                return r;
            }
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

libc_only!(std::ptr::null_mut(); first super::files::fopen_view(path, mode);
    /// `fopen(3)`, the C library's (see `libc_only!`), or a view of the
    /// memory limit (`files.rs`).
    fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE
);
libc_only!(std::ptr::null_mut(); first super::files::fopen_view(path, mode);
    /// `fopen64(3)`, the C library's, or a view of the memory limit.
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

libc_only!(std::ptr::null_mut();
    /// `setlocale(3)`, the C library's: the locale data it allocates is
    /// read by the C library's `start_thread` in every new thread before
    /// anything else runs there, with every signal blocked — in a forked
    /// child, by the threads that serve the child's copy of the space too,
    /// one of which could fault on its own locale read and wait on itself.
    setlocale(category: c_int, locale: *const c_char) -> *mut c_char
);
libc_only!(std::ptr::null_mut();
    /// `newlocale(3)`, the C library's (`uselocale` makes it the thread's:
    /// see `setlocale`).
    newlocale(mask: c_int, locale: *const c_char, base: *mut c_void) -> *mut c_void
);
libc_only!(std::ptr::null_mut();
    /// `duplocale(3)`, the C library's.
    duplocale(locale: *mut c_void) -> *mut c_void
);
