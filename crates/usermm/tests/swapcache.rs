//! The swap cache: a page swapped in and only read since keeps its swap
//! copy, and evicting it again writes nothing; the first write to it —
//! by the program or by the kernel on its behalf (`read(2)` into it) — ends
//! the copy before it lands, so the next eviction writes the new data.

use usermm::consts::*;
use usermm_sys::kernel::{peek, pipe_read_into, poke};

mod common;
use common::{fill, space_pages as space};

const PS: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const BUDGET: usize = 256;
const PAGES: usize = 4 * BUDGET;

/// Reads every page's first byte (each pass over 4× the budget evicts
/// everything the previous one brought in).
fn read_all(a: usize) -> u64 {
    (0..PAGES).map(|p| peek(a + p * PS) as u64).sum()
}

fn expect(a: usize, p: usize, tag: u8, what: &str) {
    let want = tag.wrapping_add(p as u8);
    assert_eq!((peek(a + p * PS), peek(a + p * PS + PS - 1)), (want, want), "page {p}: {what}");
}

/// A space and a region of 4× its budget, written (tag 1) and read once,
/// so that every page has been swapped out and most read back in.
fn swapped_region() -> (usermm::Space, usize) {
    let s = space(BUDGET, 2 * PAGES, 0);
    let a = s.mmap(0, PAGES * PS, RW, ANON, -1, 0).unwrap();
    fill(a, 0..PAGES, 1);
    read_all(a);
    (s, a)
}

#[test]
fn pages_only_read_since_their_swap_in_are_evicted_without_a_write() {
    let (s, a) = swapped_region();
    let before = s.stats();
    for _ in 0..2 {
        read_all(a);
    }
    let after = s.stats();
    let evictions = after.evictions - before.evictions;
    let writes = after.swapouts - before.swapouts;
    let clean = after.clean_evictions - before.clean_evictions;
    assert!(evictions >= PAGES as u64, "two passes over 4x the budget evict: {after:?}");
    assert_eq!(evictions, writes + clean, "every eviction writes or is clean");
    assert!(clean * 10 >= evictions * 8, "read-only passes: {clean} of {evictions} evictions clean");
    for p in 0..PAGES {
        expect(a, p, 1, "after clean evictions");
    }
    s.validate();
}

#[test]
fn a_write_after_a_clean_swap_in_is_never_lost() {
    let (s, a) = swapped_region();
    read_all(a);
    // Pages read in (write-protected, with their swap copies) and then
    // written: by the program (a read fault first, then the write), and by
    // the kernel on its behalf (`read(2)` from a pipe into the page).
    for round in 0..3u8 {
        let tag = 10 + round;
        for p in (round as usize..PAGES).step_by(3) {
            let _ = peek(a + p * PS);
            if p % 2 == 0 {
                poke(a + p * PS, tag.wrapping_add(p as u8));
                poke(a + p * PS + PS - 1, tag.wrapping_add(p as u8));
            } else {
                let v = tag.wrapping_add(p as u8);
                assert_eq!(pipe_read_into(a + p * PS, &[v]), Ok(1));
                assert_eq!(pipe_read_into(a + p * PS + PS - 1, &[v]), Ok(1));
            }
        }
        // Everything evicted and read back.
        read_all(a);
        read_all(a);
        for p in 0..PAGES {
            let last = (0..=round).rev().find(|&r| p >= r as usize && (p - r as usize).is_multiple_of(3));
            let tag = last.map_or(1, |r| 10 + r);
            expect(a, p, tag, &format!("round {round}"));
        }
        s.validate();
    }
    let st = s.stats();
    assert!(st.clean_evictions > 0 && st.swapouts > 0, "{st:?}");
}

/// A page with a swap copy that is parked (`MADV_COLD`) and touched again
/// comes back write-protected, keeping its copy; a write to it then still
/// ends the copy before it lands — as a read and a write touch, or as one
/// write touch of the parked page.
#[test]
fn a_parked_page_with_a_swap_copy_keeps_its_writes() {
    let (s, a) = swapped_region();
    read_all(a);
    for (round, tag) in [(0usize, 20u8), (1, 30)] {
        // Pages read in (copies), parked, then touched.
        let pages: Vec<usize> = (round * 64..round * 64 + 64).collect();
        for &p in &pages {
            let _ = peek(a + p * PS);
        }
        s.madvise(a + pages[0] * PS, pages.len() * PS, MADV_COLD).unwrap();
        let before = s.stats();
        for &p in &pages {
            if round == 0 {
                let _ = peek(a + p * PS); // mapped back with its copy
            }
            poke(a + p * PS, tag.wrapping_add(p as u8));
            poke(a + p * PS + PS - 1, tag.wrapping_add(p as u8));
        }
        assert!(s.stats().minor_faults > before.minor_faults, "the parked pages were mapped back");
        read_all(a);
        read_all(a);
        for &p in &pages {
            expect(a, p, tag, &format!("round {round}"));
        }
        s.validate();
    }
}

