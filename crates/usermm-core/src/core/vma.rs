//! Region changes: `mmap`, `munmap` and `mprotect`.
//!
//! Every call here changes region metadata only (split, insert, merge,
//! detach) and never touches a page: `munmap` detaches the range and holds
//! it (`Core::held`) until the executor has zapped its pages and calls
//! `unhold`, and a `MAP_FIXED` replacement comes back as `MmapPlan::replaced`
//! for the executor to zap the same way (seed 003, Linux's
//! `do_vmi_munmap`/`unmap_region` split). Argument checks follow Linux's
//! order (`do_mmap`, `do_mprotect_pkey`) so that each call returns the errno
//! Linux would. Invariant kept: the region count never exceeds
//! `CoreConfig::max_regions` once a call returns.

use super::range::Piece;
use super::{bad, Core, Detached, FileMap, FileRange, MmapPlan, MmapReply, TASK_SIZE};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::pf;
use crate::region::{Kind, LockMode, Region, RegionAttrs, FILE_OBJECT};
use crate::types::{PageIdx, PageRange};

/// `mmap`'s mapping-type checks, in Linux's order (`do_mmap`'s switch on
/// the type): `MAP_SHARED` or `MAP_PRIVATE` (`EINVAL`; `MAP_SHARED_VALIDATE`
/// with an unknown flag `EOPNOTSUPP`), a file mapping only through
/// `mmap_file`, a shared writable file mapping only of a descriptor open
/// for writing, any file mapping only of one open for reading (`EACCES`)
/// and of a file type that can be mapped (`ENODEV`), `MAP_GROWSDOWN` only
/// on private anonymous memory (`EINVAL`). Whether the mapping is shared.
fn mmap_type_checked(prot: i32, flags: i32, file: Option<&FileMap>) -> Result<bool, Errno> {
    let shared = mmap_shared(flags, file)?;
    if flags & MAP_ANONYMOUS == 0 && file.is_none() {
        // The executor maps files through `mmap_file`.
        return bad(Errno::ENODEV);
    }
    if file.is_none() && shared && flags & MAP_GROWSDOWN != 0 {
        return bad(Errno::EINVAL);
    }
    if let Some(f) = file {
        if shared && prot & PROT_WRITE != 0 && !f.writable {
            return bad(Errno::EACCES);
        }
        if !f.readable {
            return bad(Errno::EACCES);
        }
        if !f.mappable {
            return bad(Errno::ENODEV);
        }
        // Only private anonymous memory may grow down.
        if flags & MAP_GROWSDOWN != 0 {
            return bad(Errno::EINVAL);
        }
        // The file system's own mmap (ext4's, xfs's) refuses MAP_SYNC on a
        // file that is not on a DAX device, and usermm's copies never are
        // (with any type: Linux keeps the bit when MAP_SHARED drops it).
        if flags & MAP_SYNC != 0 && !f.zero {
            return bad(Errno::EOPNOTSUPP);
        }
    }
    Ok(shared)
}

