mod common;

use usermm::{Config, Space};

#[test]
fn touch_and_evict() {
    let s = Space::open(&common::with_test_store(Config {
        budget_bytes: 4 << 20,
        swap_bytes: 64 << 20,
        ..Config::default()
    }))
    .unwrap();
    let mut m = s.map_anon(16 << 20).unwrap();
    for i in (0..m.len()).step_by(4096) {
        m[i] = (i / 4096) as u8;
        m[i + 1] = 0xAB;
    }
    let st = s.stats();
    eprintln!("{st:?}");
    assert!(st.resident_pages_max <= st.budget_pages);
    for i in (0..m.len()).step_by(4096) {
        assert_eq!(m[i], (i / 4096) as u8, "page {}", i / 4096);
        assert_eq!(m[i + 1], 0xAB);
    }
    let st = s.stats();
    eprintln!("{st:?}");
    assert!(st.swapouts > 0 && st.swapins > 0);
    s.validate();
}
