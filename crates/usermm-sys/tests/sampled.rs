//! `usermm_sys::sampled` on the real kernel: a memfd mapped shared over a
//! reservation and registered MISSING|WP, whose pages are filled, zapped,
//! scanned, protected, read and punched, with the userfaultfd watched from
//! this thread while a second one touches the pages (a touch that raises a
//! message waits until it is served, so the toucher must never be the
//! thread that serves).
//!
//! Pages of a fixture, drawn as the tests use them:
//!
//! ```text
//!   base  0    1    2    3   ...
//!         [ P0 ][ P1 ][ P2 ][ P3 ]     the SampledMap, PAGE bytes each
//! ```
//!
//! They need a userfaultfd that handles faults from inside the kernel too
//! (`/dev/userfaultfd` or `userfaultfd(2)` without `UFFD_USER_MODE_ONLY`),
//! and fail loudly without one.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use usermm_sys::sampled::{SampledMap, PAGE};
use usermm_sys::uffd::{poll2, Uffd, UffdMsg, UFFD_EVENT_PAGEFAULT, UFFD_PAGEFAULT_FLAG_WP, UFFD_PAGEFAULT_FLAG_WRITE};
use usermm_sys::{mem, now_ns, Errno};

/// How long a touching thread may wait before the test fails.
const STUCK_AFTER: Duration = Duration::from_secs(5);

fn open_uffd() -> Uffd {
    match Uffd::open(true, false, false) {
        Ok(u) => u,
        Err(e) => {
            let why = format!(
                "\n\n*** cannot open a userfaultfd with kernel faults handled: {e} ***\n\
                 *** these tests need /dev/userfaultfd (read-write access) or userfaultfd(2)  ***\n\
                 *** with vm.unprivileged_userfaultfd=1 or CAP_SYS_PTRACE; run them as root.  ***\n"
            );
            eprintln!("{why}");
            panic!("{why}");
        }
    }
}

/// A reservation of `pages` pages with a [`SampledMap`] over all of it.
struct Fixture {
    uffd: Uffd,
    map: SampledMap,
    base: usize,
    pages: usize,
}

impl Fixture {
    fn new(pages: usize) -> Fixture {
        let uffd = open_uffd();
        let base = mem::reserve(pages * PAGE, PAGE).expect("reserve");
        // SAFETY: the reservation was just made for this fixture, which
        // alone uses it, and only through raw addresses.
        let map = unsafe { SampledMap::new(&uffd, base, pages * PAGE) }.expect("SampledMap::new");
        assert_eq!((map.addr(), map.len_bytes()), (base, pages * PAGE));
        Fixture { uffd, map, base, pages }
    }

    /// The address of page `i`.
    fn page(&self, i: usize) -> usize {
        assert!(i < self.pages, "page {i} of {}", self.pages);
        self.base + i * PAGE
    }

    /// Reads byte `off` of page `i` through the mapping (a touch).
    fn read(&self, i: usize, off: usize) -> u8 {
        assert!(off < PAGE);
        // SAFETY: a byte of this fixture's map, which stays mapped while
        // the fixture lives and which no Rust reference points into.
        unsafe { ((self.page(i) + off) as *const u8).read_volatile() }
    }

    /// Writes byte `off` of page `i` through the mapping (a touch).
    fn write(&self, i: usize, off: usize, v: u8) {
        assert!(off < PAGE);
        // SAFETY: as in `read`.
        unsafe { ((self.page(i) + off) as *mut u8).write_volatile(v) }
    }

    /// Page `i`'s bytes, read through the mapping (a touch).
    fn touch_page(&self, i: usize) -> Vec<u8> {
        (0..PAGE).map(|off| self.read(i, off)).collect()
    }

    /// Page `i`'s bytes, read from the memfd (no touch).
    fn stored(&self, i: usize) -> Vec<u8> {
        let mut buf = vec![0xEE; PAGE];
        self.map.read_page(self.page(i), &mut buf).expect("read_page");
        buf
    }

    /// The present runs of pages `[first, first+n)`.
    fn present(&self, first: usize, n: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        self.map.present(self.page(first), n * PAGE, &mut out).expect("present");
        out
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: the fixture's reservation; every thread that touched it
        // has been joined.
        let _ = unsafe { mem::unmap(self.base, self.pages * PAGE) };
    }
}

