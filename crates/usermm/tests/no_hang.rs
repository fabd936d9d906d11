//! Nothing hangs, nothing is lost: one test per deadlock, lost-data and
//! spurious-signal bug found by the differential fuzzer and the soak. Each
//! runs under a timeout (a hang fails the test instead of stalling the
//! suite) and asserts the bytes, not just that the call returned.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use usermm::consts::*;
use usermm_sys::kernel::{peek, poke};
use usermm_sys::testing::SigbusRecorder;

mod common;
use common::{fill, shared_temp_file, space_pages as space, within};

const PS: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// Item 1: a populate (or a lock, which populates) over a resident page
/// that was `MADV_FREE`d deadlocked on the core mutex it still held.
#[test]
fn populate_and_lock_over_lazily_freed_pages() {
    for (i, advice) in ["populate-write", "populate-read", "mlock", "mlock2-0", "mlockall"].into_iter().enumerate() {
        within(20, advice, move || {
            let s = space(256, 1024, 0);
            let a = s.mmap(0, 32 * PS, RW, ANON, -1, 0).unwrap();
            fill(a, 0..32, 7);
            s.madvise(a + 20 * PS, 10 * PS, MADV_FREE).unwrap();
            // One of them written again since the free: it must keep the
            // new byte.
            poke(a + 25 * PS + 1, 0xAB);
            match i {
                0 => s.madvise(a, 32 * PS, MADV_POPULATE_WRITE).unwrap(),
                1 => s.madvise(a, 32 * PS, MADV_POPULATE_READ).unwrap(),
                2 => s.mlock(a, 32 * PS).unwrap(),
                3 => s.mlock2(a, 32 * PS, 0).unwrap(),
                _ => s.mlockall(MCL_CURRENT).unwrap(),
            }
            for p in 0..32 {
                let v = peek(a + p * PS);
                let want = 7u8.wrapping_add(p as u8);
                if (20..30).contains(&p) && p != 25 {
                    // Lazily freed and not written since: old data or zeros.
                    assert!(v == want || v == 0, "{advice}: page {p} reads {v}");
                } else {
                    assert_eq!(v, want, "{advice}: page {p}");
                }
            }
            assert_eq!(peek(a + 25 * PS + 1), 0xAB, "{advice}: written after the free");
            s.validate();
        });
    }
}

/// Item 2: `MADV_WILLNEED` on anonymous memory reads in swapped pages only;
/// it never populates untouched pages (and, with a lazily freed page in
/// reach, it deadlocked the background thread).
#[test]
fn willneed_reads_swap_only() {
    within(20, "willneed after pageout and free", || {
        let s = space(256, 1024, UMM_F_EXACT_FAULTS);
        let a = s.mmap(0, 1024 * PS, RW, ANON, -1, 0).unwrap();
        fill(a, 0..32, 3);
        s.madvise(a, 8 * PS, MADV_PAGEOUT).unwrap();
        s.madvise(a + 20 * PS, 10 * PS, MADV_FREE).unwrap();
        let before = s.stats().resident_pages;
        s.madvise(a, 8 * PS, MADV_WILLNEED).unwrap();
        // Untouched pages far from the swapped ones: never populated.
        s.madvise(a + 512 * PS, 256 * PS, MADV_WILLNEED).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        for p in 0..8 {
            assert_eq!(peek(a + p * PS), 3u8.wrapping_add(p as u8), "page {p}");
        }
        let st = s.stats();
        assert!(st.resident_pages <= before + 8, "WILLNEED populated pages: {} -> {}", before, st.resident_pages);
        let mut v = vec![0u8; 256];
        s.mincore(a + 512 * PS, 256 * PS, &mut v).unwrap();
        assert!(v.iter().all(|&b| b & 1 == 0), "untouched pages made resident by WILLNEED");
        s.validate();
    });
}

