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
//! (`umm_malloc` and friends: a block up to 16 KiB is told by its address
//! from the heap's side table, a larger one by a 16-byte header, so `free`
//! needs no size).
//!
//! # What goes where
//! - An allocation goes to the space's heap when the process's space is
//!   open (see "Forked children" for a child's) and the calling thread is
//!   a program thread outside usermm. Everything else goes to the C
//!   library's own allocator (`__libc_malloc` and friends, which glibc
//!   exports for allocators that stand in for it):
//!   - allocations before the space is open (the dynamic loader's, `dlsym`'s
//!     `calloc`, other libraries' constructors) and while it opens;
//!   - allocations by usermm's own threads (fault handlers, background
//!     reclaim, wake-ahead): a handler that allocated on the heap it
//!     serves could fault on it and wait on itself;
//!   - allocations made inside a call of this library (re-entrant ones:
//!     [`GlobalHeap::with_space`] marks the thread for its duration);
//!   - allocations inside the C library functions that make a stream
//!     (`fopen`, `fdopen`, `popen`, `setmntent`, …) or change the
//!     environment (`setenv`, `putenv`, …), which this library wraps: a
//!     forked child touches both before it can do anything else (glibc's
//!     `fork` resets the lock of every open stream in the child);
//!   - allocations the space refuses (its reservation or region limit
//!     full): counted, and listed by `--verbose`.
//! - A `free`, `realloc` or `malloc_usable_size` goes by address: inside
//!   the space's reservation it is the heap's, anywhere else the C
//!   library's. In a forked child a free of an ancestor's block frees
//!   nothing (the block is not there); a `realloc` of one fails (`ENOMEM`).
//! - A `realloc` of a C-library block stays with the C library (glibc grows
//!   a thread's TLS vector with `realloc`; on the space it could hang
//!   usermm's own code, see `boundary.rs`, `pthread_create`).
//! - The library's own Rust allocations (and the usermm crate's inside it)
//!   use the C library's allocator directly (its `#[global_allocator]`),
//!   never the exported `malloc`.
//!
//! # Forked children
//! A forked child gets a copy of its parent's space, heap and mappings
//! (`usermm::Space`'s "fork"): usermm's own `pthread_atfork` child handler,
//! registered as the space opened, runs before this library's, which then
//! finds the space the child's and changes nothing. Anonymous `MAP_SHARED`
//! mappings are the kernel's (`route_mmap`): shared with children from the
//! start (on a space the first fork would hand them to the host, a copy).
//!
//! Where the space is not copied (a copy that failed, with a message), the child has none of its
//! parent's space (a touch of the parent's heap or mappings is SIGSEGV).
//! Its own new memory goes on a space of its own: the `pthread_atfork`
//! child handler moves the process one *generation* on (a space and a
//! reservation per generation, `GENERATIONS` deep; deeper children get
//! none, and their calls are the kernel's), and the child's first
//! allocation or memory call opens its space (a child that only `exec`s
//! opens none; the exec'd program gets the preload again, unless
//! `--no-inherit`). The handler also maps the reservations of the parent
//! and its ancestors with no access, so the child's space (or anything the
//! kernel places) never lands where a pointer into the parent's memory
//! points: a touch stays SIGSEGV, never another block's bytes; and the
//! child's range calls on them see a hole (`munmap` 0, the others
//! `ENOMEM`, `mremap` `EFAULT`).
//!
//! # The memory calls
//! It also exports `mmap`, `mmap64`, `munmap`, `mremap`, `mprotect`,
//! `madvise`, `posix_madvise`, `mlock`, `mlock2`, `munlock`, `mlockall`,
//! `munlockall`, `mincore`, `msync` and `syscall` (for those numbers):
//! - a call from this library's own code (usermm's host calls) goes to the
//!   kernel by a raw system call: the exported names are trampolines that
//!   look at their return address (`boundary.rs`);
//! - so does every call before the space is open, from usermm's threads,
//!   re-entrant, or in a forked child past the last generation
//!   (`program_call`);
//! - a program's anonymous `mmap` is the space's (`route_mmap`: files,
//!   hugetlb, stacks, `MAP_32BIT`, `MAP_DROPPABLE`, `MAP_FIXED` outside the
//!   reservation are the kernel's; `MAP_FIXED` inside it is the space's
//!   whatever its kind, straddling its edge is `ENOMEM`; a file or device
//!   mapping with a hint inside it is the space's at the hint when nothing
//!   is mapped there, as Linux uses a free hint, else the kernel's), and an
//!   `ENOMEM` from the space for one without a fixed address falls back to
//!   the kernel;
//! - a range call is cut at the reservation's edges (`pieces`): inside,
//!   the space's call; outside, the kernel's;
//! - `mremap` of a space region is done here (shrink in place, grow in
//!   place as the region's continuation, `Space::grow_region`, or map,
//!   copy, unmap);
//! - `mlockall` locks the space's regions through the space and the other
//!   mappings with one kernel `mlock2` each.
//!
//! Each call is counted by where it went (`Why`); `--verbose` prints it.
//!
//! # SIGBUS's action
//! It also exports `sigaction` and `signal`: a program's call for SIGBUS
//! goes to `umm_sigbus_action`, so that with faults resolved in the
//! faulting thread (`--inthread`: each fault on the space a SIGBUS) the
//! program's handler is the one usermm's chains to, not its replacement.
//! Other signals, usermm's own calls (by return address, as above) and
//! calls before the space is open are the C library's.
//!
//! # Configuration (environment, set by `usermm run`)
//! The space: the `USERMM_*` variables of `usermm_compat.h`
//! (`USERMM_BUDGET_BYTES`, `USERMM_SWAP_BYTES`, `USERMM_SWAP_DIR`,
//! `USERMM_SWAP_URL`, `USERMM_MEMLOCK_BYTES`, `USERMM_FLAGS`, …). This
//! library's own: `USERMM_RUN_STATS=1` prints the space's statistics on
//! stderr at exit (appended to the file `USERMM_RUN_STATS_FILE` names, if
//! set), `USERMM_RUN_VERBOSE=1` also where the allocations went,
//! `USERMM_RUN_NO_INHERIT=1` removes `LD_PRELOAD` from the environment at
//! start, so that the programs this one runs are not preloaded.
//!
//! # Unsafe code
//! None here: everything `unsafe` (the exported C functions, the C
//! library's allocator, the constructor) is in `boundary.rs`.

