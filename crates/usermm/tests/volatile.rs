//! Seed 002: volatile ranges — mvolatile / mnovolatile, purge instead of
//! swap, SIGBUS on a purged page, exact purge reports.

use std::sync::OnceLock;

use usermm::consts::*;
use usermm::{Config, Errno, Space};
use usermm_sys::kernel::{peek, poke};
use usermm_sys::testing::SigbusRecorder;

mod common;
use common::space;

const PS: usize = 4096;
const CHUNK: usize = 16 << 10;

fn anon(s: &Space, len: usize) -> usize {
    s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap()
}

/// Writes `len` bytes of private anonymous memory elsewhere in the space,
/// twice, so that the LRU cycles everything older through reclaim.
fn pressure(s: &Space, len: usize) {
    let mut m = s.map_anon(len).unwrap();
    for round in 1..=2u8 {
        for c in m.chunks_mut(PS) {
            c[0] = round;
        }
    }
}

#[test]
fn volatile_pages_keep_data_and_take_no_fault() {
    let s = space(64, 0);
    let a = anon(&s, 64 * PS);
    for p in 0..64 {
        poke(a + p * PS, p as u8 + 1);
    }
    s.mvolatile(a, 64 * PS).unwrap();
    s.mvolatile(a, 64 * PS).unwrap(); // twice is harmless
                                      // (A write fault-around window is committed, and counted, after its
                                      // last piece is installed: the writes above may return first. mincore
                                      // waits for the commit, as every introspection does.)
    let mut vec = [0u8; 64];
    s.mincore(a, 64 * PS, &mut vec).unwrap();
    assert!(vec.iter().all(|b| b & 1 == 1), "every written page resident: {vec:?}");
    let faults = s.stats().faults;
    for p in 0..64 {
        assert_eq!(peek(a + p * PS), p as u8 + 1);
        poke(a + p * PS + 1, 9);
    }
    assert_eq!(s.stats().faults, faults, "no usermm fault on volatile pages");
    assert_eq!(s.stats().volatile_pages, 64);
    let (purged, rep) = s.mnovolatile(a, 64 * PS).unwrap();
    assert!(!purged);
    assert_eq!(rep.purged_pages, 0);
    assert_eq!(rep.first_purged, 0);
    assert!(!s.mnovolatile(a, 64 * PS).unwrap().0); // twice is harmless
    assert_eq!(s.stats().volatile_pages, 0);
    s.validate();
}

#[test]
fn argument_rules() {
    let s = space(64, 0);
    let a = anon(&s, 8 * PS);
    assert_eq!(s.mvolatile(a + 1, PS), Err(Errno::EINVAL));
    s.mlock(a, PS).unwrap();
    assert_eq!(s.mvolatile(a, 2 * PS), Err(Errno::EINVAL), "a locked page in the range");
    s.munlock(a, PS).unwrap();
    s.mvolatile(a, 2 * PS).unwrap();
    assert_eq!(s.mlock(a, PS), Err(Errno::EINVAL), "mlock on a volatile page");
    assert_eq!(s.mlock2(a, PS, MLOCK_ONFAULT), Err(Errno::EINVAL));
    s.munmap(a + 4 * PS, PS).unwrap();
    assert_eq!(s.mvolatile(a, 8 * PS), Err(Errno::ENOMEM), "hole");
    assert_eq!(s.mnovolatile(a, 8 * PS).map(|r| r.0), Err(Errno::ENOMEM));
    assert_eq!(s.stats().volatile_pages, 0, "the mapped parts were made non-volatile");
    s.validate();
}

#[test]
fn purge_demonstration_reports_exactly_the_purged_chunks() {
    // The seed's demonstration: 26 chunks of 16 KiB filled with 'A'..'Z',
    // the even ones volatile, pressure, then mnovolatile reports exactly
    // which were purged and the odd ones are intact.
    let s = space(4, 128);
    let a = anon(&s, 26 * CHUNK);
    for i in 0..26 {
        for off in (0..CHUNK).step_by(512) {
            poke(a + i * CHUNK + off, b'A' + i as u8);
        }
    }
    for i in (0..26).step_by(2) {
        s.mvolatile(a + i * CHUNK, CHUNK).unwrap();
    }
    pressure(&s, 32 << 20);
    let st = s.stats();
    assert!(st.volatile_purges > 0, "{st:?}");
    let mut purged_total = 0;
    for i in 0..26 {
        let base = a + i * CHUNK;
        if i % 2 == 0 {
            let (purged, rep) = s.mnovolatile(base, CHUNK).unwrap();
            assert_eq!(purged, rep.purged_pages > 0);
            purged_total += rep.purged_pages;
            for p in 0..CHUNK / PS {
                let bit = rep.bitmap[0] >> p & 1 == 1;
                let v = peek(base + p * PS);
                if bit {
                    assert_eq!(v, 0, "purged page reads zero");
                } else {
                    assert_eq!(v, b'A' + i as u8, "page reported intact is intact");
                }
            }
            if purged {
                assert_eq!(rep.first_purged, base + (rep.bitmap[0].trailing_zeros() as usize) * PS);
            }
        } else {
            for off in (0..CHUNK).step_by(512) {
                assert_eq!(peek(base + off), b'A' + i as u8, "odd chunk {i} intact");
            }
        }
    }
    assert_eq!(purged_total as u64, st.volatile_purges, "every purge reported once");
    assert!(purged_total >= 13 * 4 / 2, "pressure 8x the budget purges most volatile pages");
    s.validate();
}

