//! `heap`: the heap on a space (`Space::heap`, `usermm::heap`) against the
//! system allocator.
//!
//! Two workloads, the same code on both allocators (hashbrown and
//! `allocator_api2`'s `Vec`, generic over the allocator):
//! - `alloc-free`: allocation throughput with no memory pressure. A window
//!   of `alloc_slots` live blocks of 16..1024 bytes; each operation frees a
//!   random slot's block and allocates a new one (writing its first byte).
//!   One untimed warm-up pass first, so that both allocators work on memory
//!   they already have. `usermm` is a space with a budget far above the
//!   window; `kernel` is the system allocator (glibc malloc).
//! - `alloc-free-threads`: the same, in `threads` threads at once on one
//!   allocator (each its own window and `alloc_ops` operations): ns per
//!   operation of each thread, averaged over the threads.
//! - `hashmap` (the `hashmap` example's program): a hashbrown
//!   `HashMap<u64, Vec<u8>>` whose values (64..2048 bytes, `data_mib` in
//!   all) are built (`build`: inserts/s) and then looked up at random
//!   (`query`: lookups/s, every byte of each value checked) under a budget
//!   of `budget_pct`% of the data. Systems, alternated run by run:
//!   `usermm` (map and values in a space of that budget with a swap file),
//!   `kernel-memcg` (the same program with the system allocator in a child
//!   process in a memory cgroup of the same limit, with a swap file:
//!   `memcg.rs`), and `kernel (no limit, upper bound)` (the system
//!   allocator in this process, everything resident). `free`: the time to
//!   drop the whole map at the end (every value freed), against
//!   `usermm (budget above the data)`, the same map on a space whose budget
//!   holds all of it (freeing cold blocks must not swap them in).
//! - `malloc-free`, `malloc-free-threads`, `larson`, `churn`: C programs'
//!   `malloc` through `usermm run`'s preload library against the C
//!   library's (`malloc.rs`).

pub mod malloc;

use allocator_api2::alloc::{Allocator, Global};
use allocator_api2::vec::Vec as AVec;
use usermm::Space;
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, run_label, Progress, Rng, MIB};
use crate::memcg::{self, KernelLimit};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Table};

const MEMCG: &str = "kernel-memcg";
const NOLIMIT: &str = "kernel (no limit, upper bound)";
const RESIDENT: &str = "usermm (budget above the data)";
/// The C-allocator workloads (`malloc.rs`) and their goals: usermm's ns
/// per operation at most this many times the C library's.
const MALLOC_WORKLOADS: [(&str, f64); 4] =
    [("malloc-free", 1.5), ("malloc-free-threads", 1.5), ("larson", 1.3), ("churn", 1.3)];

pub fn params(full: bool) -> Params {
    Params::default()
        .def("data_mib", Kind::Int, if full { 1024 } else { 64 }, "bytes of HashMap values (MiB)")
        .def("budget_pct", Kind::Int, 25, "usermm's budget and the memory cgroup's limit, % of data_mib")
        .def("queries", Kind::Int, if full { 400_000 } else { 40_000 }, "random lookups after the build")
        .def("alloc_ops", Kind::Int, if full { 20_000_000 } else { 2_000_000 }, "alloc-free operations per run")
        .def("alloc_slots", Kind::Int, 4096, "live blocks of the alloc-free window")
        .def("threads", Kind::Int, 2, "threads of the alloc-free-threads variant")
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (systems alternate run by run)")
        .def("swap_dir", Kind::Text, default_swap_dir(), "directory of the swap files")
        .def("seed", Kind::Int, 5, "PRNG seed of value sizes and lookups")
}

