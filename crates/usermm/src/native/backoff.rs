//! The page store's write back-off (`native/reclaim.rs`, "A store that
//! refuses writes"): after a failed store write no write is tried for a
//! pause that starts at `tuning::STORE_BACKOFF_FIRST_NS` and doubles with
//! each failure in a row up to `tuning::STORE_BACKOFF_MAX_NS`; the first
//! write that goes through ends it.
//!
//! Invariant: `pause_ns` is 0 (the store takes writes) or between the
//! first pause and the longest, and `retry_at_ns` is when the last failure
//! plus `pause_ns` ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use usermm_sys::now_ns;

use super::tuning::{STORE_BACKOFF_FIRST_NS, STORE_BACKOFF_MAX_NS};

pub(crate) struct StoreBackoff {
    /// The first pause after a failed write (ns; 0 in the simulation,
    /// whose runs must not depend on the clock: no pause).
    first_ns: AtomicU64,
    /// The pause now (ns; 0: the store takes writes).
    pause_ns: AtomicU64,
    /// When writes are tried again (`now_ns`).
    retry_at_ns: AtomicU64,
    /// Store writes (one call, a run of up to 256 pages) that failed.
    write_fails: AtomicU64,
}

impl StoreBackoff {
    pub(super) fn new() -> StoreBackoff {
        StoreBackoff {
            first_ns: AtomicU64::new(STORE_BACKOFF_FIRST_NS),
            pause_ns: AtomicU64::new(0),
            retry_at_ns: AtomicU64::new(0),
            write_fails: AtomicU64::new(0),
        }
    }

    /// The first pause of the back-off (0: none).
    #[cfg(feature = "test-hooks")]
    pub(super) fn set_first_ns(&self, ns: u64) {
        self.first_ns.store(ns, Ordering::Relaxed);
    }

    /// A store write went through: the back-off ends.
    pub(super) fn write_ok(&self) {
        self.pause_ns.store(0, Ordering::Relaxed);
    }

    /// A store write failed (counted; the back-off follows the step's
    /// writes as a whole: [`StoreBackoff::write_failed`]).
    pub(super) fn count_failure(&self) {
        self.write_fails.fetch_add(1, Ordering::Relaxed);
    }

    /// A step's store writes all failed: the back-off starts, or its pause
    /// doubles.
    pub(super) fn write_failed(&self) {
        let first = self.first_ns.load(Ordering::Relaxed);
        let was = self.pause_ns.load(Ordering::Relaxed);
        let pause = if was == 0 { first } else { (was * 2).min(STORE_BACKOFF_MAX_NS) };
        self.retry_at_ns.store(now_ns() + pause, Ordering::Relaxed);
        self.pause_ns.store(pause, Ordering::Relaxed);
    }

    /// Whether the store is backed off from (its last write failed, and no
    /// later one went through), whether or not the pause is over.
    pub(super) fn engaged(&self) -> bool {
        self.pause_ns.load(Ordering::Relaxed) > 0
    }

    /// Whether no store write is to be tried now (a pause is running).
    pub(super) fn backing_off(&self) -> bool {
        self.engaged() && now_ns() < self.retry_at_ns.load(Ordering::Relaxed)
    }

    /// When the store is tried again (`now_ns`).
    pub(super) fn retry_at_ns(&self) -> u64 {
        self.retry_at_ns.load(Ordering::Relaxed)
    }

    /// How long from now until the store is tried again, while a pause
    /// runs.
    pub(super) fn retry_in(&self) -> Option<Duration> {
        if !self.backing_off() {
            return None;
        }
        Some(Duration::from_nanos(self.retry_at_ns().saturating_sub(now_ns())))
    }

    /// The pause now, in ms (0: the store takes writes).
    pub(super) fn pause_ms(&self) -> u64 {
        self.pause_ns.load(Ordering::Relaxed) / 1_000_000
    }

    /// Store writes that failed so far.
    pub(super) fn write_fails(&self) -> u64 {
        self.write_fails.load(Ordering::Relaxed)
    }
}
