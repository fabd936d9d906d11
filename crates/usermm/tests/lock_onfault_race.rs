//! Found by the C ABI test: after `mlock2(MLOCK_ONFAULT)`, the first touch of
//! a page must leave it resident *and locked* (SPEC §3, seed 000: "the others
//! are locked when they are first touched"). Now and then the page comes back
//! `RESIDENT | DIRTY` without `LOCKED`.

mod common;

use usermm::consts::{MLOCK_ONFAULT, UMM_PAGE_LOCKED, UMM_PAGE_RESIDENT};
use usermm::Config;

const PAGE: usize = 4096;

#[test]
fn touched_lock_on_fault_page_is_locked() {
    let s = common::open_mode(&Config {
        budget_bytes: 8 << 20,
        swap_bytes: 64 << 20,
        reserve_bytes: 1 << 30,
        ..Config::default()
    })
    .unwrap();
    // Some pressure first, as in the C test: pages go to swap and back.
    {
        let mut big = s.map_anon(32 << 20).unwrap();
        for i in (0..big.len()).step_by(PAGE) {
            big[i] = 1;
        }
    }
    let mut bad = Vec::new();
    for round in 0..300 {
        let mut m = s.map_anon(16 * PAGE).unwrap();
        s.mlock2(m.addr(), 4 * PAGE, MLOCK_ONFAULT).unwrap();
        m[0] = 7;
        let mut st = [0u32; 1];
        s.page_state(m.addr(), 1, &mut st).unwrap();
        if st[0] & (UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED) != UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED {
            bad.push((round, st[0]));
        }
        s.munlock(m.addr(), 4 * PAGE).unwrap();
    }
    s.validate();
    assert!(bad.is_empty(), "touched lock-on-fault pages not locked (round, state): {bad:?}");
}