static SPACE: OnceLock<Space> = OnceLock::new();

fn regenerate(addr: usize) {
    // Called from the SIGBUS handler: make the page non-volatile and
    // regenerate its data; the retried access then succeeds.
    let s = SPACE.get().unwrap();
    let page = addr & !(PS - 1);
    let (purged, _) = s.mnovolatile(page, PS).unwrap();
    assert!(purged);
    poke(page, 0x77);
}

#[test]
fn sigbus_with_exact_address_and_handler_regenerates_from_several_threads() {
    let s = SPACE.get_or_init(|| space(4, 128));
    let a = anon(s, 64 * PS);
    for p in 0..64 {
        poke(a + p * PS, 1);
    }
    s.mvolatile(a, 64 * PS).unwrap();
    pressure(s, 32 << 20);
    let mut st = vec![0u32; 64];
    s.page_state(a, 64, &mut st).unwrap();
    let purged: Vec<usize> = (0..64).filter(|&p| st[p] & UMM_PAGE_PURGED != 0).collect();
    assert!(purged.len() >= 4, "pressure purged {} pages", purged.len());
    let rec = SigbusRecorder::install_with(a, a + 64 * PS, regenerate).unwrap();
    std::thread::scope(|sc| {
        for &p in purged.iter().take(4) {
            sc.spawn(move || {
                let addr = a + p * PS + 123;
                // The first touch raises SIGBUS (si_addr = addr); the handler
                // regenerates the page and the retried read sees the new data.
                assert_eq!(peek(addr - 123), 0x77);
                let _ = addr;
            });
        }
    });
    let r = rec.record();
    assert_eq!(r.count, 4, "one SIGBUS per touching thread");
    assert_eq!(r.code, 2, "BUS_ADRERR");
    assert!(purged.iter().take(4).any(|&p| r.addr == a + p * PS), "si_addr is the touched address: {:#x}", r.addr);
    drop(rec);
    s.validate();
}

