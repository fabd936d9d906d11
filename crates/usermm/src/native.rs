//! The native executor: owns a space's memory, serves its faults, and carries
//! out the core's decisions with userfaultfd, `madvise` and file I/O.
//!
//! # Where each concern lives
//! | file | what |
//! |---|---|
//! | `native.rs` | `Inner` (the executor's state), `close`, small helpers |
//! | `native/open.rs` | `open`: the host platform and the space's threads; `build`: the state over a platform |
//! | `native/fault.rs` | the handler threads' loop; `resolve`: one fault, planned and served; waits for pages in flight |
//! | `native/serve.rs` | `serve`: the one plan dispatcher (faults, read-ins, populate, the locks' population), with each caller's failure report |
//! | `native/install.rs` | how a small fill's pages go in (head first, split with the wake-ahead thread) and who wakes the faulting thread |
//! | `native/commit.rs` | the commit after a fill's I/O: `fill_done`, the failure report, the wake-ups, the read-ahead that follows |
//! | `native/fill.rs` | fill mechanics: zero fills and zero-page maps, swap-in, file reads, a parked page moved back |
//! | `native/writeback.rs` | write-back of shared file pages (reclaim, msync, munmap, DONTNEED, close) |
//! | `native/background.rs` | the background thread: reclaim ahead of the program, spares, WILLNEED and file read-ahead |
//! | `native/reclaim.rs` | reclaim execution: deactivate, evict, discard, drop clean file pages, purge volatile pages |
//! | `native/volatile.rs` | `mvolatile`, `mnovolatile` |
//! | `native/zap.rs` | dropping the pages of detached or replaced ranges (seed 003) |
//! | `native/calls.rs` | `mmap`, `munmap`, `msync`, `mprotect`, `madvise`'s entry |
//! | `native/advise.rs` | carrying out a planned advice (`AdviceOp`) |
//! | `native/populate.rs` | the lock calls and populate |
//!
//! The decisions are the core's (`usermm_core`); these files carry them out.
//!
//! # Memory layout
//! - the *reservation*: `reserve_bytes` of `PROT_NONE` address space,
//!   registered with userfaultfd (MISSING), `MADV_DONTFORK` and
//!   `MADV_NOHUGEPAGE`. Regions are `mprotect`ed windows of it; unmapped parts
//!   stay `PROT_NONE`, so touching them is a plain SIGSEGV from the kernel;
//! - the *staging area*: one slot per budget page, where deactivated
//!   (inactive) pages are parked by `UFFDIO_MOVE` and from which evictions
//!   are written to swap;
//! - the swap file.
//!
//! # Locks
//! - `mm`: the region lock (the mmap lock analogue), a task-fair
//!   reader-writer lock (parking_lot: a waiting writer blocks new readers,
//!   which is what lets another thread's mmap in between two zap chunks;
//!   std's lock lets a reader loop starve writers).
//!   Exclusive for region changes (mmap, the detach phase of munmap,
//!   mprotect, attribute madvise); shared for everything that works on pages
//!   (fault resolution, reclaim, zap chunks, page madvise).
//! - `core`: a mutex around the pure core, held for decisions. Host calls
//!   are made without it, except these, each on purpose and none able to
//!   block for long: a small fill's install-and-wake (so that the woken
//!   thread can observe nothing before the commit), a transient SIGBUS
//!   (queued while the thread is surely still in the fault), and
//!   `mvolatile`'s and `MADV_FREE`'s hand-over of parked pages' slots to
//!   the host's lazy free (`mvolatile` flushes the host's LRU batches
//!   first): no slot may be mapped back, freed and reused meanwhile.
//!   The lock calls' host `mlock`/`munlock` run under the region lock
//!   alone, held exclusively; `smaps`' `PAGEMAP_SCAN`s before the core
//!   lock is taken.
//!
//! Lock order: `mm` before `core`. Neither lock is ever held while touching
//! the program's memory through a pointer the program gave us (it could be
//! in a space and fault into a handler that needs the lock).
//!
//! # Fault model
//! Any syscall may fail. A fill that fails leaves the page where its data
//! was and raises SIGBUS in the faulting thread; an eviction whose write
//! fails keeps the page resident; I/O errors are counted. The test hook
//! `inject` makes the next swap reads or writes fail with `EIO`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use parking_lot::{RwLock, RwLockReadGuard};
use std::thread::JoinHandle;

