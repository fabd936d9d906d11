//! Recycled frames (docs/design.md, "Recycled frames"): the frames of
//! evicted pages go to the space's pool and are moved into later zero fills
//! and swap-ins of read-write, unlocked regions. A recycled frame never
//! shows another page's bytes (this test fails if the zeroing before a zero
//! fill is taken out), a swap-in into one reads back exactly, the pool stays
//! within the budget's free frames; it is opt-in (`UMM_F_FRAME_POOL`).

use usermm::consts::*;
use usermm::{Config, Space};

mod common;

const PS: usize = 4096;
const BUDGET: usize = 256;
const SECRET: u8 = 0xa5;

/// A space of the test's size with `flags` plus the test run's own (swap
/// store, in-thread faults), the frame pool exactly when `pool`.
fn space(pool: bool) -> Space {
    let mut cfg =
        common::with_test_store(Config { budget_bytes: BUDGET * PS, swap_bytes: 8192 * PS, ..Config::default() });
    cfg.flags = if pool { cfg.flags | UMM_F_FRAME_POOL } else { cfg.flags & !UMM_F_FRAME_POOL };
    Space::open(&cfg).expect("umm_open (the native tests need userfaultfd)")
}

/// The stats once `resident_pages + pool_frames <= budget_pages`: the pool
/// counts in the budget. A snapshot may count one frame twice while an
/// eviction is in flight (its frame is moved to the pool when its write is
/// done, and its commit, a moment later, takes the page off
/// `resident_pages`; docs/design.md, "Recycled frames"), so the check waits
/// up to 2 s for the background reclaim's evictions to commit; a pool that
/// is not trimmed stays over and fails.
fn within_budget(s: &Space) -> usermm::Stats {
    let t0 = std::time::Instant::now();
    loop {
        let st = s.stats();
        if st.pool_frames + st.resident_pages <= st.budget_pages {
            return st;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "the pool counts in the budget: {st:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Fills 2,048 pages with `SECRET` through a 256-page budget (their frames
/// are evicted, recycled), then maps 512 fresh pages and writes one byte of
/// each (zero fills), then writes one byte of each secret page (swap-ins
/// with a write: not write-protected). Returns the stats at the end.
fn run(s: &Space) -> usermm::Stats {
    let mut secret = s.map_anon(2048 * PS).unwrap();
    secret.advise(MADV_RANDOM).unwrap();
    secret.fill(SECRET);
    let st = within_budget(s);
    assert!(st.swapouts > 0, "the secret pages must be evicted: {st:?}");

    let mut fresh = s.map_anon(512 * PS).unwrap();
    fresh.advise(MADV_RANDOM).unwrap();
    for p in 0..512 {
        fresh[p * PS + 7] = p as u8;
        // A recycled frame that was not zeroed shows the secret here.
        let page = &fresh[p * PS..(p + 1) * PS];
        for (i, &b) in page.iter().enumerate() {
            let want = if i == 7 { p as u8 } else { 0 };
            assert_eq!(b, want, "fresh page {p} byte {i}: a zero fill showed another page's bytes");
        }
    }
    for p in 0..2048 {
        secret[p * PS + 100] = 1;
        let page = &secret[p * PS..(p + 1) * PS];
        for (i, &b) in page.iter().enumerate() {
            let want = if i == 100 { 1 } else { SECRET };
            assert_eq!(b, want, "secret page {p} byte {i} after its swap-in");
        }
    }
    let st = within_budget(s);
    s.validate();
    st
}

#[test]
fn recycled_frames_are_zeroed_or_overwritten_and_within_the_budget() {
    let s = space(true);
    let st = run(&s);
    assert!(st.pool_fills > 0, "no fill took a recycled frame: {st:?}");
    s.close().unwrap();
}

#[test]
fn no_frame_pool_without_the_flag() {
    let s = space(false);
    let st = run(&s);
    assert_eq!((st.pool_frames, st.pool_fills), (0, 0), "no UMM_F_FRAME_POOL: {st:?}");
    s.close().unwrap();
}
