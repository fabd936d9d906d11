//! Seed 003 with real threads: while thread A unmaps a populated 512 MiB
//! region (detach under the exclusive lock, then zap chunk by chunk under the
//! shared lock), thread B keeps working:
//! (a) B's faults in its own region keep being served;
//! (b) B's mmap/munmap calls keep completing, the exclusive lock is never
//!     held for long, and A's range is not handed out again before A's
//!     munmap returns (then it is);
//! (c) after the unmap, `mincore` on A's range fails with `ENOMEM`.
//!
//! Only "progress was made" is asserted about timing (plus a generous bound
//! on the exclusive-lock hold that only catches a lock held across the whole
//! zap); the latencies are printed. The 1 ms goal is the benchmark's.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use usermm::consts::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::{Config, Errno, Space};

const PAGE: usize = 4096;
const A_BYTES: usize = 512 << 20;
const B_BYTES: usize = 32 << 20;

/// The two tests each populate 512 MiB: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn open() -> Space {
    // Everything fits in the budget: no swap, A's pages are all resident.
    common::open_mode(&Config { budget_bytes: A_BYTES + 2 * B_BYTES, swap_bytes: 0, ..Config::default() })
        .expect("open")
}

fn unmapped_range_is_enomem(s: &Space, a: usize) {
    let mut v = vec![0u8; A_BYTES / PAGE];
    assert_eq!(s.mincore(a, A_BYTES, &mut v), Err(Errno::ENOMEM), "mincore on the unmapped range");
    assert_eq!(s.mincore(a + A_BYTES / 2, PAGE, &mut v[..1]), Err(Errno::ENOMEM), "mincore inside it");
}

#[test]
fn faults_are_served_during_a_large_unmap() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = open();
    let mut a_map = s.map_anon(A_BYTES).expect("mmap A");
    let t0 = Instant::now();
    for off in (0..A_BYTES).step_by(PAGE) {
        a_map[off] = 1;
    }
    let populate = t0.elapsed();
    let a = a_map.addr();
    assert_eq!(s.stats().resident_pages as usize, A_BYTES / PAGE, "A not fully resident");
    let mut b_map = s.map_anon(B_BYTES).expect("mmap B");
    let b_pages = B_BYTES / PAGE;

    let barrier = Barrier::new(2);
    let a_running = AtomicBool::new(false);
    let a_done = AtomicBool::new(false);
    let (mut unmap_time, mut b_total, mut b_during, mut b_worst, mut b_worst_during) =
        (Duration::ZERO, 0u64, 0u64, Duration::ZERO, Duration::ZERO);
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| {
            barrier.wait();
            // Let B get going first.
            std::thread::sleep(Duration::from_millis(20));
            a_running.store(true, Ordering::SeqCst);
            let t = Instant::now();
            a_map.unmap().expect("munmap A");
            let d = t.elapsed();
            a_done.store(true, Ordering::SeqCst);
            d
        });
        let tb = sc.spawn(|| {
            // B faults its pages in a scattered order (no fault-around run),
            // starting over (after MADV_DONTNEED) when it has touched them all.
            let (mut total, mut during, mut worst, mut worst_during) = (0u64, 0u64, Duration::ZERO, Duration::ZERO);
            let mut i = 0usize;
            barrier.wait();
            while !a_done.load(Ordering::SeqCst) {
                let p = (i * 7919) % b_pages;
                i += 1;
                if i.is_multiple_of(b_pages) {
                    b_map.advise(usermm::consts::MADV_DONTNEED).expect("MADV_DONTNEED");
                }
                let running = a_running.load(Ordering::SeqCst);
                let t = Instant::now();
                b_map[p * PAGE] = b_map[p * PAGE].wrapping_add(1);
                let d = t.elapsed();
                worst = worst.max(d);
                total += 1;
                if running && !a_done.load(Ordering::SeqCst) {
                    during += 1;
                    worst_during = worst_during.max(d);
                }
            }
            (total, during, worst, worst_during)
        });
        unmap_time = ta.join().unwrap();
        (b_total, b_during, b_worst, b_worst_during) = tb.join().unwrap();
    });
    let st = s.stats();
    eprintln!(
        "munmap of {} MiB populated (populate {:?}): took {:?}; B touched {} pages ({} while A's munmap ran), worst \
         touch {:?} (during the unmap {:?}); write-lock hold max {} us",
        A_BYTES >> 20,
        populate,
        unmap_time,
        b_total,
        b_during,
        b_worst,
        b_worst_during,
        st.write_lock_hold_ns_max / 1000
    );
    assert!(b_during > 0, "B made no progress while A's munmap ran ({unmap_time:?})");
    unmapped_range_is_enomem(&s, a);
    drop(b_map);
    s.validate();
}