/// A page's bytes, different for each `seed` and never all zero.
fn pattern(seed: u8) -> Vec<u8> {
    (0..PAGE).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// The page a fault message is about.
fn page_of(m: &UffdMsg) -> usize {
    m.address as usize & !(PAGE - 1)
}

/// Runs `work` (touches of `f`'s map) on a second thread while this one
/// watches the userfaultfd: every message goes to `serve`, which must
/// resolve it, and is returned with `work`'s result. A touching thread
/// still waiting after [`STUCK_AFTER`], or a `serve` that panics, fails the
/// test — after the map is unregistered, which wakes the waiting thread
/// (its touch then goes through as an unregistered one's).
fn watched<T: Send>(
    f: &Fixture,
    work: impl FnOnce() -> T + Send,
    mut serve: impl FnMut(&UffdMsg),
) -> (T, Vec<UffdMsg>) {
    std::thread::scope(|s| {
        let worker = s.spawn(work);
        let deadline = Instant::now() + STUCK_AFTER;
        let mut msgs = Vec::new();
        let give_up = |msgs: &[UffdMsg]| {
            let _ = f.uffd.unregister(f.base, f.pages * PAGE);
            eprintln!("messages so far: {msgs:?}");
        };
        loop {
            // After the worker is done, one last look without waiting: a
            // message it raised is queued by then.
            let finished = worker.is_finished();
            let readable = poll2(f.uffd.raw(), -1, if finished { 0 } else { 10 }).expect("poll");
            if readable {
                let mut buf = [UffdMsg::default(); 16];
                let n = match f.uffd.read_msgs(&mut buf) {
                    Ok(n) => n,
                    Err(Errno::EAGAIN) => 0,
                    Err(e) => panic!("read of the userfaultfd: {e}"),
                };
                for m in &buf[..n] {
                    msgs.push(*m);
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| serve(m))) {
                        give_up(&msgs);
                        resume_unwind(p);
                    }
                }
                continue;
            }
            if finished {
                break;
            }
            if Instant::now() > deadline {
                give_up(&msgs);
                panic!("the touching thread still waits after {STUCK_AFTER:?}");
            }
        }
        (worker.join().expect("the touching thread panicked"), msgs)
    })
}

/// [`watched`] where no touch may raise a message.
fn silent<T: Send>(f: &Fixture, work: impl FnOnce() -> T + Send) -> T {
    watched(f, work, |m| panic!("a touch raised a message: {m:?}")).0
}

/// The maximal runs of the pages `touched` says, as `(address, length)`:
/// the oracle for `present`.
fn runs_of(f: &Fixture, touched: &[bool]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == f.page(i) => last.1 += PAGE,
            _ => out.push((f.page(i), PAGE)),
        }
    }
    out
}

/// Case 1: a page's first touch raises a MISSING message (a write's says so),
/// and `fill_copy` serves it: the waiting touch sees the copied bytes.
#[test]
fn a_first_touch_is_missing_and_a_copy_fills_it() {
    let f = Fixture::new(2);
    let (p0, p1) = (pattern(1), pattern(2));
    let (v, msgs) = watched(
        &f,
        || f.read(0, 100),
        |m| {
            assert_eq!(m.event, UFFD_EVENT_PAGEFAULT);
            assert_eq!(f.map.fill_copy(&f.uffd, page_of(m), &p0, true), Ok(PAGE));
        },
    );
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(page_of(&msgs[0]), f.page(0));
    assert_eq!(msgs[0].flags & (UFFD_PAGEFAULT_FLAG_WRITE | UFFD_PAGEFAULT_FLAG_WP), 0, "{msgs:?}");
    assert_eq!(v, p0[100]);
    assert_eq!(silent(&f, || f.touch_page(0)), p0);
    assert_eq!(f.present(0, 2), [(f.page(0), PAGE)]);

    // A first write: the message says it is one, and the write lands on
    // the copied bytes once served.
    let ((), msgs) =
        watched(&f, || f.write(1, 5, 0xAB), |m| assert_eq!(f.map.fill_copy(&f.uffd, page_of(m), &p1, true), Ok(PAGE)));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(page_of(&msgs[0]), f.page(1));
    assert_ne!(msgs[0].flags & UFFD_PAGEFAULT_FLAG_WRITE, 0, "{msgs:?}");
    let mut want = p1.clone();
    want[5] = 0xAB;
    assert_eq!(f.stored(1), want);
    assert_eq!(f.present(0, 2), [(f.page(0), 2 * PAGE)]);
}

