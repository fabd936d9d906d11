//! Swap and file I/O errors on demand (`Space::inject_swap_errors`, the C
//! ABI's `umm_debug_inject_swap_errors`): a wrapper of the space's platform
//! that fails the next reads or writes with `EIO` before they reach the
//! host, so that no I/O path of the executor checks for an injection.
//!
//! Why a wrapper of the platform and not of the page store: the errors
//! stand for the space's I/O as a program sees it, file regions' reads and
//! write-backs included (the file tests inject them too), and the store is
//! the host's business (`Native` owns it; the simulation keeps its swap
//! elsewhere). The reads counted are swap reads (`swap_read`, a swap-in's
//! `Fill::SwapIn`) and file reads (`file_in`, `file_read`); the writes,
//! store writes (`Store::Write`) and file write-backs
//! (`page_out_to_file`). Everything else passes through untouched.

use std::sync::atomic::{AtomicU32, Ordering};

use usermm_core::Errno;
use usermm_sys::file::MappedFile;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::UffdMsg;

use super::hooks::take_one;
use crate::platform::{Caps, Fill, Platform, Range, Runs, Staging, Store, Thread, Upkeep, Window};

/// The space's platform, with the I/O errors still to inject.
pub(crate) struct Injecting {
    host: Box<dyn Platform>,
    /// Reads still to fail.
    read_errors: AtomicU32,
    /// Writes still to fail.
    write_errors: AtomicU32,
}

impl Injecting {
    pub(super) fn new(host: Box<dyn Platform>) -> Injecting {
        Injecting { host, read_errors: AtomicU32::new(0), write_errors: AtomicU32::new(0) }
    }

    /// Makes the next `reads` reads and `writes` writes fail.
    pub(super) fn set(&self, reads: u32, writes: u32) {
        self.read_errors.store(reads, Ordering::SeqCst);
        self.write_errors.store(writes, Ordering::SeqCst);
    }

    /// Whether read errors are still to be injected (a read that would
    /// not pass through here, a page-cache window, is not made then).
    pub(super) fn reads_pending(&self) -> bool {
        self.read_errors.load(Ordering::Relaxed) != 0
    }

    fn read_fails(&self) -> bool {
        take_one(&self.read_errors)
    }

    fn write_fails(&self) -> bool {
        take_one(&self.write_errors)
    }
}

impl Platform for Injecting {
    fn caps(&self) -> Caps {
        self.host.caps()
    }
    fn wait_events(&self, wake: &EventFd, timeout_ms: i32) -> Result<bool, Errno> {
        self.host.wait_events(wake, timeout_ms)
    }
    fn read_events(&self, buf: &mut [UffdMsg]) -> Result<usize, Errno> {
        self.host.read_events(buf)
    }
    fn fill(&self, op: Fill, dst: usize, len: usize) -> Result<usize, Errno> {
        if matches!(op, Fill::SwapIn { .. }) && self.read_fails() {
            return Err(Errno::EIO);
        }
        self.host.fill(op, dst, len)
    }
    fn swap_gather(&self, reads: &[(u64, usize)], ps: usize, wp: bool) -> Vec<bool> {
        if !self.reads_pending() {
            return self.host.swap_gather(reads, ps, wp);
        }
        // A page at a time, each read one that may fail.
        reads.iter().map(|&(off, dst)| self.fill(Fill::SwapIn { off, wp }, dst, ps) == Ok(ps)).collect()
    }
    fn pool_stats(&self) -> (u64, u64) {
        self.host.pool_stats()
    }
    fn swap_read(&self, off: u64, len: usize, pooled: bool) -> Result<(), Errno> {
        if self.read_fails() {
            return Err(Errno::EIO);
        }
        self.host.swap_read(off, len, pooled)
    }
    fn file_in(&self, file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno> {
        if self.read_fails() {
            return Err(Errno::EIO);
        }
        self.host.file_in(file, off, dst, len)
    }
    fn file_read(&self, file: &MappedFile, off: u64, len: usize) -> Result<(usize, bool), Errno> {
        if self.read_fails() {
            return Err(Errno::EIO);
        }
        self.host.file_read(file, off, len)
    }
    fn file_install_split(&self, dst: usize, mid: usize, len: usize) -> (usize, usize) {
        self.host.file_install_split(dst, mid, len)
    }
    fn help(&self) -> bool {
        self.host.help()
    }
    fn window(&self, op: Window<'_>) -> Result<(), Errno> {
        self.host.window(op)
    }
    fn range(&self, op: Range, a: usize, l: usize) -> Result<bool, Errno> {
        self.host.range(op, a, l)
    }
    fn runs(&self, what: Runs, a: usize, l: usize) -> Vec<(usize, usize)> {
        self.host.runs(what, a, l)
    }
    fn pages_to_slots_move(&self, src: usize, slot: u32, n: usize) -> Result<usize, Errno> {
        self.host.pages_to_slots_move(src, slot, n)
    }
    fn slots_to_pages_move(&self, slot: u32, dst: usize, n: usize) -> Result<usize, Errno> {
        self.host.slots_to_pages_move(slot, dst, n)
    }
    fn pages_to_slots_copy(&self, pairs: &[(usize, u32)]) -> Vec<bool> {
        self.host.pages_to_slots_copy(pairs)
    }
    fn staging(&self, op: Staging<'_>) -> Result<bool, Errno> {
        self.host.staging(op)
    }
    fn upkeep(&self, op: Upkeep) {
        self.host.upkeep(op)
    }
    fn store(&self, op: Store<'_>) -> Result<bool, Errno> {
        if matches!(op, Store::Write { .. }) && self.write_fails() {
            return Err(Errno::EIO);
        }
        self.host.store(op)
    }
    #[cfg(feature = "test-hooks")]
    fn swap_contents(&self, len: u64) -> Result<Vec<u8>, Errno> {
        self.host.swap_contents(len)
    }
    fn page_out_to_file(
        &self,
        file: &MappedFile,
        src: Option<usize>,
        slot: Option<u32>,
        off: u64,
    ) -> Result<(), Errno> {
        if self.write_fails() {
            return Err(Errno::EIO);
        }
        self.host.page_out_to_file(file, src, slot, off)
    }
    fn thread(&self, op: Thread) -> Result<bool, Errno> {
        self.host.thread(op)
    }
    fn fork_child(&self, swap_runs: &[(u64, u64)]) -> Result<(), Errno> {
        self.host.fork_child(swap_runs)
    }
    fn child_tie(&self, tie: &std::sync::Arc<crate::platform::fork::ChildTie>) {
        self.host.child_tie(tie)
    }
    fn share(
        &self,
        a: usize,
        l: usize,
        prot: i32,
        to: crate::platform::ShareTo<'_>,
        pages: &[(usize, crate::platform::ShareSrc)],
    ) -> Result<(), Errno> {
        self.host.share(a, l, prot, to, pages)
    }
}
