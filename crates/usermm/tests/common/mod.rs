//! Helpers every native integration test shares: opening a space (failing
//! loudly, with the reason, where userfaultfd is not available), and a
//! timeout for calls that must not hang.

#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

use usermm::{Config, Space};

/// Opens a space with `cfg`; panics with the reason if it cannot (these
/// tests need userfaultfd with kernel-mode faults: root, or access to
/// `/dev/userfaultfd`; they never skip).
///
/// With `USERMM_TEST_SWAP_URL` set, a space that has swap swaps to that page
/// store instead of a file (`scripts/test.sh` runs the swap tests a second
/// time so, against a Redis server of its own).
pub fn open(cfg: &Config) -> Space {
    Space::open(&with_test_store(cfg.clone())).unwrap_or_else(|e| {
        panic!("umm_open failed ({e}): the native tests need userfaultfd (root, or rw access to /dev/userfaultfd)")
    })
}

/// `Space::open(cfg)` in the mode of this run ([`with_test_store`]): for
/// tests that handle the error themselves.
pub fn open_mode(cfg: &Config) -> Result<Space, usermm::Errno> {
    Space::open(&with_test_store(cfg.clone()))
}

/// `cfg` with `swap_url` from `USERMM_TEST_SWAP_URL` when it has swap and
/// no store of its own, with `UMM_F_INTHREAD_FAULTS` when
/// `USERMM_TEST_INTHREAD` is 1 (`scripts/test.sh` runs the tests that apply
/// a second time so), and with `UMM_F_FRAME_POOL` when
/// `USERMM_TEST_FRAME_POOL` is 1 (that second pass too).
pub fn with_test_store(mut cfg: Config) -> Config {
    if cfg.swap_bytes > 0 && cfg.swap_url.is_none() {
        cfg.swap_url = std::env::var("USERMM_TEST_SWAP_URL").ok().filter(|u| !u.is_empty());
    }
    if in_thread_run() {
        cfg.flags |= usermm::consts::UMM_F_INTHREAD_FAULTS;
    }
    if std::env::var("USERMM_TEST_FRAME_POOL").is_ok_and(|v| v == "1") {
        cfg.flags |= usermm::consts::UMM_F_FRAME_POOL;
    }
    cfg
}

/// Whether this run puts every test space in in-thread fault mode
/// (`USERMM_TEST_INTHREAD=1`).
pub fn in_thread_run() -> bool {
    std::env::var("USERMM_TEST_INTHREAD").is_ok_and(|v| v == "1")
}

/// A space with a budget and swap of the given MiB.
pub fn space(budget_mib: usize, swap_mib: usize) -> Space {
    open(&Config { budget_bytes: budget_mib << 20, swap_bytes: swap_mib << 20, ..Config::default() })
}

/// A space with a budget and swap of the given pages (4 KiB) and flags.
pub fn space_pages(budget_pages: usize, swap_pages: usize, flags: u32) -> Space {
    open(&Config { budget_bytes: budget_pages * 4096, swap_bytes: swap_pages * 4096, flags, ..Config::default() })
}

/// Runs `f` on its own thread and fails the test if it has not returned
/// within `secs` (the hung thread is left behind; the test binary exits).
pub fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => panic!("hang: {what} did not return within {secs} s"),
    }
}

/// Marks pages `pages` of the region at `a` (4 KiB pages): their first and
/// last bytes get `tag + page`.
pub fn fill(a: usize, pages: std::ops::Range<usize>, tag: u8) {
    const PS: usize = 4096;
    for p in pages {
        usermm_sys::kernel::poke(a + p * PS, tag.wrapping_add(p as u8));
        usermm_sys::kernel::poke(a + p * PS + PS - 1, tag.wrapping_add(p as u8));
    }
}

/// A read-write temporary file of `pages` zero pages, unlinked at once.
pub fn shared_temp_file(name: &str, pages: usize) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("usermm-test-{}-{name}", std::process::id()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.set_len((pages * 4096) as u64).unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

/// Runs this test binary's ignored test `entry` alone in a child process
/// with `env` set, and returns its output: for tests that need a process of
/// their own (a crash, a core dump, a dropped privilege, a fatal signal).
pub fn run_entry(entry: &str, env: &[(&str, std::ffi::OsString)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", entry, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// In a child test entry: touches `target`, a poisoned page, on a thread of
/// its own (the recorder `rec` returns, so the access is retried and raises
/// forever; the process exits under it), waits up to 10 s for `rec` to see
/// it, and prints "poison seen at the address" when it saw exactly
/// `target`.
pub fn touch_poisoned_and_report(rec: &usermm_sys::testing::SigbusRecorder, target: usize) {
    std::thread::spawn(move || usermm_sys::kernel::peek(target));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rec.record().count == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = rec.record();
    if r.count >= 1 && r.addr == target {
        println!("poison seen at the address (si_code {})", r.code);
    } else {
        println!("poison not seen right: {r:?}, wanted {target:#x}");
    }
}
