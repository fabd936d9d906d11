//! `lockonfault` (seed 000): keep the pages of a large file that a program
//! touches locked in memory, without reading the whole file in first.
//!
//! One file of `file_mib` of random data (the `common::Rng` stream of
//! `seed`, so every byte can be recomputed) is created in `dir` and deleted
//! at the end. The work is a fixed list of `reads` uniformly random 1-byte
//! reads (the same list for every row and run); every row sums the bytes it
//! reads, and the sum is checked against the one the content implies, so no
//! row can skip work. Each row is timed in two parts, as the seed did:
//! `setup` (the `mmap` and the lock call over the whole file) and
//! `processing` (the reads).
//!
//! Rows, all in one run, on the same warm host page cache:
//! - `kernel`: a host `mmap` of the file (`MAP_SHARED`, `PROT_READ`):
//!   `plain`; `mlock-all` (`mlock` of the whole range in setup);
//!   `mlock-each-access` (`mlock` of the page before every read, locked or
//!   not, as the seed did); `sigsegv-batchN` (mapped `PROT_NONE`; a SIGSEGV
//!   handler `mprotect`s `PROT_READ` and `mlock`s the faulting page and the
//!   `N - 1` after it, clipped to the mapping); `onfault`
//!   (`mlock2(MLOCK_ONFAULT)` of the whole range);
//! - `usermm`: a file region in a fresh space whose budget is the file's
//!   size: `plain`, `mlock-all` (`Space::mlock`: reads the whole file in),
//!   `onfault` (`Space::mlock2(MLOCK_ONFAULT)`).
//!
//! # The page cache
//! The kernel's own numbers differ by about 5× between a page cache of 4 KiB
//! folios and one of large folios, so the layout is set and checked before
//! every measured run (see [`file::TestFile::prepare`]): 4 KiB folios by rewriting
//! the file with buffered 4 KiB `pwrite`s after dropping its cache; large
//! folios by dropping the cache and reading the file sequentially (the
//! kernel's read-ahead allocates large folios). A sampler reads the folio
//! flags of every `sample_every`th page through `/proc/self/pagemap` and
//! `/proc/kpageflags` (root only) and the fraction found is a row of its
//! own. Every row runs on the 4 KiB cache; `kernel plain`, `kernel onfault`
//! and `usermm onfault` run on the large-folio cache too (`@large-folios`).

mod file;
mod kernel;
mod table;
mod usermm;

use usermm_sys::host::peek_u8;
use usermm_sys::now_ns;

use self::file::{byte_at, Layout, TestFile};
use crate::common::{default_swap_dir, Progress, Rng, MIB};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment};

pub fn params(full: bool) -> Params {
    Params::default()
        .def("file_mib", Kind::Int, if full { 5120 } else { 2048 }, "file size (MiB); the seed's was 5 GB")
        .def("reads", Kind::Int, if full { 15_000_000 } else { 4_000_000 }, "random 1-byte reads per row and run")
        .def("runs", Kind::Int, 5, "measured runs of every row (row order rotates run by run)")
        .def(
            "slow_runs",
            Kind::Int,
            if full { 5 } else { 3 },
            "measured runs of the slow kernel rows (mlock-each-access, sigsegv-batch1); at most runs",
        )
        .def("batches", Kind::IntList, "1,8,16", "batch sizes (pages) of the kernel SIGSEGV rows")
        .def("large_folio_rows", Kind::Int, 1, "1: also run kernel plain/onfault and usermm onfault on large folios")
        .def("variants", Kind::Text, "all", "rows to run: all, or a comma-separated list of variant names")
        .def("sample_every", Kind::Int, 64, "page-cache layout check: sample every Nth page of the file")
        .def("dir", Kind::Text, default_swap_dir(), "directory of the test file (not a tmpfs: it must have a disk)")
        .def("seed", Kind::Int, 0, "PRNG seed of the file's content and of the read offsets")
}

/// The system name of the seed's reference rows (never used in a ratio).
pub const SEED_SYSTEM: &str = "seed000-other-hw";
/// usermm with `UMM_F_INTHREAD_FAULTS`.
pub const IN_THREAD: &str = "usermm (in-thread)";

/// Seed 000's published numbers (5 GB file, 15,000,000 accesses, average of
/// 20 runs, ms), measured on other hardware: `(variant, setup, processing)`.
/// The seed has no plain-mmap row.
const SEED: [(&str, f64, f64); 6] = [
    ("mlock-all", 8228.666, 8274.257),
    ("mlock-each-access", 0.113, 90993.552),
    ("sigsegv-batch1", 0.058, 69488.073),
    ("sigsegv-batch8", 0.068, 38204.116),
    ("sigsegv-batch16", 0.044, 29671.180),
    ("onfault", 0.189, 17904.899),
];

/// How the host page cache is to hold the file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cache {
    /// Order-0 (4 KiB) folios.
    Small,
    /// Large folios (read-ahead's).
    Large,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Plain,
    MlockAll,
    MlockEachAccess,
    Segv(usize),
    OnFault,
}

