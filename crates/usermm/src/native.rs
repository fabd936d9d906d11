//! The native executor: owns a space's memory, serves its faults, and carries
//! out the core's decisions with userfaultfd, `madvise` and file I/O.
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
//! - `core`: a mutex around the pure core, held only for decisions, never
//!   across a syscall that can block for long.
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
    Addr, AdviceOp, Core, CoreConfig, Deactivate, Detached, Discard, Errno, Evict, FaultPlan, FileMap, FileRange,
    LockPlan, MmapReply, PageIdx, PageRange, Transfer, Writeback,
};
use usermm_sys::arena::{Arena, Bounce};
use usermm_sys::file::MappedFile;
use usermm_sys::file::{ProcMem, SwapFile};
use usermm_sys::now_ns;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::{Uffd, UffdMode, UffdMsg, UFFD_EVENT_PAGEFAULT, UFFD_FEATURE_MOVE, UFFD_PAGEFAULT_FLAG_WRITE};

use crate::Config;

/// Zap and unmap work is done in chunks of this many bytes, so that neither
/// usermm's region lock nor the kernel's mmap lock is held for long.
pub const ZAP_CHUNK_BYTES: usize = 4 << 20;
/// A chunk's pages are dropped this many bytes at a time, with a yield of
/// the CPU between two slices.
const ZAP_SLICE_BYTES: usize = 512 << 10;
/// Size of each handler thread's swap-in buffer.
const SWAP_BOUNCE_BYTES: usize = 1 << 20;
/// Empty reclaim rounds (5 ms apart) before a fault is out of memory.
const OOM_ROUNDS: u32 = 50;
/// Fills up to this many pages are installed under the core lock.
const SMALL_FILL_PAGES: u64 = 16;
/// How long a handler spins for the next fault after serving one.
const SPIN_NS: u64 = 100_000;
/// How many windows a streaming file region's read-in runs ahead of the
/// program's last fault.
const READAHEAD_DEPTH: u64 = 4;
/// Pages reclaimed per background round.
const RECLAIM_BATCH: u64 = 256;

pub(crate) struct Inner {
    pub base: usize,
    pub reserve_len: usize,
    pub page_size: usize,
    pub arena: Arena,
    pub uffd: Uffd,
    pub mm: RwLock<()>,
    pub core: Mutex<Core>,
    /// Signalled whenever a busy page settles or a held range is released.
    pub settled: Condvar,
    /// Signalled when free frames fall below the low watermark.
    pub reclaim_wanted: Condvar,
    pub swap: Option<SwapFile>,
    pub procmem: Option<ProcMem>,
    pub shutdown: AtomicBool,
    /// Whether a handler thread is spinning for the next message.
    spinning: AtomicBool,
    pub wake_fd: EventFd,
    pub write_hold_ns_max: AtomicU64,
    /// Zaps the host refused at first (see `Arena::zap`).
    pub host_refusals: AtomicU64,
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
    /// Test hook: the page index at which a populate is interrupted (EINTR),
    /// once; `u64::MAX`: none (see `Space::interrupt_populate_at`).
    pub populate_interrupt: AtomicU64,
    pub inject_write_errors: AtomicU32,
    pub willneed: Mutex<Vec<usize>>,
    /// Files mapped by the space's regions, by id (ids start at 1).
    pub files: Mutex<std::collections::HashMap<u32, Arc<MappedFile>>>,
    next_file: AtomicU32,
    pub user_mode_only: bool,
    /// Lazily freed pages are passed down to the host (`MADV_FREE`) and
    /// discarded through it (see `Arena::host_lazyfree`).
    pub host_lazyfree: bool,
    pub fallback_reason: Option<String>,
    pub swap_bytes: u64,
    /// `UMM_F_KEEP_FILE_CACHE`: file pages stay in the host page cache.
    keep_file_cache: bool,
    /// `/proc/self/pagemap`, for the zero-page scans of the lock reports.
    pagemap: Option<usermm_sys::file::Pagemap>,
}

