//! The host kernel's own memory, for baselines: what `usermm report` measures
//! usermm against.
//!
//! - [`HostMap`]: an anonymous private kernel mapping (plain `mmap`), owned,
//!   that derefs to a byte slice and unmaps on drop or by [`HostMap::unmap`].
//!   Invariant: `[addr, addr+len)` is a readable and writable mapping of this
//!   process for as long as the `HostMap` lives, and nothing else unmaps it.
//!   [`HostMap::shared_anon`] makes the same kind of owned mapping with
//!   `MAP_SHARED | MAP_ANONYMOUS` (shmem-backed; this process never forks it
//!   away, so it stays ours alone).
//! - [`process_faults`]: the process's minor and major page-fault counts
//!   (`getrusage(RUSAGE_SELF)`), to count the kernel's faults in a run.
//! - [`reset_peak_rss`] / [`rss_kib`]: `/proc/self/clear_refs` "5" (resets
//!   `VmHWM` to the current RSS) and the `VmRSS` / `VmHWM` lines of
//!   `/proc/self/status`: the process-wide resident peak of a run.
//! - [`map_unmap_pair`]: one `mmap` + `munmap` of a small fresh region (the
//!   "second thread" of the munmap experiment; the caller times it).
//! - [`disk_write_bandwidth`]: the sequential `O_DIRECT` write bandwidth of
//!   the file system holding a directory (the yardstick for swap-out
//!   throughput).
//! - [`HostFileMap`], [`fadvise`], [`peek_u64`]: a read-only shared file
//!   mapping read by volatile 8-byte loads, `posix_fadvise`, and an 8-byte
//!   volatile load at an address (a usermm space's memory): the `outofcore`
//!   experiment's baselines.
//! - [`HostFileMap::open_prot`], [`HostFileMap::mlock`]/[`HostFileMap::mlock2`]/
//!   [`HostFileMap::mprotect`], [`SegvBatchLocker`], [`peek_u8`] and
//!   [`page_cache_layout`]: the `lockonfault` experiment's kernel rows (the
//!   seed's mlock variants and its SIGSEGV + `mprotect`/`mlock` batch
//!   handler) and the check of how the host page cache holds the file
//!   (4 KiB pages or large folios).
//!
//! # Fault model
//! Every call can fail with the errno the kernel gives; nothing here panics
//! on a syscall error.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::{check, check_isize, last_errno, Errno};

/// The `posix_fadvise` advice values [`fadvise`] takes.
pub use libc::{POSIX_FADV_DONTNEED, POSIX_FADV_NORMAL, POSIX_FADV_RANDOM, POSIX_FADV_SEQUENTIAL};

/// An anonymous private kernel mapping that derefs to a byte slice.
pub struct HostMap {
    addr: usize,
    len: usize,
}