#![deny(unsafe_code)]

mod boundary;
mod cgroup;
mod route;
use route::*;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use usermm::heap::CachedMalloc;
use usermm::{GlobalHeap, Space};

/// How many generations of forked children get a space of their own: a
/// process `GENERATIONS` forks deep (or deeper) gets none, and its calls go
/// to the kernel as before.
const GENERATIONS: usize = 8;

/// The space and its heap of each fork generation: `HEAPS[0]` is opened by
/// the library's constructor, `HEAPS[g]` by a process `g` forks deep, on
/// its first allocation or memory call (see "Forked children" in the
/// module docs). A process uses `HEAPS[generation()]` only.
static HEAPS: [GlobalHeap; GENERATIONS] = [const { GlobalHeap::from_env() }; GENERATIONS];

/// This process's fork generation (0: the process the preload started in),
/// bumped by the `pthread_atfork` child handler.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

fn generation() -> usize {
    GENERATION.load(Relaxed)
}

/// Set by the constructor once it has tried to open the space: until then
/// every allocation is the C library's (the space is opened from the
/// constructor, never from inside a `malloc` of the dynamic loader or of
/// another library's constructor).
static READY: AtomicBool = AtomicBool::new(false);

/// The reservation `[start, end)` of each generation's space (0, 0 until it
/// is open): `RANGES[generation()]` is this process's (a block inside it is
/// the heap's), the ones before it its ancestors' (not mapped here: a
/// placeholder with no access keeps them free of anything else).
static RANGES: [(AtomicUsize, AtomicUsize); GENERATIONS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; GENERATIONS];

/// This process's reservation, `(0, 0)` while it has no space.
fn own_range() -> (usize, usize) {
    match RANGES.get(generation()) {
        Some((b, e)) => (b.load(Relaxed), e.load(Relaxed)),
        None => (0, 0),
    }
}

/// Runs `f` on this process's space, opening it if this is a forked child
/// whose space is not open yet, and records its reservation.
fn space_call<R>(f: impl FnOnce(&Space) -> R) -> Option<R> {
    let g = generation();
    HEAPS.get(g)?.with_space(|sp| {
        let (b, e) = &RANGES[g];
        if b.load(Relaxed) == 0 {
            let (base, len) = sp.reservation();
            e.store(base + len, Relaxed);
            b.store(base, Relaxed);
        }
        f(sp)
    })
}

