//! A user-mode touch of a guard page (`MADV_GUARD_INSTALL`, Linux 6.13)
//! raises SIGSEGV, on the host kernel and on a space alike — also after
//! `MADV_DONTNEED` over it. Each touch runs in a child process (this test
//! binary, re-run on its ignored entry point), which must die of SIGSEGV;
//! the same child without the guard exits normally.

use usermm::consts::*;
use usermm::Config;

mod common;

const PAGE: usize = 4096;
const CASE_ENV: &str = "USERMM_GUARD_TOUCH_CASE";

#[test]
#[ignore = "child-process entry point of a_touch_of_a_guard_page_is_sigsegv"]
fn touch_child() {
    let Ok(case) = std::env::var(CASE_ENV) else { return };
    let (backend, guard) = case.split_once(':').unwrap();
    let guard = guard == "guard";
    let rw = PROT_READ | PROT_WRITE;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS;
    // The space lives until the process dies (a touch never returns).
    let space;
    let a = if backend == "kernel" {
        // SAFETY: new anonymous memory, used only through raw addresses.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4 * PAGE, rw, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as usize;
        if guard {
            // SAFETY: our own mapping; nothing refers into it.
            assert_eq!(unsafe { libc::madvise(p.cast::<u8>().add(PAGE).cast(), PAGE, MADV_GUARD_INSTALL) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { libc::madvise(p, 4 * PAGE, libc::MADV_DONTNEED) }, 0);
        }
        a
    } else {
        space = common::open_mode(&Config { budget_bytes: 16 << 20, ..Config::default() }).unwrap();
        let a = space.mmap(0, 4 * PAGE, rw, flags, -1, 0).unwrap();
        if guard {
            space.madvise(a + PAGE, PAGE, MADV_GUARD_INSTALL).unwrap();
            space.madvise(a, 4 * PAGE, MADV_DONTNEED).unwrap();
        }
        a
    };
    usermm_sys::kernel::poke(a, 1);
    eprintln!("child: touching the guarded page");
    usermm_sys::kernel::poke(a + PAGE, 1);
    eprintln!("child: touched, no signal");
}

fn run(case: &str) -> std::process::Output {
    common::run_entry("touch_child", &[(CASE_ENV, case.into())])
}

#[test]
fn a_touch_of_a_guard_page_is_sigsegv() {
    use std::os::unix::process::ExitStatusExt;
    for backend in ["kernel", "usermm"] {
        let out = run(&format!("{backend}:guard"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("touching the guarded page"), "{backend}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{backend}: a guard page touched: {:?}\n{err}",
            out.status
        );
        let out = run(&format!("{backend}:none"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.contains("touched, no signal"),
            "{backend}: no guard: {:?}\n{err}",
            out.status
        );
    }
}
