//! `Space::mincore` and `Space::page_state` against Linux's rules for
//! mincore(2), found while writing the C ABI:
//!
//! - A huge length is an errno (`ENOMEM`, from the range check), never an
//!   allocation sized by the length: Linux rejects the range before touching
//!   anything. The cases that would abort the process run in a child process
//!   (this same test executable, re-run with `USERMM_INTROSPECT_CHILD` set),
//!   so that an abort fails one test instead of killing the whole binary.
//! - On a hole, mincore(2) has filled the vector up to the hole and leaves the
//!   bytes past it as they were.

mod common;

use std::process::Command;

use usermm::consts::*;
use usermm::{Config, Errno, Space};

const PAGE: usize = 4096;

fn open() -> Space {
    common::open_mode(&Config { budget_bytes: 4 << 20, swap_bytes: 0, reserve_bytes: 1 << 30, ..Config::default() })
        .unwrap()
}

/// Runs `name` in a child process when not already in one; `body` in the
/// child; the parent asserts that the child passed.
fn in_child(name: &str, body: impl FnOnce()) {
    if std::env::var_os("USERMM_INTROSPECT_CHILD").is_some() {
        body();
        return;
    }
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env("USERMM_INTROSPECT_CHILD", "1")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{name} in a child process: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr).lines().take(12).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn mincore_huge_len_is_enomem() {
    in_child("mincore_huge_len_is_enomem", || {
        let s = open();
        let (base, _) = s.reservation();
        let mut vec = [0u8; 4];
        assert_eq!(s.mincore(base, usize::MAX - 2 * PAGE, &mut vec), Err(Errno::ENOMEM));
    });
}

#[test]
fn page_state_huge_npages_is_enomem() {
    in_child("page_state_huge_npages_is_enomem", || {
        let s = open();
        let (base, _) = s.reservation();
        let mut states = [0u32; 4];
        assert_eq!(s.page_state(base, usize::MAX / PAGE, &mut states), Err(Errno::ENOMEM));
    });
}

#[test]
fn mincore_leaves_bytes_past_a_hole_untouched() {
    let s = open();
    // Raw addresses (a `Mapping`'s range cannot be partly unmapped through
    // the address-based call: EBUSY).
    let a = s.mmap(0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    usermm_sys::kernel::poke(a, 1);
    // Region: A A . A  (page 2 is a hole).
    s.munmap(a + 2 * PAGE, PAGE).unwrap();
    let mut vec = [0xEEu8; 4];
    assert_eq!(s.mincore(a, 4 * PAGE, &mut vec), Err(Errno::ENOMEM));
    assert_eq!(vec[0] & 1, 1, "page 0 is resident");
    assert_eq!(vec[2..], [0xEE, 0xEE], "Linux leaves the bytes from the hole on as they were");
}
