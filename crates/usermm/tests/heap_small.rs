//! The heap's small blocks (size classes in slabs, per-thread caches),
//! through the Rust allocator and the C calls (`umm_malloc` and friends, as
//! the `usermm run` preload library calls them).
//!
//! Checked: every size class hands out distinct, aligned, usable blocks and
//! refuses double and foreign frees (so does every other kind of block);
//! blocks freed by another thread than the one that allocated them, and the
//! cache of a thread that exits full, go back to the heap; the classes keep
//! to pages of their own; freeing swapped-out blocks swaps nothing in; four
//! threads trading blocks at 4× the budget keep every byte.

mod common;
mod pattern;

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use allocator_api2::vec::Vec as AVec;
use common::space;
use pattern::Rng;
use usermm::capi::{
    umm_aligned_alloc, umm_calloc, umm_free, umm_malloc, umm_malloc_usable_size, umm_realloc, umm_space,
};
use usermm::heap::{SLAB_BYTES, SMALL_MAX_BYTES};
use usermm::{Heap, Space};

fn handle(sp: &Space) -> *mut umm_space {
    sp as *const Space as *mut umm_space
}

/// The byte at offset `i` of block `k`.
fn pat(k: u64, i: usize) -> u8 {
    (k.wrapping_mul(0x9e37_79b9) as usize ^ i.wrapping_mul(31) ^ (i >> 12)) as u8
}

fn fill(p: *mut u8, k: u64, n: usize) {
    // SAFETY: `p` is a live block of at least `n` bytes (the callers').
    let b = unsafe { std::slice::from_raw_parts_mut(p, n) };
    for (i, x) in b.iter_mut().enumerate() {
        *x = pat(k, i);
    }
}

fn wrong(p: *const u8, k: u64, n: usize) -> usize {
    // SAFETY: as in `fill`.
    let b = unsafe { std::slice::from_raw_parts(p, n) };
    b.iter().enumerate().filter(|&(i, &x)| x != pat(k, i)).count()
}

/// Sizes at every class boundary (and past the small blocks: medium,
/// large).
fn sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 15, 16, 17];
    let mut c = 16;
    while c <= SMALL_MAX_BYTES {
        v.extend([c - 1, c, c + 1]);
        c += if c < 128 { 16 } else { c.next_power_of_two() / 8 };
    }
    v.extend([20_000, 100 << 10, (256 << 10) - 16, 256 << 10, 1 << 20]);
    v
}

/// For every size: blocks are whole, usable up to their usable size, and a
/// second free, a free of an interior pointer, a realloc and a usable-size
/// query of a freed block are refused; the heap goes on handing out
/// distinct blocks.
#[test]
fn every_size_refuses_double_and_foreign_frees() {
    let sp = space(64, 256);
    let s = handle(&sp);
    let base_live = sp.heap().stats().live_allocations;
    for (k, &n) in sizes().iter().enumerate() {
        let k = k as u64;
        // SAFETY: `s` is a live handle; every pointer passed is one the
        // heap handed out (live or freed: the calls must refuse the freed).
        unsafe {
            let p = umm_malloc(s, n) as *mut u8;
            assert!(!p.is_null() && (p as usize).is_multiple_of(16), "{n}");
            let usable = umm_malloc_usable_size(s, p as *mut c_void);
            assert!(usable >= n, "{n}: usable {usable}");
            fill(p, k, usable);
            assert_eq!(wrong(p, k, usable), 0, "{n}");
            // Interior pointers, one at a 16-byte boundary: not a block.
            for at in [8, 16].into_iter().filter(|&at| at < usable) {
                umm_free(s, p.add(at) as *mut c_void);
                assert_eq!(umm_malloc_usable_size(s, p.add(at) as *mut c_void), 0, "{n} +{at}");
            }
            assert_eq!(wrong(p, k, usable), 0, "{n}: an interior free changed the block");
            umm_free(s, p as *mut c_void);
            assert_eq!(umm_malloc_usable_size(s, p as *mut c_void), 0, "{n}: freed, still usable");
            umm_free(s, p as *mut c_void);
            assert!(umm_realloc(s, p as *mut c_void, n + 1).is_null(), "{n}: realloc of a freed block");
            // The heap still hands out distinct blocks: with the double
            // free taken, the freed block would come back twice.
            let mut seen = HashSet::new();
            let mut live = Vec::new();
            for j in 0..64u64 {
                let q = umm_malloc(s, n) as *mut u8;
                assert!(!q.is_null() && seen.insert(q as usize), "{n}: block {q:?} handed out twice");
                fill(q, k * 100 + j, n);
                live.push(q);
            }
            for (j, &q) in live.iter().enumerate() {
                assert_eq!(wrong(q, k * 100 + j as u64, n), 0, "{n}: blocks overlap");
                umm_free(s, q as *mut c_void);
            }
        }
    }
    // A pointer outside every block, inside the reservation and outside it.
    let (base, len) = sp.reservation();
    // SAFETY: the calls must refuse these without touching them.
    unsafe {
        umm_free(s, (base + len - 4096) as *mut c_void);
        let x = 0u64;
        umm_free(s, &x as *const u64 as *mut c_void);
    }
    assert_eq!(sp.heap().stats().live_allocations, base_live);
    sp.validate();
}

