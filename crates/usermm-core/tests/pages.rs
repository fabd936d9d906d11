//! Page-state tests: the fault, reclaim and zap plans, their failure paths,
//! and the LRU's "hot set survives a cold scan" property. The test acts as
//! the executor; `draw_pages` shows `_` absent, `R` resident, `I` inactive
//! (parked in staging), `S` swapped, `*` busy, `.` unmapped.

mod common;

use common::*;
use usermm_core::consts::*;
use usermm_core::page::{pf, PState};
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, MmapReply, PageIdx, PageRange, Transfer, STREAM_GAP_PAGES};

fn fault(c: &mut Core, p: u64, write: bool) -> FaultPlan {
    let plan = c.fault(Addr(at(p)), write);
    validate_planned(c, &plan);
    plan
}

fn state(c: &Core, p: u64) -> PState {
    c.page(PageIdx(p)).state
}

/// Maps `n` pages at 0 and makes all of them resident.
fn full(c: &mut Core, n: u64) {
    map_at(c, 0, n);
    for p in 0..n {
        assert!(matches!(touch(c, p, true), Touch::Served(_)));
    }
}

#[test]
fn fault_on_an_absent_page_zero_fills_it() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let plan = fault(&mut c, 1, true);
    assert_eq!(plan, FaultPlan::ZeroFill { run: PageRange::new(1, 2) });
    assert_eq!(draw_pages(&c, 0, 5), "_*__.");
    assert_eq!(c.stats().resident_pages, 1, "the frame is charged while filling");
    c.fill_done(&plan, 1);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 5), "_R__.");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.counters.zero_fills, s.counters.faults), (1, 1, 1));
    // A second fault on it (a race, or a page dropped behind usermm's back)
    // refills it: the copy installs nothing where the page is there.
    let plan = fault(&mut c, 1, true);
    assert_eq!(plan, FaultPlan::Refill { page: PageIdx(1) });
    c.fill_done(&plan, 0);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 5), "_R__.");
    // A read fault fills too.
    assert!(matches!(fault(&mut c, 2, false), FaultPlan::ZeroFill { .. }));
}

#[test]
fn a_failed_zero_fill_leaves_the_page_absent() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let plan = fault(&mut c, 0, true);
    c.fill_done(&plan, 0);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 4), "____");
    assert_eq!(c.stats().resident_pages, 0);
}

#[test]
fn faults_that_are_not_served() {
    let mut c = core();
    map_at(&mut c, 0, 2);
    mmap(&mut c, at(2), PS, PROT_READ, ANON | MAP_FIXED).unwrap();
    mmap(&mut c, at(3), PS, PROT_NONE, ANON | MAP_FIXED).unwrap();
    mmap(&mut c, at(4), PS, PROT_EXEC, ANON | MAP_FIXED).unwrap();
    // Unmapped: the executor makes the page PROT_NONE (munmap leaves the
    // host protection as it was). Outside the reservation, wrong
    // protection: wake (the retry takes SIGSEGV from the kernel).
    assert_eq!(fault(&mut c, 10, false), FaultPlan::Segv { gap: PageRange::new(5, 1024) });
    assert_eq!(c.fault(Addr(BASE - PS), false), FaultPlan::Wake);
    assert_eq!(fault(&mut c, 2, true), FaultPlan::Wake);
    assert_eq!(fault(&mut c, 3, false), FaultPlan::Wake);
    assert_eq!(fault(&mut c, 4, true), FaultPlan::Wake);
    assert_eq!(draw_pages(&c, 0, 6), "_____.");
    assert_eq!(c.stats().resident_pages, 0);
    // A read of the read-only page is served, and a read fault (a load or
    // an instruction fetch) of the exec-only one: the kernel reports one
    // only where the protection lets it through (issue 71 item 3: woken
    // instead, the thread faulted again for good).
    assert!(matches!(fault(&mut c, 2, false), FaultPlan::ZeroFill { .. }));
    assert!(matches!(fault(&mut c, 4, false), FaultPlan::ZeroFill { .. }));
}

#[test]
fn a_full_budget_asks_for_reclaim() {
    let mut c = core();
    full(&mut c, 16);
    map_at(&mut c, 16, 4);
    assert_eq!(c.stats().resident_pages, 16);
    assert_eq!(fault(&mut c, 17, true), FaultPlan::Reclaim { want: c.direct_reclaim_batch(false) });
    assert_eq!(state(&c, 17), PState::Absent);
    assert_eq!(c.stats().resident_pages, 16);
}

#[test]
fn reclaim_deactivates_first_then_evicts_the_oldest() {
    let mut c = core();
    full(&mut c, 16);
    let plan = c.reclaim_plan(1);
    c.validate();
    // Nothing is inactive yet: the first plan only refills the inactive list,
    // up to its target (a quarter of the budget), oldest pages first.
    assert!(plan.evict.is_empty());
    assert_eq!(plan.deactivate.len(), 4);
    assert!(plan.deactivate.iter().all(|d| d.how == Transfer::Move));
    assert_eq!(draw_pages(&c, 0, 16), "****RRRRRRRRRRRR");
    for d in &plan.deactivate {
        c.deactivate_done(d, true);
    }
    c.validate();
    assert_eq!(draw_pages(&c, 0, 16), "IIIIRRRRRRRRRRRR");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages), (16, 4), "inactive pages still hold frames");

    let plan = c.reclaim_plan(1);
    assert!(plan.deactivate.is_empty(), "the inactive list is at its target");
    assert_eq!(plan.evict.len(), 1);
    let e = &plan.evict[0];
    assert_eq!(e.page, PageIdx(0), "the oldest inactive page goes first");
    let slot0 = c.page(PageIdx(0)).slot;
    assert_eq!(e.staging, slot0);
    c.evict_done(e, true);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 16), "SIIIRRRRRRRRRRRR");
    assert_eq!(c.page(PageIdx(0)).slot, e.swap);
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages, s.swapped_pages), (15, 3, 1));
    assert_eq!((s.counters.swapouts, s.counters.evictions, s.counters.deactivations), (1, 1, 4));
    assert_eq!(c.free_frames(), 1);
}

