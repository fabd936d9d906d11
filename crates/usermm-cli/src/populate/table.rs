//! The output of `populate`: the goals (usermm's `MADV_POPULATE_*` against
//! the kernel's and against touching pages one by one), the summary table
//! (usermm / kernel per size, kind and method), and the notes.

use super::{variant, Opts, ONE_BY_ONE, SEED_SYSTEM};
use crate::report::{fmt_num, Experiment, Goal, Table};

/// The goals of the largest size's private kind, with the note that puts
/// the last one in context.
pub(super) fn goals(e: &mut Experiment, o: &Opts) {
    let large = o.sizes.iter().copied().max().unwrap_or(0);
    let (kinds, methods) = (&o.kinds, &o.methods);
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
}

/// The summary table: per size and kind, usermm / kernel of every method.
pub(super) fn summary(e: &mut Experiment, o: &Opts) {
    let (sizes, kinds, methods, runs) = (&o.sizes, &o.kinds, &o.methods, o.runs);
    let mut lines = Vec::new();
    for &size in sizes {
        for k in kinds {
            let mut cells = vec![format!("{size} MiB"), k.clone()];
            for m in methods {
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
}

/// The notes: the sizes, kinds and methods; the file kinds and the page
/// cache (`layouts`: per size, resident % and % in large folios); the seed's
/// rows; errors.
pub(super) fn notes(e: &mut Experiment, o: &Opts, layouts: &[(u64, (f64, Option<f64>))], errors: Vec<String>) {
    let (sizes, runs, warmup) = (&o.sizes, o.runs, o.warmup);
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
    if o.any_file {
        file_note(e, o, layouts);
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
}

/// The note on the file kinds: the test files, the warm host page cache,
/// and what each system's writes do to the file.
fn file_note(e: &mut Experiment, o: &Opts, layouts: &[(u64, (f64, Option<f64>))]) {
    let (dir, file_warmup, warmup) = (&o.dir, o.file_warmup, o.warmup);
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
