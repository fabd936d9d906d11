//! The swap cache: a page swapped in keeps its swap slot for as long as
//! its data is unchanged, so that evicting it again writes nothing.
//!
//! Linux keeps a swapped-in page in its swap cache the same way (until swap
//! is half full), and knows from the PTE's dirty bit whether it was written.
//! usermm cannot read dirty bits; it makes the first write visible instead:
//! a read fault's swap-in installs the pages write-protected
//! (`UFFDIO_COPY_MODE_WP`, the reservation being registered in WP mode as
//! well), and the page's `cache` names its slot. Reads cost nothing more. The
//! first write is a WP fault ([`Core::wp_fault`]): the core drops the copy
//! (frees the slot) *before* the executor lifts the protection, so the
//! write cannot land while the core still believes the page clean. An
//! eviction of a page with a copy (`Evict::clean`) writes nothing: the
//! staging frame is dropped and the page is `Swapped` at its old slot.
//!
//! The copy is dropped wherever the data may change or the protection is
//! lost: the WP fault, `MADV_FREE`, a volatile mark, a zap, any way the
//! page leaves memory other than an eviction. A parked page with a copy is
//! mapped back by a write-protected copy (`Reactivate { wp }`), not a move:
//! `UFFDIO_MOVE` does not carry the protection bit, and re-protecting after
//! the move would leave a window where another thread's write goes unseen.
//! A swap-in for a write fault keeps nothing (the write follows at once),
//! and neither does one while swap is short of free slots (as Linux's
//! `vm_swap_full`): a kept slot is one a dirty page cannot use.
//!
//! A locked page keeps no copy (a copy only serves an eviction, which a
//! locked page never gets): a swap-in into a locked region keeps nothing,
//! and a page with a copy that becomes locked — locked in place, mapped
//! back by the lock call, or swapped in by a plan made before the lock —
//! drops it when it is flagged `LOCKED`, and its slot is overwritten in the
//! store (`swap_scrub_plan`): a locked secret does not stay in swap.
//!
//! Measured on the `reclaim` experiment's read-verify workloads (uniform,
//! hot/cold, zipfian, scan): every eviction of a page only read since its
//! swap-in wrote it again before, and those writes queued ahead of the
//! next swap-in's read on this machine's one virtio queue (a 4 KiB
//! `O_DIRECT` read: 33 µs alone, 47 µs beside 4 KiB writes, 150 µs
//! beside 128 KiB writes). See docs/design.md, "Swap cache".

use super::{Core, FaultPlan};
use crate::page::PState;
use crate::region::{Kind, LockMode};
use crate::types::{Addr, PageIdx};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Plans a WP fault at `a`: a write to a page installed
    /// write-protected. The page's swap copy is dropped now (before the
    /// write can land) and the page is claimed until the executor has
    /// lifted the protection (`FaultPlan::Unprotect`). A page in flight is
    /// `Busy`; one no longer mapped (parked, evicted, unmapped meanwhile)
    /// is woken, and its retry faults as a missing page.
    pub fn wp_fault(&mut self, a: Addr) -> FaultPlan {
        let Some(p) = self.page_of(a) else {
            return FaultPlan::Wake;
        };
        let m = self.pages.get(p);
        if self.in_flight(p, &m) {
            return FaultPlan::Busy;
        }
        if m.state != PState::Resident {
            return FaultPlan::Wake;
        }
        let Some(r) = self.regions.find_mut(p) else {
            return FaultPlan::Wake;
        };
        if m.cache != 0 {
            r.note_copy(true);
        }
        self.uncache(p);
        self.pages.update(p, |m| m.state = PState::Filling);
        FaultPlan::Unprotect { page: p }
    }

    /// Where an eviction of page `p` writes: its swap copy's slot, with
    /// nothing to write (`true`), or a new slot; `None` when swap is full.
    pub(super) fn evict_target(&mut self, p: PageIdx) -> Option<(u32, bool)> {
        match self.pages.get(p).cache {
            0 => self.swap.alloc().map(|s| (s, false)),
            c => {
                if let Some(r) = self.regions.find_mut(p) {
                    r.note_copy(false);
                }
                Some((c - 1, true))
            }
        }
    }
}

/// Configuration (see "Methods by kind" in `core.rs`).
impl Core {
    /// The executor maps swapped-in pages write-protected and reports the
    /// first write to each as a WP fault.
    pub fn set_tracks_writes(&mut self, on: bool) {
        self.options.set_tracks_writes(on);
    }

    /// Whether a swap-in at page `p` for a fault (`write`: a write fault)
    /// keeps its slots as swap copies and is installed write-protected.
    /// A locked page keeps none: it is never evicted, so the copy would
    /// only keep its data in swap (Linux frees the swap slot of a page it
    /// swaps into a locked region, `do_swap_page`'s `should_try_to_free_swap`).
    /// Nor does a region whose copies are mostly written before they are
    /// evicted (`CopyFeedback::pays`), but for one swap-in in
    /// `PROBE_EVERY`, which keeps the verdict current.
    pub(super) fn keeps_swap_copy(&mut self, p: PageIdx, write: bool) -> bool {
        if write || !self.may_keep_swap_copy(p) {
            return false;
        }
        self.regions.find_mut(p).is_some_and(|r| r.keep_copy())
    }

    /// Whether a swap-in at page `p` may keep its swap copies at all (the
    /// region's feedback aside).
    pub(super) fn may_keep_swap_copy(&self, p: PageIdx) -> bool {
        if !self.options.tracks_writes() || self.swap.short() {
            return false;
        }
        let Some(r) = self.regions.find(p) else { return false };
        !(r.kind() == Kind::FileShared || r.in_thread() || r.lock() != LockMode::None)
    }

    /// Drops page `p`'s swap copy, if it has one: its data may change, or
    /// the page leaves memory another way than by eviction.
    pub(super) fn uncache(&mut self, p: PageIdx) {
        let m = self.pages.get(p);
        if m.cache != 0 {
            self.swap.free_slot(m.cache - 1);
            self.pages.update(p, |m| m.cache = 0);
        }
    }

    /// Drops page `p`'s swap copy because the page is locked: the slot is
    /// freed and its stored copy overwritten (`swap_scrub_plan`), so that
    /// a locked page's data does not stay in the store.
    pub(super) fn uncache_locked(&mut self, p: PageIdx) {
        let m = self.pages.get(p);
        if m.cache != 0 {
            self.swap.free_and_scrub(m.cache - 1);
            self.pages.update(p, |m| m.cache = 0);
        }
    }
}