/// The C calls: calloc zeroes reused blocks, aligned blocks keep their
/// alignment (also through realloc), realloc keeps the bytes across
/// small, medium and large blocks.
#[test]
fn c_calls_zero_align_and_resize() {
    let sp = space(64, 256);
    let s = handle(&sp);
    // SAFETY: `s` is a live handle, every pointer passed a live block.
    unsafe {
        for n in [1usize, 24, 100, 1000, 4000, 16 << 10, 20_000] {
            for _ in 0..4 {
                let d = umm_malloc(s, n) as *mut u8;
                d.write_bytes(0xa5, n);
                umm_free(s, d as *mut c_void);
                let z = umm_calloc(s, 1, n) as *mut u8;
                assert!(std::slice::from_raw_parts(z, n).iter().all(|&b| b == 0), "{n}");
                umm_free(s, z as *mut c_void);
            }
        }
        for align in [8usize, 16, 32, 64, 256, 4096, 65536] {
            for n in [1usize, 100, 3000, 20_000] {
                let p = umm_aligned_alloc(s, align, n) as *mut u8;
                assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{align} {n}");
                fill(p, 1, n);
                let q = umm_realloc(s, p as *mut c_void, 3 * n) as *mut u8;
                assert!(!q.is_null() && (q as usize).is_multiple_of(align.max(16)), "{align} {n}");
                assert_eq!(wrong(q, 1, n), 0);
                umm_free(s, q as *mut c_void);
            }
        }
        // One block grown from 1 byte to 2 MiB and back, its bytes kept.
        let mut p = umm_malloc(s, 1) as *mut u8;
        let mut n = 1usize;
        fill(p, 9, n);
        while n < 2 << 20 {
            let m = n * 3 / 2 + 7;
            p = umm_realloc(s, p as *mut c_void, m) as *mut u8;
            assert!(!p.is_null() && wrong(p, 9, n) == 0, "{n} -> {m}");
            fill(p, 9, m);
            n = m;
        }
        while n > 1 {
            n /= 3;
            p = umm_realloc(s, p as *mut c_void, n.max(1)) as *mut u8;
            assert!(!p.is_null() && wrong(p, 9, n.max(1)) == 0, "-> {n}");
        }
        umm_free(s, p as *mut c_void);
    }
    assert_eq!(sp.heap().stats().live_allocations, 0);
}

