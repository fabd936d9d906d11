//! Swap I/O errors, injected with `Space::inject_swap_errors`: no silent
//! corruption, ever.
//!
//! - a failed swap *write* keeps the page resident with its data, and once
//!   the errors stop, reclaim proceeds and every byte verifies;
//! - a failed swap *read* raises SIGBUS in the faulting thread (it never
//!   reads wrong data): checked in a child process that dies of it, and
//!   in-process with a recording SIGBUS handler (whose return retries the
//!   access, which then succeeds);
//! - a fault that can get no frame (the budget locked, swap full, the page
//!   store down) gets exactly one SIGBUS, within 100 ms, and another
//!   thread's `umm_mmap` does not wait for it; one whose thread faulted
//!   twice for the access (woken by another signal) too;
//! - a store that refuses writes (swap on a full file system) is backed off
//!   from, says so in `umm_stats`, and is written again once it has room.

mod common;
mod paging;
mod pattern;
mod redis_server;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paging::{bad_in, fill, pageout_all, states, PAGE};
use pattern::bad_bytes;
use usermm::consts::{
    MADV_PAGEOUT, MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, UMM_PAGE_INACTIVE, UMM_PAGE_RESIDENT,
    UMM_PAGE_SWAPPED,
};
use usermm::{Config, Space};
use usermm_sys::kernel::poke;
use usermm_sys::testing::{sigbus_default, SigbusRecorder};
use usermm_sys::thread::SIGBUS_TRANSIENT_SI_CODE;

fn space(budget: usize, swap: usize) -> Space {
    common::open(&Config { budget_bytes: budget, swap_bytes: swap, ..Config::default() })
}

#[test]
fn write_errors_keep_pages_resident_and_intact() {
    let s = space(4 << 20, 64 << 20); // 1024-page budget
    let mut a = s.map_anon(1 << 20).expect("mmap a"); // 256 pages
    fill(&mut a, 1, 1);

    // Every swap write fails: MADV_PAGEOUT parks the pages but cannot evict.
    s.inject_swap_errors(0, 1_000_000);
    a.advise(MADV_PAGEOUT).expect("MADV_PAGEOUT");
    let st = s.stats();
    eprintln!("after failed pageout: {st:?}");
    assert!(st.swap_write_errors > 0, "no write error counted");
    assert_eq!(st.swapouts, 0, "a page was counted swapped out although every write failed");
    assert_eq!(st.swapped_pages, 0);
    let ps = states(&s, &a);
    assert!(ps.iter().all(|&b| b & UMM_PAGE_RESIDENT != 0 && b & UMM_PAGE_SWAPPED == 0), "page states {ps:x?}");
    assert!(ps.iter().any(|&b| b & UMM_PAGE_INACTIVE != 0), "nothing was even deactivated");
    assert_eq!(bad_in(&a, 1, 1), 0, "data of pages whose eviction failed");

    // A few more failures, then pressure: reclaim must get past them.
    let errors_before = s.stats().swap_write_errors;
    s.inject_swap_errors(0, 4);
    let mut b = s.map_anon(16 << 20).expect("mmap b"); // 4x the budget
    fill(&mut b, 2, 7);
    fill(&mut a, 1, 2);
    assert_eq!(bad_in(&b, 2, 7), 0, "pressure region b");
    assert_eq!(bad_in(&a, 1, 2), 0, "region a after pressure");
    let st = s.stats();
    eprintln!("after pressure: {st:?}");
    // Each injected error fails one swap write call, which carries a run of
    // up to 256 pages; the counter counts pages.
    assert!(
        st.swap_write_errors > errors_before && st.swap_write_errors <= errors_before + 4 * 256,
        "write errors {} -> {}",
        errors_before,
        st.swap_write_errors
    );
    assert!(st.swapouts > 0 && st.swapins > 0, "no pressure");
    assert_eq!(st.oom_sigbus, 0);
    assert_eq!(st.swap_read_errors, 0);
    assert!(st.resident_pages_max <= st.budget_pages);

    // The errors are used up: a page-out really swaps now.
    let ps = pageout_all(&s, &mut a);
    assert!(ps.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0), "not all swapped after the errors stopped: {ps:x?}");
    assert_eq!(bad_in(&a, 1, 2), 0, "region a read back from swap");
    drop(a);
    drop(b);
    s.validate();
}

