//! Region-tree tests, drawn in ASCII the way the kernel's `tools/testing/vma`
//! tests are: one character per page, `.` unmapped, a letter per region.
//! Every errno is Linux's (x86-64, measured on the 6.18 host where the
//! contract does not say otherwise).

mod common;

use common::*;
use usermm_core::consts::*;
use usermm_core::region::Advice;
use usermm_core::{Core, CoreConfig, Errno, MmapReply, PageIdx};

fn prot_at(c: &Core, p: u64) -> i32 {
    c.regions().find(PageIdx(p)).expect("mapped").prot()
}

fn advice_at(c: &Core, p: u64) -> Advice {
    c.regions().find(PageIdx(p)).expect("mapped").advice()
}

fn regions(c: &Core) -> u64 {
    c.stats().regions
}

fn with_max_regions(n: usize) -> Core {
    Core::new(CoreConfig { max_regions: n, ..cfg() })
}

#[test]
fn map_split_and_merge_back() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    assert_eq!(draw(&c, 0, 16), "AAAAAAAA........");
    assert_eq!(regions(&c), 1);

    mprotect(&mut c, at(2), pages(2), PROT_READ).unwrap();
    assert_eq!(draw(&c, 0, 16), "AABBCCCC........");
    assert_eq!(regions(&c), 3);
    assert_eq!(prot_at(&c, 1), RW);
    assert_eq!(prot_at(&c, 2), PROT_READ);
    assert_eq!(prot_at(&c, 4), RW);

    mprotect(&mut c, at(2), pages(2), RW).unwrap();
    assert_eq!(draw(&c, 0, 16), "AAAAAAAA........");
    assert_eq!(regions(&c), 1);
}

#[test]
fn mprotect_at_the_edges_splits_once() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    mprotect(&mut c, at(0), pages(3), PROT_NONE).unwrap();
    assert_eq!(draw(&c, 0, 10), "AAABBBBB..");
    mprotect(&mut c, at(6), pages(2), PROT_NONE).unwrap();
    assert_eq!(draw(&c, 0, 10), "AAABBBCC..");
    // Changing the middle to the same protection merges all three.
    mprotect(&mut c, at(3), pages(3), PROT_NONE).unwrap();
    assert_eq!(draw(&c, 0, 10), "AAAAAAAA..");
    assert_eq!(prot_at(&c, 5), PROT_NONE);
    assert_eq!(regions(&c), 1);
}

#[test]
fn adjacent_maps_merge_unless_they_differ() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    map_at(&mut c, 4, 4);
    assert_eq!(draw(&c, 0, 12), "AAAAAAAA....");
    assert_eq!(regions(&c), 1);
    mmap(&mut c, at(8), pages(2), PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 12), "AAAAAAAABB..");
    // Shared anonymous regions are distinct objects: never merged.
    mmap(&mut c, at(10), pages(1), RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED).unwrap();
    mmap(&mut c, at(11), pages(1), RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 12), "AAAAAAAABBCD");
    assert_eq!(regions(&c), 4);
}

#[test]
fn munmap_middle_edges_and_across_holes() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    munmap(&mut c, at(3), pages(2)).unwrap();
    assert_eq!(draw(&c, 0, 10), "AAA..BBB..");
    assert_eq!(regions(&c), 2);
    // Across the hole: unmapped pages in the range are fine.
    munmap(&mut c, at(2), pages(4)).unwrap();
    assert_eq!(draw(&c, 0, 10), "AA....BB..");
    // The head, then a length that is not a page multiple (rounded up).
    munmap(&mut c, at(0), 1).unwrap();
    assert_eq!(draw(&c, 0, 10), ".A....BB..");
    // Nothing mapped there: success, nothing changes.
    munmap(&mut c, at(20), pages(4)).unwrap();
    assert_eq!(c.munmap(at(20), pages(4)), Ok(None));
    munmap(&mut c, at(0), pages(10)).unwrap();
    assert_eq!(draw(&c, 0, 10), "..........");
    assert_eq!(regions(&c), 0);
}