/// Blocks allocated by one thread and freed by another (through both the
/// Rust allocator and the C calls): every byte arrives, every block is
/// freed once.
#[test]
fn blocks_freed_by_another_thread() {
    let sp = space(64, 256);
    let bad = AtomicU64::new(0);
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, AVec<u8, Heap<'_>>, usize, usize)>(256);
    std::thread::scope(|sc| {
        let sp = &sp;
        sc.spawn(move || {
            let heap = sp.heap();
            let mut rng = Rng::new(3);
            for k in 0..40_000u64 {
                let n = 1 + rng.index(3000);
                let mut v = AVec::with_capacity_in(n, heap);
                v.extend((0..n).map(|i| pat(k, i)));
                let m = 1 + rng.index(SMALL_MAX_BYTES);
                // SAFETY: a live handle.
                let c = unsafe { umm_malloc(handle(sp), m) } as *mut u8;
                fill(c, k + 1, m);
                tx.send((k, v, c as usize, m)).unwrap();
            }
        });
        let bad = &bad;
        sc.spawn(move || {
            for (k, v, c, m) in rx {
                let w =
                    v.iter().enumerate().filter(|&(i, &b)| b != pat(k, i)).count() + wrong(c as *const u8, k + 1, m);
                bad.fetch_add(w as u64, Ordering::Relaxed);
                drop(v);
                // SAFETY: a live block of the space's heap, freed once.
                unsafe { umm_free(handle(sp), c as *mut c_void) };
            }
        });
    });
    assert_eq!(bad.load(Ordering::Relaxed), 0);
    assert_eq!(sp.heap().stats().live_allocations, 0);
    sp.validate();
}

/// A thread that frees many small blocks and exits with its cache full:
/// its cache goes back at exit, the slabs left wholly free are lazily
/// freed, and the next allocations reuse them instead of new memory.
#[test]
fn a_thread_exiting_with_a_full_cache_gives_it_back() {
    let sp = space(256, 256);
    let heap = sp.heap();
    let n = 64 * SLAB_BYTES / 64; // 64 slabs of 64-byte blocks
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let heap = sp.heap();
            let mut v: Vec<AVec<u8, Heap<'_>>> = Vec::new();
            for k in 0..n {
                let mut b = AVec::with_capacity_in(64, heap);
                b.extend((0..64).map(|i| pat(k as u64, i)));
                v.push(b);
            }
            for sz in [16usize, 200, 1000, 5000, 16 << 10] {
                // A full cache of other classes too.
                let keep: Vec<_> = (0..64).map(|_| AVec::<u8, _>::with_capacity_in(sz, heap)).collect();
                drop(keep);
            }
            drop(v);
        });
    });
    let hs = heap.stats();
    assert_eq!(hs.live_allocations, 0, "{hs:?}");
    // The slabs the exiting thread released are lazily freed by the next
    // call that has the space.
    heap.flush_thread_cache();
    let hs = heap.stats();
    assert!(hs.lazily_freed_bytes >= 60 * SLAB_BYTES as u64, "{hs:?}");
    let arena = hs.arena_bytes;
    let again: Vec<_> = (0..n).map(|_| AVec::<u8, _>::with_capacity_in(64, heap)).collect();
    assert_eq!(heap.stats().arena_bytes, arena, "the freed slabs were not reused");
    drop(again);
}

/// Blocks of one class share pages only with blocks of the same class.
#[test]
fn classes_keep_to_pages_of_their_own() {
    let sp = space(64, 256);
    let s = handle(&sp);
    let page = sp.page_size();
    let mut pages: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    let mut all = Vec::new();
    for i in 0..20_000usize {
        // Small objects and 4 KiB values interleaved, as in Redis.
        let n = [24usize, 4096 + 8, 48, 100][i % 4];
        // SAFETY: a live handle.
        let p = unsafe { umm_malloc(s, n) } as usize;
        // SAFETY: a live handle and block.
        let usable = unsafe { umm_malloc_usable_size(s, p as *mut c_void) };
        for pg in (p / page)..=((p + usable - 1) / page) {
            let class = *pages.entry(pg).or_insert(usable);
            assert_eq!(class, usable, "page {pg:#x} holds blocks of {class} and {usable} bytes");
        }
        all.push(p);
    }
    for p in all {
        // SAFETY: live blocks, freed once.
        unsafe { umm_free(s, p as *mut c_void) };
    }
}