/// The length of key `k`'s value.
fn value_len(k: u64) -> usize {
    64 + (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % 1985
}

/// Byte `i` of key `k`'s value.
fn value_byte(k: u64, i: usize) -> u8 {
    (k as usize).wrapping_mul(131).wrapping_add(i) as u8
}

/// What one `hashmap` run measured.
#[derive(Default, Debug)]
struct MapRun {
    build_ns: u64,
    entries: u64,
    query_ns: u64,
    queries: u64,
    /// Looked-up bytes that were wrong, or keys missing.
    wrong: u64,
    /// Pages written to / read from swap (usermm's counters; the kernel's
    /// machine-wide pswpout/pswpin).
    swapouts: u64,
    swapins: u64,
    /// Time to drop the whole map, and the pages read from swap meanwhile
    /// (the map's own table, which the drop walks: the heap's frees read
    /// nothing of the blocks).
    free_ns: u64,
    free_swapins: u64,
}

/// The `hashmap` program on allocator `a`: builds a map of `data` bytes of
/// values, then looks up `queries` random keys. `swap()` reads the swap
/// counters (pages out, in).
fn hashmap<A: Allocator + Clone>(a: A, data: usize, queries: u64, seed: u64, swap: &dyn Fn() -> (u64, u64)) -> MapRun {
    let mut r = MapRun::default();
    let (o0, i0) = swap();
    let t0 = now_ns();
    let mut m = hashbrown::HashMap::with_hasher_in(hashbrown::DefaultHashBuilder::default(), a.clone());
    let (mut bytes, mut k) = (0usize, 0u64);
    while bytes < data {
        let n = value_len(k);
        let mut v = AVec::with_capacity_in(n, a.clone());
        v.extend((0..n).map(|i| value_byte(k, i)));
        m.insert(k, v);
        bytes += n;
        k += 1;
    }
    r.build_ns = now_ns() - t0;
    r.entries = k;
    let mut rng = Rng::new(seed);
    let t1 = now_ns();
    for _ in 0..queries {
        let key = rng.below(k);
        match m.get(&key) {
            Some(v) => {
                r.wrong += v.iter().enumerate().filter(|&(i, &b)| b != value_byte(key, i)).count() as u64;
                r.wrong += (v.len() != value_len(key)) as u64;
            }
            None => r.wrong += 1,
        }
    }
    r.query_ns = now_ns() - t1;
    r.queries = queries;
    let (o1, i1) = swap();
    (r.swapouts, r.swapins) = (o1 - o0, i1 - i0);
    let t2 = now_ns();
    drop(m);
    r.free_ns = now_ns() - t2;
    r.free_swapins = swap().1 - i1;
    r
}

/// `alloc-free` on allocator `a`: `ops` operations over `slots` live
/// blocks; returns ns per operation (after an untimed warm-up pass).
fn alloc_free<A: Allocator>(a: &A, ops: u64, slots: usize, seed: u64) -> f64 {
    let mut live: Vec<Option<AVec<u8, &A>>> = (0..slots).map(|_| None).collect();
    let mut rng = Rng::new(seed);
    alloc_free_pass(a, &mut live, &mut rng, ops / 4);
    let ns = alloc_free_pass(a, &mut live, &mut rng, ops);
    ns as f64 / ops.max(1) as f64
}

/// `alloc_free` in `threads` threads at once on `a`: each thread's ns per
/// operation, averaged.
fn alloc_free_threads<A: Allocator + Sync>(a: &A, threads: usize, ops: u64, slots: usize, seed: u64) -> f64 {
    let sum: f64 = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..threads).map(|t| s.spawn(move || alloc_free(a, ops, slots, seed + 1000 * t as u64))).collect();
        hs.into_iter().map(|h| h.join().expect("an alloc-free thread panicked")).sum()
    });
    sum / threads as f64
}

/// `n` operations: each frees a random slot's block, allocates one of
/// 16..1024 bytes and writes its first byte. Returns the ns taken.
fn alloc_free_pass<'a, A: Allocator>(a: &'a A, live: &mut [Option<AVec<u8, &'a A>>], rng: &mut Rng, n: u64) -> u64 {
    let t0 = now_ns();
    for _ in 0..n {
        let j = rng.below(live.len() as u64) as usize;
        let mut v = AVec::with_capacity_in(16 + rng.below(1009) as usize, a);
        v.push(j as u8);
        live[j] = Some(v);
    }
    now_ns() - t0
}

/// `usermm __kernel-memcg-child heap DATA QUERIES SEED`: the `hashmap`
/// program with the system allocator, in the memory group the parent put
/// it in; prints one `result` line (see [`parse_child`]).
pub fn kernel_memcg_child(args: &[String]) -> Result<(), String> {
    let n = |i: usize| -> Result<u64, String> {
        args.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {args:?} is no number"))
    };
    let (data, queries, seed) = (n(0)? as usize, n(1)?, n(2)?);
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let swap = || {
        let (o, i, _) = memcg::vmstat_reclaim();
        (o, i)
    };
    let r = hashmap(Global, data, queries, seed, &swap);
    println!(
        "result {} {} {} {} {} {} {} {} {}",
        r.build_ns, r.entries, r.query_ns, r.queries, r.wrong, r.swapouts, r.swapins, r.free_ns, r.free_swapins
    );
    Ok(())
}