#[test]
fn munmap_drops_pages_and_frees_frames_and_slots() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    for p in 0..8 {
        assert!(matches!(touch(&mut c, p, true), Touch::Served(_)));
    }
    // Park pages 0..2 in staging and push page 2 to swap.
    madvise(&mut c, at(0), pages(2), MADV_COLD).unwrap();
    madvise(&mut c, at(2), pages(1), MADV_PAGEOUT).unwrap();
    assert_eq!(draw_pages(&c, 0, 10), "IISRRRRR..");
    assert_eq!(c.stats().resident_pages, 7);
    assert_eq!(c.stats().swapped_pages, 1);
    munmap(&mut c, at(1), pages(6)).unwrap();
    assert_eq!(draw(&c, 0, 10), "A......B..");
    assert_eq!(draw_pages(&c, 0, 10), "I......R..");
    let s = c.stats();
    assert_eq!(s.resident_pages, 2);
    assert_eq!(s.inactive_pages, 1);
    assert_eq!(s.swapped_pages, 0);
}

#[test]
fn map_fixed_replaces_part_of_a_region() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    for p in 0..8 {
        touch(&mut c, p, true);
    }
    assert_eq!(draw_pages(&c, 0, 8), "RRRRRRRR");
    mmap(&mut c, at(2), pages(3), PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 10), "AABBBCCC..");
    // The replaced pages are gone (they read as zeros in the new region).
    assert_eq!(draw_pages(&c, 0, 10), "RR___RRR..");
    assert_eq!(c.stats().resident_pages, 5);

    // The same protection over the rest: one region again, pages dropped.
    mmap(&mut c, at(0), pages(2), PROT_READ, ANON | MAP_FIXED).unwrap();
    mmap(&mut c, at(5), pages(5), PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 12), "AAAAAAAAAA..");
    assert_eq!(draw_pages(&c, 0, 12), "__________..");
    assert_eq!(c.stats().resident_pages, 0);
}

#[test]
fn map_fixed_noreplace() {
    let mut c = core();
    map_at(&mut c, 4, 4);
    let nr = ANON | MAP_FIXED_NOREPLACE;
    assert_eq!(c.mmap(at(6), pages(1), RW, nr).err(), Some(Errno::EEXIST));
    assert_eq!(c.mmap(at(2), pages(3), RW, nr).err(), Some(Errno::EEXIST));
    assert_eq!(c.mmap(at(7), pages(4), RW, nr).err(), Some(Errno::EEXIST));
    assert_eq!(draw(&c, 0, 10), "....AAAA..");
    // Right next to it is free (and merges).
    let a = mmap(&mut c, at(8), pages(2), RW, nr).unwrap();
    assert_eq!(a, at(8));
    assert_eq!(draw(&c, 0, 12), "....AAAAAA..");
}

#[test]
fn map_fixed_noreplace_over_a_range_being_unmapped_is_eexist() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let d = c.munmap(at(0), pages(4)).unwrap().expect("detached");
    c.validate();
    assert_eq!(draw(&c, 0, 6), "......");
    assert_eq!(c.mmap(at(1), pages(1), RW, ANON | MAP_FIXED_NOREPLACE).err(), Some(Errno::EEXIST));
    // MAP_FIXED waits for the zap; a non-fixed mmap avoids the held range.
    assert!(matches!(c.mmap(at(1), pages(1), RW, ANON | MAP_FIXED), Ok(MmapReply::Busy)));
    let a = mmap(&mut c, 0, pages(2), RW, ANON).unwrap();
    assert_eq!(a, at(4));
    for r in &d.ranges {
        zap(&mut c, *r);
    }
    c.unhold(&d);
    c.validate();
    let a = mmap(&mut c, 0, pages(2), RW, ANON).unwrap();
    assert_eq!(a, at(0));
}

#[test]
fn non_fixed_mmap_takes_the_hint_or_the_lowest_gap() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    map_at(&mut c, 6, 2);
    assert_eq!(mmap(&mut c, 0, pages(3), PROT_READ, ANON), Ok(at(8)));
    assert_eq!(mmap(&mut c, 0, pages(2), PROT_READ, ANON), Ok(at(4)));
    assert_eq!(draw(&c, 0, 12), "AAAABBCCDDD.");
    // A free hint is used; an unaligned one is rounded down (x86-64 Linux).
    assert_eq!(mmap(&mut c, at(20), pages(1), RW, ANON), Ok(at(20)));
    assert_eq!(mmap(&mut c, at(30) - 5, pages(1), RW, ANON), Ok(at(29)));
    // A hint over a mapping falls back to the lowest gap.
    assert_eq!(mmap(&mut c, at(0), pages(1), RW, ANON), Ok(at(11)));
    // A hint outside the reservation falls back too.
    assert_eq!(mmap(&mut c, 0x1000, pages(1), RW, ANON), Ok(at(12)));
    assert_eq!(draw(&c, 0, 14), "AAAABBCCDDDEE.");
}

