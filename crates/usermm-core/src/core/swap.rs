//! Swap space: the swap slots, and the slots on their way back to the page
//! store (released a granule at a time, or scrubbed).
//!
//! A store that holds swapped pages on another machine (a Redis server) can
//! give their memory back, but only a whole *granule* of slots at a time
//! (one value holds a granule's pages). Every freed slot's granule is
//! logged; the executor asks for the ones wholly free now (`release_plan`),
//! which stay reserved — allocated to no page, so no eviction writes into
//! them while the store deletes them — until `release_done`. The swap file
//! wants none of this (granule 0: nothing is logged).
//!
//! Separately, the slots of pages that came back into a locked region are
//! *scrubbed*: their stored copies overwritten with a page of zeros
//! (`scrub_plan`), in every store, so that a locked page's data does not
//! stay readable in swap (on a Redis server, for good after a crash).
//!
//! Invariants (`validate`, with the page counts the core recounts): the
//! slots in use are the swapped pages', the swap copies' (`swapcache.rs`),
//! the `reserved` ones and those of pages in flight; `reserved` counts the
//! slots a release or scrub plan holds.

use crate::slots::SlotAllocator;

pub(super) struct SwapSpace {
    slots: SlotAllocator,
    /// Swap slots of each granule given back to the store (0: none are).
    release_granule: u32,
    /// Granules in which slots were freed since the last release plan.
    /// Invariant: at most `2 * granules + 64` entries (deduplicated when
    /// it grows past that).
    release_log: Vec<u32>,
    /// Invariant: swap slots reserved by a release or scrub plan
    /// (allocated, no page's).
    reserved: u64,
    /// Granules in which a slot was freed (page stores only), where
    /// [`SwapSpace::alloc`] looks first: a slot there that is free while
    /// others of its granule are in use is a dead slot holding the server's
    /// memory (its value cannot shrink), so it is written again before a
    /// slot of a fresh granule is. Invariant: at most `2 * granules + 64`
    /// entries, as `release_log`.
    holes: Vec<u32>,
    /// Freed swap slots whose stored copy must be overwritten: the copies
    /// of pages that came back into a locked region. A slot allocated
    /// again leaves the list (its next page's write overwrites it).
    scrub_log: Vec<u32>,
    /// Slots whose scrub failed, for the next `scrub_plan` (not counted as
    /// pending work: a store that keeps failing must not keep the
    /// background thread awake).
    scrub_retry: Vec<u32>,
    /// The page store refuses writes and is backed off from: evictions
    /// that need a write wait.
    paused: bool,
    /// Forked children that may read slots in place (`core/fork.rs`): each
    /// one's id and the slots in use at its fork, a bit a slot. A slot of
    /// any is not reused (nor scrubbed) until every such child is gone.
    holds: Vec<(u64, Vec<u64>)>,
    /// Invariant: slots freed here while a hold had them, still allocated
    /// (counted in `reserved`); `deferred_scrub`, those to scrub once free.
    deferred: Vec<u64>,
    deferred_scrub: Vec<u64>,
    /// Each slot's last eviction into it: the core's eviction count then,
    /// plus one (0: none recorded), for the refault distance of the page
    /// read back from it (`policy::refault_earns`). Grown as slots are
    /// written.
    evicted_at: Vec<u32>,
}

fn bit(v: &[u64], s: u32) -> bool {
    v.get(s as usize / 64).is_some_and(|w| w & (1 << (s % 64)) != 0)
}

fn set_bit(v: &mut Vec<u64>, s: u32, on: bool) {
    let i = s as usize / 64;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    if on {
        v[i] |= 1 << (s % 64);
    } else {
        v[i] &= !(1 << (s % 64));
    }
}

impl SwapSpace {
    pub(super) fn new(slots: u32) -> SwapSpace {
        SwapSpace {
            slots: SlotAllocator::new(slots),
            release_granule: 0,
            release_log: Vec::new(),
            holes: Vec::new(),
            reserved: 0,
            scrub_log: Vec::new(),
            scrub_retry: Vec::new(),
            paused: false,
            holds: Vec::new(),
            deferred: Vec::new(),
            deferred_scrub: Vec::new(),
            evicted_at: Vec::new(),
        }
    }

    /// A page was evicted into slot `s` (a write, or a swap copy kept)
    /// after `evictions` evictions.
    pub(super) fn note_evicted(&mut self, s: u32, evictions: u64) {
        let i = s as usize;
        if self.evicted_at.len() <= i {
            self.evicted_at.resize(i + 1, 0);
        }
        self.evicted_at[i] = (evictions as u32).wrapping_add(1);
    }

