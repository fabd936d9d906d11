//! `libusermm_preload.so`: the library `usermm run` preloads (`LD_PRELOAD`)
//! into an unmodified, dynamically linked program to put its heap on a
//! space.
//!
//! It exports the C library's malloc family — `malloc`, `free`, `calloc`,
//! `realloc`, `reallocarray`, `posix_memalign`, `aligned_alloc`,
//! `memalign`, `valloc`, `pvalloc`, `malloc_usable_size` (C++'s `operator
//! new`/`delete` call `malloc`/`free`) — and serves them from the heap of
//! one space (a [`GlobalHeap`] configured by the `USERMM_*` environment,
//! as `usermm_compat.h`'s default space is), through the C heap calls
//! (`umm_malloc` and friends: a 16-byte header per block, so `free` needs
//! no size).
//!
//! # What goes where
//! - An allocation goes to the space's heap when the space is open, the
//!   process is the one that opened it (not a forked child) and the
//!   calling thread is a program thread outside usermm. Everything else
//!   goes to the C library's own allocator (`__libc_malloc` and friends,
//!   which glibc exports for allocators that stand in for it):
//!   - allocations before the space is open (the dynamic loader's, `dlsym`'s
//!     `calloc`, other libraries' constructors) and while it opens;
//!   - allocations by usermm's own threads (fault handlers, background
//!     reclaim, wake-ahead): a handler that allocated on the heap it
//!     serves could fault on it and wait on itself;
//!   - allocations made inside a call of this library (re-entrant ones:
//!     [`GlobalHeap::with_space`] marks the thread for its duration);
//!   - allocations in a forked child, which has no space (the parent's is
//!     not mapped there: a touch is SIGSEGV); a child that `exec`s gets the
//!     preload again (unless `--no-inherit`) and a space of its own;
//!   - allocations the space refuses (its reservation or region limit
//!     full): counted, and listed by `--verbose`.
//! - A `free`, `realloc` or `malloc_usable_size` goes by address: inside
//!   the space's reservation it is the heap's, anywhere else the C
//!   library's. In a forked child a free of the parent's block frees
//!   nothing (the block is not there); a `realloc` of one fails (`ENOMEM`).
//! - A `realloc` of a C-library block by a program thread moves it onto the
//!   space (so a buffer allocated before the space opened and grown later
//!   ends up under the budget).
//! - The library's own Rust allocations (and the usermm crate's inside it)
//!   use the C library's allocator directly (its `#[global_allocator]`),
//!   never the exported `malloc`.
//!
//! # Configuration (environment, set by `usermm run`)
//! The space: the `USERMM_*` variables of `usermm_compat.h`
//! (`USERMM_BUDGET_BYTES`, `USERMM_SWAP_BYTES`, `USERMM_SWAP_DIR`,
//! `USERMM_SWAP_URL`, `USERMM_MEMLOCK_BYTES`, `USERMM_FLAGS`, …). This
//! library's own: `USERMM_RUN_STATS=1` prints the space's statistics on
//! stderr at exit, `USERMM_RUN_VERBOSE=1` also where the allocations went,
//! `USERMM_RUN_NO_INHERIT=1` removes `LD_PRELOAD` from the environment at
//! start, so that the programs this one runs are not preloaded.
//!
//! # Unsafe code
//! None here: everything `unsafe` (the exported C functions, the C
//! library's allocator, the constructor) is in `boundary.rs`.

#![deny(unsafe_code)]

mod boundary;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use usermm::{GlobalHeap, Space};

/// The space and its heap, opened by the library's constructor.
static HEAP: GlobalHeap = GlobalHeap::from_env();

/// Set by the constructor once it has tried to open the space: until then
/// every allocation is the C library's (the space is opened from the
/// constructor, never from inside a `malloc` of the dynamic loader or of
/// another library's constructor).
static READY: AtomicBool = AtomicBool::new(false);

/// The space's reservation `[BASE, END)` (0, 0 until it is open): a block
/// inside it is the heap's.
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

/// Where allocations went, for `--verbose`.
struct Counts {
    /// Allocations served by the space's heap.
    space: AtomicU64,
    /// Allocations before the space was open (or when it could not be).
    early: AtomicU64,
    /// Allocations by usermm's own threads and re-entrant ones.
    usermm: AtomicU64,
    /// Allocations in a forked child (no space there).
    child: AtomicU64,
    /// Allocations the space refused, served by the C library instead.
    refused: AtomicU64,
    /// Frees of the parent's blocks in a forked child (nothing freed).
    child_frees: AtomicU64,
}

static COUNTS: Counts = Counts {
    space: AtomicU64::new(0),
    early: AtomicU64::new(0),
    usermm: AtomicU64::new(0),
    child: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    child_frees: AtomicU64::new(0),
};

/// Whether `USERMM_RUN_STATS` / `USERMM_RUN_VERBOSE` asked for the exit
/// report (read by the constructor).
static STATS: AtomicBool = AtomicBool::new(false);
static VERBOSE: AtomicBool = AtomicBool::new(false);