use usermm_core::consts::*;
use usermm_core::region::{Kind, LockMode};
use usermm_core::{
    Addr, AdviceOp, Busy, Core, CoreConfig, Deactivate, Detached, Discard, Errno, Evict, FaultPlan, FileMap, FileRange,
    LockPlan, MmapReply, PageIdx, PageRange, Transfer, Writeback,
};

use crate::platform::{Fill, Native, Platform, Range, Runs, Signal, Staging, Store, Thread, Upkeep, Window, Zero};
use usermm_sys::file::MappedFile;
use usermm_sys::now_ns;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::{UffdMsg, UFFD_EVENT_PAGEFAULT, UFFD_PAGEFAULT_FLAG_WP, UFFD_PAGEFAULT_FLAG_WRITE};

use crate::Config;

mod advise;
mod awake;
mod background;
mod calls;
mod commit;
mod fault;
mod filemap;
mod fill;
mod install;
mod open;
mod populate;
mod reclaim;
mod serve;
mod volatile;
mod writeback;
mod zap;
/// Zap and unmap work is done in chunks of this many bytes, so that neither
/// usermm's region lock nor the kernel's mmap lock is held for long.
pub const ZAP_CHUNK_BYTES: usize = 4 << 20;
/// A chunk's pages are dropped this many bytes at a time, with a yield of
/// the CPU between two slices.
const ZAP_SLICE_BYTES: usize = 512 << 10;
/// An injected executor bug (`Inner::sim_bug`): an eviction whose swap
/// write failed is taken as done.
#[cfg(feature = "test-hooks")]
pub(crate) const SIM_BUG_LOST_SWAP_WRITE: u32 = 1;
/// Fills up to this many pages are installed under the core lock.
const SMALL_FILL_PAGES: u64 = 16;
/// An in-thread fault's file read of at least this many pages is installed
/// in two halves at once (`Inner::install_split`); below, the hand-off
/// costs more than half the copy saves.
const SPLIT_MIN_PAGES: usize = 4;
/// How long a handler spins for the next fault after serving one.
const SPIN_NS: u64 = 100_000;
/// Pages reclaimed per background round.
const RECLAIM_BATCH: u64 = 256;

