//! File-backed regions: shared and private file mappings, read on fault,
//! write-back on msync, munmap, reclaim and close, SIGBUS/EFAULT past the end
//! of the file, and Linux's errno rules (EBADF, EACCES, ENODEV, msync's).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use usermm::consts::*;
use usermm::{Config, Errno, Space};
use usermm_sys::kernel::{peek, poke};

mod common;

const PS: usize = 4096;

fn space(budget_mib: usize) -> Space {
    common::open_mode(&Config { budget_bytes: budget_mib << 20, swap_bytes: 64 << 20, ..Config::default() }).unwrap()
}

fn temp_file(name: &str, data: &[u8]) -> (PathBuf, File) {
    let p = std::env::temp_dir().join(format!("usermm-test-{}-{name}", std::process::id()));
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
    (p, f)
}

fn contents(p: &PathBuf) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(p).unwrap().read_to_end(&mut v).unwrap();
    v
}

fn pattern(pages: usize) -> Vec<u8> {
    (0..pages * PS).map(|i| (i / PS) as u8 ^ (i % 251) as u8).collect()
}

#[test]
fn shared_mapping_reads_the_file_and_msync_writes_it() {
    let s = space(64);
    let data = pattern(8);
    let (p, f) = temp_file("shared", &data);
    let a = s.mmap(0, 8 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    for i in (0..8 * PS).step_by(509) {
        assert_eq!(peek(a + i), data[i], "byte {i}");
    }
    poke(a + 3 * PS + 7, 0xAB);
    s.msync(a, 8 * PS, MS_SYNC).unwrap();
    assert_eq!(contents(&p)[3 * PS + 7], 0xAB, "MS_SYNC wrote the page");
    poke(a + 5 * PS, 0xCD);
    // smaps shows the file as Linux does: offset, device, inode, path.
    let smaps = s.smaps();
    let header = smaps.lines().next().unwrap();
    assert!(header.contains(" rw-s 00000000 "), "{header}");
    assert!(header.ends_with(&*p.to_string_lossy()), "{header}");
    s.munmap(a, 8 * PS).unwrap();
    let c = contents(&p);
    assert_eq!(c[5 * PS], 0xCD, "munmap wrote the page back");
    assert_eq!(c.len(), 8 * PS, "never written past the end");
    assert!(s.smaps().is_empty() || !s.smaps().contains("usermm-test"), "region gone");
    s.validate();
    let _ = std::fs::remove_file(p);
}

#[test]
fn private_mapping_never_writes_the_file() {
    let s = space(64);
    let data = pattern(4);
    let (p, f) = temp_file("private", &data);
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.as_raw_fd(), 0).unwrap();
    poke(a + 10, 0x77);
    assert_eq!(peek(a + 10), 0x77);
    s.msync(a, 4 * PS, MS_SYNC).unwrap();
    // DONTNEED on a private file mapping: the page is re-read from the file.
    s.madvise(a, PS, MADV_DONTNEED).unwrap();
    assert_eq!(peek(a + 10), data[10]);
    poke(a + PS, 0x55);
    s.munmap(a, 4 * PS).unwrap();
    assert_eq!(contents(&p), data, "a private mapping never reaches the file");
    let _ = std::fs::remove_file(p);
}

