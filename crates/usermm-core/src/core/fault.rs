//! Fault resolution: `fault` and `populate_step` plan, `fill_done` commits.
//!
//! A plan claims the pages it hands out (state `Filling`) and charges their
//! frames before the executor installs anything; `fill_done` then commits
//! the installed prefix of the run and releases the rest, so a failed or
//! short fill leaves every page where its data was. A fault on a busy page,
//! or in a chunk being zapped, is told to `Wait`; one that finds no free
//! frame is told to `Reclaim`. How many pages a fault fills around the
//! touched one is the window policy (constants and helpers in `window.rs`).

use super::policy::{refault_earns, refaulted_soon, AGING_PER_REFAULT};
use super::window::{
    dense_block, fault_around_window, file_fault_around_block, grow_run, swap_in_window, IN_THREAD_ZERO_WINDOW_PAGES,
    MAX_WINDOW_PAGES,
};
use super::{bad, Core, FaultPlan};
use crate::consts::*;
use crate::errno::Errno;
use crate::page::{pf, PState, PageMeta};
use crate::region::{Advice, Kind, LockMode};
use crate::types::{Addr, PageIdx, PageRange};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Plans the resolution of a fault at `a`.
    pub fn fault(&mut self, a: Addr, write: bool) -> FaultPlan {
        self.fault_in(a, write, None, MAX_WINDOW_PAGES)
    }

    /// `fault` for a fault the faulting thread resolves itself (in-thread
    /// mode): an anonymous write fault's zero-fill window takes at most
    /// `IN_THREAD_ZERO_WINDOW_PAGES`, because the thread fills all of it
    /// before it returns to the program (a handler thread wakes the program
    /// after the piece it waits for and fills the rest meanwhile).
    pub fn fault_in_thread(&mut self, a: Addr, write: bool) -> FaultPlan {
        self.fault_in(a, write, None, IN_THREAD_ZERO_WINDOW_PAGES)
    }

    /// Plans one step of populating `[p, end)` (MADV_POPULATE_*): like a
    /// fault at `p`, with the largest window, bounded by `end`. The caller
    /// checked the range with `populate_check`. Returns `None` when `p` is
    /// already resident and mapped.
    pub fn populate_step(&mut self, p: PageIdx, end: PageIdx, write: bool) -> Option<FaultPlan> {
        let plan = self.fault_in(self.addr_of(p), write, Some(end), MAX_WINDOW_PAGES);
        match plan {
            FaultPlan::Wake => None,
            other => Some(other),
        }
    }

    /// Checks a `MADV_POPULATE_READ/WRITE` range: returns the segments to
    /// populate, in order, and the error to return after populating them
    /// (Linux populates up to the failing region: a hole is `ENOMEM`, a
    /// region without the needed protection `EINVAL`).
    pub fn populate_check(&self, addr: u64, len: u64, write: bool) -> (Vec<PageRange>, Result<(), Errno>) {
        let pages = match self.advice_pages(addr, len) {
            Ok(p) => p,
            Err(e) => return (vec![], Err(e)),
        };
        if pages == 0 {
            return (vec![], Ok(()));
        }
        if !self.in_reservation(addr, pages) && self.page_of(Addr(addr)).is_none() {
            return (vec![], bad(Errno::ENOMEM));
        }
        let w = self.walk(addr, pages);
        let need = if write { PROT_WRITE } else { PROT_READ };
        let mut segs = Vec::new();
        for p in &w.pieces {
            if p.hole_before {
                return (segs, bad(Errno::ENOMEM));
            }
            if p.reg.prot() & need == 0 {
                return (segs, bad(Errno::EINVAL));
            }
            segs.push(p.seg);
        }
        if w.hole_after || w.outside {
            return (segs, bad(Errno::ENOMEM));
        }
        (segs, Ok(()))
    }

    /// A fault or populate step at `a`; `zero_window`: the largest
    /// zero-fill window of an anonymous write fault (`fault_in_thread`).
    fn fault_in(&mut self, a: Addr, write: bool, populate: Option<PageIdx>, zero_window: u64) -> FaultPlan {
        let Some(p) = self.page_of(a) else {
            return FaultPlan::Wake;
        };
        let free = self.free_frames();
        let exact = self.cfg.exact_faults;
        let Some(reg) = self.regions.find_mut(p) else {
            // Unmapped (or being unmapped): munmap leaves the range's host
            // protection as it was, so the touch reached the handler.
            return FaultPlan::Segv { gap: self.regions.gap_around(p, self.cfg.reserve_pages) };
        };
        if reg.host() {
            // The host's pages (a shared region a fork left shared): a
            // fault taken before it became the host's, served there now.
            return FaultPlan::Wake;
        }
        if populate.is_none() && (reg.prot() & PROT_MASK == PROT_NONE || (write && !reg.writable())) {
            // The kernel checks protection before it reports a fault; this
            // one raced with mprotect. The retry sees the new protection.
            // (Any of read, write or exec lets a read fault through, as
            // Linux's `vma_is_accessible`: an instruction fetch arrives as
            // a read, and so does a load of an exec-only page on x86
            // without protection keys; with them the kernel raises
            // `SEGV_PKUERR` for the load itself and never reports it.)
            return FaultPlan::Wake;
        }
        // Shared anonymous memory is shmem on Linux: a fault allocates
        // exactly the touched page (no fault-around, no mTHP-like blocks).
        let exact = exact || reg.kind() == Kind::AnonShared;
        let region = match populate {
            Some(end) => PageRange { start: reg.range().start, end: reg.range().end.min(end) },
            None => reg.range(),
        };
        let region = self.zaps.clear_of(region, p);
        let (prot, kind) = (reg.prot(), reg.kind());
        let m = self.pages.get(p);
        if self.in_flight(p, &m) {
            return FaultPlan::Busy;
        }
        match m.state {
            // A fault on a page we hold as resident: either a race (it is
            // there by now: the refill's copy finds it and installs
            // nothing), a lazily freed page the host discarded, or a page
            // the program dropped behind our back with a raw
            // `madvise(MADV_DONTNEED)` (Linux reads zeros there; a plain
            // wake would send the thread back into the same fault forever).
            // (A populate treats it as resident: the executor asks the host
            // to populate lazily freed pages, which faults here if the host
            // dropped one.)
            PState::Resident if populate.is_none() => {
                self.pages.update(p, |m| m.state = PState::Filling);
                FaultPlan::Refill { page: p }
            }
            PState::Resident => FaultPlan::Wake,
            PState::Inactive => {
                self.pages.update(p, |m| m.state = PState::Filling);
                let checked = self.options.host_lazyfree() && m.has(pf::VOLATILE);
                // A page with a swap copy comes back write-protected (a
                // write fault's page is written at once: it drops it).
                let wp = m.cache != 0 && !checked && !write;
                FaultPlan::Reactivate { page: p, slot: m.slot, how: self.transfer_by(kind, prot), checked, wp }
            }
            PState::Swapped => self.plan_swap_in(p, m, region, free, populate.is_some(), write),
            PState::Absent => self.plan_absent(p, m, region, free, populate.is_some(), write, exact, zero_window),
            _ => unreachable!("busy handled above"),
        }
    }

    /// Whether page `p` (metadata `m`) is being worked on: a fault there
    /// waits (`Busy`).
    pub(super) fn in_flight(&self, p: PageIdx, m: &PageMeta) -> bool {
        m.state.busy() || self.zaps.zapping_at(p)
    }

    /// A fault on a swapped page: a swap-in of it and the swapped
    /// neighbours that follow it in swap (up to the read-around window and
    /// the free frames), or reclaim first.
    fn plan_swap_in(
        &mut self,
        p: PageIdx,
        m: PageMeta,
        region: PageRange,
        free: u64,
        populate: bool,
        write: bool,
    ) -> FaultPlan {
        let reg = self.regions.find_mut(p).expect("region");
        if free == 0 {
            self.pressure.ran_out();
            return FaultPlan::Reclaim { want: self.direct_reclaim_batch(populate) };
        }
        let (window, backwards, stream) = swap_in_window(reg, p, populate);
        let limit = free.min(window);
        // The run's pages sit in consecutive slots, in address order:
        // `slot` is its first page's.
        let mut run = PageRange::new(p.0, p.0 + 1);
        let mut slot = m.slot;
        if backwards {
            while run.pages() < limit && run.start > region.start && slot > 0 {
                let n = self.pages.get(PageIdx(run.start.0 - 1));
                if n.state != PState::Swapped || n.slot != slot - 1 {
                    break;
                }
                run.start.0 -= 1;
                slot -= 1;
            }
        } else {
            while run.pages() < limit && run.end < region.end {
                let n = self.pages.get(run.end);
                if n.state != PState::Swapped || n.slot != m.slot + run.pages() as u32 {
                    break;
                }
                run.end.0 += 1;
            }
        }
        if let (Some(reg), Some(i)) = (self.regions.find_mut(p), stream) {
            reg.end_swap_stream(i, run);
        }
        let keep = self.keeps_swap_copy(p, write);
        self.claim_frames(run.pages());
        for q in run.start.0..run.end.0 {
            self.pages.update(PageIdx(q), |m| m.state = PState::Filling);
        }
        FaultPlan::SwapIn { run, slot, keep }
    }

    /// A fault on a page never filled (or dropped): SIGBUS if poisoned or
    /// purged, else a zero fill or file read of a run around it (the
    /// fault-around window, a dense block, a file's fault-around block),
    /// or reclaim first.
    #[allow(clippy::too_many_arguments)]
    fn plan_absent(
        &mut self,
        p: PageIdx,
        m: PageMeta,
        region: PageRange,
        free: u64,
        populate: bool,
        write: bool,
        exact: bool,
        zero_window: u64,
    ) -> FaultPlan {
        if m.has(pf::POISONED) || (m.has(pf::PURGED) && m.has(pf::VOLATILE)) {
            return FaultPlan::Sigbus;
        }
        if free == 0 {
            self.pressure.ran_out();
            return FaultPlan::Reclaim { want: self.direct_reclaim_batch(populate) };
        }
        // (One lookup for the whole plan: the borrow is of `regions` only.)
        let reg = self.regions.find_mut(p).expect("region");
        // Fault-around: how many pages past (and around) `p`.
        let mut window = fault_around_window(reg, p, populate, exact);
        if write && reg.file().is_none() {
            window = window.min(zero_window);
        }
        let mut run = PageRange::new(p.0, p.0 + 1);
        let limit = free.min(window);
        while run.pages() < limit && run.end < region.end && self.pages.get(run.end) == PageMeta::default() {
            run.end.0 += 1;
        }
        if window == 1 && !populate && !exact && reg.advice() == Advice::Normal && reg.lock() == LockMode::None {
            if let Some(block) = dense_block(&self.pages, p, region) {
                grow_run(&self.pages, &mut run, block, free);
            }
        }
        if !populate && !write && reg.lock() != LockMode::None && reg.file().is_some() {
            // Linux maps (and so locks, in a VM_LOCKONFAULT vma) the
            // whole fault-around window of a file read fault (64 KiB
            // around the page, within the vma). That is
            // Linux's residency, so UMM_F_EXACT_FAULTS keeps it too.
            let block = file_fault_around_block(p, region, self.cfg.page_shift);
            grow_run(&self.pages, &mut run, block, free);
        }
        if !populate {
            reg.note_filled(run);
        }
        let file = reg.file().map(|f| (f, reg.file_page(run.start)));
        self.claim_frames(run.pages());
        for q in run.start.0..run.end.0 {
            self.pages.update(PageIdx(q), |m| m.state = PState::Filling);
        }
        match file {
            Some((file, file_page)) => FaultPlan::FileRead { run, file, file_page },
            None => FaultPlan::ZeroFill { run },
        }
    }
}

