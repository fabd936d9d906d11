//! The Rust API is sound: the bytes a `Mapping` derefs to never change
//! under a borrow through a safe call. The address-based calls that would
//! change or remove them refuse a live mapping's range (`EBUSY`); the
//! handle's own methods (by `&mut` or by value) do it, and advice that
//! changes bytes later (`MADV_FREE`) is only reachable through an `unsafe`
//! method.

mod common;

use usermm::consts::*;
use usermm::{Config, Errno};

const PS: usize = 4096;

#[test]
fn address_based_calls_refuse_a_live_mapping_and_the_handle_does_them() {
    let s = common::open_mode(&Config { budget_bytes: 64 << 20, swap_bytes: 64 << 20, ..Config::default() }).unwrap();
    let mut m = s.map_anon(16 * PS).unwrap();
    m.fill(7);
    let a = m.addr();
    // Whatever overlaps it, even by one page.
    assert_eq!(s.munmap(a + 15 * PS, 2 * PS), Err(Errno::EBUSY));
    assert_eq!(s.munmap(a, 16 * PS), Err(Errno::EBUSY));
    assert_eq!(s.mprotect(a, PS, PROT_READ), Err(Errno::EBUSY));
    for adv in [MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MADV_GUARD_INSTALL] {
        assert_eq!(s.madvise(a, PS, adv), Err(Errno::EBUSY), "advice {adv}");
    }
    assert_eq!(s.mvolatile(a, PS), Err(Errno::EBUSY));
    assert_eq!(
        s.mmap(a, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
        Err(Errno::EBUSY)
    );
    // Advice that keeps the bytes is fine through the address.
    for adv in [MADV_PAGEOUT, MADV_COLD, MADV_WILLNEED, MADV_POPULATE_READ, MADV_SEQUENTIAL] {
        s.madvise(a, 16 * PS, adv).unwrap_or_else(|e| panic!("advice {adv}: {e}"));
    }
    assert!(m.iter().all(|&b| b == 7), "nothing changed the bytes");
    // The handle: DONTNEED by &mut (zeros after), FREE only unsafe.
    m.advise_range(PS, PS, MADV_DONTNEED).unwrap();
    assert!(m[PS..2 * PS].iter().all(|&b| b == 0));
    assert!(m[..PS].iter().all(|&b| b == 7));
    assert_eq!(m.advise(MADV_FREE), Err(Errno::EINVAL));
    assert_eq!(m.advise_range(15 * PS, 2 * PS, MADV_DONTNEED), Err(Errno::EINVAL), "past its end");
    // SAFETY: every freed page is written before it is borrowed again.
    unsafe { m.advise_unchecked(2 * PS, PS, MADV_FREE) }.unwrap();
    m[2 * PS..3 * PS].fill(9);
    assert!(m[2 * PS..3 * PS].iter().all(|&b| b == 9));
    // Once the handle is gone the range is the program's again.
    m.unmap().unwrap();
    let b = s.mmap(a, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0).unwrap();
    assert_eq!(b, a);
    s.madvise(a, 16 * PS, MADV_DONTNEED).unwrap();
    s.munmap(a, 16 * PS).unwrap();
    // A dropped handle too.
    {
        let m = s.map_anon(4 * PS).unwrap();
        assert_eq!(s.munmap(m.addr(), PS), Err(Errno::EBUSY));
    }
    s.validate();
}

/// The check that refuses a live mapping's range and the call it guards are
/// one step: a `munmap` over a hole, racing with `map_anon` placing a
/// mapping there, never unmaps the new mapping (it checked the hole, then
/// unmapped what `map_anon` had just handed to safe code: the next read of
/// the mapping's bytes was a SIGSEGV).
#[test]
fn a_munmap_racing_with_map_anon_never_unmaps_the_new_mapping() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = common::open_mode(&Config { budget_bytes: 64 << 20, swap_bytes: 0, ..Config::default() }).unwrap();
    // Where map_anon places a mapping of this size (first fit): note it,
    // and give it back.
    let spot = s.map_anon(4 * PS).unwrap();
    let a = spot.addr();
    drop(spot);
    let stop = AtomicBool::new(false);
    let (mut made, mut unmapped) = (0u64, 0u64);
    std::thread::scope(|sc| {
        let un = sc.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Ok over the hole, EBUSY over a live mapping.
                match s.munmap(a, 4 * PS) {
                    Ok(()) => n += 1,
                    Err(e) => assert_eq!(e, Errno::EBUSY),
                }
            }
            n
        });
        // At least 2 s and 1,000 mappings (a loaded machine makes fewer a
        // second: the other thread's munmaps take the region lock
        // exclusively in a tight loop), at most 30 s.
        let t0 = std::time::Instant::now();
        let secs = |n| std::time::Duration::from_secs(n);
        while (t0.elapsed() < secs(2) || made < 1000) && t0.elapsed() < secs(30) {
            let mut m = s.map_anon(4 * PS).unwrap();
            m[0] = 9;
            std::thread::yield_now();
            // A mapping the other thread unmapped would fault here (a
            // touch of unmapped space memory is a SIGSEGV).
            assert_eq!(m[0], 9);
            assert!(m[PS..].iter().all(|&b| b == 0));
            made += 1;
        }
        stop.store(true, Ordering::Relaxed);
        unmapped = un.join().unwrap();
    });
    assert!(made >= 1000 && unmapped > 0, "{made} mappings made, {unmapped} munmaps over the hole");
}