impl HostMap {
    /// Maps `len` bytes (`len > 0`) of fresh private anonymous read-write
    /// memory; `extra_flags` are or-ed into `MAP_PRIVATE | MAP_ANONYMOUS`
    /// (e.g. `MAP_NORESERVE`, `MAP_POPULATE`). Flags that would make the
    /// mapping something other than a fresh private anonymous mapping
    /// (`MAP_FIXED*`, `MAP_SHARED*`, `MAP_GROWSDOWN`) are refused with
    /// `EINVAL`, so that the invariant above holds.
    pub fn anon(len: usize, extra_flags: i32) -> Result<HostMap, Errno> {
        let refused = libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_SHARED | libc::MAP_GROWSDOWN;
        if len == 0 || extra_flags & refused != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address (no
        // MAP_FIXED) touches no existing memory.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(HostMap { addr: p as usize, len })
    }

    /// Maps `len` bytes (`len > 0`) of fresh shared anonymous read-write
    /// memory (`MAP_SHARED | MAP_ANONYMOUS`); `extra_flags` as for
    /// [`HostMap::anon`] (`MAP_POPULATE`, `MAP_NORESERVE`), with the same
    /// flags refused. The mapping is shared only with a child that this
    /// process never creates, so the invariant holds as for a private one.
    pub fn shared_anon(len: usize, extra_flags: i32) -> Result<HostMap, Errno> {
        let refused = libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_PRIVATE | libc::MAP_GROWSDOWN;
        if len == 0 || extra_flags & refused != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS | extra_flags;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address (no
        // MAP_FIXED) touches no existing memory.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(HostMap { addr: p as usize, len })
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `madvise` on the whole mapping. Takes `&mut self` because advice such
    /// as `MADV_DONTNEED` changes the contents (to zeros), which no shared
    /// borrow of the slice may observe.
    pub fn madvise(&mut self, advice: i32) -> Result<(), Errno> {
        self.madvise_range(0, self.len, advice)
    }

    /// `madvise` on `[off, off+len)` of the mapping (`EINVAL` if outside).
    pub fn madvise_range(&mut self, off: usize, len: usize, advice: i32) -> Result<(), Errno> {
        if off.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: the range lies inside our own private anonymous mapping and
        // `&mut self` excludes any live borrow of its bytes; advice cannot
        // unmap it (MADV_DONTNEED and friends only drop or hint pages).
        check(unsafe { libc::madvise((self.addr + off) as *mut libc::c_void, len, advice) }).map(|_| ())
    }

    /// `mincore` on the whole mapping: one byte per 4 KiB page, bit 0 set when
    /// the page is resident.
    pub fn mincore(&self) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; self.len.div_ceil(4096)];
        // SAFETY: the range is our mapping; `v` holds one byte per page.
        check(unsafe { libc::mincore(self.addr as *mut libc::c_void, self.len, v.as_mut_ptr()) })?;
        Ok(v)
    }

    /// Unmaps now and reports the result.
    pub fn unmap(self) -> Result<(), Errno> {
        let (addr, len) = (self.addr, self.len);
        std::mem::forget(self);
        // SAFETY: `self` is consumed, so no slice of the mapping outlives this.
        check(unsafe { libc::munmap(addr as *mut libc::c_void, len) }).map(|_| ())
    }
}

impl std::ops::Deref for HostMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: by the invariant, the range is mapped readable for the life
        // of `self`, and the borrow cannot outlive `self`.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl std::ops::DerefMut for HostMap {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        // SAFETY: `self` is being dropped; no borrow of the bytes remains.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

// SAFETY: a HostMap owns its memory exclusively (like a `Box<[u8]>`); moving
// it to another thread moves that ownership.
unsafe impl Send for HostMap {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for HostMap {}

/// The process's `(minor, major)` page faults so far: `ru_minflt` and
/// `ru_majflt` of `getrusage(RUSAGE_SELF)` (every thread, live and exited).
pub fn process_faults() -> Result<(u64, u64), Errno> {
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    check(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) })?;
    Ok((ru.ru_minflt.max(0) as u64, ru.ru_majflt.max(0) as u64))
}

