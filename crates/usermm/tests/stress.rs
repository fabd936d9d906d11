//! The stress test: several threads write and verify checksummed pages in a
//! space whose budget is a quarter of their working set, while they also
//! unmap and re-map their regions, drop pages (`MADV_DONTNEED`: zeros
//! expected after) and push pages out (`MADV_PAGEOUT`).
//!
//! Duration: `USERMM_STRESS_SECS` (default 60, what CI runs); two more runs
//! swap to a Redis server and to a Redis Cluster that loses a master
//! (`USERMM_STRESS_REDIS_SECS` each, default 20). A watchdog
//! aborts the process if no operation completes for 30 s (a hang).
//!
//! Checked: no corrupted byte (wrong, stale or zeroed data), `validate()`
//! during the run (every 100 ms, with evictions in flight) and after it, the
//! resident maximum never above the budget (measured overshoot: 0 pages,
//! since frames are claimed under the core lock before a fill), no OOM
//! SIGBUS, and that swapping really happened.

mod common;
mod pattern;
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pattern::{bad_bytes, fill_page, Rng};
use usermm::consts::{MADV_DONTNEED, MADV_PAGEOUT};
use usermm::{Config, Mapping, Space};

const THREADS: usize = 4;
const REGIONS_PER_THREAD: usize = 8;
const REGION_BYTES: usize = 8 << 20;
const WORKING_SET: usize = THREADS * REGIONS_PER_THREAD * REGION_BYTES; // 256 MiB
const BUDGET: usize = WORKING_SET / 4; // 64 MiB
const SWAP: usize = 512 << 20;
const PAGE: usize = 4096;
const PAGES: usize = REGION_BYTES / PAGE;
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// How long a killed master's replica may take to take over (measured on
/// this 2-vCPU machine under the test's load: see the test's output).
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Totals {
    ops: AtomicU64,
    bytes_written: AtomicU64,
    bytes_verified: AtomicU64,
    corrupted: AtomicU64,
    remaps: AtomicU64,
    dontneeds: AtomicU64,
    pageouts: AtomicU64,
}

struct Region<'a> {
    map: Option<Mapping<'a>>,
    /// Version of each page's contents; 0: must read as zeros.
    versions: Vec<u64>,
}

fn page_id(thread: usize, region: usize, page: usize) -> u64 {
    ((thread as u64) << 48) | ((region as u64) << 32) | page as u64
}

fn verify_run(r: &Region<'_>, thread: usize, ri: usize, first: usize, n: usize, t: &Totals) {
    let m = r.map.as_ref().expect("mapped");
    let mut bad = 0;
    for p in first..first + n {
        let b = bad_bytes(&m[p * PAGE..(p + 1) * PAGE], page_id(thread, ri, p), r.versions[p]);
        if b != 0 {
            eprintln!(
                "CORRUPTION: thread {thread} region {ri} page {p} (addr {:#x}) version {}: {b} bad bytes",
                m.addr() + p * PAGE,
                r.versions[p]
            );
        }
        bad += b;
    }
    t.corrupted.fetch_add(bad as u64, Ordering::Relaxed);
    t.bytes_verified.fetch_add((n * PAGE) as u64, Ordering::Relaxed);
}

fn write_run(r: &mut Region<'_>, thread: usize, ri: usize, first: usize, n: usize, ver: &mut u64, t: &Totals) {
    let m = r.map.as_mut().expect("mapped");
    for p in first..first + n {
        *ver += 1;
        fill_page(&mut m[p * PAGE..(p + 1) * PAGE], page_id(thread, ri, p), *ver);
        r.versions[p] = *ver;
    }
    t.bytes_written.fetch_add((n * PAGE) as u64, Ordering::Relaxed);
}

