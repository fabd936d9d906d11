//! The simulation's shared file regions: each `mmap` of a file maps a new
//! unlinked temporary file, and these steps check that each file holds its
//! pages' last bytes (after `msync`, `munmap`, a replacement, at the end).

use usermm_core::consts::*;
use usermm_core::Errno;

use super::{Sim, PS};

impl Sim {
    /// The shared file pages of `[s, s+l)`: (page, file, page in file, the
    /// bytes it must hold).
    pub(super) fn file_pages(&self, s: usize, l: usize) -> Vec<(usize, u64, u64, u64)> {
        (s..s + l).filter_map(|q| self.model[q].and_then(|m| m.file.map(|(f, fp)| (q, f, fp, m.stamp)))).collect()
    }

    /// Each listed file page holds its bytes in its file.
    pub(super) fn check_files(&mut self, pages: &[(usize, u64, u64, u64)], when: &str) {
        use std::os::unix::fs::FileExt;
        for &(q, f, fp, stamp) in pages {
            let file = &self.files[&f];
            let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
            file.read_exact_at(&mut a, fp * PS as u64).expect("file read");
            file.read_exact_at(&mut b, fp * PS as u64 + PS as u64 - 8).expect("file read");
            let got = (u64::from_le_bytes(a), u64::from_le_bytes(b));
            assert_eq!(got, (stamp, stamp), "p{q} ({when}): file {f} page {fp} holds {got:?}, not the last write");
            self.sum.file_checks += 1;
        }
    }

    /// `msync` (`MS_SYNC` or `MS_ASYNC`) of a random range: the mapped file
    /// pages reach their files (a hole is `ENOMEM`, after the mapped parts).
    /// The second thread may write the range meanwhile: a page it wrote may
    /// hold either write in its file now (and must hold the last one after
    /// the next write-back).
    pub(super) fn op_msync(&mut self) {
        let (s, l) = self.random_range();
        self.set_busy(0, 0);
        let flags = if self.rng.one_in(2) { MS_SYNC } else { MS_ASYNC };
        self.log.push(format!("msync p{s}+{l} flags {flags}"));
        let r = self.inner.msync(Self::addr(s), l * PS, flags);
        let hole = (s..s + l).any(|q| self.model[q].is_none());
        assert_eq!(r, if hole { Err(Errno::ENOMEM) } else { Ok(()) }, "msync");
        let raced = self.other_writes();
        let mut pages = self.file_pages(s, l);
        pages.retain(|pg| !raced.contains(&pg.0));
        self.check_files(&pages, "after msync");
    }
}

/// A read-write file of `pages` zero pages, unlinked at once. Its name is
/// unique in the process (`create_new`, a process-wide counter): two
/// simulations run by parallel test threads made the same names from the
/// same seed, opened one file and truncated each other's pages (seed 0x24
/// failed "file read: UnexpectedEof" in one CI run).
pub(super) fn temp_file(id: u64, pages: usize) -> std::fs::File {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("usermm-sim-{}-{n}-{id}", std::process::id()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("temp file");
    f.set_len((pages * PS) as u64).expect("set_len");
    let _ = std::fs::remove_file(&path);
    f
}