pub(crate) struct Inner {
    pub base: usize,
    pub reserve_len: usize,
    pub page_size: usize,
    /// The host: every operation on pages, files, signals and events.
    pub plat: Box<dyn Platform>,
    pub mm: RwLock<()>,
    pub core: Mutex<Core>,
    /// Signalled whenever a busy page settles or a held range is released.
    pub settled: Settled,
    /// Signalled when free frames fall below the low watermark.
    pub reclaim_wanted: Condvar,
    /// Whether a fill has poked the background thread since it last went to
    /// wait (set and cleared under the core lock): a fill pokes it once, not
    /// on every fault while it works (a futex call each, and a wake-up of
    /// its vCPU: a sparse run of faults, each needing a fresh page-table
    /// leaf, kept the spares low and paid one per fault).
    pub bg_poked: AtomicBool,
    pub shutdown: AtomicBool,
    /// Whether a handler thread is spinning for the next message.
    spinning: AtomicBool,
    /// Keeps the faulting thread's CPU awake while its fault is served
    /// (`native/awake.rs`).
    pub(crate) wake_ahead: awake::WakeAhead,
    /// `UMM_F_FRAME_POOL`: fills may take recycled frames (`Arena::recycle_slots`).
    pub frame_pool: bool,
    pub wake_fd: EventFd,
    pub write_hold_ns_max: AtomicU64,
    /// Zaps the host refused at first (see `Arena::zap`).
    pub host_refusals: AtomicU64,
    /// Pages a host move moved without saying so (see `deactivate_all`).
    pub host_unreported_moves: AtomicU64,
    /// Fills committed so far, and that count at the last drain of the
    /// host's LRU batches before a `MADV_FREE` (see `AdviceOp::Free`).
    fills: AtomicU64,
    fills_drained: AtomicU64,
    /// Whether guard pages (`MADV_GUARD_INSTALL`) or `MADV_DONTDUMP` were
    /// ever passed down: unmapped ranges then have them removed, so that a
    /// new region there starts clean.
    guards_used: AtomicBool,
    dontdump_used: AtomicBool,
    pub low_watermark: u64,
    pub high_watermark: u64,
    pub inject_read_errors: AtomicU32,
    /// How long a fault or populate that found no frame waits for reclaim
    /// elsewhere before it tries again (µs; 5 ms, 0 in the simulation,
    /// where nothing runs meanwhile).
    oom_wait_us: AtomicU64,
    /// The page store's write back-off (`native/reclaim.rs`, "A store that
    /// refuses writes"): the first pause after a failed write (ns; 0 in
    /// the simulation, whose runs must not depend on the clock: no pause),
    /// the pause now (0: the store takes writes), and when writes are tried
    /// again.
    store_backoff_first_ns: AtomicU64,
    pub(super) store_backoff_ns: AtomicU64,
    pub(super) store_retry_at_ns: AtomicU64,
    /// Store writes (one call, a run of up to 256 pages) that failed.
    pub swap_write_fails: AtomicU64,
    /// Threads sent a fault's signal (`report`), one entry a thread (the
    /// last signal): a message of such a thread read before it took the
    /// signal was for the fault the signal answers (`native/fault.rs`,
    /// "Answered faults").
    pub(super) signalled: Mutex<Vec<fault::Signalled>>,
    /// Batches of fault messages read so far: the number of each batch
    /// orders its reads against the observations that a thread took its
    /// signal (`fault::Signalled::taken`).
    pub(super) read_batches: AtomicU64,
    /// Whether `signalled` is kept: not in the simulation, whose faults are
    /// served in the touching step (no messages, nothing to answer twice).
    pub(super) tracks_signals: AtomicBool,
    /// Test hook: a bug to inject, so that the simulation shows it catches
    /// one (`SIM_BUG_*`; 0: none).
    #[cfg(feature = "test-hooks")]
    pub sim_bug: AtomicU32,
    /// Test hook: milliseconds a handler waits between deciding a
    /// transient SIGBUS and queuing it (widens the window in which a late
    /// signal could arise).
    #[cfg(feature = "test-hooks")]
    pub inject_signal_stall_ms: AtomicU32,
    /// Test hook: milliseconds a range write-back (msync, munmap, close)
    /// waits between listing the pages and writing them (widens the window
    /// in which reclaim could evict a listed page).
    #[cfg(feature = "test-hooks")]
    pub inject_writeback_stall_ms: AtomicU32,
    /// Test hook: the next this many `install_split`s fail their first
    /// half (the second goes in), as a failed `UFFDIO_COPY` would leave
    /// them.
    #[cfg(feature = "test-hooks")]
    pub inject_split_failures: AtomicU32,
    /// Test hook: `install_split`s done (both halves tried).
    #[cfg(feature = "test-hooks")]
    pub split_installs: AtomicU64,
    /// Test hook: the page index at which a populate is interrupted (EINTR),
    /// once; `u64::MAX`: none (see `Space::interrupt_populate_at`).
    pub populate_interrupt: AtomicU64,
    pub inject_write_errors: AtomicU32,
    pub willneed: Mutex<Vec<usize>>,
    /// Files mapped by the space's regions, by id (ids start at 1).
    pub files: Mutex<std::collections::HashMap<u32, Arc<MappedFile>>>,
    next_file: AtomicU32,
    pub user_mode_only: bool,
    /// `UMM_F_INTHREAD_FAULTS`: faults are resolved in the faulting thread.
    pub in_thread: bool,
    /// The space itself, for the SIGBUS handler's table
    /// (`Thread::InThreadOn`).
    me: std::sync::Weak<Inner>,
    /// Lazily freed pages are passed down to the host (`MADV_FREE`) and
    /// discarded through it (see `Arena::host_lazyfree`).
    pub host_lazyfree: bool,
    pub fallback_reason: Option<String>,
    #[cfg(feature = "test-hooks")]
    pub swap_bytes: u64,
    /// `UMM_F_KEEP_FILE_CACHE`: file pages stay in the host page cache.
    keep_file_cache: bool,
    /// Locked read-only shared file regions map the page cache's pages
    /// (not `UMM_F_COPY_LOCKED_FILES`; see `filemap.rs`).
    map_file_windows: bool,
}

