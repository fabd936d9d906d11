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
//!
//! # Fault model
//! Every call can fail with the errno the kernel gives; nothing here panics
//! on a syscall error.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

/// A read-only shared mapping of a file (`PROT_READ`, `MAP_SHARED`) at a
/// kernel-chosen address: the `kernel-mmap` baseline of the `outofcore`
/// experiment. It hands out no slice (the file could change under a
/// reference); reads are volatile 8-byte loads through [`HostFileMap::read_u64`].
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
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        // SAFETY: a fresh file mapping at a kernel-chosen address (no
        // MAP_FIXED) touches no existing memory; the descriptor is borrowed
        // for the call only (the mapping keeps its own reference).
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
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

    /// `madvise` on the whole mapping, for the access-pattern hints only
    /// (`MADV_NORMAL`, `MADV_RANDOM`, `MADV_SEQUENTIAL`, `MADV_WILLNEED`);
    /// other advice is refused with `EINVAL`.
    pub fn madvise(&self, advice: i32) -> Result<(), Errno> {
        if !matches!(advice, libc::MADV_NORMAL | libc::MADV_RANDOM | libc::MADV_SEQUENTIAL | libc::MADV_WILLNEED) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: the range is our own mapping and the advice is a hint that
        // changes neither its contents nor its extent.
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
