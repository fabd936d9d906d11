//! SPEC §4 "fork": a child gets a copy of every space of its parent —
//! every byte the parent had at the fork, resident, parked or swapped, at
//! the same addresses — and after the fork neither sees the other's
//! writes; both go on swapping. (A space that cannot be copied: `fork.rs`.)

mod common;

use usermm::consts::{MADV_COLD, MADV_PAGEOUT};
use usermm::{Config, Space};
use usermm_sys::thread::{fork_run, ChildExit};

const PAGE: usize = 4096;

/// The byte at offset `i` of page `p` in round `r`.
fn byte(r: u8, p: usize, i: usize) -> u8 {
    (p as u8).wrapping_mul(31).wrapping_add(r).wrapping_add((i % 251) as u8)
}

fn fill(m: &mut [u8], r: u8) {
    for (p, page) in m.chunks_mut(PAGE).enumerate() {
        for (i, b) in page.iter_mut().enumerate().step_by(61) {
            *b = byte(r, p, i);
        }
    }
}

/// Pages of `m` whose bytes are not round `r`'s.
fn bad_pages(m: &[u8], r: u8) -> usize {
    m.chunks(PAGE)
        .enumerate()
        .filter(|(p, page)| page.iter().enumerate().step_by(61).any(|(i, &b)| b != byte(r, *p, i)))
        .count()
}

/// Pages of `m` resident (`mincore`).
fn resident(s: &Space, m: &[u8]) -> usize {
    space_resident(s, m.as_ptr() as usize, m.len()).unwrap()
}

/// Pages of `[a, a+l)` of `s` resident (`mincore`).
fn space_resident(s: &Space, a: usize, l: usize) -> Result<usize, usermm::Errno> {
    let mut v = vec![0u8; l / PAGE];
    s.mincore(a, l, &mut v).map(|()| v.iter().filter(|&&b| b & 1 != 0).count())
}

/// Pages of `[a, a+l)` resident in the kernel's mapping (`mincore`).
fn kernel_resident(a: usize, l: usize) -> usize {
    usermm_sys::kernel::mincore(a, l).map_or(0, |v| v.iter().filter(|&&b| b & 1 != 0).count())
}

/// One test at a time: a test's fork copies every space of the process,
/// the other tests' too, and its child then holds their swap slots (and
/// runs their threads) while those tests count and wait on them.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn space() -> Space {
    // (In the run's mode: in-thread faults, the frame pool, swap to the
    // run's page store, `tests/common`.)
    let cfg = Config { budget_bytes: 8 << 20, swap_bytes: 128 << 20, ..Config::default() };
    common::open_mode(&cfg).unwrap()
}

