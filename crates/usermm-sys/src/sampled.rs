//! The "zap and scan" reference source: a memfd mapped `MAP_SHARED` over a
//! range of the caller's reservation and registered MISSING|WP with its
//! userfaultfd, so that whether a page was touched since it was last zapped
//! can be read from the page tables (`PAGEMAP_SCAN`) without a fault
//! round trip through usermm.
//!
//! # What the kernel does with such a page (Linux 6.18, measured)
//! The bytes live in the memfd (the page cache of a shmem file); the
//! mapping only shows them. A page of the range is in one of four states:
//!
//! ```text
//!   state        in memfd  mapped   read touch            write touch
//!   hole         no        no       MISSING message       MISSING message
//!   mapped       yes       yes      silent                silent
//!   zapped       yes       no       minor fault, silent   minor fault, silent
//!   zapped+WP    yes       no       minor fault, silent   WP message
//!                                   (mapped read-only, still protected)
//!
//!   hole ──fill_copy/fill_zero──▶ mapped ──zap──▶ zapped ──touch──▶ mapped
//!   zapped ──protect_for_eviction──▶ zapped+WP ──read──▶ mapped (WP)
//!   any ──punch──▶ hole
//! ```
//!
//! - [`SampledMap::zap`] (`MADV_DONTNEED`) drops a page's mapping but not the
//!   page: it clears its "reference bit". The next touch maps it again
//!   inside the kernel, with no userfaultfd message, and
//!   [`SampledMap::present`] (`PAGEMAP_SCAN`, `PAGE_IS_PRESENT`) then lists
//!   exactly the touched pages: a range registered for WP has fault-around
//!   turned off, so a touch never maps its neighbours.
//! - [`SampledMap::protect_for_eviction`] (`UFFDIO_WRITEPROTECT`) on zapped
//!   pages leaves write-protect markers in their page-table entries: a read
//!   still maps the page silently (read-only), a write waits in a WP fault
//!   until [`SampledMap::unprotect`]. An evictor can so read a page's bytes
//!   ([`SampledMap::read_page`], from the memfd: no touch) knowing that no
//!   write slips in between, then [`SampledMap::punch`] it.
//! - [`SampledMap::punch`] (`fallocate(PUNCH_HOLE)`) frees the page from the
//!   memfd (and unmaps it): the next touch is a MISSING message again.
//!
//! A fill (`UFFDIO_COPY`, `UFFDIO_ZEROPAGE`) installs a page writable,
//! whatever protection its address had: a protected page that is punched
//! and filled again is no longer protected (measured).
//!
//! Host reclaim of a memfd page should unmap it as a zap does (shmem keeps
//! its swap entry in the file, not in the page table), so the page reads as
//! not referenced and its next touch is silent (a major fault); this is
//! the kernel's design, not measured here (this host has no swap).
//!
//! # Invariants
//! `addr` and `len` are multiples of [`PAGE`], `len > 0`, and
//! `addr + len` does not overflow; the byte at `addr + i` of the mapping is
//! the byte at offset `i` of the memfd, which is `len` bytes long. Every
//! method checks that its range lies inside the map (`EFAULT` otherwise)
//! and, where the kernel works in pages, that it is page-aligned (`EINVAL`).
//!
//! # What this is not for
//! `MADV_DONTNEED` on a private anonymous range registered MISSING drops
//! the page itself: its next touch is a MISSING message and the bytes are
//! gone. Only a shared file mapping keeps them.
//!
//! A forked child shares the memfd's pages (the mapping is `MAP_SHARED`)
//! but not the registration; a caller that forks sets `MADV_DONTFORK` on
//! the range. The descriptors held here still show the parent's pages
//! (`/proc/self/pagemap`) in a child.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::file::pagemap::PAGE_IS_PRESENT;
use crate::file::{punch_hole, Pagemap};
use crate::uffd::{Uffd, UFFDIO_REGISTER_MODE_MISSING, UFFDIO_REGISTER_MODE_WP, UFFD_FEATURE_PAGEFAULT_FLAG_WP};
use crate::{check, mem, Errno};

/// The page size the map works in (the host's base page).
pub const PAGE: usize = 4096;

/// A memfd mapped shared over `[addr, addr+len)` of the caller's
/// reservation, registered MISSING|WP with the caller's userfaultfd.
///
/// Every method that takes a [`Uffd`] must be given the one
/// [`SampledMap::new`] registered the range with, the one whose messages
/// it serves (the kernel refuses another's copies there with `ENOENT`).
///
/// Dropping the map closes its descriptors only. The mapping holds a
/// reference to the memfd of its own, so its pages stay, registered, until
/// the caller unmaps or replaces the range (the caller owns it, as
/// [`SampledMap::new`] says).
pub struct SampledMap {
    /// Invariant: a multiple of [`PAGE`], and `addr + len` does not
    /// overflow (checked by `new`).
    addr: usize,
    /// Invariant: a multiple of [`PAGE`], more than 0, and the memfd's size.
    len: usize,
    memfd: OwnedFd,
    /// `/proc/self/pagemap`, for `PAGEMAP_SCAN`.
    pagemap: Pagemap,
}

