//! The output of `outofcore`: the goals (usermm against the kernel under the
//! same limit and against the pread cache, usermm's resident peak) and the
//! notes that say how every system was measured.

use super::{Opts, Totals, MEMCG};
use crate::common::MIB;
use crate::memcg::{self, KernelLimit};
use crate::report::{fmt_num, Experiment, Goal};

/// The note on `kernel-memcg`: how it ran, or why it was not measured.
pub(super) fn memcg_note(
    limit: &Result<KernelLimit, String>,
    budget: usize,
    memcg_peak_max: f64,
    oom_kills: u32,
) -> String {
    match limit {
        Ok(_) => format!(
            "**`{MEMCG}`**: the kernel under the same limit. For each workload and run, a child process (`usermm {} \
             outofcore …`) is put into a fresh cgroup v1 memory group `{}<pid>-<n>` with `memory.limit_in_bytes` = \
             the budget ({} MiB) before it maps anything, then maps the file (`MAP_SHARED`, `PROT_READ`, the same \
             `madvise`/`posix_fadvise` as `kernel-mmap`) and makes the same reads, from a cold page cache. The page \
             cache it fills is charged to its group and reclaimed ({}) at the limit; no swap file (usermm's space \
             here has no swap). Its offsets are worked out before it joins the group (the other systems' offset \
             lists are outside their budgets too). `resident_peak` = the group's `memory.max_usage_in_bytes` \
             (everything charged to it: page cache and the child's own memory; largest seen: {} MiB); \
             `major_faults` its `ru_majflt`; `pages_read` = `read_bytes` of its `/proc/self/io` / 4 KiB (read-ahead \
             included). The group is made and removed by the benchmark (also on error, SIGINT and SIGTERM). {}",
            memcg::CHILD_CMD,
            memcg::CGROUP_PREFIX,
            budget / MIB,
            memcg::kernel_lru(),
            fmt_num(memcg_peak_max / MIB as f64),
            memcg::oom_sentence(oom_kills),
        ),
        Err(why) => format!("**`{MEMCG}` not measured**: {why}. The goals against it read \"not measured\"."),
    }
}

/// The goals of the workloads in `wanted`, against `base` (`kernel-memcg`, or
/// a name with no rows when it was not measured), and the resident peak's.
pub(super) fn goals(e: &mut Experiment, wanted: &[&str], base: &str, budget: usize, usermm_peak_max: f64) {
    let ratio = |what: &str, variant: &str, base: &str, threshold: f64, goal: f64| Goal {
        what: what.into(),
        how: format!("usermm/{base}, {variant} throughput"),
        value: e.med("usermm", variant, "throughput") / e.med(base, variant, "throughput"),
        unit: "×".into(),
        at_least: true,
        threshold,
        goal,
    };
    let g1 = ratio("hot/cold reads vs a hand-written pread cache", "hotcold", "pread-cache", 1.0, 1.5);
    let g2 = ratio("sequential scan vs the kernel under the same limit", "seq-scan", base, 1.0, 1.0);
    let g3 = ratio("random reads vs the kernel under the same limit", "random", base, 0.8, 1.0);
    let g4 = ratio("hot/cold reads vs the kernel under the same limit", "hotcold", base, 0.8, 1.0);
    if wanted.contains(&"random") {
        e.goals.push(g3);
    }
    if wanted.contains(&"hotcold") {
        e.goals.push(g4);
        e.goals.push(g1);
    }
    if wanted.contains(&"seq-scan") {
        e.goals.push(g2);
    }
    if wanted.contains(&"random") {
        e.goals.push(Goal {
            what: "random 4 KiB misses, faults resolved in the faulting thread, vs a hand-written pread cache".into(),
            how: format!("{}/pread-cache, random throughput", super::IN_THREAD),
            value: e.med(super::IN_THREAD, "random", "throughput") / e.med("pread-cache", "random", "throughput"),
            unit: "×".into(),
            at_least: true,
            threshold: 0.84,
            goal: 0.84,
        });
    }
    let budget_mib = (budget / MIB) as f64;
    e.goals.push(Goal {
        what: "usermm resident peak within the budget".into(),
        how: "max over runs and workloads of resident_pages_max × page size".into(),
        value: usermm_peak_max / MIB as f64,
        unit: " MiB".into(),
        at_least: false,
        threshold: budget_mib,
        goal: budget_mib,
    });
}

