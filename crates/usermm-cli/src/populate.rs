//! `populate` (seed 004): prefault a fresh region, host kernel vs usermm.
//!
//! For every size and kind (private anonymous, shared anonymous, shared file,
//! private file) and method:
//! - `read`: one 1-byte read per page (a user-mode load);
//! - `write`: one 1-byte write per page;
//! - `read-write`: one read and one write back of the same byte per page (the
//!   "don't overwrite existing data" prefault of QEMU and databases);
//! - `write-1by1` (private anonymous only): the write loop in a region advised
//!   `MADV_RANDOM`, so that every page takes a fault of its own (usermm's
//!   default loop has one fault map a batch of pages);
//! - `populate-read` / `populate-write`: one `madvise(MADV_POPULATE_*)` call
//!   over the region;
//! - `map-populate`: `mmap(MAP_POPULATE)` (the mmap call itself is timed).
//!
//! Every measurement maps a fresh region (on the usermm side in a fresh space
//! whose budget holds it, no swap), times only the prefault, verifies every
//! page untimed, and unmaps. The result is wall time per 4 KiB page; a row's
//! min is the fastest of its runs (what the seed reports), its value the
//! median.
//!
//! The file kinds map one test file per size, written once (a per-page
//! pattern, fsynced) and reused by every run. Before each measurement the
//! file is made clean (`fdatasync`: no write-back pending from an earlier
//! run) and read once through `pread` (verifying the pattern), so both
//! systems start from the same warm host page cache; usermm's spaces use
//! `UMM_F_KEEP_FILE_CACHE`, so its reads go through that warm cache too.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use usermm::consts::{
    MADV_POPULATE_READ, MADV_POPULATE_WRITE, MADV_RANDOM, MAP_ANONYMOUS, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED,
    PROT_READ, PROT_WRITE, UMM_F_KEEP_FILE_CACHE,
};
use usermm::{Config, Space};
use usermm_sys::host::{page_cache_layout, HostFileMap, HostMap};
use usermm_sys::kernel::{peek, poke};
use usermm_sys::now_ns;

use crate::common::{default_swap_dir, systems, Progress, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Goal, Table};

pub fn params(full: bool) -> Params {
    Params::default()
        .def(
            "sizes_mib",
            Kind::IntList,
            if full { "2,1024,4096" } else { "2,256" },
            "region sizes (MiB); goals use the largest, private",
        )
        .def(
            "kinds",
            Kind::Text,
            KINDS.join(","),
            "mapping kinds: private, shared (anonymous), file-shared, file-private (a test file per size)",
        )
        .def("methods", Kind::Text, METHODS.join(","), "prefault methods (see the report's notes)")
        .def("runs", Kind::Int, if full { 10 } else { 5 }, "measured runs (fresh regions) per row")
        .def("warmup", Kind::Int, 1, "unmeasured warm-up runs before the measured ones")
        .def(
            "file_warmup",
            Kind::Int,
            if full { 1 } else { 0 },
            "warm-up runs the file kinds take (the last ones of --warmup; each file run re-reads the page cache)",
        )
        .def("dir", Kind::Text, default_swap_dir(), "directory of the file kinds' test files (not a tmpfs: a disk)")
}

const METHODS: [&str; 7] =
    ["read", "write", "read-write", "write-1by1", "populate-read", "populate-write", "map-populate"];

/// `write-1by1` is the write loop in a region advised `MADV_RANDOM`: one
/// fault per page, with no fault-around (usermm's default write loop maps a
/// batch of pages per fault). It runs on private anonymous regions only.
const ONE_BY_ONE: &str = "write-1by1";

/// The loop a method runs (`write-1by1` is the write loop).
fn loop_of(method: &str) -> &str {
    if method == ONE_BY_ONE {
        "write"
    } else {
        method
    }
}
const KINDS: [&str; 4] = ["private", "shared", "file-shared", "file-private"];

/// What a region maps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MapKind {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`.
    Private,
    /// `MAP_SHARED | MAP_ANONYMOUS`.
    Shared,
    /// `MAP_SHARED` of the test file.
    FileShared,
    /// `MAP_PRIVATE` of the test file (a write copies the page).
    FilePrivate,
}