/// The condition "a page in flight settled", with a count of its waiters:
/// a fill notifies it every time, and a `Condvar`'s notify is a futex call
/// even with nobody waiting (0.3–1 µs a fault here). Every wait registers
/// under the core lock before the lock is let go, so a notifier that
/// changed the state under that lock, even one that reads the count after
/// letting the lock go, sees the waiter.
#[derive(Default)]
pub(crate) struct Settled {
    cv: Condvar,
    waiters: std::sync::atomic::AtomicUsize,
}

impl Settled {
    pub fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> std::sync::LockResult<MutexGuard<'a, T>> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let r = self.cv.wait(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }

    pub fn wait_timeout<'a, T>(
        &self,
        g: MutexGuard<'a, T>,
        d: std::time::Duration,
    ) -> std::sync::LockResult<(MutexGuard<'a, T>, std::sync::WaitTimeoutResult)> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let r = self.cv.wait_timeout(g, d);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }

    pub fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }
}

pub(crate) struct Threads {
    pub handles: Vec<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    if SERVES_FAULTS.with(std::cell::Cell::get) {
        return lock_spinning(m);
    }
    // A panic while holding the core lock is a bug; the state it left is
    // still the best there is, so keep serving rather than cascade.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// Whether a faulting thread waits on this thread's progress (a handler
    /// thread, or a faulting thread resolving its own fault): its [`lock`]
    /// tries for a while before it sleeps ([`lock_spinning`]).
    static SERVES_FAULTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long a thread that a faulting thread waits on tries for the core
/// lock before it sleeps on it ([`lock_spinning`]): the longest holds by
/// other threads are a large unmap's per-chunk bookkeeping (30–90 µs).
const LOCK_SPIN_NS: u64 = 150_000;

/// [`lock`] for a thread that a faulting thread waits on: tries for up to
/// [`LOCK_SPIN_NS`], yielding now and then (to a holder queued on this
/// CPU), before it sleeps on the lock. Sleeping there lets this vCPU halt,
/// and on this VM the hypervisor then wakes it up to a millisecond late
/// while a large unmap frees memory (`perf`: a handler blocked on the core
/// lock held by the zap's chunk bookkeeping, woken 18 µs later, running
/// again 0.9–1.5 ms later, the faulting thread waiting all that time;
/// docs/design.md, "Seed 003"). Async-signal-safe (the in-thread SIGBUS
/// handler takes the lock this way): an atomic try, the vDSO clock,
/// `sched_yield`.
fn lock_spinning<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    let mut until = 0;
    let mut turn = 0u32;
    loop {
        match m.try_lock() {
            Ok(g) => return g,
            Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        let now = now_ns();
        if until == 0 {
            until = now + LOCK_SPIN_NS;
        } else if now >= until {
            return m.lock().unwrap_or_else(|e| e.into_inner());
        }
        turn = turn.wrapping_add(1);
        if turn.is_multiple_of(8) {
            std::thread::yield_now();
        } else {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

impl Inner {
    pub fn close(&self, threads: Threads) {
        // Shared file pages reach their files first (umm_close's contract).
        let ranges = lock(&self.core).shared_file_ranges();
        for r in ranges {
            let _mm = self.read_mm();
            let _ = self.writeback_range(r, &[]);
        }
        for f in lock(&self.files).values() {
            let _ = f.sync();
        }
        self.shutdown.store(true, Ordering::SeqCst);
        self.wake_fd.signal();
        {
            let _c = lock(&self.core);
            self.reclaim_wanted.notify_all();
            self.settled.notify_all();
        }
        self.wake_ahead.shut();
        for h in threads.handles {
            let _ = h.join();
        }
        // The reservation leaves the SIGBUS handler's table, where an
        // in-thread space (`UMM_F_INTHREAD_FAULTS`) or its first
        // `UMM_MAP_INTHREAD` region put it, with the reference to the space
        // it held (after the threads inside its resolver leave it).
        let _ = self.plat.thread(Thread::InThreadOff);
        // The arena's mappings go when the last reference to `Inner` does.
    }

    pub fn addr(&self, p: PageIdx) -> usize {
        self.base + (p.0 as usize) * self.page_size
    }
    fn swap_off(&self, slot: u32) -> u64 {
        slot as u64 * self.page_size as u64
    }

    /// The page ranges of `[addr, addr+len)` that map the shared zero page
    /// (none where the host has no `PAGEMAP_SCAN`).
    pub fn zero_pfn_ranges(&self, addr: usize, len: usize) -> Vec<(usize, usize)> {
        self.plat.runs(Runs::ZeroPage, addr, len)
    }

    /// A fault or populate short of frames waits for reclaim in flight
    /// elsewhere to settle (at most `oom_wait_us`).
    fn wait_settled<'a>(&self, c: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        match self.oom_wait_us.load(Ordering::Relaxed) {
            0 => c,
            us => {
                self.settled.wait_timeout(c, std::time::Duration::from_micros(us)).unwrap_or_else(|e| e.into_inner()).0
            }
        }
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_oom_wait_us(&self, us: u64) {
        self.oom_wait_us.store(us, Ordering::Relaxed);
    }

    /// The first pause of the store's write back-off (0: none; the
    /// simulation's runs must not depend on the clock).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_store_backoff_first_ns(&self, ns: u64) {
        self.store_backoff_first_ns.store(ns, Ordering::Relaxed);
    }

    /// Stops keeping `signalled` (the simulation: see `tracks_signals`).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_tracks_signals(&self, on: bool) {
        self.tracks_signals.store(on, Ordering::Relaxed);
    }

    /// `Core::validate` under the region lock (shared) and the core lock.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn validate_core(&self) {
        let _mm = self.read_mm();
        lock(&self.core).validate();
    }

    /// Another thread's background reclaim round, run now if nothing this
    /// thread holds would block it (the core lock, the region lock held
    /// exclusively); for the simulation's preemption points. Returns
    /// whether it ran.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn reclaim_if_unblocked(&self, want: u64) -> bool {
        match self.core.try_lock() {
            Ok(c) => drop(c),
            Err(_) => return false,
        }
        let Some(mm) = self.mm.try_read() else { return false };
        self.reclaim_rounds(&mm, want, false);
        true
    }

    /// A page's state in the core (for the simulation's checks).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn page_state(&self, a: usize) -> usermm_core::page::PState {
        let c = lock(&self.core);
        c.page_of(Addr(a as u64)).map_or(usermm_core::page::PState::Absent, |p| c.page(p).state)
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn core_counters(&self) -> usermm_core::Counters {
        lock(&self.core).stats().counters
    }

    pub fn read_mm(&self) -> RwLockReadGuard<'_, ()> {
        self.mm.read()
    }
}

fn take_one(a: &AtomicU32) -> bool {
    a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1)).is_ok()
}
