//! The soak test: four program threads on one space whose budget is a
//! quarter of their working set make random calls of every kind — writes
//! (whole pages and a few bytes), reads, `MADV_FREE`, `MADV_WILLNEED`,
//! `MADV_PAGEOUT`, `MADV_COLD`, `MADV_DONTNEED`, `MADV_POPULATE_READ/WRITE`,
//! `mlock`, `mlock2(MLOCK_ONFAULT)`, `munlock`, `mvolatile`, `mnovolatile`,
//! touches of volatile pages (SIGBUS handled as the seed's model does),
//! `mprotect`, `munmap` + `mmap(MAP_FIXED)` of the thread's own pages
//! (a third of them `UMM_MAP_INTHREAD`, faults resolved in the faulting
//! thread beside the other regions' handler threads), and, with every other
//! seed (then no region is `UMM_MAP_INTHREAD`, which a fork does not copy),
//! `fork`: the child checks the forking thread's pages against its model
//! as of the fork, pages them out and checks them again, while the other
//! threads were anywhere in their calls at the fork —
//! and verify every byte they read against an exact per-thread model (each
//! thread owns its pages).
//!
//! The model keeps every page's expected bytes. After `MADV_FREE` a page is
//! "its old bytes or zeros" (with any bytes written since applied to both)
//! until a read settles which, or a whole-page write makes it exact again;
//! `MADV_DONTNEED`, a remap, and a purge reported by `mnovolatile`'s bitmap
//! make it zeros. A byte that is neither allowed value fails the test with
//! the thread, address, expected and read bytes and the thread's op history.
//!
//! A watchdog fails the test (abort, with a report) if any thread is inside
//! one call for `USERMM_SOAK_HANG_SECS` (default 20) or nothing completes for
//! that long: it prints every thread's current op and history, every task of
//! the process (comm, state, wchan, kernel stack from /proc/self/task) and
//! the user stacks from `gdb` (or `eu-stack`; it says if neither exists).
//! A SIGBUS or SIGSEGV that the thread did not expect is reported the same
//! way.
//!
//! Environment:
//! - `USERMM_SOAK_SECS` (default 60): duration.
//! - `USERMM_SOAK_SEED`: the RNG seed (default: the fixed `SOAK_SEEDS`, one
//!   that forks and one that does not, each for its share of the duration;
//!   printed).
//! - `USERMM_SOAK_OPS`: which op kinds run: a comma list of names (only
//!   those) or of `-name` (all but those); `USERMM_SOAK_NO_FREE=1` is
//!   `-free`. Names: see `OPS`.
//! - `USERMM_SOAK_HANG_SECS` (default 20): the watchdog's limit.
//! - `USERMM_SOAK_SELFTEST=hang` or `=sigbus`: checks the harness itself:
//!   worker 0 sleeps inside an op forever (the watchdog must report and
//!   abort), or touches volatile pages without expecting a SIGBUS (the
//!   SIGBUS of the first purged one must be reported and abort).
//! - `USERMM_SOAK_HOST_SWAP=1`: run with a 512 MiB host swap file active
//!   (`fallocate` + `mkswap` + `swapon` in /tmp; `swapoff` and removed at the
//!   end, on panic and before a watchdog abort).

mod common;

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use usermm::consts::*;
use usermm::{Config, Errno, Space, Stats};

const THREADS: usize = 4;
const REGIONS: usize = 4; // per thread
const REGION_PAGES: usize = 256; // 1 MiB
const PS: usize = 4096;
const PAGES: usize = REGIONS * REGION_PAGES; // per thread
const WORKING_SET: usize = THREADS * PAGES * PS; // 16 MiB
const BUDGET: usize = WORKING_SET / 4; // 4 MiB
const SWAP: usize = 64 << 20;
/// Most pages one thread keeps locked (either kind): 4 x 48 = 19% of the budget.
const LOCK_CAP: usize = 48;
/// Calls remembered per thread, and how many of the last are always printed.
const HISTORY: usize = 4000;
const TAIL: usize = 40;

// ---------------------------------------------------------------- op kinds

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Write,
    PWrite,
    Read,
    Free,
    WillNeed,
    PageOut,
    Cold,
    DontNeed,
    PopRead,
    PopWrite,
    Mlock,
    MlockOnFault,
    Munlock,
    Mvolatile,
    Mnovolatile,
    VTouch,
    Mprotect,
    Remap,
    Fork,
}

/// (op, name, weight).
const OPS: &[(Op, &str, u32)] = &[
    (Op::Write, "write", 20),
    (Op::PWrite, "pwrite", 8),
    (Op::Read, "read", 20),
    (Op::Free, "free", 6),
    (Op::WillNeed, "willneed", 3),
    (Op::PageOut, "pageout", 3),
    (Op::Cold, "cold", 3),
    (Op::DontNeed, "dontneed", 4),
    (Op::PopRead, "popread", 3),
    (Op::PopWrite, "popwrite", 3),
    (Op::Mlock, "mlock", 2),
    (Op::MlockOnFault, "mlockonfault", 2),
    (Op::Munlock, "munlock", 3),
    (Op::Mvolatile, "mvolatile", 3),
    (Op::Mnovolatile, "mnovolatile", 3),
    (Op::VTouch, "vtouch", 2),
    (Op::Mprotect, "mprotect", 3),
    (Op::Remap, "remap", 1),
    (Op::Fork, "fork", 1),
];

fn op_name(op: Op) -> &'static str {
    OPS.iter().find(|o| o.0 == op).unwrap().1
}

fn enabled_ops() -> Vec<(Op, u32)> {
    let mut on: Vec<bool> = vec![true; OPS.len()];
    let spec = std::env::var("USERMM_SOAK_OPS").unwrap_or_default();
    let toks: Vec<&str> = spec.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
    if toks.first().is_some_and(|t| !t.starts_with('-')) {
        on.fill(false);
    }
    let find = |n: &str| {
        OPS.iter().position(|o| o.1 == n).unwrap_or_else(|| {
            panic!("USERMM_SOAK_OPS: unknown op {n:?}; known: {:?}", OPS.iter().map(|o| o.1).collect::<Vec<_>>())
        })
    };
    for t in toks {
        match t.strip_prefix('-') {
            Some(n) => on[find(n)] = false,
            None => on[find(t)] = true,
        }
    }
    if std::env::var("USERMM_SOAK_NO_FREE").is_ok_and(|v| v != "0" && !v.is_empty()) {
        on[find("free")] = false;
    }
    let v: Vec<(Op, u32)> = OPS.iter().zip(&on).filter(|(_, &b)| b).map(|(o, _)| (o.0, o.2)).collect();
    assert!(!v.is_empty(), "USERMM_SOAK_OPS leaves no op kind");
    v
}

// ---------------------------------------------------------------- RNG

use usermm_core::rng::Rng;

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------- raw memory

/// Copies `src` into the space's memory at `addr`.
fn mem_write(addr: usize, src: &[u8]) {
    // SAFETY: `addr..addr+len` lies in a region this thread owns, mapped
    // writable (the model says so); no Rust reference points into it.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) }
}

/// Copies the space's memory at `addr` into `dst`.
fn mem_read(addr: usize, dst: &mut [u8]) {
    // SAFETY: as `mem_write`, mapped readable.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) }
}

// ---------------------------------------------------------------- signals

/// The space, for the SIGBUS handler's `mnovolatile` (set while workers run).
static SPACE: AtomicPtr<Space> = AtomicPtr::new(std::ptr::null_mut());
/// An unexpected fault signal: its number (0: none yet), code, address,
/// worker index (usize::MAX: not a worker) and tid.
static BAD_SIG: AtomicI32 = AtomicI32::new(0);
static BAD_CODE: AtomicI32 = AtomicI32::new(0);
static BAD_ADDR: AtomicUsize = AtomicUsize::new(0);
static BAD_WORKER: AtomicUsize = AtomicUsize::new(usize::MAX);
static BAD_TID: AtomicI32 = AtomicI32::new(0);

