//! A space's test and debugging hooks: stalls and failures injected into its
//! executor (the `test-hooks` feature), and `inject_swap_errors`, which
//! every build keeps for programs testing their SIGBUS handling.
#[cfg(feature = "test-hooks")]
use crate::Errno;
use crate::Space;

impl Space {
    #[cfg(feature = "test-hooks")]
    /// Test hook: opens a space a forked child gets no copy of (its
    /// reservation left out of forks), for
    /// the tests of what a child does without one.
    pub fn open_not_copied(cfg: &crate::Config) -> Result<Space, crate::Errno> {
        crate::native::NOT_COPIED.with(|n| n.set(true));
        let s = Space::open(cfg);
        crate::native::NOT_COPIED.with(|n| n.set(false));
        s
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: a handler that decides a transient SIGBUS (a failed swap
    /// read, no frame) waits `ms` milliseconds before queuing it, as a
    /// preempted handler thread would.
    pub fn inject_signal_stall(&self, ms: u32) {
        self.inner.set_signal_stall_ms(ms);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: a range write-back (msync, munmap, close) waits `ms`
    /// milliseconds between listing the dirty pages and writing them, as a
    /// preempted caller would.
    pub fn inject_writeback_stall(&self, ms: u32) {
        self.inner.set_writeback_stall_ms(ms);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the next `n` in-thread file reads installed in two
    /// halves at once fail their first half (the second goes in and must
    /// be dropped again). Returns how many split installs were done so far.
    pub fn inject_split_failures(&self, n: u32) -> u64 {
        self.inner.set_split_failures(n)
    }

    /// Debugging hook (also in the C ABI, `umm_debug_inject_swap_errors`,
    /// for programs testing their SIGBUS handling): the next `reads` swap
    /// reads and `writes` swap writes fail with `EIO`.
    pub fn inject_swap_errors(&self, reads: u32, writes: u32) {
        self.inner.inject_io_errors(reads, writes);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the host kernel reclaims the space's staging area now, as
    /// its own memory pressure would: parked volatile pages (and lazily
    /// freed ones) that are clean are discarded by the host. Returns whether
    /// host discards are on for this space (`false`: no userfaultfd
    /// write-protect or no `PAGEMAP_SCAN`, so nothing is handed to the host).
    pub fn host_reclaim(&self) -> bool {
        self.assert_owner();
        self.inner.host_reclaim_staging();
        self.inner.host_lazyfree()
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the next populate (`MADV_POPULATE_*`, `umm_populate`) that
    /// reaches the page at `addr` is interrupted there with `EINTR`, as a
    /// populate is when the space closes under it; the hook then clears.
    pub fn interrupt_populate_at(&self, addr: usize) {
        self.inner.interrupt_populate_at(addr);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the whole swap file's contents (to check what reached disk).
    pub fn swap_contents(&self) -> Result<Vec<u8>, Errno> {
        self.check_owner()?;
        self.inner.swap_contents()
    }
}
