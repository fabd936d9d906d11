//! The replacement policy: which resident pages stay, decided from what
//! userfaultfd lets usermm see.
//!
//! What it sees: a touch of a page that is not mapped — a first touch, a
//! refault of an evicted page, or a touch of a *parked* page (one the
//! inactive list moved out of the program's range: see `lru.rs`). A touch
//! of a mapped page is invisible. Parking is the policy's accessed bit: a
//! page touched while parked comes back with its referenced bit and
//! [`PROVEN_TRIPS`] extra trips, and only pages untouched for a whole trip
//! through the inactive list are evicted. So does a page read back from
//! swap soon after its eviction (its refault distance, as Linux's
//! workingset detection measures it). Such a page waits on the *proven*
//! list, which aging passes by while pages not yet proved are left.
//!
//! What it decides, here and nowhere else:
//! - which list aging takes its next page from ([`Core::age_proven`]: the
//!   proven list only beyond its target or after refaults);
//! - whether the page at a list's head gets another trip
//!   ([`another_trip`]) or is parked;
//! - what a touch of a parked page earns ([`touched_parked`]), what a
//!   refault does ([`refault_earns`]), the extra passes through the
//!   inactive list a page touched parked again and again makes
//!   ([`standing_pass`]), and when a page forgets it all ([`forget_use`]);
//! - the inactive list's target and how fast aging refills it
//!   ([`Core::inactive_target`], [`Core::refill_target`],
//!   [`Core::needs_aging`]);
//! - when reclaim works ahead of the program, and how much
//!   ([`Core::reclaim_ahead`], [`Core::reclaim_ahead_want`]);
//! - when pressure is over, and parked pages go back in bulk
//!   ([`Core::ease_if_calm`], [`Core::calm_by_touches`], `unpark.rs`).
//!
//! The mechanism — the lists (`lru.rs`, `frames.rs`) and the plans that
//! carry decisions out (`reclaim.rs`, `evict.rs`) — is elsewhere. The
//! policy is replayed on access traces without a kernel in
//! `tests/policy.rs` (a hot set through a scan 8× the budget, a zipfian
//! trace against an exact LRU, the `reclaim` experiment's phases); what was
//! measured, and what was tried and rejected, is in `docs/design.md`
//! ("Budget, LRU and reclaim").

use super::Core;
use crate::page::{pf, PageMeta, PageTable};
use crate::types::PageIdx;

/// Extra trips past the active list's head a page earns when touched while
/// parked, beside its referenced bit's one: a page that proved itself
/// outlives pages that came in once and were never touched parked. (With
/// the referenced bit alone, the `reclaim` experiment's hot set — touched
/// parked all through its scan phase, then once, mapped, by the `fits`
/// warm-up — looked as old as the scan's pages and was evicted by the
/// warm-up, and came back in the `fits` phase: 258 evictions after the
/// warm-up in `tests/policy.rs`'s replay, and 13.5 page reads per 1,000
/// touches in the experiment; with 2 extra trips, none and 2.1. One extra
/// trip left 387 evictions in the replay; 3 left none, with more minor
/// faults.)
pub(super) const PROVEN_TRIPS: u8 = 2;

/// Pages an aging round may deactivate per frame claimed since the last
/// round. Refilling the inactive list to its target at once whenever any
/// frame was claimed parked pages a working set that fits was still
/// touching: in the `fits` phase, 153 minor faults per 1,000 touches in
/// `tests/policy.rs`'s replay, 57 with this bound (the other phases within
/// 1%).
pub(super) const AGING_PER_CLAIM: u64 = 4;

/// Pages the proven list ages (rotates or parks, from its head) for each
/// page read back from swap soon after its eviction (`refault_earns`),
/// which joins it: a program whose misses come back soon has a working set
/// the proven list's old pages stand in the way of, and those were proved
/// long ago (a stale hot set) or never touched again. With 1, the proven
/// list only turned over as fast as it grew, and the `reclaim` experiment's
/// zipfian phase left 4,200 of its pages proven through the scan after it
/// and the `fits` warm-up (a fifth of the working set out after the
/// warm-up, 0.6 s for the phase); with 8, 600 to 950 (0.3% out, 11–16
/// ms), with the zipfian misses within 1% (`tests/policy.rs`).
pub(super) const AGING_PER_REFAULT: u64 = 8;

