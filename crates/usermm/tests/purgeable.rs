//! `Purgeable` (seed 002's cache-shaped API): pin/unpin without pressure,
//! exact purge reports under pressure, guards that protect their bytes, and a
//! cache workload that regenerates exactly what was purged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use usermm::consts::*;
use usermm::{Contents, Errno, Purgeable, Space};
use usermm_sys::testing::SigbusRecorder;

mod common;
use common::space;

const PS: usize = 4096;

/// Writes `len` bytes of private anonymous memory elsewhere in the space,
/// twice, so that the LRU cycles everything older through reclaim.
fn pressure(s: &Space, len: usize) {
    let mut m = s.map_anon(len).unwrap();
    for round in 1..=2u8 {
        for c in m.chunks_mut(PS) {
            c[0] = round;
        }
    }
}

/// The byte page `p` of buffer `tag` holds (never 0, so a purged page is
/// told from an intact one).
fn pat(tag: usize, p: usize) -> u8 {
    (tag * 31 + p * 7) as u8 | 1
}

fn fill(bytes: &mut [u8], tag: usize) {
    for (p, page) in bytes.chunks_mut(PS).enumerate() {
        page.fill(pat(tag, p));
    }
}

fn purged_states(s: &Space, addr: usize, pages: usize) -> Vec<bool> {
    let mut st = vec![0u32; pages];
    s.page_state(addr, pages, &mut st).unwrap();
    st.iter().map(|w| w & UMM_PAGE_PURGED != 0).collect()
}

#[test]
fn lock_unlock_without_pressure_is_always_intact() {
    let s = space(64, 0);
    let mut b = Purgeable::new(&s, 64 * PS).unwrap();
    assert_eq!(b.len(), 64 * PS);
    assert!(!b.is_volatile(), "a new buffer starts non-volatile");
    {
        let (mut g, c) = b.lock().unwrap();
        assert_eq!(c, Contents::Intact);
        assert!(g.iter().all(|&x| x == 0), "a new buffer is zero-filled");
        fill(&mut g, 1);
    }
    assert!(b.is_volatile());
    assert_eq!(s.stats().volatile_pages, 64, "unlocked: the whole buffer is volatile");
    for round in 0..20 {
        let (mut g, c) = b.lock().unwrap();
        assert_eq!(c, Contents::Intact, "round {round}");
        assert_eq!(s.stats().volatile_pages, 0, "locked: nothing is volatile");
        for (p, page) in g.chunks(PS).enumerate() {
            assert!(page.iter().all(|&x| x == pat(round + 1, p)), "round {round} page {p}");
        }
        fill(&mut g, round + 2);
        g.unlock().unwrap();
        assert_eq!(s.stats().volatile_pages, 64);
    }
    assert_eq!(s.stats().volatile_purges, 0);
    s.validate();
}

#[test]
fn pressure_while_unlocked_purges_with_an_exact_report() {
    let s = space(4, 128);
    let n = 256; // 1 MiB: a quarter of the budget
    let mut b = Purgeable::new(&s, n * PS).unwrap();
    fill(&mut b.lock().unwrap().0, 3);
    pressure(&s, 32 << 20); // 8x the budget
    let expect = purged_states(&s, b.addr(), n);
    let purged_before = s.stats().volatile_purges;
    assert!(purged_before > 0, "pressure purged nothing: {:?}", s.stats());
    let (g, c) = b.lock().unwrap();
    let Contents::Purged { pages, first, ref bitmap } = c else { panic!("expected Purged, got {c:?}") };
    assert_eq!(pages as u64, purged_before, "only this buffer was volatile");
    assert_eq!(pages, expect.iter().filter(|&&x| x).count());
    assert_eq!(first, expect.iter().position(|&x| x).unwrap() * PS);
    assert_eq!(bitmap.len(), n / 64);
    for p in 0..n {
        assert_eq!(c.is_page_purged(p), expect[p], "page {p}: bitmap agrees with page_state");
        let page = &g[p * PS..(p + 1) * PS];
        if expect[p] {
            assert!(page.iter().all(|&x| x == 0), "purged page {p} reads zero");
        } else {
            assert!(page.iter().all(|&x| x == pat(3, p)), "intact page {p} keeps its data");
        }
    }
    assert_eq!(c.purged_page_indices().count(), pages);
    drop(g);
    // The report is consumed: the next lock (no pressure since) is intact.
    assert_eq!(b.lock().unwrap().1, Contents::Intact);
    s.validate();
}

