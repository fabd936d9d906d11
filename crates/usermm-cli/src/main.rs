//! `usermm`: runs usermm's experiments beside the host kernel and writes the
//! report (see `BENCHMARKS.md`).
//!
//! ```text
//! usermm report [--full] [--out DIR] [--runs N]
//! usermm bench NAME [--full] [--out DIR] [--PARAM=VALUE ...]
//! usermm run [OPTIONS] -- PROGRAM [ARGS...]
//! ```
//!
//! Exit status: 0 on success, 1 when an experiment failed to run, 2 on a
//! usage error.

// No unsafe code; the few calls with an unsafe *contract* (advice and
// volatile ranges on a `Mapping`, whose bytes they may change later) are
// allowed one by one, each with its SAFETY.
#![deny(unsafe_code)]

mod common;
mod fault;
mod fork;
mod heap;
mod lockonfault;
mod madvfree;
mod memcg;
mod munmap;
mod outofcore;
mod params;
mod populate;
mod programs;
mod reclaim;
mod report;
mod run;
mod svg;
mod volatile;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::Progress;
use params::Params;
use report::Experiment;

struct ExpDef {
    name: &'static str,
    about: &'static str,
    params: fn(bool) -> Params,
    run: fn(&Params, &Progress) -> Result<Experiment, String>,
}

const EXPERIMENTS: [ExpDef; 12] = [
    ExpDef {
        name: "fault",
        about: "first touch of a fresh region (seq/random/sparse × read/write): throughput, sparse latency",
        params: fault::params,
        run: fault::run,
    },
    ExpDef {
        name: "reclaim",
        about: "working set 4× the budget: sequential and hot/cold throughput, swap traffic, hot-set residency, disk bandwidth",
        params: reclaim::params,
        run: reclaim::run,
    },
    ExpDef {
        name: "munmap",
        about: "seed 003: unmap a populated region while a second thread faults or maps/unmaps; hold time and stalls",
        params: munmap::params,
        run: munmap::run,
    },
    ExpDef {
        name: "populate",
        about: "seed 004: prefault a fresh anonymous or file region (read/write loops, MADV_POPULATE_*, MAP_POPULATE), ns per page",
        params: populate::params,
        run: populate::run,
    },
    ExpDef {
        name: "madvfree",
        about: "seed 001: ebizzy-style memset + MADV_FREE/MADV_DONTNEED of random chunks; ops/s, faults/op, pressure",
        params: madvfree::params,
        run: madvfree::run,
    },
    ExpDef {
        name: "volatile",
        about: "seed 002: fill-and-drop loop, mvolatile/mnovolatile vs MADV_DONTNEED; time, faults, peak; purge demo",
        params: volatile::params,
        run: volatile::run,
    },
    ExpDef {
        name: "outofcore",
        about: "a file 4× the budget mapped MAP_SHARED: random, hot/cold, sequential reads vs the kernel in a memory cgroup of the budget, kernel mmap with no limit, a pread cache",
        params: outofcore::params,
        run: outofcore::run,
    },
    ExpDef {
        name: "lockonfault",
        about: "seed 000: random 1-byte reads of a big file kept locked: mlock, per-access mlock, SIGSEGV batches, MLOCK_ONFAULT vs usermm",
        params: lockonfault::params,
        run: lockonfault::run,
    },
    ExpDef {
        name: "heap",
        about: "a heap on a space: alloc/free throughput vs the system allocator; a HashMap 4× the budget vs the kernel in a memory cgroup of the budget",
        params: heap::params,
        run: heap::run,
    },
    ExpDef {
        name: "farmem",
        about: "far memory: the reclaim phases swapping to the local swap file and to a Redis server it starts; page round trip vs GET, bytes on the wire",
        params: reclaim::farmem::params,
        run: reclaim::farmem::run,
    },
    ExpDef {
        name: "fork",
        about: "fork of a process with 4× its budget written: the parent's fork, the child's start and first touches vs the kernel in a memory cgroup of the budget",
        params: fork::params,
        run: fork::run,
    },
    ExpDef {
        name: "programs",
        about: "usermm run on CPython, the SQLite shell, a Redis server, Node.js, Java (G1, Serial) and git (repack, fsck, log -p) at ½ and ¼ of their heap: time and misses under usermm (swap file, Redis) vs the kernel in a memory cgroup of the same limit, and with no limit",
        params: programs::params,
        run: programs::run,
    },
];

