//! Pressure's end: once the budget has stayed calm for a while (no frame
//! claimed, no refill), the pages reclaim parked go back in bulk, without a
//! fault, and a working set that fits runs at memory speed — no fault at
//! all — instead of paying a fault for each parked page it touches.
//! (docs/design.md, "Pressure's end".)

use std::time::{Duration, Instant};

use usermm::consts::*;
use usermm_sys::kernel::{peek, poke};

mod common;
use common::{fill, space_pages as space};

const PS: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const BUDGET: usize = 1024;
const PAGES: usize = 4 * BUDGET;
/// The working set that fits: three quarters of the budget.
const FITS: usize = 3 * BUDGET / 4;

fn expect(a: usize, p: usize, tag: u8) {
    let want = tag.wrapping_add(p as u8);
    assert_eq!((peek(a + p * PS), peek(a + p * PS + PS - 1)), (want, want), "page {p}");
}

/// Waits (up to 5 s) until `done` holds for the space's statistics.
fn wait_for(s: &usermm::Space, what: &str, done: impl Fn(&usermm::Stats) -> bool) -> usermm::Stats {
    let t = Instant::now();
    loop {
        let st = s.stats();
        if done(&st) {
            return st;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{what}: {st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn parked_pages_go_back_when_pressure_ends() {
    let s = space(BUDGET, 2 * PAGES, 0);
    let a = s.mmap(0, PAGES * PS, RW, ANON, -1, 0).unwrap();
    // Pressure: 4× the budget written, then the working set read back a
    // few times while reclaim ages what it brings in.
    fill(a, 0..PAGES, 1);
    let filled = s.stats();
    for _ in 0..3 {
        for p in 0..FITS {
            expect(a, p, 1);
        }
    }
    let under = s.stats();
    assert!(under.swapouts > 0 && under.deactivations > 0, "no pressure to end: {under:?}");
    // Calm: nothing claimed from here on. The parked pages go back (or
    // went back already while the working set was read: a run of parked
    // pages touched with no claim ends pressure at once).
    let calm = wait_for(&s, "parked pages still parked", |st| st.inactive_pages == 0);
    assert!(calm.unparked_pages > filled.unparked_pages, "nothing was mapped back in bulk: {calm:?}");
    assert_eq!(calm.minor_faults, under.minor_faults, "mapped back by faults, not in bulk");
    // The working set, read again: not a single fault.
    for _ in 0..3 {
        for p in 0..FITS {
            expect(a, p, 1);
        }
    }
    let read = s.stats();
    assert_eq!(read.faults, calm.faults, "faults after pressure ended: {read:?}");
    // And written: only the first write to a page read back from swap
    // faults (its swap copy ends there, as on Linux), nothing is read or
    // evicted.
    for round in 0..3u8 {
        for p in 0..FITS {
            expect(a, p, 1 + round);
            poke(a + p * PS, (2 + round).wrapping_add(p as u8));
            poke(a + p * PS + PS - 1, (2 + round).wrapping_add(p as u8));
        }
    }
    let after = s.stats();
    assert!(after.faults - read.faults <= calm.swap_cached_pages, "{after:?}");
    assert_eq!((after.swapins, after.evictions), (calm.swapins, calm.evictions), "after pressure ended: {after:?}");
    assert!(after.resident_pages <= after.budget_pages);
    // Pressure again: the pages that went back are evicted as before, and
    // every byte survives.
    fill(a, FITS..PAGES, 9);
    for p in 0..FITS {
        expect(a, p, 4);
    }
    for p in FITS..PAGES {
        expect(a, p, 9);
    }
    let again = s.stats();
    assert!(again.evictions > after.evictions && again.deactivations > after.deactivations, "{again:?}");
    s.validate();
}

/// Pages parked by `MADV_COLD` with no pressure at all stay parked: the
/// program said they are cold, and nothing ended.
#[test]
fn pages_parked_by_madv_cold_without_pressure_stay_parked() {
    let s = space(BUDGET, 2 * PAGES, 0);
    let a = s.mmap(0, FITS * PS, RW, ANON, -1, 0).unwrap();
    fill(a, 0..FITS, 3);
    s.madvise(a, FITS / 2 * PS, MADV_COLD).unwrap();
    let cold = s.stats();
    assert!(cold.inactive_pages >= (FITS / 2) as u64, "{cold:?}");
    std::thread::sleep(Duration::from_millis(200));
    let later = s.stats();
    assert_eq!(later.inactive_pages, cold.inactive_pages, "{later:?}");
    assert_eq!(later.unparked_pages, 0, "{later:?}");
    for p in 0..FITS {
        expect(a, p, 3);
    }
    s.validate();
}