/// Where allocations went, for `--verbose`.
struct Counts {
    /// Allocations served by the space's heap (counted with `--verbose`
    /// only).
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
    // First: usermm's own memory calls (its threads' first ones included)
    // must be told from the program's before anything else runs.
    boundary::find_own_range();
    // And the C library's signal functions, before any handler may need them.
    boundary::find_signal_calls();
    STATS.store(env_on("USERMM_RUN_STATS"), Relaxed);
    VERBOSE.store(env_on("USERMM_RUN_VERBOSE"), Relaxed);
    if env_on("USERMM_RUN_NO_INHERIT") {
        // The constructor runs before the program's own code and threads.
        std::env::remove_var("LD_PRELOAD");
    }
    // A shell keeps the C library's heap and the kernel's memory: it forks
    // for every `$(…)` and pipeline, and a space's child starts threads of
    // its own for its copy (the kernel's fork of a small shell costs far
    // less), while the programs it execs get a space each (a wrapper script
    // such as pyenv's `python3` shim, `sh -c`, `make`'s recipes).
    if is_shell() {
        return false;
    }
    space_call(|_| ());
    READY.store(true, Relaxed);
    let report = STATS.load(Relaxed) || VERBOSE.load(Relaxed);
    if report {
        // The program may close its stderr before the report is written
        // (coreutils' `close_stdout` at exit does): keep a copy, or the
        // file `USERMM_RUN_STATS_FILE` names (`--stats=FILE`).
        let file = std::env::var_os("USERMM_RUN_STATS_FILE").filter(|f| !f.is_empty());
        boundary::keep_report_fd(file.as_deref());
    }
    report
}

/// The shells whose processes keep the kernel's memory (see `init`).
const SHELLS: [&str; 8] = ["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"];

/// Whether this process's program is a shell (`SHELLS`, by the name of
/// `/proc/self/exe`).
fn is_shell() -> bool {
    std::fs::read_link("/proc/self/exe")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| SHELLS.contains(&n.as_str()))
}

/// Whether allocations served by the space are counted: only for
/// `--verbose`, which reports them (one shared counter on every `malloc`
/// would make threads fight over its cache line).
fn counting_space() -> bool {
    VERBOSE.load(Relaxed)
}

/// Whether `p` lies in this process's space's reservation (so it is the
/// heap's).
fn in_space(p: usize) -> bool {
    let (base, end) = own_range();
    p >= base && p < end
}

/// Whether `p` lies in the reservation of an ancestor's space (this process
/// is a forked child, and the memory is not here).
fn in_ancestors(p: usize) -> bool {
    RANGES.iter().take(generation()).any(|(b, e)| p >= b.load(Relaxed) && p < e.load(Relaxed))
}

/// Whether this process is a forked child of a process that had a space
/// (some of its memory is out of reach here).
fn has_ancestors() -> bool {
    RANGES.iter().take(generation()).any(|(b, e)| b.load(Relaxed) < e.load(Relaxed))
}

/// Whether `[a, a + len)` overlaps an ancestor's reservation.
fn overlaps_ancestors(a: usize, len: usize) -> bool {
    let stop = a.saturating_add(len);
    RANGES.iter().take(generation()).any(|(b, e)| a < e.load(Relaxed) && b.load(Relaxed) < stop)
}

/// The `pthread_atfork` child handler's work: the child is one generation
/// further, has no space yet (its first allocation or memory call opens
/// one), and gets the reservations of this process and its ancestors as
/// ranges with no access, so that its own space (and any mapping the
/// kernel places) never lands where a pointer into its parent's memory
/// could reach it: a touch stays SIGSEGV, never another block's bytes.
/// Returns the ranges to cover (at most [`GENERATIONS`]).
fn after_fork_child() -> Vec<(usize, usize)> {
    let g = generation();
    // The counts `--verbose` prints are the child's own.
    for c in [&COUNTS.space, &COUNTS.early, &COUNTS.usermm, &COUNTS.child, &COUNTS.refused, &COUNTS.child_frees]
        .into_iter()
        .chain(MEM_COUNTS.iter())
    {
        c.store(0, Relaxed);
    }
    // usermm's own child handler, registered as the space opened (before
    // this one), has run: if it copied the space here, the child goes on
    // on it, heap, mappings and all, at this generation.
    if HEAPS.get(g).is_some_and(GlobalHeap::open_here) {
        return Vec::new();
    }
    GENERATION.store(g + 1, Relaxed);
    RANGES.iter().take(g + 1).map(|(b, e)| (b.load(Relaxed), e.load(Relaxed))).filter(|&(b, e)| b < e).collect()
}