    /// How many evictions came after the last one into slot `s`, the count
    /// being `evictions` now (None: none recorded).
    pub(super) fn evictions_since(&self, s: u32, evictions: u64) -> Option<u32> {
        match self.evicted_at.get(s as usize) {
            None | Some(0) => None,
            Some(&at) => Some((evictions as u32).wrapping_add(1).wrapping_sub(at)),
        }
    }

    /// Slots in all (0: no swap).
    pub(super) fn capacity(&self) -> u32 {
        self.slots.capacity()
    }

    /// Slots allocated to nothing.
    pub(super) fn slots_free(&self) -> u32 {
        self.slots.free()
    }

    /// Whether swap is short of free slots (an eighth or less of them, as
    /// Linux's `vm_swap_full` has it half full): a slot kept as a swap
    /// copy is then one a dirty page cannot use. A page store keeps its
    /// copies by the same rule, though they hold its server's memory (in
    /// `bench farmem`, Linux's half made a Redis server hold 1.18 bytes per
    /// byte swapped out instead of 1.52, at half the throughput of random
    /// and scanning reads: a clean page's eviction became a write).
    pub(super) fn short(&self) -> bool {
        u64::from(self.slots.free()) <= u64::from(self.slots.capacity()) / 8
    }

    pub(super) fn is_used(&self, s: u32) -> bool {
        self.slots.is_used(s)
    }

    /// Allocates a slot: in a page store, a dead slot of a granule others
    /// of whose slots are in use (`holes`) first; otherwise the one after
    /// the last if free. `None` when swap is full.
    pub(super) fn alloc(&mut self) -> Option<u32> {
        let g = self.release_granule;
        while let Some(&k) = self.holes.last() {
            let first = k * g;
            let end = (first + g).min(self.slots.capacity());
            let mut free = None;
            let mut used = false;
            for s in first..end {
                if self.slots.is_used(s) {
                    used = true;
                } else if free.is_none() {
                    free = Some(s);
                }
            }
            match free {
                Some(s) if used => {
                    self.slots.take(s);
                    return Some(s);
                }
                // Full, or wholly free (then its release frees the
                // server's memory instead).
                _ => {
                    self.holes.pop();
                }
            }
        }
        self.slots.alloc()
    }

    /// Frees slot `s` (and logs its granule).
    pub(super) fn free_slot(&mut self, s: u32) {
        self.free(s, true);
    }

    /// Frees slot `s`, whose write failed: not a dead slot to write first
    /// (its store group may not take writes now).
    pub(super) fn free_unwritten(&mut self, s: u32) {
        self.free(s, false);
    }

    fn free(&mut self, s: u32, hole: bool) {
        if self.held(s) {
            self.defer(s, false);
            return;
        }
        self.slots.release(s);
        if let Some(g) = s.checked_div(self.release_granule) {
            self.release_log.push(g);
            if hole {
                self.holes.push(g);
            }
            // Bounded: at most one entry per granule once deduplicated.
            let max = self.release_log_max();
            for log in [&mut self.release_log, &mut self.holes] {
                if log.len() as u64 > max {
                    log.sort_unstable();
                    log.dedup();
                }
            }
        }
    }

    /// How long the release log may grow before it is deduplicated.
    fn release_log_max(&self) -> u64 {
        2 * u64::from(self.slots.capacity().div_ceil(self.release_granule)) + 64
    }

    /// Frees slot `s` and has its stored copy overwritten (`scrub_plan`):
    /// it held the data of a page now locked.
    pub(super) fn free_and_scrub(&mut self, s: u32) {
        if self.held(s) {
            self.defer(s, true);
            return;
        }
        self.free_slot(s);
        self.scrub_log.push(s);
    }

    fn held(&self, s: u32) -> bool {
        self.holds.iter().any(|(_, h)| bit(h, s))
    }

    /// Slot `s`, freed while a hold has it, stays allocated until the last
    /// such hold ends.
    fn defer(&mut self, s: u32, scrub: bool) {
        debug_assert!(!bit(&self.deferred, s), "slot {s} freed twice");
        set_bit(&mut self.deferred, s, true);
        set_bit(&mut self.deferred_scrub, s, scrub);
        self.reserved += 1;
    }

    /// A forked child that may read slots in place: every slot in use now
    /// stays unwritten until [`SwapSpace::hold_end`] with `id`.
    pub(super) fn hold(&mut self, id: u64) {
        if self.slots.used() == 0 {
            return;
        }
        // (A slot kept for another child is no page's: this one does not
        // read it.)
        let h = self
            .slots
            .words()
            .iter()
            .enumerate()
            .map(|(i, &w)| w & !self.deferred.get(i).copied().unwrap_or(0))
            .collect();
        self.holds.push((id, h));
    }