#[test]
fn a_child_reads_every_byte_resident_parked_and_swapped() {
    let _serial = serial();
    let s = space();
    // 32 MiB under an 8 MiB budget: most pages swapped, some resident,
    // some parked (MADV_COLD).
    let mut m = s.map_anon(32 << 20).unwrap();
    fill(&mut m, 1);
    let mut hot = s.map_anon(1 << 20).unwrap();
    fill(&mut hot, 2);
    let mut cold = s.map_anon(1 << 20).unwrap();
    fill(&mut cold, 3);
    cold.advise(MADV_COLD).unwrap();
    let st = s.stats();
    eprintln!("before the fork: {st:?}");
    assert!(st.swapped_pages > 4096, "not much swapped: {st:?}");
    let (maddr, mlen) = (m.addr(), m.len());
    let out = fork_run(60, || {
        // SAFETY: the child's copy of the parent's mapping, which this
        // thread alone uses.
        let m = unsafe { std::slice::from_raw_parts_mut(maddr as *mut u8, mlen) };
        if bad_pages(m, 1) != 0 || bad_pages(&hot, 2) != 0 || bad_pages(&cold, 3) != 0 {
            return 2;
        }
        // Pages resident at the fork and only read since go out all the
        // same (the host refuses to move a page the fork left shared).
        if s.madvise(hot.addr(), hot.len(), MADV_PAGEOUT).is_err() || resident(&s, &hot) != 0 {
            return 6;
        }
        if bad_pages(&hot, 2) != 0 {
            return 7;
        }
        // The child's own writes, under pressure: swapped out and back.
        fill(m, 4);
        if bad_pages(m, 4) != 0 {
            return 3;
        }
        if s.madvise(maddr, mlen, MADV_PAGEOUT).is_err() || bad_pages(m, 4) != 0 {
            return 4;
        }
        let st = s.stats();
        if st.swapins == 0 {
            return 5;
        }
        s.validate();
        0
    })
    .unwrap();
    assert_eq!(out, ChildExit::Exited(0), "the child's check failed");
    // The parent saw none of the child's writes, and goes on swapping, the
    // pages it only read since the fork too.
    assert_eq!(bad_pages(&hot, 2), 0);
    hot.advise(MADV_PAGEOUT).unwrap();
    assert_eq!(resident(&s, &hot), 0, "pages resident at the fork and only read since stayed");
    assert_eq!(bad_pages(&m, 1), 0);
    assert_eq!(bad_pages(&hot, 2), 0);
    assert_eq!(bad_pages(&cold, 3), 0);
    fill(&mut m, 5);
    m.advise(MADV_PAGEOUT).unwrap();
    assert_eq!(bad_pages(&m, 5), 0);
    s.validate();
}

/// What a forked child sees of a parent's four ranges of 4 pages, each
/// page's first byte `0x5c` in the parent: `plain`, `dontfork`
/// (`MADV_DONTFORK`), `wipe` (`MADV_WIPEONFORK`) and `locked` (`mlock`).
/// One bit each: the plain page's byte came along; `mincore` on the
/// `dontfork` range fails with `ENOMEM` (no mapping); the `wipe` page reads
/// 0; the lock is not inherited (`locked(…)` says so).
fn child_view(ranges: [usize; 4], mincore: &dyn Fn(usize) -> Result<(), i32>, locked: &dyn Fn() -> bool) -> i32 {
    let [plain, dontfork, wipe, _] = ranges;
    let mut code = 0;
    code |= i32::from(usermm_sys::kernel::peek(plain) == 0x5c);
    code |= i32::from(mincore(dontfork) == Err(libc::ENOMEM)) << 1;
    code |= i32::from(usermm_sys::kernel::peek(wipe) == 0) << 2;
    code |= i32::from(!locked()) << 3;
    code
}