/// Freeing blocks whose pages are swapped out reads none of them back.
#[test]
fn freeing_swapped_out_blocks_swaps_nothing_in() {
    let sp = space(4, 256);
    let s = handle(&sp);
    let blocks: Vec<usize> = (0..8192u64)
        .map(|k| {
            // 4 KiB values and small objects: 16 MiB, 4× the budget.
            let n = if k % 2 == 0 { 4000 } else { 40 };
            // SAFETY: a live handle.
            let p = unsafe { umm_malloc(s, n) } as *mut u8;
            fill(p, k, n);
            p as usize
        })
        .collect();
    let st = sp.stats();
    assert!(st.swapped_pages > 1000, "{st:?}");
    let swapins = st.swapins;
    for p in blocks {
        // SAFETY: live blocks, freed once.
        unsafe { umm_free(s, p as *mut c_void) };
    }
    sp.heap().flush_thread_cache();
    let st = sp.stats();
    assert_eq!(st.swapins, swapins, "freeing swapped-out blocks swapped pages in: {st:?}");
    assert_eq!(sp.heap().stats().live_allocations, 0);
}

/// Four threads trading small blocks at 4× the budget: each frees blocks
/// the others allocated, every byte checked.
#[test]
fn threads_trade_small_blocks_under_pressure() {
    let sp = space(16, 512);
    let pool: Mutex<Vec<(u64, usize, usize)>> = Mutex::new(Vec::new());
    let bytes = AtomicU64::new(0);
    let bad = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (sp, pool, bytes, bad) = (&sp, &pool, &bytes, &bad);
            sc.spawn(move || {
                let s = handle(sp);
                let mut rng = Rng::new(77 + t);
                for i in 0..60_000u64 {
                    let r = rng.next_u64();
                    if bytes.load(Ordering::Relaxed) > 64 << 20 || r.is_multiple_of(3) {
                        let got = {
                            let mut p = pool.lock().unwrap();
                            let len = p.len();
                            (len > 0).then(|| p.swap_remove((r >> 8) as usize % len))
                        };
                        if let Some((k, p, n)) = got {
                            bad.fetch_add(wrong(p as *const u8, k, n) as u64, Ordering::Relaxed);
                            // SAFETY: a live block, freed once.
                            unsafe { umm_free(s, p as *mut c_void) };
                            bytes.fetch_sub(n as u64, Ordering::Relaxed);
                        }
                    } else {
                        let n = 1 + (r >> 16) as usize % [64, 1024, 8192, SMALL_MAX_BYTES][(r >> 8) as usize % 4];
                        // SAFETY: a live handle.
                        let p = unsafe { umm_malloc(s, n) } as *mut u8;
                        assert!(!p.is_null());
                        let k = (t << 40) | i;
                        fill(p, k, n);
                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                        pool.lock().unwrap().push((k, p as usize, n));
                    }
                }
            });
        }
    });
    let s = handle(&sp);
    for (k, p, n) in pool.into_inner().unwrap() {
        bad.fetch_add(wrong(p as *const u8, k, n) as u64, Ordering::Relaxed);
        // SAFETY: a live block, freed once.
        unsafe { umm_free(s, p as *mut c_void) };
    }
    assert_eq!(bad.load(Ordering::Relaxed), 0, "corrupted bytes");
    let st = sp.stats();
    assert!(st.swapouts > 0 && st.swapins > 0, "{st:?}");
    assert!(st.resident_pages_max <= st.budget_pages, "{st:?}");
    assert_eq!(sp.heap().stats().live_allocations, 0);
    sp.validate();
}