/// The same body on the host kernel's mapping and on usermm's: populating a
/// shared file mapping that runs past the end of its file is `EFAULT` (never
/// a signal), for READ and WRITE, and the file does not grow.
#[test]
fn populate_past_eof_is_efault_like_the_kernel() {
    let mut data = pattern(2);
    data.truncate(PS + 100);
    let (p, f) = temp_file("eof-twin", &data);
    let body = |madvise: &dyn Fn(i32) -> Result<(), Errno>| -> Vec<Result<(), Errno>> {
        vec![madvise(MADV_POPULATE_READ), madvise(MADV_POPULATE_WRITE), madvise(MADV_WILLNEED)]
    };
    let k = usermm_sys::host::HostFileMap::open_rw(&f, 3 * PS, true, 0).unwrap();
    let kernel = body(&|adv| k.madvise(adv).map_err(|e| Errno(e.0)));
    k.unmap().unwrap();
    let s = space(64);
    let a = s.mmap(0, 3 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    let usermm = body(&|adv| s.madvise(a, 3 * PS, adv));
    assert_eq!(usermm, kernel);
    assert_eq!(kernel[..2], [Err(Errno::EFAULT), Err(Errno::EFAULT)]);
    s.munmap(a, 3 * PS).unwrap();
    assert_eq!(contents(&p).len(), PS + 100, "the file did not grow");
    let _ = std::fs::remove_file(p);
}

#[test]
fn offset_partial_last_page_and_past_eof() {
    let s = space(64);
    let mut data = pattern(2);
    data.truncate(PS + 100); // a partial second page
    let (p, f) = temp_file("eof", &data);
    // From file page 1: byte 0 of the mapping is file byte 4096.
    let a = s.mmap(0, 3 * PS, PROT_READ, MAP_PRIVATE, f.as_raw_fd(), PS as i64).unwrap();
    assert_eq!(peek(a), data[PS]);
    assert_eq!(peek(a + 99), data[PS + 99]);
    assert_eq!(peek(a + 100), 0, "the tail of the last page reads zeros");
    // Past the end of the file: populate says EFAULT, never a signal.
    let (rep, r) = s.populate(a + PS, PS, MADV_POPULATE_READ);
    assert_eq!(r, Err(Errno::EFAULT));
    assert_eq!(rep.populated_bytes, 0);
    s.munmap(a, 3 * PS).unwrap();
    // A shared mapping of the partial page is never written past the end.
    let b = s.mmap(0, PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), PS as i64).unwrap();
    poke(b + 50, 9);
    poke(b + 200, 9);
    s.munmap(b, PS).unwrap();
    let c = contents(&p);
    assert_eq!(c.len(), PS + 100);
    assert_eq!(c[PS + 50], 9);
    let _ = std::fs::remove_file(p);
}

#[test]
fn descriptor_rules_are_linux_rules() {
    let s = space(64);
    let (p, _f) = temp_file("rules", &pattern(1));
    let ro = File::open(&p).unwrap();
    let wo = OpenOptions::new().write(true).open(&p).unwrap();
    let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let sh = MAP_SHARED;
    assert_eq!(s.mmap(0, PS, PROT_READ, sh, -1, 0), Err(Errno::EBADF));
    assert_eq!(s.mmap(0, PS, PROT_READ | PROT_WRITE, sh, ro.as_raw_fd(), 0), Err(Errno::EACCES));
    assert_eq!(s.mmap(0, PS, PROT_READ, sh, wo.as_raw_fd(), 0), Err(Errno::EACCES));
    assert_eq!(s.mmap(0, PS, PROT_READ, sh, rw.as_raw_fd(), 1), Err(Errno::EINVAL), "unaligned offset");
    assert_eq!(s.mmap(0, 0, PROT_READ, sh, rw.as_raw_fd(), 0), Err(Errno::EINVAL));
    // A private writable mapping of a read-only descriptor is fine.
    let a = s.mmap(0, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, ro.as_raw_fd(), 0).unwrap();
    s.munmap(a, PS).unwrap();
    // mprotect cannot make a shared read-only-descriptor mapping writable.
    let b = s.mmap(0, PS, PROT_READ, sh, ro.as_raw_fd(), 0).unwrap();
    assert_eq!(s.mprotect(b, PS, PROT_READ | PROT_WRITE), Err(Errno::EACCES));
    s.munmap(b, PS).unwrap();
    // A pipe cannot be mapped.
    let (r, _w) = std::io::pipe().unwrap();
    assert_eq!(s.mmap(0, PS, PROT_READ, MAP_PRIVATE, r.as_raw_fd(), 0), Err(Errno::ENODEV));
    s.validate();
    let _ = std::fs::remove_file(p);
}