/// Swap barely larger than what must leave memory: slots kept as copies
/// must never stop a dirty page from leaving (a clean page leaves without a
/// new slot; none is kept while swap is short). Written, read (copies),
/// written again and read back: every byte as written, no SIGBUS.
#[test]
fn copies_never_starve_dirty_pages_of_swap() {
    let (budget, swap, pages) = (256, 600, 700);
    let s = space(budget, swap, 0);
    let a = s.mmap(0, pages * PS, RW, ANON, -1, 0).unwrap();
    fill(a, 0..pages, 1);
    for _ in 0..2 {
        for p in 0..pages {
            expect(a, p, 1, "first read");
        }
    }
    fill(a, 0..pages, 7);
    for p in 0..pages {
        expect(a, p, 7, "after the second write");
    }
    let st = s.stats();
    assert_eq!(st.oom_sigbus, 0, "{st:?}");
    assert!(st.clean_evictions > 0, "{st:?}");
    s.validate();
}

// ----------------------------------------------------------------------
// A locked page leaves swap (issue 45, item 7). Linux frees the swap slot
// of a page it swaps into a locked region; usermm frees it too and
// overwrites the store's copy, so that a locked secret is not left in the
// swap file or on a Redis server (where a crash would leave it for good).
// Each way a swapped (or swap-cached) page becomes locked and resident is
// checked: the page is resident, locked and not swapped, no slot is kept
// as its copy, and no byte of it is left in the store.

/// A page's worth of a marker no other test writes.
fn secret() -> Vec<u8> {
    let tag = format!("LOCKED-SECRET-{}-{:?}|", std::process::id(), std::thread::current().id());
    tag.bytes().cycle().take(PS).collect()
}

/// Whether the space's page store still holds `needle` anywhere: the swap
/// file, or every value on the Redis server(s) of `USERMM_TEST_SWAP_URL`
/// (each seed of a cluster, replicas included).
fn store_holds(s: &usermm::Space, needle: &[u8]) -> bool {
    let has = |v: &[u8]| v.windows(needle.len()).any(|w| w == needle);
    let Some(url) = std::env::var("USERMM_TEST_SWAP_URL").ok().filter(|u| !u.is_empty()) else {
        return has(&s.swap_contents().expect("the swap file"));
    };
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let hosts: Vec<String> = if scheme == "redis+cluster" {
        rest.split(['/', '?']).next().unwrap().split(',').map(str::to_string).collect()
    } else {
        vec![rest.split(['/', '?']).next().unwrap().to_string()]
    };
    hosts.iter().any(|h| {
        let mut c = redis::Client::open(format!("redis://{h}/")).unwrap().get_connection().unwrap();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
        keys.iter().any(|k| {
            // (READONLY lets a cluster replica answer; a key of another
            // test may be gone meanwhile.)
            let _ = redis::cmd("READONLY").query::<()>(&mut c);
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(k).query(&mut c).unwrap_or(None);
            v.is_some_and(|v| has(&v))
        })
    })
}

fn write_bytes(a: usize, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        poke(a + i, b);
    }
}

/// Writes the secret into page `a`, pages it out, and checks that it is in
/// swap (and in the store).
fn swapped_secret(s: &usermm::Space, a: usize, prot: i32) -> Vec<u8> {
    let sec = secret();
    write_bytes(a, &sec);
    if prot != RW {
        s.mprotect(a, PS, prot).unwrap();
    }
    s.madvise(a, PS, MADV_PAGEOUT).unwrap();
    assert_eq!(state(s, a) & (UMM_PAGE_SWAPPED | UMM_PAGE_RESIDENT), UMM_PAGE_SWAPPED, "paged out");
    assert!(store_holds(s, &sec), "the secret is in the store before the lock");
    sec
}

