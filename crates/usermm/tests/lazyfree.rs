//! MADV_FREE (seed 001): data intact right after the call, reuse with no
//! fault, swapped pages freed at once (read back as zeros), clean lazily
//! freed pages discarded under pressure before any dirty page is swapped,
//! written ones kept whole, host-side discards read back as zeros — never a
//! byte that is neither the last value written nor zero.

use usermm::consts::*;
use usermm::{Config, Errno, Space};
use usermm_sys::kernel::{peek, poke};

mod common;
use common::space;

const PS: usize = 4096;

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
    let pages = m.len() / PS;
    let mut st = vec![0u32; pages];
    s.page_state(m.addr(), pages, &mut st).unwrap();
    let swapped: Vec<usize> = (0..pages).filter(|&p| st[p] & UMM_PAGE_SWAPPED != 0).collect();
    assert!(!swapped.is_empty());
    // SAFETY: every page is only compared against "its data or zeros"
    // afterwards, one fresh borrow per read (the test of lazy free itself).
    unsafe { m.advise_unchecked(0, m.len(), MADV_FREE) }.unwrap();
    // The pages that were in swap are freed by the call itself (reclaim may
    // swap other pages afterwards, but those were resident at the call).
    s.page_state(m.addr(), pages, &mut st).unwrap();
    for &p in &swapped {
        assert_eq!(st[p] & (UMM_PAGE_SWAPPED | UMM_PAGE_RESIDENT), 0, "page {p} was in swap: freed at once");
    }
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
        if swapped.contains(&i) && i % 7 != 0 {
            assert_eq!(c[0], 0, "page {i} was freed from swap: reads zero");
        }
        if i % 7 == 0 {
            assert_eq!((c[0], c[1]), (want, 0xEE), "page {i} written after the free");
        } else {
            assert!(c[0] == want || c[0] == 0, "page {i}: {} is neither its data nor zero", c[0]);
        }
    }
    s.validate();
}

fn anon(s: &Space, len: usize) -> usize {
    s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap()
}

fn fill(a: usize, pages: usize, v: u8) {
    for p in 0..pages {
        poke(a + p * PS, v);
        poke(a + p * PS + PS - 1, v);
    }
}

#[test]
fn reuse_after_free_takes_no_fault() {
    let s = space(64, 64);
    let a = anon(&s, 256 * PS);
    fill(a, 256, 1);
    for round in 2..10u8 {
        s.madvise(a, 256 * PS, MADV_FREE).unwrap();
        let faults = s.stats().faults;
        fill(a, 256, round);
        assert_eq!(s.stats().faults, faults, "round {round}: reuse of lazily freed pages faulted");
    }
    for p in 0..256 {
        assert_eq!(peek(a + p * PS), 9);
    }
    s.validate();
}

#[test]
fn clean_lazy_pages_are_discarded_before_any_dirty_page_is_swapped() {
    // Budget 4 MiB: a dirty region D (1.5 MiB, older), a lazily freed region
    // L (2 MiB, newer); then 2 MiB of new pages must push 2 MiB out.
    let s = space(4, 64);
    let d = anon(&s, 384 * PS);
    fill(d, 384, 0xD);
    let l = anon(&s, 512 * PS);
    fill(l, 512, 0x1);
    // A few lazily freed pages are written again afterwards: they must be
    // kept whole, never discarded.
    s.madvise(l, 512 * PS, MADV_FREE).unwrap();
    for p in (0..512).step_by(64) {
        poke(l + p * PS, 0x2);
        poke(l + p * PS + PS - 1, 0x2);
    }
    let before = s.stats();
    let n = anon(&s, 512 * PS);
    fill(n, 512, 0xE);
    let after = s.stats();
    assert!(after.lazyfree_discards - before.lazyfree_discards >= 256, "discards: {after:?}");
    // The rewritten lazy pages are ordinary dirty pages and may be swapped;
    // no page of D may be swapped while clean lazy pages remained.
    let mut st = vec![0u32; 384];
    s.page_state(d, 384, &mut st).unwrap();
    assert!(
        st.iter().all(|x| x & UMM_PAGE_SWAPPED == 0),
        "a dirty page was swapped before the lazy ones were discarded"
    );
    for p in 0..512 {
        let (a, b) = (peek(l + p * PS), peek(l + p * PS + PS - 1));
        if p % 64 == 0 {
            assert_eq!((a, b), (0x2, 0x2), "page {p} written after MADV_FREE");
        } else {
            assert!((a, b) == (0x1, 0x1) || (a, b) == (0, 0), "page {p}: ({a}, {b}) is neither its data nor zero");
        }
    }
    for p in 0..384 {
        assert_eq!(peek(d + p * PS), 0xD);
    }
    s.validate();
}