fn help() -> String {
    let mut o = String::from(
        "usermm — usermm's experiments, side by side with the host kernel\n\n\
         USAGE:\n  \
         usermm report [--full] [--out DIR] [--runs N]\n      \
         Runs every experiment; prints tables on stdout, progress on stderr, and writes\n      \
         report.md, results.json and SVG plots into DIR (default ./usermm-report).\n      \
         Quick by default (a few minutes on 2 CPUs); --full uses seed scale. --runs N\n      \
         overrides every experiment's number of measured runs.\n  \
         usermm bench NAME [--full] [--out DIR] [--PARAM=VALUE ...]\n      \
         Runs one experiment with every parameter exposed; writes the same files for it alone.\n  \
         usermm run [OPTIONS] -- PROGRAM [ARGS...]\n      \
         Runs a program you already have with its heap on a space ('usermm run --help').\n  \
         usermm --help\n\nEXPERIMENTS AND PARAMETERS (quick default / full default):\n",
    );
    for d in &EXPERIMENTS {
        o += &format!("\n  {} — {}\n", d.name, d.about);
        let (q, f) = ((d.params)(false), (d.params)(true));
        for (a, b) in q.items.iter().zip(&f.items) {
            let def = if a.value == b.value { a.value.clone() } else { format!("{} / {}", a.value, b.value) };
            o += &format!("      --{:<22} {} [{}]\n", a.name.replace('_', "-"), a.help, def);
        }
    }
    o
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("usermm: {msg}\nRun 'usermm --help' for usage.");
    ExitCode::from(2)
}

/// A parsed command line.
struct Cmd {
    full: bool,
    out: PathBuf,
    /// `None`: report (all experiments); `Some(i)`: bench `EXPERIMENTS[i]`.
    only: Option<usize>,
    /// `(name, value)` parameter overrides, applied after the mode defaults.
    sets: Vec<(String, String)>,
}

fn parse(args: &[String]) -> Result<Option<Cmd>, String> {
    let Some(first) = args.first() else {
        return Err("missing command".into());
    };
    let mut rest = &args[1..];
    let only = match first.as_str() {
        "-h" | "--help" | "help" => return Ok(None),
        "report" => None,
        "bench" => {
            let Some(name) = rest.first() else {
                return Err("bench: missing experiment NAME".into());
            };
            if name == "--help" || name == "-h" {
                return Ok(None);
            }
            let i = EXPERIMENTS.iter().position(|d| d.name == name).ok_or_else(|| {
                let names: Vec<&str> = EXPERIMENTS.iter().map(|d| d.name).collect();
                format!("bench: unknown experiment '{name}' (one of: {})", names.join(", "))
            })?;
            rest = &rest[1..];
            Some(i)
        }
        other => return Err(format!("unknown command '{other}'")),
    };
    let mut cmd = Cmd { full: false, out: PathBuf::from("usermm-report"), only, sets: Vec::new() };
    let mut i = 0;
    while i < rest.len() {
        let a = &rest[i];
        i += 1;
        let Some(opt) = a.strip_prefix("--") else {
            return Err(format!("unexpected argument '{a}'"));
        };
        let (name, inline) = match opt.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (opt.to_string(), None),
        };
        if name == "help" {
            return Ok(None);
        }
        if name == "full" {
            if inline.is_some() {
                return Err("--full takes no value".into());
            }
            cmd.full = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = rest.get(i).ok_or_else(|| format!("--{name} needs a value"))?;
                i += 1;
                v.clone()
            }
        };
        if name == "out" {
            cmd.out = PathBuf::from(value);
            continue;
        }
        // In `report`, only --runs is a parameter; in `bench`, every
        // parameter of the experiment is.
        let known = match cmd.only {
            None => name == "runs",
            Some(e) => (EXPERIMENTS[e].params)(false).has(&name),
        };
        if !known {
            return Err(format!("unknown option '--{name}'"));
        }
        cmd.sets.push((name, value));
    }
    Ok(Some(cmd))
}

fn machine_info() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut v = vec![
        ("kernel".into(), format!("Linux {}", read("/proc/sys/kernel/osrelease"))),
        ("CPUs".into(), format!("{} × {cpu}", usermm_sys::ncpus())),
        ("memory".into(), format!("{:.1} GiB", usermm_sys::phys_mem_bytes() as f64 / (1u64 << 30) as f64)),
        ("transparent huge pages".into(), fault::thp_setting()),
    ];
    match usermm::Space::open(&common::config(16 << 20, 0, None)) {
        Ok(s) => {
            let mode = format!("{:?}", s.uffd_mode());
            let why = s.fallback_reason().map(|r| format!(" (fallback: {r})")).unwrap_or_default();
            v.push(("usermm userfaultfd mode".into(), format!("{mode}{why}")));
        }
        Err(e) => v.push(("usermm userfaultfd mode".into(), format!("space failed to open: {e:?}"))),
    }
    v
}

fn write_out(dir: &Path, exps: &[Experiment], mode: &str, header: &[(String, String)]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let put = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
    };
    put("results.json", &report::to_json(exps))?;
    put("report.md", &report::markdown(exps, header, mode))?;
    for e in exps {
        for (f, svg) in &e.plots {
            put(f, svg)?;
        }
    }
    Ok(())
}

