//! Reclaim plans: what leaves memory, in what order, and the commits of
//! each step.
//!
//! Pages leave in two phases, both claimed while in flight: deactivation
//! parks a resident page in a staging slot (`Deactivating`, then
//! `Inactive`), and eviction writes a parked page to swap (`Evicting`, then
//! `Swapped`). Volatile pages are purged instead of swapped, lazily freed
//! ones discarded (or swapped if written since), clean pages of streaming
//! shared file regions dropped where they are; shared file pages go back to
//! their file (`writeback_done`, in `file.rs`). Order: volatile pages first
//! when `purge_volatile_first` is set, then lazily freed pages, then the
//! inactive list oldest first, refilled from the active list's head (more
//! trips for pages that earned them: `policy.rs`, which decides what stays). Without swap, anonymous pages are
//! unevictable. Every `*_done` leaves the state consistent on failure: the
//! page stays resident (parked or mapped).
//!
//! This file plans what reclaim takes; `evict.rs` holds the explicit range
//! plans (`MADV_COLD`, `MADV_PAGEOUT`) and the `*_done` commits of every
//! step.

use super::policy::{another_trip, forget_use, sampled_pass, standing_pass};
use super::{Core, Deactivate, Discard, Evict, ReclaimPlan, Transfer, Writeback};
use crate::consts::*;
use crate::page::{pf, PState};
use crate::region::{Advice, Kind, LockMode};

