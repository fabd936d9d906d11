//! The C ABI from C: compiles `tests/c/*.c` against `include/` with the
//! system's `cc`, links them to the `libusermm.so` / `libusermm.a` that this
//! test's own build produced, runs them and checks their verdict line
//! (`N passed, 0 failed`).
//!
//! The library is found next to the test executable: cargo builds the
//! crate's cdylib and staticlib into `target/<profile>/deps/` (the same
//! rustc run as the rlib this test links), and `cargo build` copies them one
//! level up. If neither place has them, they are built once with
//! `cargo build -p usermm` into a separate target directory (the running
//! `cargo test` holds the lock on its own).

mod redis_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The directory of this test executable (`target/<profile>/deps`).
fn exe_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

fn has_libs(dir: &Path) -> bool {
    dir.join("libusermm.so").exists() && dir.join("libusermm.a").exists()
}

/// The directory holding `libusermm.so` and `libusermm.a`.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let deps = exe_dir();
        if has_libs(&deps) {
            return deps;
        }
        let dir = if deps.ends_with("deps") { deps.parent().unwrap().to_path_buf() } else { deps };
        if has_libs(&dir) {
            return dir;
        }
        let profile = dir.file_name().unwrap().to_str().unwrap().to_string();
        let target = dir.parent().unwrap().join("c-abi-fallback");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root()).args(["build", "-p", "usermm", "--lib"]).env("CARGO_TARGET_DIR", &target);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let st = cmd.status().expect("run cargo build");
        assert!(st.success(), "cargo build -p usermm failed: {st}");
        let built = target.join(&profile);
        assert!(has_libs(&built), "no libusermm.so/.a in {}", built.display());
        built
    })
}

/// Compiles `tests/c/<src>` into `<tmp>/<out>` with `extra` link arguments.
fn compile(src: &str, out: &str, link: &[&str]) -> PathBuf {
    let root = repo_root();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    let o = Command::new("cc")
        .current_dir(&root)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", "include"])
        .arg(root.join("tests/c").join(src))
        .args(link)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc {src} failed: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    exe
}

fn link_shared() -> Vec<String> {
    let dir = lib_dir().display().to_string();
    vec![format!("-L{dir}"), "-lusermm".into(), format!("-Wl,-rpath,{dir}")]
}

/// [`compile`] against the shared library, with `extra` link arguments.
fn compile_shared(src: &str, out: &str, extra: &[&str]) -> PathBuf {
    let link = link_shared();
    let link: Vec<&str> = link.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    compile(src, out, &link)
}