impl MapKind {
    fn parse(s: &str) -> Option<MapKind> {
        Some(match s {
            "private" => MapKind::Private,
            "shared" => MapKind::Shared,
            "file-shared" => MapKind::FileShared,
            "file-private" => MapKind::FilePrivate,
            _ => return None,
        })
    }
    fn shared(self) -> bool {
        matches!(self, MapKind::Shared | MapKind::FileShared)
    }
    fn file(self) -> bool {
        matches!(self, MapKind::FileShared | MapKind::FilePrivate)
    }
}

/// The byte the test file holds in every byte of page `p` (never 0, so that
/// a page read from anywhere but the file reads back wrong).
#[inline(always)]
fn pattern(p: usize) -> u8 {
    (p % 251) as u8 + 1
}

/// The byte `write` stores into page `p`: 1 for anonymous memory; for a
/// shared file the page's own pattern byte (the file keeps its content, so
/// every run maps the same file); for a private file the pattern's
/// complement (only the private copy changes: the verification proves the
/// copy was made and the file was not written).
#[inline(always)]
fn stored(kind: MapKind, p: usize) -> u8 {
    match kind {
        MapKind::Private | MapKind::Shared => 1,
        MapKind::FileShared => pattern(p),
        MapKind::FilePrivate => !pattern(p),
    }
}

/// The byte every page's first byte holds after `method` (fresh anonymous
/// memory is 0, a file page its pattern; only `write` stores something
/// else).
fn expected(kind: MapKind, method: &str, p: usize) -> u8 {
    match (kind.file(), method == "write") {
        (_, true) => stored(kind, p),
        (false, false) => 0,
        (true, false) => pattern(p),
    }
}

/// The timed loop over `pages` pages at `addr` (never a Rust reference).
fn touch_loop(addr: usize, pages: usize, method: &str, kind: MapKind) {
    match method {
        "read" => {
            let mut sum = 0u8;
            for p in 0..pages {
                sum = sum.wrapping_add(peek(addr + p * PAGE));
            }
            std::hint::black_box(sum);
        }
        "write" => match kind {
            MapKind::Private | MapKind::Shared => {
                for p in 0..pages {
                    poke(addr + p * PAGE, 1);
                }
            }
            _ => {
                for p in 0..pages {
                    poke(addr + p * PAGE, stored(kind, p));
                }
            }
        },
        _ => {
            for p in 0..pages {
                let a = addr + p * PAGE;
                poke(a, peek(a));
            }
        }
    }
}

/// Pages whose first byte is not what `method` leaves (untimed).
fn verify(addr: usize, pages: usize, method: &str, kind: MapKind) -> usize {
    (0..pages).filter(|&p| peek(addr + p * PAGE) != expected(kind, loop_of(method), p)).count()
}

