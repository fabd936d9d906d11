//! Locks (seed 000): `mlock2`, `munlock`, `mlockall`, `munlockall`.
//!
//! As Linux's `mm/mlock.c` does, a lock call normalises the range and checks
//! the limit, then changes region flags only (split, set, merge) and
//! reports what changed in a `LockPlan`; populating the newly locked pages
//! is the executor's next phase, outside the exclusive lock, and
//! `lock_revert` undoes the flags if that phase cannot finish.
//! Invariants kept: the lock charge (`Locks`, `locks.rs`) is the page count
//! of all locked regions, and the census's `locked` the count of pages
//! flagged `LOCKED`.

use super::range::Piece;
use super::{bad, Core, LockPlan};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::{pf, PState};
use crate::region::{LockMode, Region};
use crate::types::{Addr, PageIdx, PageRange};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Decides `mlock2` (`mode` Locked or OnFault) and `munlock` (`mode`
    /// None). `addr` need not be aligned: the range is widened to whole pages
    /// (Linux). Returns the plan; on error after a partial apply (a hole),
    /// `plan.result` is the error and `plan.changed` what was applied.
    pub fn lock_range(&mut self, addr: u64, len: u64, mode: LockMode) -> LockPlan {
        let mut plan = LockPlan::default();
        if mode != LockMode::None && !self.cfg.mlock_allowed {
            plan.result = bad(Errno::EPERM);
            return plan;
        }
        // Linux (do_mlock, apply_vma_lock_flags): the length is widened to
        // whole pages with wrap-around; an empty result is a no-op (0), and
        // `start + len` overflowing is EINVAL — after the limit check.
        let ps = self.page_size();
        let start = addr & !(ps - 1);
        let bytes = self.page_align_wrapping(len.wrapping_add(addr & (ps - 1)));
        let pages = bytes >> self.cfg.page_shift;
        if mode != LockMode::None && self.cfg.memlock_pages != u64::MAX {
            let r = self.clip(start, pages);
            let already: u64 = self
                .regions
                .overlapping(r)
                .iter()
                .filter(|g| g.lock() != LockMode::None)
                .map(|g| g.range().intersect(&r).pages())
                .sum();
            if self.locks.charged() + pages - already.min(pages) > self.cfg.memlock_pages {
                plan.result = bad(Errno::ENOMEM);
                return plan;
            }
        }
        let Some(end) = start.checked_add(bytes) else {
            plan.result = bad(Errno::EINVAL);
            return plan;
        };
        if end == start {
            return plan;
        }
        if !self.in_reservation(start, pages) && self.page_of(Addr(start)).is_none() {
            plan.result = bad(Errno::ENOMEM);
            return plan;
        }
        let r = self.clip(start, pages);
        if mode != LockMode::None && self.any_volatile(r) {
            plan.result = bad(Errno::EINVAL);
            return plan;
        }
        let w = self.walk(start, pages);
        // Linux stops at the first hole (or at a split it cannot make).
        let mut hole = w.outside || w.hole_after;
        for Piece { reg, seg, hole_before } in w.pieces {
            if hole_before {
                hole = true;
                break;
            }
            if mode == LockMode::Locked {
                plan.populate.push(seg);
            }
            if reg.lock() == mode {
                continue;
            }
            let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
            if self.regions.len() + cost > self.cfg.max_regions {
                hole = true;
                break;
            }
            self.set_lock(seg, mode, &mut plan);
            plan.changed.push((seg, reg.lock()));
        }
        self.regions.merge_around(r);
        if hole {
            plan.result = bad(Errno::ENOMEM);
        }
        plan
    }

    /// Sets the lock mode of `seg` (inside one region) and its pages.
    fn set_lock(&mut self, seg: PageRange, mode: LockMode, plan: &mut LockPlan) {
        self.regions.split_at(seg.start);
        self.regions.split_at(seg.end);
        let reg = self.regions.find_mut(seg.start).expect("split");
        let old = reg.set_lock(mode);
        self.locks.relock(old, mode, seg.pages());
        for (p, m) in self.pages.live_in(seg) {
            if mode == LockMode::None {
                if m.has(pf::LOCKED) {
                    self.pages.update(p, |m| m.flags &= !pf::LOCKED);
                }
                // Every resident page goes back on the LRU, flagged or not
                // (a lock-on-fault read maps the zero page unflagged, and
                // reclaim drops locked regions' entries): otherwise it
                // would stay resident, never reclaimed, after the unlock.
                // (A new entry makes any old one stale.)
                if m.state == PState::Resident {
                    self.push_active(p);
                }
            } else if m.state == PState::Resident && !m.has(pf::LOCKED) {
                self.pages.update(p, |m| m.flags |= pf::LOCKED);
                // A page swapped in and only read since: its swap copy
                // goes (`swapcache.rs`).
                self.uncache_locked(p);
            } else if m.state == PState::Inactive {
                // Parked pages are resident: they must come back and be
                // locked now (the executor maps them back).
                plan.reactivate.push(p);
            }
        }
    }

    /// Decides `mlockall`: returns the plan for `MCL_CURRENT`'s changes.
    pub fn mlockall(&mut self, flags: i32) -> LockPlan {
        let mut plan = LockPlan { populate_best_effort: true, ..LockPlan::default() };
        if flags == 0 || flags & !(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0 || flags == MCL_ONFAULT {
            plan.result = bad(Errno::EINVAL);
            return plan;
        }
        if !self.cfg.mlock_allowed {
            plan.result = bad(Errno::EPERM);
            return plan;
        }
        let mode = if flags & MCL_ONFAULT != 0 { LockMode::OnFault } else { LockMode::Locked };
        if flags & MCL_CURRENT != 0 {
            let total: u64 = self.regions.iter().map(|r| r.range().pages()).sum();
            if self.cfg.memlock_pages != u64::MAX && total > self.cfg.memlock_pages {
                plan.result = bad(Errno::ENOMEM);
                return plan;
            }
        }
        self.locks.set_future((flags & MCL_FUTURE != 0).then_some(mode));
        if flags & MCL_CURRENT != 0 {
            let regs: Vec<Region> = self.regions.iter().cloned().collect();
            for reg in regs {
                if reg.lock() != mode {
                    self.set_lock(reg.range(), mode, &mut plan);
                    plan.changed.push((reg.range(), reg.lock()));
                }
            }
            self.regions.merge_around(PageRange::new(0, self.cfg.reserve_pages));
        }
        plan
    }

    /// Decides `munlockall`: every region unlocked, the future flag cleared.
    pub fn munlockall(&mut self) -> LockPlan {
        let mut plan = LockPlan::default();
        self.locks.set_future(None);
        let regs: Vec<Region> = self.regions.iter().cloned().collect();
        for reg in regs {
            if reg.lock() != LockMode::None {
                self.set_lock(reg.range(), LockMode::None, &mut plan);
                plan.changed.push((reg.range(), reg.lock()));
            }
        }
        self.regions.merge_around(PageRange::new(0, self.cfg.reserve_pages));
        plan
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Undoes a lock plan's changes (the host refused, or the budget could
    /// not hold a full lock).
    pub fn lock_revert(&mut self, plan: &LockPlan) {
        let mut scratch = LockPlan::default();
        for &(seg, old) in plan.changed.iter().rev() {
            let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
            if self.regions.len() + cost > self.cfg.max_regions + 2 {
                continue;
            }
            self.set_lock(seg, old, &mut scratch);
            self.regions.merge_around(seg);
        }
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Pages a full lock of `segs` would need resident at once, and whether
    /// the budget can hold them (the locked pages elsewhere stay).
    pub fn lock_fits(&self, segs: &[PageRange]) -> bool {
        let mut need = 0;
        for s in segs {
            let mut resident_locked = 0;
            self.pages.for_each_live(*s, |_, m| {
                if m.has(pf::LOCKED) {
                    resident_locked += 1;
                }
            });
            need += s.pages() - resident_locked;
        }
        self.pages.census().locked + need <= self.cfg.budget_pages
    }

    /// The region containing `p` (for the executor's lock population).
    pub fn region_at(&self, p: PageIdx) -> Option<&Region> {
        self.regions.find(p)
    }
}

/// The errno a lock call reports when populating its range fails: Linux's
/// `__mlock_posix_error_return` (`EFAULT`, and an unreadable range's
/// `EINVAL`, become `ENOMEM`).
pub fn lock_populate_errno(e: Errno) -> Errno {
    if e == Errno::EFAULT || e == Errno::EINVAL {
        Errno::ENOMEM
    } else {
        e
    }
}