fn parse_child(out: &str) -> Result<MapRun, String> {
    let line = out.lines().find_map(|l| l.strip_prefix("result ")).ok_or_else(|| format!("no result line: {out}"))?;
    let w: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().map_err(|_| format!("bad line: {line}")))
        .collect::<Result<_, _>>()?;
    if w.len() != 9 {
        return Err(format!("bad line: {line}"));
    }
    Ok(MapRun {
        build_ns: w[0],
        entries: w[1],
        query_ns: w[2],
        queries: w[3],
        wrong: w[4],
        swapouts: w[5],
        swapins: w[6],
        free_ns: w[7],
        free_swapins: w[8],
    })
}

fn add_map_rows(e: &mut Experiment, sys: &str, r: &MapRun, errors: &mut Vec<String>, prog: &Progress) {
    if r.wrong > 0 {
        let msg = format!("{sys} hashmap: {} wrong bytes or missing keys", r.wrong);
        prog.say(&format!("ERROR: {msg}"));
        errors.push(msg);
    }
    e.add(sys, "free", "ms", "ms", r.free_ns as f64 / 1e6);
    if sys == RESIDENT {
        return;
    }
    if sys != NOLIMIT {
        e.add(sys, "free", "swapins", "pages", r.free_swapins as f64);
    }
    e.add(sys, "build", "throughput", "inserts/s", r.entries as f64 / (r.build_ns as f64 / 1e9));
    e.add(sys, "query", "throughput", "lookups/s", r.queries as f64 / (r.query_ns as f64 / 1e9));
    if sys != NOLIMIT {
        e.add(sys, "build", "swapouts", "pages", r.swapouts as f64);
        e.add(sys, "query", "page_reads_per_1k_lookups", "pages", r.swapins as f64 * 1000.0 / r.queries.max(1) as f64);
    }
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let data = p.int("data_mib") as usize * MIB;
    let budget = data * p.int("budget_pct").clamp(1, 100) as usize / 100;
    let queries = p.int("queries");
    let ops = p.int("alloc_ops");
    let slots = p.int("alloc_slots").max(1) as usize;
    let threads = p.int("threads").max(1) as usize;
    let runs = p.int("runs").max(1) as usize;
    let dir = p.text("swap_dir");
    let seed = p.int("seed");
    // Values, the table and the allocator's slack, with room to spare.
    let swap_bytes = 3 * data;
    let mut e = Experiment::new("heap", "a heap on a space: allocation throughput, a HashMap 4× the budget", p.pairs());
    prog.say(&format!(
        "{MEMCG}: setting up a {} MiB swap file in {dir}, {} MiB memory groups",
        swap_bytes / MIB,
        budget / MIB
    ));
    let mut limit = KernelLimit::setup(budget, swap_bytes, &dir);
    if let Err(why) = &limit {
        prog.say(&format!("{MEMCG}: not measured: {why}"));
    }
    let mut errors = Vec::new();
    for r in 0..runs {
        let s = seed + r as u64;
        let which = run_label(r, 0, runs);
        // alloc-free: the system allocator and a space with room to spare.
        let sp = Space::open(&config(1 << 30, 0, None)).map_err(|e| format!("umm_open: {e}"))?;
        let order = if r.is_multiple_of(2) { ["usermm", "kernel"] } else { ["kernel", "usermm"] };
        for sys in order {
            prog.say(&format!("alloc-free {sys}, {which}"));
            let ns = if sys == "usermm" {
                alloc_free(&sp.heap(), ops, slots, s)
            } else {
                alloc_free(&Global, ops, slots, s)
            };
            e.add(sys, "alloc-free", "ns_per_op", "ns", ns);
        }
        for sys in order {
            prog.say(&format!("alloc-free-threads {sys} ({threads} threads), {which}"));
            let ns = if sys == "usermm" {
                alloc_free_threads(&sp.heap(), threads, ops, slots, s)
            } else {
                alloc_free_threads(&Global, threads, ops, slots, s)
            };
            e.add(sys, "alloc-free-threads", "ns_per_op", "ns", ns);
        }
        drop(sp);
        // The C workloads: the same child program with and without the
        // preload library.
        for (w, _) in MALLOC_WORKLOADS {
            for sys in order {
                prog.say(&format!("{w} {sys}, {which}"));
                match malloc::run_child(sys == "usermm", w, threads, ops, s) {
                    Ok(ns) => e.add(sys, w, "ns_per_op", "ns", ns),
                    Err(why) => {
                        prog.say(&format!("ERROR: {sys} {why}"));
                        errors.push(format!("{sys} {why}"));
                    }
                }
            }
        }
        // hashmap: usermm and kernel-memcg alternate; the unlimited kernel
        // and usermm with room for all of it last.
        let order = if r.is_multiple_of(2) {
            ["usermm", MEMCG, NOLIMIT, RESIDENT]
        } else {
            [MEMCG, "usermm", NOLIMIT, RESIDENT]
        };
        for sys in order {
            prog.say(&format!("hashmap {sys}, {which}"));
            let m = match sys {
                "usermm" | RESIDENT => {
                    let b = if sys == RESIDENT { 4 * data } else { budget };
                    let sp = Space::open(&config(b, swap_bytes, Some(&dir))).map_err(|e| format!("umm_open: {e}"))?;
                    let stats = || {
                        let st = sp.stats();
                        (st.swapouts, st.swapins)
                    };
                    let m = hashmap(sp.heap(), data, queries, s, &stats);
                    let st = sp.stats();
                    if st.resident_pages_max > st.budget_pages {
                        errors.push(format!(
                            "usermm hashmap: resident max {} pages above the budget",
                            st.resident_pages_max
                        ));
                    }
                    m
                }
                NOLIMIT => hashmap(Global, data, queries, s, &|| (0, 0)),
                _ => {
                    let Ok(l) = &limit else { continue };
                    let args = ["heap".to_string(), data.to_string(), queries.to_string(), s.to_string()];
                    match l.run_child(&args).and_then(|c| parse_child(&c.stdout)) {
                        Ok(m) => m,
                        // The kernel could not run the map at this limit
                        // (its reclaim in a group of a few MiB gives up now
                        // and then: seen in CI with every page of the group
                        // active and in the swap cache): said, counted, and
                        // no comparison with it.
                        Err(why) if why.starts_with(memcg::OOM_FAILURE) => {
                            let msg = format!("{MEMCG} run {}: {why}", r + 1);
                            prog.say(&format!("{msg}: not measured"));
                            e.add(MEMCG, "build", "oom_killed_children", "children", memcg::OOM_TRIES as f64);
                            e.notes.push(format!(
                                "{MEMCG} not measured: {msg}. The kernel could not run this map under a {} MiB limit.",
                                budget / MIB
                            ));
                            limit = Err(msg);
                            continue;
                        }
                        Err(why) => {
                            let msg = format!("{MEMCG} run {}: {why}", r + 1);
                            prog.say(&format!("ERROR: {msg}"));
                            errors.push(msg.clone());
                            limit = Err(msg);
                            continue;
                        }
                    }
                }
            };
            add_map_rows(&mut e, sys, &m, &mut errors, prog);
        }
    }
    let measured = limit.is_ok();
    drop(limit);
    summary(&mut e, measured);
    goals(&mut e, measured);
    e.notes.push(format!(
        "alloc-free: {ops} operations over {slots} live blocks of 16..1024 bytes after an untimed warm-up of a quarter of that \
         (alloc-free-threads: the same in {threads} threads at once, each its own window; ns per operation of a thread); \
         usermm is the heap of a space with a 1 GiB budget (no pressure), kernel the system allocator (glibc malloc) on the \
         kernel's memory. hashmap: a hashbrown HashMap<u64, Vec<u8>> with {} MiB of values (64..2048 bytes each) built, then \
         {queries} random lookups each checking every byte; usermm and {MEMCG} under the same {} MiB ({}% of the data); \
         page reads: usermm's swap-ins, {MEMCG}'s pswpin (machine-wide, the machine is otherwise idle); free: the map \
         dropped at the end, against {RESIDENT} (the same map on a space with a budget of 4× the data); its swap-ins are pages of the map's own table, which the drop walks (a free reads nothing of its block). malloc-free, \
         malloc-free-threads ({threads} threads), larson ({threads} threads, windows passed between threads) and churn \
         (mixed sizes in bursts, some realloc): the same child program, {ops} operations, with the C library's malloc \
         (kernel) and under usermm run (usermm, a 1 GiB budget); every block's bytes checked.",
        data / MIB,
        budget / MIB,
        p.int("budget_pct"),
    ));
    if !errors.is_empty() {
        e.notes.push(format!("ERRORS: {}", errors.join("; ")));
        return Err(format!("heap: {}", errors.join("; ")));
    }
    Ok(e)
}