/// Item 3: `MADV_POPULATE_WRITE` over zero-page mappings while pages are
/// evicted under it and another thread maps and unmaps: the populate must
/// not hold the region lock across a host call that can fault into the
/// space's own handlers (a waiting writer then blocks the handler).
#[test]
fn populate_write_vs_munmap_vs_faults() {
    within(60, "populate/munmap/fault mix", || {
        let s = Arc::new(space(128, 4096, 0));
        let a = s.mmap(0, 256 * PS, RW, ANON, -1, 0).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        {
            let (s, stop) = (s.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let b = s.mmap(0, 64 * PS, RW, ANON, -1, 0).unwrap();
                    poke(b, 1);
                    s.munmap(b, 64 * PS).unwrap();
                }
            }));
        }
        {
            let (s, stop) = (s.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let _ = s.madvise(a + (i % 4) * 64 * PS, 64 * PS, MADV_PAGEOUT);
                    i += 1;
                }
            }));
        }
        let t0 = Instant::now();
        let mut rounds = 0;
        while t0.elapsed() < Duration::from_secs(5) {
            // Read faults map the zero page; the populate then allocates.
            s.madvise(a, 256 * PS, MADV_DONTNEED).unwrap();
            for p in (0..256).step_by(3) {
                peek(a + p * PS);
            }
            let _ = s.madvise(a, 128 * PS, MADV_POPULATE_WRITE);
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert!(rounds > 0);
        s.validate();
    });
}

/// A host swap file, active for as long as the value lives.
struct HostSwap(String);