/// Linux's `file_mmap_ok`: whether a mapping of `len` bytes at `off` bytes
/// ends within what the file allows (`EOVERFLOW` otherwise).
fn file_mmap_ok(f: &FileMap, off: Option<u64>, len: u64) -> Result<(), Errno> {
    let end_ok = |off: u64| f.size_max_bytes.checked_sub(len).is_some_and(|room| off <= room);
    if off.is_some_and(end_ok) {
        Ok(())
    } else {
        bad(Errno::EOVERFLOW)
    }
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Decides an anonymous `mmap`. `anon` is false for a file mapping, which
    /// the executor has validated (the descriptor) before calling.
    pub fn mmap(&mut self, addr: u64, len: u64, prot: i32, flags: i32) -> Result<MmapReply, Errno> {
        self.mmap_in(addr, len, prot, flags, None)
    }

    /// Decides a file `mmap`: the executor has checked the descriptor (EBADF,
    /// ENODEV, EACCES for a descriptor not open for reading) and gives the
    /// file's id, whether it is open for writing, and the offset in pages.
    pub fn mmap_file(&mut self, addr: u64, len: u64, prot: i32, flags: i32, file: FileMap) -> Result<MmapReply, Errno> {
        self.mmap_in(addr, len, prot, flags & !MAP_ANONYMOUS, Some(file))
    }

    fn mmap_in(
        &mut self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<FileMap>,
    ) -> Result<MmapReply, Errno> {
        // Linux's order (do_mmap): the length, the offset, the address
        // (alignment, MAP_FIXED_NOREPLACE overlap), the lock limit, the
        // file's size limit, and only then the mapping type and the
        // descriptor's checks.
        let pages = self.mmap_pages(len, flags, file.as_ref())?;
        let fixed_range = self.mmap_fixed_range(addr, pages, flags)?;
        let lock = self.mmap_lock_checked(flags, pages)?;
        if let Some(f) = &file {
            let shift = self.cfg.page_shift;
            file_mmap_ok(f, f.off_pages.checked_mul(1 << shift), pages << shift)?;
        }
        let shared = mmap_type_checked(prot, flags, file.as_ref())?;
        // `/dev/zero`, checked as a file, maps as anonymous memory.
        let file = file.filter(|f| !f.zero);
        let Some(start) = self.mmap_place(addr, pages, fixed_range)? else {
            return Ok(MmapReply::Busy);
        };
        let range = PageRange::new(start, start + pages);
        let cuts = self.mmap_region_count_checked(range, prot, shared || file.is_some(), lock, flags)?;
        // Linux (vms_gather_munmap_vmas): a sealed region under a MAP_FIXED
        // mapping refuses it before anything changes.
        if cuts && self.any_sealed(range) {
            return bad(Errno::EPERM);
        }
        let replaced = if cuts { Some(self.detach(range)) } else { None };
        self.mmap_insert(range, prot, flags, file.as_ref(), shared, lock);
        // A MAP_FIXED replacement's pages must be gone before the new region
        // is seen; the executor zaps `replaced` under the exclusive lock. The
        // range is held until then so that faults in it wait.
        Ok(MmapReply::Done(MmapPlan { range, prot: prot & PROT_MASK, replaced }))
    }

    /// `mmap`'s length checks (and a file offset's overflow): the length in
    /// pages.
    fn mmap_pages(&self, len: u64, flags: i32, file: Option<&FileMap>) -> Result<u64, Errno> {
        if len == 0 {
            return bad(Errno::EINVAL);
        }
        if flags & MAP_HUGETLB != 0 {
            return bad(Errno::EINVAL);
        }
        let pages = self.len_pages(len).ok_or(Errno::ENOMEM)?;
        if pages == 0 {
            return bad(Errno::ENOMEM);
        }
        if let Some(f) = file {
            if f.off_pages.checked_add(pages).is_none() {
                return bad(Errno::EOVERFLOW);
            }
        }
        Ok(pages)
    }

    /// `mmap`'s address checks: the range a `MAP_FIXED` (or
    /// `MAP_FIXED_NOREPLACE`) mapping must take, `None` for a hint.
    fn mmap_fixed_range(&self, addr: u64, pages: u64, flags: i32) -> Result<Option<PageRange>, Errno> {
        let fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
        // Linux (`__get_unmapped_area`): a length past TASK_SIZE, or with
        // MAP_FIXED a range ending past it, is ENOMEM, before the address's
        // alignment is looked at.
        let bytes = pages << self.cfg.page_shift;
        if bytes > TASK_SIZE || fixed && addr > TASK_SIZE - bytes {
            return bad(Errno::ENOMEM);
        }
        if !fixed {
            return Ok(None);
        }
        if !self.aligned(addr) {
            return bad(Errno::EINVAL);
        }
        if !self.in_reservation(addr, pages) {
            return bad(Errno::EINVAL);
        }
        let r = self.clip(addr, pages);
        if flags & MAP_FIXED_NOREPLACE != 0 && (self.regions.any_in(r) || self.zaps.held_overlaps(&r)) {
            return bad(Errno::EEXIST);
        }
        Ok(Some(r))
    }

    /// The new mapping's lock mode, checked against the lock limit.
    fn mmap_lock_checked(&self, flags: i32, pages: u64) -> Result<LockMode, Errno> {
        let lock = self.locks.mmap_mode(flags);
        if lock != LockMode::None {
            if !self.cfg.mlock_allowed {
                return bad(Errno::EPERM);
            }
            if self.locks.charged().saturating_add(pages) > self.cfg.memlock_pages {
                return bad(Errno::EAGAIN);
            }
        }
        Ok(lock)
    }

    /// Whether placing a mapping at `range` keeps the region count within
    /// the limit (the new region, plus splits of regions it cuts, less the
    /// neighbours it merges with): `ENOMEM` if not; `Ok(true)` if it cuts
    /// existing regions (a `MAP_FIXED` replacement).
    fn mmap_region_count_checked(
        &self,
        range: PageRange,
        prot: i32,
        shared_or_file: bool,
        lock: LockMode,
        flags: i32,
    ) -> Result<bool, Errno> {
        let mut new_count = self.regions.len() + 1;
        let cut = self.regions.overlapping(range);
        new_count -= cut.len();
        new_count += self.regions.split_cost(range.start) + self.regions.split_cost(range.end);
        let would_merge = self.merge_neighbours(range, prot, shared_or_file, lock, flags);
        if new_count - would_merge > self.cfg.max_regions {
            return bad(Errno::ENOMEM);
        }
        Ok(!cut.is_empty())
    }

    /// Where a new mapping of `pages` goes: the fixed range, the hint if it
    /// is free, else the first gap. `None`: the fixed range is being
    /// unmapped (wait).
    fn mmap_place(&self, addr: u64, pages: u64, fixed_range: Option<PageRange>) -> Result<Option<u64>, Errno> {
        if let Some(r) = fixed_range {
            if self.zaps.held_overlaps(&r) {
                return Ok(None);
            }
            return Ok(Some(r.start.0));
        }
        let ps = self.page_size();
        // x86-64 Linux rounds an unaligned hint down.
        let hint = addr & !(ps - 1);
        let hinted = (hint != 0 && self.in_reservation(hint, pages)).then(|| self.clip(hint, pages));
        Ok(Some(match hinted {
            Some(r) if !self.regions.any_in(r) && !self.zaps.held_overlaps(&r) => r.start.0,
            _ => self.regions.find_gap(pages, 0, self.cfg.reserve_pages, self.zaps.held()).ok_or(Errno::ENOMEM)?,
        }))
    }

    /// Inserts the new region (merged with its neighbours where it can be)
    /// and charges its lock and file.
    fn mmap_insert(
        &mut self,
        range: PageRange,
        prot: i32,
        flags: i32,
        file: Option<&FileMap>,
        shared: bool,
        lock: LockMode,
    ) {
        let pages = range.pages();
        let object = match file {
            Some(f) => FILE_OBJECT | f.id as u64,
            None if shared => self.regions.new_object(),
            None => 0,
        };
        if lock != LockMode::None {
            self.locks.charge(pages);
        }
        if let Some(f) = file {
            self.files.map(f.id, pages);
        }
        self.regions.insert(Region::new(
            range,
            RegionAttrs {
                prot: prot & PROT_MASK,
                kind: match (file, shared) {
                    (Some(_), true) => Kind::FileShared,
                    (Some(_), false) => Kind::FilePrivate,
                    (None, true) => Kind::AnonShared,
                    (None, false) => Kind::AnonPrivate,
                },
                noreserve: flags & MAP_NORESERVE != 0,
                lock,
                object,
                pgoff: file.map_or(0, |f| f.off_pages),
                may_write: file.is_none_or(|f| f.writable || !shared),
                in_thread: flags & UMM_MAP_INTHREAD != 0,
            },
        ));
        self.regions.merge_around(range);
    }

    /// How many neighbours (0..=2) a new region would merge with.
    fn merge_neighbours(&self, range: PageRange, prot: i32, shared: bool, lock: LockMode, flags: i32) -> usize {
        if shared {
            return 0;
        }
        let probe = Region::new(
            range,
            RegionAttrs {
                prot: prot & PROT_MASK,
                kind: Kind::AnonPrivate,
                noreserve: flags & MAP_NORESERVE != 0,
                lock,
                object: 0,
                pgoff: 0,
                may_write: true,
                in_thread: flags & UMM_MAP_INTHREAD != 0,
            },
        );
        let mut n = 0;
        if range.start.0 > 0 {
            if let Some(prev) = self.regions.find(PageIdx(range.start.0 - 1)) {
                if prev.range().end == range.start && prev.can_merge(&probe) {
                    n += 1;
                }
            }
        }
        if let Some(next) = self.regions.find(range.end) {
            if probe.can_merge(next) {
                n += 1;
            }
        }
        n
    }

    /// Splits at the boundaries of `r`, removes the regions inside, holds the
    /// parts that had regions, and uncharges their locks. O(regions + log n):
    /// no page is touched (seed 003).
    fn detach(&mut self, r: PageRange) -> Detached {
        self.regions.split_at(r.start);
        self.regions.split_at(r.end);
        let removed = self.regions.remove_range(r);
        let mut ranges: Vec<PageRange> = Vec::new();
        let mut locked = Vec::new();
        let mut files = Vec::new();
        for reg in &removed {
            if reg.lock() != LockMode::None {
                self.locks.uncharge(reg.range().pages());
                locked.push(reg.range());
            }
            if reg.kind() == Kind::FileShared {
                files.push(FileRange { range: reg.range(), file: reg.file().expect("file"), file_page: reg.pgoff() });
            }
            if let Some(f) = reg.file() {
                self.files.unmap(f, reg.range().pages());
            }
            match ranges.last_mut() {
                Some(last) if last.end == reg.range().start => last.end = reg.range().end,
                _ => ranges.push(reg.range()),
            }
        }
        self.zaps.hold(&ranges);
        Detached { ranges, locked, files }
    }

    /// Phase 1 of `munmap`, under the exclusive lock: validate and detach.
    /// Returns `None` when nothing was mapped there.
    pub fn munmap(&mut self, addr: u64, len: u64) -> Result<Option<Detached>, Errno> {
        if !self.aligned(addr) || addr > TASK_SIZE || len > TASK_SIZE - addr {
            return bad(Errno::EINVAL);
        }
        let pages = self.len_pages(len).ok_or(Errno::EINVAL)?;
        if pages == 0 {
            return bad(Errno::EINVAL);
        }
        if !self.in_reservation(addr, pages) {
            return bad(Errno::EINVAL);
        }
        let r = self.clip(addr, pages);
        if !self.regions.any_in(r) {
            return Ok(None);
        }
        // Unmapping the middle of a region adds one region (Linux checks the
        // limit before splitting).
        if let Some(reg) = self.regions.find(r.start) {
            if reg.range().start < r.start && r.end < reg.range().end && self.regions.len() >= self.cfg.max_regions {
                return bad(Errno::ENOMEM);
            }
        }
        // Linux (vms_gather_munmap_vmas): any sealed region in the range
        // refuses the whole call, nothing unmapped.
        if self.any_sealed(r) {
            return bad(Errno::EPERM);
        }
        Ok(Some(self.detach(r)))
    }

    /// Decides `mprotect`. Returns the segments to apply (in order) and the
    /// call's result; on error the segments before the failure are applied,
    /// as Linux does.
    pub fn mprotect(&mut self, addr: u64, len: u64, prot: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        const PROT_SEM: i32 = 0x8;
        const PROT_GROWSDOWN: i32 = 0x0100_0000;
        const PROT_GROWSUP: i32 = 0x0200_0000;
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        if len == 0 {
            return (vec![], Ok(()));
        }
        let Some(pages) = self.len_pages(len).filter(|p| *p > 0) else {
            return (vec![], bad(Errno::ENOMEM));
        };
        if self.range_end(addr, pages).is_none() {
            return (vec![], bad(Errno::ENOMEM));
        }
        if prot & !(PROT_MASK | PROT_SEM | PROT_GROWSDOWN | PROT_GROWSUP) != 0
            || prot & (PROT_GROWSDOWN | PROT_GROWSUP) == PROT_GROWSDOWN | PROT_GROWSUP
        {
            return (vec![], bad(Errno::EINVAL));
        }
        if prot & (PROT_GROWSDOWN | PROT_GROWSUP) != 0 {
            // No region grows: Linux finds the first mapping in the range
            // (none: ENOMEM), then refuses it for not growing (EINVAL).
            let r = self.clip(addr, pages);
            let any = !r.is_empty() && self.regions.any_in(r);
            return (vec![], bad(if any { Errno::EINVAL } else { Errno::ENOMEM }));
        }
        let prot = prot & PROT_MASK;
        if !self.in_reservation(addr, pages) {
            // Partly outside: Linux applies the mapped prefix; the reservation
            // edge is a hole.
            let r = self.clip(addr, pages);
            if r.is_empty() || self.addr_of(r.start).0 != addr {
                return (vec![], bad(Errno::ENOMEM));
            }
            let (v, _) = self.mprotect_range(r, prot);
            return (v, bad(Errno::ENOMEM));
        }
        let r = self.clip(addr, pages);
        self.mprotect_range(r, prot)
    }

    fn mprotect_range(&mut self, r: PageRange, prot: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        let w = self.walk_range(r);
        let mut applied = Vec::new();
        // Linux stops at the first hole: ENOMEM, the pieces before changed.
        let mut hole = w.hole_after;
        for Piece { reg, seg, hole_before } in w.pieces {
            if hole_before {
                hole = true;
                break;
            }
            if prot & PROT_WRITE != 0 && !reg.may_write() {
                // Linux: PROT_WRITE on a shared mapping of a descriptor not
                // open for writing (the parts before were changed).
                self.regions.merge_around(r);
                return (applied, bad(Errno::EACCES));
            }
            if reg.sealed() {
                // Linux (mprotect_fixup): a sealed region refuses any
                // protection, its own included (the parts before changed).
                self.regions.merge_around(r);
                return (applied, bad(Errno::EPERM));
            }
            if reg.prot() != prot {
                // Split, change and merge first, then check the count: a
                // change that merges into a neighbour only moves a boundary
                // (Linux succeeds at the limit then). Undo if over.
                self.regions.split_at(seg.start);
                self.regions.split_at(seg.end);
                self.regions.find_mut(seg.start).expect("split").set_prot(prot);
                if prot & PROT_WRITE != 0 {
                    for (p, m) in self.pages.live_in(seg) {
                        if m.state.holds_frame() {
                            self.pages.update(p, |m| m.flags |= pf::MAYBE_DIRTY);
                        }
                    }
                }
                self.regions.merge_around(seg);
                if self.regions.len() > self.cfg.max_regions {
                    self.regions.split_at(seg.start);
                    self.regions.split_at(seg.end);
                    self.regions.find_mut(seg.start).expect("split").set_prot(reg.prot());
                    self.regions.merge_around(r);
                    return (applied, bad(Errno::ENOMEM));
                }
                applied.push(seg);
            }
        }
        self.regions.merge_around(r);
        if hole {
            return (applied, bad(Errno::ENOMEM));
        }
        (applied, Ok(()))
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// The last phase of `munmap`: the range may be reused.
    pub fn unhold(&mut self, d: &Detached) {
        for r in &d.ranges {
            self.zaps.unhold(*r);
        }
    }
}

/// Whether a mapping's type is shared (`MAP_SHARED`, or a valid
/// `MAP_SHARED_VALIDATE`); Linux's errors for the others.
fn mmap_shared(flags: i32, file: Option<&FileMap>) -> Result<bool, Errno> {
    match flags & MAP_TYPE {
        MAP_SHARED => Ok(true),
        MAP_PRIVATE => Ok(false),
        MAP_SHARED_VALIDATE => {
            // Linux validates flags only for file mappings; an anonymous
            // MAP_SHARED_VALIDATE is EINVAL whatever the flags.
            if flags & MAP_ANONYMOUS != 0 {
                return bad(Errno::EINVAL);
            }
            // Regular files are taken to be on a file system that offers
            // MAP_SYNC (ext4, xfs): it passes here and fails at the end
            // (`mmap_type_checked`). `MAP_FIXED_NOREPLACE` is not in
            // Linux's mask.
            let sync = if file.is_some_and(|f| f.mappable) { MAP_SYNC } else { 0 };
            if flags & !(LEGACY_MAP_MASK | sync | UMM_MAP_LOCKONFAULT | UMM_MAP_INTHREAD | MAP_SHARED_VALIDATE) != 0 {
                return bad(Errno::EOPNOTSUPP);
            }
            Ok(true)
        }
        _ => bad(Errno::EINVAL),
    }
}
