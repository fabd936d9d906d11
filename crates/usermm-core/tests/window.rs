//! The fault-around window of a sequential first touch, with no kernel:
//! how far it grows when a handler thread serves the faults and when the
//! faulting thread serves them itself (`Core::fault_in_thread`).

mod common;

use usermm_core::{
    Addr, Core, CoreConfig, FaultPlan, PageRange, IN_THREAD_ZERO_WINDOW_PAGES, MAX_WINDOW_PAGES, SMALL_BLOCK_PAGES,
};

use common::{at, map_at};

/// (Below `BLOCK_MIN_REGION_PAGES`: a second fault fills a block of
/// `SMALL_BLOCK_PAGES`.)
const N: u64 = 4096;

/// A core with room for every window and one anonymous region of `N`
/// pages at page 0.
fn core() -> Core {
    let mut c = Core::new(CoreConfig { reserve_pages: N + 64, budget_pages: N, exact_faults: false, ..common::cfg() });
    map_at(&mut c, 0, N);
    c
}

/// Touches the region from its start, one fault where the last window
/// ended, `faults` times, each served in full; returns the windows.
fn sequential(c: &mut Core, write: bool, in_thread: bool, faults: usize) -> Vec<u64> {
    let mut p = 0;
    let mut runs = Vec::new();
    for _ in 0..faults {
        let a = Addr(at(p));
        let plan = if in_thread { c.fault_in_thread(a, write) } else { c.fault(a, write) };
        let run: PageRange = match plan {
            FaultPlan::ZeroFill { run } => run,
            other => panic!("not a zero fill: {other:?}"),
        };
        assert_eq!(run.start.0, p, "the window starts at the touched page");
        c.fill_done(&plan, run.pages());
        c.validate();
        runs.push(run.pages());
        p = run.end.0;
    }
    runs
}

#[test]
fn a_handler_served_writer_reaches_the_largest_window() {
    let runs = sequential(&mut core(), true, false, 10);
    // The second fault fills the rest of its block; then one page until
    // the streak.
    assert_eq!(runs[..3], [1, SMALL_BLOCK_PAGES - 1, 1]);
    assert_eq!(*runs.iter().max().unwrap(), MAX_WINDOW_PAGES);
    assert_eq!(*runs.last().unwrap(), MAX_WINDOW_PAGES);
}

#[test]
fn a_second_fault_in_a_block_fills_the_block_a_first_does_not() {
    let mut c = core();
    let touch = |c: &mut Core, p: u64| {
        let plan = c.fault(Addr(at(p)), true);
        let FaultPlan::ZeroFill { run } = plan else { panic!("{plan:?}") };
        c.fill_done(&plan, run.pages());
        c.validate();
        run
    };
    // Scattered first touches of blocks: a page each.
    let b = SMALL_BLOCK_PAGES;
    assert_eq!(touch(&mut c, 5), PageRange::new(5, 6));
    assert_eq!(touch(&mut c, 3 * b + 2), PageRange::new(3 * b + 2, 3 * b + 3));
    // A second in the first block fills its untouched pages around it.
    assert_eq!(touch(&mut c, 9), PageRange::new(6, b));
    assert_eq!(touch(&mut c, 1), PageRange::new(0, 5));
    // A first touch of a block whose lower neighbour is live to its last
    // page: a page still (the kernel's residency after one touch).
    assert_eq!(touch(&mut c, b + 3), PageRange::new(b + 3, b + 4));
}

#[test]
fn an_in_thread_writer_stops_at_the_in_thread_window() {
    const { assert!(IN_THREAD_ZERO_WINDOW_PAGES < MAX_WINDOW_PAGES) };
    let runs = sequential(&mut core(), true, true, 10);
    // The second fault fills the rest of its block; then one page until
    // the streak.
    assert_eq!(runs[..3], [1, SMALL_BLOCK_PAGES - 1, 1]);
    assert_eq!(*runs.iter().max().unwrap(), IN_THREAD_ZERO_WINDOW_PAGES);
    assert_eq!(*runs.last().unwrap(), IN_THREAD_ZERO_WINDOW_PAGES, "the streak goes on: the window stays");
}

#[test]
fn an_in_thread_reader_keeps_the_largest_window() {
    // (A read fault maps the zero page: no frame to allocate, so a large
    // window costs the thread little.)
    let runs = sequential(&mut core(), false, true, 10);
    assert_eq!(*runs.last().unwrap(), MAX_WINDOW_PAGES);
}