#[test]
fn a_held_guard_keeps_its_bytes_under_pressure() {
    let s = space(4, 128);
    let n = 256;
    let mut b = Purgeable::new(&s, n * PS).unwrap();
    fill(&mut b.lock().unwrap().0, 5);
    let before = s.stats();
    {
        let (g, c) = b.lock().unwrap();
        assert_eq!(c, Contents::Intact);
        pressure(&s, 32 << 20);
        let st = s.stats();
        assert_eq!(st.volatile_purges, before.volatile_purges, "nothing is purged while locked");
        assert!(st.swapouts > before.swapouts, "the pressure was real: {st:?}");
        for (p, page) in g.chunks(PS).enumerate() {
            assert!(page.iter().all(|&x| x == pat(5, p)), "page {p} kept under pressure");
        }
    }
    assert_eq!(b.lock().unwrap().1, Contents::Intact);
    s.validate();
}

#[test]
fn lock_range_pins_only_its_part() {
    let s = space(4, 128);
    let items = 16;
    let item_pages = 16; // 64 KiB items in one 1 MiB buffer
    let mut b = Purgeable::new_volatile(&s, items * item_pages * PS).unwrap();
    assert!(b.is_volatile());
    for i in 0..items {
        let (mut g, c) = b.lock_range(i * item_pages * PS, item_pages * PS).unwrap();
        assert_eq!(c, Contents::Intact);
        assert_eq!(g.len(), item_pages * PS);
        assert_eq!(g.offset(), i * item_pages * PS);
        fill(&mut g, i);
    }
    assert_eq!(s.stats().volatile_pages, (items * item_pages) as u64);
    let hot = 5;
    let (mut purged, mut intact) = (0, 0);
    {
        let (g, c) = b.lock_range(hot * item_pages * PS, item_pages * PS).unwrap();
        assert_eq!(c, Contents::Intact);
        assert_eq!(s.stats().volatile_pages, ((items - 1) * item_pages) as u64, "only the range is pinned");
        pressure(&s, 32 << 20);
        for (p, page) in g.chunks(PS).enumerate() {
            assert!(page.iter().all(|&x| x == pat(hot, p)), "the pinned item is kept (page {p})");
        }
    }
    for i in (0..items).filter(|&i| i != hot) {
        let (g, c) = b.lock_range(i * item_pages * PS, item_pages * PS).unwrap();
        for p in 0..item_pages {
            let page = &g[p * PS..(p + 1) * PS];
            if c.is_page_purged(p) {
                purged += 1;
                assert!(page.iter().all(|&x| x == 0));
            } else {
                intact += 1;
                assert!(page.iter().all(|&x| x == pat(i, p)), "item {i} page {p}");
            }
        }
    }
    assert!(purged > 0, "pressure 8x the budget purges unpinned items ({intact} pages intact)");
    assert_eq!(purged as u64, s.stats().volatile_purges);
    s.validate();
}