pub(crate) struct Threads {
    pub handles: Vec<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the core lock is a bug; the state it left is
    // still the best there is, so keep serving rather than cascade.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    pub fn open(cfg: &Config) -> Result<(Arc<Inner>, Threads), Errno> {
        let shift = if cfg.page_shift == 0 { 12 } else { cfg.page_shift };
        if !(12..=21).contains(&shift) {
            return Err(Errno::EINVAL);
        }
        if cfg.flags & !UMM_F_ALL != 0 {
            return Err(Errno::EINVAL);
        }
        let ps = 1usize << shift;
        let budget_bytes = if cfg.budget_bytes == 0 { crate::default_budget_bytes() } else { cfg.budget_bytes };
        let budget_pages = (budget_bytes / ps).max(1) as u64;
        let reserve = if cfg.reserve_bytes == 0 { crate::DEFAULT_RESERVE_BYTES } else { cfg.reserve_bytes };
        let reserve = reserve.checked_add(ps - 1).ok_or(Errno::EINVAL)? & !(ps - 1);
        if reserve == 0 || reserve as u64 > (1u64 << 46) {
            return Err(Errno::EINVAL);
        }
        let swap_slots = (cfg.swap_bytes / ps).min(u32::MAX as usize - 1) as u32;
        if budget_pages > u32::MAX as u64 / 2 {
            return Err(Errno::EINVAL);
        }
        let uffd = Uffd::open(cfg.flags & UMM_F_REQUIRE_FULL_UFFD != 0, cfg.flags & UMM_F_FORCE_USER_MODE != 0)
            .map_err(|e| if e == Errno::ENOSYS || e == Errno::EOPNOTSUPP { Errno::ENOSYS } else { e })?;
        let user_mode_only = uffd.mode == UffdMode::UserModeOnly;
        let swap = if swap_slots > 0 {
            let dir = cfg
                .swap_dir
                .clone()
                .or_else(|| std::env::var("TMPDIR").ok().map(Into::into))
                .unwrap_or_else(|| "/tmp".into());
            Some(SwapFile::create(&dir.to_string_lossy(), swap_slots as u64 * ps as u64)?)
        } else {
            None
        };
        let staging_slots = budget_pages as u32;
        let arena = Arena::new(&uffd, reserve, staging_slots as usize, ps)?;
        let base = arena.base;
        let core = Core::new(CoreConfig {
            base: base as u64,
            reserve_pages: (reserve / ps) as u64,
            page_shift: shift,
            budget_pages,
            swap_slots,
            staging_slots,
            max_regions: if cfg.max_regions == 0 { 65530 } else { cfg.max_regions },
            memlock_pages: if cfg.memlock_bytes == usize::MAX { u64::MAX } else { (cfg.memlock_bytes / ps) as u64 },
            mlock_allowed: cfg.memlock_bytes != 0,
            exact_faults: cfg.flags & UMM_F_EXACT_FAULTS != 0,
        });
        let host_lazyfree = arena.host_lazyfree() && ps == 4096 && !user_mode_only;
        let mut core = core;
        core.set_host_lazyfree(host_lazyfree);
        core.set_purge_volatile_first(cfg.flags & UMM_F_PURGE_VOLATILE_FIRST != 0);
        if cfg.lazyfree_max_bytes != 0 {
            core.set_lazyfree_max((cfg.lazyfree_max_bytes / ps) as u64);
        }
        let low = (budget_pages / 32).clamp(1, 4096);
        let high = (low * 2).min(budget_pages);
        let inner = Arc::new(Inner {
            base,
            reserve_len: reserve,
            page_size: ps,
            arena,
            fallback_reason: uffd.fallback_reason.clone(),
            uffd,
            mm: RwLock::new(()),
            core: Mutex::new(core),
            settled: Condvar::new(),
            reclaim_wanted: Condvar::new(),
            swap,
            procmem: ProcMem::open().ok(),
            shutdown: AtomicBool::new(false),
            spinning: AtomicBool::new(false),
            wake_fd: EventFd::new()?,
            write_hold_ns_max: AtomicU64::new(0),
            host_refusals: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            fills_drained: AtomicU64::new(0),
            guards_used: AtomicBool::new(false),
            dontdump_used: AtomicBool::new(false),
            low_watermark: low,
            high_watermark: high,
            inject_read_errors: AtomicU32::new(0),
            populate_interrupt: AtomicU64::new(u64::MAX),
            inject_write_errors: AtomicU32::new(0),
            willneed: Mutex::new(Vec::new()),
            files: Mutex::new(std::collections::HashMap::new()),
            next_file: AtomicU32::new(1),
            user_mode_only,
            host_lazyfree,
            swap_bytes: swap_slots as u64 * ps as u64,
            keep_file_cache: cfg.flags & UMM_F_KEEP_FILE_CACHE != 0,
            pagemap: usermm_sys::file::Pagemap::open().ok(),
        });
        let nthreads =
            if cfg.fault_threads == 0 { default_fault_threads() } else { cfg.fault_threads.min(64) as usize };
        let mut handles = Vec::new();
        for i in 0..nthreads {
            let me = inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("usermm-fault-{i}"))
                .spawn(move || me.handler_loop())
                .map_err(|_| Errno::EAGAIN)?;
            handles.push(h);
        }
        {
            // The background thread also serves MADV_WILLNEED; with
            // UMM_F_NO_BACKGROUND_RECLAIM it only does that.
            let me = inner.clone();
            let bg = cfg.flags & UMM_F_NO_BACKGROUND_RECLAIM == 0;
            let h = std::thread::Builder::new()
                .name("usermm-reclaim".into())
                .spawn(move || me.background_loop(bg))
                .map_err(|_| Errno::EAGAIN)?;
            handles.push(h);
        }
        Ok((inner, Threads { handles }))
    }

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
        for h in threads.handles {
            let _ = h.join();
        }
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
        self.pagemap.as_ref().and_then(|p| p.zero_pfn_ranges(addr, len).ok()).unwrap_or_default()
    }

    pub fn read_mm(&self) -> RwLockReadGuard<'_, ()> {
        self.mm.read()
    }

    // ------------------------------------------------------------------
    // Fault service

    fn handler_loop(&self) {
        let mut msgs = [UffdMsg::default(); 32];
        while !self.shutdown.load(Ordering::Relaxed) {
            match usermm_sys::uffd::poll2(self.uffd.raw(), self.wake_fd.raw(), 200) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => continue,
            }
            // Serve, then spin briefly for the next message: a program that
            // faults in a loop faults again a few microseconds after it is
            // woken, and catching that without a wake-up of this thread saves
            // most of a round trip. Only one handler spins at a time, never
            // for long, and it yields the CPU on every turn, so that a
            // runnable thread queued on its CPU (the program) runs first.
            let mut spin_until = 0;
            loop {
                let n = self.uffd.read_msgs(&mut msgs).unwrap_or(0);
                if n > 0 {
                    for m in &msgs[..n] {
                        if m.event == UFFD_EVENT_PAGEFAULT {
                            self.resolve(m.address as usize, m.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0, Some(m.ptid));
                        }
                    }
                    // Become the spinner unless this thread already is or
                    // another one is.
                    if spin_until == 0
                        && self.spinning.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_err()
                    {
                        break;
                    }
                    spin_until = now_ns() + SPIN_NS;
                    continue;
                }
                if spin_until == 0 || now_ns() >= spin_until {
                    break;
                }
                std::thread::yield_now();
            }
            if spin_until != 0 {
                self.spinning.store(false, Ordering::Release);
            }
        }
    }

    /// Resolves a fault at `addr` (or a WILLNEED read-in when `tid` is None).
    pub fn resolve(&self, addr: usize, write: bool, tid: Option<u32>) {
        let page_addr = addr & !(self.page_size - 1);
        let mm = self.read_mm();
        let mut c = lock(&self.core);
        let mut reclaim_rounds = 0;
        let mut poison_failed = false;
        loop {
            let plan = c.fault(Addr(page_addr as u64), write);
            match plan {
                FaultPlan::Wake => {
                    drop(c);
                    let _ = self.uffd.wake(page_addr, self.page_size);
                    return;
                }
                FaultPlan::Segv { gap } => {
                    drop(c);
                    let protected =
                        self.arena.protect(self.addr(gap.start), gap.pages() as usize * self.page_size, PROT_NONE);
                    if protected.is_err() {
                        // The host refused (out of its map count): the
                        // signal itself, or the thread would fault forever.
                        if let Some(t) = tid {
                            let _ = usermm_sys::thread::sigsegv_thread(t, addr);
                        }
                        return;
                    }
                    let _ = self.uffd.wake(page_addr, self.page_size);
                    return;
                }
                FaultPlan::Wait => {
                    c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner());
                }
                FaultPlan::Reclaim { want } => {
                    if reclaim_rounds > OOM_ROUNDS {
                        // Everything resident is unevictable (or swap is
                        // full): the kernel would OOM-kill; we raise SIGBUS.
                        // Decided on a plan made under this hold of the core
                        // lock, and raised before it is let go: the page is
                        // neither resident nor being filled, so the thread
                        // is still in this fault (or will fault here again)
                        // and the signal cannot reach it anywhere else.
                        if let Some(t) = tid {
                            c.fault_oom();
                            let _ = usermm_sys::thread::sigbus_thread(t, addr);
                        }
                        return;
                    }
                    let want = want.max(c.direct_reclaim_batch());
                    drop(c);
                    let freed = self.reclaim_locked(&mm, want);
                    c = lock(&self.core);
                    if freed == 0 && c.free_frames() == 0 {
                        // Nothing freed this time, but other reclaim may be
                        // in flight (the pages it holds are busy, so this
                        // plan could not take them): wait for it to settle
                        // before trying again. Only no progress for a while
                        // is out of memory.
                        reclaim_rounds += 1;
                        c = self
                            .settled
                            .wait_timeout(c, std::time::Duration::from_millis(5))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                FaultPlan::Refill { page } => {
                    // A lazily freed page the host dropped: zeros (or, if the
                    // fault raced with nothing gone, the copy finds the page
                    // there and installs nothing).
                    let a = self.addr(page);
                    let n = self.arena.zero_fill_wake(&self.uffd, a, self.page_size, true).unwrap_or(0);
                    c.fill_done(&plan, u64::from(n == self.page_size));
                    self.after_fill(&mut c);
                    drop(c);
                    let _ = self.uffd.wake(page_addr, self.page_size);
                    return;
                }
                FaultPlan::Sigbus => {
                    if poison_failed {
                        // Still to be raised, and no marker can be placed:
                        // the signal itself, under the core lock (see the
                        // out-of-memory case above).
                        if let Some(t) = tid {
                            let _ = usermm_sys::thread::sigbus_thread(t, addr);
                        }
                        return;
                    }
                    drop(c);
                    // A poison marker makes the kernel raise the SIGBUS itself,
                    // in the touching thread, with the exact address (and for
                    // every later touch too); the marker also wakes the thread.
                    if self.uffd.poison(page_addr, self.page_size).is_ok() {
                        return;
                    }
                    // The page may have been filled meanwhile (the thread
                    // then went on, and a signal now would reach it
                    // elsewhere): plan again.
                    poison_failed = true;
                    c = lock(&self.core);
                }
                FaultPlan::FileRead { run, file, file_page } => {
                    drop(c);
                    let (n, drop_due) = self.file_in(run, file, file_page, true).unwrap_or((0, None));
                    let c = self.commit_fill(&plan, n);
                    // Read-ahead pipeline: a full window in a sequential or
                    // streaming region has the next window read by the
                    // background thread while the program consumes this one.
                    let ahead = n == run.pages() && n >= usermm_core::BLOCK_PAGES && file_continues(&c, run.end, file);
                    if n == 0 {
                        // Past the end of the file (or the read failed):
                        // SIGBUS, as Linux raises for a mapping past EOF.
                        // Under the core lock, before the wake: the thread
                        // is still in this fault.
                        if let Some(t) = tid {
                            let _ = usermm_sys::thread::sigbus_thread(t, addr);
                        }
                    }
                    drop(c);
                    // Wake only after the commit (the pages were copied in
                    // without waking): the woken thread must see them
                    // committed (e.g. locked), never a fill in flight.
                    self.wake_run(run, page_addr);
                    // Then what the woken thread need not wait for: the
                    // deferred page-cache drop. (No POSIX_FADV_WILLNEED hint
                    // for the host's read-ahead: the kernel's own read-ahead
                    // on our sequential 1 MiB preads keeps ahead better; the
                    // hint blocks 0.23 ms a MiB in the caller and halved the
                    // streaming scan's throughput.)
                    if let Some(f) = drop_due {
                        let ps = self.page_size as u64;
                        f.drop_cache(file_page * ps, (n * ps) as usize);
                    }
                    if ahead {
                        lock(&self.willneed).push(self.addr(run.end));
                        let _c = lock(&self.core);
                        self.reclaim_wanted.notify_all();
                    }
                    return;
                }
                FaultPlan::ZeroFill { run } if run.pages() <= SMALL_FILL_PAGES => {
                    // A small fill: install, wake and commit under the core
                    // lock. The woken thread can observe nothing before the
                    // commit (every observer takes this lock), no zap can
                    // interleave, and its wake-up overlaps our commit instead
                    // of waiting for a separate wake ioctl. The install never
                    // waits on anything that needs this lock.
                    let a = self.addr(run.start);
                    let len = run.pages() as usize * self.page_size;
                    let done = if write {
                        self.arena.zero_fill_wake(&self.uffd, a, len, true)
                    } else {
                        self.arena
                            .zero_map_wake(&self.uffd, a, len, true)
                            .or_else(|_| self.arena.zero_fill_wake(&self.uffd, a, len, true))
                    };
                    let n = (done.unwrap_or(0) / self.page_size) as u64;
                    c.fill_done(&plan, n);
                    self.after_fill(&mut c);
                    drop(c);
                    if n < run.pages() {
                        let _ = self.uffd.wake(page_addr, self.page_size);
                    }
                    return;
                }
                FaultPlan::ZeroFill { run } => {
                    drop(c);
                    // A large run is a fault-around window, which only
                    // unlocked regions get: its pieces wake their waiters
                    // as they go in (see zero_fill_pieces).
                    let n = if write { self.zero_fill_pieces(run) } else { self.zero_map(run) };
                    drop(self.commit_fill(&plan, n));
                    // Wake the rest only after the commit: the woken thread
                    // must see the page's final state, never a fill in
                    // flight.
                    self.wake_run(run, page_addr);
                    return;
                }
                FaultPlan::SwapIn { run, .. } => {
                    drop(c);
                    let n = self.fill_io(&plan, write);
                    let c = self.commit_fill(&plan, n);
                    let p = Addr(page_addr as u64);
                    let faulted_in = n > 0 && (p.0 - self.addr(run.start) as u64) / (self.page_size as u64) < n;
                    if !faulted_in {
                        // Signal first, under the core lock: a thread woken
                        // before its SIGBUS is queued would retry the fault
                        // instead, and the page cannot be filled meanwhile.
                        if let Some(t) = tid {
                            let _ = usermm_sys::thread::sigbus_thread(t, addr);
                        }
                    }
                    drop(c);
                    self.wake_run(run, page_addr);
                    return;
                }
                FaultPlan::Reactivate { .. } => {
                    drop(c);
                    let Some(n) = self.reactivate_io(&plan) else {
                        // The host purged the parked volatile page: plan
                        // again (a SIGBUS, as for any purged page).
                        c = lock(&self.core);
                        continue;
                    };
                    drop(self.commit_fill(&plan, n));
                    let _ = self.uffd.wake(page_addr, self.page_size);
                    return;
                }
            }
        }
    }

    /// The I/O of a fill plan, with no lock held: returns how many pages of
    /// the plan (a prefix) were installed.
    fn fill_io(&self, plan: &FaultPlan, write: bool) -> u64 {
        match *plan {
            FaultPlan::ZeroFill { run } if write => self.zero_fill(run),
            // A read maps the zero page (Linux does too).
            FaultPlan::ZeroFill { run } => self.zero_map(run),
            FaultPlan::FileRead { run, file, file_page } => {
                self.file_in(run, file, file_page, false).map_or(0, |(n, _)| n)
            }
            FaultPlan::SwapIn { run, slot } => self.swap_in(run, slot),
            // (Checked reactivations go through `reactivate_io`, which also
            // commits a loss.)
            FaultPlan::Reactivate { page, slot, how, checked: false } => u64::from(self.reactivate(page, slot, how)),
            _ => 0,
        }
    }

    /// A reactivation's I/O: `Some(pages installed)`, or `None` when a
    /// checked reactivation found that the host discarded the parked page
    /// (the loss is committed: the page is purged).
    fn reactivate_io(&self, plan: &FaultPlan) -> Option<u64> {
        let FaultPlan::Reactivate { page, slot, checked, .. } = *plan else { return Some(0) };
        if !checked {
            return Some(self.fill_io(plan, false));
        }
        let dst = self.addr(page);
        let r = with_bounce(self.page_size, |b| self.arena.slot_to_page_checked(&self.uffd, slot, dst, b));
        match r {
            Some(Ok(true)) => Some(1),
            Some(Ok(false)) => {
                let mut c = lock(&self.core);
                c.reactivate_lost(plan);
                self.settled.notify_all();
                None
            }
            _ => Some(0),
        }
    }

    /// Commits a fill and tells the threads waiting on the core; returns the
    /// core, still locked.
    fn commit_fill(&self, plan: &FaultPlan, installed: u64) -> MutexGuard<'_, Core> {
        let mut c = lock(&self.core);
        c.fill_done(plan, installed);
        self.after_fill(&mut c);
        c
    }

    /// Wakes the threads waiting on `run` (and on `fault_addr`'s page,
    /// which a failed fill did not cover).
    fn wake_run(&self, run: PageRange, fault_addr: usize) {
        let a = self.addr(run.start);
        let l = run.pages() as usize * self.page_size;
        let _ = self.uffd.wake(a, l);
        if fault_addr < a || fault_addr >= a + l {
            let _ = self.uffd.wake(fault_addr, self.page_size);
        }
    }

    /// Waits until no page of `[addr, addr+len)` is being filled, and returns
    /// the core locked, so that introspection and advice see the fills other
    /// threads' faults have in flight as committed.
    pub fn settled_core(&self, addr: usize, len: usize) -> MutexGuard<'_, Core> {
        self.settled_core_all(addr, len, false)
    }

    /// `settled_core`; with `all`, waits for every busy page of the range
    /// (evictions too), for advice that must see every page where it rests.
    pub fn settled_core_all(&self, addr: usize, len: usize, all: bool) -> MutexGuard<'_, Core> {
        let mut c = lock(&self.core);
        let ps = self.page_size as u64;
        let pages = (len as u64).div_ceil(ps).min(c.config().reserve_pages);
        while c.any_filling(Addr(addr as u64), pages, all) {
            c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        c
    }

    fn after_fill(&self, c: &mut MutexGuard<'_, Core>) {
        self.fills.fetch_add(1, Ordering::Relaxed);
        self.settled.notify_all();
        if c.free_frames() < self.low_watermark || c.spares_low() {
            self.reclaim_wanted.notify_one();
        }
    }

    /// Tops up the core's spare metadata buffers, allocated here with no
    /// lock held (see `Core::add_spares`).
    fn refill_spares(&self) {
        let wanted = lock(&self.core).spares_wanted();
        let spares = usermm_core::Spares::alloc(wanted);
        lock(&self.core).add_spares(spares);
    }

    /// Installs zero pages on `run` a piece of `SMALL_FILL_PAGES` at a time,
    /// each piece waking the threads that wait in it; returns how many pages
    /// (a prefix) went in. A fault-around window of 256 pages takes 0.3 ms
    /// to fill (1.5 ms on memory the host must fault in), and the faulting
    /// thread resumes after the first piece instead of after the whole
    /// window. The pages stay `Filling` until the caller commits: the woken
    /// thread may touch them, but every observer (introspection, advice,
    /// reclaim, zap) waits for the commit.
    fn zero_fill_pieces(&self, run: PageRange) -> u64 {
        let mut done = 0;
        let mut s = run.start.0;
        while s < run.end.0 {
            let piece = PageRange::new(s, (s + SMALL_FILL_PAGES).min(run.end.0));
            let len = piece.pages() as usize * self.page_size;
            let n = self.arena.zero_fill_wake(&self.uffd, self.addr(piece.start), len, true).unwrap_or(0);
            done += (n / self.page_size) as u64;
            if n < len {
                break;
            }
            s = piece.end.0;
            if s < run.end.0 {
                // The woken thread may be queued on this CPU: let it run.
                std::thread::yield_now();
            }
        }
        done
    }

    /// Installs zero pages on `run`; returns how many (a prefix) went in.
    fn zero_fill(&self, run: PageRange) -> u64 {
        let len = run.pages() as usize * self.page_size;
        let done = self.arena.zero_fill(&self.uffd, self.addr(run.start), len).unwrap_or(0);
        (done / self.page_size) as u64
    }

    /// Reads the swap slots `slot..` into the pages of `run`; returns how
    /// many pages (a prefix) were installed.
    /// Maps the zero page on `run` (a read fault). The frame a later write
    /// allocates (the kernel's copy-on-write) is already charged: the page
    /// counts as resident from now on, so the budget stays hard.
    fn zero_map(&self, run: PageRange) -> u64 {
        let len = run.pages() as usize * self.page_size;
        match self.arena.zero_map(&self.uffd, self.addr(run.start), len) {
            Ok(done) => (done / self.page_size) as u64,
            Err(_) => self.zero_fill(run),
        }
    }

    fn swap_in(&self, run: PageRange, slot: u32) -> u64 {
        let Some(swap) = &self.swap else { return 0 };
        if take_one(&self.inject_read_errors) {
            return 0;
        }
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        with_bounce(len, |bounce| {
            self.arena
                .swap_in(&self.uffd, swap, self.swap_off(slot), self.addr(run.start), len, bounce)
                .map(|n| (n / ps) as u64)
                .unwrap_or(0)
        })
        .unwrap_or(0)
    }

    /// Reads file pages into `run` (its first page is file page
    /// `file_page`); returns how many (a prefix) were installed — 0 when the
    /// run starts past the end of the file — and, if a drop of the host's
    /// page-cache copy is still due, the file to drop it from.
    ///
    /// That copy (of a read through the page cache; a single page is read
    /// with `O_DIRECT` where possible and leaves none) is dropped here
    /// unless `defer_drop`, when the caller drops it once the faulting
    /// thread is woken: the drop costs 3 µs for a single page and 0.5 µs a
    /// page in a window, and the thread need not wait for it.
    fn file_in(
        &self,
        run: PageRange,
        file: u32,
        file_page: u64,
        defer_drop: bool,
    ) -> Result<(u64, Option<Arc<MappedFile>>), Errno> {
        let f = lock(&self.files).get(&file).cloned().ok_or(Errno::EIO)?;
        if take_one(&self.inject_read_errors) {
            return Err(Errno::EIO);
        }
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        let off = file_page * ps as u64;
        let r = with_bounce(len, |bounce| self.arena.file_in(&self.uffd, &f, off, self.addr(run.start), len, bounce))
            .ok_or(Errno::ENOMEM)?;
        let (n, cached) = r?;
        if !cached || n == 0 {
            return Ok(((n / ps) as u64, None));
        }
        if !defer_drop {
            f.drop_cache(off, n);
            return Ok(((n / ps) as u64, None));
        }
        Ok(((n / ps) as u64, Some(f)))
    }

    /// Writes pages of shared file regions to their files. Returns one
    /// result per item.
    fn write_pages(&self, ws: &[Writeback]) -> Vec<Result<(), Errno>> {
        let files = lock(&self.files).clone();
        let ps = self.page_size as u64;
        let mut touched = Vec::new();
        let out = ws
            .iter()
            .map(|w| {
                let f = files.get(&w.file).ok_or(Errno::EIO)?;
                let src = if w.staging.is_none() { Some(self.addr(w.page)) } else { None };
                if take_one(&self.inject_write_errors) {
                    return Err(Errno::EIO);
                }
                let r = self.arena.page_out_to_file(f, src, w.staging, w.file_page * ps);
                if r.is_ok() && !touched.contains(&w.file) {
                    touched.push(w.file);
                }
                r
            })
            .collect();
        for id in touched {
            if let Some(f) = files.get(&id) {
                f.drop_cache(0, 0);
            }
        }
        out
    }

    /// Evicts parked pages of shared file regions to their files.
    fn writeback_all(&self, ws: &[Writeback]) -> u64 {
        if ws.is_empty() {
            return 0;
        }
        // Clean pages are dropped without I/O.
        let dirty: Vec<Writeback> = ws.iter().filter(|w| !w.clean).cloned().collect();
        let mut written = self.write_pages(&dirty).into_iter();
        let results: Vec<Result<(), Errno>> =
            ws.iter().map(|w| if w.clean { Ok(()) } else { written.next().unwrap_or(Err(Errno::EIO)) }).collect();
        let mut ok_slots = Vec::new();
        for (w, r) in ws.iter().zip(&results) {
            if r.is_ok() {
                if let Some(s) = w.staging {
                    let _ = self.arena.drop_slot(s);
                    ok_slots.push(s);
                }
            }
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (w, r) in ws.iter().zip(results) {
            freed += u64::from(r.is_ok());
            c.writeback_done(w, r);
        }
        self.settled.notify_all();
        freed
    }

    /// Writes the data of the shared file pages of `r` to their files (for
    /// msync, munmap, DONTNEED, close). `detached` describes shared file
    /// ranges already removed from the region tree. Returns the first error.
    fn writeback_range(&self, r: PageRange, detached: &[FileRange]) -> Result<Vec<u32>, Errno> {
        let snapshot = {
            let bytes = r.pages() as usize * self.page_size;
            let c = self.settled_core_all(self.addr(r.start), bytes, true);
            c.writeback_snapshot(r, detached)
        };
        let mut files: Vec<u32> = snapshot.iter().map(|w| w.file).collect();
        files.sort_unstable();
        files.dedup();
        let mut first = None;
        for (w, res) in snapshot.iter().zip(self.write_pages(&snapshot)) {
            if let Err(e) = res {
                first.get_or_insert(e);
                lock(&self.core).note_file_error(w.file, e);
            } else {
                lock(&self.core).count_writeback(w.page);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(files),
        }
    }

    /// Forgets the files no region maps any more.
    fn release_files(&self) {
        let used = lock(&self.core).files_in_use();
        lock(&self.files).retain(|id, _| used.contains(id));
    }

    fn reactivate(&self, page: PageIdx, slot: u32, how: Transfer) -> bool {
        let mv = how == Transfer::Move && self.uffd.has(UFFD_FEATURE_MOVE);
        self.arena.slot_to_page(&self.uffd, slot, self.addr(page), mv).is_ok()
    }

    // ------------------------------------------------------------------
    // Reclaim

    fn background_loop(&self, reclaim: bool) {
        loop {
            {
                let mut c = lock(&self.core);
                loop {
                    if self.shutdown.load(Ordering::Relaxed) {
                        return;
                    }
                    if c.spares_low() {
                        drop(c);
                        self.refill_spares();
                        c = lock(&self.core);
                        continue;
                    }
                    let need = reclaim && (c.free_frames() < self.low_watermark || c.needs_aging());
                    if need || !lock(&self.willneed).is_empty() {
                        break;
                    }
                    c = self
                        .reclaim_wanted
                        .wait_timeout(c, std::time::Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            let pending: Vec<usize> = std::mem::take(&mut *lock(&self.willneed));
            for a in pending {
                let (swapped, file) = {
                    let c = lock(&self.core);
                    let p = c.page_of(Addr(a as u64));
                    (
                        p.is_some_and(|p| c.page(p).state == usermm_core::page::PState::Swapped),
                        p.and_then(|p| c.region_at(p)).is_some_and(|r| r.file().is_some()),
                    )
                };
                if swapped {
                    self.resolve(a, false, None);
                } else if file {
                    // File read-ahead: a window from `a` (up to a hole or the
                    // end of the file; best effort, errors ignored).
                    // Never past the end of the region: the next one may be
                    // anonymous (a read populate would map its pages), or
                    // another file's (the chain below decides).
                    let region_end = {
                        let c = lock(&self.core);
                        c.page_of(Addr(a as u64)).and_then(|p| c.region_at(p)).map(|r| self.addr(r.range.end))
                    };
                    let full = usermm_core::MAX_WINDOW_PAGES as usize * self.page_size;
                    let window = region_end.map_or(full, |e| full.min(e.saturating_sub(a)));
                    let (n, _) = self.populate(a, window, false);
                    // A streaming read-in chains: the next window follows,
                    // up to READAHEAD_DEPTH windows past the program's last
                    // fault in the region (it does not fault on the windows
                    // read ahead, so that is as far as it is known to be).
                    let next = a + window;
                    let chain = n == window && {
                        let c = lock(&self.core);
                        let here = c.page_of(Addr(a as u64));
                        let there = c.page_of(Addr(next as u64));
                        match (here.and_then(|p| c.region_at(p)), there) {
                            (Some(r), Some(q)) => r.file().is_some_and(|f| {
                                file_continues(&c, q, f)
                                    && q.0.saturating_sub(r.next_fault)
                                        < READAHEAD_DEPTH * usermm_core::MAX_WINDOW_PAGES
                            }),
                            _ => false,
                        }
                    };
                    if chain {
                        lock(&self.willneed).push(next);
                    }
                }
            }
            if !reclaim {
                continue;
            }
            let mm = self.read_mm();
            let (want, aging) = {
                let c = lock(&self.core);
                (self.high_watermark.saturating_sub(c.free_frames()), c.needs_aging())
            };
            if want > 0 {
                let freed = self.reclaim_rounds(&mm, want.min(RECLAIM_BATCH), false);
                drop(mm);
                if freed == 0 {
                    // Nothing evicted this time (the round only aged pages,
                    // or nothing is evictable): give the program a moment to
                    // touch what was just deactivated, instead of spinning.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            } else if aging {
                self.reclaim_rounds(&mm, 0, false);
            }
        }
    }

    /// Reclaims up to `want` frames for a fault that found none (direct
    /// reclaim: it must make progress). The caller holds `mm` shared.
    pub fn reclaim_locked(&self, mm: &RwLockReadGuard<'_, ()>, want: u64) -> u64 {
        self.reclaim_rounds(mm, want, true)
    }

    /// Reclaim rounds. Without `direct`, a round that evicted nothing (it
    /// only deactivated) ends the call, so that freshly deactivated pages get
    /// a chance to be touched before they are evicted.
    fn reclaim_rounds(&self, _mm: &RwLockReadGuard<'_, ()>, want: u64, direct: bool) -> u64 {
        let mut freed = 0;
        for _round in 0..4 {
            let plan = lock(&self.core).reclaim_plan(want - freed);
            if plan.is_empty() {
                break;
            }
            freed += self.deactivate_all(&plan.deactivate);
            freed += self.discard_all(&plan.discard);
            freed += self.writeback_all(&plan.writeback);
            freed += self.purge_all(&plan.purge);
            freed += self.evict_all(&plan.evict);
            freed += self.drop_all(&plan.drop);
            // Stop as soon as anything was freed: another round would evict
            // the pages this one just deactivated, before the program had a
            // chance to touch them (and so to prove them hot).
            if freed > 0 || !direct || want == 0 {
                break;
            }
        }
        freed
    }

    /// Parks the pages of `ds` in their staging slots and commits; returns
    /// the frames freed meanwhile: lazily freed pages the host turned out
    /// to have discarded (a move finds no page: `deactivate_lost`).
    fn deactivate_all(&self, ds: &[Deactivate]) -> u64 {
        let mut oks = vec![false; ds.len()];
        let can_move = self.uffd.has(UFFD_FEATURE_MOVE);
        let mut i = 0;
        while i < ds.len() {
            // A run of neighbouring pages going to neighbouring slots moves
            // with one ioctl.
            let mut j = i + 1;
            if can_move && ds[i].how == Transfer::Move {
                while j < ds.len()
                    && ds[j].how == Transfer::Move
                    && ds[j].page.0 == ds[j - 1].page.0 + 1
                    && ds[j].slot == ds[j - 1].slot + 1
                {
                    j += 1;
                }
                let moved =
                    self.arena.pages_to_slots_move(&self.uffd, self.addr(ds[i].page), ds[i].slot, j - i).unwrap_or(0);
                for ok in &mut oks[i..i + moved] {
                    *ok = true;
                }
            } else {
                oks[i] = self.transfer_out(&ds[i]);
            }
            i = j;
        }
        // Parked volatile pages may be purged by the host under its own
        // pressure (found out when they are mapped back). Before the commit,
        // while the slots are surely still theirs. (The host only takes
        // pages on its LRU lists: a page still in a CPU's batch would stay
        // unpurgeable, so flush the batches first.)
        if ds.iter().zip(&oks).any(|(d, ok)| *ok && d.host_free) {
            self.arena.drain_host_lru();
        }
        for (d, ok) in ds.iter().zip(&oks) {
            if *ok && d.host_free {
                let _ = self.arena.host_free_slot(d.slot);
            }
        }
        // A page that would not move may be a lazily freed page the host
        // discarded (its MADV_FREE was passed down): no page at all there.
        let gone: Vec<bool> = ds
            .iter()
            .zip(&oks)
            .map(|(d, ok)| !ok && self.host_lazyfree && self.arena.page_gone(self.addr(d.page)))
            .collect();
        let mut c = lock(&self.core);
        let mut freed = 0;
        for ((d, ok), gone) in ds.iter().zip(&oks).zip(gone) {
            if gone {
                freed += u64::from(c.deactivate_lost(d));
            } else {
                c.deactivate_done(d, *ok);
            }
        }
        self.settled.notify_all();
        freed
    }

    /// Moves a resident page out of the program's range into its staging
    /// slot when it cannot be moved (a non-writable region, or no
    /// `UFFDIO_MOVE`): copy, then drop — race-free because nothing can write
    /// a non-writable page in between.
    fn transfer_out(&self, d: &Deactivate) -> bool {
        let src = self.addr(d.page);
        match d.how {
            Transfer::Move | Transfer::Copy { readable: true } => {
                if d.how == Transfer::Move {
                    // A writable page without UFFDIO_MOVE: a copy would race
                    // with the program's writes, so the page stays.
                    return false;
                }
                self.arena.page_to_slot_copy(&self.uffd, src, d.slot, None).is_ok()
            }
            Transfer::Copy { readable: false } => match &self.procmem {
                Some(pm) => self.arena.page_to_slot_copy(&self.uffd, src, d.slot, Some(pm)).is_ok(),
                None => false,
            },
        }
    }

    /// Discards lazily freed parked pages: the host drops the clean ones
    /// (no I/O); the ones written since `MADV_FREE` are swapped normally.
    fn discard_all(&self, ds: &[Discard]) -> u64 {
        if ds.is_empty() {
            return 0;
        }
        let mut outcome = Vec::with_capacity(ds.len());
        self.arena.drain_host_lru();
        for d in ds {
            if self.arena.discard_slot(d.staging) {
                outcome.push((true, false));
                continue;
            }
            let written = match (&self.swap, d.swap) {
                (Some(swap), Some(slot)) if !take_one(&self.inject_write_errors) => {
                    self.arena.write_slots(swap, &[d.staging], self.swap_off(slot)).is_ok()
                        && self.arena.drop_slot(d.staging).is_ok()
                }
                _ => false,
            };
            outcome.push((false, written));
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (d, &(dropped, written)) in ds.iter().zip(&outcome) {
            c.discard_done(d, dropped, written);
            freed += u64::from(dropped || written);
        }
        self.settled.notify_all();
        freed
    }

    /// Drops clean pages of streaming file regions where they are, a run of
    /// consecutive pages per `MADV_DONTNEED`; returns how many went.
    fn drop_all(&self, pages: &[PageIdx]) -> u64 {
        if pages.is_empty() {
            return 0;
        }
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        let mut ok = Vec::with_capacity(sorted.len());
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j].0 == sorted[j - 1].0 + 1 {
                j += 1;
            }
            let r = self.arena.dontneed(self.addr(sorted[i]), (j - i) * self.page_size).is_ok();
            ok.extend(std::iter::repeat_n(r, j - i));
            i = j;
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (&p, &ok) in sorted.iter().zip(&ok) {
            c.drop_done(p, ok);
            freed += u64::from(ok);
        }
        self.settled.notify_all();
        freed
    }

    /// Purges volatile pages: drops their staging frames and puts a poison
    /// marker at their addresses (a touch raises SIGBUS). No I/O.
    fn purge_all(&self, purges: &[(PageIdx, u32)]) -> u64 {
        if purges.is_empty() {
            return 0;
        }
        for &(p, slot) in purges {
            let _ = self.arena.drop_slot(slot);
            let _ = self.uffd.poison(self.addr(p), self.page_size);
        }
        let mut c = lock(&self.core);
        for &(p, slot) in purges {
            c.purge_done(p, slot);
        }
        self.settled.notify_all();
        purges.len() as u64
    }

    /// `mvolatile`.
    pub fn mvolatile(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let _mm = self.read_mm();
        let mut c = lock(&self.core);
        let (parked, res) = c.mvolatile(addr as u64, len as u64);
        // Under the core lock: no parked page can be mapped back (and its
        // slot reused) meanwhile.
        if !parked.is_empty() {
            self.arena.drain_host_lru();
        }
        for slot in parked {
            let _ = self.arena.host_free_slot(slot);
        }
        res
    }

    /// `mnovolatile`: returns the purged pages (in address order) and the
    /// call's result.
    pub fn mnovolatile(&self, addr: usize, len: usize) -> Result<(Vec<usize>, Result<(), Errno>), Errno> {
        let mut mm = self.read_mm();
        let mut c = lock(&self.core);
        let (nv, res) = loop {
            match c.mnovolatile(addr as u64, len as u64) {
                Ok((nv, _)) if !nv.reactivate.is_empty() => {
                    // Parked pages the host may have purged: map them back
                    // (which finds out), then decide again.
                    drop(c);
                    drop(mm);
                    for p in nv.reactivate {
                        self.resolve(self.addr(p), false, None);
                    }
                    mm = self.read_mm();
                    c = lock(&self.core);
                }
                Ok(r) => break r,
                Err(Some(e)) => return Err(e),
                Err(None) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
            }
        };
        drop(c);
        // Purged pages read back as zeros from now on: remove the markers.
        let mut i = 0;
        while i < nv.purged.len() {
            let mut j = i + 1;
            while j < nv.purged.len() && nv.purged[j].0 == nv.purged[j - 1].0 + 1 {
                j += 1;
            }
            let _ = self.arena.dontneed(self.addr(nv.purged[i]), (j - i) * self.page_size);
            i = j;
        }
        Ok((nv.purged.iter().map(|&p| self.addr(p)).collect(), res))
    }

    /// Test hook: the host kernel reclaims the staging area as its memory
    /// pressure would (clean lazily freed slots are discarded).
    pub fn host_reclaim_staging(&self) {
        self.arena.host_reclaim_staging();
    }

    /// Writes the evictions to swap (runs of consecutive slots in one call),
    /// drops their staging frames, and commits. Returns frames freed.
    fn evict_all(&self, evs: &[Evict]) -> u64 {
        if evs.is_empty() {
            return 0;
        }
        let mut order: Vec<usize> = (0..evs.len()).collect();
        order.sort_by_key(|&i| evs[i].swap);
        let mut ok = vec![false; evs.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i + 1;
            while j < order.len() && evs[order[j]].swap == evs[order[j - 1]].swap + 1 && j - i < 256 {
                j += 1;
            }
            let slots: Vec<u32> = order[i..j].iter().map(|&k| evs[k].staging).collect();
            let written = match &self.swap {
                Some(swap) if !take_one(&self.inject_write_errors) => {
                    self.arena.write_slots(swap, &slots, self.swap_off(evs[order[i]].swap)).is_ok()
                }
                _ => false,
            };
            if written {
                let mut a = i;
                while a < j {
                    let mut b = a + 1;
                    while b < j && evs[order[b]].staging == evs[order[b - 1]].staging + 1 {
                        b += 1;
                    }
                    let dropped = self.arena.drop_slots(evs[order[a]].staging, b - a).is_ok();
                    for &k in &order[a..b] {
                        ok[k] = dropped;
                    }
                    a = b;
                }
            }
            i = j;
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (e, ok) in evs.iter().zip(&ok) {
            c.evict_done(e, *ok);
            freed += *ok as u64;
        }
        self.settled.notify_all();
        freed
    }

    // ------------------------------------------------------------------
    // Zap

    /// Drops the pages of `r` (the caller holds `mm`, shared or exclusive).
    fn zap_range(&self, r: PageRange) {
        let chunk_pages = (ZAP_CHUNK_BYTES / self.page_size).max(1) as u64;
        let mut s = r.start.0;
        while s < r.end.0 {
            let e = (s + chunk_pages).min(r.end.0);
            self.zap_chunk(PageRange::new(s, e), None);
            s = e;
        }
    }

    /// Drops the pages of one chunk. With `mm` (munmap's shared hold of the
    /// region lock), the lock is let go during the yields between slices,
    /// so a waiting writer (another thread's mmap or munmap) waits for one
    /// slice, not for the chunk; without it the caller holds the lock
    /// throughout. (munmap's range is detached and held back from reuse:
    /// nothing a writer does while the lock is let go touches it. Not
    /// holding the lock at all was measured too: the writers then collide
    /// with the slices' `MADV_DONTNEED` on the kernel's own mmap lock, and
    /// the map/unmap loop's p99 stall was 0.45–0.5 ms instead of 0.13.)
    fn zap_chunk<'a>(&'a self, r: PageRange, mut mm: Option<RwLockReadGuard<'a, ()>>) {
        let start = self.addr(r.start);
        let len = r.pages() as usize * self.page_size;
        let (claim, prot) = {
            let mut c = lock(&self.core);
            loop {
                match c.zap_begin(r) {
                    // (A detached range is PROT_NONE to the program: a
                    // touch is SIGSEGV; see `Arena::zap` for the prot.)
                    Ok(claim) => break (claim, c.region_at(r.start).map_or(PROT_NONE, |g| g.prot & PROT_MASK)),
                    Err(()) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
                }
            }
        };
        if claim.mapped {
            // In slices with a yield between them, like the kernel's zap
            // with its cond_resched(): a thread woken on this CPU (a fault
            // just served) waits for one slice, not for the whole chunk.
            let mut off = 0;
            while off < len {
                let n = (len - off).min(ZAP_SLICE_BYTES);
                // Whatever the host says, the pages go (a range locked
                // behind our back is unlocked, or replaced): a new region
                // here must never show them.
                if !matches!(self.arena.zap(&self.uffd, start + off, n, prot), Ok(false)) {
                    self.host_refusals.fetch_add(1, Ordering::Relaxed);
                }
                off += n;
                if off < len {
                    // A fair unlock hands the lock to a parked writer at
                    // once, instead of letting this thread take it back
                    // first.
                    let held = mm.take().map(RwLockReadGuard::unlock_fair).is_some();
                    std::thread::yield_now();
                    if held {
                        mm = Some(self.read_mm());
                    }
                }
            }
        }
        for &s in &claim.staging {
            let _ = self.arena.drop_slot(s);
        }
        let mut c = lock(&self.core);
        c.zap_end(&claim);
        self.settled.notify_all();
    }

    // ------------------------------------------------------------------
    // Calls

    pub fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        if off & (self.page_size as i64 - 1) != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & MAP_ANONYMOUS == 0 && !usermm_sys::ffi::fd_is_open(fd) && flags & MAP_TYPE != 0 {
            // Linux checks the type first (EINVAL), then the descriptor.
            let t = flags & MAP_TYPE;
            if t == MAP_SHARED || t == MAP_PRIVATE || t == MAP_SHARED_VALIDATE {
                if len == 0 {
                    return Err(Errno::EINVAL);
                }
                return Err(Errno::EBADF);
            }
        }
        // A file mapping: Linux's checks on the descriptor (after the length
        // and type), then the space keeps a duplicate of it.
        let file = if flags & MAP_ANONYMOUS == 0 {
            let t = flags & MAP_TYPE;
            if len == 0 || !(t == MAP_SHARED || t == MAP_PRIVATE || t == MAP_SHARED_VALIDATE) {
                // Linux checks a file mapping's type after the address
                // (MAP_FIXED_NOREPLACE's EEXIST) and the lock limit: the
                // core's order, which ends in EINVAL for this type (it never
                // maps with an invalid type).
                let r = lock(&self.core).mmap(addr as u64, len as u64, prot, flags | MAP_ANONYMOUS);
                return Err(r.err().unwrap_or(Errno::EINVAL));
            }
            let f = MappedFile::from_fd(fd, self.keep_file_cache)?;
            // One entry (and one descriptor) per open file, however many
            // regions map it: 100,000 regions of one file need one fd.
            let mut files = lock(&self.files);
            let same = files.iter().find(|(_, e)| e.dev == f.dev && e.ino == f.ino && e.writable == f.writable);
            let (id, f) = match same {
                Some((id, e)) => (*id, e.clone()),
                None => {
                    let id = self.next_file.fetch_add(1, Ordering::Relaxed);
                    let f = Arc::new(f);
                    files.insert(id, f.clone());
                    (id, f)
                }
            };
            drop(files);
            Some((id, f))
        } else {
            None
        };
        let result = self.mmap_locked(addr, len, prot, flags, off, file.as_ref());
        if result.is_err() && file.is_some() {
            self.release_files();
        }
        result
    }

    fn mmap_locked(
        &self,
        addr: usize,
        len: usize,
        prot: i32,
        flags: i32,
        off: i64,
        file: Option<&(u32, Arc<MappedFile>)>,
    ) -> Result<usize, Errno> {
        loop {
            let mm = self.mm.write();
            let t0 = now_ns();
            let reply = match file {
                Some((id, f)) => lock(&self.core).mmap_file(
                    addr as u64,
                    len as u64,
                    prot,
                    flags,
                    FileMap { id: *id, writable: f.writable, off_pages: off as u64 / self.page_size as u64 },
                ),
                None => lock(&self.core).mmap(addr as u64, len as u64, prot, flags),
            }?;
            match reply {
                MmapReply::WaitUnmapping => {
                    drop(mm);
                    let c = lock(&self.core);
                    let _ = self.settled.wait_timeout(c, std::time::Duration::from_millis(10));
                    continue;
                }
                MmapReply::Done(plan) => {
                    if let Some(d) = &plan.replaced {
                        for f in &d.files {
                            let _ = self.writeback_range(f.range, &d.files);
                        }
                        for r in &d.locked {
                            let _ = self.host_lock(*r, LockMode::None);
                        }
                        self.clear_host_advice(&d.ranges);
                        for r in &d.ranges {
                            self.zap_range(*r);
                        }
                        lock(&self.core).unhold(d);
                    }
                    let a = self.addr(plan.range.start);
                    let l = plan.range.pages() as usize * self.page_size;
                    if let Err(e) = self.arena.protect(a, l, plan.prot) {
                        // Undo: the kernel refused (out of its map count).
                        let d = lock(&self.core).munmap(a as u64, l as u64);
                        if let Ok(Some(d)) = d {
                            lock(&self.core).unhold(&d);
                        }
                        return Err(e);
                    }
                    let mode = lock(&self.core).region_at(plan.range.start).map(|r| r.lock).unwrap_or(LockMode::None);
                    if mode != LockMode::None {
                        if let Err(e) = self.host_lock(plan.range, mode) {
                            let d = lock(&self.core).munmap(a as u64, l as u64);
                            if let Ok(Some(d)) = d {
                                lock(&self.core).unhold(&d);
                            }
                            let _ = self.arena.protect(a, l, PROT_NONE);
                            return Err(if e == Errno::ENOMEM || e == Errno::EPERM { Errno::EAGAIN } else { e });
                        }
                    }
                    self.note_hold(t0);
                    drop(mm);
                    // Best effort: never fails the mmap (Linux). A
                    // lock-on-fault region is never populated, even with
                    // MAP_POPULATE (Linux skips VM_LOCKONFAULT).
                    // MAP_NONBLOCK with MAP_POPULATE populates nothing
                    // (do_mmap: only a lock, or MAP_POPULATE alone).
                    let populate = mode == LockMode::Locked
                        || (flags & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE && mode != LockMode::OnFault);
                    if populate && plan.prot != PROT_NONE {
                        let _ = self.populate(a, l, plan.prot & PROT_WRITE != 0);
                    }
                    return Ok(a);
                }
            }
        }
    }

    /// Removes what advice passed down to the host left on ranges that are
    /// leaving (guard markers, `VM_DONTDUMP`), so that a new region there
    /// starts as a fresh mapping would. Nothing to do, and no syscall, in a
    /// space that never used them.
    fn clear_host_advice(&self, ranges: &[PageRange]) {
        let guards = self.guards_used.load(Ordering::Relaxed);
        let dump = self.dontdump_used.load(Ordering::Relaxed);
        for r in ranges {
            let (a, l) = (self.addr(r.start), r.pages() as usize * self.page_size);
            if guards {
                let _ = self.arena.host_advise(a, l, MADV_GUARD_REMOVE);
            }
            if dump {
                let _ = self.arena.host_advise(a, l, MADV_DODUMP);
            }
        }
    }

    fn note_hold(&self, t0: u64) {
        let held = now_ns().saturating_sub(t0);
        self.write_hold_ns_max.fetch_max(held, Ordering::Relaxed);
    }

    /// Seed 003: detach under the exclusive lock, then zap chunk by chunk
    /// under the shared lock (re-taken per chunk, so that writers get in
    /// between chunks), with the range held back from reuse until done.
    pub fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let detached: Option<Detached> = {
            let _mm = self.mm.write();
            let t0 = now_ns();
            let d = lock(&self.core).munmap(addr as u64, len as u64)?;
            self.note_hold(t0);
            d
        };
        let Some(d) = detached else { return Ok(()) };
        // Dirty shared file pages reach their file before the call returns.
        let mut wb_err = None;
        for f in &d.files {
            let _mm = self.read_mm();
            if let Err(e) = self.writeback_range(f.range, &d.files) {
                wb_err.get_or_insert(e);
            }
        }
        for r in &d.locked {
            // MADV_DONTNEED refuses VM_LOCKED ranges; the range is leaving.
            let _ = self.host_lock(*r, LockMode::None);
        }
        // The range keeps its host protection: no mprotect(PROT_NONE), which
        // would hold the kernel's mmap lock exclusively while it walks the
        // range's page tables (0.6 ms a GiB), stalling every fault the
        // handlers serve. A touch of an unmapped page reaches a handler,
        // which finds no region and makes the gap around it PROT_NONE (`Segv`).
        self.clear_host_advice(&d.ranges);
        let chunk_pages = (ZAP_CHUNK_BYTES / self.page_size).max(1) as u64;
        for r in &d.ranges {
            let mut s = r.start.0;
            while s < r.end.0 {
                let e = (s + chunk_pages).min(r.end.0);
                self.zap_chunk(PageRange::new(s, e), Some(self.read_mm()));
                // Let the handler threads and a waiting writer run: on a
                // machine with few CPUs the zap would otherwise keep one busy
                // for the whole unmap.
                std::thread::yield_now();
                s = e;
            }
        }
        let mut c = lock(&self.core);
        c.unhold(&d);
        let errs: Vec<Errno> = d.files.iter().filter_map(|f| c.take_file_error(f.file)).collect();
        self.settled.notify_all();
        drop(c);
        self.release_files();
        match wb_err.or(errs.first().copied()) {
            // Linux's munmap does not report write-back errors; usermm does
            // (the data could not reach the file), as fsync would.
            Some(e) => Err(if e == Errno::EIO { Errno::EIO } else { e }),
            None => Ok(()),
        }
    }

    /// `msync`: writes the shared file pages of the range to their files;
    /// with `MS_SYNC`, also `fdatasync`s them before returning. A write-back
    /// error since the last msync (eviction included) is reported as `EIO`.
    pub fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno> {
        let _mm = self.read_mm();
        let (segs, res) = lock(&self.core).msync(addr as u64, len as u64, flags);
        let mut files = Vec::new();
        let mut err = None;
        for seg in segs {
            match self.writeback_range(seg, &[]) {
                Ok(fs) => files.extend(fs),
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
            // Files of the segment even when no page was resident: their
            // earlier write-back errors are reported here.
            let c = lock(&self.core);
            if let Some(f) = c.region_at(seg.start).and_then(|r| r.file()) {
                files.push(f);
            }
        }
        files.sort_unstable();
        files.dedup();
        if flags & MS_SYNC != 0 {
            let table = lock(&self.files).clone();
            for f in &files {
                if let Some(mf) = table.get(f) {
                    if let Err(e) = mf.sync() {
                        err.get_or_insert(e);
                    }
                }
            }
        }
        let mut c = lock(&self.core);
        for f in &files {
            if let Some(e) = c.take_file_error(*f) {
                err.get_or_insert(e);
            }
        }
        drop(c);
        if let Some(e) = err {
            return Err(if e == Errno::ENOSPC { e } else { Errno::EIO });
        }
        res
    }

    pub fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        let mm = self.mm.write();
        let t0 = now_ns();
        let (segs, res, populate) = {
            let mut c = lock(&self.core);
            // Linux (mprotect_fixup): a fully locked private range made
            // writable is populated for writing (the zero pages a read
            // mapped get frames of their own); lock-on-fault ones are not.
            let populate: Vec<PageRange> = if prot & PROT_WRITE != 0 {
                let ps = self.page_size as u64;
                let pages = (len as u64).div_ceil(ps);
                c.page_of(Addr(addr as u64))
                    .map(|p0| {
                        let r = PageRange::new(p0.0, p0.0.saturating_add(pages));
                        c.regions()
                            .overlapping(r)
                            .iter()
                            .filter(|g| {
                                g.lock == LockMode::Locked
                                    && matches!(g.kind, Kind::AnonPrivate | Kind::FilePrivate)
                                    && g.prot & PROT_WRITE == 0
                            })
                            .map(|g| g.range.intersect(&r))
                            .collect()
                    })
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let (segs, res) = c.mprotect(addr as u64, len as u64, prot);
            (segs, res, populate)
        };
        for s in &segs {
            let a = self.addr(s.start);
            self.arena.protect(a, s.pages() as usize * self.page_size, prot & PROT_MASK)?;
        }
        self.note_hold(t0);
        drop(mm);
        for r in populate.into_iter().filter(|r| segs.iter().any(|s| s.overlaps(r))) {
            let _ = self.populate(self.addr(r.start), r.pages() as usize * self.page_size, true);
        }
        res
    }

    pub fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        if advice == MADV_POPULATE_READ || advice == MADV_POPULATE_WRITE {
            return self.populate(addr, len, advice == MADV_POPULATE_WRITE).1;
        }
        let attr = matches!(advice, MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL);
        let (ops, res) = if attr {
            let _mm = self.mm.write();
            let t0 = now_ns();
            let r = lock(&self.core).madvise(addr as u64, len as u64, advice);
            self.note_hold(t0);
            r
        } else {
            let mm = self.read_mm();
            // Fills of this range in flight (other threads' faults) land
            // first: the advice applies to them.
            let r = self.settled_core_all(addr, len, advice == MADV_FREE).madvise(addr as u64, len as u64, advice);
            let mut err = None;
            for op in &r.0 {
                if let Err(e) = self.advice_op(&mm, op) {
                    err.get_or_insert(e);
                }
            }
            (Vec::new(), r.1.and(err.map_or(Ok(()), Err)))
        };
        debug_assert!(ops.is_empty());
        res
    }

    /// Carries out one page advice; the caller holds `mm` shared.
    fn advice_op(&self, _mm: &RwLockReadGuard<'_, ()>, op: &AdviceOp) -> Result<(), Errno> {
        match *op {
            AdviceOp::Host(r, advice) => {
                match advice {
                    MADV_GUARD_INSTALL => self.guards_used.store(true, Ordering::Relaxed),
                    MADV_DONTDUMP => self.dontdump_used.store(true, Ordering::Relaxed),
                    _ => {}
                }
                return self.arena.host_advise(self.addr(r.start), r.pages() as usize * self.page_size, advice);
            }
            AdviceOp::PunchZap { range, file, file_page } => {
                let f = lock(&self.files).get(&file).cloned().ok_or(Errno::EIO)?;
                let ps = self.page_size as u64;
                f.punch_hole(file_page * ps, range.pages() * ps)?;
                // The file reads zeros there now: drop our copies, dirty or
                // not, with no write-back.
                self.zap_range(range);
            }
            AdviceOp::Zap(r) => self.zap_range(r),
            AdviceOp::WritebackZap(r) => {
                if self.writeback_range(r, &[]).is_ok() {
                    self.zap_range(r);
                }
            }
            AdviceOp::Cold(r) => {
                let ds = lock(&self.core).deactivate_range(r);
                self.deactivate_all(&ds);
            }
            AdviceOp::Pageout(r) => {
                // Deactivate the mapped pages, then evict every parked page of
                // the range (also those parked before this call).
                let ds = lock(&self.core).deactivate_range(r);
                self.deactivate_all(&ds);
                loop {
                    let (evs, wbs) = lock(&self.core).evict_range(r, 1024);
                    if evs.is_empty() && wbs.is_empty() {
                        break;
                    }
                    if self.evict_all(&evs) + self.writeback_all(&wbs) == 0 {
                        break;
                    }
                }
            }
            AdviceOp::Free(r) => {
                let parked = lock(&self.core).lazyfree(r);
                if self.host_lazyfree {
                    // Reuse costs nothing: the pages stay mapped, a write
                    // cancels the host's lazy free, and only under pressure
                    // (ours or the host's) is a clean page dropped.
                    //
                    // The host's MADV_FREE skips a page still waiting in a
                    // CPU's LRU batch (it drains only the calling CPU's, and
                    // our handlers install pages on the others): such a page
                    // would never be discarded. Drain every CPU's batches
                    // first, when pages were installed since the last drain
                    // (a free-and-reuse loop installs none, and pays
                    // nothing).
                    let fills = self.fills.load(Ordering::Relaxed);
                    if self.fills_drained.swap(fills, Ordering::Relaxed) != fills {
                        self.arena.drain_host_lru();
                    }
                    let _ = self.arena.host_free(self.addr(r.start), r.pages() as usize * self.page_size);
                    for s in parked {
                        let _ = self.arena.host_free_slot(s);
                    }
                    // Past the space's bound, discard the oldest at once.
                    for _ in 0..64 {
                        let plan = lock(&self.core).lazyfree_trim_plan();
                        if plan.is_empty() {
                            break;
                        }
                        self.deactivate_all(&plan.deactivate);
                        self.discard_all(&plan.discard);
                    }
                }
            }
            AdviceOp::Poison(r) => {
                self.zap_range(r);
                lock(&self.core).set_poison(r);
                let _ = self.uffd.poison(self.addr(r.start), r.pages() as usize * self.page_size);
            }
            AdviceOp::WillNeed(r) => {
                let pages = lock(&self.core).swapped_in(r);
                if !pages.is_empty() {
                    lock(&self.willneed).extend(pages.into_iter().map(|p| self.addr(p)));
                    let _c = lock(&self.core);
                    self.reclaim_wanted.notify_all();
                }
            }
        }
        Ok(())
    }
}

impl Inner {
    /// Locks (`mode` Locked/OnFault) or unlocks (None) a range in the host
    /// kernel too, so that locked pages never reach the host's swap. Always
    /// `MLOCK_ONFAULT` in the host: usermm populates itself (a host populate
    /// would fault into our own handlers while we hold the region lock).
    fn host_lock(&self, r: PageRange, mode: LockMode) -> Result<(), Errno> {
        let a = self.addr(r.start);
        let l = r.pages() as usize * self.page_size;
        match mode {
            LockMode::None => usermm_sys::mem::munlock(a, l),
            _ => usermm_sys::mem::mlock2(a, l, MLOCK_ONFAULT),
        }
    }

    /// Carries out a lock decision made by `decide` under the exclusive
    /// lock: host locks, the budget check for full locks, then (under the
    /// shared lock) mapping parked pages back and populating full locks.
    /// Anything that fails undoes the whole call (a full lock that the budget
    /// cannot hold is `EAGAIN` and locks nothing new).
    pub fn lock_call(&self, decide: impl FnOnce(&mut Core) -> LockPlan) -> Result<(), Errno> {
        let mm = self.mm.write();
        let t0 = now_ns();
        let mut c = lock(&self.core);
        let plan = decide(&mut c);
        let mut full = Vec::new();
        let mut done = Vec::new();
        for &(seg, old) in &plan.changed {
            let new = c.region_at(seg.start).map(|r| r.lock).unwrap_or(LockMode::None);
            if let Err(e) = self.host_lock(seg, new) {
                for &(seg, old) in done.iter().rev() {
                    let _ = self.host_lock(seg, old);
                }
                c.lock_revert(&plan);
                self.note_hold(t0);
                return Err(e);
            }
            done.push((seg, old));
            if new == LockMode::Locked {
                full.push(seg);
            }
        }
        if !full.is_empty() && !c.lock_fits(&full) {
            for &(seg, old) in done.iter().rev() {
                let _ = self.host_lock(seg, old);
            }
            c.lock_revert(&plan);
            self.note_hold(t0);
            return Err(Errno::EAGAIN);
        }
        drop(c);
        self.note_hold(t0);
        drop(mm);
        for &p in &plan.reactivate {
            self.resolve(self.addr(p), false, None);
        }
        if plan.result.is_ok() {
            let mut failed = None;
            let populate = if plan.populate.is_empty() { &full } else { &plan.populate };
            for seg in populate {
                let prot = lock(&self.core).region_at(seg.start).map(|r| r.prot).unwrap_or(PROT_NONE);
                // Linux populates what it can reach (FOLL_FORCE): not
                // PROT_NONE, and here not exec-only either (measured on
                // this kernel: mlock of both says ENOMEM).
                let r = if prot & (PROT_READ | PROT_WRITE) == 0 {
                    Err(Errno::EFAULT)
                } else {
                    self.populate(self.addr(seg.start), seg.pages() as usize * self.page_size, prot & PROT_WRITE != 0).1
                };
                match r {
                    Ok(()) => {}
                    Err(Errno::ENOMEM) => {
                        // The budget cannot hold the pages: EAGAIN, and
                        // nothing new stays locked (usermm's improvement on
                        // Linux, which leaves the range locked).
                        let _mm = self.mm.write();
                        for &(seg, old) in plan.changed.iter().rev() {
                            let _ = self.host_lock(seg, old);
                        }
                        lock(&self.core).lock_revert(&plan);
                        return Err(Errno::EAGAIN);
                    }
                    // mlockall ignores the others (Linux's ignore_errors);
                    // mlock reports them as Linux's
                    // __mlock_posix_error_return does (EFAULT, and an
                    // unreadable range, is ENOMEM) and stays locked.
                    Err(_) if plan.populate_best_effort => {}
                    // The first failure ends the populate, as in Linux's
                    // __mm_populate: what follows stays unpopulated.
                    Err(e) => {
                        failed = Some(if e == Errno::EFAULT || e == Errno::EINVAL { Errno::ENOMEM } else { e });
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        plan.result
    }

    /// `MADV_POPULATE_READ/WRITE` and `umm_populate`: returns the bytes
    /// populated (from `addr`, a prefix of the range) and the result.
    pub fn populate(&self, addr: usize, len: usize, write: bool) -> (usize, Result<(), Errno>) {
        let mut mm = self.read_mm();
        let (segs, check) = lock(&self.core).populate_check(addr as u64, len as u64, write);
        let mut populated = 0usize;
        let mut empty_rounds = 0;
        for seg in segs {
            let mut p = seg.start;
            let mut skipped = false;
            while p < seg.end {
                // Interrupted: the space is closing (or the test hook).
                let stop = self.populate_interrupt.load(Ordering::Relaxed);
                if self.shutdown.load(Ordering::Relaxed) || p.0 == stop {
                    self.populate_interrupt.store(u64::MAX, Ordering::Relaxed);
                    return (populated, Err(Errno::EINTR));
                }
                // (A step never runs past the interruption point.)
                let end = if stop > p.0 { PageIdx(seg.end.0.min(stop)) } else { seg.end };
                let mut c = lock(&self.core);
                let Some(plan) = c.populate_step(p, end, write) else {
                    drop(c);
                    skipped = true;
                    p.0 += 1;
                    populated += self.page_size;
                    continue;
                };
                match plan {
                    FaultPlan::Wait => {
                        let _c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner());
                    }
                    FaultPlan::Reclaim { want } => {
                        let obtainable = c.frames_obtainable();
                        drop(c);
                        if obtainable == 0 || self.reclaim_locked(&mm, want.max(64)) == 0 {
                            let c = lock(&self.core);
                            if c.free_frames() == 0 {
                                empty_rounds += 1;
                                if obtainable == 0 || empty_rounds > OOM_ROUNDS {
                                    return (populated, Err(Errno::ENOMEM));
                                }
                                // Reclaim in flight elsewhere: let it settle.
                                let _ = self.settled.wait_timeout(c, std::time::Duration::from_millis(5));
                            }
                        }
                    }
                    FaultPlan::Sigbus => return (populated, Err(Errno::EHWPOISON)),
                    FaultPlan::Refill { page } => {
                        // (A populate step plans none: a lazily freed
                        // resident page is skipped like any resident one.)
                        let a = self.addr(page);
                        let n = self.arena.zero_fill_wake(&self.uffd, a, self.page_size, true).unwrap_or(0);
                        c.fill_done(&plan, u64::from(n == self.page_size));
                        self.after_fill(&mut c);
                        drop(c);
                    }
                    FaultPlan::Wake | FaultPlan::Segv { .. } => {
                        // The region went away under us (a concurrent munmap).
                        return (populated, Err(Errno::ENOMEM));
                    }
                    FaultPlan::Reactivate { checked: true, page, .. } => {
                        drop(c);
                        // `None`: the host purged the parked page; the loop
                        // plans again and finds it purged.
                        if let Some(n) = self.reactivate_io(&plan) {
                            drop(self.commit_fill(&plan, n));
                            let _ = self.uffd.wake(self.addr(page), self.page_size);
                            if n == 0 {
                                return (populated, Err(Errno::EFAULT));
                            }
                        }
                    }
                    FaultPlan::ZeroFill { .. }
                    | FaultPlan::FileRead { .. }
                    | FaultPlan::SwapIn { .. }
                    | FaultPlan::Reactivate { .. } => {
                        drop(c);
                        let n = self.fill_io(&plan, write);
                        drop(self.commit_fill(&plan, n));
                        let run = match plan {
                            FaultPlan::ZeroFill { run }
                            | FaultPlan::FileRead { run, .. }
                            | FaultPlan::SwapIn { run, .. } => run,
                            FaultPlan::Reactivate { page, .. } => PageRange::new(page.0, page.0 + 1),
                            _ => unreachable!(),
                        };
                        self.wake_run(run, self.addr(run.start));
                        if n == 0 {
                            // Backing that cannot be read: past the end of a
                            // file, or an I/O error.
                            return (populated, Err(Errno::EFAULT));
                        }
                        // The loop re-checks the page; a filled page is skipped.
                    }
                }
                // A range larger than the budget cannot be resident at once.
                let c = lock(&self.core);
                let budget = c.config().budget_pages;
                let seg_done = p.0 - seg.start.0;
                if seg_done > budget {
                    return (populated, Err(Errno::ENOMEM));
                }
            }
            if write && skipped {
                // Resident pages a read mapped to the zero page: a WRITE
                // populate allocates them (never leaves the zero page). And
                // lazily freed pages: the host's write populate dirties
                // them, so that they are kept, as Linux's populate does
                // (`FOLL_WRITE`); one the host already dropped faults into
                // our handlers and is refilled.
                let a = self.addr(seg.start);
                let mut ranges = self.zero_pfn_ranges(a, seg.pages() as usize * self.page_size);
                let lazy = lock(&self.core).lazyfree_runs(seg);
                ranges.extend(lazy.iter().map(|r| (self.addr(r.start), self.addr(r.end))));
                if !ranges.is_empty() {
                    // The host call can fault into our own handlers, which
                    // take the region lock: never hold it across one (a
                    // writer waiting for it would block the handler, and
                    // the handler this call). Without the lock the range
                    // may be unmapped meanwhile: the host populate then
                    // fails or populates the new region's pages through our
                    // handlers, which changes no byte.
                    drop(mm);
                    for (z, e) in ranges {
                        let _ = self.arena.host_populate_write(z, e - z);
                    }
                    mm = self.read_mm();
                }
            }
        }
        drop(mm);
        (populated, check)
    }
}

/// Runs `f` with this thread's bounce buffer of at least `len` bytes.
fn with_bounce<R>(len: usize, f: impl FnOnce(&Bounce) -> R) -> Option<R> {
    thread_local! {
        static BOUNCE: std::cell::RefCell<Option<Bounce>> = const { std::cell::RefCell::new(None) };
    }
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().is_none_or(|b| b.len() < len) {
            *b = None;
            *b = Bounce::new(len.max(SWAP_BOUNCE_BYTES)).ok();
        }
        b.as_ref().map(f)
    })
}

/// Whether page `p` is an untouched page of a region of `file`: where a
/// streaming read of that file goes on.
fn file_continues(c: &Core, p: PageIdx, file: u32) -> bool {
    c.region_at(p).is_some_and(|r| r.file() == Some(file)) && c.page(p) == usermm_core::page::PageMeta::default()
}

/// Handler threads when the configuration says 0. One spinning handler
/// serves a single faulting thread fastest (measured on 2 vCPUs: 13–16 µs a
/// fault against 18–21 µs for two pinned handlers, which race each other
/// for every message); more help when many threads fault at once and swap-in
/// I/O waits.
fn default_fault_threads() -> usize {
    match usermm_sys::ncpus() {
        0..=2 => 1,
        3..=8 => 2,
        _ => 4,
    }
}

fn take_one(a: &AtomicU32) -> bool {
    a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1)).is_ok()
}
