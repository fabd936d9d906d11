//! `UMM_F_INTHREAD_FAULTS`: faults resolved in the faulting thread, from the
//! SIGBUS handler usermm installs (`UFFD_FEATURE_SIGBUS`).
//!
//! What is checked: pages come in (zero fills, swap-ins under a budget a
//! quarter of the data, write-protect faults) with every byte right and no
//! handler thread; threads fault at once; a program's own SIGBUS handler
//! gets the SIGBUS that are not a space's faults (a poisoned page), with
//! the address, whether it was installed before or after the space opened;
//! with no handler the process dies of SIGBUS; a sequential writer's
//! windows stop at the in-thread size; faults with the async
//! signals blocked and from code on an alternate signal stack; and the
//! documented cost: a kernel-mode access to a page that is not resident
//! fails with `EFAULT`.

mod common;

use usermm::consts::*;
use usermm::{Config, Space};
use usermm_sys::kernel::{peek, pipe_read_into, poke};
use usermm_sys::testing::{run_on_alt_stack, with_async_signals_blocked, SigbusRecorder};

const PS: usize = 4096;

fn space(budget_pages: usize, swap_pages: usize) -> Space {
    common::open(&Config {
        budget_bytes: budget_pages * PS,
        swap_bytes: swap_pages * PS,
        flags: UMM_F_INTHREAD_FAULTS,
        ..Config::default()
    })
}

fn tag(p: usize, round: usize) -> u8 {
    (p * 7 + round * 13 + 1) as u8
}

/// Handler threads of any space in this process ("usermm-fault-N").
fn fault_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("usermm-fault"))
        .count()
}

