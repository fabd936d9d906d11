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
