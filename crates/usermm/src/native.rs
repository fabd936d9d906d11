//! The native executor: owns a space's memory, serves its faults, and carries
//! out the core's decisions with userfaultfd, `madvise` and file I/O.
//!
//! # Where each concern lives
//! | file | what |
//! |---|---|
//! | `native.rs` | `Inner`, a composition of the parts below, `close`, small helpers |
//! | `native/settings.rs` | `Settings`: what the space was opened with, fixed |
//! | `native/service.rs` | `FaultService`: the spinning handler, the wake-ahead thread, the signals sent |
//! | `native/reclaimer.rs` | `Reclaimer`: watermarks, the background thread's poke, the read-in queue |
//! | `native/backoff.rs` | `StoreBackoff`: the page store's write back-off |
//! | `native/files.rs` | `FileTable`: the files the regions map |
//! | `native/counters.rs` | `HostCounters`: what is counted of the host |
//! | `native/hooks.rs`, `native/inject.rs` | test hooks; I/O errors injected by a wrapper of the platform |
//! | `native/tuning.rs` | every spin budget, wait and latency threshold, with what decided it |
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
//! - `mm`: the region lock (the mmap lock analogue), a reader-writer lock
//!   that hands off to a waiting writer (`usermm_sys::sync::RwLock`: a
//!   waiting writer blocks new readers, which is what lets another
//!   thread's mmap in between two zap slices: with std's lock the zapping
//!   thread took it back first, and a map/unmap loop beside a 4 GiB unmap
//!   stalled 113 ms against 4; and no state outside the lock, so a forked
//!   child can wait: parking_lot's shared table of waiters could be left
//!   locked by a parent thread). A fork holds it across; a child never lets
//!   the parent's go (its word counts parent threads waiting on it, which
//!   do not exist there) but takes the next of `mm_locks`
//!   (`native/fork.rs`).
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
//! fails keeps the page resident; I/O errors are counted.
//! `Space::inject_swap_errors` makes the next swap or file reads or writes
//! fail with `EIO` (`native/inject.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use std::thread::JoinHandle;
use usermm_sys::sync::{RwLock, RwLockReadGuard};

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
mod backoff;
mod calls;
mod commit;
mod counters;
pub(crate) mod creds;
mod fault;
mod filemap;
mod files;
mod fill;
mod fork;
mod hooks;
mod inject;
mod install;
mod open;
mod populate;
mod reclaim;
mod reclaimer;
mod serve;
mod service;
mod settings;
mod tuning;
mod volatile;
mod writeback;
mod zap;

pub(crate) use fork::ForkLocks;
#[cfg(feature = "test-hooks")]
pub(crate) use hooks::SIM_BUG_LOST_SWAP_WRITE;
#[cfg(feature = "test-hooks")]
pub(crate) use open::NOT_COPIED;
use tuning::*;

/// A space's executor: its identity (the reservation, its page size), its
/// locks and the platform, and the parts that keep their own state behind
/// their own methods. Every field is private to the executor
/// (`native/**`); the API layer asks through methods.
pub(crate) struct Inner {
    base: usize,
    reserve_len: usize,
    page_size: usize,
    /// The host: every operation on pages, files, signals and events (with
    /// the I/O errors still to inject, `native/inject.rs`).
    plat: inject::Injecting,
    /// The region lock (`mm()`): one of these per fork generation the space
    /// went through, `mm_ix` naming this process's (see `native/fork.rs`).
    mm_locks: Box<[RwLock<()>]>,
    mm_ix: std::sync::atomic::AtomicUsize,
    core: Mutex<Core>,
    /// Signalled whenever a busy page settles or a held range is released.
    settled: Settled,
    shutdown: AtomicBool,
    /// Pokes the handler threads out of their wait (at close).
    wake_fd: EventFd,
    /// The space itself, for the SIGBUS handler's table
    /// (`Thread::InThreadOn`).
    me: std::sync::Weak<Inner>,
    /// What the space was opened with, fixed.
    settings: settings::Settings,
    /// The handler threads' spinner, the wake-ahead thread, the signals sent.
    service: service::FaultService,
    /// The background reclaimer's watermarks, poke and read-in queue.
    reclaimer: reclaimer::Reclaimer,
    /// The page store's write back-off.
    backoff: backoff::StoreBackoff,
    /// The files the regions map.
    files: files::FileTable,
    /// What the executor counts of the host.
    counters: counters::HostCounters,
    /// Bugs and stalls the tests inject.
    hooks: hooks::TestHooks,
    /// Whose the space is (the fork generation), its threads, and whether
    /// a forked child gets a copy (`native/fork.rs`).
    fork: fork::ForkState,
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
    handles: Vec<JoinHandle<()>>,
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

/// [`lock`] for a thread that a faulting thread waits on: tries for up to
/// [`LOCK_SPIN_NS`] (see there why), yielding now and then (to a holder queued
/// on this CPU), before it sleeps on the lock. Async-signal-safe (the in-thread
/// SIGBUS handler takes the lock this way): an atomic try, the vDSO clock,
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
        self.files.sync_all();
        self.shutdown.store(true, Ordering::SeqCst);
        self.wake_threads();
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
    /// elsewhere to settle (at most `Reclaimer::oom_wait`).
    fn wait_settled<'a>(&self, c: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        match self.reclaimer.oom_wait() {
            None => c,
            Some(d) => self.settled.wait_timeout(c, d).unwrap_or_else(|e| e.into_inner()).0,
        }
    }

    /// `Core::validate` under the region lock (shared) and the core lock.
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
        let Some(mm) = self.mm().try_read() else { return false };
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

    /// The region lock of this process (see `mm_locks`).
    #[inline]
    pub(crate) fn mm(&self) -> &RwLock<()> {
        &self.mm_locks[self.mm_ix.load(Ordering::Relaxed)]
    }

    pub fn read_mm(&self) -> RwLockReadGuard<'_, ()> {
        self.mm().read()
    }
}

