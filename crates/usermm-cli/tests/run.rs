//! `usermm run`: real programs nobody here wrote (CPython, the SQLite
//! shell, a Redis server, SQLite's `speedtest1` built from Debian's SQLite
//! source package as upstream's configure builds it) and C programs built at test time, each with a
//! working set about 4× the budget, under `usermm run --budget`: their
//! output must be right (compared with the same run without usermm where
//! there is one) and the space must really have swapped (`--stats`:
//! `swapouts` > 0). Also: exit status and death by signal passed on, SIGTERM
//! forwarded, children started by `system`, `posix_spawn`, `popen`,
//! `fork`+`exec` and Python's `subprocess` run, `--no-inherit`, a static
//! binary refused with a clear message, a program's own SIGSEGV and
//! SIGBUS handlers in both fault modes, locks beyond the budget or
//! `--memlock`, `malloc_usable_size` (also of a block from before the
//! space opened). The memory calls (`mmap`,
//! `munmap`, `mprotect`, `madvise`, `mincore`, `mlock*`, `mremap`, `msync`,
//! `syscall` for them): a C program and CPython's `mmap` module, each
//! compared with the same run without usermm, and threads mapping at once.
//!
//! The preload library is `target/release/libusermm_preload.so`, built by
//! `cargo build --release` (scripts/test.sh does it before the tests; `cargo
//! test` alone does not build a cdylib). A missing or stale library fails
//! the tests, saying so. The programs (`gcc` and `nm`, `python3`,
//! `sqlite3`, `redis-server`) are installed by scripts/test.sh; a missing
//! one fails.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

const BIN: &str = env!("CARGO_BIN_EXE_usermm");

/// A test's scratch directory, removed with what is in it when the test
/// ends (passed or failed).
struct TmpDir(PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(tag: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("usermm-run-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    TmpDir(d)
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for src in ["usermm-preload/src", "usermm/src"] {
        assert!(
            newest_source(&root.join(src)) <= built,
            "{} is older than crates/{src}: run `cargo build --release -p usermm-preload` first",
            lib.display()
        );
    }
}

fn usermm_run(args: &[&str]) -> Command {
    check_preload();
    let mut c = Command::new(BIN);
    c.arg("run").args(args);
    c
}

fn output(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"))
}

/// A program the test needs, in `$PATH` (scripts/test.sh installs it).
fn need(prog: &str) -> PathBuf {
    for p in ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"] {
        let c = Path::new(p).join(prog);
        if c.is_file() {
            return c;
        }
    }
    panic!("{prog} is not installed (scripts/test.sh installs it: apt-get install {prog})")
}

/// The `--stats` line of the process named `comm`: its `key=value` pairs.
fn stats(stderr: &str, comm: &str) -> HashMap<String, u64> {
    let tag = format!("({comm}): stats: ");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("usermm run: pid ") && l.contains(&tag))
        .unwrap_or_else(|| panic!("no stats line for {comm} on stderr:\n{stderr}"));
    let rest = &line[line.find(&tag).unwrap() + tag.len()..];
    rest.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("bad stats field {kv:?} in {line}"));
            (k.to_string(), v.parse().unwrap_or_else(|_| panic!("bad stats value {kv:?} in {line}")))
        })
        .collect()
}

fn assert_swapped(stderr: &str, comm: &str, budget: u64) -> HashMap<String, u64> {
    let s = stats(stderr, comm);
    assert_eq!(s["budget_bytes"], budget, "{s:?}");
    assert!(s["swapouts"] > 0 && s["swapins"] > 0, "{comm} did not swap: {s:?}");
    assert!(s["resident_bytes_max"] <= budget, "{comm} over its budget: {s:?}");
    assert_eq!(s["oom_sigbus"], 0, "{s:?}");
    s
}

/// Runs `exe` under `usermm run --budget 16m` with handler threads and with
/// `--inthread`: each run succeeds, prints `plain_out` (the plain run's
/// output) and swapped (process `comm`'s statistics).
fn same_as_plain_in_both_fault_modes(exe: &Path, comm: &str, plain_out: &str) {
    for mode in [None, Some("--inthread")] {
        let mut c = usermm_run(&["--budget", "16m", "--stats"]);
        c.args(mode).arg("--").arg(exe);
        let out = output(&mut c);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{mode:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert_eq!(stdout, plain_out, "{mode:?}\nstderr:\n{stderr}");
        assert_swapped(&stderr, comm, 16 << 20);
    }
}

fn gcc(dir: &Path, name: &str, src: &str, extra: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let exe = dir.join(name);
    let out = output(&mut {
        let mut g = Command::new(need("gcc"));
        g.args(["-O2", "-Wall", "-o"]).arg(&exe).arg(&c).args(extra);
        g
    });
    assert!(out.status.success(), "gcc {name}: {}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// A C working set of 4× the budget through every call of the malloc
/// family, each block checked after the others have pushed it out.
const WORKING_SET_C: &str = r#"
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 2048               /* blocks of 16 KiB (the heap's arenas): 32 MiB */
#define BIG 16               /* blocks of 2 MiB (regions of their own): 32 MiB */
static unsigned char *small[N], *big[BIG];

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 64) p[i] = (unsigned char)(seed * 31 + i / 64);
}
static int check(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 64) if (p[i] != (unsigned char)(seed * 31 + i / 64)) return 0;
    return 1;
}

int main(void) {
    for (int i = 0; i < N; i++) {
        small[i] = (i % 3 == 0) ? calloc(1, 16384) : malloc(16384);
        if (!small[i]) return 10;
        if (i % 3 == 0) for (int j = 0; j < 16384; j += 512) if (small[i][j]) return 11;
        fill(small[i], 16384, i);
    }
    for (int i = 0; i < BIG; i++) {
        void *p;
        if (posix_memalign(&p, 4096, 2 << 20) || ((uintptr_t)p & 4095)) return 12;
        big[i] = p;
        fill(big[i], 2 << 20, 5000 + i);
    }
    /* Grow every other small block (its bytes must follow it), free a quarter. */
    for (int i = 0; i < N; i += 2) {
        unsigned char *q = realloc(small[i], 24576);
        if (!q) return 13;
        small[i] = q;
        if (malloc_usable_size(q) < 24576) return 14;
    }
    for (int i = 0; i < N; i += 4) { free(small[i]); small[i] = NULL; }
    unsigned long sum = 0;
    for (int i = 0; i < N; i++) {
        if (!small[i]) continue;
        if (!check(small[i], 16384, i)) { printf("bad small %d\n", i); return 15; }
        sum += small[i][64];
    }
    for (int i = 0; i < BIG; i++) {
        if (!check(big[i], 2 << 20, 5000 + i)) { printf("bad big %d\n", i); return 16; }
        sum += big[i][4096];
        free(big[i]);
    }
    char *s = strdup("strdup'd"); /* the C library allocating on our behalf */
    printf("ok %lu %s\n", sum, s);
    free(s);
    for (int i = 0; i < N; i++) free(small[i]);
    return 0;
}
"#;