/// While alive, this thread's allocations come from the C library (one
/// depth with usermm's own system-only threads and calls, kept beside the
/// heap's thread cache: one thread-local lookup per `malloc`).
pub(crate) type LibcOnly = usermm::heap::SystemOnly;

/// `malloc(size)`'s common case: a small block from the calling thread's
/// cache on this process's space (`None`: take the full path, which also
/// decides whether the allocation is the space's at all).
#[inline]
fn malloc_cached(size: usize) -> Option<usize> {
    if !READY.load(Relaxed) {
        return None;
    }
    match HEAPS.get(generation())?.malloc_cached(size) {
        CachedMalloc::Block(p) => {
            if counting_space() {
                COUNTS.space.fetch_add(1, Relaxed);
            }
            Some(p)
        }
        CachedMalloc::System | CachedMalloc::Slow => None,
    }
}

/// `free(p)`'s common case for a block in this process's space: whether it
/// was a small block (freed, or refused with `umm_free`'s message).
#[inline]
fn free_cached(p: usize) -> bool {
    HEAPS.get(generation()).is_some_and(|h| h.free_small(p))
}

/// Runs `f` on the space when this allocation is the space's to serve (see
/// the module docs); `None` sends it to the C library. Allocations `f` makes
/// itself go to the C library.
fn on_space<R>(f: impl FnOnce(&Space) -> R) -> Option<R> {
    if !READY.load(Relaxed) {
        COUNTS.early.fetch_add(1, Relaxed);
        return None;
    }
    if usermm::heap::thread_is_system_only() {
        COUNTS.usermm.fetch_add(1, Relaxed);
        return None;
    }
    // (Not while the space's threads are started again: what they
    // allocate as they start must not fault on the space.)
    let r = space_call(|sp| (!sp.threads_starting()).then(|| f(sp))).flatten();
    if r.is_none() {
        let c = if generation() > 0 { &COUNTS.child } else { &COUNTS.early };
        c.fetch_add(1, Relaxed);
    }
    r
}

/// This process's space's budget, for the cgroup limit the program reads
/// (`cgroup.rs`); `None` before the space is open, in a forked child
/// whose space is not open yet, and on usermm's own threads.
fn budget_bytes() -> Option<u64> {
    if !READY.load(Relaxed) || usermm::heap::thread_is_system_only() || own_range().0 == 0 {
        return None;
    }
    space_call(|sp| sp.stats().budget_pages * sp.page_size() as u64)
}

/// Runs `f` on the space for a block that lies in it (a free, a resize, a
/// size query), whatever the thread.
fn for_block<R>(f: impl FnOnce(&Space) -> R) -> Option<R> {
    space_call(f)
}

/// The exit report (`--stats`, `--verbose`) on stderr: one line of the
/// space's statistics, and with `--verbose` one of where allocations went.
fn report() {
    let who = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let (who, pid) = (who.trim(), std::process::id());
    // A forked child that never allocated nor called has no space: the
    // report does not open one.
    let stats =
        if own_range().0 != 0 { space_call(|sp| (sp.stats(), sp.heap().stats(), sp.page_size() as u64)) } else { None };
    let mut out = String::new();
    if stats.is_none() {
        if !VERBOSE.load(Relaxed) {
            return;
        }
        out += &format!(
            "usermm run: pid {pid} ({who}): no space (it could not be opened, or this forked child made no call \
             that needed one)\n"
        );
    }
    if let Some((s, h, page)) = stats {
        // Every field of the space's statistics (`Stats::fields`), a count
        // of pages as bytes (`budget_pages` as `budget_bytes`), then the
        // heap's.
        out += &format!("usermm run: pid {pid} ({who}): stats:");
        for (name, v) in s.fields() {
            match name.split_once("_pages") {
                Some((a, b)) => out += &format!(" {a}_bytes{b}={}", v * page),
                None => out += &format!(" {name}={v}"),
            }
        }
        out += &format!(
            " heap_live_bytes={} heap_live_allocations={} heap_arena_bytes={} heap_large_bytes={}\n",
            h.live_bytes, h.live_allocations, h.arena_bytes, h.large_bytes
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
        out += &format!("usermm run: pid {pid} ({who}): memory calls:{}\n", mem_report());
    }
    boundary::write_report(&out);
}