const CHILD_ENV: &str = "USERMM_SWAP_ERR_CHILD";
const CHILD_TEST: &str = "child_read_error_scenario";
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// The child side of the read-error tests: does nothing unless
/// `USERMM_SWAP_ERR_CHILD` is set. Modes:
/// - `inject`: one swap read fails, SIGBUS at its default action: the child
///   must die of SIGBUS at the touch;
/// - `clean`: the same without the error: exit 0 (data verified);
/// - `recorder`: one swap read fails, with a recording SIGBUS handler: the
///   in-process checks below run, exit 0 if they pass (a panic is 101).
///
/// Exit codes: 0 the page read back correctly; 2 wrong data was read; 3 the
/// page was not swapped out (the scenario could not be set up).
#[test]
#[ignore = "child-process entry point of the read-error tests"]
fn child_read_error_scenario() {
    let Ok(mode) = std::env::var(CHILD_ENV) else { return };
    if mode == "recorder" {
        read_error_in_process();
        std::process::exit(0);
    }
    let s = space(4 << 20, 16 << 20);
    let mut m = s.map_anon(16 * PAGE).expect("mmap");
    fill(&mut m, 9, 1);
    let st = pageout_all(&s, &mut m);
    if st[0] & UMM_PAGE_SWAPPED == 0 {
        eprintln!("child: page 0 not swapped out: {:#x}", st[0]);
        std::process::exit(3);
    }
    eprintln!("child: page 0 SWAPPED");
    if mode == "inject" {
        s.inject_swap_errors(1, 0);
    }
    // Rust's runtime handler would turn the first SIGBUS into a retry (see
    // usermm_sys::testing); the default action is what a C program gets.
    sigbus_default().expect("sigaction");
    eprintln!("child: stats before the touch: {:?}", s.stats());
    let bad = std::thread::scope(|sc| sc.spawn(|| bad_bytes(&m[..PAGE], 9 << 32, 1)).join().unwrap());
    eprintln!("child: read page 0, {bad} bad bytes; stats {:?}", s.stats());
    std::process::exit(if bad == 0 { 0 } else { 2 });
}

/// Runs the child scenario `mode`; kills it (and fails) if it has not ended
/// within `CHILD_TIMEOUT` (a thread stuck in a fault that is never served
/// nor signalled). Returns its status and stderr.
fn run_child(mode: &str) -> (ExitStatus, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", CHILD_TEST, "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if t0.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            let err = reader.join().unwrap();
            panic!("child ({mode}) hung for {CHILD_TIMEOUT:?} (a fault neither served nor signalled); stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = reader.join().unwrap();
    eprintln!("child ({mode}) status {status:?}, stderr:\n{err}");
    (status, err)
}

#[test]
fn read_error_kills_faulting_thread_with_sigbus() {
    let (status, err) = run_child("inject");
    assert!(err.contains("child: page 0 SWAPPED"), "the child could not set up the scenario");
    assert!(err.contains("swap_read_errors: 0"), "stats printed before the touch");
    assert!(!err.contains("bad bytes"), "the child's touch returned instead of faulting");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "the child must die of SIGBUS, not {status:?}");
}

/// Control: the same steps without the injected error read the right data.
#[test]
fn read_without_error_reads_right_data_in_child() {
    let (status, err) = run_child("clean");
    assert!(err.contains("child: read page 0, 0 bad bytes"), "clean child output");
    assert_eq!(status.code(), Some(0), "clean child: {status:?}");
}

#[test]
fn read_error_sigbus_in_process_then_retry_reads_right_data() {
    let (status, err) = run_child("recorder");
    assert!(err.contains("in-process: "), "recorder child output");
    assert_eq!(status.code(), Some(0), "recorder child failed: {status:?}");
}

