//! The LRU's upkeep stays short per call: a large `munmap` leaves every page
//! of its range stale in the lists at once, and compaction then sweeps them
//! a little at a time. A fault-around window's commit pushes each of its
//! pages; it must not sweep a chunk per page (a 256-page window swept 256
//! chunks, 0.7 ms under the core lock, and every other thread's fault waited
//! for it: the second thread's worst stall in `usermm bench munmap`).

mod common;

use usermm_core::consts::MADV_SEQUENTIAL;
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, PageRange};

use common::{at, map_at, pages, BASE};

const BIG: u64 = 32_768;
const SECOND: u64 = 8_192;

/// Faults page `p` for a write and commits the whole plan; returns its run.
fn touch(c: &mut Core, p: u64) -> PageRange {
    let plan = c.fault(Addr(BASE + p * 4096), true);
    match plan {
        FaultPlan::ZeroFill { run } => {
            c.fill_done(&plan, run.pages());
            run
        }
        other => panic!("page {p}: unexpected plan {other:?}"),
    }
}

#[test]
fn a_window_commit_during_a_large_unmap_sweeps_a_few_chunks() {
    let mut c = Core::new(CoreConfig {
        base: BASE,
        reserve_pages: BIG + SECOND + 64,
        page_shift: 12,
        budget_pages: BIG + SECOND,
        swap_slots: 0,
        staging_slots: 64,
        max_regions: 100,
        memlock_pages: u64::MAX,
        mlock_allowed: true,
        exact_faults: false,
    });
    // A populated region, and a second one faulted in 256-page windows.
    map_at(&mut c, 0, BIG);
    let mut p = 0;
    while p < BIG {
        p = touch(&mut c, p).end.0;
    }
    map_at(&mut c, BIG, SECOND);
    let (_, r) = c.madvise(at(BIG), pages(SECOND), MADV_SEQUENTIAL);
    r.expect("madvise");
    // Unmap the first in 1024-page chunks (the executor's zap), a window of
    // the second committed after each chunk.
    let d = c.munmap(at(0), pages(BIG)).expect("munmap").expect("detached");
    let mut next = BIG;
    let mut worst = 0;
    let mut windows = 0;
    for r in &d.ranges {
        let mut s = r.start.0;
        while s < r.end.0 {
            let e = (s + 1024).min(r.end.0);
            let claim = c.zap_begin(PageRange::new(s, e)).expect("nothing busy");
            c.zap_end(&claim);
            s = e;
            if next < BIG + SECOND {
                let before = c.lru_sweep_work();
                let run = touch(&mut c, next);
                assert_eq!(run.pages(), 256, "a sequential region's window");
                worst = worst.max(c.lru_sweep_work() - before);
                windows += 1;
                next = run.end.0;
            }
        }
    }
    c.unhold(&d);
    c.validate();
    assert_eq!(windows, SECOND / 256);
    // The zap left the lists stale: compaction ran (its work counted).
    assert!(c.lru_sweep_work() > 0, "no compaction at all: the test does not reach it");
    assert!(worst <= 8, "a 256-page window's commit swept up to {worst} chunks of 512 entries");
}
