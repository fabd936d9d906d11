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
//! # Unsafe code
//! This crate has no `unsafe` of its own except the `boundary` module: the C
//! ABI, whose exported functions necessarily trust the pointers C callers
//! pass, and `Mapping`'s deref to a slice. Everything else that is unsafe
//! (every syscall and ioctl) lives in `usermm-sys`.

#![deny(unsafe_code)]

pub mod boundary;
mod native;
mod platform;
pub mod purgeable;
#[cfg(feature = "test-hooks")]
pub mod sim;

pub use boundary::capi;
pub use purgeable::{Contents, Purgeable, PurgeableGuard};

use std::path::PathBuf;
use std::sync::Arc;

pub use usermm_core::consts;
pub use usermm_core::Errno;
pub use usermm_sys::uffd::UffdMode;

use native::{Inner, Threads};

/// The default virtual range a space reserves: 64 GiB of address space (no
/// memory is used until pages are touched).
pub const DEFAULT_RESERVE_BYTES: usize = 64 << 30;
/// The default swap file size limit: 8 GiB (the file is sparse and grows as
/// pages are written).
pub const DEFAULT_SWAP_BYTES: usize = 8 << 30;

/// The default budget: a quarter of physical memory.
pub fn default_budget_bytes() -> usize {
    (usermm_sys::phys_mem_bytes() / 4).max(16 << 20) as usize
}

/// A space's configuration (`struct umm_config`). `Config::default()` gives
/// the same values as `umm_config_init`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Resident budget in bytes; 0: a quarter of physical memory.
    pub budget_bytes: usize,
    /// Virtual range reserved for the space; 0: [`DEFAULT_RESERVE_BYTES`].
    pub reserve_bytes: usize,
    /// Lock limit in bytes (the RLIMIT_MEMLOCK analogue); `usize::MAX`:
    /// unlimited; 0: every lock request fails with `EPERM`.
    pub memlock_bytes: usize,
    /// Largest swap file; 0: no swap (anonymous pages are then unevictable).
    pub swap_bytes: usize,
    /// Directory of the swap file; `None`: `$TMPDIR` or `/tmp`.
    pub swap_dir: Option<PathBuf>,
    /// Region limit; 0: 65530, as `vm.max_map_count`.
    pub max_regions: usize,
    /// log2 of the page size; 0: 12 (4 KiB); up to 21.
    pub page_shift: u32,
    /// Fault handler threads; 0: 2.
    pub fault_threads: u32,
    /// `UMM_F_*` flags.
    pub flags: u32,
    /// Most lazily freed (`MADV_FREE`) bytes the space keeps; past it the
    /// oldest are discarded at once (through the host: clean ones are
    /// dropped, written ones kept). 0: no bound.
    pub lazyfree_max_bytes: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            budget_bytes: 0,
            reserve_bytes: 0,
            memlock_bytes: usize::MAX,
            swap_bytes: DEFAULT_SWAP_BYTES,
            swap_dir: None,
            max_regions: 0,
            page_shift: 0,
            fault_threads: 0,
            flags: 0,
            lazyfree_max_bytes: 0,
        }
    }
}

/// Statistics of a space (`struct umm_stats`, plus usermm's own fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub budget_pages: u64,
    pub resident_pages: u64,
    pub resident_pages_max: u64,
    pub locked_pages: u64,
    pub locked_charged_pages: u64,
    pub swapped_pages: u64,
    pub lazyfree_pages: u64,
    pub volatile_pages: u64,
    pub faults: u64,
    pub major_faults: u64,
    pub zero_fills: u64,
    pub swapins: u64,
    pub swapouts: u64,
    pub writebacks: u64,
    pub lazyfree_discards: u64,
    pub volatile_purges: u64,
    /// Of `volatile_purges`, the pages the host kernel purged (Rust API
    /// only; not in `struct umm_stats`).
    pub host_purges: u64,
    pub evictions: u64,
    pub oom_sigbus: u64,
    pub write_lock_hold_ns_max: u64,
    // usermm's own:
    /// Resident pages parked on the inactive list (counted in `resident_pages`).
    pub inactive_pages: u64,
    /// Faults that mapped an inactive page back (no I/O).
    pub minor_faults: u64,
    pub deactivations: u64,
    pub swap_read_errors: u64,
    pub swap_write_errors: u64,
    pub regions: u64,
    /// 1 when the space runs on the user-mode-only userfaultfd fallback.
    pub user_mode_only: u64,
    /// 1 when swap I/O bypasses the host page cache (O_DIRECT).
    pub swap_direct_io: u64,
    /// Zaps (munmap, `MADV_DONTNEED`, `MAP_FIXED`) the host refused at
    /// first because the pages were locked behind usermm's back (a raw
    /// `mlock` syscall): the range was unlocked, or replaced by a fresh
    /// mapping, so that no old byte is ever seen again.
    pub host_refusals: u64,
}