/// In-process (run in a child so that a hang cannot block the test binary):
/// a recording SIGBUS handler sees exactly one SIGBUS at the page whose swap
/// read failed, with `si_code` `SI_QUEUE` (usermm's code for a transient
/// error; the kernel lets only the faulting thread itself queue
/// `BUS_ADRERR`); when it returns, the retried access reads the right data.
fn read_error_in_process() {
    let s = space(4 << 20, 16 << 20);
    let mut m = s.map_anon(16 * PAGE).expect("mmap");
    fill(&mut m, 5, 3);
    let st = pageout_all(&s, &mut m);
    assert!(st.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0), "not swapped out: {st:x?}");
    let before = s.stats();
    let rec = SigbusRecorder::install(m.addr(), m.addr() + m.len()).expect("install SIGBUS recorder");
    s.inject_swap_errors(1, 0);
    // Read page 3 from another thread: the first swap-in fails (SIGBUS, the
    // handler records it and returns), the retried access reads it in.
    let page = 3;
    let bad = std::thread::scope(|sc| {
        sc.spawn(|| bad_bytes(&m[page * PAGE..(page + 1) * PAGE], 5 << 32 | page as u64, 3)).join().unwrap()
    });
    let r = rec.record();
    drop(rec);
    let after = s.stats();
    eprintln!(
        "in-process: {r:?}, bad bytes {bad}, read errors {}, swapins +{}",
        after.swap_read_errors,
        after.swapins - before.swapins
    );
    assert_eq!(r.count, 1, "exactly one SIGBUS for one injected read error");
    let page_addr = m.addr() + page * PAGE;
    assert!((page_addr..page_addr + PAGE).contains(&r.addr), "si_addr {:#x} not in page {page_addr:#x}", r.addr);
    assert_eq!(r.code, SIGBUS_TRANSIENT_SI_CODE, "si_code");
    assert_eq!(r.errno, libc::EIO, "si_errno says a read error");
    assert_eq!(bad, 0, "the retried read returned wrong data");
    assert_eq!(after.swap_read_errors, before.swap_read_errors + 1);
    assert!(after.swapins > before.swapins);
    assert_eq!(states(&s, &m)[page] & UMM_PAGE_RESIDENT, UMM_PAGE_RESIDENT);
    // The other pages are still swapped and read back correctly.
    assert_eq!(bad_in(&m, 5, 3), 0);
    drop(m);
    s.validate();
}