/// Resets the process's resident peak (`VmHWM`) to its current RSS by
/// writing "5" to `/proc/self/clear_refs`.
pub fn reset_peak_rss() -> Result<(), Errno> {
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// `(VmRSS, VmHWM)` of this process in KiB, from `/proc/self/status`.
pub fn rss_kib() -> Result<(u64, u64), Errno> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
    let field = |name: &str| -> Result<u64, Errno> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or(Errno::EINVAL)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Maps `len` bytes of fresh anonymous memory with the kernel and unmaps it
/// at once, without touching it.
pub fn map_unmap_pair(len: usize) -> Result<(), Errno> {
    let m = HostMap::anon(len, 0)?;
    m.unmap()
}

/// The result of [`disk_write_bandwidth`].
#[derive(Clone, Copy, Debug)]
pub struct DiskWrite {
    pub bytes: u64,
    /// From the first write to the end of `fsync`.
    pub ns: u64,
    /// Whether the writes bypassed the page cache (`O_DIRECT`).
    pub direct: bool,
}

/// Writes `bytes` (rounded up to `chunk`) to a fresh file in `dir` in
/// sequential `chunk`-sized writes with `O_DIRECT` (buffered if the file
/// system refuses it; `DiskWrite::direct` says which), `fsync`s it and
/// deletes it. The buffer is non-zero data so that no layer can elide it.
pub fn disk_write_bandwidth(dir: &str, bytes: u64, chunk: usize) -> Result<DiskWrite, Errno> {
    if chunk == 0 || !chunk.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    let name = format!("{dir}/usermm-diskbw-{}-{}", std::process::id(), crate::now_ns());
    let cname = CString::new(name).map_err(|_| Errno::EINVAL)?;
    let mut fd = None;
    let mut last = Errno::EIO;
    for direct in [true, false] {
        let dflag = if direct { libc::O_DIRECT } else { 0 };
        // SAFETY: `cname` is NUL-terminated.
        let r = unsafe {
            libc::open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | dflag, 0o600)
        };
        if r >= 0 {
            // SAFETY: a new descriptor we own.
            fd = Some((unsafe { OwnedFd::from_raw_fd(r) }, direct));
            break;
        }
        last = last_errno();
    }
    let Some((fd, direct)) = fd else {
        return Err(last);
    };
    // Page-aligned buffer, as O_DIRECT requires.
    let mut buf = HostMap::anon(chunk, 0)?;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    let run = || -> Result<u64, Errno> {
        let t0 = crate::now_ns();
        let mut off = 0u64;
        while off < bytes {
            let mut done = 0usize;
            while done < chunk {
                // SAFETY: `buf[done..]` is readable for `chunk - done` bytes.
                let r = unsafe {
                    libc::pwrite(
                        fd.as_raw_fd(),
                        buf[done..].as_ptr() as *const libc::c_void,
                        chunk - done,
                        (off + done as u64) as libc::off_t,
                    )
                };
                let n = check_isize(r)?;
                if n == 0 {
                    return Err(Errno::EIO);
                }
                done += n;
            }
            off += chunk as u64;
        }
        // SAFETY: fsync takes its argument by value.
        check(unsafe { libc::fsync(fd.as_raw_fd()) })?;
        Ok(crate::now_ns() - t0)
    };
    let res = run();
    // SAFETY: `cname` is NUL-terminated.
    unsafe { libc::unlink(cname.as_ptr()) };
    let ns = res?;
    let written = bytes.div_ceil(chunk as u64) * chunk as u64;
    Ok(DiskWrite { bytes: written, ns, direct })
}

/// A mapping of a file at a kernel-chosen address: read-only and shared
/// (`open`, `open_prot`: the `kernel-mmap` baseline of the `outofcore` and
/// `lockonfault` experiments) or read-write, shared or private (`open_rw`:
/// the `populate` experiment's kernel rows for file regions). It hands out
/// no slice (the file could change under a reference); it is read and
/// written only by volatile loads and stores ([`HostFileMap::read_u64`],
/// [`crate::kernel::peek`] / [`crate::kernel::poke`] at its addresses).
/// Invariant: `[addr, addr+len)` is that mapping for as long as the
/// `HostFileMap` lives, and nothing else unmaps it.
pub struct HostFileMap {
    addr: usize,
    len: usize,
}

impl HostFileMap {
    /// Maps the first `len` bytes (`len > 0`) of `file` read-only and shared.
    /// The caller keeps the file at least `len` bytes long while the mapping
    /// lives (a read past its end raises SIGBUS, as for any file mapping).
    pub fn open(file: &std::fs::File, len: usize) -> Result<HostFileMap, Errno> {
        HostFileMap::open_prot(file, len, libc::PROT_READ)
    }