fn env_on(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The constructor's work: read this library's options, drop `LD_PRELOAD`
/// if asked, open the space. Returns whether the exit report is wanted.
fn init() -> bool {
    STATS.store(env_on("USERMM_RUN_STATS"), Relaxed);
    VERBOSE.store(env_on("USERMM_RUN_VERBOSE"), Relaxed);
    if env_on("USERMM_RUN_NO_INHERIT") {
        // The constructor runs before the program's own code and threads.
        std::env::remove_var("LD_PRELOAD");
    }
    if let Some((base, len)) = HEAP.with_space(Space::reservation) {
        BASE.store(base, Relaxed);
        END.store(base + len, Relaxed);
    }
    READY.store(true, Relaxed);
    let report = STATS.load(Relaxed) || VERBOSE.load(Relaxed);
    if report {
        // The program may close its stderr before the report is written
        // (coreutils' `close_stdout` at exit does): keep a copy.
        boundary::keep_stderr();
    }
    report
}

/// Whether this process (or the parent it was forked from) opened a space.
fn had_space() -> bool {
    BASE.load(Relaxed) != 0
}

/// Whether `p` lies in the space's reservation (so it is the heap's).
fn in_space(p: usize) -> bool {
    p >= BASE.load(Relaxed) && p < END.load(Relaxed)
}

thread_local! {
    /// How deep this thread is in code whose allocations must come from the
    /// C library (`pthread_create`).
    static LIBC_ONLY: Cell<u32> = const { Cell::new(0) };
}

/// While alive, this thread's allocations come from the C library.
struct LibcOnly(());

impl LibcOnly {
    fn enter() -> LibcOnly {
        LIBC_ONLY.with(|d| d.set(d.get() + 1));
        LibcOnly(())
    }
}

impl Drop for LibcOnly {
    fn drop(&mut self) {
        LIBC_ONLY.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `f` on the space when this allocation is the space's to serve (see
/// the module docs); `None` sends it to the C library. Allocations `f` makes
/// itself go to the C library.
fn on_space<R>(f: impl FnOnce(&Space) -> R) -> Option<R> {
    if !READY.load(Relaxed) {
        COUNTS.early.fetch_add(1, Relaxed);
        return None;
    }
    if usermm::heap::thread_is_system_only() || LIBC_ONLY.try_with(|d| d.get() > 0).unwrap_or(true) {
        COUNTS.usermm.fetch_add(1, Relaxed);
        return None;
    }
    let r = HEAP.with_space(f);
    if r.is_none() {
        let c = if BASE.load(Relaxed) != 0 { &COUNTS.child } else { &COUNTS.early };
        c.fetch_add(1, Relaxed);
    }
    r
}

/// Runs `f` on the space for a block that lies in it (a free, a resize, a
/// size query), whatever the thread; `None` in a forked child, where the
/// block is not there.
fn for_block<R>(f: impl FnOnce(&Space) -> R) -> Option<R> {
    HEAP.with_space(f)
}

/// The exit report (`--stats`, `--verbose`) on stderr: one line of the
/// space's statistics, and with `--verbose` one of where allocations went.
fn report() {
    let who = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let (who, pid) = (who.trim(), std::process::id());
    let Some((s, h, page)) = HEAP.with_space(|sp| (sp.stats(), sp.heap().stats(), sp.page_size() as u64)) else {
        if VERBOSE.load(Relaxed) {
            boundary::write_report(&format!(
                "usermm run: pid {pid} ({who}): no space (it could not be opened, or this is a forked child)\n"
            ));
        }
        return;
    };
    let mut out = String::new();
    if STATS.load(Relaxed) || VERBOSE.load(Relaxed) {
        out += &format!(
            "usermm run: pid {pid} ({who}): stats: budget_bytes={} resident_bytes={} resident_bytes_max={} \
             swapped_bytes={} faults={} major_faults={} zero_fills={} swapins={} swapouts={} evictions={} \
             lazyfree_discards={} oom_sigbus={} heap_live_bytes={} heap_live_allocations={} heap_arena_bytes={} \
             heap_large_bytes={}\n",
            s.budget_pages * page,
            s.resident_pages * page,
            s.resident_pages_max * page,
            s.swapped_pages * page,
            s.faults,
            s.major_faults,
            s.zero_fills,
            s.swapins,
            s.swapouts,
            s.evictions,
            s.lazyfree_discards,
            s.oom_sigbus,
            h.live_bytes,
            h.live_allocations,
            h.arena_bytes,
            h.large_bytes,
        );
    }
    if VERBOSE.load(Relaxed) {
        let c = |a: &AtomicU64| a.load(Relaxed);
        out += &format!(
            "usermm run: pid {pid} ({who}): allocations: space={} libc_before_open={} libc_usermm_threads={} \
             libc_forked_child={} libc_refused_by_space={} child_frees_dropped={}\n",
            c(&COUNTS.space),
            c(&COUNTS.early),
            c(&COUNTS.usermm),
            c(&COUNTS.child),
            c(&COUNTS.refused),
            c(&COUNTS.child_frees),
        );
    }
    boundary::write_report(&out);
}