/// `MADV_DONTFORK`, `MADV_WIPEONFORK` and `mlock` across a fork, on the
/// kernel's anonymous memory and on a space's, compared: the child has no
/// mapping of the first, zeros in the second, no lock on the third.
#[test]
fn fork_advice_and_locks_as_the_kernel() {
    let _serial = serial();
    const LEN: usize = 4 * PAGE;
    // The kernel's.
    // SAFETY: a fresh anonymous mapping the kernel places.
    let k = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_ne!(k as *mut libc::c_void, libc::MAP_FAILED);
    let kr = [k, k + LEN, k + 2 * LEN, k + 3 * LEN];
    for &r in &kr {
        for p in 0..4 {
            usermm_sys::kernel::poke(r + p * PAGE, 0x5c);
        }
    }
    // SAFETY: ranges of the mapping above, which nothing else uses.
    unsafe {
        assert_eq!(libc::madvise(kr[1] as *mut libc::c_void, LEN, libc::MADV_DONTFORK), 0);
        assert_eq!(libc::madvise(kr[2] as *mut libc::c_void, LEN, libc::MADV_WIPEONFORK), 0);
        assert_eq!(libc::mlock(kr[3] as *const libc::c_void, LEN), 0);
    }
    let kmincore = |a: usize| {
        let mut v = [0u8; 4];
        // SAFETY: `v` holds one byte for each of the 4 pages asked about.
        if unsafe { libc::mincore(a as *mut libc::c_void, LEN, v.as_mut_ptr()) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    };
    let klocked = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        !status.lines().any(|l| l.starts_with("VmLck:") && l.split_whitespace().nth(1) == Some("0"))
    };
    let kernel = fork_run(20, || child_view(kr, &kmincore, &klocked)).unwrap();
    // A space's.
    let s = space();
    let a =
        s.mmap(0, 4 * LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0).unwrap();
    let ur = [a, a + LEN, a + 2 * LEN, a + 3 * LEN];
    for &r in &ur {
        for p in 0..4 {
            usermm_sys::kernel::poke(r + p * PAGE, 0x5c);
        }
    }
    s.madvise(ur[1], LEN, libc::MADV_DONTFORK).unwrap();
    s.madvise(ur[2], LEN, libc::MADV_WIPEONFORK).unwrap();
    s.mlock(ur[3], LEN).unwrap();
    let smaps = s.smaps();
    assert!(smaps.contains(" dc ") && smaps.contains(" wf "), "VmFlags dc and wf: {smaps}");
    let umincore = |a: usize| {
        let mut v = [0u8; 4];
        s.mincore(a, LEN, &mut v).map_err(|e| e.0)
    };
    let ulocked = || s.stats().locked_pages > 0;
    let usermm = fork_run(20, || child_view(ur, &umincore, &ulocked)).unwrap();
    assert_eq!(kernel, ChildExit::Exited(15), "the kernel's child");
    assert_eq!(usermm, kernel, "usermm's child against the kernel's");
    // The parent keeps all four, and its lock.
    for &r in &ur {
        assert_eq!(usermm_sys::kernel::peek(r), 0x5c);
    }
    assert_eq!(s.stats().locked_pages, 4);
    // SAFETY: the kernel mapping above, no longer used.
    unsafe { libc::munmap(k as *mut libc::c_void, 4 * LEN) };
    s.munmap(a, 4 * LEN).unwrap();
    s.validate();
}