/// `usermm __kernel-memcg-child EXPERIMENT ARGS…`: the kernel-memcg child's
/// side of an experiment.
fn memcg_child_main(args: &[String]) -> ExitCode {
    // The parent blocked SIGINT/SIGTERM, and exec keeps the mask: get
    // their default action back (a Ctrl-C ends the child too).
    if let Err(e) = usermm_sys::process::unblock_termination_signals() {
        eprintln!("usermm {}: cannot unblock SIGINT/SIGTERM: {e:?}", memcg::CHILD_CMD);
        return ExitCode::from(1);
    }
    let r = match args.get(1).map(String::as_str) {
        Some("reclaim") => reclaim::kernel_memcg_child(&args[2..]),
        Some("outofcore") => outofcore::kernel_memcg_child(&args[2..]),
        Some("heap") => heap::kernel_memcg_child(&args[2..]),
        Some("programs") => programs::kernel_memcg_child(&args[2..]),
        Some("fork") => fork::kernel_memcg_child(&args[2..]),
        other => Err(format!("unknown child experiment {other:?}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(m) => {
            eprintln!("usermm {}: {m}", memcg::CHILD_CMD);
            ExitCode::from(1)
        }
    }
}

/// The chosen experiments with their parameters resolved (`Err`: a bad
/// value, a usage error).
fn plan(cmd: &Cmd) -> Result<Vec<(usize, Params)>, String> {
    let chosen: Vec<usize> = match cmd.only {
        Some(i) => vec![i],
        None => (0..EXPERIMENTS.len()).collect(),
    };
    let mut plan = Vec::new();
    for &i in &chosen {
        let mut p = (EXPERIMENTS[i].params)(cmd.full);
        for (n, v) in &cmd.sets {
            p.set(n, v)?;
        }
        plan.push((i, p));
    }
    Ok(plan)
}

fn main() -> ExitCode {
    let os_args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // `usermm run`: its own options, and the program's arguments as they are
    // (not necessarily UTF-8).
    if os_args.first().is_some_and(|a| a == "run") {
        return run::main(&os_args[1..]);
    }
    let args: Vec<String> = os_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    // The heap bench's C-allocator child (heap/malloc.rs).
    if args.first().map(String::as_str) == Some(heap::malloc::CHILD_CMD) {
        return match heap::malloc::child_main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(m) => {
                eprintln!("usermm {}: {m}", heap::malloc::CHILD_CMD);
                ExitCode::from(1)
            }
        };
    }
    // The kernel-memcg child (re-executed by the benchmark, see memcg.rs).
    if args.first().map(String::as_str) == Some(memcg::CHILD_CMD) {
        return memcg_child_main(&args);
    }
    // Before any other thread exists: SIGINT/SIGTERM go to the teardown
    // thread, which removes what kernel-memcg set up and ends the process.
    if let Err(e) = usermm_sys::process::block_termination_signals() {
        eprintln!("usermm: cannot block SIGINT/SIGTERM: {e:?}");
        return ExitCode::from(1);
    }
    memcg::install_signal_teardown();
    let cmd = match parse(&args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(m) => return usage_error(&m),
    };
    // Resolve every experiment's parameters before running anything, so that
    // a bad value is a usage error and not a failure minutes later.
    let plan = match plan(&cmd) {
        Ok(plan) => plan,
        Err(m) => return usage_error(&m),
    };
    let mode = if cmd.full { "full (seed scale)" } else { "quick" };
    let t0 = Progress::new("usermm");
    let header = machine_info();
    for (k, v) in &header {
        eprintln!("{k}: {v}");
    }
    let mut exps = Vec::new();
    for (i, p) in &plan {
        let d = &EXPERIMENTS[*i];
        let prog = Progress::new(d.name);
        prog.say(&format!("start ({mode}): {}", d.about));
        match (d.run)(p, &prog) {
            Ok(mut e) => {
                e.elapsed_s = prog.elapsed_s();
                print!("{}", report::text(&e));
                exps.push(e);
            }
            Err(m) => {
                eprintln!("usermm: experiment {} failed: {m}", d.name);
                let _ = write_out(&cmd.out, &exps, mode, &header);
                return ExitCode::from(1);
            }
        }
    }
    println!("\n== ratios and goals ({mode}, {:.1} s in all)", t0.elapsed_s());
    print!("{}", report::goals_text(&exps));
    if let Err(m) = write_out(&cmd.out, &exps, mode, &header) {
        eprintln!("usermm: {m}");
        return ExitCode::from(1);
    }
    println!("\nwrote {}/report.md, results.json and plots", cmd.out.display());
    ExitCode::SUCCESS
}