/// Case 2: a zap unmaps the pages but keeps their bytes in the memfd: a copy
/// cannot install over them, and the next touches raise no message and
/// read the same bytes.
#[test]
fn a_zap_keeps_the_bytes_and_the_next_touch_is_silent() {
    let f = Fixture::new(4);
    let pages: Vec<Vec<u8>> = (0..4).map(|i| pattern(10 + i)).collect();
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &pages.concat(), false), Ok(4 * PAGE));
    assert_eq!(f.present(0, 4), [(f.page(0), 4 * PAGE)]);

    f.map.zap(&[(f.page(0), PAGE), (f.page(1), 2 * PAGE), (f.page(3), PAGE)]).expect("zap");
    assert_eq!(f.present(0, 4), []);
    // The memfd holds the page: nothing is installed (EEXIST).
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(2), &pattern(99), false), Ok(0));

    let seen = silent(&f, || (0..4).map(|i| f.touch_page(i)).collect::<Vec<_>>());
    assert_eq!(seen, pages);
    assert_eq!(f.present(0, 4), [(f.page(0), 4 * PAGE)]);
}

/// Case 3: after every page is zapped, `present` lists exactly the touched ones
/// (read or written), as maximal runs — more of them than one
/// `PAGEMAP_SCAN` returns — and leaves what `out` held alone:
///
/// ```text
///   page  0    5 6 7 8 ... 598 599 ... 605       639
///         TTTTT. T . T ...  T   .  ... TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT
/// ```
#[test]
fn present_lists_exactly_the_touched_pages() {
    let n = 640;
    let f = Fixture::new(n);
    assert_eq!(f.map.fill_zero(&f.uffd, f.page(0), n * PAGE, false), Ok(n * PAGE));
    let every: Vec<(usize, usize)> = (0..n).map(|i| (f.page(i), PAGE)).collect();
    f.map.zap(&every).expect("zap");
    assert_eq!(f.present(0, n), []);

    let touched: Vec<bool> = (0..n).map(|i| i < 5 || (i < 600 && i % 2 == 0) || i >= 605).collect();
    silent(&f, || {
        for i in (0..n).filter(|&i| touched[i]) {
            if i % 4 == 0 {
                f.write(i, 0, 1);
            } else {
                f.read(i, 0);
            }
        }
    });
    let want = runs_of(&f, &touched);
    assert!(want.len() > 256, "{} runs: fewer than one scan returns", want.len());

    // An entry already there, ending where the first run starts, stays.
    let before = (f.base - PAGE, PAGE);
    let mut out = vec![before];
    f.map.present(f.page(0), n * PAGE, &mut out).expect("present");
    assert_eq!(out[0], before);
    assert_eq!(out[1..], want[..]);

    // A part of the map: the runs clipped to it.
    let part: Vec<bool> = (0..n).map(|i| (3..13).contains(&i) && touched[i]).collect();
    assert_eq!(f.present(3, 10), runs_of(&f, &part));
}

/// Case 4: write protection on zapped pages: a read maps the page with no
/// message; a write — to the page the read mapped, or to one not touched
/// since the zap — raises a WP message, served by lifting the protection;
/// and a zap of a protected page keeps it protected.
#[test]
fn a_protected_zapped_page_reads_silently_and_a_write_raises_wp() {
    let f = Fixture::new(2);
    let pages = [pattern(20), pattern(21)];
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &pages.concat(), false), Ok(2 * PAGE));
    f.map.zap(&[(f.page(0), 2 * PAGE)]).expect("zap");
    f.map.protect_for_eviction(&f.uffd, f.page(0), 2 * PAGE).expect("protect_for_eviction");

    assert_eq!(silent(&f, || f.touch_page(0)), pages[0]);
    assert_eq!(f.present(0, 2), [(f.page(0), PAGE)]);

    for (i, page) in pages.iter().enumerate() {
        let ((), msgs) = watched(
            &f,
            || f.write(i, 7, 0xCD),
            |m| {
                assert_ne!(m.flags & UFFD_PAGEFAULT_FLAG_WP, 0, "not a WP message: {m:?}");
                f.map.unprotect(&f.uffd, page_of(m), PAGE).expect("unprotect");
            },
        );
        assert_eq!(msgs.len(), 1, "page {i}: {msgs:?}");
        assert_eq!(page_of(&msgs[0]), f.page(i));
        assert_ne!(msgs[0].flags & UFFD_PAGEFAULT_FLAG_WRITE, 0, "{msgs:?}");
        let mut want = page.clone();
        want[7] = 0xCD;
        assert_eq!(f.stored(i), want, "page {i}");
    }
    assert_eq!(f.present(0, 2), [(f.page(0), 2 * PAGE)]);

    // A zap keeps a protected page's protection (as a marker): its next
    // write is a WP message again.
    f.map.protect_for_eviction(&f.uffd, f.page(0), PAGE).expect("protect_for_eviction");
    f.map.zap(&[(f.page(0), PAGE)]).expect("zap");
    let ((), msgs) =
        watched(&f, || f.write(0, 8, 0xEF), |m| f.map.unprotect(&f.uffd, page_of(m), PAGE).expect("unprotect"));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_ne!(msgs[0].flags & UFFD_PAGEFAULT_FLAG_WP, 0, "{msgs:?}");
    assert_eq!(f.stored(0)[8], 0xEF);
}