/// Waits up to `secs` for `w` to hold `v`.
fn wait_for(w: &std::sync::atomic::AtomicU32, v: u32, secs: u64) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while w.load(std::sync::atomic::Ordering::SeqCst) != v {
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// The child reads the parent's swap slots in place: while it waits, the
/// parent swaps every page in, writes it and swaps it out five times over
/// (its slots of the fork freed, every slot's turn come round again); the child still reads every
/// byte as of the fork, and the slots the parent freed meanwhile are kept
/// for the child (`swap_fork_held_pages`) until it is gone, then freed.
#[test]
fn the_parent_rewrites_its_swap_while_the_child_reads_it_in_place() {
    let _serial = serial();
    use std::sync::atomic::Ordering::SeqCst;
    let s = space();
    let mut m = s.map_anon(32 << 20).unwrap();
    fill(&mut m, 1);
    m.advise(MADV_PAGEOUT).unwrap();
    assert!(s.stats().swapped_pages > 7000, "{:?}", s.stats());
    let (maddr, mlen) = (m.addr(), m.len());
    let word = usermm_sys::testing::shared_word();
    let sp = &s;
    std::thread::scope(|sc| {
        let child = sc.spawn(move || {
            fork_run(120, || {
                word.store(1, SeqCst);
                if !wait_for(word, 2, 100) {
                    return 9;
                }
                // SAFETY: the child's copy of the parent's mapping, which this
                // thread alone uses.
                let m = unsafe { std::slice::from_raw_parts_mut(maddr as *mut u8, mlen) };
                if bad_pages(m, 1) != 0 {
                    return 2;
                }
                // Its own writes go to a swap file of its own.
                fill(m, 7);
                if sp.madvise(maddr, mlen, MADV_PAGEOUT).is_err() || bad_pages(m, 7) != 0 {
                    return 3;
                }
                sp.validate();
                0
            })
        });
        assert!(wait_for(word, 1, 60), "the child did not start");
        // (Five rounds of 8,192 pages: the 32,768 slots' next-fit goes
        // round to the fork's.)
        for r in 2..=6 {
            fill(&mut m, r);
            m.advise(MADV_PAGEOUT).unwrap();
        }
        let held = s.stats();
        word.store(2, SeqCst);
        assert_eq!(child.join().unwrap().unwrap(), ChildExit::Exited(0), "the child's check failed");
        assert!(held.swap_fork_held_pages > 7000, "the slots of the fork are kept for the child: {held:?}");
    });
    assert_eq!(bad_pages(&m, 6), 0);
    // Gone: its slots are the parent's again (the background thread asks).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.stats().swap_fork_held_pages != 0 {
        assert!(std::time::Instant::now() < until, "held slots never freed: {:?}", s.stats());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.validate();
    // And are written again.
    for r in [8, 9, 10] {
        fill(&mut m, r);
        m.advise(MADV_PAGEOUT).unwrap();
        assert_eq!(bad_pages(&m, r), 0);
    }
    s.validate();
}

/// A child outlives its parent: the parent closes the space and exits,
/// and the child still reads every byte the parent had swapped out at the
/// fork (its swap file stays open in the child).
#[test]
fn a_child_reads_the_swap_of_a_parent_that_exited() {
    let _serial = serial();
    use std::sync::atomic::Ordering::SeqCst;
    let word = usermm_sys::testing::shared_word();
    let parent = fork_run(120, || {
        let s = space();
        let mut m = s.map_anon(32 << 20).unwrap();
        fill(&mut m, 1);
        if s.madvise(m.addr(), m.len(), MADV_PAGEOUT).is_err() || s.stats().swapped_pages < 7000 {
            return 2;
        }
        let (maddr, mlen) = (m.addr(), m.len());
        let me = std::process::id() as i32;
        // SAFETY: fork; the child runs only the check below and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return 3;
        }
        if pid == 0 {
            // SAFETY: `getppid`, `alarm` and `_exit` take no pointer.
            unsafe { libc::alarm(60) };
            // SAFETY: as above.
            while unsafe { libc::getppid() } == me {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // SAFETY: the child's copy of the mapping, this thread's alone.
            let m = unsafe { std::slice::from_raw_parts_mut(maddr as *mut u8, mlen) };
            let bad = bad_pages(m, 1) as u32;
            fill(m, 4);
            let again = s.madvise(maddr, mlen, MADV_PAGEOUT).is_ok() && bad_pages(m, 4) == 0;
            word.store(if bad == 0 && again { 1 } else { 2 + bad }, SeqCst);
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        drop(m);
        drop(s);
        0
    })
    .unwrap();
    assert_eq!(parent, ChildExit::Exited(0));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while word.load(SeqCst) == 0 {
        assert!(std::time::Instant::now() < until, "the orphaned child never answered");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(word.load(SeqCst), 1, "the child read bad pages (2 + their count)");
}

/// Forks (20 times) while two threads allocate and free on the space's heap (small
/// blocks and medium ones, so every class lock and the arenas' lock are
/// taken all the time): every child allocates from the heap itself and
/// ends — none waits on a lock a parent thread held at the fork.
#[test]
fn a_child_forked_while_threads_use_the_heap_allocates_from_it() {
    let _serial = serial();
    use allocator_api2::vec::Vec as AVec;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let s = space();
    let stop = AtomicBool::new(false);
    let churn = |seed: usize| {
        let mut live: std::vec::Vec<AVec<u8, usermm::Heap<'_>>> = std::vec::Vec::new();
        let mut i = seed;
        while !stop.load(Relaxed) {
            i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let size = if i >> 60 == 0 { 20_000 + (i >> 40) % 100_000 } else { 8 + (i >> 48) % 4000 };
            let mut v = AVec::with_capacity_in(size, s.heap());
            v.resize(size, i as u8);
            live.push(v);
            if live.len() > 200 {
                live.swap_remove((i >> 20) % live.len());
            }
        }
    };
    std::thread::scope(|sc| {
        sc.spawn(|| churn(1));
        sc.spawn(|| churn(2));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut outs = std::vec::Vec::new();
        for _ in 0..20 {
            let out = fork_run(20, || {
                let mut v: std::vec::Vec<AVec<u8, usermm::Heap<'_>>> = std::vec::Vec::new();
                for k in 0..300 {
                    let size = if k % 30 == 0 { 50_000 } else { 8 + k * 13 };
                    let mut b = AVec::with_capacity_in(size, s.heap());
                    b.resize(size, k as u8);
                    v.push(b);
                }
                i32::from(v.iter().enumerate().any(|(k, b)| b.iter().any(|&x| x != k as u8)))
            })
            .unwrap();
            outs.push(out);
            if out != ChildExit::Exited(0) {
                break;
            }
        }
        stop.store(true, Relaxed);
        assert!(outs.iter().all(|&o| o == ChildExit::Exited(0)), "the children's heap allocations: {outs:?}");
    });
    s.validate();
}

/// What a parent and its child see of a `MAP_SHARED` anonymous region
/// (`sh`, round 1 written before the fork) and a private one (`pv`, round
/// 2): the child checks both, writes the first half of `sh` (round 3) and
/// all of `pv` (round 5), and waits for the parent, which checks that it
/// sees the first (and not the second), writes the second half (round 4),
/// which the child then checks. `resident`: pages of a range in memory.
/// The child's exit and the parent's bad page counts.
fn shared_scenario(
    sh: usize,
    len: usize,
    pv: usize,
    plen: usize,
    resident: &(dyn Fn(usize, usize) -> usize + Sync),
) -> (ChildExit, [usize; 3]) {
    use std::sync::atomic::Ordering::SeqCst;
    let word = usermm_sys::testing::shared_word();
    word.store(0, SeqCst);
    let half = len / 2;
    // SAFETY: the caller's two mappings, which only this test uses (its
    // child its own copies, and the shared one as the kernel shares it).
    let (m, p) = unsafe {
        (std::slice::from_raw_parts_mut(sh as *mut u8, len), std::slice::from_raw_parts_mut(pv as *mut u8, plen))
    };
    std::thread::scope(|sc| {
        let child = sc.spawn(move || {
            let t0 = usermm_sys::now_ns();
            let (out, returned) = usermm_sys::thread::fork_run_timed(120, || {
                // SAFETY: as above, in the child.
                let (m, p) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(sh as *mut u8, len),
                        std::slice::from_raw_parts_mut(pv as *mut u8, plen),
                    )
                };
                if bad_pages(m, 1) != 0 {
                    return 2;
                }
                if bad_pages(p, 2) != 0 {
                    return 3;
                }
                if resident(sh, len) != len / PAGE {
                    return 4;
                }
                fill(&mut m[..half], 3);
                fill(p, 5);
                word.store(1, SeqCst);
                if !wait_for(word, 2, 100) {
                    return 9;
                }
                if bad_pages(&m[half..], 4) != 0 {
                    return 5;
                }
                0
            })
            .unwrap();
            // (What the first fork costs, for the record: a space's copies
            // the region's bytes to the host.)
            eprintln!(
                "shared_scenario: {} MiB shared: fork returned after {:.2} ms",
                len >> 20,
                (returned - t0) as f64 / 1e6
            );
            out
        });
        assert!(wait_for(word, 1, 60), "the child did not get as far as its writes");
        let seen = bad_pages(&m[..half], 3);
        let private = bad_pages(p, 2);
        fill(&mut m[half..], 4);
        word.store(2, SeqCst);
        let out = child.join().unwrap();
        (out, [seen, private, bad_pages(&m[..half], 3) + bad_pages(&m[half..], 4)])
    })
}

/// SPEC §4 "fork": shared anonymous regions stay shared — on a space as on
/// the kernel, the same scenario (`shared_scenario`) gives the same
/// outcome, with most of the space's region swapped out at the fork; and
/// after it the region still behaves as shmem there (`MADV_DONTNEED`
/// keeps the bytes, `MADV_FREE` is `EINVAL`, `MADV_REMOVE` frees them), and
/// its range is the space's again once unmapped.
#[test]
fn a_shared_region_stays_shared_across_the_fork_as_the_kernels() {
    use usermm::consts::{
        MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE,
    };
    let _serial = serial();
    let (len, plen) = (16usize << 20, 1usize << 20);
    // The kernel's.
    let mut ksh = usermm_sys::host::HostMap::shared_anon(len, 0).unwrap();
    let mut kpv = usermm_sys::host::HostMap::anon(plen, 0).unwrap();
    fill(&mut ksh, 1);
    fill(&mut kpv, 2);
    let kernel = shared_scenario(ksh.addr(), len, kpv.addr(), plen, &kernel_resident);
    // The space's: 16 MiB under an 8 MiB budget.
    let s = space();
    let sh = s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0).unwrap();
    let mut pv = s.map_anon(plen).unwrap();
    // SAFETY: the space's new mapping, which only this test uses.
    let m = unsafe { std::slice::from_raw_parts_mut(sh as *mut u8, len) };
    fill(m, 1);
    fill(&mut pv, 2);
    let st = s.stats();
    assert!(st.swapped_pages > 1000, "not much swapped at the fork: {st:?}");
    let space = shared_scenario(sh, len, pv.addr(), plen, &|a, l| space_resident(&s, a, l).unwrap_or(0));
    assert_eq!(kernel, (ChildExit::Exited(0), [0, 0, 0]), "the kernel's outcome");
    assert_eq!(space, kernel, "the space's outcome against the kernel's");
    s.validate();
    // Still shmem.
    let q = len / 4;
    s.madvise(sh, q, MADV_DONTNEED).unwrap();
    assert_eq!(bad_pages(&m[..q], 3), 0, "MADV_DONTNEED kept the bytes");
    assert_eq!(s.madvise(sh, q, MADV_FREE), Err(usermm::Errno::EINVAL));
    s.madvise(sh + q, q, MADV_REMOVE).unwrap();
    assert!(m[q..2 * q].iter().all(|&b| b == 0), "MADV_REMOVE freed the bytes");
    // Unmapped, the range is the space's again: a new region there reads
    // zeros and is served by usermm.
    s.munmap(sh, len).unwrap();
    let again = s.mmap(sh, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0).unwrap();
    assert_eq!(again, sh);
    // SAFETY: the space's new mapping, which only this test uses.
    let m = unsafe { std::slice::from_raw_parts_mut(sh as *mut u8, len) };
    assert!(m.iter().step_by(PAGE).all(|&b| b == 0), "the old shared bytes showed through");
    fill(m, 6);
    assert!(s.stats().swapped_pages > 1000);
    assert_eq!(bad_pages(m, 6), 0);
    s.validate();
    drop(ksh);
}

