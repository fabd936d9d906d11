//! Ranges of the reservation handed to the host as shared memory: a
//! `MAP_SHARED` anonymous region becomes a `MAP_SHARED` mapping of a memfd
//! of its own before a fork, so that parent and child share it as Linux
//! shares shmem (docs/design.md, "fork").
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::Arena;
use crate::file::{pwrite_all, MappedFile};
use crate::uffd::Uffd;
use crate::{mem, Errno};

/// Where the bytes of one page of a range handed to the host come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareSrc {
    /// The page mapped at its address (resident).
    Mapped,
    /// The page parked in a staging slot.
    Slot(u32),
    /// The page in the page store at this byte offset (`read` reads it).
    Stored(u64),
}

/// What a range handed to the host becomes a mapping of.
#[derive(Clone, Copy)]
pub enum ShareTo<'a> {
    /// A memfd of its own (shared anonymous memory).
    Memfd,
    /// `file` from byte `off` (a shared file region): the pages given are
    /// written to it first (never past its end).
    File { file: &'a MappedFile, off: u64 },
}

/// Reads the stored pages at byte offsets `offs` into the buffer it is
/// given (one page each, in order); says for each whether it was read.
pub type ReadStored<'a> = &'a mut dyn FnMut(&[u64], &mut [u8]) -> Vec<bool>;

/// Stored pages read in one batch (`ShareTo`'s copy).
const READ_BATCH: usize = 64;

