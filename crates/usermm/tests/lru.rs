//! LRU quality: a hot set that the program keeps using survives a cold scan
//! eight times the budget; and (negative control) a hot set that is not used
//! during the scan is evicted, which shows the first test can fail.
//!
//! Note: usermm cannot see accesses to a page that is mapped (no accessed
//! bits under userfaultfd); it ages pages by deactivating them (unmapping
//! them into the staging area) and sees the next touch as a minor fault. A
//! hot page that is touched while inactive goes back to the active list.
//! Inactive pages are resident (`UMM_PAGE_RESIDENT | UMM_PAGE_INACTIVE`).

mod common;
mod pattern;

use pattern::{bad_bytes, fill_page};
use usermm::consts::{UMM_PAGE_RESIDENT, UMM_PAGE_SWAPPED};
use usermm::{Config, Space};

const PAGE: usize = 4096;
const BUDGET: usize = 32 << 20;
const SWAP: usize = 256 << 20;
const HOT_PAGES: usize = 512; // 2 MiB
const COLD_BYTES: usize = 256 << 20; // 8 x budget
const COLD_PAGES: usize = COLD_BYTES / PAGE;
const PASS_EVERY: usize = 64;

struct Outcome {
    hot_resident: usize,
    hot_swapped: usize,
    swapins_during_scan: u64,
    hot_passes: usize,
    /// The hot passes that had to read hot pages back from swap: (pass,
    /// cold pages written before it, swap-ins).
    swapin_passes: Vec<(usize, usize, u64)>,
    corrupted: usize,
}

/// Writes the hot set, then scans the cold region once (one write per
/// page), reading every hot page after each `PASS_EVERY` cold pages when
/// `retouch`. Returns what became of the hot set.
fn hot_vs_cold_scan(retouch: bool) -> Outcome {
    let space =
        Space::open(&common::with_test_store(Config { budget_bytes: BUDGET, swap_bytes: SWAP, ..Config::default() }))
            .expect("open");
    let mut hot = space.map_anon(HOT_PAGES * PAGE).expect("mmap hot");
    let mut cold = space.map_anon(COLD_BYTES).expect("mmap cold");
    for p in 0..HOT_PAGES {
        fill_page(&mut hot[p * PAGE..(p + 1) * PAGE], p as u64, 1);
    }
    let before = space.stats();
    let mut hot_passes = 0;
    let mut sum = 0u64;
    let mut last_swapins = before.swapins;
    let mut swapin_passes = Vec::new();
    for c in 0..COLD_PAGES {
        cold[c * PAGE] = 1;
        if retouch && (c + 1) % PASS_EVERY == 0 {
            // Read one word of every hot page, as a program using its hot data.
            for p in 0..HOT_PAGES {
                sum = sum.wrapping_add(hot[p * PAGE + 8] as u64);
            }
            hot_passes += 1;
            let now = space.stats().swapins;
            if now != last_swapins {
                // (pass, cold pages written so far, hot pages read back from swap)
                swapin_passes.push((hot_passes, c + 1, now - last_swapins));
                last_swapins = now;
            }
        }
    }
    std::hint::black_box(sum);
    let after = space.stats();
    // The state of the hot set at the end of the scan, before it is read again.
    let mut st = vec![0u32; HOT_PAGES];
    space.page_state(hot.addr(), HOT_PAGES, &mut st).expect("page_state");
    let hot_resident = st.iter().filter(|&&s| s & UMM_PAGE_RESIDENT != 0).count();
    let hot_swapped = st.iter().filter(|&&s| s & UMM_PAGE_SWAPPED != 0).count();
    // Whatever happened, the hot data must be intact.
    let corrupted = (0..HOT_PAGES).map(|p| bad_bytes(&hot[p * PAGE..(p + 1) * PAGE], p as u64, 1)).sum();
    let end = space.stats();
    assert!(end.resident_pages_max <= end.budget_pages);
    assert!(
        end.swapouts as usize >= COLD_PAGES - BUDGET / PAGE - HOT_PAGES,
        "the cold scan must have been swapped out"
    );
    assert_eq!(end.oom_sigbus, 0);
    eprintln!(
        "lru (retouch={retouch}): hot resident {hot_resident}/{HOT_PAGES} ({:.1}%), hot swapped {hot_swapped}, \
         swap-ins during the scan {}, minor faults during the scan {}, hot passes {hot_passes}, swapouts {}; passes with swap-ins (pass, cold pages so far, \
         swap-ins): {swapin_passes:?}",
        100.0 * hot_resident as f64 / HOT_PAGES as f64,
        after.swapins - before.swapins,
        after.minor_faults - before.minor_faults,
        after.swapouts - before.swapouts,
    );
    drop(cold);
    drop(hot);
    space.validate();
    Outcome {
        hot_resident,
        hot_swapped,
        swapins_during_scan: after.swapins - before.swapins,
        hot_passes,
        swapin_passes,
        corrupted,
    }
}