#[test]
fn a_fault_on_an_inactive_page_reactivates_it() {
    let mut c = core();
    full(&mut c, 4);
    madvise(&mut c, at(0), pages(4), MADV_COLD).unwrap();
    assert_eq!(draw_pages(&c, 0, 4), "IIII");
    let slot = c.page(PageIdx(2)).slot;
    let plan = fault(&mut c, 2, false);
    assert_eq!(plan, FaultPlan::Reactivate { page: PageIdx(2), slot, how: Transfer::Move, checked: false, wp: false });
    assert_eq!(draw_pages(&c, 0, 4), "II*I");
    c.fill_done(&plan, 1);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 4), "IIRI");
    assert!(c.page(PageIdx(2)).has(pf::REFERENCED));
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages, s.counters.minor_faults, s.counters.major_faults), (4, 3, 1, 0));

    // A page touched while parked waits on the proven list: the next
    // reclaim pass parks the page not yet proved and passes it by.
    map_at(&mut c, 4, 1);
    touch(&mut c, 4, true);
    let plan = c.reclaim_plan(1);
    let deact: Vec<u64> = plan.deactivate.iter().map(|d| d.page.0).collect();
    assert_eq!(deact, vec![4]);
    assert_eq!(plan.evict.iter().map(|e| e.page.0).collect::<Vec<_>>(), vec![0]);
    assert!(c.page(PageIdx(2)).has(pf::REFERENCED), "the proven page was not looked at");
    for d in &plan.deactivate {
        c.deactivate_done(d, true);
    }
    for e in &plan.evict {
        c.evict_done(e, true);
    }
    c.validate();
    assert_eq!(draw_pages(&c, 0, 5), "SIRII");
}

#[test]
fn reactivation_of_a_read_only_page_is_a_copy() {
    let mut c = core();
    mmap(&mut c, at(0), pages(2), PROT_READ, ANON | MAP_FIXED).unwrap();
    touch(&mut c, 0, false);
    let plan = c.reclaim_plan(1);
    assert_eq!(plan.deactivate.len(), 1);
    assert_eq!(plan.deactivate[0].how, Transfer::Copy { readable: true });
    c.deactivate_done(&plan.deactivate[0], true);
    c.validate();
    assert!(matches!(fault(&mut c, 0, false), FaultPlan::Reactivate { how: Transfer::Copy { readable: true }, .. }));
}

#[test]
fn a_fault_on_a_swapped_page_swaps_it_in() {
    let mut c = core();
    full(&mut c, 4);
    madvise(&mut c, at(0), pages(2), MADV_PAGEOUT).unwrap();
    assert_eq!(draw_pages(&c, 0, 4), "SSRR");
    let slot = c.page(PageIdx(1)).slot;
    let plan = fault(&mut c, 1, false);
    assert_eq!(plan, FaultPlan::SwapIn { run: PageRange::new(1, 2), slot, keep: false });
    assert_eq!(c.stats().resident_pages, 3, "the frame is charged while reading");
    c.fill_done(&plan, 1);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 4), "SRRR");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.swapped_pages, s.counters.swapins, s.counters.major_faults), (3, 1, 1, 1));
}

/// Swaps out pages `[0, n)` of a full mapping in address order; returns
/// their slots (consecutive, as one eviction writes them).
fn swapped_in_order(c: &mut Core, n: u64) -> Vec<u32> {
    full(c, n);
    madvise(c, at(0), pages(n), MADV_PAGEOUT).unwrap();
    let slots: Vec<u32> = (0..n).map(|p| c.page(PageIdx(p)).slot).collect();
    assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "PAGEOUT wrote the pages in order: {slots:?}");
    slots
}

/// Serves a planned swap-in in full; returns its run.
fn swap_in(c: &mut Core, p: u64) -> PageRange {
    let plan = fault(c, p, false);
    let FaultPlan::SwapIn { run, slot, .. } = plan else { panic!("page {p}: {plan:?}") };
    assert_eq!(slot, c.page(run.start).slot, "the plan names the run's first slot");
    assert!(run.contains(PageIdx(p)));
    c.fill_done(&plan, run.pages());
    c.validate();
    run
}

#[test]
fn a_swap_in_stream_reads_ahead_forwards() {
    let mut c = core();
    swapped_in_order(&mut c, 16);
    // One page, then the window doubles at each fault where the last run ended.
    assert_eq!(swap_in(&mut c, 0), PageRange::new(0, 1));
    assert_eq!(swap_in(&mut c, 1), PageRange::new(1, 3));
    assert_eq!(swap_in(&mut c, 3), PageRange::new(3, 7));
    assert_eq!(swap_in(&mut c, 7), PageRange::new(7, 15));
}

#[test]
fn a_swap_in_far_from_every_stream_reads_its_page_alone() {
    let mut c = Core::new(CoreConfig { budget_pages: 128, swap_slots: 128, staging_slots: 128, ..cfg() });
    swapped_in_order(&mut c, 128);
    assert_eq!(swap_in(&mut c, 0), PageRange::new(0, 1));
    assert_eq!(swap_in(&mut c, 1), PageRange::new(1, 3));
    // More than `STREAM_GAP_PAGES` past the stream's end: a stream of its own.
    assert_eq!(swap_in(&mut c, 3 + STREAM_GAP_PAGES), PageRange::new(3 + STREAM_GAP_PAGES, 4 + STREAM_GAP_PAGES));
    // Within it (a walk that skips resident pages): the stream goes on.
    assert_eq!(
        swap_in(&mut c, 3 + STREAM_GAP_PAGES - 1),
        PageRange::new(3 + STREAM_GAP_PAGES - 1, 3 + STREAM_GAP_PAGES)
    );
}

#[test]
fn a_swap_in_stream_reads_ahead_backwards() {
    let mut c = core();
    swapped_in_order(&mut c, 16);
    // A program walking its pages downwards (freeing a list from its end):
    // the window doubles at each fault just before the last run, and grows
    // downwards.
    assert_eq!(swap_in(&mut c, 15), PageRange::new(15, 16));
    assert_eq!(swap_in(&mut c, 14), PageRange::new(13, 15));
    assert_eq!(swap_in(&mut c, 12), PageRange::new(9, 13));
    assert_eq!(swap_in(&mut c, 8), PageRange::new(1, 9));
    assert_eq!(swap_in(&mut c, 0), PageRange::new(0, 1), "the window stops at the region's start");
    assert_eq!(draw_pages(&c, 0, 16), "RRRRRRRRRRRRRRRR");
    let s = c.stats();
    assert_eq!((s.counters.swapins, s.counters.major_faults), (16, 5));
}