fn worker(space: &Space, thread: usize, stop: &AtomicBool, t: &Totals) {
    let mut rng = Rng::new(0x5eed_0000 + thread as u64);
    let mut ver = 0u64;
    let mut regions: Vec<Region<'_>> = (0..REGIONS_PER_THREAD)
        .map(|_| Region { map: Some(space.map_anon(REGION_BYTES).expect("mmap")), versions: vec![0; PAGES] })
        .collect();
    // Write the whole working set once, so that pressure starts at once.
    for (ri, region) in regions.iter_mut().enumerate() {
        write_run(region, thread, ri, 0, PAGES, &mut ver, t);
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
    while !stop.load(Ordering::Relaxed) {
        let ri = rng.index(REGIONS_PER_THREAD);
        let r = &mut regions[ri];
        let op = rng.index(100);
        match op {
            0..=39 => {
                let n = 1 + rng.index(64);
                let first = rng.index(PAGES - n + 1);
                write_run(r, thread, ri, first, n, &mut ver, t);
            }
            40..=79 => {
                let n = 1 + rng.index(256);
                let first = rng.index(PAGES - n + 1);
                verify_run(r, thread, ri, first, n, t);
            }
            80..=87 => {
                // MADV_DONTNEED: the run must read as zeros, then is rewritten.
                let n = 1 + rng.index(512);
                let first = rng.index(PAGES - n + 1);
                r.map.as_mut().unwrap().advise_range(first * PAGE, n * PAGE, MADV_DONTNEED).expect("MADV_DONTNEED");
                r.versions[first..first + n].fill(0);
                verify_run(r, thread, ri, first, n, t);
                let k = n.min(1 + rng.index(64));
                write_run(r, thread, ri, first, k, &mut ver, t);
                t.dontneeds.fetch_add(1, Ordering::Relaxed);
            }
            88..=95 => {
                let n = 1 + rng.index(512);
                let first = rng.index(PAGES - n + 1);
                let addr = r.map.as_ref().unwrap().addr() + first * PAGE;
                space.madvise(addr, n * PAGE, MADV_PAGEOUT).expect("MADV_PAGEOUT");
                t.pageouts.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                // munmap + mmap: the new region reads as zeros.
                r.map.take().unwrap().unmap().expect("munmap");
                r.map = Some(space.map_anon(REGION_BYTES).expect("mmap"));
                r.versions.fill(0);
                let n = 1 + rng.index(64);
                let first = rng.index(PAGES - n + 1);
                verify_run(r, thread, ri, first, n, t);
                write_run(r, thread, ri, first, n, &mut ver, t);
                t.remaps.fetch_add(1, Ordering::Relaxed);
            }
        }
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
    // Final check of everything this thread wrote.
    for (ri, r) in regions.iter().enumerate() {
        verify_run(r, thread, ri, 0, PAGES, t);
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
    for r in regions {
        r.map.unwrap().unmap().expect("final munmap");
    }
}

/// Sets the stop and finished flags when dropped, so that a panic in the
/// main thread (a failed assertion or `validate()`) ends the workers and the
/// watchdog instead of hanging the scope.
struct StopOnDrop<'a>(&'a AtomicBool, &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
        self.1.store(true, Ordering::SeqCst);
    }
}

/// Runs the workers for `secs`, calling `validate()` every `validate_every`
/// meanwhile (if given), then checks and prints the results.
/// `write_errors_allowed`: swap writes may fail (a store losing a node:
/// the pages stay resident); reads never may.
fn run(secs: u64, validate_every: Option<Duration>, swap_url: Option<String>, write_errors_allowed: bool) {
    // No SIGBUS is expected: one ends the binary, saying where and which.
    usermm_sys::testing::sigbus_said_and_fatal().expect("SIGBUS disposition");
    let space = common::open_mode(&Config { budget_bytes: BUDGET, swap_bytes: SWAP, swap_url, ..Config::default() })
        .expect("open");
    let budget_pages = space.stats().budget_pages;
    assert_eq!(budget_pages, (BUDGET / PAGE) as u64);
    let totals = Totals::default();
    let stop = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let started = Instant::now();
    let mut validations = 0u64;

    std::thread::scope(|s| {
        // Watchdog: no completed operation for STALL_LIMIT is a hang.
        s.spawn(|| {
            let mut last = u64::MAX;
            let mut since = Instant::now();
            while !finished.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(250));
                let now = totals.ops.load(Ordering::Relaxed);
                if now != last {
                    last = now;
                    since = Instant::now();
                } else if since.elapsed() >= STALL_LIMIT {
                    eprintln!(
                        "WATCHDOG: usermm stress test made no progress for {:?} ({} ops done, {:?} into the run); \
                         a fault or call hangs. Stats: {:?}",
                        STALL_LIMIT,
                        now,
                        started.elapsed(),
                        space.stats()
                    );
                    std::process::abort();
                }
            }
        });
        let _guard = StopOnDrop(&stop, &finished);
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let (space, stop, totals) = (&space, &stop, &totals);
                s.spawn(move || worker(space, i, stop, totals))
            })
            .collect();
        let deadline = started + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(validate_every.unwrap_or(Duration::from_millis(200)).min(left));
            if validate_every.is_some() {
                // The core's invariants must hold at any moment (under its lock).
                space.validate();
                validations += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().expect("worker panicked");
        }
        finished.store(true, Ordering::SeqCst);
    });

    let elapsed = started.elapsed();
    space.validate();
    let st = space.stats();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "stress: {:.1} s, {THREADS} threads, working set {} MiB, budget {} MiB; {} ops ({} remaps, {} DONTNEED, \
         {} PAGEOUT); written {:.0} MiB, verified {:.0} MiB; swapouts {}, swapins {}, faults {}, minor {}, \
         write errors {}, read errors {}; resident max {} / budget {} pages (overshoot {}); write-lock hold max \
         {} us; {validations} mid-run validations; corrupted bytes {}",
        elapsed.as_secs_f64(),
        WORKING_SET >> 20,
        BUDGET >> 20,
        totals.ops.load(Ordering::Relaxed),
        totals.remaps.load(Ordering::Relaxed),
        totals.dontneeds.load(Ordering::Relaxed),
        totals.pageouts.load(Ordering::Relaxed),
        mib(totals.bytes_written.load(Ordering::Relaxed)),
        mib(totals.bytes_verified.load(Ordering::Relaxed)),
        st.swapouts,
        st.swapins,
        st.faults,
        st.minor_faults,
        st.swap_write_errors,
        st.swap_read_errors,
        st.resident_pages_max,
        st.budget_pages,
        st.resident_pages_max.saturating_sub(st.budget_pages),
        st.write_lock_hold_ns_max / 1000,
        totals.corrupted.load(Ordering::Relaxed),
    );
    assert_eq!(totals.corrupted.load(Ordering::Relaxed), 0, "corrupted bytes");
    assert!(
        st.resident_pages_max <= st.budget_pages,
        "resident max {} > budget {}",
        st.resident_pages_max,
        st.budget_pages
    );
    assert_eq!(st.oom_sigbus, 0, "OOM SIGBUS raised");
    assert_eq!(st.swap_read_errors, 0, "unexpected swap read errors");
    if !write_errors_allowed {
        assert_eq!(st.swap_write_errors, 0, "unexpected swap write errors");
    }
    assert!(st.swapouts > 0 && st.swapins > 0, "no pressure: swapouts {} swapins {}", st.swapouts, st.swapins);
    // Everything was unmapped: nothing may be left resident or in swap.
    assert_eq!(st.regions, 0);
    assert_eq!(st.resident_pages, 0, "resident pages leaked");
    assert_eq!(st.swapped_pages, 0, "swap slots leaked");
}