#[test]
fn hot_set_survives_cold_scan() {
    let o = hot_vs_cold_scan(true);
    assert_eq!(o.corrupted, 0, "hot data corrupted");
    assert_eq!(o.hot_passes, COLD_PAGES / PASS_EVERY);
    assert_eq!(o.hot_resident + o.hot_swapped, HOT_PAGES);
    assert!(
        o.hot_resident * 100 >= HOT_PAGES * 95,
        "only {}/{} hot pages resident after the cold scan ({} swapped, {} swap-ins during the scan)",
        o.hot_resident,
        HOT_PAGES,
        o.hot_swapped,
        o.swapins_during_scan
    );
}

/// Stronger: the hot set is never pushed out during the scan at all (at most
/// 5% of it is read back from swap by the hot passes). Still fails: the
/// background thread ages pages from half the budget on, but a sequential
/// scan this fast outruns it; when the budget fills with the inactive list
/// empty, direct reclaim deactivates and evicts in one call and the hot set
/// goes to swap (~710 swap-ins at two passes, near cold pages 7,700 and
/// 8,000), then never again. Run with `--ignored` to see it.
#[test]
#[ignore = "known limitation: a scan faster than background aging empties the inactive list; direct reclaim then evicts the hot set (~710 swap-ins at two passes)"]
fn hot_set_not_swapped_during_cold_scan() {
    let o = hot_vs_cold_scan(true);
    assert_eq!(o.corrupted, 0, "hot data corrupted");
    assert!(
        (o.swapins_during_scan as usize) * 100 <= HOT_PAGES * 5,
        "{} swap-ins of hot pages during the scan, at passes {:?}",
        o.swapins_during_scan,
        o.swapin_passes
    );
}

/// Negative control: the same scan without using the hot set evicts it (the
/// pressure is real and an LRU without the re-touches would fail the test
/// above).
#[test]
fn untouched_hot_set_is_evicted() {
    let o = hot_vs_cold_scan(false);
    assert_eq!(o.corrupted, 0, "hot data corrupted");
    assert_eq!(o.swapins_during_scan, 0);
    assert!(
        o.hot_swapped * 100 >= HOT_PAGES * 90,
        "only {}/{} untouched hot pages were evicted by a scan of 8x the budget",
        o.hot_swapped,
        HOT_PAGES
    );
}

/// Pages of a read-only region are parked by a copy each and dropped from
/// the program's range in one batch (`Arena::pages_to_slots_copy`): after
/// `MADV_COLD` every page is parked, and its next touch is a minor fault
/// that brings the same bytes back — a page the batch failed to drop
/// would still be mapped and take no fault.
#[test]
fn read_only_pages_park_in_a_batch_and_fault_back_once_each() {
    use usermm::consts::{MADV_COLD, MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
    use usermm_sys::kernel::peek;
    const PAGES: usize = 256;
    let s = common::space_pages(1024, 4096, 0);
    let a = s.mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    common::fill(a, 0..PAGES, 5);
    s.mprotect(a, PAGES * PAGE, PROT_READ).unwrap();
    // Every other run of 8 pages first (runs of their own), then the whole
    // range: the rest, in one batch of separate runs.
    for r in (0..PAGES).step_by(16) {
        s.madvise(a + r * PAGE, 8 * PAGE, MADV_COLD).unwrap();
    }
    s.madvise(a, PAGES * PAGE, MADV_COLD).unwrap();
    let cold = s.stats();
    assert_eq!(cold.inactive_pages, PAGES as u64, "{cold:?}");
    for p in 0..PAGES {
        let want = 5u8.wrapping_add(p as u8);
        assert_eq!((peek(a + p * PAGE), peek(a + p * PAGE + PAGE - 1)), (want, want), "page {p}");
    }
    let back = s.stats();
    assert_eq!(back.minor_faults - cold.minor_faults, PAGES as u64, "{back:?}");
    assert_eq!(back.inactive_pages, 0, "{back:?}");
    s.validate();
}