impl HostSwap {
    fn on(mib: usize) -> Option<HostSwap> {
        let path = format!("/tmp/usermm-test-hostswap-{}", std::process::id());
        let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
        let sh =
            |cmd: String| ok(std::process::Command::new("sh").arg("-c").arg(cmd).stderr(std::process::Stdio::null()));
        if sh(format!("fallocate -l {mib}M {path} && chmod 600 {path} && mkswap {path} >/dev/null && swapon {path}")) {
            Some(HostSwap(path))
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

impl Drop for HostSwap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Item 4: with a host that has swap of its own, a lazily freed page
/// written again is swapped out by the host's `MADV_PAGEOUT`, not dropped:
/// reclaim must not count it as discarded (it read back as zeros).
#[test]
fn lazily_freed_then_written_survives_host_swap() {
    let Some(_swap) = HostSwap::on(256) else {
        panic!("cannot activate a host swap file (needs root and swapon): this test cannot run here");
    };
    within(60, "lazyfree with host swap", || {
        for round in 0..8 {
            let s = space(32, 4096, 0);
            let a = s.mmap(0, 16 * PS, RW, ANON, -1, 0).unwrap();
            fill(a, 0..16, 1);
            s.madvise(a, 16 * PS, MADV_FREE).unwrap();
            fill(a, 0..16, 9);
            if round % 2 == 1 {
                // Park them, and let the host's own reclaim run over the
                // staging area twice, as its pressure would: the first pass
                // finds them written (dirty), the second swaps them out to
                // the host's swap — they are not gone.
                s.madvise(a, 16 * PS, MADV_COLD).unwrap();
                s.host_reclaim();
                s.host_reclaim();
            }
            let b = s.mmap(0, 256 * PS, RW, ANON, -1, 0).unwrap();
            fill(b, 0..256, 5);
            for p in 0..16 {
                assert_eq!(peek(a + p * PS), 9u8.wrapping_add(p as u8), "round {round}: page {p} lost");
                assert_eq!(peek(a + p * PS + PS - 1), 9u8.wrapping_add(p as u8), "round {round}: page {p} lost");
            }
            s.validate();
        }
    });
}

/// Item 10: under the space's own pressure, clean lazily freed pages are
/// discarded (read back as zeros), as Linux does; pages written since the
/// free keep their data.
#[test]
fn lazily_freed_clean_pages_are_discarded_under_pressure() {
    for flags in [0, UMM_F_EXACT_FAULTS] {
        lazyfree_discard_under_pressure(flags);
    }
}

fn lazyfree_discard_under_pressure(flags: u32) {
    within(60, "lazyfree discard", move || {
        let s = space(8192, 65536, flags);
        let a = s.mmap(0, 64 * PS, RW, ANON, -1, 0).unwrap();
        fill(a, 0..64, 1);
        s.madvise(a, 64 * PS, MADV_FREE).unwrap();
        fill(a, 0..16, 50);
        for p in 16..32 {
            peek(a + p * PS);
        }
        let discards0 = s.stats().lazyfree_discards;
        let b = s.mmap(0, 32768 * PS, RW, ANON, -1, 0).unwrap();
        for p in 0..32768 {
            poke(b + p * PS, 1);
        }
        for p in 0..16 {
            assert_eq!(peek(a + p * PS), 50u8.wrapping_add(p as u8), "written page {p}");
        }
        let zeros = (16..64).filter(|p| peek(a + p * PS) == 0 && peek(a + p * PS + PS - 1) == 0).count();
        for p in 16..64 {
            let v = peek(a + p * PS);
            assert!(v == 0 || v == 1u8.wrapping_add(p as u8), "page {p}: {v}");
        }
        let st = s.stats();
        assert_eq!(zeros, 48, "clean lazily freed pages discarded: {zeros} of 48 ({st:?})");
        assert!(st.lazyfree_discards >= discards0 + 48, "{st:?}");
        s.validate();
    });
}

/// Items 5 and 11: `MADV_FREE` mixed with reads and writes under pressure
/// never raises SIGBUS while memory is evictable, and never makes progress
/// stop; no SIGBUS ever reaches a thread outside a fault.
#[test]
fn lazyfree_mix_under_pressure_never_sigbus() {
    within(60, "lazyfree mix", || {
        let s = space(256, 8192, 0);
        let pages = 1024;
        let a = s.mmap(0, pages * PS, RW, ANON, -1, 0).unwrap();
        let rec = SigbusRecorder::install(a, a + pages * PS).unwrap();
        let mut model: Vec<Option<u8>> = vec![Some(0); pages];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let t0 = Instant::now();
        let mut ops = 0u64;
        while t0.elapsed() < Duration::from_secs(5) {
            let r = rnd();
            let p = (r >> 8) as usize % pages;
            match r % 10 {
                0 => {
                    let n = 1 + (r >> 40) as usize % 16;
                    let n = n.min(pages - p);
                    s.madvise(a + p * PS, n * PS, MADV_FREE).unwrap();
                    for m in &mut model[p..p + n] {
                        *m = None; // old value or zeros until written
                    }
                }
                1..=4 => {
                    let v = (r >> 32) as u8 | 1;
                    for off in (0..PS).step_by(512) {
                        poke(a + p * PS + off, v);
                    }
                    model[p] = Some(v);
                }
                _ => {
                    let v = peek(a + p * PS);
                    if let Some(want) = model[p] {
                        assert_eq!(v, want, "page {p} after {ops} ops");
                    }
                }
            }
            ops += 1;
        }
        let st = s.stats();
        assert_eq!(rec.record().count, 0, "SIGBUS with evictable memory: {st:?}");
        assert_eq!(st.oom_sigbus, 0, "{st:?}");
        assert!(st.swapouts + st.lazyfree_discards > 0, "no pressure: {st:?}");
        s.validate();
    });
}

/// Item 7: pages locked in the host behind usermm's back (a raw `mlock2`
/// syscall, as LTP and the kernel's selftests make) make the host refuse
/// `MADV_DONTNEED`; munmap must still drop them, so that the next region at
/// that address reads zeros, and the space keeps working there.
#[test]
fn a_region_never_shows_another_regions_bytes() {
    within(30, "raw host lock, munmap, remap", || {
        let s = space(256, 1024, 0);
        let a = s.mmap(0, 8 * PS, RW, ANON, -1, 0).unwrap();
        fill(a, 0..8, 0x40);
        usermm_sys::mem::mlock2(a, 8 * PS, 0).expect("raw host mlock2");
        s.munmap(a, 8 * PS).unwrap();
        let b = s.mmap(a, 8 * PS, RW, ANON | MAP_FIXED, -1, 0).unwrap();
        assert_eq!(b, a);
        for p in 0..8 {
            assert_eq!(peek(b + p * PS), 0, "page {p}: the old region's byte");
            assert_eq!(peek(b + p * PS + PS - 1), 0, "page {p}: the old region's byte");
        }
        assert!(s.stats().host_refusals > 0, "the refusal is counted");
        // The space works there as before: writes, locks, populate.
        fill(b, 0..8, 0x11);
        s.mlockall(MCL_CURRENT).unwrap();
        s.munlockall().unwrap();
        s.madvise(b, 8 * PS, MADV_POPULATE_WRITE).unwrap();
        for p in 0..8 {
            assert_eq!(peek(b + p * PS), 0x11u8.wrapping_add(p as u8));
        }
        // MADV_DONTNEED over pages locked behind our back drops them too.
        usermm_sys::mem::mlock2(b, 8 * PS, 0).expect("raw host mlock2");
        s.madvise(b, 8 * PS, MADV_DONTNEED).unwrap();
        for p in 0..8 {
            assert_eq!(peek(b + p * PS), 0, "page {p} after DONTNEED");
        }
        s.validate();
    });
}

/// Item 6: a region that the host keeps as two VMAs (two regions written
/// separately, then the page between them mapped: the host cannot merge
/// VMAs with different anon_vmas, usermm merges the regions). Every
/// multi-page host operation across the boundary must still work: swap-in
/// runs, fault-around, PAGEOUT, POPULATE, mlock.
#[test]
fn one_region_over_two_host_vmas() {
    within(30, "one region over two host VMAs", || {
        let s = space(256, 1024, 0);
        let base = s.reservation().0 + (64 << 20);
        let a = s.mmap(base, 4 * PS, RW, ANON | MAP_FIXED, -1, 0).unwrap();
        let b = s.mmap(base + 5 * PS, 4 * PS, RW, ANON | MAP_FIXED, -1, 0).unwrap();
        assert_eq!(b, a + 5 * PS);
        fill(a, 0..4, 0x10);
        fill(a, 5..9, 0x10);
        s.mmap(a + 4 * PS, PS, RW, ANON | MAP_FIXED, -1, 0).unwrap();
        fill(a, 4..5, 0x10);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let vmas: Vec<&str> = maps
            .lines()
            .filter(|l| {
                let r = l.split_whitespace().next().unwrap();
                let (lo, hi) = r.split_once('-').unwrap();
                let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
                lo < a + 9 * PS && hi > a
            })
            .collect();
        assert!(vmas.len() >= 2, "the host keeps two VMAs there (the case under test): {vmas:#?}");
        let check = |what: &str| {
            for p in 0..9 {
                let want = 0x10u8.wrapping_add(p as u8);
                assert_eq!(peek(a + p * PS), want, "{what}: page {p}");
                assert_eq!(peek(a + p * PS + PS - 1), want, "{what}: page {p} end");
            }
        };
        check("written");
        // Out to swap and back in as one run across the boundary.
        s.madvise(a, 9 * PS, MADV_PAGEOUT).unwrap();
        let st = s.stats();
        assert_eq!(st.resident_pages, 0, "PAGEOUT over the boundary evicts every page: {st:?}");
        check("after pageout");
        assert_eq!(s.stats().swap_read_errors, 0);
        s.madvise(a, 9 * PS, MADV_PAGEOUT).unwrap();
        s.madvise(a, 9 * PS, MADV_POPULATE_WRITE).unwrap();
        check("after populate-write");
        s.madvise(a, 9 * PS, MADV_PAGEOUT).unwrap();
        s.madvise(a, 9 * PS, MADV_POPULATE_READ).unwrap();
        check("after populate-read");
        s.madvise(a, 9 * PS, MADV_PAGEOUT).unwrap();
        s.mlock(a, 9 * PS).unwrap();
        check("after mlock");
        s.munlock(a, 9 * PS).unwrap();
        // Zero fills across the boundary: a fresh range mapped the same way.
        s.madvise(a, 9 * PS, MADV_DONTNEED).unwrap();
        s.madvise(a, 9 * PS, MADV_POPULATE_WRITE).unwrap();
        for p in 0..9 {
            assert_eq!(peek(a + p * PS), 0, "zeros after DONTNEED: page {p}");
        }
        s.validate();
    });
}

/// A raw `madvise(MADV_DONTNEED)` on space memory (LTP and the kernel's mm
/// selftests make raw calls) dropped pages usermm holds as resident: the
/// next touch faulted, usermm woke the thread as for a fault that raced
/// with a fill, and the thread faulted again forever. Linux reads zeros.
#[test]
fn raw_dontneed_behind_usermms_back_reads_zeros() {
    within(20, "touch after a raw MADV_DONTNEED", || {
        let s = space(256, 1024, 0);
        let a = s.mmap(0, 16 * PS, RW, ANON, -1, 0).unwrap();
        fill(a, 0..16, 0x30);
        // SAFETY: no Rust reference points into the space's memory.
        unsafe { usermm_sys::mem::advise(a + 4 * PS, 4 * PS, MADV_DONTNEED) }.expect("raw madvise");
        for p in 0..16 {
            let want = if (4..8).contains(&p) { 0 } else { 0x30u8.wrapping_add(p as u8) };
            assert_eq!(peek(a + p * PS), want, "page {p}");
        }
        poke(a + 5 * PS, 9);
        assert_eq!(peek(a + 5 * PS), 9);
        s.validate();
    });
}

/// Why write-back copies a space page with `process_vm_readv` first: a
/// `/proc/self/mem` read of a page that is not there cannot wait for the
/// userfault (it fails with EIO), while `process_vm_readv` is served by the
/// handlers. (The fuzzer with a host swap file saw munmap return EIO when a
/// page was evicted between write-back's snapshot and its copy.)
#[test]
fn a_missing_page_is_served_to_process_vm_readv_not_to_proc_mem() {
    let s = space(256, 1024, 0);
    let a = s.mmap(0, 4 * PS, RW, ANON, -1, 0).unwrap();
    let mut buf = vec![1u8; PS];
    let pm = usermm_sys::file::ProcMem::open().expect("/proc/self/mem");
    // SAFETY: `buf` is ours and writable for a page.
    let forced = unsafe { pm.read(buf.as_mut_ptr() as usize, a, PS) };
    assert!(forced.is_err(), "/proc/self/mem served a missing page: {forced:?}");
    usermm_sys::ffi::copy_from_own_memory(&mut buf, a + PS).expect("process_vm_readv of a missing page");
    assert!(buf.iter().all(|&b| b == 0));
    poke(a + 2 * PS, 5);
    // SAFETY: as above.
    unsafe { pm.read(buf.as_mut_ptr() as usize, a + 2 * PS, PS) }.expect("a present page");
    assert_eq!(buf[0], 5);
}

/// `MADV_REMOVE` on a shared file mapping while reclaim writes dirty pages
/// of the range back: a write-back in flight when the hole was punched
/// landed after it, and the page read the old bytes back from the file
/// instead of zeros (the differential fuzzer's seed 0x7689630444bf4566,
/// page 630, once in 2M calls).
#[test]
fn remove_punches_after_write_backs_in_flight() {
    within(120, "remove vs write-back", || {
        const PAGES: usize = 256;
        let f = shared_temp_file("remove-race", PAGES);
        use std::os::fd::AsRawFd;
        // A budget of a quarter of the mapping: reclaim writes pages back
        // all the time, in the background and in faults.
        let s = space(PAGES / 4, 1024, 0);
        let a = s.mmap(0, PAGES * PS, RW, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
        let t0 = Instant::now();
        let mut rounds = 0;
        while t0.elapsed() < Duration::from_secs(4) {
            rounds += 1;
            let tag = (rounds % 250 + 1) as u8;
            for p in 0..PAGES {
                for off in [0, 1024, 2048, PS - 1] {
                    poke(a + p * PS + off, tag);
                }
            }
            // Remove a window that reclaim is likely writing back.
            let lo = (rounds * 37) % (PAGES - 64);
            s.madvise(a + lo * PS, 64 * PS, MADV_REMOVE).unwrap();
            for p in lo..lo + 64 {
                for off in [0, 1024, 2048, PS - 1] {
                    let v = peek(a + p * PS + off);
                    assert_eq!(
                        v,
                        0,
                        "round {rounds}: page {p} byte {off} reads {v} after MADV_REMOVE: {:?}",
                        s.stats()
                    );
                }
            }
        }
        s.validate();
        eprintln!("{rounds} rounds: {:?}", s.stats());
    });
}

/// `MADV_DONTNEED` on a shared file mapping while another thread writes
/// the pages: on Linux the page cache keeps every write (DONTNEED only
/// unmaps), so a thread always reads back what it wrote last.
#[test]
fn dontneed_on_a_shared_file_never_loses_a_concurrent_write() {
    within(60, "dontneed vs writes", || {
        const PAGES: usize = 8;
        let f = shared_temp_file("dontneed-race", PAGES);
        use std::os::fd::AsRawFd;
        let s = space(256, 1024, 0);
        let a = s.mmap(0, PAGES * PS, RW, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    s.madvise(a, PAGES * PS, MADV_DONTNEED).unwrap();
                }
            });
            let t0 = Instant::now();
            let mut v: u64 = 0;
            while t0.elapsed() < Duration::from_secs(3) {
                v += 1;
                let p = (v as usize) % PAGES;
                let at = (a + p * PS) as *mut u64;
                // SAFETY: `at` is in a mapped read-write page of the space.
                let before = unsafe { at.read_volatile() };
                let last = v.saturating_sub(PAGES as u64);
                if before != last {
                    stop.store(true, Ordering::Relaxed);
                    panic!("write {last} to page {p} lost: read {before}");
                }
                // SAFETY: as above.
                unsafe { at.write_volatile(v) };
                // SAFETY: as above.
                let got = unsafe { at.read_volatile() };
                if got != v {
                    stop.store(true, Ordering::Relaxed);
                    panic!("write {v} to page {p} lost: read {got}");
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        s.validate();
    });
}
