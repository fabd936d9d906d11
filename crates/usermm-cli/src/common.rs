//! What every experiment shares: the unit of work (one 8-byte read or write
//! per page touch), the fixed-seed PRNG, progress lines, and the usermm
//! configurations used for the baseline comparisons.

use std::hint::black_box;
use std::time::Instant;

use usermm::Config;

/// The page size both systems use (usermm's default; the host's).
pub const PAGE: usize = 4096;
pub const MIB: usize = 1 << 20;

/// One 8-byte read at `off`.
#[inline(always)]
pub fn read8(buf: &[u8], off: usize) -> u64 {
    let b: [u8; 8] = buf[off..off + 8].try_into().expect("8 bytes");
    black_box(u64::from_le_bytes(b))
}

/// One 8-byte write at `off`.
#[inline(always)]
pub fn write8(buf: &mut [u8], off: usize, v: u64) {
    buf[off..off + 8].copy_from_slice(&black_box(v).to_le_bytes());
}

/// The value written into page `p` (never 0, so that a page that lost its
/// data reads back wrong).
#[inline(always)]
pub fn tag(p: usize) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

pub use usermm_core::rng::Rng;

/// Progress lines on stderr: `[name +12.3s] message`.
pub struct Progress {
    pub name: String,
    start: Instant,
}

impl Progress {
    pub fn new(name: &str) -> Progress {
        Progress { name: name.into(), start: Instant::now() }
    }
    pub fn say(&self, msg: &str) {
        eprintln!("[{} +{:.1}s] {msg}", self.name, self.start.elapsed().as_secs_f64());
    }
    pub fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// The systems in run `run`'s order: kernel first on even runs, usermm first
/// on odd ones, so that drift hits both.
pub fn systems(run: usize) -> [&'static str; 2] {
    if run.is_multiple_of(2) {
        ["kernel", "usermm"]
    } else {
        ["usermm", "kernel"]
    }
}

/// The progress label of round `r` of `warmup` unmeasured rounds followed
/// by `runs` measured ones: `warm-up 1/1`, then `run 1/5`, …
pub fn run_label(r: usize, warmup: usize, runs: usize) -> String {
    if r >= warmup {
        format!("run {}/{runs}", r - warmup + 1)
    } else {
        format!("warm-up {}/{warmup}", r + 1)
    }
}

/// A usermm space configuration: `budget_bytes` of budget, `swap_bytes` of
/// swap (0: none) in `swap_dir`, otherwise the defaults.
pub fn config(budget_bytes: usize, swap_bytes: usize, swap_dir: Option<&str>) -> Config {
    Config { budget_bytes, swap_bytes, swap_dir: swap_dir.map(Into::into), ..Config::default() }
}

/// p50, p99 and max of `v` (sorted in place), in the units of `v`.
pub fn p50_p99_max(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (crate::report::percentile(v, 0.50), crate::report::percentile(v, 0.99), v.last().copied().unwrap_or(f64::NAN))
}

/// The default swap directory: `$TMPDIR` or `/tmp`, as usermm's own default.
pub fn default_swap_dir() -> String {
    std::env::var("TMPDIR").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/tmp".into())
}
