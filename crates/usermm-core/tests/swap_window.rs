//! Swap-in read-around (`window::swap_in_window`): which swapped pages a
//! fault on a swapped page reads, and how the window adapts.
//!
//! Pages are drawn as in `common::draw_pages` (`S` swapped, `R` resident).

mod common;

use common::*;
use usermm_core::consts::*;
use usermm_core::page::PState;
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, PageIdx, PageRange};

/// A core whose budget holds `n` pages, with `n` resident pages at page 0
/// (an anonymous read-write region), then all of them paged out.
fn swapped(n: u64) -> Core {
    let mut c = Core::new(CoreConfig { budget_pages: n, swap_slots: 4 * n as u32, staging_slots: n as u32, ..cfg() });
    map_at(&mut c, 0, n);
    for p in 0..n {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    madvise(&mut c, at(0), pages(n), MADV_PAGEOUT).unwrap();
    assert!((0..n).all(|p| c.page(PageIdx(p)).state == PState::Swapped));
    c
}

/// Faults on page `p` and serves the swap-in in full; returns its run.
fn swap_in(c: &mut Core, p: u64) -> PageRange {
    let plan = c.fault(Addr(at(p)), false);
    validate_planned(c, &plan);
    let FaultPlan::SwapIn { run, .. } = plan else { panic!("page {p}: {plan:?}") };
    assert_eq!(run.start, PageIdx(p), "a run starts at the faulting page");
    c.fill_done(&plan, run.pages());
    c.validate();
    run
}

#[test]
fn a_stream_doubles_the_window_up_to_the_cluster() {
    let mut c = swapped(256);
    // The first fault knows no stream: the page alone; each fault where
    // the last run ended doubles the window.
    let mut p = 0;
    let mut lens = Vec::new();
    for _ in 0..8 {
        let run = swap_in(&mut c, p);
        lens.push(run.pages());
        p = run.end.0;
    }
    assert_eq!(lens, [1, 2, 4, 8, 16, 32, 32, 32]);
    assert_eq!(c.stats().counters.major_faults, 8);
}

#[test]
fn a_stream_with_gaps_still_grows_and_a_stray_fault_halves_it() {
    let mut c = swapped(256);
    // `SSSS…`: 0 alone, then 1 (the end of the last run): 2 pages.
    assert_eq!(swap_in(&mut c, 0).pages(), 1);
    assert_eq!(swap_in(&mut c, 1).pages(), 2);
    // The run ended at 3; a fault at 4 skips a page (still swapped, or
    // resident in another program's order) but lands within one window
    // (2 pages) past the end: a stream, 4 pages.
    assert_eq!(swap_in(&mut c, 4), PageRange::new(4, 8));
    // 9 is within 4 of 8: 8 pages.
    assert_eq!(swap_in(&mut c, 9), PageRange::new(9, 17));
    // A stray fault far away halves the window (8 → 4), not back to 1.
    assert_eq!(swap_in(&mut c, 200), PageRange::new(200, 204));
    // Back on the stream's end (17 is not within 4 of 204): halved again.
    assert_eq!(swap_in(&mut c, 100).pages(), 2);
    // Random faults bring it down to the page alone.
    assert_eq!(swap_in(&mut c, 150).pages(), 1);
    assert_eq!(swap_in(&mut c, 50).pages(), 1);
}

#[test]
fn the_run_takes_swapped_neighbours_from_any_slots_and_stops_at_a_resident_page() {
    let mut c = swapped(64);
    // Pages 0..8 back in, then out again in reverse order, to slots that
    // are not their neighbours' in the region.
    for p in 0..8 {
        touch(&mut c, p, true);
    }
    for p in (0..8).rev() {
        madvise(&mut c, at(p), PS, MADV_PAGEOUT).unwrap();
    }
    let slots: Vec<u32> = (0..8).map(|p| c.page(PageIdx(p)).slot).collect();
    assert!(slots.windows(2).any(|w| w[1] != w[0] + 1), "scattered: {slots:?}");
    // Pages 6 and 7 resident (one fault): `SSSSSSRR`.
    touch(&mut c, 6, true);
    assert_eq!(&draw_pages(&c, 0, 8), "SSSSSSRR");
    // A stream from 0: each run reads its pages, each from its own slot,
    // and stops at the resident page 6.
    let mut p = 0;
    let mut longest = 0;
    while p < 6 {
        let plan = c.fault(Addr(at(p)), false);
        let FaultPlan::SwapIn { run, .. } = plan else { panic!("{plan:?}") };
        assert_eq!(run.start, PageIdx(p));
        assert!(run.end.0 <= 6, "{run:?} reads past the resident page");
        assert_eq!(c.swap_in_slots(run), slots[run.start.0 as usize..run.end.0 as usize].to_vec());
        c.fill_done(&plan, run.pages());
        c.validate();
        longest = longest.max(run.pages());
        p = run.end.0;
    }
    assert!(longest >= 2, "read-around over scattered slots");
    assert_eq!(&draw_pages(&c, 0, 8), "RRRRRRRR");
}

#[test]
fn random_advice_reads_the_page_alone() {
    let mut c = swapped(64);
    madvise(&mut c, at(0), pages(64), MADV_RANDOM).unwrap();
    for p in 0..8 {
        assert_eq!(swap_in(&mut c, p).pages(), 1);
    }
}