/// SPEC §4 "fork" with a `MAP_SHARED` file region: shared with the child
/// as the kernel's (`shared_scenario`, the same outcome), the pages written
/// before the fork among what the child reads, and every write of both
/// processes in the file once the parent's `msync` returns.
#[test]
fn a_shared_file_region_stays_shared_across_the_fork_as_the_kernels() {
    use std::os::unix::fs::FileExt;
    use usermm::consts::{MAP_SHARED, MS_SYNC, PROT_READ, PROT_WRITE};
    let _serial = serial();
    let (len, plen) = (4usize << 20, 1usize << 20);
    let file = |tag: &str| {
        let dir = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
        let path = format!("{dir}/usermm-fork-shared-file-{tag}-{}", std::process::id());
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(len as u64).unwrap();
        f
    };
    // The kernel's.
    let kf = file("kernel");
    let kmap = usermm_sys::host::HostFileMap::open_rw(&kf, len, true, 0).unwrap();
    let mut kpv = usermm_sys::host::HostMap::anon(plen, 0).unwrap();
    // SAFETY: the kernel's shared mapping of the test's own file, which
    // only this test uses.
    fill(unsafe { std::slice::from_raw_parts_mut(kmap.addr() as *mut u8, len) }, 1);
    fill(&mut kpv, 2);
    let kernel = shared_scenario(kmap.addr(), len, kpv.addr(), plen, &kernel_resident);
    // The space's.
    let s = space();
    let sf = file("space");
    use std::os::fd::AsRawFd;
    let sh = s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, sf.as_raw_fd(), 0).unwrap();
    let mut pv = s.map_anon(plen).unwrap();
    // SAFETY: the space's new mapping, which only this test uses.
    let m = unsafe { std::slice::from_raw_parts_mut(sh as *mut u8, len) };
    fill(m, 1);
    fill(&mut pv, 2);
    let space = shared_scenario(sh, len, pv.addr(), plen, &|a, l| space_resident(&s, a, l).unwrap_or(0));
    assert_eq!(kernel, (ChildExit::Exited(0), [0, 0, 0]), "the kernel's outcome");
    assert_eq!(space, kernel, "the space's outcome against the kernel's");
    s.msync(sh, len, MS_SYNC).unwrap();
    let mut back = vec![0u8; len];
    sf.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(
        bad_pages(&back[..len / 2], 3) + bad_pages(&back[len / 2..], 4),
        0,
        "the file has both processes' writes"
    );
    s.munmap(sh, len).unwrap();
    s.validate();
    drop(kmap);
}