/// What `umm_populate` reports (`struct umm_populate_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopulateReport {
    /// Bytes populated from the start of the range (a prefix).
    pub populated_bytes: usize,
    /// The first address that could not be populated (0 on success).
    pub fail_addr: usize,
}

/// What `mnovolatile` reports (`struct umm_purge_report`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Pages of the range purged since it was marked volatile.
    pub purged_pages: usize,
    /// The first purged address (0 when none was).
    pub first_purged: usize,
    /// One bit per page of the range (bit `i % 64` of word `i / 64`): set
    /// when page `i` was purged.
    pub bitmap: Vec<u64>,
}

/// A space: a reserved virtual range whose pages usermm serves.
///
/// # fork
/// A space belongs to the process that opened it. In a forked child every
/// call on it fails at once with [`Errno::ESTALE`] (the calls that return no
/// `Result` — [`Space::stats`], [`Space::smaps`], [`Space::validate`],
/// [`Space::host_reclaim`] — panic), before any lock is taken: a parent
/// thread may have held one at the fork, and the handler threads that serve
/// the space do not exist in the child. Dropping or closing it in the child
/// only forgets it; the parent's space is untouched. A child opens its own.
pub struct Space {
    inner: Arc<Inner>,
    threads: Option<Threads>,
    /// The fork generation ([`usermm_sys::thread::fork_generation`]) of the
    /// process that opened the space. Invariant: the space is used (locked,
    /// closed) only while the current generation equals it.
    fork_generation: u64,
    /// The ranges of the live [`Mapping`]s (and [`Purgeable`]s): safe code
    /// may hold a `&[u8]` into them, so the address-based calls that would
    /// change or remove their bytes refuse them (`EBUSY`); the handle's own
    /// methods, which hold it by `&mut` or by value, do it instead.
    owned: std::sync::Mutex<Vec<(usize, usize)>>,
    /// Makes a range check and the call it guards one step: the
    /// address-based calls hold it shared from their check to their end,
    /// and a new handle holds it exclusively from its `mmap` to its
    /// registration in `owned` (otherwise a `munmap` that found a hole
    /// could unmap the handle `map_anon` had just placed there).
    own_gate: std::sync::RwLock<()>,
}

/// Advice that changes a range's bytes now or later, or removes access to
/// them: refused on a [`Mapping`]'s range through the address-based
/// [`Space::madvise`].
fn advice_changes_bytes(advice: i32) -> bool {
    use consts::*;
    matches!(advice, MADV_DONTNEED | MADV_FREE | MADV_REMOVE | MADV_HWPOISON | MADV_GUARD_INSTALL)
}

impl Space {
    /// Opens a space (`umm_open`).
    pub fn open(cfg: &Config) -> Result<Space, Errno> {
        let fork_generation = usermm_sys::thread::watch_forks()?;
        let (inner, threads) = Inner::open(cfg)?;
        Ok(Space {
            inner,
            threads: Some(threads),
            fork_generation,
            owned: std::sync::Mutex::new(Vec::new()),
            own_gate: std::sync::RwLock::new(()),
        })
    }

    /// `Err(ESTALE)` in a process forked after the space was opened (see
    /// [`Space`]'s "fork"); an atomic load, checked before any lock.
    pub fn check_owner(&self) -> Result<(), Errno> {
        if usermm_sys::thread::fork_generation() != self.fork_generation {
            return Err(Errno::ESTALE);
        }
        Ok(())
    }