/// What the handler did for an expected SIGBUS.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Handled {
    None,
    /// `mnovolatile` on the page said it was purged.
    Purged,
    /// `mnovolatile` said it was not purged (a spurious SIGBUS).
    NotPurged,
    /// `mnovolatile` failed.
    Error(i32),
}

thread_local! {
    /// The page a volatile touch is reading (0: no SIGBUS expected).
    static EXPECT: Cell<usize> = const { Cell::new(0) };
    static HANDLED: Cell<Handled> = const { Cell::new(Handled::None) };
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

extern "C" fn on_fault_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; for
    // SIGBUS/SIGSEGV (kernel or usermm's SI_QUEUE) the address is si_addr.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let expect = EXPECT.with(Cell::get);
    if sig == libc::SIGBUS && expect != 0 && addr & !(PS - 1) == expect {
        // The seed's model: make the page non-volatile from the handler (the
        // touching thread holds no usermm lock); the retried access then
        // reads the zeros of the purged page.
        EXPECT.with(|e| e.set(0));
        let space = SPACE.load(Ordering::SeqCst);
        let h = if space.is_null() {
            Handled::Error(0)
        } else {
            // SAFETY: SPACE points at the live space while workers run.
            match unsafe { &*space }.mnovolatile(expect, PS) {
                Ok((true, _)) => Handled::Purged,
                Ok((false, _)) => Handled::NotPurged,
                Err(e) => Handled::Error(e.0),
            }
        };
        HANDLED.with(|c| c.set(h));
        return;
    }
    // Unexpected: record it and park this thread for good; the main thread
    // reports it (with every thread's history and stack) and aborts.
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if BAD_SIG.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        BAD_CODE.store(code, Ordering::SeqCst);
        BAD_ADDR.store(addr, Ordering::SeqCst);
        BAD_WORKER.store(WORKER.with(Cell::get), Ordering::SeqCst);
        BAD_TID.store(tid, Ordering::SeqCst);
    }
    let msg = b"\nsoak: UNEXPECTED SIGBUS/SIGSEGV; thread parked, main thread reports\n";
    // SAFETY: write(2) on stderr is async-signal-safe; the buffer is valid.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    loop {
        // SAFETY: pause is async-signal-safe.
        unsafe { libc::pause() };
    }
}

struct SignalGuard {
    old: [libc::sigaction; 2],
}

const SIGNALS: [libc::c_int; 2] = [libc::SIGBUS, libc::SIGSEGV];

impl SignalGuard {
    fn install() -> SignalGuard {
        // SAFETY: sigaction is plain data; zeroed is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_fault_signal;
        act.sa_sigaction = h as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `act.sa_mask` is a valid sigset to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: as above.
        let mut old: [libc::sigaction; 2] = unsafe { std::mem::zeroed() };
        for (i, &s) in SIGNALS.iter().enumerate() {
            if s == libc::SIGBUS {
                // Through usermm where a space resolves its faults in the
                // faulting thread (USERMM_TEST_INTHREAD): the handler usermm
                // chains to, not one in front of usermm's (plain sigaction
                // elsewhere).
                let r = usermm_sys::inthread::sigbus_action(Some(&act), Some(&mut old[i]));
                assert_eq!(r, Ok(()), "sigbus_action");
                continue;
            }
            // SAFETY: both pointers are valid sigaction structs; the handler
            // has the SA_SIGINFO signature.
            let r = unsafe { libc::sigaction(s, &act, &mut old[i]) };
            assert_eq!(r, 0, "sigaction");
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (i, &s) in SIGNALS.iter().enumerate() {
            if s == libc::SIGBUS {
                let _ = usermm_sys::inthread::sigbus_action(Some(&self.old[i]), None);
                continue;
            }
            // SAFETY: `old[i]` is what sigaction returned for `s`.
            unsafe { libc::sigaction(s, &self.old[i], std::ptr::null_mut()) };
        }
    }
}

// ---------------------------------------------------------------- host swap

static HOST_SWAP: Mutex<Option<PathBuf>> = Mutex::new(None);

fn run_cmd(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {args:?}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A 512 MiB host swap file, active while the guard lives.
struct HostSwap;

impl HostSwap {
    fn on() -> HostSwap {
        let path = PathBuf::from(format!("/tmp/usermm-soak-swap-{}", std::process::id()));
        let p = path.to_str().unwrap();
        let _ = std::fs::remove_file(&path);
        if run_cmd("fallocate", &["-l", "512M", p]).is_err() {
            run_cmd("dd", &["if=/dev/zero", &format!("of={p}"), "bs=1M", "count=512"]).expect("create swap file");
        }
        run_cmd("chmod", &["600", p]).expect("chmod swap file");
        run_cmd("mkswap", &[p]).expect("mkswap");
        *HOST_SWAP.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.clone());
        if let Err(e) = run_cmd("swapon", &[p]) {
            host_swap_off();
            panic!("swapon: {e}");
        }
        eprintln!("soak: host swap file {p} (512 MiB) active");
        HostSwap
    }
}

fn host_swap_off() {
    let path = HOST_SWAP.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(path) = path {
        let p = path.to_str().unwrap();
        if let Err(e) = run_cmd("swapoff", &[p]) {
            eprintln!("soak: {e}");
        }
        let _ = std::fs::remove_file(&path);
        eprintln!("soak: host swap file {p} off and removed");
    }
}

impl Drop for HostSwap {
    fn drop(&mut self) {
        host_swap_off();
    }
}

// ---------------------------------------------------------------- progress

static START: OnceLock<Instant> = OnceLock::new();

fn now_ms() -> u64 {
    START.get().unwrap().elapsed().as_millis() as u64 + 1
}

/// One actor's progress (a worker, or the main thread's own calls).
struct Slot {
    name: String,
    /// When the call in flight began (ms since start; 0: none in flight).
    busy_since: AtomicU64,
    ops: AtomicU64,
    current: Mutex<(String, usize, usize)>,
    /// (text, range start, range end) of the last `HISTORY` calls.
    history: Mutex<VecDeque<(String, usize, usize)>>,
}

impl Slot {
    fn new(name: String) -> Slot {
        Slot {
            name,
            busy_since: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            current: Mutex::new((String::new(), 0, 0)),
            history: Mutex::new(VecDeque::new()),
        }
    }
    fn begin(&self, what: String, lo: usize, hi: usize) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = (what, lo, hi);
        self.busy_since.store(now_ms(), Ordering::SeqCst);
    }
    fn end(&self, result: &str) {
        self.busy_since.store(0, Ordering::SeqCst);
        self.ops.fetch_add(1, Ordering::Relaxed);
        let (cur, lo, hi) = std::mem::take(&mut *self.current.lock().unwrap_or_else(|e| e.into_inner()));
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back((format!("{:>9.3}s {cur} -> {result}", now_ms() as f64 / 1000.0), lo, hi));
    }
    /// The last `TAIL` calls, and before them the older ones whose range
    /// covers `addr` (if given).
    fn history_text(&self, addr: Option<usize>) -> String {
        let mut s = String::new();
        let Ok(h) = self.history.try_lock() else { return "      (history locked)\n".into() };
        let tail = h.len().saturating_sub(TAIL);
        if let Some(a) = addr {
            let _ = writeln!(s, "    older calls that covered {a:#x}:");
            for (l, lo, hi) in h.iter().take(tail) {
                if (*lo..*hi).contains(&a) {
                    let _ = writeln!(s, "      {l}");
                }
            }
            let _ = writeln!(s, "    last {TAIL} calls:");
        }
        for (l, lo, hi) in h.iter().skip(tail) {
            let mark = if addr.is_some_and(|a| (*lo..*hi).contains(&a)) { "*" } else { " " };
            let _ = writeln!(s, "     {mark}{l}");
        }
        s
    }
    fn current_text(&self) -> String {
        let since = self.busy_since.load(Ordering::SeqCst);
        let cur = self.current.try_lock().map(|c| c.0.clone()).unwrap_or_else(|_| "(locked)".into());
        if since == 0 {
            format!("idle (between ops), {} ops done", self.ops.load(Ordering::Relaxed))
        } else {
            format!(
                "IN `{cur}` for {:.1} s, {} ops done",
                (now_ms() - since) as f64 / 1000.0,
                self.ops.load(Ordering::Relaxed)
            )
        }
    }
}