thread_local! {
    /// The page this thread is reading now (0: none).
    static READING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
static LATE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Called from the SIGBUS handler: a transient SIGBUS must reach a thread
/// only while it is blocked in an access to that page.
fn check_not_late(addr: usize) {
    if READING.with(|r| r.get()) != addr & !(PAGE - 1) {
        LATE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 16 item 11: a transient SIGBUS never arrives late. Two fault
/// threads; thread A's swap-in of a page fails and its handler stalls before
/// queuing the SIGBUS (as a preempted handler would); meanwhile thread B
/// touches the same page, and the other handler reads it in and wakes every
/// waiter on it. The SIGBUS must still reach A inside its access (it was
/// queued after A had been woken and had gone on, when the signal was sent
/// after the core lock was let go).
#[test]
fn transient_sigbus_never_arrives_after_the_access() {
    let s = Space::open(&common::with_test_store(Config {
        budget_bytes: 4 << 20,
        swap_bytes: 16 << 20,
        fault_threads: 2,
        ..Config::default()
    }))
    .expect("open");
    let mut m = s.map_anon(16 * PAGE).expect("mmap");
    fill(&mut m, 9, 1);
    let st = pageout_all(&s, &mut m);
    assert!(st.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0), "not swapped out: {st:x?}");
    let rec = SigbusRecorder::install_with(m.addr(), m.addr() + m.len(), check_not_late).expect("install");
    LATE.store(0, std::sync::atomic::Ordering::SeqCst);
    s.inject_signal_stall(200);
    s.inject_swap_errors(1, 0);
    let page = 5;
    let at = m.addr() + page * PAGE;
    let read = |expect_bad: bool| {
        READING.with(|r| r.set(at));
        let bad = bad_bytes(&m[page * PAGE..(page + 1) * PAGE], 9 << 32 | page as u64, 1);
        READING.with(|r| r.set(0));
        assert_eq!(bad, 0, "wrong data (expect_bad {expect_bad})");
        // Stay alive past the stall: a late signal would land here.
        std::thread::sleep(Duration::from_millis(400));
    };
    std::thread::scope(|sc| {
        let a = sc.spawn(|| read(false));
        std::thread::sleep(Duration::from_millis(50));
        let b = sc.spawn(|| read(false));
        a.join().unwrap();
        b.join().unwrap();
    });
    s.inject_signal_stall(0);
    let r = rec.record();
    drop(rec);
    assert_eq!(r.count, 1, "one SIGBUS for one injected read error");
    assert_eq!(LATE.load(std::sync::atomic::Ordering::SeqCst), 0, "a SIGBUS arrived after its access: {r:?}");
    drop(m);
    s.validate();
}

// ---------------------------------------------------------------------
// Out of memory: one SIGBUS per failed fault, soon, and nothing else waits
// (issue 45 items 1 and 2); a store that refuses writes (item 3).
// ---------------------------------------------------------------------

/// The space a failed fault's SIGBUS handler frees memory in, and what it
/// frees (`OOM_FREE`, `OOM_FREE_LEN` bytes; 0: nothing more).
static OOM_SPACE: std::sync::Mutex<Option<Arc<Space>>> = std::sync::Mutex::new(None);
static OOM_FREE: AtomicUsize = AtomicUsize::new(0);
static OOM_FREE_LEN: AtomicUsize = AtomicUsize::new(0);
/// When the touch began and the first SIGBUS came (`now_ns`).
static OOM_T0_NS: AtomicU64 = AtomicU64::new(0);
static OOM_FIRST_NS: AtomicU64 = AtomicU64::new(0);
/// SIGBUSes that arrived while their thread was not touching their page.
static OOM_LATE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The page this thread is touching now (0: none).
    static TOUCHING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The SIGBUS handler's part: a SIGBUS must come while its thread touches
/// that page; the first frees `OOM_FREE` (munmap: the touching thread holds
/// no usermm lock), so that the retried access finds a frame.
fn on_oom_sigbus(addr: usize) {
    if TOUCHING.with(|t| t.get()) != addr & !(PAGE - 1) {
        OOM_LATE.fetch_add(1, Ordering::SeqCst);
        return;
    }
    let _ = OOM_FIRST_NS.compare_exchange(0, usermm_sys::now_ns(), Ordering::SeqCst, Ordering::SeqCst);
    let free = OOM_FREE.swap(0, Ordering::SeqCst);
    if free != 0 {
        // (The test's thread holds this lock only before and after the
        // touch.)
        let s = OOM_SPACE.lock().unwrap().clone();
        if let Some(s) = s {
            let _ = s.munmap(free, OOM_FREE_LEN.load(Ordering::SeqCst));
        }
    }
}

/// What one touch that found no frame came to.
#[derive(Debug)]
struct OomTouch {
    /// SIGBUSes the touching thread took for it.
    sigbus: u64,
    /// SIGBUSes that came when it was no longer touching the page.
    late: u64,
    /// The last SIGBUS's `si_errno` (`ENOMEM`: no frame).
    errno: i32,
    /// From the touch to the first SIGBUS.
    first_ms: f64,
    /// The longest `umm_mmap` + `umm_munmap` of another thread meanwhile.
    other_call_max_ms: f64,
}

/// Touches `target` (no frame to be had for it) on a thread of its own,
/// while another thread maps and unmaps a page in a loop; the SIGBUS
/// handler frees `[free, free + free_len)` so that the retried touch
/// succeeds. `during(tid)` runs on the test's thread 50 ms into the touch.
fn touch_out_of_memory(
    s: &Arc<Space>,
    target: usize,
    free: usize,
    free_len: usize,
    during: impl FnOnce(u32),
) -> OomTouch {
    let (lo, len) = s.reservation();
    // (The statics are set once the recorder is installed: it is one at a
    // time, and tests run in parallel.)
    let rec = SigbusRecorder::install_with(lo, lo + len, on_oom_sigbus).expect("install SIGBUS recorder");
    *OOM_SPACE.lock().unwrap() = Some(Arc::clone(s));
    OOM_FREE_LEN.store(free_len, Ordering::SeqCst);
    OOM_FREE.store(free, Ordering::SeqCst);
    OOM_FIRST_NS.store(0, Ordering::SeqCst);
    OOM_LATE.store(0, Ordering::SeqCst);
    let stop = AtomicBool::new(false);
    let other_max_ns = AtomicU64::new(0);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let a = s.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).expect("mmap");
                s.munmap(a, PAGE).expect("munmap");
                other_max_ns.fetch_max(t.elapsed().as_nanos() as u64, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let toucher = sc.spawn(|| {
            tid_tx.send(usermm_sys::thread::gettid()).unwrap();
            TOUCHING.with(|t| t.set(target));
            compiler_fence(Ordering::SeqCst);
            OOM_T0_NS.store(usermm_sys::now_ns(), Ordering::SeqCst);
            compiler_fence(Ordering::SeqCst);
            poke(target, 1);
            compiler_fence(Ordering::SeqCst);
            TOUCHING.with(|t| t.set(0));
            // Another call, and time: a late SIGBUS would land here.
            let a = s.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).expect("mmap");
            std::thread::sleep(Duration::from_millis(500));
            s.munmap(a, PAGE).expect("munmap");
        });
        let tid = tid_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        during(tid);
        toucher.join().unwrap();
        stop.store(true, Ordering::SeqCst);
    });
    // (Read while the recorder is installed: the next test's resets them.)
    let r = rec.record();
    let first = OOM_FIRST_NS.load(Ordering::SeqCst);
    let t = OomTouch {
        sigbus: r.count,
        late: OOM_LATE.load(Ordering::SeqCst),
        errno: r.errno,
        first_ms: first.saturating_sub(OOM_T0_NS.load(Ordering::SeqCst)) as f64 / 1e6,
        other_call_max_ms: other_max_ns.load(Ordering::SeqCst) as f64 / 1e6,
    };
    OOM_FREE.store(0, Ordering::SeqCst);
    *OOM_SPACE.lock().unwrap() = None;
    drop(rec);
    eprintln!("{t:?}; stats {:?}", s.stats());
    t
}