/// Fails in most runs: B's mmap (or munmap) waits for the whole of A's
/// munmap (~60 ms for 512 MiB) although the exclusive-lock hold stays in the
/// tens of microseconds. `Inner::munmap` drops and re-takes the shared `mm`
/// lock per chunk so that writers get in between, but std's `RwLock` does not
/// hand the lock to the waiting writer: the read-unlock clears the
/// writers-waiting bit and wakes the writer, and A (still on CPU) re-takes
/// the read lock before the writer runs, chunk after chunk.
#[test]
fn mmap_munmap_proceed_and_range_is_held_during_a_large_unmap() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = open();
    let mut a_map = s.map_anon(A_BYTES).expect("mmap A");
    for off in (0..A_BYTES).step_by(PAGE) {
        a_map[off] = 1;
    }
    let a = a_map.addr();
    let a_end = a + A_BYTES;

    let barrier = Barrier::new(2);
    let a_done = AtomicBool::new(false);
    // Nanoseconds since `base` at which A's munmap was called and returned.
    let base = Instant::now();
    let ns = || base.elapsed().as_nanos() as u64;
    let a_start_ns = AtomicU64::new(u64::MAX);
    let a_end_ns = AtomicU64::new(u64::MAX);
    let mut pairs: Vec<(u64, u64, u64, usize)> = Vec::new();
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| {
            barrier.wait();
            std::thread::sleep(Duration::from_millis(20));
            a_start_ns.store(ns(), Ordering::SeqCst);
            a_map.unmap().expect("munmap A");
            a_end_ns.store(ns(), Ordering::SeqCst);
            a_done.store(true, Ordering::SeqCst);
        });
        let tb = sc.spawn(|| {
            // B maps (with A's start as a hint: a free hinted range is taken
            // as is) and unmaps a small region in a loop, recording for each
            // pair when it started, when the mmap returned, and the address.
            let mut v = Vec::new();
            barrier.wait();
            let mut after = 0;
            while after < 20 {
                let done_before = a_done.load(Ordering::SeqCst);
                let t0 = ns();
                let r =
                    s.mmap(a, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).expect("mmap B");
                let t1 = ns();
                s.munmap(r, 16 * PAGE).expect("munmap B");
                let t2 = ns();
                v.push((t0, t1, t2, r));
                if done_before {
                    after += 1;
                }
            }
            v
        });
        ta.join().unwrap();
        pairs = tb.join().unwrap();
    });
    let (a0, a1) = (a_start_ns.load(Ordering::SeqCst), a_end_ns.load(Ordering::SeqCst));
    let unmap_time = Duration::from_nanos(a1 - a0);
    let st = s.stats();
    // Pairs that overlapped A's munmap, and those that ran entirely inside it.
    let worst_during = pairs.iter().filter(|p| p.0 < a1 && p.2 > a0).map(|p| p.2 - p.0).max().unwrap_or(0);
    let during = pairs.iter().filter(|p| p.0 >= a0 && p.2 <= a1).count();
    let worst_mmap = pairs.iter().filter(|p| p.0 < a1 && p.1 > a0).map(|p| p.1 - p.0).max().unwrap_or(0);
    let worst_munmap = pairs.iter().filter(|p| p.1 < a1 && p.2 > a0).map(|p| p.2 - p.1).max().unwrap_or(0);
    // B's mappings inside A's range, with the time their mmap returned.
    let inside: Vec<(usize, u64)> =
        pairs.iter().filter(|p| p.3 < a_end && p.3 + 16 * PAGE > a).map(|p| (p.3, p.1)).collect();
    // One that returned clearly before A's munmap did (1 ms of slack for the
    // moment between the range's release and the munmap call returning) is
    // a reuse of a range still being zapped.
    let early: Vec<_> = inside.iter().filter(|&&(_, t)| t + 1_000_000 < a1).collect();
    eprintln!(
        "munmap of {} MiB populated took {:?}; B did {} mmap+munmap pairs, {during} entirely while A's munmap ran, \
         worst pair overlapping it {:?} (mmap {:?}, munmap {:?}); write-lock hold max {} us; B mappings inside A's range: {} (first at {:?} ns \
         after start, A's munmap ran {a0}..{a1} ns); early reuses: {}",
        A_BYTES >> 20,
        unmap_time,
        pairs.len(),
        Duration::from_nanos(worst_during),
        Duration::from_nanos(worst_mmap),
        Duration::from_nanos(worst_munmap),
        st.write_lock_hold_ns_max / 1000,
        inside.len(),
        inside.first().map(|x| x.1),
        early.len()
    );
    assert!(during > 0, "B's mmap/munmap made no progress while A's munmap ran ({unmap_time:?})");
    assert!(early.is_empty(), "A's range was handed out while its munmap ran: {early:x?}");
    // Positive control: once A's munmap has returned, the hinted range is free
    // and B gets exactly A's start.
    assert!(inside.iter().any(|&(r, t)| r == a && t >= a1), "A's range was never reused after its munmap");
    assert!(
        st.write_lock_hold_ns_max < 50_000_000,
        "exclusive lock held {} us (across the zap?)",
        st.write_lock_hold_ns_max / 1000
    );
    unmapped_range_is_enomem(&s, a);
    s.validate();
}
