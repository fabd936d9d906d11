//! `usermm run [OPTIONS] -- PROGRAM [ARGS…]`: an unmodified, dynamically
//! linked program with its heap on a space.
//!
//! The command finds the preload library (`libusermm_preload.so`, built
//! beside the `usermm` binary), puts it in `LD_PRELOAD`, turns its options
//! into the `USERMM_*` environment the library reads (an option not given
//! leaves the variable as the caller's environment has it), runs the
//! program and passes on how it ended: its exit status, or 128 + the signal
//! that killed it (as a shell does). SIGTERM sent to `usermm` is passed to
//! the program; SIGINT (Ctrl-C reaches both from the terminal) is ignored
//! by `usermm` while it waits, as `system(3)` does.
//!
//! What runs where (space or kernel) is the library's business: see
//! `crates/usermm-preload/src/lib.rs` and docs/design.md, "`usermm run`".

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use usermm::consts::{UMM_F_FRAME_POOL, UMM_F_INTHREAD_FAULTS};

/// The preload library's file name, looked for beside the `usermm` binary.
pub(crate) const PRELOAD_LIB: &str = "libusermm_preload.so";

/// SIGTERM's number on Linux.
const SIGTERM: i32 = 15;

/// Exit status when the program cannot be found (as a shell's).
const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when the program cannot run under the preload (a static or
/// 32-bit binary, no preload library) or cannot be started (as a shell's
/// "found but cannot execute").
const EXIT_CANNOT_RUN: u8 = 126;

pub(crate) fn help() -> &'static str {
    "usermm run — run a program you already have with its heap on a usermm space\n\n\
     USAGE:\n  \
     usermm run [OPTIONS] -- PROGRAM [ARGS...]\n\n\
     The program's malloc family (malloc, free, calloc, realloc, reallocarray, posix_memalign,\n\
     aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size; C++ new/delete) is served from\n\
     a space's heap, under the space's budget, LRU reclaim and swap, by a preload library\n\
     (LD_PRELOAD, libusermm_preload.so beside this binary). PROGRAM must be dynamically linked.\n\
     Its exit status is passed on; death by a signal exits with 128 + the signal number.\n\n\
     OPTIONS (each falls back to the USERMM_* variable named, when not given):\n  \
     --budget BYTES       resident budget of the space              (USERMM_BUDGET_BYTES; default 1/4 of RAM;\n                       \
     at least 1m: 0 is refused, omit the option for the default)\n  \
     --swap-bytes BYTES   largest swap file; 0: no swap              (USERMM_SWAP_BYTES; default 8g)\n  \
     --swap-dir DIR       directory of the swap file                 (USERMM_SWAP_DIR; default $TMPDIR or /tmp)\n  \
     --swap-url URL       a Redis page store instead of the file     (USERMM_SWAP_URL), e.g. redis://127.0.0.1:6379/\n                       (also redis+cluster://SEEDS and redis+sentinel://SENTINELS/MASTER;\n                       each process of the program a space, its keys under a prefix of its own;\n                       a ?prefix= is one space's: a second process opening it runs without a space: EBUSY)\n  \
     --memlock BYTES      lock limit of the space; 0: locks are EPERM (USERMM_MEMLOCK_BYTES; default unlimited)\n  \
     --inthread           resolve faults in the faulting thread (UMM_F_INTHREAD_FAULTS, in USERMM_FLAGS);\n                       \
     read(2)/write(2) on heap memory that is not resident then fail with EFAULT\n  \
     --frame-pool         recycle evicted frames (UMM_F_FRAME_POOL, in USERMM_FLAGS)\n  \
     --stats[=FILE]       print the space's statistics when the program exits (one line per process) on\n                       \
     stderr, or into FILE (made anew; USERMM_RUN_STATS_FILE)\n  \
     --verbose            also print where allocations went (space, or the C library's malloc and why)\n  \
     --no-inherit         programs this one runs are not preloaded (LD_PRELOAD removed at start)\n  \
     --no-cgroup-view     the program reads its memory cgroup's real limit, not the budget\n                       \
     (USERMM_RUN_NO_CGROUP_VIEW; with --budget, memory.limit_in_bytes/memory.max read the smaller)\n  \
     --help               this text\n\n\
     BYTES: decimal or 0x hex, with an optional binary suffix k, m, g, t (--budget 64m).\n\n\
     EXIT STATUS: the program's; 128+N if signal N killed it; 127 if PROGRAM is not found; 126 if\n\
     it cannot run under the preload (statically linked, 32-bit, no preload library) or cannot be\n\
     started; 2 on a usage error (an option, or a numeric USERMM_* variable, that does not parse).\n\n\
     LIMITS (this version): the heap and anonymous mmaps are on the space (stacks and files stay\n\
     with the kernel); a forked child gets a copy of the space (shared mappings stay shared); where\n\
     the copy fails (no descriptor left) it gets a space of its own for its new memory, and one\n\
     that touches its parent's heap or mappings without exec'ing first dies of SIGSEGV. A shell (sh, bash, dash, zsh, ksh, mksh, ash, busybox) keeps\n\
     the kernel's memory, so that its forks work; the programs it execs get a space (wrapper scripts).\n"
}

