//! [`MapOptions`]: a mapping builder in the shape of `memmap2::MmapOptions`
//! (`len`, `offset`, `populate`, then `map_anon` / `map` / `map_mut` /
//! `map_copy`), with usermm's own options — locked now or on fault, advice —
//! returning the handles Rust users know: [`Mapping`] (read-write, like
//! `MmapMut`) and [`ReadOnlyMapping`] (like `Mmap`).
//!
//! Differences from memmap2, all stricter:
//! - `offset` must be a multiple of the page size (`EINVAL`); memmap2 maps
//!   from the page below and hides the difference.
//! - A file mapping must lie within the file (rounded up to a page):
//!   `EINVAL` otherwise, where memmap2 maps it and a touch of a page past
//!   the end raises SIGBUS.
//! - `populate` is `MADV_POPULATE_READ`/`WRITE` after the `mmap`, and its
//!   error is returned (nothing stays mapped), where `MAP_POPULATE` ignores
//!   failures.
//! - Advice is checked like [`Mapping::advise_range`]'s: advice that changes
//!   or removes bytes under a borrow is `EINVAL` here.

use std::os::fd::AsRawFd;

use crate::{advice_changes_bytes, consts, Errno, Mapping, Space};

/// How the new mapping is locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    /// `mlock2(…, 0)`: every page read in and pinned now.
    Now,
    /// `mlock2(…, MLOCK_ONFAULT)`: pages pinned once touched.
    OnFault,
}

/// A builder of mappings in a [`Space`] (see the module's documentation).
///
/// ```no_run
/// # fn main() -> Result<(), usermm::Errno> {
/// use usermm::{Config, MapOptions, Space};
/// let space = Space::open(&Config::default())?;
/// let mut buf = MapOptions::new().len(1 << 20).lock_on_fault().map_anon(&space)?;
/// buf[0] = 1; // faulted in and pinned now, not before
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MapOptions {
    len: Option<usize>,
    offset: u64,
    populate: bool,
    lock: Option<Lock>,
    advice: Vec<i32>,
}

impl MapOptions {
    /// Options with no length, offset 0, no populate, no lock, no advice.
    pub fn new() -> MapOptions {
        MapOptions::default()
    }

    /// The mapping's length in bytes. Required by [`MapOptions::map_anon`];
    /// for a file, the default is the file's length from `offset`.
    pub fn len(&mut self, len: usize) -> &mut Self {
        self.len = Some(len);
        self
    }

    /// Where in the file the mapping starts (a multiple of the page size).
    pub fn offset(&mut self, offset: u64) -> &mut Self {
        self.offset = offset;
        self
    }

    /// Fault every page in before returning (as `MAP_POPULATE`; errors are
    /// returned). Written in for a private writable mapping, read in
    /// otherwise, as Linux's `MAP_POPULATE` does.
    pub fn populate(&mut self) -> &mut Self {
        self.populate = true;
        self
    }

    /// Lock the mapping now (`mlock`): every page is read in and pinned
    /// (`EAGAIN` if the budget cannot hold them).
    pub fn lock(&mut self) -> &mut Self {
        self.lock = Some(Lock::Now);
        self
    }

    /// Lock the mapping on fault (`mlock2(MLOCK_ONFAULT)`): pages are pinned
    /// once touched, never before.
    pub fn lock_on_fault(&mut self) -> &mut Self {
        self.lock = Some(Lock::OnFault);
        self
    }

    /// Advice applied to the whole mapping once it is made (`madvise`; may
    /// be given more than once). Advice that changes or removes bytes
    /// (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`, `MADV_GUARD_INSTALL`,
    /// `MADV_HWPOISON`) is `EINVAL`.
    pub fn advice(&mut self, advice: i32) -> &mut Self {
        self.advice.push(advice);
        self
    }

