//! [`Mapping`]: the `memmap2`-style handle of an anonymous mapping of a
//! space ([`Space::map_anon`]): its advice and volatile calls on its own
//! range, and its unmap on drop. Its deref to a byte slice is in
//! `boundary` (the one module with `unsafe` code).

use crate::{consts, Errno, PurgeReport, Space};

/// A mapped region that derefs to a byte slice and unmaps on drop.
pub struct Mapping<'a> {
    pub(crate) space: &'a Space,
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Mapping<'_> {
    pub fn addr(&self) -> usize {
        self.addr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.addr as *mut u8
    }
    /// Unmaps now and reports the result (dropping a `Mapping` also unmaps,
    /// ignoring errors).
    pub fn unmap(self) -> Result<(), Errno> {
        self.space.disown(self.addr);
        let r = self.space.check_owner().and_then(|()| self.space.inner.munmap(self.addr, self.len));
        std::mem::forget(self);
        r
    }

    /// `madvise` on the whole mapping: [`Mapping::advise_range`].
    pub fn advise(&mut self, advice: i32) -> Result<(), Errno> {
        self.advise_range(0, self.len, advice)
    }

    /// `madvise` on `[offset, offset+len)` of the mapping (`EINVAL` past its
    /// end). It takes the mapping by `&mut`: no borrow of its bytes lives
    /// across the call, so advice that changes them now (`MADV_DONTNEED`:
    /// zeros after) is safe. Advice that may change them *later*, under a
    /// borrow taken after the call (`MADV_FREE`: a page reads as its data or
    /// as zeros until written), or that removes access
    /// (`MADV_GUARD_INSTALL`, `MADV_HWPOISON`), is `EINVAL` here:
    /// [`Mapping::advise_unchecked`].
    pub fn advise_range(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        use consts::*;
        if matches!(advice, MADV_FREE | MADV_GUARD_INSTALL | MADV_HWPOISON) {
            return Err(Errno::EINVAL);
        }
        self.advise_inner(offset, len, advice)
    }

    /// `madvise` with any advice on `[offset, offset+len)` of the mapping.
    ///
    /// # Safety
    /// After `MADV_FREE`, each page must be written (or advised with
    /// `MADV_DONTNEED`) before its bytes are borrowed: until then a discard
    /// may change them under a borrow. After `MADV_GUARD_INSTALL` or
    /// `MADV_HWPOISON`, the pages must not be borrowed at all until
    /// `MADV_GUARD_REMOVE` (poison: never).
    // An unsafe contract, not unsafe code: the body is a safe call.
    #[allow(unsafe_code)]
    pub unsafe fn advise_unchecked(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.advise_inner(offset, len, advice)
    }

    /// `mvolatile` on `[offset, offset+len)` of the mapping.
    ///
    /// # Safety
    /// Until `mnovolatile` on it, the range must not be borrowed: a purge
    /// may change it at any time (and a touch of a purged page raises
    /// SIGBUS). [`Purgeable`](crate::Purgeable) is the safe handle for volatile memory.
    #[allow(unsafe_code)]
    pub unsafe fn mvolatile(&mut self, offset: usize, len: usize) -> Result<(), Errno> {
        self.check_range(offset, len)?;
        self.space.check_owner()?;
        self.space.inner.mvolatile(self.addr + offset, len)
    }

    /// `mnovolatile` on `[offset, offset+len)` of the mapping: see
    /// [`Space::mnovolatile`].
    pub fn mnovolatile(&mut self, offset: usize, len: usize) -> Result<(bool, PurgeReport), Errno> {
        self.check_range(offset, len)?;
        self.space.mnovolatile(self.addr + offset, len)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), Errno> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }

    fn advise_inner(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.check_range(offset, len)?;
        self.space.check_owner()?;
        self.space.inner.madvise(self.addr + offset, len, advice)
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        self.space.disown(self.addr);
        if self.space.check_owner().is_ok() {
            let _ = self.space.inner.munmap(self.addr, self.len);
        }
    }
}