fn state(s: &usermm::Space, a: usize) -> u32 {
    let mut st = [0u32];
    s.page_state(a, 1, &mut st).unwrap();
    st[0]
}

/// The page at `a` is locked, resident, out of swap, and its bytes are
/// gone from the store (`wait`: the store is scrubbed by the background
/// thread, after a fault; else by the call itself, before it returns).
fn left_swap(s: &usermm::Space, a: usize, sec: &[u8], what: &str, wait: bool) {
    let st = state(s, a);
    assert_eq!(
        st & (UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED | UMM_PAGE_SWAPPED),
        UMM_PAGE_RESIDENT | UMM_PAGE_LOCKED,
        "{what}: {st:#x}"
    );
    let stats = s.stats();
    assert_eq!((stats.swapped_pages, stats.swap_cached_pages), (0, 0), "{what}: no slot kept: {stats:?}");
    let mut held = store_holds(s, sec);
    for _ in 0..if wait { 500 } else { 0 } {
        if !held {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        held = store_holds(s, sec);
    }
    assert!(!held, "{what}: the locked page's bytes are still in the store");
    assert!((0..PS).all(|i| peek(a + i) == sec[i]), "{what}: the page's data");
    s.validate();
}

#[test]
fn a_swapped_page_locked_leaves_swap() {
    let s = space(BUDGET, PAGES, 0);
    let a = s.mmap(0, PS, RW, ANON, -1, 0).unwrap();
    let sec = swapped_secret(&s, a, RW);
    s.mlock(a, PS).unwrap();
    left_swap(&s, a, &sec, "mlock", false);
}

#[test]
fn a_swapped_read_only_page_locked_leaves_swap() {
    // A read populate: the swap-in would have kept its slot as a copy.
    let s = space(BUDGET, PAGES, 0);
    let a = s.mmap(0, PS, RW, ANON, -1, 0).unwrap();
    let sec = swapped_secret(&s, a, PROT_READ);
    s.mlockall(MCL_CURRENT).unwrap();
    left_swap(&s, a, &sec, "mlockall(MCL_CURRENT) of a read-only page", false);
}

#[test]
fn a_swap_cached_page_locked_leaves_swap() {
    let s = space(BUDGET, PAGES, 0);
    let a = s.mmap(0, PS, RW, ANON, -1, 0).unwrap();
    let sec = swapped_secret(&s, a, RW);
    // Read back in: a clean swap-in keeps its slot as the page's copy.
    assert_eq!(peek(a), sec[0]);
    assert_eq!(s.stats().swap_cached_pages, 1, "the read kept a swap copy");
    s.mlock2(a, PS, MLOCK_ONFAULT).unwrap();
    left_swap(&s, a, &sec, "mlock2(MLOCK_ONFAULT) of a swap-cached page", false);
}

#[test]
fn a_parked_swap_cached_page_locked_leaves_swap() {
    let s = space(BUDGET, PAGES, 0);
    let a = s.mmap(0, PS, RW, ANON, -1, 0).unwrap();
    let sec = swapped_secret(&s, a, RW);
    assert_eq!(peek(a), sec[0]);
    s.madvise(a, PS, MADV_COLD).unwrap();
    assert_ne!(state(&s, a) & UMM_PAGE_INACTIVE, 0, "parked");
    assert_eq!(s.stats().swap_cached_pages, 1, "parked with its swap copy");
    s.mlock(a, PS).unwrap();
    left_swap(&s, a, &sec, "mlock of a parked swap-cached page", false);
}

#[test]
fn a_swapped_page_faulted_into_a_lock_on_fault_range_leaves_swap() {
    let s = space(BUDGET, PAGES, 0);
    let a = s.mmap(0, 2 * PS, RW, ANON, -1, 0).unwrap();
    let sec = swapped_secret(&s, a, RW);
    let sec2 = swapped_secret(&s, a + PS, RW);
    s.mlock2(a, 2 * PS, MLOCK_ONFAULT).unwrap();
    assert_ne!(state(&s, a) & UMM_PAGE_SWAPPED, 0, "lock on fault swaps nothing in");
    // A read fault, and a read populate.
    assert_eq!(peek(a), sec[0]);
    s.madvise(a + PS, PS, MADV_POPULATE_READ).unwrap();
    left_swap(&s, a + PS, &sec2, "MADV_POPULATE_READ over a lock-on-fault range", false);
    left_swap(&s, a, &sec, "a read fault in a lock-on-fault range", true);
}
