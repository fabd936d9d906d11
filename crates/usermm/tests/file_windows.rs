//! File windows from the page cache: a read-only shared file region that
//! is locked or read sequentially maps the file's own page-cache pages
//! where its faults land (`Platform::file_map`), and makes them usermm's
//! copies again when the region stops being read-only (or locked, for a
//! locked one); every zap replaces them. Each
//! test checks what the program sees (bytes, residency, locks) against
//! the file, and what the host maps at the address (`/proc/self/maps`:
//! the file, or anonymous memory).

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use usermm::consts::*;
use usermm::{Config, Space};
use usermm_sys::kernel::{peek, poke};

const PS: usize = 4096;
const PAGES: usize = 256;

/// The byte at `off` of the test file as written by `file`.
fn byte(off: usize) -> u8 {
    (off / PS * 7 + off % 251) as u8
}

/// A shared, unlinked temporary file of `PAGES` pages of known bytes.
fn file(name: &str) -> std::fs::File {
    let f = common::shared_temp_file(name, PAGES);
    let buf: Vec<u8> = (0..PAGES * PS).map(byte).collect();
    f.write_all_at(&buf, 0).unwrap();
    f
}

fn space(flags: u32) -> Space {
    common::open(&Config { budget_bytes: 8 << 20, memlock_bytes: 8 << 20, flags, ..Config::default() })
}

/// Whether the host maps a file (an inode) at `a`, from `/proc/self/maps`.
fn host_maps_file(a: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, inode) = (f.next().unwrap(), f.nth(3).unwrap());
        let (s, e) = range.split_once('-').unwrap();
        let (s, e) = (usize::from_str_radix(s, 16).unwrap(), usize::from_str_radix(e, 16).unwrap());
        if s <= a && a < e {
            return inode != "0";
        }
    }
    panic!("nothing mapped at {a:#x}")
}