fn advice(method: &str) -> i32 {
    if method == "populate-read" {
        MADV_POPULATE_READ
    } else {
        MADV_POPULATE_WRITE
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The file kinds' test file of one size; deleted when dropped.
struct TestFile {
    path: String,
    file: File,
    len: usize,
}

impl TestFile {
    /// Creates the file in `dir`: `len` bytes of [`pattern`], written with
    /// 1 MiB `pwrite`s and `fsync`ed.
    fn create(dir: &str, len: usize) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-populate-{}-{}MiB-{}.dat", std::process::id(), len / MIB, now_ns());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io(&format!("create {path}"), e))?;
        let t = TestFile { path, file, len };
        let mut buf = vec![0u8; MIB];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MIB);
            for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
                page.fill(pattern(off / PAGE + i));
            }
            t.file.write_all_at(&buf[..n], off as u64).map_err(|e| io("pwrite", e))?;
            off += n;
        }
        t.file.sync_all().map_err(|e| io("fsync", e))?;
        Ok(t)
    }

    /// Right before a measurement (untimed): writes back whatever an earlier
    /// run dirtied (`fdatasync`; a no-op when the file is clean), then reads
    /// the whole file with 1 MiB `pread`s so that the host page cache holds
    /// all of it. Returns the pages whose first byte is not their pattern
    /// (0: the file is intact).
    fn warm(&self) -> Result<usize, String> {
        self.file.sync_data().map_err(|e| io("fdatasync", e))?;
        let mut buf = vec![0u8; MIB];
        let mut bad = 0;
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(MIB);
            self.file.read_exact_at(&mut buf[..n], off as u64).map_err(|e| io("pread", e))?;
            bad += (0..n / PAGE).filter(|&i| buf[i * PAGE] != pattern(off / PAGE + i)).count();
            off += n;
        }
        Ok(bad)
    }

    /// `(resident %, % of sampled pages in large folios)` of the file in
    /// the host page cache (the second `None` without root).
    fn layout(&self) -> Result<(f64, Option<f64>), String> {
        let l = page_cache_layout(&self.file, self.len, 64).map_err(|e| io("page-cache sampler", format!("{e:?}")))?;
        let large = l.folios.ok().filter(|s| s.sampled > 0).map(|s| 100.0 * s.large_fraction());
        Ok((100.0 * l.resident_pages as f64 / l.pages as f64, large))
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A kernel mapping of either kind.
enum KernelMap {
    Anon(HostMap),
    File(HostFileMap),
}

impl KernelMap {
    fn addr(&self) -> usize {
        match self {
            KernelMap::Anon(m) => m.addr(),
            KernelMap::File(m) => m.addr(),
        }
    }
    fn madvise(&mut self, advice: i32) -> Result<(), usermm::Errno> {
        match self {
            KernelMap::Anon(m) => m.madvise(advice),
            KernelMap::File(m) => m.madvise(advice),
        }
    }
    fn unmap(self) -> Result<(), usermm::Errno> {
        match self {
            KernelMap::Anon(m) => m.unmap(),
            KernelMap::File(m) => m.unmap(),
        }
    }
}

/// Times `method`'s prefault of the `pages` pages at `addr` (ns); `advise`
/// is the system's `madvise` over the region. `map-populate` is the mmap
/// itself (`map_ns`); `write-1by1` advises `MADV_RANDOM` first, untimed.
fn prefault(
    method: &str,
    map_ns: u64,
    addr: usize,
    pages: usize,
    kind: MapKind,
    mut advise: impl FnMut(i32) -> Result<(), String>,
) -> Result<u64, String> {
    Ok(match method {
        "map-populate" => map_ns,
        "populate-read" | "populate-write" => {
            let t = now_ns();
            advise(advice(method))?;
            now_ns() - t
        }
        _ => {
            if method == ONE_BY_ONE {
                advise(MADV_RANDOM)?;
            }
            let t = now_ns();
            touch_loop(addr, pages, loop_of(method), kind);
            now_ns() - t
        }
    })
}

/// One measurement: `(ns, pages read back wrong)`.
fn kernel_one(size: usize, kind: MapKind, method: &str, file: Option<&TestFile>) -> Result<(u64, usize), String> {
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let m = match (kind, file) {
        (MapKind::Private, _) => HostMap::anon(size, extra).map(KernelMap::Anon),
        (MapKind::Shared, _) => HostMap::shared_anon(size, extra).map(KernelMap::Anon),
        (_, Some(f)) => HostFileMap::open_rw(&f.file, size, kind.shared(), extra).map(KernelMap::File),
        (_, None) => return Err("populate: a file kind without its test file".into()),
    };
    let mut m = m.map_err(|e| format!("kernel mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let addr = m.addr();
    let ns = prefault(method, map_ns, addr, pages, kind, |adv| {
        m.madvise(adv).map_err(|e| format!("kernel madvise({adv}): {e:?}"))
    })?;
    let bad = verify(m.addr(), pages, method, kind);
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok((ns, bad))
}

fn usermm_one(size: usize, kind: MapKind, method: &str, file: Option<&TestFile>) -> Result<(u64, usize), String> {
    let cfg = Config {
        budget_bytes: size + 64 * MIB,
        swap_bytes: 0,
        flags: if kind.file() { UMM_F_KEEP_FILE_CACHE } else { 0 },
        ..Config::default()
    };
    let (fd, anon) = match (kind.file(), file) {
        (false, _) => (-1, MAP_ANONYMOUS),
        (true, Some(f)) => (f.file.as_raw_fd(), 0),
        (true, None) => return Err("populate: a file kind without its test file".into()),
    };
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let share = if kind.shared() { MAP_SHARED } else { MAP_PRIVATE };
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let a = space
        .mmap(0, size, PROT_READ | PROT_WRITE, share | anon | extra, fd, 0)
        .map_err(|e| format!("usermm mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let ns = prefault(method, map_ns, a, pages, kind, |adv| {
        space.madvise(a, size, adv).map_err(|e| format!("usermm madvise({adv}): {e:?}"))
    })?;
    let faults = space.stats().faults;
    let mut bad = verify(a, pages, method, kind);
    if (method.starts_with("populate") || method == "map-populate") && space.stats().faults != faults {
        // A prefault that left pages to fault in afterwards did not prefault.
        bad += (space.stats().faults - faults) as usize;
    }
    // Untimed: a shared file region is written back here.
    space.munmap(a, size).map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok((ns, bad))
}

/// Seed 004's numbers (fastest of 10, ms, anonymous 4 KiB pages), measured
/// on other hardware: `(size MiB, kind, method, ms)`.
const SEED: [(u64, &str, &str, f64); 20] = [
    (2, "private", "read", 0.119),
    (2, "private", "write", 0.222),
    (2, "private", "read-write", 0.380),
    (2, "private", "populate-read", 0.060),
    (2, "private", "populate-write", 0.158),
    (4096, "private", "read", 237.940),
    (4096, "private", "write", 708.409),
    (4096, "private", "read-write", 1054.041),
    (4096, "private", "populate-read", 124.310),
    (4096, "private", "populate-write", 572.582),
    (2, "shared", "read", 0.394),
    (2, "shared", "write", 0.348),
    (2, "shared", "read-write", 0.400),
    (2, "shared", "populate-read", 0.326),
    (2, "shared", "populate-write", 0.273),
    (4096, "shared", "read", 1053.090),
    (4096, "shared", "write", 913.642),
    (4096, "shared", "read-write", 1060.350),
    (4096, "shared", "populate-read", 893.691),
    (4096, "shared", "populate-write", 782.885),
];

/// The system name of the seed's reference rows (never used in a ratio).
pub const SEED_SYSTEM: &str = "seed004-other-hw";

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let sizes = p.list("sizes_mib");
    let runs = p.int("runs").max(1) as usize;
    let warmup = p.int("warmup") as usize;
    let dir = p.text("dir");
    let file_warmup = (p.int("file_warmup") as usize).min(warmup);
    let split = |name: &str| -> Vec<String> { p.text(name).split(',').map(|s| s.trim().to_string()).collect() };
    let kinds = split("kinds");
    let methods = split("methods");
    if let Some(k) = kinds.iter().find(|k| MapKind::parse(k).is_none()) {
        return Err(format!("populate: unknown kind '{k}' ({})", KINDS.join(", ")));
    }
    if let Some(m) = methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
        return Err(format!("populate: unknown method '{m}' ({})", METHODS.join(", ")));
    }
    if sizes.contains(&0) {
        return Err("populate: sizes must be ≥ 1 MiB".into());
    }
    let mut e = Experiment::new(
        "populate",
        "seed 004: prefault a fresh region, anonymous or file-backed (ns per 4 KiB page)",
        p.pairs(),
    );
    let variant = |size: u64, kind: &str, method: &str| format!("{size}MiB-{kind}-{method}");
    let mut errors = Vec::new();
    // One test file per size, shared by both file kinds and every run.
    let any_file = kinds.iter().any(|k| MapKind::parse(k).is_some_and(MapKind::file));
    let mut files = Vec::new();
    let mut layouts = Vec::new();
    if any_file {
        for &size in &sizes {
            prog.say(&format!("writing the {size} MiB test file in {dir}"));
            let f = TestFile::create(&dir, size as usize * MIB)?;
            f.warm()?;
            layouts.push((size, f.layout()?));
            files.push(f);
        }
    }
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        let which =
            if measured { format!("run {}/{runs}", r - warmup + 1) } else { format!("warm-up {}/{warmup}", r + 1) };
        for (si, &size) in sizes.iter().enumerate() {
            prog.say(&format!("{size} MiB, {which}"));
            for kind_name in &kinds {
                let kind = MapKind::parse(kind_name).expect("checked");
                if kind.file() && r + file_warmup < warmup {
                    continue; // the file kinds take only the last `file_warmup` warm-up runs
                }
                let file = if kind.file() { files.get(si) } else { None };
                for method in &methods {
                    if method == ONE_BY_ONE && kind != MapKind::Private {
                        continue;
                    }
                    for sys in systems(r) {
                        let bytes = size as usize * MIB;
                        let v = variant(size, kind_name, method);
                        if let Some(f) = file {
                            let bad = f.warm()?;
                            if bad > 0 {
                                let msg = format!("before {sys} {v}: {bad} pages of the test file lost their pattern");
                                prog.say(&format!("ERROR: {msg}"));
                                errors.push(msg);
                            }
                        }
                        let (ns, bad) = if sys == "kernel" {
                            kernel_one(bytes, kind, method, file)?
                        } else {
                            usermm_one(bytes, kind, method, file)?
                        };
                        if bad > 0 {
                            let msg = format!("{sys} {v}: {bad} pages wrong or not prefaulted");
                            prog.say(&format!("ERROR: {msg}"));
                            errors.push(msg);
                        }
                        if measured {
                            e.add(sys, &v, "ns_per_page", "ns", ns as f64 / (bytes / PAGE) as f64);
                        }
                    }
                }
            }
        }
    }
    for f in &files {
        // The shared-file writes stored each page's own pattern back, and a
        // private file's writes never reach it: the file must be intact.
        let bad = f.warm()?;
        if bad > 0 {
            errors.push(format!("after the runs: {bad} pages of the {} MiB test file lost their pattern", f.len / MIB));
        }
    }
    for (size, kind, method, ms) in SEED {
        if kinds.iter().any(|k| k == kind) && methods.iter().any(|m| m == method) {
            let pages = (size as usize * MIB / PAGE) as f64;
            e.add(SEED_SYSTEM, &variant(size, kind, method), "ns_per_page_fastest", "ns", ms * 1e6 / pages);
        }
    }
    let large = sizes.iter().copied().max().unwrap_or(0);
    if kinds.iter().any(|k| k == "private") {
        for m in ["populate-write", "populate-read"] {
            if methods.iter().any(|x| x == m) {
                let what = format!("MADV_{} {large} MiB private", m.to_uppercase().replace('-', "_"));
                e.ratio_goal(&what, &variant(large, "private", m), "ns_per_page", false, 1.5, 1.0);
            }
        }
        let has = |m: &str| methods.iter().any(|x| x == m);
        if has(ONE_BY_ONE) && has("populate-write") {
            let one = e.med("usermm", &variant(large, "private", ONE_BY_ONE), "ns_per_page");
            let pw = e.med("usermm", &variant(large, "private", "populate-write"), "ns_per_page");
            e.goals.push(Goal {
                what: format!("usermm POPULATE_WRITE vs touching the pages one by one in usermm, {large} MiB private"),
                how: "usermm write-1by1 ns/page / usermm populate-write ns/page".into(),
                value: one / pw,
                unit: "×".into(),
                at_least: true,
                threshold: 3.0,
                goal: 3.0,
            });
            if has("write") {
                let w = e.med("usermm", &variant(large, "private", "write"), "ns_per_page");
                let kw = e.med("kernel", &variant(large, "private", "write"), "ns_per_page");
                let kpw = e.med("kernel", &variant(large, "private", "populate-write"), "ns_per_page");
                e.notes.push(format!(
                    "For context on the last goal: \"one by one\" is `write-1by1`, the write loop in a region advised \
                     `MADV_RANDOM`, so that every page takes its own fault. usermm's default write loop is cheaper: \
                     one of its faults maps a batch of pages (fault-around, see `fault`), and POPULATE_WRITE is only \
                     {}× faster than it ({large} MiB private, medians). On the host kernel in this run, where every \
                     anonymous page takes its own fault either way, the write loop / POPULATE_WRITE ratio is {}×.",
                    fmt_num(w / pw),
                    fmt_num(kw / kpw)
                ));
            }
        }
    }
    let mut lines = Vec::new();
    for &size in &sizes {
        for k in &kinds {
            let mut cells = vec![format!("{size} MiB"), k.clone()];
            for m in &methods {
                let v = variant(size, k, m);
                let (u, kn) = (e.med("usermm", &v, "ns_per_page"), e.med("kernel", &v, "ns_per_page"));
                cells.push(format!("{} / {} ({}×)", fmt_num(u), fmt_num(kn), fmt_num(u / kn)));
            }
            lines.push(cells);
        }
    }
    e.tables.push(Table {
        title: format!(
            "Summary: median ns per 4 KiB page of {runs} fresh regions, usermm / kernel (usermm ÷ kernel; below 1× \
             usermm is faster); file kinds on a warm host page cache"
        ),
        head: ["size", "kind"].iter().map(|s| s.to_string()).chain(methods.iter().cloned()).collect(),
        rows: lines,
    });
    e.notes.push(format!(
        "Sizes {} MiB{}; kinds: private = `MAP_PRIVATE|MAP_ANONYMOUS`, shared = `MAP_SHARED|MAP_ANONYMOUS`, \
         file-shared = `MAP_SHARED` of a test file, file-private = `MAP_PRIVATE` of it (a write copies the page), all \
         `PROT_READ|PROT_WRITE`. Every measurement maps a fresh region; usermm: a fresh space per measurement \
         (`Space::mmap`), budget = size + 64 MiB, no swap. Methods: `read` one 1-byte load per page, `write` one \
         1-byte store per page, `read-write` a load and a store back of the same byte, `write-1by1` (private \
         anonymous only) the write loop after `madvise(MADV_RANDOM)`, so that every page faults on its own, \
         `populate-read`/`populate-write` one `madvise(MADV_POPULATE_READ/WRITE)` over the region, `map-populate` the \
         `mmap(MAP_POPULATE)` call itself. Only the prefault is timed; afterwards every page is verified (untimed; for \
         usermm's prefault methods, no usermm fault may happen while verifying). `ns_per_page` is wall time / (size / \
         4 KiB): the value is the median of {runs} fresh regions, the min column the fastest (the seed's statistic), \
         after {warmup} warm-up run(s).",
        sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        if sizes.iter().all(|&s| s < 1024) {
            " (quick scale: 1 GiB is too slow for this mode's runs on 2 vCPUs; `--full` or `--sizes-mib` adds it)"
        } else {
            ""
        },
    ));
    if any_file {
        let layout = layouts
            .iter()
            .map(|(size, (res, large))| {
                let folios = large.map_or("folio sizes not readable (needs root)".to_string(), |l| {
                    format!("{}% of sampled pages in large folios", fmt_num(l))
                });
                format!("{size} MiB: {}% resident, {folios}", fmt_num(*res))
            })
            .collect::<Vec<_>>()
            .join("; ");
        e.notes.push(format!(
            "File kinds: one test file per size in `{dir}`, created once (every byte of page p holds p % 251 + 1; \
             1 MiB `pwrite`s, `fsync`) and mapped by every run of both file kinds (the kernel: a plain `mmap` of the \
             file; usermm: `Space::mmap` with its descriptor). **Host page cache: warm for both systems.** Before \
             every measurement (untimed) the file is `fdatasync`ed — whatever an earlier run dirtied (the kernel's \
             shared writes, usermm's write-back at `munmap`) goes to disk then, so no write-back runs during the timed \
             part — and read once through 1 MiB `pread`s, which also checks its pattern. Neither system reads the \
             disk: the kernel's faults map page-cache pages (a read fault maps up to 64 KiB of them: fault-around), \
             usermm fills its own pages by `pread` from that cache. usermm's spaces set `UMM_F_KEEP_FILE_CACHE` here \
             (by default usermm drops file pages from the host page cache behind its reads and writes, which would \
             leave the kernel's next row a cold file): the file data then sits twice in memory on the usermm side, in \
             the budget and in the page cache. `write` stores each page's own pattern byte in file-shared (the file \
             keeps its content) and the pattern's complement in file-private (verified: the private copy changed, the \
             file did not); `read-write` stores back the byte it read; the file is checked intact after the runs. \
             Linux's `MAP_POPULATE` write-prefaults only private writable mappings: on file-shared it maps the pages \
             read-only (write-protected for dirty tracking), usermm's maps them writable; a usermm shared file region \
             is writable, so its `munmap` (untimed) writes every resident page back (usermm does not track which pages \
             were written). That write-back and the `fdatasync` after it make a shared-file measurement several times \
             longer than its timed part, so the file kinds take {file_warmup} of the {warmup} warm-up run(s) \
             (`--file-warmup`; quick default 0: every file measurement starts from a re-read page cache, and the \
             anonymous kinds, when selected, take their warm-up run before the file kinds in the same round). Host \
             page cache after the first read of each file: {layout}."
        ));
    }
    e.notes.push(format!(
        "Rows `{SEED_SYSTEM}` are seed 004's published numbers (fastest of 10, converted from ms to ns per 4 KiB \
         page), measured on other hardware with an older kernel: for reference only, never in a ratio. The seed has no \
         `MAP_POPULATE`, no 1 GiB row and no file rows. KERNEL-FACTS records this host kernel at 1 GiB private \
         (fastest ns/page): read loop 886, write loop 2022, read+write 3323, POPULATE_READ 575, POPULATE_WRITE 1487, \
         MAP_POPULATE 1494."
    ));
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    Ok(e)
}
