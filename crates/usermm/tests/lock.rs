//! Seed 000: mlock, mlock2(MLOCK_ONFAULT), munlock, mlockall, munlockall,
//! MAP_LOCKED and UMM_MAP_LOCKONFAULT, with Linux's rules.

mod common;

use usermm::consts::*;
use usermm::{Config, Errno, Space};

const PS: usize = 4096;

fn space(budget_mib: usize, swap_mib: usize, memlock: usize) -> Space {
    common::open_mode(&Config {
        budget_bytes: budget_mib << 20,
        swap_bytes: swap_mib << 20,
        memlock_bytes: memlock,
        ..Config::default()
    })
    .unwrap()
}

fn anon(s: &Space, len: usize) -> usize {
    s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap()
}

fn states(s: &Space, a: usize, n: usize) -> Vec<u32> {
    let mut v = vec![0; n];
    s.page_state(a, n, &mut v).unwrap();
    v
}

fn write(a: usize, v: u8) {
    usermm_sys::kernel::poke(a, v);
}

#[test]
fn flags_and_limits() {
    let s = space(64, 0, 16 * PS);
    let a = anon(&s, 64 * PS);
    assert_eq!(s.mlock2(a, PS, 2), Err(Errno::EINVAL));
    assert_eq!(s.mlock(a, 17 * PS), Err(Errno::ENOMEM), "beyond memlock_bytes");
    s.mlock(a, 16 * PS).unwrap();
    // Overlapping locks are not charged twice.
    s.mlock2(a, 16 * PS, MLOCK_ONFAULT).unwrap();
    assert_eq!(s.stats().locked_charged_pages, 16);
    let r = s.mmap(0, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    assert_eq!(r, Err(Errno::EAGAIN), "locked mmap beyond the limit");
    for f in [0, 8, MCL_ONFAULT] {
        assert_eq!(s.mlockall(f), Err(Errno::EINVAL), "mlockall({f})");
    }
    assert_eq!(s.mlockall(MCL_CURRENT), Err(Errno::ENOMEM), "mapped size beyond the limit");
    s.munlock(a, 64 * PS).unwrap();
    assert_eq!(s.stats().locked_charged_pages, 0);
    s.validate();

    let z = space(64, 0, 0);
    let a = anon(&z, 4 * PS);
    assert_eq!(z.mlock(a, PS), Err(Errno::EPERM));
    assert_eq!(z.mlock2(a, PS, MLOCK_ONFAULT), Err(Errno::EPERM));
    assert_eq!(z.mlockall(MCL_CURRENT), Err(Errno::EPERM));
    let flags = MAP_PRIVATE | MAP_ANONYMOUS;
    assert_eq!(z.mmap(0, PS, PROT_READ, flags | MAP_LOCKED, -1, 0), Err(Errno::EPERM));
    assert_eq!(z.mmap(0, PS, PROT_READ, flags | UMM_MAP_LOCKONFAULT, -1, 0), Err(Errno::EPERM));
}

#[test]
fn onfault_locks_only_touched_pages() {
    let s = space(64, 64, usize::MAX);
    let a = anon(&s, 8 * PS);
    // Unaligned start: widened to whole pages.
    s.mlock2(a + 100, 8 * PS - 100, MLOCK_ONFAULT).unwrap();
    assert!(states(&s, a, 8).iter().all(|st| st & UMM_PAGE_RESIDENT == 0), "nothing faulted in");
    assert_eq!(s.stats().locked_charged_pages, 8);
    write(a + 3 * PS, 7);
    let st = states(&s, a, 8);
    assert_ne!(st[3] & UMM_PAGE_LOCKED, 0);
    assert_eq!(st[4] & UMM_PAGE_RESIDENT, 0, "a neighbour is never faulted in");
    assert_eq!(s.stats().locked_pages, 1);
    let smaps = s.smaps();
    assert!(smaps.contains(" lo ") && smaps.contains(" lf "), "{smaps}");
    s.validate();
}

#[test]
fn full_lock_populates_and_splits_like_linux() {
    let s = space(64, 64, usize::MAX);
    let a = anon(&s, 8 * PS);
    s.mlock(a, 8 * PS).unwrap();
    assert!(states(&s, a, 8)
        .iter()
        .all(|st| st & (UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED) == (UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED)));
    assert_eq!(s.stats().locked_pages, 8);
    // Unlocking the middle page leaves three regions, unlocking the rest one.
    s.munlock(a + 4 * PS, PS).unwrap();
    assert_eq!(s.stats().regions, 3);
    s.munlock(a, 8 * PS).unwrap();
    assert_eq!(s.stats().regions, 1);
    assert_eq!(s.stats().locked_pages, 0);
    // A hole: the part before it is locked (not populated: Linux returns
    // before its populate step), then ENOMEM.
    let b = anon(&s, 4 * PS);
    s.munmap(b + 2 * PS, PS).unwrap();
    assert_eq!(s.mlock(b, 4 * PS), Err(Errno::ENOMEM));
    assert_eq!(s.stats().locked_charged_pages, 2);
    // Locked pages refuse DONTNEED, COLD, PAGEOUT; WILLNEED and POPULATE_WRITE are fine.
    for adv in [MADV_DONTNEED, MADV_COLD, MADV_PAGEOUT] {
        assert_eq!(s.madvise(b, 2 * PS, adv), Err(Errno::EINVAL), "advice {adv}");
    }
    s.madvise(b, 2 * PS, MADV_WILLNEED).unwrap();
    s.madvise(b, 2 * PS, MADV_POPULATE_WRITE).unwrap();
    s.validate();
}

#[test]
fn full_lock_beyond_budget_is_eagain_and_locks_nothing() {
    let s = space(4, 64, usize::MAX);
    let a = anon(&s, 8 << 20);
    assert_eq!(s.mlock(a, 8 << 20), Err(Errno::EAGAIN));
    let st = s.stats();
    assert_eq!(st.locked_charged_pages, 0);
    assert_eq!(st.locked_pages, 0);
    assert_eq!(st.regions, 1);
    s.validate();
}

#[test]
fn mlockall_future_onfault_leaves_new_regions_unpopulated() {
    let s = space(64, 64, usize::MAX);
    s.mlockall(MCL_FUTURE | MCL_ONFAULT).unwrap();
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0).unwrap();
    assert!(states(&s, a, 4).iter().all(|x| x & UMM_PAGE_RESIDENT == 0));
    assert_eq!(s.stats().locked_charged_pages, 4);
    write(a, 1);
    assert_ne!(states(&s, a, 1)[0] & UMM_PAGE_LOCKED, 0);
    // Without MCL_FUTURE the future flag is cleared.
    s.mlockall(MCL_CURRENT).unwrap();
    let b = anon(&s, PS);
    assert_eq!(states(&s, b, 1)[0] & UMM_PAGE_LOCKED, 0);
    s.munlockall().unwrap();
    assert_eq!(s.stats().locked_charged_pages, 0);
    s.validate();
}