/// usermm's own goals: the heap's alloc/free within 1.5× glibc's on memory
/// both already have, on one thread and per operation on several (issue
/// 48; goal: as fast), and the HashMap under the same limit at least half as
/// fast as the kernel's swap when looking up (goal: as fast) and 0.8× when
/// building.
fn goals(e: &mut Experiment, memcg_measured: bool) {
    e.ratio_goal(
        "alloc/free ns per operation vs the system allocator (no pressure)",
        "alloc-free",
        "ns_per_op",
        false,
        1.5,
        1.0,
    );
    e.ratio_goal(
        "alloc/free ns per operation vs the system allocator, threads at once (no pressure)",
        "alloc-free-threads",
        "ns_per_op",
        false,
        1.5,
        1.0,
    );
    for (w, limit) in MALLOC_WORKLOADS {
        e.ratio_goal(
            &format!("C malloc through usermm run vs the C library's, {w} ns per operation (no pressure)"),
            w,
            "ns_per_op",
            false,
            limit,
            1.0,
        );
    }
    e.ratio_goal_vs(
        RESIDENT,
        "HashMap freed at exit, 4× the budget, vs the same map all resident (time)",
        "free",
        "ms",
        false,
        2.0,
        1.0,
    );
    if memcg_measured {
        e.ratio_goal_vs(
            MEMCG,
            "HashMap build throughput vs the kernel under the same limit",
            "build",
            "throughput",
            true,
            0.8,
            1.0,
        );
        e.ratio_goal_vs(
            MEMCG,
            "HashMap lookup throughput vs the kernel under the same limit",
            "query",
            "throughput",
            true,
            0.5,
            1.0,
        );
    }
}