/// Commits (see "Methods by kind" in `core.rs`).
impl Core {
    /// Commits a fill. `installed` is how many pages of the plan the executor
    /// installed (a prefix of the run); the rest are released.
    pub fn fill_done(&mut self, plan: &FaultPlan, installed: u64) {
        self.counters.faults += 1;
        match *plan {
            FaultPlan::ZeroFill { run } | FaultPlan::FileRead { run, .. } => {
                self.fresh_fill_done(run, installed, matches!(plan, FaultPlan::FileRead { .. }))
            }
            FaultPlan::SwapIn { run, slot, keep } => self.swap_in_done(run, slot, keep, installed),
            FaultPlan::Refill { page } => {
                // The frame stays charged either way; the page is no longer
                // lazily freed (a discard reads back as zeros, and the
                // program is about to use it).
                // A copy that installed nothing found the page there, as it
                // was (a fault that raced with the fill, a read-ahead's
                // say): its swap copy, if any, is still exact.
                let lazy = self.pages.get(page).has(pf::LAZYFREE);
                if installed > 0 {
                    self.uncache(page);
                }
                self.pages.update(page, |m| {
                    m.state = PState::Resident;
                    m.flags &= !pf::LAZYFREE;
                });
                if lazy && installed > 0 {
                    self.counters.lazyfree_discards += 1;
                }
            }
            FaultPlan::Reactivate { page, slot, wp, .. } => self.reactivate_done(page, slot, wp, installed),
            FaultPlan::Unprotect { page } => {
                debug_assert_eq!(self.pages.get(page).state, PState::Filling);
                // Back on the active list (reclaim dropped its entry while
                // it was claimed): a page just written is in use.
                self.pages.update(page, |m| m.state = PState::Resident);
                self.note_resident(page);
            }
            _ => {}
        }
    }

