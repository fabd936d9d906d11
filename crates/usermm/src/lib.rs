//! usermm: a user-space virtual-memory manager.
//!
//! A program opens a [`Space`]; the space reserves a range of virtual address
//! space, maps regions in it, and serves every page fault in them itself
//! through userfaultfd, under a resident-memory budget of its own, with its
//! own LRU reclaim and swap file.
//!
//! ```no_run
//! use usermm::{Config, Space};
//! let space = Space::open(&Config { budget_bytes: 64 << 20, ..Config::default() }).unwrap();
//! let mut buf = space.map_anon(1 << 30).unwrap(); // 1 GiB, faulted in on touch
//! buf[0] = 42;
//! assert_eq!(buf[0], 42);
//! ```
//!
//! The raw calls ([`Space::mmap`], [`Space::munmap`], [`Space::madvise`], …)
//! take and return addresses as `usize` and follow Linux's semantics and
//! errno values exactly (see `SPEC.md`); [`Mapping`] is the `memmap2`-style
//! handle that derefs to a byte slice and unmaps on drop.
//!
//! # Where each concern lives
//!
//! | file                   | what                                                          |
//! |------------------------|---------------------------------------------------------------|
//! | `lib.rs` (this)        | [`Space`]: open/close, the address-based calls, introspection |
//! | `config.rs`, `config/` | [`Config`], [`DEFAULT_RESERVE_BYTES`], [`DEFAULT_SWAP_BYTES`], the `USERMM_*` environment |
//! | `stats.rs`             | [`Stats`], [`PopulateReport`], [`PurgeReport`]                |
//! | `mapping.rs`           | [`Mapping`]: the owned handle [`Space::map_anon`] returns     |
//! | `purgeable.rs`         | [`Purgeable`]: the safe handle of volatile memory             |
//! | `heap.rs`              | [`Heap`], [`GlobalHeap`]: a heap on a space (policy, docs)     |
//! | `store.rs`, `store/`   | page stores: the swap file, a Redis-protocol server           |
//! | `boundary/`            | the C ABI ([`capi`]), `Mapping`'s slice view, the heap's allocator (`unsafe`) |
//! | `native.rs`, `native/` | the native executor: memory, fault service, the calls         |
//! | `platform.rs`, `platform/` | the executor's platform: host operations as one trait; the operations a call names (`ops.rs`) |
//! | `sim/`                 | a seeded simulation of a space (test hooks only)              |
//! | `thread_role.rs`       | what the calling thread is to usermm (its own, system-only, resolving its own fault) |
//!
//! # Unsafe code
//! This crate has no `unsafe` of its own except the `boundary` module: the C
//! ABI, whose exported functions necessarily trust the pointers C callers
//! pass, and `Mapping`'s deref to a slice. Everything else that is unsafe
//! (every syscall and ioctl) lives in `usermm-sys`.

#![deny(unsafe_code)]

pub mod boundary;
mod config;
pub mod heap;
mod hooks;
mod mapping;
mod native;
mod options;
mod platform;
pub mod purgeable;
#[cfg(feature = "test-hooks")]
pub mod sim;
mod stats;
mod store;
mod thread_role;

pub use boundary::capi;
pub use config::{config_from_vars, default_budget_bytes, Config, EnvError, DEFAULT_RESERVE_BYTES, DEFAULT_SWAP_BYTES};
pub use heap::{GlobalHeap, Heap, HeapStats};
pub use mapping::Mapping;
pub use native::creds::{credentials_changed_everywhere, threads_follow_credentials};
pub use options::{MapOptions, ReadOnlyMapping};
pub use purgeable::{Contents, Purgeable, PurgeableGuard};
pub use stats::{PopulateReport, PurgeReport, Stats};

use std::sync::Arc;

pub use usermm_core::consts;
pub use usermm_core::Errno;
pub use usermm_sys::uffd::UffdMode;

use native::Inner;

