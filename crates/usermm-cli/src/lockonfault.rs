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
//! every measured run (see [`TestFile::prepare`]): 4 KiB folios by rewriting
//! the file with buffered 4 KiB `pwrite`s after dropping its cache; large
//! folios by dropping the cache and reading the file sequentially (the
//! kernel's read-ahead allocates large folios). A sampler reads the folio
//! flags of every `sample_every`th page through `/proc/self/pagemap` and
//! `/proc/kpageflags` (root only) and the fraction found is a row of its
//! own. Every row runs on the 4 KiB cache; `kernel plain`, `kernel onfault`
//! and `usermm onfault` run on the large-folio cache too (`@large-folios`).

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use usermm::consts::{MAP_SHARED, MLOCK_ONFAULT, PROT_NONE, PROT_READ, UMM_F_KEEP_FILE_CACHE};
use usermm::{Config, Space};
use usermm_sys::host::{
    fadvise, page_cache_layout, peek_u8, process_faults, HostFileMap, SegvBatchLocker, POSIX_FADV_DONTNEED,
};
use usermm_sys::{now_ns, Errno};

use crate::common::{default_swap_dir, Progress, Rng, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Goal, Table};

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
    if large_rows {
        out.push(v("kernel", "plain", Method::Plain, Cache::Large, false));
        out.push(v("kernel", "onfault", Method::OnFault, Cache::Large, false));
        out.push(v("usermm", "onfault", Method::OnFault, Cache::Large, false));
    }
    out
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The file's 8-byte word number `k`: output `k` of `Rng::new(seed)` (the
/// generator's state after `k` steps is `seed + k × golden`), so any byte
/// can be recomputed without the file.
#[inline(always)]
fn word(seed: u64, k: u64) -> u64 {
    Rng::new(seed.wrapping_add(k.wrapping_mul(GOLDEN))).next()
}

/// The file's byte at `off`.
fn byte_at(seed: u64, off: usize) -> u8 {
    (word(seed, (off / 8) as u64) >> ((off % 8) * 8)) as u8
}

/// Fills `buf` (one page) with the content of file page `page`.
fn fill_page(buf: &mut [u8], seed: u64, page: usize) {
    let first = (page * PAGE / 8) as u64;
    for (i, c) in buf.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&word(seed, first + i as u64).to_le_bytes());
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// What the sampler said about the page cache just before a run.
#[derive(Clone, Copy, Debug)]
struct Layout {
    resident_pct: f64,
    /// `None`: unknown (the sampler needs root).
    large_pct: Option<f64>,
}

impl Layout {
    fn describe(&self) -> String {
        let res =
            if self.resident_pct < 99.95 { format!(", {:.1}% resident", self.resident_pct) } else { String::new() };
        match self.large_pct {
            None => format!("unknown (needs root){res}"),
            Some(p) if p < 50.0 => format!("4 KiB pages ({p:.1}% in large folios){res}"),
            Some(p) => format!("large folios ({p:.0}%){res}"),
        }
    }
}

/// The test file; deleted when dropped.
struct TestFile {
    path: String,
    len: usize,
    seed: u64,
    sample_every: usize,
    /// The layout last established (`None`: unknown).
    current: Cell<Option<Cache>>,
}