// MADV_PAGEOUT over lazily freed pages: the clean ones are discarded with
// no I/O (read back as zeros), the ones written since are paged out as any
// page (the kernel comparison is conformance.rs,
// `pageout_discards_clean_lazily_freed_pages`). It kept all of them once,
// swapped out and no longer lazily freed: 0 discards, 64 swap-outs.
#[test]
fn pageout_discards_clean_lazily_freed_pages_and_swaps_written_ones() {
    let s = space(64, 64);
    let a = anon(&s, 64 * PS);
    fill(a, 64, 0x5);
    s.madvise(a, 64 * PS, MADV_FREE).unwrap();
    let written = |p: usize| p % 4 == 1;
    for p in (0..64).filter(|&p| written(p)) {
        poke(a + p * PS + 1, 0x6);
    }
    let before = s.stats();
    s.madvise(a, 64 * PS, MADV_PAGEOUT).unwrap();
    let after = s.stats();
    assert_eq!(after.lazyfree_discards - before.lazyfree_discards, 48, "clean pages discarded: {after:?}");
    assert_eq!(after.swapouts - before.swapouts, 16, "only the written pages go to swap: {after:?}");
    assert_eq!(after.lazyfree_pages, 0, "{after:?}");
    let mut st = vec![0u32; 64];
    s.page_state(a, 64, &mut st).unwrap();
    for (p, &x) in st.iter().enumerate() {
        let want = if written(p) { UMM_PAGE_SWAPPED } else { 0 };
        assert_eq!(x & (UMM_PAGE_SWAPPED | UMM_PAGE_RESIDENT | UMM_PAGE_LAZYFREE), want, "page {p}: {x:#x}");
    }
    for p in 0..64 {
        let got = (peek(a + p * PS), peek(a + p * PS + 1), peek(a + p * PS + PS - 1));
        let want = if written(p) { (0x5, 0x6, 0x5) } else { (0, 0, 0) };
        assert_eq!(got, want, "page {p}");
    }
    s.validate();
}

#[test]
fn swapped_in_page_freed_again_is_discardable_again() {
    // The seed's subtle case (the kernel had to clear PG_dirty for it).
    let s = space(4, 64);
    let a = anon(&s, 64 * PS);
    fill(a, 64, 7);
    for _ in 0..10 {
        s.madvise(a, 64 * PS, MADV_PAGEOUT).unwrap();
    }
    let mut st = vec![0u32; 64];
    s.page_state(a, 64, &mut st).unwrap();
    assert!(st.iter().any(|x| x & UMM_PAGE_SWAPPED != 0));
    for p in 0..64 {
        assert_eq!(peek(a + p * PS), 7); // swapped back in
    }
    s.madvise(a, 64 * PS, MADV_FREE).unwrap();
    let before = s.stats().lazyfree_discards;
    let n = anon(&s, 8 << 20);
    fill(n, 2048, 1);
    assert!(s.stats().lazyfree_discards - before >= 32, "swapped-in pages were not discardable: {:?}", s.stats());
    for p in 0..64 {
        let v = peek(a + p * PS);
        assert!(v == 7 || v == 0);
    }
    s.validate();
}

#[test]
fn a_page_the_host_discards_reads_back_as_zeros_and_is_counted() {
    let s = space(64, 64);
    let a = anon(&s, 32 * PS);
    fill(a, 32, 5);
    s.madvise(a, 32 * PS, MADV_FREE).unwrap();
    // Host memory pressure, simulated: the host reclaims the range now.
    usermm_sys::testing::host_pageout(a, 32 * PS).unwrap();
    let before = s.stats();
    let mut zeros = 0;
    for p in 0..32 {
        // The host may keep a page (it decides); a dropped one reads zeros,
        // never stale data from anywhere else.
        match peek(a + p * PS) {
            0 => zeros += 1,
            5 => {}
            v => panic!("page {p} reads {v}"),
        }
    }
    let after = s.stats();
    // (Which pages the host drops is its decision; pages still in another
    // CPU's LRU batch may be skipped.)
    assert!(zeros >= 1, "the host dropped none of 32 clean lazily freed pages");
    assert_eq!(after.lazyfree_discards - before.lazyfree_discards, zeros, "every host discard is counted");
    // Writable again, and counted as ordinary memory.
    fill(a, 32, 6);
    assert_eq!(peek(a + 31 * PS), 6);
    s.validate();
}

