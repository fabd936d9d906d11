//! The files the space maps: how many pages of live regions map each, and
//! the write-back errors not reported yet.
//!
//! Invariant (`validate`): `pages` counts, for each file, the pages of the
//! live regions mapping it, and holds no file with none. Splits and merges
//! do not change it; `mmap` adds (`map`), a detach subtracts (`unmap`).
//! A write-back error is kept until the next `msync`/`munmap` of its file
//! takes it (`take_error`, fsync semantics).

use std::collections::HashMap;

use crate::errno::Errno;
use crate::region::RegionTree;

#[derive(Default)]
pub(super) struct FileTable {
    /// Pages of live regions mapping each file.
    pages: HashMap<u32, u64>,
    /// Write-back errors not reported yet: `(file, errno)`.
    errors: Vec<(u32, Errno)>,
}

impl FileTable {
    /// A region of `pages` pages now maps `file`.
    pub(super) fn map(&mut self, file: u32, pages: u64) {
        *self.pages.entry(file).or_insert(0) += pages;
    }

    /// A region of `pages` pages no longer maps `file`.
    pub(super) fn unmap(&mut self, file: u32, pages: u64) {
        let n = self.pages.entry(file).or_insert(0);
        *n -= pages;
        if *n == 0 {
            self.pages.remove(&file);
        }
    }

    /// The files still mapped by a live region.
    pub(super) fn in_use(&self) -> Vec<u32> {
        self.pages.iter().filter(|(_, n)| **n > 0).map(|(f, _)| *f).collect()
    }

    /// Keeps a write-back error of `file` for the next `take_error`.
    pub(super) fn note_error(&mut self, file: u32, e: Errno) {
        self.errors.push((file, e));
    }

    /// The first write-back error kept for `file` since the last call; every
    /// error of `file` is cleared.
    pub(super) fn take_error(&mut self, file: u32) -> Option<Errno> {
        let i = self.errors.iter().position(|(f, _)| *f == file)?;
        let e = self.errors[i].1;
        self.errors.retain(|(f, _)| *f != file);
        Some(e)
    }

    /// The pages per file against a recount from the regions.
    pub(super) fn validate(&self, regions: &RegionTree) {
        let mut fp: HashMap<u32, u64> = HashMap::new();
        for r in regions.iter() {
            if let Some(f) = r.file() {
                *fp.entry(f).or_insert(0) += r.range().pages();
            }
        }
        assert_eq!(fp, self.pages, "pages per file");
    }
}