/// Empty reclaim rounds, with no work in flight anywhere, before a fault
/// is out of memory although reclaim is not hopeless (pages the policy
/// still grants trips past the active list's head, pages that cannot be
/// parked): each round is up to four plans, and a page earns at most a few
/// trips (see `Core::out_of_memory`).
pub const OOM_ROUNDS: u32 = 16;
/// Rounds of no progress after which a fault or populate gives up even
/// though work is still in flight (5 s with the host's 5 ms waits): pages
/// stayed busy for seconds, something is wrong, and a SIGBUS beats a hang.
pub const OOM_ROUNDS_BUSY: u32 = 1000;
/// Frames a populate that finds none reclaims at once.
const POPULATE_RECLAIM_BATCH: u64 = 64;

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Plans reclaim of up to `want` frames: evictions from the inactive
    /// list, and deactivations that refill it.
    pub fn reclaim_plan(&mut self, want: u64) -> ReclaimPlan {
        let plan = self.plan_reclaim(want);
        if !plan.deactivate.is_empty() {
            // (What pressure parks goes back when it eases: `unpark.rs`.)
            self.pressure.parked();
        }
        plan
    }

    fn plan_reclaim(&mut self, want: u64) -> ReclaimPlan {
        let mut plan = ReclaimPlan::default();
        if self.nothing_reclaimable() {
            // Nothing to age either.
            return plan;
        }
        if self.options.purge_volatile_first() && self.lru.volatile_len() > 0 {
            self.plan_volatile(&mut plan, want);
            if !plan.purge.is_empty() || !plan.deactivate.is_empty() {
                // Volatile pages go first: nothing else leaves while they
                // are on their way out (parked now, purged next round).
                return plan;
            }
        }
        // Lazily freed pages first: a clean one is discarded with no I/O.
        self.plan_lazy(&mut plan, want.max(32));
        if want > 0 && ((plan.deactivate.len() + plan.discard.len()) as u64) >= want {
            // Enough lazily freed pages are on their way out (parked now,
            // discarded by the next round): nothing dirty is evicted before
            // them. With fewer, the rest of the round evicts as usual (every
            // lazily freed page is already in this plan), so that lazily
            // freed pages that cannot be parked never stop reclaim. (An
            // aging round, which wants no frame, goes on to refill the
            // inactive list.)
            return plan;
        }
        if self.options.sampled_refs() && self.pressure.take_began() {
            self.plan_sample_all(&mut plan);
        }
        self.plan_fresh(&mut plan);
        self.plan_evict_inactive(&mut plan, want);
        self.plan_refill_inactive(&mut plan, want);
        self.pressure.demand_met();
        plan
    }

    /// Evicts the oldest inactive pages into `plan` (up to `want` frames
    /// with what is there already). A page that cannot go anywhere (no swap
    /// slot) is kept at the head and the scan goes on, so that volatile
    /// pages behind it can still be purged.
    fn plan_evict_inactive(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let mut kept = Vec::new();
        // (Locked pages, and pages making a pass their use earned.)
        let mut to_tail = Vec::new();
        let mut scanned = 0;
        let scan_max = self.lru.inactive_len();
        let first = plan.evict.len();
        while ((plan.evict.len() + plan.purge.len() + plan.discard.len()) as u64) < want && scanned < scan_max {
            scanned += 1;
            let Some((p, g)) = self.lru.isolate_inactive() else { break };
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Inactive {
                continue;
            }
            let Some(reg) = self.regions.find(p) else {
                continue; // being unmapped: the zap frees it
            };
            if reg.lock() != LockMode::None || m.has(pf::LOCKED) {
                // Parked, then locked (the lock call maps it back, after
                // letting the region lock go): it stays in memory. Kept
                // on the list, at its tail, for when it is unlocked.
                to_tail.push((p, g));
                continue;
            }
            let sampled = self.sampled(reg);
            if sampled && sampled_pass(&mut self.pages, p) {
                // Passes it earned: on to the tail, unseen.
                to_tail.push((p, g));
                continue;
            }
            if !sampled && standing_pass(&mut self.pages, p) {
                // Proved in use again and again: another pass, parked.
                to_tail.push((p, g));
                continue;
            }
            if m.has(pf::VOLATILE) {
                // Volatile: purged instead of swapped, no I/O.
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.purge.push((p, m.slot));
                continue;
            }
            let file_shared = self.regions.find(p).filter(|r| r.kind() == Kind::FileShared).cloned();
            if let Some(reg) = file_shared {
                // A shared file page goes back to its file, never to swap.
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.writeback.push(Writeback {
                    page: p,
                    staging: Some(m.slot),
                    file: reg.file().expect("file region"),
                    file_page: reg.file_page(p),
                    clean: !m.has(pf::MAYBE_DIRTY),
                });
                continue;
            }
            if m.has(pf::LAZYFREE) && self.options.host_lazyfree() {
                let swap = self.swap.alloc();
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.discard.push(Discard { page: p, staging: m.slot, swap });
                continue;
            }
            if self.swap.paused() && m.cache == 0 {
                // The store refuses writes (backing off): it stays parked.
                kept.push((p, g));
                continue;
            }
            let Some((swap, clean)) = self.evict_target(p) else {
                kept.push((p, g));
                continue;
            };
            self.pages.update(p, |m| m.state = PState::Evicting);
            plan.evict.push(Evict { page: p, staging: m.slot, swap, clean, zapped: self.zapped_at(p) });
        }
        for e in kept.into_iter().rev() {
            self.lru.putback_inactive(e);
        }
        for e in to_tail {
            self.lru.rotate_inactive(e);
        }
        self.slots_in_address_order(&mut plan.evict[first..]);
    }

    /// Refills the inactive list from the head of the active list, or of
    /// the proven list when the policy says so (`Core::age_proven`), with
    /// more trips for the pages the policy grants them
    /// (`policy::another_trip`), to its aging target and to what the round
    /// still wants.
    fn plan_refill_inactive(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let target = self.refill_target();
        let short = want.saturating_sub((plan.evict.len() + plan.purge.len() + plan.discard.len()) as u64);
        let mut scanned = 0;
        let (active_n, proven_n) = (self.lru.active_len(), self.lru.proven_len());
        // Entries taken from each list so far: once a list has been gone
        // through, the other one's turn (a list of pages that cannot be
        // parked — writable non-RW ones — must not stop the round).
        let (mut from_active, mut from_proven) = (0, 0);
        while ((self.pages.census().inactive + plan.deactivate.len() as u64) < target
            || ((plan.deactivate.len() + plan.drop.len()) as u64) < short)
            && scanned < active_n + proven_n
        {
            scanned += 1;
            let proven = match self.age_proven() {
                true => from_proven < proven_n || from_active >= active_n,
                false => from_active >= active_n && from_proven < proven_n,
            };
            if proven {
                from_proven += 1;
            } else {
                from_active += 1;
            }
            let Some((p, g)) = (if proven { self.lru.isolate_proven() } else { self.lru.isolate_active() }) else {
                break;
            };
            if proven {
                self.pressure.proven_aged();
            }
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Resident {
                continue;
            }
            let Some(reg) = self.regions.find(p) else { continue };
            if reg.lock() != LockMode::None || m.has(pf::LOCKED) {
                continue; // unevictable: off the LRU until unlocked
            }
            if reg.writable() && reg.prot() != PROT_READ | PROT_WRITE {
                // Writable but not plain RW (e.g. RWX): neither MOVE nor a
                // race-free copy is possible; keep it (documented).
                self.lru_rotate(proven, (p, g));
                continue;
            }
            if another_trip(&mut self.pages, p) {
                // (An unproved page with a trip has proved itself.)
                self.lru.rotate_proven((p, g));
                continue;
            }
            if reg.kind() == Kind::FileShared
                && reg.advice() == Advice::Sequential
                && !m.has(pf::MAYBE_DIRTY)
                && !m.has(pf::VOLATILE)
            {
                if (plan.drop.len() as u64) >= short {
                    // Only as many as the round wants (never age a stream
                    // into staging): the rest stays, oldest first.
                    self.lru_putback(proven, (p, g));
                    break;
                }
                // (Zapping: being dropped where it is, frame still charged.)
                self.pages.update(p, |m| m.state = PState::Zapping);
                plan.drop.push(p);
                continue;
            }
            if !m.has(pf::VOLATILE)
                && reg.kind() != Kind::FileShared
                && m.cache == 0
                && (self.swap.paused() || self.swap.slots_free() as u64 <= plan.deactivate.len() as u64)
            {
                // No swap room: only volatile pages can leave.
                self.lru_rotate(proven, (p, g));
                continue;
            }
            let Some(slot) = self.staging.alloc() else {
                // No staging slot: the page stays where it was, oldest
                // first (dropping its entry here would leave it resident
                // and never reclaimed).
                self.lru_putback(proven, (p, g));
                break;
            };
            let how = self.transfer_of(reg);
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
            });
            let host_free = self.options.host_lazyfree() && m.has(pf::VOLATILE);
            plan.deactivate.push(Deactivate { page: p, slot, how, host_free });
        }
    }

    /// Moves an isolated entry of the proven list (`proven`) or the
    /// active list to its list's tail.
    fn lru_rotate(&mut self, proven: bool, e: crate::lru::Entry) {
        if proven {
            self.lru.rotate_proven(e)
        } else {
            self.lru.rotate_active(e)
        }
    }

    /// Returns an isolated entry of the proven list (`proven`) or the
    /// active list to its list's head.
    fn lru_putback(&mut self, proven: bool, e: crate::lru::Entry) {
        if proven {
            self.lru.putback_proven(e)
        } else {
            self.lru.putback_active(e)
        }
    }

    /// Pressure began: zaps every page of the active list in a sampled
    /// region: pages filled while memory was plenty join the inactive list
    /// as new pages do under pressure (`plan_fresh`), in the active list's
    /// order; the rest of the list keeps its order. Under pressure a sampled
    /// page lives on the inactive list (`policy::SAMPLED_TRIPS`).
    fn plan_sample_all(&mut self, plan: &mut ReclaimPlan) {
        for _ in 0..self.lru.active_len() {
            let Some((p, g)) = self.lru.isolate_active() else { break };
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Resident {
                continue;
            }
            let plain = m.flags & (pf::LOCKED | pf::LAZYFREE | pf::VOLATILE) == 0 && !self.zaps.zapping_at(p);
            let sampled = self.regions.find(p).is_some_and(|r| r.lock() == LockMode::None && self.sampled(r));
            if !(plain && sampled) {
                self.lru.rotate_active((p, g));
                continue;
            }
            let Some(slot) = self.staging.alloc() else {
                self.lru.rotate_active((p, g));
                continue;
            };
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
            });
            plan.deactivate.push(Deactivate { page: p, slot, how: Transfer::Zap, host_free: false });
        }
    }

    /// Zaps the pages of sampled regions filled under pressure since the
    /// last round ([`Transfer::Zap`]): they join the inactive list's tail
    /// as they came, and stay only if touched again before they reach its
    /// head (`policy.rs`, "new pages prove themselves"). Lazily freed and
    /// volatile pages are left to their own lists.
    fn plan_fresh(&mut self, plan: &mut ReclaimPlan) {
        for (p, g) in std::mem::take(&mut self.fresh) {
            let m = self.pages.get(p);
            if m.gen != g
                || m.state != PState::Resident
                || m.flags & (pf::LOCKED | pf::LAZYFREE | pf::VOLATILE) != 0
                || self.zaps.zapping_at(p)
            {
                continue;
            }
            let Some(reg) = self.regions.find(p) else { continue };
            if reg.lock() != LockMode::None || !self.sampled(reg) {
                continue;
            }
            let Some(slot) = self.staging.alloc() else { break };
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
            });
            plan.deactivate.push(Deactivate { page: p, slot, how: Transfer::Zap, host_free: false });
        }
    }

    /// Plans work on lazily freed pages, oldest first, up to `want` pages:
    /// parked ones are discarded now; mapped ones are parked this round (and
    /// discarded by the next).
    fn plan_lazy(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let mut parked = Vec::new();
        let mut scanned = 0;
        let lazy_max = self.lru.lazy_len();
        while ((plan.discard.len() + plan.deactivate.len()) as u64) < want && scanned < lazy_max {
            scanned += 1;
            let Some(p) = self.lru.isolate_lazy() else { break };
            let m = self.pages.get(p);
            if !m.has(pf::LAZYFREE) || m.has(pf::VOLATILE) || self.regions.find(p).is_none() {
                continue;
            }
            if m.has(pf::LOCKED) || self.regions.find(p).is_some_and(|r| r.lock() != LockMode::None) {
                // Locked since it was freed (mlock after MADV_FREE): never
                // reclaimed while locked, and no longer a lazy candidate.
                continue;
            }
            match m.state {
                PState::Inactive if self.options.host_lazyfree() => {
                    let swap = self.swap.alloc();
                    self.pages.update(p, |m| m.state = PState::Evicting);
                    plan.discard.push(Discard { page: p, staging: m.slot, swap });
                }
                PState::Resident if self.options.host_lazyfree() => {
                    let Some(reg) = self.regions.find(p) else { continue };
                    if reg.prot() != PROT_READ | PROT_WRITE {
                        continue;
                    }
                    let Some(slot) = self.staging.alloc() else {
                        self.lru.putback_lazy(p);
                        break;
                    };
                    self.pages.update(p, |m| {
                        m.state = PState::Deactivating;
                        m.slot = slot;
                    });
                    plan.deactivate.push(Deactivate { page: p, slot, how: Transfer::Move, host_free: false });
                    // To the front: the next round discards it first (a round
                    // that parks lazy pages evicts nothing else).
                    parked.push(p);
                }
                _ => self.lru.rotate_lazy(p),
            }
        }
        for p in parked.into_iter().rev() {
            self.lru.putback_lazy(p);
        }
    }

    /// Plans the purge of volatile pages, oldest mark first, up to `want`
    /// pages (`set_purge_volatile_first`): parked ones are purged now;
    /// mapped ones are parked this round (and purged by the next, unless
    /// touched meanwhile, which parks them again the round after).
    fn plan_volatile(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let mut parked = Vec::new();
        let mut scanned = 0;
        let max = self.lru.volatile_len();
        while ((plan.purge.len() + plan.deactivate.len()) as u64) < want && scanned < max {
            scanned += 1;
            let Some(p) = self.lru.isolate_volatile() else { break };
            let m = self.pages.get(p);
            if !m.has(pf::VOLATILE) || m.has(pf::PURGED) {
                continue;
            }
            let Some(reg) = self.regions.find(p).cloned() else { continue };
            match m.state {
                PState::Inactive => {
                    self.pages.update(p, |m| m.state = PState::Evicting);
                    plan.purge.push((p, m.slot));
                }
                PState::Resident => {
                    if reg.lock() != LockMode::None || m.has(pf::LOCKED) {
                        continue;
                    }
                    if reg.writable() && reg.prot() != PROT_READ | PROT_WRITE {
                        continue; // cannot be parked (see reclaim_plan)
                    }
                    let Some(slot) = self.staging.alloc() else {
                        self.lru.putback_volatile(p);
                        break;
                    };
                    self.pages.update(p, |m| {
                        m.state = PState::Deactivating;
                        m.slot = slot;
                        forget_use(m);
                    });
                    let host_free = self.options.host_lazyfree();
                    plan.deactivate.push(Deactivate { page: p, slot, how: self.transfer_of(&reg), host_free });
                    parked.push(p);
                }
                PState::Absent | PState::Swapped => {}
                _ => self.lru.rotate_volatile(p),
            }
        }
        for p in parked.into_iter().rev() {
            self.lru.putback_volatile(p);
        }
    }

    /// Plans the eager discard of the lazily freed pages beyond the bound.
    pub fn lazyfree_trim_plan(&mut self) -> ReclaimPlan {
        let mut plan = ReclaimPlan::default();
        let excess = self.lazyfree_excess();
        if excess > 0 && self.options.host_lazyfree() {
            self.plan_lazy(&mut plan, excess);
        }
        plan
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether reclaim can free nothing however long it is waited for:
    /// every resident page is locked, or there is no swap room (full, or
    /// the page store refuses writes and is being backed off from:
    /// `set_swap_writes_paused`). What clean pages there were, the round
    /// that found the fault short of frames dropped.
    pub fn reclaim_hopeless(&self) -> bool {
        self.resident() <= self.pages.census().locked || self.swap.slots_free() == 0 || self.swap.paused()
    }

    /// Whether any page is being worked on (filled, parked, evicted,
    /// written back, zapped): work whose end may free frames or make pages
    /// reclaimable, which a fault short of frames waits for rather than
    /// being out of memory.
    pub fn reclaim_in_flight(&self) -> bool {
        self.pages.busy() > 0 || self.zaps.any_zapping()
    }

    /// Whether a fault or populate that has found no frame after `rounds`
    /// empty reclaim rounds is out of memory: after one round when nothing
    /// could ever be reclaimed (no swap, nothing to purge, discard or drop);
    /// when no work is in flight anywhere (`reclaim_in_flight`), after one
    /// round when reclaim is hopeless and after `OOM_ROUNDS` otherwise;
    /// with work in flight only after `OOM_ROUNDS_BUSY` (the executor waits
    /// for it to settle between rounds). The decision needs no clock: a
    /// budget full of locked pages, a full swap or a page store that
    /// refuses writes is out of memory at once, not after a wait (the
    /// faulting thread's SIGBUS within a millisecond, where waiting 50
    /// rounds of 5 ms had made it 0.25 s, and 5 s behind a failing store).
    /// The executor gives up with [`Failure::OutOfMemory`](super::Failure::OutOfMemory).
    pub fn out_of_memory(&self, rounds: u32) -> bool {
        if rounds == 0 {
            return false;
        }
        if self.free_frames() == 0 && self.nothing_reclaimable() {
            return true;
        }
        if rounds > OOM_ROUNDS_BUSY {
            return true;
        }
        !self.reclaim_in_flight() && (self.reclaim_hopeless() || rounds > OOM_ROUNDS)
    }

    /// Whether reclaim could free a frame were the store taking writes:
    /// not every resident page is locked, and swap has room.
    pub fn reclaim_possible_but_for_store(&self) -> bool {
        self.resident() > self.pages.census().locked && self.swap.slots_free() > 0
    }

    /// See [`Core::set_swap_writes_paused`].
    pub fn swap_writes_paused(&self) -> bool {
        self.swap.paused()
    }

    /// Whether reclaim has nothing it could ever take: no swap (anonymous
    /// pages are unevictable, as on a swapless Linux), no volatile page to
    /// purge, no lazily freed page the host can discard, and no shared file
    /// region whose pages could go to their file.
    fn nothing_reclaimable(&self) -> bool {
        self.swap.capacity() == 0
            && self.pages.census().volatile == 0
            && (self.pages.census().lazyfree == 0 || !self.options.host_lazyfree())
            && !self.regions.iter().any(|r| r.kind() == Kind::FileShared)
    }

    /// Lazily freed pages beyond the space's bound (`set_lazyfree_max`).
    pub fn lazyfree_excess(&self) -> u64 {
        self.options.lazyfree_excess(self.pages.census().lazyfree)
    }

    /// How many frames a fault that finds none reclaims at once: enough to
    /// amortise the work, never so many that a small budget is flushed. A
    /// populate, which goes on to the next page at once and has no thread
    /// waiting on one page, takes `POPULATE_RECLAIM_BATCH`.
    pub fn direct_reclaim_batch(&self, populate: bool) -> u64 {
        if populate {
            POPULATE_RECLAIM_BATCH
        } else {
            (self.cfg.budget_pages / 8).clamp(1, 16)
        }
    }
}