/// The bound on a failed fault's SIGBUS and on another thread's call
/// meanwhile (issue 45: 100 ms; 5.1 s, 1.4-2.0 s and 4.8-4.9 s were
/// seen). Generous against the milliseconds it takes: a loaded 2-vCPU
/// machine can hold a thread off its CPU for tens of them.
const OOM_BOUND_MS: f64 = 100.0;

fn assert_one_sigbus_soon(t: &OomTouch, s: &Space) {
    assert_eq!(t.late, 0, "a SIGBUS came after its access: {t:?}");
    assert_eq!(t.sigbus, 1, "one failed fault, one SIGBUS: {t:?}");
    assert_eq!(t.errno, libc::ENOMEM, "si_errno says no frame: {t:?}");
    assert_eq!(s.stats().oom_sigbus, 1, "{t:?}");
    assert!(t.first_ms < OOM_BOUND_MS, "the SIGBUS took {:.1} ms", t.first_ms);
    assert!(t.other_call_max_ms < OOM_BOUND_MS, "another thread's mmap waited {:.1} ms", t.other_call_max_ms);
}

fn map_rw(s: &Space, pages: usize) -> usize {
    s.mmap(0, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).expect("mmap")
}

/// The budget full of locked pages: the fault is out of memory at once
/// (it waited 50 rounds of 5 ms, 0.25 s, for nothing; pinned pages that
/// are not counted locked made it 5 s).
#[test]
fn out_of_memory_with_the_budget_locked_is_one_sigbus_within_100ms() {
    let s = Arc::new(space(64 * PAGE, 1 << 20));
    let l = map_rw(&s, 64);
    s.mlock(l, 64 * PAGE).expect("mlock");
    let b = map_rw(&s, 16);
    let t = touch_out_of_memory(&s, b, l, PAGE, |_| {});
    assert_one_sigbus_soon(&t, &s);
}

