//! The Linux kernel's own mm selftests for what usermm implements — the
//! lock tests (`mlock2-tests`, `mlock-random-test`, `on-fault-limit`),
//! `madv_populate`, `mincore_selftest`, `map_populate`,
//! `map_fixed_noreplace`, `mremap_test`, `mremap_dontunmap`, `droppable` —
//! from Debian's `linux-source-6.12` package (below), built as the kernel
//! builds them (plain `gcc` with `kselftest.h`/`kselftest_harness.h` and
//! `vm_util.c`, not against `usermm_compat.h`), run unchanged on the host
//! kernel and under `usermm run --budget`, their TAP output compared test
//! by test.
//!
//! Every test's result under usermm must equal the host's, or the
//! difference must be one of [`EXPECTED`], each naming the row of
//! docs/design.md's "Deviations from Linux" table that explains it. A test
//! the machine cannot run (no huge pages, no soft-dirty) gives the same
//! result on both sides, so it compares equal; nothing here is skipped.
//!
//! What each program exercises under usermm: the lock tests,
//! `madv_populate`, `map_fixed_noreplace` and `mremap_dontunmap` run in the
//! process that holds the space, so their anonymous mappings,
//! `mlock2`/`mlockall`/`munlock*` (also by raw `syscall`), `madvise` and
//! `mremap` are the space's; what they read back (`/proc/self/smaps` and
//! `maps`, `VmLck`, pagemap) is the host's view of the space's memory,
//! which usermm's own host calls (locks, zaps, copies) shape.
//! `mincore_selftest`'s harness runs every `TEST()` in a forked child, which
//! gets a copy of the space (its calls are the copy's) and shares the
//! harness's anonymous `MAP_SHARED` results page with it (the kernel's:
//! `usermm run` leaves those to it). `map_populate`'s checks run in a
//! forked child too, on its copy of the parent's heap. `mremap_test` maps
//! most of its regions at fixed low addresses, outside the space's
//! reservation (the kernel's); its expand-merge tests, its random-pattern
//! buffer and its 20 MiB "move within range" mapping (larger than the
//! budget: the space swaps) are the space's. `droppable`'s `MAP_DROPPABLE`
//! mapping is the kernel's (a space does not build one), and so is its
//! `madvise(MADV_PAGEOUT)`.
//!
//! The sources are Debian's: the package `linux-source-6.12` (installed
//! by scripts/install-deps.sh) ships the kernel tree as
//! `/usr/src/linux-source-6.12.tar.xz`. The test extracts what it needs
//! ([`EXTRACT`]: `tools/testing/selftests/{mm,mincore}`, `kselftest*.h`,
//! `tools/include` and `tools/arch/x86/include`, about 10 MB) once into
//! `target/upstream-kernel-mm/`, keyed by the tarball's name, size and
//! modification time, and reuses it while it is there (the first run of a
//! fresh checkout extracts: about 40 s). A missing tarball fails the test,
//! naming scripts/install-deps.sh; nothing is skipped. The sources are
//! built unchanged, with the flags of the kernel's Makefiles ([`build`]);
//! 6.12's `mlock2.h` has no `asm-generic/unistd.h` include and its
//! `madv_populate.c` calls `ksft_exit_pass()` without `return`, so nothing
//! needs fixing. The programs run as run_vmtests.sh runs them
//! (`on-fault-limit` as `nobody`: as root it skips), but `mremap_test`
//! without address-space randomization, on both sides (`Prog::no_aslr`:
//! one of its cases is flaky on the host otherwise).
//!
//! The preload library is `target/release/libusermm_preload.so` (built by
//! `cargo build --release`, as scripts/test.sh does first). `gcc`, `tar`
//! with `xz`, `setpriv`, `setarch` and libcap's header
//! (scripts/install-deps.sh) are needed; a missing one fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Instant, SystemTime};

const BIN: &str = env!("CARGO_BIN_EXE_usermm");

/// The budget of each run under usermm: every test's memory fits a few
/// times over, so a difference is never the budget's.
const BUDGET: &str = "16m";