struct Shared {
    slots: Vec<Slot>, // THREADS workers, then main
    stop: AtomicBool,
    finished: AtomicBool,
    failed: Mutex<Vec<String>>,
    counts: Vec<AtomicU64>, // per OPS index
    bytes_written: AtomicU64,
    bytes_verified: AtomicU64,
    sigbus_handled: AtomicU64,
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p).map(|s| s.trim_end().to_string()).unwrap_or_else(|e| format!("({e})"))
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(cmd)).find(|p| p.is_file())
}

/// Every task of the process (comm, state, wchan, kernel stack) and the user
/// stacks from gdb or eu-stack.
fn dump_stacks() -> String {
    let mut s = String::from("=== tasks of this process (/proc/self/task) ===\n");
    let mut tids: Vec<u32> = std::fs::read_dir("/proc/self/task")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    for t in &tids {
        let base = format!("/proc/self/task/{t}");
        let stat = read_trim(&format!("{base}/stat"));
        let state = stat.rsplit_once(") ").map(|x| x.1.chars().next().unwrap_or('?')).unwrap_or('?');
        let _ = writeln!(
            s,
            "--- tid {t} comm {:?} state {state} wchan {}",
            read_trim(&format!("{base}/comm")),
            read_trim(&format!("{base}/wchan"))
        );
        for l in read_trim(&format!("{base}/stack")).lines() {
            let _ = writeln!(s, "      {l}");
        }
    }
    // Print what we have before gdb runs (should it take the process down).
    eprint!("{s}");
    s.clear();
    let pid = std::process::id().to_string();
    let t0 = Instant::now();
    // A task in uninterruptible sleep (D: e.g. a kernel-mode userfaultfd
    // fault from inside madvise or a syscall) cannot be stopped by ptrace:
    // gdb would wait for it until its timeout. Its kernel stack is above.
    let stuck: Vec<u32> = tids
        .iter()
        .copied()
        .filter(|t| {
            let st = read_trim(&format!("/proc/self/task/{t}/stat"));
            st.rsplit_once(") ").is_some_and(|x| x.1.starts_with('D'))
        })
        .collect();
    if !stuck.is_empty() {
        let _ = writeln!(
            s,
            "=== user stacks: SKIPPED: tasks {stuck:?} are in uninterruptible sleep (D), which ptrace cannot stop \
             (gdb would hang); see their kernel stacks above ==="
        );
        return s;
    }
    let tool = if which("gdb").is_some() {
        Some((
            "gdb",
            Command::new("timeout")
                .args(["-k", "5", "120", "gdb", "-p", &pid, "-batch", "-nx", "-q"])
                .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
                .output(),
        ))
    } else if which("eu-stack").is_some() {
        Some(("eu-stack", Command::new("timeout").args(["-k", "5", "120", "eu-stack", "-p", &pid]).output()))
    } else {
        None
    };
    match tool {
        None => s.push_str("=== user stacks: NEITHER gdb NOR eu-stack IS INSTALLED: no user-space stacks ===\n"),
        Some((name, Err(e))) => {
            let _ = writeln!(s, "=== user stacks: running {name} failed: {e} ===");
        }
        Some((name, Ok(out))) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let _ =
                writeln!(s, "=== user stacks ({name}, {}, took {:.1} s) ===", out.status, t0.elapsed().as_secs_f64());
            for l in text.lines() {
                // gdb's chatter about loading symbols is noise.
                if !l.starts_with("[New LWP") && !l.contains("Downloading") {
                    s.push_str(l);
                    s.push('\n');
                }
            }
            s.push_str(&String::from_utf8_lossy(&out.stderr));
            s.push_str(&stack_summary(&text));
        }
    }
    s
}

/// One line per thread of gdb's `thread apply all bt`: its name and the
/// innermost frames in usermm's or this test's code.
fn stack_summary(gdb: &str) -> String {
    let mut s = String::from("=== stack summary (innermost usermm/soak frames per thread) ===\n");
    let mut cur: Option<(String, Vec<String>)> = None;
    let flush = |s: &mut String, cur: &mut Option<(String, Vec<String>)>| {
        if let Some((t, f)) = cur.take() {
            let _ = writeln!(s, "  {t}: {}", if f.is_empty() { "(no usermm frame)".into() } else { f.join(" <- ") });
        }
    };
    for l in gdb.lines() {
        if l.starts_with("Thread ") {
            flush(&mut s, &mut cur);
            let name = l.split('"').nth(1).unwrap_or("?");
            let lwp = l.split("LWP ").nth(1).and_then(|x| x.split(')').next()).unwrap_or("?");
            cur = Some((format!("{name} (tid {lwp})"), Vec::new()));
        } else if let Some((_, f)) = cur.as_mut() {
            if l.starts_with('#') && f.len() < 3 {
                let func = l.split(" in ").nth(1).unwrap_or(l.split_whitespace().nth(1).unwrap_or(""));
                let func = func.split(" (").next().unwrap_or(func);
                let at = l.rsplit(" at ").next().unwrap_or("");
                if func.starts_with("usermm") || func.starts_with("soak::") {
                    f.push(format!("{func} ({})", at.rsplit('/').next().unwrap_or(at)));
                }
            }
        }
    }
    flush(&mut s, &mut cur);
    s
}

/// `space.stats()` on a helper thread: the core lock may be the one held.
fn stats_with_timeout(space: &Weak<Space>) -> String {
    let Some(sp) = space.upgrade() else { return "(space closed)".into() };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let st = sp.stats();
        let _ = tx.send(st);
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(st) => format!("{st:?}"),
        Err(_) => "(stats() did not return within 3 s: the core lock is held)".into(),
    }
}

/// Prints the full report and aborts the process: the test fails, CI never
/// stalls.
fn fatal(sh: &Shared, space: &Weak<Space>, what: &str) -> ! {
    let mut s = format!("\n\n################ SOAK FAILURE: {what} ({:.1} s into the run)\n", now_ms() as f64 / 1000.0);
    for sl in &sh.slots {
        let _ = writeln!(s, "  [{}] {}\n    history (oldest first):", sl.name, sl.current_text());
        s.push_str(&sl.history_text(None));
    }
    let _ = writeln!(s, "  stats: {}", stats_with_timeout(space));
    eprint!("{s}");
    // gdb stops the process with SIGINT; one still pending when it detaches
    // would end the process before the report is out. A no-op handler (not
    // SIG_IGN: an ignored SIGINT never reaches gdb, which then waits for it).
    extern "C" fn ignore(_: libc::c_int) {}
    let h: extern "C" fn(libc::c_int) = ignore;
    // SAFETY: the handler is async-signal-safe (it does nothing).
    unsafe { libc::signal(libc::SIGINT, h as libc::sighandler_t) };
    eprint!("{}", dump_stacks());
    eprintln!("################ SOAK FAILURE: {what} (aborting the process)\n");
    host_swap_off();
    // No core dump of a process with a 64 GiB reservation.
    let rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &rl) };
    std::process::abort();
}

