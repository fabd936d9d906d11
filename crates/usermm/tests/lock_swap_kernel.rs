//! A page swapped out and then locked leaves swap — on the host kernel (with
//! a host swap file of this test's own) and on a space, side by side
//! (issue 45 item 7: Linux frees the swap slot of a page it swaps into a
//! locked region; a locked secret must not stay in swap).
//!
//! One test in its own binary: the host side reads this process's `VmSwap`,
//! which no other test of the process may move meanwhile.

mod common;

use usermm::consts::*;
use usermm::Config;

const PS: usize = 4096;
const PAGES: usize = 16;

/// A host swap file, active for as long as the value lives.
struct HostSwap(String);

impl HostSwap {
    fn on(mib: usize) -> Option<HostSwap> {
        let path = format!("/tmp/usermm-test-lockswap-{}", std::process::id());
        let sh = |cmd: String| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if sh(format!("fallocate -l {mib}M {path} && chmod 600 {path} && mkswap {path} >/dev/null && swapon {path}")) {
            Some(HostSwap(path))
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

impl Drop for HostSwap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// This process's swapped-out memory (`VmSwap`, KiB).
fn vm_swap_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmSwap:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const MARKER: &[u8] = b"SWAPPED-THEN-LOCKED-KERNEL-SIDE";

/// Host kernel: `(KiB swapped after MADV_PAGEOUT, KiB swapped after mlock)`.
fn kernel_side() -> (u64, u64) {
    // SAFETY: a fresh private anonymous mapping of this test's own, written
    // and read only through the pointer below, unmapped at the end.
    unsafe {
        let a = libc::mmap(
            std::ptr::null_mut(),
            PAGES * PS,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8;
        assert_ne!(a as isize, -1);
        for p in 0..PAGES {
            std::ptr::copy_nonoverlapping(MARKER.as_ptr(), a.add(p * PS), MARKER.len());
        }
        let base = vm_swap_kib();
        assert_eq!(libc::madvise(a as *mut _, PAGES * PS, libc::MADV_PAGEOUT), 0);
        let out = vm_swap_kib() - base;
        assert_eq!(libc::mlock(a as *const _, PAGES * PS), 0);
        let after = vm_swap_kib().saturating_sub(base);
        for p in 0..PAGES {
            assert_eq!(std::slice::from_raw_parts(a.add(p * PS), MARKER.len()), MARKER);
        }
        libc::munlock(a as *const _, PAGES * PS);
        libc::munmap(a as *mut _, PAGES * PS);
        (out, after)
    }
}

#[test]
fn a_swapped_page_locked_leaves_swap_on_the_kernel_and_on_a_space() {
    let Some(_swap) = HostSwap::on(64) else {
        panic!("cannot activate a host swap file (needs root, fallocate, mkswap, swapon): this test cannot run here");
    };
    let (k_out, k_after) = kernel_side();
    assert!(k_out >= (PAGES * PS / 1024) as u64, "the kernel paged out {k_out} KiB (wanted {})", PAGES * PS / 1024);

    let s = common::open_mode(&Config { budget_bytes: 64 << 20, swap_bytes: 64 << 20, ..Config::default() }).unwrap();
    let a = s.mmap(0, PAGES * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    for p in 0..PAGES {
        for (i, b) in MARKER.iter().enumerate() {
            usermm_sys::kernel::poke(a + p * PS + i, *b);
        }
    }
    s.madvise(a, PAGES * PS, MADV_PAGEOUT).unwrap();
    let u_out = s.stats().swapped_pages;
    s.mlock(a, PAGES * PS).unwrap();
    let st = s.stats();
    // Pages still swapped or swap-cached, or whose bytes are still in the
    // swap file: none once locked.
    let in_file = s.swap_contents().unwrap().windows(MARKER.len()).any(|w| w == MARKER);
    let u_after = st.swapped_pages + st.swap_cached_pages + u64::from(in_file);
    for p in 0..PAGES {
        assert_eq!(usermm_sys::kernel::peek(a + p * PS), MARKER[0]);
    }
    // Side by side: both paged the pages out, both hold no swap for them
    // once they are locked.
    assert_eq!(
        (k_out >= (PAGES * PS / 1024) as u64, k_after),
        (u_out >= PAGES as u64, u_after),
        "kernel: {k_out} KiB out, {k_after} KiB after mlock; usermm: {u_out} pages out, {u_after} after ({st:?})"
    );
    s.validate();
}
