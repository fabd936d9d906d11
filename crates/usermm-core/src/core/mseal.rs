//! `mseal(2)`: regions sealed for good (Linux's `VM_SEALED`, mm/mseal.c),
//! and the check each call that would change a sealed region makes
//! (`munmap`, `mprotect`, `MAP_FIXED` in `vma.rs`; discarding advice in
//! `madvise.rs`; `mremap` is the preload's, which asks `smaps`).

use super::{bad, Core};
use crate::consts::*;
use crate::errno::Errno;
use crate::region::{Kind, Region};
use crate::types::PageRange;

/// Linux's `is_discard` (mm/madvise.c, 6.18): the advice a sealed VMA
/// refuses when it is anonymous and not writable (also
/// `MADV_DONTNEED_LOCKED`, which usermm refuses as unknown advice first).
pub(super) fn is_discard(advice: i32) -> bool {
    matches!(advice, MADV_FREE | MADV_DONTNEED | MADV_REMOVE | MADV_DONTFORK | MADV_WIPEONFORK | MADV_GUARD_INSTALL)
}

/// Linux's `can_madvise_modify`: `EPERM` for discarding advice on a sealed
/// region of private anonymous memory that is not writable (file mappings
/// and shmem, which shared anonymous memory is, are allowed).
pub(super) fn madvise_sealed_check(reg: &Region, advice: i32) -> Result<(), Errno> {
    if reg.sealed() && is_discard(advice) && reg.kind() == Kind::AnonPrivate && reg.prot() & PROT_WRITE == 0 {
        return bad(Errno::EPERM);
    }
    Ok(())
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// `mseal(addr, len, flags)`, Linux's order (`do_mseal`): flags not 0,
    /// an unaligned address, a length that rounds past the top or a range
    /// that overflows `EINVAL`; an empty range 0; any unmapped page of the
    /// range `ENOMEM` before anything changes; then every region of the
    /// range is split at its edges and sealed (a split past
    /// `max_regions`: `ENOMEM`, the regions before it sealed, as Linux's
    /// `vma_modify_flags`). Nothing changes on the host.
    pub fn mseal(&mut self, addr: u64, len: u64, flags: u64) -> Result<(), Errno> {
        if flags != 0 {
            return bad(Errno::EINVAL);
        }
        let pages = self.advice_pages(addr, len)?;
        if pages == 0 {
            return Ok(());
        }
        let w = self.walk(addr, pages);
        if w.has_hole() {
            return bad(Errno::ENOMEM);
        }
        let r = self.clip(addr, pages);
        let mut result = Ok(());
        for p in w.pieces {
            if p.reg.sealed() {
                continue;
            }
            let cost = self.regions.split_cost(p.seg.start) + self.regions.split_cost(p.seg.end);
            if self.regions.len() + cost > self.cfg.max_regions {
                result = bad(Errno::ENOMEM);
                break;
            }
            self.regions.split_at(p.seg.start);
            self.regions.split_at(p.seg.end);
            self.regions.find_mut(p.seg.start).expect("split").seal();
        }
        self.regions.merge_around(r);
        result
    }

    /// Whether any region overlapping `r` is sealed (`munmap`, `MAP_FIXED`
    /// and the `mremap` they make refuse the whole call with `EPERM`).
    pub fn any_sealed(&self, r: PageRange) -> bool {
        self.regions.overlapping(r).iter().any(|reg| reg.sealed())
    }
}