/// `usermm run`'s options.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunOpts {
    /// `(variable, value)` to set in the program's environment.
    env: Vec<(&'static str, String)>,
    /// `UMM_F_*` bits to add to `USERMM_FLAGS`.
    flags: u32,
    /// `PROGRAM ARGS…`.
    argv: Vec<OsString>,
    /// `--stats=FILE`: where the statistics go instead of stderr.
    stats_file: Option<PathBuf>,
}

/// The lowest descriptor the inherited `/dev/userfaultfd` takes: above the
/// ones a program opens first, below 64 (the first descriptor table's
/// size), beside the exit report's (60, the preload's).
const UFFD_DEVICE_FD_MIN: i32 = 59;

/// The smallest `--budget` (1 MiB): below it a program as small as the
/// C library's own start-up spends its time in swap-ins (CPython's
/// start-up took 2.8 s at 512 KiB, over a minute at 64 KiB, against
/// 20 ms), and the kernel's memory cgroup of that size kills it.
const BUDGET_MIN_BYTES: u64 = 1 << 20;

/// `--budget`'s own rule: a byte count (checked before) of at least
/// [`BUDGET_MIN_BYTES`]; `0`, which the library reads as its default, is
/// refused here rather than silently meaning a quarter of the machine.
fn check_budget(v: &str) -> Result<(), String> {
    match parse_bytes(v) {
        Some(0) => Err("0 is not a budget (omit --budget for the default, a quarter of RAM)".into()),
        Some(n) if n < BUDGET_MIN_BYTES => {
            Err(format!("'{v}' is below the smallest budget a program can run in, 1m (1048576 bytes)"))
        }
        _ => Ok(()),
    }
}

/// A byte count as [`check_bytes`] accepts it (`None`: unlimited, or not a
/// count).
fn parse_bytes(v: &str) -> Option<u64> {
    let s = v.trim().to_ascii_lowercase();
    let (num, shift) = match s.as_bytes().last() {
        Some(b'k') => (&s[..s.len() - 1], 10),
        Some(b'm') => (&s[..s.len() - 1], 20),
        Some(b'g') => (&s[..s.len() - 1], 30),
        Some(b't') => (&s[..s.len() - 1], 40),
        _ => (&s[..], 0),
    };
    let n = match num.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => num.parse::<u64>(),
    }
    .ok()?;
    n.checked_mul(1 << shift)
}

/// A byte count as the preload library reads it (`usermm_compat.h`):
/// decimal or `0x` hex, an optional `k`/`m`/`g`/`t` suffix, or `unlimited`.
fn check_bytes(v: &str) -> Result<(), String> {
    let s = v.trim().to_ascii_lowercase();
    if s == "unlimited" || s == "max" || parse_bytes(v).is_some() {
        return Ok(());
    }
    Err(format!("'{v}' is not a byte count (e.g. 64m, 1g, 0x1000), or is too large"))
}

/// The `USERMM_*` variables the program's space will read (usermm run's own
/// environment, with its options' variables in place of the inherited
/// ones), checked by the library's own rules: one that does not parse makes
/// the space refuse to open (`EINVAL`), and the program would run on the C
/// library's allocator with no word said.
fn check_inherited_env(set: &[(&str, String)]) -> Result<(), String> {
    let get = |name: &str| match set.iter().find(|(k, _)| *k == name) {
        Some((_, v)) => Some(OsString::from(v)),
        None => std::env::var_os(name),
    };
    usermm::config_from_vars(&get).map(drop).map_err(|e| e.to_string())
}

