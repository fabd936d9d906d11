//! `madvise`: the argument checks and the per-region decision of every
//! advice, plus the page queries its ops need (`swapped_in` for
//! `MADV_WILLNEED`, `set_poison` for `MADV_HWPOISON`).
//!
//! Attribute advice (`MADV_NORMAL/RANDOM/SEQUENTIAL`) changes region flags
//! here, under the executor's exclusive lock; page advice comes back as
//! `AdviceOp`s in address order, for the executor to carry out afterwards.
//! On an error the ops planned before the failing region still apply, as on
//! Linux. `MADV_FREE`'s page work is in `volatile.rs` (`lazyfree`).

use super::range::Piece;
use super::window::MAX_WINDOW_PAGES;
use super::{bad, AdviceOp, Core};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::{pf, PState, PageMeta};
use crate::region::{Advice, Kind, LockMode, Region};
use crate::types::{PageIdx, PageRange};

/// `MADV_REMOVE`'s checks and op on a region's part `seg`. Linux
/// (madvise_remove): locked EINVAL, no backing object EINVAL, not shared
/// and writable EACCES.
fn remove_op(reg: &Region, seg: PageRange) -> Result<AdviceOp, Errno> {
    if reg.lock() != LockMode::None || reg.kind() == Kind::AnonPrivate {
        return bad(Errno::EINVAL);
    }
    if !matches!(reg.kind(), Kind::AnonShared | Kind::FileShared) || !reg.may_write() {
        return bad(Errno::EACCES);
    }
    Ok(match reg.file() {
        Some(file) => AdviceOp::PunchZap { range: seg, file, file_page: reg.file_page(seg.start) },
        // Shared anonymous memory is shmem: its pages and their data go.
        None => AdviceOp::Zap(seg),
    })
}

/// `MADV_GUARD_INSTALL`'s checks: guard pages on private memory (Linux
/// 6.13; shared regions are refused here, see docs/design.md), never
/// locked. The pages are then dropped, and the host installs its markers
/// (a touch raises SIGSEGV without reaching usermm; MADV_DONTNEED keeps
/// them; munmap removes them).
fn guard_install_checks(reg: &Region) -> Result<(), Errno> {
    if reg.lock() != LockMode::None || !matches!(reg.kind(), Kind::AnonPrivate | Kind::FilePrivate) {
        return bad(Errno::EINVAL);
    }
    Ok(())
}