impl TestFile {
    fn create(dir: &str, len: usize, seed: u64, sample_every: usize) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-lockonfault-{}-{}.dat", std::process::id(), now_ns());
        let t = TestFile { path, len, seed, sample_every, current: Cell::new(None) };
        File::create_new(&t.path).map_err(|e| io(&format!("create {}", t.path), e))?;
        t.write_4k()?;
        Ok(t)
    }

    fn open(&self) -> Result<File, String> {
        File::open(&self.path).map_err(|e| io(&format!("open {}", self.path), e))
    }

    /// Drops the file's page cache (after writing back anything dirty, which
    /// `POSIX_FADV_DONTNEED` would otherwise keep).
    fn drop_cache(&self, f: &File) -> Result<(), String> {
        f.sync_data().map_err(|e| io("fdatasync", e))?;
        fadvise(f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| io("fadvise(DONTNEED)", format!("{e:?}")))
    }

    /// (Re)writes the whole content with buffered 4 KiB `pwrite`s after
    /// dropping the cache: the page cache then holds the file in 4 KiB
    /// folios (a write of one page allocates an order-0 folio), clean after
    /// the final `fdatasync`.
    fn write_4k(&self) -> Result<(), String> {
        let f = OpenOptions::new().read(true).write(true).open(&self.path).map_err(|e| io("open", e))?;
        self.drop_cache(&f)?;
        let mut buf = vec![0u8; PAGE];
        for p in 0..self.len / PAGE {
            fill_page(&mut buf, self.seed, p);
            f.write_all_at(&buf, (p * PAGE) as u64).map_err(|e| io("pwrite", e))?;
        }
        f.sync_data().map_err(|e| io("fdatasync", e))?;
        self.current.set(Some(Cache::Small));
        Ok(())
    }

    /// Drops the cache and reads the file sequentially in 1 MiB reads:
    /// read-ahead fills the cache with large folios.
    fn read_large(&self) -> Result<(), String> {
        let f = self.open()?;
        self.drop_cache(&f)?;
        let g = self.open()?;
        self.read_through(&g)?;
        self.current.set(Some(Cache::Large));
        Ok(())
    }

    /// Reads the whole file with 1 MiB `pread`s, discarding the data.
    fn read_through(&self, f: &File) -> Result<(), String> {
        let mut buf = vec![0u8; MIB];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(MIB);
            f.read_exact_at(&mut buf[..n], off as u64).map_err(|e| io("pread", e))?;
            off += n;
        }
        std::hint::black_box(&buf);
        Ok(())
    }

    fn layout(&self, f: &File) -> Result<(Layout, Vec<u64>), String> {
        let l = page_cache_layout(f, self.len, self.sample_every).map_err(|e| io("page-cache sampler", e))?;
        let layout = Layout {
            resident_pct: 100.0 * l.resident_pages as f64 / l.pages as f64,
            large_pct: l.folios.ok().filter(|s| s.sampled > 0).map(|s| 100.0 * s.large_fraction()),
        };
        Ok((layout, l.missing))
    }

    /// Brings back the few `missing` pages of a cache in the `want` layout:
    /// 4 KiB `pwrite`s of their content (order-0 folios, like the rest) or,
    /// for large folios, 4 KiB `pread`s (read-ahead picks the folio size).
    fn repair(&self, want: Cache, missing: &[u64]) -> Result<(), String> {
        let f =
            OpenOptions::new().read(true).write(want == Cache::Small).open(&self.path).map_err(|e| io("open", e))?;
        let mut buf = vec![0u8; PAGE];
        for &p in missing {
            let off = p * PAGE as u64;
            if want == Cache::Small {
                fill_page(&mut buf, self.seed, p as usize);
                f.write_all_at(&buf, off).map_err(|e| io("pwrite", e))?;
            } else {
                f.read_exact_at(&mut buf, off).map_err(|e| io("pread", e))?;
            }
        }
        if want == Cache::Small {
            f.sync_data().map_err(|e| io("fdatasync", e))?;
        }
        Ok(())
    }

    /// Makes the page cache hold the whole file in the `want` layout, right
    /// before a measured run (untimed): checks it with the sampler; if the
    /// folios are of the wrong kind or more than 1% of the pages are
    /// missing, re-establishes the layout, else brings the missing pages back
    /// one by one; then reads the file once through the cache (pages of an
    /// idle cache may have been paged out by the hypervisor; this faults
    /// them back in, and changes no folio). Returns the layout the run sees.
    fn prepare(&self, want: Cache, prog: &Progress) -> Result<Layout, String> {
        let f = self.open()?;
        let (l, missing) = self.layout(&f)?;
        let kind_ok = match l.large_pct {
            Some(p) => (want == Cache::Large) == (p >= 50.0),
            None => self.current.get() == Some(want),
        };
        let t = now_ns();
        if l.resident_pct < 99.0 || !kind_ok {
            match want {
                Cache::Small => self.write_4k()?,
                Cache::Large => self.read_large()?,
            }
            prog.say(&format!(
                "page cache was {}; re-established {} in {:.1} s",
                l.describe(),
                if want == Cache::Small { "4 KiB folios (4 KiB pwrites)" } else { "large folios (sequential read)" },
                (now_ns() - t) as f64 / 1e9
            ));
        } else if !missing.is_empty() {
            self.repair(want, &missing)?;
            prog.say(&format!(
                "page cache missed {} pages; brought them back in {:.2} s",
                missing.len(),
                (now_ns() - t) as f64 / 1e9
            ));
        }
        self.read_through(&f)?;
        Ok(self.layout(&f)?.0)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

fn max_map_count() -> Result<u64, String> {
    let s = std::fs::read_to_string(MAX_MAP_COUNT).map_err(|e| io(MAX_MAP_COUNT, e))?;
    s.trim().parse().map_err(|e| io(MAX_MAP_COUNT, e))
}

/// `vm.max_map_count` raised for one run; the old value is written back on
/// drop (also when the run fails).
struct MapCountRaise {
    old: u64,
}

impl MapCountRaise {
    /// Raises `vm.max_map_count` to `want` if it is lower. `Ok(None)`: it
    /// already was high enough.
    fn to(want: u64) -> Result<Option<MapCountRaise>, String> {
        let old = max_map_count()?;
        if old >= want {
            return Ok(None);
        }
        std::fs::write(MAX_MAP_COUNT, want.to_string())
            .map_err(|e| format!("cannot raise vm.max_map_count from {old} to {want}: {e}"))?;
        Ok(Some(MapCountRaise { old }))
    }
}

impl Drop for MapCountRaise {
    fn drop(&mut self) {
        let _ = std::fs::write(MAX_MAP_COUNT, self.old.to_string());
    }
}

/// `(Rss, Locked)` of the whole process in KiB, from `/proc/self/smaps_rollup`.
fn rss_locked_kib() -> Result<(u64, u64), String> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").map_err(|e| io("smaps_rollup", e))?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| format!("smaps_rollup: no {name}"))
    };
    Ok((field("Rss:")?, field("Locked:")?))
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