/// The notes, in order: the workloads, the timing, each system, the
/// descriptor's mode, anything odd, quick mode, errors.
pub(super) fn notes(e: &mut Experiment, o: &Opts, memcg_note: String, t: Totals) {
    let Opts { len, pages, budget, reads, hot_touch, hot_pages, hot_pct, every, usermm_rdwr, ref dir, .. } = *o;
    let Totals { errors, writebacks, .. } = t;
    e.notes.push(format!(
        "File {} MiB ({} pages) in `{dir}`, written once with random-ish content (every 8-byte word a hash of its \
         index) and deleted at the end; budget {} MiB for usermm and for the pread cache. `random`: {reads} uniform \
         random 8-byte reads at 4 KiB-aligned offsets; `hotcold`: {reads} reads, {hot_touch}% of them to the first \
         {} pages ({}% of the file), the rest to the remainder; `seq-scan`: 8 bytes of every page in order ({} \
         reads). The same offsets for every system and run; every value read is summed and the sum checked against \
         the one the content implies. Each (system, workload) starts cold: the file is opened afresh and its host \
         page cache dropped (`POSIX_FADV_DONTNEED` on the whole file) before it; usermm uses a fresh space for each.",
        len / MIB,
        pages,
        budget / MIB,
        hot_pages,
        hot_pct,
        pages,
    ));
    e.notes.push(format!(
        "`throughput` = reads / wall time of the whole loop. `p50`/`p99`: latency of every {every}th read alone \
         (timed with `now_ns()` around the read; the loop's other reads are not timed, so the timer's cost barely \
         touches throughput)."
    ));
    system_notes(e, memcg_note);
    e.notes.push(format!(
        "usermm's descriptor is opened `{}` (`--usermm-rdwr`). usermm writes back only pages that were resident \
         while their region was writable, so a `PROT_READ` mapping never writes: its clean pages are dropped with \
         no I/O when evicted.",
        if usermm_rdwr { "O_RDWR" } else { "O_RDONLY" }
    ));
    if writebacks > 0 {
        e.notes.push(format!(
            "**odd**: usermm wrote back {writebacks} pages of a `PROT_READ` mapping that no one wrote (see above)."
        ));
    }
    e.notes.push(
        "Quick mode uses a 256 MiB file and a 64 MiB budget with 50,000 reads (the same 4× ratio and reads per page \
         as `--full`'s 4 GiB / 1 GiB / 800,000): at 1 GiB / 256 MiB / 200,000 reads one run of the three systems \
         takes about a minute on this 2-vCPU VM (a random 4 KiB read from disk costs ~35-50 µs)."
            .into(),
    );
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
}

/// The notes on how each system reads the file.
fn system_notes(e: &mut Experiment, memcg_note: String) {
    e.notes.push(
        "`usermm`: `MAP_SHARED` `PROT_READ` mapping of the file in a space with no swap; `MADV_RANDOM` on the \
         region for `random` and `hotcold` (a fault reads exactly its page), `MADV_SEQUENTIAL` for `seq-scan` \
         (usermm reads through its own open file descriptions of the file, one per reading thread, so \
         `posix_fadvise` on the program's descriptor would not reach its reads). \
         `resident_peak` = `Stats::resident_pages_max` × page size; usermm also drops the host page cache behind \
         its reads, so that is all the memory the file costs it, apart from the host's read-ahead ahead of a \
         stream (up to the disk's `read_ahead_kb`). `faults` = delta of `Stats::faults` \
         (`Stats::major_faults` stays 0 for pages read from a file, so it is not shown). `writebacks` = delta \
         of `Stats::writebacks` over the workload and its `munmap`."
            .into(),
    );
    e.notes.push(memcg_note);
    e.notes.push(
        "**`kernel-mmap` is an upper bound and no goal's yardstick: the page cache takes what it wants** (no budget). Plain host `mmap` \
         (`MAP_SHARED`, `PROT_READ`) with `madvise` + `posix_fadvise` `RANDOM` (`random`, `hotcold`) or \
         `SEQUENTIAL` (`seq-scan`). Its `resident_peak` is **approximate**: `VmHWM` at the end − `VmRSS` before \
         (peak reset through `/proc/self/clear_refs`), i.e. the file pages mapped into this process; pages the \
         page cache holds unmapped (readahead) are not counted. `major_faults` are the whole process's \
         (`getrusage`)."
            .into(),
    );
    e.notes.push(
        "`pread-cache`: a user-space page cache of the same budget (LRU over 4 KiB slots in one arena, a hash map \
         page → slot, one 4 KiB `pread` per miss, then `POSIX_FADV_DONTNEED` on that page; `posix_fadvise` \
         `RANDOM`/`SEQUENTIAL` on its descriptor as for the kernel). `resident_peak` = slots filled × 4 KiB (≤ the \
         budget by construction); in `seq-scan` the kernel's readahead window may briefly hold a few pages more in \
         the page cache. `misses` = preads."
            .into(),
    );
}