/// Two streams through one region in step (CPython walking a dict's table
/// and the objects it points to): each keeps its growing window.
#[test]
fn interleaved_swap_in_streams_each_read_ahead() {
    let mut c = Core::new(CoreConfig { budget_pages: 256, swap_slots: 256, staging_slots: 256, ..cfg() });
    swapped_in_order(&mut c, 256);
    assert_eq!(swap_in(&mut c, 0), PageRange::new(0, 1));
    assert_eq!(swap_in(&mut c, 128), PageRange::new(128, 129));
    assert_eq!(swap_in(&mut c, 1), PageRange::new(1, 3));
    assert_eq!(swap_in(&mut c, 129), PageRange::new(129, 131));
    assert_eq!(swap_in(&mut c, 3), PageRange::new(3, 7));
    assert_eq!(swap_in(&mut c, 131), PageRange::new(131, 135));
    assert_eq!(swap_in(&mut c, 7), PageRange::new(7, 15));
    assert_eq!(swap_in(&mut c, 135), PageRange::new(135, 143));
    // A fault far from both starts a third stream with one page; the two
    // lose one step of their windows and go on growing.
    assert_eq!(swap_in(&mut c, 64), PageRange::new(64, 65));
    assert_eq!(swap_in(&mut c, 15), PageRange::new(15, 23));
    assert_eq!(swap_in(&mut c, 143), PageRange::new(143, 151));
    assert_eq!(swap_in(&mut c, 23), PageRange::new(23, 39));
}

#[test]
fn a_backward_swap_in_stops_at_a_slot_out_of_order() {
    let mut c = core();
    swapped_in_order(&mut c, 8);
    // Page 5 swapped again: it takes a new slot, out of the run's order.
    assert_eq!(swap_in(&mut c, 5), PageRange::new(5, 6));
    madvise(&mut c, at(5), PS, MADV_PAGEOUT).unwrap();
    assert_eq!(swap_in(&mut c, 7), PageRange::new(7, 8));
    assert_eq!(swap_in(&mut c, 6), PageRange::new(6, 7), "page 5's slot does not follow page 6's");
}

/// A reclaim round's evictions take their slots in address order, whatever
/// the order the LRU holds the pages in, and a clean page (its swap copy
/// exact) beside a rewritten one is rewritten with it, so that a stream
/// reads back with one read in either direction.
#[test]
fn a_rounds_evictions_take_slots_in_address_order() {
    for descending in [false, true] {
        let mut c = core();
        c.set_tracks_writes(true);
        full(&mut c, 8);
        // Page 3: a clean page with a swap copy (swapped out, read back).
        madvise(&mut c, at(3), PS, MADV_PAGEOUT).unwrap();
        let plan = fault(&mut c, 3, false);
        assert!(matches!(plan, FaultPlan::SwapIn { keep: true, .. }), "{plan:?}");
        c.fill_done(&plan, 1);
        let copy = c.page(PageIdx(3)).cache;
        assert_ne!(copy, 0, "page 3 keeps its swap copy");
        let order: Vec<u64> = if descending { (0..8).rev().collect() } else { (0..8).collect() };
        for &p in &order {
            madvise(&mut c, at(p), PS, MADV_COLD).unwrap();
        }
        assert_eq!(draw_pages(&c, 0, 8), "IIIIIIII");
        let plan = c.reclaim_plan(8);
        assert_eq!(plan.evict.len(), 8, "descending {descending}");
        assert!(plan.evict.iter().all(|e| !e.clean), "page 3 is rewritten beside its dirty neighbours");
        for e in &plan.evict {
            c.evict_done(e, true);
        }
        c.validate();
        let slots: Vec<u32> = (0..8).map(|p| c.page(PageIdx(p)).slot).collect();
        assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "descending {descending}: {slots:?}");
        assert_eq!(c.stats().swapped_pages, 8);
        // Walked from the top down, the stream reads back in growing runs
        // that end at the faulting page: 8 pages in 4 faults at most.
        let (mut top, mut faults) = (8, 0);
        while top > 0 {
            let run = swap_in(&mut c, top - 1);
            assert_eq!(run.end, PageIdx(top), "descending {descending}");
            top = run.start.0;
            faults += 1;
        }
        assert!(faults <= 4, "descending {descending}: {faults} faults");
    }
}

/// One round of a page's life in the swap cache: swapped out (its copy, if
/// any, evicted clean), read back by a fault, then written (`write`) or
/// not. Returns whether the swap-in kept a copy.
fn swap_round(c: &mut Core, p: u64, write: bool) -> bool {
    madvise(c, at(p), PS, MADV_PAGEOUT).unwrap();
    assert_eq!(state(c, p), PState::Swapped);
    let plan = fault(c, p, false);
    let FaultPlan::SwapIn { keep, .. } = plan else { panic!("{plan:?}") };
    c.fill_done(&plan, 1);
    if write && keep {
        let plan = c.wp_fault(Addr(at(p)));
        assert_eq!(plan, FaultPlan::Unprotect { page: PageIdx(p) });
        c.fill_done(&plan, 1);
        assert_eq!(c.page(PageIdx(p)).cache, 0, "a write drops the copy");
    }
    c.validate();
    keep
}

