//! A whole test binary on a space: `#[global_allocator]` is a
//! [`GlobalHeap`], so the test harness, its threads, every `Vec`, `String`
//! and `HashMap` below (and usermm's own calls, which it routes to the
//! system allocator) run with the heap in a space of a 32 MiB budget.
//!
//! Checked: allocations land in the space's reservation; a working set 4×
//! the budget keeps every byte; zeroed allocations read zeros on reused
//! memory; threads allocate at once; a child process can be spawned; a
//! child whose heap swaps to a Redis server leaves no key there once it has
//! exited (it never closes its space).

mod redis_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use usermm::{Config, GlobalHeap};

/// Set in the child of [`a_heap_swapping_to_redis_leaves_no_key_after_exit`]:
/// its heap's page store.
const SWAP_URL_ENV: &str = "USERMM_GLOBAL_HEAP_TEST_SWAP_URL";

#[global_allocator]
static HEAP: GlobalHeap = GlobalHeap::new(|| Config {
    budget_bytes: 32 << 20,
    swap_bytes: 1 << 30,
    swap_url: std::env::var(SWAP_URL_ENV).ok(),
    ..Config::default()
});

fn in_space(p: *const u8) -> bool {
    let (base, len) = HEAP.with_space(|sp| sp.reservation()).expect("the global heap's space is open");
    (p as usize).wrapping_sub(base) < len
}

#[test]
fn allocations_live_in_the_space() {
    let small = Box::new(7u32);
    let s = String::from("a string in a space");
    let big = vec![1u8; 4 << 20];
    assert!(in_space(&*small as *const u32 as *const u8));
    assert!(in_space(s.as_ptr()));
    assert!(in_space(big.as_ptr()));
    let hs = HEAP.heap_stats().unwrap();
    assert!(hs.live_allocations >= 3 && hs.large_regions >= 1, "{hs:?}");
}

#[test]
fn a_working_set_larger_than_the_budget_keeps_every_byte() {
    // 128 MiB of values (4× the budget) in a std HashMap.
    let mut m: HashMap<u64, Vec<u64>> = HashMap::new();
    for k in 0..32_768u64 {
        m.insert(k, (0..512).map(|i| k * 1000 + i).collect());
    }
    let mut bad = 0u64;
    for k in (0..32_768u64).rev() {
        let v = &m[&k];
        bad += v.iter().enumerate().filter(|&(i, &w)| w != k * 1000 + i as u64).count() as u64;
    }
    assert_eq!(bad, 0);
    let st = HEAP.stats().unwrap();
    assert!(st.swapouts > 0 && st.swapins > 0, "{st:?}");
    assert!(st.resident_pages_max <= st.budget_pages, "{st:?}");
}

#[test]
fn zeroed_allocations_read_zeros_on_reused_memory() {
    for n in [100usize, 5_000, 100_000, 1 << 20] {
        for _ in 0..8 {
            let dirty = vec![0xa5u8; n];
            drop(dirty);
            let z = vec![0u8; n]; // alloc_zeroed
            assert!(z.iter().all(|&b| b == 0), "{n}");
        }
    }
}

#[test]
fn threads_allocate_at_once() {
    let wrong = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let wrong = &wrong;
            s.spawn(move || {
                let mut keep: Vec<Vec<u64>> = Vec::new();
                for i in 0..20_000u64 {
                    let n = ((i * 7919 + t) % 700) as usize;
                    let v: Vec<u64> = (0..n as u64).map(|j| j ^ (t << 40) ^ i).collect();
                    if keep.len() < 256 {
                        keep.push(v);
                    } else {
                        let j = (i % 256) as usize;
                        let old = std::mem::replace(&mut keep[j], v);
                        let bad = old.iter().enumerate().filter(|&(x, &w)| (w ^ x as u64) >> 40 != t).count();
                        wrong.fetch_add(bad as u64, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(wrong.load(Ordering::Relaxed), 0);
}

#[test]
fn a_child_process_can_be_spawned() {
    let out = std::process::Command::new("echo").arg("spawned").output().expect("spawn echo");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "spawned");
}

/// The child side of [`a_heap_swapping_to_redis_leaves_no_key_after_exit`]
/// (nothing unless `USERMM_GLOBAL_HEAP_TEST_SWAP_URL` is set): 64 MiB of
/// values, twice the budget, so that most of the heap is on the server;
/// then the harness exits (`exit(3)`) with the space open, as every
/// program on a `GlobalHeap` does.
#[test]
#[ignore = "child-process entry point"]
fn child_swaps_its_heap_to_redis() {
    if std::env::var(SWAP_URL_ENV).is_err() {
        return;
    }
    let v: Vec<Vec<u64>> = (0..16_384u64).map(|k| (0..512).map(|i| k ^ i).collect()).collect();
    let bad: usize = v
        .iter()
        .enumerate()
        .map(|(k, w)| w.iter().enumerate().filter(|&(i, &x)| x != k as u64 ^ i as u64).count())
        .sum();
    let st = HEAP.stats().expect("the heap's space");
    eprintln!("child: {bad} bad, {} pages swapped out", st.swapouts);
    assert!(bad == 0 && st.swapouts > 0, "{st:?}");
    std::mem::forget(v);
}

#[test]
fn a_heap_swapping_to_redis_leaves_no_key_after_exit() {
    let srv = redis_server::Server::start(&[]);
    let exe = std::env::current_exe().expect("current_exe");
    let out = std::process::Command::new(exe)
        .args(["--exact", "child_swaps_its_heap_to_redis", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SWAP_URL_ENV, format!("redis://127.0.0.1:{}/?timeout_ms=2000", srv.port))
        .output()
        .expect("spawn the child");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("child: 0 bad"), "the child: {}\n{err}", out.status);
    let t0 = Instant::now();
    while srv.dbsize() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = srv.keys("*");
    assert!(
        left.is_empty(),
        "{} keys left 10 s after the child exited, e.g. {:?}",
        left.len(),
        &left[..left.len().min(3)]
    );
}
