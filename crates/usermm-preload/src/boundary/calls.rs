//! The memory calls' exported names: trampolines that send this library's own
//! calls to the kernel and the program's to `program.rs`.

use super::*;

// ---------------------------------------------------------------------------
// The memory calls. Each exported name is a naked trampoline that looks at
// its return address: a call from this library's own code (usermm's host
// calls, Rust's std — e.g. a new thread's signal stack) goes straight to the
// kernel (`own_*`, a raw system call), anything else through the routing
// policy of `route.rs` (`program_*`). usermm's code calls `mmap`, `madvise`,
// `syscall`… by their plain names, which now resolve to these: without the
// check a handler thread's zap of its own reservation would come back into
// the space it serves. The policy also sends usermm's threads and re-entrant
// calls to the kernel (belt and braces, for a tail call whose return
// address is outside).

/// `[OWN_LO, OWN_HI)`: this library's mapping (its code and data), found by
/// [`find_own_range`]. Both 0 until then: no call is "ours", and every call
/// goes through the policy, which sends it to the kernel until the space
/// is open.
pub(super) static OWN_LO: AtomicUsize = AtomicUsize::new(0);
pub(super) static OWN_HI: AtomicUsize = AtomicUsize::new(0);

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
pub(super) unsafe fn sys(nr: c_long, a1: usize, a2: usize, a3: usize, a4: usize, a5: usize, a6: usize) -> c_long {
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
pub(super) fn ret(r: c_long) -> c_long {
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

pub(super) fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

pub(super) fn fail<T>(e: c_int, v: T) -> T {
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

pub(super) unsafe extern "C" fn own_mmap(
    a: *mut c_void,
    l: usize,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: i64,
) -> *mut c_void {
    // SAFETY: the caller's (usermm's) promises.
    kernel_mmap(a as usize, l, p, f, fd, o)
}

pub(super) unsafe extern "C" fn own_munmap(a: *mut c_void, l: usize) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_munmap, a as usize, l, 0, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mprotect(a: *mut c_void, l: usize, p: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_mprotect, a as usize, l, p as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_madvise, a as usize, l, adv as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_posix_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    // glibc ignores POSIX_MADV_DONTNEED (it would be MADV_DONTNEED, which
    // drops data POSIX says to keep).
    if adv == libc::POSIX_MADV_DONTNEED {
        return 0;
    }
    // SAFETY: the caller's promises.
    -(unsafe { sys(libc::SYS_madvise, a as usize, l, adv as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mlock(a: *const c_void, l: usize) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlock, a as usize, l, 0, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mlock2(a: *const c_void, l: usize, f: c_uint) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlock2, a as usize, l, f as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_munlock(a: *const c_void, l: usize) -> c_int {
    // SAFETY: unlocking changes no memory.
    ret(unsafe { sys(libc::SYS_munlock, a as usize, l, 0, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mlockall(f: c_int) -> c_int {
    // SAFETY: locking changes no memory.
    ret(unsafe { sys(libc::SYS_mlockall, f as usize, 0, 0, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_munlockall() -> c_int {
    // SAFETY: unlocking changes no memory.
    ret(unsafe { sys(libc::SYS_munlockall, 0, 0, 0, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mincore(a: *mut c_void, l: usize, v: *mut u8) -> c_int {
    // SAFETY: the caller's promises (`v` holds a byte per page).
    ret(unsafe { sys(libc::SYS_mincore, a as usize, l, v as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_msync(a: *mut c_void, l: usize, f: c_int) -> c_int {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_msync, a as usize, l, f as usize, 0, 0, 0) }) as c_int
}

pub(super) unsafe extern "C" fn own_mremap(
    o: *mut c_void,
    ol: usize,
    nl: usize,
    f: c_int,
    n: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's promises.
    ret(unsafe { sys(libc::SYS_mremap, o as usize, ol, nl, f as usize, n as usize, 0) }) as *mut c_void
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn own_syscall(
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

pub(super) fn kernel_mmap(a: usize, l: usize, p: c_int, f: c_int, fd: c_int, o: i64) -> *mut c_void {
    // SAFETY: a new mapping replaces memory only with MAP_FIXED, which the
    // program asked for (the policy never sends a MAP_FIXED inside the
    // reservation here while the space is open).
    ret(unsafe { sys(libc::SYS_mmap, a, l, p as usize, f as usize, fd as usize, o as usize) }) as *mut c_void
}

/// A kernel range call's result as an errno (0: success).
pub(super) fn kernel_errno(r: c_long) -> c_int {
    if (-4095..0).contains(&r) {
        -r as c_int
    } else {
        0
    }
}