/// Parked pages touched in a row, with no frame claimed in between, that
/// end pressure at once (`Core::calm_by_touches`): the program's working
/// set is all in memory, and each parked page it still has to touch costs
/// a fault. Under pressure a claim comes every few parked touches (the
/// `reclaim` experiment: 5 to 12 page reads per parked-page fault in the
/// hot/cold, uniform and zipfian phases), never a run this long; after the
/// `fits` warm-up the working set touches its parked quarter with no claim
/// at all. (Waiting for a calm stretch of time alone came too late there:
/// the phase is over in a few milliseconds at memory speed.)
pub(super) const PARKED_TOUCHES_CALM: u64 = 32;

/// Parked-page touches a frame claimed cancels on the way to
/// [`PARKED_TOUCHES_CALM`]. A program whose misses are mostly parked pages
/// has its working set in memory even if a few of its pages are still in
/// swap: after the `reclaim` experiment's `fits` warm-up, a quarter of the
/// working set was parked and one page in 45 swapped, about ten parked
/// touches a swap-in; with every claim starting the count again, pressure
/// held through 737 parked-page faults and 693 new deactivations. Under
/// pressure the claims far outnumber them (hot/cold, uniform, zipfian,
/// scan: 0.04 to 0.2 parked touches a frame claimed).
pub(super) const PARKED_TOUCHES_PER_CLAIM: u64 = 4;

/// Passes through the inactive list a sampled page earns when an eviction
/// finds it touched (`Core::evict_touched`): it is not looked at again
/// until it has made them, and then kept only if touched since (a lazy
/// GCLOCK: the reference bit, the page's mapping, accumulates over the
/// passes). Replayed on zipfian traces of 4× the budget, misses over an
/// exact LRU's (θ 0.99, 0.8): 0 passes 1.00×, 1 0.95×, 2 0.92×, 3 0.91×, but
/// with 3 the `reclaim` phases' `fits` evicts after its warm-up (468
/// misses), with 2 or fewer nothing (`tests/policy.rs`).
pub(super) const SAMPLED_TRIPS: u8 = 2;

/// Parked-page touches a page's standing counts at most (see
/// [`standing_pass`]).
pub(super) const STANDING_MAX: u8 = 3;

/// A page's use as the policy keeps it in [`PageMeta::uses`]: the trips
/// past the active list's head it has left (low nibble), and its standing,
/// the parked-page touches it proved since it came into memory (high
/// nibble, at most [`STANDING_MAX`]).
fn trips(m: &PageMeta) -> u8 {
    m.uses & 0x0f
}

fn standing(m: &PageMeta) -> u8 {
    m.uses >> 4
}

fn set_uses(m: &mut PageMeta, trips: u8, standing: u8) {
    debug_assert!(trips <= 0x0f && standing <= STANDING_MAX);
    m.uses = standing << 4 | trips;
}

/// The active list's head page `p` is up for deactivation: whether it
/// gets another trip instead (its referenced bit first, then its
/// earned trips), spending one.
pub(super) fn another_trip(pages: &mut PageTable, p: PageIdx) -> bool {
    let m = pages.get(p);
    if !m.has(pf::REFERENCED) && trips(&m) == 0 {
        return false;
    }
    pages.update(p, |m| {
        if m.has(pf::REFERENCED) {
            m.flags &= !pf::REFERENCED;
        } else {
            set_uses(m, trips(m) - 1, standing(m));
        }
    });
    true
}

/// Whether a resident page's use is proved: its referenced bit or trips
/// it earned. It then waits on the proven list, which aging leaves alone
/// while unproved pages are left and it holds no more than its share
/// (`Core::age_proven`).
pub(super) fn proved(m: &PageMeta) -> bool {
    m.has(pf::REFERENCED) || trips(m) > 0
}

/// A page touched while parked, being mapped back: what it earns.
pub(super) fn touched_parked(m: &mut PageMeta) {
    m.flags |= pf::REFERENCED;
    set_uses(m, PROVEN_TRIPS, (standing(m) + 1).min(STANDING_MAX));
}

/// A page read back from swap `distance` evictions after it was evicted,
/// with `proven` pages on the proven list: whether it was evicted too soon
/// — it would have been found in memory had the proven list been that much
/// smaller — and so comes back as a page in use ([`refaulted_soon`]), as
/// Linux's workingset detection activates a refault whose distance is
/// within its active list. (Without it, a hot page that a stream's
/// read-ahead or a burst of fills pushed out came back with nothing to show
/// for its use, and went again: each page of the `reclaim` experiment's
/// hot set was evicted 2 to 8 times over its phases.)
pub(super) fn refault_earns(distance: u32, proven: u64) -> bool {
    u64::from(distance) <= proven
}