#[derive(Clone, Debug)]
struct Variant {
    system: &'static str,
    /// The variant's name without the cache suffix.
    base: String,
    method: Method,
    cache: Cache,
    /// Runs `slow_runs` times instead of `runs`.
    slow: bool,
}

impl Variant {
    fn name(&self) -> String {
        match self.cache {
            Cache::Small => self.base.clone(),
            Cache::Large => format!("{}@large-folios", self.base),
        }
    }
}

fn variants(batches: &[u64], large_rows: bool) -> Vec<Variant> {
    let v = |system, base: &str, method, cache, slow| Variant { system, base: base.into(), method, cache, slow };
    let mut out = vec![
        v("kernel", "plain", Method::Plain, Cache::Small, false),
        v("kernel", "mlock-all", Method::MlockAll, Cache::Small, false),
        v("kernel", "mlock-each-access", Method::MlockEachAccess, Cache::Small, true),
    ];
    for &b in batches {
        out.push(v("kernel", &format!("sigsegv-batch{b}"), Method::Segv(b as usize), Cache::Small, b == 1));
    }
    out.push(v("kernel", "onfault", Method::OnFault, Cache::Small, false));
    out.push(v("usermm", "plain", Method::Plain, Cache::Small, false));
    out.push(v("usermm", "mlock-all", Method::MlockAll, Cache::Small, false));
    out.push(v("usermm", "onfault", Method::OnFault, Cache::Small, false));
    out.push(v(IN_THREAD, "onfault", Method::OnFault, Cache::Small, false));
    if large_rows {
        out.push(v("kernel", "plain", Method::Plain, Cache::Large, false));
        out.push(v("kernel", "onfault", Method::OnFault, Cache::Large, false));
        out.push(v("usermm", "onfault", Method::OnFault, Cache::Large, false));
    }
    out
}

/// What one run of one row measured.
#[derive(Default)]
struct Sample {
    setup_ns: u64,
    proc_ns: u64,
    sum: u64,
    locked_pages: f64,
    resident_pages: f64,
    /// kernel: the process's minor + major faults during processing;
    /// usermm: `Stats::faults` during processing.
    faults: f64,
    /// Further `(metric, value)`s: kernel SIGSEGV rows: signals handled;
    /// usermm: `Stats::major_faults` and `Stats::evictions` during processing.
    extra: Vec<(&'static str, f64)>,
    /// Why the row failed (the run's numbers are not used).
    failure: Option<String>,
}

/// The timed loop: one volatile 1-byte load per offset, summed.
#[inline(never)]
fn read_all(base: usize, offs: &[usize]) -> (u64, u64) {
    let mut sum = 0u64;
    let t0 = now_ns();
    for &o in offs {
        sum = sum.wrapping_add(peek_u8(base + o) as u64);
    }
    (now_ns() - t0, sum)
}

struct Ctx<'a> {
    file: &'a TestFile,
    offs: &'a [usize],
    budget: usize,
    /// What `vm.max_map_count` handling did, for the notes.
    map_count_log: Vec<String>,
}

/// The parameters of one `lockonfault` experiment, checked.
struct Opts {
    len: usize,
    reads: usize,
    runs: usize,
    slow_runs: usize,
    seed: u64,
    dir: String,
    sample_every: usize,
    /// The budget of usermm's spaces: the whole file, in whole 2 MiB units.
    budget: usize,
    /// The rows to run.
    all: Vec<Variant>,
}

fn opts(p: &Params) -> Result<Opts, String> {
    let len = p.int("file_mib") as usize * MIB;
    let reads = p.int("reads") as usize;
    let runs = p.int("runs").max(1) as usize;
    let slow_runs = (p.int("slow_runs") as usize).clamp(1, runs);
    let batches = p.list("batches");
    let seed = p.int("seed");
    let dir = p.text("dir");
    let sample_every = p.int("sample_every").max(1) as usize;
    if len == 0 || reads == 0 || batches.contains(&0) {
        return Err("lockonfault: need file_mib ≥ 1, reads ≥ 1 and batches ≥ 1".into());
    }
    let mut all = variants(&batches, p.int("large_folio_rows") != 0);
    let pick = p.text("variants");
    if pick != "all" {
        let want: Vec<&str> = pick.split(',').map(str::trim).collect();
        if let Some(w) = want.iter().find(|w| !all.iter().any(|v| v.base == **w || v.name() == **w)) {
            let names: Vec<String> = all.iter().map(Variant::name).collect();
            return Err(format!("lockonfault: unknown variant '{w}' (one of: {})", names.join(", ")));
        }
        all.retain(|v| want.iter().any(|w| v.base == *w || v.name() == *w));
    }
    let budget = len.div_ceil(2 * MIB) * 2 * MIB;
    Ok(Opts { len, reads, runs, slow_runs, seed, dir, sample_every, budget, all })
}

