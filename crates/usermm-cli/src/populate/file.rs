//! The test file of `populate`'s file kinds: one per size, every page filled
//! with its pattern byte, kept warm and clean in the host page cache before
//! every measurement, and checked intact.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use usermm_sys::host::page_cache_layout;
use usermm_sys::now_ns;

use super::touch::pattern;
use crate::common::{MIB, PAGE};

fn io(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The file kinds' test file of one size; deleted when dropped.
pub(super) struct TestFile {
    path: String,
    pub(super) file: File,
    pub(super) len: usize,
}

impl TestFile {
    /// Creates the file in `dir`: `len` bytes of [`pattern`], written with
    /// 1 MiB `pwrite`s and `fsync`ed.
    pub(super) fn create(dir: &str, len: usize) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-populate-{}-{}MiB-{}.dat", std::process::id(), len / MIB, now_ns());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io(&format!("create {path}"), e))?;
        let t = TestFile { path, file, len };
        let mut buf = vec![0u8; MIB];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MIB);
            for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
                page.fill(pattern(off / PAGE + i));
            }
            t.file.write_all_at(&buf[..n], off as u64).map_err(|e| io("pwrite", e))?;
            off += n;
        }
        t.file.sync_all().map_err(|e| io("fsync", e))?;
        Ok(t)
    }

    /// Right before a measurement (untimed): writes back whatever an earlier
    /// run dirtied (`fdatasync`; a no-op when the file is clean), then reads
    /// the whole file with 1 MiB `pread`s so that the host page cache holds
    /// all of it. Returns the pages whose first byte is not their pattern
    /// (0: the file is intact).
    pub(super) fn warm(&self) -> Result<usize, String> {
        self.file.sync_data().map_err(|e| io("fdatasync", e))?;
        let mut buf = vec![0u8; MIB];
        let mut bad = 0;
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(MIB);
            self.file.read_exact_at(&mut buf[..n], off as u64).map_err(|e| io("pread", e))?;
            bad += (0..n / PAGE).filter(|&i| buf[i * PAGE] != pattern(off / PAGE + i)).count();
            off += n;
        }
        Ok(bad)
    }

    /// `(resident %, % of sampled pages in large folios)` of the file in
    /// the host page cache (the second `None` without root).
    pub(super) fn layout(&self) -> Result<(f64, Option<f64>), String> {
        let l = page_cache_layout(&self.file, self.len, 64).map_err(|e| io("page-cache sampler", format!("{e:?}")))?;
        let large = l.folios.ok().filter(|s| s.sampled > 0).map(|s| 100.0 * s.large_fraction());
        Ok((100.0 * l.resident_pages as f64 / l.pages as f64, large))
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