/// Case 5: `read_page` reads the memfd, not the mapping: a zapped page's bytes
/// come back and the page stays unreferenced; a hole reads as zeros and
/// stays a hole (its next touch is still MISSING).
#[test]
fn read_page_leaves_the_page_unreferenced() {
    let f = Fixture::new(2);
    let p0 = pattern(30);
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &p0, false), Ok(PAGE));
    f.map.zap(&[(f.page(0), PAGE)]).expect("zap");

    assert_eq!(f.stored(0), p0);
    let mut some = [0u8; 10];
    f.map.read_page(f.page(0) + 100, &mut some).expect("read_page");
    assert_eq!(some[..], p0[100..110]);
    assert_eq!(f.stored(1), vec![0; PAGE]);
    assert_eq!(f.present(0, 2), []);

    let (v, msgs) =
        watched(&f, || f.read(1, 9), |m| assert_eq!(f.map.fill_zero(&f.uffd, page_of(m), PAGE, true), Ok(PAGE)));
    assert_eq!((v, msgs.len()), (0, 1), "{msgs:?}");
    assert_eq!(page_of(&msgs[0]), f.page(1));
    assert_eq!(f.present(0, 2), [(f.page(1), PAGE)]);
}

/// Case 6: a punched page leaves the memfd and the page tables: it reads as
/// zeros, its neighbour keeps its bytes, and its next touch is a MISSING
/// message again, served here with a zero page.
#[test]
fn a_punched_page_is_missing_again() {
    let f = Fixture::new(2);
    let pages = [pattern(40), pattern(41)];
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &pages.concat(), false), Ok(2 * PAGE));
    assert_eq!(silent(&f, || [f.touch_page(0), f.touch_page(1)]), pages);

    f.map.punch(f.page(0), PAGE).expect("punch");
    assert_eq!(f.present(0, 2), [(f.page(1), PAGE)]);
    assert_eq!(f.stored(0), vec![0; PAGE]);
    assert_eq!(f.stored(1), pages[1]);

    let (v, msgs) = watched(
        &f,
        || f.read(0, 50),
        |m| {
            assert_eq!(m.flags & UFFD_PAGEFAULT_FLAG_WP, 0, "{m:?}");
            assert_eq!(f.map.fill_zero(&f.uffd, page_of(m), PAGE, true), Ok(PAGE));
        },
    );
    assert_eq!((v, msgs.len()), (0, 1), "{msgs:?}");
    assert_eq!(page_of(&msgs[0]), f.page(0));
    assert_eq!(silent(&f, || f.touch_page(0)), vec![0; PAGE]);
}

/// Ranges outside the map (`EFAULT`) or not in pages where the kernel
/// works in pages (`EINVAL`) are refused, and a zap checks every run
/// before it zaps any.
#[test]
fn ranges_outside_the_map_or_unaligned_are_refused() {
    let f = Fixture::new(2);
    assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &pattern(50), false), Ok(PAGE));
    assert_eq!(f.map.zap(&[(f.page(0), PAGE), (f.page(1), 2 * PAGE)]), Err(Errno::EFAULT));
    assert_eq!(f.present(0, 2), [(f.page(0), PAGE)], "a run was zapped before the bad one was seen");

    assert_eq!(f.map.fill_copy(&f.uffd, f.page(1), &[1; 100], false), Err(Errno::EINVAL));
    assert_eq!(f.map.fill_zero(&f.uffd, f.page(1) + 1, PAGE, false), Err(Errno::EINVAL));
    assert_eq!(f.map.punch(f.page(1), 100), Err(Errno::EINVAL));
    assert_eq!(f.map.present(f.base - PAGE, PAGE, &mut Vec::new()), Err(Errno::EFAULT));
    assert_eq!(f.map.protect_for_eviction(&f.uffd, f.page(1), 2 * PAGE), Err(Errno::EFAULT));
    assert_eq!(f.map.read_page(f.page(1) + PAGE - 10, &mut [0; 20]), Err(Errno::EFAULT));
    assert_eq!(f.map.read_page(usize::MAX - 4, &mut [0; 20]), Err(Errno::EFAULT));
    for (a, l) in [(f.base + 1, PAGE), (f.base, PAGE + 1), (f.base, 0)] {
        // SAFETY: the fixture's own range, which nothing refers into; the
        // call is refused before it maps anything.
        let r = unsafe { SampledMap::new(&f.uffd, a, l) };
        assert_eq!(r.err(), Some(Errno::EINVAL), "{a:#x}+{l:#x}");
    }
}

