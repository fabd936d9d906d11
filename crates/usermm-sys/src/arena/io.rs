//! Swap and file I/O into and out of the arena: page runs written to and
//! read from a page store (through a bounce buffer, or straight into
//! staging), file windows read in and pages written out to their files, the
//! two halves of a split install (one lent to the wake-ahead thread).
use super::Arena;
use crate::file::{pread_upto, pwrite_all, MappedFile, ProcMem};
use crate::lend::Lender;
use crate::uffd::Uffd;
use crate::{mem, Errno};

thread_local! {
    /// A page copied out of the space before it is written to a file
    /// (`Arena::page_to_file`).
    static PAGE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Registers this module's thread-locals in the calling thread now (see
/// `usermm::platform::warm_thread_locals`).
pub fn warm_thread_locals() {
    PAGE.with(|_| ());
}

impl Arena {
    /// Runs `f` on the pages of `slots`, in order (a page store writes them
    /// out from there).
    pub fn with_slots<R>(&self, slots: &[u32], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let pages: Vec<&[u8]> = slots
            .iter()
            // SAFETY: the slots are ours and hold pages nothing writes while
            // they are being written out (the caller's claim); the slices
            // live only for the call.
            .map(|&s| unsafe { std::slice::from_raw_parts(self.slot_addr(s) as *const u8, self.page_size) })
            .collect();
        f(&pages)
    }

    /// Reads `len` bytes from a page store (`read` fills the buffer it is
    /// given) and installs them at `dst` (of the reservation, without
    /// waking), write-protected if `wp` (see `tracks_writes`). Returns the
    /// bytes installed (a prefix).
    #[allow(clippy::too_many_arguments)]
    pub fn store_in(
        &self,
        uffd: &Uffd,
        dst: usize,
        len: usize,
        wp: bool,
        bounce: &Bounce,
        read: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
    ) -> Result<usize, Errno> {
        self.check(dst, len)?;
        assert!(bounce.len >= len);
        {
            // SAFETY: the bounce buffer is a private mapping owned by
            // `bounce`, writable for `bounce.len >= len` bytes, and this
            // thread's alone (`with_bounce`): no other reference into it
            // while `read` runs; the slice dies before the copy below.
            let buf = unsafe { std::slice::from_raw_parts_mut(bounce.addr as *mut u8, len) };
            read(buf)?;
        }
        // SAFETY: as above, readable.
        unsafe { uffd.copy_wp(dst, bounce.addr as *const u8, len, false, wp && self.program_wp) }
    }

    /// Reads `len` bytes from a page store into `bounce` (`read` fills the
    /// buffer it is given), for a later [`Arena::install_bounce`].
    pub fn store_read(
        &self,
        len: usize,
        bounce: &Bounce,
        read: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        assert!(bounce.len >= len);
        // SAFETY: the bounce buffer is a private mapping owned by `bounce`,
        // writable for `bounce.len >= len` bytes, and this thread's alone
        // (`with_bounce`): no other reference into it while `read` runs.
        let buf = unsafe { std::slice::from_raw_parts_mut(bounce.addr as *mut u8, len) };
        read(buf)
    }

    /// Installs the first `len` bytes of `bounce` at `dst` (of the
    /// reservation), write-protected if `wp` (see `tracks_writes`), waking
    /// the waiters if `wake`. Returns the bytes installed (a prefix).
    pub fn install_bounce(
        &self,
        uffd: &Uffd,
        dst: usize,
        len: usize,
        wp: bool,
        wake: bool,
        bounce: &Bounce,
    ) -> Result<usize, Errno> {
        self.install_bounce_part(uffd, dst, 0, len, wp, wake, bounce)
    }

    /// [`Arena::install_bounce`] of `len` bytes in two halves at once: bytes
    /// `[mid, len)` are offered to a helper thread (`lender`, served by
    /// [`Arena::help_install`] on another CPU) while this thread installs
    /// `[0, mid)`; a half no helper claimed is installed here after. No
    /// wake-up and no write protection (for a caller no thread waits on).
    /// Returns the bytes installed of each half (each a prefix of its half:
    /// the second may be in when the first is short).
    #[allow(clippy::too_many_arguments)]
    pub fn install_bounce_split(
        &self,
        uffd: &Uffd,
        lender: &Lender,
        dst: usize,
        mid: usize,
        len: usize,
        bounce: &Bounce,
    ) -> (Result<usize, Errno>, Result<usize, Errno>) {
        assert!(mid <= len && bounce.len >= len);
        if let Err(e) = self.check(dst, len) {
            return (Err(e), Err(e));
        }
        let job = [dst + mid, bounce.addr + mid, len - mid];
        let (head, tail) = lender.lend(
            job,
            || self.install_bounce_part(uffd, dst, 0, mid, false, false, bounce),
            |_| errno_or_len(self.install_bounce_part(uffd, dst, mid, len - mid, false, false, bounce)),
        );
        (head, len_or_errno(tail))
    }

    /// The helper's side of [`Arena::install_bounce_split`]: installs a half
    /// offered in `lender`, if any. Returns whether it did.
    pub fn help_install(&self, uffd: &Uffd, lender: &Lender) -> bool {
        lender.help(|[dst, src, len]| {
            errno_or_len(self.check(dst, len).and_then(|()| {
                // SAFETY: only `install_bounce_split` offers jobs, with a
                // source inside its bounce buffer (`bounce.addr + mid`, `len
                // - mid` bytes), which it keeps borrowed until the job is
                // settled (`Lender::lend`): readable for `len` bytes.
                unsafe { uffd.copy_wp(dst, src as *const u8, len, false, false) }
            }))
        })
    }

    /// [`Arena::install_bounce`] of bytes `[from, from + len)` of `bounce`,
    /// at `dst + from`.
    #[allow(clippy::too_many_arguments)]
    pub fn install_bounce_part(
        &self,
        uffd: &Uffd,
        dst: usize,
        from: usize,
        len: usize,
        wp: bool,
        wake: bool,
        bounce: &Bounce,
    ) -> Result<usize, Errno> {
        self.check(dst + from, len)?;
        assert!(bounce.len >= from + len);
        // SAFETY: the bounce buffer is ours and readable for `from + len`
        // bytes.
        unsafe { uffd.copy_wp(dst + from, (bounce.addr + from) as *const u8, len, wake, wp && self.program_wp) }
    }

    /// Reads `len` bytes of `file` at `off` and installs them at `dst` (of
    /// the reservation), without waking the waiters (the caller commits,
    /// then wakes). Bytes past the end of the file read as zeros up to the
    /// end of the last page that holds file data. Returns
    /// the bytes installed (a whole number of pages; 0 when `off` is at or
    /// past the end of the file), and whether the read went through the
    /// host page cache (a single page is read with `O_DIRECT` where the file
    /// system allows it, on a ring of `rings`; see
    /// `MappedFile::read_page_direct`).
    #[allow(clippy::too_many_arguments)]
    pub fn file_in(
        &self,
        uffd: &Uffd,
        file: &MappedFile,
        off: u64,
        dst: usize,
        len: usize,
        bounce: &Bounce,
        rings: &crate::ring::RingPool,
    ) -> Result<(usize, bool), Errno> {
        self.check(dst, len)?;
        let (pages_len, cached) = self.file_read(file, off, len, bounce, rings)?;
        if pages_len == 0 {
            return Ok((0, cached));
        }
        self.install_bounce(uffd, dst, pages_len, false, false, bounce).map(|n| (n, cached))
    }

    /// The read of [`Arena::file_in`], into `bounce`: the bytes to install
    /// (whole pages, the tail past the end of the file zeroed; 0 when `off`
    /// is at or past the end), and whether the read went through the host
    /// page cache.
    pub fn file_read(
        &self,
        file: &MappedFile,
        off: u64,
        len: usize,
        bounce: &Bounce,
        rings: &crate::ring::RingPool,
    ) -> Result<(usize, bool), Errno> {
        let ps = self.page_size;
        assert!(bounce.len >= len);
        // A single page past the page cache where the file system allows it
        // (its short count says where the file ends: no fstat needed).
        // SAFETY: the bounce buffer is ours, page-aligned and at least a page.
        let direct = if len == ps { unsafe { file.read_page_direct(bounce.addr, ps, off, rings) } } else { None };
        let cached = direct.is_none();
        let done = match direct {
            Some(r) => r?,
            // Through the page cache: `pread` stops at the end of the file
            // (its count says where, as the single page's does: an `fstat`
            // first was one more syscall per fault).
            // SAFETY: the bounce buffer is ours and writable for its length.
            None => unsafe { pread_upto(file.read_fd(), bounce.addr, len, off) }?,
        };
        if done == 0 {
            return Ok((0, cached));
        }
        let pages_len = done.div_ceil(ps) * ps;
        // SAFETY: the tail of the last page is inside the bounce buffer.
        unsafe { mem::zero(bounce.addr + done, pages_len - done) };
        Ok((pages_len, cached))
    }

    /// Writes one page of the space — at `src` (mapped) or in staging `slot`
    /// — to `file` at `off`, never past the end of the file.
    pub fn page_out_to_file(
        &self,
        file: &MappedFile,
        src: Option<usize>,
        procmem: Option<&ProcMem>,
        slot: Option<u32>,
        off: u64,
    ) -> Result<(), Errno> {
        let ps = self.page_size;
        let addr = match (src, slot) {
            (_, Some(s)) => self.slot_addr(s),
            (Some(a), None) => {
                self.check(a, ps)?;
                a
            }
            (None, None) => return Err(Errno::EINVAL),
        };
        let size = file.size()?;
        if off >= size {
            return Ok(());
        }
        let len = ps.min((size - off) as usize);
        if slot.is_some() {
            // SAFETY: a parked page in staging, readable for a page (it
            // never faults: staging is ours, not registered).
            return unsafe { pwrite_all(file.raw(), addr, len, off) };
        }
        // A page of the space is copied out first, never written from
        // where it is: between the caller's snapshot and this write the
        // page may be evicted, and a `pwrite` that faults on it does so
        // holding the file's inode lock, while the handler may wait for
        // reclaim, whose own write-back waits for that lock (a deadlock
        // seen in the file tests). The copy's fault takes no lock of ours.
        PAGE.with(|b| {
            let mut b = b.borrow_mut();
            b.resize(len, 0);
            // `process_vm_readv` first: a page evicted since the snapshot
            // is faulted back in through the handlers (a `/proc/self/mem`
            // read cannot wait for a userfault: its GUP may not retry, and
            // the read fails with EIO — seen as a spurious munmap EIO by
            // the fuzzer with a host swap file). `/proc/self/mem` where the
            // region is not readable (PROT_NONE, write-only: FOLL_FORCE).
            // A page that cannot be read either way is `EFAULT`, whatever
            // the reader said: the caller tells it from the file's errors
            // (it may find the page elsewhere now and try again).
            if crate::ffi::copy_from_own_memory(&mut b[..len], addr).is_err() {
                let pm = procmem.ok_or(Errno::EFAULT)?;
                // SAFETY: `b` is our own buffer, writable for `len` bytes.
                unsafe { pm.read(b.as_mut_ptr() as usize, addr, len) }.map_err(|_| Errno::EFAULT)?;
            }
            // SAFETY: `b` is our own buffer, readable for `len` bytes.
            let r = unsafe { pwrite_all(file.raw(), b.as_ptr() as usize, len, off) };
            // No copy of the page stays behind (a core dump would show it,
            // though its region is `MADV_DONTDUMP`).
            b.fill(0);
            r
        })
    }
}

/// A page-aligned private buffer (for O_DIRECT reads).
pub struct Bounce {
    pub(super) addr: usize,
    pub(super) len: usize,
}

impl Bounce {
    pub fn new(len: usize) -> Result<Bounce, Errno> {
        let b = Bounce { addr: mem::map_rw(len)?, len };
        // Copies of the program's pages (swap and file I/O) stay out of
        // core dumps, as the staging area does.
        // SAFETY: the buffer is ours, just mapped: no reference into it.
        unsafe { mem::advise(b.addr, b.len, libc::MADV_DONTDUMP) }?;
        Ok(b)
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: the buffer is ours and dropped with us.
        unsafe {
            let _ = mem::unmap(self.addr, self.len);
        }
    }
}

/// A copy's result in one word for a [`Lender`]: the bytes, or `-errno`.
pub(super) fn errno_or_len(r: Result<usize, Errno>) -> i64 {
    match r {
        Ok(n) => n as i64,
        Err(e) => -(e.0 as i64),
    }
}

/// The other way round.
pub(super) fn len_or_errno(v: i64) -> Result<usize, Errno> {
    if v < 0 {
        Err(Errno(-v as i32))
    } else {
        Ok(v as usize)
    }
}
