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

mod file;
mod kernel;
mod table;
mod touch;
mod usermm;

use self::file::TestFile;
use crate::common::{default_swap_dir, run_label, systems, Progress, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::Experiment;

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

/// The parameters of one `populate` experiment, checked.
struct Opts {
    sizes: Vec<u64>,
    runs: usize,
    warmup: usize,
    dir: String,
    /// The warm-up runs the file kinds take (the last ones).
    file_warmup: usize,
    kinds: Vec<String>,
    methods: Vec<String>,
    /// Whether a file kind is selected (then there are test files).
    any_file: bool,
}

fn opts(p: &Params) -> Result<Opts, String> {
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
    let any_file = kinds.iter().any(|k| MapKind::parse(k).is_some_and(MapKind::file));
    Ok(Opts { sizes, runs, warmup, dir, file_warmup, kinds, methods, any_file })
}

/// A row's variant name: `{size}MiB-{kind}-{method}`.
fn variant(size: u64, kind: &str, method: &str) -> String {
    format!("{size}MiB-{kind}-{method}")
}

/// One test file per size, shared by both file kinds and every run (none
/// without a file kind), with the page-cache layout of each after its first
/// read.
type Files = (Vec<TestFile>, Vec<(u64, (f64, Option<f64>))>);

fn test_files(o: &Opts, prog: &Progress) -> Result<Files, String> {
    let mut files = Vec::new();
    let mut layouts = Vec::new();
    if o.any_file {
        for &size in &o.sizes {
            prog.say(&format!("writing the {size} MiB test file in {}", o.dir));
            let f = TestFile::create(&o.dir, size as usize * MIB)?;
            f.warm()?;
            layouts.push((size, f.layout()?));
            files.push(f);
        }
    }
    Ok((files, layouts))
}

/// Reports a problem: on the progress lines and in `errors`.
fn error(errors: &mut Vec<String>, prog: &Progress, msg: String) {
    prog.say(&format!("ERROR: {msg}"));
    errors.push(msg);
}

/// One measurement of `method` on a region of `size` MiB of `kind` by
/// `sys`; added to `e` when `measured` (not a warm-up run).
fn measure_one(
    e: &mut Experiment,
    errors: &mut Vec<String>,
    prog: &Progress,
    (sys, size, kind_name, method): (&str, u64, &str, &str),
    file: Option<&TestFile>,
    measured: bool,
) -> Result<(), String> {
    let kind = MapKind::parse(kind_name).expect("checked");
    let bytes = size as usize * MIB;
    let v = variant(size, kind_name, method);
    if let Some(f) = file {
        let bad = f.warm()?;
        if bad > 0 {
            error(errors, prog, format!("before {sys} {v}: {bad} pages of the test file lost their pattern"));
        }
    }
    let (ns, bad) = if sys == "kernel" {
        kernel::kernel_one(bytes, kind, method, file)?
    } else {
        usermm::usermm_one(bytes, kind, method, file)?
    };
    if bad > 0 {
        error(errors, prog, format!("{sys} {v}: {bad} pages wrong or not prefaulted"));
    }
    if measured {
        e.add(sys, &v, "ns_per_page", "ns", ns as f64 / (bytes / PAGE) as f64);
    }
    Ok(())
}

/// The warm-up and measured runs: every size, kind, method and system
/// (alternating which system goes first).
fn measure(o: &Opts, files: &[TestFile], e: &mut Experiment, prog: &Progress) -> Result<Vec<String>, String> {
    let (runs, warmup) = (o.runs, o.warmup);
    let mut errors = Vec::new();
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        let which = run_label(r, warmup, runs);
        for (si, &size) in o.sizes.iter().enumerate() {
            prog.say(&format!("{size} MiB, {which}"));
            for kind_name in &o.kinds {
                let kind = MapKind::parse(kind_name).expect("checked");
                if kind.file() && r + o.file_warmup < warmup {
                    continue; // the file kinds take only the last `file_warmup` warm-up runs
                }
                let file = if kind.file() { files.get(si) } else { None };
                for method in &o.methods {
                    if method == ONE_BY_ONE && kind != MapKind::Private {
                        continue;
                    }
                    for sys in systems(r) {
                        measure_one(e, &mut errors, prog, (sys, size, kind_name, method), file, measured)?;
                    }
                }
            }
        }
    }
    Ok(errors)
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let o = opts(p)?;
    let mut e = Experiment::new(
        "populate",
        "seed 004: prefault a fresh region, anonymous or file-backed (ns per 4 KiB page)",
        p.pairs(),
    );
    let (files, layouts) = test_files(&o, prog)?;
    let mut errors = measure(&o, &files, &mut e, prog)?;
    for f in &files {
        // The shared-file writes stored each page's own pattern back, and a
        // private file's writes never reach it: the file must be intact.
        let bad = f.warm()?;
        if bad > 0 {
            errors.push(format!("after the runs: {bad} pages of the {} MiB test file lost their pattern", f.len / MIB));
        }
    }
    for (size, kind, method, ms) in SEED {
        if o.kinds.iter().any(|k| k == kind) && o.methods.iter().any(|m| m == method) {
            let pages = (size as usize * MIB / PAGE) as f64;
            e.add(SEED_SYSTEM, &variant(size, kind, method), "ns_per_page_fastest", "ns", ms * 1e6 / pages);
        }
    }
    table::goals(&mut e, &o);
    table::summary(&mut e, &o);
    table::notes(&mut e, &o, &layouts, errors);
    Ok(e)
}