/// The timed loop with an `mlock` of the page before every read. Returns
/// `(ns, sum, first failure as (read index, errno))`.
#[inline(never)]
fn read_all_mlock_each(m: &HostFileMap, offs: &[usize]) -> (u64, u64, Option<(usize, Errno)>) {
    let base = m.addr();
    let mut sum = 0u64;
    let mut err = None;
    let t0 = now_ns();
    for (i, &o) in offs.iter().enumerate() {
        if let Err(e) = m.mlock(o & !(PAGE - 1), PAGE) {
            err.get_or_insert((i, e));
        }
        sum = sum.wrapping_add(peek_u8(base + o) as u64);
    }
    (now_ns() - t0, sum, err)
}

struct Ctx<'a> {
    file: &'a TestFile,
    offs: &'a [usize],
    budget: usize,
    /// What `vm.max_map_count` handling did, for the notes.
    map_count_log: Vec<String>,
}

fn run_kernel(cx: &mut Ctx, method: Method) -> Result<Sample, String> {
    let len = cx.file.len;
    let f = cx.file.open()?;
    // Splitting rows make up to one VMA per locked island of pages.
    let _raise = match method {
        Method::MlockEachAccess | Method::Segv(_) => {
            let want = 2 * (len / PAGE) as u64 + 1000;
            match MapCountRaise::to(want) {
                Ok(r) => {
                    if let Some(r) = &r {
                        let msg = format!("raised vm.max_map_count from {} to {want} (restored after the run)", r.old);
                        if !cx.map_count_log.contains(&msg) {
                            cx.map_count_log.push(msg);
                        }
                    }
                    r
                }
                Err(m) => {
                    if !cx.map_count_log.contains(&m) {
                        cx.map_count_log.push(m);
                    }
                    None
                }
            }
        }
        _ => None,
    };
    let (rss0, locked0) = rss_locked_kib()?;
    let prot = if matches!(method, Method::Segv(_)) { PROT_NONE } else { PROT_READ };
    let mut s = Sample::default();
    let t0 = now_ns();
    let m = HostFileMap::open_prot(&f, len, prot).map_err(|e| format!("kernel mmap: {e:?}"))?;
    let locked = match method {
        Method::MlockAll => m.mlock(0, len),
        Method::OnFault => m.mlock2(0, len, MLOCK_ONFAULT),
        _ => Ok(()),
    };
    s.setup_ns = now_ns() - t0;
    if let Err(e) = locked {
        s.failure = Some(format!(
            "{} failed: {}",
            if method == Method::OnFault { "mlock2(MLOCK_ONFAULT)" } else { "mlock" },
            e
        ));
        m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
        return Ok(s);
    }
    let (min0, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    match method {
        Method::Segv(batch) => {
            let locker = SegvBatchLocker::install(&m, batch).map_err(|e| format!("sigaction: {e:?}"))?;
            (s.proc_ns, s.sum) = read_all(m.addr(), cx.offs);
            s.extra.push(("sigsegv", locker.faults() as f64));
            if let Some(e) = locker.error() {
                s.failure = Some(format!("mprotect/mlock in the SIGSEGV handler failed: {}", e));
            }
        }
        Method::MlockEachAccess => {
            let (ns, sum, err) = read_all_mlock_each(&m, cx.offs);
            (s.proc_ns, s.sum) = (ns, sum);
            if let Some((i, e)) = err {
                s.failure = Some(format!("mlock failed with {} from read {i} on", e));
            }
        }
        _ => (s.proc_ns, s.sum) = read_all(m.addr(), cx.offs),
    }
    let (min1, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    s.faults = ((min1 - min0) + (maj1 - maj0)) as f64;
    let (rss1, locked1) = rss_locked_kib()?;
    s.resident_pages = (rss1.saturating_sub(rss0) * 1024 / PAGE as u64) as f64;
    s.locked_pages = (locked1.saturating_sub(locked0) * 1024 / PAGE as u64) as f64;
    // Untimed: with up to one VMA per page this takes a while.
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok(s)
}

fn run_usermm(cx: &Ctx, method: Method) -> Result<Sample, String> {
    let len = cx.file.len;
    let f = cx.file.open()?;
    let cfg = Config {
        budget_bytes: cx.budget,
        memlock_bytes: cx.budget,
        swap_bytes: 0,
        flags: UMM_F_KEEP_FILE_CACHE,
        ..Config::default()
    };
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let mut s = Sample::default();
    let t0 = now_ns();
    let a = space.mmap(0, len, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let locked = match method {
        Method::MlockAll => space.mlock(a, len),
        Method::OnFault => space.mlock2(a, len, MLOCK_ONFAULT),
        _ => Ok(()),
    };
    s.setup_ns = now_ns() - t0;
    if let Err(e) = locked {
        s.failure = Some(format!("Space::mlock{} failed: {}", if method == Method::OnFault { "2" } else { "" }, e));
    } else {
        let st0 = space.stats();
        (s.proc_ns, s.sum) = read_all(a, cx.offs);
        let st1 = space.stats();
        s.locked_pages = st1.locked_pages as f64;
        s.resident_pages = st1.resident_pages as f64;
        s.faults = (st1.faults - st0.faults) as f64;
        s.extra.push(("major_faults", (st1.major_faults - st0.major_faults) as f64));
        s.extra.push(("evictions", (st1.evictions - st0.evictions) as f64));
    }
    space.munmap(a, len).map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(s)
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
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
    // The budget holds the whole file, in whole 2 MiB units.
    let budget = len.div_ceil(2 * MIB) * 2 * MIB;
    let mut e = Experiment::new(
        "lockonfault",
        "seed 000: lock the touched pages of a big file (mmap + lock: setup and processing time)",
        p.pairs(),
    );

    prog.say(&format!("creating a {} MiB file in {dir} (4 KiB pwrites)", len / MIB));
    let t = now_ns();
    let file = TestFile::create(&dir, len, seed, sample_every)?;
    prog.say(&format!("file written in {:.1} s", (now_ns() - t) as f64 / 1e9));
    let mut rng = Rng::new(seed ^ 0x5EED_0000_0000_0000);
    let offs: Vec<usize> = (0..reads).map(|_| rng.below(len as u64) as usize).collect();
    let want = offs.iter().fold(0u64, |a, &o| a.wrapping_add(byte_at(seed, o) as u64));
    let mut cx = Ctx { file: &file, offs: &offs, budget, map_count_log: Vec::new() };

    let mut errors = Vec::new();
    // name → why it failed (later runs of it are skipped).
    let mut failed: Vec<(String, String, String)> = Vec::new();
    // (system, name) → layouts seen.
    let mut layouts: Vec<(String, String, Layout)> = Vec::new();
    for r in 0..runs {
        // The cache groups alternate run by run, so that each run starts
        // with the layout the last one ended with (one switch per run).
        let groups = if r % 2 == 0 { [Cache::Small, Cache::Large] } else { [Cache::Large, Cache::Small] };
        for cache in groups {
            let mut vs: Vec<&Variant> = all.iter().filter(|v| v.cache == cache).collect();
            if vs.is_empty() {
                continue;
            }
            let k = r % vs.len();
            vs.rotate_left(k);
            for v in vs {
                let name = v.name();
                if (v.slow && r >= slow_runs) || failed.iter().any(|(s, n, _)| s == v.system && *n == name) {
                    continue;
                }
                let layout = file.prepare(cache, prog)?;
                prog.say(&format!(
                    "{} {name} run {}/{}; host page cache: {}",
                    v.system,
                    r + 1,
                    if v.slow { slow_runs } else { runs },
                    layout.describe()
                ));
                let s = if v.system == "kernel" { run_kernel(&mut cx, v.method)? } else { run_usermm(&cx, v.method)? };
                if let Some(why) = s.failure {
                    prog.say(&format!("{} {name}: FAILED: {why}", v.system));
                    failed.push((v.system.into(), name, why));
                    continue;
                }
                if s.sum != want {
                    let msg = format!("{} {name} run {}: checksum {:#x}, expected {want:#x}", v.system, r + 1, s.sum);
                    prog.say(&format!("ERROR: {msg}"));
                    errors.push(msg);
                }
                prog.say(&format!(
                    "  setup {} ms, processing {} s, locked {} / resident {} pages",
                    fmt_num(s.setup_ns as f64 / 1e6),
                    fmt_num(s.proc_ns as f64 / 1e9),
                    s.locked_pages,
                    s.resident_pages
                ));
                let sys = v.system;
                e.add(sys, &name, "setup", "ms", s.setup_ns as f64 / 1e6);
                e.add(sys, &name, "processing", "s", s.proc_ns as f64 / 1e9);
                e.add(sys, &name, "locked_pages", "pages", s.locked_pages);
                e.add(sys, &name, "resident_pages", "pages", s.resident_pages);
                e.add(sys, &name, "faults", "count", s.faults);
                for (metric, x) in &s.extra {
                    e.add(sys, &name, metric, "count", *x);
                }
                if let Some(lp) = layout.large_pct {
                    e.add(sys, &name, "cache_in_large_folios", "%", lp);
                }
                layouts.push((sys.into(), name, layout));
            }
        }
    }
    let map_count_log = std::mem::take(&mut cx.map_count_log);
    drop(file);
    for (v, setup, processing) in SEED {
        e.add(SEED_SYSTEM, v, "setup_avg", "ms", setup);
        e.add(SEED_SYSTEM, v, "processing_avg", "ms", processing);
    }

    // The summary table: one line per row.
    let base_proc = e.med("kernel", "onfault", "processing");
    let mut lines = Vec::new();
    for v in &all {
        let name = v.name();
        let seed_of = |col: usize| {
            SEED.iter()
                .find(|s| v.system == "kernel" && v.cache == Cache::Small && s.0 == v.base)
                .map_or("–".to_string(), |s| fmt_num(if col == 0 { s.1 } else { s.2 }))
        };
        let seen: Vec<&Layout> =
            layouts.iter().filter(|(s, n, _)| s == v.system && *n == name).map(|(_, _, l)| l).collect();
        let cache = match seen.iter().map(|l| l.large_pct).collect::<Option<Vec<f64>>>() {
            Some(ps) if !ps.is_empty() => {
                let (lo, hi) = ps.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &p| (a.min(p), b.max(p)));
                let kind = if hi < 50.0 {
                    "4 KiB"
                } else if lo >= 50.0 {
                    "large folios"
                } else {
                    "mixed"
                };
                if (hi - lo) < 0.05 {
                    format!("{kind} ({lo:.1}% large)")
                } else {
                    format!("{kind} ({lo:.1}–{hi:.1}% large)")
                }
            }
            _ if seen.is_empty() => "–".into(),
            _ => format!("{} (unverified: needs root)", if v.cache == Cache::Small { "4 KiB" } else { "large folios" }),
        };
        let mut cells = vec![v.system.to_string(), name.clone(), cache];
        if let Some((_, _, why)) = failed.iter().find(|(s, n, _)| s == v.system && *n == name) {
            cells.extend([
                "0".into(),
                format!("FAILED: {why}"),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                seed_of(0),
                seed_of(1),
            ]);
            lines.push(cells);
            continue;
        }
        let Some(setup) = e.row(v.system, &name, "setup") else {
            continue;
        };
        let proc_row = e.row(v.system, &name, "processing").expect("added with setup");
        cells.extend([
            setup.samples.len().to_string(),
            format!("{} [{}]", fmt_num(setup.median()), fmt_num(setup.min())),
            format!("{} [{}]", fmt_num(proc_row.median()), fmt_num(proc_row.min())),
            format!("{}×", fmt_num(proc_row.median() / base_proc)),
            format!(
                "{} / {}",
                fmt_num(e.med(v.system, &name, "locked_pages")),
                fmt_num(e.med(v.system, &name, "resident_pages"))
            ),
            fmt_num(e.med(v.system, &name, "faults")),
            seed_of(0),
            seed_of(1),
        ]);
        lines.push(cells);
    }
    e.tables.push(Table {
        title: format!(
            "Summary: {} MiB file, {reads} random 1-byte reads; medians [min] of the runs shown; the seed's columns are \
             its averages (5 GB, 15M reads, other hardware, never in a ratio)",
            len / MIB
        ),
        head: [
            "system",
            "variant",
            "host page cache",
            "runs",
            "setup ms",
            "processing s",
            "÷ kernel onfault",
            "locked / resident pages",
            "faults",
            "seed setup ms",
            "seed processing ms",
        ]
        .map(String::from)
        .to_vec(),
        rows: lines,
    });

    let uo_proc = e.med("usermm", "onfault", "processing");
    e.goals.push(Goal {
        what: "usermm lock-on-fault setup (mmap + mlock2 ONFAULT)".into(),
        how: "usermm onfault setup, median".into(),
        value: e.med("usermm", "onfault", "setup"),
        unit: " ms".into(),
        at_least: false,
        threshold: 1.0,
        goal: 1.0,
    });
    let b16 = e.med("kernel", "sigsegv-batch16", "processing");
    e.goals.push(Goal {
        what: "usermm lock-on-fault processing vs the seed's SIGSEGV batch-16 handler".into(),
        how: "usermm onfault / kernel sigsegv-batch16, processing".into(),
        value: uo_proc / b16,
        unit: "×".into(),
        at_least: false,
        threshold: 1.0,
        goal: 0.5,
    });
    e.goals.push(Goal {
        what: "usermm lock-on-fault processing vs the kernel's MLOCK_ONFAULT (4 KiB page cache)".into(),
        how: "usermm onfault / kernel onfault, processing".into(),
        value: uo_proc / base_proc,
        unit: "×".into(),
        at_least: false,
        threshold: 3.0,
        goal: 1.5,
    });

    // Notes.
    let small: Vec<&Layout> =
        layouts.iter().filter(|(_, n, _)| !n.ends_with("@large-folios")).map(|(_, _, l)| l).collect();
    let large: Vec<&Layout> =
        layouts.iter().filter(|(_, n, _)| n.ends_with("@large-folios")).map(|(_, _, l)| l).collect();
    let range = |ls: &[&Layout]| -> String {
        let ps: Option<Vec<f64>> = ls.iter().map(|l| l.large_pct).collect();
        match ps {
            _ if ls.is_empty() => "not measured".into(),
            None => "unknown (the sampler needs root: /proc/self/pagemap PFNs and /proc/kpageflags)".into(),
            Some(ps) => {
                let (lo, hi) = ps.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &p| (a.min(p), b.max(p)));
                let kind = if hi < 50.0 { "4 KiB pages" } else { "large folios" };
                format!("{kind}, {lo:.1}–{hi:.1}% of sampled pages in large folios over {} runs", ps.len())
            }
        }
    };
    e.notes.push(format!(
        "**How the host page cache held the file**: rows without a suffix: {}; rows `@large-folios`: {}. Checked \
         right before every measured run by sampling every {sample_every}th page of the file (mapped with \
         `MADV_POPULATE_READ` into a throwaway private mapping; PFN from `/proc/self/pagemap`, `KPF_COMPOUND_HEAD`/\
         `_TAIL` from `/proc/kpageflags`); the per-row value is the `cache_in_large_folios` metric. The 4 KiB layout is \
         made by dropping the file's cache and rewriting it with buffered 4 KiB `pwrite`s (then `fdatasync`); the \
         large-folio one by dropping the cache and reading the file sequentially (read-ahead allocates large folios). \
         A layout is re-made only when the check finds folios of the wrong kind or more than 1% of the pages \
         missing (fewer missing pages are brought back one by one: 4 KiB `pwrite`s of their content, or `pread`s \
         on the large-folio cache); then, untimed, the whole file is read once through the cache (`pread`), so that \
         pages the hypervisor paged out while idle are back before the clock starts.",
        range(&small),
        range(&large)
    ));
    e.notes.push(format!(
        "File {} MiB of random data (the `common::Rng` stream of seed {seed}) in `{dir}`, deleted at the end; {reads} \
         uniformly random 1-byte reads (one fixed list for every row and run), each a volatile load; every row's sum \
         of the bytes read is checked against the content. `setup` = the `mmap` plus the lock call over the whole \
         file (for usermm: `Space::mmap` + `Space::mlock`/`mlock2`; the space itself is opened before, untimed, as \
         the kernel's process exists before); `processing` = the reads. `munmap` (and `Space::close`) are untimed: \
         unmapping a mapping split into hundreds of thousands of VMAs takes a while.",
        len / MIB
    ));
    e.notes.push(
        "Kernel rows: the file opened `O_RDONLY` and mapped `MAP_SHARED` `PROT_READ` (the seed does not say which \
         kind it used; shared is what a program reading a big file would use, and usermm's region is shared too). \
         `mlock-all`: `mlock` of the whole mapping in setup. `mlock-each-access`: `mlock(page, 4096)` before every \
         read, whether the page is locked already or not (the seed's point: the program does not track it). \
         `sigsegv-batchN`: mapped `PROT_NONE`; a SIGSEGV handler (SA_SIGINFO, only syscalls and atomics) \
         `mprotect`s `PROT_READ` and `mlock`s the faulting page and the N−1 pages after it. **Unlike the seed's \
         handler**, which locked the faulting page and then speculatively tried the following N−1 (it did not know \
         where the mapping ended), ours knows the mapping's bounds (global atomics) and clips the batch to them: one \
         `mprotect` and one `mlock` per signal. As in the seed, a batch starts at the faulting page, not at an \
         aligned boundary, so batches overlap pages made readable before and a batch-N row takes more than \
         pages / N signals (its `sigsegv` metric). `onfault`: `mlock2(MLOCK_ONFAULT)` over the whole mapping. \
         `locked_pages`/`resident_pages` for the kernel: the change of `Locked:`/`Rss:` in `/proc/self/smaps_rollup` \
         over the run (pages of this mapping that are mapped, and mapped in locked VMAs); `faults`: the process's \
         minor + major faults during processing (`getrusage`); `sigsegv`: signals the handler served."
            .into(),
    );
    let mc = if map_count_log.is_empty() { "no change was needed".to_string() } else { map_count_log.join("; ") };
    e.notes.push(format!(
        "`vm.max_map_count` for the rows that split the mapping (`mlock-each-access`, `sigsegv-batch*`): raised to \
         2 × pages + 1000 for each run and restored right after it, also on failure; {mc}. The seed reports \
         that batch 1 fails with ENOMEM at the default; if raising fails here, the row shows the errno it failed \
         with instead of numbers."
    ));
    e.notes.push(format!(
        "usermm rows: a fresh space per run, budget = the file's size rounded up to 2 MiB ({} MiB; no slack was \
         needed), `memlock_bytes` = the budget, no swap, flag `UMM_F_KEEP_FILE_CACHE` (file pages stay in the host \
         page cache, so usermm reads through the same warm cache as the kernel rows; that cache is memory the \
         budget does not show, as for the kernel rows). The file opened `O_RDONLY`, mapped with \
         `Space::mmap(PROT_READ, MAP_SHARED)`; reads are the same volatile 1-byte loads. `locked_pages` and \
         `resident_pages` are `Stats` at the end of processing; `faults`/`major_faults`/`evictions` their change \
         during it. usermm's background reclaim keeps up to 2 × min(budget/32, 4096) pages free, so with a budget \
         equal to the file's size the unlocked `plain` row evicts and re-reads some pages (its `evictions`); the \
         locked rows cannot be evicted.",
        budget / MIB
    ));
    e.notes.push(format!(
        "Runs: every row {runs}, except `mlock-each-access` and `sigsegv-batch1` ({slow_runs}: each takes seconds; \
         `--slow-runs`). The order of the rows rotates run by run, and the two cache layouts alternate which comes \
         first. A row's `runs` column says how many runs it has."
    ));
    e.notes.push(format!(
        "Rows `{SEED_SYSTEM}` are seed 000's own averages (5 GB file, 15,000,000 accesses, 20 runs, ms), measured on \
         other hardware with Linux 4.2: for reference only, never in a ratio. The seed has no plain-mmap row. \
         KERNEL-FACTS records this host at 2 GiB / 4M reads on a 4 KiB-page cache: plain 0.20 s; mlock-all 238 ms + \
         0.06 s; mlock each access 10.3 s; SIGSEGV batch 1/8/16: 8.1/1.32/0.81 s; ONFAULT 0.28 s; on large folios \
         plain and ONFAULT 0.045 s."
    ));
    for (s, n, why) in &failed {
        e.notes.push(format!("**{s} {n} failed**: {why} (its later runs were skipped)."));
    }
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    Ok(e)
}
