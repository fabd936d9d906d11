//! `/proc/self/pagemap`: whether a page is present, and `PAGEMAP_SCAN` for
//! runs of present or zero-page-mapped pages.

use super::*;

/// `/proc/self/pagemap`: whether a page is present.
pub struct Pagemap(OwnedFd);

impl Pagemap {
    pub fn open() -> Result<Pagemap, Errno> {
        // SAFETY: NUL-terminated path.
        let fd = check(unsafe { libc::open(c"/proc/self/pagemap".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
        // SAFETY: a new descriptor we own.
        Ok(Pagemap(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// In a forked child: opens the file again under the same number (one
    /// opened before the fork still shows the parent's pages).
    pub fn reopen_in_child(&self) -> Result<(), Errno> {
        crate::replace_fd(self.0.as_raw_fd(), Pagemap::open()?.0)
    }

    /// Whether the page at `addr` is gone: neither present (bit 63 of its
    /// entry) nor swapped out by the host (bit 62). A page the host swapped
    /// (a host with swap of its own, under its own pressure) still holds
    /// its data.
    pub fn gone(&self, addr: usize) -> Result<bool, Errno> {
        let e = self.entry(addr)?;
        Ok(e >> 62 == 0)
    }

    /// The raw pagemap entry of the page at `addr`.
    pub fn entry(&self, addr: usize) -> Result<u64, Errno> {
        let mut e = 0u64;
        // SAFETY: reads 8 bytes into a valid u64.
        let r = unsafe {
            libc::pread(
                self.0.as_raw_fd(),
                &mut e as *mut u64 as *mut libc::c_void,
                8,
                ((addr / 4096) * 8) as libc::off_t,
            )
        };
        if check_isize(r)? != 8 {
            return Err(Errno::EIO);
        }
        Ok(e)
    }

    /// Whether the page at `addr` is present and maps a page of its own,
    /// not the shared zero page (`PAGEMAP_SCAN`; Linux 6.7+).
    pub fn present_not_zero(&self, addr: usize) -> Result<bool, Errno> {
        let mut vec = [PageRegion::default(); 1];
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: (addr & !4095) as u64,
            end: ((addr & !4095) + 4096) as u64,
            vec: vec.as_mut_ptr() as u64,
            vec_len: 1,
            category_mask: PAGE_IS_PRESENT,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_PFNZERO,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at one
        // writable page_region entry that outlives the call.
        let n = check_isize(unsafe { libc::ioctl(self.0.as_raw_fd(), PAGEMAP_SCAN, &mut arg) as isize })?;
        Ok(n == 1 && vec[0].categories & PAGE_IS_PFNZERO == 0)
    }

    /// The page ranges of `[addr, addr+len)` whose page-table entry maps
    /// the shared zero page (`PAGEMAP_SCAN`, `PAGE_IS_PFNZERO`; Linux 6.7+).
    /// `Err` where the kernel has no `PAGEMAP_SCAN`.
    pub fn zero_pfn_ranges(&self, addr: usize, len: usize) -> Result<Vec<(usize, usize)>, Errno> {
        let mut out = Vec::new();
        self.scan(addr, len, PAGE_IS_PFNZERO, |s, e| out.push((s, e)))?;
        Ok(out)
    }

    /// The runs `[start, end)` of `[addr, addr+len)` whose pages are in
    /// `category` (`PAGEMAP_SCAN`, Linux 6.7+), in address order, each
    /// handed to `each`; one call a batch of 256 runs, going on from where
    /// the kernel stopped (`walk_end`). A run may come split in two where a
    /// batch ended.
    pub(crate) fn scan(
        &self,
        addr: usize,
        len: usize,
        category: u64,
        mut each: impl FnMut(usize, usize),
    ) -> Result<(), Errno> {
        let mut vec = [PageRegion::default(); 256];
        let mut start = addr as u64;
        let end = (addr + len) as u64;
        while start < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start,
                end,
                vec: vec.as_mut_ptr() as u64,
                vec_len: vec.len() as u64,
                category_mask: category,
                return_mask: category,
                ..PmScanArg::default()
            };
            // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at
            // `vec.len()` writable page_region entries that outlive the
            // call; the scan only reads page tables.
            let n = check_isize(unsafe { libc::ioctl(self.0.as_raw_fd(), PAGEMAP_SCAN, &mut arg) as isize })?;
            for r in &vec[..n.min(vec.len())] {
                each(r.start as usize, r.end as usize);
            }
            if arg.walk_end <= start || n < vec.len() {
                break;
            }
            start = arg.walk_end;
        }
        Ok(())
    }
}

/// `PAGEMAP_SCAN` (`_IOWR('f', 16, struct pm_scan_arg)`) and its categories,
/// from the kernel's uapi `linux/fs.h` (newer than this system's headers).
pub(super) const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
pub(crate) const PAGE_IS_PRESENT: u64 = 1 << 3;
pub(super) const PAGE_IS_PFNZERO: u64 = 1 << 5;

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Default)]
pub(super) struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}