impl SampledMap {
    /// Creates a memfd of `len` bytes (`MFD_CLOEXEC`), maps it read-write,
    /// `MAP_SHARED | MAP_FIXED`, over `[addr, addr+len)`, and registers the
    /// range with `uffd` in MISSING|WP mode. Every page starts as a hole:
    /// its first touch raises a MISSING message.
    ///
    /// Errors: `EINVAL` for a range that is empty or not page-aligned;
    /// `EOPNOTSUPP` where `uffd` cannot write-protect, or the kernel cannot
    /// write-protect shmem (see below); else the failing call's errno.
    ///
    /// What a failure leaves: before the `mmap` (argument checks, the memfd,
    /// `/proc/self/pagemap`) the range is untouched. A failed `MAP_FIXED`
    /// normally leaves the old mapping since Linux 6.12 (the old one is
    /// unmapped only once the new one is set up); an older kernel may leave
    /// a hole. After a failed registration the range holds a fresh
    /// `PROT_NONE` private anonymous mapping (what `mem::reserve` makes):
    /// the old mapping's bytes are gone then.
    ///
    /// # Why not check `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`?
    /// [`Uffd::open`] keeps only the features usermm asks for, and that
    /// bit is not one of them: the kernel reports it but does not need it
    /// asked for. A kernel without write-protect markers for shmem refuses
    /// the registration itself (`EINVAL` on a range `new` has just checked
    /// and mapped), which is reported as `EOPNOTSUPP`.
    ///
    /// # Safety
    /// `[addr, addr+len)` must be memory of this process that nothing but
    /// the caller relies on (a part of its reservation), and no Rust
    /// reference may point into it while the mapping made here is there:
    /// the map's methods install, drop and free its pages.
    pub unsafe fn new(uffd: &Uffd, addr: usize, len: usize) -> Result<SampledMap, Errno> {
        if len == 0 || !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || addr.checked_add(len).is_none() {
            return Err(Errno::EINVAL);
        }
        if !uffd.has(UFFD_FEATURE_PAGEFAULT_FLAG_WP) {
            return Err(Errno::EOPNOTSUPP);
        }
        // SAFETY: a plain syscall on a static NUL-terminated name.
        let fd = check(unsafe { libc::memfd_create(c"usermm-sampled".as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: `fd` was just created and is owned here alone.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a plain syscall on our own descriptor.
        check(unsafe { libc::ftruncate(memfd.as_raw_fd(), size) })?;
        let pagemap = Pagemap::open()?;
        // SAFETY: the caller's contract: the range is its own, and nothing
        // relies on its old bytes.
        unsafe { mem::map_shared_fixed(addr, len, libc::PROT_READ | libc::PROT_WRITE, memfd.as_raw_fd(), 0) }?;
        if let Err(e) = uffd.register_mode(addr, len, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP) {
            // SAFETY: the caller's contract; the range holds only the empty
            // memfd mapping made above.
            let _ = unsafe { mem::replace_anon(addr, len, libc::PROT_NONE) };
            return Err(if e == Errno::EINVAL { Errno::EOPNOTSUPP } else { e });
        }
        Ok(SampledMap { addr, len, memfd, pagemap })
    }

    /// The first address of the map.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The map's length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len
    }

    /// `UFFDIO_COPY`: installs `src` at `[dst, dst+src.len())` (a page
    /// multiple), pages that are holes, waking the threads waiting there if
    /// `wake` — how a MISSING message is served. Returns the bytes
    /// installed: a prefix, shorter than `src` where a page the memfd
    /// already holds (mapped or zapped) stopped the copy (`EEXIST`, which
    /// never overwrites).
    pub fn fill_copy(&self, uffd: &Uffd, dst: usize, src: &[u8], wake: bool) -> Result<usize, Errno> {
        self.offset_aligned(dst, src.len())?;
        // SAFETY: `src` is a live slice, readable for its length, and it
        // cannot point into the map (no Rust reference does, by `new`'s
        // contract); `dst` is this map's (checked), whose bytes no Rust
        // reference relies on.
        unsafe { uffd.copy(dst, src.as_ptr(), src.len(), wake) }
    }

    /// `UFFDIO_ZEROPAGE`: installs zero-filled pages at `[dst, dst+len)`,
    /// pages that are holes, waking the waiters if `wake`. In a shmem
    /// mapping this allocates a page of the memfd (there is no shared zero
    /// page for files). Returns the bytes installed (a prefix).
    pub fn fill_zero(&self, uffd: &Uffd, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        self.offset_aligned(dst, len)?;
        // SAFETY: this map's range (checked): no Rust reference points
        // into it, by `new`'s contract.
        unsafe { uffd.zeropage(dst, len, wake) }
    }

    /// Zaps the `(address, length)` runs (`MADV_DONTNEED`, batched with
    /// `process_madvise`): their pages stay in the memfd but leave the page
    /// tables, so [`SampledMap::present`] lists them again only once
    /// touched. A write-protected page keeps its protection (as a marker).
    /// Every run is checked before any is zapped. `EINVAL` from the kernel
    /// where a run is locked (`mlock`).
    pub fn zap(&self, runs: &[(usize, usize)]) -> Result<(), Errno> {
        for &(a, l) in runs {
            self.offset_aligned(a, l)?;
        }
        // SAFETY: runs of this map (checked), into which no Rust reference
        // points (`new`'s contract); a shared mapping's bytes stay in the
        // memfd, so no byte changes.
        unsafe { mem::advise_many(runs, libc::MADV_DONTNEED) }
    }

    /// Appends to `out` the `(address, length)` runs of `[a, a+l)` whose
    /// pages are mapped (`PAGEMAP_SCAN`, `PAGE_IS_PRESENT`): those touched
    /// (or filled) since they were last zapped. Runs are in address order
    /// and maximal (two runs appended by one call never touch); entries
    /// already in `out` are left alone.
    pub fn present(&self, a: usize, l: usize, out: &mut Vec<(usize, usize)>) -> Result<(), Errno> {
        self.offset_aligned(a, l)?;
        let first = out.len();
        self.pagemap.scan(a, l, PAGE_IS_PRESENT, |s, e| {
            // A run the kernel split where a batch ended.
            let fresh = out.len() > first;
            match out.last_mut() {
                Some(last) if fresh && last.0 + last.1 == s => last.1 += e - s,
                _ => out.push((s, e - s)),
            }
        })
    }

    /// Write-protects `[a, a+l)` (`UFFDIO_WRITEPROTECT`, mode WP), meant for
    /// zapped pages chosen for eviction: a read of one then maps it
    /// read-only with no message, a write raises a WP message and waits
    /// until [`SampledMap::unprotect`]. Mapped pages are write-protected
    /// where they are.
    pub fn protect_for_eviction(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.offset_aligned(a, l)?;
        uffd.write_protect(a, l)
    }

    /// Lifts the write protection of `[a, a+l)` (`UFFDIO_WRITEPROTECT`,
    /// mode 0) and wakes the writers waiting there: their writes go through
    /// on retry. How a WP message is served when the page stays.
    pub fn unprotect(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.offset_aligned(a, l)?;
        // SAFETY: this map's range (checked); the page stays in the memfd,
        // so the woken writer's retry finds it.
        unsafe { uffd.unprotect(a, l) }
    }

    /// Reads the bytes at `[a, a+buf.len())` of the map into `buf` from the
    /// memfd (`pread`), not through the mapping: the pages are not touched,
    /// so they do not become present. A hole reads as zeros and stays a
    /// hole.
    pub fn read_page(&self, a: usize, buf: &mut [u8]) -> Result<(), Errno> {
        let off = self.offset(a, buf.len())?;
        // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
        let n = unsafe { crate::file::pread_upto(self.memfd.as_raw_fd(), buf.as_mut_ptr() as usize, buf.len(), off) }?;
        // Inside the memfd's size, so never short.
        if n < buf.len() {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    /// Frees `[a, a+l)` from the memfd (`fallocate`, `PUNCH_HOLE |
    /// KEEP_SIZE`), unmapping it wherever it is mapped: the pages become
    /// holes, whose next touch raises a MISSING message.
    pub fn punch(&self, a: usize, l: usize) -> Result<(), Errno> {
        let off = self.offset_aligned(a, l)?;
        if l == 0 {
            return Ok(());
        }
        // (The pages freed are this map's, checked, which no Rust reference
        // relies on.)
        punch_hole(self.memfd.as_raw_fd(), off, l as u64)
    }

    /// The memfd offset of `[a, a+l)`; `EFAULT` unless it lies inside the
    /// map.
    fn offset(&self, a: usize, l: usize) -> Result<u64, Errno> {
        let end = a.checked_add(l).ok_or(Errno::EFAULT)?;
        if a < self.addr || end > self.addr + self.len {
            return Err(Errno::EFAULT);
        }
        Ok((a - self.addr) as u64)
    }

    /// [`SampledMap::offset`], and `EINVAL` unless `a` and `l` are page
    /// multiples.
    fn offset_aligned(&self, a: usize, l: usize) -> Result<u64, Errno> {
        if !a.is_multiple_of(PAGE) || !l.is_multiple_of(PAGE) {
            return Err(Errno::EINVAL);
        }
        self.offset(a, l)
    }
}