#[test]
fn msync_rules() {
    let s = space(64);
    let (p, f) = temp_file("msync", &pattern(4));
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    assert_eq!(s.msync(a + 1, PS, MS_SYNC), Err(Errno::EINVAL));
    assert_eq!(s.msync(a, PS, MS_SYNC | MS_ASYNC), Err(Errno::EINVAL));
    assert_eq!(s.msync(a, PS, 8), Err(Errno::EINVAL));
    assert_eq!(s.msync(a, 0, MS_SYNC), Ok(()));
    s.msync(a, 4 * PS, MS_ASYNC).unwrap();
    s.munmap(a + 2 * PS, PS).unwrap();
    assert_eq!(s.msync(a, 4 * PS, MS_SYNC), Err(Errno::ENOMEM), "hole");
    s.mlock(a, PS).unwrap();
    assert_eq!(s.msync(a, PS, MS_INVALIDATE), Err(Errno::EBUSY), "locked pages");
    s.msync(a, PS, MS_SYNC).unwrap();
    s.validate();
    let _ = std::fs::remove_file(p);
}

#[test]
fn eviction_writes_shared_pages_back_and_close_too() {
    // 16 MiB shared file, 4 MiB budget: pages are evicted to the file (not
    // to swap) and read back from it.
    let (p, f) = temp_file("evict", &vec![0u8; 16 << 20]);
    {
        let s = space(4);
        let a = s.mmap(0, 16 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
        for pg in 0..4096 {
            poke(a + pg * PS, (pg % 253) as u8 + 1);
            poke(a + pg * PS + PS - 1, 0xEE);
        }
        let st = s.stats();
        assert!(st.writebacks > 0, "{st:?}");
        assert_eq!(st.swapouts, 0, "shared file pages never go to swap");
        assert!(st.resident_pages_max <= st.budget_pages);
        for pg in 0..4096 {
            assert_eq!(peek(a + pg * PS), (pg % 253) as u8 + 1, "page {pg} read back from the file");
        }
        poke(a + 4095 * PS + 1, 0x42);
        s.validate();
        // Closed (dropped) with the mapping in place: close writes back.
    }
    let c = contents(&p);
    for pg in 0..4096 {
        assert_eq!(c[pg * PS], (pg % 253) as u8 + 1, "page {pg} in the file");
        assert_eq!(c[pg * PS + PS - 1], 0xEE);
    }
    assert_eq!(c[4095 * PS + 1], 0x42, "close wrote the last change back");
    let _ = std::fs::remove_file(p);
}

/// `MAP_FIXED` of one shared file mapping over another: the replaced
/// mapping's dirty pages go to their own file, and the new file is left as
/// it was (the replaced pages were written to the new region's file too —
/// its bytes overwritten with the old mapping's; found by the simulation).
#[test]
fn a_replaced_shared_file_page_goes_to_its_own_file_only() {
    let (pa, fa) = temp_file("replace-a", &vec![0u8; 4 * PS]);
    let (pb, fb) = temp_file("replace-b", &pattern(4));
    let s = space(64);
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, fa.as_raw_fd(), 0).unwrap();
    for pg in 0..4 {
        poke(a + pg * PS, 0xA0 + pg as u8);
    }
    let b = s.mmap(a, 4 * PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fb.as_raw_fd(), 0).unwrap();
    assert_eq!(b, a);
    let (ca, cb) = (contents(&pa), contents(&pb));
    for pg in 0..4 {
        assert_eq!(ca[pg * PS], 0xA0 + pg as u8, "page {pg} of the replaced mapping reached its file");
        assert_eq!(
            cb[pg * PS..(pg + 1) * PS],
            pattern(4)[pg * PS..(pg + 1) * PS],
            "page {pg} of the new file unchanged"
        );
        assert_eq!(peek(b + pg * PS), pattern(4)[pg * PS], "the new mapping reads its file");
    }
    s.validate();
    let _ = std::fs::remove_file(pa);
    let _ = std::fs::remove_file(pb);
}