#[test]
fn pages_come_in_in_the_faulting_thread_with_every_byte_right() {
    // 4,096 pages through a 1,024-page budget, twice, every page checked
    // at its first and last byte; then read-only passes (swap-ins
    // installed write-protected, so that the next writes are WP faults).
    let s = space(1024, 8192);
    let pages = 4096;
    let a = s.mmap(0, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    // (Every space in this binary has in-thread faults: none has a
    // handler thread.)
    assert_eq!(fault_threads(), 0, "an in-thread space must not start handler threads");
    for p in 0..pages {
        assert_eq!(peek(a + p * PS), 0, "untouched page {p} must read zero");
    }
    for round in 0..2 {
        for p in 0..pages {
            poke(a + p * PS, tag(p, round));
            poke(a + p * PS + PS - 1, tag(p, round));
        }
        for p in (0..pages).rev() {
            assert_eq!(peek(a + p * PS), tag(p, round), "page {p} first byte, round {round}");
            assert_eq!(peek(a + p * PS + PS - 1), tag(p, round), "page {p} last byte, round {round}");
        }
    }
    for p in 0..pages {
        poke(a + p * PS + 1, 0x5a);
    }
    for p in 0..pages {
        assert_eq!(peek(a + p * PS + 1), 0x5a, "page {p} after the write-protect faults");
        assert_eq!(peek(a + p * PS), tag(p, 1), "page {p} kept its data");
    }
    let st = s.stats();
    assert!(st.swapouts > 4096 && st.swapins > 4096, "the data must really have been swapped: {st:?}");
    // Every page was a fault of its own on the first pass (a zero fill);
    // later passes fault swapped pages in, several at a time: the
    // read-around follows the passes, forwards and backwards.
    assert!(st.zero_fills >= 4096 && st.major_faults > 0, "{st:?}");
    assert!(st.major_faults * 4 < st.swapins, "the passes read around their faults: {st:?}");
    assert_eq!(st.swap_read_errors + st.swap_write_errors, 0, "{st:?}");
    assert!(st.resident_pages <= 1024, "the budget holds: {st:?}");
    s.close().unwrap();
}

#[test]
fn a_sequential_writer_fills_windows_of_at_most_the_in_thread_size() {
    // The faulting thread fills its whole window before it goes on, so an
    // in-thread write fault's zero-fill window stops at
    // IN_THREAD_ZERO_WINDOW_PAGES; a handler thread's would grow to
    // MAX_WINDOW_PAGES.
    use usermm_core::{IN_THREAD_ZERO_WINDOW_PAGES as CAP, MAX_WINDOW_PAGES as MAX};
    const { assert!(CAP < MAX) };
    let s = space(8192, 0);
    let pages = 4096;
    let a = s.mmap(0, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    for p in 0..pages {
        poke(a + p * PS, tag(p, 0));
    }
    let st = s.stats();
    assert_eq!(st.zero_fills, pages as u64, "{st:?}");
    // (Windows of the largest size would take fewer than pages / CAP.)
    let faults = st.faults as usize;
    assert!(faults >= pages / CAP as usize, "{faults} faults: windows over {CAP} pages");
    assert!(faults <= pages / CAP as usize + 8, "{faults} faults: the windows did not grow");
    for p in 0..pages {
        assert_eq!(peek(a + p * PS), tag(p, 0), "page {p}");
    }
    s.close().unwrap();
}

#[test]
fn threads_fault_at_once() {
    let s = space(512, 8192);
    let pages = 2048;
    let a = s.mmap(0, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4 {
            sc.spawn(move || {
                for round in 0..3 {
                    for p in (t..pages).step_by(4) {
                        poke(a + p * PS + t, tag(p, round));
                    }
                    // Every page, the others' too: reads race with their
                    // writes and with reclaim, never a wrong own byte.
                    for p in 0..pages {
                        let _ = peek(a + p * PS);
                        if p % 4 == t {
                            assert_eq!(peek(a + p * PS + t), tag(p, round), "thread {t} page {p}");
                        }
                    }
                }
            });
        }
    });
    let st = s.stats();
    assert!(st.swapins > 0 && st.swapouts > 0, "{st:?}");
    s.close().unwrap();
}

#[test]
fn a_program_sigbus_handler_gets_the_sigbus_that_are_not_faults_of_a_space() {
    // In a child each (a thread is left retrying a poisoned page): the
    // program's handler installed after the space opened (usermm's handler
    // stays and chains to it), then before.
    for when in ["after", "before"] {
        let out = common::run_entry("entry_program_handler", &[("INTHREAD_HANDLER", when.into())]);
        let so = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && so.contains("resolved faults seen: 0") && so.contains("poison seen at the address"),
            "handler installed {when} the space opened: {:?}\n{so}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[ignore = "run by a_program_sigbus_handler_gets_the_sigbus_that_are_not_faults_of_a_space in a child"]
fn entry_program_handler() {
    let before = std::env::var("INTHREAD_HANDLER").as_deref() == Ok("before");
    // (The recorder's range is set once the region's address is known:
    // installed before, it starts with an empty one.)
    let early = before.then(|| SigbusRecorder::install(0, 0).unwrap());
    let s = space(256, 1024);
    let a = s.mmap(0, 64 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    drop(early);
    let rec = SigbusRecorder::install(a, a + 64 * PS).unwrap();
    for p in 0..64 {
        poke(a + p * PS, 1);
    }
    println!("resolved faults seen: {}", rec.record().count);
    s.madvise(a + 5 * PS, PS, MADV_HWPOISON).unwrap();
    let target = a + 5 * PS + 123;
    common::touch_poisoned_and_report(&rec, target);
    // Other pages still fault in the usual way.
    println!("page 6 reads {}", peek(a + 6 * PS));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

#[test]
fn with_no_program_handler_a_poisoned_page_kills_with_sigbus() {
    let out = common::run_entry("entry_touch_poisoned_page", &[]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the child must die of SIGBUS: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("zero-fill ok"),
        "the child must first have faulted normally"
    );
}

#[test]
#[ignore = "run by with_no_program_handler_a_poisoned_page_kills_with_sigbus in a child"]
fn entry_touch_poisoned_page() {
    usermm_sys::testing::sigbus_default().unwrap();
    let s = space(64, 0);
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    poke(a, 3);
    assert_eq!(peek(a), 3);
    println!("zero-fill ok");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    s.madvise(a + PS, PS, MADV_HWPOISON).unwrap();
    let _ = peek(a + PS);
    println!("survived");
}

#[test]
fn faults_with_the_async_signals_blocked() {
    let s = space(128, 2048);
    let a = s.mmap(0, 1024 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    std::thread::spawn(move || {
        with_async_signals_blocked(|| {
            for p in 0..1024 {
                poke(a + p * PS, tag(p, 0));
            }
            for p in 0..1024 {
                assert_eq!(peek(a + p * PS), tag(p, 0), "page {p}");
            }
        })
    })
    .join()
    .unwrap();
    assert!(s.stats().swapins > 0);
    s.close().unwrap();
}

static ALT_ADDR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static ALT_SUM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn touch_from_handler() {
    let a = ALT_ADDR.load(std::sync::atomic::Ordering::SeqCst);
    let mut sum = 0u64;
    for p in 0..256 {
        sum += u64::from(peek(a + p * PS));
    }
    ALT_SUM.store(sum, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn faults_from_a_handler_on_an_alternate_stack() {
    // Swapped pages read by a signal handler running on a 64 KiB alternate
    // stack: usermm's handler runs nested, on that stack.
    let s = space(64, 2048);
    let a = s.mmap(0, 512 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    for p in 0..512 {
        poke(a + p * PS, 1);
    }
    assert!(s.stats().swapouts > 0);
    ALT_ADDR.store(a, std::sync::atomic::Ordering::SeqCst);
    run_on_alt_stack(64 << 10, touch_from_handler).unwrap();
    assert_eq!(ALT_SUM.load(std::sync::atomic::Ordering::SeqCst), 256, "every page read on the alternate stack");
    s.close().unwrap();
}

#[test]
fn a_kernel_mode_access_to_a_page_not_resident_is_efault() {
    // The documented cost of the mode: read(2) into an untouched page
    // fails (the kernel cannot wait for a signal handler); once touched,
    // it works.
    let s = space(64, 1024);
    let a = s.mmap(0, 8 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    assert_eq!(pipe_read_into(a + 2 * PS, b"hello"), Err(usermm::Errno::EFAULT));
    // And umm_smaps says so: the VmFlag `it` on every region.
    let smaps = s.smaps();
    let flags: Vec<&str> = smaps.lines().filter(|l| l.starts_with("VmFlags:")).collect();
    assert!(!flags.is_empty() && flags.iter().all(|l| l.split_whitespace().any(|f| f == "it")), "{smaps}");
    poke(a + 2 * PS, 0);
    assert_eq!(pipe_read_into(a + 2 * PS, b"hello"), Ok(5));
    assert_eq!(peek(a + 2 * PS + 4), b'o');
    s.close().unwrap();
}

#[test]
fn a_lock_on_fault_file_window_comes_in_in_two_halves_and_a_failed_half_is_dropped_again() {
    // A read-only, lock-on-fault file mapping: each fault reads a 16-page
    // window, which the faulting thread installs in two halves at once with
    // the wake-ahead thread when that spins (`install_split`). Every byte
    // right, every touched page resident and locked; then a split whose
    // first half fails (injected): one transient SIGBUS, the second half
    // dropped again (left in, its pages would be mapped but never
    // committed: readable, yet not resident in the space's books), and the
    // retried access reads the window in. The wake-ahead thread runs at
    // SCHED_IDLE: with the other CPU busy (tests run two at a time) it may
    // not spin at a given fault, so the mapping is read afresh until splits
    // happen (at most 60 s).
    let pages = 1024;
    let len = pages * PS;
    let data: Vec<u8> = (0..len).map(|i| (i / PS) as u8 ^ (i % 251) as u8).collect();
    let path = std::env::temp_dir().join(format!("usermm-test-{}-split", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let s = space(4096, 1024);
    let a = s.mmap(0, len, PROT_READ, MAP_PRIVATE, fd, 0).unwrap();
    let remap = || {
        s.munmap(a, len).unwrap();
        assert_eq!(s.mmap(a, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0), Ok(a));
        s.mlock2(a, len, MLOCK_ONFAULT).unwrap();
    };
    let check = |p: usize| {
        assert_eq!(peek(a + p * PS), data[p * PS], "page {p} first byte");
        assert_eq!(peek(a + p * PS + PS - 1), data[p * PS + PS - 1], "page {p} last byte");
    };
    let books_right = |what: &str| {
        let mut st = vec![0u32; pages];
        s.page_state(a, pages, &mut st).unwrap();
        let not_resident: Vec<usize> = (0..pages).filter(|&p| st[p] & UMM_PAGE_RESIDENT == 0).collect();
        assert!(not_resident.is_empty(), "{what}: touched pages the space does not count resident: {not_resident:?}");
        assert_eq!(s.stats().locked_pages, pages as u64, "{what}: {:?}", s.stats());
    };
    let multi = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut rounds = 0;
    loop {
        remap();
        rounds += 1;
        (0..pages).for_each(check);
        books_right("halves");
        if !multi || s.inject_split_failures(0) > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no window came in in two halves in {rounds} rounds");
    }
    if !multi {
        eprintln!("one CPU: no wake-ahead thread, no split installs");
        s.close().unwrap();
        return;
    }
    // Now a failure: fresh windows are touched until the injected one is hit.
    let rec = SigbusRecorder::install(a, a + len).expect("install SIGBUS recorder");
    s.inject_split_failures(1);
    let hit = 'rounds: loop {
        remap();
        for p in (0..pages).step_by(16) {
            check(p);
            if rec.record().count > 0 {
                break 'rounds p;
            }
        }
        assert!(std::time::Instant::now() < deadline, "no split was injected a failure");
    };
    let r = rec.record();
    drop(rec);
    assert_eq!(r.count, 1, "one SIGBUS for one failed split");
    assert_eq!(r.code, usermm_sys::thread::SIGBUS_TRANSIENT_SI_CODE, "a transient SIGBUS");
    assert_eq!(r.errno, libc::EIO, "si_errno: the page could not be read");
    assert!((a + hit * PS..a + (hit + 1) * PS).contains(&r.addr), "si_addr {:#x}, page {hit}", r.addr);
    (0..pages).for_each(check);
    books_right("after a failed half");
    s.validate();
    s.close().unwrap();
}