    /// Hold `id`'s child is gone: the slots freed meanwhile that no other
    /// hold has are freed (and scrubbed if they were to be).
    pub(super) fn hold_end(&mut self, id: u64) {
        let Some(i) = self.holds.iter().position(|h| h.0 == id) else { return };
        self.holds.swap_remove(i);
        self.free_deferred();
    }

    /// In a forked child: the parent's holds are not its (its own swap
    /// file holds nothing of the parent's children), and the slots they
    /// kept are free here.
    pub(super) fn holds_forget(&mut self) {
        self.holds.clear();
        self.free_deferred();
    }

    /// Slots freed here but kept for a forked child.
    pub(super) fn deferred(&self) -> u64 {
        self.deferred.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Whether a forked child holds slots.
    pub(super) fn holds_any(&self) -> bool {
        !self.holds.is_empty()
    }

    fn free_deferred(&mut self) {
        let mut free = Vec::new();
        for (w, &bits) in self.deferred.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                let s = (w * 64) as u32 + b.trailing_zeros();
                b &= b - 1;
                if !self.held(s) {
                    free.push(s);
                }
            }
        }
        for s in free {
            set_bit(&mut self.deferred, s, false);
            self.reserved -= 1;
            if bit(&self.deferred_scrub, s) {
                set_bit(&mut self.deferred_scrub, s, false);
                self.free_and_scrub(s);
            } else {
                self.free_slot(s);
            }
        }
    }

    /// Logs freed slots by granules of `granule` slots from now on (0: not
    /// at all).
    pub(super) fn set_release_granule(&mut self, granule: u32) {
        self.release_granule = granule;
        self.release_log.clear();
        self.holes.clear();
    }

    /// Whether granules with freed slots wait for `release_plan`, or slots
    /// for `scrub_plan`.
    pub(super) fn release_pending(&self) -> bool {
        !self.release_log.is_empty() || !self.scrub_log.is_empty()
    }

    /// Up to `max` freed slots whose stored copy is to be overwritten,
    /// reserved until `scrub_done` so that no eviction writes there
    /// meanwhile. A slot allocated again since is left out: its new page's
    /// write overwrites it.
    pub(super) fn scrub_plan(&mut self, max: usize) -> Vec<u32> {
        self.scrub_log.append(&mut self.scrub_retry);
        self.scrub_log.sort_unstable();
        self.scrub_log.dedup();
        let take = self.scrub_log.len().min(max);
        let mut out = Vec::new();
        for s in self.scrub_log.drain(..take) {
            if !self.slots.is_used(s) {
                self.slots.take(s);
                self.reserved += 1;
                out.push(s);
            }
        }
        out
    }

    /// The slots of a `scrub_plan` are overwritten in the store (`ok`) or
    /// not: either way they are free again, and their granules logged for
    /// `release_plan`. A failed scrub is kept for the next plan (unless a
    /// page takes the slot first), without counting as pending work.
    pub(super) fn scrub_done(&mut self, slots: &[u32], ok: bool) {
        for &s in slots {
            self.reserved -= 1;
            self.free_slot(s);
        }
        if !ok {
            self.scrub_retry.extend_from_slice(slots);
        }
    }

    /// Up to `max` granules whose slots are all free, reserved until
    /// `release_done`: `(first slot, slots)` each. Granules logged but in
    /// use again are forgotten (their slots will be freed, and logged,
    /// again).
    pub(super) fn release_plan(&mut self, max: usize) -> Vec<(u32, u32)> {
        let g = self.release_granule;
        let mut out = Vec::new();
        if g == 0 {
            return out;
        }
        self.release_log.sort_unstable();
        self.release_log.dedup();
        let cap = self.slots.capacity();
        let take = self.release_log.len().min(max);
        for k in self.release_log.drain(..take) {
            let first = k * g;
            let n = g.min(cap - first);
            if (first..first + n).all(|s| !self.slots.is_used(s)) {
                for s in first..first + n {
                    self.slots.take(s);
                }
                self.reserved += u64::from(n);
                out.push((first, n));
            }
        }
        out
    }

    /// The granules of a `release_plan` are deleted from the store (or not:
    /// either way their slots are free again, and not logged).
    pub(super) fn release_done(&mut self, granules: &[(u32, u32)]) {
        for &(first, n) in granules {
            for s in first..first + n {
                self.slots.release(s);
            }
            self.reserved -= u64::from(n);
        }
    }

    pub(super) fn set_paused(&mut self, on: bool) {
        self.paused = on;
    }

    /// Whether the page store refuses writes and is backed off from.
    pub(super) fn paused(&self) -> bool {
        self.paused
    }

    /// The allocator on its own, the logs' bounds, and the slots in use
    /// against the core's recount: `cached` swap copies, `swapped` pages
    /// and `in_flight` pages (being evicted or filled) that may hold a slot.
    pub(super) fn validate(&self, cached: u64, swapped: u64, in_flight: u64) {
        self.slots.validate();
        if self.release_granule != 0 {
            assert!(self.release_log.len() as u64 <= self.release_log_max(), "release log bound");
            assert!(self.holes.len() as u64 <= self.release_log_max(), "holes bound");
        }
        let mut deferred = 0u64;
        for (w, &bits) in self.deferred.iter().enumerate() {
            deferred += u64::from(bits.count_ones());
            let mut b = bits;
            while b != 0 {
                let s = (w * 64) as u32 + b.trailing_zeros();
                b &= b - 1;
                assert!(self.slots.is_used(s) && self.held(s), "deferred slot {s} allocated and held");
            }
        }
        assert!(deferred <= self.reserved, "deferred slots are reserved");
        let su = u64::from(self.slots.used()) - cached - self.reserved;
        // (A lazily freed page being discarded may hold no swap slot.)
        assert!(su >= swapped && su <= swapped + in_flight, "swap slots in use");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page store's dead slot (free in a granule whose other slots are in
    /// use) is written again before a fresh slot; a wholly free granule is
    /// left to its release; the swap file (no granule) stays next-fit.
    #[test]
    fn a_page_store_fills_dead_slots_first() {
        for granule in [15, 0] {
            let mut s = SwapSpace::new(60);
            s.set_release_granule(granule);
            let got: Vec<u32> = (0..30).map(|_| s.alloc().unwrap()).collect();
            assert_eq!(got, (0..30).collect::<Vec<_>>());
            s.free_slot(3);
            (15..30).for_each(|x| s.free_slot(x));
            if granule == 0 {
                assert_eq!(s.alloc(), Some(30), "the swap file stays next-fit");
                continue;
            }
            assert_eq!(s.alloc(), Some(3), "the dead slot of granule 0 first");
            assert_eq!(s.alloc(), Some(30), "then next-fit, past the wholly free granule 1");
            assert_eq!(s.release_plan(8), [(15, 15)], "granule 1 goes back to the store");
            s.release_done(&[(15, 15)]);
        }
    }

    /// A slot a forked child holds, freed, is not handed out again (nor
    /// scrubbed) until every hold that has it ends; then it is free (and
    /// scrubbed if it was to be). A child drops its parent's holds.
    #[test]
    fn held_slots_wait_for_every_hold() {
        let mut s = SwapSpace::new(8);
        let a: Vec<u32> = (0..4).map(|_| s.alloc().unwrap()).collect();
        s.hold(1);
        s.free_slot(a[0]);
        s.hold(2);
        s.free_and_scrub(a[1]);
        s.free_slot(a[2]);
        assert_eq!((s.deferred(), s.reserved), (3, 3));
        let got: Vec<u32> = std::iter::from_fn(|| s.alloc()).collect();
        assert_eq!(got, [4, 5, 6, 7], "no held slot handed out");
        s.validate(0, 4 + 1, 0);
        s.hold_end(1);
        // a[0] was only hold 1's; a[1] and a[2] are hold 2's too.
        assert_eq!(s.deferred(), 2);
        assert!(!s.is_used(a[0]) && s.is_used(a[1]));
        s.hold_end(2);
        assert_eq!((s.deferred(), s.reserved), (0, 0));
        assert_eq!(s.scrub_plan(8), [a[1]], "the scrub waited for the holds");
        let mut t = SwapSpace::new(4);
        let b = t.alloc().unwrap();
        t.hold(7);
        t.free_slot(b);
        assert!(t.is_used(b));
        t.holds_forget();
        assert!(!t.is_used(b) && !t.holds_any(), "a child's copy keeps no hold of its parent's");
    }

    /// However slots come and go, the holes stay bounded and no slot is
    /// handed out twice (the allocator's `take` asserts it).
    #[test]
    fn holes_stay_bounded() {
        let mut s = SwapSpace::new(300);
        s.set_release_granule(15);
        let mut used = Vec::new();
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || used.is_empty() {
                if let Some(slot) = s.alloc() {
                    used.push(slot);
                }
            } else {
                let i = (x as usize / 3) % used.len();
                s.free_slot(used.swap_remove(i));
            }
            assert!(s.holes.len() as u64 <= s.release_log_max());
        }
        assert_eq!(u64::from(s.slots.used()), used.len() as u64);
    }
}
