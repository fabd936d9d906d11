//! What starts the background reclaimer and what it is asked to do: the
//! free-frame watermarks it keeps above, the condition it waits on and the
//! poke a fill gives it, the read-ins queued for it (`MADV_WILLNEED`, file
//! read-ahead windows), and how long a fault short of frames waits for
//! reclaim elsewhere.
//!
//! Invariants: `1 <= low <= high <= budget`; `poked` is set and cleared
//! under the core lock (a fill sets it, the thread clears it before it
//! waits), so a fill after the clear pokes again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use usermm_core::Core;

use super::lock;
use super::tuning::OOM_WAIT_US;

/// Pages reclaimed per background round.
pub(super) const RECLAIM_BATCH: u64 = 256;

pub(crate) struct Reclaimer {
    /// Below this many free frames a fill pokes the thread.
    low_watermark: u64,
    /// Reclaim ahead goes on up to this many free frames.
    high_watermark: u64,
    /// Signalled when free frames fall below the low watermark, a read-in
    /// is queued, or the space closes (waited on with the core lock).
    wanted: Condvar,
    /// Whether a fill has poked the thread since it last went to wait: a
    /// fill pokes it once, not on every fault while it works (a futex call
    /// each, and a wake-up of its vCPU: a sparse run of faults, each
    /// needing a fresh page-table leaf, kept the spares low and paid one
    /// per fault).
    poked: AtomicBool,
    /// How long a fault or populate that found no frame waits for reclaim
    /// elsewhere before it tries again (µs; 0: not at all).
    oom_wait_us: AtomicU64,
    /// Page addresses to read in (`MADV_WILLNEED`, read-ahead windows).
    willneed: Mutex<Vec<usize>>,
    /// The simulation's background step: the calm mark it saw last
    /// (`u64::MAX`: none yet).
    #[cfg(feature = "test-hooks")]
    calm_seen: AtomicU64,
}

impl Reclaimer {
    /// Its lock, held across a fork (a leaf: `native/fork.rs`).
    pub(super) fn fork_guard(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        lock(&self.willneed)
    }

    /// For a budget of `budget_pages` frames.
    pub(super) fn new(budget_pages: u64) -> Reclaimer {
        let low = (budget_pages / 32).clamp(1, 4096);
        let high = (low * 2).min(budget_pages);
        debug_assert!(1 <= low && low <= high && high <= budget_pages.max(1));
        Reclaimer {
            low_watermark: low,
            high_watermark: high,
            wanted: Condvar::new(),
            poked: AtomicBool::new(false),
            oom_wait_us: AtomicU64::new(OOM_WAIT_US),
            willneed: Mutex::new(Vec::new()),
            #[cfg(feature = "test-hooks")]
            calm_seen: AtomicU64::new(u64::MAX),
        }
    }

    /// The frames the core wants reclaimed ahead of the program, to bring
    /// free frames up to the high watermark once under the low one.
    pub(super) fn ahead_want(&self, c: &mut Core) -> u64 {
        c.reclaim_ahead_want(self.low_watermark, self.high_watermark)
    }

    /// Ends pressure if it stayed calm since the core's calm mark was
    /// `mark` (see `Core::ease_if_calm`), with this reclaimer's low
    /// watermark.
    pub(super) fn ease_if_calm(&self, c: &mut Core, mark: u64) -> bool {
        c.ease_if_calm(mark, self.low_watermark)
    }

    /// The simulation's background step: the calm mark it saw at the step
    /// before (None at the first), and `mark` remembered for the next.
    #[cfg(feature = "test-hooks")]
    pub(super) fn last_calm_mark(&self, mark: u64) -> Option<u64> {
        let last = self.calm_seen.swap(mark, Ordering::Relaxed);
        (last != u64::MAX).then_some(last)
    }

    /// After a fill (the core lock `c` held): pokes the thread, once until
    /// it next waits, when free frames or spare metadata run low, or when a
    /// run of parked-page touches shows that pressure is over
    /// (`Core::calm_by_touches`).
    pub(super) fn after_fill(&self, c: &Core) {
        let wanted = c.free_frames() < self.low_watermark || c.spares_low() || c.calm_by_touches();
        if wanted && !self.poked.swap(true, Ordering::Relaxed) {
            self.wanted.notify_one();
        }
    }

    /// Wakes the thread (the core lock held, so that it cannot miss it
    /// between its look and its wait).
    pub(super) fn notify(&self) {
        self.wanted.notify_all();
    }

    /// The thread's wait, up to `d`, with the core lock `c` let go
    /// meanwhile; `rests`: it goes idle (a fill after this pokes again).
    pub(super) fn wait<'a>(&self, c: MutexGuard<'a, Core>, d: Duration, rests: bool) -> MutexGuard<'a, Core> {
        if rests {
            self.poked.store(false, Ordering::Relaxed);
        }
        self.wanted.wait_timeout(c, d).unwrap_or_else(|e| e.into_inner()).0
    }

    /// Queues page addresses to read in (the caller then notifies, under
    /// the core lock).
    pub(super) fn queue(&self, addrs: impl IntoIterator<Item = usize>) {
        lock(&self.willneed).extend(addrs);
    }

    /// Whether read-ins are queued.
    pub(super) fn queued(&self) -> bool {
        !lock(&self.willneed).is_empty()
    }

    /// Takes the queued read-ins.
    pub(super) fn take_queued(&self) -> Vec<usize> {
        std::mem::take(&mut *lock(&self.willneed))
    }

    /// How long a fault short of frames waits for reclaim elsewhere
    /// (`None`: it does not wait).
    pub(super) fn oom_wait(&self) -> Option<Duration> {
        match self.oom_wait_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn set_oom_wait_us(&self, us: u64) {
        self.oom_wait_us.store(us, Ordering::Relaxed);
    }
}