fn watchdog(sh: Arc<Shared>, space: Weak<Space>, limit: Duration) {
    let limit_ms = limit.as_millis() as u64;
    let total = |sh: &Shared| sh.slots.iter().map(|s| s.ops.load(Ordering::Relaxed)).sum::<u64>();
    let mut last = total(&sh);
    let mut last_change = now_ms();
    while !sh.finished.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let now = now_ms();
        let sig = BAD_SIG.load(Ordering::SeqCst);
        if sig != 0 {
            let w = BAD_WORKER.load(Ordering::SeqCst);
            let who = if w < THREADS { format!("worker {w}") } else { "a non-worker thread".into() };
            let addr = BAD_ADDR.load(Ordering::SeqCst);
            fatal(
                &sh,
                &space,
                &format!(
                    "unexpected {} in {who} (tid {}), si_code {}, si_addr {addr:#x} (page {:#x})",
                    if sig == libc::SIGBUS { "SIGBUS" } else { "SIGSEGV" },
                    BAD_TID.load(Ordering::SeqCst),
                    BAD_CODE.load(Ordering::SeqCst),
                    addr & !(PS - 1)
                ),
            );
        }
        for sl in &sh.slots {
            let since = sl.busy_since.load(Ordering::SeqCst);
            if since != 0 && now.saturating_sub(since) >= limit_ms {
                fatal(&sh, &space, &format!("HANG: [{}] has been inside one call for {limit:?}", sl.name));
            }
        }
        let t = total(&sh);
        if t != last {
            last = t;
            last_change = now;
        } else if now - last_change >= limit_ms {
            fatal(&sh, &space, &format!("HANG: no thread made progress for {limit:?}"));
        }
    }
}

// ---------------------------------------------------------------- model

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Prot {
    Rw,
    R,
    No,
}

impl Prot {
    fn bits(self) -> i32 {
        match self {
            Prot::Rw => PROT_READ | PROT_WRITE,
            Prot::R => PROT_READ,
            Prot::No => PROT_NONE,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lock {
    No,
    Locked,
    OnFault,
}

struct Page {
    /// The expected bytes.
    data: Vec<u8>,
    /// After MADV_FREE: the other allowed contents (zeros, with the bytes
    /// written since applied). A page freed again before a read settled it
    /// keeps every earlier alternative too: it may have been discarded
    /// before the writes in between, so zeros-plus-those-writes is as right
    /// as the expected bytes. A read settles which contents it is, but a
    /// page not written since its last MADV_FREE keeps zeros as an
    /// alternative (it can still be discarded).
    alt: Vec<Vec<u8>>,
    /// Written since MADV_FREE (the lazy free is cancelled: no later
    /// discard; a read settles which contents it is).
    written_since_free: bool,
    volatile: bool,
    lock: Lock,
    prot: Prot,
}

impl Page {
    fn zero() -> Page {
        Page {
            data: vec![0; PS],
            alt: Vec::new(),
            written_since_free: false,
            volatile: false,
            lock: Lock::No,
            prot: Prot::Rw,
        }
    }
    fn set_zero(&mut self) {
        self.data.fill(0);
        self.alt.clear();
        self.written_since_free = false;
    }
    fn readable(&self) -> bool {
        self.prot != Prot::No && !self.volatile
    }
    fn writable(&self) -> bool {
        self.prot == Prot::Rw && !self.volatile
    }
    fn locked(&self) -> bool {
        self.lock != Lock::No
    }
    fn describe(&self) -> String {
        format!(
            "prot {:?} lock {:?} volatile {} lazily-freed {} written-since-free {}",
            self.prot,
            self.lock,
            self.volatile,
            !self.alt.is_empty(),
            self.written_since_free
        )
    }
}

struct Worker<'a> {
    idx: usize,
    space: &'a Space,
    sh: &'a Shared,
    rng: Rng,
    /// Start address of each region (fixed for the whole run).
    bases: [usize; REGIONS],
    pages: Vec<Page>,
    seq: u64,
    buf: Vec<u8>,
    locked: usize,
    selftest: String,
    /// Whether this run forks (`Op::Fork`).
    forks: bool,
}

/// When the last fork of the run was (`now_ms`): one every
/// [`FORK_EVERY_MS`] at most, all workers together.
static LAST_FORK: AtomicU64 = AtomicU64::new(0);
const FORK_EVERY_MS: u64 = 250;
/// Forks whose child checked its copy.
static FORKS: AtomicU64 = AtomicU64::new(0);

fn errno_str(r: &Result<(), Errno>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("{e:?}"),
    }
}

impl Worker<'_> {
    fn slot(&self) -> &Slot {
        &self.sh.slots[self.idx]
    }

    fn addr(&self, p: usize) -> usize {
        self.bases[p / REGION_PAGES] + (p % REGION_PAGES) * PS
    }

    /// A random run `[first, first+n)` inside one region, `n <= max`.
    fn run(&mut self, max: usize) -> (usize, usize) {
        let r = self.rng.index(REGIONS);
        let n = 1 + self.rng.index(max.min(REGION_PAGES));
        let off = self.rng.index(REGION_PAGES - n + 1);
        (r * REGION_PAGES + off, n)
    }

    /// The longest prefix of the run whose pages satisfy `ok`.
    fn clip(&self, first: usize, n: usize, ok: impl Fn(&Page) -> bool) -> usize {
        (first..first + n).take_while(|&p| ok(&self.pages[p])).count()
    }

    fn fail(&self, msg: String) -> ! {
        self.fail_at(msg, None)
    }

    /// Fails the test; `addr`: the address concerned (its calls are listed).
    fn fail_at(&self, msg: String, addr: Option<usize>) -> ! {
        let s = format!("worker {} ({:.1} s into the run): {msg}", self.idx, now_ms() as f64 / 1000.0);
        eprintln!(
            "\n################ SOAK FAILURE: {s}\n  history of worker {} (oldest first, * = covers the address):\n{}",
            self.idx,
            self.slot().history_text(addr)
        );
        self.sh.failed.lock().unwrap_or_else(|e| e.into_inner()).push(s.clone());
        self.sh.stop.store(true, Ordering::SeqCst);
        panic!("{s}");
    }

    /// Makes a call into usermm under the watchdog, recording it.
    fn call<T>(&self, what: String, range: (usize, usize), f: impl FnOnce() -> T, show: impl Fn(&T) -> String) -> T {
        self.slot().begin(what, range.0, range.1);
        let r = f();
        self.slot().end(&show(&r));
        r
    }

