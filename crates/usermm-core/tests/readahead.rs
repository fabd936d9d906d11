//! A stream's read-ahead decisions, with no kernel: where the background
//! thread's next window starts, how far a window reaches, and the window a
//! handler reads instead of waiting for a page being read ahead
//! (docs/design.md, "Read-ahead" and "Two windows at once"). The fills are
//! left in flight where a thread would still be reading them.

mod common;

use usermm_core::consts::*;
use usermm_core::page::PState;
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, FileMap, MmapReply, PageIdx, PageRange, MAX_WINDOW_PAGES};

use common::{at, pages};

const FILE: u32 = 3;
const N: u64 = 4096;
const W: u64 = MAX_WINDOW_PAGES;

/// A core with room for every window, and a shared read-only mapping of a
/// file of `N` pages at page 0, advised `advice`.
fn stream(advice: i32, flags: i32) -> Core {
    let mut c = Core::new(CoreConfig {
        reserve_pages: N + 64,
        budget_pages: N,
        swap_slots: 0,
        staging_slots: 64,
        exact_faults: false,
        ..common::cfg()
    });
    let file = FileMap::regular(FILE, false, 0);
    match c.mmap_file(at(0), pages(N), PROT_READ, MAP_SHARED | MAP_FIXED | flags, file).unwrap() {
        MmapReply::Done(_) => {}
        MmapReply::Busy => panic!("nothing is being unmapped"),
    }
    common::madvise(&mut c, at(0), pages(N), advice).unwrap();
    c.validate();
    c
}

/// The run of a file read plan.
fn read_run(plan: &FaultPlan) -> PageRange {
    match plan {
        FaultPlan::FileRead { run, file, .. } => {
            assert_eq!(*file, FILE);
            *run
        }
        other => panic!("not a file read: {other:?}"),
    }
}

/// The program's first fault reads window 0 (committed); the background
/// thread's read-in of window 1 is left in flight.
fn first_windows(c: &mut Core) -> FaultPlan {
    let plan = c.fault(Addr(at(0)), false);
    assert_eq!(read_run(&plan), PageRange::new(0, W));
    c.fill_done(&plan, W);
    let next = c.readahead_after_fault(PageRange::new(0, W), W, FILE).expect("the stream goes on");
    assert_eq!(next, PageIdx(W));
    assert_eq!(c.readahead_window(next), W);
    let ahead = c.populate_step(next, PageIdx(next.0 + W), false).expect("window 1 is absent");
    assert_eq!(read_run(&ahead), PageRange::new(W, 2 * W));
    ahead
}

#[test]
fn a_handler_reads_the_window_after_the_one_being_read() {
    let mut c = stream(MADV_SEQUENTIAL, 0);
    let w1 = first_windows(&mut c);
    // The program caught up with window 1: its fault finds the page busy,
    // and the handler is given window 2 to read meanwhile.
    let p = PageIdx(W + 10);
    assert!(matches!(c.fault(Addr(at(p.0)), false), FaultPlan::Busy));
    assert_eq!(c.readahead_instead_of_wait(p), Some((PageIdx(2 * W), PageIdx(3 * W))));
    let w2 = c.populate_step(PageIdx(2 * W), PageIdx(3 * W), false).unwrap();
    assert_eq!(read_run(&w2), PageRange::new(2 * W, 3 * W));
    // Both windows in flight: the background thread's chain skips the
    // handler's window, and a window never reaches into one in flight.
    assert_eq!(c.readahead_chains(PageIdx(W), PageIdx(2 * W)), Some(PageIdx(3 * W)));
    assert_eq!(c.readahead_window(PageIdx(3 * W)), W);
    let other = c.populate_step(PageIdx(3 * W + 10), PageIdx(3 * W + 20), false).unwrap();
    assert_eq!(c.readahead_window(PageIdx(3 * W)), 10);
    c.fill_done(&other, 10);
    // A second wait in window 1 is given window 3, the next untouched one,
    // up to the pages read there meanwhile.
    assert_eq!(c.readahead_instead_of_wait(PageIdx(W + 11)), Some((PageIdx(3 * W), PageIdx(3 * W + 10))));
    // Committed in either order, the pages are resident.
    c.fill_done(&w2, W);
    c.fill_done(&w1, W);
    for q in [W, 2 * W - 1, 2 * W, 3 * W - 1] {
        assert_eq!(c.page(PageIdx(q)).state, PState::Resident, "page {q}");
    }
    c.validate();
}

#[test]
fn read_ahead_stops_four_windows_past_where_the_program_was_seen() {
    let mut c = stream(MADV_SEQUENTIAL, 0);
    let w1 = first_windows(&mut c);
    // Seen last at its fault: up to READAHEAD_DEPTH windows past the run it
    // read (next_fault = W).
    let depth = usermm_core::READAHEAD_DEPTH * W;
    assert_eq!(c.readahead_chains(PageIdx(W), PageIdx(W + depth - 1)), Some(PageIdx(W + depth - 1)));
    assert_eq!(c.readahead_chains(PageIdx(W), PageIdx(W + depth)), None);
    // Seen waiting further on (a page being read ahead): the limit moves.
    let p = PageIdx(W + 100);
    assert!(c.readahead_instead_of_wait(p).is_some());
    assert_eq!(c.readahead_chains(PageIdx(W), PageIdx(W + depth)), Some(PageIdx(W + depth)));
    assert_eq!(c.readahead_chains(PageIdx(W), PageIdx(p.0 + depth)), None);
    c.fill_done(&w1, W);
    // A fault that fills behind where the program was seen waiting (it went
    // back) forgets the wait: the limit is that fault's again.
    let w3 = c.populate_step(PageIdx(3 * W), PageIdx(4 * W), false).unwrap();
    assert!(c.readahead_instead_of_wait(PageIdx(3 * W + 200)).is_some());
    let plan = c.fault(Addr(at(2 * W)), false);
    assert_eq!(read_run(&plan), PageRange::new(2 * W, 3 * W));
    c.fill_done(&plan, W);
    c.fill_done(&w3, W);
    assert_eq!(c.readahead_chains(PageIdx(3 * W), PageIdx(3 * W + depth - 1)), Some(PageIdx(3 * W + depth - 1)));
    assert_eq!(c.readahead_chains(PageIdx(3 * W), PageIdx(3 * W + depth)), None);
    c.validate();
}

#[test]
fn no_window_instead_of_waiting_outside_a_stream() {
    // Random advice: every fault reads its page alone; a busy page is
    // waited for.
    let mut c = stream(MADV_RANDOM, 0);
    let plan = c.populate_step(PageIdx(0), PageIdx(W), false).unwrap();
    assert!(matches!(c.fault(Addr(at(5)), false), FaultPlan::Busy));
    assert_eq!(c.readahead_instead_of_wait(PageIdx(5)), None);
    c.fill_done(&plan, read_run(&plan).pages());
    // A locked region's faults are its own: no read-ahead in its place.
    let mut c = stream(MADV_SEQUENTIAL, MAP_LOCKED);
    let plan = c.populate_step(PageIdx(0), PageIdx(W), false).unwrap();
    assert_eq!(c.readahead_instead_of_wait(PageIdx(5)), None);
    c.fill_done(&plan, read_run(&plan).pages());
    // A page that is not being filled (resident) is no read-ahead's.
    let mut c = stream(MADV_SEQUENTIAL, 0);
    let plan = c.fault(Addr(at(0)), false);
    c.fill_done(&plan, read_run(&plan).pages());
    assert_eq!(c.readahead_instead_of_wait(PageIdx(0)), None);
    c.validate();
}