/// `Ok(None)`: `--help`.
fn parse(args: &[OsString]) -> Result<Option<RunOpts>, String> {
    let mut o = RunOpts::default();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        i += 1;
        if a == "--" {
            o.argv = args[i..].to_vec();
            break;
        }
        let Some(opt) = a.strip_prefix("--") else {
            // The program starts at the first word that is not an option.
            o.argv = args[i - 1..].to_vec();
            break;
        };
        let (name, inline) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (opt, None),
        };
        let var = match name {
            "help" => return Ok(None),
            "stats" => {
                o.env.push(("USERMM_RUN_STATS", "1".into()));
                if let Some(f) = inline {
                    if f.is_empty() {
                        return Err("--stats=FILE needs a file name".into());
                    }
                    o.stats_file = Some(PathBuf::from(f));
                }
                continue;
            }
            "inthread" | "frame-pool" | "verbose" | "no-inherit" | "no-cgroup-view" => {
                if inline.is_some() {
                    return Err(format!("--{name} takes no value"));
                }
                match name {
                    "inthread" => o.flags |= UMM_F_INTHREAD_FAULTS,
                    "frame-pool" => o.flags |= UMM_F_FRAME_POOL,
                    "verbose" => o.env.push(("USERMM_RUN_VERBOSE", "1".into())),
                    "no-cgroup-view" => o.env.push(("USERMM_RUN_NO_CGROUP_VIEW", "1".into())),
                    _ => o.env.push(("USERMM_RUN_NO_INHERIT", "1".into())),
                }
                continue;
            }
            "budget" => "USERMM_BUDGET_BYTES",
            "swap-bytes" => "USERMM_SWAP_BYTES",
            "swap-dir" => "USERMM_SWAP_DIR",
            "swap-url" => "USERMM_SWAP_URL",
            "memlock" => "USERMM_MEMLOCK_BYTES",
            _ => return Err(format!("run: unknown option '--{name}'")),
        };
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args.get(i).ok_or_else(|| format!("--{name} needs a value"))?;
                i += 1;
                v.to_string_lossy().into_owned()
            }
        };
        if var.ends_with("_BYTES") {
            check_bytes(&value).map_err(|m| format!("--{name}: {m}"))?;
        }
        if name == "budget" {
            check_budget(&value).map_err(|m| format!("--budget: {m}"))?;
        }
        o.env.push((var, value));
    }
    if o.argv.is_empty() {
        return Err("run: missing PROGRAM (usermm run [OPTIONS] -- PROGRAM [ARGS...])".into());
    }
    Ok(Some(o))
}

/// `PROGRAM` as `execvp` would find it: a name with a `/` as it is, any
/// other in `$PATH`.
fn find_program(name: &OsString) -> Option<PathBuf> {
    let p = Path::new(name);
    if name.to_string_lossy().contains('/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file())
}

/// Why the preload cannot reach the program in `head` (its first bytes),
/// if it cannot: a 64-bit ELF file without a program interpreter
/// (`PT_INTERP`) is statically linked, and the dynamic loader that reads
/// `LD_PRELOAD` never runs; a 32-bit one cannot load a 64-bit library. A
/// script (`#!`) runs its interpreter, which the preload reaches.
fn preload_refusal(head: &[u8]) -> Option<&'static str> {
    const PT_INTERP: u32 = 3;
    if head.starts_with(b"#!") || !head.starts_with(b"\x7fELF") {
        return None;
    }
    if head.get(4) != Some(&2) {
        return Some("is a 32-bit program; the preload library is 64-bit");
    }
    let u16_at = |o: usize| head.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |o: usize| head.get(o..o + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return Some("is not a complete ELF file");
    };
    let has_interp = (0..phnum).any(|i| {
        let at = phoff as usize + i * phentsize;
        head.get(at..at + 4).is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == PT_INTERP)
    });
    if has_interp {
        None
    } else {
        Some("is statically linked (no program interpreter): LD_PRELOAD cannot put its memory on a space")
    }
}