/// What the API layer (`Space`) and the simulation read of a space, and the
/// test hooks they set.
impl Inner {
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    pub(crate) fn reserve_len(&self) -> usize {
        self.reserve_len
    }

    pub(crate) fn page_size(&self) -> usize {
        self.page_size
    }

    /// The host, for what the API layer reports of it (capabilities, the
    /// frame pool).
    pub(crate) fn plat(&self) -> &dyn Platform {
        &self.plat
    }

    /// The core, locked (for introspection).
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    pub(crate) fn user_mode_only(&self) -> bool {
        self.settings.user_mode_only()
    }

    pub(crate) fn in_thread(&self) -> bool {
        self.settings.in_thread()
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn host_lazyfree(&self) -> bool {
        self.settings.host_lazyfree()
    }

    pub(crate) fn fallback_reason(&self) -> Option<&str> {
        self.settings.fallback_reason()
    }

    /// The files the regions map, as they are now.
    pub(crate) fn files(&self) -> std::collections::HashMap<u32, Arc<MappedFile>> {
        self.files.snapshot()
    }

    /// The host counters for `Space::stats`: the longest exclusive
    /// region-lock hold (ns), zaps the host refused at first, failed store
    /// writes, the store back-off's pause (ms), unreported host moves.
    pub(crate) fn host_stats(&self) -> HostStats {
        HostStats {
            write_hold_ns_max: self.counters.write_hold_ns_max(),
            host_refusals: self.counters.host_refusals(),
            swap_write_fails: self.backoff.write_fails(),
            swap_backoff_ms: self.backoff.pause_ms(),
            host_unreported_moves: self.counters.host_unreported_moves(),
        }
    }

    /// Makes the next `reads` swap or file reads and `writes` swap or file
    /// writes fail with `EIO` (`native/inject.rs`).
    pub(crate) fn inject_io_errors(&self, reads: u32, writes: u32) {
        self.plat.set(reads, writes);
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_oom_wait_us(&self, us: u64) {
        self.reclaimer.set_oom_wait_us(us);
    }

    /// The first pause of the store's write back-off (0: none; the
    /// simulation's runs must not depend on the clock).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_store_backoff_first_ns(&self, ns: u64) {
        self.backoff.set_first_ns(ns);
    }

    /// Stops keeping the signals sent (the simulation: see
    /// `FaultService::set_tracks_signals`).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_tracks_signals(&self, on: bool) {
        self.service.set_tracks_signals(on);
    }

    /// Test hook: see `Space::inject_signal_stall`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_signal_stall_ms(&self, ms: u32) {
        self.hooks.set_signal_stall_ms(ms);
    }

    /// Test hook: see `Space::inject_writeback_stall`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_writeback_stall_ms(&self, ms: u32) {
        self.hooks.set_writeback_stall_ms(ms);
    }

    /// Test hook: see `Space::inject_split_failures`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_split_failures(&self, n: u32) -> u64 {
        self.hooks.set_split_failures(n)
    }

    /// Test hook: see `Space::interrupt_populate_at`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn interrupt_populate_at(&self, addr: usize) {
        self.hooks.set_populate_interrupt((addr.wrapping_sub(self.base) / self.page_size) as u64);
    }

    /// Test hook: an executor bug to inject (`SIM_BUG_*`).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_sim_bug(&self, bug: u32) {
        self.hooks.set_sim_bug(bug);
    }

    /// Test hook: the whole swap's contents.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn swap_contents(&self) -> Result<Vec<u8>, Errno> {
        self.plat.swap_contents(self.settings.swap_bytes())
    }
}

/// [`Inner::host_stats`].
pub(crate) struct HostStats {
    pub write_hold_ns_max: u64,
    pub host_refusals: u64,
    pub swap_write_fails: u64,
    pub swap_backoff_ms: u64,
    pub host_unreported_moves: u64,
}