    fn verify(&mut self, p: usize) {
        let addr = self.addr(p);
        let mut buf = std::mem::take(&mut self.buf);
        mem_read(addr, &mut buf);
        let pg = &mut self.pages[p];
        let ok_data = buf == pg.data;
        // A page lazily freed and not written since its last MADV_FREE can
        // still be discarded: its zeros stay an alternative whatever a read
        // shows now (only a write cancels a lazy free).
        let discardable = !pg.alt.is_empty() && !pg.written_since_free;
        let still = |data: &[u8]| {
            if discardable && data.iter().any(|&b| b != 0) {
                vec![vec![0u8; PS]]
            } else {
                Vec::new()
            }
        };
        if ok_data {
            // Not discarded before any write in between: the alternatives
            // that assumed so are gone.
            pg.alt = still(&pg.data);
            pg.written_since_free = false;
        } else if let Some(i) = pg.alt.iter().position(|a| *a == buf) {
            // Discarded before the writes since (or now): those contents
            // it is, and zeros if still lazily freed (freed again after
            // the writes: seen as a corruption by a 10-minute soak, which
            // adopted the zeros-plus-writes contents and dropped the zeros).
            pg.data = pg.alt.swap_remove(i);
            pg.alt = still(&pg.data);
            pg.written_since_free = false;
        } else if discardable && torn_by_discard(&buf, &pg.data, &pg.alt) {
            // Discarded while it was being copied: some bytes old, the
            // others the discarded page's zeros — a reader on Linux can see
            // that too (its discard clears the page table entry under a
            // reader's copy). Seen in soaks (a page read as its 32 first
            // bytes, then zeros). The page must read discarded now.
            let mut again = vec![0u8; PS];
            mem_read(addr, &mut again);
            if again.iter().all(|&b| b == 0) {
                pg.data = again;
                pg.alt.clear();
                pg.written_since_free = false;
            } else {
                let msg = format!(
                    "CORRUPTION at {addr:#x} (page {p}): a lazily freed page read as a mix of its contents and \
                     zeros, but read again it is not discarded; page state: {}",
                    pg.describe()
                );
                self.fail_at(msg, Some(addr));
            }
        } else {
            // The first byte that is neither allowed value.
            let alt_ok = |i: usize| pg.alt.iter().any(|a| buf[i] == a[i]);
            let off = (0..PS).find(|&i| buf[i] != pg.data[i] && !alt_ok(i));
            let off = off.unwrap_or_else(|| (0..PS).find(|&i| buf[i] != pg.data[i]).unwrap());
            let bad = (0..PS).filter(|&i| buf[i] != pg.data[i]).count();
            let zeros = buf.iter().all(|&b| b == 0);
            let hdr = |b: &[u8]| {
                (u64::from_le_bytes(b[0..8].try_into().unwrap()), u64::from_le_bytes(b[8..16].try_into().unwrap()))
            };
            let (ga, gs) = hdr(&buf);
            let (ea, es) = hdr(&pg.data);
            let msg = format!(
                "CORRUPTION at {:#x} (page {p} = region {} page {}, offset {off}): expected {:#04x}{} got {:#04x}; \
                 {bad} of {PS} bytes differ from the expected contents{}; page read {}; header read (addr {ga:#x}, \
                 write #{gs}), expected (addr {ea:#x}, write #{es}); page state: {}",
                addr + off,
                p / REGION_PAGES,
                p % REGION_PAGES,
                pg.data[off],
                pg.alt
                    .first()
                    .map(|a| format!(" or {:#04x} (lazily freed: old or zeros, {} alternatives)", a[off], pg.alt.len()))
                    .unwrap_or_default(),
                buf[off],
                if pg.alt.is_empty() { "" } else { " and from the zeros alternatives" },
                if zeros { "ALL ZEROS" } else { "not all zeros" },
                pg.describe()
            );
            self.fail_at(msg, Some(addr));
        }
        self.buf = buf;
    }

    fn write_page(&mut self, p: usize) {
        self.seq += 1;
        let addr = self.addr(p);
        let mut r = Rng::new(addr as u64 ^ self.seq.rotate_left(32));
        let pg = &mut self.pages[p];
        pg.data[0..8].copy_from_slice(&(addr as u64).to_le_bytes());
        pg.data[8..16].copy_from_slice(&self.seq.to_le_bytes());
        for w in pg.data[16..].chunks_exact_mut(8) {
            w.copy_from_slice(&r.next_u64().to_le_bytes());
        }
        pg.alt.clear();
        pg.written_since_free = false;
        mem_write(addr, &pg.data);
    }

    /// [`Op::Fork`]: a child checks this worker's pages (its model is
    /// exact between its calls; the other workers are anywhere in theirs
    /// at the fork), pages them out and checks them again.
    fn fork(&mut self) {
        let now = now_ms();
        let last = LAST_FORK.load(Ordering::Relaxed);
        if !self.forks
            || now < last + FORK_EVERY_MS
            || LAST_FORK.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        self.slot().begin(format!("fork (the child checks this worker's {PAGES} pages)"), 0, 0);
        let r = usermm_sys::thread::fork_run(60, || {
            let mut buf = vec![0u8; PS];
            let check = |buf: &mut Vec<u8>| -> Option<usize> {
                (0..PAGES).find(|&p| {
                    let pg = &self.pages[p];
                    if !pg.readable() {
                        return false;
                    }
                    mem_read(self.addr(p), buf);
                    let discardable = !pg.alt.is_empty() && !pg.written_since_free;
                    !(*buf == pg.data || pg.alt.contains(buf) || discardable && torn_by_discard(buf, &pg.data, &pg.alt))
                })
            };
            if check(&mut buf).is_some() {
                return 2;
            }
            for b in self.bases {
                if self.space.madvise(b, REGION_PAGES * PS, MADV_PAGEOUT).is_err() {
                    return 3;
                }
            }
            if check(&mut buf).is_some() {
                return 4;
            }
            self.space.validate();
            0
        });
        match r {
            Ok(usermm_sys::thread::ChildExit::Exited(0)) => {
                FORKS.fetch_add(1, Ordering::Relaxed);
                self.slot().end("ok");
            }
            other => {
                let what = match other {
                    Ok(usermm_sys::thread::ChildExit::Exited(2)) => "a page differs from the model as of the fork",
                    Ok(usermm_sys::thread::ChildExit::Exited(3)) => "MADV_PAGEOUT failed",
                    Ok(usermm_sys::thread::ChildExit::Exited(4)) => "a page differs after the child paged it out",
                    _ => "the child failed",
                };
                self.fail_at(format!("FORK: the forked child's check: {what} ({other:?})"), None);
            }
        }
    }