#[test]
fn locked_pages_are_never_evicted_or_written_to_swap() {
    // Working set 3x the budget, locked pages a third of the budget.
    let s = space(12, 128, usize::MAX);
    let locked = anon(&s, 4 << 20);
    s.mlock(locked, 4 << 20).unwrap();
    let marker = *b"LOCKED-PAGE-MARKER";
    for p in 0..1024 {
        for (i, b) in marker.iter().enumerate() {
            write(locked + p * PS + i, *b);
        }
    }
    let mut m = s.map_anon(32 << 20).unwrap();
    for round in 0..2u8 {
        for c in m.chunks_mut(PS) {
            c[0] = round;
        }
    }
    let st = s.stats();
    assert!(st.swapouts > 1000, "pressure: {st:?}");
    assert!(st.resident_pages_max <= st.budget_pages);
    assert!(states(&s, locked, 1024).iter().all(|x| x & UMM_PAGE_RESIDENT != 0 && x & UMM_PAGE_LOCKED != 0));
    let swap = s.swap_contents().unwrap();
    assert!(!swap.windows(marker.len()).any(|w| w == marker), "a locked page reached the swap file");
    s.validate();
}

// A page swapped out and then locked leaves swap: its slot is freed and
// the swap file's copy overwritten before mlock returns (issue 45, item 7;
// swapcache.rs checks every way there, and the Redis store). It stayed:
// the marker was still in the swap file.
#[test]
fn a_swapped_page_locked_leaves_the_swap_file() {
    let s = space(64, 64, usize::MAX);
    let a = anon(&s, 16 * PS);
    let marker = *b"SWAPPED-THEN-LOCKED-MARKER";
    for p in 0..16 {
        for (i, b) in marker.iter().enumerate() {
            write(a + p * PS + i, *b);
        }
    }
    s.madvise(a, 16 * PS, MADV_PAGEOUT).unwrap();
    assert!(states(&s, a, 16).iter().all(|x| x & UMM_PAGE_SWAPPED != 0), "paged out");
    let swap = s.swap_contents().unwrap();
    assert!(swap.windows(marker.len()).any(|w| w == marker), "the pages are in the swap file");
    s.mlock(a, 16 * PS).unwrap();
    assert!(states(&s, a, 16)
        .iter()
        .all(|x| x & (UMM_PAGE_SWAPPED | UMM_PAGE_LOCKED | UMM_PAGE_RESIDENT) == UMM_PAGE_LOCKED | UMM_PAGE_RESIDENT));
    let st = s.stats();
    assert_eq!((st.swapped_pages, st.swap_cached_pages), (0, 0), "{st:?}");
    let swap = s.swap_contents().unwrap();
    assert!(!swap.windows(marker.len()).any(|w| w == marker), "a locked page's copy stayed in the swap file");
    for p in 0..16 {
        assert_eq!(usermm_sys::kernel::peek(a + p * PS), marker[0]);
    }
    s.validate();
}