/// A page of a shared region the host dropped behind usermm's back (a raw
/// `madvise(MADV_DONTNEED)`, as a program compiled against
/// `usermm_compat.h` makes with `syscall`) when the fork hands the region
/// to the host: the fork returns (the copy does not fault into usermm's
/// own handlers, waiting for the lock the fork holds) and the page reads
/// as zeros in both processes; its neighbours keep their bytes.
#[test]
fn a_fork_after_a_raw_dontneed_of_a_shared_page_returns() {
    use usermm::consts::{MAP_ANONYMOUS, MAP_SHARED, PROT_READ, PROT_WRITE};
    let _serial = serial();
    let s = space();
    let len = 16 * PAGE;
    let sh = s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0).unwrap();
    // SAFETY: the space's new mapping, which only this test uses.
    let m = unsafe { std::slice::from_raw_parts_mut(sh as *mut u8, len) };
    fill(m, 1);
    // SAFETY: no reference into the page is used across the call.
    unsafe { usermm_sys::testing::raw_dontneed(sh + 3 * PAGE, PAGE) }.unwrap();
    let out = fork_run(30, || {
        // SAFETY: as above, in the child.
        let m = unsafe { std::slice::from_raw_parts(sh as *const u8, len) };
        let zero = m[3 * PAGE..4 * PAGE].iter().all(|&b| b == 0);
        let others = (0..16)
            .filter(|&p| p != 3)
            .filter(|&p| (0..PAGE).step_by(61).any(|i| m[p * PAGE + i] != byte(1, p, i)))
            .count();
        if zero && others == 0 {
            0
        } else {
            2
        }
    })
    .unwrap();
    assert_eq!(out, ChildExit::Exited(0), "the child's view of the shared region");
    // SAFETY: the space's mapping, only this test's.
    let m = unsafe { std::slice::from_raw_parts(sh as *const u8, len) };
    assert!(m[3 * PAGE..4 * PAGE].iter().all(|&b| b == 0));
    s.munmap(sh, len).unwrap();
    s.validate();
}

