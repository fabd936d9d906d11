//! `UMM_MAP_INTHREAD`: one region's faults resolved in the faulting thread
//! (the SIGBUS handler usermm installs) in a space whose other regions keep
//! their handler threads.
//!
//! What is checked: the two kinds side by side, each with its own
//! behaviour (a kernel-mode access to a page not resident is `EFAULT` in
//! the in-thread region only; `umm_smaps` shows `it` on that region only);
//! both kinds swapped under one budget by several threads with every byte
//! right, with and without the frame pool; a range that changes kind with
//! the region mapped there (`munmap` then `mmap`, `MAP_FIXED` over a live
//! region, part of a region); regions of the two kinds never merge, and a
//! split keeps the kind; fills no fault asked for (populate, `mlock`,
//! `MADV_WILLNEED`) in an in-thread region; a file region in-thread; and a
//! poisoned page of a handler region still raises the program's SIGBUS once
//! the handler is usermm's.

mod common;

use usermm::consts::*;
use usermm::{Config, Space};
use usermm_sys::kernel::{peek, pipe_read_into, poke, probe_read};

const PS: usize = 4096;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const RW: i32 = PROT_READ | PROT_WRITE;

/// A handler-thread space (never `UMM_F_INTHREAD_FAULTS`: this binary is
/// not in the suite's in-thread pass, and the space is opened here as
/// configured).
fn space(budget_pages: usize, swap_pages: usize, flags: u32) -> Space {
    let cfg = Config { budget_bytes: budget_pages * PS, swap_bytes: swap_pages * PS, flags, ..Config::default() };
    Space::open(&cfg).unwrap_or_else(|e| panic!("umm_open failed ({e}): these tests need userfaultfd (root)"))
}

/// Whether a kernel-mode write to the untouched page at `a` works (a
/// handler region serves it) or fails with `EFAULT` (an in-thread one).
fn kernel_write_works(a: usize) -> bool {
    match pipe_read_into(a, b"hi") {
        Ok(2) => true,
        Err(usermm::Errno::EFAULT) => false,
        r => panic!("read(2) into {a:#x}: {r:?}"),
    }
}

/// The `VmFlags` of the region starting at `a`, from `umm_smaps`.
fn vm_flags(s: &Space, a: usize) -> Vec<String> {
    let smaps = s.smaps();
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        let start = l.split('-').next().and_then(|h| usize::from_str_radix(h, 16).ok());
        if start == Some(a) && l.contains(' ') {
            for l in lines.by_ref() {
                if let Some(f) = l.strip_prefix("VmFlags:") {
                    return f.split_whitespace().map(String::from).collect();
                }
            }
        }
    }
    panic!("no region at {a:#x} in\n{smaps}")
}

fn regions(s: &Space) -> usize {
    s.smaps().lines().filter(|l| l.starts_with("VmFlags:")).count()
}

fn tag(p: usize, round: usize, which: usize) -> u8 {
    (p * 7 + round * 13 + which * 101 + 1) as u8
}