#[test]
fn non_fixed_mmap_with_no_gap_is_enomem() {
    let mut c = core();
    map_at(&mut c, 0, 1000);
    assert_eq!(c.mmap(0, pages(25), RW, ANON).err(), Some(Errno::ENOMEM));
    assert_eq!(mmap(&mut c, 0, pages(24), RW, ANON), Ok(at(1000)));
    assert_eq!(c.mmap(0, pages(1), RW, ANON).err(), Some(Errno::ENOMEM));
    c.validate();
}

#[test]
fn max_regions_limits_mmap_munmap_mprotect_and_madvise() {
    let mut c = with_max_regions(3);
    map_at(&mut c, 0, 4);
    mmap(&mut c, at(5), pages(2), PROT_READ, ANON | MAP_FIXED).unwrap();
    map_at(&mut c, 8, 4);
    assert_eq!(draw(&c, 0, 14), "AAAA.BB.CCCC..");
    assert_eq!(regions(&c), 3);

    // A fourth region: ENOMEM, nothing changes.
    assert_eq!(c.mmap(at(13), pages(1), RW, ANON | MAP_FIXED).err(), Some(Errno::ENOMEM));
    // (The lowest gap is page 4; PROT_NONE merges with neither side.)
    assert_eq!(c.mmap(0, pages(1), PROT_NONE, ANON).err(), Some(Errno::ENOMEM));
    c.validate();
    // One that merges with a neighbour costs nothing.
    map_at(&mut c, 12, 1);
    assert_eq!(draw(&c, 0, 14), "AAAA.BB.CCCCC.");
    // One that fills a hole and merges on both sides removes a region.
    mmap(&mut c, at(7), pages(1), PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 14), "AAAA.BBBCCCCC.");
    munmap(&mut c, at(7), pages(1)).unwrap();
    assert_eq!(draw(&c, 0, 14), "AAAA.BB.CCCCC.");

    // munmap of the middle of a region needs a split: ENOMEM.
    assert_eq!(munmap(&mut c, at(1), pages(2)), Err(Errno::ENOMEM));
    // Its head or tail, or a whole region, needs none.
    munmap(&mut c, at(0), pages(1)).unwrap();
    munmap(&mut c, at(12), pages(1)).unwrap();
    assert_eq!(draw(&c, 0, 14), ".AAA.BB.CCCC..");

    // mprotect and madvise splits: ENOMEM, nothing changed.
    assert_eq!(mprotect(&mut c, at(9), pages(2), PROT_READ), Err(Errno::ENOMEM));
    assert!(madvise(&mut c, at(9), pages(2), MADV_RANDOM).is_err());
    assert_eq!(mprotect(&mut c, at(1), pages(1), PROT_READ), Err(Errno::ENOMEM));
    assert_eq!(draw(&c, 0, 14), ".AAA.BB.CCCC..");
    assert_eq!(prot_at(&c, 9), RW);
    assert_eq!(prot_at(&c, 1), RW);
    assert_eq!(advice_at(&c, 9), Advice::Normal);
    // A change of a whole region needs no split.
    mprotect(&mut c, at(8), pages(4), PROT_READ).unwrap();
    madvise(&mut c, at(1), pages(3), MADV_RANDOM).unwrap();
    assert_eq!(draw(&c, 0, 14), ".AAA.BB.CCCC..");
    assert_eq!(prot_at(&c, 9), PROT_READ);
    assert_eq!(advice_at(&c, 2), Advice::Random);
    // With one region fewer, one split goes through, but not two.
    munmap(&mut c, at(5), pages(2)).unwrap();
    assert_eq!(mprotect(&mut c, at(9), pages(2), RW), Err(Errno::ENOMEM));
    assert_eq!(draw(&c, 0, 14), ".AAA....BBBB..");
    mprotect(&mut c, at(8), pages(2), RW).unwrap();
    assert_eq!(draw(&c, 0, 14), ".AAA....BBCC..");
}

