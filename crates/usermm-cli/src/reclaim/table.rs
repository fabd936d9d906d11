//! The output of `reclaim`: the per-phase summary table, the goals (all
//! against `kernel-memcg`, the swap-out one against the disk), and the notes.

use super::{Opts, Totals, MEMCG, NOLIMIT, PHASES};
use crate::common::MIB;
use crate::memcg::{self, KernelLimit};
use crate::report::{fmt_num, Experiment, Goal, Table};

/// Per phase, the medians side by side: throughput and page traffic per
/// 1,000 touches of every system.
pub(super) fn summary_table(e: &mut Experiment) {
    let mut rows = Vec::new();
    for ph in PHASES {
        for sys in ["usermm", MEMCG, NOLIMIT] {
            let cell = |metric: &str| fmt_num(e.med(sys, ph, metric));
            let thr = e.row(sys, ph, "throughput");
            let Some(thr) = thr else { continue };
            rows.push(vec![
                ph.to_string(),
                sys.to_string(),
                format!("{} [{}..{}] {}", fmt_num(thr.median()), fmt_num(thr.min()), fmt_num(thr.max()), thr.unit),
                cell("page_reads_per_1k_touches"),
                cell("page_writes_per_1k_touches"),
                cell("major_faults_per_1k_touches"),
                cell("parked_faults_per_1k_touches"),
            ]);
        }
    }
    e.tables.push(Table {
        title: format!(
            "per phase (medians; page reads/writes: usermm swap-ins/-outs, {MEMCG} pswpin/pswpout; n/a: no swap)"
        ),
        head: [
            "phase",
            "system",
            "throughput [min..max]",
            "page reads/1k touches",
            "page writes/1k",
            "major faults/1k",
            "parked-page faults/1k",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
}

/// The goals against the kernel under the same limit, in order: (what,
/// phase, metric, at_least, threshold, goal).
const RATIO_GOALS: [(&str, &str, &str, bool, f64, f64); 8] = [
    ("sequential write throughput vs the kernel under the same limit", "seq-write", "throughput", true, 1.0, 1.0),
    ("sequential read throughput vs the kernel under the same limit", "seq-read", "throughput", true, 1.0, 1.0),
    ("hot/cold throughput vs the kernel under the same limit", "hotcold", "throughput", true, 0.8, 1.0),
    (
        "hot/cold page reads per 1,000 touches vs the kernel under the same limit",
        "hotcold",
        "page_reads_per_1k_touches",
        false,
        1.1,
        1.1,
    ),
    ("uniform random throughput vs the kernel under the same limit", "uniform", "throughput", true, 0.8, 1.0),
    (
        "uniform random page reads per 1,000 touches vs the kernel under the same limit",
        "uniform",
        "page_reads_per_1k_touches",
        false,
        1.1,
        1.1,
    ),
    ("zipfian throughput vs the kernel under the same limit", "zipfian", "throughput", true, 1.2, 1.5),
    (
        "scan resistance (a scan of 4× the budget beside a hot set) throughput vs the kernel under the same limit",
        "scan",
        "throughput",
        true,
        1.2,
        1.5,
    ),
];

/// The goals, every one against `kernel-memcg` (`measured`: it could be
/// set up and every run of it succeeded; otherwise they read "not measured").
pub(super) fn goals(e: &mut Experiment, measured: bool) {
    let disk_bw = e.rows.iter().find(|r| r.system == "disk").map_or(f64::NAN, |r| r.median());
    e.goals.push(Goal {
        what: "swap-out throughput vs the disk".into(),
        how: "usermm seq-write swapout_throughput / disk bandwidth".into(),
        value: e.med("usermm", "seq-write", "swapout_throughput") / disk_bw,
        unit: "×".into(),
        at_least: true,
        threshold: 0.5,
        goal: 0.5,
    });
    let base = if measured { MEMCG } else { "(kernel-memcg not measured)" };
    for (what, phase, metric, at_least, threshold, goal) in RATIO_GOALS {
        e.ratio_goal_vs(base, what, phase, metric, at_least, threshold, goal);
    }
    e.goals.push(Goal {
        what: "fits: pages evicted while a working set of 90% of the budget is touched (after warm-up)".into(),
        how: "usermm fits evictions (median)".into(),
        value: e.med("usermm", "fits", "evictions"),
        unit: "pages".into(),
        at_least: false,
        threshold: 0.0,
        goal: 0.0,
    });
}

/// The note on `kernel-memcg`: how it ran (the group's peak charge and limit
/// hits per run), or why it was not measured.
pub(super) fn memcg_note(
    limit: &Result<KernelLimit, String>,
    o: &Opts,
    peaks: &[(u64, u64)],
    oom_kills: u32,
) -> String {
    let (budget, swap_bytes) = (o.budget, o.swap_bytes);
    match limit {
        Ok(l) => format!(
            "**{MEMCG}**: a child process (`usermm {} reclaim …`, the same phases, touches and checks on anonymous \
             memory) in a cgroup v1 memory group `{}<pid>-<n>` with `memory.limit_in_bytes` = the budget ({} MiB; \
             swap use not limited), put into the group (`cgroup.procs`) before it maps anything; swap: a {} MiB file \
             `{}` (fallocate, mkswap, swapon) on the swap directory's file system. Both made by the benchmark and \
             removed after it (and on error, SIGINT, SIGTERM). The group's peak charge per run: {} MiB (limit hits: {}). \
             Its swap-outs/swap-ins are `pswpout`/`pswpin` of `/proc/vmstat` (machine-wide: swap traffic of \
             other processes in the same moments would be counted too; the machine has no other swap), its major \
             faults the child's `ru_majflt` (a major fault may read up to 8 pages: `vm.page-cluster` = 3), its \
             `evictions` `pgsteal_anon` of `/proc/vmstat` (machine-wide too). Its \
             `hot_hit_rate` counts major faults during hot touches (usermm's counts swap-ins). \
             The kernel reclaims with {}. {}",
            memcg::CHILD_CMD,
            memcg::CGROUP_PREFIX,
            budget / MIB,
            swap_bytes / MIB,
            l.swap_path().map_or("?".into(), |p| p.display().to_string()),
            peaks.iter().map(|(b, _)| fmt_num(*b as f64 / MIB as f64)).collect::<Vec<_>>().join(", "),
            peaks.iter().map(|(_, f)| f.to_string()).collect::<Vec<_>>().join(", "),
            memcg::kernel_lru(),
            memcg::oom_sentence(oom_kills),
        ),
        Err(why) => format!("**{MEMCG} not measured**: {why}. Its goals read \"not measured\"."),
    }
}

/// The notes, in order: the shape and counters, `kernel-memcg`, the
/// unlimited kernel, errors.
pub(super) fn notes(e: &mut Experiment, o: &Opts, memcg_note: String, t: Totals) {
    let Opts { set, budget, swap_bytes, hot_pages, hot_pct, mix, ref dir, .. } = *o;
    let Totals { errors, direct_io, .. } = t;
    e.notes.push(format!(
        "Working set {} MiB, usermm budget {} MiB (swap file of {} MiB in `{dir}`, O_DIRECT: {}). Hot set: {} pages ({}% \
         of the budget) taking {}% of {} hot/cold touches; `hot_resident` is the fraction of the hot set `mincore` \
         reports resident right after the hot/cold phase; `hot_hit_rate` is 1 − (page reads during hot \
         touches)/(hot touches), measured over a second, untimed run of {} hot/cold touches in which every hot touch \
         is bracketed by the counters. Every touch is one 8-byte access; reads are verified against what the write \
         phase stored. usermm's swap-outs/swap-ins (pages) and major faults are deltas of `Space::stats()` over each \
         phase, its `evictions` (pages that left memory, written or not) too; `page_reads_per_1k_touches` and `page_writes_per_1k_touches` are swap-ins and swap-outs (usermm) or \
         pswpin and pswpout (kernel-memcg) per 1,000 touches of the phase; `swapout_throughput` = pages swapped out \
         during seq-write × 4 KiB / duration of seq-write. Systems run in the order usermm, {MEMCG}, then \
         {MEMCG}, usermm on the next run, and so on; the unlimited kernel last.",
        set / MIB,
        budget / MIB,
        swap_bytes / MIB,
        direct_io.map_or("?".into(), |d| d.to_string()),
        hot_pages,
        o.hot_pct_of_budget,
        hot_pct,
        mix,
        mix,
    ));
    e.notes.push(memcg_note);
    e.notes.push(format!(
        "**`{NOLIMIT}`**: the same phases on plain anonymous memory in the benchmark's own process, with no limit: \
         the kernel keeps the whole working set in RAM (no reclaim, no swap). It shows the cost of the touches \
         themselves; no goal uses it (its `hot_hit_rate` is 1 by construction)."
    ));
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
}
