//! `MADV_DONTDUMP` keeps a secret held in a space out of core dumps — also
//! while reclaim has parked its pages (their copies in the staging area).
//!
//! A child process (this test binary, re-run on its ignored entry point)
//! writes two patterns into a space, marks one region `MADV_DONTDUMP`,
//! parks both (`MADV_COLD`) and aborts with core dumps on; the parent looks
//! for each pattern in the core file. The other region is the control: its
//! pattern must be in the dump (the dump works and holds the space).

use usermm::consts::*;
use usermm::Config;

mod common;

const PAGE: usize = 4096;
const PAGES: usize = 16;
const DIR_ENV: &str = "USERMM_DONTDUMP_DIR";

/// 64 bytes derived from `seed` (xorshift), never held anywhere but where
/// they are written.
fn pattern_byte(seed: u64, i: usize) -> u8 {
    let mut x = seed ^ (i as u64 / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    (x >> ((i % 8) * 8)) as u8
}

fn pattern(seed: u64) -> Vec<u8> {
    (0..64).map(|i| pattern_byte(seed, i)).collect()
}

#[test]
#[ignore = "child-process entry point of a_dontdump_secret_stays_out_of_core_dumps"]
fn dump_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else { return };
    std::env::set_current_dir(&dir).unwrap();
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: a plain setrlimit of this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &unlimited) }, 0);
    let seed: u64 = std::env::var("USERMM_DONTDUMP_SEED").unwrap().parse().unwrap();
    let s = common::open_mode(&Config { budget_bytes: 16 << 20, swap_bytes: 16 << 20, ..Config::default() }).unwrap();
    let rw = PROT_READ | PROT_WRITE;
    let secret = s.mmap(0, PAGES * PAGE, rw, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    let visible = s.mmap(0, PAGES * PAGE, rw, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    s.madvise(secret, PAGES * PAGE, MADV_DONTDUMP).unwrap();
    for p in 0..PAGES {
        for i in 0..64 {
            usermm_sys::kernel::poke(secret + p * PAGE + i, pattern_byte(seed, i));
            usermm_sys::kernel::poke(visible + p * PAGE + i, pattern_byte(seed + 1, i));
        }
    }
    // Half the pages of each region parked in the staging area.
    s.madvise(secret, PAGES / 2 * PAGE, MADV_COLD).unwrap();
    s.madvise(visible, PAGES / 2 * PAGE, MADV_COLD).unwrap();
    assert!(s.stats().inactive_pages >= PAGES as u64, "{:?}", s.stats());
    // SAFETY: ends this process with a core dump.
    unsafe { libc::abort() };
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn a_dontdump_secret_stays_out_of_core_dumps() {
    use std::os::unix::process::ExitStatusExt;
    let pattern_path = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    assert!(
        pattern_path.trim() == "core" || pattern_path.trim().starts_with("core."),
        "this test needs core dumps written to the working directory (kernel.core_pattern = core), not {:?}",
        pattern_path.trim()
    );
    let dir = std::env::temp_dir().join(format!("usermm-dontdump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A fixed seed (USERMM_DONTDUMP_SEED overrides it): the patterns need
    // only be unlike anything else in the dump, not new each run.
    let seed = std::env::var("USERMM_DONTDUMP_SEED")
        .map_or(0x0d0e_5eed_2d17_a6b1, |s| s.trim().parse().expect("USERMM_DONTDUMP_SEED: a decimal number"));
    let out = common::run_entry(
        "dump_child",
        &[(DIR_ENV, dir.clone().into()), ("USERMM_DONTDUMP_SEED", seed.to_string().into())],
    );
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "child: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.core_dumped(), "no core dumped: {:?}", out.status);
    let core = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with("core"))
        .map(|e| e.path())
        .expect("core file");
    let bytes = std::fs::read(&core).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let visible = find(&bytes, &pattern(seed + 1));
    let secret = find(&bytes, &pattern(seed));
    assert!(visible >= PAGES / 2, "the control region's pages are in the dump ({visible} copies)");
    assert_eq!(secret, 0, "the MADV_DONTDUMP region's pattern is in the core dump {secret} times");
}