/// Swap full (`swap_bytes` used up) and the budget full of pages that
/// could only go there.
#[test]
fn out_of_memory_with_swap_full_is_one_sigbus_within_100ms() {
    let s = Arc::new(space(64 * PAGE, 64 * PAGE));
    let a = map_rw(&s, 128);
    for p in 0..128 {
        poke(a + p * PAGE, 1);
    }
    assert_eq!(s.stats().swapped_pages, 64, "swap not full");
    let b = map_rw(&s, 16);
    let t = touch_out_of_memory(&s, b, a, 128 * PAGE, |_| {});
    assert_one_sigbus_soon(&t, &s);
}

/// The page store down (a Redis server killed): every write fails, so
/// nothing can be evicted; the fault is out of memory after the store's
/// first few tries (it retried the write for 5 s, 32,000 times).
#[test]
fn out_of_memory_with_the_store_down_is_one_sigbus_within_100ms() {
    let mut srv = redis_server::Server::start(&[]);
    let cfg = Config {
        budget_bytes: 64 * PAGE,
        swap_bytes: 1 << 20,
        swap_url: Some(srv.url("usermm-oom-test:")),
        ..Config::default()
    };
    let s = Arc::new(common::open(&cfg));
    let a = map_rw(&s, 128);
    for p in 0..128 {
        poke(a + p * PAGE, 1);
    }
    assert!(s.stats().swapped_pages > 0, "nothing went to the server");
    srv.kill();
    // Until a write has failed (one sent just as the server died may be
    // taken for done).
    let t0 = Instant::now();
    while s.stats().swap_write_fails == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no write failed with the server killed");
        s.madvise(a, 128 * PAGE, MADV_PAGEOUT).expect("MADV_PAGEOUT");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The frames reclaim freed ahead before the server died, used up
    // (none comes back: nothing can be evicted).
    let b = map_rw(&s, 64);
    let mut next = b;
    loop {
        while s.stats().resident_pages < s.stats().budget_pages {
            poke(next, 1);
            // (Every other page: no fault-around window, which a stream
            // of faults grows, reaches the page touched below.)
            next += 2 * PAGE;
        }
        // (An eviction in flight when the server died may still free one.)
        std::thread::sleep(Duration::from_millis(50));
        if s.stats().resident_pages == s.stats().budget_pages {
            break;
        }
    }
    let t = touch_out_of_memory(&s, b + 63 * PAGE, a, 128 * PAGE, |_| {});
    assert_one_sigbus_soon(&t, &s);
    assert!(s.stats().swap_write_fails > 0, "the store was never tried");
}

/// Item 1: the faulting thread leaves its fault and faults again while a
/// handler decides its SIGBUS (any signal does that: here a no-op SIGUSR2
/// 50 ms into a 200 ms stall of the deciding handler), so a second handler
/// reads a second message for the same access. It gets one SIGBUS, not
/// one per message (the second came after the thread had recovered from
/// the first: in its next `umm_mmap`, or once its handler returned).
#[test]
fn a_thread_that_faults_twice_for_one_access_gets_one_sigbus() {
    let cfg = Config { budget_bytes: 64 * PAGE, swap_bytes: 1 << 20, fault_threads: 2, ..Config::default() };
    let s = Arc::new(common::open(&cfg));
    let l = map_rw(&s, 64);
    s.mlock(l, 64 * PAGE).expect("mlock");
    let b = map_rw(&s, 16);
    s.inject_signal_stall(200);
    let t = touch_out_of_memory(&s, b, l, PAGE, |tid| {
        usermm_sys::testing::nudge_thread(tid).expect("nudge");
    });
    s.inject_signal_stall(0);
    assert_eq!(t.late, 0, "a SIGBUS came after its access: {t:?}");
    assert_eq!(t.sigbus, 1, "one failed fault, one SIGBUS: {t:?}");
    assert_eq!(t.errno, libc::ENOMEM, "si_errno says no frame: {t:?}");
    assert_eq!(s.stats().oom_sigbus, 1, "{t:?}");
}