/// Configuration (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether the page store refuses writes and the executor backs off
    /// from it: no eviction that needs a write is planned, no page parked
    /// for one, and reclaim is hopeless once nothing else can leave
    /// (`reclaim_hopeless`).
    pub fn set_swap_writes_paused(&mut self, on: bool) {
        self.swap.set_paused(on);
    }

    /// Bounds how many lazily freed pages the space keeps (`u64::MAX`:
    /// unbounded); past it, `MADV_FREE` discards the oldest at once.
    pub fn set_lazyfree_max(&mut self, pages: u64) {
        self.options.set_lazyfree_max(pages);
    }
}

impl Core {
    /// Puts a round's evictions in address order and gives the dirty ones
    /// their new slots in that order (the same slots, reassigned): whichever
    /// order the program left its pages in (the LRU's), neighbouring pages
    /// land in neighbouring slots, so the swap read-around reads a stream
    /// back with one read whether the program walks it forwards or
    /// backwards (SQLite's page cache, scanned downwards and evicted
    /// downwards, took a swap fault per page when the slots followed the
    /// LRU). A clean page beside a dirty one of the round is written too,
    /// to a new slot (its swap copy dropped): a page the program only read,
    /// left at its old slot, would split the stream's run there (SQLite's
    /// page headers, one page in nine: 17k swap faults, against 11k with
    /// runs that skip nothing). The writes follow the slots, so runs of
    /// consecutive slots still go out with one write each; a clean page
    /// with no dirty neighbour keeps its copy and writes nothing.
    fn slots_in_address_order(&mut self, evict: &mut [Evict]) {
        evict.sort_unstable_by_key(|e| e.page);
        for i in 0..evict.len() {
            let beside_dirty = |j: usize| evict[j].page.0.abs_diff(evict[i].page.0) == 1 && !evict[j].clean;
            let neighbour = (i > 0 && beside_dirty(i - 1)) || (i + 1 < evict.len() && beside_dirty(i + 1));
            if !evict[i].clean || !neighbour {
                continue;
            }
            let Some(slot) = self.swap.alloc() else { break };
            self.uncache(evict[i].page);
            evict[i].clean = false;
            evict[i].swap = slot;
        }
        let mut slots: Vec<u32> = evict.iter().filter(|e| !e.clean).map(|e| e.swap).collect();
        slots.sort_unstable();
        for (e, s) in evict.iter_mut().filter(|e| !e.clean).zip(slots) {
            e.swap = s;
        }
    }
}