/// A range write-back (msync here; munmap and close alike) lists the dirty
/// pages, then writes them — a parked page from its staging slot. Reclaim
/// must not evict a listed parked page meanwhile: it would write it, free
/// the slot and hand it to another page, and the msync then wrote zeros or
/// another page's bytes over reclaim's good copy (close lost pages of
/// `eviction_writes_shared_pages_back_and_close_too` one run in twenty).
/// The hook stalls the msync between listing and writing, while a second
/// thread's faults keep reclaim evicting.
#[test]
fn a_range_write_back_never_writes_a_slot_reclaim_freed() {
    const PAGES: usize = 2048;
    let (p, f) = temp_file("wb-stall", &vec![0u8; PAGES * PS]);
    let (_q, g) = temp_file("wb-stall-other", &vec![0u8; PAGES * PS]);
    let s = space(2);
    let a = s.mmap(0, PAGES * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    let b = s.mmap(0, PAGES * PS, PROT_READ | PROT_WRITE, MAP_SHARED, g.as_raw_fd(), 0).unwrap();
    for round in 1..=4u8 {
        for pg in 0..PAGES {
            poke(a + pg * PS, (pg % 251) as u8 ^ round);
            poke(a + pg * PS + PS - 1, round);
        }
        s.inject_writeback_stall(30);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let r = std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    poke(b + (i % PAGES) * PS, i as u8);
                    i += 1;
                }
            });
            // (The result is checked once the other thread is stopped: a
            // panic here would leave the scope waiting for it forever.)
            let r = s.msync(a, PAGES * PS, MS_ASYNC);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        });
        s.inject_writeback_stall(0);
        assert_eq!(r, Ok(()), "round {round}: msync");
        let c = contents(&p);
        for pg in 0..PAGES {
            let want = (pg % 251) as u8 ^ round;
            assert_eq!((c[pg * PS], c[pg * PS + PS - 1]), (want, round), "round {round}: page {pg} in the file");
        }
    }
    s.validate();
    let _ = std::fs::remove_file(p);
    let _ = std::fs::remove_file(_q);
}

/// A page a range write-back listed where it was, and that was parked
/// (`MADV_COLD` here; background reclaim alike) before its copy, is
/// written from where it is now. In a space that resolves its faults in the
/// faulting thread, the copy (a kernel-mode access) cannot fault it back
/// in (`EFAULT`), and the msync said `EIO` for a page that was only parked
/// (found by the differential fuzzer's in-thread pass). Both fault modes.
#[test]
fn a_page_parked_during_a_range_write_back_is_written() {
    const PAGES: usize = 64;
    for flags in [0, UMM_F_INTHREAD_FAULTS] {
        let (p, f) = temp_file("wb-parked", &vec![0u8; PAGES * PS]);
        let s = common::open_mode(&Config { budget_bytes: 4 << 20, swap_bytes: 64 << 20, flags, ..Config::default() })
            .unwrap();
        let a = s.mmap(0, PAGES * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
        for round in 1..=3u8 {
            for pg in 0..PAGES {
                poke(a + pg * PS, pg as u8 ^ round);
                poke(a + pg * PS + PS - 1, round);
            }
            s.inject_writeback_stall(100);
            let r = std::thread::scope(|sc| {
                sc.spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    s.madvise(a, PAGES * PS, MADV_COLD).unwrap();
                });
                s.msync(a, PAGES * PS, MS_SYNC)
            });
            s.inject_writeback_stall(0);
            assert_eq!(r, Ok(()), "flags {flags:#x} round {round}: msync of pages parked meanwhile");
            let c = contents(&p);
            for pg in 0..PAGES {
                let want = (pg as u8 ^ round, round);
                assert_eq!((c[pg * PS], c[pg * PS + PS - 1]), want, "flags {flags:#x} round {round}: page {pg}");
            }
        }
        s.validate();
        s.close().unwrap();
        let _ = std::fs::remove_file(p);
    }
}

