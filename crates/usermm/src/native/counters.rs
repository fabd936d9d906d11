//! What the executor counts of the host for `Space::stats` and for its own
//! decisions: the longest exclusive region-lock hold, the host's refusals
//! and unreported moves, the fills since the host's LRU batches were last
//! drained, and which advice left marks on the host's mappings.
//!
//! Every count only grows (the drained mark follows the fill count), so a
//! relaxed load is always a value the count had.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use usermm_core::consts::{MADV_DONTDUMP, MADV_GUARD_INSTALL};

#[derive(Default)]
pub(crate) struct HostCounters {
    /// The longest hold of the region lock exclusively (ns).
    write_hold_ns_max: AtomicU64,
    /// Zaps the host refused at first (see `Arena::zap`).
    host_refusals: AtomicU64,
    /// Pages a host move moved without saying so (see `deactivate_all`).
    host_unreported_moves: AtomicU64,
    /// Fills committed so far, and that count at the last drain of the
    /// host's LRU batches before a `MADV_FREE` (see `AdviceOp::Free`).
    fills: AtomicU64,
    fills_drained: AtomicU64,
    /// Whether guard pages (`MADV_GUARD_INSTALL`) or `MADV_DONTDUMP` were
    /// ever passed down: unmapped ranges then have them removed, so that a
    /// new region there starts clean.
    guards_used: AtomicBool,
    dontdump_used: AtomicBool,
}

impl HostCounters {
    /// An exclusive hold of the region lock of `ns` ended.
    pub(super) fn note_hold(&self, ns: u64) {
        self.write_hold_ns_max.fetch_max(ns, Ordering::Relaxed);
    }

    pub(super) fn write_hold_ns_max(&self) -> u64 {
        self.write_hold_ns_max.load(Ordering::Relaxed)
    }

    /// The host refused a zap at first.
    pub(super) fn host_refused(&self) {
        self.host_refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn host_refusals(&self) -> u64 {
        self.host_refusals.load(Ordering::Relaxed)
    }

    /// A host move moved a page without saying so.
    pub(super) fn unreported_move(&self) {
        self.host_unreported_moves.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn host_unreported_moves(&self) -> u64 {
        self.host_unreported_moves.load(Ordering::Relaxed)
    }

    /// A fill was committed.
    pub(super) fn filled(&self) {
        self.fills.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether pages were installed since the last drain of the host's LRU
    /// batches; the caller drains them now (this marks them drained).
    pub(super) fn drain_due(&self) -> bool {
        let fills = self.fills.load(Ordering::Relaxed);
        self.fills_drained.swap(fills, Ordering::Relaxed) != fills
    }

    /// `advice` was passed down to the host.
    pub(super) fn advised(&self, advice: i32) {
        match advice {
            MADV_GUARD_INSTALL => self.guards_used.store(true, Ordering::Relaxed),
            MADV_DONTDUMP => self.dontdump_used.store(true, Ordering::Relaxed),
            _ => {}
        }
    }

    /// Whether guard pages, and `MADV_DONTDUMP`, were ever passed down.
    pub(super) fn marks_used(&self) -> (bool, bool) {
        (self.guards_used.load(Ordering::Relaxed), self.dontdump_used.load(Ordering::Relaxed))
    }
}
