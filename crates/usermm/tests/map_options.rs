//! `MapOptions`, the memmap2-shaped builder: each option does what it says
//! (measured in the space's stats and the file's bytes), and bad input is
//! `EINVAL` with nothing left mapped.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use usermm::consts::*;
use usermm::{Errno, MapOptions};

const PS: usize = 4096;

#[test]
fn anonymous_options_populate_lock_and_lock_on_fault() {
    let s = common::space(8, 16);
    let base = s.stats().resident_pages;
    let m = MapOptions::new().len(64 * PS).populate().map_anon(&s).unwrap();
    assert_eq!(s.stats().resident_pages - base, 64, "populate faults every page in");
    assert!(m.iter().all(|&b| b == 0));
    drop(m);

    let m = MapOptions::new().len(32 * PS).lock().map_anon(&s).unwrap();
    assert_eq!(s.stats().locked_pages, 32, "lock pins every page now");
    m.unmap().unwrap();
    assert_eq!(s.stats().locked_pages, 0);

    let mut m = MapOptions::new().len(32 * PS).lock_on_fault().map_anon(&s).unwrap();
    assert_eq!(s.stats().locked_pages, 0, "lock on fault pins nothing before a touch");
    m[0] = 1;
    m[5 * PS] = 2;
    let locked = s.stats().locked_pages;
    assert!((2..=32).contains(&locked), "touched pages (and their fault-around) pinned: {locked}");
    drop(m);

    let mut m = MapOptions::new().len(8 * PS).advice(MADV_RANDOM).advice(MADV_DONTFORK).map_anon(&s).unwrap();
    m[0] = 7;
    let vmflags = s.smaps().lines().find(|l| l.starts_with("VmFlags:")).unwrap_or_default().to_string();
    assert!(vmflags.contains(" rr") && vmflags.contains(" dc"), "MADV_RANDOM, MADV_DONTFORK in smaps: {vmflags}");
    drop(m);
    s.validate();
}

#[test]
fn bad_input_is_einval_and_maps_nothing() {
    let s = common::space(8, 16);
    let regions = || {
        let smaps = s.smaps();
        let heads = smaps.lines().filter(|l| l.split(' ').next().is_some_and(|a| a.contains('-') && !a.contains(':')));
        heads.count()
    };
    let _keep = MapOptions::new().len(PS).map_anon(&s).unwrap();
    let before = regions();
    assert_eq!(before, 1, "{}", s.smaps());
    assert_eq!(MapOptions::new().map_anon(&s).err(), Some(Errno::EINVAL), "no length");
    assert_eq!(MapOptions::new().len(0).map_anon(&s).err(), Some(Errno::EINVAL));
    assert_eq!(MapOptions::new().len(PS).offset(PS as u64).map_anon(&s).err(), Some(Errno::EINVAL));
    for a in [MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MADV_GUARD_INSTALL, MADV_HWPOISON] {
        assert_eq!(MapOptions::new().len(PS).advice(a).map_anon(&s).err(), Some(Errno::EINVAL), "advice {a}");
    }
    // An error after the mmap (advice the space refuses) unmaps again.
    assert_eq!(MapOptions::new().len(PS).advice(12345).map_anon(&s).err(), Some(Errno::EINVAL));
    let f = common::shared_temp_file("opts-bad", 4);
    // SAFETY: nothing else uses the unlinked file.
    unsafe {
        assert_eq!(MapOptions::new().offset(100).map(&s, &f).err(), Some(Errno::EINVAL), "unaligned offset");
        assert_eq!(MapOptions::new().offset(5 * PS as u64).map(&s, &f).err(), Some(Errno::EINVAL), "past the end");
        assert_eq!(MapOptions::new().len(5 * PS).map(&s, &f).err(), Some(Errno::EINVAL), "longer than the file");
        assert_eq!(
            MapOptions::new().offset(PS as u64).len(4 * PS).map(&s, &f).err(),
            Some(Errno::EINVAL),
            "offset + len past the end"
        );
    }
    assert_eq!(regions(), before, "{}", s.smaps());
    s.validate();
}

#[test]
fn file_mappings_read_write_and_copy_as_memmap2() {
    let s = common::space(8, 16);
    let mut f = common::shared_temp_file("opts-file", 4);
    let content: Vec<u8> = (0..4 * PS).map(|i| (i % 251) as u8).collect();
    f.write_all(&content).unwrap();

    // SAFETY: nothing else writes or truncates the unlinked file while the
    // mapping lives.
    let ro = unsafe { MapOptions::new().offset(PS as u64).populate().map(&s, &f) }.unwrap();
    assert_eq!(ro.len(), 3 * PS, "the rest of the file from the offset");
    assert_eq!(&ro[..], &content[PS..]);
    ro.unmap().unwrap();

    // SAFETY: as above.
    let mut copy = unsafe { MapOptions::new().map_copy(&s, &f) }.unwrap();
    assert_eq!(&copy[..], &content[..]);
    copy[10] = 0xEE;
    drop(copy);

    // SAFETY: as above.
    let mut rw = unsafe { MapOptions::new().len(2 * PS).map_mut(&s, &f) }.unwrap();
    assert_eq!(&rw[..], &content[..2 * PS], "the copy's write stayed private");
    rw[PS + 1] = 0xAA;
    rw.unmap().unwrap(); // writes back

    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    let mut want = content.clone();
    want[PS + 1] = 0xAA;
    assert_eq!(back, want, "the shared mapping's write reached the file, the private one's did not");
    s.validate();
}
