//! The test file of `lockonfault`: its content (recomputable from the seed,
//! byte by byte), its creation and deletion, and the host page-cache layout
//! it is held in before every measured run (4 KiB or large folios, checked
//! with the page-cache sampler).

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use usermm_sys::host::{fadvise, page_cache_layout, POSIX_FADV_DONTNEED};
use usermm_sys::now_ns;

use super::Cache;
use crate::common::{Progress, Rng, MIB, PAGE};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The file's 8-byte word number `k`: output `k` of `Rng::new(seed)` (the
/// generator's state after `k` steps is `seed + k × golden`), so any byte
/// can be recomputed without the file.
#[inline(always)]
fn word(seed: u64, k: u64) -> u64 {
    Rng::new(seed.wrapping_add(k.wrapping_mul(GOLDEN))).next_u64()
}

/// The file's byte at `off`.
pub(super) fn byte_at(seed: u64, off: usize) -> u8 {
    (word(seed, (off / 8) as u64) >> ((off % 8) * 8)) as u8
}

/// Fills `buf` (one page) with the content of file page `page`.
fn fill_page(buf: &mut [u8], seed: u64, page: usize) {
    let first = (page * PAGE / 8) as u64;
    for (i, c) in buf.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&word(seed, first + i as u64).to_le_bytes());
    }
}

pub(super) fn io(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// What the sampler said about the page cache just before a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) resident_pct: f64,
    /// `None`: unknown (the sampler needs root).
    pub(super) large_pct: Option<f64>,
}

impl Layout {
    pub(super) fn describe(&self) -> String {
        let res =
            if self.resident_pct < 99.95 { format!(", {:.1}% resident", self.resident_pct) } else { String::new() };
        match self.large_pct {
            None => format!("unknown (needs root){res}"),
            Some(p) if p < 50.0 => format!("4 KiB pages ({p:.1}% in large folios){res}"),
            Some(p) => format!("large folios ({p:.0}%){res}"),
        }
    }
}

/// The test file; deleted when dropped.
pub(super) struct TestFile {
    path: String,
    pub(super) len: usize,
    seed: u64,
    sample_every: usize,
    /// The layout last established (`None`: unknown).
    current: Cell<Option<Cache>>,
}

