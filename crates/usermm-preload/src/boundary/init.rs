//! The exit report's descriptor, a forked child's SIGSEGV message, and the
//! constructor that opens the space.

use super::*;

/// The copy of stderr the exit report goes to (-1: none, use fd 2).
pub(super) static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

/// The lowest descriptor the copy may take: far above the ones a program
/// opens first (some count on getting 3, 4, …), and below 64, the size of a
/// process's first descriptor table: growing it in a process with threads
/// (the space's) waits for an RCU grace period, which took 10-13 ms at
/// every start here with the copy at 500.
pub(super) const REPORT_FD_MIN: c_int = 60;

/// Keeps a descriptor (close-on-exec, at [`REPORT_FD_MIN`] or above) for
/// the exit report: `file` opened for appending (every process of a run
/// adds its lines, each in one write), or a copy of stderr when there is no
/// file or it cannot be opened (said on stderr).
pub(crate) fn keep_report_fd(file: Option<&std::ffi::OsStr>) {
    let from = match file {
        Some(path) => {
            let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path)).ok();
            // SAFETY: `c` is a NUL-terminated path; open makes a new
            // descriptor or fails.
            let fd = c.map_or(-1, |c| unsafe {
                libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC, 0o600)
            });
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                write_report(&format!(
                    "usermm run: pid {}: cannot open the statistics file {}: {e}; they go to stderr\n",
                    std::process::id(),
                    path.to_string_lossy()
                ));
                2
            } else {
                fd
            }
        }
        None => 2,
    };
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` only makes a new descriptor.
    let fd = unsafe { libc::fcntl(from, libc::F_DUPFD_CLOEXEC, REPORT_FD_MIN) };
    if from != 2 {
        // SAFETY: `from` is the descriptor opened above, not used again.
        unsafe { libc::close(from) };
    }
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
pub(super) static OLD_SEGV: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// Appends `n` in decimal (`base` 10) or hex (16) to `buf` at `*at`.
pub(super) fn put_num(buf: &mut [u8], at: &mut usize, mut n: usize, base: usize) {
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

pub(super) fn put(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    let n = s.len().min(buf.len() - *at);
    buf[*at..*at + n].copy_from_slice(&s[..n]);
    *at += n;
}

/// A forked child's first SIGSEGV: if it is a touch of the parent's heap
/// (not inherited: the space is not), says so on stderr; then puts the
/// child's own SIGSEGV action back and returns, so the access faults again
/// under it (by default: death by SIGSEGV, as without this handler).
/// Async-signal-safe: atomics, `write`, `sigaction`, no allocation.
pub(super) extern "C" fn child_segv(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
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
pub(super) extern "C" fn after_fork_child() {
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

pub(super) extern "C" fn constructor() {
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

pub(super) extern "C" fn at_exit() {
    guard((), crate::report);
}

/// Runs when the dynamic loader initialises the library: after the C
/// library, before the program's own constructors and `main`.
#[used]
#[link_section = ".init_array"]
pub(super) static CONSTRUCTOR: extern "C" fn() = constructor;
