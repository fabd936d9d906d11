//! How the host page cache holds a file ([`page_cache_layout`]: resident
//! pages, large folios) and how many pages of a range are resident
//! ([`resident_pages`]).

use std::os::fd::AsRawFd;

use crate::{check, last_errno, Errno};

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