    fn step(&mut self, op: Op) {
        let name = op_name(op);
        if self.idx == 0 && self.selftest == "hang" && self.slot().ops.load(Ordering::Relaxed) > 1000 {
            self.slot().begin("SELFTEST: sleeping forever".into(), 0, 0);
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        match op {
            Op::Fork => self.fork(),
            Op::Write => {
                let (first, n) = self.run(32);
                let (a, b) = (self.addr(first), self.addr(first) + n * PS);
                self.slot().begin(format!("{name} pages {first}+{n} [{a:#x}..{b:#x})"), a, b);
                let mut w = 0;
                for p in first..first + n {
                    if self.pages[p].writable() {
                        self.write_page(p);
                        w += 1;
                    }
                }
                self.sh.bytes_written.fetch_add((w * PS) as u64, Ordering::Relaxed);
                self.slot().end(&format!("ok, {w} pages written"));
            }
            Op::PWrite => {
                let (p, _) = self.run(1);
                if !self.pages[p].writable() {
                    return;
                }
                let off = self.rng.index(PS);
                let len = (1 + self.rng.index(512)).min(PS - off);
                let a = self.addr(p);
                let mut bytes = vec![0u8; len];
                for b in bytes.iter_mut() {
                    *b = self.rng.next_u64() as u8;
                }
                self.slot().begin(format!("{name} page {p} [{a:#x}] bytes {off}+{len}"), a, a + PS);
                mem_write(a + off, &bytes);
                let pg = &mut self.pages[p];
                pg.data[off..off + len].copy_from_slice(&bytes);
                for alt in pg.alt.iter_mut() {
                    alt[off..off + len].copy_from_slice(&bytes);
                }
                if !pg.alt.is_empty() {
                    pg.written_since_free = true;
                }
                self.sh.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
                self.slot().end("ok");
            }
            Op::Read => {
                let (first, n) = self.run(64);
                let (a, b) = (self.addr(first), self.addr(first) + n * PS);
                self.slot().begin(format!("{name} pages {first}+{n} [{a:#x}..{b:#x})"), a, b);
                let mut v = 0;
                for p in first..first + n {
                    if self.pages[p].readable() {
                        self.verify(p);
                        v += 1;
                    }
                }
                self.sh.bytes_verified.fetch_add((v * PS) as u64, Ordering::Relaxed);
                self.slot().end(&format!("ok, {v} pages verified"));
            }
            Op::Free | Op::DontNeed => {
                let (first, n) = self.run(64);
                let n = self.clip(first, n, |pg| !pg.locked() && !pg.volatile);
                if n == 0 {
                    return;
                }
                let a = self.addr(first);
                let adv = if op == Op::Free { MADV_FREE } else { MADV_DONTNEED };
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
                    (a, a + n * PS),
                    || self.space.madvise(a, n * PS, adv),
                    errno_str,
                );
                if let Err(e) = r {
                    self.fail(format!("madvise({name}) on {a:#x}+{n} pages: {e:?}"));
                }
                for pg in &mut self.pages[first..first + n] {
                    if op == Op::DontNeed {
                        pg.set_zero();
                    } else {
                        // Freed again before a read settled it: every
                        // earlier alternative stays possible, and zeros.
                        if !pg.alt.iter().any(|a| a.iter().all(|&b| b == 0)) {
                            pg.alt.push(vec![0; PS]);
                        }
                        pg.written_since_free = false;
                    }
                }
            }
            Op::WillNeed | Op::PageOut | Op::Cold => {
                let (first, n) = self.run(128);
                let a = self.addr(first);
                let adv = match op {
                    Op::WillNeed => MADV_WILLNEED,
                    Op::PageOut => MADV_PAGEOUT,
                    _ => MADV_COLD,
                };
                // Linux: MADV_COLD and MADV_PAGEOUT on a locked region are
                // EINVAL (can_madv_lru_vma).
                let locked = op != Op::WillNeed && self.pages[first..first + n].iter().any(Page::locked);
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x}) locked {locked}", a + n * PS),
                    (a, a + n * PS),
                    || self.space.madvise(a, n * PS, adv),
                    errno_str,
                );
                let want = if locked { Err(Errno::EINVAL) } else { Ok(()) };
                if r != want {
                    self.fail(format!("madvise({name}) on {a:#x}+{n} pages: {r:?}, expected {want:?}"));
                }
            }
            Op::PopRead | Op::PopWrite => {
                let (first, n) = self.run(64);
                let n = self.clip(first, n, |pg| !pg.volatile);
                if n == 0 {
                    return;
                }
                let a = self.addr(first);
                let write = op == Op::PopWrite;
                let lacking = self.pages[first..first + n].iter().any(|pg| {
                    if write {
                        pg.prot != Prot::Rw
                    } else {
                        pg.prot == Prot::No
                    }
                });
                let adv = if write { MADV_POPULATE_WRITE } else { MADV_POPULATE_READ };
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x}) lacking-prot {lacking}", a + n * PS),
                    (a, a + n * PS),
                    || self.space.madvise(a, n * PS, adv),
                    errno_str,
                );
                let want = if lacking { Err(Errno::EINVAL) } else { Ok(()) };
                if r != want {
                    self.fail(format!("madvise({name}) on {a:#x}+{n} pages: {r:?}, expected {want:?}"));
                }
                // An OnFault-locked page populated is locked now: nothing
                // to model (both kinds stay locked).
            }
            Op::Mlock | Op::MlockOnFault => {
                let (first, n) = self.run(16);
                let n = self.clip(first, n, |pg| !pg.volatile && pg.prot != Prot::No);
                let new = self.pages[first..first + n].iter().filter(|pg| !pg.locked()).count();
                if n == 0 || self.locked + new > LOCK_CAP {
                    return;
                }
                let a = self.addr(first);
                let flags = if op == Op::Mlock { 0 } else { MLOCK_ONFAULT };
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
                    (a, a + n * PS),
                    || self.space.mlock2(a, n * PS, flags),
                    errno_str,
                );
                match r {
                    Ok(()) => {
                        for pg in &mut self.pages[first..first + n] {
                            pg.lock = if op == Op::Mlock { Lock::Locked } else { Lock::OnFault };
                        }
                        self.locked += new;
                    }
                    // The budget could not hold them: nothing new locked.
                    Err(Errno::EAGAIN) if op == Op::Mlock => {}
                    Err(e) => self.fail(format!("{name} on {a:#x}+{n} pages: {e:?}")),
                }
            }
            Op::Munlock => {
                let (first, n) = self.run(64);
                let a = self.addr(first);
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
                    (a, a + n * PS),
                    || self.space.munlock(a, n * PS),
                    errno_str,
                );
                if let Err(e) = r {
                    self.fail(format!("munlock on {a:#x}+{n} pages: {e:?}"));
                }
                for pg in &mut self.pages[first..first + n] {
                    if pg.locked() {
                        self.locked -= 1;
                    }
                    pg.lock = Lock::No;
                }
            }
            Op::Mvolatile => {
                let (first, n) = self.run(32);
                let n = self.clip(first, n, |pg| !pg.locked());
                if n == 0 {
                    return;
                }
                let a = self.addr(first);
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
                    (a, a + n * PS),
                    || self.space.mvolatile(a, n * PS),
                    errno_str,
                );
                if let Err(e) = r {
                    self.fail(format!("mvolatile on {a:#x}+{n} pages: {e:?}"));
                }
                for pg in &mut self.pages[first..first + n] {
                    pg.volatile = true;
                }
            }
            Op::Mnovolatile => {
                let (first, n) = self.run(64);
                self.mnovolatile(first, n);
            }
            Op::VTouch => {
                // Readable volatile pages (a PROT_NONE one would raise SIGSEGV).
                let vol: Vec<usize> =
                    (0..PAGES).filter(|&p| self.pages[p].volatile && self.pages[p].prot != Prot::No).collect();
                if vol.is_empty() {
                    return;
                }
                let p = vol[self.rng.index(vol.len())];
                let a = self.addr(p);
                let off = self.rng.index(PS);
                self.slot().begin(format!("{name} page {p} [{a:#x}] byte {off}"), a, a + PS);
                HANDLED.with(|h| h.set(Handled::None));
                if self.selftest != "sigbus" {
                    EXPECT.with(|e| e.set(a));
                }
                // The handler runs inside the read: compiler fences keep the
                // stores to EXPECT before it and the load of HANDLED after it
                // (a volatile access alone orders nothing else).
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                // SAFETY: as `mem_read`; a purged page raises SIGBUS, which
                // the handler serves (mnovolatile) before the retry.
                let got = unsafe { std::ptr::read_volatile((a + off) as *const u8) };
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                EXPECT.with(|e| e.set(0));
                let h = HANDLED.with(Cell::get);
                self.slot().end(&format!("read {got:#04x}, sigbus {h:?}"));
                let pg = &mut self.pages[p];
                match h {
                    Handled::None => {
                        let ok = got == pg.data[off] || pg.alt.iter().any(|x| x[off] == got);
                        if !ok {
                            let want = pg.data[off];
                            let st = pg.describe();
                            // What the whole page holds now (still volatile:
                            // read it only if the byte was not a SIGBUS).
                            let mut buf = vec![0u8; PS];
                            mem_read(a, &mut buf);
                            let zeros = buf.iter().filter(|&&b| b == 0).count();
                            let same = buf.iter().zip(&pg.data).filter(|(x, y)| x == y).count();
                            let mut ps = [0u32; 1];
                            let _ = self.space.page_state(a, 1, &mut ps);
                            self.fail_at(
                                format!(
                                    "CORRUPTION: volatile page {p} at {:#x} read with no SIGBUS: expected {want:#04x} got \
                                     {got:#04x}; the page now holds {zeros} zero bytes, {same} bytes as expected; page \
                                     state: {st}; umm_page_state {:#x}",
                                    a + off,
                                    ps[0]
                                ),
                                Some(a),
                            );
                        }
                    }
                    Handled::Purged => {
                        self.sh.sigbus_handled.fetch_add(1, Ordering::Relaxed);
                        pg.volatile = false;
                        pg.set_zero();
                        if got != 0 {
                            self.fail(format!("purged page {p} at {:#x} read {got:#04x} after SIGBUS", a + off));
                        }
                        self.verify(p);
                    }
                    Handled::NotPurged => self.fail(format!(
                        "SPURIOUS SIGBUS on volatile page {p} at {:#x}: mnovolatile says it was not purged",
                        a + off
                    )),
                    Handled::Error(e) => {
                        self.fail(format!("mnovolatile in the SIGBUS handler of page {p} at {a:#x}: errno {e}"))
                    }
                }
            }
            Op::Mprotect => {
                let (first, n) = self.run(64);
                let a = self.addr(first);
                let prot = match self.rng.index(10) {
                    0..=5 => Prot::Rw,
                    6..=8 => Prot::R,
                    _ => Prot::No,
                };
                let r = self.call(
                    format!("{name} pages {first}+{n} [{a:#x}..{:#x}) {prot:?}", a + n * PS),
                    (a, a + n * PS),
                    || self.space.mprotect(a, n * PS, prot.bits()),
                    errno_str,
                );
                if let Err(e) = r {
                    self.fail(format!("mprotect({prot:?}) on {a:#x}+{n} pages: {e:?}"));
                }
                for pg in &mut self.pages[first..first + n] {
                    pg.prot = prot;
                }
            }
            Op::Remap => {
                let (mut first, mut n) = self.run(REGION_PAGES);
                if self.rng.ratio(30, 100) {
                    first -= first % REGION_PAGES;
                    n = REGION_PAGES;
                }
                let a = self.addr(first);
                let unmap_first = self.rng.ratio(50, 100);
                // A third of the new mappings resolve their faults in the
                // faulting thread (`UMM_MAP_INTHREAD`), beside the others'
                // handler threads: every op then meets both kinds.
                let in_thread = if self.rng.ratio(33, 100) { UMM_MAP_INTHREAD } else { 0 };
                let what = match (unmap_first, in_thread != 0) {
                    (true, false) => "munmap+mmap(MAP_FIXED)",
                    (false, false) => "mmap(MAP_FIXED) over",
                    (true, true) => "munmap+mmap(MAP_FIXED|UMM_MAP_INTHREAD)",
                    (false, true) => "mmap(MAP_FIXED|UMM_MAP_INTHREAD) over",
                };
                let r = self.call(
                    format!("{name} {what} pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
                    (a, a + n * PS),
                    || {
                        if unmap_first {
                            self.space.munmap(a, n * PS)?;
                        }
                        self.space.mmap(
                            a,
                            n * PS,
                            PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | in_thread,
                            -1,
                            0,
                        )
                    },
                    |r| format!("{r:x?}"),
                );
                if r != Ok(a) {
                    self.fail(format!("{what} at {a:#x}+{n} pages: {r:x?}"));
                }
                for pg in &mut self.pages[first..first + n] {
                    if pg.locked() {
                        self.locked -= 1;
                    }
                    *pg = Page::zero();
                }
            }
        }
    }

    fn mnovolatile(&mut self, first: usize, n: usize) {
        let a = self.addr(first);
        let r = self.call(
            format!("mnovolatile pages {first}+{n} [{a:#x}..{:#x})", a + n * PS),
            (a, a + n * PS),
            || self.space.mnovolatile(a, n * PS),
            |r| match r {
                Ok((p, rep)) => format!("purged {p} ({} pages)", rep.purged_pages),
                Err(e) => format!("{e:?}"),
            },
        );
        let (purged, rep) = match r {
            Ok(x) => x,
            Err(e) => self.fail(format!("mnovolatile on {a:#x}+{n} pages: {e:?}")),
        };
        let mut count = 0;
        for i in 0..n {
            let bit = rep.bitmap[i / 64] >> (i % 64) & 1 == 1;
            let pg = &mut self.pages[first + i];
            if bit {
                count += 1;
                if !pg.volatile {
                    let s =
                        format!("mnovolatile reports page {} at {:#x} purged, but it was not volatile", first + i, a);
                    self.fail(s);
                }
                pg.set_zero();
            }
            pg.volatile = false;
        }
        if count != rep.purged_pages || purged != (count > 0) {
            self.fail(format!("mnovolatile at {a:#x}: returned {purged}, report {rep:?}, bitmap counts {count}"));
        }
    }

    fn main_loop(&mut self, ops: &[(Op, u32)]) {
        let total: u32 = ops.iter().map(|o| o.1).sum();
        while !self.sh.stop.load(Ordering::Relaxed) {
            let mut x = self.rng.index(total as usize) as u32;
            let mut op = ops[0].0;
            for &(o, w) in ops {
                if x < w {
                    op = o;
                    break;
                }
                x -= w;
            }
            self.step(op);
            let i = OPS.iter().position(|o| o.0 == op).unwrap();
            self.sh.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        // Final check: everything non-volatile, readable, then every byte.
        for r in 0..REGIONS {
            self.mnovolatile(r * REGION_PAGES, REGION_PAGES);
            let a = self.bases[r];
            let res = self.call(
                format!("final mprotect RW region {r} [{a:#x}]"),
                (a, a + REGION_PAGES * PS),
                || self.space.mprotect(a, REGION_PAGES * PS, PROT_READ | PROT_WRITE),
                errno_str,
            );
            if let Err(e) = res {
                self.fail(format!("final mprotect: {e:?}"));
            }
            for pg in &mut self.pages[r * REGION_PAGES..(r + 1) * REGION_PAGES] {
                pg.prot = Prot::Rw;
            }
            self.slot().begin(format!("final verify region {r} [{a:#x}]"), a, a + REGION_PAGES * PS);
            for p in r * REGION_PAGES..(r + 1) * REGION_PAGES {
                self.verify(p);
            }
            self.sh.bytes_verified.fetch_add((REGION_PAGES * PS) as u64, Ordering::Relaxed);
            self.slot().end("ok");
        }
    }
}