/// A page read back from swap that was evicted too soon
/// ([`refault_earns`]): what it earns, as if touched while parked.
pub(super) fn refaulted_soon(m: &mut PageMeta) {
    touched_parked(m);
}

/// A parked page at the inactive list's head, about to be evicted: whether
/// it makes another pass through the inactive list instead (still parked,
/// so that a touch is still seen), halving its standing: a page the
/// program touched while parked again and again outlives pages touched
/// parked once, whose use may have been a passing one (replayed on
/// zipfian traces of 4× the budget, θ 0.99 and 0.8, misses over an exact
/// LRU's: 1.04× and 1.03× with the pass, 1.09× and 1.06× without).
pub(super) fn standing_pass(pages: &mut PageTable, p: PageIdx) -> bool {
    let m = pages.get(p);
    if standing(&m) == 0 {
        return false;
    }
    pages.update(p, |m| set_uses(m, trips(m), standing(m) / 2));
    true
}

/// A sampled page at the inactive list's head: whether it makes another
/// pass unseen instead of being looked at, spending one of its trips.
pub(super) fn sampled_pass(pages: &mut PageTable, p: PageIdx) -> bool {
    let m = pages.get(p);
    if trips(&m) == 0 {
        return false;
    }
    pages.update(p, |m| set_uses(m, trips(m) - 1, standing(m)));
    true
}

/// A sampled page an eviction found touched: what it earns.
pub(super) fn touched_sampled(m: &mut PageMeta) {
    m.flags &= !pf::REFERENCED;
    set_uses(m, SAMPLED_TRIPS, standing(m));
}

/// A page leaving the LRU or marked cold: it forgets every use it proved.
pub(super) fn forget_use(m: &mut PageMeta) {
    m.flags &= !pf::REFERENCED;
    m.uses = 0;
}