/// A space: a reserved virtual range whose pages usermm serves.
///
/// # fork
/// A forked child gets a copy of the space, as Linux gives it a copy of its
/// memory: every byte at the same address, served by threads of the
/// child's own under a budget of its own; neither process sees the other's
/// writes, locks are not inherited, `MADV_DONTFORK` regions are absent in
/// the child and `MADV_WIPEONFORK` ones read zeros (docs/design.md,
/// "fork"); its `MAP_SHARED` regions stay shared, the host's memory from
/// the first fork on. A space whose copy failed (no descriptor left for
/// the tie to its parent, 16 forks deep) is
/// inaccessible in the child (a touch raises SIGSEGV) and every call on it
/// there fails at once with [`Errno::ESTALE`] (the calls that return no
/// `Result` — [`Space::stats`], [`Space::smaps`], [`Space::validate`],
/// `Space::host_reclaim` — panic); dropping or closing it there only
/// forgets it.
pub struct Space {
    /// The space; whose it is (the opener's, or a forked child's that was
    /// given a copy) is `Inner::owned_here`. Invariant: the space is used
    /// (locked, closed) only where it is owned.
    inner: Arc<Inner>,
    /// The space's heap ([`Space::heap`], `umm_malloc`).
    pub(crate) heap: Arc<boundary::heap::HeapCore>,
    /// Closed (or forgotten, in a forked child not given a copy).
    closed: bool,
}

/// Advice that changes a range's bytes now or later, or removes access to
/// them: refused on a [`Mapping`]'s range through the address-based
/// [`Space::madvise`].
pub(crate) fn advice_changes_bytes(advice: i32) -> bool {
    use consts::*;
    matches!(advice, MADV_DONTNEED | MADV_FREE | MADV_REMOVE | MADV_HWPOISON | MADV_GUARD_INSTALL)
}

impl Space {
    /// Opens a space (`umm_open`).
    pub fn open(cfg: &Config) -> Result<Space, Errno> {
        usermm_sys::thread::watch_forks()?;
        let inner = Inner::open(cfg)?;
        let heap = Arc::new(boundary::heap::HeapCore::new(inner.base(), inner.reserve_len(), cfg.budget_or_default()));
        inner.set_fork_locks(Arc::downgrade(&heap) as std::sync::Weak<dyn native::ForkLocks>);
        Ok(Space { inner, closed: false, heap })
    }

    /// `Err(ESTALE)` in a process forked after the space was opened that was
    /// not given a copy of it (see [`Space`]'s "fork"); an atomic load,
    /// checked before any lock.
    #[inline]
    pub fn check_owner(&self) -> Result<(), Errno> {
        if !self.inner.owned_here() {
            return Err(Errno::ESTALE);
        }
        Ok(())
    }

    /// Whether the space's threads are being started again after a
    /// credential change ([`threads_follow_credentials`]): a heap that
    /// stands in for `malloc` must then allocate elsewhere (what a starting
    /// thread allocates must not fault on the space). Frees are the
    /// space's as ever.
    #[doc(hidden)]
    pub fn threads_starting(&self) -> bool {
        self.inner.threads_starting()
    }

    /// Panics in a forked child, for the calls that cannot return `ESTALE`.
    fn assert_owner(&self) {
        assert!(
            self.check_owner().is_ok(),
            "usermm: a space used in a forked child that was not given a copy of it (ESTALE)"
        );
    }

    /// Closes the space (`umm_close`): stops its threads and releases its
    /// memory. Nothing may touch the space's memory afterwards. In a forked
    /// child it only forgets the space (and returns `Ok`).
    pub fn close(mut self) -> Result<(), Errno> {
        self.close_inner();
        Ok(())
    }

    fn close_inner(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if self.check_owner().is_err() {
            // A forked child not given a copy: the handler threads do not
            // exist here, and the space's locks may be held forever by
            // threads that did not come along. Forget everything; freeing
            // the reservation could even unmap what the child has mapped
            // there since.
            std::mem::forget(Arc::clone(&self.inner));
            return;
        }
        self.inner.shut();
    }

    /// The space's page size in bytes.
    #[inline]
    pub fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    /// The reserved range `(start, len)`.
    #[inline]
    pub fn reservation(&self) -> (usize, usize) {
        (self.inner.base(), self.inner.reserve_len())
    }

    /// How userfaultfd was obtained.
    pub fn uffd_mode(&self) -> UffdMode {
        if self.inner.user_mode_only() {
            UffdMode::UserModeOnly
        } else {
            UffdMode::Full
        }
    }