#[test]
fn mnovolatile_races_reclaim_without_losing_a_page_reported_intact() {
    let s = space(8, 256);
    let a = anon(&s, 128 * CHUNK);
    let host = host_discards_on(&s);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let stop = &stop;
        let s = &s;
        sc.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pressure(s, 16 << 20);
            }
        });
        // And the host kernel's reclaim, purging parked volatile pages.
        sc.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                s.host_reclaim();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        // At least 40 rounds, and on until both usermm's reclaim and the
        // host's really purged during the race (at most 30 s: a round takes
        // about a millisecond, and the host may take every page first for
        // a while).
        let t0 = std::time::Instant::now();
        for round in 0..u32::MAX {
            let st = s.stats();
            if round >= 40 && st.volatile_purges > st.host_purges && (st.host_purges > 0 || !host) {
                break;
            }
            if round >= 40 && t0.elapsed() > std::time::Duration::from_secs(30) {
                break;
            }
            let v = (round as u8).wrapping_mul(7) | 1;
            for c in 0..128 {
                s.mnovolatile(a + c * CHUNK, CHUNK).unwrap();
                for p in 0..CHUNK / PS {
                    poke(a + c * CHUNK + p * PS, v);
                }
                s.mvolatile(a + c * CHUNK, CHUNK).unwrap();
            }
            if st.volatile_purges <= st.host_purges && round % 8 == 7 {
                // The pages were all just touched: give reclaim a moment in
                // which they are volatile and ageing, or with fast fault
                // service the pressure may never reach them.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            for c in 0..128 {
                let base = a + c * CHUNK;
                let (_, rep) = s.mnovolatile(base, CHUNK).unwrap();
                for p in 0..CHUNK / PS {
                    let bit = rep.bitmap[0] >> p & 1 == 1;
                    let got = peek(base + p * PS);
                    assert!(
                        if bit { got == 0 } else { got == v },
                        "round {round} chunk {c} page {p}: reported purged={bit}, read {got}"
                    );
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let st = s.stats();
    assert!(st.volatile_purges > st.host_purges, "usermm's reclaim must really purge: {st:?}");
    assert!(st.host_purges > 0 || !host, "the host must really purge: {st:?}");
    eprintln!(
        "volatile race: {} purges ({} by the host), {} swapouts",
        st.volatile_purges, st.host_purges, st.swapouts
    );
    s.validate();
}

/// Parks pages `[from, to)` of `a` (MADV_COLD): a parked volatile page is
/// handed to the host, which may discard it under its own pressure.
fn park(s: &Space, a: usize, from: usize, to: usize) {
    s.madvise(a + from * PS, (to - from) * PS, MADV_COLD).unwrap();
    let mut st = vec![0u32; to - from];
    s.page_state(a + from * PS, to - from, &mut st).unwrap();
    assert!(st.iter().all(|b| b & UMM_PAGE_RESIDENT != 0), "parked pages still count as resident: {st:?}");
}

fn host_discards_on(s: &Space) -> bool {
    let on = s.host_reclaim();
    if !on {
        eprintln!(
            "\n*** NOT RUN: host discards are off in this space (no userfaultfd write-protect or PAGEMAP_SCAN, \
             e.g. user-mode-only userfaultfd): the host kernel cannot purge volatile pages here ***\n"
        );
    }
    on
}

#[test]
fn host_kernel_purges_are_reported_exactly() {
    let s = space(64, 64);
    if !host_discards_on(&s) {
        return;
    }
    let n = 64;
    let a = anon(&s, n * PS);
    for p in 0..n {
        poke(a + p * PS, p as u8 + 1);
    }
    s.mvolatile(a, n * PS).unwrap();
    // Parked: 0..32 and 48..64; of those, 48..56 are touched again (mapped
    // back while intact, so no longer the host's to discard).
    park(&s, a, 0, 32);
    park(&s, a, 48, 64);
    for p in 48..56 {
        assert_eq!(peek(a + p * PS), p as u8 + 1, "page {p} mapped back intact");
    }
    let before = s.stats();
    // The host's reclaim discards the clean parked pages: 0..32 and 56..64.
    s.host_reclaim();
    let (purged, rep) = s.mnovolatile(a, n * PS).unwrap();
    let lost: Vec<usize> = (0..32).chain(56..64).collect();
    assert!(purged);
    assert_eq!(rep.purged_pages, lost.len(), "{rep:?}");
    assert_eq!(rep.first_purged, a);
    for p in 0..n {
        let bit = rep.bitmap[p / 64] >> (p % 64) & 1 == 1;
        assert_eq!(bit, lost.contains(&p), "page {p}: reported purged={bit}");
        let want = if lost.contains(&p) { 0 } else { p as u8 + 1 };
        assert_eq!(peek(a + p * PS), want, "page {p} reads back");
    }
    let after = s.stats();
    assert_eq!(after.volatile_purges - before.volatile_purges, lost.len() as u64);
    assert_eq!(after.host_purges - before.host_purges, lost.len() as u64);
    assert_eq!(after.volatile_pages, 0);
    s.validate();
}

#[test]
fn pages_mapped_back_by_mnovolatile_are_safe_from_the_host() {
    let s = space(64, 64);
    if !host_discards_on(&s) {
        return;
    }
    let n = 32;
    let a = anon(&s, n * PS);
    for p in 0..n {
        poke(a + p * PS, 0x40 + p as u8);
    }
    s.mvolatile(a, n * PS).unwrap();
    park(&s, a, 0, n);
    let (purged, _) = s.mnovolatile(a, n * PS).unwrap();
    assert!(!purged, "nothing was discarded before mnovolatile");
    // Non-volatile now: the host's reclaim must not take anything.
    s.host_reclaim();
    park(&s, a, 0, n);
    s.host_reclaim();
    for p in 0..n {
        assert_eq!(peek(a + p * PS), 0x40 + p as u8, "page {p} kept");
    }
    assert_eq!(s.stats().host_purges, 0);
    s.validate();
}

/// A parked volatile page of a `PROT_NONE` region: `mnovolatile` maps it
/// back to find out whether the host purged it, and a fault there plans
/// nothing (the kernel would not have reported it), so asking for one
/// looped forever (found by the seeded simulation, seed 14739). It returns,
/// reports exactly what the host took, and keeps the rest from the host.
#[test]
fn mnovolatile_takes_back_parked_pages_of_a_prot_none_region() {
    let s: &'static Space = Box::leak(Box::new(space(64, 64)));
    if !host_discards_on(s) {
        return;
    }
    let n = 32;
    let a = anon(s, n * PS);
    for p in 0..n {
        poke(a + p * PS, 0x60 + p as u8);
    }
    s.mvolatile(a, n * PS).unwrap();
    park(s, a, 0, n / 2);
    s.host_reclaim();
    park(s, a, n / 2, n);
    s.mprotect(a, n * PS, PROT_NONE).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(s.mnovolatile(a, n * PS)));
    let r = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("mnovolatile of a PROT_NONE range hangs");
    let (purged, rep) = r.unwrap();
    assert!(purged);
    assert_eq!(rep.purged_pages, n / 2, "{rep:?}");
    assert_eq!(rep.first_purged, a);
    s.mprotect(a, n * PS, PROT_READ | PROT_WRITE).unwrap();
    for p in 0..n {
        let want = if p < n / 2 { 0 } else { 0x60 + p as u8 };
        assert_eq!(peek(a + p * PS), want, "page {p} reads back");
    }
    // Non-volatile now: the host's reclaim must not take the rest.
    park(s, a, 0, n);
    s.host_reclaim();
    for p in n / 2..n {
        assert_eq!(peek(a + p * PS), 0x60 + p as u8, "page {p} kept");
    }
    assert_eq!(s.stats().volatile_pages, 0);
    s.validate();
}

static HOST_SPACE: OnceLock<Space> = OnceLock::new();

fn regenerate_host_purged(addr: usize) {
    let s = HOST_SPACE.get().unwrap();
    let page = addr & !(PS - 1);
    let (purged, _) = s.mnovolatile(page, PS).unwrap();
    assert!(purged);
    poke(page, 0x5a);
}

#[test]
fn touching_a_page_the_host_purged_raises_sigbus_at_the_address() {
    let s = HOST_SPACE.get_or_init(|| space(64, 64));
    if !host_discards_on(s) {
        return;
    }
    let n = 16;
    let a = anon(s, n * PS);
    for p in 0..n {
        poke(a + p * PS, 7);
    }
    s.mvolatile(a, n * PS).unwrap();
    park(s, a, 0, n);
    s.host_reclaim();
    let rec = SigbusRecorder::install_with(a, a + n * PS, regenerate_host_purged).unwrap();
    std::thread::scope(|sc| {
        for p in [1usize, 5, 9, 13] {
            sc.spawn(move || {
                // SIGBUS first (si_addr = this address), then the handler
                // regenerates and the retried read sees its data.
                assert_eq!(peek(a + p * PS), 0x5a);
            });
        }
    });
    let r = rec.record();
    drop(rec);
    assert_eq!(r.count, 4, "one SIGBUS per touching thread");
    assert_eq!(r.code, 2, "BUS_ADRERR");
    assert!([1usize, 5, 9, 13].iter().any(|&p| r.addr == a + p * PS), "si_addr {:#x}", r.addr);
    // The untouched ones are still volatile and purged: reported as such.
    let (purged, rep) = s.mnovolatile(a, n * PS).unwrap();
    assert!(purged);
    assert_eq!(rep.purged_pages, 12, "{rep:?}");
    s.validate();
}

/// Writes `old` (non-volatile, written first, so the oldest on the LRU) and
/// `vol` (volatile), then presses the budget; returns how many pages of
/// `old` were swapped and how many of `vol` purged.
fn pressure_order(flags: u32) -> (usize, usize) {
    let s = Space::open(&common::with_test_store(Config {
        budget_bytes: 4 << 20,
        swap_bytes: 64 << 20,
        flags,
        ..Config::default()
    }))
    .unwrap();
    let n = 384;
    let old = anon(&s, n * PS);
    let vol = anon(&s, n * PS);
    for p in 0..n {
        poke(old + p * PS, 1);
    }
    for p in 0..n {
        poke(vol + p * PS, 2);
    }
    s.mvolatile(vol, n * PS).unwrap();
    let mut more = s.map_anon(384 * PS).unwrap();
    for c in more.chunks_mut(PS) {
        c[0] = 3;
    }
    let mut st = vec![0u32; n];
    s.page_state(old, n, &mut st).unwrap();
    let swapped = st.iter().filter(|b| *b & UMM_PAGE_SWAPPED != 0).count();
    s.page_state(vol, n, &mut st).unwrap();
    let purged = st.iter().filter(|b| *b & UMM_PAGE_PURGED != 0).count();
    for p in 0..n {
        assert_eq!(peek(old + p * PS), 1, "old page {p} kept its data");
    }
    s.validate();
    (swapped, purged)
}

#[test]
fn purge_volatile_first_option_purges_before_anything_is_swapped() {
    let (swapped, purged) = pressure_order(UMM_F_PURGE_VOLATILE_FIRST);
    assert!(purged >= 128, "pressure must purge volatile pages: {purged}");
    assert_eq!(swapped, 0, "with the option, no page is swapped while volatile pages remain ({purged} purged)");
    // Without it, volatile pages age like the others: the older ordinary
    // pages are swapped first.
    let (swapped, purged) = pressure_order(0);
    assert!(swapped > 0, "without the option the oldest pages are swapped first ({purged} purged)");
}

/// A volatile page of a file region: a purge drops usermm's copy and writes
/// nothing back; the file keeps its data, and once the range is made
/// non-volatile a purged page reads the file again (for a shared region,
/// what the file holds; for a private one, the file, not the private copy).
#[test]
fn volatile_file_pages_are_dropped_and_read_back_from_the_file() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    for shared in [true, false] {
        let s = space(4, 64);
        let n = 64;
        let path = std::env::temp_dir().join(format!("usermm-test-{}-volatile-file-{shared}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.write_all(&vec![1u8; n * PS]).unwrap();
        f.sync_all().unwrap();
        let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
        let a = s.mmap(0, n * PS, PROT_READ | PROT_WRITE, kind, f.as_raw_fd(), 0).unwrap();
        for p in 0..n {
            poke(a + p * PS, 2);
        }
        s.mvolatile(a, n * PS).unwrap();
        pressure(&s, 32 << 20);
        let (purged, rep) = s.mnovolatile(a, n * PS).unwrap();
        assert!(purged && rep.purged_pages > 0, "pressure purged file pages ({shared}): {rep:?}");
        for p in 0..n {
            let bit = rep.bitmap[p / 64] >> (p % 64) & 1 == 1;
            assert_eq!(peek(a + p * PS), if bit { 1 } else { 2 }, "shared={shared} page {p} purged={bit}");
        }
        s.munmap(a, n * PS).unwrap();
        let mut c = Vec::new();
        std::fs::File::open(&path).unwrap().read_to_end(&mut c).unwrap();
        for p in 0..n {
            let bit = rep.bitmap[p / 64] >> (p % 64) & 1 == 1;
            let want = if shared && !bit { 2 } else { 1 };
            assert_eq!(c[p * PS], want, "shared={shared}: file page {p} (purged={bit})");
        }
        let _ = std::fs::remove_file(&path);
        s.validate();
    }
}

/// Private and shared anonymous regions alike: smaps shows the volatile
/// pages (`Volatile:` and the VmFlag `vo`, only while there are some),
/// reclaim purges them, the report is exact and purged pages read zeros.
#[test]
fn anonymous_private_and_shared_regions_and_smaps() {
    for shared in [false, true] {
        let s = space(4, 64);
        let n = 64;
        let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
        let a = s.mmap(0, n * PS, PROT_READ | PROT_WRITE, kind | MAP_ANONYMOUS, -1, 0).unwrap();
        for p in 0..n {
            poke(a + p * PS, 5);
        }
        assert!(!s.smaps().contains("Volatile:"), "no volatile line before mvolatile");
        s.mvolatile(a, n * PS).unwrap();
        let smaps = s.smaps();
        assert!(smaps.contains(&format!("Volatile:       {:>8} kB", n * 4)), "shared={shared}:\n{smaps}");
        assert!(smaps.lines().any(|l| l.starts_with("VmFlags:") && l.contains(" vo ")), "{smaps}");
        pressure(&s, 32 << 20);
        let (purged, rep) = s.mnovolatile(a, n * PS).unwrap();
        assert!(purged && rep.purged_pages > 0, "shared={shared}: {rep:?}");
        for p in 0..n {
            let bit = rep.bitmap[p / 64] >> (p % 64) & 1 == 1;
            assert_eq!(peek(a + p * PS), if bit { 0 } else { 5 }, "shared={shared} page {p} purged={bit}");
        }
        let smaps = s.smaps();
        assert!(!smaps.contains("Volatile:") && !smaps.contains(" vo "), "{smaps}");
        s.validate();
    }
}