/// Measured on the host (Linux 6.18, at vm.max_map_count): a madvise that
/// needs a split beyond the limit fails with `EAGAIN` (madvise reserves
/// `ENOMEM` for unmapped ranges and turns the split's ENOMEM into EAGAIN).
#[test]
fn madvise_split_beyond_the_limit_is_eagain() {
    let mut c = with_max_regions(1);
    map_at(&mut c, 0, 8);
    assert_eq!(madvise(&mut c, at(2), pages(2), MADV_RANDOM), Err(Errno::EAGAIN));
    assert_eq!(madvise(&mut c, at(0), pages(2), MADV_SEQUENTIAL), Err(Errno::EAGAIN));
    assert_eq!(draw(&c, 0, 8), "AAAAAAAA");
    assert_eq!(advice_at(&c, 0), Advice::Normal);
}

/// Measured on the host (Linux 6.18, at vm.max_map_count): an mprotect whose
/// changed part merges into the neighbour region needs no new region and
/// succeeds at the limit (`vma_modify` adjusts the boundary, no split).
#[test]
fn mprotect_that_merges_into_the_neighbour_succeeds_at_the_limit() {
    let mut c = with_max_regions(2);
    map_at(&mut c, 0, 4);
    mmap(&mut c, at(4), pages(4), PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(draw(&c, 0, 8), "AAAABBBB");
    assert_eq!(mprotect(&mut c, at(4), pages(2), RW), Ok(()));
    assert_eq!(draw(&c, 0, 8), "AAAAAABB");
    // The tail of A back to read-only merges into B.
    assert_eq!(mprotect(&mut c, at(4), pages(2), PROT_READ), Ok(()));
    assert_eq!(draw(&c, 0, 8), "AAAABBBB");
    assert_eq!(prot_at(&c, 4), PROT_READ);
}

#[test]
fn madvise_random_on_a_subrange_splits_and_normal_merges() {
    let mut c = core();
    map_at(&mut c, 0, 8);
    madvise(&mut c, at(2), pages(2), MADV_RANDOM).unwrap();
    assert_eq!(draw(&c, 0, 10), "AABBCCCC..");
    assert_eq!(advice_at(&c, 2), Advice::Random);
    assert_eq!(advice_at(&c, 4), Advice::Normal);
    madvise(&mut c, at(3), pages(3), MADV_SEQUENTIAL).unwrap();
    assert_eq!(draw(&c, 0, 10), "AABCCCDD..");
    assert_eq!(advice_at(&c, 3), Advice::Sequential);
    madvise(&mut c, at(0), pages(8), MADV_NORMAL).unwrap();
    assert_eq!(draw(&c, 0, 10), "AAAAAAAA..");
    // Page advice (COLD, WILLNEED, DONTNEED) never splits.
    madvise(&mut c, at(2), pages(2), MADV_COLD).unwrap();
    madvise(&mut c, at(2), pages(2), MADV_DONTNEED).unwrap();
    madvise(&mut c, at(2), pages(2), MADV_WILLNEED).unwrap();
    assert_eq!(regions(&c), 1);
}

#[test]
fn mprotect_over_a_hole_applies_the_prefix_then_enomem() {
    let mut c = core();
    map_at(&mut c, 0, 2);
    map_at(&mut c, 4, 2);
    assert_eq!(draw(&c, 0, 8), "AA..BB..");
    // Linux changes the regions before the hole, then fails.
    assert_eq!(mprotect(&mut c, at(0), pages(6), PROT_READ), Err(Errno::ENOMEM));
    assert_eq!(prot_at(&c, 0), PROT_READ);
    assert_eq!(prot_at(&c, 1), PROT_READ);
    assert_eq!(prot_at(&c, 4), RW);
    // A range that starts in a hole changes nothing.
    assert_eq!(mprotect(&mut c, at(3), pages(3), PROT_NONE), Err(Errno::ENOMEM));
    assert_eq!(prot_at(&c, 4), RW);
    // Split before the hole: the part up to the hole changes.
    map_at(&mut c, 2, 2);
    assert_eq!(draw(&c, 0, 8), "AABBBB..");
    assert_eq!(mprotect(&mut c, at(1), pages(6), PROT_NONE), Err(Errno::ENOMEM));
    assert_eq!(draw(&c, 0, 8), "ABBBBB..");
    assert_eq!(prot_at(&c, 0), PROT_READ);
    assert_eq!(prot_at(&c, 1), PROT_NONE);
    assert_eq!(prot_at(&c, 5), PROT_NONE);
    // The returned segments are exactly the changed ranges.
    let (segs, r) = c.mprotect(at(0), pages(8), RW);
    assert_eq!(r, Err(Errno::ENOMEM));
    assert_eq!(segs, vec![usermm_core::PageRange::new(0, 1), usermm_core::PageRange::new(1, 6)]);
    c.validate();
    assert_eq!(draw(&c, 0, 8), "AAAAAA..");
}

#[test]
fn madvise_dontneed_over_a_hole_drops_both_sides_then_enomem() {
    let mut c = core();
    map_at(&mut c, 0, 2);
    map_at(&mut c, 4, 2);
    for p in [0, 1, 4, 5] {
        touch(&mut c, p, true);
    }
    assert_eq!(draw_pages(&c, 0, 8), "RR..RR..");
    assert_eq!(madvise(&mut c, at(0), pages(6), MADV_DONTNEED), Err(Errno::ENOMEM));
    assert_eq!(draw_pages(&c, 0, 8), "__..__..");
    assert_eq!(c.stats().resident_pages, 0);
    // A range starting in the hole still advises what is mapped.
    for p in [4, 5] {
        touch(&mut c, p, true);
    }
    assert_eq!(madvise(&mut c, at(3), pages(3), MADV_DONTNEED), Err(Errno::ENOMEM));
    assert_eq!(draw_pages(&c, 0, 8), "__..__..");
    // Nothing mapped at all: ENOMEM.
    assert_eq!(madvise(&mut c, at(10), pages(3), MADV_DONTNEED), Err(Errno::ENOMEM));
}

#[test]
fn madvise_random_over_a_hole_applies_to_every_mapped_part() {
    let mut c = core();
    map_at(&mut c, 0, 2);
    map_at(&mut c, 4, 4);
    assert_eq!(madvise(&mut c, at(1), pages(5), MADV_RANDOM), Err(Errno::ENOMEM));
    assert_eq!(draw(&c, 0, 8), "AB..CCDD");
    assert_eq!(advice_at(&c, 0), Advice::Normal);
    assert_eq!(advice_at(&c, 1), Advice::Random);
    assert_eq!(advice_at(&c, 4), Advice::Random);
    assert_eq!(advice_at(&c, 6), Advice::Normal);
}

#[test]
fn madvise_dontneed_on_shared_anonymous_keeps_the_data() {
    let mut c = core();
    mmap(&mut c, at(0), pages(2), RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED).unwrap();
    touch(&mut c, 0, true);
    madvise(&mut c, at(0), pages(2), MADV_DONTNEED).unwrap();
    assert_eq!(draw_pages(&c, 0, 2), "R_");
}

// ----------------------------------------------------------------------
// errno tables

/// (what, addr, len, prot or advice, expected result)
type RangeCase = (&'static str, u64, u64, i32, Result<(), Errno>);

const TOP: u64 = BASE + 1024 * PS;

#[test]
fn mmap_errno_table() {
    let mut c = core();
    let cases: &[(&str, u64, u64, i32, i32, Errno)] = &[
        ("len 0", 0, 0, RW, ANON, Errno::EINVAL),
        ("len 0 fixed", at(0), 0, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("no type", 0, PS, RW, MAP_ANONYMOUS, Errno::EINVAL),
        ("type 0xf", 0, PS, RW, MAP_ANONYMOUS | 0xf, Errno::EINVAL),
        ("fixed unaligned", at(0) + 1, PS, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("noreplace unaligned", at(0) + 8, PS, RW, ANON | MAP_FIXED_NOREPLACE, Errno::EINVAL),
        ("len overflow", 0, u64::MAX, RW, ANON, Errno::ENOMEM),
        ("len -2 pages", 0, u64::MAX - 2 * PS + 1, RW, ANON, Errno::ENOMEM),
        ("larger than the reservation", 0, pages(1025), RW, ANON, Errno::ENOMEM),
        // Outside the reservation: EINVAL for MAP_FIXED (SPEC §3).
        ("fixed below", BASE - PS, PS, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("fixed straddling base", BASE - PS, 2 * PS, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("fixed above", TOP, PS, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("fixed straddling top", TOP - PS, 2 * PS, RW, ANON | MAP_FIXED, Errno::EINVAL),
        ("noreplace above", TOP, PS, RW, ANON | MAP_FIXED_NOREPLACE, Errno::EINVAL),
        // A validated flag set with a bit Linux does not know, on a file
        // mapping (the descriptor has been checked): EOPNOTSUPP.
        ("validate unknown (file)", 0, PS, RW, MAP_SHARED_VALIDATE | 0x40_0000, Errno::EOPNOTSUPP),
    ];
    for &(what, addr, len, prot, flags, e) in cases {
        assert_eq!(c.mmap(addr, len, prot, flags).err(), Some(e), "{what}");
        c.validate();
    }
    assert_eq!(regions(&c), 0);
    // Unknown bits are ignored without MAP_SHARED_VALIDATE (Linux).
    assert!(mmap(&mut c, 0, PS, RW, ANON | 0x40_0000).is_ok());
    // The edges of the reservation are fine.
    assert_eq!(mmap(&mut c, TOP - PS, PS, RW, ANON | MAP_FIXED), Ok(TOP - PS));
    assert_eq!(mmap(&mut c, BASE, PS, RW, ANON | MAP_FIXED_NOREPLACE), Err(Errno::EEXIST));
}

/// Measured on the host (Linux 6.18): an anonymous mapping accepts only
/// `MAP_SHARED`, `MAP_PRIVATE` (and `MAP_DROPPABLE`) as its type, so
/// `MAP_SHARED_VALIDATE | MAP_ANONYMOUS` is `EINVAL`, with or without unknown
/// flags. `EOPNOTSUPP` is the answer for file mappings only.
#[test]
fn mmap_shared_validate_anonymous_is_einval_as_on_linux() {
    let mut c = core();
    let sv = MAP_SHARED_VALIDATE | MAP_ANONYMOUS;
    assert_eq!(c.mmap(0, PS, RW, sv).err(), Some(Errno::EINVAL));
    assert_eq!(c.mmap(0, PS, RW, sv | 0x40_0000).err(), Some(Errno::EINVAL));
    assert_eq!(c.mmap(0, PS, RW, sv | MAP_FIXED_NOREPLACE).err(), Some(Errno::EINVAL));
    c.validate();
}

#[test]
fn munmap_errno_table() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let cases: &[(&str, u64, u64, Errno)] = &[
        ("unaligned", at(0) + 1, PS, Errno::EINVAL),
        ("len 0", at(0), 0, Errno::EINVAL),
        ("len 0 unmapped", at(100), 0, Errno::EINVAL),
        ("overflow", at(0), u64::MAX, Errno::EINVAL),
        ("overflow -1 page", at(0), u64::MAX - PS + 1, Errno::EINVAL),
        ("below", BASE - PS, PS, Errno::EINVAL),
        ("straddling base", BASE - PS, 2 * PS, Errno::EINVAL),
        ("above", TOP, PS, Errno::EINVAL),
        ("straddling top", TOP - PS, 2 * PS, Errno::EINVAL),
        ("beyond TASK_SIZE", 0x8000_0000_0000, PS, Errno::EINVAL),
    ];
    for &(what, addr, len, e) in cases {
        assert_eq!(munmap(&mut c, addr, len), Err(e), "{what}");
    }
    assert_eq!(draw(&c, 0, 6), "AAAA..");
}

#[test]
fn mprotect_errno_table() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let cases: &[RangeCase] = &[
        ("unaligned", at(0) + 1, PS, PROT_READ, Err(Errno::EINVAL)),
        ("unaligned len 0", at(0) + 1, 0, PROT_READ, Err(Errno::EINVAL)),
        ("len 0", at(0), 0, PROT_READ, Ok(())),
        ("len 0 unmapped", at(100), 0, PROT_READ, Ok(())),
        ("len 0 bad prot", at(0), 0, 0x10, Ok(())),
        ("overflow", at(0), u64::MAX, PROT_READ, Err(Errno::ENOMEM)),
        ("overflow -1 page", at(0), u64::MAX - PS + 1, PROT_READ, Err(Errno::ENOMEM)),
        ("overflow bad prot", at(0), u64::MAX, 0x10, Err(Errno::ENOMEM)),
        ("bad prot", at(0), PS, 0x10, Err(Errno::EINVAL)),
        ("growsdown", at(0), PS, PROT_READ | 0x0100_0000, Err(Errno::EINVAL)),
        ("unmapped", at(10), PS, PROT_READ, Err(Errno::ENOMEM)),
        ("below", BASE - PS, PS, PROT_READ, Err(Errno::ENOMEM)),
        ("above", TOP, PS, PROT_READ, Err(Errno::ENOMEM)),
        ("beyond TASK_SIZE", 0x8000_0000_0000, PS, PROT_READ, Err(Errno::ENOMEM)),
        ("past the end", at(2), pages(4), PROT_NONE, Err(Errno::ENOMEM)),
    ];
    for &(what, addr, len, prot, e) in cases {
        assert_eq!(mprotect(&mut c, addr, len, prot), e, "{what}");
    }
    // Only the last case changed anything: the mapped prefix.
    assert_eq!(draw(&c, 0, 6), "AABB..");
    assert_eq!(prot_at(&c, 2), PROT_NONE);
    // A length that is not a page multiple is rounded up.
    mprotect(&mut c, at(0), 1, PROT_READ).unwrap();
    assert_eq!(draw(&c, 0, 6), "ABCC..");
    // PROT_SEM is accepted and ignored.
    mprotect(&mut c, at(0), PS, PROT_READ | 0x8).unwrap();
    assert_eq!(prot_at(&c, 0), PROT_READ);
}

#[test]
fn mprotect_straddling_the_top_of_the_reservation_applies_the_prefix() {
    let mut c = core();
    map_at(&mut c, 1020, 4);
    assert_eq!(mprotect(&mut c, at(1022), pages(4), PROT_READ), Err(Errno::ENOMEM));
    assert_eq!(draw(&c, 1018, 1024), "..AABB");
    assert_eq!(prot_at(&c, 1023), PROT_READ);
}

#[test]
fn madvise_errno_table() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    let cases: &[RangeCase] = &[
        ("unknown advice", at(0), PS, 77, Err(Errno::EINVAL)),
        ("unknown advice, len 0", at(0), 0, 77, Err(Errno::EINVAL)),
        ("unknown advice, unaligned", at(0) + 1, PS, 77, Err(Errno::EINVAL)),
        ("unaligned", at(0) + 1, PS, MADV_DONTNEED, Err(Errno::EINVAL)),
        ("unaligned len 0", at(0) + 1, 0, MADV_DONTNEED, Err(Errno::EINVAL)),
        ("len 0", at(0), 0, MADV_DONTNEED, Ok(())),
        ("len 0 unmapped", at(100), 0, MADV_RANDOM, Ok(())),
        ("overflow", at(0), u64::MAX, MADV_DONTNEED, Err(Errno::EINVAL)),
        ("overflow -1 page", at(0), u64::MAX - PS + 1, MADV_DONTNEED, Err(Errno::EINVAL)),
        ("unmapped", at(10), PS, MADV_DONTNEED, Err(Errno::ENOMEM)),
        ("below", BASE - PS, PS, MADV_WILLNEED, Err(Errno::ENOMEM)),
        ("above", TOP, PS, MADV_COLD, Err(Errno::ENOMEM)),
        ("beyond TASK_SIZE", 0x8000_0000_0000, PS, MADV_NORMAL, Err(Errno::ENOMEM)),
        ("past the end", at(2), pages(4), MADV_SEQUENTIAL, Err(Errno::ENOMEM)),
        ("whole", at(0), pages(4), MADV_PAGEOUT, Ok(())),
        ("rounded up", at(0), 1, MADV_WILLNEED, Ok(())),
    ];
    for &(what, addr, len, advice, e) in cases {
        assert_eq!(madvise(&mut c, addr, len, advice), e, "{what}");
    }
    assert_eq!(draw(&c, 0, 6), "AABB..");
    assert_eq!(advice_at(&c, 2), Advice::Sequential);
}

#[test]
fn mincore_errno_table_and_values() {
    let mut c = core();
    map_at(&mut c, 0, 4);
    map_at(&mut c, 5, 1);
    touch(&mut c, 1, false);
    touch(&mut c, 3, true);
    let mut v = [9u8; 8];
    assert_eq!(c.mincore(at(0), pages(4), &mut v), Ok(()));
    assert_eq!(&v[..4], &[0, 1, 0, 1]);
    assert_eq!(c.mincore(at(0) + 1, PS, &mut v), Err(Errno::EINVAL));
    assert_eq!(c.mincore(at(10), 0, &mut v), Ok(()));
    assert_eq!(c.mincore(at(0), pages(6), &mut v), Err(Errno::ENOMEM));
    assert_eq!(c.mincore(at(4), PS, &mut v), Err(Errno::ENOMEM));
    assert_eq!(c.mincore(TOP, PS, &mut v), Err(Errno::ENOMEM));
    assert_eq!(c.mincore(BASE - PS, pages(2), &mut v), Err(Errno::ENOMEM));
    assert_eq!(c.mincore(0x8000_0000_0000, PS, &mut v), Err(Errno::ENOMEM));
    assert_eq!(c.mincore(at(5), 1, &mut v), Ok(()));
    assert_eq!(v[0], 0);
}

/// A `madvise` that fails part way (Linux: at the first region the advice
/// does not apply to) leaves the regions it changed before merged with
/// their neighbours, as Linux's VMAs are merged as each one is changed.
#[test]
fn a_fork_advice_that_fails_part_way_leaves_the_changed_regions_merged() {
    let mut c = core();
    map_at(&mut c, 0, 20);
    mmap(&mut c, at(20), pages(10), RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED).unwrap();
    madvise(&mut c, at(0), pages(10), MADV_WIPEONFORK).unwrap();
    assert_eq!(draw(&c, 0, 32), "AAAAAAAAAABBBBBBBBBBCCCCCCCCCC..");
    // The private part after the first region takes the advice, then the
    // shared region refuses it.
    assert_eq!(madvise(&mut c, at(10), pages(20), MADV_WIPEONFORK), Err(Errno::EINVAL));
    assert_eq!(draw(&c, 0, 32), "AAAAAAAAAAAAAAAAAAAABBBBBBBBBB..");
    assert_eq!(regions(&c), 2);
    c.validate();
    // The same with an advice that splits: a region in the middle.
    madvise(&mut c, at(5), pages(20), MADV_KEEPONFORK).unwrap();
    madvise(&mut c, at(0), pages(5), MADV_WIPEONFORK).unwrap();
    assert_eq!(draw(&c, 0, 32), "AAAAABBBBBBBBBBBBBBBCCCCCCCCCC..");
    assert_eq!(madvise(&mut c, at(5), pages(20), MADV_WIPEONFORK), Err(Errno::EINVAL));
    assert_eq!(draw(&c, 0, 32), "AAAAAAAAAAAAAAAAAAAABBBBBBBBBB..");
    c.validate();
}

/// A fork hands each shared region to the host (`hand_to_host`): the core
/// says where each page's bytes are (resident here), keeps the region's
/// attributes and no page, wakes a fault there (the host serves it),
/// refuses `MADV_FREE`, `MADV_WIPEONFORK` and `mvolatile` as shmem's, and
/// passes page advice to the host; a private neighbour is left alone, and
/// the space can be copied.
#[test]
fn a_shared_region_handed_to_the_host_keeps_its_attributes_and_no_page() {
    use usermm_core::{AdviceOp, FaultPlan, HandSrc};
    let mut c = core();
    map_at(&mut c, 0, 8);
    mmap(&mut c, at(8), pages(8), RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED).unwrap();
    for p in [1, 9, 10] {
        touch(&mut c, p, true);
    }
    assert_eq!(c.fork_blocker(), Some("a MAP_SHARED anonymous region"));
    let shared = c.shared_to_hand_over();
    assert_eq!(shared, vec![usermm_core::PageRange::new(8, 16)]);
    let srcs = c.hand_over_sources(shared[0]).unwrap();
    assert_eq!(srcs, vec![(PageIdx(9), HandSrc::Mapped), (PageIdx(10), HandSrc::Mapped)]);
    zap(&mut c, shared[0]);
    c.hand_to_host(shared[0]);
    c.validate();
    assert_eq!(c.fork_blocker(), None);
    assert!(c.shared_to_hand_over().is_empty());
    assert_eq!(draw(&c, 0, 17), "AAAAAAAABBBBBBBB.");
    assert!(c.regions().find(PageIdx(12)).unwrap().host());
    assert_eq!(c.stats().resident_pages, 1, "the private page only");
    assert_eq!(c.fault(usermm_core::Addr(at(12)), true), FaultPlan::Wake);
    assert_eq!(madvise(&mut c, at(8), pages(8), MADV_FREE), Err(Errno::EINVAL));
    assert_eq!(madvise(&mut c, at(8), pages(8), MADV_WIPEONFORK), Err(Errno::EINVAL));
    assert_eq!(c.mvolatile(at(8), pages(2)).1, Err(Errno::EINVAL));
    let (ops, r) = c.madvise(at(8), pages(4), MADV_REMOVE);
    assert_eq!(r, Ok(()));
    assert!(matches!(ops[..], [AdviceOp::Host(_, MADV_REMOVE)]), "{ops:?}");
    // Attributes still change (and split) as for any region.
    madvise(&mut c, at(12), pages(4), MADV_DONTFORK).unwrap();
    assert_eq!(draw(&c, 0, 17), "AAAAAAAABBBBCCCC.");
    assert!(c.regions().find(PageIdx(14)).unwrap().host());
    c.validate();
}