/// Per-page costs, the median of 5 runs over 4,096 pages: a copy filling a
/// hole (one `UFFDIO_COPY` a page, no fault), a zap (`process_madvise`
/// batches, one run a page), a touch of a zapped page (the host's minor
/// fault), a `present` scan (per page scanned: all present, one run; half
/// present, single-page runs), a `pread` of a page, a `pread` and a punch
/// of one page, and a punch of all pages in one call.
#[test]
#[ignore]
fn sampled_costs() {
    const N: usize = 4096;
    const RUNS: usize = 5;
    let names = [
        "copy-fill",
        "zap (batched)",
        "re-touch after zap",
        "present scan, 1 run",
        "present scan, N/2 runs",
        "pread",
        "pread + punch",
        "punch, one call",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let per_page = |t0: u64| (now_ns() - t0) as f64 / N as f64;
    for _ in 0..RUNS {
        let f = Fixture::new(N);
        let src = pattern(60);

        let t0 = now_ns();
        for i in 0..N {
            assert_eq!(f.map.fill_copy(&f.uffd, f.page(i), &src, false), Ok(PAGE));
        }
        samples[0].push(per_page(t0));

        let every: Vec<(usize, usize)> = (0..N).map(|i| (f.page(i), PAGE)).collect();
        let t0 = now_ns();
        f.map.zap(&every).expect("zap");
        samples[1].push(per_page(t0));
        assert_eq!(f.present(0, N), []);

        let ns = silent(&f, || {
            let t0 = now_ns();
            for i in 0..N {
                f.read(i, 0);
            }
            now_ns() - t0
        });
        samples[2].push(ns as f64 / N as f64);

        let mut out = Vec::with_capacity(N);
        let t0 = now_ns();
        f.map.present(f.page(0), N * PAGE, &mut out).expect("present");
        samples[3].push(per_page(t0));
        assert_eq!(out, [(f.page(0), N * PAGE)]);

        let odd: Vec<(usize, usize)> = (1..N).step_by(2).map(|i| (f.page(i), PAGE)).collect();
        f.map.zap(&odd).expect("zap");
        out.clear();
        let t0 = now_ns();
        f.map.present(f.page(0), N * PAGE, &mut out).expect("present");
        samples[4].push(per_page(t0));
        assert_eq!(out.len(), N / 2);

        let mut buf = vec![0u8; PAGE];
        let t0 = now_ns();
        for i in 0..N {
            f.map.read_page(f.page(i), &mut buf).expect("read_page");
        }
        samples[5].push(per_page(t0));

        let t0 = now_ns();
        for i in 0..N {
            f.map.read_page(f.page(i), &mut buf).expect("read_page");
            f.map.punch(f.page(i), PAGE).expect("punch");
        }
        samples[6].push(per_page(t0));
        assert_eq!(buf, src);
        assert_eq!(f.present(0, N), []);

        assert_eq!(f.map.fill_copy(&f.uffd, f.page(0), &src.repeat(N), false), Ok(N * PAGE));
        let t0 = now_ns();
        f.map.punch(f.page(0), N * PAGE).expect("punch");
        samples[7].push(per_page(t0));
        assert_eq!(f.present(0, N), []);
    }
    println!("sampled map, per page, median of {RUNS} runs of {N} pages:");
    for (name, mut s) in names.iter().zip(samples) {
        s.sort_by(f64::total_cmp);
        println!("  {name:<24} {:>6.0} ns   (runs: {s:.0?})", s[RUNS / 2]);
    }
}