    /// Why the user-mode-only fallback was taken, if it was.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback_reason()
    }

    /// `EBUSY` if `[addr, addr+len)` overlaps a live [`Mapping`] (safe
    /// code may be borrowing its bytes); otherwise a guard that keeps new
    /// handles out until the caller's call is done.
    fn not_owned(&self, addr: usize, len: usize) -> Result<std::sync::RwLockReadGuard<'_, ()>, Errno> {
        let gate = self.inner.handles().gate.read().unwrap_or_else(|e| e.into_inner());
        let owned = self.inner.handles().owned.lock().unwrap_or_else(|e| e.into_inner());
        let end = addr.saturating_add(len);
        if owned.iter().any(|&(a, l)| a < end && addr < a + l) {
            return Err(Errno::EBUSY);
        }
        Ok(gate)
    }

    fn own(&self, addr: usize, len: usize) {
        self.inner.handles().owned.lock().unwrap_or_else(|e| e.into_inner()).push((addr, len));
    }

    fn disown(&self, addr: usize) {
        let mut owned = self.inner.handles().owned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = owned.iter().position(|&(a, _)| a == addr) {
            owned.swap_remove(i);
        }
    }

    /// `mmap`: returns the start address of the new region. `MAP_FIXED`
    /// over a live [`Mapping`] is `EBUSY` (it would replace bytes safe code
    /// may be borrowing).
    pub fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        self.check_owner()?;
        let _gate = if flags & consts::MAP_FIXED != 0 { Some(self.not_owned(addr, len)?) } else { None };
        self.inner.mmap(addr, len, prot, flags, fd, off)
    }

    /// `mremap`'s grow in place: maps `[end, end + grow)` as the
    /// continuation of the region that ends at `end` (same protection and
    /// kind; a file region's following pages of its file), only where
    /// nothing is mapped (`EEXIST` otherwise; `EFAULT` when no region ends
    /// at `end`).
    pub fn grow_region(&self, end: usize, grow: usize) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.grow_region(end, grow)
    }

    /// `munmap` (seed 003: two-phase). A range overlapping a live
    /// [`Mapping`] is `EBUSY`: use [`Mapping::unmap`] (or drop it).
    pub fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.check_owner()?;
        let _gate = self.not_owned(addr, len)?;
        self.inner.munmap(addr, len)
    }

    /// `mseal(2)` (flags must be 0): seals every region of the range for
    /// good (`EINVAL` unaligned or bad flags, `ENOMEM` on any unmapped page,
    /// before anything changes). A sealed region refuses `munmap`,
    /// `mprotect`, `MAP_FIXED` over it and discarding advice on read-only
    /// private anonymous memory with `EPERM`, as Linux.
    pub fn mseal(&self, addr: usize, len: usize, flags: u64) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.mseal(addr, len, flags)
    }

    /// `msync` (`MS_ASYNC`, `MS_SYNC`, `MS_INVALIDATE`): shared file pages
    /// of the range are written to their files before it returns (both
    /// modes); `MS_SYNC` also `fdatasync`s the files.
    pub fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.msync(addr, len, flags)
    }

    /// `mprotect`. A range overlapping a live [`Mapping`] is `EBUSY` (its
    /// `Deref` promises readable, writable bytes).
    pub fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        self.check_owner()?;
        let _gate = self.not_owned(addr, len)?;
        self.inner.mprotect(addr, len, prot)
    }

    /// `madvise`. Advice that changes or removes bytes (`MADV_DONTNEED`,
    /// `MADV_FREE`, `MADV_REMOVE`, `MADV_GUARD_INSTALL`, `MADV_HWPOISON`)
    /// over a live [`Mapping`] is `EBUSY`: use [`Mapping::advise`].
    pub fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.check_owner()?;
        let _gate = if advice_changes_bytes(advice) { Some(self.not_owned(addr, len)?) } else { None };
        self.inner.madvise(addr, len, advice)
    }

    /// `mlock`: `mlock2(addr, len, 0)`.
    pub fn mlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.mlock2(addr, len, 0)
    }

    /// `mlock2`: locks the pages of the range now (populating them; `EAGAIN`
    /// if the budget cannot hold them, locking nothing new) or, with
    /// `MLOCK_ONFAULT`, as they are first touched. `addr` need not be
    /// aligned. The whole range is charged to `memlock_bytes` now.
    pub fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
        self.check_owner()?;
        if flags & !consts::MLOCK_ONFAULT != 0 {
            return Err(Errno::EINVAL);
        }
        let mode = if flags & consts::MLOCK_ONFAULT != 0 {
            usermm_core::region::LockMode::OnFault
        } else {
            usermm_core::region::LockMode::Locked
        };
        self.inner.lock_call(|c| c.lock_range(addr as u64, len as u64, mode))
    }

    /// `munlock`: clears both kinds of lock on the range and uncharges it.
    pub fn munlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.lock_call(|c| c.lock_range(addr as u64, len as u64, usermm_core::region::LockMode::None))
    }

    /// `mlockall` (`MCL_CURRENT`, `MCL_FUTURE`, `MCL_ONFAULT`).
    pub fn mlockall(&self, flags: i32) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.lock_call(|c| c.mlockall(flags))
    }

    /// `munlockall`.
    pub fn munlockall(&self) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.lock_call(|c| c.munlockall())
    }

    /// `mvolatile`: the pages of the range may be purged at any time until
    /// `mnovolatile`; until then they keep their data and are accessed with
    /// no fault. Touching a purged page while it is volatile raises SIGBUS
    /// (`si_code` `BUS_ADRERR`, `si_addr` the address touched).
    ///
    /// A range overlapping a live [`Mapping`] is `EBUSY`: a purge would
    /// change bytes safe code may be borrowing. [`Purgeable`] is the safe
    /// handle for volatile memory.
    pub fn mvolatile(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.check_owner()?;
        let _gate = self.not_owned(addr, len)?;
        self.inner.mvolatile(addr, len)
    }

    /// `mvolatile` for a [`Purgeable`], whose bytes are only reachable
    /// through a guard that makes them non-volatile first.
    pub(crate) fn mvolatile_owned(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.check_owner()?;
        self.inner.mvolatile(addr, len)
    }

    /// `mnovolatile`: makes the range non-volatile; returns `true` if any
    /// page was purged since it was marked volatile (purged pages read back as
    /// zeros), with the exact report. Holes: the mapped parts are made
    /// non-volatile and the call fails with `ENOMEM`.
    pub fn mnovolatile(&self, addr: usize, len: usize) -> Result<(bool, PurgeReport), Errno> {
        self.check_owner()?;
        let (purged, res) = self.inner.mnovolatile(addr, len)?;
        let ps = self.page_size();
        let pages = len.div_ceil(ps);
        let mut bitmap = vec![0u64; pages.div_ceil(64)];
        for &a in &purged {
            let i = (a - addr) / ps;
            bitmap[i / 64] |= 1 << (i % 64);
        }
        res?;
        let report =
            PurgeReport { purged_pages: purged.len(), first_purged: purged.first().copied().unwrap_or(0), bitmap };
        Ok((!purged.is_empty(), report))
    }

    /// `umm_populate`: `MADV_POPULATE_READ` or `MADV_POPULATE_WRITE` on the
    /// range, also reporting how many bytes (from `addr`) were populated; on
    /// failure, the report's `fail_addr` is `addr + populated`.
    pub fn populate(&self, addr: usize, len: usize, advice: i32) -> (PopulateReport, Result<(), Errno>) {
        if let Err(e) = self.check_owner() {
            return (PopulateReport::default(), Err(e));
        }
        if advice != consts::MADV_POPULATE_READ && advice != consts::MADV_POPULATE_WRITE {
            return (PopulateReport::default(), Err(Errno::EINVAL));
        }
        let (n, r) = self.inner.populate(addr, len, advice == consts::MADV_POPULATE_WRITE);
        let fail_addr = if r.is_err() { addr + n } else { 0 };
        (PopulateReport { populated_bytes: n, fail_addr }, r)
    }

    /// `mincore`: fills `vec` (one byte per page; bit 0 is "resident"). `vec`
    /// must hold `ceil(len / page_size)` bytes; a shorter one is `EFAULT` as
    /// a vector that ends in unmapped memory is on Linux, which copies each
    /// region's bytes out before it looks past the region: unless the range
    /// runs into a hole (`ENOMEM`) within the pages `vec` holds. As on
    /// Linux, the bytes `vec` holds are written before the `EFAULT`.
    pub fn mincore(&self, addr: usize, len: usize, vec: &mut [u8]) -> Result<(), Errno> {
        let (bytes, r) = self.mincore_walk(addr, len)?;
        let n = bytes.len().min(vec.len());
        // Linux leaves the bytes past a hole untouched.
        vec[..n].copy_from_slice(&bytes[..n]);
        if bytes.len() > vec.len() {
            return Err(Errno::EFAULT);
        }
        r
    }

    /// `mincore`'s walk, for callers that copy its bytes to memory of their
    /// own (the C ABI, the preload): the bytes of the pages before the first
    /// hole (of all the pages when there is none), and the walk's result
    /// (`ENOMEM` at the hole). A caller copies the bytes out first and
    /// answers `EFAULT` if that fails, whatever the walk said, as Linux's
    /// `mincore` copies each region's bytes out before it walks past the
    /// region. Errors found before any byte (`EINVAL` for an unaligned
    /// `addr`, `ENOMEM` past the address space or a hole at `addr`) come
    /// back as `Err`.
    pub fn mincore_walk(&self, addr: usize, len: usize) -> Result<(Vec<u8>, Result<(), Errno>), Errno> {
        self.check_owner()?;
        // Never allocate more than the reservation has pages: a longer range
        // ends in a hole anyway (ENOMEM), which the core reports.
        let pages = len.div_ceil(self.inner.page_size()).min(self.reserve_pages());
        // The core writes 0 or 1 for each page before the first hole; the
        // pages after it keep this byte.
        const UNFILLED: u8 = 0xff;
        let mut tmp = vec![UNFILLED; pages];
        let r = self.inner.settled_core(addr, len).mincore(addr as u64, len as u64, &mut tmp);
        let filled = tmp.iter().position(|&b| b == UNFILLED).unwrap_or(pages);
        if filled == 0 {
            // (Nothing walked: an error before the walk, a hole first, or
            // no pages.)
            return r.map(|()| (tmp, Ok(())));
        }
        // Memory shared with a forked process is the host's: its pages in
        // memory are the host's answer.
        let ps = self.inner.page_size();
        for (s, t) in self.inner.shared_resident(addr, filled * ps) {
            tmp[(s - addr) / ps..(t - addr) / ps].fill(1);
        }
        tmp.truncate(filled);
        Ok((tmp, r))
    }

    fn reserve_pages(&self) -> usize {
        self.inner.reserve_len() / self.inner.page_size()
    }

    /// `umm_page_state`: one word of `UMM_PAGE_*` bits per page (the words
    /// past a hole are left untouched).
    pub fn page_state(&self, addr: usize, npages: usize, out: &mut [u32]) -> Result<(), Errno> {
        self.check_owner()?;
        let pages = npages.min(self.reserve_pages());
        let mut tmp = vec![0u32; pages];
        let n = out.len().min(pages);
        tmp[..n].copy_from_slice(&out[..n]);
        let r = self.inner.settled_core(addr, npages.saturating_mul(self.inner.page_size())).page_state(
            addr as u64,
            npages as u64,
            &mut tmp,
        );
        if r.is_ok() && out.len() < npages {
            return Err(Errno::EFAULT);
        }
        if r.is_ok() {
            // A locked page that maps the zero page is not locked for Linux
            // (nothing is pinned until a write allocates the page).
            let ps = self.inner.page_size();
            for (a, e) in self.inner.zero_pfn_ranges(addr, n * ps) {
                for w in &mut tmp[(a - addr) / ps..(e - addr) / ps] {
                    *w &= !consts::UMM_PAGE_LOCKED;
                }
            }
        }
        out[..n].copy_from_slice(&tmp[..n]);
        r
    }

    /// Statistics.
    pub fn stats(&self) -> Stats {
        self.assert_owner();
        let (s, locked) = {
            let c = self.inner.core();
            (c.stats(), c.locked_extents())
        };
        // Pages of locked regions that map the zero page are resident (and
        // pinned: a write would allocate them) but, as on Linux, not locked.
        let zero: usize = locked
            .iter()
            .flat_map(|&(a, l)| self.inner.zero_pfn_ranges(a as usize, l as usize))
            .map(|(a, e)| (e - a) / self.inner.page_size())
            .sum();
        let c = &s.counters;
        let pool = self.inner.plat().pool_stats();
        let host = self.inner.host_stats();
        Stats {
            budget_pages: s.budget_pages,
            resident_pages: s.resident_pages,
            resident_pages_max: s.resident_pages_max,
            locked_pages: s.locked_pages.saturating_sub(zero as u64),
            locked_charged_pages: s.locked_charged_pages,
            swapped_pages: s.swapped_pages,
            lazyfree_pages: s.lazyfree_pages,
            volatile_pages: s.volatile_pages,
            faults: c.faults,
            major_faults: c.major_faults,
            zero_fills: c.zero_fills,
            swapins: c.swapins,
            swapouts: c.swapouts,
            writebacks: c.writebacks,
            lazyfree_discards: c.lazyfree_discards,
            volatile_purges: c.volatile_purges,
            host_purges: c.host_purges,
            evictions: c.evictions,
            oom_sigbus: c.oom_sigbus,
            write_lock_hold_ns_max: host.write_hold_ns_max,
            inactive_pages: s.inactive_pages,
            minor_faults: c.minor_faults,
            deactivations: c.deactivations,
            swap_read_errors: c.swap_read_errors,
            swap_write_errors: c.swap_write_errors,
            regions: s.regions,
            user_mode_only: self.inner.user_mode_only() as u64,
            swap_direct_io: self.inner.plat().caps().swap_direct_io as u64,
            host_refusals: host.host_refusals,
            swap_write_fails: host.swap_write_fails,
            swap_backoff_ms: host.swap_backoff_ms,
            host_unreported_moves: host.host_unreported_moves,
            swap_cached_pages: s.swap_cached_pages,
            clean_evictions: c.clean_evictions,
            pool_frames: pool.0,
            pool_fills: pool.1,
            unparked_pages: c.unparked,
            swap_ahead_pages: c.swap_ahead,
            swap_fork_held_pages: s.swap_fork_held_pages,
        }
    }

    /// Whether a forked child gets a copy of the space (see [`Space`]'s
    /// "fork"; a copy can still fail).
    pub fn fork_copies(&self) -> bool {
        self.inner.fork_copies()
    }

    /// The smaps text: one entry per region in `/proc/PID/smaps`'s layout.
    /// Linux's `dc` on a region a fork does not copy (`MADV_DONTFORK`, or
    /// every region of a space not copied), `wf` for `MADV_WIPEONFORK`;
    /// usermm's own VmFlags: `um` (served by usermm) on every region, `uo`
    /// when the space runs on the user-mode-only fallback, `it` when its
    /// faults are resolved in the faulting thread (`UMM_F_INTHREAD_FAULTS`,
    /// or the region's `UMM_MAP_INTHREAD`; like `uo`, a kernel-mode access
    /// to a page not resident is `EFAULT`).
    pub fn smaps(&self) -> String {
        self.assert_owner();
        let extra = format!(
            "{}{}{}",
            if self.inner.user_mode_only() { "uo " } else { "" },
            if self.inner.in_thread() { "it " } else { "" },
            if self.inner.fork_copies() { "" } else { "dc " }
        );
        let extra = extra.as_str();
        let files = self.inner.files();
        let info = |id: u32| {
            files.get(&id).map(|f| {
                let maj = ((f.dev >> 8) & 0xfff) as u32 | ((f.dev >> 32) & !0xfff) as u32;
                let min = (f.dev & 0xff) as u32 | ((f.dev >> 12) & !0xff) as u32;
                (maj, min, f.ino, f.path.clone())
            })
        };
        // The zero-page counts of the locked regions first, with no core
        // lock held (a PAGEMAP_SCAN each); then the text under it. (A
        // region changed in between reads 0 there.)
        let locked = self.inner.core().locked_extents();
        let zeros: std::collections::HashMap<(u64, u64), u64> = locked
            .iter()
            .map(|&(a, l)| {
                let r = self.inner.zero_pfn_ranges(a as usize, l as usize);
                ((a, l), r.iter().map(|(a, e)| ((e - a) / self.inner.page_size()) as u64).sum())
            })
            .collect();
        let zero = |a: u64, l: u64| zeros.get(&(a, l)).copied().unwrap_or(0);
        let c = self.inner.core();
        usermm_core::smaps::format_with_files(&c, extra, &info, &zero)
    }

    /// Maps `len` bytes of private anonymous read-write memory as a handle
    /// that derefs to a byte slice and unmaps on drop (like `memmap2::MmapMut`).
    pub fn map_anon(&self, len: usize) -> Result<Mapping<'_>, Errno> {
        self.map_owned(len, consts::PROT_READ | consts::PROT_WRITE, consts::MAP_PRIVATE | consts::MAP_ANONYMOUS, -1, 0)
    }

    /// Maps (placed by the space) and registers the range as a live
    /// handle's (see `owned`). [`MapOptions`] builds on it.
    pub(crate) fn map_owned(&self, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<Mapping<'_>, Errno> {
        // No address-based call between the placement and the registration
        // (see `Handles::gate`).
        let _gate = self.inner.handles().gate.write().unwrap_or_else(|e| e.into_inner());
        let addr = self.mmap(0, len, prot, flags, fd, off)?;
        self.own(addr, len);
        Ok(Mapping { space: self, addr, len })
    }

    /// Checks every invariant of the core (for tests). Takes the region
    /// lock shared, then the core lock, as every observer does: a
    /// `MAP_FIXED` replacement holds the region lock exclusively while the
    /// new region already covers the range whose old pages it zaps (seen by
    /// the soak as "held range has regions" under the core lock alone).
    pub fn validate(&self) {
        self.assert_owner();
        self.inner.validate_core();
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        self.close_inner();
    }
}