/// One upstream program.
struct Prog {
    name: &'static str,
    /// Source directory under `tools/testing/selftests`.
    dir: &'static str,
    /// Linked with `vm_util.c` and `thp_settings.c`, as every mm selftest is.
    vm_util: bool,
    libs: &'static [&'static str],
    /// Run as `nobody`, as run_vmtests.sh does (`sudo -u nobody`): the
    /// test checks `RLIMIT_MEMLOCK`, which root's `CAP_IPC_LOCK` bypasses.
    as_nobody: bool,
    /// Run with address-space randomization off (`setarch -R`), on both
    /// sides: `mremap_test`'s "40MB Preamble" case maps the 40 MiB below
    /// the destination it checked with `MAP_FIXED_NOREPLACE` without
    /// checking that range, which a randomized layout occupies in about one
    /// host run in fifteen (`EEXIST`, the case fails; never in 30 runs
    /// without randomization, nor under usermm, where the heap is the
    /// space's).
    no_aslr: bool,
}

const PROGS: &[Prog] = &[
    Prog { name: "mlock2-tests", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "mlock-random-test", dir: "mm", vm_util: true, libs: &["-lcap"], as_nobody: false, no_aslr: false },
    Prog { name: "on-fault-limit", dir: "mm", vm_util: true, libs: &[], as_nobody: true, no_aslr: false },
    Prog { name: "madv_populate", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "map_populate", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "map_fixed_noreplace", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "mincore_selftest", dir: "mincore", vm_util: false, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "mremap_test", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: true },
    Prog { name: "mremap_dontunmap", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
    Prog { name: "droppable", dir: "mm", vm_util: true, libs: &[], as_nobody: false, no_aslr: false },
];

/// A test's result, from its TAP line (`Missing`: the plan announced it,
/// no line reported it — the program bailed out or died before).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Res {
    Pass,
    Fail,
    Skip,
    /// `ok N # XFAIL`: a failure the test expects (an `mremap` refused).
    XFail,
    Missing,
}

/// A difference usermm is allowed: `prog`'s test `num` is `host` on the
/// host and `usermm` under usermm, for the reason in `row` (the first
/// column of a row of docs/design.md's deviation table). An entry applies
/// only when the host gives `host` (a machine with huge pages, say, may
/// pass a test this one skips); then usermm must give exactly `usermm`.
struct Expected {
    prog: &'static str,
    num: u32,
    host: Res,
    usermm: Res,
    row: &'static str,
    why: &'static str,
}

/// None today: every test gives the host's result.
const EXPECTED: &[Expected] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn newest_source(dir: &Path) -> SystemTime {
    let mut t = SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        let m = if p.is_dir() { newest_source(&p) } else { e.metadata().and_then(|m| m.modified()).unwrap() };
        t = t.max(m);
    }
    t
}

/// Fails unless the preload library beside the binary is there and newer
/// than its sources (and usermm's).
fn check_preload() {
    let lib = Path::new(BIN).with_file_name("libusermm_preload.so");
    let built = std::fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: run `cargo build --release -p usermm-preload` first", lib.display()));
    for src in ["crates/usermm-preload/src", "crates/usermm/src", "crates/usermm-core/src"] {
        assert!(
            newest_source(&root().join(src)) <= built,
            "{} is older than {src}: run `cargo build --release -p usermm-preload` first",
            lib.display()
        );
    }
}

fn need(prog: &str) -> PathBuf {
    for p in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let c = Path::new(p).join(prog);
        if c.is_file() {
            return c;
        }
    }
    panic!("{prog} is not installed (scripts/install-deps.sh installs it)");
}

fn output(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"))
}

/// Where Debian's `linux-source-6.12` package (scripts/install-deps.sh)
/// puts the kernel's sources.
const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";