/// Plans (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether reclaim should work ahead of the program (keep free frames
    /// above the executor's watermarks, age pages): only once the budget has
    /// run out under a fault, since it was last less than half full. A
    /// working set that fits the budget never runs it out, and then nothing
    /// is evicted or aged ahead of need — as Linux's memory cgroup, which
    /// reclaims only at its limit. (Keeping 3–6% of the budget free ahead
    /// of need turned a working set equal to the budget into a stream of
    /// evictions and re-faults.)
    pub fn reclaim_ahead(&mut self) -> bool {
        let half_full = self.resident() * 2 >= self.cfg.budget_pages;
        self.pressure.persists(half_full)
    }

    /// How many frames background reclaim should free now, with the
    /// executor's watermarks: once free frames fall below `low`, back up to
    /// `high`, and nothing while they stay between the two otherwise (as
    /// kswapd's watermarks). Only when reclaim works ahead (`reclaim_ahead`).
    /// (Evicting up to `high` whenever a round ran for aging kept 6% of the
    /// budget free for good: a working set of 90% of the budget, the
    /// `reclaim` experiment's `fits`, then had 3.75% left for anything else
    /// and went on evicting.)
    pub fn reclaim_ahead_want(&mut self, low: u64, high: u64) -> u64 {
        if !self.reclaim_ahead() {
            self.pressure.stop_refilling();
            return 0;
        }
        let free = self.free_frames();
        self.pressure.watermark_want(free, low, high)
    }

    /// Ends pressure if it has eased: `mark` is [`Core::calm_mark`] as the
    /// executor read it a calm interval ago, and since then no frame was
    /// claimed, the budget did not run out, no refill to the high watermark
    /// began, and free frames are at or above `low`. Then nothing is aged or reclaimed ahead until
    /// the budget runs out again, and the pages reclaim parked go back
    /// (`unpark_plan`): a working set that fits after a pressure phase runs
    /// at memory speed, where each parked page would cost it a fault when
    /// touched (the `reclaim` experiment's `fits`: 57 minor faults per
    /// 1,000 touches in `tests/policy.rs`'s replay, and a hundredth of the
    /// unlimited kernel's throughput). Returns whether it ended.
    pub fn ease_if_calm(&mut self, mark: u64, low: u64) -> bool {
        let calm = self.unpark_due()
            && (mark == self.pressure.calm_mark() || self.calm_by_touches())
            && !self.pressure.refilling()
            && self.free_frames() >= low;
        if calm {
            self.pressure.ease();
        }
        calm
    }
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    /// Whether aging takes its next page from the proven list (never when
    /// it is empty): when the active list (unproved pages) is empty, when
    /// the proven list holds more than its target, and while pages read
    /// back from swap soon after their eviction ask for it
    /// (`AGING_PER_REFAULT`; Linux deactivates active pages after refaults'
    /// activations likewise).
    /// Otherwise a stream of new pages passes the proven ones by: aging
    /// from one list, the `reclaim` experiment's `fits` warm-up — 13,000
    /// pages read once — sent its hot set, touched mapped and so unseen
    /// since the scan before, through the inactive list and evicted a
    /// quarter of it.
    pub(super) fn age_proven(&self) -> bool {
        let proven = self.lru.proven_len() as u64;
        proven > 0 && (self.lru.active_len() == 0 || self.pressure.activated() > 0 || proven > self.proven_target())
    }

    /// The proven list's target: a quarter of the budget. (Half, Linux's
    /// share for its active list below 1 GiB, kept the stale pages of
    /// earlier phases through the `reclaim` experiment's `fits` warm-up:
    /// 1,296 evictions after it in `tests/policy.rs`'s replay; an eighth
    /// missed 1.16× an exact LRU's misses on a zipfian trace.)
    pub(super) fn proven_target(&self) -> u64 {
        (self.cfg.budget_pages / 4).max(1)
    }

    /// The inactive list's target length: a quarter of the budget.
    pub fn inactive_target(&self) -> u64 {
        (self.cfg.budget_pages / 4).max(1)
    }

    /// How long the inactive list may grow in this round: to its target,
    /// but by at most [`AGING_PER_CLAIM`] pages per frame claimed since the
    /// last round (a round that also frees frames deactivates what it must
    /// beyond this).
    pub(super) fn refill_target(&self) -> u64 {
        self.inactive_target()
            .min(self.pages.census().inactive.saturating_add(AGING_PER_CLAIM.saturating_mul(self.pressure.demand())))
    }

    /// Whether pressure's end would map pages back: reclaim parked pages
    /// since it last eased, or the budget ran out, and pages are parked.
    /// The executor then watches for a calm interval (`ease_if_calm`).
    pub fn unpark_due(&self) -> bool {
        (self.pressure.under() || self.pressure.aged()) && self.pages.census().inactive > 0
    }

    /// Whether pressure looks over without waiting for a calm stretch: the
    /// program touched `PARKED_TOUCHES_CALM` (32) parked pages in a row with no
    /// frame claimed in between (its working set is in memory, parked or
    /// mapped). [`Core::ease_if_calm`] then ends it whatever mark it is
    /// given; the executor asks as soon as a fill makes this true.
    pub fn calm_by_touches(&self) -> bool {
        self.unpark_due() && self.pressure.touched_unclaimed() >= PARKED_TOUCHES_CALM
    }

    /// The mark [`Core::ease_if_calm`] compares: it changes whenever frames
    /// are claimed, the budget runs out or a refill to the high watermark
    /// begins.
    pub fn calm_mark(&self) -> u64 {
        self.pressure.calm_mark()
    }

    /// Whether the inactive list should be refilled ahead of need: once the
    /// budget is half full, pages start aging (deactivation, no eviction), so
    /// that the first evictions come from a list the program has had time
    /// to touch — the hot pages prove themselves before any page leaves.
    pub fn needs_aging(&self) -> bool {
        // Only with swap: without it nothing aged could be evicted but
        // volatile pages, which are purged when pressure comes anyway, and
        // parking them early only costs the program minor faults. Only under
        // pressure: a working set that fits is never aged (each aged page
        // costs a minor fault when touched, for no eviction to come). Only
        // with demand: once frames are claimed again since the last refill
        // (a working set that fits after pressure claims none, and aging
        // it turned a fifth of its touches into minor faults: `fits`).
        self.pressure.under()
            && self.pressure.demand() > 0
            && self.swap.capacity() > 0
            && self.resident() * 2 >= self.cfg.budget_pages
            && self.pages.census().inactive < self.inactive_target()
            && self.lru.active_len() + self.lru.proven_len() > 0
    }
}
