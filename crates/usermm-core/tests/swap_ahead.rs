//! Swap read-ahead of a stream (`Core::swap_ahead_plan`): after a fault's
//! swap-in continues a stream long enough, the swapped pages of the window
//! past it are claimed in address order, whatever their slots, one of them
//! (the marker) left swapped for the program's next fault to continue the
//! stream; random faults, random advice and short frames read nothing ahead.

mod common;

use common::*;
use usermm_core::consts::*;
use usermm_core::page::PState;
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, PageIdx, PageRange, SwapAhead, AHEAD_STREAK, SWAP_CLUSTER_PAGES};

const N: u64 = 256;

/// `n` pages mapped and made resident, then paged out one at a time in a
/// scrambled order: their slots follow no order of address.
fn scattered_of(n: u64) -> Core {
    let cfg = CoreConfig {
        reserve_pages: 2 * n,
        budget_pages: n,
        swap_slots: 2 * n as u32,
        staging_slots: n as u32,
        ..cfg()
    };
    let mut c = Core::new(cfg);
    map_at(&mut c, 0, n);
    for p in 0..n {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    for p in 0..n {
        let q = (p * 97) % n;
        madvise(&mut c, at(q), PS, MADV_PAGEOUT).unwrap();
    }
    assert_eq!(draw_pages(&c, 0, 8), "SSSSSSSS");
    assert!((0..n - 1).all(|p| c.page(PageIdx(p + 1)).slot != c.page(PageIdx(p)).slot + 1), "slots in order");
    c
}

fn scattered() -> Core {
    scattered_of(N)
}

/// Serves a fault's swap-in of page `p` in full; returns its run.
fn swap_in(c: &mut Core, p: u64) -> PageRange {
    let plan = c.fault(Addr(at(p)), false);
    let FaultPlan::SwapIn { run, .. } = plan else { panic!("page {p}: {plan:?}") };
    c.fill_done(&plan, run.pages());
    run
}

/// The read-ahead after the fault at `p`, committed as `installed` says.
fn ahead(c: &mut Core, p: u64, installed: bool) -> SwapAhead {
    let run = swap_in(c, p);
    let a = c.swap_ahead_plan(run);
    for &(q, _) in &a.pages {
        assert_eq!(c.page(q).state, PState::Filling, "claimed");
    }
    c.validate();
    c.swap_ahead_done(&a, &vec![installed; a.pages.len()]);
    let parked: Vec<(FaultPlan, u64)> = a.parked.iter().map(|p| (p.clone(), u64::from(installed))).collect();
    c.swap_ahead_unparked(&parked);
    c.validate();
    a
}

#[test]
fn a_forward_walk_reads_the_swapped_pages_ahead_and_leaves_a_marker() {
    let mut c = scattered();
    // Faults in a row, each where the last run ended: the streak builds.
    for p in 0..u64::from(AHEAD_STREAK) {
        assert!(ahead(&mut c, p, true).pages.is_empty(), "read ahead before the streak, at {p}");
    }
    let p = u64::from(AHEAD_STREAK);
    let a = ahead(&mut c, p, true);
    // The window past the page, less its marker, in address order, each
    // with the slot it sat in.
    let window: Vec<u64> = (p + 1..p + 1 + SWAP_CLUSTER_PAGES).collect();
    let marker = window[window.len() / 2];
    let read: Vec<u64> = a.pages.iter().map(|&(q, _)| q.0).collect();
    let want: Vec<u64> = window.iter().copied().filter(|&q| q != marker).collect();
    assert_eq!(read, want);
    for q in &want {
        assert_eq!(c.page(PageIdx(*q)).state, PState::Resident, "page {q}");
    }
    assert_eq!(c.page(PageIdx(marker)).state, PState::Swapped, "the marker stays swapped");
    let s = c.stats().counters;
    assert_eq!(s.swap_ahead, want.len() as u64);
    assert_eq!(s.swapins, s.swap_ahead + u64::from(AHEAD_STREAK) + 1);
    // The program's fault on the marker continues the stream: the next
    // window, twice as wide, goes on from there.
    let b = ahead(&mut c, marker, true);
    let last = b.pages.last().expect("a second window").0 .0;
    assert_eq!(last, marker + 2 * SWAP_CLUSTER_PAGES, "{b:?}");
    assert!(b.pages.iter().all(|&(q, _)| q.0 > p + SWAP_CLUSTER_PAGES), "only pages not read yet");
}

#[test]
fn a_backward_walk_reads_ahead_downwards() {
    let mut c = scattered();
    let top = N - 1;
    for k in 0..u64::from(AHEAD_STREAK) {
        assert!(ahead(&mut c, top - k, true).pages.is_empty());
    }
    let p = top - u64::from(AHEAD_STREAK);
    let a = ahead(&mut c, p, true);
    let read: Vec<u64> = a.pages.iter().map(|&(q, _)| q.0).collect();
    assert_eq!(read.len() as u64, SWAP_CLUSTER_PAGES - 1, "{read:?}");
    assert!(read.windows(2).all(|w| w[0] < w[1]), "address order: {read:?}");
    assert!(read.iter().all(|&q| q < p && q >= p - SWAP_CLUSTER_PAGES), "{read:?}");
}

#[test]
fn a_failed_read_ahead_leaves_the_pages_swapped_in_their_slots() {
    let mut c = scattered();
    for p in 0..u64::from(AHEAD_STREAK) {
        ahead(&mut c, p, true);
    }
    let slots: Vec<u32> = (0..N).map(|p| c.page(PageIdx(p)).slot).collect();
    let a = ahead(&mut c, u64::from(AHEAD_STREAK), false);
    assert!(!a.pages.is_empty());
    for &(q, slot) in &a.pages {
        let m = c.page(q);
        assert_eq!((m.state, m.slot, slot), (PState::Swapped, slots[q.0 as usize], slots[q.0 as usize]), "page {q:?}");
    }
    assert_eq!(c.stats().counters.swap_ahead, 0);
}

#[test]
fn random_faults_random_advice_and_short_frames_read_nothing_ahead() {
    // Faults that continue no stream, in a region large enough that they
    // seldom land near one (in a small one every fault is near a stream's
    // end: the window, a few dozen pages, bounds what that reads).
    let big = 8 * N;
    let mut c = scattered_of(big);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = x % big;
        if c.page(PageIdx(p)).state == PState::Swapped {
            assert!(ahead(&mut c, p, true).pages.is_empty(), "at {p}");
        }
    }
    // MADV_RANDOM: a walk reads nothing ahead either.
    let mut c = scattered();
    madvise(&mut c, at(0), pages(N), MADV_RANDOM).unwrap();
    for p in 0..8 {
        assert!(ahead(&mut c, p, true).pages.is_empty(), "at {p}");
    }
    // No free frame to spare: nothing read ahead (never reclaim for it).
    let mut c = Core::new(CoreConfig { budget_pages: 8, swap_slots: 64, staging_slots: 8, ..cfg() });
    map_at(&mut c, 0, 32);
    for p in 0..32 {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    madvise(&mut c, at(0), pages(32), MADV_PAGEOUT).unwrap();
    for p in 24..32 {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    assert_eq!(c.free_frames(), 0);
    let run = PageRange::new(0, 1);
    assert!(c.swap_ahead_plan(run).pages.is_empty());
}

/// `N` pages mapped and made resident, swap and staging for all.
fn all_resident() -> Core {
    let cfg = CoreConfig { budget_pages: N, swap_slots: 2 * N as u32, staging_slots: N as u32, ..cfg() };
    let mut c = Core::new(cfg);
    map_at(&mut c, 0, N);
    for p in 0..N {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    c
}

/// A walk over swapped pages from `p` (each fault at the next swapped
/// page, its runs growing) until a fault reads ahead, before `limit`.
fn walk_to_read_ahead(c: &mut Core, mut p: u64, limit: u64) -> SwapAhead {
    loop {
        assert!(p < limit, "no read-ahead before page {limit}");
        let a = ahead(c, p, true);
        if !a.parked.is_empty() || !a.pages.is_empty() {
            return a;
        }
        while c.page(PageIdx(p)).state != PState::Swapped {
            p += 1;
        }
    }
}

#[test]
fn the_windows_parked_pages_are_mapped_back_without_a_fault() {
    let mut c = all_resident();
    // Pages 200..208 stay, parked (reclaim's sampling); the rest go out.
    for p in (0..N).filter(|p| !(200..208).contains(p)) {
        madvise(&mut c, at(p), PS, MADV_PAGEOUT).unwrap();
    }
    madvise(&mut c, at(200), pages(8), MADV_COLD).unwrap();
    assert_eq!(draw_pages(&c, 199, 209), "SIIIIIIIIS");
    // A walk from 180 (its runs of neighbouring slots grow: 1, 2, 4, 8
    // pages), until it reads ahead.
    let a = walk_to_read_ahead(&mut c, 180, 200);
    let parked: Vec<u64> = a
        .parked
        .iter()
        .map(|p| match p {
            FaultPlan::Reactivate { page, .. } => page.0,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(parked, (200..208).collect::<Vec<u64>>());
    assert_eq!(draw_pages(&c, 200, 208), "RRRRRRRR", "mapped back");
    let s = c.stats().counters;
    assert_eq!((s.unparked, s.minor_faults), (8, 0));
}

/// A window's pages that a `MADV_PAGEOUT` has parked and is about to evict
/// stay parked (the page-out evicts them, as Linux's drops them); once it
/// is over, a read-ahead maps back the ones it left.
#[test]
fn a_windows_pages_being_paged_out_are_left_to_the_page_out() {
    let mut c = all_resident();
    for p in (0..N).filter(|p| !(200..208).contains(p)) {
        madvise(&mut c, at(p), PS, MADV_PAGEOUT).unwrap();
    }
    // Pages 200..208: parked by a page-out still under way.
    let out = PageRange::new(200, 208);
    for d in c.pageout_range(out) {
        c.deactivate_done(&d, true);
    }
    assert_eq!(draw_pages(&c, 199, 209), "SIIIIIIIIS");
    let a = walk_to_read_ahead(&mut c, 180, 200);
    assert!(a.parked.is_empty(), "mapped back pages being paged out: {:?}", a.parked);
    assert_eq!(draw_pages(&c, 200, 208), "IIIIIIII");
    let plan = c.evict_range(out, usize::MAX);
    assert_eq!(plan.evict.len(), 8);
    for e in &plan.evict {
        c.evict_done(e, true);
    }
    c.pageout_done(out);
    assert_eq!(draw_pages(&c, 200, 208), "SSSSSSSS");
    c.validate();
}