/// The tarball of the kernel's sources: [`SOURCE_TARBALL`], or else the
/// newest `/usr/src/linux-source-6.N.tar.xz`, N > 12 (what
/// scripts/install-deps.sh installs where the archive has no 6.12; its
/// results may differ from 6.12's, which [`EXPECTED`] was made from, and the
/// test says which it built). Fails, naming scripts/install-deps.sh, if
/// there is none.
fn source_tarball() -> PathBuf {
    let tarball = PathBuf::from(SOURCE_TARBALL);
    if tarball.exists() {
        return tarball;
    }
    let later = std::fs::read_dir("/usr/src").into_iter().flatten().flatten().filter_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let minor: u32 = name.strip_prefix("linux-source-6.")?.strip_suffix(".tar.xz")?.parse().ok()?;
        (minor > 12).then_some((minor, e.path()))
    });
    later.max().map(|(_, p)| p).unwrap_or_else(|| {
        panic!(
            "{SOURCE_TARBALL} is missing: the kernel's mm selftests come from Debian's linux-source-6.12 package; \
             install it with scripts/install-deps.sh (as root; or apt-get install linux-source-6.12)"
        )
    })
}

/// What the test extracts from the tarball (under its top directory): the
/// selftests it builds and their headers (`kselftest.h`,
/// `kselftest_harness.h`), `lib.mk` (the flags [`build`] follows, for a
/// reader), and the tools tree's copies of the newer uapi headers
/// (`TOOLS_INCLUDES`) with the x86 ones they include.
const EXTRACT: &[&str] = &[
    "tools/testing/selftests/mm/*",
    "tools/testing/selftests/mincore/*",
    "tools/testing/selftests/kselftest*",
    "tools/testing/selftests/lib.mk",
    "tools/include/*",
    "tools/arch/x86/include/*",
];

