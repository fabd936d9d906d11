//! Lock accounting: the pages charged to the lock limit (VmLck) and
//! `mlockall(MCL_FUTURE)`'s lock for new mappings.
//!
//! Invariant (`validate`): `charged` is the page count of all locked
//! regions. Every change of a region's lock mode goes through `relock`
//! (or `charge`/`uncharge` when a region comes or goes), so that the charge
//! follows the regions exactly; the limit itself is checked by the calls
//! that lock (`mlock.rs`, `vma.rs`), in Linux's order.

use crate::consts::*;
use crate::region::{LockMode, RegionTree};

#[derive(Default)]
pub(super) struct Locks {
    /// Pages charged to the lock limit.
    charged: u64,
    /// `mlockall(MCL_FUTURE)` flags in force.
    future: Option<LockMode>,
}

impl Locks {
    /// Pages charged to the lock limit (VmLck).
    pub(super) fn charged(&self) -> u64 {
        self.charged
    }

    /// A locked region of `pages` pages comes in.
    pub(super) fn charge(&mut self, pages: u64) {
        self.charged += pages;
    }

    /// A locked region of `pages` pages goes.
    pub(super) fn uncharge(&mut self, pages: u64) {
        self.charged -= pages;
    }

    /// `pages` pages of a region change lock mode from `old` to `new`.
    pub(super) fn relock(&mut self, old: LockMode, new: LockMode, pages: u64) {
        match (old == LockMode::None, new == LockMode::None) {
            (true, false) => self.charge(pages),
            (false, true) => self.uncharge(pages),
            _ => {}
        }
    }

    /// Sets the lock new mappings get (`mlockall(MCL_FUTURE)`), or clears
    /// it (`None`).
    pub(super) fn set_future(&mut self, mode: Option<LockMode>) {
        self.future = mode;
    }

    /// The lock a new mapping gets: its flags', or `mlockall`'s future one.
    pub(super) fn mmap_mode(&self, flags: i32) -> LockMode {
        if flags & UMM_MAP_LOCKONFAULT != 0 {
            LockMode::OnFault
        } else if flags & MAP_LOCKED != 0 {
            // Under mlockall(MCL_FUTURE | MCL_ONFAULT), MAP_LOCKED adds
            // VM_LOCKED to the default VM_LOCKED | VM_LOCKONFAULT: still
            // lock-on-fault (Linux).
            if self.future == Some(LockMode::OnFault) {
                LockMode::OnFault
            } else {
                LockMode::Locked
            }
        } else {
            self.future.unwrap_or(LockMode::None)
        }
    }

    /// The charge against the locked regions.
    pub(super) fn validate(&self, regions: &RegionTree) {
        let locked: u64 = regions.iter().filter(|r| r.lock() != LockMode::None).map(|r| r.range().pages()).sum();
        assert_eq!(locked, self.charged, "lock charge");
    }
}
