//! A fork: what the executor asks of the core to give a forked child a copy
//! of the space (docs/design.md, "fork").
//!
//! The child inherits the core as it was at the fork (the executor holds
//! every lock across it, so no page is in flight) and the host's mappings:
//! resident pages shared copy-on-write with the parent, parked pages in
//! the staging area likewise, swapped pages in the parent's swap file,
//! which the child reads in place: the parent keeps the slots in use at
//! the fork as they are until the child is gone ([`Core::swap_hold`]). Two
//! things the host does not carry over are the core's business: the
//! write protection of a swapped-in clean page (dropped in the child, so a
//! write there would go unseen while the core believes the page clean:
//! [`Core::forget_copies_after_fork`]), and locks (not inherited, as on
//! Linux: the executor unlocks everything through `munlockall`).

use super::{Core, ZapClaim};
use crate::page::{pf, PState};
use crate::region::Kind;
use crate::types::{PageIdx, PageRange};

/// Where a page of a shared anonymous region handed to the host has its
/// bytes ([`Core::hand_over_sources`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandSrc {
    /// Mapped at its address.
    Mapped,
    /// Parked in this staging slot.
    Parked(u32),
    /// In this swap slot.
    Swapped(u32),
}

/// Queries and the child's one change (see "Methods by kind" in `core.rs`).
impl Core {
    /// Why the space cannot be copied into a forked child, or `None`: a
    /// `MAP_SHARED` region (anonymous, or of a file) not handed to the host
    /// (`hand_to_host`) would not stay shared with the parent.
    pub fn fork_blocker(&self) -> Option<&'static str> {
        for r in self.regions.iter() {
            match r.kind() {
                // (One not handed to the host: `Core::hand_to_host`.)
                Kind::AnonShared if !r.host() => return Some("a MAP_SHARED anonymous region"),
                Kind::FileShared if !r.host() => return Some("a MAP_SHARED file region"),
                _ => {}
            }
        }
        None
    }

    /// The shared regions (anonymous, or of a file) whose pages are still
    /// usermm's: a fork hands each to the host first
    /// ([`Core::hand_to_host`]), so that parent and child share it.
    pub fn shared_to_hand_over(&self) -> Vec<PageRange> {
        self.regions
            .iter()
            .filter(|r| matches!(r.kind(), Kind::AnonShared | Kind::FileShared) && !r.host())
            .map(|r| r.range())
            .collect()
    }

    /// Where the bytes of each page of region part `r` are that the host
    /// must be given: of shared anonymous memory every page with any (the
    /// others read as zeros), of a shared file the pages that may differ
    /// from it (`MAYBE_DIRTY`); `None` when a page is busy.
    pub fn hand_over_sources(&self, r: PageRange) -> Option<Vec<(PageIdx, HandSrc)>> {
        let file = self.regions.find(r.start).is_some_and(|g| g.kind() == Kind::FileShared);
        let mut v = Vec::new();
        let mut busy = false;
        self.pages.for_each_live(r, |p, m| match m.state {
            PState::Resident | PState::Inactive if file && !m.has(pf::MAYBE_DIRTY) => {}
            PState::Resident => v.push((p, HandSrc::Mapped)),
            PState::Inactive => v.push((p, HandSrc::Parked(m.slot))),
            PState::Swapped => v.push((p, HandSrc::Swapped(m.slot))),
            PState::Absent => {}
            _ => busy = true,
        });
        (!busy).then_some(v)
    }

    /// The regions in `r`, whose pages the executor has copied out to host
    /// memory it mapped there and then dropped (`zap_begin`, `zap_end`),
    /// become the host's: no fault reaches usermm there, and the calls on
    /// them pass the host's pages their work (`Region::host`).
    pub fn hand_to_host(&mut self, r: PageRange) {
        debug_assert!(self.pages.live_in(r).iter().all(|(_, m)| m.state == PState::Absent));
        self.regions.split_at(r.start);
        self.regions.split_at(r.end);
        let starts: Vec<PageIdx> = self.regions.overlapping(r).iter().map(|g| g.range().start).collect();
        for s in starts {
            if let Some(g) = self.regions.find_mut(s) {
                g.set_host();
            }
        }
        self.regions.merge_around(r);
    }

    /// Page `p`, being parked, would not move: a fork left it shared with
    /// the other process, and the executor write-faults it before moving it
    /// again (`native/reclaim.rs`). Its swap copy is dropped first: the
    /// write protection that kept the copy exact is lifted for the fault.
    pub fn unshare_for_move(&mut self, p: PageIdx) {
        if self.pages.get(p).state == PState::Deactivating {
            self.uncache(p);
        }
    }

    /// The runs `(first slot, slots)` of swap slots in use: what a child's
    /// own swap file must hold of its parent's.
    pub fn swap_used_runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for s in 0..self.swap.capacity() {
            if !self.swap.is_used(s) {
                continue;
            }
            match runs.last_mut() {
                Some((first, n)) if *first + *n == s => *n += 1,
                _ => runs.push((s, 1)),
            }
        }
        runs
    }

    /// Before a fork (every lock held): the swap slots in use now stay as
    /// they are — freed, they are not reused or scrubbed — until
    /// [`Core::swap_hold_end`] with `id`: the child reads them in place,
    /// in this process's swap file, for as long as it may.
    pub fn swap_hold(&mut self, id: u64) {
        self.swap.hold(id);
    }

    /// The child of hold `id` (and every process it forked) has exited or
    /// exec'd: the slots freed meanwhile are free.
    pub fn swap_hold_end(&mut self, id: u64) {
        self.swap.hold_end(id);
    }

    /// Whether a forked child holds swap slots.
    pub fn swap_holds_any(&self) -> bool {
        self.swap.holds_any()
    }

    /// In a forked child: the parent's holds (for its other children) are
    /// dropped, and the slots they kept are free here.
    pub fn swap_holds_forget_after_fork(&mut self) {
        self.swap.holds_forget();
    }

    /// In a forked child: the zaps the parent's threads had under way (a
    /// `munmap` or `MADV_DONTNEED` between two of its slices at the fork:
    /// the region lock is let go between them), claimed for the child to
    /// finish, and the ranges `munmap` had detached (held): the threads that
    /// would have finished them did not come along, and their pages would
    /// stay charged, their ranges held, for good. The executor drops each
    /// claim's pages and calls [`Core::zap_end`]; then, for each held range,
    /// [`Core::zap_begin`], the drop, `zap_end` and
    /// [`Core::unhold_after_fork`].
    pub fn zaps_after_fork(&self) -> (Vec<ZapClaim>, Vec<PageRange>) {
        let mut claims = Vec::new();
        for &r in self.zaps.zapping() {
            let mut claim = ZapClaim { range: r, staging: Vec::new(), mapped: true };
            self.pages.for_each_live(r, |_, m| {
                if m.state == PState::Zapping && m.from == PState::Inactive {
                    claim.staging.push(m.slot);
                }
            });
            claims.push(claim);
        }
        (claims, self.zaps.held().to_vec())
    }

    /// In a forked child: held range `r` (see [`Core::zaps_after_fork`]) is
    /// free again.
    pub fn unhold_after_fork(&mut self, r: PageRange) {
        self.zaps.unhold(r);
    }

    /// Pages some thread is working on (filled, parked, evicted, zapped):
    /// none may be in a forked child once its zaps are finished, or the
    /// space cannot be its.
    pub fn busy_pages(&self) -> u64 {
        self.pages.busy()
    }

    /// The ranges a forked child gets no copy of (`MADV_DONTFORK`) and those
    /// whose copy reads zeros (`MADV_WIPEONFORK`).
    pub fn fork_advised(&self) -> (Vec<PageRange>, Vec<PageRange>) {
        let dont = self.regions.iter().filter(|r| r.dontfork()).map(|r| r.range()).collect();
        let wipe = self.regions.iter().filter(|r| !r.dontfork() && r.wipeonfork()).map(|r| r.range()).collect();
        (dont, wipe)
    }

    /// In a forked child: every resident page's swap copy is dropped (the
    /// fork dropped the page's write protection, so its first write would
    /// go unseen); returns how many.
    pub fn forget_copies_after_fork(&mut self) -> u64 {
        let mut cached = Vec::new();
        for r in self.regions.iter() {
            self.pages.for_each_live(r.range(), |p, m| {
                if m.state == PState::Resident && m.cache != 0 {
                    cached.push(p);
                }
            });
        }
        for &p in &cached {
            self.uncache(p);
        }
        cached.len() as u64
    }
}