/// The ratios side by side.
fn summary(e: &mut Experiment, memcg_measured: bool) {
    let ratio = |e: &Experiment, sys: &str, base: &str, v: &str, m: &str| fmt_num(e.med(sys, v, m) / e.med(base, v, m));
    let mut rows = Vec::new();
    for v in ["alloc-free", "alloc-free-threads"].into_iter().chain(MALLOC_WORKLOADS.map(|(w, _)| w)) {
        rows.push(vec![
            format!("{v} ns/op"),
            fmt_num(e.med("usermm", v, "ns_per_op")),
            fmt_num(e.med("kernel", v, "ns_per_op")),
            format!("{}× (kernel: system allocator)", ratio(e, "usermm", "kernel", v, "ns_per_op")),
        ]);
    }
    for (v, unit) in [("build", "inserts/s"), ("query", "lookups/s")] {
        rows.push(vec![
            format!("hashmap {v} {unit}"),
            fmt_num(e.med("usermm", v, "throughput")),
            fmt_num(e.med(MEMCG, v, "throughput")),
            if memcg_measured {
                format!(
                    "{}× ({} no limit: {})",
                    ratio(e, "usermm", MEMCG, v, "throughput"),
                    NOLIMIT.split(' ').next().unwrap_or(""),
                    fmt_num(e.med(NOLIMIT, v, "throughput"))
                )
            } else {
                "n/a (kernel-memcg not measured)".into()
            },
        ]);
    }
    rows.push(vec![
        "hashmap free ms".into(),
        fmt_num(e.med("usermm", "free", "ms")),
        fmt_num(e.med(RESIDENT, "free", "ms")),
        format!("{}× (vs usermm with the map all resident)", ratio(e, "usermm", RESIDENT, "free", "ms")),
    ]);
    e.tables.push(Table {
        title: "usermm's heap against the system allocator (medians)".into(),
        head: ["what", "usermm", "kernel / kernel-memcg", "usermm / kernel"].map(String::from).to_vec(),
        rows,
    });
}