#[test]
fn a_c_program_4x_its_budget_swaps_and_reads_back_every_byte() {
    let dir = tmpdir("c");
    let exe = gcc(&dir, "ws", WORKING_SET_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let budget = 16u64 << 20;
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--verbose", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, String::from_utf8_lossy(&plain.stdout));
    assert!(stdout.starts_with("ok ") && stdout.contains("strdup'd"), "{stdout}");
    let s = assert_swapped(&stderr, "ws", budget);
    assert!(s["heap_arena_bytes"] >= 32 << 20, "{s:?}");
    assert!(stderr.contains("allocations: space="), "--verbose said nothing:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Four threads allocating, checking, growing and freeing each other's
/// blocks, small and large, about 3× the budget in all.
const THREADS_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define T 4
#define N 2048
static unsigned char *slots[T][N];
static size_t sizes[T][N];
static pthread_barrier_t bar;
static int bad;
static unsigned rnd(unsigned *s) { *s = *s * 1103515245 + 12345; return *s >> 8; }
static void *work(void *arg) {
    int t = (int)(long)arg;
    unsigned s = 1234 + t;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            size_t n = 64 + rnd(&s) % 8000;
            if (rnd(&s) % 50 == 0) n = 300000 + rnd(&s) % 100000;
            unsigned char *p = malloc(n);
            if (!p) { __sync_fetch_and_add(&bad, 1); return NULL; }
            memset(p, (t * 31 + i + round) & 0xff, n);
            slots[t][i] = p; sizes[t][i] = n;
        }
        pthread_barrier_wait(&bar);
        int o = (t + 1) % T;
        for (int i = 0; i < N; i++) {
            unsigned char *p = slots[o][i]; size_t n = sizes[o][i];
            unsigned char want = (o * 31 + i + round) & 0xff;
            if (p[0] != want || p[n / 2] != want || p[n - 1] != want) __sync_fetch_and_add(&bad, 1);
            if (i % 2) { p = realloc(p, n * 2); if (!p || p[n - 1] != want) __sync_fetch_and_add(&bad, 1); }
            free(p);
        }
        pthread_barrier_wait(&bar);
    }
    return NULL;
}
int main(void) {
    pthread_t th[T];
    pthread_barrier_init(&bar, NULL, T);
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    printf("bad %d\n", bad);
    return bad != 0;
}
"#;

/// Hung before `pthread_create` was wrapped: glibc `calloc`s a new thread's
/// TLS vector, which then lived on the space, was evicted, and was read by
/// `__tls_get_addr` in usermm's own code while it held the space's mm lock
/// that the fault handler needed.
#[test]
fn threads_allocating_and_freeing_each_others_blocks_4x_the_budget() {
    let dir = tmpdir("threads");
    let exe = gcc(&dir, "mt", THREADS_C, &["-pthread"]);
    let mut c = usermm_run(&["--budget", "16m", "--stats", "--"]);
    c.arg(&exe);
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("usermm run -- mt hung (4 minutes)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "bad 0\n");
    assert_swapped(&stderr, "mt", 16 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every memory call of a program on anonymous memory 4× the budget —
/// `mmap`, `munmap`, `mprotect`, `madvise`, `posix_madvise`, `mincore`,
/// `mlock`, `munlock`, `mremap`, `mlockall`, raw `syscall(SYS_mmap, …)`,
/// `syscall(SYS_mlock2, …)` and friends — with the results and errno values
/// it prints, which must be the same without usermm.
const MEMORY_CALLS_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1L << 20)
#define N (64 * MB) /* 4x the budget of the test */
#define P 4096L

static sigjmp_buf jb;
static void on_segv(int sig) { (void)sig; siglongjmp(jb, 1); }
/* 1 if a write to p faults */
static int write_faults(volatile char *p) {
    if (sigsetjmp(jb, 1)) return 1;
    *p = 1;
    return 0;
}
static void say(const char *what, long r) {
    if (r == -1) printf("%s: -1 %s\n", what, strerrorname_np(errno));
    else printf("%s: %ld\n", what, r);
    errno = 0;
}
/* The "Locked:" kB of the mapping that starts at a, from /proc/self/smaps
   (-1: no such mapping) */
static long smaps_locked_kb(void *a) {
    char line[512], start[32];
    long kb = -1;
    int in = 0;
    snprintf(start, sizeof start, "%lx-", (unsigned long)a);
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -2;
    while (fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, '-') < strchr(line, ' ') && line[0] != ' ')
            in = strncmp(line, start, strlen(start)) == 0;
        if (in && sscanf(line, "Locked: %ld kB", &kb) == 1) break;
    }
    fclose(f);
    return kb;
}

int main(void) {
    signal(SIGSEGV, on_segv);
    char *p = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    for (long i = 0; i < N / P; i++) { p[i * P] = (char)(i * 7 + 1); p[i * P + 100] = (char)i; }
    long bad = 0;
    for (long i = 0; i < N / P; i++) bad += p[i * P] != (char)(i * 7 + 1) || p[i * P + 100] != (char)i;
    printf("written and read back, bad %ld\n", bad);

    say("madvise DONTNEED", madvise(p, MB, MADV_DONTNEED));
    printf("after DONTNEED %d %d\n", p[0], p[MB - P]);
    say("madvise FREE", madvise(p + MB, MB, MADV_FREE));
    printf("after FREE ok %d\n", p[MB] == 0 || p[MB] == (char)(256 * 7 + 1));
    say("madvise bad advice", madvise(p, P, 12345));
    say("madvise unaligned", madvise(p + 1, P, MADV_NORMAL));
    say("posix_madvise WILLNEED", posix_madvise(p, MB, POSIX_MADV_WILLNEED));
    say("posix_madvise bad", posix_madvise(p, MB, 999));

    unsigned char vec[16];
    p[5 * MB] = 9;
    say("mincore", mincore(p + 5 * MB, P, vec));
    printf("mincore touched page resident %d\n", vec[0] & 1);
    say("mincore unaligned", mincore(p + 5 * MB + 1, P, vec));
    say("mincore into NULL", mincore(p + 5 * MB, P, NULL));
    unsigned char *ro = mmap(NULL, P, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    say("mincore into a read-only page", mincore(p + 5 * MB, P, ro));
    munmap(ro, P);

    say("mprotect READ", mprotect(p + 2 * MB, P, PROT_READ));
    printf("write to read-only faults %d, reads %d\n", write_faults(p + 2 * MB), p[2 * MB]);
    say("mprotect RW", mprotect(p + 2 * MB, P, PROT_READ | PROT_WRITE));
    printf("write to read-write faults %d\n", write_faults(p + 2 * MB));
    say("mprotect bad prot", mprotect(p, P, 0x100));

    say("mlock", mlock(p + 3 * MB + 5, 16 * P));
    say("munlock", munlock(p + 3 * MB, 16 * P));
    say("syscall mlock2 ONFAULT", syscall(SYS_mlock2, p + 3 * MB, 16 * P, MLOCK_ONFAULT));
    say("syscall mlock2 bad flags", syscall(SYS_mlock2, p + 3 * MB, P, 0x8));
    say("syscall munlock", syscall(SYS_munlock, p + 3 * MB, 16 * P));
    printf("locked range reads %d\n", p[3 * MB] == (char)(768 * 7 + 1));

    char *q = (char *)syscall(SYS_mmap, NULL, 4 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("syscall mmap ok %d\n", q != MAP_FAILED);
    memset(q, 0x5a, 4 * MB);
    printf("syscall mmap reads %d\n", q[4 * MB - 1] == 0x5a && q[0] == 0x5a);
    say("syscall msync", syscall(SYS_msync, q, P, MS_SYNC));
    say("syscall madvise DONTNEED", syscall(SYS_madvise, q, P, MADV_DONTNEED));
    printf("q[0] after DONTNEED %d\n", q[0]);
    say("syscall mprotect", syscall(SYS_mprotect, q, P, PROT_READ));
    say("syscall munmap", syscall(SYS_munmap, q, 4 * MB));
    say("syscall getpid is positive", syscall(SYS_getpid) > 0);

    /* mremap: grow (moving if need be), shrink, and the errors */
    char *r = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (long i = 0; i < MB; i += P) r[i] = (char)(i / P + 3);
    char *r2 = mremap(r, MB, 8 * MB, MREMAP_MAYMOVE);
    printf("mremap grow ok %d\n", r2 != MAP_FAILED);
    bad = 0;
    for (long i = 0; i < MB; i += P) bad += r2[i] != (char)(i / P + 3);
    for (long i = MB; i < 8 * MB; i += P) bad += r2[i] != 0;
    memset(r2 + MB, 7, 7 * MB);
    printf("mremap kept the bytes, bad %ld\n", bad);
    char *r3 = mremap(r2, 8 * MB, 2 * MB, 0);
    printf("mremap shrink in place %d, reads %d %d\n", r3 == r2, r3[0] == 3, r3[2 * MB - 1] == 7);
    printf("shrunk tail faults %d\n", write_faults(r3 + 2 * MB));
    errno = 0;
    say("mremap unaligned", (long)mremap(r3 + 1, P, 2 * P, MREMAP_MAYMOVE));
    say("mremap FIXED without MAYMOVE", (long)mremap(r3, P, 2 * P, MREMAP_FIXED, r3 + 4 * MB));
    /* MREMAP_DONTUNMAP: its errors, then a locked read-only source is left
       mapped, read-only and empty, its bytes at the new address */
    say("mremap DONTUNMAP without MAYMOVE", (long)mremap(r3, P, P, MREMAP_DONTUNMAP));
    say("mremap DONTUNMAP growing", (long)mremap(r3, P, 2 * P, MREMAP_DONTUNMAP | MREMAP_MAYMOVE));
    char *s = mmap(NULL, 4 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(s, 9, 4 * P);
    say("mlock source", mlock(s, 4 * P));
    say("mprotect source read-only", mprotect(s, 4 * P, PROT_READ));
    char *d = mremap(s, 4 * P, 4 * P, MREMAP_DONTUNMAP | MREMAP_MAYMOVE);
    printf("mremap DONTUNMAP moved %d, new reads %d %d, old reads %d %d, old write faults %d\n", d != MAP_FAILED && d != s,
           d[0] == 9, d[4 * P - 1] == 9, s[0] == 0, s[4 * P - 1] == 0, write_faults(s));
    say("munmap DONTUNMAP source", munmap(s, 4 * P));
    say("munmap DONTUNMAP target", munmap(d, 4 * P));
    say("munmap mremapped", munmap(r3, 2 * MB));

    /* holes and bad arguments */
    say("munmap middle", munmap(p + 10 * MB, MB));
    printf("unmapped faults %d\n", write_faults(p + 10 * MB));
    say("madvise over a hole", madvise(p + 9 * MB, 3 * MB, MADV_WILLNEED));
    say("mprotect over a hole", mprotect(p + 9 * MB, 3 * MB, PROT_READ | PROT_WRITE));
    say("mlock over a hole", mlock(p + 9 * MB, 3 * MB));
    say("mincore over a hole", mincore(p + 10 * MB, P, vec));
    say("msync over a hole", msync(p + 10 * MB, P, MS_ASYNC));
    say("munmap unaligned", munmap(p + 1, P));
    say("munmap zero length", munmap(p, 0));
    say("munmap hole again", munmap(p + 10 * MB, MB));

    /* the rest of the big mapping still reads back */
    bad = 0;
    for (long i = 12 * MB / P; i < N / P; i++) bad += p[i * P] != (char)(i * 7 + 1) || p[i * P + 100] != (char)i;
    printf("read back again, bad %ld\n", bad);

    /* a child that execs */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { execl("/bin/echo", "echo", "child ran", (char *)NULL); _exit(127); }
    int st;
    waitpid(pid, &st, 0);
    printf("child exit %d\n", WEXITSTATUS(st));
    say("munmap all", munmap(p, N));

    /* MAP_DROPPABLE memory (Linux 6.11) is never locked, by mlock or by
       mlockall(MCL_FUTURE); under usermm run it is the kernel's */
    char *dr = mmap(NULL, 2 * P, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | 0x08 /* MAP_DROPPABLE */, -1, 0);
    if (dr == MAP_FAILED) {
        say("mmap DROPPABLE", -1);
    } else {
        dr[0] = dr[P] = 1;
        say("mlock DROPPABLE", mlock(dr, 2 * P));
        printf("DROPPABLE locked kB %ld\n", smaps_locked_kb(dr));
        say("munmap DROPPABLE", munmap(dr, 2 * P));
        say("mlockall CURRENT|FUTURE", mlockall(MCL_CURRENT | MCL_FUTURE));
        dr = mmap(NULL, 2 * P, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | 0x08, -1, 0);
        dr[0] = dr[P] = 1;
        printf("DROPPABLE after MCL_FUTURE locked kB %ld\n", smaps_locked_kb(dr));
        say("munlockall", munlockall());
        say("munmap DROPPABLE", munmap(dr, 2 * P));
    }

    say("mlockall 0", mlockall(0));
    say("mlockall ONFAULT alone", mlockall(MCL_ONFAULT));
    say("mlockall CURRENT|ONFAULT", mlockall(MCL_CURRENT | MCL_ONFAULT));
    say("munlockall", munlockall());
    return 0;
}
"#;

/// The program's memory calls are the space's (issue 46): its anonymous
/// mapping 4× the budget swaps, and every call answers as the kernel does
/// for the same program. Its `MAP_DROPPABLE` mappings are the kernel's and
/// stay unlocked under `mlock` and `mlockall(MCL_FUTURE)`, as Linux leaves
/// them (later versions of the kernel selftest mlock2-tests check this;
/// 6.12's, which upstream_kernel_mm.rs builds, does not).
#[test]
fn a_c_programs_memory_calls_are_the_spaces_and_answer_as_the_kernel() {
    let dir = tmpdir("memcalls");
    let exe = gcc(&dir, "mc", MEMORY_CALLS_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout);
    assert!(plain_out.contains("read back again, bad 0\n"), "{plain_out}");
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--verbose", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, plain_out, "stderr:\n{stderr}");
    assert_swapped(&stderr, "mc", 16 << 20);
    let calls = memory_calls(&stderr, "mc");
    assert!(calls["space"] >= 30, "the space served too few calls: {calls:?}");
    assert_eq!(calls["kernel_usermm"] + calls["kernel_before_open"] + calls["refused_straddling"], 0, "{calls:?}");
    // The MAP_DROPPABLE mappings are the kernel's (not the space's EINVAL).
    assert!(calls["kernel_droppable"] >= 1, "{calls:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 71 item 4: `mseal` through `syscall()` (glibc has no wrapper) on
/// mapped and malloc'd memory: the calls that would change sealed memory
/// answer `EPERM` as the kernel does, the memory keeps its bytes and stays
/// writable, and a write after `MADV_DONTNEED` goes through (it hung).
const MSEAL_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
static long pg = 4096;
static void say(const char *what, long r) { printf("%s: %ld %s\n", what, r, r < 0 ? strerror(errno) : "ok"); }
static long seal(void *a, size_t len, unsigned long flags) { return syscall(462, a, len, flags); }
int main(void) {
    char *a = mmap(NULL, 16 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return 1;
    memset(a, 'a', 16 * pg);
    say("bad flags", seal(a, pg, 1));
    say("unaligned", seal(a + 1, pg, 0));
    say("seal [4,8)", seal(a + 4 * pg, 4 * pg, 0));
    say("munmap sealed", munmap(a + 5 * pg, pg));
    say("munmap all", munmap(a, 16 * pg));
    say("raw munmap", syscall(SYS_munmap, a + 4 * pg, 4 * pg));
    say("mprotect sealed", mprotect(a + 4 * pg, pg, PROT_READ));
    say("raw mprotect", syscall(SYS_mprotect, a + 6 * pg, pg, PROT_READ | PROT_WRITE));
    say("mremap shrink", (long)mremap(a + 4 * pg, 4 * pg, pg, 0));
    say("mremap move", (long)mremap(a + 4 * pg, pg, 8 * pg, MREMAP_MAYMOVE));
    void *f = mmap(a + 6 * pg, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    say("fixed over sealed", f == MAP_FAILED ? -1 : 0);
    f = (void *)syscall(SYS_mmap, a + 2 * pg, 4 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    say("raw fixed across", f == MAP_FAILED ? -1 : 0);
    printf("sealed bytes: %c %c\n", a[4 * pg], a[8 * pg - 1]);
    say("dontneed writable", madvise(a + 4 * pg, 2 * pg, MADV_DONTNEED));
    printf("after dontneed: %d %c\n", a[4 * pg], a[6 * pg]);
    a[4 * pg] = 'w';
    a[5 * pg + 9] = 'x';
    printf("written: %c %c\n", a[4 * pg], a[5 * pg + 9]);
    say("munmap unsealed", munmap(a + 12 * pg, 4 * pg));
    char *g = mmap(a + 12 * pg, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    say("fixed after it", g == MAP_FAILED ? -1 : (long)(g - a));

    char *r = mmap(NULL, 5 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED || munmap(r + 4 * pg, pg)) return 2;
    memset(r, 'r', 4 * pg);
    say("read-only", mprotect(r, 4 * pg, PROT_READ));
    say("seal read-only", seal(r, 4 * pg, 0));
    say("dontneed read-only", madvise(r, pg, MADV_DONTNEED));
    say("raw dontneed read-only", syscall(SYS_madvise, r + pg, pg, MADV_DONTNEED));
    say("free read-only", madvise(r, 4 * pg, MADV_FREE));
    say("cold read-only", madvise(r, 4 * pg, MADV_COLD));
    printf("read-only bytes: %c %c\n", r[0], r[4 * pg - 1]);
    say("gap", seal(r + 3 * pg, 2 * pg, 0));

    char *m = malloc(1 << 20);
    if (!m) return 3;
    memset(m, 'm', 1 << 20);
    char *in = (char *)(((unsigned long)m + pg - 1) & ~(pg - 1));
    say("seal malloc'd", seal(in, 16 * pg, 0));
    in[3] = 'M';
    printf("malloc'd: %c %c\n", in[3], in[16 * pg - 1]);
    say("dontneed malloc'd", madvise(in, pg, MADV_DONTNEED));
    in[0] = 'z';
    printf("malloc'd after: %c %d\n", in[0], in[1]);
    return 0;
}
"#;

#[test]
fn mseal_on_space_memory_answers_as_the_kernel() {
    let dir = tmpdir("mseal");
    let exe = gcc(&dir, "ms", MSEAL_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout);
    assert!(plain_out.contains("munmap sealed: -1 Operation not permitted\n"), "{plain_out}");
    // (Under `timeout`: a write after MADV_DONTNEED hung.)
    check_preload();
    let mut c = Command::new(need("timeout"));
    c.args(["60", BIN, "run", "--budget", "16m", "--stats", "--verbose", "--"]).arg(&exe);
    let out = output(c.stdin(Stdio::null()));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, plain_out, "stderr:\n{stderr}");
    let calls = memory_calls(&stderr, "ms");
    assert!(calls["space"] >= 20, "the space served too few calls: {calls:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `MAP_FIXED` mappings of every kind over an anonymous mapping (the
/// space's): a shared file window, a stack that grows down, a private file
/// copy. The kernel must never map inside the space's reservation, so each
/// is the space's; what the program sees must be what it sees without
/// usermm.
const FIXED_INSIDE_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long pg = 4096;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 4 * pg)) return 1;
    char *a = mmap(NULL, 16 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return 2;
    memset(a, 'a', 16 * pg);
    char *f = mmap(a + 2 * pg, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    printf("file window at +%ld: %d\n", f == MAP_FAILED ? -1L : (long)(f - a), f == MAP_FAILED ? -1 : f[0]);
    strcpy(f + pg, "through the window");
    if (msync(f, 4 * pg, MS_SYNC)) return 3;
    char buf[32] = {0};
    if (pread(fd, buf, 18, pg) != 18) return 4;
    printf("file reads: %s\n", buf);
    char *s = mmap(a + 8 * pg, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_GROWSDOWN, -1, 0);
    printf("stack at +%ld: %d\n", s == MAP_FAILED ? -1L : (long)(s - a), s == MAP_FAILED ? -1 : s[0]);
    s[pg] = 's';
    char *p = mmap(a + 12 * pg, pg, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, pg);
    printf("private copy at +%ld: %s\n", p == MAP_FAILED ? -1L : (long)(p - a), p == MAP_FAILED ? "" : p);
    printf("around: %c %c %c\n", a[pg], a[7 * pg], a[15 * pg]);
    if (munmap(a, 16 * pg)) return 5;
    return 0;
}
"#;

#[test]
fn fixed_mappings_of_any_kind_inside_the_reservation_are_the_spaces() {
    let dir = tmpdir("fixedinside");
    let exe = gcc(&dir, "fixedin", FIXED_INSIDE_C, &[]);
    let file = dir.join("window");
    let plain = output(Command::new(&exe).arg(&file));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout);
    assert!(plain_out.contains("file reads: through the window\n"), "{plain_out}");
    let out = output(usermm_run(&["--budget", "16m", "--verbose", "--"]).arg(&exe).arg(&file));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, plain_out, "stderr:\n{stderr}");
    let calls = memory_calls(&stderr, "fixedin");
    // The anonymous mapping and the three fixed ones, then msync and munmap.
    assert!(calls["space"] >= 6, "{calls:?}");
    assert_eq!(calls["kernel_file"] + calls["kernel_stack"], 0, "{calls:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file mapped at a hint (no `MAP_FIXED`), as LTP's `mmap16` does: at a
/// free hint it lands there and grows in place with `mremap` (flags 0),
/// the new pages the file's next ones; at a hint over an existing mapping
/// it lands elsewhere and the mapping keeps its bytes. The free hint is the
/// middle of an anonymous range just unmapped (inside the reservation under
/// `usermm run`).
const FILE_HINT_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define PG 4096
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    char buf[8 * PG];
    for (int i = 0; i < 8; i++) memset(buf + i * PG, 'a' + i, PG);
    if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf) { perror("file"); return 1; }
    // (stdout's buffer first: nothing is allocated between the free
    // range's unmap and the mremap.)
    printf("file at a hint\n");
    fflush(stdout);
    char *r = mmap(NULL, 16 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED || munmap(r, 16 * PG)) { perror("free range"); return 1; }
    char *hint = r + 4 * PG;
    char *p = mmap(hint, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap at hint"); return 1; }
    char first[64];
    snprintf(first, sizeof first, "free hint: %s, reads %c%c\n", p == hint ? "at the hint" : "elsewhere", p[0], p[PG]);
    memcpy(p, "hello", 5);
    char *q = mremap(p, 2 * PG, 4 * PG, 0);
    int e = errno;
    fputs(first, stdout);
    if (q == MAP_FAILED) {
        printf("mremap in place: %s\n", strerror(e));
        msync(p, 2 * PG, MS_SYNC);
    } else {
        printf("mremap in place: %s, reads %c%c%c\n", q == p ? "same address" : "moved", q[0], q[2 * PG], q[3 * PG]);
        q[3 * PG] = 'Z';
        msync(q, 4 * PG, MS_SYNC);
        munmap(q, 4 * PG);
    }
    char back[6] = {0}, z = 0;
    pread(fd, back, 5, 0);
    pread(fd, &z, 1, 3 * PG);
    printf("file: %s %c\n", back, z);
    char *m = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("anonymous"); return 1; }
    memset(m, 'x', 4 * PG);
    char *f = mmap(m + PG, 2 * PG, PROT_READ, MAP_SHARED, fd, 2 * PG);
    if (f == MAP_FAILED) { perror("mmap over a mapping"); return 1; }
    int intact = 1;
    for (int i = 0; i < 4 * PG; i++) intact &= m[i] == 'x';
    printf("taken hint: %s, reads %c%c, mapping %s\n", f == m + PG ? "at the hint" : "elsewhere", f[0], f[PG],
           intact ? "intact" : "changed");
    return 0;
}
"#;

#[test]
fn a_file_mapped_at_a_free_hint_lands_there_and_grows_in_place() {
    let dir = tmpdir("filehint");
    let exe = gcc(&dir, "filehint", FILE_HINT_C, &[]);
    let file = dir.join("data");
    let plain = output(Command::new(&exe).arg(&file));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(
        plain_out,
        "file at a hint\nfree hint: at the hint, reads ab\nmremap in place: same address, reads hcd\nfile: hello Z\n\
         taken hint: elsewhere, reads cZ, mapping intact\n"
    );
    let out = output(usermm_run(&["--budget", "16m", "--verbose", "--"]).arg(&exe).arg(&file));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, plain_out, "stderr:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Four threads mapping, touching, checking, lazily freeing and unmapping
/// anonymous memory at once (up to 28 MiB live under a 16 MiB budget),
/// then `mlockall(MCL_CURRENT)` over the space and the kernel's mappings.
const THREADS_MMAP_C: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
static int bad;
static void *work(void *a) {
    for (int i = 0; i < 48; i++) {
        size_t n = (1 + (i % 7)) << 20;
        unsigned char *p = mmap(NULL, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { __sync_fetch_and_add(&bad, 1); continue; }
        for (size_t j = 0; j < n; j += 4096) p[j] = (unsigned char)(j >> 12) + (long)a;
        for (size_t j = 0; j < n; j += 4096) if (p[j] != (unsigned char)((j >> 12) + (long)a)) __sync_fetch_and_add(&bad, 1);
        if (i % 3 == 0) madvise(p, n / 2, MADV_FREE);
        munmap(p, n);
    }
    return NULL;
}
int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    char *q = mmap(NULL, 1 << 20, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    q[0] = 1;
    int r = mlockall(MCL_CURRENT);
    int r2 = munlockall();
    printf("bad %d mlockall %d munlockall %d\n", bad, r, r2);
    return 0;
}
"#;

#[test]
fn threads_mapping_and_unmapping_at_once_under_the_budget() {
    let dir = tmpdir("mmap-threads");
    let exe = gcc(&dir, "tm", THREADS_MMAP_C, &["-pthread"]);
    let mut c = usermm_run(&["--budget", "16m", "--stats", "--verbose", "--"]);
    c.arg(&exe);
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("usermm run -- tm hung (2 minutes)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "bad 0 mlockall 0 munlockall 0\n");
    let s = stats(&stderr, "tm");
    assert!(s["swapouts"] > 0 && s["resident_bytes_max"] <= 16 << 20, "{s:?}");
    // The 1 MiB mapping `main` keeps (merged with the heap's arena when
    // the two are adjacent).
    assert!(s["regions"] >= 1, "{s:?}");
    assert!(memory_calls(&stderr, "tm")["space"] >= 4 * 48 * 2, "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `memory calls:` line of `--verbose` for `comm`.
fn memory_calls(stderr: &str, comm: &str) -> HashMap<String, u64> {
    let tag = format!("({comm}): memory calls: ");
    let line = stderr
        .lines()
        .find(|l| l.contains(&tag))
        .unwrap_or_else(|| panic!("no memory calls line for {comm} on stderr:\n{stderr}"));
    line[line.find(&tag).unwrap() + tag.len()..]
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Python's standard library: `mmap.mmap` of anonymous memory 4× the
/// budget, `madvise`, `resize` (an `mremap`), answering as without usermm.
#[test]
fn cpython_mmap_and_madvise_4x_the_budget_answer_as_without_usermm() {
    let py = need("python3");
    let script = r#"
import mmap
n = 64 << 20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)
val = lambda i: (i // 4096 * 7 + 1) & 255
for i in range(0, n, 4096):
    m[i] = val(i)
m.madvise(mmap.MADV_DONTNEED, 0, 1 << 20)
print("dontneed", m[0], m[4096], m[1 << 20] == val(1 << 20))
m.madvise(mmap.MADV_FREE, 1 << 20, 1 << 20)
m.madvise(mmap.MADV_WILLNEED, 2 << 20, 1 << 20)
try:
    m.madvise(mmap.MADV_DONTNEED, 1, 4096)
except OSError as e:
    print("unaligned errno", e.errno)
print("bad", sum(1 for i in range(2 << 20, n, 4096) if m[i] != val(i)))
m.resize(n + (8 << 20))
print("resized", len(m), sum(1 for i in range(2 << 20, n, 4096) if m[i] != val(i)), m[n + 4096])
m.close()
"#;
    let plain = output(Command::new(&py).args(["-c", script]));
    assert!(plain.status.success(), "{plain:?}");
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--verbose", "--"]).arg(&py).args(["-c", script]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, String::from_utf8_lossy(&plain.stdout));
    assert!(stdout.contains("bad 0\n"), "{stdout}");
    assert_swapped(&stderr, "python3", 16 << 20);
    assert!(memory_calls(&stderr, "python3")["space"] >= 5, "{stderr}");
}

/// A wrapper script in front of the program (pyenv's `python3` shim is
/// one): the shell forks for `$(…)` and pipelines and its children run on
/// its heap, so the shell keeps the C library's; the program it execs gets
/// a space and swaps.
#[test]
fn a_shell_wrapper_that_forks_then_execs_cpython_4x_its_budget() {
    let py = need("python3");
    let dir = tmpdir("wrapper");
    let wrapper = dir.join("python3");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/bash\nset -e\nname=\"$(basename \"$0\")\"\nver=$(echo 3 | tr -d '\\n')\n[ \"$name$ver\" = python33 ]\nexec {} \"$@\"\n",
            py.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = "n = 64 * 1024\nd = {i: (b'%08d' % i) * 128 for i in range(n)}\n\
                  print('ok' if all(d[i][:8] == b'%08d' % i for i in range(n)) else 'BAD', len(d))\n";
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--"]).arg(&wrapper).args(["-c", script]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "ok 65536\n", "{stderr}");
    assert!(!stderr.contains("touched its parent's heap"), "{stderr}");
    assert_swapped(&stderr, "python3", 16 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cpython_builds_and_checks_a_dict_4x_its_budget() {
    let py = need("python3");
    // 64 Ki values of 1 KiB (64 MiB) in a dict, half of them again in a list.
    let script = r#"
n = 64 * 1024
d = {i: (b"%08d" % i) * 128 for i in range(n)}
lst = [d[i] for i in range(0, n, 2)]
ok = all(d[i][:8] == b"%08d" % i and len(d[i]) == 1024 for i in range(n))
ok = ok and all(v[:8] == b"%08d" % (2 * j) for j, v in enumerate(lst))
print("ok" if ok else "BAD", len(d), len(lst))
"#;
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--"]).arg(&py).args(["-c", script]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "ok 65536 32768\n");
    assert_swapped(&stderr, "python3", 16 << 20);
}

#[test]
fn the_sqlite_shell_answers_as_without_usermm_on_a_database_larger_than_the_budget() {
    let sqlite = need("sqlite3");
    let dir = tmpdir("sqlite");
    let db = dir.join("t.db");
    // About 24 MiB of rows and an index, built without usermm.
    let make = "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 20000)
        INSERT INTO t SELECT i, printf('key%08d', (i*7919) % 20000), zeroblob(1000) || randomblob(100) FROM c;
        CREATE INDEX tk ON t(k);";
    let out = output(&mut {
        let mut c = Command::new(&sqlite);
        c.arg(&db).arg(make);
        c
    });
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::metadata(&db).unwrap().len() > 20 << 20);
    // A page cache of 64 MiB: the whole database ends up in the heap.
    let query = "PRAGMA cache_size=-65536;
        PRAGMA integrity_check;
        SELECT count(*), sum(length(v)), min(k), max(k), hex(md5) FROM t, (SELECT sum(id * length(v)) AS md5 FROM t);
        SELECT k, hex(substr(v, 1001, 4)) FROM t ORDER BY k LIMIT 3 OFFSET 10000;
        SELECT count(*) FROM t a JOIN t b ON a.k = b.k WHERE a.id % 3 = 0;
        SELECT sum(length(v)) FROM t WHERE id % 2 = 0;";
    let run = |c: &mut Command| output(c.arg(&db).arg(query));
    let plain = run(&mut Command::new(&sqlite));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(plain_out.starts_with("ok\n20000|"), "{plain_out}");
    let mut c = usermm_run(&["--budget", "8m", "--stats", "--"]);
    c.arg(&sqlite);
    let out = run(&mut c);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), plain_out, "stderr:\n{stderr}");
    assert_swapped(&stderr, "sqlite3", 8 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `speedtest1` of SQLite built as upstream's configure builds it on glibc,
/// so that SQLite asks `malloc_usable_size` for every block's size. The
/// source tree is Debian's source package `sqlite3` without Debian's patches
/// (which take `malloc_usable_size` out), configured and with its
/// amalgamation made by `scripts/install-deps.sh` (`usermm_sqlite_source`,
/// which `scripts/test.sh` runs) in `target/upstream/sqlite3-VERSION`, or in
/// `$USERMM_SQLITE_SRC`. Compiled as upstream's `make speedtest1` does, once
/// into the target directory and again when the tree is newer.
fn speedtest1() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = sqlite_source();
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(src.file_name().unwrap());
            std::fs::create_dir_all(&dir).unwrap();
            let exe = dir.join("speedtest1");
            let fresh = std::fs::metadata(&exe).and_then(|m| m.modified()).is_ok_and(|t| {
                std::fs::metadata(src.join("sqlite3.c")).and_then(|m| m.modified()).is_ok_and(|s| t >= s)
            });
            if !fresh {
                let tmp = dir.join(format!("speedtest1.{}", std::process::id()));
                let out = output(&mut {
                    let mut g = Command::new(need("gcc"));
                    g.current_dir(&src)
                        .args(["-O2", "-I.", "-D_HAVE_SQLITE_CONFIG_H", "-DBUILD_sqlite", "-DNDEBUG"])
                        .args(["-DSQLITE_THREADSAFE=1", "-DSQLITE_OS_KV_OPTIONAL", "-o"])
                        .arg(&tmp)
                        .args(["test/speedtest1.c", "sqlite3.c", "-lm", "-lpthread"]);
                    g
                });
                assert!(out.status.success(), "gcc speedtest1: {}", String::from_utf8_lossy(&out.stderr));
                std::fs::rename(&tmp, &exe).unwrap();
            }
            // The point of this build: SQLite sizes its blocks with
            // malloc_usable_size (Debian's libsqlite3 does not).
            let nm = output(Command::new(need("nm")).args(["-D", "--undefined-only"]).arg(&exe));
            assert!(nm.status.success(), "{nm:?}");
            assert!(
                String::from_utf8_lossy(&nm.stdout).contains("malloc_usable_size"),
                "speedtest1 does not call malloc_usable_size:\n{}",
                String::from_utf8_lossy(&nm.stdout)
            );
            exe
        })
        .clone()
}

/// The SQLite source tree `usermm_sqlite_source` (scripts/install-deps.sh)
/// prepared: `$USERMM_SQLITE_SRC`, or the one `target/upstream/sqlite3-*`.
fn sqlite_source() -> PathBuf {
    let ready = |d: &Path| ["sqlite3.c", "sqlite_cfg.h", "test/speedtest1.c"].iter().all(|f| d.join(f).is_file());
    if let Some(d) = std::env::var_os("USERMM_SQLITE_SRC") {
        let d = PathBuf::from(d);
        assert!(ready(&d), "USERMM_SQLITE_SRC={}: no configured SQLite tree there", d.display());
        return d;
    }
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/upstream");
    let found = std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("sqlite3-")) && ready(p));
    found.unwrap_or_else(|| {
        panic!(
            "no SQLite source tree in {}: run `. scripts/install-deps.sh; usermm_sqlite_source target/upstream` \
             (scripts/test.sh does) to fetch Debian's sqlite3 source package and configure it",
            base.display()
        )
    })
}

/// The `Verification Hash: …` line `speedtest1 --verify` ends with (after
/// its timings, which differ from run to run).
fn verification_hash(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
        .lines()
        .find(|l| l.starts_with("Verification Hash: "))
        .unwrap_or_else(|| panic!("no verification hash:\n{stdout}\nstderr:\n{stderr}"))
        .to_string()
}

/// Issue 46: SQLite's own benchmark, unmodified, its database in memory
/// (`--memdb`: every page in the heap, blocks of every size allocated,
/// grown with `realloc` and sized with `malloc_usable_size` all along),
/// under a budget of about a quarter of its working set: the same
/// verification hash as without usermm, having swapped; and again with
/// faults resolved in the faulting thread.
#[test]
fn sqlite_speedtest1_with_malloc_usable_size_a_quarter_of_its_working_set() {
    let exe = speedtest1();
    let args = |size: &str| ["--memdb", "--size", size, "--verify"].map(String::from);
    for (size, budget, mode) in [("50", 10u64 << 20, None), ("25", 5 << 20, Some("--inthread"))] {
        let plain = verification_hash(&output(Command::new(&exe).args(args(size))));
        // The working set: the space's peak with a budget that holds it all.
        let out = output(usermm_run(&["--budget", "1g", "--stats", "--"]).arg(&exe).args(args(size)));
        assert_eq!(verification_hash(&out), plain);
        let peak = stats(&String::from_utf8_lossy(&out.stderr), "speedtest1")["resident_bytes_max"];
        // (About 3.6×: 38 MB at --size 50, 18.6 MB at 25.)
        assert!(peak >= 3 * budget, "speedtest1 --size {size} peaked at {peak} bytes: not 3x {budget}");
        let mut c = usermm_run(&["--budget", &budget.to_string(), "--stats"]);
        c.args(mode).arg("--");
        if mode.is_some() {
            // In-thread faults: a `write(2)` from a heap page that is not
            // resident fails with `EFAULT` (the mode's documented deviation:
            // the kernel's own access raises no signal), and stdout's
            // buffer is on the heap: its last flush lost the hash in about
            // one run in ten. Unbuffered (coreutils' `stdbuf`), `printf`
            // writes from the stack.
            c.args(["stdbuf", "-o0"]);
        }
        c.arg(&exe).args(args(size));
        let out = output(&mut c);
        assert_eq!(verification_hash(&out), plain, "{mode:?}");
        assert_swapped(&String::from_utf8_lossy(&out.stderr), "speedtest1", budget);
    }
}

/// A shared library whose constructor allocates before the preload's
/// constructor has opened the space (the dynamic loader runs a program's
/// libraries' constructors first).
const EARLY_LIB_C: &str = r#"
#include <stdlib.h>
#include <string.h>
void *early_block;
__attribute__((constructor)) static void early(void) { early_block = malloc(100); memset(early_block, 7, 100); }
"#;

/// `malloc_usable_size` as SQLite's `mem1.c` uses it: every byte up to it
/// written, then `realloc` past it and back, the bytes kept; for every
/// allocation call, and for a block from before the space opened.
const USABLE_SIZE_C: &str = r#"
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern void *early_block;
int main(void) {
    long bad = 0;
    size_t u = malloc_usable_size(early_block);
    bad += u < 100 || ((char *)early_block)[99] != 7;
    memset(early_block, 1, u);
    char *e = realloc(early_block, 5000);
    bad += !e || e[u - 1] != 1 || malloc_usable_size(e) < 5000;
    free(e);
    for (size_t n = 0; n < 600000; n = n * 3 / 2 + 1) {
        for (int k = 0; k < 4; k++) {
            unsigned char *p = k == 0 ? malloc(n) : k == 1 ? calloc(1, n) : k == 2 ? memalign(64, n) : aligned_alloc(4096, n);
            if (!p) { bad++; continue; }
            size_t us = malloc_usable_size(p);
            bad += us < n;
            memset(p, 0xab, us);
            unsigned char *q = realloc(p, us + 17);
            if (!q) { bad++; continue; }
            bad += malloc_usable_size(q) < us + 17;
            for (size_t i = 0; i < us; i += 97) bad += q[i] != 0xab;
            size_t half = us / 2 + 1;
            q = realloc(q, half);
            if (!q) { bad++; continue; }
            bad += malloc_usable_size(q) < half;
            for (size_t i = 0; i < half && i < us; i += 97) bad += q[i] != 0xab;
            free(q);
        }
    }
    printf("bad %ld\n", bad);
    return 0;
}
"#;

#[test]
fn malloc_usable_size_is_usable_for_every_call_and_a_block_from_before_the_space() {
    let dir = tmpdir("usable");
    let lib = dir.join("libearly.so");
    let so = gcc(&dir, "early", EARLY_LIB_C, &["-shared", "-fPIC"]);
    std::fs::rename(&so, &lib).unwrap();
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = gcc(&dir, "usable", USABLE_SIZE_C, &["-L", dir.to_str().unwrap(), "-learly", &rpath]);
    let plain = output(&mut Command::new(&exe));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "bad 0\n", "{plain:?}");
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--verbose", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "bad 0\n", "stderr:\n{stderr}");
    // The early block was the C library's; the rest the space's.
    let line = stderr.lines().find(|l| l.contains("(usable): allocations: ")).unwrap_or_else(|| panic!("{stderr}"));
    let count = |k: &str| -> u64 {
        let v = line.split_whitespace().find_map(|kv| kv.strip_prefix(k)).unwrap_or_else(|| panic!("{line}"));
        v.parse().unwrap()
    };
    assert!(count("libc_before_open=") >= 1 && count("space=") >= 100, "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One RESP request and its reply line (and bulk body, if any).
fn redis_call(r: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Vec<u8> {
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    r.get_mut().write_all(&req).unwrap();
    redis_reply(r)
}

fn redis_reply(r: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    if let Some(n) = line.strip_prefix('$') {
        let n: i64 = n.trim().parse().unwrap();
        if n < 0 {
            return b"(nil)".to_vec();
        }
        let mut body = vec![0u8; n as usize + 2];
        r.read_exact(&mut body).unwrap();
        body.truncate(n as usize);
        return body;
    }
    line.trim_end().as_bytes().to_vec()
}

/// Starts `redis-server` under `usermm run` with a 16 MiB budget, its RDB
/// file in `dir`, and connects to it.
fn start_redis(dir: &Path) -> (std::process::Child, BufReader<TcpStream>) {
    let server = need("redis-server");
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut c = usermm_run(&["--budget", "16m", "--stats", "--"]);
    c.arg(&server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    let conn = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                let _ = child.kill();
                panic!("redis-server under usermm run did not listen on {port}: {e}")
            }
        }
    };
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    (child, BufReader::new(conn))
}

/// A Redis server 4× its budget; then `BGSAVE` (its forked child writes
/// the data set from its copy of the space while the parent overwrites a
/// fifth of it), and a second server started from the RDB file has every
/// key as of the fork.
#[test]
fn a_redis_server_keeps_values_4x_its_budget_and_bgsave_writes_every_one() {
    let dir = tmpdir("redis");
    let (child, mut r) = start_redis(&dir);
    // 16 Ki values of 4 KiB: 64 MiB.
    let value = |i: usize| format!("{i:08}").repeat(512).into_bytes();
    let n = 16 * 1024;
    for i in 0..n {
        assert_eq!(redis_call(&mut r, &[b"SET", format!("k{i}").as_bytes(), &value(i)]), b"+OK");
    }
    for i in (0..n).step_by(5) {
        assert!(redis_call(&mut r, &[b"GET", format!("k{i}").as_bytes()]) == value(i), "value {i} differs");
    }
    assert_eq!(redis_call(&mut r, &[b"DBSIZE"]), format!(":{n}").as_bytes());
    // The fork happens before the reply: what is written after it is not
    // in the file.
    assert_eq!(redis_call(&mut r, &[b"BGSAVE"]), b"+Background saving started");
    for i in (0..n).step_by(5) {
        assert_eq!(redis_call(&mut r, &[b"SET", format!("k{i}").as_bytes(), b"after the fork"]), b"+OK");
    }
    let t0 = Instant::now();
    let persistence = loop {
        let info = String::from_utf8_lossy(&redis_call(&mut r, &[b"INFO", b"persistence"])).into_owned();
        if info.contains("rdb_bgsave_in_progress:0") {
            break info;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "BGSAVE still running after 120 s:\n{info}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(persistence.contains("rdb_last_bgsave_status:ok"), "{persistence}");
    assert!(redis_call(&mut r, &[b"GET", b"k0"]) == b"after the fork");
    let _ = redis_call(&mut r, &[b"SHUTDOWN", b"NOSAVE"]);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert_swapped(&stderr, "redis-server", 16 << 20);
    assert!(!stderr.contains("is not copied"), "{stderr}");
    // A server started from the file has every key as of the fork.
    let (child, mut r) = start_redis(&dir);
    assert_eq!(redis_call(&mut r, &[b"DBSIZE"]), format!(":{n}").as_bytes());
    let bad: Vec<usize> =
        (0..n).filter(|&i| redis_call(&mut r, &[b"GET", format!("k{i}").as_bytes()]) != value(i)).collect();
    assert!(bad.is_empty(), "{} keys differ from the RDB file, the first {:?}", bad.len(), &bad[..bad.len().min(8)]);
    let _ = redis_call(&mut r, &[b"SHUTDOWN", b"NOSAVE"]);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program with SIGSEGV and SIGBUS handlers of its own (`sigaction`, then
/// `signal`), which leave a bad access with `siglongjmp`, and a heap 4× the
/// budget. Unbuffered stdout: with `--inthread`, the exit's `write` of an
/// evicted stdio buffer fails (`EFAULT`, docs/design.md).
const SIGNALS_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static sigjmp_buf jb;
static volatile sig_atomic_t segvs, buses, plain_buses;
static void *volatile last;
static void on_segv(int sig, siginfo_t *si, void *uc) { (void)sig; (void)uc; segvs++; last = si->si_addr; siglongjmp(jb, 1); }
static void on_bus(int sig, siginfo_t *si, void *uc) { (void)sig; (void)uc; buses++; last = si->si_addr; siglongjmp(jb, 2); }
static void on_bus_plain(int sig) { (void)sig; plain_buses++; siglongjmp(jb, 3); }

enum { N = 4096, SZ = 16384 };  /* 64 MiB of heap blocks */
static unsigned char *b[N];
static long check(void) {
    long bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < SZ; j += 512) bad += b[i][j] != (unsigned char)(i * 13 + j / 512);
    return bad;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = on_segv;
    if (sigaction(SIGSEGV, &sa, NULL)) return 10;
    sa.sa_sigaction = on_bus;
    if (sigaction(SIGBUS, &sa, NULL)) return 11;
    if (sigaction(SIGBUS, NULL, &old) || old.sa_sigaction != on_bus) return 12;
    for (int i = 0; i < N; i++) {
        if (!(b[i] = malloc(SZ))) return 13;
        for (int j = 0; j < SZ; j += 512) b[i][j] = (unsigned char)(i * 13 + j / 512);
    }
    printf("heap bad %ld\n", check());

    /* A write to a read-only page: the program's SIGSEGV handler. */
    char *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ro == MAP_FAILED) return 14;
    if (sigsetjmp(jb, 1) == 0) { ro[0] = 1; printf("no SIGSEGV\n"); }
    printf("SIGSEGV %d at the page %d\n", (int)segvs, last == ro);

    /* A touch past a file's end: the program's SIGBUS handler. */
    char path[] = "/tmp/usermm-run-sig-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 15;
    unlink(path);
    if (ftruncate(fd, 100)) return 16;
    char *f = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED) return 17;
    if (sigsetjmp(jb, 1) == 0) printf("past the end reads %d\n", f[4096]);
    printf("SIGBUS %d at the page %d\n", (int)buses, last == f + 4096);
    printf("heap bad %ld\n", check());

    /* The same with signal(), which answers with the handler before it. */
    if (signal(SIGBUS, on_bus_plain) != (void (*)(int))on_bus) return 18;
    if (sigsetjmp(jb, 1) == 0) printf("past the end reads %d\n", f[4100]);
    printf("signal() SIGBUS %d\n", (int)plain_buses);
    printf("heap bad %ld\n", check());
    if (signal(SIGBUS, SIG_DFL) != on_bus_plain) return 19;
    for (int i = 0; i < N; i++) free(b[i]);
    return 0;
}
"#;

/// A program's own SIGSEGV and SIGBUS handlers get the program's signals
/// and nothing of the space's, in both fault modes: the same output as
/// without usermm. With `--inthread` every fault on the space is a SIGBUS,
/// and the program's `sigaction`/`signal` for it replaced usermm's handler
/// before they were wrapped: the first fault went to the program's handler,
/// whose `siglongjmp` (its jump buffer not yet set) crashed the program.
#[test]
fn a_programs_own_sigsegv_and_sigbus_handlers_work_in_both_fault_modes() {
    let dir = tmpdir("signals");
    let exe = gcc(&dir, "sig", SIGNALS_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert_eq!(
        plain_out,
        "heap bad 0\nSIGSEGV 1 at the page 1\nSIGBUS 1 at the page 1\nheap bad 0\nsignal() SIGBUS 1\nheap bad 0\n"
    );
    same_as_plain_in_both_fault_modes(&exe, "sig", &plain_out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A JIT's code pages: eight functions written into an anonymous mapping
/// (`lea eax, [rdi + 1000 k]; ret`, one a page), made exec-only
/// (`PROT_EXEC` alone), then called between rounds that write 32 MiB of
/// data, 4× the budget under `usermm run`, so the code is evicted and its
/// calls fault it back. It prints the sum of the calls, the data read back
/// and one byte loaded from a code page (the host decides whether an
/// exec-only page can be read: with protection keys the load is SIGSEGV,
/// and the exit status says so), and on stderr how many times a code page
/// was found not resident before its call.
const JIT_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#define P 4096L
#define FUNCS 8
#define DATA (32L << 20)
#define ROUNDS 6
typedef int (*fn)(int);
int main(void) {
    unsigned char *code = mmap(NULL, FUNCS * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *d = mmap(NULL, DATA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED || d == MAP_FAILED) return 10;
    for (int k = 0; k < FUNCS; k++) {
        unsigned char *f = code + k * P;
        int disp = 1000 * k;
        f[0] = 0x8d; f[1] = 0x87; memcpy(f + 2, &disp, 4); f[6] = 0xc3;
    }
    if (mprotect(code, FUNCS * P, PROT_EXEC)) return 11;
    long sum = 0, absent = 0, bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (long i = 0; i < DATA; i += P) d[i] = (unsigned char)(i / P + r);
        for (int k = 0; k < FUNCS; k++) {
            unsigned char v = 0;
            if (mincore(code + k * P, P, &v)) return 12;
            absent += !(v & 1);
            sum += ((fn)(code + k * P))(r);
        }
        for (long i = 0; i < DATA; i += P) bad += d[i] != (unsigned char)(i / P + r);
    }
    printf("sum %ld, data bad %ld\n", sum, bad);
    fprintf(stderr, "code pages absent before a call: %ld\n", absent);
    fflush(stdout);
    printf("code byte %#x\n", *(volatile unsigned char *)code);
    return sum == 28000L * ROUNDS + 8L * 15 && bad == 0 ? 0 : 1;
}
"#;

/// Issue 71 item 3: a JIT's exec-only code pages are evicted under the
/// budget and served again by its calls, in both fault modes and with the
/// frame pool: output and exit status as without usermm, and the code was
/// really out of memory before some call.
#[test]
fn a_jits_exec_only_code_is_evicted_and_runs_again() {
    let dir = tmpdir("jit");
    let exe = gcc(&dir, "jit", JIT_C, &[]);
    let plain = output(&mut Command::new(&exe));
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(plain_out.starts_with("sum 168120, data bad 0\n"), "{plain:?}");
    for mode in [None, Some("--inthread"), Some("--frame-pool")] {
        let mut c = usermm_run(&["--budget", "8m", "--stats"]);
        c.args(mode).arg("--").arg(&exe);
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                panic!("{mode:?}: usermm run -- jit hung (2 minutes)");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.to_string(), plain.status.to_string(), "{mode:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert_eq!(stdout, plain_out, "{mode:?}\nstderr:\n{stderr}");
        let absent: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("code pages absent before a call: "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{mode:?}: no count on stderr:\n{stderr}"));
        assert!(absent > 0, "{mode:?}: the code was never evicted\nstderr:\n{stderr}");
        assert_swapped(&stderr, "jit", 8 << 20);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mincore` with a bad vector (issue 71 item 7): NULL, read-only,
/// `PROT_NONE` or unmapped (also past its first bytes), past the address
/// space, over mapped
/// pages, holes and both. Linux checks the address (`EINVAL`), the range and
/// the vector's place (`access_ok`), then walks region by region, copying
/// each region's bytes out (`EFAULT`) before it looks past it (`ENOMEM`).
/// The bytes a partly valid vector got are printed too.
///
/// ```text
///   A A A A . . . . B B      (A: 4 pages, a hole of 4, B: 2 pages)
/// ```
const MINCORE_VEC_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#define P 4096L
static unsigned char *ok_end; /* the last bytes of a writable page, a PROT_NONE page after it */
static void t(const char *what, void *a, size_t l, void *v) {
    int partly = v == ok_end - 2 || v == ok_end - 8;
    if (partly)
        memset(ok_end - 8, 0x55, 8);
    errno = 0;
    int r = mincore(a, l, v);
    printf("%-40s %s", what, r == 0 ? "ok" : strerrorname_np(errno));
    if (partly)
        for (int i = 8; i > 0; i--)
            printf(" %x", ok_end[-i]);
    printf("\n");
}
int main(void) {
    /* (No allocation after the hole is made: nothing may be mapped there.) */
    static char out[1 << 16];
    setvbuf(stdout, out, _IOFBF, sizeof out);
    char *b = mmap(NULL, 10 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *w = mmap(NULL, 2 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED || w == MAP_FAILED) return 10;
    /* Linux's residency (no fault-around) */
    if (madvise(b, 10 * P, MADV_RANDOM)) return 14;
    if (munmap(b + 4 * P, 4 * P) || mprotect(w + P, P, PROT_NONE)) return 11;
    b[0] = 1; b[8 * P] = 1;
    ok_end = w + P;
    void *kernel = (void *)0xffff800000000000UL;
    t("NULL over A", b, 4 * P, NULL);
    t("NULL over part of A", b + P, P, NULL);
    t("NULL over A and the hole", b, 6 * P, NULL);
    t("NULL over A, the hole and B", b, 10 * P, NULL);
    t("NULL over the hole", b + 4 * P, P, NULL);
    t("NULL over the hole and B", b + 4 * P, 6 * P, NULL);
    t("NULL, len 0", b, 0, NULL);
    t("NULL, len 0 in the hole", b + 4 * P, 0, NULL);
    t("NULL, unaligned", b + 1, P, NULL);
    t("NULL, unaligned in the hole", b + 4 * P + 1, P, NULL);
    t("kernel vec over A", b, P, kernel);
    t("kernel vec over the hole", b + 4 * P, P, kernel);
    t("kernel vec, len 0", b, 0, kernel);
    t("2 valid over A", b, 4 * P, ok_end - 2);
    t("2 valid over A and the hole", b, 6 * P, ok_end - 2);
    t("8 valid over A and the hole", b, 6 * P, ok_end - 8);
    t("2 valid over B", b + 8 * P, 2 * P, ok_end - 2);
    t("2 valid over the hole and B", b + 4 * P, 6 * P, ok_end - 2);
    if (mprotect(w, P, PROT_READ)) return 12;
    t("read-only vec over A", b, P, w);
    t("read-only vec over A and the hole", b, 6 * P, w);
    t("read-only vec over the hole", b + 4 * P, P, w);
    if (mprotect(w, P, PROT_READ | PROT_WRITE)) return 13;
    t("PROT_NONE vec over A", b, P, w + P);
    t("PROT_NONE vec over the hole", b + 4 * P, P, w + P);
    if (munmap(w + P, P)) return 15;
    t("unmapped vec over A", b, P, w + P);
    return 0;
}
"#;

/// Issue 71 item 7: `mincore` with a bad vector answers under `usermm run`
/// (the preload's route to the space) as the kernel answers the same
/// program, errno and bytes written.
#[test]
fn mincore_with_a_bad_vector_answers_as_the_kernel() {
    let dir = tmpdir("mincore-vec");
    let exe = gcc(&dir, "mcv", MINCORE_VEC_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    for mode in [None, Some("--inthread")] {
        let mut c = usermm_run(&["--budget", "16m", "--verbose"]);
        c.args(mode).arg("--").arg(&exe);
        let out = output(&mut c);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{mode:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert_eq!(stdout, plain_out, "{mode:?}\nstderr:\n{stderr}");
        let calls = memory_calls(&stderr, "mcv");
        assert!(calls["space"] >= 20, "{mode:?}: the space served too few calls: {calls:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Locks of more than the budget (or `--memlock`) holds: each call's errno.
const LOCKS_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
static void say(const char *what, int r) { printf("%s: %s\n", what, r == 0 ? "ok" : strerrorname_np(errno)); }
int main(void) {
    size_t n = 32 << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 10;
    memset(p, 1, n);
    say("mlock 32m", mlock(p, n));
    say("mlock 1m", mlock(p, 1 << 20));
    say("mlock2 ONFAULT 32m", mlock2(p, n, MLOCK_ONFAULT));
    say("munlock", munlock(p, n));
    say("mlockall CURRENT", mlockall(MCL_CURRENT));
    say("munlockall", munlockall());
    long bad = 0;
    for (size_t i = 0; i < n; i += 4096) bad += p[i] != 1;
    printf("reads back, bad %ld\n", bad);
    return 0;
}
"#;

/// A program that locks more than its budget holds gets `EAGAIN` from
/// `mlock`/`mlockall(MCL_CURRENT)` (the space's deliberate deviation,
/// docs/design.md: Linux would lock while RAM lasts), and goes on; under
/// `--memlock`, Linux's `RLIMIT_MEMLOCK` errnos (`ENOMEM`; `EPERM` for a
/// limit of 0). A lock on fault locks only what is touched, so it is taken.
#[test]
fn locks_beyond_the_budget_or_the_memlock_limit_fail_with_linuxs_errno() {
    let dir = tmpdir("locks");
    let exe = gcc(&dir, "locks", LOCKS_C, &[]);
    for (opts, want) in [
        (&["--budget", "16m"][..], ["EAGAIN", "ok", "ok", "ok", "EAGAIN", "ok"]),
        (&["--budget", "64m", "--memlock", "8m"][..], ["ENOMEM", "ok", "ENOMEM", "ok", "ENOMEM", "ok"]),
        (&["--budget", "64m", "--memlock", "0"][..], ["EPERM", "EPERM", "EPERM", "ok", "EPERM", "ok"]),
    ] {
        let out = output(usermm_run(opts).arg("--").arg(&exe));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{opts:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        let calls = ["mlock 32m", "mlock 1m", "mlock2 ONFAULT 32m", "munlock", "mlockall CURRENT", "munlockall"];
        let mut expect: String = calls.iter().zip(want).map(|(c, w)| format!("{c}: {w}\n")).collect();
        expect += "reads back, bad 0\n";
        assert_eq!(stdout, expect, "{opts:?}\nstderr:\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Process-directed signals a program blocks, waits for or reads from a
/// `signalfd`, with a working set 4× the budget around them: each reaches a
/// program thread exactly as without usermm (never one of usermm's, whose
/// masks block them all).
const SIGMASK_C: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t taken_by_other, taken_here;
static pid_t main_tid;
static void on_sig(int sig) {
    (void)sig;
    if ((pid_t)syscall(SYS_gettid) == main_tid) taken_here++; else taken_by_other++;
}
enum { N = 4096, SZ = 16384 };  /* 64 MiB of heap blocks */
static unsigned char *b[N];
static long touch(int pass) {
    long bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < SZ; j += 512) {
            if (pass == 0) b[i][j] = (unsigned char)(i * 7 + j / 512);
            else bad += b[i][j] != (unsigned char)(i * 7 + j / 512);
        }
    return bad;
}
static void block(int sig) { sigset_t s; sigemptyset(&s); sigaddset(&s, sig); sigprocmask(SIG_BLOCK, &s, NULL); }
static void unblock(int sig) { sigset_t s; sigemptyset(&s); sigaddset(&s, sig); sigprocmask(SIG_UNBLOCK, &s, NULL); }

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    main_tid = (pid_t)syscall(SYS_gettid);
    for (int i = 0; i < N; i++) if (!(b[i] = malloc(SZ))) return 10;
    touch(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sig;
    int sigs[] = { SIGTERM, SIGUSR1, SIGHUP, SIGRTMIN, SIGRTMIN + 3 };
    for (int k = 0; k < 5; k++) {
        sigaction(sigs[k], &sa, NULL);
        block(sigs[k]);
        kill(getpid(), sigs[k]);
        long bad = touch(1);
        printf("signal %d: pending while blocked: other %d here %d, bad %ld\n", k, (int)taken_by_other, (int)taken_here, bad);
        unblock(sigs[k]);
        printf("signal %d: after unblock: other %d here %d\n", k, (int)taken_by_other, (int)taken_here);
        taken_here = taken_by_other = 0;
    }
    /* sigwait / sigtimedwait on a real-time signal queued twice. */
    block(SIGRTMIN + 1);
    union sigval v = { .sival_int = 41 };
    sigqueue(getpid(), SIGRTMIN + 1, v);
    v.sival_int = 42;
    sigqueue(getpid(), SIGRTMIN + 1, v);
    printf("touch bad %ld\n", touch(1));
    sigset_t w; sigemptyset(&w); sigaddset(&w, SIGRTMIN + 1);
    siginfo_t si;
    struct timespec ts = { 5, 0 };
    for (int k = 0; k < 2; k++) {
        int s = sigtimedwait(&w, &si, &ts);
        printf("sigtimedwait: %d value %d\n", s == SIGRTMIN + 1, si.si_value.sival_int);
    }
    /* signalfd */
    block(SIGUSR2);
    int fd = signalfd(-1, &(sigset_t){0}, 0);
    sigset_t u; sigemptyset(&u); sigaddset(&u, SIGUSR2);
    fd = signalfd(-1, &u, 0);
    kill(getpid(), SIGUSR2);
    printf("touch bad %ld\n", touch(1));
    struct signalfd_siginfo fdsi;
    printf("signalfd read %d signo %d\n", (int)read(fd, &fdsi, sizeof fdsi) == (int)sizeof fdsi, fdsi.ssi_signo == SIGUSR2);
    /* SIGCHLD, blocked, waited for. */
    block(SIGCHLD);
    pid_t c = fork();
    if (c == 0) _exit(7);
    sigemptyset(&w); sigaddset(&w, SIGCHLD);
    int s = sigtimedwait(&w, &si, &ts);
    int st = 0;
    waitpid(c, &st, 0);
    printf("SIGCHLD %d from the child %d status %d\n", s == SIGCHLD, si.si_pid == c, WEXITSTATUS(st));
    printf("touch bad %ld\n", touch(1));
    return 0;
}
"#;

/// A process-directed signal that the program's thread blocks is never
/// taken by one of usermm's threads (before: the kernel delivered it there
/// at once, and the program's handler ran on a fault handler); `sigwait`,
/// `signalfd`, real-time signals and `SIGCHLD` reach the program as
/// without usermm, in both fault modes.
#[test]
fn signals_the_program_blocks_wait_for_it_as_without_usermm() {
    let dir = tmpdir("sigmask");
    let exe = gcc(&dir, "sigmask", SIGMASK_C, &[]);
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(plain_out.contains("signal 0: pending while blocked: other 0 here 0, bad 0\n"), "{plain_out}");
    assert!(plain_out.contains("signal 0: after unblock: other 0 here 1\n"), "{plain_out}");
    same_as_plain_in_both_fault_modes(&exe, "sigmask", &plain_out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sort` of a file 4× the budget (its buffer 2× the budget: about 160,000
/// swap-ins), killed part-way by `timeout`: it blocks
/// SIGTERM in critical sections, and the kernel used to hand the signal to
/// a usermm thread, where `sort`'s handler touched an evicted page and the
/// fault handler waited on its own fault for good. Now it ends as the plain
/// run does (`timeout`'s 124), well before the hard kill.
#[test]
fn sort_killed_half_way_by_timeout_ends_as_without_usermm() {
    let dir = tmpdir("sort");
    let input = dir.join("in.txt");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        // 64 MiB of lines, 4× a 16 MiB budget.
        for _ in 0..(64 << 20) / 32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            writeln!(f, "{x:020} {:010}", x % 1_000_000_007).unwrap();
        }
    }
    let sort = need("sort");
    let timeout = need("timeout");
    // How long the whole sort takes under usermm; it is killed at half that.
    let t0 = Instant::now();
    let full = output(
        usermm_run(&["--budget", "16m", "--"])
            .arg(&sort)
            .args(["-S", "32M"])
            .arg(&input)
            .arg("-o")
            .arg(dir.join("out.txt")),
    );
    let whole = t0.elapsed();
    assert!(full.status.success(), "{full:?}");
    for round in 0..2u32 {
        let at = whole.mul_f64(0.3 + 0.3 * f64::from(round));
        let t0 = Instant::now();
        let mut c = Command::new(&timeout);
        c.args(["-k", "60"]).arg(format!("{:.3}", at.as_secs_f64())).arg(BIN).args(["run", "--budget", "16m", "--"]);
        c.arg(&sort).args(["-S", "32M"]).arg(&input).arg("-o").arg(dir.join("out2.txt"));
        let out = output(&mut c);
        let took = t0.elapsed();
        // 124: timeout's SIGTERM ended it; 0: it finished first. Never
        // 137 (the hard kill after 60 s: a hang).
        assert!(matches!(out.status.code(), Some(124) | Some(0)), "round {round}: {out:?} after {took:?}");
        assert!(took < at + Duration::from_secs(30), "round {round}: took {took:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server started as root that drops to its user the way `setpriv`
/// does (keep caps, `setresuid`, `capset` on its own thread, `setresgid`,
/// `setgroups`) with a heap 4× the budget; then a forked child, and a
/// `setuid(0)` that must fail. glibc runs each `set*id` in every thread and
/// aborts when one fails where the caller succeeded: usermm's threads must
/// carry the caller's capabilities at each step.
const CREDS_C: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern int capset(void *hdr, void *data);
extern int capget(void *hdr, void *data);
struct hdr { unsigned version; int pid; };
struct data { unsigned effective, permitted, inheritable; };

enum { N = 4096, SZ = 16384 };  /* 64 MiB of heap blocks */
static unsigned char *b[N];
static long touch(int pass) {
    long bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < SZ; j += 512) {
            if (pass == 0) b[i][j] = (unsigned char)(i * 5 + j / 512);
            else bad += b[i][j] != (unsigned char)(i * 5 + j / 512);
        }
    return bad;
}
/* The Uid, Gid, Groups and CapEff lines of a thread's status. */
static void creds_of(const char *status, char *out, size_t n) {
    FILE *f = fopen(status, "r");
    out[0] = 0;
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Uid:", 4) || !strncmp(line, "Gid:", 4) || !strncmp(line, "Groups:", 7) || !strncmp(line, "CapEff:", 7))
            strncat(out, line, n - strlen(out) - 1);
    fclose(f);
}
/* Whether every thread of the process has the main thread's. */
static int all_threads_alike(void) {
    char mine[2048], theirs[2048], path[128];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", getpid());
    creds_of(path, mine, sizeof mine);
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int alike = 1;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        creds_of(path, theirs, sizeof theirs);
        alike &= !strcmp(mine, theirs);
    }
    closedir(d);
    return alike;
}
static void say(const char *what, int r) { printf("%s: %s\n", what, r == 0 ? "ok" : strerrorname_np(errno)); }

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 0; i < N; i++) if (!(b[i] = malloc(SZ))) return 10;
    touch(0);
    say("keepcaps", prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0));
    say("setresuid", setresuid(65534, 65534, 65534));
    printf("heap bad %ld, threads alike %d\n", touch(1), all_threads_alike());
    struct hdr h = { 0x20080522, 0 };
    struct data d[2];
    say("capget", capget(&h, d));
    d[0].effective = d[0].permitted;
    d[1].effective = d[1].permitted;
    say("capset", capset(&h, d));
    say("setresgid", setresgid(65534, 65534, 65534));
    say("setgroups", setgroups(0, NULL));
    printf("uid %d gid %d, heap bad %ld, threads alike %d\n", (int)getuid(), (int)getgid(), touch(1), all_threads_alike());
    pid_t c = fork();
    if (c == 0) _exit(touch(1) != 0 || setresuid(65534, 65534, 65534) != 0 || !all_threads_alike());
    int st = 0;
    waitpid(c, &st, 0);
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    h.version = 0x20080522;
    memset(d, 0, sizeof d);
    say("drop every capability", capset(&h, d));
    say("setuid(0)", setuid(0));
    printf("heap bad %ld, threads alike %d\n", touch(1), all_threads_alike());
    return 0;
}
"#;

/// Credential changes under `usermm run` as without it: `setpriv` and
/// `runuser` dropping to `nobody`, and a C server doing it by hand with a
/// heap 4× the budget, in both fault modes. Before: `setpriv` died of
/// SIGABRT (glibc's `setresgid` failed on usermm's threads, whose
/// capabilities the keep-caps `setresuid` had dropped), `runuser` hung (a
/// new fault handler's first thread-local waited for the dynamic loader's
/// lock, which `dlclose` held while it faulted), and `id` run as `nobody`
/// printed no names (its space fell back to user-mode-only faults, and
/// `read(2)` of `/etc/passwd` into the heap failed with EFAULT).
#[test]
fn credential_changes_work_as_without_usermm() {
    let dir = tmpdir("creds");
    for argv in [
        &["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "id"][..],
        &["runuser", "-u", "nobody", "--", "id"][..],
    ] {
        let plain = output(Command::new(need(argv[0])).args(&argv[1..]));
        assert!(plain.status.success(), "{argv:?}: {plain:?}");
        let out = output(usermm_run(&["--budget", "16m", "--"]).arg(need(argv[0])).args(&argv[1..]));
        assert_eq!(out.status.code(), plain.status.code(), "{argv:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&plain.stdout), "{argv:?}: {out:?}");
    }
    let exe = gcc(&dir, "creds", CREDS_C, &[]);
    // (The program must be readable by nobody for nothing: it is already
    // running when it drops.)
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let plain_out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(plain_out.contains("setresgid: ok\n") && plain_out.contains("setuid(0): EPERM\n"), "{plain_out}");
    same_as_plain_in_both_fault_modes(&exe, "creds", &plain_out);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exit_status_and_death_by_signal_are_passed_on() {
    let out = output(&mut usermm_run(&["--", "sh", "-c", "exit 42"]));
    assert_eq!(out.status.code(), Some(42), "{out:?}");
    let out = output(&mut usermm_run(&["--", "sh", "-c", "kill -SEGV $$"]));
    assert_eq!(out.status.code(), Some(128 + 11), "{out:?}");
    let out = output(&mut usermm_run(&["--", "usermm-no-such-program"]));
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{out:?}");
    let out = output(&mut usermm_run(&["--budget", "lots", "--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `--stats=FILE` writes every process's statistics line into FILE (made
/// anew, by its absolute name) and nothing onto the program's stderr, so a
/// script's `2>&1` gets only the program's output; plain `--stats` keeps
/// stderr. `--budget 0` and a budget below 1m are refused with a message
/// naming the smallest.
#[test]
fn stats_go_to_a_file_when_asked_and_a_budget_too_small_is_refused() {
    let dir = tmpdir("statsfile");
    let file = dir.join("stats.txt");
    std::fs::write(&file, "old line\n").unwrap();
    let out = output(
        usermm_run(&["--budget", "16m", &format!("--stats={}", file.display()), "--"])
            .args(["sh", "-c", "echo out; echo err >&2; cat /dev/null; exec head -c 1 /dev/zero >/dev/null"])
            .current_dir(&dir),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n", "only the program's own stderr");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("old line"), "the file is made anew: {text}");
    // `cat` and `head` each wrote their line (the shell keeps the kernel's memory).
    for comm in ["cat", "head"] {
        let s = stats(&text, comm);
        assert_eq!(s["budget_bytes"], 16 << 20, "{text}");
    }
    // Plain --stats: stderr, as before.
    let out = output(&mut usermm_run(&["--budget", "16m", "--stats", "--", "true"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(true): stats: "), "{out:?}");
    for bad in ["0", "64k", "4096"] {
        let out = output(&mut usermm_run(&["--budget", bad, "--", "true"]));
        assert_eq!(out.status.code(), Some(2), "--budget {bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--budget") && (err.contains("1m") || err.contains("default")), "{err}");
    }
    // A variable the space would refuse (the flag's name, not its bit) is
    // refused here with its name, not left to make the space fail to open
    // and the program run silently on the C library's malloc; a valid one
    // runs, and an option replaces a bad variable.
    for (var, bad) in [("USERMM_FLAGS", "UMM_F_NO_WAKE_AHEAD"), ("USERMM_BUDGET_BYTES", "64 MiB")] {
        let out = output(usermm_run(&["--", "true"]).env(var, bad));
        assert_eq!(out.status.code(), Some(2), "{var}={bad}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(var), "{out:?}");
    }
    let out = output(usermm_run(&["--", "true"]).env("USERMM_FLAGS", "128"));
    assert!(out.status.success(), "{out:?}");
    let out = output(usermm_run(&["--budget", "64m", "--", "true"]).env("USERMM_BUDGET_BYTES", "64 MiB"));
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_to_usermm_reaches_the_program() {
    let mut child = usermm_run(&["--", "sleep", "30"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let k = output(&mut {
        let mut k = Command::new("kill");
        k.args(["-TERM", &child.id().to_string()]);
        k
    });
    assert!(k.status.success(), "{k:?}");
    let t0 = Instant::now();
    let st = child.wait().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(st.code(), Some(128 + 15), "{st:?}");
}

#[test]
fn a_static_binary_is_refused_with_a_clear_message() {
    let dir = tmpdir("static");
    let exe = gcc(&dir, "st", "int main(void) { return 0; }\n", &["-static"]);
    let out = output(usermm_run(&["--"]).arg(&exe));
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("statically linked") && stderr.contains("LD_PRELOAD"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Children that `exec`: `system`, `posix_spawn`, `popen`, `fork` + `execv`.
const SPAWN_C: &str = r#"
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(void) {
    char *keep = strdup("the parent's heap");
    fflush(stdout);
    if (system("echo from-system") != 0) return 10;
    pid_t pid;
    char *argv[] = {"echo", "from-posix-spawn", NULL};
    int st;
    if (posix_spawnp(&pid, "echo", NULL, NULL, argv, environ) != 0) return 11;
    if (waitpid(pid, &st, 0) != pid || st != 0) return 12;
    FILE *p = popen("echo from-popen", "r");
    char line[64] = {0};
    if (!p || !fgets(line, sizeof line, p) || pclose(p) != 0) return 13;
    fputs(line, stdout);
    fflush(stdout);
    char *fargv[] = {"/bin/echo", "from-fork-exec", NULL};
    pid = fork();
    if (pid == 0) { execv(fargv[0], fargv); _exit(127); }
    if (waitpid(pid, &st, 0) != pid || st != 0) return 14;
    printf("%s\n", keep);
    free(keep);
    return 0;
}
"#;

#[test]
fn children_that_exec_run_and_inherit_the_preload() {
    let dir = tmpdir("spawn");
    let exe = gcc(&dir, "spawner", SPAWN_C, &[]);
    let out = output(usermm_run(&["--budget", "16m", "--stats", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "from-system\nfrom-posix-spawn\nfrom-popen\nfrom-fork-exec\nthe parent's heap\n");
    // The exec'd children ran preloaded, each on a space of its own.
    stats(&stderr, "spawner");
    stats(&stderr, "echo");
    // Python's subprocess.
    let py = need("python3");
    let out = output(usermm_run(&["--"]).arg(&py).args([
        "-c",
        "import subprocess, os; print(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout.strip(), os.system('true'))",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sub 0\n");
    // --no-inherit: the program itself is preloaded (its stats line), what
    // it runs is not. (A shell would not do here: dash ends with `_exit`,
    // which runs no exit handler, so it prints no stats.)
    let out = output(usermm_run(&["--no-inherit", "--stats", "--"]).arg(&py).args([
        "-c",
        "import subprocess; print(subprocess.run(['sh', '-c', 'echo \"[$LD_PRELOAD]\"'], capture_output=True, text=True).stdout.strip())",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n");
    stats(&String::from_utf8_lossy(&out.stderr), "python3");
    let out = output(&mut usermm_run(&["--", "sh", "-c", "echo \"[$LD_PRELOAD]\""]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("libusermm_preload.so"), "{out:?}");
    // A program's forked child reads its parent's heap without exec'ing
    // (its copy of the space), and allocates on it (the locale CPython set
    // is the C library's: the child's copy starts threads, which read it).
    let fork = "import os\nd = [bytes([i]) * 1000 for i in range(64)]\npid = os.fork()\n\
                if pid == 0:\n    e = [bytes([i]) * 3000 for i in range(256)]\n    \
                print(sum(len(x) for x in d), sum(x[0] for x in e), flush=True)\n    os._exit(0)\n\
                print('child signal', os.waitpid(pid, 0)[1] & 127)\n";
    let out = output(usermm_run(&["--budget", "16m", "--"]).arg(&py).args(["-c", fork]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "64000 32640\nchild signal 0\n", "{out:?}");
    // Where the space is not copied (its copy failed: no descriptor was
    // left for the tie to the parent), the same child dies of SIGSEGV on
    // its parent's heap, and says so.
    let no_fd = "import os, resource\nd = [bytes([i]) * 1000 for i in range(64)]\n\
                 resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n\
                 fds = []\ntry:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n\
                 except OSError: pass\npid = os.fork()\nfor f in fds: os.close(f)\n\
                 if pid == 0:\n    print(sum(len(x) for x in d), flush=True)\n    os._exit(0)\n\
                 print('child signal', os.waitpid(pid, 0)[1] & 127)\n";
    let out = output(usermm_run(&["--"]).arg(&py).args(["-c", no_fd]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "child signal 11\n", "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("a forked child touched its parent's heap"), "{out:?}");
    // A shell's `$(...)` child runs on its parent's heap without exec'ing:
    // the shell keeps the kernel's memory, so it works.
    let out = output(&mut usermm_run(&["--", "sh", "-c", "echo \"[$(echo x)]\""]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[x]\n", "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("touched its parent's heap"), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python's `multiprocessing` with the `fork` start method: two pool
/// workers, forked from a parent whose dict (12 MiB) is half again its
/// budget, check every value in their copies of it.
#[test]
fn cpython_multiprocessing_fork_workers_read_the_parents_dict() {
    let py = need("python3");
    let prog = "import multiprocessing as mp, hashlib\n\
                n = 6000\n\
                data = {i: hashlib.sha256(str(i).encode()).digest() * 64 for i in range(n)}\n\
                def check(k):\n    \
                return sum(1 for i in range(k, n, 4) if data[i] != hashlib.sha256(str(i).encode()).digest() * 64)\n\
                if __name__ == '__main__':\n    \
                with mp.get_context('fork').Pool(2) as p:\n        \
                print('bad', sum(p.map(check, range(4))), flush=True)\n";
    let out = output(usermm_run(&["--budget", "8m", "--stats", "--"]).arg(&py).args(["-c", prog]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "bad 0\n", "{stderr}");
    assert!(stats(&stderr, "python3")["swapouts"] > 0, "{stderr}");
    assert!(!stderr.contains("is not copied"), "{stderr}");
}

/// Where a fork does not copy the space (its copy failed: no descriptor
/// left for the tie to the parent, at the first fork): a forked child (and
/// grandchild) that allocates and maps without exec'ing: its new memory is
/// on a space of its own; its parent's stream
/// and environment (changed after the space opened) survive the fork; the
/// parent's heap stays unreachable (a mapping with no access, which the
/// child's calls treat as a hole), never another block's bytes.
const FORKER_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether p lies in a mapping with no access ("---p" in /proc/self/maps). */
static int noaccess(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int r = -1;
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t a, b;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && a <= (uintptr_t)p && (uintptr_t)p < b)
            r = strcmp(perms, "---p") == 0;
    }
    if (f) fclose(f);
    return r == 1;
}

/* New memory of this process: malloc, an anonymous mapping locked, checked
   resident, unlocked and unmapped. */
static int new_memory(void) {
    char *c = malloc(64);
    size_t len = 1 << 20;
    unsigned char vec[256];
    if (!c) return 1;
    strcpy(c, "new");
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    memset(m, 7, len);
    if (mlock(m, len) || mincore(m, len, vec)) return 3;
    for (int i = 0; i < 256; i++) if (!(vec[i] & 1) || m[i * 4096] != 7) return 4;
    if (munlock(m, len) || munmap(m, len)) return 5;
    if (noaccess(c)) return 6;
    free(c);
    return 0;
}

/* Opens /dev/null until no descriptor is left (under a limit of 256): a
   fork then cannot tie the child to its parent, and the space is not
   copied. undo() closes exactly those. */
static int taken[256], ntaken;

static void exhaust(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 256;
    setrlimit(RLIMIT_NOFILE, &rl);
    int fd;
    while (ntaken < 256 && (fd = open("/dev/null", O_RDONLY)) >= 0)
        taken[ntaken++] = fd;
}

static void undo(void) {
    while (ntaken > 0) close(taken[--ntaken]);
}

int main(void) {
    char *parent = malloc(64);
    strcpy(parent, "the parent's heap");
    FILE *keep = fopen("/proc/self/maps", "r");
    if (!keep || setenv("FORKER_VAR", "set after the space opened", 1)) return 1;
    exhaust();
    pid_t pid = fork();
    undo();
    if (pid == 0) {
        const char *v = getenv("FORKER_VAR");
        if (!v || strcmp(v, "set after the space opened")) _exit(10);
        int r = new_memory();
        if (r) _exit(10 + r);
        void *page = (void *)((uintptr_t)parent & ~(uintptr_t)4095);
        if (!noaccess(parent)) _exit(20);
        if (mprotect(page, 4096, PROT_READ) != -1 || errno != ENOMEM) _exit(21);
        if (madvise(page, 4096, MADV_DONTNEED) != -1 || errno != ENOMEM) _exit(22);
        if (munmap(page, 4096) != 0 || !noaccess(parent)) _exit(23);
        free(parent);
        char *mine = malloc(64);
        exhaust();
        pid_t g = fork();
        undo();
        if (g == 0) exit(new_memory() || !noaccess(parent) || !noaccess(mine) ? 30 : 0);
        int st;
        if (waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st)) _exit(31);
        printf("child ok\n");
        exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return 2;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        printf("child status %#x\n", st);
        return 3;
    }
    printf("%s\n", parent);
    fclose(keep);
    return 0;
}
"#;

#[test]
fn a_forked_child_allocates_and_maps_on_a_space_of_its_own() {
    let dir = tmpdir("forker");
    let exe = gcc(&dir, "forker", FORKER_C, &[]);
    let out = output(usermm_run(&["--budget", "16m", "--verbose", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, "child ok\nthe parent's heap\n", "{stderr}");
    // Three processes, each with a space: the parent's calls (none but
    // malloc) and the child's and grandchild's (mmap, mlock, mincore,
    // munlock, munmap) each counted on their own.
    let calls: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.split_once("(forker): memory calls: space="))
        .map(|(_, r)| r.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(calls.len(), 3, "{stderr}");
    assert!(calls.iter().filter(|&&n| n >= 5).count() == 2, "{calls:?}\n{stderr}");
    assert_eq!(stderr.matches("(forker): stats: ").count(), 3, "{stderr}");
    // The child's free of its parent's block freed nothing.
    assert!(stderr.contains("child_frees_dropped=1"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A forked child gets a copy of everything: the heap (a block, and a
/// buffer four times the budget, mostly swapped out at the fork), a
/// private mapping, a stream's buffer; an anonymous `MAP_SHARED` mapping
/// stays shared; locks are not inherited; neither process sees the other's
/// private writes; a grandchild gets a copy of the child's. The same
/// program runs on the kernel, and both print the same.
const COPIER_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG (64L << 20)
#define MAPPED (4L << 20)

static long vmlck_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmLck:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static long bad_big(const unsigned char *b, int salt) {
    long bad = 0;
    for (long i = 0; i < BIG; i += 512) bad += b[i] != (unsigned char)(i / 512 * 7 + salt);
    return bad;
}

static int child(char *blk, unsigned char *big, char *priv, volatile int *shared, FILE *mem) {
    char buf[64] = {0};
    if (strcmp(blk, "the parent's block")) return 10;
    if (bad_big(big, 1)) return 11;
    for (long i = 0; i < MAPPED; i += 4096) if (priv[i] != (char)(i >> 12)) return 12;
    rewind(mem);
    if (!fgets(buf, sizeof buf, mem) || strcmp(buf, "in the parent's stream")) return 13;
    if (vmlck_kb() != 0) return 14;
    /* private writes: the parent must not see them */
    strcpy(blk, "the child's block");
    for (long i = 0; i < BIG; i += 512) big[i] = (unsigned char)(i / 512 * 7 + 2);
    memset(priv, 0x5a, MAPPED);
    /* a shared write: the parent must see it */
    shared[0] = 4242;
    /* the child's own memory, and the parent's block freed here */
    free(blk);
    char *mine = malloc(100000);
    if (!mine) return 15;
    memset(mine, 3, 100000);
    pid_t g = fork();
    if (g == 0) _exit(bad_big(big, 2) || mine[99999] != 3 || shared[0] != 4242 ? 16 : 0);
    int st;
    if (waitpid(g, &st, 0) != g || !WIFEXITED(st)) return 17;
    if (WEXITSTATUS(st)) return WEXITSTATUS(st);
    free(mine);
    return 0;
}

int main(void) {
    char *blk = malloc(64);
    unsigned char *big = malloc(BIG);
    char *priv = mmap(NULL, MAPPED, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    volatile int *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *locked = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FILE *mem = tmpfile();
    if (!blk || !big || priv == MAP_FAILED || shared == MAP_FAILED || locked == MAP_FAILED || !mem) return 1;
    strcpy(blk, "the parent's block");
    for (long i = 0; i < BIG; i += 512) big[i] = (unsigned char)(i / 512 * 7 + 1);
    for (long i = 0; i < MAPPED; i += 4096) priv[i] = (char)(i >> 12);
    memset(locked, 1, 1 << 20);
    if (mlock(locked, 1 << 20)) return 2;
    fputs("in the parent's stream", mem);
    fflush(mem);
    shared[0] = 1;
    printf("parent locked kB %ld\n", vmlck_kb());
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(child(blk, big, priv, shared, mem));
    int st;
    if (waitpid(pid, &st, 0) != pid) return 3;
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    printf("parent block: %s\n", blk);
    printf("parent big bad: %ld\n", bad_big(big, 1));
    long pbad = 0;
    for (long i = 0; i < MAPPED; i += 4096) pbad += priv[i] != (char)(i >> 12);
    printf("parent mapping bad: %ld\n", pbad);
    printf("shared: %d\n", shared[0]);
    printf("parent locked kB %ld\n", vmlck_kb());
    return 0;
}
"#;

#[test]
fn a_forked_child_gets_a_copy_of_the_heap_and_mappings_as_on_the_kernel() {
    let dir = tmpdir("copier");
    let exe = gcc(&dir, "copier", COPIER_C, &[]);
    let host = output(&mut Command::new(&exe));
    assert!(host.status.success(), "{host:?}");
    let expected = "parent locked kB 1024\nchild status 0\nparent block: the parent's block\nparent big bad: 0\n\
                    parent mapping bad: 0\nshared: 4242\nparent locked kB 1024\n";
    assert_eq!(String::from_utf8_lossy(&host.stdout), expected, "the kernel: {host:?}");
    // 64 MiB of heap under a 16 MiB budget: most of it is swapped at the fork.
    let out = output(usermm_run(&["--budget", "16m", "--memlock", "2m", "--stats", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, expected, "{stderr}");
    let st = stats(&stderr, "copier");
    assert!(st["swapouts"] > 0, "the heap was never swapped: {stderr}");
    assert!(!stderr.contains("is not copied"), "{stderr}");
    // The same with the heap swapped to a Redis server: the child reads the
    // parent's swapped heap in place in the parent's keys, and no key
    // outlives the program.
    let server = need("redis-server");
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut store = Command::new(server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let dbsize = || -> Option<u64> {
        let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
        c.write_all(b"*1\r\n$6\r\nDBSIZE\r\n").ok()?;
        let mut line = String::new();
        BufReader::new(c).read_line(&mut line).ok()?;
        line.trim().strip_prefix(':')?.parse().ok()
    };
    let t0 = Instant::now();
    while dbsize().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the Redis server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("redis://127.0.0.1:{port}/");
    let out =
        output(usermm_run(&["--budget", "16m", "--memlock", "2m", "--swap-url", &url, "--stats", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let left = {
        let t0 = Instant::now();
        while dbsize() != Some(0) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        dbsize()
    };
    let _ = store.kill();
    let _ = store.wait();
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, expected, "{stderr}");
    assert!(stats(&stderr, "copier")["swapouts"] > 0, "the heap was never swapped: {stderr}");
    assert!(!stderr.contains("is not copied"), "{stderr}");
    assert_eq!(left, Some(0), "keys outlived the program");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_help_lists_every_option() {
    let out = output(Command::new(BIN).args(["run", "--help"]));
    assert!(out.status.success(), "{out:?}");
    let h = String::from_utf8_lossy(&out.stdout);
    for w in [
        "--budget",
        "--swap-bytes",
        "--swap-dir",
        "--swap-url",
        "--memlock",
        "--inthread",
        "--frame-pool",
        "--stats",
        "--verbose",
        "--no-inherit",
        "USERMM_BUDGET_BYTES",
        "128 + the signal",
    ] {
        assert!(h.contains(w), "usermm run --help lacks {w}:\n{h}");
    }
    let top = output(Command::new(BIN).arg("--help"));
    assert!(String::from_utf8_lossy(&top.stdout).contains("usermm run [OPTIONS] -- PROGRAM"));
}

/// A C++ program's `new`, `new[]`, aligned `new` and the standard
/// containers (libstdc++'s `operator new` calls `malloc`, and its aligned
/// form `aligned_alloc`): about 4× the budget, every byte checked after the
/// rest pushed it out, so its memory is the space's.
const CXX_SRC: &str = r#"
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
struct alignas(256) Wide { unsigned char b[1000]; };
int main() {
    std::vector<std::unique_ptr<std::vector<uint32_t>>> vs;
    for (uint32_t i = 0; i < 4096; i++) {
        vs.emplace_back(new std::vector<uint32_t>(4096 / 4 * (1 + i % 3)));
        for (size_t j = 0; j < vs.back()->size(); j++) (*vs.back())[j] = i * 7 + (uint32_t)j;
    }
    std::vector<Wide *> ws;
    for (int i = 0; i < 2048; i++) {
        Wide *w = new Wide;
        if ((uintptr_t)w % 256) return 10;
        for (int j = 0; j < 1000; j++) w->b[j] = (unsigned char)(i + j);
        ws.push_back(w);
    }
    std::string s;
    for (int i = 0; i < 100000; i++) s += std::to_string(i);
    unsigned long bad = 0;
    for (uint32_t i = 0; i < vs.size(); i++)
        for (size_t j = 0; j < vs[i]->size(); j++) bad += (*vs[i])[j] != i * 7 + (uint32_t)j;
    for (int i = 0; i < 2048; i++) {
        for (int j = 0; j < 1000; j++) bad += ws[i]->b[j] != (unsigned char)(i + j);
        delete ws[i];
    }
    char *arr = new char[1 << 20];
    arr[0] = 1;
    delete[] arr;
    std::printf("ok %lu %zu\n", bad, s.size());
    return bad != 0;
}
"#;

#[test]
fn a_cxx_programs_new_and_containers_are_on_the_space() {
    let dir = tmpdir("cxx");
    let src = dir.join("cxx.cpp");
    std::fs::write(&src, CXX_SRC).unwrap();
    let exe = dir.join("cxx");
    let out = output(Command::new(need("g++")).args(["-O2", "-std=c++17", "-o"]).arg(&exe).arg(&src));
    assert!(out.status.success(), "g++: {}", String::from_utf8_lossy(&out.stderr));
    let plain = output(&mut Command::new(&exe));
    assert!(plain.status.success(), "{plain:?}");
    let budget = 8u64 << 20;
    let out = output(usermm_run(&["--budget", "8m", "--stats", "--"]).arg(&exe));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, String::from_utf8_lossy(&plain.stdout));
    assert!(stdout.starts_with("ok 0 "), "{stdout}");
    assert_swapped(&stderr, "cxx", budget);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads its own memory cgroup's limit file (from `/proc/self/cgroup`) with
/// `open`, `openat` and `fopen`, and the root cgroup's (when it is another
/// one) with `open`; prints each value.
const CGROUP_LIMIT_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void show(const char *how, int fd) {
    char b[64] = {0};
    int n = fd < 0 ? -1 : (int)read(fd, b, sizeof b - 1);
    printf("%s %s", how, n > 0 ? b : "none\n");
    if (fd >= 0) close(fd);
}
int main(void) {
    char line[512], path[700] = "", *p;
    FILE *cg = fopen("/proc/self/cgroup", "r");
    while (cg && fgets(line, sizeof line, cg)) {
        line[strcspn(line, "\n")] = 0;
        if ((p = strstr(line, ":memory:")))
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", p + 8);
        else if (!strncmp(line, "0::", 3) && !path[0])
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
    }
    free(malloc(64));
    show("open", open(path, O_RDONLY | O_CLOEXEC));
    show("openat", openat(AT_FDCWD, path, O_RDONLY));
    FILE *f = fopen(path, "re");
    show("fopen", f ? dup(fileno(f)) : -1);
    if (f) fclose(f);
    const char *root = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
    if (strcmp(path, root)) show("root", open(root, O_RDONLY));
    else printf("root own\n");
    return 0;
}
"#;

/// The budget is the limit the program reads from its memory cgroup, as
/// a cgroup of the budget's size would show it (`cgroup.rs` in the preload):
/// `open`, `openat` and `fopen` of its own limit file read the smaller of
/// the real limit and the budget; another file reads as without usermm, and
/// `--no-cgroup-view` or no `--budget` shows the real limit. Node.js sizes its heap by it
/// (`process.constrainedMemory()`).
#[test]
fn the_program_reads_the_budget_as_its_cgroup_limit() {
    let dir = tmpdir("cgroup");
    let exe = gcc(&dir, "cglimit", CGROUP_LIMIT_C, &[]);
    let plain = String::from_utf8_lossy(&output(&mut Command::new(&exe)).stdout).into_owned();
    let real: u64 = plain
        .lines()
        .find_map(|l| l.strip_prefix("open "))
        .and_then(|v| if v == "max" { Some(u64::MAX) } else { v.parse().ok() })
        .unwrap_or_else(|| panic!("no memory cgroup limit read without usermm:\n{plain}"));
    let budget: u64 = 40 << 20;
    let seen = real.min(budget);
    let out = output(usermm_run(&["--budget", "40m", "--"]).arg(&exe));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    let root = plain.lines().find(|l| l.starts_with("root ")).unwrap();
    assert_eq!(stdout, format!("open {seen}\nopenat {seen}\nfopen {seen}\n{root}\n").replace("\n\n", "\n"));
    // Turned off, or no budget given (the default one is no limit the
    // user set): the real limit.
    for args in [&["--budget", "40m", "--no-cgroup-view", "--"][..], &["--"]] {
        let out = output(usermm_run(args).env_remove("USERMM_BUDGET_BYTES").arg(&exe));
        let unviewed = String::from_utf8_lossy(&out.stdout);
        assert!(unviewed.starts_with(&format!("{}\n", plain.lines().next().unwrap())), "{args:?}: {unviewed}");
    }
    let js = "console.log(process.constrainedMemory())";
    let out = output(usermm_run(&["--budget", "40m", "--"]).args([need("node").to_str().unwrap(), "-e", js]));
    let node = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {node}", out.status);
    assert_eq!(node.trim().parse::<f64>().ok(), Some(seen as f64), "node's constrained memory: {node}");
    let _ = std::fs::remove_dir_all(&dir);
}