impl Arena {
    /// Write-protects the present pages of `[a, a+l)` of the reservation: a
    /// write there waits in a WP fault until the range is replaced
    /// (`share_out`) or the protection lifted. Needs `tracks_writes`.
    pub fn write_protect(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        if !self.program_wp {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        uffd.write_protect(a, l)
    }

    /// Replaces `[a, a+l)` of the reservation by a `MAP_SHARED` mapping of
    /// protection `prot` of a new memfd holding the range's bytes: page
    /// `i` (at byte `pages[k].0 = i * page_size`) from `pages[k].1`, the
    /// others zeros; `read` reads a stored page into the buffer it is
    /// given. The mapping is registered with no userfaultfd (the host
    /// serves its faults) and a fork shares it. On failure before the
    /// mapping, the range is as it was.
    pub fn share_out(
        &self,
        a: usize,
        l: usize,
        prot: i32,
        to: ShareTo<'_>,
        pages: &[(usize, ShareSrc)],
        read: ReadStored<'_>,
    ) -> Result<(), Errno> {
        self.check(a, l)?;
        let memfd;
        let (fd, off, end) = match to {
            ShareTo::Memfd => {
                // SAFETY: a plain syscall on a static NUL-terminated name.
                let fd = unsafe { libc::memfd_create(c"usermm-shared".as_ptr(), libc::MFD_CLOEXEC) };
                if fd < 0 {
                    return Err(crate::last_errno());
                }
                // SAFETY: `fd` was just opened and is owned here alone.
                memfd = unsafe { OwnedFd::from_raw_fd(fd) };
                // SAFETY: a plain syscall on our descriptor.
                if unsafe { libc::ftruncate(memfd.as_raw_fd(), l as libc::off_t) } < 0 {
                    return Err(crate::last_errno());
                }
                (memfd.as_raw_fd(), 0, l as u64)
            }
            ShareTo::File { file, off } => (file.raw(), off, file.size()?),
        };
        let unreadable = prot & libc::PROT_READ == 0 && pages.iter().any(|p| p.1 == ShareSrc::Mapped);
        if unreadable {
            // (Read for the copy; the new mapping has `prot`.)
            self.protect(a, l, libc::PROT_READ)?;
        }
        let copied = self.share_copy(fd, off, end, a, l, pages, read);
        if let Err(e) = copied {
            if unreadable {
                let _ = self.protect(a, l, prot);
            }
            return Err(e);
        }
        // SAFETY: this arena's memory (checked range), whose bytes were
        // just copied out: the new mapping holds them.
        unsafe { mem::map_shared_fixed(a, l, prot, fd, off) }
    }

    /// `share_out`'s copy of the bytes to `fd` from byte `off`, never at
    /// or past byte `end`.
    #[allow(clippy::too_many_arguments)]
    fn share_copy(
        &self,
        fd: i32,
        off: u64,
        end: u64,
        a: usize,
        l: usize,
        pages: &[(usize, ShareSrc)],
        read: ReadStored<'_>,
    ) -> Result<(), Errno> {
        let len = self.page_size * READ_BATCH;
        // (A buffer of its own, aligned as `O_DIRECT` swap reads need.)
        let batch = mem::map_rw(len)?;
        let r = self.share_pages((fd, off, end), a, l, pages, read, batch as *mut u8);
        // SAFETY: `batch` is ours and no longer used.
        unsafe {
            let _ = mem::unmap(batch, len);
        }
        r
    }

    fn share_pages(
        &self,
        (fd, base, end): (i32, u64, u64),
        a: usize,
        l: usize,
        pages: &[(usize, ShareSrc)],
        read: ReadStored<'_>,
        batch: *mut u8,
    ) -> Result<(), Errno> {
        let ps = self.page_size;
        // SAFETY: `batch` is a fresh mapping of `READ_BATCH` pages, ours alone.
        let buf = unsafe { std::slice::from_raw_parts_mut(batch, ps * READ_BATCH) };
        // The stored pages are read `READ_BATCH` at a time (one batch of
        // reads, not a round trip each), when the first of a batch is met.
        let stored: Vec<u64> =
            pages.iter().filter_map(|&(_, s)| if let ShareSrc::Stored(at) = s { Some(at) } else { None }).collect();
        let mut next = 0;
        for &(off, src) in pages {
            if off + ps > l {
                return Err(Errno::EINVAL);
            }
            let from = match src {
                ShareSrc::Mapped => a + off,
                ShareSrc::Slot(s) => self.slot_addr(s),
                ShareSrc::Stored(_) => {
                    let k = next % READ_BATCH;
                    if k == 0 {
                        let offs = &stored[next..(next + READ_BATCH).min(stored.len())];
                        if read(offs, &mut buf[..offs.len() * ps]).iter().any(|ok| !ok) {
                            return Err(Errno::EIO);
                        }
                    }
                    next += 1;
                    buf.as_ptr() as usize + k * ps
                }
            };
            // SAFETY: `from` is a resident page of the reservation (the
            // caller's core says so, and its writers wait: write-protected),
            // a parked page of our staging area, or our buffer: readable,
            // and no Rust reference writes it meanwhile.
            let at = base + off as u64;
            let n = end.saturating_sub(at).min(ps as u64) as usize;
            if n > 0 {
                // SAFETY: as above.
                unsafe { pwrite_all(fd, from, n, at) }?;
            }
        }
        Ok(())
    }

    /// Makes `[a, a+l)`, a range of [`Arena::share_out`] mappings, the
    /// host's lock or not: `mlock2` (populating, as a `MAP_LOCKED`
    /// region's lock) when `populate`, else `MLOCK_ONFAULT`; `munlock`
    /// when not `locked`.
    pub fn shared_lock(&self, a: usize, l: usize, locked: bool, populate: bool) -> Result<(), Errno> {
        self.check(a, l)?;
        match (locked, populate) {
            (false, _) => mem::munlock(a, l),
            (true, true) => mem::mlock2(a, l, 0),
            (true, false) => mem::mlock2(a, l, 1),
        }
    }

    /// Advice on `[a, a+l)`, a range of [`Arena::share_out`] mappings:
    /// the host's memory there is the program's (shmem), and the advice
    /// does to it what Linux's does.
    pub fn shared_advise(&self, a: usize, l: usize, advice: i32) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range), a shared mapping
        // whose bytes no Rust reference holds (the program's memory).
        unsafe { mem::advise(a, l, advice) }
    }

    /// `mincore` of `[a, a+l)`, a range of [`Arena::share_out`] mappings:
    /// the runs `(start, end)` of its pages in memory.
    pub fn shared_resident(&self, a: usize, l: usize) -> Result<Vec<(usize, usize)>, Errno> {
        self.check(a, l)?;
        let ps = self.page_size;
        let v = mem::mincore(a, l)?;
        let host_pages = (ps / 4096).max(1);
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for i in 0..l / ps {
            // (A page of the space is in memory when its first host page is.)
            if v.get(i * host_pages).is_none_or(|b| b & 1 == 0) {
                continue;
            }
            let s = a + i * ps;
            match runs.last_mut() {
                Some(r) if r.1 == s => r.1 = s + ps,
                _ => runs.push((s, s + ps)),
            }
        }
        Ok(runs)
    }
}