    /// `fill_done` of a zero fill or a file read (`file`) of `run`.
    fn fresh_fill_done(&mut self, run: PageRange, installed: u64, file: bool) {
        for q in run.start.0..run.end.0 {
            let p = PageIdx(q);
            if q - run.start.0 < installed {
                self.pages.update(p, |m| m.state = PState::Resident);
                self.note_resident(p);
            } else {
                self.pages.update(p, |m| m.state = PState::Absent);
            }
        }
        if file {
            self.counters.major_faults += u64::from(installed > 0);
        } else {
            self.counters.zero_fills += installed;
        }
    }

    /// `fill_done` of a swap-in of `run` from consecutive slots from `slot`
    /// (`keep`: the pages keep their swap copies).
    fn swap_in_done(&mut self, run: PageRange, slot: u32, keep: bool, installed: u64) {
        for q in run.start.0..run.end.0 {
            let p = PageIdx(q);
            let k = q - run.start.0;
            if k < installed {
                self.commit_swapped_in(p, slot + k as u32, keep);
            } else {
                self.pages.update(p, |m| m.state = PState::Swapped);
            }
        }
        if installed > 0 {
            self.counters.swapins += installed;
            self.counters.major_faults += 1;
        } else {
            self.counters.swap_read_errors += 1;
        }
    }