#[test]
fn argument_rules() {
    let s = space(64, 0);
    assert_eq!(Purgeable::new(&s, 0).err(), Some(Errno::EINVAL));
    let mut b = Purgeable::new(&s, 3 * PS + 100).unwrap();
    assert_eq!(b.len(), 3 * PS + 100);
    assert_eq!(b.lock_range(1, PS).err(), Some(Errno::EINVAL), "unaligned offset");
    assert_eq!(b.lock_range(PS, 0).err(), Some(Errno::EINVAL), "empty range");
    assert_eq!(b.lock_range(PS, 3 * PS).err(), Some(Errno::EINVAL), "past the end");
    assert_eq!(b.lock_range(usize::MAX & !(PS - 1), PS).err(), Some(Errno::EINVAL), "overflow");
    {
        // An unaligned length: the guard is exact, the last page is pinned.
        let (mut g, _) = b.lock_range(2 * PS, PS + 100).unwrap();
        assert_eq!(g.len(), PS + 100);
        g.fill(9);
    }
    assert_eq!(s.stats().volatile_pages, 4);
    let (g, _) = b.lock().unwrap();
    assert_eq!(g.len(), 3 * PS + 100);
    assert!(g[2 * PS..].iter().all(|&x| x == 9));
    drop(g);
    // Unpinning reports the mvolatile error that Drop would ignore: here
    // someone locked the buffer's pages behind its back.
    let (g, _) = b.lock().unwrap();
    s.mlock(b_addr(&g), PS).unwrap();
    assert_eq!(g.unlock(), Err(Errno::EINVAL));
    s.validate();
}

fn b_addr(g: &usermm::PurgeableGuard<'_, '_>) -> usize {
    g.as_ptr() as usize - g.offset()
}

#[test]
fn dropping_a_purgeable_unmaps_it() {
    let s = space(64, 0);
    let r0 = s.stats().regions;
    let mut b = Purgeable::new(&s, 32 * PS).unwrap();
    fill(&mut b.lock().unwrap().0, 1);
    assert_eq!(s.stats().regions, r0 + 1);
    assert_eq!(s.stats().volatile_pages, 32);
    let addr = b.addr();
    drop(b);
    assert_eq!(s.stats().regions, r0);
    assert_eq!(s.stats().volatile_pages, 0);
    assert_eq!(s.stats().resident_pages, 0);
    let mut v = [0u8; 1];
    assert_eq!(s.mincore(addr, PS, &mut v), Err(Errno::ENOMEM), "the range is a hole now");
    s.validate();
}

// ---------------------------------------------------------------------------
// The cache workload of `examples/purgeable_cache.rs`, with assertions.

const ITEMS: usize = 64;
const ITEM_BYTES: usize = 256 << 10;