/// A space with a frame pool (`UMM_F_FRAME_POOL`) is copied too: the pool,
/// left out of the fork, starts empty in the child, which reads every byte
/// its parent had and recycles frames into its own fills; the parent's
/// pool goes on.
#[test]
fn a_frame_pool_space_is_copied_with_an_empty_pool() {
    let _serial = serial();
    let cfg = Config {
        budget_bytes: 8 << 20,
        swap_bytes: 128 << 20,
        flags: usermm::consts::UMM_F_FRAME_POOL,
        ..Config::default()
    };
    let s = Space::open(&cfg).unwrap();
    let mut m = s.map_anon(32 << 20).unwrap();
    fill(&mut m, 1);
    fill(&mut m, 2);
    let before = s.stats();
    assert!(before.pool_fills > 0, "the parent's pool was not used: {before:?}");
    let (maddr, mlen) = (m.addr(), m.len());
    let out = fork_run(60, || {
        // SAFETY: the child's copy of the parent's mapping, which this
        // thread alone uses.
        let m = unsafe { std::slice::from_raw_parts_mut(maddr as *mut u8, mlen) };
        if bad_pages(m, 2) != 0 {
            return 2;
        }
        let fills = s.stats().pool_fills;
        fill(m, 3);
        if bad_pages(m, 3) != 0 {
            return 3;
        }
        if s.stats().pool_fills == fills {
            return 4;
        }
        s.validate();
        0
    })
    .unwrap();
    assert_eq!(out, ChildExit::Exited(0), "the child's check failed");
    assert_eq!(bad_pages(&m, 2), 0);
    fill(&mut m, 4);
    assert_eq!(bad_pages(&m, 4), 0);
    assert!(s.stats().pool_fills > before.pool_fills);
    s.validate();
}