    /// Page `p` was read from swap `slot` and installed (`keep`: it keeps
    /// its swap copy). Swapped into a locked region, the slot is freed and
    /// its stored copy overwritten (`swap_scrub_plan`).
    pub(super) fn commit_swapped_in(&mut self, p: PageIdx, s: u32, keep: bool) {
        let locked = self.regions.find(p).is_some_and(|r| r.lock() != LockMode::None);
        if !keep && locked {
            self.swap.free_and_scrub(s);
        } else if !keep {
            self.swap.free_slot(s);
        }
        let proven = self.lru.proven_len() as u64;
        let soon = self.swap.evictions_since(s, self.counters.evictions).is_some_and(|d| refault_earns(d, proven));
        self.pages.update(p, |m| {
            m.state = PState::Resident;
            m.slot = 0;
            m.cache = if keep { s + 1 } else { 0 };
            if soon {
                refaulted_soon(m);
            }
        });
        if soon {
            self.pressure.refault_activated(AGING_PER_REFAULT);
        }
        self.note_resident(p);
    }

    /// `fill_done` of the reactivation of parked `page` from staging `slot`
    /// (`wp`: mapped back write-protected, keeping its swap copy).
    fn reactivate_done(&mut self, page: PageIdx, slot: u32, wp: bool, installed: u64) {
        if self.mapped_back(page, slot, wp, installed) {
            self.pages.update(page, super::policy::touched_parked);
            self.pressure.touched_parked();
            self.note_resident(page);
            self.counters.minor_faults += 1;
        }
    }

    /// The part every commit of a reactivation shares (a fault's, a bulk
    /// map-back's: `unpark.rs`): a parked page the executor mapped back
    /// (`installed` > 0) is resident again, its staging slot free; one it
    /// did not stays parked. Returns whether it is resident; the caller
    /// queues it on the active list.
    pub(super) fn mapped_back(&mut self, page: PageIdx, slot: u32, wp: bool, installed: u64) -> bool {
        if installed == 0 {
            self.pages.update(page, |m| m.state = PState::Inactive);
            self.push_inactive(page);
            return false;
        }
        if !wp {
            // Mapped back writable (moved, or copied without protection):
            // the swap copy may not stay exact.
            self.uncache(page);
        }
        self.staging.release(slot);
        self.pages.update(page, |m| {
            m.state = PState::Resident;
            m.slot = 0;
        });
        true
    }

    /// Counts a fault that could get no frame (SIGBUS raised).
    pub fn fault_oom(&mut self) {
        self.counters.oom_sigbus += 1;
    }
}