/// A region whose swap copies are written before they are evicted stops
/// keeping them (each would cost a WP fault and save no write), but for
/// one swap-in in `PROBE_EVERY`; a region whose pages are only read keeps
/// them all; and a region that stops writing gets them back.
#[test]
fn swap_copies_are_kept_where_they_are_evicted_clean() {
    use usermm_core::region::CopyFeedback;
    let mut c = core();
    c.set_tracks_writes(true);
    full(&mut c, 1);
    // Page 0 is written after every swap-in.
    let kept: Vec<bool> = (0..200).map(|_| swap_round(&mut c, 0, true)).collect();
    assert!(kept[0], "copies are kept while nothing is known");
    let probe = CopyFeedback::PROBE_EVERY as usize;
    assert!(kept.iter().enumerate().all(|(i, &k)| k == (i % probe == 0)), "only probes keep a copy: {kept:?}");
    // Page 4, in a region of its own, is only read: every copy is evicted
    // clean.
    map_at(&mut c, 4, 1);
    assert!(matches!(touch(&mut c, 4, true), Touch::Served(_)));
    let read_only: Vec<bool> = (0..200).map(|_| swap_round(&mut c, 4, false)).collect();
    assert!(read_only[1..].iter().all(|&k| k), "a read-only region keeps every copy");
    assert!(c.stats().counters.clean_evictions >= 199);
    // Page 0 stops writing: its probes are evicted clean and copies come
    // back within a window of outcomes.
    let back: Vec<bool> = (0..CopyFeedback::WINDOW as usize * 4).map(|_| swap_round(&mut c, 0, false)).collect();
    assert!(back[back.len() - 10..].iter().all(|&k| k), "copies come back when they pay");
}

#[test]
fn a_swapped_page_with_a_full_budget_asks_for_reclaim_first() {
    let mut c = core();
    full(&mut c, 16);
    madvise(&mut c, at(0), PS, MADV_PAGEOUT).unwrap();
    map_at(&mut c, 16, 1);
    touch(&mut c, 16, true);
    assert_eq!(fault(&mut c, 0, false), FaultPlan::Reclaim { want: c.direct_reclaim_batch(false) });
    assert_eq!(state(&c, 0), PState::Swapped);
    assert!(matches!(touch(&mut c, 0, false), Touch::Served(_)));
    assert_eq!(state(&c, 0), PState::Resident);
    assert!(c.stats().resident_pages <= 16);
}

#[test]
fn a_failed_swap_in_leaves_the_page_swapped_with_its_slot() {
    let mut c = core();
    full(&mut c, 2);
    madvise(&mut c, at(0), PS, MADV_PAGEOUT).unwrap();
    let slot = c.page(PageIdx(0)).slot;
    let plan = fault(&mut c, 0, true);
    assert_eq!(plan, FaultPlan::SwapIn { run: PageRange::new(0, 1), slot, keep: false });
    c.fill_done(&plan, 0);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 2), "SR");
    assert_eq!(c.page(PageIdx(0)).slot, slot);
    let s = c.stats();
    assert_eq!((s.resident_pages, s.swapped_pages, s.counters.swap_read_errors, s.counters.swapins), (1, 1, 1, 0));
    // The retry reads the same slot.
    assert_eq!(fault(&mut c, 0, true), FaultPlan::SwapIn { run: PageRange::new(0, 1), slot, keep: false });
}

#[test]
fn a_failed_eviction_keeps_the_page_resident_and_releases_the_swap_slot() {
    let mut c = core();
    full(&mut c, 2);
    madvise(&mut c, at(0), pages(2), MADV_COLD).unwrap();
    let staging = c.page(PageIdx(0)).slot;
    let evs = c.evict_pages(&[PageIdx(0)]);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].staging, staging);
    assert_eq!(draw_pages(&c, 0, 2), "*I");
    c.evict_done(&evs[0], false);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 2), "II");
    assert_eq!(c.page(PageIdx(0)).slot, staging, "still parked in its staging slot");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages, s.swapped_pages), (2, 2, 0));
    assert_eq!((s.counters.swap_write_errors, s.counters.swapouts), (1, 0));
    // It can still be reactivated, or evicted later.
    let evs = c.evict_pages(&[PageIdx(0)]);
    c.evict_done(&evs[0], true);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 2), "SI");
}

#[test]
fn failed_eviction_slots_are_reusable() {
    // With 2 swap slots, failing every eviction must not leak them.
    let mut c = Core::new(CoreConfig { swap_slots: 2, ..cfg() });
    full(&mut c, 4);
    madvise(&mut c, at(0), pages(4), MADV_COLD).unwrap();
    for _ in 0..10 {
        let evs = c.evict_pages(&[PageIdx(0), PageIdx(1)]);
        assert_eq!(evs.len(), 2);
        for e in &evs {
            c.evict_done(e, false);
        }
        c.validate();
    }
    let evs = c.evict_pages(&[PageIdx(0), PageIdx(1), PageIdx(2)]);
    assert_eq!(evs.len(), 2, "two slots, two evictions");
    for e in &evs {
        c.evict_done(e, true);
    }
    c.validate();
    assert_eq!(draw_pages(&c, 0, 4), "SSII");
}

#[test]
fn a_failed_deactivation_keeps_the_page_mapped() {
    let mut c = core();
    full(&mut c, 2);
    let ds = c.deactivate_range(PageRange::new(0, 2));
    assert_eq!(ds.len(), 2);
    c.deactivate_done(&ds[0], false);
    c.deactivate_done(&ds[1], true);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 2), "RI");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages), (2, 1));
}

#[test]
fn a_fault_on_a_busy_page_waits() {
    let mut c = core();
    full(&mut c, 4);
    map_at(&mut c, 4, 1);
    // Filling.
    let fill = c.fault(Addr(at(4)), true);
    assert_eq!(c.fault(Addr(at(4)), false), FaultPlan::Busy);
    // Deactivating.
    let ds = c.deactivate_range(PageRange::new(0, 1));
    assert_eq!(c.fault(Addr(at(0)), false), FaultPlan::Busy);
    c.deactivate_done(&ds[0], true);
    // Evicting.
    let evs = c.evict_pages(&[PageIdx(0)]);
    assert_eq!(c.fault(Addr(at(0)), false), FaultPlan::Busy);
    // Zapping.
    let claim = c.zap_begin(PageRange::new(1, 2)).unwrap();
    assert_eq!(c.fault(Addr(at(1)), false), FaultPlan::Busy);
    // A zap over a busy page must wait too.
    assert!(c.zap_begin(PageRange::new(0, 1)).is_err());
    assert!(c.zap_begin(PageRange::new(4, 5)).is_err());
    assert_eq!(draw_pages(&c, 0, 5), "**RR*");
    c.zap_end(&claim);
    c.evict_done(&evs[0], true);
    c.fill_done(&fill, 1);
    c.validate();
    assert_eq!(draw_pages(&c, 0, 5), "S_RRR");
}

