//! The programs bench's summary: the time a miss costs, the goals, one
//! table of every program at every budget, and the notes.

use super::{fraction, variant, Bench, FITS, MEMCG, NOLIMIT, USERMM, USERMM_REDIS};
use crate::report::{fmt_num, Experiment, Goal, Table};

/// Runs of `sys` `v` that ended so (`oom_killed`, `timed_out`).
fn count(e: &Experiment, sys: &str, v: &str, metric: &str) -> usize {
    e.row(sys, v, metric).map_or(0, |r| r.samples.len())
}

/// The median time of `sys` `v`, or why there is none; with the runs
/// OOM-killed or timed out beside it.
fn time_cell(e: &Experiment, sys: &str, v: &str) -> String {
    let (oom, late) = (count(e, sys, v, "oom_killed"), count(e, sys, v, "timed_out"));
    let t = e.med(sys, v, "time");
    let mut s = if t.is_finite() {
        fmt_num(t)
    } else if oom > 0 {
        "OOM-killed".to_string()
    } else if late > 0 {
        "timed out".to_string()
    } else {
        "—".to_string()
    };
    if t.is_finite() && oom > 0 {
        s += &format!(" (+{oom} OOM-killed)");
    }
    if t.is_finite() && late > 0 {
        s += &format!(" (+{late} timed out)");
    }
    s
}

/// The medians of `metrics` of `sys` `v`, joined by `/`.
fn misses_cell(e: &Experiment, sys: &str, v: &str, metrics: &[&str]) -> String {
    metrics.iter().map(|m| fmt_num(e.med(sys, v, m))).collect::<Vec<_>>().join(" / ")
}

/// Per program, at each budget: the time a miss costs (µs), and the goals.
pub fn program(e: &mut Experiment, name: &str, budgets: &[(u64, usize, usize)]) {
    for &(pct, _, _) in budgets {
        let v = variant(name, pct);
        for sys in [USERMM, USERMM_REDIS] {
            let misses = e.med(sys, &v, "major_faults") + e.med(sys, &v, "parked_faults");
            let extra = e.med(sys, &v, "time") - e.med(FITS, name, "time");
            if misses > 0.0 && extra.is_finite() {
                e.add(sys, &v, "us_per_miss", "µs", extra * 1e6 / misses);
            }
        }
        let misses = e.med(MEMCG, &v, "pgmajfault");
        let extra = e.med(MEMCG, &v, "time") - e.med(NOLIMIT, name, "time");
        if misses > 0.0 && extra.is_finite() {
            e.add(MEMCG, &v, "us_per_miss", "µs", extra * 1e6 / misses);
        }
        let what =
            format!("under the same limit ({} of the heap) vs the kernel (memory cgroup + swap file)", fraction(pct));
        goal(e, &v, USERMM, MEMCG, &what, 0.8);
    }
    goal(e, name, FITS, NOLIMIT, "with the budget above the working set vs the unlimited kernel", 0.9);
}

/// The table and the notes, once every program ran.
pub fn finish(e: &mut Experiment, b: &Bench, limits: &[String]) {
    let mut rows = Vec::new();
    for name in b.p.text("programs").split(',').map(str::trim).filter(|s| !s.is_empty()) {
        for pct in b.p.list("budget_pcts") {
            let v = variant(name, pct.clamp(1, 100));
            let ratio = e.med(MEMCG, &v, "time") / e.med(USERMM, &v, "time");
            rows.push(vec![
                name.to_string(),
                fraction(pct.clamp(1, 100)),
                time_cell(e, USERMM, &v),
                misses_cell(e, USERMM, &v, &["major_faults", "parked_faults", "swapins"]),
                fmt_num(e.med(USERMM, &v, "us_per_miss")),
                time_cell(e, USERMM_REDIS, &v),
                time_cell(e, MEMCG, &v),
                misses_cell(e, MEMCG, &v, &["pgmajfault", "pswpin"]),
                fmt_num(e.med(MEMCG, &v, "us_per_miss")),
                time_cell(e, NOLIMIT, name),
                time_cell(e, FITS, name),
                format!("{}×", fmt_num(ratio)),
            ]);
        }
    }
    e.tables.push(Table {
        title: "seconds a run (medians), misses (medians) and the time a miss costs".into(),
        head: [
            "program",
            "budget (of heap peak)",
            USERMM,
            "usermm misses (major / parked / swap-ins)",
            "usermm µs/miss",
            USERMM_REDIS,
            MEMCG,
            "kernel misses (pgmajfault / machine pswpin)",
            "kernel µs/miss",
            "kernel no limit",
            "usermm fits",
            "kernel-memcg time / usermm time",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
    e.notes.push(format!(
        "Limits (calibration round, not recorded): {}. The memory cgroup charges all of the program's memory \
         (stacks, libraries, page cache of its files) while usermm's budget covers only its heap, so the \
         cgroup's limit is usermm's budget plus the program's non-heap memory: the group's peak charge with \
         no limit minus usermm's heap peak (resident_bytes_max) with no pressure. The kernel rows run in the \
         same harness (a child in a memory group that execs the program); usermm's time includes the start \
         of `usermm run` itself. Redis: time from the client's connection to the last reply; values of 4 KiB \
         set and read back in pipelines of 64, every one checked. usermm-redis swaps to one redis-server on \
         loopback (not the program's). Misses: usermm's major faults, parked-page faults and swap-ins \
         (`--stats`, summed over the run's processes); the kernel's `pgmajfault` of the group's memory.stat \
         and the machine's pswpin across the run (cgroup v1 counts no swap-ins per group). µs/miss: the \
         median time over the no-pressure row's (usermm: the fitting usermm row; the kernel: the unlimited \
         row) divided by the median misses (usermm: major + parked faults; the kernel: pgmajfault). git \
         repack runs git pack-objects as a child: under usermm run each process has its own space and \
         budget (the budget is computed from the largest process's heap peak), while the kernel's group \
         limits the whole tree. {} runs a row; a run still going after {} s is killed and reported as timed \
         out.",
        limits.join("; "),
        b.runs,
        b.timeout.as_secs()
    ));
}

/// A PASS/FAIL line on `base time / sys time` of variant `v` (goal 1.0×).
fn goal(e: &mut Experiment, v: &str, sys: &str, base: &str, what: &str, threshold: f64) {
    let value = e.med(base, v, "time") / e.med(sys, v, "time");
    e.goals.push(Goal {
        what: format!("{v}: {what}"),
        how: format!("{base} time / {sys} time"),
        value,
        unit: "×".into(),
        at_least: true,
        threshold,
        goal: 1.0,
    });
}