#[test]
fn one_region_in_thread_beside_handler_regions() {
    let s = space(256, 0, 0);
    let h = s.mmap(0, 16 * PS, RW, ANON, -1, 0).unwrap();
    let it = s.mmap(0, 16 * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    let h2 = s.mmap(0, 16 * PS, RW, ANON, -1, 0).unwrap();
    // The handler regions serve a kernel-mode access; the in-thread one
    // cannot (the documented cost, for this region only).
    assert!(kernel_write_works(h + 3 * PS), "a handler region must serve read(2) into an untouched page");
    assert!(!kernel_write_works(it + 3 * PS), "read(2) into an untouched in-thread page must be EFAULT");
    assert!(kernel_write_works(h2 + 3 * PS), "a region mapped after the in-thread one keeps its handler threads");
    assert_eq!(probe_read(it + 5 * PS), None, "process_vm_readv of an untouched in-thread page: EFAULT");
    assert_eq!(probe_read(h + 5 * PS), Some(0), "process_vm_readv of an untouched handler page is served");
    assert!(vm_flags(&s, it).iter().any(|f| f == "it"), "{}", s.smaps());
    assert!(!vm_flags(&s, h).iter().any(|f| f == "it"), "{}", s.smaps());
    // Touched in the program, the in-thread pages come in (zero, then the
    // written bytes), and then read(2) into them works.
    for p in 0..16 {
        assert_eq!(peek(it + p * PS + 7), 0, "untouched in-thread page {p}");
        poke(it + p * PS + 9, p as u8 + 1);
    }
    for p in 0..16 {
        assert_eq!(peek(it + p * PS + 9), p as u8 + 1, "in-thread page {p}");
    }
    assert_eq!(pipe_read_into(it + 3 * PS, b"hi"), Ok(2));
    assert_eq!(peek(it + 3 * PS + 1), b'i');
    assert_eq!(peek(h + 3 * PS + 1), b'i', "the handler region kept what read(2) wrote");
    s.close().unwrap();
}

fn swap_both_kinds(flags: u32) {
    // Two regions of 1,024 pages each, one of each kind, through a
    // 256-page budget, written and checked by four threads three times:
    // evictions and swap-ins of both kinds interleave.
    let s = space(256, 8192, flags);
    let pages = 1024;
    let h = s.mmap(0, pages * PS, RW, ANON, -1, 0).unwrap();
    let it = s.mmap(0, pages * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4 {
            sc.spawn(move || {
                for round in 0..3 {
                    for p in (t..pages).step_by(4) {
                        poke(h + p * PS + t, tag(p, round, 0));
                        poke(it + p * PS + PS - 1 - t, tag(p, round, 1));
                    }
                    for p in (t..pages).step_by(4) {
                        assert_eq!(peek(h + p * PS + t), tag(p, round, 0), "handler page {p} round {round}");
                        assert_eq!(
                            peek(it + p * PS + PS - 1 - t),
                            tag(p, round, 1),
                            "in-thread page {p} round {round}"
                        );
                    }
                }
            });
        }
    });
    // Read-only passes: swap-ins of the handler region may be installed
    // write-protected (the swap cache), the in-thread region's never
    // (read(2) into a resident page must work there).
    for p in 0..pages {
        assert_eq!(peek(h + p * PS + p % 4), tag(p, 2, 0), "handler page {p}");
        assert_eq!(peek(it + p * PS + PS - 1 - p % 4), tag(p, 2, 1), "in-thread page {p}");
    }
    let st = s.stats();
    assert!(st.swapouts > 2048 && st.swapins > 2048, "both regions must really have been swapped: {st:?}");
    assert!(st.resident_pages <= 256, "the budget holds: {st:?}");
    assert_eq!(st.swap_read_errors + st.swap_write_errors, 0, "{st:?}");
    for p in (0..pages).step_by(97) {
        // Resident now or not: a touch first, then the kernel's own write.
        poke(it + p * PS + 100, 1);
        assert_eq!(pipe_read_into(it + p * PS + 100, b"ok"), Ok(2), "read(2) into touched in-thread page {p}");
        assert_eq!(peek(it + p * PS + 101), b'k');
    }
    s.validate();
    s.close().unwrap();
}

#[test]
fn both_kinds_swap_under_one_budget_with_every_byte_right() {
    swap_both_kinds(0);
}

#[test]
fn both_kinds_swap_with_the_frame_pool() {
    // Pool frames are moved in (`UFFDIO_MOVE`, which wants the
    // destination's own userfaultfd) in both kinds of region.
    swap_both_kinds(UMM_F_FRAME_POOL);
}