#[test]
fn a_fault_in_a_range_being_unmapped_is_segv() {
    let mut c = core();
    full(&mut c, 4);
    let d = c.munmap(at(1), pages(2)).unwrap().expect("detached");
    c.validate();
    assert_eq!(d.ranges, vec![PageRange::new(1, 3)]);
    assert_eq!(draw(&c, 0, 4), "A..B");
    // The pages are still there until the zap; a touch must not see zeros.
    assert_eq!(fault(&mut c, 1, false), FaultPlan::Segv { gap: PageRange::new(1, 3) });
    assert_eq!(fault(&mut c, 2, true), FaultPlan::Segv { gap: PageRange::new(1, 3) });
    assert_eq!(state(&c, 1), PState::Resident);
    // MAP_FIXED over the held range waits for the zap.
    assert!(matches!(c.mmap(at(2), PS, RW, ANON | MAP_FIXED), Ok(MmapReply::Busy)));
    for r in &d.ranges {
        zap(&mut c, *r);
    }
    assert_eq!(fault(&mut c, 1, false), FaultPlan::Segv { gap: PageRange::new(1, 3) }, "held until unhold");
    c.unhold(&d);
    c.validate();
    // Unmapped: the executor left the host protection as it was (no
    // mprotect on munmap), so a touch still reaches the core — and is SIGSEGV.
    assert_eq!(fault(&mut c, 1, false), FaultPlan::Segv { gap: PageRange::new(1, 3) });
    assert_eq!(c.stats().resident_pages, 2);
    assert!(matches!(c.mmap(at(2), PS, RW, ANON | MAP_FIXED), Ok(MmapReply::Done(_))));
    c.validate();
}

#[test]
fn reclaim_skips_a_page_being_unmapped() {
    let mut c = core();
    full(&mut c, 4);
    madvise(&mut c, at(0), pages(4), MADV_COLD).unwrap();
    let d = c.munmap(at(0), pages(2)).unwrap().unwrap();
    let plan = c.reclaim_plan(4);
    let ev: Vec<u64> = plan.evict.iter().map(|e| e.page.0).collect();
    assert_eq!(ev, vec![2, 3]);
    for e in &plan.evict {
        c.evict_done(e, true);
    }
    for r in &d.ranges {
        zap(&mut c, *r);
    }
    c.unhold(&d);
    c.validate();
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages, s.swapped_pages), (0, 0, 2));
}

#[test]
fn dontneed_drops_resident_inactive_and_swapped_pages() {
    let mut c = core();
    full(&mut c, 6);
    madvise(&mut c, at(0), pages(2), MADV_COLD).unwrap();
    madvise(&mut c, at(2), pages(2), MADV_PAGEOUT).unwrap();
    assert_eq!(draw_pages(&c, 0, 6), "IISSRR");
    madvise(&mut c, at(1), pages(4), MADV_DONTNEED).unwrap();
    assert_eq!(draw_pages(&c, 0, 6), "I____R");
    let s = c.stats();
    assert_eq!((s.resident_pages, s.inactive_pages, s.swapped_pages), (2, 1, 0));
    // WILLNEED reads swapped pages back.
    madvise(&mut c, at(0), pages(6), MADV_PAGEOUT).unwrap();
    assert_eq!(draw_pages(&c, 0, 6), "S____S");
    madvise(&mut c, at(0), pages(6), MADV_WILLNEED).unwrap();
    assert_eq!(draw_pages(&c, 0, 6), "R____R");
}

#[test]
fn with_swap_full_a_fault_gets_no_frame() {
    let mut c = Core::new(CoreConfig { swap_slots: 4, ..cfg() });
    map_at(&mut c, 0, 40);
    for p in 0..20 {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)), "page {p}");
    }
    assert_eq!(c.stats().swapped_pages, 4);
    assert_eq!(touch(&mut c, 20, true), Touch::Oom);
    assert_eq!(c.stats().counters.oom_sigbus, 1);
    assert!(c.stats().resident_pages <= 16);
    // Dropping some memory makes room again.
    madvise(&mut c, at(0), pages(20), MADV_DONTNEED).unwrap();
    assert!(matches!(touch(&mut c, 20, true), Touch::Served(_)));
}

#[test]
fn without_swap_nothing_is_reclaimed() {
    let mut c = Core::new(CoreConfig { swap_slots: 0, ..cfg() });
    full(&mut c, 16);
    map_at(&mut c, 16, 1);
    assert!(c.reclaim_plan(16).is_empty());
    assert!(c.deactivate_range(PageRange::new(0, 16)).is_empty());
    assert_eq!(touch(&mut c, 16, true), Touch::Oom);
    assert_eq!(draw_pages(&c, 0, 17), "RRRRRRRRRRRRRRRR_");
}