#[test]
fn the_lazyfree_bound_discards_the_oldest_at_once() {
    let s = Space::open(&common::with_test_store(Config {
        budget_bytes: 64 << 20,
        swap_bytes: 64 << 20,
        lazyfree_max_bytes: 64 * PS,
        ..Config::default()
    }))
    .unwrap();
    let a = anon(&s, 256 * PS);
    fill(a, 256, 3);
    s.madvise(a, 256 * PS, MADV_FREE).unwrap();
    let st = s.stats();
    assert!(st.lazyfree_pages <= 64, "lazily freed pages kept past the bound: {st:?}");
    assert!(st.lazyfree_discards > 0, "nothing discarded: {st:?}");
    for p in 0..256 {
        let v = peek(a + p * PS);
        assert!(v == 3 || v == 0, "page {p} reads {v}");
    }
    s.validate();
}

#[test]
fn free_and_reuse_loop_under_pressure_never_fails() {
    // The madvfree experiment's pressure row: chunks twice the budget,
    // memset a random part, MADV_FREE it, reuse.
    let s = space(8, 64);
    let mut m = s.map_anon(16 << 20).unwrap();
    m.fill(1);
    let chunk = 2 << 20;
    let mut x = 0x9E3779B97F4A7C15u64;
    for op in 0..600u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let c = (x % 8) as usize;
        let len = ((256 << 10) + (x >> 8) as usize % ((2 << 20) - (256 << 10))) & !(PS - 1);
        let off = c * chunk;
        m[off..off + len].fill(op as u8);
        // Diagnostics for a failure: the host's view of the pages before the
        // check reads them, and the counters across the check.
        let host_before = pagemap(m.as_ptr() as usize + off, len / PS);
        let mut state_before = vec![0u32; len / PS];
        let _ = s.page_state(m.as_ptr() as usize + off, len / PS, &mut state_before);
        let before = s.stats();
        if let Some(i) = m[off..off + len].iter().position(|&b| b != op as u8) {
            let wrong = m[off + i..off + len].iter().take_while(|&&b| b != op as u8).count();
            let mut st = [0u32; 1];
            let _ = s.page_state(m.as_ptr() as usize + off + (i & !(PS - 1)), 1, &mut st);
            panic!(
                "op {op}: chunk {c} byte {i:#x} (page {}) reads {} for {wrong} bytes, not {}; host pagemap before \
                 the check {:#x}, page state before {:#x} after {:#x}; before the check {before:?}; after {:?}",
                (off + i) / PS,
                m[off + i],
                op as u8,
                host_before[i / PS],
                state_before[i / PS],
                st[0],
                s.stats()
            );
        }
        // SAFETY: the range is written (filled) before it is read again.
        unsafe { m.advise_unchecked(off, len, MADV_FREE) }.unwrap();
    }
    let st = s.stats();
    eprintln!("{st:?}");
    assert_eq!(st.oom_sigbus, 0);
    s.validate();
}

/// The host's pagemap entries of `n` pages from `a` (bit 63 present, 62
/// swapped).
fn pagemap(a: usize, n: usize) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut buf = vec![0u8; n * 8];
    f.read_exact_at(&mut buf, (a / PS * 8) as u64).unwrap();
    buf.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn a_page_written_after_free_keeps_its_entire_contents_under_pressure() {
    // Every byte of each page holds a pattern; after MADV_FREE one byte of
    // some pages is written again. Under pressure those pages must keep the
    // whole old page plus the write (Linux: the write cancels the lazy free
    // for the whole page); the others read back whole or as all zeros.
    let s = space(4, 64);
    let a = anon(&s, 256 * PS);
    let pat = |p: usize, i: usize| (p * 31 + i * 7) as u8 | 1;
    for p in 0..256 {
        for i in (0..PS).step_by(64) {
            poke(a + p * PS + i, pat(p, i));
        }
    }
    s.madvise(a, 256 * PS, MADV_FREE).unwrap();
    for p in (0..256).step_by(3) {
        poke(a + p * PS + 100, 0xEE);
    }
    {
        let mut q = s.map_anon(16 << 20).unwrap();
        for round in 1..=2u8 {
            for c in q.chunks_mut(PS) {
                c[0] = round;
            }
        }
    }
    assert!(s.stats().lazyfree_discards > 0, "pressure discarded nothing: {:?}", s.stats());
    for p in 0..256 {
        let zero = peek(a + p * PS) == 0;
        for i in (0..PS).step_by(64) {
            let got = peek(a + p * PS + i);
            if p % 3 == 0 {
                assert_eq!(got, pat(p, i), "page {p} byte {i}: written after the free, must be whole");
            } else if zero {
                assert_eq!(got, 0, "page {p} byte {i}: a discarded page is all zeros");
            } else {
                assert_eq!(got, pat(p, i), "page {p} byte {i}: a kept page is whole");
            }
        }
        if p % 3 == 0 {
            assert_eq!(peek(a + p * PS + 100), 0xEE);
        }
    }
    s.validate();
}