/// Spaces whose faults are resolved in the faulting thread are copied: one
/// with `UMM_F_INTHREAD_FAULTS`, and one with a `UMM_MAP_INTHREAD` region
/// beside a handler-served one (two userfaultfds, both taken over). The
/// child reads every byte, writes under pressure, and its faults are its
/// own (the SIGBUS handler's table passes over the parent's entry).
#[test]
fn in_thread_spaces_are_copied() {
    use usermm::consts::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, UMM_F_INTHREAD_FAULTS, UMM_MAP_INTHREAD};
    let _serial = serial();
    for whole in [true, false] {
        let flags = if whole { UMM_F_INTHREAD_FAULTS } else { 0 };
        let s =
            Space::open(&Config { budget_bytes: 8 << 20, swap_bytes: 128 << 20, flags, ..Config::default() }).unwrap();
        let len = 16usize << 20;
        let a = s.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | UMM_MAP_INTHREAD, -1, 0).unwrap();
        let mut b = s.map_anon(len).unwrap();
        // SAFETY: the space's new mapping, which only this test uses.
        let m = unsafe { std::slice::from_raw_parts_mut(a as *mut u8, len) };
        fill(m, 1);
        fill(&mut b, 2);
        assert!(s.stats().swapped_pages > 1000, "{:?}", s.stats());
        let bad = (b.addr(), b.len());
        let out = fork_run(60, || {
            // SAFETY: the child's copies of the parent's mappings, which
            // this thread alone uses.
            let (m, b) = unsafe {
                (
                    std::slice::from_raw_parts_mut(a as *mut u8, len),
                    std::slice::from_raw_parts_mut(bad.0 as *mut u8, bad.1),
                )
            };
            if bad_pages(m, 1) != 0 || bad_pages(b, 2) != 0 {
                return 2;
            }
            fill(m, 3);
            fill(b, 4);
            if bad_pages(m, 3) != 0 || bad_pages(b, 4) != 0 {
                return 3;
            }
            s.validate();
            0
        })
        .unwrap();
        assert_eq!(out, ChildExit::Exited(0), "the child's check (whole space in-thread: {whole})");
        assert_eq!(bad_pages(m, 1), 0);
        assert_eq!(bad_pages(&b, 2), 0);
        fill(m, 5);
        assert_eq!(bad_pages(m, 5), 0);
        s.validate();
    }
}
