//! Volatile ranges (`mvolatile`/`mnovolatile`) and lazy free (`MADV_FREE`).
//!
//! Both mark pages whose data the program lets go of under pressure, and
//! both are flags on the page (`VOLATILE`, `LAZYFREE`), counted in
//! `volatile_pages` and `lazyfree_pages` (invariants `validate` checks).
//! A volatile page is purged by reclaim and reads back as a SIGBUS until
//! `mnovolatile` reports it; a lazily freed page is discarded if the host
//! finds it clean and reads back as zeros. Reclaim's side of both is in
//! `reclaim.rs` (`plan_volatile`, `plan_lazy`).

use super::{bad, Busy, Core, FaultPlan, NoVolatile};
use crate::errno::Errno;
use crate::page::{pf, PState, PageMeta};
use crate::region::LockMode;
use crate::types::{PageIdx, PageRange};

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Decides `mvolatile`: marks the pages of the range volatile. A locked
    /// region is `EINVAL`, holes `ENOMEM` (after marking the mapped parts).
    /// Returns the staging slots of the parked pages it marked: with host
    /// discards on (`set_host_lazyfree`), the executor hands them to the
    /// host (`MADV_FREE`), as it does for pages parked later while volatile.
    pub fn mvolatile(&mut self, addr: u64, len: u64) -> (Vec<u32>, Result<(), Errno>) {
        let (segs, res) = self.volatile_segments(addr, len, true);
        let mut parked = Vec::new();
        for seg in segs {
            for q in seg.start.0..seg.end.0 {
                let p = PageIdx(q);
                let m = self.pages.get(p);
                if !m.has(pf::VOLATILE) {
                    if !m.state.busy() {
                        // Purged, not swapped, from now on.
                        self.uncache(p);
                    }
                    self.pages.update(p, |m| m.flags |= pf::VOLATILE);
                    if self.options.host_lazyfree() && m.state == PState::Inactive {
                        parked.push(m.slot);
                    }
                    if self.options.purge_volatile_first() && m.state.holds_frame() {
                        self.lru.add_volatile(p);
                    }
                }
            }
        }
        (parked, res)
    }

    /// The segments of a volatile call, and its result.
    fn volatile_segments(&self, addr: u64, len: u64, refuse_locked: bool) -> (Vec<PageRange>, Result<(), Errno>) {
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        let Some(pages) = self.len_pages(len) else {
            return (vec![], bad(Errno::EINVAL));
        };
        if self.range_end(addr, pages).is_none() {
            return (vec![], bad(Errno::EINVAL));
        }
        if pages == 0 {
            return (vec![], Ok(()));
        }
        let w = self.walk(addr, pages);
        // (Memory shared with a forked process is the host's, which
        // purges nothing.)
        if w.pieces.iter().any(|p| p.reg.host())
            || refuse_locked && w.pieces.iter().any(|p| p.reg.lock() != LockMode::None)
        {
            return (vec![], bad(Errno::EINVAL));
        }
        let segs = w.pieces.iter().map(|p| p.seg).collect();
        (segs, if w.has_hole() { bad(Errno::ENOMEM) } else { Ok(()) })
    }

    /// Decides `mnovolatile`: `Err(e)` refuses the call; `Ok(Err(Busy))`
    /// means a page of the range is busy (a purge may be in flight): wait
    /// and call again. Otherwise the range is no longer volatile when this
    /// returns (no purge can start: purges are planned under the same lock),
    /// and the purged pages are reported; the executor removes their markers
    /// so that they read back as zeros.
    #[allow(clippy::type_complexity)]
    pub fn mnovolatile(&mut self, addr: u64, len: u64) -> Result<Result<(NoVolatile, Result<(), Errno>), Busy>, Errno> {
        let (segs, res) = self.volatile_segments(addr, len, false);
        if segs.is_empty() {
            res?;
        }
        for seg in &segs {
            if self.pages.live_in(*seg).iter().any(|(_, m)| m.state.busy()) {
                return Ok(Err(Busy));
            }
        }
        let mut out = NoVolatile::default();
        if self.options.host_lazyfree() {
            // A parked volatile page's slot may be discarded by the host at
            // any time: only mapping it back tells (atomically) whether it
            // was. Pages in the program's range never are (only parked
            // pages are handed to the host).
            for seg in &segs {
                for (p, m) in self.pages.live_in(*seg) {
                    if m.state == PState::Inactive && m.has(pf::VOLATILE) {
                        out.reactivate.push(p);
                    }
                }
            }
            if !out.reactivate.is_empty() {
                return Ok(Ok((out, res)));
            }
        }
        for seg in segs {
            for (p, m) in self.pages.live_in(seg) {
                if m.has(pf::PURGED) {
                    out.purged.push(p);
                }
                self.pages.update(p, |m| m.flags &= !(pf::VOLATILE | pf::PURGED));
            }
        }
        Ok(Ok((out, res)))
    }

    /// Plans the reactivation of the parked page `p` for `mnovolatile`
    /// (`NoVolatile::reactivate`, checked) or a lock (`LockPlan::reactivate`),
    /// whatever its region's protection: a fault in a `PROT_NONE` region plans nothing (the
    /// kernel would not have reported it), so a fault would never bring
    /// such a page back, and `mnovolatile` would ask for it forever.
    /// `Some(FaultPlan::Busy)`: wait for the page to settle and call again;
    /// `None`: `p` is no longer parked (or no longer mapped).
    pub fn reactivate_step(&mut self, p: PageIdx) -> Option<FaultPlan> {
        let m = self.pages.get(p);
        if self.in_flight(p, &m) {
            return Some(FaultPlan::Busy);
        }
        if m.state != PState::Inactive {
            return None;
        }
        let how = self.transfer_of(self.regions.find(p)?);
        self.pages.update(p, |m| m.state = PState::Filling);
        let checked = self.options.host_lazyfree() && m.has(pf::VOLATILE);
        let wp = m.cache != 0 && !checked;
        Some(FaultPlan::Reactivate { page: p, slot: m.slot, how, checked, wp })
    }

    /// `MADV_FREE` on `r`: swapped pages are freed at once (their slots
    /// released; they read back as zeros); resident pages become lazily
    /// freed and keep their data. Busy pages are left alone (Linux's
    /// MADV_FREE is best effort too).
    ///
    /// The core does not know whether a lazily freed page is written after
    /// the call; the host kernel does (the executor passes MADV_FREE down and
    /// the PTE's dirty bit follows the page). Reclaim therefore takes lazily
    /// freed pages first and plans a `Discard`: the host drops a clean page,
    /// keeps a written one (which is then swapped). The flag is cleared when
    /// the page leaves memory or is refilled, as Linux settles its LazyFree
    /// count at reclaim.
    /// Returns the staging slots of the parked pages it marked (the executor
    /// passes MADV_FREE down for those too).
    pub fn lazyfree(&mut self, r: PageRange) -> Vec<u32> {
        let mut parked = Vec::new();
        for (p, m) in self.pages.live_in(r) {
            if m.state == PState::Inactive && !m.has(pf::LAZYFREE) {
                parked.push(m.slot);
            }
            match m.state {
                PState::Swapped => {
                    self.swap.free_slot(m.slot);
                    self.pages.set(p, PageMeta::default());
                }
                PState::Resident | PState::Inactive if !m.has(pf::LAZYFREE) => {
                    // Its data may be discarded (reads zeros) or written.
                    self.uncache(p);
                    self.pages.update(p, |m| m.flags |= pf::LAZYFREE);
                    self.lru.add_lazy(p);
                }
                _ => {}
            }
        }
        parked
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// How many pages of `r` are marked volatile (purged ones included).
    pub fn volatile_in(&self, r: PageRange) -> u64 {
        let mut n = 0;
        self.pages.for_each_live(r, |_, m| n += u64::from(m.has(pf::VOLATILE)));
        n
    }

    /// Whether any page of `r` is volatile (mlock refuses them).
    pub fn any_volatile(&self, r: PageRange) -> bool {
        let mut v = false;
        self.pages.for_each_live(r, |_, m| v |= m.has(pf::VOLATILE));
        v
    }

    /// The runs of resident, lazily freed pages of `r` (a write populate
    /// passes them to the host, which then treats them as written, as
    /// Linux's populate does: `FOLL_WRITE` dirties the folio).
    pub fn lazyfree_runs(&self, r: PageRange) -> Vec<PageRange> {
        let mut runs: Vec<PageRange> = Vec::new();
        self.pages.for_each_live(r, |p, m| {
            if m.state == PState::Resident && m.has(pf::LAZYFREE) {
                match runs.last_mut() {
                    Some(last) if last.end == p => last.end.0 += 1,
                    _ => runs.push(PageRange::new(p.0, p.0 + 1)),
                }
            }
        });
        runs
    }
}