/// Runs the hot/cold scan: 4 hot pages touched between every access of 100
/// cold pages streamed once each. `native_reclaim` serves a `Reclaim` the
/// way the native executor does (at least 16 frames, up to 4 plans in a row);
/// otherwise one plan of `want` frames. Returns (hot swap-ins, cold swap-outs).
fn hot_cold(native_reclaim: bool) -> (u64, u64) {
    let mut c = Core::new(CoreConfig { swap_slots: 256, ..cfg() });
    let hot = [0u64, 1, 2, 3];
    map_at(&mut c, 0, 4);
    map_at(&mut c, 10, 100);
    let mut hot_swapins = 0;
    let cold_done = std::cell::Cell::new(0u64);
    let serve = |c: &mut Core, p: u64, hot_swapins: &mut u64| {
        let mut idle = 0;
        loop {
            let plan = c.fault(Addr(at(p)), true);
            validate_planned(c, &plan);
            match plan {
                FaultPlan::Wake => return,
                FaultPlan::Reclaim { want } => {
                    let (want, rounds) = if native_reclaim { (want, 4) } else { (1, 1) };
                    let mut freed = 0;
                    for _ in 0..rounds {
                        let plan = c.reclaim_plan(want - freed);
                        if plan.is_empty() {
                            break;
                        }
                        for d in &plan.deactivate {
                            c.deactivate_done(d, true);
                        }
                        for e in &plan.evict {
                            c.evict_done(e, true);
                        }
                        freed += plan.evict.len() as u64;
                        c.validate();
                        if freed > 0 {
                            break;
                        }
                    }
                    idle += 1;
                    assert!(idle < 100, "no progress");
                }
                FaultPlan::ZeroFill { run } => c.fill_done(&plan, run.pages()),
                FaultPlan::SwapIn { run, .. } => {
                    if p >= 10 + WARMUP_COLD_PAGES || (p < 10 && cold_done.get() >= WARMUP_COLD_PAGES) {
                        *hot_swapins += hot.iter().filter(|h| run.contains(PageIdx(**h))).count() as u64;
                    }
                    c.fill_done(&plan, run.pages());
                }
                FaultPlan::Reactivate { .. } => c.fill_done(&plan, 1),
                // Faulted in by the plan before: the page is there.
                FaultPlan::Refill { .. } => {
                    c.fill_done(&plan, 0);
                    return;
                }
                other => panic!("unexpected {other:?}"),
            }
            c.validate();
        }
    };
    for &h in &hot {
        serve(&mut c, h, &mut hot_swapins);
    }
    for cold in 10..110 {
        serve(&mut c, cold, &mut hot_swapins);
        cold_done.set(cold - 10 + 1);
        // The program touches its hot set: a resident page costs nothing
        // (the core does not see it); any other state is a fault.
        for &h in &hot {
            if state(&c, h) != PState::Resident {
                serve(&mut c, h, &mut hot_swapins);
            }
        }
        assert!(c.stats().resident_pages <= 16);
    }
    (hot_swapins, c.stats().counters.swapouts)
}

/// When the budget first fills, the core has seen every page touched exactly
/// once (a touch of a resident page is invisible) and the hot pages are the
/// oldest, so the first reclaim may evict them: it has no recency to go by.
/// From then on the hot pages are deactivated, touched, and reactivated with
/// their referenced bit, and must never reach swap again.
const WARMUP_COLD_PAGES: u64 = 16;

#[test]
fn the_hot_set_survives_a_cold_scan() {
    let (hot_swapins, swapouts) = hot_cold(false);
    assert_eq!(hot_swapins, 0, "a hot page was evicted to swap after warm-up");
    assert!(swapouts >= 100 - 16, "the cold pages were evicted ({swapouts} swap-outs)");
}

/// The native executor serves a `Reclaim` with the core's `want` and up to four
/// plans in a row, while the faulting program is blocked. With a budget of
/// 16 the inactive target was once the whole budget, so one plan deactivated
/// every unreferenced page and the next evicted them before the program could
/// touch them. The target is now a quarter of the budget and the direct
/// reclaim batch `direct_reclaim_batch(false)`.
#[test]
fn the_hot_set_survives_a_cold_scan_with_native_batch_reclaim() {
    let (hot_swapins, swapouts) = hot_cold(true);
    assert_eq!(hot_swapins, 0, "a hot page was evicted to swap after warm-up");
    assert!(swapouts >= 100 - 16, "the cold pages were evicted ({swapouts} swap-outs)");
}

/// The protocol makes a claimed page a valid state between a plan and its
/// `*_done`; `validate` must hold there too (the brief: after every step).
#[test]
fn validate_accepts_a_swap_in_in_flight() {
    let mut c = core();
    full(&mut c, 2);
    madvise(&mut c, at(0), PS, MADV_PAGEOUT).unwrap();
    let plan = c.fault(Addr(at(0)), false);
    assert!(matches!(plan, FaultPlan::SwapIn { .. }));
    c.validate();
    c.fill_done(&plan, 1);
    c.validate();
}

#[test]
fn validate_accepts_a_reactivation_in_flight() {
    let mut c = core();
    full(&mut c, 2);
    madvise(&mut c, at(0), PS, MADV_COLD).unwrap();
    let plan = c.fault(Addr(at(0)), false);
    assert!(matches!(plan, FaultPlan::Reactivate { .. }));
    c.validate();
    c.fill_done(&plan, 1);
    c.validate();
}

#[test]
fn validate_accepts_an_eviction_in_flight() {
    let mut c = core();
    full(&mut c, 2);
    madvise(&mut c, at(0), PS, MADV_COLD).unwrap();
    let evs = c.evict_pages(&[PageIdx(0)]);
    assert_eq!(evs.len(), 1);
    c.validate();
    c.evict_done(&evs[0], true);
    c.validate();
}

#[test]
fn aging_ahead_needs_demand_and_reclaim_ahead_keeps_to_its_watermarks() {
    // A working set that fits after pressure (the reclaim experiment's
    // `fits`): once nothing claims frames, nothing is aged — aging parks
    // pages the program is touching, each a minor fault for no eviction.
    let mut c = core();
    full(&mut c, 20);
    map_at(&mut c, 20, 12);
    assert!(c.reclaim_ahead(), "the budget ran out under a fault: pressure");
    // The last touch claimed a frame: aging may run, and refills the
    // inactive list. Then the program maps pages back (minor faults),
    // which claims no frame.
    assert!(c.needs_aging() || c.stats().inactive_pages >= c.inactive_target());
    reclaim(&mut c, 0);
    while c.stats().inactive_pages > 0 {
        let p = (0..20).find(|&p| c.page(PageIdx(p)).state == PState::Inactive).unwrap();
        assert!(matches!(touch(&mut c, p, false), Touch::Served(_)));
    }
    assert!(!c.needs_aging(), "no frame claimed since the last refill: no aging");
    // A fault that claims a frame (a swap-in) is demand again.
    let p = (0..20).find(|&p| c.page(PageIdx(p)).state == PState::Swapped).unwrap();
    let _ = touch(&mut c, p, false);
    assert!(c.needs_aging(), "a frame was claimed: aging may refill the inactive list");
    reclaim(&mut c, 0);
    assert!(!c.needs_aging(), "the refill served that demand");

    // Watermarks (low 2, high 4 frames): nothing is reclaimed ahead while
    // free frames stay above low; once below, back up to high.
    let free = c.free_frames();
    assert!(free < 2, "the budget is full: {free} free");
    assert_eq!(c.reclaim_ahead_want(2, 4), 4 - free);
    reclaim(&mut c, 4 - free);
    let free = c.free_frames();
    if free < 4 {
        assert_eq!(c.reclaim_ahead_want(2, 4), 4 - free, "refilling goes on up to high");
    }
    while c.free_frames() < 4 {
        let want = c.reclaim_ahead_want(2, 4);
        reclaim(&mut c, want);
    }
    assert_eq!(c.reclaim_ahead_want(2, 4), 0, "at high: done");
    // Free frames taken down to between the two: nothing to reclaim yet.
    let absent: Vec<u64> = (20..32).filter(|&p| c.page(PageIdx(p)).state == PState::Absent).collect();
    assert!(matches!(touch(&mut c, absent[0], true), Touch::Served(_)));
    assert!((2..4).contains(&c.free_frames()), "{} free", c.free_frames());
    assert_eq!(c.reclaim_ahead_want(2, 4), 0, "between the watermarks, not refilling: nothing");
}

