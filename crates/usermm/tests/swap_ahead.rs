//! Swap read-ahead of a stream: a walk over pages that were swapped out at
//! different times (their slots scattered) reads the swapped pages ahead of
//! it in batches, forwards or backwards, instead of a fault each; random
//! touches read nothing ahead. Every byte is checked. (docs/design.md,
//! "Swap read-ahead".)

use usermm::consts::*;
use usermm_sys::kernel::{peek, poke};

mod common;
use common::{fill, space_pages as space};

const PS: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const BUDGET: usize = 1024;
const PAGES: usize = 4 * BUDGET;

fn tag_of(p: usize, tag: u8) -> u8 {
    tag.wrapping_add(p as u8)
}

fn expect(a: usize, p: usize, tag: u8) {
    let want = tag_of(p, tag);
    assert_eq!((peek(a + p * PS), peek(a + p * PS + PS - 1)), (want, want), "page {p}");
}

/// The pages `0..n` in a scrambled order (a fixed permutation).
fn scrambled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// A space whose `PAGES` pages were written twice, the second time in a
/// scrambled order: the swapped ones sit in slots in no order of address.
fn scattered() -> (usermm::Space, usize) {
    let s = space(BUDGET, 2 * PAGES, 0);
    let a = s.mmap(0, PAGES * PS, RW, ANON, -1, 0).unwrap();
    fill(a, 0..PAGES, 1);
    for p in scrambled(PAGES) {
        poke(a + p * PS, tag_of(p, 2));
        poke(a + p * PS + PS - 1, tag_of(p, 2));
    }
    (s, a)
}

fn walk(forwards: bool) {
    let (s, a) = scattered();
    let before = s.stats();
    assert!(before.swapped_pages as usize > PAGES / 2, "{before:?}");
    let order: Vec<usize> = if forwards { (0..PAGES).collect() } else { (0..PAGES).rev().collect() };
    for &p in &order {
        expect(a, p, 2);
    }
    let after = s.stats();
    let ahead = after.swap_ahead_pages - before.swap_ahead_pages;
    let faults = after.major_faults - before.major_faults;
    let swapped = before.swapped_pages;
    eprintln!("forwards {forwards}: {swapped} swapped pages, {faults} major faults, {ahead} pages read ahead");
    assert!(ahead >= swapped / 2, "read ahead {ahead} of {swapped} swapped pages: {after:?}");
    assert!(faults <= swapped / 4, "{faults} major faults for {swapped} swapped pages: {after:?}");
    // Whatever was read ahead is what the pages hold, again.
    for &p in &order {
        expect(a, p, 2);
    }
}

#[test]
fn a_forward_walk_over_scattered_swap_reads_ahead() {
    walk(true);
}

#[test]
fn a_backward_walk_over_scattered_swap_reads_ahead() {
    walk(false);
}

#[test]
fn random_touches_read_nothing_ahead() {
    let (s, a) = scattered();
    let before = s.stats();
    for p in scrambled(PAGES).into_iter().rev() {
        expect(a, p, 2);
    }
    let after = s.stats();
    let ahead = after.swap_ahead_pages - before.swap_ahead_pages;
    let swapins = after.swapins - before.swapins;
    eprintln!("random: {swapins} pages swapped in, {ahead} read ahead");
    assert!(swapins > 0 && ahead * 20 <= swapins, "read ahead {ahead} of {swapins} swapped in: {after:?}");
}