/// The kernel tree of the package's tarball, extracted once into
/// `target/upstream-kernel-mm/` (keyed by the tarball's name, size and
/// modification time; another version of the package extracts afresh) and
/// reused while that directory is there. Fails, naming
/// scripts/install-deps.sh, if the tarball is missing.
fn kernel_tree() -> PathBuf {
    let tarball = source_tarball();
    let meta = std::fs::metadata(&tarball).unwrap_or_else(|e| panic!("{}: {e}", tarball.display()));
    // The tarball's top directory: linux-source-6.N.
    let top = tarball.file_name().unwrap().to_str().unwrap().strip_suffix(".tar.xz").unwrap().to_string();
    if tarball != Path::new(SOURCE_TARBALL) {
        eprintln!("{SOURCE_TARBALL} is missing: building the selftests of {}", tarball.display());
    }
    let mtime = meta.modified().unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    // The target directory: the binary is target/<profile>/usermm.
    let target = Path::new(BIN).parent().and_then(Path::parent).unwrap();
    let cache = target.join("upstream-kernel-mm").join(format!("{top}-{}-{mtime}", meta.len()));
    let tree = cache.join(&top);
    if cache.join("complete").exists() {
        return tree;
    }
    let t0 = Instant::now();
    let tmp = cache.with_file_name(format!("{top}-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut tar = Command::new(need("tar"));
    tar.args(["-x", "-J", "--no-same-owner", "--wildcards", "-f"]).arg(&tarball).arg("-C").arg(&tmp);
    tar.args(EXTRACT.iter().map(|m| format!("{top}/{m}")));
    let o = output(&mut tar);
    assert!(o.status.success(), "{tar:?}: {}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(tmp.join("complete"), format!("{}, {} bytes, mtime {mtime}\n", tarball.display(), meta.len()))
        .unwrap();
    // A run that died half way left only its partial-PID directory; two
    // runs at once both extract and the first rename wins.
    if std::fs::rename(&tmp, &cache).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    assert!(cache.join("complete").exists(), "{}: extraction did not land", cache.display());
    eprintln!("extracted {} into {} in {:.1} s", tarball.display(), cache.display(), t0.elapsed().as_secs_f64());
    tree
}

/// Builds `p` into `out` as the kernel's Makefiles do, in the program's
/// directory: tools/testing/selftests/mm/Makefile's `CFLAGS = -Wall -O2 -I
/// $(top_srcdir) $(KHDR_INCLUDES) $(TOOLS_INCLUDES)`, `-U_FORTIFY_SOURCE`,
/// `-no-pie` (x86-64), lib.mk's `-D_GNU_SOURCE=`, `LDLIBS = -lrt -lpthread
/// -lm` (`-lcap` for `mlock-random-test`), every program linked with
/// `vm_util.c` and `thp_settings.c`; mincore/Makefile's `-Wall` and lib.mk's
/// `-D_GNU_SOURCE=`. `KHDR_INCLUDES` (the tree's `usr/include` from `make
/// headers_install`) is left out: the system's uapi headers stand in, and
/// `TOOLS_INCLUDES` (`tools/include/uapi`) has the newer definitions the
/// tests use (`PAGEMAP_SCAN`, `PROCMAP_QUERY`, `MAP_DROPPABLE`).
fn build(p: &Prog, tree: &Path, out: &Path) -> PathBuf {
    let src = tree.join("tools/testing/selftests").join(p.dir);
    let exe = out.join(p.name);
    let mut g = Command::new(need("gcc"));
    g.current_dir(&src).arg("-Wall");
    if p.dir == "mm" {
        g.args(["-O2", "-I", "../../../.."]).args(["-isystem", "../../../../tools/include/uapi"]);
        g.args(["-U_FORTIFY_SOURCE", "-no-pie"]);
    }
    g.arg("-D_GNU_SOURCE=").arg(format!("{}.c", p.name));
    if p.vm_util {
        g.args(["vm_util.c", "thp_settings.c"]);
    }
    if p.dir == "mm" {
        g.args(["-lrt", "-lpthread", "-lm"]);
    }
    g.args(p.libs).arg("-o").arg(&exe);
    let o = output(&mut g);
    assert!(o.status.success(), "{g:?}: {}", String::from_utf8_lossy(&o.stderr));
    exe
}

/// The TAP results of one run: the plan and each test's result by number.
#[derive(Debug)]
struct Tap {
    plan: u32,
    results: BTreeMap<u32, (Res, String)>,
}

impl Tap {
    fn parse(stdout: &str) -> Tap {
        let mut plan = 0;
        let mut results = BTreeMap::new();
        for line in stdout.lines() {
            if let Some(n) = line.strip_prefix("1..") {
                plan = n.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
                continue;
            }
            let (pass, rest) = if let Some(r) = line.strip_prefix("ok ") {
                (true, r)
            } else if let Some(r) = line.strip_prefix("not ok ") {
                (false, r)
            } else {
                continue;
            };
            let (num, desc) = rest.split_once(' ').unwrap_or((rest, ""));
            let Ok(num) = num.parse::<u32>() else { continue };
            let res = match (pass, desc.contains("# SKIP"), desc.contains("# XFAIL")) {
                (true, true, _) => Res::Skip,
                (true, false, true) => Res::XFail,
                (true, false, false) => Res::Pass,
                (false, _, _) => Res::Fail,
            };
            results.insert(num, (res, desc.trim().to_string()));
        }
        Tap { plan, results }
    }

    fn get(&self, num: u32) -> (Res, &str) {
        self.results.get(&num).map_or((Res::Missing, ""), |(r, d)| (*r, d.as_str()))
    }
}

/// Runs `argv` (as `nobody`, without address-space randomization if `p`
/// asks) in `cwd`, under `timeout` so that a hang fails the test instead of
/// stalling the suite.
fn run(argv: &[&std::ffi::OsStr], p: &Prog, cwd: &Path) -> Output {
    let mut c = Command::new(need("timeout"));
    c.args(["--kill-after=10", "300"]);
    if p.no_aslr {
        c.arg(need("setarch")).arg("-R");
    }
    if p.as_nobody {
        c.arg(need("setpriv")).args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]);
    }
    c.args(argv).current_dir(cwd);
    output(&mut c)
}

#[test]
fn kernel_mm_selftests_give_the_hosts_results_under_usermm_run() {
    check_preload();
    let t0 = Instant::now();
    let dir = std::env::temp_dir().join(format!("usermm-kernel-mm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // `nobody` runs programs from here and creates temporary files in it.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();

    let tree = kernel_tree();
    let mut problems = Vec::new();
    let mut applied = 0;
    let mut compared = 0;
    for p in PROGS {
        let exe = build(p, &tree, &dir);
        let host = run(&[exe.as_os_str()], p, &dir);
        let budget = format!("--budget={BUDGET}");
        let swap_dir = format!("--swap-dir={}", dir.display());
        let under = run(
            &[
                Path::new(BIN).as_os_str(),
                "run".as_ref(),
                budget.as_ref(),
                swap_dir.as_ref(),
                "--stats".as_ref(),
                "--".as_ref(),
                exe.as_os_str(),
            ],
            p,
            &dir,
        );
        let (hs, us) = (String::from_utf8_lossy(&host.stdout), String::from_utf8_lossy(&under.stdout));
        let ue = String::from_utf8_lossy(&under.stderr);
        let (h, u) = (Tap::parse(&hs), Tap::parse(&us));
        eprintln!("== {}: host {:?}, usermm {:?}", p.name, host.status, under.status);
        // A build or run that produced nothing would compare equal.
        assert!(
            h.plan > 0 && !h.results.is_empty(),
            "{} on the host printed no TAP results:\n{hs}\n{}",
            p.name,
            String::from_utf8_lossy(&host.stderr)
        );
        // The preload was active: the space printed its statistics.
        assert!(
            ue.contains(&format!("({}", &p.name[..p.name.len().min(15)])) && ue.contains("stats: budget_bytes="),
            "{}: no statistics from usermm run's space:\n{ue}",
            p.name
        );
        // Every test either side announced or reported, so that a plan
        // cut short (a bail-out before the plan) or a test only one side
        // ran counts as a difference.
        let last = [
            h.plan,
            u.plan,
            h.results.keys().max().copied().unwrap_or(0),
            u.results.keys().max().copied().unwrap_or(0),
        ];
        for num in 1..=last.into_iter().max().unwrap() {
            let ((hr, hd), (ur, ud)) = (h.get(num), u.get(num));
            compared += 1;
            eprintln!("   {num:>2} host {hr:?} usermm {ur:?}  {hd}");
            let entry = EXPECTED.iter().find(|e| e.prog == p.name && e.num == num && e.host == hr);
            match entry {
                Some(e) => {
                    applied += 1;
                    if ur != e.usermm {
                        problems.push(format!(
                            "{} #{num} ({hd}): host {hr:?}, usermm {ur:?} ({ud}); the expected deviation says {:?} \
                             ({}: {})",
                            p.name, e.usermm, e.row, e.why
                        ));
                    }
                }
                None if hr != ur => problems.push(format!(
                    "{} #{num} ({hd}): host {hr:?}, usermm {ur:?} ({ud}), not an expected deviation",
                    p.name
                )),
                None => {}
            }
        }
        if problems.iter().any(|m| m.starts_with(p.name)) {
            eprintln!("--- {} host stdout:\n{hs}\n--- usermm stdout:\n{us}\n--- usermm stderr:\n{ue}", p.name);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{compared} kernel mm selftest results compared, {applied} expected deviations applied, {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "kernel mm selftests under usermm run:\n{}", problems.join("\n"));
    // Every deviation row named above is a row of the table.
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    for e in EXPECTED {
        assert!(design.contains(&format!("| {} |", e.row)), "docs/design.md has no deviation row {}", e.row);
    }
}

#[test]
fn tap_parsing() {
    let t = Tap::parse(
        "TAP version 13\n1..4\n# hello\nok 1 first\nnot ok 2 second\nok 3 # SKIP no huge pages\n\
         Bail out! gone\n# Totals: pass:1 fail:1\n",
    );
    assert_eq!(t.plan, 4);
    assert_eq!(t.get(1).0, Res::Pass);
    assert_eq!(t.get(2), (Res::Fail, "second"));
    assert_eq!(t.get(3).0, Res::Skip);
    assert_eq!(Tap::parse("1..1\nok 1 # XFAIL mremap - overlapping\n").get(1).0, Res::XFail);
    assert_eq!(t.get(4).0, Res::Missing);
    let h = Tap::parse("1..3\nok 1 global.a\nok 2 global.b # SKIP x\nnot ok 3 global.c\n");
    assert_eq!([h.get(1).0, h.get(2).0, h.get(3).0], [Res::Pass, Res::Skip, Res::Fail]);
}