/// The host's `Locked:` (kB) of the mapping at `a`, from `/proc/self/smaps`.
fn host_locked_kb(a: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
            let (s, e) = range.split_once('-').unwrap();
            if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                inside = s <= a && a < e;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("Locked:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("no Locked: line for {a:#x}")
}

fn resident(s: &Space, a: usize, pages: usize) -> Vec<bool> {
    let mut v = vec![0u8; pages];
    s.mincore(a, pages * PS, &mut v).unwrap();
    v.iter().map(|b| b & 1 == 1).collect()
}

/// Every byte of pages `pages` at `a` is the file's.
fn check(a: usize, pages: std::ops::Range<usize>, what: &str) {
    for p in pages {
        for o in (0..PS).step_by(97).chain([PS - 1]) {
            let off = p * PS + o;
            assert_eq!(peek(a + off), byte(off), "{what}: byte {off}");
        }
    }
}

/// A read-only shared mapping of `f`, locked on fault, with pages 37 and
/// 130 touched (two 16-page windows: 32..48 and 128..144).
fn map_and_touch(s: &Space, f: &std::fs::File) -> usize {
    let a = s.mmap(0, PAGES * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.mlock2(a, PAGES * PS, MLOCK_ONFAULT).unwrap();
    assert_eq!(peek(a + 37 * PS + 5), byte(37 * PS + 5));
    assert_eq!(peek(a + 130 * PS), byte(130 * PS));
    a
}

#[test]
fn locked_read_only_windows_map_the_page_cache() {
    let f = file("map");
    let s = space(0);
    let a = map_and_touch(&s, &f);
    let want: Vec<bool> = (0..PAGES).map(|p| (32..48).contains(&p) || (128..144).contains(&p)).collect();
    assert_eq!(resident(&s, a, PAGES), want, "Linux's fault-around windows, locked");
    assert_eq!(s.stats().locked_pages, 32);
    check(a, 32..48, "window");
    check(a, 128..144, "window");
    assert!(host_maps_file(a + 40 * PS), "the window is the file's page cache");
    assert!(host_locked_kb(a + 40 * PS) >= 64, "and locked in the host");
    assert!(!host_maps_file(a + 60 * PS), "an untouched page is usermm's (anonymous)");
    // The page cache itself: a write to the file shows at once, as in a
    // Linux shared mapping.
    f.write_all_at(&[0xa5; 3], (40 * PS + 9) as u64).unwrap();
    assert_eq!(peek(a + 40 * PS + 10), 0xa5);
    // An untouched page of the region still faults through usermm.
    assert_eq!(peek(a + 200 * PS + 1), byte(200 * PS + 1));
    assert!(!host_maps_file(a + 190 * PS) || resident(&s, a, PAGES)[190]);
    assert_eq!(s.stats().locked_pages, 48);
    s.close().unwrap();
}

/// A read-only shared file region read sequentially (`MADV_SEQUENTIAL`),
/// not locked, maps windows of the page cache too; reclaim drops them
/// behind the stream (an empty registered range again: the next touch
/// faults through usermm), keeps the space within its budget, and every
/// byte read is the file's.
#[test]
fn a_sequential_read_only_region_maps_windows_and_drops_them_behind() {
    let budget = 8usize << 20;
    let pages = 4 * budget / PS;
    let f = common::shared_temp_file("seq", pages);
    let buf: Vec<u8> = (0..pages * PS).map(byte).collect();
    f.write_all_at(&buf, 0).unwrap();
    let s = space(0);
    let len = pages * PS;
    let a = s.mmap(0, len, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, len, MADV_SEQUENTIAL).unwrap();
    assert_eq!(peek(a + 3 * PS + 1), byte(3 * PS + 1));
    assert!(host_maps_file(a + 3 * PS), "a sequential read-only region maps the page cache");
    assert_eq!(host_locked_kb(a + 3 * PS), 0, "not locked: the region is not");
    check(a, 0..pages, "the scan");
    let st = s.stats();
    assert!(st.resident_pages_max as usize * PS <= budget, "{st:?}");
    assert!(!host_maps_file(a + 3 * PS), "dropped behind the stream: usermm's empty range again");
    assert!(!resident(&s, a, 1)[0]);
    // Read again, through usermm's fault (a window again).
    check(a, 0..4, "the start, read again");
    assert!(host_maps_file(a + PS));
    // Parked (`MADV_COLD`): usermm's copy in staging, the window gone, so
    // that the next touch is usermm's fault.
    s.madvise(a, 4 * PS, MADV_COLD).unwrap();
    assert!(!host_maps_file(a + PS), "a parked window page is usermm's again");
    check(a, 0..4, "after MADV_COLD");
    // Writable: the windows become usermm's copies, and reach the file.
    s.mprotect(a, 4 * PS, PROT_READ | PROT_WRITE).unwrap();
    assert!(!host_maps_file(a + PS));
    poke(a + PS + 7, 0x5a);
    check(a, 2..4, "copies");
    s.msync(a, 4 * PS, MS_SYNC).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, (PS + 7) as u64).unwrap();
    assert_eq!(b[0], 0x5a);
    s.close().unwrap();
}

#[test]
fn copy_locked_files_flag_copies_instead() {
    let f = file("copy");
    let s = space(UMM_F_COPY_LOCKED_FILES);
    let a = map_and_touch(&s, &f);
    check(a, 32..48, "window");
    assert!(!host_maps_file(a + 40 * PS), "UMM_F_COPY_LOCKED_FILES: usermm's copy");
    assert_eq!(s.stats().locked_pages, 32);
    s.close().unwrap();
}

#[test]
fn munlock_keeps_the_pages_resident_as_copies() {
    let f = file("munlock");
    let s = space(0);
    let a = map_and_touch(&s, &f);
    s.munlock(a, PAGES * PS).unwrap();
    let r = resident(&s, a, PAGES);
    assert!(r[32..48].iter().chain(&r[128..144]).all(|&x| x), "munlock drops nothing");
    assert_eq!(s.stats().locked_pages, 0);
    assert!(!host_maps_file(a + 40 * PS), "made usermm's own page");
    check(a, 32..48, "after munlock");
    check(a, 128..144, "after munlock");
    // They are ordinary pages now: paged out and read again (one page: a
    // sequential read would start the read-ahead of the pages after it).
    s.madvise(a, PAGES * PS, MADV_PAGEOUT).unwrap();
    assert!(!resident(&s, a, PAGES)[40], "paged out");
    check(a, 40..41, "after pageout");
    // Locked again, a new touch maps the page cache again (far from what
    // the reads above may have faulted around).
    s.mlock2(a, PAGES * PS, MLOCK_ONFAULT).unwrap();
    assert!(!resident(&s, a, PAGES)[220]);
    assert_eq!(peek(a + 220 * PS), byte(220 * PS));
    assert!(host_maps_file(a + 220 * PS));
    s.munlockall().unwrap();
    assert!(resident(&s, a, PAGES)[208..224].iter().all(|&x| x));
    check(a, 208..224, "after munlockall");
    assert!(!host_maps_file(a + 220 * PS));
    s.close().unwrap();
}

#[test]
fn mprotect_makes_them_copies_that_reach_the_file() {
    let f = file("mprotect");
    let s = space(0);
    let a = map_and_touch(&s, &f);
    s.mprotect(a, PAGES * PS, PROT_NONE).unwrap();
    assert!(!host_maps_file(a + 40 * PS));
    s.mprotect(a, PAGES * PS, PROT_READ | PROT_WRITE).unwrap();
    check(a, 32..48, "after mprotect");
    assert_eq!(s.stats().locked_pages, 32, "still locked");
    poke(a + 41 * PS + 3, 0x5a);
    s.msync(a, PAGES * PS, MS_SYNC).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, (41 * PS + 3) as u64).unwrap();
    assert_eq!(b[0], 0x5a, "a write through the made-writable page reaches the file");
    // Read-only again: a new window is the page cache.
    s.mprotect(a, PAGES * PS, PROT_READ).unwrap();
    assert_eq!(peek(a + 90 * PS), byte(90 * PS));
    assert!(host_maps_file(a + 90 * PS));
    s.close().unwrap();
}

#[test]
fn an_unmapped_window_leaves_no_file_byte_behind() {
    let f = file("munmap");
    let s = space(0);
    let a = map_and_touch(&s, &f);
    s.munmap(a, PAGES * PS).unwrap();
    let b = s.mmap(a, PAGES * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0).unwrap();
    assert_eq!(b, a);
    assert!(!host_maps_file(a + 40 * PS));
    for p in (32..48).chain(128..144) {
        for o in (0..PS).step_by(512) {
            assert_eq!(peek(a + p * PS + o), 0, "page {p}: a fresh anonymous page reads zeros");
        }
    }
    poke(a + 40 * PS, 1);
    assert_eq!(peek(a + 40 * PS), 1);
    // MAP_FIXED over a region with windows replaces them the same way.
    let c = s.mmap(0, PAGES * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.mlock2(c, PAGES * PS, MLOCK_ONFAULT).unwrap();
    assert_eq!(peek(c + 3 * PS), byte(3 * PS));
    assert!(host_maps_file(c + 3 * PS));
    s.mmap(c, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0).unwrap();
    assert!(!host_maps_file(c + 3 * PS));
    assert_eq!(peek(c + 3 * PS), 0);
    s.close().unwrap();
}

#[test]
fn a_window_past_the_end_of_the_file_is_copied() {
    // 10 pages and 100 bytes: the 16-page window at 0 runs past the end.
    let f = common::shared_temp_file("eof", 0);
    let len = 10 * PS + 100;
    let buf: Vec<u8> = (0..len).map(byte).collect();
    f.write_all_at(&buf, 0).unwrap();
    let s = space(0);
    let a = s.mmap(0, 16 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.mlock2(a, 16 * PS, MLOCK_ONFAULT).unwrap();
    assert_eq!(peek(a + 3 * PS), byte(3 * PS));
    assert!(!host_maps_file(a + 3 * PS), "copied: a mapping would disagree with the core past the end");
    assert_eq!(peek(a + 10 * PS + 99), byte(10 * PS + 99));
    assert_eq!(peek(a + 10 * PS + 100), 0, "the last page's tail reads zeros");
    s.close().unwrap();
}

const REFUSED_ENV: &str = "USERMM_FILE_WINDOWS_REFUSED";

/// The host refuses a window (`RLIMIT_MEMLOCK` exactly the region's size,
/// which its own lock takes, so `MAP_LOCKED` of a window over it is
/// `EAGAIN`): the fault copies instead, with the right bytes, locked, and
/// the space asks the host no more. In a child process that is not root
/// (root's `CAP_IPC_LOCK` lifts the limit).
#[test]
fn a_window_the_host_refuses_is_copied() {
    let out = common::run_entry("refused_child", &[(REFUSED_ENV, "1".into())]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("REFUSED-OK"),
        "child: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "child-process entry point of a_window_the_host_refuses_is_copied"]
fn refused_child() {
    if std::env::var(REFUSED_ENV).is_err() {
        return;
    }
    let f = file("refused");
    let r = libc::rlimit { rlim_cur: (PAGES * PS) as u64, rlim_max: (PAGES * PS) as u64 };
    // SAFETY: this process only (a child that exits after the scenario);
    // `r` is a valid rlimit.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &r), 0);
        assert_eq!(libc::setgid(65534), 0);
        assert_eq!(libc::setuid(65534), 0);
    }
    let s = Space::open(&Config { budget_bytes: 8 << 20, memlock_bytes: 8 << 20, ..Config::default() })
        .expect("an unprivileged space (user-mode-only userfaultfd)");
    let a = map_and_touch(&s, &f);
    check(a, 32..48, "copied window");
    check(a, 128..144, "copied window");
    assert!(!host_maps_file(a + 40 * PS) && !host_maps_file(a + 130 * PS), "the host refused: copies");
    assert!(host_locked_kb(a + 40 * PS) > 0, "the copied window is locked in the host too");
    assert_eq!(s.stats().locked_pages, 32);
    s.close().unwrap();
    println!("REFUSED-OK");
}