#[test]
fn stress_threads_under_quarter_budget() {
    let secs: u64 = std::env::var("USERMM_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    run(secs, Some(Duration::from_millis(100)), None, false);
}

/// The same with the space's swap on a Redis server (`swap_url`), for
/// `USERMM_STRESS_REDIS_SECS` (default 20).
#[test]
fn stress_threads_under_quarter_budget_swapping_to_redis() {
    let secs: u64 = std::env::var("USERMM_STRESS_REDIS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let srv = redis_server::Server::start(&[]);
    run(secs, Some(Duration::from_millis(100)), Some(srv.url("stress:")), false);
    assert!(srv.keys("stress:*").is_empty(), "the space's keys outlived it");
}

/// The same against a 3-master cluster with a replica each and
/// `replicas=1`, for `USERMM_STRESS_REDIS_SECS` (default 20): a master is
/// killed a quarter of the way in and restarted (it rejoins as a replica)
/// once its replica has taken over, 6 s after the kill at the earliest.
/// Writes to its slots fail until its replica takes over (pages stay
/// resident); reads wait the failover out (`failover_ms`, as long as the
/// test waits for it); no read fails and no byte is lost.
#[test]
fn stress_threads_under_quarter_budget_swapping_to_a_cluster_losing_a_master() {
    let secs: u64 = std::env::var("USERMM_STRESS_REDIS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut cl = redis_server::Cluster::start(3, 1);
    let url = format!("{}&failover_ms={}", cl.url("stresscl:", 1), FAILOVER_LIMIT.as_millis());
    std::thread::scope(|sc| {
        let cl = &mut cl;
        sc.spawn(move || {
            std::thread::sleep(Duration::from_secs(secs / 4));
            let victim = cl.masters()[0];
            eprintln!("stress: killing the master on port {}", cl.nodes[victim].port);
            let took = cl.fail_over(victim, FAILOVER_LIMIT);
            eprintln!("stress: its replica took over after {took:?}");
            std::thread::sleep(Duration::from_secs(6).saturating_sub(took));
            eprintln!("stress: restarting port {}", cl.nodes[victim].port);
            cl.nodes[victim].restart();
        });
        run(secs, Some(Duration::from_millis(100)), Some(url), true);
    });
    assert_eq!(cl.total_keys(), 0, "the space's keys outlived it");
}