/// A command for a compiled C test with no `USERMM_*` variable inherited,
/// and no `LD_LIBRARY_PATH`: cargo's lists `target/<profile>` (where `cargo
/// build` last copied a library, perhaps an older one) before
/// `target/<profile>/deps`, and it would win over the `-rpath` the program
/// was linked with, so the test could run against a stale library.
fn command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env_remove("LD_LIBRARY_PATH");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("USERMM_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Asserts the program succeeded and its last line is `N passed, 0 failed`
/// with N > 0; returns N.
fn assert_verdict(name: &str, o: &Output) -> u32 {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("--- {name} stdout:\n{stdout}--- {name} stderr:\n{stderr}");
    let last = stdout.lines().last().unwrap_or("");
    let words: Vec<&str> = last.split(' ').collect();
    assert!(
        words.len() == 4 && words[1] == "passed," && words[3] == "failed",
        "{name}: no verdict line, got {last:?} (status {})",
        o.status
    );
    let passed: u32 = words[0].parse().unwrap();
    let failed: u32 = words[2].parse().unwrap();
    assert_eq!(failed, 0, "{name}: {last}");
    assert!(passed > 0, "{name}: nothing checked");
    assert!(o.status.success(), "{name}: {}", o.status);
    passed
}

#[test]
fn c_test_against_shared_library() {
    let exe = compile_shared("test_usermm.c", "test_usermm_shared", &[]);
    let o = command(&exe).output().unwrap();
    assert!(assert_verdict("test_usermm (shared)", &o) >= 100);
}

#[test]
fn c_test_against_static_library() {
    let a = lib_dir().join("libusermm.a").display().to_string();
    let exe = compile("test_usermm.c", "test_usermm_static", &[&a, "-lpthread", "-ldl", "-lm"]);
    let o = command(&exe).output().unwrap();
    assert!(assert_verdict("test_usermm (static)", &o) >= 100);
}

#[test]
fn compat_header_redirects_plain_calls() {
    let exe = compile_shared("test_compat.c", "test_compat", &[]);
    let o = command(&exe).output().unwrap();
    assert_verdict("test_compat", &o);

    // A malformed variable: the default space is not opened, the calls fail
    // with EINVAL, and a message says why.
    let o = command(&exe).arg("bad-env").env("USERMM_BUDGET_BYTES", "lots").output().unwrap();
    assert_verdict("test_compat bad-env", &o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("cannot open the default space"), "{stderr}");
}

#[test]
fn compat_header_routes_malloc_to_the_default_space() {
    let exe = compile_shared("test_malloc.c", "test_malloc", &["-lpthread"]);
    let o = command(&exe).output().unwrap();
    assert!(assert_verdict("test_malloc", &o) >= 40);
    // The double free was refused, with a message.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("bad or double free"), "{stderr}");
}

/// The same program swapping its heap to a Redis server
/// (`USERMM_SWAP_URL`, default prefix): it never closes its default space,
/// and once it has exited no key of it is left on the server.
#[test]
fn a_malloc_program_leaves_no_key_on_its_redis_server() {
    let srv = redis_server::Server::start(&[]);
    let exe = compile_shared("test_malloc.c", "test_malloc_redis", &["-lpthread"]);
    let url = format!("redis://127.0.0.1:{}/?timeout_ms=2000", srv.port);
    let o = command(&exe).env("USERMM_SWAP_URL", &url).output().unwrap();
    assert!(assert_verdict("test_malloc (redis)", &o) >= 40);
    let t0 = std::time::Instant::now();
    while srv.dbsize() > 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left = srv.keys("*");
    assert!(
        left.is_empty(),
        "{} keys left 10 s after the program exited, e.g. {:?}",
        left.len(),
        &left[..left.len().min(3)]
    );
}

#[test]
fn in_thread_faults_from_c() {
    let exe = compile_shared("test_inthread.c", "test_inthread", &[]);
    let o = command(&exe).output().unwrap();
    assert!(assert_verdict("test_inthread", &o) >= 20);
}

#[test]
fn headers_compile_as_cxx_and_strict_c() {
    let root = repo_root();
    let src = "#include \"usermm_compat.h\"\n\
               int main(void) { struct umm_config c; umm_config_init(&c); \
               umm_space *s = umm_open(&c); return s ? umm_close(s) : 1; }\n";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // Also with the C heap routed (USERMM_MALLOC=1), used once.
    let malloc_src =
        format!("#define USERMM_MALLOC 1\n{}", src.replace("return s ?", "void *m = malloc(8); free(m); return s ?"));
    // The C library's own headers after it (which declare every name it
    // redirects), and free taken as a pointer.
    let after = |headers: &str, free: &str| {
        format!(
            "#define USERMM_MALLOC 1\n#include \"usermm_compat.h\"\n{headers}\n\
             int main(void) {{ void (*f)(void *) = {free}; void *p = NULL; \
             if (posix_memalign(&p, 64, 10) == 0) f(p); \
             f(reallocarray(memalign(64, 1), 2, 3)); f(valloc(1)); f(pvalloc(1)); \
             return (int)malloc_usable_size(NULL); }}\n"
        )
    };
    let cxx_after = after("#include <cstdlib>\n#include <malloc.h>\n#include <stdlib.h>", "std::free");
    let c_after = after("#include <malloc.h>\n#include <stdlib.h>", "free");
    for (file, args, text) in [
        ("hdr.cpp", &["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..], src),
        ("hdr.c", &["cc", "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..], src),
        ("hdr_malloc.cpp", &["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..], &malloc_src),
        (
            "hdr_malloc.c",
            &["cc", "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..],
            &malloc_src,
        ),
        ("hdr_after.cpp", &["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..], &cxx_after),
        ("hdr_after.c", &["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"][..], &c_after),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let o = Command::new(args[0])
            .current_dir(&root)
            .args(&args[1..])
            .args(["-I", "include"])
            .arg(&path)
            .output()
            .expect("run the compiler");
        assert!(o.status.success(), "{file}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
