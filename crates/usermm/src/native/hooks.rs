//! Test hooks: bugs and stalls injected so that the tests and the
//! simulation can show what they catch. Each hook is a counter or a value a
//! test sets; the executor asks a hook at one named point (`split_fails`,
//! `stall_signal`, …) and never reads its fields. Without the `test-hooks`
//! feature the hooks hold nothing and every question has the answer of a
//! hook never set.
//!
//! (The swap and file I/O errors of `inject_swap_errors` are no hook here:
//! they are a wrapper of the platform, `native/inject.rs`.)

#[cfg(feature = "test-hooks")]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// An injected executor bug (`TestHooks::set_sim_bug`): an eviction whose
/// swap write failed is taken as done.
#[cfg(feature = "test-hooks")]
pub(crate) const SIM_BUG_LOST_SWAP_WRITE: u32 = 1;

#[derive(Default)]
pub(crate) struct TestHooks {
    /// A bug to inject, so that the simulation shows it catches one
    /// (`SIM_BUG_*`; 0: none).
    #[cfg(feature = "test-hooks")]
    sim_bug: AtomicU32,
    /// Milliseconds a handler waits between deciding a transient SIGBUS
    /// and queuing it (widens the window in which a late signal could
    /// arise).
    #[cfg(feature = "test-hooks")]
    signal_stall_ms: AtomicU32,
    /// Milliseconds a range write-back (msync, munmap, close) waits between
    /// listing the pages and writing them (widens the window in which
    /// reclaim could evict a listed page).
    #[cfg(feature = "test-hooks")]
    writeback_stall_ms: AtomicU32,
    /// The next this many `install_split`s fail their first half (the
    /// second goes in), as a failed `UFFDIO_COPY` would leave them.
    #[cfg(feature = "test-hooks")]
    split_failures: AtomicU32,
    /// `install_split`s done (both halves tried).
    #[cfg(feature = "test-hooks")]
    split_installs: AtomicU64,
    /// The page index at which a populate is interrupted (EINTR), once;
    /// `u64::MAX`: none (see `Space::interrupt_populate_at`).
    #[cfg(feature = "test-hooks")]
    populate_interrupt: AtomicU64,
}

/// Takes one from a count of injections to make; whether there was one.
pub(super) fn take_one(a: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering;
    a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1)).is_ok()
}

impl TestHooks {
    pub(super) fn new() -> TestHooks {
        let hooks = TestHooks::default();
        #[cfg(feature = "test-hooks")]
        hooks.populate_interrupt.store(u64::MAX, Ordering::Relaxed);
        hooks
    }

    /// Whether the simulation's injected bug takes a failed swap write for
    /// a successful one (the page's data is lost).
    pub(super) fn loses_swap_write(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.sim_bug.load(Ordering::Relaxed) == SIM_BUG_LOST_SWAP_WRITE;
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// A handler about to queue a transient SIGBUS waits as a preempted
    /// one would, if a test asked for it.
    pub(super) fn stall_signal(&self) {
        #[cfg(feature = "test-hooks")]
        {
            let stall = self.signal_stall_ms.load(Ordering::Relaxed);
            if stall > 0 {
                std::thread::sleep(std::time::Duration::from_millis(stall.into()));
            }
        }
    }

    /// A range write-back that listed pages waits before it writes them,
    /// if a test asked for it.
    pub(super) fn stall_writeback(&self) {
        #[cfg(feature = "test-hooks")]
        {
            let stall = self.writeback_stall_ms.load(Ordering::Relaxed);
            if stall > 0 {
                std::thread::sleep(std::time::Duration::from_millis(stall.into()));
            }
        }
    }

    /// Counts a split install, and says whether its first half is to fail.
    pub(super) fn split_fails(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            self.split_installs.fetch_add(1, Ordering::SeqCst);
            take_one(&self.split_failures)
        }
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// The page index at which a populate is to be interrupted
    /// (`u64::MAX`: none).
    pub(super) fn populate_stop(&self) -> u64 {
        #[cfg(feature = "test-hooks")]
        return self.populate_interrupt.load(Ordering::Relaxed);
        #[cfg(not(feature = "test-hooks"))]
        u64::MAX
    }

    /// A populate was interrupted: the hook (if set) is spent.
    pub(super) fn populate_interrupted(&self) {
        #[cfg(feature = "test-hooks")]
        self.populate_interrupt.store(u64::MAX, Ordering::Relaxed);
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn set_sim_bug(&self, bug: u32) {
        self.sim_bug.store(bug, Ordering::Relaxed);
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn set_signal_stall_ms(&self, ms: u32) {
        self.signal_stall_ms.store(ms, Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn set_writeback_stall_ms(&self, ms: u32) {
        self.writeback_stall_ms.store(ms, Ordering::SeqCst);
    }

    /// Sets the split failures to inject; returns the split installs done
    /// so far.
    #[cfg(feature = "test-hooks")]
    pub(super) fn set_split_failures(&self, n: u32) -> u64 {
        self.split_failures.store(n, Ordering::SeqCst);
        self.split_installs.load(Ordering::SeqCst)
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn set_populate_interrupt(&self, page: u64) {
        self.populate_interrupt.store(page, Ordering::SeqCst);
    }
}
