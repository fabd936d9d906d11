//! Shared file regions: write-back, `msync`, and write-back errors.
//!
//! A page of a `MAP_SHARED` file region never goes to swap: reclaim plans a
//! `Writeback` of it (see `reclaim.rs`) and `writeback_done` commits it, and
//! `msync`, `munmap` and `close` write back the dirty pages that
//! `writeback_snapshot` lists. A failed write keeps the page resident and
//! parks the error, reported once by the next `msync`/`munmap` of the file
//! (`take_file_error`, fsync semantics). Which files are mapped, and the
//! errors kept, are the `FileTable`'s (`file_table.rs`).

use super::{bad, Core, FileRange, Writeback};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::{pf, PState, PageMeta};
use crate::region::{Kind, LockMode};
use crate::types::{PageIdx, PageRange};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// The pages of `r` that belong to shared file regions (live or being
    /// unmapped, described by `files`) and hold data: what a write-back of
    /// `r` (msync, munmap, DONTNEED, close) must write. Busy pages are
    /// skipped (the caller settles first).
    ///
    /// Parked pages are claimed (`Evicting`) until `writeback_release`: the
    /// write reads their staging slot, which reclaim would otherwise evict
    /// under it — write the page, free the slot, hand it to another page —
    /// so that the range write put zeros or another page's bytes in the
    /// file after reclaim's good copy (lost data, seen at close in
    /// `file.rs eviction_writes_shared_pages_back_and_close_too`, 1 run in
    /// 20). Resident pages are copied out through the space (a page
    /// evicted in between faults back in from the file reclaim wrote).
    pub fn writeback_claim(&mut self, r: PageRange, detached: &[FileRange]) -> Vec<Writeback> {
        let mut v = Vec::new();
        let mut push = |seg: PageRange, file: u32, file_page_of_start: u64| {
            self.pages.for_each_live(seg, |p, m| {
                let staging = match m.state {
                    PState::Resident => None,
                    PState::Inactive => Some(m.slot),
                    _ => return,
                };
                if !m.has(pf::MAYBE_DIRTY) {
                    return; // clean: nothing to write
                }
                v.push(Writeback {
                    page: p,
                    staging,
                    file,
                    file_page: file_page_of_start + (p.0 - seg.start.0),
                    clean: false,
                });
            });
        };
        // Either the live regions (msync, DONTNEED, close) or the detached
        // ones (munmap, a MAP_FIXED replacement): a replacement's new region
        // is already live over the range, but the pages there are still the
        // old region's until they are zapped — written to the new file they
        // put the old bytes in it (found by the simulation).
        if detached.is_empty() {
            for reg in self.regions.overlapping(r) {
                if reg.kind() == Kind::FileShared {
                    let seg = reg.range().intersect(&r);
                    push(seg, reg.file().expect("file"), reg.file_page(seg.start));
                }
            }
        }
        for f in detached {
            let seg = f.range.intersect(&r);
            if !seg.is_empty() {
                push(seg, f.file, f.file_page + (seg.start.0 - f.range.start.0));
            }
        }
        for w in v.iter().filter(|w| w.staging.is_some()) {
            self.pages.update(w.page, |m| m.state = PState::Evicting);
        }
        v
    }

    /// Decides `msync`: returns the shared file segments to write back (in
    /// order) and the result (Linux: `EINVAL` for bad flags or an unaligned
    /// start, `ENOMEM` for holes — after syncing the mapped parts — and
    /// `EBUSY` for `MS_INVALIDATE` over locked pages).
    pub fn msync(&self, addr: u64, len: u64, flags: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        if flags & !(MS_ASYNC | MS_INVALIDATE | MS_SYNC) != 0 || !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        if flags & MS_ASYNC != 0 && flags & MS_SYNC != 0 {
            return (vec![], bad(Errno::EINVAL));
        }
        // Linux rounds the length up with wrap-around (a length that wraps
        // to 0 is an empty range), then `start + len` overflowing is ENOMEM.
        let bytes = self.page_align_wrapping(len);
        let Some(end) = addr.checked_add(bytes) else {
            return (vec![], bad(Errno::ENOMEM));
        };
        if end == addr {
            return (vec![], Ok(()));
        }
        let pages = bytes >> self.cfg.page_shift;
        let w = self.walk(addr, pages);
        if w.pieces.is_empty() {
            return (vec![], bad(Errno::ENOMEM));
        }
        let mut segs = Vec::new();
        for p in &w.pieces {
            if flags & MS_INVALIDATE != 0 && p.reg.lock() != LockMode::None {
                return (segs, bad(Errno::EBUSY));
            }
            if p.reg.kind() == Kind::FileShared {
                segs.push(p.seg);
            }
        }
        (segs, if w.has_hole() { bad(Errno::ENOMEM) } else { Ok(()) })
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Commits an eviction to a file: on success the page is dropped (a
    /// touch re-reads it); on failure it stays resident and parked, and the
    /// error is kept for the next `msync`/`munmap` of the file (as fsync
    /// reports write-back errors).
    pub fn writeback_done(&mut self, w: &Writeback, result: Result<(), Errno>) {
        debug_assert_eq!(self.pages.get(w.page).state, PState::Evicting);
        let slot = w.staging.expect("evicted page is parked");
        match result {
            Ok(()) => {
                self.staging.release(slot);
                self.pages.set(w.page, PageMeta::default());
                if !w.clean {
                    self.counters.writebacks += 1;
                }
                self.counters.evictions += 1;
            }
            Err(e) => {
                self.pages.update(w.page, |m| m.state = PState::Inactive);
                self.push_inactive(w.page);
                self.files.note_error(w.file, e);
            }
        }
    }

    /// Records a write-back error for `file` (reported by the next msync or
    /// munmap of it).
    pub fn note_file_error(&mut self, file: u32, e: Errno) {
        self.files.note_error(file, e);
    }

    /// Counts one page written back to its file; a page of a region that
    /// is no longer writable is clean from now on.
    pub fn count_writeback(&mut self, p: PageIdx) {
        self.counters.writebacks += 1;
        if self.regions.find(p).is_some_and(|r| !r.writable()) {
            self.pages.update(p, |m| {
                if m.state.holds_frame() {
                    m.flags &= !pf::MAYBE_DIRTY
                }
            });
        }
    }

    /// Ends a range write-back of one page (`writeback_claim`): counts it
    /// or keeps its error for the next `msync`/`munmap`, and gives a parked
    /// page back to reclaim — clean if its write succeeded (a parked page
    /// cannot be written by the program). Returns the write-back's result:
    /// a failed copy of a page listed where it was (not parked, so not
    /// claimed) that reclaim took meanwhile is no failure — its eviction
    /// wrote it (an eviction whose write fails keeps the page), and the copy
    /// could not fault it back in (a `PROT_NONE` page: `/proc/self/mem`
    /// cannot wait for a userfault). Found by the executor simulation.
    pub fn writeback_release(&mut self, w: &Writeback, result: Result<(), Errno>) -> Result<(), Errno> {
        if result.is_err() && w.staging.is_none() && !self.pages.get(w.page).state.holds_frame() {
            return Ok(());
        }
        match result {
            Ok(()) => self.count_writeback(w.page),
            Err(e) => self.note_file_error(w.file, e),
        }
        if w.staging.is_some() {
            debug_assert_eq!(self.pages.get(w.page).state, PState::Evicting);
            self.pages.update(w.page, |m| {
                m.state = PState::Inactive;
                if result.is_ok() {
                    m.flags &= !pf::MAYBE_DIRTY;
                }
            });
            self.push_inactive(w.page);
        }
        result
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// The first write-back error recorded for `file` since the last call,
    /// cleared (fsync semantics).
    pub fn take_file_error(&mut self, file: u32) -> Option<Errno> {
        self.files.take_error(file)
    }

    /// The file ids still mapped by a live region.
    pub fn files_in_use(&self) -> Vec<u32> {
        self.files.in_use()
    }

    /// Every shared file segment of the space (for `close`).
    pub fn shared_file_ranges(&self) -> Vec<PageRange> {
        self.regions.iter().filter(|r| r.kind() == Kind::FileShared).map(|r| r.range()).collect()
    }
}