#[test]
fn populate_lock_and_willneed_fill_an_in_thread_region_from_other_threads() {
    // Fills that no fault asked for (a populate, a lock's population, the
    // background thread's read-in) install pages in an in-thread region
    // through the space's own userfaultfd; each page is then resident, and
    // a kernel-mode access to it works.
    let s = space(1024, 4096, 0);
    let it = s.mmap(0, 64 * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    s.madvise(it, 16 * PS, MADV_POPULATE_WRITE).unwrap();
    s.mlock(it + 16 * PS, 16 * PS).unwrap();
    for p in 0..32 {
        assert_eq!(pipe_read_into(it + p * PS, b"ok"), Ok(2), "populated or locked page {p}");
    }
    assert!(!kernel_write_works(it + 40 * PS), "an untouched page is still EFAULT to the kernel");
    s.munlock(it + 16 * PS, 16 * PS).unwrap();
    // Swapped out, then read back in by MADV_WILLNEED.
    for p in 32..64 {
        poke(it + p * PS + 3, p as u8);
    }
    s.madvise(it + 32 * PS, 32 * PS, MADV_PAGEOUT).unwrap();
    s.madvise(it + 32 * PS, 32 * PS, MADV_WILLNEED).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !(32..64).all(|p| probe_read(it + p * PS + 3) == Some(p as u8)) {
        assert!(std::time::Instant::now() < deadline, "MADV_WILLNEED must read the swapped pages back in");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for p in 0..64 {
        let want = if p >= 32 { p as u8 } else { 0 };
        assert_eq!(peek(it + p * PS + 3), want, "page {p}");
    }
    s.close().unwrap();
}

#[test]
fn a_range_changes_kind_with_the_region_mapped_there() {
    let s = space(256, 0, 0);
    let a = s.mmap(0, 16 * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    assert!(!kernel_write_works(a));
    // Unmapped, then mapped again without the flag at the same address.
    s.munmap(a, 16 * PS).unwrap();
    assert_eq!(s.mmap(a, 16 * PS, RW, ANON | MAP_FIXED, -1, 0).unwrap(), a);
    for p in 0..16 {
        assert!(kernel_write_works(a + p * PS), "page {p} of a handler region mapped over an in-thread one");
    }
    // Part of it replaced by an in-thread mapping (MAP_FIXED over a live
    // region): that part changes kind, the rest does not.
    assert_eq!(s.mmap(a + 4 * PS, 4 * PS, RW, ANON | MAP_FIXED | UMM_MAP_INTHREAD, -1, 0).unwrap(), a + 4 * PS);
    assert_eq!(peek(a + 4 * PS), 0, "a MAP_FIXED mapping reads zeros");
    for p in 5..8 {
        assert!(!kernel_write_works(a + p * PS), "page {p} of the in-thread mapping");
    }
    for p in (8..16).chain(0..4) {
        poke(a + p * PS + 50, 7);
        assert_eq!(peek(a + p * PS + 50), 7);
    }
    assert_eq!(regions(&s), 3, "{}", s.smaps());
    // And back: a handler mapping over the in-thread one.
    assert_eq!(s.mmap(a + 4 * PS, 4 * PS, RW, ANON | MAP_FIXED, -1, 0).unwrap(), a + 4 * PS);
    for p in 4..8 {
        assert!(kernel_write_works(a + p * PS), "page {p} mapped back to the handler threads");
    }
    assert_eq!(regions(&s), 1, "the three handler pieces merge again: {}", s.smaps());
    s.close().unwrap();
}

#[test]
fn a_zap_the_host_refused_at_first_keeps_the_kind() {
    // Pages locked in the host behind usermm's back make it refuse
    // `MADV_DONTNEED`; the zap unlocks and drops them again. The next
    // in-thread region there reads zeros and is still in-thread.
    let s = space(256, 0, 0);
    let a = s.mmap(0, 8 * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    for p in 0..8 {
        poke(a + p * PS, 0x40);
    }
    usermm_sys::mem::mlock2(a, 8 * PS, 0).expect("raw host mlock2");
    s.munmap(a, 8 * PS).unwrap();
    assert!(s.stats().host_refusals > 0, "the refusal is counted");
    assert_eq!(s.mmap(a, 8 * PS, RW, ANON | MAP_FIXED | UMM_MAP_INTHREAD, -1, 0).unwrap(), a);
    assert!(!kernel_write_works(a + 2 * PS), "the range must still be the in-thread userfaultfd's");
    for p in 0..8 {
        assert_eq!(peek(a + p * PS), 0, "page {p}: the old region's byte");
    }
    s.close().unwrap();
}

#[test]
fn the_two_kinds_never_merge_and_a_split_keeps_its_kind() {
    let s = space(256, 0, 0);
    let a = s.mmap(0, 32 * PS, RW, ANON, -1, 0).unwrap();
    // Adjacent, same protection and kind of memory: only the flag differs.
    s.munmap(a + 16 * PS, 16 * PS).unwrap();
    assert_eq!(s.mmap(a + 16 * PS, 16 * PS, RW, ANON | MAP_FIXED | UMM_MAP_INTHREAD, -1, 0).unwrap(), a + 16 * PS);
    assert_eq!(regions(&s), 2, "{}", s.smaps());
    // mprotect splits the in-thread region; both pieces stay in-thread.
    s.mprotect(a + 20 * PS, 4 * PS, PROT_READ).unwrap();
    assert_eq!(regions(&s), 4, "{}", s.smaps());
    assert_eq!(peek(a + 21 * PS), 0, "a read-only in-thread page reads zero");
    for p in [17, 26, 31] {
        assert!(!kernel_write_works(a + p * PS), "page {p} after the split");
    }
    assert!(vm_flags(&s, a + 20 * PS).iter().any(|f| f == "it"), "{}", s.smaps());
    assert!(vm_flags(&s, a + 24 * PS).iter().any(|f| f == "it"), "{}", s.smaps());
    s.mprotect(a + 20 * PS, 4 * PS, RW).unwrap();
    assert_eq!(regions(&s), 2, "the in-thread pieces merge back, never with the handler region: {}", s.smaps());
    s.close().unwrap();
}

#[test]
fn a_file_region_in_thread_reads_its_file() {
    let dir = std::env::temp_dir().join(format!("usermm-inthread-region-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    let pages = 64;
    let data: Vec<u8> = (0..pages * PS).map(|i| (i / PS * 3 + i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    let s = space(256, 0, 0);
    let a = s.mmap(0, pages * PS, PROT_READ, MAP_PRIVATE | UMM_MAP_INTHREAD, f.as_raw_fd(), 0).unwrap();
    let b = s.mmap(0, pages * PS, PROT_READ, MAP_PRIVATE, f.as_raw_fd(), 0).unwrap();
    assert_eq!(probe_read(a + 40 * PS + 5), None, "an untouched in-thread file page: EFAULT to the kernel");
    assert_eq!(probe_read(b + 40 * PS + 5), Some(data[40 * PS + 5]), "a handler file region serves the kernel");
    for p in 0..pages {
        for off in [0, 1234, PS - 1] {
            assert_eq!(peek(a + p * PS + off), data[p * PS + off], "in-thread file page {p} byte {off}");
        }
    }
    assert_eq!(probe_read(a + 40 * PS + 5), Some(data[40 * PS + 5]), "resident now");
    s.close().unwrap();
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_poisoned_page_of_a_handler_region_still_raises_the_programs_sigbus() {
    let out = common::run_entry("entry_poison_beside_in_thread_region", &[]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && so.contains("poison seen at the address") && so.contains("in-thread page reads 9"),
        "{:?}\n{so}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by a_poisoned_page_of_a_handler_region_still_raises_the_programs_sigbus in a child"]
fn entry_poison_beside_in_thread_region() {
    use usermm_sys::testing::SigbusRecorder;
    let s = space(256, 0, 0);
    let h = s.mmap(0, 16 * PS, RW, ANON, -1, 0).unwrap();
    // The in-thread region installs usermm's SIGBUS handler; the
    // recorder (the program's handler) is chained to from then on.
    let it = s.mmap(0, 16 * PS, RW, ANON | UMM_MAP_INTHREAD, -1, 0).unwrap();
    let rec = SigbusRecorder::install(h, h + 16 * PS).unwrap();
    poke(it, 9);
    poke(h + PS, 1);
    s.madvise(h + 5 * PS, PS, MADV_HWPOISON).unwrap();
    let target = h + 5 * PS + 77;
    common::touch_poisoned_and_report(&rec, target);
    println!("in-thread page reads {}", peek(it));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}
