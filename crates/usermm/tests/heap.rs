//! The heap on a space ([`Space::heap`]) as an `allocator_api2` allocator:
//! collections in a space, under pressure, from several threads, and how it
//! gives memory back.
//!
//! Checked: no corrupted byte anywhere (every block carries a pattern of its
//! own, verified before it is freed and at the end), the space really
//! swapped (the working set is 4× the budget), `validate()` after the run,
//! large blocks are regions that free returns at once, medium frees are
//! lazily freed. (Zeroed allocations on reused memory: `global_heap.rs`
//! and the C test's `calloc`.)

mod common;
mod pattern;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allocator_api2::vec::Vec as AVec;
use common::space;
use pattern::Rng;
use usermm::heap::{FREE_RUN_BYTES, LARGE_BYTES, LARGE_MAX_BYTES};
use usermm::{Heap, Space};

/// The byte at offset `i` of block `k`.
fn pat(k: u64, i: usize) -> u8 {
    (k.wrapping_mul(0x9e37_79b9) as usize ^ i.wrapping_mul(31) ^ (i >> 12)) as u8
}

fn filled(heap: Heap<'_>, k: u64, len: usize) -> AVec<u8, Heap<'_>> {
    let mut v = AVec::with_capacity_in(len, heap);
    v.extend((0..len).map(|i| pat(k, i)));
    v
}

fn wrong(v: &[u8], k: u64) -> u64 {
    v.iter().enumerate().filter(|&(i, &b)| b != pat(k, i)).count() as u64
}

/// A block size: mostly small, some medium, one in 64 large.
fn block_size(rng: &mut Rng) -> usize {
    let r = rng.next_u64();
    match r % 64 {
        0 => LARGE_BYTES + (r >> 8) as usize % (1 << 20),
        1..=8 => FREE_RUN_BYTES + (r >> 8) as usize % (128 << 10),
        _ => 1 + (r >> 8) as usize % 4000,
    }
}

/// The stress test's pressure on the heap: 4 threads, each keeping up to
/// 16 MiB of blocks live (64 MiB in all, 4× the budget), allocating,
/// growing, shrinking and freeing at random; every byte verified.
#[test]
fn heap_under_pressure_keeps_every_byte() {
    let sp = space(16, 512);
    let secs: u64 = std::env::var("USERMM_HEAP_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let corrupted = AtomicU64::new(0);
    let ops = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(secs);
    // On a loaded machine the threads may not reach 4× the budget in
    // `secs`: they go on until the space has swapped both ways (up to 4×
    // as long), so that the run is the pressure it is meant to be.
    let hard_deadline = deadline + Duration::from_secs(4 * secs);
    let go_on = || {
        let now = Instant::now();
        now < deadline || (now < hard_deadline && { sp.stats() }.swapins == 0)
    };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (sp, corrupted, ops, go_on) = (&sp, &corrupted, &ops, &go_on);
            s.spawn(move || {
                let heap = sp.heap();
                let mut rng = Rng::new(0x1234_5678 + t);
                let mut live: Vec<(u64, AVec<u8, Heap<'_>>)> = Vec::new();
                let (mut bytes, mut next_k) = (0usize, t << 40);
                while go_on() {
                    let r = rng.next_u64();
                    if bytes > 16 << 20 || (r.is_multiple_of(3) && !live.is_empty()) {
                        let i = (r >> 8) as usize % live.len();
                        let (k, v) = live.swap_remove(i);
                        corrupted.fetch_add(wrong(&v, k), Ordering::Relaxed);
                        bytes -= v.len();
                    } else if r % 3 == 1 && !live.is_empty() {
                        // Resize in place or by moving: the prefix stays.
                        let i = (r >> 8) as usize % live.len();
                        let (k, v) = &mut live[i];
                        let n = block_size(&mut rng);
                        let keep = n.min(v.len());
                        bytes = bytes - v.len() + n;
                        if n < v.len() {
                            v.truncate(n);
                            v.shrink_to_fit();
                        } else {
                            v.reserve_exact(n - v.len());
                            let from = v.len();
                            v.extend((from..n).map(|j| pat(*k, j)));
                        }
                        corrupted.fetch_add(wrong(&v[..keep], *k), Ordering::Relaxed);
                    } else {
                        let n = block_size(&mut rng);
                        next_k += 1;
                        live.push((next_k, filled(heap, next_k, n)));
                        bytes += n;
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                for (k, v) in &live {
                    corrupted.fetch_add(wrong(v, *k), Ordering::Relaxed);
                }
            });
        }
    });
    sp.validate();
    let st = sp.stats();
    let hs = sp.heap().stats();
    eprintln!("{} ops; {st:?}\n{hs:?}", ops.load(Ordering::Relaxed));
    assert_eq!(corrupted.load(Ordering::Relaxed), 0, "corrupted bytes");
    assert!(st.swapouts > 0 && st.swapins > 0, "the heap never swapped: {st:?}");
    assert!(st.resident_pages_max <= st.budget_pages, "{st:?}");
    assert_eq!(hs.live_allocations, 0, "{hs:?}");
    assert_eq!(hs.large_regions, 0, "{hs:?}");
    assert!(hs.lazily_freed_bytes > 0, "{hs:?}");
}

/// A hashbrown `HashMap` 4× the budget, built and checked entry by entry.
#[test]
fn hashmap_larger_than_the_budget() {
    let sp = space(8, 256);
    let mut m = hashbrown::HashMap::new_in(sp.heap());
    let n = 32_000u64; // 32 MiB of values
    for k in 0..n {
        let mut v = [0u64; 128];
        v[0] = k;
        v[127] = !k;
        m.insert(k, v);
    }
    let mut bad = 0;
    for k in (0..n).rev() {
        let v = m.get(&k).expect("every key is there");
        bad += (v[0] != k || v[127] != !k) as u64;
    }
    assert_eq!(bad, 0);
    let st = sp.stats();
    assert!(st.swapouts > 0, "{st:?}");
    drop(m);
    assert_eq!(sp.heap().stats().live_allocations, 0);
}

/// Large blocks are regions of their own: freeing one unmaps it, growing one
/// keeps its bytes, and medium frees go back with `MADV_FREE`.
#[test]
fn memory_goes_back_to_the_space() {
    let sp = space(64, 64);
    let heap = sp.heap();
    let regions0 = sp.stats().regions;
    let big = filled(heap, 7, 4 << 20);
    let hs = heap.stats();
    assert_eq!(hs.large_regions, 1, "{hs:?}");
    assert_eq!(sp.stats().regions, regions0 + 1);
    // Grown: in place or moved, the bytes stay.
    let mut big = big;
    big.reserve_exact(8 << 20);
    assert_eq!(wrong(&big, 7), 0);
    drop(big);
    let hs = heap.stats();
    assert_eq!((hs.large_regions, hs.large_bytes), (0, 0), "{hs:?}");
    assert_eq!(sp.stats().regions, regions0);

    // Medium blocks live in an arena; freeing them lazily frees their
    // pages, once more than a sixty-fourth of the budget (1 MiB here) is
    // freed and not reused.
    let meds: Vec<_> = (0..8).map(|k| filled(heap, k, 200 << 10)).collect();
    let lazy0 = sp.stats().lazyfree_pages;
    drop(meds);
    let hs = heap.stats();
    assert!(hs.lazily_freed_bytes >= 1 << 20, "{hs:?}");
    assert!(sp.stats().lazyfree_pages > lazy0);
    // Reused at once, with no zeroing: the bytes written are the bytes read.
    let again = filled(heap, 99, 1 << 20);
    assert_eq!(wrong(&again, 99), 0);
}

/// A medium block freed and allocated again at once, over and over (zlib's
/// windows in git): its pages are never lazily freed — each free waits for
/// the next, which takes them back — and the bytes are the bytes written.
#[test]
fn a_block_freed_and_allocated_again_makes_no_call() {
    let sp = space(64, 64);
    let heap = sp.heap();
    let keep = filled(heap, 1, 100 << 10);
    let lazy0 = heap.stats().lazily_freed_bytes;
    for k in 0..1000 {
        let v = filled(heap, k, 128 << 10);
        assert_eq!(wrong(&v, k), 0);
    }
    let freed = heap.stats().lazily_freed_bytes - lazy0;
    // (125 MiB went through the heap: a call a free would lazily free all
    // of it.)
    assert!(freed <= 1 << 20, "{freed} bytes lazily freed");
    assert_eq!(wrong(&keep, 1), 0);
}

/// A large block freed raises the size from which blocks are regions past
/// its own (glibc's dynamic mmap threshold): the same size allocated and
/// freed again and again maps no region; a block past `LARGE_MAX_BYTES`
/// still does.
#[test]
fn a_large_block_freed_and_allocated_again_maps_no_region() {
    let sp = space(256, 64);
    let heap = sp.heap();
    let regions0 = sp.stats().regions;
    let first = filled(heap, 0, 1 << 20);
    assert_eq!(heap.stats().large_regions, 1);
    drop(first);
    let mut most = 0;
    for k in 1..200 {
        let v = filled(heap, k, 1 << 20);
        assert_eq!(wrong(&v, k), 0);
        most = most.max(sp.stats().regions);
        assert_eq!(heap.stats().large_regions, 0, "round {k}");
    }
    // (The arenas the blocks came from: a few regions, not one a round.)
    assert!(most <= regions0 + 4, "{most} regions (from {regions0})");
    let huge = filled(heap, 7, LARGE_MAX_BYTES + (1 << 20));
    assert_eq!(heap.stats().large_regions, 1);
    drop(huge);
}

/// Threads allocating and freeing in one heap at once, each checking its
/// own blocks (no pressure: the contention is on the heap's lock).
#[test]
fn threads_share_one_heap() {
    let sp = space(256, 64);
    let corrupted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (sp, corrupted): (&Space, _) = (&sp, &corrupted);
            s.spawn(move || {
                let heap = sp.heap();
                let mut rng = Rng::new(99 + t);
                let mut keep: Vec<Option<(u64, AVec<u8, Heap<'_>>)>> = (0..128).map(|_| None).collect();
                for i in 0..20_000u64 {
                    let j = rng.next_u64() as usize % keep.len();
                    if let Some((k, v)) = keep[j].take() {
                        corrupted.fetch_add(wrong(&v, k), Ordering::Relaxed);
                    }
                    let k = (t << 32) | i;
                    let n = 1 + rng.next_u64() as usize % 2000;
                    keep[j] = Some((k, filled(heap, k, n)));
                }
                for (k, v) in keep.iter().flatten() {
                    corrupted.fetch_add(wrong(v, *k), Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(corrupted.load(Ordering::Relaxed), 0);
    assert_eq!(sp.heap().stats().live_allocations, 0);
    sp.validate();
}