    /// Panics in a forked child, for the calls that cannot return `ESTALE`.
    fn assert_owner(&self) {
        assert!(
            self.check_owner().is_ok(),
            "usermm: a space used in a forked child (ESTALE): a child must open its own"
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
        if self.check_owner().is_err() {
            // A forked child: the handler threads to join do not exist here,
            // and the space's locks may be held forever by threads that did
            // not come along. Forget everything; freeing the reservation
            // could even unmap what the child has mapped there since.
            if let Some(t) = self.threads.take() {
                std::mem::forget(t);
                std::mem::forget(Arc::clone(&self.inner));
            }
            return;
        }
        if let Some(t) = self.threads.take() {
            self.inner.close(t);
        }
    }

    /// The space's page size in bytes.
    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }

    /// The reserved range `(start, len)`.
    pub fn reservation(&self) -> (usize, usize) {
        (self.inner.base, self.inner.reserve_len)
    }

    /// How userfaultfd was obtained.
    pub fn uffd_mode(&self) -> UffdMode {
        if self.inner.user_mode_only {
            UffdMode::UserModeOnly
        } else {
            UffdMode::Full
        }
    }

    /// Why the user-mode-only fallback was taken, if it was.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback_reason.as_deref()
    }

    /// `EBUSY` if `[addr, addr+len)` overlaps a live [`Mapping`] (safe
    /// code may be borrowing its bytes); otherwise a guard that keeps new
    /// handles out until the caller's call is done.
    fn not_owned(&self, addr: usize, len: usize) -> Result<std::sync::RwLockReadGuard<'_, ()>, Errno> {
        let gate = self.own_gate.read().unwrap_or_else(|e| e.into_inner());
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let end = addr.saturating_add(len);
        if owned.iter().any(|&(a, l)| a < end && addr < a + l) {
            return Err(Errno::EBUSY);
        }
        Ok(gate)
    }

    fn own(&self, addr: usize, len: usize) {
        self.owned.lock().unwrap_or_else(|e| e.into_inner()).push((addr, len));
    }

    fn disown(&self, addr: usize) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
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

    /// `munmap` (seed 003: two-phase). A range overlapping a live
    /// [`Mapping`] is `EBUSY`: use [`Mapping::unmap`] (or drop it).
    pub fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.check_owner()?;
        let _gate = self.not_owned(addr, len)?;
        self.inner.munmap(addr, len)
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
    /// must hold `ceil(len / page_size)` bytes (`EFAULT` otherwise).
    pub fn mincore(&self, addr: usize, len: usize, vec: &mut [u8]) -> Result<(), Errno> {
        self.check_owner()?;
        // Never allocate more than the reservation has pages: a longer range
        // ends in a hole anyway (ENOMEM), which the core reports.
        let pages = len.div_ceil(self.inner.page_size).min(self.reserve_pages());
        // Start from the caller's bytes: Linux leaves the bytes past a hole
        // untouched.
        let mut tmp = vec![0u8; pages];
        let n = vec.len().min(pages);
        tmp[..n].copy_from_slice(&vec[..n]);
        let r = self.inner.settled_core(addr, len).mincore(addr as u64, len as u64, &mut tmp);
        if r.is_ok() && vec.len() < pages {
            return Err(Errno::EFAULT);
        }
        vec[..n].copy_from_slice(&tmp[..n]);
        r
    }

    fn reserve_pages(&self) -> usize {
        self.inner.reserve_len / self.inner.page_size
    }

    /// `umm_page_state`: one word of `UMM_PAGE_*` bits per page (the words
    /// past a hole are left untouched).
    pub fn page_state(&self, addr: usize, npages: usize, out: &mut [u32]) -> Result<(), Errno> {
        self.check_owner()?;
        let pages = npages.min(self.reserve_pages());
        let mut tmp = vec![0u32; pages];
        let n = out.len().min(pages);
        tmp[..n].copy_from_slice(&out[..n]);
        let r = self.inner.settled_core(addr, npages.saturating_mul(self.inner.page_size)).page_state(
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
            let ps = self.inner.page_size;
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
            let c = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
            (c.stats(), c.locked_extents())
        };
        // Pages of locked regions that map the zero page are resident (and
        // pinned: a write would allocate them) but, as on Linux, not locked.
        let zero: usize = locked
            .iter()
            .flat_map(|&(a, l)| self.inner.zero_pfn_ranges(a as usize, l as usize))
            .map(|(a, e)| (e - a) / self.inner.page_size)
            .sum();
        let c = &s.counters;
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
            write_lock_hold_ns_max: self.inner.write_hold_ns_max.load(std::sync::atomic::Ordering::Relaxed),
            inactive_pages: s.inactive_pages,
            minor_faults: c.minor_faults,
            deactivations: c.deactivations,
            swap_read_errors: c.swap_read_errors,
            swap_write_errors: c.swap_write_errors,
            regions: s.regions,
            user_mode_only: self.inner.user_mode_only as u64,
            swap_direct_io: self.inner.plat.swap_direct_io() as u64,
            host_refusals: self.inner.host_refusals.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The smaps text: one entry per region in `/proc/PID/smaps`'s layout.
    /// usermm's own VmFlags: `um` (served by usermm) on every region, and
    /// `uo` when the space runs on the user-mode-only fallback.
    pub fn smaps(&self) -> String {
        self.assert_owner();
        let extra = if self.inner.user_mode_only { "uo " } else { "" };
        let files = self.inner.files.lock().unwrap_or_else(|e| e.into_inner()).clone();
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
        let locked = self.inner.core.lock().unwrap_or_else(|e| e.into_inner()).locked_extents();
        let zeros: std::collections::HashMap<(u64, u64), u64> = locked
            .iter()
            .map(|&(a, l)| {
                let r = self.inner.zero_pfn_ranges(a as usize, l as usize);
                ((a, l), r.iter().map(|(a, e)| ((e - a) / self.inner.page_size) as u64).sum())
            })
            .collect();
        let zero = |a: u64, l: u64| zeros.get(&(a, l)).copied().unwrap_or(0);
        let c = self.inner.core.lock().unwrap_or_else(|e| e.into_inner());
        usermm_core::smaps::format_with_files(&c, extra, &info, &zero)
    }

    /// Maps `len` bytes of private anonymous read-write memory as a handle
    /// that derefs to a byte slice and unmaps on drop (like `memmap2::MmapMut`).
    pub fn map_anon(&self, len: usize) -> Result<Mapping<'_>, Errno> {
        // No address-based call between the placement and the registration
        // (see `own_gate`).
        let _gate = self.own_gate.write().unwrap_or_else(|e| e.into_inner());
        let addr = self.mmap(
            0,
            len,
            consts::PROT_READ | consts::PROT_WRITE,
            consts::MAP_PRIVATE | consts::MAP_ANONYMOUS,
            -1,
            0,
        )?;
        self.own(addr, len);
        Ok(Mapping { space: self, addr, len })
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: a handler that decides a transient SIGBUS (a failed swap
    /// read) waits `ms` milliseconds before queuing it, as a preempted
    /// handler thread would.
    pub fn inject_signal_stall(&self, ms: u32) {
        self.inner.inject_signal_stall_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: a range write-back (msync, munmap, close) waits `ms`
    /// milliseconds between listing the dirty pages and writing them, as a
    /// preempted caller would.
    pub fn inject_writeback_stall(&self, ms: u32) {
        self.inner.inject_writeback_stall_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Debugging hook (also in the C ABI, `umm_debug_inject_swap_errors`,
    /// for programs testing their SIGBUS handling): the next `reads` swap
    /// reads and `writes` swap writes fail with `EIO`.
    pub fn inject_swap_errors(&self, reads: u32, writes: u32) {
        self.inner.inject_read_errors.store(reads, std::sync::atomic::Ordering::SeqCst);
        self.inner.inject_write_errors.store(writes, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the host kernel reclaims the space's staging area now, as
    /// its own memory pressure would: parked volatile pages (and lazily
    /// freed ones) that are clean are discarded by the host. Returns whether
    /// host discards are on for this space (`false`: no userfaultfd
    /// write-protect or no `PAGEMAP_SCAN`, so nothing is handed to the host).
    pub fn host_reclaim(&self) -> bool {
        self.assert_owner();
        self.inner.host_reclaim_staging();
        self.inner.host_lazyfree
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the next populate (`MADV_POPULATE_*`, `umm_populate`) that
    /// reaches the page at `addr` is interrupted there with `EINTR`, as a
    /// populate is when the space closes under it; the hook then clears.
    pub fn interrupt_populate_at(&self, addr: usize) {
        let p = (addr.wrapping_sub(self.inner.base) / self.inner.page_size) as u64;
        self.inner.populate_interrupt.store(p, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    /// Test hook: the whole swap file's contents (to check what reached disk).
    pub fn swap_contents(&self) -> Result<Vec<u8>, Errno> {
        self.check_owner()?;
        self.inner.plat.swap_contents(self.inner.swap_bytes)
    }

    /// Checks every invariant of the core (for tests). Takes the region
    /// lock shared, then the core lock, as every observer does: a
    /// `MAP_FIXED` replacement holds the region lock exclusively while the
    /// new region already covers the range whose old pages it zaps (seen by
    /// the soak as "held range has regions" under the core lock alone).
    pub fn validate(&self) {
        self.assert_owner();
        let _mm = self.inner.read_mm();
        self.inner.core.lock().unwrap_or_else(|e| e.into_inner()).validate();
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        self.close_inner();
    }
}

/// A mapped region that derefs to a byte slice and unmaps on drop.
pub struct Mapping<'a> {
    space: &'a Space,
    addr: usize,
    len: usize,
}

impl Mapping<'_> {
    pub fn addr(&self) -> usize {
        self.addr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.addr as *mut u8
    }
    /// Unmaps now and reports the result (dropping a `Mapping` also unmaps,
    /// ignoring errors).
    pub fn unmap(self) -> Result<(), Errno> {
        self.space.disown(self.addr);
        let r = self.space.check_owner().and_then(|()| self.space.inner.munmap(self.addr, self.len));
        std::mem::forget(self);
        r
    }

    /// `madvise` on the whole mapping: [`Mapping::advise_range`].
    pub fn advise(&mut self, advice: i32) -> Result<(), Errno> {
        self.advise_range(0, self.len, advice)
    }

    /// `madvise` on `[offset, offset+len)` of the mapping (`EINVAL` past its
    /// end). It takes the mapping by `&mut`: no borrow of its bytes lives
    /// across the call, so advice that changes them now (`MADV_DONTNEED`:
    /// zeros after) is safe. Advice that may change them *later*, under a
    /// borrow taken after the call (`MADV_FREE`: a page reads as its data or
    /// as zeros until written), or that removes access
    /// (`MADV_GUARD_INSTALL`, `MADV_HWPOISON`), is `EINVAL` here:
    /// [`Mapping::advise_unchecked`].
    pub fn advise_range(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        use consts::*;
        if matches!(advice, MADV_FREE | MADV_GUARD_INSTALL | MADV_HWPOISON) {
            return Err(Errno::EINVAL);
        }
        self.advise_inner(offset, len, advice)
    }

    /// `madvise` with any advice on `[offset, offset+len)` of the mapping.
    ///
    /// # Safety
    /// After `MADV_FREE`, each page must be written (or advised with
    /// `MADV_DONTNEED`) before its bytes are borrowed: until then a discard
    /// may change them under a borrow. After `MADV_GUARD_INSTALL` or
    /// `MADV_HWPOISON`, the pages must not be borrowed at all until
    /// `MADV_GUARD_REMOVE` (poison: never).
    // An unsafe contract, not unsafe code: the body is a safe call.
    #[allow(unsafe_code)]
    pub unsafe fn advise_unchecked(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.advise_inner(offset, len, advice)
    }

    /// `mvolatile` on `[offset, offset+len)` of the mapping.
    ///
    /// # Safety
    /// Until `mnovolatile` on it, the range must not be borrowed: a purge
    /// may change it at any time (and a touch of a purged page raises
    /// SIGBUS). [`Purgeable`] is the safe handle for volatile memory.
    #[allow(unsafe_code)]
    pub unsafe fn mvolatile(&mut self, offset: usize, len: usize) -> Result<(), Errno> {
        self.check_range(offset, len)?;
        self.space.check_owner()?;
        self.space.inner.mvolatile(self.addr + offset, len)
    }

    /// `mnovolatile` on `[offset, offset+len)` of the mapping: see
    /// [`Space::mnovolatile`].
    pub fn mnovolatile(&mut self, offset: usize, len: usize) -> Result<(bool, PurgeReport), Errno> {
        self.check_range(offset, len)?;
        self.space.mnovolatile(self.addr + offset, len)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), Errno> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }

    fn advise_inner(&mut self, offset: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.check_range(offset, len)?;
        self.space.check_owner()?;
        self.space.inner.madvise(self.addr + offset, len, advice)
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        self.space.disown(self.addr);
        if self.space.check_owner().is_ok() {
            let _ = self.space.inner.munmap(self.addr, self.len);
        }
    }
}