fn decode_page(item: usize, page: usize, out: &mut [u8]) {
    let mut x =
        (item as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (page as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for word in out.chunks_mut(8) {
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// Runs `lookups` random lookups over the cache; returns (hits, regenerated
/// lookups, purged pages reported in all).
fn cache_workload(s: &Space, lookups: usize) -> (usize, usize, usize, u64) {
    let mut items: Vec<Purgeable<'_>> = (0..ITEMS)
        .map(|i| {
            let mut item = Purgeable::new(s, ITEM_BYTES).unwrap();
            let (mut g, c) = item.lock().unwrap();
            assert_eq!(c, Contents::Intact);
            for (p, page) in g.chunks_mut(PS).enumerate() {
                decode_page(i, p, page);
            }
            drop(g);
            item
        })
        .collect();
    let (mut hits, mut regenerated, mut pages) = (0, 0, 0);
    let mut want = vec![0u8; PS];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..lookups {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % ITEMS as u64) as usize;
        let (mut g, c) = items[i].lock().unwrap();
        for p in c.purged_page_indices() {
            let page = &mut g[p * PS..(p + 1) * PS];
            assert!(page.iter().all(|&b| b == 0), "item {i} page {p}: purged reads zero");
            decode_page(i, p, page);
        }
        for (p, page) in g.chunks(PS).enumerate() {
            decode_page(i, p, &mut want);
            assert!(page == &want[..], "item {i} page {p}: wrong contents after lookup");
        }
        match c {
            Contents::Intact => hits += 1,
            Contents::Purged { pages: n, .. } => {
                regenerated += 1;
                pages += n;
            }
        }
    }
    // Collect the reports of purges after each item's last lookup (pin and
    // unpin only: touching nothing purges nothing more, but background
    // reclaim may still be finishing a round, so sweep until the reports
    // account for every purge the space counted).
    let mut swept = 0;
    // Pin every item at once: while all are pinned no purge can happen, so
    // the purges counted so far are exactly the ones reported.
    let mut guards = Vec::new();
    for it in items.iter_mut() {
        let (g, c) = it.lock().unwrap();
        swept += c.purged_pages();
        guards.push(g);
    }
    let purges = s.stats().volatile_purges;
    drop(guards);
    (hits, regenerated, pages + swept, purges)
}

#[test]
fn cache_workload_with_swap_regenerates_exactly_what_was_purged() {
    let s = space(8, 64);
    let (hits, regenerated, pages, purges) = cache_workload(&s, 300);
    let st = s.stats();
    eprintln!("cache (swap): {hits} hits, {regenerated} regenerated, {pages} pages, {st:?}");
    assert_eq!(hits + regenerated, 300);
    assert!(regenerated > 0, "a budget of half the cache must purge");
    assert!(hits > 0, "half the cache fits: some lookups hit");
    assert_eq!(pages as u64, purges, "every purge reported exactly once");
    assert_eq!(st.oom_sigbus, 0);
    s.validate();
}

// ---------------------------------------------------------------------------
// Without swap (the seed's embedded case): a page that was deactivated while
// volatile and then pinned stays on the inactive list; direct reclaim must
// still purge the volatile pages behind it.

static NOSWAP: OnceLock<Space> = OnceLock::new();
static PINNED: AtomicUsize = AtomicUsize::new(0);
static PINNED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Called from the SIGBUS handler if a fault found no frame: unpins the
/// pinned buffer so that reclaim can make progress and the test ends with a
/// failed assertion instead of a SIGBUS loop.
fn unblock(_addr: usize) {
    let s = NOSWAP.get().unwrap();
    let _ = s.mvolatile(PINNED.load(Ordering::SeqCst), PINNED_LEN.load(Ordering::SeqCst));
}

#[test]
fn without_swap_a_repinned_buffer_does_not_block_purging_others() {
    let s = NOSWAP.get_or_init(|| space(4, 0));
    let n = 256; // 1 MiB
    let mut a = Purgeable::new(s, n * PS).unwrap();
    fill(&mut a.lock().unwrap().0, 7);
    // Three more volatile MiB: the budget is full and aging moves the
    // oldest pages (a's) to the inactive list.
    let mut others: Vec<Purgeable<'_>> = (0..3)
        .map(|i| {
            let mut o = Purgeable::new(s, n * PS).unwrap();
            fill(&mut o.lock().unwrap().0, 10 + i);
            o
        })
        .collect();
    PINNED.store(a.addr(), Ordering::SeqCst);
    PINNED_LEN.store(n * PS, Ordering::SeqCst);
    let (lo, hi) = (s.reservation().0, s.reservation().0 + s.reservation().1);
    let rec = SigbusRecorder::install_with(lo, hi, unblock).unwrap();
    {
        let (g, _) = a.lock().unwrap();
        // New volatile buffers, 8x the budget, while `a` is pinned: each
        // needs frames, which only purging the other buffers can give.
        for i in 0..32 {
            let mut o = Purgeable::new(s, n * PS).unwrap();
            fill(&mut o.lock().unwrap().0, 20 + i);
            others.push(o);
        }
        let r = rec.record();
        assert_eq!(
            (r.count, s.stats().oom_sigbus),
            (0, 0),
            "a fault found no frame (SIGBUS si_code {} at {:#x}) although other buffers were volatile: {:?}",
            r.code,
            r.addr,
            s.stats()
        );
        drop(g);
    }
    drop(rec);
    assert!(s.stats().volatile_purges > 0);
    s.validate();
}
