//! [`HostFileMap`]: a shared file mapping read by volatile loads, with its
//! lock and protection calls; [`fadvise`]; [`peek_u64`] / [`peek_u8`],
//! volatile loads at an address.

use std::os::fd::AsRawFd;

use crate::{check, last_errno, Errno};

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
    pub(super) addr: usize,
    pub(super) len: usize,
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
/// readable by a fault handler such as [`SegvBatchLocker`](super::SegvBatchLocker)'s), and no Rust
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
    /// ([`SegvBatchLocker`](super::SegvBatchLocker)); a plain read of it raises SIGSEGV.
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