/// A 16 MiB tmpfs mounted for a test, unmounted on drop.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(name: &str) -> SmallFs {
        let dir = std::env::temp_dir().join(format!("usermm-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"]).arg(&dir).status();
        assert!(st.is_ok_and(|s| s.success()), "mount -t tmpfs (this test needs root)");
        SmallFs(dir)
    }

    /// Fills the file system up with one file (`filler`).
    fn fill_up(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Item 3: swap on a file system that is full. Every write fails: the
/// store is backed off from (a few tries a second, where it was retried
/// some 35,000 times a second), the pages stay resident with their data,
/// `umm_stats` says so (`swap_backoff_ms`, `swap_write_fails`), and a fault
/// short of frames meanwhile gets SIGBUS (and retries). Once the file
/// system has room, the pages go out again and reclaim resumes: the
/// faulting thread gets its frames, every byte reads back.
#[test]
fn a_full_swap_file_system_is_backed_off_until_it_has_room() {
    let fs = SmallFs::mount("fullswap");
    fs.fill_up();
    let mut cfg = common::with_test_store(Config {
        budget_bytes: 4 << 20, // 1,024 pages
        swap_bytes: 64 << 20,
        swap_dir: Some(fs.0.clone()),
        ..Config::default()
    });
    cfg.swap_url = None; // the file system is the point
    let s = Space::open(&cfg).expect("open");
    let mut a = s.map_anon(4 << 20).expect("mmap a");
    fill(&mut a, 3, 1);
    let mut b = s.map_anon(1 << 20).expect("mmap b");
    let (lo, len) = s.reservation();
    // (A millisecond's nap in the handler before the retry: a writer that
    // retries at once takes a CPU from the tests running beside it.)
    let rec = SigbusRecorder::install_with(lo, lo + len, |_| std::thread::sleep(Duration::from_millis(1)))
        .expect("install SIGBUS recorder");
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let b = &mut b;
        let done = &done;
        sc.spawn(move || {
            // Needs frames: evictions, which cannot be written until the
            // file system has room (SIGBUS meanwhile; the handler returns
            // and the touch is retried).
            fill(b, 4, 1);
            done.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(500));
        let before = s.stats();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        let after = s.stats();
        let secs = t0.elapsed().as_secs_f64();
        let sigbus = rec.record().count;
        let finished_full = done.load(Ordering::SeqCst);
        // Room again: reclaim resumes and the writer finishes (before any
        // assertion: the writer cannot finish otherwise).
        std::fs::remove_file(fs.0.join("filler")).unwrap();
        let t1 = Instant::now();
        while !done.load(Ordering::SeqCst) && t1.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let resumed = done.load(Ordering::SeqCst);
        eprintln!("resumed {resumed} after {:?}", t1.elapsed());
        let rate = (after.swap_write_fails - before.swap_write_fails) as f64 / secs;
        eprintln!("full: {rate:.1} failed writes a second; {sigbus} SIGBUS; stats {after:?}");
        assert!(resumed, "reclaim did not resume once the file system had room");
        assert!(!finished_full, "the writer got its frames with the file system full");
        assert!(after.swap_write_fails > 0, "no write was tried");
        assert!(rate <= 200.0, "{rate:.1} failed writes a second: no back-off");
        assert!(after.swap_backoff_ms > 0, "umm_stats does not say the store is backed off from");
        assert_eq!(after.swapouts, 0);
        assert_eq!(after.resident_pages, after.budget_pages, "pages left memory without being written");
        assert!(sigbus > 0 && after.oom_sigbus > 0, "the writer got no SIGBUS while memory was full");
    });
    drop(rec);
    let st = s.stats();
    eprintln!("after: {st:?}");
    assert!(st.swapouts > 0, "nothing went out once there was room");
    assert_eq!(st.swap_backoff_ms, 0, "still backing off from a store that takes writes");
    assert_eq!(bad_in(&a, 3, 1), 0, "region a");
    assert_eq!(bad_in(&b, 4, 1), 0, "region b");
    drop(a);
    drop(b);
    s.validate();
}
