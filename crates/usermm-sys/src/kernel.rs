//! The host kernel as an oracle, for conformance tests: the same
//! address-based calls usermm implements, made as real syscalls on a private
//! stretch of address space, plus the few raw memory probes the tests need.
//!
//! - [`KernelArena`]: a 1 GiB (or larger) stretch of this process's address
//!   space that nothing else uses, where tests `mmap`, `munmap`, `mprotect`,
//!   `madvise` and `mincore` with Linux's own syscalls. Unlike a usermm
//!   space it is *not* a `PROT_NONE` reservation: the unused parts of the
//!   arena are real holes, so that calls over them fail with `ENOMEM` exactly
//!   as they do over the unmapped parts of a space.
//!   Invariant: every mapping inside `[base, base+len)` was made through the
//!   arena; no Rust reference ever points into it.
//! - [`peek`] / [`poke`]: a volatile one-byte access from user mode (it takes
//!   the same page faults a program's own load or store takes).
//! - [`call_code`]: a call into machine code at an address (an instruction
//!   fetch from user mode).
//! - [`probe_read`]: a one-byte read through `process_vm_readv` on our own
//!   pid, which fails with `EFAULT` instead of raising SIGSEGV.
//! - [`pipe_read_into`]: a `read(2)` from a pipe into a given address (a
//!   kernel-mode access to it).
//!
//! # Why a hole and not a reservation?
//! The arena claims its range with `MAP_FIXED_NOREPLACE` (so it never takes
//! anything that exists) in the lower half of the user address space
//! (from 16 TiB up), and unmaps it again at once. The kernel's top-down
//! allocator places unhinted mappings below `mmap_base` (just under the
//! stack, near 128 TiB) and only descends to 16 TiB after about 100 TiB of
//! mappings, so the hole stays ours. A `PROT_NONE` reservation would be a
//! *mapping*: `mprotect`, `madvise` and `mincore` would succeed on it, and the
//! kernel would not show Linux's errno for a hole.
//!
//! # Fault model
//! Calls return the errno the kernel gives. A call that could change memory
//! outside the arena (`MAP_FIXED`, `munmap`, `mprotect`, `madvise` over a
//! range that leaves it) is refused with a panic: it is a bug in the test,
//! not a result to compare.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{check, check_isize, last_errno, Errno};

const PAGE: usize = 4096;
/// Where arenas start: far below the kernel's top-down allocation area.
const ARENA_FLOOR: usize = 0x1000_0000_0000;
/// How many candidate slots to try before giving up.
const ARENA_TRIES: usize = 4096;
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// A stretch of address space where the host kernel's own memory calls are
/// made. Dropping it unmaps everything inside.
pub struct KernelArena {
    base: usize,
    len: usize,
}

impl KernelArena {
    /// Claims `len` bytes (rounded up to 1 GiB, the slot size) of address
    /// space as a hole.
    pub fn new(len: usize) -> Result<KernelArena, Errno> {
        let slot_len = len.max(1).div_ceil(1 << 30) << 30;
        // A guard slot between arenas, so that mappings of two arenas never
        // touch (and never merge).
        let stride = slot_len + (1 << 30);
        let mut last = Errno::ENOMEM;
        for _ in 0..ARENA_TRIES {
            let n = NEXT_SLOT.fetch_add(stride >> 30, Ordering::Relaxed);
            let base = ARENA_FLOOR + (n << 30);
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE;
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping;
            // a fresh anonymous mapping touches no memory we use.
            let p = unsafe { libc::mmap(base as *mut libc::c_void, slot_len, libc::PROT_NONE, flags, -1, 0) };
            if p == libc::MAP_FAILED {
                last = last_errno();
                continue;
            }
            if p as usize != base {
                // An old kernel that ignores NOREPLACE put it elsewhere.
                // SAFETY: the mapping was just made by us and is unused.
                unsafe { libc::munmap(p, slot_len) };
                last = Errno::EEXIST;
                continue;
            }
            // SAFETY: the mapping was just made by us and is unused.
            check(unsafe { libc::munmap(p, slot_len) })?;
            return Ok(KernelArena { base, len: slot_len });
        }
        Err(last)
    }