/// A streaming read of a file 4× the budget (`MADV_SEQUENTIAL`, read-only
/// shared mapping): reclaim drops the clean pages where they are — nothing
/// goes through the staging area, nothing is written — and every page reads
/// the file's data, on the first pass and on the second (re-read from it).
/// A page written in the same kind of region is never dropped without its
/// write-back.
#[test]
fn streaming_reads_drop_clean_pages_behind_and_keep_the_data() {
    let pages = 4096; // 16 MiB, budget 4 MiB
    let data = pattern(pages);
    let (p, f) = temp_file("stream", &data);
    let s = space(4);
    let a = s.mmap(0, pages * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, pages * PS, MADV_SEQUENTIAL).unwrap();
    let st0 = s.stats();
    for pass in 0..2 {
        for pg in 0..pages {
            for off in [0, 1234, PS - 1] {
                assert_eq!(peek(a + pg * PS + off), data[pg * PS + off], "pass {pass}, page {pg}+{off}");
            }
        }
    }
    let st = s.stats();
    assert!(st.resident_pages_max <= st.budget_pages, "{st:?}");
    assert_eq!(st.deactivations, st0.deactivations, "clean streaming pages skip the staging area");
    assert_eq!(st.writebacks, 0);
    assert_eq!(st.swapouts, 0);
    s.validate();

    // Written pages of a streaming region still reach the file.
    let f2 = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let b = s.mmap(0, pages * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f2.as_raw_fd(), 0).unwrap();
    s.madvise(b, pages * PS, MADV_SEQUENTIAL).unwrap();
    for pg in 0..pages {
        let v = peek(b + pg * PS);
        if pg % 3 == 0 {
            poke(b + pg * PS, !v);
        }
    }
    for pg in 0..pages {
        let want = if pg % 3 == 0 { !data[pg * PS] } else { data[pg * PS] };
        assert_eq!(peek(b + pg * PS), want, "page {pg} after the write pass");
    }
    s.munmap(b, pages * PS).unwrap();
    s.munmap(a, pages * PS).unwrap();
    s.validate();
    drop(s);
    let c = contents(&p);
    for pg in 0..pages {
        let want = if pg % 3 == 0 { !data[pg * PS] } else { data[pg * PS] };
        assert_eq!(c[pg * PS], want, "page {pg} in the file");
    }
    let _ = std::fs::remove_file(p);
}

static GROW_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

fn grow_file(_addr: usize) {
    // From the SIGBUS handler: make the file long enough, so that the retried
    // access is served.
    let fd = GROW_FD.load(std::sync::atomic::Ordering::SeqCst);
    reopen(fd).set_len(4 * PS as u64).unwrap();
}

// A second descriptor for the same file.
fn reopen(fd: i32) -> File {
    // (`File::from_raw_fd` would need unsafe: reopen through /proc instead.)
    OpenOptions::new().write(true).open(format!("/proc/self/fd/{fd}")).unwrap()
}

