//! The output of `lockonfault`: the summary table (one line per row, with
//! the host page-cache layout its runs saw and the seed's own averages),
//! the goals, and the notes that say how every row was measured.

use super::{Cache, Layout, Opts, Outcome, Variant, SEED, SEED_SYSTEM};
use crate::common::MIB;
use crate::report::{fmt_num, Experiment, Goal, Table};

/// The lo–hi range of the large-folio fractions `ps`.
fn lo_hi(ps: &[f64]) -> (f64, f64) {
    ps.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &p| (a.min(p), b.max(p)))
}

/// The "host page cache" cell of row `v`: what the layouts its runs saw say.
fn cache_cell(v: &Variant, seen: &[&Layout]) -> String {
    match seen.iter().map(|l| l.large_pct).collect::<Option<Vec<f64>>>() {
        Some(ps) if !ps.is_empty() => {
            let (lo, hi) = lo_hi(&ps);
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
    }
}

/// The seed's setup (`col` 0) or processing (1) average of row `v`, if it has one.
fn seed_of(v: &Variant, col: usize) -> String {
    SEED.iter()
        .find(|s| v.system == "kernel" && v.cache == Cache::Small && s.0 == v.base)
        .map_or("–".to_string(), |s| fmt_num(if col == 0 { s.1 } else { s.2 }))
}

/// The cells of row `v`'s line; `None`: it has no runs.
fn line(e: &Experiment, v: &Variant, out: &Outcome, base_proc: f64) -> Option<Vec<String>> {
    let name = v.name();
    let seen: Vec<&Layout> =
        out.layouts.iter().filter(|(s, n, _)| s == v.system && *n == name).map(|(_, _, l)| l).collect();
    let mut cells = vec![v.system.to_string(), name.clone(), cache_cell(v, &seen)];
    if let Some((_, _, why)) = out.failed(v, &name) {
        cells.extend([
            "0".into(),
            format!("FAILED: {why}"),
            "–".into(),
            "–".into(),
            "–".into(),
            "–".into(),
            seed_of(v, 0),
            seed_of(v, 1),
        ]);
        return Some(cells);
    }
    let setup = e.row(v.system, &name, "setup")?;
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
        seed_of(v, 0),
        seed_of(v, 1),
    ]);
    Some(cells)
}

/// The summary table: one line per row.
pub(super) fn summary(e: &mut Experiment, o: &Opts, out: &Outcome) {
    let base_proc = e.med("kernel", "onfault", "processing");
    let lines: Vec<Vec<String>> = o.all.iter().filter_map(|v| line(e, v, out, base_proc)).collect();
    let (reads, len) = (o.reads, o.len);
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
}

/// The goals: usermm's lock-on-fault setup, and its processing against the
/// seed's SIGSEGV handler and the kernel's `MLOCK_ONFAULT`.
pub(super) fn goals(e: &mut Experiment) {
    let base_proc = e.med("kernel", "onfault", "processing");
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
        what: "usermm lock-on-fault processing, faults resolved in the faulting thread, vs the seed's SIGSEGV \
               batch-16 handler"
            .into(),
        how: format!("{} onfault / kernel sigsegv-batch16, processing", super::IN_THREAD),
        value: e.med(super::IN_THREAD, "onfault", "processing") / b16,
        unit: "×".into(),
        at_least: false,
        threshold: 0.7,
        goal: 0.7,
    });
    e.goals.push(Goal {
        what: "usermm lock-on-fault processing vs the kernel's MLOCK_ONFAULT (4 KiB page cache)".into(),
        how: "usermm onfault / kernel onfault, processing".into(),
        value: uo_proc / base_proc,
        unit: "×".into(),
        at_least: false,
        // (The goal of "Faults that cost what the hardware costs": a
        // userfaultfd fault that copies its window stays ~3.5× the kernel's
        // zero-copy fault on a warm page cache; docs/design.md.)
        threshold: 4.0,
        goal: 4.0,
    });
}

/// The note on the host page cache: the layouts the runs saw, and how they
/// were made and checked.
fn layout_note(e: &mut Experiment, layouts: &[(String, String, Layout)], sample_every: usize) {
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
                let (lo, hi) = lo_hi(&ps);
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
}

/// The notes: how the page cache held the file, how every row is measured,
/// and what failed.
pub(super) fn notes(e: &mut Experiment, o: &Opts, out: Outcome) {
    let Opts { len, reads, runs, slow_runs, seed, ref dir, sample_every, budget, .. } = *o;
    let Outcome { errors, failed, layouts, map_count_log } = out;
    layout_note(e, &layouts, sample_every);
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
}