/// A worker that panics (its own check, or a panic inside usermm) stops the
/// run at once and says in which call, instead of looking hung.
struct PanicGuard<'a>(&'a Shared, usize);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let sl = &self.0.slots[self.1];
            let own = format!("worker {} (", self.1);
            let reported = self.0.failed.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|f| f.starts_with(&own));
            if !reported {
                let cur = sl.current.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
                eprintln!(
                    "\n################ SOAK FAILURE: worker {} PANICKED inside `{cur}` ({:.1} s into the run); \
                     history (oldest first):\n{}",
                    self.1,
                    now_ms() as f64 / 1000.0,
                    sl.history_text(None)
                );
                self.0
                    .failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("worker {} panicked inside `{cur}` (see its panic message above)", self.1));
            }
            sl.end("PANICKED");
            self.0.stop.store(true, Ordering::SeqCst);
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        let v = v.trim();
        let r = if let Some(h) = v.strip_prefix("0x") { u64::from_str_radix(h, 16) } else { v.parse() };
        r.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn print_summary(sh: &Shared, st: &Stats, elapsed: Duration) {
    let ops: u64 = sh.slots[..THREADS].iter().map(|s| s.ops.load(Ordering::Relaxed)).sum();
    let mut s = format!(
        "soak: {:.1} s, {THREADS} threads, working set {} MiB, budget {} MiB, swap {} MiB: {ops} calls/steps, \
         {:.0} ops/s; written {:.1} MiB, verified {:.1} MiB; {} SIGBUS on purged volatile pages handled\n  ops:",
        elapsed.as_secs_f64(),
        WORKING_SET >> 20,
        BUDGET >> 20,
        SWAP >> 20,
        ops as f64 / elapsed.as_secs_f64(),
        sh.bytes_written.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        sh.bytes_verified.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        sh.sigbus_handled.load(Ordering::Relaxed),
    );
    for (i, o) in OPS.iter().enumerate() {
        let _ = write!(s, " {} {}", o.1, sh.counts[i].load(Ordering::Relaxed));
    }
    let _ = write!(s, "\n  stats: {st:?}");
    eprintln!("{s}");
}

