//! [`HostMap`]: an owned anonymous kernel mapping (private, or shared with
//! [`HostMap::shared_anon`]) that derefs to a byte slice, and
//! [`map_unmap_pair`], one `mmap` + `munmap` of a fresh region.

use crate::{check, last_errno, Errno};

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

/// Maps `len` bytes of fresh anonymous memory with the kernel and unmaps it
/// at once, without touching it.
pub fn map_unmap_pair(len: usize) -> Result<(), Errno> {
    let m = HostMap::anon(len, 0)?;
    m.unmap()
}