/// Page advice on a region whose pages are the host's (`Region::host`):
/// Linux's checks, then the advice passed to the host's pages as it is
/// (shmem's semantics: `MADV_DONTNEED` unmaps and keeps the data,
/// `MADV_REMOVE` frees it, the others change no byte).
fn host_advice(advice: i32, reg: &Region, seg: PageRange, locked: bool, ops: &mut Vec<AdviceOp>) -> Result<(), Errno> {
    match advice {
        MADV_DONTNEED | MADV_COLD | MADV_PAGEOUT if locked => bad(Errno::EINVAL),
        MADV_FREE | MADV_WIPEONFORK | MADV_GUARD_INSTALL => bad(Errno::EINVAL),
        MADV_REMOVE => {
            remove_op(reg, seg)?;
            ops.push(AdviceOp::Host(seg, advice));
            Ok(())
        }
        MADV_DONTNEED | MADV_COLD | MADV_PAGEOUT | MADV_WILLNEED | MADV_DONTDUMP | MADV_DODUMP | MADV_GUARD_REMOVE => {
            ops.push(AdviceOp::Host(seg, advice));
            Ok(())
        }
        // (MADV_HWPOISON: the host's own check, CAP_SYS_ADMIN.)
        MADV_HWPOISON => {
            ops.push(AdviceOp::Host(seg, advice));
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Decides `madvise`. Attribute advice (NORMAL/RANDOM/SEQUENTIAL) is
    /// applied to the regions here (the executor holds the exclusive lock for
    /// it); page advice comes back as ops for the executor, in address order.
    /// On error, the ops before the failing region still apply (Linux).
    pub fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> (Vec<AdviceOp>, Result<(), Errno>) {
        match advice {
            MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL | MADV_WILLNEED | MADV_DONTNEED | MADV_COLD | MADV_PAGEOUT
            | MADV_HWPOISON | MADV_FREE => {}
            // What a fork copies: region attributes (`core/fork.rs`).
            MADV_DONTFORK | MADV_DOFORK | MADV_WIPEONFORK | MADV_KEEPONFORK => {}
            // Advice Linux knows whose effect usermm does not need: KSM,
            // THP (usermm installs 4 KiB pages). Accepted, no effect.
            MADV_MERGEABLE | MADV_UNMERGEABLE | MADV_HUGEPAGE | MADV_NOHUGEPAGE => {}
            // Passed down to the host (a secret kept in a space stays out
            // of core dumps), freeing the backing, and guard pages.
            MADV_DONTDUMP | MADV_DODUMP | MADV_REMOVE | MADV_GUARD_INSTALL | MADV_GUARD_REMOVE => {}
            _ => return (vec![], bad(Errno::EINVAL)),
        }
        let pages = match self.advice_pages(addr, len) {
            Ok(p) => p,
            Err(e) => return (vec![], Err(e)),
        };
        if pages == 0 {
            return (vec![], Ok(()));
        }
        let r = self.clip(addr, pages);
        let w = self.walk(addr, pages);
        if w.pieces.is_empty() {
            return (vec![], bad(Errno::ENOMEM));
        }
        let hole = w.has_hole();
        let mut ops = Vec::new();
        let mut result = if hole { bad(Errno::ENOMEM) } else { Ok(()) };
        for Piece { reg, seg, .. } in w.pieces {
            if let Err(e) = self.advise_piece(advice, &reg, seg, r, &mut ops) {
                result = Err(e);
                break;
            }
        }
        if is_attribute_advice(advice) {
            // (Also after an error: the regions changed before the one that
            // failed merge with their neighbours, as Linux's VMAs do as
            // each is changed.)
            self.regions.merge_around(r);
        }
        (ops, result)
    }

    /// One region's part `seg` of a `madvise` over `r`: an attribute
    /// change, or page ops appended to `ops`; `Err` stops the call there
    /// (Linux's order).
    fn advise_piece(
        &mut self,
        advice: i32,
        reg: &Region,
        seg: PageRange,
        r: PageRange,
        ops: &mut Vec<AdviceOp>,
    ) -> Result<(), Errno> {
        // Linux (madvise_vma_behavior): the seal first.
        super::mseal::madvise_sealed_check(reg, advice)?;
        let locked = reg.lock() != LockMode::None;
        if reg.host() && !is_attribute_advice(advice) {
            return host_advice(advice, reg, seg, locked, ops);
        }
        match advice {
            MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL => self.set_advice(advice, reg, seg, r)?,
            MADV_DONTFORK | MADV_DOFORK | MADV_KEEPONFORK => self.set_fork_advice(advice, reg, seg, r)?,
            MADV_WIPEONFORK if reg.kind() == Kind::AnonPrivate => self.set_fork_advice(advice, reg, seg, r)?,
            MADV_DONTNEED => {
                if locked {
                    return bad(Errno::EINVAL);
                }
                match reg.kind() {
                    Kind::AnonPrivate | Kind::FilePrivate => ops.push(AdviceOp::Zap(seg)),
                    Kind::FileShared => ops.push(AdviceOp::WritebackZap(seg)),
                    Kind::AnonShared => {}
                }
                // Shared anonymous memory keeps its data (shmem): the
                // pages are only unmapped on Linux, and stay resident.
            }
            MADV_COLD => {
                if locked {
                    return bad(Errno::EINVAL);
                }
                ops.push(AdviceOp::Cold(seg));
            }
            MADV_PAGEOUT => {
                if locked {
                    return bad(Errno::EINVAL);
                }
                ops.push(AdviceOp::Pageout(seg));
            }
            MADV_WILLNEED => ops.push(AdviceOp::WillNeed(seg)),
            MADV_HWPOISON => ops.push(AdviceOp::Poison(seg)),
            MADV_FREE => {
                // Linux: only anonymous private memory, never locked.
                if reg.kind() != Kind::AnonPrivate || locked {
                    return bad(Errno::EINVAL);
                }
                ops.push(AdviceOp::Free(seg));
            }
            MADV_WIPEONFORK if reg.kind() != Kind::AnonPrivate => return bad(Errno::EINVAL),
            MADV_DONTDUMP | MADV_DODUMP => ops.push(AdviceOp::Host(seg, advice)),
            MADV_REMOVE => ops.push(remove_op(reg, seg)?),
            MADV_GUARD_INSTALL => {
                guard_install_checks(reg)?;
                ops.push(AdviceOp::Zap(seg));
                ops.push(AdviceOp::Host(seg, advice));
            }
            MADV_GUARD_REMOVE => ops.push(AdviceOp::Host(seg, advice)),
            _ => {}
        }
        Ok(())
    }

    /// `MADV_DONTFORK/DOFORK/WIPEONFORK/KEEPONFORK` on a region's part
    /// `seg`: split off and flagged, as `set_advice`.
    fn set_fork_advice(&mut self, advice: i32, reg: &Region, seg: PageRange, r: PageRange) -> Result<(), Errno> {
        let (dontfork, on) = match advice {
            MADV_DONTFORK => (true, true),
            MADV_DOFORK => (true, false),
            MADV_WIPEONFORK => (false, true),
            _ => (false, false),
        };
        let now = if dontfork { reg.dontfork() } else { reg.wipeonfork() };
        if now != on {
            self.split_off(seg, r)?.set_fork_advice(dontfork, on);
        }
        Ok(())
    }

    /// `MADV_NORMAL/RANDOM/SEQUENTIAL` on a region's part `seg`: split
    /// off and flagged (Linux: a split beyond `vm.max_map_count` is
    /// `EAGAIN`).
    fn set_advice(&mut self, advice: i32, reg: &Region, seg: PageRange, r: PageRange) -> Result<(), Errno> {
        let want = match advice {
            MADV_RANDOM => Advice::Random,
            MADV_SEQUENTIAL => Advice::Sequential,
            _ => Advice::Normal,
        };
        if reg.advice() != want {
            self.split_off(seg, r)?.set_advice(want);
        }
        Ok(())
    }

    /// A region's part `seg` split off for an attribute change of a call
    /// over `r`: `EAGAIN` (the pieces merged back) when the splits would
    /// pass `vm.max_map_count`, as Linux.
    fn split_off(&mut self, seg: PageRange, r: PageRange) -> Result<&mut Region, Errno> {
        let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
        if self.regions.len() + cost > self.cfg.max_regions {
            self.regions.merge_around(r);
            return bad(Errno::EAGAIN);
        }
        self.regions.split_at(seg.start);
        self.regions.split_at(seg.end);
        Ok(self.regions.find_mut(seg.start).expect("split"))
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Marks every page of `r` poisoned (after the executor zapped them).
    pub fn set_poison(&mut self, r: PageRange) {
        for q in r.start.0..r.end.0 {
            self.pages.update(PageIdx(q), |m| {
                debug_assert_eq!(m.state, PState::Absent);
                m.flags |= pf::POISONED;
            });
        }
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Swapped pages of `r` to read in (MADV_WILLNEED); none are claimed: the
    /// executor touches them through the normal fault path.
    pub fn swapped_in(&self, r: PageRange) -> Vec<PageIdx> {
        let mut v = Vec::new();
        self.pages.for_each_live(r, |p, m| {
            if m.state == PState::Swapped {
                v.push(p)
            }
        });
        // In file regions, absent pages are read from the file (read-ahead),
        // a window at a time: one page per window is enough, the fault plan
        // reads the run after it.
        for reg in self.regions.overlapping(r) {
            if reg.file().is_none() {
                continue;
            }
            let seg = reg.range().intersect(&r);
            let mut q = seg.start.0;
            while q < seg.end.0 {
                let m = self.pages.get(PageIdx(q));
                if m == PageMeta::default() {
                    v.push(PageIdx(q));
                    q += MAX_WINDOW_PAGES;
                } else {
                    q += 1;
                }
            }
        }
        v.sort_unstable();
        v
    }
}

/// Whether `advice` changes a region attribute (the executor holds the
/// region lock exclusively for it): the access pattern, what a fork copies.
pub fn is_attribute_advice(advice: i32) -> bool {
    matches!(
        advice,
        MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL | MADV_DONTFORK | MADV_DOFORK | MADV_WIPEONFORK | MADV_KEEPONFORK
    )
}