/// What the measured runs leave for the table and the notes, besides the
/// experiment's samples.
#[derive(Default)]
struct Outcome {
    /// Checksum mismatches.
    errors: Vec<String>,
    /// (system, name, why it failed); later runs of the row are skipped.
    failed: Vec<(String, String, String)>,
    /// (system, name, the layout a run saw).
    layouts: Vec<(String, String, Layout)>,
    /// What `vm.max_map_count` handling did.
    map_count_log: Vec<String>,
}

impl Outcome {
    fn failed(&self, v: &Variant, name: &str) -> Option<&(String, String, String)> {
        self.failed.iter().find(|(s, n, _)| s == v.system && n == name)
    }
}

/// The measured runs: every row `runs` times (slow rows `slow_runs`), the
/// two cache layouts alternating which comes first and the rows of each
/// rotating run by run.
fn measure(o: &Opts, cx: &mut Ctx, want: u64, e: &mut Experiment, prog: &Progress) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    for r in 0..o.runs {
        // The cache groups alternate run by run, so that each run starts
        // with the layout the last one ended with (one switch per run).
        let groups = if r % 2 == 0 { [Cache::Small, Cache::Large] } else { [Cache::Large, Cache::Small] };
        for cache in groups {
            let mut vs: Vec<&Variant> = o.all.iter().filter(|v| v.cache == cache).collect();
            if vs.is_empty() {
                continue;
            }
            let k = r % vs.len();
            vs.rotate_left(k);
            for v in vs {
                let name = v.name();
                if (v.slow && r >= o.slow_runs) || out.failed(v, &name).is_some() {
                    continue;
                }
                let layout = cx.file.prepare(cache, prog)?;
                prog.say(&format!(
                    "{} {name} run {}/{}; host page cache: {}",
                    v.system,
                    r + 1,
                    if v.slow { o.slow_runs } else { o.runs },
                    layout.describe()
                ));
                let s = if v.system == "kernel" {
                    kernel::run_kernel(cx, v.method)?
                } else {
                    usermm::run_usermm(cx, v.method, v.system == IN_THREAD)?
                };
                if let Some(why) = s.failure {
                    prog.say(&format!("{} {name}: FAILED: {why}", v.system));
                    out.failed.push((v.system.into(), name, why));
                    continue;
                }
                if s.sum != want {
                    let msg = format!("{} {name} run {}: checksum {:#x}, expected {want:#x}", v.system, r + 1, s.sum);
                    prog.say(&format!("ERROR: {msg}"));
                    out.errors.push(msg);
                }
                record(e, v.system, &name, &s, &layout, prog);
                out.layouts.push((v.system.into(), name, layout));
            }
        }
    }
    out.map_count_log = std::mem::take(&mut cx.map_count_log);
    Ok(out)
}

/// Adds one run's numbers to the experiment.
fn record(e: &mut Experiment, sys: &str, name: &str, s: &Sample, layout: &Layout, prog: &Progress) {
    prog.say(&format!(
        "  setup {} ms, processing {} s, locked {} / resident {} pages",
        fmt_num(s.setup_ns as f64 / 1e6),
        fmt_num(s.proc_ns as f64 / 1e9),
        s.locked_pages,
        s.resident_pages
    ));
    e.add(sys, name, "setup", "ms", s.setup_ns as f64 / 1e6);
    e.add(sys, name, "processing", "s", s.proc_ns as f64 / 1e9);
    e.add(sys, name, "locked_pages", "pages", s.locked_pages);
    e.add(sys, name, "resident_pages", "pages", s.resident_pages);
    e.add(sys, name, "faults", "count", s.faults);
    for (metric, x) in &s.extra {
        e.add(sys, name, metric, "count", *x);
    }
    if let Some(lp) = layout.large_pct {
        e.add(sys, name, "cache_in_large_folios", "%", lp);
    }
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let o = opts(p)?;
    let mut e = Experiment::new(
        "lockonfault",
        "seed 000: lock the touched pages of a big file (mmap + lock: setup and processing time)",
        p.pairs(),
    );

    prog.say(&format!("creating a {} MiB file in {} (4 KiB pwrites)", o.len / MIB, o.dir));
    let t = now_ns();
    let file = TestFile::create(&o.dir, o.len, o.seed, o.sample_every)?;
    prog.say(&format!("file written in {:.1} s", (now_ns() - t) as f64 / 1e9));
    let mut rng = Rng::new(o.seed ^ 0x5EED_0000_0000_0000);
    let offs: Vec<usize> = (0..o.reads).map(|_| rng.below(o.len as u64) as usize).collect();
    let want = offs.iter().fold(0u64, |a, &off| a.wrapping_add(byte_at(o.seed, off) as u64));
    let mut cx = Ctx { file: &file, offs: &offs, budget: o.budget, map_count_log: Vec::new() };
    let out = measure(&o, &mut cx, want, &mut e, prog)?;
    drop(file);
    for (v, setup, processing) in SEED {
        e.add(SEED_SYSTEM, v, "setup_avg", "ms", setup);
        e.add(SEED_SYSTEM, v, "processing_avg", "ms", processing);
    }
    table::summary(&mut e, &o, &out);
    table::goals(&mut e);
    table::notes(&mut e, &o, out);
    Ok(e)
}