#[test]
fn onfault_read_maps_the_zero_page_and_locks_nothing_until_written() {
    let s = space(64, 64, usize::MAX);
    let a = anon(&s, 8 * PS);
    s.mlock2(a, 8 * PS, MLOCK_ONFAULT).unwrap();
    assert_eq!(usermm_sys::kernel::peek(a + 3 * PS), 0);
    let st = states(&s, a + 3 * PS, 1)[0];
    assert_ne!(st & UMM_PAGE_RESIDENT, 0, "the zero page is mapped");
    assert_eq!(st & UMM_PAGE_LOCKED, 0, "the zero page is not locked (Linux)");
    assert_eq!(s.stats().locked_pages, 0);
    assert!(s.smaps().contains("Locked:                0 kB"));
    // The write allocates the page (a copy-on-write the host kernel does
    // with no usermm fault): from then on it is locked.
    write(a + 3 * PS, 5);
    assert_ne!(states(&s, a + 3 * PS, 1)[0] & UMM_PAGE_LOCKED, 0);
    assert_eq!(s.stats().locked_pages, 1);
    assert!(s.smaps().contains("Locked:                4 kB"));
    // A READ populate maps zero pages, locked by none; WRITE locks.
    s.populate(a + 4 * PS, 2 * PS, MADV_POPULATE_READ).1.unwrap();
    assert_eq!(s.stats().locked_pages, 1);
    s.populate(a + 4 * PS, 2 * PS, MADV_POPULATE_WRITE).1.unwrap();
    assert_eq!(s.stats().locked_pages, 3);
    s.validate();
}

/// Parked pages (`MADV_COLD`) are resident: a lock maps them back and locks
/// them, whatever the region's protection (a `PROT_NONE` region takes no
/// fault, so a fault never brought them back and they stayed unlocked).
#[test]
fn a_lock_takes_back_parked_pages_of_a_prot_none_region() {
    let s = space(64, 64, 64 * PS);
    let n = 8;
    let a = anon(&s, n * PS);
    for p in 0..n {
        write(a + p * PS, 0x30 + p as u8);
    }
    s.madvise(a, n * PS, MADV_COLD).unwrap();
    let parked = states(&s, a, n);
    assert!(parked.iter().all(|b| b & UMM_PAGE_INACTIVE != 0), "MADV_COLD parks: {parked:x?}");
    s.mprotect(a, n * PS, PROT_NONE).unwrap();
    // (Linux: the populate of an unreadable range fails, EFAULT reported as
    // ENOMEM, and the lock stays.)
    assert_eq!(s.mlock(a, n * PS), Err(Errno::ENOMEM));
    for (p, b) in states(&s, a, n).into_iter().enumerate() {
        assert_eq!(b & (UMM_PAGE_LOCKED | UMM_PAGE_INACTIVE), UMM_PAGE_LOCKED, "page {p}: state {b:#x}");
    }
    s.mprotect(a, n * PS, PROT_READ | PROT_WRITE).unwrap();
    for p in 0..n {
        assert_eq!(usermm_sys::kernel::peek(a + p * PS), 0x30 + p as u8, "page {p}");
    }
    s.validate();
}