/// The seeds the soak runs when `USERMM_SOAK_SEED` is not given, each for
/// its share of the duration: fixed, so that the suite draws no random
/// seed; one that forks (even) and one that does not (odd). A seed that
/// ever failed joins them.
const SOAK_SEEDS: &[u64] = &[0x50a4_5eed_0000_0002, 0x50a4_5eed_0000_0003];

#[test]
fn soak() {
    let secs = env_u64("USERMM_SOAK_SECS").unwrap_or(60);
    let hang = Duration::from_secs(env_u64("USERMM_SOAK_HANG_SECS").unwrap_or(20));
    let seeds = match env_u64("USERMM_SOAK_SEED") {
        Some(seed) => vec![(seed, secs)],
        None => SOAK_SEEDS.iter().map(|&s| (s, secs.div_ceil(SOAK_SEEDS.len() as u64))).collect(),
    };
    let ops = enabled_ops();
    let _host_swap = std::env::var("USERMM_SOAK_HOST_SWAP").is_ok_and(|v| v == "1").then(HostSwap::on);
    START.get_or_init(Instant::now);
    for (seed, secs) in seeds {
        soak_seed(seed, secs, hang, &ops);
    }
}

/// One soak run of `secs` seconds from `seed`.
fn soak_seed(seed: u64, secs: u64, hang: Duration, ops: &[(Op, u32)]) {
    eprintln!(
        "soak: {secs} s, seed {seed:#x} (USERMM_SOAK_SEED), hang limit {hang:?}, ops: {}",
        ops.iter().map(|o| op_name(o.0)).collect::<Vec<_>>().join(",")
    );
    let forks_before = FORKS.load(Ordering::Relaxed);

    let cfg = Config { budget_bytes: BUDGET, swap_bytes: SWAP, ..Config::default() };
    // Every other seed forks.
    let forks = seed.is_multiple_of(2) && ops.iter().any(|o| o.0 == Op::Fork);
    eprintln!(
        "soak: {}",
        if forks { "this seed forks (a worker's child checks its pages)" } else { "this seed does not fork" }
    );
    let space = Arc::new(common::open_mode(&cfg).expect("open"));
    assert_eq!(space.stats().budget_pages, (BUDGET / PS) as u64);
    let mut slots: Vec<Slot> = (0..THREADS).map(|i| Slot::new(format!("worker {i}"))).collect();
    slots.push(Slot::new("main".into()));
    let sh = Arc::new(Shared {
        slots,
        stop: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        failed: Mutex::new(Vec::new()),
        counts: OPS.iter().map(|_| AtomicU64::new(0)).collect(),
        bytes_written: AtomicU64::new(0),
        bytes_verified: AtomicU64::new(0),
        sigbus_handled: AtomicU64::new(0),
    });
    let main_slot = &sh.slots[THREADS];
    let wd = {
        let (sh, space) = (sh.clone(), Arc::downgrade(&space));
        std::thread::Builder::new().name("soak-watchdog".into()).spawn(move || watchdog(sh, space, hang)).unwrap()
    };
    /// Stops the workers and the watchdog when the test unwinds.
    struct Finish<'a>(&'a Shared);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            self.0.stop.store(true, Ordering::SeqCst);
            self.0.finished.store(true, Ordering::SeqCst);
        }
    }
    let finish = Finish(&sh);

    // Every region is mapped here, before any worker runs: a worker's remap
    // uses MAP_FIXED on its own addresses, and nothing else maps.
    let bases: Vec<[usize; REGIONS]> = (0..THREADS)
        .map(|_| {
            std::array::from_fn(|_| {
                space.mmap(0, REGION_PAGES * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap()
            })
        })
        .collect();
    let signals = SignalGuard::install();
    SPACE.store(Arc::as_ptr(&space) as *mut Space, Ordering::SeqCst);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut validations = 0u64;
    std::thread::scope(|s| {
        /// A panic of the main thread in here (a failed `validate()`) must
        /// stop the workers, or the scope would wait for them for ever.
        struct StopOnUnwind<'a>(&'a AtomicBool);
        impl Drop for StopOnUnwind<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop_guard = StopOnUnwind(&sh.stop);
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let (space, sh, bases) = (&*space, &*sh, bases[i]);
                std::thread::Builder::new()
                    .name(format!("soak-worker-{i}"))
                    .spawn_scoped(s, move || {
                        WORKER.with(|w| w.set(i));
                        let _guard = PanicGuard(sh, i);
                        let mut w = Worker {
                            idx: i,
                            space,
                            sh,
                            rng: Rng::new(seed ^ mix(i as u64 + 1)),
                            bases,
                            pages: (0..PAGES).map(|_| Page::zero()).collect(),
                            seq: 0,
                            buf: vec![0; PS],
                            locked: 0,
                            selftest: std::env::var("USERMM_SOAK_SELFTEST").unwrap_or_default(),
                            forks,
                        };
                        // Write everything once, so that pressure starts at once.
                        for p in 0..PAGES {
                            w.write_page(p);
                        }
                        w.main_loop(ops);
                    })
                    .unwrap()
            })
            .collect();
        while Instant::now() < deadline && !sh.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(500).min(deadline.saturating_duration_since(Instant::now())));
            main_slot.begin("validate()".into(), 0, 0);
            space.validate();
            main_slot.end("ok");
            validations += 1;
        }
        sh.stop.store(true, Ordering::SeqCst);
        for w in workers {
            let _ = w.join();
        }
    });
    let elapsed = started.elapsed();
    SPACE.store(std::ptr::null_mut(), Ordering::SeqCst);
    drop(signals);
    let failed = sh.failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(failed.is_empty(), "soak failed: {failed:?}");

    main_slot.begin("final munmap of every region + validate()".into(), 0, 0);
    for b in bases.iter().flatten() {
        space.munmap(*b, REGION_PAGES * PS).expect("final munmap");
    }
    space.validate();
    main_slot.end("ok");
    let st = space.stats();
    print_summary(&sh, &st, elapsed);
    let forked = FORKS.load(Ordering::Relaxed) - forks_before;
    eprintln!("soak: {validations} mid-run validate() calls, {forked} forks checked; seed {seed:#x}");
    assert!(!forks || secs < 5 || forked > 0, "a forking seed whose workers never forked");
    main_slot.begin("Space::close".into(), 0, 0);
    let space = Arc::into_inner(space).expect("only the test holds the space");
    space.close().expect("close");
    main_slot.end("ok");
    drop(finish);
    wd.join().unwrap();

    assert!(
        st.resident_pages_max <= st.budget_pages,
        "resident max {} > budget {}",
        st.resident_pages_max,
        st.budget_pages
    );
    assert_eq!(st.oom_sigbus, 0, "OOM SIGBUS raised");
    assert_eq!(st.swap_read_errors + st.swap_write_errors, 0, "unexpected swap I/O errors");
    assert_eq!(st.regions, 0);
    assert_eq!(st.resident_pages, 0, "resident pages leaked");
    assert_eq!(st.swapped_pages, 0, "swap slots leaked");
    assert_eq!(st.locked_charged_pages, 0, "lock charge leaked");
}

/// Whether every byte of `read` is either zero (what a discard leaves) or
/// the byte of one possible contents (`data`, or one of `alts`): a discard
/// that happened while the page was being copied (a copy need not go in
/// address order).
fn torn_by_discard(read: &[u8], data: &[u8], alts: &[Vec<u8>]) -> bool {
    std::iter::once(data)
        .chain(alts.iter().map(|a| a.as_slice()))
        .any(|c| read.iter().zip(c).all(|(r, c)| *r == 0 || r == c))
}