#[test]
fn touching_past_the_end_of_the_file_raises_sigbus() {
    let s = space(64);
    let (p, f) = temp_file("sigbus", &pattern(1));
    let a = s.mmap(0, 4 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    GROW_FD.store(f.as_raw_fd(), std::sync::atomic::Ordering::SeqCst);
    let rec = usermm_sys::testing::SigbusRecorder::install_with(a, a + 4 * PS, grow_file).unwrap();
    // Page 2 is past the end: SIGBUS at exactly this address; the handler
    // grows the file and the retried read sees its zeros.
    let v = std::thread::scope(|sc| sc.spawn(|| peek(a + 2 * PS + 8)).join().unwrap());
    let r = rec.record();
    drop(rec);
    assert_eq!(v, 0);
    assert_eq!(r.count, 1);
    assert_eq!(r.addr, a + 2 * PS + 8, "si_addr is the address touched");
    s.munmap(a, 4 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

#[test]
fn one_hundred_thousand_file_regions() {
    // umap fails past about 950 regions (its issue #91): it registers every
    // region with userfaultfd separately. usermm registers its reservation once.
    let s = common::open_mode(&Config {
        budget_bytes: 64 << 20,
        swap_bytes: 0,
        max_regions: 200_000,
        reserve_bytes: 1 << 30,
        ..Config::default()
    })
    .unwrap();
    let (p, f) = temp_file("many", &pattern(3));
    let (base, _) = s.reservation();
    const N: usize = 100_000;
    for i in 0..N {
        // Alternate file pages 0, 2, 0, 2: neighbours are never contiguous
        // in the file, so they never merge (as on Linux).
        let off = (i % 2 * 2 * PS) as i64;
        let a = s.mmap(base + i * PS, PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), off).unwrap();
        assert_eq!(a, base + i * PS);
    }
    assert_eq!(s.stats().regions, N as u64);
    let data = pattern(3);
    for i in (0..N).step_by(997) {
        let file_page = i % 2 * 2;
        assert_eq!(peek(base + i * PS + 5), data[file_page * PS + 5], "region {i}");
    }
    s.validate();
    for i in 0..N {
        s.munmap(base + i * PS, PS).unwrap();
    }
    assert_eq!(s.stats().regions, 0);
    s.validate();
    let _ = std::fs::remove_file(p);
}

/// Runs this test binary's ignored test `name` alone in a child process,
/// with `env` set to the file `path` (a child-process entry point returns at
/// once without it).
fn run_child(name: &str, env: &str, path: &PathBuf) -> std::process::Output {
    common::run_entry(name, &[(env, path.into())])
}

const CRASH_ENV: &str = "USERMM_FILE_CRASH_CHILD";

#[test]
#[ignore = "child-process entry point of msync_sync_data_survives_sigkill"]
fn crash_child() {
    let Ok(path) = std::env::var(CRASH_ENV) else { return };
    let s = space(64);
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let a = s.mmap(0, 16 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    for i in 0..16 * PS {
        poke(a + i, (i % 241) as u8 ^ 0x5A);
    }
    s.msync(a, 16 * PS, MS_SYNC).unwrap();
    eprintln!("child: synced");
    // Killed right after the call returned: nothing else runs.
    usermm_sys::testing::kill_self();
}

#[test]
fn msync_sync_data_survives_sigkill() {
    use std::os::unix::process::ExitStatusExt;
    let (p, _f) = temp_file("crash", &vec![0u8; 16 * PS]);
    let out = run_child("crash_child", CRASH_ENV, &p);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("child: synced"), "child output: {err}");
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{:?}", out.status);
    let c = contents(&p);
    assert_eq!(c.len(), 16 * PS);
    for (i, b) in c.iter().enumerate() {
        assert_eq!(*b, (i % 241) as u8 ^ 0x5A, "byte {i} acknowledged by MS_SYNC is in the file");
    }
    let _ = std::fs::remove_file(p);
}

#[test]
fn write_back_errors_keep_data_and_are_reported() {
    let s = space(64);
    let (p, f) = temp_file("ioerr", &pattern(4));
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    poke(a + 7, 0x99);
    s.inject_swap_errors(0, 1);
    assert_eq!(s.msync(a, 4 * PS, MS_SYNC), Err(Errno::EIO), "a failed write-back is reported");
    assert_eq!(peek(a + 7), 0x99, "the data is still in memory");
    s.msync(a, 4 * PS, MS_SYNC).unwrap();
    assert_eq!(contents(&p)[7], 0x99, "the next msync wrote it");
    s.munmap(a, 4 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

#[test]
fn a_read_error_raises_sigbus_and_the_retry_reads_the_file() {
    let s = space(64);
    let data = pattern(4);
    let (p, f) = temp_file("rderr", &data);
    let a = s.mmap(0, 4 * PS, PROT_READ, MAP_PRIVATE, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, 4 * PS, MADV_RANDOM).unwrap();
    s.inject_swap_errors(1, 0);
    let rec = usermm_sys::testing::SigbusRecorder::install(a, a + 4 * PS).unwrap();
    let v = std::thread::scope(|sc| sc.spawn(|| peek(a + PS + 3)).join().unwrap());
    let r = rec.record();
    drop(rec);
    assert_eq!(r.count, 1, "one SIGBUS for one read error");
    assert_eq!(r.addr, a + PS + 3);
    assert_eq!(v, data[PS + 3], "never wrong data: the retry read the file");
    s.munmap(a, 4 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

#[test]
fn dontneed_on_a_shared_file_mapping_writes_back_then_rereads() {
    let s = space(64);
    let (p, f) = temp_file("dontneed", &pattern(4));
    let a = s.mmap(0, 4 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    poke(a + 2 * PS + 1, 0x31);
    s.madvise(a, 4 * PS, MADV_DONTNEED).unwrap();
    let mut st = vec![0u32; 4];
    s.page_state(a, 4, &mut st).unwrap();
    assert!(st.iter().all(|x| x & UMM_PAGE_RESIDENT == 0), "dropped");
    assert_eq!(contents(&p)[2 * PS + 1], 0x31, "written back before the drop");
    assert_eq!(peek(a + 2 * PS + 1), 0x31, "re-read from the file");
    s.munmap(a, 4 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

#[test]
fn willneed_reads_the_file_ahead_asynchronously() {
    let s = space(64);
    let data = pattern(64);
    let (p, f) = temp_file("willneed", &data);
    let a = s.mmap(0, 64 * PS, PROT_READ, MAP_PRIVATE, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, 64 * PS, MADV_WILLNEED).unwrap();
    // Asynchronous: wait (bounded) for the read-in to land.
    let mut st = vec![0u32; 64];
    for _ in 0..200 {
        s.page_state(a, 64, &mut st).unwrap();
        if st.iter().all(|x| x & UMM_PAGE_RESIDENT != 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(st.iter().all(|x| x & UMM_PAGE_RESIDENT != 0), "read ahead: {st:x?}");
    let faults = s.stats().faults;
    assert_eq!(peek(a + 63 * PS + 9), data[63 * PS + 9]);
    assert_eq!(s.stats().faults, faults, "no fault after the read-ahead");
    s.munmap(a, 64 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

/// How many of the file's first `pages` pages the host page cache holds.
fn host_cached_pages(f: &File, pages: usize) -> usize {
    let m = usermm_sys::host::HostFileMap::open(f, pages * PS).unwrap();
    let v = usermm_sys::kernel::mincore(m.addr(), pages * PS).unwrap();
    v.iter().filter(|b| *b & 1 != 0).count()
}

#[test]
fn host_page_cache_is_dropped_behind_unless_kept() {
    for keep in [false, true] {
        let flags = if keep { UMM_F_KEEP_FILE_CACHE } else { 0 };
        let s = common::open_mode(&Config { budget_bytes: 64 << 20, flags, ..Config::default() }).unwrap();
        let data = pattern(32);
        let (p, f) = temp_file(if keep { "keep-cache" } else { "drop-cache" }, &data);
        let a = s.mmap(0, 32 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
        s.populate(a, 32 * PS, MADV_POPULATE_READ).1.unwrap();
        assert_eq!(peek(a + 31 * PS + 3), data[31 * PS + 3]);
        let cached = host_cached_pages(&f, 32);
        if keep {
            assert_eq!(cached, 32, "UMM_F_KEEP_FILE_CACHE: the host keeps the pages usermm read");
        } else {
            assert_eq!(cached, 0, "default: the host copy is dropped behind the read");
        }
        s.munmap(a, 32 * PS).unwrap();
        let _ = std::fs::remove_file(p);
    }
}

/// Open descriptors of this process that refer to `p`.
fn open_descriptors_of(p: &PathBuf) -> usize {
    let want = std::fs::canonicalize(p).unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| *l == want)
        .count()
}

#[test]
fn reads_go_through_descriptions_of_its_own_and_none_leak() {
    // usermm reads a file through one open file description per reading
    // thread (its own read-ahead state, the program's descriptor untouched),
    // and closes them all with the file's last region. (Copies: a
    // sequential read-only region would map windows of the page cache.)
    let pages = 1024;
    let data = pattern(pages);
    let (p, f) = temp_file("readers", &data);
    assert_eq!(open_descriptors_of(&p), 1);
    let s = common::open_mode(&Config {
        budget_bytes: 64 << 20,
        swap_bytes: 64 << 20,
        flags: UMM_F_COPY_LOCKED_FILES,
        ..Config::default()
    })
    .unwrap();
    let a = s.mmap(0, pages * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, pages * PS, MADV_SEQUENTIAL).unwrap();
    for pg in 0..pages {
        assert_eq!(peek(a + pg * PS + 7), data[pg * PS + 7], "page {pg}");
    }
    // The program's, usermm's duplicate, and at least one reader's.
    let during = open_descriptors_of(&p);
    assert!(during >= 3, "{during} descriptors of the file while mapped");
    s.munmap(a, pages * PS).unwrap();
    let mut after = open_descriptors_of(&p);
    for _ in 0..100 {
        if after == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        after = open_descriptors_of(&p);
    }
    assert_eq!(after, 1, "descriptors left open after the last region went");
    s.validate();
    drop(s);
    let _ = std::fs::remove_file(p);
}

#[test]
fn single_page_reads_leave_no_host_copy_and_read_the_partial_last_page() {
    // MADV_RANDOM: each fault reads exactly its page, with O_DIRECT where
    // the file system allows it (else through the page cache, dropped just
    // after): either way no host copy is left, and the tail of the last,
    // partial page reads as zeros.
    let mut data = pattern(6);
    data.truncate(5 * PS + 100);
    let (p, f) = temp_file("single-pages", &data);
    // Writing the file cached it; start cold, so that what is cached after
    // is what usermm's reads left.
    usermm_sys::host::fadvise(&f, 0, 0, usermm_sys::host::POSIX_FADV_DONTNEED).unwrap();
    assert_eq!(host_cached_pages(&f, 6), 0);
    let s = space(64);
    let a = s.mmap(0, 6 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    s.madvise(a, 6 * PS, MADV_RANDOM).unwrap();
    for pg in [3, 0, 5, 1] {
        assert_eq!(peek(a + pg * PS + 17), data[pg * PS + 17], "page {pg}");
    }
    assert_eq!(peek(a + 5 * PS + 99), data[5 * PS + 99]);
    assert_eq!(peek(a + 5 * PS + 100), 0, "past the end of the file in the last page");
    let st = s.stats();
    assert_eq!(st.resident_pages, 4, "exactly the pages touched: {st:?}");
    let mut cached = host_cached_pages(&f, 6);
    for _ in 0..100 {
        if cached == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        cached = host_cached_pages(&f, 6);
    }
    assert_eq!(cached, 0, "pages left in the host page cache");
    s.munmap(a, 6 * PS).unwrap();
    let _ = std::fs::remove_file(p);
}

const NOFILE_ENV: &str = "USERMM_FILE_NOFILE_CHILD";

#[test]
#[ignore = "child-process entry point of reader_descriptions_stay_out_of_the_upper_half_of_the_fd_table"]
fn nofile_child() {
    let Ok(path) = std::env::var(NOFILE_ENV) else { return };
    let s = space(64);
    let f = File::open(&path).unwrap();
    let pages = 64;
    let a = s.mmap(0, pages * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    // The next descriptor number m; a soft limit of 2m - 2 lets open() give
    // m, m+1, ... but each of them is in the upper half of the table.
    let m = File::open("/dev/null").unwrap().as_raw_fd() as u64;
    let lim = 2 * m - 2;
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid out-pointer, then a valid rlimit, for the calls.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
    rl.rlim_cur = lim;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) }, 0);
    let data = pattern(pages);
    s.madvise(a, 32 * PS, MADV_RANDOM).unwrap();
    s.madvise(a + 32 * PS, 32 * PS, MADV_SEQUENTIAL).unwrap();
    for pg in (0..pages).rev() {
        assert_eq!(peek(a + pg * PS + 5), data[pg * PS + 5], "page {pg}");
    }
    // The program's descriptor and usermm's duplicate, nothing more.
    assert_eq!(open_descriptors_of(&PathBuf::from(&path)), 2);
    s.munmap(a, pages * PS).unwrap();
    eprintln!("child: read through the shared descriptor");
}

#[test]
fn reader_descriptions_stay_out_of_the_upper_half_of_the_fd_table() {
    let (p, _f) = temp_file("nofile", &pattern(64));
    let out = run_child("nofile_child", NOFILE_ENV, &p);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("child: read through the shared descriptor"), "child: {err}");
    let _ = std::fs::remove_file(p);
}