    /// Private anonymous read-write memory (like `MmapOptions::map_anon`).
    /// `EINVAL` without a length, with a length of 0 or with an offset.
    pub fn map_anon<'a>(&self, space: &'a Space) -> Result<Mapping<'a>, Errno> {
        let len = self.len.ok_or(Errno::EINVAL)?;
        if self.offset != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = consts::MAP_PRIVATE | consts::MAP_ANONYMOUS;
        self.make(space, len, consts::PROT_READ | consts::PROT_WRITE, flags, -1)
    }

    /// A read-only shared mapping of `file` (like `MmapOptions::map`); the
    /// file must be open for reading.
    ///
    /// # Safety
    /// As for memmap2: the bytes may change under the returned slice if the
    /// file is written through another mapping or descriptor, and a page
    /// past the file's end after it is truncated raises SIGBUS when touched.
    /// The caller keeps the file from being truncated or written while the
    /// mapping lives.
    // An unsafe contract, not unsafe code: the body is safe.
    #[allow(unsafe_code)]
    pub unsafe fn map<'a>(&self, space: &'a Space, file: &std::fs::File) -> Result<ReadOnlyMapping<'a>, Errno> {
        let len = self.file_len(space, file)?;
        let m = self.make(space, len, consts::PROT_READ, consts::MAP_SHARED, file.as_raw_fd())?;
        Ok(ReadOnlyMapping { inner: m })
    }

    /// A shared read-write mapping of `file` (like `MmapOptions::map_mut`):
    /// writes reach the file (`msync`, `munmap`, `umm_close`). The file must
    /// be open for reading and writing.
    ///
    /// # Safety
    /// As for [`MapOptions::map`].
    #[allow(unsafe_code)]
    pub unsafe fn map_mut<'a>(&self, space: &'a Space, file: &std::fs::File) -> Result<Mapping<'a>, Errno> {
        let len = self.file_len(space, file)?;
        let prot = consts::PROT_READ | consts::PROT_WRITE;
        self.make(space, len, prot, consts::MAP_SHARED, file.as_raw_fd())
    }

    /// A private copy-on-write mapping of `file` (like
    /// `MmapOptions::map_copy`): reads see the file, writes stay private
    /// (under pressure they go to the space's swap, never to the file).
    ///
    /// # Safety
    /// As for [`MapOptions::map`], for the pages not yet written.
    #[allow(unsafe_code)]
    pub unsafe fn map_copy<'a>(&self, space: &'a Space, file: &std::fs::File) -> Result<Mapping<'a>, Errno> {
        let len = self.file_len(space, file)?;
        let prot = consts::PROT_READ | consts::PROT_WRITE;
        self.make(space, len, prot, consts::MAP_PRIVATE, file.as_raw_fd())
    }

    /// The mapping's length for `file`: `len`, or the rest of the file from
    /// `offset`; `EINVAL` for an unaligned offset or a mapping that would
    /// reach past the file's last page.
    fn file_len(&self, space: &Space, file: &std::fs::File) -> Result<usize, Errno> {
        let ps = space.page_size() as u64;
        if !self.offset.is_multiple_of(ps) {
            return Err(Errno::EINVAL);
        }
        let size = file.metadata().map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno))?.len();
        let end_of_pages = size.div_ceil(ps) * ps;
        let len = match self.len {
            Some(l) => l as u64,
            None => size.checked_sub(self.offset).ok_or(Errno::EINVAL)?,
        };
        if self.offset.checked_add(len).is_none_or(|end| end > end_of_pages) {
            return Err(Errno::EINVAL);
        }
        usize::try_from(len).map_err(|_| Errno::EINVAL)
    }

    /// Maps, registers the handle, then advises, locks and populates; on an
    /// error after the `mmap`, the handle's drop unmaps it.
    fn make<'a>(&self, space: &'a Space, len: usize, prot: i32, flags: i32, fd: i32) -> Result<Mapping<'a>, Errno> {
        if len == 0 || self.advice.iter().any(|&a| advice_changes_bytes(a)) {
            return Err(Errno::EINVAL);
        }
        let off = i64::try_from(self.offset).map_err(|_| Errno::EINVAL)?;
        let m = space.map_owned(len, prot, flags, fd, off)?;
        for &a in &self.advice {
            space.madvise(m.addr, m.len, a)?;
        }
        match self.lock {
            Some(Lock::Now) => space.mlock2(m.addr, m.len, 0)?,
            Some(Lock::OnFault) => space.mlock2(m.addr, m.len, consts::MLOCK_ONFAULT)?,
            None => {}
        }
        if self.populate && self.lock != Some(Lock::Now) {
            let write = prot & consts::PROT_WRITE != 0 && flags & consts::MAP_PRIVATE != 0;
            let advice = if write { consts::MADV_POPULATE_WRITE } else { consts::MADV_POPULATE_READ };
            space.populate(m.addr, m.len, advice).1?;
        }
        Ok(m)
    }
}

/// A read-only mapping that derefs to a byte slice and unmaps on drop (like
/// `memmap2::Mmap`); made by [`MapOptions::map`].
pub struct ReadOnlyMapping<'a> {
    inner: Mapping<'a>,
}

impl ReadOnlyMapping<'_> {
    pub fn addr(&self) -> usize {
        self.inner.addr()
    }
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.as_ptr()
    }
    /// `madvise` on `[offset, offset+len)`: as [`Mapping::advise_range`].
    pub fn advise_range(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.inner.advise_range(offset, len, advice)
    }
    /// Unmaps now and reports the result (dropping it also unmaps).
    pub fn unmap(self) -> Result<(), Errno> {
        self.inner.unmap()
    }
}

impl std::ops::Deref for ReadOnlyMapping<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.inner
    }
}
