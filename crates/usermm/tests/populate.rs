//! Seed 004: MADV_POPULATE_READ / MADV_POPULATE_WRITE and `umm_populate`
//! reports, with Linux's errors (never a signal).

use usermm::consts::*;
use usermm::{Errno, Space};

mod common;
use common::space;

const PS: usize = 4096;

fn map(s: &Space, len: usize, prot: i32) -> usize {
    s.mmap(0, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap()
}

fn resident(s: &Space, a: usize, pages: usize) -> Vec<bool> {
    let mut v = vec![0u8; pages];
    s.mincore(a, pages * PS, &mut v).unwrap();
    v.into_iter().map(|b| b & 1 == 1).collect()
}

#[test]
fn populate_write_makes_every_page_resident() {
    let s = space(64, 0);
    let a = map(&s, 16 << 20, PROT_READ | PROT_WRITE);
    s.madvise(a, 16 << 20, MADV_POPULATE_WRITE).unwrap();
    assert!(resident(&s, a, 4096).iter().all(|&r| r));
    assert_eq!(s.stats().zero_fills, 4096);
    // Populating again is a no-op.
    s.madvise(a, 16 << 20, MADV_POPULATE_READ).unwrap();
    assert_eq!(s.stats().zero_fills, 4096);
    s.validate();
}

#[test]
fn populate_errors_are_linux_errors() {
    let s = space(64, 0);
    let a = map(&s, 64 * PS, PROT_READ | PROT_WRITE);
    assert_eq!(s.madvise(a + 1, PS, MADV_POPULATE_WRITE), Err(Errno::EINVAL));
    assert_eq!(s.madvise(a, 0, MADV_POPULATE_WRITE), Ok(()));
    let ro = map(&s, 4 * PS, PROT_READ);
    assert_eq!(s.madvise(ro, 4 * PS, MADV_POPULATE_WRITE), Err(Errno::EINVAL));
    s.madvise(ro, 4 * PS, MADV_POPULATE_READ).unwrap();
    let none = map(&s, 4 * PS, PROT_NONE);
    assert_eq!(s.madvise(none, 4 * PS, MADV_POPULATE_READ), Err(Errno::EINVAL));
    assert_eq!(s.madvise(none, 4 * PS, MADV_POPULATE_WRITE), Err(Errno::EINVAL));
    s.validate();
}

#[test]
fn hole_populates_up_to_the_hole_and_reports_it() {
    let s = space(64, 0);
    let a = map(&s, 16 * PS, PROT_READ | PROT_WRITE);
    s.munmap(a + 8 * PS, 2 * PS).unwrap();
    //  0       8  10     16
    //  AAAAAAAA..BBBBBB
    let (rep, r) = s.populate(a, 16 * PS, MADV_POPULATE_WRITE);
    assert_eq!(r, Err(Errno::ENOMEM));
    assert_eq!(rep.populated_bytes, 8 * PS);
    assert_eq!(rep.fail_addr, a + 8 * PS);
    assert_eq!(resident(&s, a, 8), vec![true; 8]);
    assert_eq!(resident(&s, a + 10 * PS, 6), vec![false; 6], "nothing after the hole");
    s.validate();
}

#[test]
fn budget_exhausted_is_enomem_with_exact_report() {
    // 4 MiB budget, no swap: a 8 MiB populate cannot be resident at once.
    let s = space(4, 0);
    let a = map(&s, 8 << 20, PROT_READ | PROT_WRITE);
    let (rep, r) = s.populate(a, 8 << 20, MADV_POPULATE_WRITE);
    assert_eq!(r, Err(Errno::ENOMEM));
    assert_eq!(rep.populated_bytes, 4 << 20);
    assert_eq!(rep.fail_addr, a + (4 << 20));
    assert_eq!(s.stats().resident_pages, 1024);
    s.validate();
}

/// A full budget with no swap is not out of memory while reclaim can still
/// take pages: lazily freed pages are discarded and volatile pages purged
/// for a populate as for a fault (Linux reclaims `MADV_FREE` pages without
/// swap too). Populate once gave up at once with `ENOMEM` whenever no swap
/// slot was free, without trying.
#[test]
fn populate_reclaims_lazily_freed_and_volatile_pages_without_swap() {
    for advice in ["MADV_FREE", "mvolatile"] {
        let s = space(4, 0);
        let a = map(&s, 4 << 20, PROT_READ | PROT_WRITE);
        s.madvise(a, 4 << 20, MADV_POPULATE_WRITE).unwrap();
        assert_eq!(s.stats().resident_pages, 1024, "{advice}");
        if advice == "MADV_FREE" {
            s.madvise(a, 4 << 20, MADV_FREE).unwrap();
        } else {
            s.mvolatile(a, 4 << 20).unwrap();
        }
        let b = map(&s, 2 << 20, PROT_READ | PROT_WRITE);
        assert_eq!(s.madvise(b, 2 << 20, MADV_POPULATE_WRITE), Ok(()), "{advice}");
        assert!(resident(&s, b, 512).iter().all(|&r| r), "{advice}");
        // Once nothing is left to reclaim (b's pages are unevictable
        // without swap), a populate is out of memory.
        let c = map(&s, 4 << 20, PROT_READ | PROT_WRITE);
        let (rep, r) = s.populate(c, 4 << 20, MADV_POPULATE_WRITE);
        assert_eq!(r, Err(Errno::ENOMEM), "{advice}");
        assert!(rep.populated_bytes <= 2 << 20, "{advice}: {rep:?}");
        s.validate();
    }
}

#[test]
fn poisoned_page_is_ehwpoison_with_its_address() {
    let s = space(64, 0);
    let a = map(&s, 32 * PS, PROT_READ | PROT_WRITE);
    s.madvise(a + 5 * PS, PS, MADV_HWPOISON).unwrap();
    let mut st = vec![0u32; 32];
    s.page_state(a, 32, &mut st).unwrap();
    assert_ne!(st[5] & UMM_PAGE_POISONED, 0);
    let (rep, r) = s.populate(a, 32 * PS, MADV_POPULATE_READ);
    assert_eq!(r, Err(Errno::EHWPOISON));
    assert_eq!(rep.fail_addr, a + 5 * PS);
    assert_eq!(rep.populated_bytes, 5 * PS);
    // MADV_DONTNEED clears the poison (as it removes Linux's marker).
    s.madvise(a + 5 * PS, PS, MADV_DONTNEED).unwrap();
    s.madvise(a, 32 * PS, MADV_POPULATE_WRITE).unwrap();
    s.validate();
}

#[test]
fn populate_with_swap_keeps_data_of_swapped_pages() {
    let s = space(8, 64);
    let mut m = s.map_anon(16 << 20).unwrap();
    for (i, chunk) in m.chunks_mut(PS).enumerate() {
        chunk[0] = i as u8;
    }
    assert!(s.stats().swapouts > 0);
    // The second half is resident or inactive; populate the first half back.
    s.madvise(m.addr(), 4 << 20, MADV_POPULATE_READ).unwrap();
    assert!(resident(&s, m.addr(), 1024).iter().all(|&r| r));
    for (i, chunk) in m.chunks(PS).enumerate() {
        assert_eq!(chunk[0], i as u8);
    }
    s.validate();
}

#[test]
fn swap_read_error_is_efault_with_exact_report_then_retry_works() {
    let s = space(8, 64);
    let a = map(&s, 64 * PS, PROT_READ | PROT_WRITE);
    for p in 0..64 {
        usermm_sys::kernel::poke(a + p * PS, p as u8 + 1);
    }
    // Page everything out (PAGEOUT is advisory: repeat until all swapped).
    for _ in 0..10 {
        s.madvise(a, 64 * PS, MADV_PAGEOUT).unwrap();
        let mut st = vec![0u32; 64];
        s.page_state(a, 64, &mut st).unwrap();
        if st.iter().all(|x| x & UMM_PAGE_SWAPPED != 0) {
            break;
        }
    }
    let mut st = vec![0u32; 64];
    s.page_state(a, 64, &mut st).unwrap();
    assert!(st.iter().all(|x| x & UMM_PAGE_SWAPPED != 0), "{st:x?}");
    s.inject_swap_errors(1, 0);
    let (rep, r) = s.populate(a, 64 * PS, MADV_POPULATE_READ);
    assert_eq!(r, Err(Errno::EFAULT), "backing that cannot be read is EFAULT, never a signal");
    assert_eq!(rep.populated_bytes, 0);
    assert_eq!(rep.fail_addr, a);
    // Nothing was lost: the retry reads every page back.
    s.madvise(a, 64 * PS, MADV_POPULATE_READ).unwrap();
    for p in 0..64 {
        assert_eq!(usermm_sys::kernel::peek(a + p * PS), p as u8 + 1);
    }
    assert_eq!(s.stats().swap_read_errors, 1);
    s.validate();
}

/// `EINTR`: a populate interrupted (as one is when the space closes under it)
/// stops at a page boundary, reports exactly what it populated, and leaves
/// the rest for a retry. Linux returns `EINTR` only for a fatal signal,
/// which a test cannot observe, so this one has no kernel twin.
#[test]
fn interrupted_populate_is_eintr_with_exact_report_then_retry_works() {
    let s = space(64, 0);
    let pages = 256;
    let a = map(&s, pages * PS, PROT_READ | PROT_WRITE);
    // Already resident pages before the interruption point are counted too.
    s.madvise(a + 10 * PS, 5 * PS, MADV_POPULATE_WRITE).unwrap();

    s.interrupt_populate_at(a + 100 * PS);
    let (rep, r) = s.populate(a, pages * PS, MADV_POPULATE_WRITE);
    assert_eq!(r, Err(Errno::EINTR));
    assert_eq!(rep.populated_bytes, 100 * PS);
    assert_eq!(rep.fail_addr, a + 100 * PS);
    let res = resident(&s, a, pages);
    assert!(res[..100].iter().all(|&r| r), "every page before the interruption is populated");
    assert!(res[100..].iter().all(|&r| !r), "nothing at or after it");

    // The hook fired once: the retry completes the range.
    let (rep, r) = s.populate(a, pages * PS, MADV_POPULATE_WRITE);
    assert_eq!(r, Ok(()));
    assert_eq!(rep.populated_bytes, pages * PS);
    assert!(resident(&s, a, pages).iter().all(|&r| r));

    // madvise gives the same errno (READ on a fresh region this time).
    let b = map(&s, 64 * PS, PROT_READ);
    s.interrupt_populate_at(b + 7 * PS);
    assert_eq!(s.madvise(b, 64 * PS, MADV_POPULATE_READ), Err(Errno::EINTR));
    let res = resident(&s, b, 64);
    assert!(res[..7].iter().all(|&r| r) && res[7..].iter().all(|&r| !r));
    s.madvise(b, 64 * PS, MADV_POPULATE_READ).unwrap();
    s.validate();
}