/// MADV_PAGEOUT over lazily freed pages (issue 45, item 6): each is
/// discarded (the host drops a clean one: no I/O, it reads back as zeros),
/// and one written since goes to swap like any page; without swap, only
/// lazily freed pages leave, and a written one stays parked (resident),
/// as Linux's PAGEOUT keeps it on a swapless host.
#[test]
fn pageout_discards_lazily_freed_pages() {
    for swap in [true, false] {
        let mut c = Core::new(CoreConfig { swap_slots: if swap { 64 } else { 0 }, ..cfg() });
        c.set_host_lazyfree(true);
        full(&mut c, 6);
        madvise(&mut c, at(0), pages(4), MADV_FREE).unwrap();
        let (ops, r) = c.madvise(at(0), pages(6), MADV_PAGEOUT);
        assert_eq!((ops.clone(), r), (vec![usermm_core::AdviceOp::Pageout(PageRange::new(0, 6))], Ok(())));
        let ds = c.pageout_range(PageRange::new(0, 6));
        // Without swap the two pages never freed stay where they are.
        assert_eq!(ds.len(), if swap { 6 } else { 4 }, "swap {swap}");
        for d in &ds {
            c.deactivate_done(d, true);
        }
        let plan = c.evict_range(PageRange::new(0, 6), usize::MAX);
        assert_eq!(plan.discard.iter().map(|d| d.page.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(plan.evict.iter().map(|e| e.page.0).collect::<Vec<_>>(), if swap { vec![4, 5] } else { vec![] });
        assert!(plan.discard.iter().all(|d| d.swap.is_some() == swap));
        for e in &plan.evict {
            c.evict_done(e, true);
        }
        // Pages 1 and 3 were written since the free: the host keeps them.
        for d in &plan.discard {
            let written = d.page.0 % 2 == 1;
            c.discard_done(d, !written, written && swap);
        }
        c.validate();
        let want = if swap { "_S_SSS" } else { "_I_IRR" };
        assert_eq!(draw_pages(&c, 0, 6), want, "swap {swap}");
        let s = c.stats();
        assert_eq!((s.lazyfree_pages, s.counters.lazyfree_discards), (0, 2), "swap {swap}");
        // Nothing more to page out: a written page without swap stays.
        assert!(c.evict_range(PageRange::new(0, 6), usize::MAX).is_empty());
        c.pageout_done(PageRange::new(0, 6));
    }
}

/// A page that comes back into a locked region keeps no swap copy, and its
/// slot is scrubbed (issue 45, item 7): a clean swap-in's copy dropped when
/// the page is locked in place, a swap-in into a locked region keeping none;
/// each slot reserved while the store overwrites it, then free.
#[test]
fn a_locked_page_keeps_no_swap_copy_and_its_slot_is_scrubbed() {
    let mut c = core();
    c.set_tracks_writes(true);
    full(&mut c, 3);
    madvise(&mut c, at(0), pages(3), MADV_PAGEOUT).unwrap();
    assert_eq!(draw_pages(&c, 0, 3), "SSS");
    let slots: Vec<u32> = (0..3).map(|p| c.page(PageIdx(p)).slot).collect();
    // A read fault keeps the slot as the page's copy.
    let plan = fault(&mut c, 0, false);
    assert_eq!(plan, FaultPlan::SwapIn { run: PageRange::new(0, 1), slot: slots[0], keep: true });
    c.fill_done(&plan, 1);
    assert_eq!(c.page(PageIdx(0)).cache, slots[0] + 1);
    assert!(c.swap_scrub_plan(16).is_empty(), "an unlocked page's copy stays");
    let lp = c.lock_range(at(0), pages(3), usermm_core::region::LockMode::OnFault);
    assert_eq!(lp.result, Ok(()));
    c.validate();
    assert_eq!(c.page(PageIdx(0)).cache, 0, "locked in place: the copy goes");
    // A read fault into the locked region keeps nothing.
    let plan = fault(&mut c, 1, false);
    assert_eq!(plan, FaultPlan::SwapIn { run: PageRange::new(1, 2), slot: slots[1], keep: false });
    c.fill_done(&plan, 1);
    c.validate();
    let scrub = c.swap_scrub_plan(16);
    assert_eq!(scrub, vec![slots[0], slots[1]]);
    c.validate();
    // Reserved meanwhile: a new eviction cannot take them.
    assert_eq!(c.swap_scrub_plan(16), vec![]);
    // A failed scrub is planned again; a done one is not.
    c.swap_scrub_done(&scrub, false);
    c.validate();
    let scrub = c.swap_scrub_plan(16);
    assert_eq!(scrub, vec![slots[0], slots[1]]);
    c.swap_scrub_done(&scrub, true);
    c.validate();
    assert_eq!(c.swap_scrub_plan(16), vec![]);
    // Page 2 is still swapped (lock on fault swaps nothing in); its slot is
    // its own.
    assert_eq!(draw_pages(&c, 0, 3), "RRS");
    let s = c.stats();
    assert_eq!((s.swapped_pages, s.swap_cached_pages, s.locked_pages), (1, 0, 2));
}

/// The spare page-table leaves a table wants: a few for a table with
/// nothing in use (a program's start pays for no more), then as many as it
/// has leaves in use, up to the cap; low below a quarter of that.
#[test]
fn spare_leaves_grow_with_the_leaves_in_use() {
    use usermm_core::page::{PageMeta, PageTable};
    let mut t = PageTable::new(512 * 1024);
    let start = t.spare_wanted();
    assert!((1..=32).contains(&start), "a fresh table wants a few spares, not {start}");
    assert!(t.spare_low());
    t.add_spare((0..start).map(|_| PageTable::new_leaf()).collect());
    assert_eq!(t.spare_wanted(), 0);
    assert!(!t.spare_low());
    // Leaves in use: one page in each of 200 leaves (marked volatile: a
    // page with no frame and no slot, so no transition).
    let live = PageMeta { flags: usermm_core::page::pf::VOLATILE, ..PageMeta::default() };
    for l in 0..200u64 {
        t.set(PageIdx(l * 512), live);
    }
    t.validate();
    assert_eq!(t.spare_wanted(), 200, "as many spares as leaves in use");
    assert!(t.spare_low());
    for l in 0..200u64 {
        t.set(PageIdx(l * 512), PageMeta::default());
    }
    t.validate();
    assert_eq!(t.spare_wanted(), 0, "emptied leaves become spares");
}

/// The page table is the one place a page's state changes: it follows the
/// transition table and keeps the counts derived from the pages, a busy
/// page counting where it came from until its work is committed.
#[test]
fn the_page_table_counts_a_page_through_its_life() {
    use usermm_core::page::{pf, PageMeta, PageTable};
    let mut t = PageTable::new(1024);
    let p = PageIdx(7);
    let to = |t: &mut PageTable, s: PState| t.update(p, |m| m.state = s);
    to(&mut t, PState::Filling);
    assert_eq!((t.census().resident, t.census().busy), (1, 1), "a fill claims a frame");
    to(&mut t, PState::Resident);
    t.update(p, |m| m.flags |= pf::LOCKED | pf::VOLATILE);
    assert_eq!((t.census().locked, t.census().volatile, t.census().busy), (1, 1, 0));
    t.update(p, |m| m.flags = 0);
    to(&mut t, PState::Deactivating);
    assert_eq!(t.census().inactive, 0, "not parked until the move is done");
    to(&mut t, PState::Inactive);
    assert_eq!(t.census().inactive, 1);
    to(&mut t, PState::Evicting);
    assert_eq!((t.census().inactive, t.census().swapped), (1, 0), "being evicted: still parked");
    to(&mut t, PState::Swapped);
    assert_eq!((t.census().inactive, t.census().swapped, t.census().resident), (0, 1, 0));
    to(&mut t, PState::Filling);
    assert_eq!(t.page_from(p), PState::Swapped);
    assert_eq!((t.census().swapped, t.census().resident), (1, 1), "being read in: still swapped");
    to(&mut t, PState::Resident);
    t.update(p, |m| m.cache = 5);
    assert_eq!((t.census().swapped, t.census().swap_cached), (0, 1));
    t.update(p, |m| m.cache = 0);
    to(&mut t, PState::Zapping);
    t.set(p, PageMeta::default());
    assert_eq!(*t.census(), Default::default(), "nothing left");
    assert_eq!(t.resident_max(), 1);
    t.validate();
}

/// A change the transition table does not allow is caught (debug builds,
/// which the suite runs the core's tests and the simulation in).
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "may not become")]
fn a_page_cannot_skip_a_state() {
    use usermm_core::page::PageTable;
    let mut t = PageTable::new(1024);
    // Absent to Resident without a fill.
    t.update(PageIdx(3), |m| m.state = PState::Resident);
}

