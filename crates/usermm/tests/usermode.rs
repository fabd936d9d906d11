//! The user-mode-only userfaultfd fallback (SPEC §4), forced with
//! `UMM_F_FORCE_USER_MODE` so that it runs on this privileged machine too:
//! the space says so, user-space touches work, and a kernel-mode access to a
//! missing page (`read(2)` into an untouched buffer) fails with `EFAULT`.

use usermm::consts::*;
use usermm::{Config, Errno, Space, UffdMode};
use usermm_sys::kernel::{peek, pipe_read_into, poke};

const PAGE: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;

fn user_mode_space() -> Space {
    Space::open(&Config {
        budget_bytes: 16 << 20,
        reserve_bytes: 1 << 30,
        swap_bytes: 16 << 20,
        flags: UMM_F_FORCE_USER_MODE,
        ..Config::default()
    })
    .expect("space")
}

#[test]
fn reports_user_mode_only() {
    let s = user_mode_space();
    assert_eq!(s.uffd_mode(), UffdMode::UserModeOnly);
    assert_eq!(s.stats().user_mode_only, 1);
    let a = s.mmap(0, 4 * PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    let smaps = s.smaps();
    let flags: Vec<&str> = smaps.lines().filter(|l| l.starts_with("VmFlags:")).collect();
    assert_eq!(flags.len(), 1, "{smaps}");
    assert!(flags[0].split_whitespace().any(|f| f == "uo"), "{smaps}");
    assert_eq!(s.munmap(a, 4 * PAGE), Ok(()));
    s.validate();
}

#[test]
fn full_mode_space_has_no_uo_flag() {
    let s = Space::open(&Config { budget_bytes: 16 << 20, reserve_bytes: 1 << 30, ..Config::default() }).unwrap();
    assert_eq!(s.uffd_mode(), UffdMode::Full);
    assert_eq!(s.stats().user_mode_only, 0);
    let _a = s.mmap(0, PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    assert!(!s.smaps().lines().any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uo")));
}

#[test]
fn user_touches_work() {
    let s = user_mode_space();
    let a = s.mmap(0, 64 * PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    assert_eq!(peek(a + 3 * PAGE), 0, "a fresh page reads zero");
    for p in 0..64 {
        poke(a + p * PAGE + 7, p as u8 ^ 0x5A);
    }
    for p in 0..64 {
        assert_eq!(peek(a + p * PAGE + 7), p as u8 ^ 0x5A, "page {p}");
    }
    let mut v = vec![0u8; 64];
    s.mincore(a, 64 * PAGE, &mut v).unwrap();
    assert!(v.iter().all(|&x| x & 1 == 1));
    s.validate();
}

#[test]
fn kernel_access_to_missing_page_is_efault() {
    let s = user_mode_space();
    let a = s.mmap(0, 4 * PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    let data = [0xC3u8; 64];
    // Page 0 untouched: the kernel cannot have usermm serve its fault.
    assert_eq!(pipe_read_into(a, &data), Err(Errno::EFAULT));
    // Once user space has touched the page, the kernel can write into it.
    poke(a + PAGE, 1);
    assert_eq!(pipe_read_into(a + PAGE, &data), Ok(data.len()));
    assert_eq!(peek(a + PAGE), 0xC3);
    assert_eq!(peek(a + PAGE + 63), 0xC3);
    assert_eq!(peek(a + PAGE + 64), 0);
    // The failed read left page 0 untouched and readable as zeros.
    assert_eq!(peek(a), 0);
    s.validate();
}

#[test]
fn full_mode_kernel_access_to_missing_page_works() {
    // The counterpart on full userfaultfd: the same read succeeds.
    let s = Space::open(&Config { budget_bytes: 16 << 20, reserve_bytes: 1 << 30, ..Config::default() }).unwrap();
    let a = s.mmap(0, 4 * PAGE, RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    let data = [0x3Cu8; 100];
    assert_eq!(pipe_read_into(a, &data), Ok(data.len()));
    assert_eq!(peek(a + 99), 0x3C);
    assert_eq!(peek(a + 100), 0);
    s.validate();
}