impl TestFile {
    pub(super) fn create(dir: &str, len: usize, seed: u64, sample_every: usize) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-lockonfault-{}-{}.dat", std::process::id(), now_ns());
        let t = TestFile { path, len, seed, sample_every, current: Cell::new(None) };
        File::create_new(&t.path).map_err(|e| io(&format!("create {}", t.path), e))?;
        t.write_4k()?;
        Ok(t)
    }

    pub(super) fn open(&self) -> Result<File, String> {
        File::open(&self.path).map_err(|e| io(&format!("open {}", self.path), e))
    }

    /// Drops the file's page cache (after writing back anything dirty, which
    /// `POSIX_FADV_DONTNEED` would otherwise keep).
    fn drop_cache(&self, f: &File) -> Result<(), String> {
        f.sync_data().map_err(|e| io("fdatasync", e))?;
        fadvise(f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| io("fadvise(DONTNEED)", format!("{e:?}")))
    }

    /// (Re)writes the whole content with buffered 4 KiB `pwrite`s after
    /// dropping the cache: the page cache then holds the file in 4 KiB
    /// folios (a write of one page allocates an order-0 folio), clean after
    /// the final `fdatasync`.
    fn write_4k(&self) -> Result<(), String> {
        let f = OpenOptions::new().read(true).write(true).open(&self.path).map_err(|e| io("open", e))?;
        self.drop_cache(&f)?;
        let mut buf = vec![0u8; PAGE];
        for p in 0..self.len / PAGE {
            fill_page(&mut buf, self.seed, p);
            f.write_all_at(&buf, (p * PAGE) as u64).map_err(|e| io("pwrite", e))?;
        }
        f.sync_data().map_err(|e| io("fdatasync", e))?;
        self.current.set(Some(Cache::Small));
        Ok(())
    }

    /// Drops the cache and reads the file sequentially in 1 MiB reads:
    /// read-ahead fills the cache with large folios.
    fn read_large(&self) -> Result<(), String> {
        let f = self.open()?;
        self.drop_cache(&f)?;
        let g = self.open()?;
        self.read_through(&g)?;
        self.current.set(Some(Cache::Large));
        Ok(())
    }

    /// Reads the whole file with 1 MiB `pread`s, discarding the data.
    fn read_through(&self, f: &File) -> Result<(), String> {
        let mut buf = vec![0u8; MIB];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(MIB);
            f.read_exact_at(&mut buf[..n], off as u64).map_err(|e| io("pread", e))?;
            off += n;
        }
        std::hint::black_box(&buf);
        Ok(())
    }

    fn layout(&self, f: &File) -> Result<(Layout, Vec<u64>), String> {
        let l = page_cache_layout(f, self.len, self.sample_every).map_err(|e| io("page-cache sampler", e))?;
        let layout = Layout {
            resident_pct: 100.0 * l.resident_pages as f64 / l.pages as f64,
            large_pct: l.folios.ok().filter(|s| s.sampled > 0).map(|s| 100.0 * s.large_fraction()),
        };
        Ok((layout, l.missing))
    }

    /// Brings back the few `missing` pages of a cache in the `want` layout:
    /// 4 KiB `pwrite`s of their content (order-0 folios, like the rest) or,
    /// for large folios, 4 KiB `pread`s (read-ahead picks the folio size).
    fn repair(&self, want: Cache, missing: &[u64]) -> Result<(), String> {
        let f =
            OpenOptions::new().read(true).write(want == Cache::Small).open(&self.path).map_err(|e| io("open", e))?;
        let mut buf = vec![0u8; PAGE];
        for &p in missing {
            let off = p * PAGE as u64;
            if want == Cache::Small {
                fill_page(&mut buf, self.seed, p as usize);
                f.write_all_at(&buf, off).map_err(|e| io("pwrite", e))?;
            } else {
                f.read_exact_at(&mut buf, off).map_err(|e| io("pread", e))?;
            }
        }
        if want == Cache::Small {
            f.sync_data().map_err(|e| io("fdatasync", e))?;
        }
        Ok(())
    }

    /// Makes the page cache hold the whole file in the `want` layout, right
    /// before a measured run (untimed): checks it with the sampler; if the
    /// folios are of the wrong kind or more than 1% of the pages are
    /// missing, re-establishes the layout, else brings the missing pages back
    /// one by one; then reads the file once through the cache (pages of an
    /// idle cache may have been paged out by the hypervisor; this faults
    /// them back in, and changes no folio). Returns the layout the run sees.
    pub(super) fn prepare(&self, want: Cache, prog: &Progress) -> Result<Layout, String> {
        let f = self.open()?;
        let (l, missing) = self.layout(&f)?;
        let kind_ok = match l.large_pct {
            Some(p) => (want == Cache::Large) == (p >= 50.0),
            None => self.current.get() == Some(want),
        };
        let t = now_ns();
        if l.resident_pct < 99.0 || !kind_ok {
            match want {
                Cache::Small => self.write_4k()?,
                Cache::Large => self.read_large()?,
            }
            prog.say(&format!(
                "page cache was {}; re-established {} in {:.1} s",
                l.describe(),
                if want == Cache::Small { "4 KiB folios (4 KiB pwrites)" } else { "large folios (sequential read)" },
                (now_ns() - t) as f64 / 1e9
            ));
        } else if !missing.is_empty() {
            self.repair(want, &missing)?;
            prog.say(&format!(
                "page cache missed {} pages; brought them back in {:.2} s",
                missing.len(),
                (now_ns() - t) as f64 / 1e9
            ));
        }
        self.read_through(&f)?;
        Ok(self.layout(&f)?.0)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