/// `LD_PRELOAD` with `lib` first (the caller's own preloads kept after it).
fn ld_preload(lib: &Path) -> OsString {
    let mut v = OsString::from(lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// `usermm run ARGS…` (`args` after `run`).
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    let o = match parse(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(m) => {
            eprintln!("usermm: {m}\nRun 'usermm run --help' for usage.");
            return ExitCode::from(2);
        }
    };
    if let Err(m) = check_inherited_env(&o.env) {
        eprintln!("usermm run: {m}");
        return ExitCode::from(2);
    }
    let prog = &o.argv[0];
    let Some(path) = find_program(prog) else {
        eprintln!("usermm run: {}: program not found", prog.to_string_lossy());
        return ExitCode::from(EXIT_NOT_FOUND);
    };
    let mut head = vec![0u8; 4096];
    let n = match std::fs::File::open(&path).and_then(|mut f| std::io::Read::read(&mut f, &mut head)) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("usermm run: {}: {e}", path.display());
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if let Some(why) = preload_refusal(&head[..n]) {
        eprintln!("usermm run: {} {why}", path.display());
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    let lib = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(PRELOAD_LIB),
        Err(e) => {
            eprintln!("usermm run: cannot find the usermm binary's directory: {e}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if !lib.is_file() {
        eprintln!(
            "usermm run: the preload library {} is missing (cargo build --release -p usermm-preload)",
            lib.display()
        );
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    let mut cmd = Command::new(prog);
    cmd.args(&o.argv[1..]).env("LD_PRELOAD", ld_preload(&lib));
    // A descriptor of /dev/userfaultfd the program and what it execs
    // inherit: one that drops its privileges and then execs (setpriv,
    // runuser, a server that switches to its user) still gets kernel-mode
    // faults, which only the device's opener may ask for
    // (`usermm_sys::uffd::DEVICE_FD_ENV`). Where usermm cannot open it, the
    // program cannot either and falls back as it would.
    if std::env::var_os(usermm_sys::uffd::DEVICE_FD_ENV).is_none() {
        if let Ok(fd) = usermm_sys::uffd::inheritable_device_fd(UFFD_DEVICE_FD_MIN) {
            cmd.env(usermm_sys::uffd::DEVICE_FD_ENV, fd.to_string());
        }
    }
    if let Some(f) = &o.stats_file {
        // Made anew here (each process of the run appends its lines), by
        // its absolute name: the program may change its directory.
        let abs = std::path::absolute(f).unwrap_or_else(|_| f.clone());
        if let Err(e) = std::fs::File::create(&abs) {
            eprintln!("usermm run: --stats={}: {e}", f.display());
            return ExitCode::from(2);
        }
        cmd.env("USERMM_RUN_STATS_FILE", abs);
    }
    for (k, v) in &o.env {
        cmd.env(k, v);
    }
    if o.flags != 0 {
        let base = std::env::var("USERMM_FLAGS").ok().and_then(|v| parse_flags(&v)).unwrap_or(0);
        cmd.env("USERMM_FLAGS", (base | o.flags).to_string());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("usermm run: cannot start {}: {e}", path.display());
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    forward_termination(child.id() as i32);
    match child.wait() {
        Ok(st) => ExitCode::from(exit_byte(st)),
        Err(e) => {
            eprintln!("usermm run: cannot wait for {}: {e}", path.display());
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

/// `USERMM_FLAGS` as the library reads it (decimal or `0x` hex).
fn parse_flags(v: &str) -> Option<u32> {
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The exit status that passes on how the program ended: its own, or
/// 128 + the signal that killed it.
fn exit_byte(st: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => EXIT_CANNOT_RUN,
    }
}

/// From now on SIGTERM sent to `usermm` goes to the program, and SIGINT is
/// left to the program alone (the terminal sends it to both).
fn forward_termination(pid: i32) {
    // Blocked in this thread before the forwarding thread starts, so that
    // it inherits the mask and no thread takes the default action.
    if usermm_sys::process::block_termination_signals().is_err() {
        return;
    }
    std::thread::spawn(move || loop {
        let sig = usermm_sys::process::wait_termination_signal();
        if sig == SIGTERM {
            let _ = usermm_sys::process::kill(pid, sig);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_become_the_environment() {
        let o = parse(&args(&["--budget", "32m", "--swap-bytes=1g", "--stats", "--inthread", "--", "prog", "--x"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            o.env,
            vec![
                ("USERMM_BUDGET_BYTES", "32m".to_string()),
                ("USERMM_SWAP_BYTES", "1g".into()),
                ("USERMM_RUN_STATS", "1".into())
            ]
        );
        assert_eq!(o.flags, UMM_F_INTHREAD_FAULTS);
        assert_eq!(o.argv, args(&["prog", "--x"]));
        // Without `--`, the program starts at the first word that is not an option.
        assert_eq!(parse(&args(&["--verbose", "ls", "-l"])).unwrap().unwrap().argv, args(&["ls", "-l"]));
    }

    #[test]
    fn bad_options_are_usage_errors() {
        assert!(parse(&args(&["--budget", "lots", "--", "ls"])).is_err());
        assert!(parse(&args(&["--budget"])).is_err());
        assert!(parse(&args(&["--frobnicate", "--", "ls"])).is_err());
        assert!(parse(&args(&["--stats=", "--", "ls"])).is_err());
        assert!(parse(&args(&["--budget", "0", "--", "ls"])).is_err());
        assert!(parse(&args(&["--budget=64k", "--", "ls"])).is_err());
        assert!(parse(&args(&["--budget=1m", "--", "ls"])).is_ok());
        assert_eq!(
            parse(&args(&["--stats=/tmp/s", "--", "ls"])).unwrap().unwrap().stats_file,
            Some(PathBuf::from("/tmp/s"))
        );
        assert!(parse(&args(&["--stats", "--"])).is_err());
        assert_eq!(parse(&args(&["--help"])).unwrap(), None);
    }

    #[test]
    fn static_binaries_are_refused_scripts_are_not() {
        assert_eq!(preload_refusal(b"#!/bin/sh\n"), None);
        let ls = std::fs::read("/bin/ls").unwrap();
        assert_eq!(preload_refusal(&ls[..4096.min(ls.len())]), None);
        // An ELF header with no program headers at all: no interpreter.
        let mut h = vec![0u8; 64];
        h[..5].copy_from_slice(b"\x7fELF\x02");
        assert!(preload_refusal(&h).unwrap().contains("statically linked"));
    }
}