    /// The first address of the arena (1 GiB aligned).
    pub fn base(&self) -> usize {
        self.base
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[addr, addr+len)` (widened to whole pages) lies inside.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let lo = addr & !(PAGE - 1);
        match addr.checked_add(len).and_then(|e| e.checked_add(PAGE - 1)) {
            Some(e) => lo >= self.base && (e & !(PAGE - 1)) <= self.base + self.len,
            None => false,
        }
    }

    /// A range the kernel would act on must lie inside the arena. A range
    /// whose end overflows is passed through: the kernel rejects it before
    /// touching anything.
    fn guard(&self, what: &str, addr: usize, len: usize) {
        let overflows = addr.checked_add(len).and_then(|e| e.checked_add(PAGE - 1)).is_none();
        assert!(
            overflows && addr >= self.base && addr < self.base + self.len || self.contains(addr, len),
            "KernelArena::{what}({addr:#x}, {len:#x}) leaves the arena {:#x}+{:#x}",
            self.base,
            self.len
        );
    }

    /// `mmap(addr, len, prot, flags, -1, off)`, the raw syscall (`fd` is
    /// always -1: anonymous memory, or `EBADF` when `MAP_ANONYMOUS` is
    /// missing). With `MAP_FIXED` the range must lie inside the arena.
    /// Without it, pass a hint inside the arena: a mapping the kernel places
    /// outside (the hinted range was not free) is unmapped again and the call
    /// panics, because the caller asked for a comparable address and did not
    /// get one.
    pub fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, off: i64) -> Result<usize, Errno> {
        self.mmap_fd(addr, len, prot, flags, -1, off)
    }

    /// `mmap(addr, len, prot, flags, fd, off)`: as [`KernelArena::mmap`],
    /// for file mappings too.
    pub fn mmap_fd(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        if flags & libc::MAP_FIXED != 0 {
            self.guard("mmap(MAP_FIXED)", addr, len);
        }
        // SAFETY: with MAP_FIXED the range lies inside the arena, whose
        // memory no Rust reference points into (invariant); without it the
        // kernel never replaces an existing mapping.
        let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd as i64, off) };
        if r < 0 && r > -4096 {
            return Err(last_errno());
        }
        let p = r as usize;
        if !self.contains(p, len) {
            // SAFETY: the kernel just made this mapping for us, outside the
            // arena, and nobody else knows its address.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
            panic!("KernelArena::mmap({addr:#x}, {len:#x}): the kernel placed it outside the arena at {p:#x}");
        }
        Ok(p)
    }

    /// `munmap`, the raw syscall, on a range inside the arena.
    pub fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.guard("munmap", addr, len);
        // SAFETY: the range lies inside the arena (no Rust reference into it).
        let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
        check(r as libc::c_int).map(|_| ())
    }

    /// `mprotect`, the raw syscall, on a range inside the arena.
    pub fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        self.guard("mprotect", addr, len);
        // SAFETY: the range lies inside the arena (no Rust reference into it).
        let r = unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) };
        check(r as libc::c_int).map(|_| ())
    }

    /// `madvise`, the raw syscall, on a range inside the arena.
    pub fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.guard("madvise", addr, len);
        // SAFETY: the range lies inside the arena (no Rust reference into it);
        // advice that drops pages only changes memory nobody borrows.
        let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
        check(r as libc::c_int).map(|_| ())
    }
}

impl Drop for KernelArena {
    fn drop(&mut self) {
        // SAFETY: everything inside the arena is the arena's (invariant).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// `mincore(addr, len)`: one byte per 4 KiB page. Reading page tables has
/// no effect on memory, so any address may be asked about. On error nothing
/// of the vector is returned (the kernel fills a prefix, which callers
/// compare only by errno).
pub fn mincore(addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
    crate::mem::mincore(addr, len)
}

/// Reads the byte at `addr` with a volatile load from user mode.
///
/// For tests only: `addr` must be mapped readable (by a usermm space or a
/// [`KernelArena`]) and no Rust reference may point at it; otherwise the
/// process takes SIGSEGV (or the load races with a writer). The function is
/// safe to call in the sense that it never creates a reference: the memory
/// is treated as foreign, like a device register.
pub fn peek(addr: usize) -> u8 {
    // SAFETY: see the function's contract: the caller names memory that is
    // mapped and that Rust does not own.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

/// Writes `v` at `addr` with a volatile store from user mode. The same
/// contract as [`peek`], with the memory mapped writable.
pub fn poke(addr: usize, v: u8) {
    // SAFETY: see `peek`.
    unsafe { std::ptr::write_volatile(addr as *mut u8, v) }
}

/// Calls the machine code at `addr` as an `extern "C" fn() -> i32` (an
/// instruction fetch from user mode: the page faults a program's call into
/// JIT-compiled code takes).
///
/// For tests only, with the contract of [`peek`]: `addr` must hold a
/// complete x86-64 function of that signature (e.g. `mov eax, 42; ret`) in
/// memory mapped executable.
pub fn call_code(addr: usize) -> i32 {
    // SAFETY: see the function's contract: the caller names executable
    // memory that holds a whole function of this signature.
    let f = unsafe { std::mem::transmute::<usize, extern "C" fn() -> i32>(addr) };
    f()
}

/// Reads the byte at `addr` through `process_vm_readv` on our own pid:
/// `None` when the kernel refuses (`EFAULT`: unmapped or `PROT_NONE`), never
/// a signal. A missing page of a userfaultfd region is a kernel-mode fault
/// that the region's handler serves (full userfaultfd only).
pub fn probe_read(addr: usize) -> Option<u8> {
    let mut b = 0u8;
    let local = libc::iovec { iov_base: (&mut b as *mut u8).cast(), iov_len: 1 };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 1 };
    // SAFETY: `local` points at our own byte; the kernel validates `remote`
    // (a bad address is an error, not a fault in this process).
    let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (r == 1).then_some(b)
}

/// Writes `data` into a fresh pipe and `read(2)`s it back into
/// `[addr, addr+data.len())`: a kernel-mode write to that memory. Returns
/// what `read` returned.
///
/// For tests only, with the contract of [`poke`]: the range must be memory
/// no Rust reference points at (a space's or an arena's); an unmapped range
/// gives `EFAULT`.
pub fn pipe_read_into(addr: usize, data: &[u8]) -> Result<usize, Errno> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for two descriptors.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let res = (|| {
        // SAFETY: `data` is readable for its length.
        let w = unsafe { libc::write(fds[1], data.as_ptr().cast(), data.len()) };
        check_isize(w)?;
        // SAFETY: see the function's contract; the kernel validates the
        // destination and fails with EFAULT instead of faulting us.
        let r = unsafe { libc::read(fds[0], addr as *mut libc::c_void, data.len()) };
        check_isize(r)
    })();
    for fd in fds {
        // SAFETY: both descriptors are ours and closed once.
        unsafe { libc::close(fd) };
    }
    res
}