    /// Maps the first `len` bytes (`len > 0`) of `file` readable and
    /// writable, `MAP_SHARED` if `shared` (the file must be open for
    /// writing) else `MAP_PRIVATE` (copy on write); `extra_flags` may hold
    /// only `MAP_POPULATE` and `MAP_NORESERVE` (anything else is `EINVAL`,
    /// so that the mapping stays a fresh one at a kernel-chosen address).
    /// The caller keeps the file at least `len` bytes long while the mapping
    /// lives (a touch past its end raises SIGBUS, as for any file mapping).
    pub fn open_rw(file: &std::fs::File, len: usize, shared: bool, extra_flags: i32) -> Result<HostFileMap, Errno> {
        if len == 0 || extra_flags & !(libc::MAP_POPULATE | libc::MAP_NORESERVE) != 0 {
            return Err(Errno::EINVAL);
        }
        let kind = if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
        // SAFETY: a fresh file mapping at a kernel-chosen address (no
        // MAP_FIXED) touches no existing memory; the descriptor is borrowed
        // for the call only (the mapping keeps its own reference).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                kind | extra_flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(HostFileMap { addr: p as usize, len })
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 8 bytes at `off` (little-endian), by a volatile unaligned load.
    /// Panics if `off + 8` exceeds the mapping.
    #[inline(always)]
    pub fn read_u64(&self, off: usize) -> u64 {
        assert!(off.checked_add(8).is_some_and(|e| e <= self.len), "read_u64 outside the mapping");
        // SAFETY: the 8 bytes lie inside our readable mapping (checked
        // above; the invariant keeps it mapped); no reference is created.
        u64::from_le_bytes(unsafe { std::ptr::read_volatile((self.addr + off) as *const [u8; 8]) })
    }

    /// `madvise` on the whole mapping, for the access-pattern hints
    /// (`MADV_NORMAL`, `MADV_RANDOM`, `MADV_SEQUENTIAL`, `MADV_WILLNEED`) and
    /// the prefaults (`MADV_POPULATE_READ`, `MADV_POPULATE_WRITE`); other
    /// advice is refused with `EINVAL`.
    pub fn madvise(&self, advice: i32) -> Result<(), Errno> {
        if !matches!(
            advice,
            libc::MADV_NORMAL
                | libc::MADV_RANDOM
                | libc::MADV_SEQUENTIAL
                | libc::MADV_WILLNEED
                | libc::MADV_POPULATE_READ
                | libc::MADV_POPULATE_WRITE
        ) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: the range is our own mapping; the hints change neither its
        // contents nor its extent, and a prefault maps the pages it would
        // map on a touch (a write prefault of a private mapping breaks copy
        // on write, leaving the same bytes), so no byte any reader can see
        // changes.
        check(unsafe { libc::madvise(self.addr as *mut libc::c_void, self.len, advice) }).map(|_| ())
    }

    /// Unmaps now and reports the result.
    pub fn unmap(self) -> Result<(), Errno> {
        let (addr, len) = (self.addr, self.len);
        std::mem::forget(self);
        // SAFETY: `self` is consumed; no reference into the mapping exists.
        check(unsafe { libc::munmap(addr as *mut libc::c_void, len) }).map(|_| ())
    }
}

impl Drop for HostFileMap {
    fn drop(&mut self) {
        // SAFETY: `self` is being dropped; no reference into the mapping exists.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// `posix_fadvise(file, off, len, advice)` (`len` 0: to the end of the file).
pub fn fadvise(file: &std::fs::File, off: u64, len: u64, advice: i32) -> Result<(), Errno> {
    // SAFETY: posix_fadvise takes its arguments by value.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), off as libc::off_t, len as libc::off_t, advice) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno(r))
    }
}

/// Reads the 8 bytes at `addr` (little-endian) with a volatile unaligned
/// load from user mode: an 8-byte [`crate::kernel::peek`], with the same
/// contract (`addr..addr+8` mapped readable, by a usermm space for
/// instance, and no Rust reference pointing at it).
#[inline(always)]
pub fn peek_u64(addr: usize) -> u64 {
    // SAFETY: see the function's contract: the caller names memory that is
    // mapped and that Rust does not own; no reference is created.
    u64::from_le_bytes(unsafe { std::ptr::read_volatile(addr as *const [u8; 8]) })
}

/// Reads the byte at `addr` with a volatile load from user mode: the
/// `lockonfault` experiment's one access, the same instruction on every
/// system. The contract of [`peek_u64`]: `addr` is mapped readable (or made
/// readable by a fault handler such as [`SegvBatchLocker`]'s), and no Rust
/// reference points at it.
#[inline(always)]
pub fn peek_u8(addr: usize) -> u8 {
    // SAFETY: see the function's contract: the caller names memory that is
    // mapped and that Rust does not own; no reference is created.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

/// Lock and protection calls on a [`HostFileMap`], for the `lockonfault`
/// experiment's kernel rows. None of them changes what the mapping holds.
impl HostFileMap {
    /// Maps the first `len` bytes (`len > 0`) of `file` shared with
    /// protection `prot`, which must be `PROT_READ` or `PROT_NONE` (anything
    /// else is `EINVAL`: the mapping stays read-only, so [`HostFileMap`]'s
    /// reads can never race with a write through it). A `PROT_NONE` mapping
    /// is read only through a fault handler that makes pages readable
    /// ([`SegvBatchLocker`]); a plain read of it raises SIGSEGV.
    pub fn open_prot(file: &std::fs::File, len: usize, prot: i32) -> Result<HostFileMap, Errno> {
        if len == 0 || (prot != libc::PROT_READ && prot != libc::PROT_NONE) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: a fresh file mapping at a kernel-chosen address (no
        // MAP_FIXED) touches no existing memory; the descriptor is borrowed
        // for the call only (the mapping keeps its own reference).
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(HostFileMap { addr: p as usize, len })
    }

    fn in_range(&self, off: usize, len: usize) -> Result<usize, Errno> {
        if off.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Errno::EINVAL);
        }
        Ok(self.addr + off)
    }

    /// `mlock2(addr + off, len, flags)` (`flags` 0: `mlock`; `MLOCK_ONFAULT`
    /// is 1). `EINVAL` if the range leaves the mapping.
    pub fn mlock2(&self, off: usize, len: usize, flags: u32) -> Result<(), Errno> {
        let a = self.in_range(off, len)?;
        // SAFETY: locking changes no memory; the range is our own mapping.
        let r = unsafe { libc::syscall(libc::SYS_mlock2, a, len, flags) };
        if r < 0 {
            return Err(last_errno());
        }
        Ok(())
    }

    /// `mlock(addr + off, len)`: the plain libc call, as the seed made it.
    #[inline(always)]
    pub fn mlock(&self, off: usize, len: usize) -> Result<(), Errno> {
        let a = self.in_range(off, len)?;
        // SAFETY: locking changes no memory; the range is our own mapping.
        check(unsafe { libc::mlock(a as *const libc::c_void, len) }).map(|_| ())
    }

    /// `mprotect(addr + off, len, prot)` with `prot` `PROT_READ` or
    /// `PROT_NONE` only (the mapping stays read-only; see `open_prot`).
    pub fn mprotect(&self, off: usize, len: usize, prot: i32) -> Result<(), Errno> {
        if prot != libc::PROT_READ && prot != libc::PROT_NONE {
            return Err(Errno::EINVAL);
        }
        let a = self.in_range(off, len)?;
        // SAFETY: no reference into the mapping exists (it hands out none);
        // a read of a PROT_NONE page raises SIGSEGV, never undefined
        // behaviour.
        check(unsafe { libc::mprotect(a as *mut libc::c_void, len, prot) }).map(|_| ())
    }
}

static SEGV_BASE: AtomicUsize = AtomicUsize::new(0);
static SEGV_LEN: AtomicUsize = AtomicUsize::new(0);
static SEGV_BATCH_BYTES: AtomicUsize = AtomicUsize::new(0);
static SEGV_PAGE: AtomicUsize = AtomicUsize::new(4096);
static SEGV_FAULTS: AtomicU64 = AtomicU64::new(0);
/// The first errno an `mprotect` or `mlock` in the handler failed with (0:
/// none).
static SEGV_ERRNO: AtomicI32 = AtomicI32::new(0);
/// One locker at a time: the SIGSEGV disposition is process-wide.
static SEGV_INSTALLED: Mutex<()> = Mutex::new(());

/// Sets SIGSEGV to its default action from inside a handler.
fn segv_default() {
    // SAFETY: sigaction is plain data; zeroed is a valid value (empty mask,
    // no flags), and SIG_DFL is a valid disposition.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = libc::SIG_DFL;
    // SAFETY: `act` is a valid sigaction; a null old-action pointer is
    // allowed; sigaction is async-signal-safe.
    unsafe { libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()) };
}

/// The seed's user-space lock on fault: on a SIGSEGV inside the mapping,
/// `mprotect(PROT_READ)` and `mlock` the faulting page and the `batch - 1`
/// pages after it, clipped to the mapping's end.
///
/// Only raw syscalls (`mprotect`, `mlock`, `sigaction`) and atomics, all
/// async-signal-safe; `errno` is saved and restored around them.
extern "C" fn segv_batch_lock(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; the location is valid for this thread.
    let saved_errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // `si_addr` reads the _sigfault member, which SIGSEGV fills.
    let addr = unsafe { (*info).si_addr() } as usize;
    let base = SEGV_BASE.load(Ordering::SeqCst);
    let end = base + SEGV_LEN.load(Ordering::SeqCst);
    if addr < base || addr >= end {
        // Not ours: let the retried access take the default action.
        segv_default();
    } else {
        SEGV_FAULTS.fetch_add(1, Ordering::Relaxed);
        let page = addr & !(SEGV_PAGE.load(Ordering::Relaxed) - 1);
        let len = SEGV_BATCH_BYTES.load(Ordering::Relaxed).min(end - page);
        let record = || {
            // SAFETY: as above.
            let e = unsafe { *libc::__errno_location() };
            let _ = SEGV_ERRNO.compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst);
        };
        // SAFETY: `[page, page+len)` lies inside the locker's mapping (the
        // bounds are checked above), which the locker's borrow keeps mapped;
        // it is read-only, so PROT_READ exposes no writable memory.
        if unsafe { libc::mprotect(page as *mut libc::c_void, len, libc::PROT_READ) } != 0 {
            record();
            // Typically ENOMEM: splitting the mapping would pass
            // vm.max_map_count. Make the whole mapping readable (no split:
            // it covers whole VMAs) so that the program finishes; the
            // recorded errno marks the run as failed.
            // SAFETY: as above, for the whole mapping.
            if unsafe { libc::mprotect(base as *mut libc::c_void, end - base, libc::PROT_READ) } != 0 {
                segv_default();
            }
        // SAFETY: locking changes no memory.
        } else if unsafe { libc::mlock(page as *const libc::c_void, len) } != 0 {
            record();
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// A SIGSEGV handler, installed for as long as the value lives, that does
/// the seed's "PROT_NONE + SIGSEGV handler that mprotects and mlocks a
/// batch of pages" over one [`HostFileMap`] opened `PROT_NONE`.
///
/// Unlike the seed's handler, which locked the faulting page first and then
/// speculatively tried the `batch - 1` pages after it (it did not know where
/// the mapping ended, and could crash past it), this one knows the mapping's
/// bounds (global atomics set by `install`) and clips the batch to them: one
/// `mprotect` + one `mlock` per fault.
///
/// A SIGSEGV outside the mapping is not ours: the handler resets SIGSEGV to
/// its default action and returns, so that the retried access terminates
/// the process as it would have without the locker. If `mprotect` fails
/// (`ENOMEM` past `vm.max_map_count`), the handler records the errno and
/// makes the whole mapping readable, so that the run ends and can be
/// reported as failed instead of looping; an `mlock` failure is recorded
/// too. Dropping the locker restores the previous SIGSEGV disposition.
pub struct SegvBatchLocker<'m> {
    old: libc::sigaction,
    _map: std::marker::PhantomData<&'m HostFileMap>,
    _only_one: MutexGuard<'static, ()>,
}

impl<'m> SegvBatchLocker<'m> {
    /// Installs the handler for `map` with batches of `batch_pages` host
    /// pages (≥ 1). Blocks while another locker is installed.
    pub fn install(map: &'m HostFileMap, batch_pages: usize) -> Result<SegvBatchLocker<'m>, Errno> {
        if batch_pages == 0 {
            return Err(Errno::EINVAL);
        }
        let guard = SEGV_INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        SEGV_PAGE.store(page, Ordering::SeqCst);
        SEGV_BATCH_BYTES.store(batch_pages * page, Ordering::SeqCst);
        SEGV_FAULTS.store(0, Ordering::SeqCst);
        SEGV_ERRNO.store(0, Ordering::SeqCst);
        SEGV_BASE.store(map.addr, Ordering::SeqCst);
        SEGV_LEN.store(map.len, Ordering::SeqCst);
        // SAFETY: sigaction is plain data; zeroed is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = segv_batch_lock;
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `act.sa_mask` is a valid sigset to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid sigaction structs; the handler is
        // an `extern "C"` function with the SA_SIGINFO signature.
        if let Err(e) = check(unsafe { libc::sigaction(libc::SIGSEGV, &act, &mut old) }) {
            SEGV_LEN.store(0, Ordering::SeqCst);
            return Err(e);
        }
        Ok(SegvBatchLocker { old, _map: std::marker::PhantomData, _only_one: guard })
    }

    /// SIGSEGVs handled in the mapping so far.
    pub fn faults(&self) -> u64 {
        SEGV_FAULTS.load(Ordering::SeqCst)
    }

    /// The first errno an `mprotect` or `mlock` of the handler failed with.
    pub fn error(&self) -> Option<Errno> {
        match SEGV_ERRNO.load(Ordering::SeqCst) {
            0 => None,
            e => Some(Errno(e)),
        }
    }
}

impl Drop for SegvBatchLocker<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.old` is the disposition sigaction returned.
        unsafe { libc::sigaction(libc::SIGSEGV, &self.old, std::ptr::null_mut()) };
        SEGV_BASE.store(0, Ordering::SeqCst);
        SEGV_LEN.store(0, Ordering::SeqCst);
    }
}

/// How the host page cache holds a file: see [`page_cache_layout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageCacheLayout {
    /// The file's 4 KiB pages (of the `len` bytes looked at).
    pub pages: u64,
    /// Of those, the ones in the page cache (`mincore`).
    pub resident_pages: u64,
    /// The others' page numbers, ascending.
    pub missing: Vec<u64>,
    /// The folio sample, or why there is none (`EPERM`/`EACCES`: the PFNs
    /// of `/proc/self/pagemap` and `/proc/kpageflags` need root).
    pub folios: Result<FolioSample, Errno>,
}

/// Sampled page-cache pages and how many of them sit in large folios.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FolioSample {
    /// Pages sampled (resident ones only).
    pub sampled: u64,
    /// Of those, pages in a large folio (`KPF_COMPOUND_HEAD` or `_TAIL`).
    pub large: u64,
    /// Of those, pages flagged `KPF_THP`.
    pub thp: u64,
}

impl FolioSample {
    /// The fraction of sampled pages in large folios (NaN for none).
    pub fn large_fraction(&self) -> f64 {
        if self.sampled == 0 {
            f64::NAN
        } else {
            self.large as f64 / self.sampled as f64
        }
    }
}

const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
const KPF_THP: u64 = 1 << 22;
const PM_PFN_MASK: u64 = (1 << 55) - 1;
const PM_PRESENT: u64 = 1 << 63;

fn io_errno(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

/// How the host page cache holds the first `len` bytes of `file`, without
/// changing it: the resident pages (`mincore` over a throwaway mapping), and
/// for every `every_pages`th page that is resident, whether it sits in a
/// large folio.
///
/// Each sampled page is mapped into a private read-only throwaway mapping
/// with `MADV_POPULATE_READ` (a page-cache hit: only resident pages are
/// sampled, so no read-ahead can change the layout being measured), its PFN
/// read from `/proc/self/pagemap` (bits 0–54) and its flags from
/// `/proc/kpageflags` (bits 15/16 `KPF_COMPOUND_HEAD`/`_TAIL`: a page of a
/// large folio; bit 22 `KPF_THP`). Without root the PFNs read as 0 and
/// `folios` is `Err(EPERM)`.
pub fn page_cache_layout(file: &std::fs::File, len: usize, every_pages: usize) -> Result<PageCacheLayout, Errno> {
    use std::os::unix::fs::FileExt;
    if len == 0 || every_pages == 0 {
        return Err(Errno::EINVAL);
    }
    const PS: usize = 4096;
    // SAFETY: a fresh private read-only file mapping at a kernel-chosen
    // address touches no existing memory; it is unmapped below and no
    // reference into it is made.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    let addr = p as usize;
    let res = (|| -> Result<PageCacheLayout, Errno> {
        let pages = len.div_ceil(PS);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is our mapping; `vec` holds one byte per page.
        check(unsafe { libc::mincore(p, len, vec.as_mut_ptr()) })?;
        let missing: Vec<u64> = (0..pages).filter(|&i| vec[i] & 1 == 0).map(|i| i as u64).collect();
        let resident_pages = (pages - missing.len()) as u64;
        let folios = (|| -> Result<FolioSample, Errno> {
            let pagemap = std::fs::File::open("/proc/self/pagemap").map_err(io_errno)?;
            let kflags = std::fs::File::open("/proc/kpageflags").map_err(io_errno)?;
            let mut s = FolioSample::default();
            let mut b = [0u8; 8];
            for pg in (0..pages).step_by(every_pages) {
                if vec[pg] & 1 == 0 {
                    continue;
                }
                let a = addr + pg * PS;
                // SAFETY: one page of our own read-only mapping; populating
                // it maps a page-cache page and changes no memory.
                if unsafe { libc::madvise(a as *mut libc::c_void, PS, libc::MADV_POPULATE_READ) } != 0 {
                    continue;
                }
                pagemap.read_exact_at(&mut b, (a / PS * 8) as u64).map_err(io_errno)?;
                let e = u64::from_le_bytes(b);
                if e & PM_PRESENT == 0 {
                    continue;
                }
                let pfn = e & PM_PFN_MASK;
                if pfn == 0 {
                    return Err(Errno::EPERM);
                }
                kflags.read_exact_at(&mut b, pfn * 8).map_err(io_errno)?;
                let f = u64::from_le_bytes(b);
                s.sampled += 1;
                s.large += u64::from(f & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) != 0);
                s.thp += u64::from(f & KPF_THP != 0);
            }
            Ok(s)
        })();
        Ok(PageCacheLayout { pages: pages as u64, resident_pages, missing, folios })
    })();
    // SAFETY: the throwaway mapping is ours and nothing refers to it.
    unsafe { libc::munmap(p, len) };
    res
}

/// How many pages of `[addr, addr+len)` of this process are resident
/// (`mincore`; an unmapped page in the range is `ENOMEM`). Safe for any
/// range: `mincore` reads no memory of it.
pub fn resident_pages(addr: usize, len: usize) -> Result<usize, Errno> {
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: mincore only writes `v`, one byte per page of the range; the
    // kernel checks the range itself.
    check(unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) })?;
    Ok(v.iter().filter(|b| *b & 1 == 1).count())
}