/// A page a fill gives back goes where it came from, not elsewhere.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "may not become")]
fn a_failed_fill_goes_back_where_it_came_from() {
    use usermm_core::page::PageTable;
    let mut t = PageTable::new(1024);
    let p = PageIdx(3);
    t.update(p, |m| m.state = PState::Filling);
    // A zero fill (from Absent) cannot end in swap.
    t.update(p, |m| m.state = PState::Swapped);
}

/// A swap-in that fails leaves the page in its slot: it never reads as zeros.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "may not become")]
fn a_failed_swap_in_never_becomes_zeros() {
    use usermm_core::page::PageTable;
    let mut t = PageTable::new(1024);
    let p = PageIdx(3);
    for s in [PState::Filling, PState::Resident, PState::Deactivating, PState::Inactive, PState::Evicting] {
        t.update(p, |m| m.state = s);
    }
    t.update(p, |m| {
        m.state = PState::Swapped;
        m.slot = 7;
    });
    t.update(p, |m| m.state = PState::Filling);
    t.update(p, |m| m.state = PState::Absent);
}

/// Proven pages behind an active list of pages that cannot be parked
/// (writable non-RW ones) are still aged: a round that goes through the
/// one list turns to the other (in the faulting thread, such a budget
/// had a fault find no frame 16 rounds running: SIGBUS; here, no round
/// parked anything).
#[test]
fn proven_pages_behind_pages_that_cannot_be_parked_are_aged() {
    let mut c = core();
    mmap(&mut c, at(0), pages(12), RW | PROT_EXEC, ANON | MAP_FIXED).unwrap();
    for p in 0..12 {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    map_at(&mut c, 12, 4);
    for p in 12..16 {
        touch(&mut c, p, true);
    }
    madvise(&mut c, at(12), pages(4), MADV_COLD).unwrap();
    for p in 12..16 {
        assert!(matches!(touch(&mut c, p, false), Touch::Served(_)));
        assert!(c.page(PageIdx(p)).has(pf::REFERENCED), "page {p} touched while parked");
    }
    assert_eq!(draw_pages(&c, 12, 16), "RRRR");
    // (Each round spends a trip of theirs: referenced bit, then two.)
    let parked = (0..4).find_map(|_| Some(reclaim(&mut c, 1).0).filter(|d| !d.is_empty()));
    assert!(parked.as_ref().is_some_and(|d| d.iter().all(|p| p.0 >= 12)), "parked: {parked:?}");
}
