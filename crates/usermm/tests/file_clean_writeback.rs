//! Bug demonstration (found by the `outofcore` experiment): usermm writes
//! back *clean* pages of a `MAP_SHARED` file region. Linux writes back only
//! dirty pages, so a read-only shared mapping of a file opened `O_RDONLY`
//! can be read past the budget and unmapped without error; usermm's write
//! to the `O_RDONLY` descriptor fails with `EBADF`, so `munmap` returns
//! `EBADF` and reclaim cannot evict (a read beyond the budget ends in
//! SIGBUS). Also, an `O_RDWR` descriptor gets one needless write per page.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;

use usermm::consts::*;
use usermm::Config;
use usermm_sys::kernel::peek;

const PS: usize = 4096;

fn file(name: &str, pages: usize) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("usermm-test-{}-{name}", std::process::id()));
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&p).unwrap();
    f.write_all(&vec![7u8; pages * PS]).unwrap();
    f.sync_all().unwrap();
    p
}

#[test]
fn read_only_shared_mapping_of_a_read_only_fd_unmaps_cleanly() {
    let p = file("rdonly-unmap", 4);
    let f = File::open(&p).unwrap();
    let s = common::open_mode(&Config { budget_bytes: 16 << 20, swap_bytes: 0, ..Config::default() }).unwrap();
    let a = s.mmap(0, 4 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    assert_eq!(peek(a), 7);
    // Linux: Ok (nothing is dirty). usermm today: Err(EBADF).
    let r = s.munmap(a, 4 * PS);
    let _ = std::fs::remove_file(&p);
    assert_eq!(r, Ok(()));
}

#[test]
fn reading_a_shared_mapping_writes_nothing_back() {
    let p = file("rdwr-clean", 4);
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let s = common::open_mode(&Config { budget_bytes: 16 << 20, swap_bytes: 0, ..Config::default() }).unwrap();
    let a = s.mmap(0, 4 * PS, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).unwrap();
    for i in 0..4 {
        assert_eq!(peek(a + i * PS), 7);
    }
    s.munmap(a, 4 * PS).unwrap();
    let _ = std::fs::remove_file(&p);
    // usermm today: 4 (every clean page written back on munmap).
    assert_eq!(s.stats().writebacks, 0);
}
