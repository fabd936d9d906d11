//! MADV_FREE (seed 001) — the semantics usermm guarantees today: data intact
//! right after the call, swapped pages freed at once (read back as zeros),
//! lazily freed pages counted, never a byte that is neither the last value
//! written nor zero. (Discarding clean lazily freed pages under pressure
//! instead of swapping them needs write tracking: not done yet.)

use usermm::consts::*;
use usermm::{Config, Errno, Space};
use usermm_sys::kernel::{peek, poke};

const PS: usize = 4096;

fn space(budget_mib: usize, swap_mib: usize) -> Space {
    Space::open(&Config { budget_bytes: budget_mib << 20, swap_bytes: swap_mib << 20, ..Config::default() }).unwrap()
}

#[test]
fn rules_and_data_intact() {
    let s = space(64, 64);
    let a = s.mmap(0, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    for p in 0..16 {
        poke(a + p * PS, p as u8 + 1);
    }
    assert_eq!(s.madvise(a + 1, PS, MADV_FREE), Err(Errno::EINVAL));
    assert_eq!(s.madvise(a, 0, MADV_FREE), Ok(()));
    s.madvise(a, 16 * PS, MADV_FREE).unwrap();
    assert_eq!(s.stats().lazyfree_pages, 16);
    assert!(s.smaps().contains("LazyFree:             64 kB"), "{}", s.smaps());
    let mut st = vec![0u32; 16];
    s.page_state(a, 16, &mut st).unwrap();
    assert!(st.iter().all(|x| x & UMM_PAGE_LAZYFREE != 0));
    for p in 0..16 {
        assert_eq!(peek(a + p * PS), p as u8 + 1, "data intact right after MADV_FREE");
    }
    let shared = s.mmap(0, PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0).unwrap();
    assert_eq!(s.madvise(shared, PS, MADV_FREE), Err(Errno::EINVAL));
    let locked = s.mmap(0, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0).unwrap();
    assert_eq!(s.madvise(locked, PS, MADV_FREE), Err(Errno::EINVAL));
    // A hole: both sides advised, then ENOMEM.
    s.munmap(a + 8 * PS, PS).unwrap();
    assert_eq!(s.madvise(a, 16 * PS, MADV_FREE), Err(Errno::ENOMEM));
    s.validate();
}

#[test]
fn swapped_pages_are_freed_at_once_and_pressure_never_corrupts() {
    let s = space(4, 64);
    let mut m = s.map_anon(16 << 20).unwrap();
    for (i, c) in m.chunks_mut(PS).enumerate() {
        c[0] = (i % 251) as u8 + 1;
    }
    let before = s.stats();
    assert!(before.swapped_pages > 0);
    s.madvise(m.addr(), m.len(), MADV_FREE).unwrap();
    let after = s.stats();
    assert_eq!(after.swapped_pages, 0, "swapped pages freed at once");
    // Write some pages after the free: they must survive pressure intact.
    for (i, c) in m.chunks_mut(PS).enumerate().step_by(7) {
        c[0] = (i % 251) as u8 + 1;
        c[1] = 0xEE;
    }
    {
        let mut p = s.map_anon(16 << 20).unwrap();
        p.fill(3);
    }
    for (i, c) in m.chunks(PS).enumerate() {
        let want = (i % 251) as u8 + 1;
        if i % 7 == 0 {
            assert_eq!((c[0], c[1]), (want, 0xEE), "page {i} written after the free");
        } else {
            assert!(c[0] == want || c[0] == 0, "page {i}: {} is neither its data nor zero", c[0]);
        }
    }
    s.validate();
}
