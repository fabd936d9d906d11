//! The space's state machine: every decision, no action.
//!
//! See the crate documentation for the plan / act / done protocol. Fault
//! model: the executor may fail any action (I/O error, `EAGAIN`, a lost
//! race); every `*_done` call takes `ok` and leaves the state consistent
//! either way — a failed fill leaves the page where its data was, a failed
//! eviction keeps the page resident, a failed zap is impossible by
//! construction (it only drops).
//!
//! # Parts
//!
//! `Core` is a thin composition of owned parts, each a type whose fields
//! are private to its own module and whose methods keep its invariants
//! (quinn-proto's `Connection` of `PathData`, `Streams`, `Pacer`). The
//! concerns below call a part's methods, never its fields, and
//! `Core::validate` calls each part's own `validate` before it checks the
//! parts against one another.
//!
//! | part (module)                      | owns                                                                             |
//! |------------------------------------|----------------------------------------------------------------------------------|
//! | `RegionTree` (`region.rs`)         | the regions (changed only by `Region`'s mutators); shared anonymous objects' ids |
//! | `Zaps` (`core/zaps.rs`)            | ranges held by `munmap`; chunks being zapped                                     |
//! | `PageTable` (`page.rs`)            | every page's state and flags, and their census                                   |
//! | `Lru` (`lru.rs`)                   | the active, inactive, lazy, volatile lists; generations; compaction              |
//! | `SwapSpace` (`core/swap.rs`)       | swap slots; slots being released or scrubbed; pause                              |
//! | `SlotAllocator` (`slots.rs`)       | staging slots                                                                    |
//! | `Pressure` (`core/pressure.rs`)    | budget ran out; refill to the watermark; demand; parked since it eased           |
//! | `Locks` (`core/locks.rs`)          | pages charged to the lock limit; `mlockall`'s future                             |
//! | `Options` (`core/options.rs`)      | the host's lazy free and write tracking; space options                           |
//! | `FileTable` (`core/file_table.rs`) | pages mapping each file; write-back errors to report                             |
//!
//! Beside them `Core` holds its configuration (read only) and the event
//! `Counters`.
//!
//! # Methods by kind
//!
//! Every public method of `Core` is one of four kinds, which the executor
//! calls in the order of the crate's protocol (plan, act, commit):
//!
//! - **plan**: decides, changes the metadata, claims what it decided on
//!   (pages made busy, slots reserved) and returns what the executor
//!   carries out outside the core lock — a `FaultPlan`, a `ReclaimPlan`, a
//!   `LockPlan`, pages, ranges or slots. (`msync` and `populate_check` only
//!   check their arguments and return ranges; `reclaim_ahead` and
//!   `reclaim_ahead_want` decide the background thread's rounds.)
//! - **commit**: applies what the executor did with a plan (`*_done`,
//!   `*_lost`, `writeback_release`, `unhold`, `zap_end`, `lock_revert`),
//!   and leaves the state consistent whether it succeeded or failed.
//! - **query**: reads (`&self`), for the executor's decisions,
//!   introspection and tests (`validate`); `take_file_error` also clears
//!   the error it reports (fsync semantics).
//! - **configuration**: `new`, and the `set_*` of the space's options, the
//!   host's capabilities and the page store's state.
//!
//! Each concern's file holds one `impl Core` block per kind it has, in
//! that order, headed by its kind (a private helper stays after the
//! public method it followed):
//!
//! | kind          | file            | methods                                                           |
//! |---------------|-----------------|-------------------------------------------------------------------|
//! | plan          | `evict.rs`      | `deactivate_range`, `pageout_range`, `evict_pages`, `evict_range` |
//! |               | `fault.rs`      | `fault`, `fault_in_thread`, `populate_step`, `populate_check`     |
//! |               | `file.rs`       | `writeback_claim`, `msync`                                        |
//! |               | `madvise.rs`    | `madvise`                                                         |
//! |               | `mlock.rs`      | `lock_range`, `mlockall`, `munlockall`                            |
//! |               | `policy.rs`     | `reclaim_ahead`, `reclaim_ahead_want`, `ease_if_calm`             |
//! |               | `reclaim.rs`    | `reclaim_plan`, `lazyfree_trim_plan`                              |
//! |               | `release.rs`    | `swap_scrub_plan`, `swap_release_plan`                            |
//! |               | `swapcache.rs`  | `wp_fault`                                                        |
//! |               | `unpark.rs`     | `unpark_plan`                                                     |
//! |               | `vma.rs`        | `mmap`, `mmap_file`, `munmap`, `mprotect`                         |
//! |               | `volatile.rs`   | `mvolatile`, `mnovolatile`, `reactivate_step`, `lazyfree`         |
//! |               | `window.rs`     | `readahead_instead_of_wait`                                       |
//! |               | `zap.rs`        | `zap_begin`                                                       |
//! | commit        | `evict.rs`      | `pageout_done`, `deactivate_done`, `deactivate_lost`,             |
//! |               |                 | `drop_done`, `evict_done`, `purge_done`, `reactivate_lost`,       |
//! |               |                 | `discard_done`                                                    |
//! |               | `fault.rs`      | `fill_done`, `fault_oom`                                          |
//! |               | `file.rs`       | `writeback_done`, `note_file_error`, `count_writeback`,           |
//! |               |                 | `writeback_release`                                               |
//! |               | `frames.rs`     | `add_spares`                                                      |
//! |               | `madvise.rs`    | `set_poison`                                                      |
//! |               | `mlock.rs`      | `lock_revert`                                                     |
//! |               | `release.rs`    | `swap_scrub_done`, `swap_release_done`                            |
//! |               | `unpark.rs`     | `unpark_done`                                                     |
//! |               | `vma.rs`        | `unhold`                                                          |
//! |               | `zap.rs`        | `zap_end`                                                         |
//! | query         | `core.rs`       | `config`, `page_size`, `regions`, `locked_extents`, `page`,       |
//! |               |                 | `free_frames`, `resident`, `held`, `addr_of`, `page_of`           |
//! |               | `file.rs`       | `take_file_error`, `files_in_use`, `shared_file_ranges`           |
//! |               | `frames.rs`     | `lru_sweep_work`, `spares_wanted`, `spares_low`                   |
//! |               | `introspect.rs` | `any_filling`, `mincore`, `page_state`, `stats`, `region_usage`   |
//! |               | `madvise.rs`    | `swapped_in`                                                      |
//! |               | `mlock.rs`      | `lock_fits`, `region_at`                                          |
//! |               | `policy.rs`     | `inactive_target`, `needs_aging`, `unpark_due`, `calm_mark`       |
//! |               | `reclaim.rs`    | `reclaim_hopeless`, `reclaim_in_flight`, `out_of_memory`,         |
//! |               |                 | `reclaim_possible_but_for_store`, `swap_writes_paused`,           |
//! |               |                 | `lazyfree_excess`, `direct_reclaim_batch`                         |
//! |               | `release.rs`    | `swap_release_pending`                                            |
//! |               | `validate.rs`   | `validate`                                                        |
//! |               | `volatile.rs`   | `volatile_in`, `any_volatile`, `lazyfree_runs`                    |
//! |               | `window.rs`     | `file_continues`, `readahead_after_fault`, `readahead_window`,    |
//! |               |                 | `readahead_chains`                                                |
//! | configuration | `core.rs`       | `new`, `set_host_lazyfree`, `set_purge_volatile_first`            |
//! |               | `reclaim.rs`    | `set_swap_writes_paused`, `set_lazyfree_max`                      |
//! |               | `release.rs`    | `set_swap_release_granule`                                        |
//! |               | `swapcache.rs`  | `set_tracks_writes`                                               |
//!
//! # Where each concern lives
//!
//! Each concern is a child module (a helper another concern calls is
//! `pub(super)`); a concern that needs several parts at once — a fault
//! claims pages, charges frames and asks the swap space — is a method of
//! `Core`. Every public method is reached as `Core::method` whatever file
//! it is in, and every type as `usermm_core::core::X` and
//! `usermm_core::X` (re-exported below).
//!
//! | file                 | what                                                                   |
//! |----------------------|------------------------------------------------------------------------|
//! | `core.rs` (this)     | `Core`, its config, counters, constructor, accessors, range arithmetic |
//! | `core/plan.rs`       | the core ↔ executor protocol: plans, outcomes, replies                 |
//! | `core/vma.rs`        | region changes: `mmap`, `munmap` (detach, `unhold`), `mprotect`        |
//! | `core/mlock.rs`      | locks: `mlock2`/`munlock`, `mlockall`/`munlockall`                     |
//! | `core/madvise.rs`    | `madvise` decisions, `WILLNEED`/`HWPOISON` page queries                |
//! | `core/fault.rs`      | fault and populate plans, `fill_done`                                  |
//! | `core/window.rs`     | fault-around and swap-in window policy, `grow_run`                     |
//! | `core/frames.rs`     | frame charge, LRU pushes, spare buffers                                |
//! | `core/reclaim.rs`    | reclaim policy: what to deactivate, evict, purge, discard, and when    |
//! | `core/evict.rs`      | `MADV_COLD`/`PAGEOUT` range plans, every reclaim step's `*_done`       |
//! | `core/unpark.rs`     | pressure's end: parked pages mapped back in bulk                       |
//! | `core/file.rs`       | shared file regions: write-back, `msync`, write-back errors            |
//! | `core/release.rs`    | the swap space's release and scrub plans, as the executor calls them   |
//! | `core/volatile.rs`   | `mvolatile`/`mnovolatile`, lazy free (`MADV_FREE`)                     |
//! | `core/zap.rs`        | `zap_begin`/`zap_end`: dropping a range's pages                        |
//! | `core/introspect.rs` | `mincore`, `page_state`, `stats`, smaps usage                          |
//! | `core/validate.rs`   | `validate`: every invariant, asserted                                  |

use crate::consts::*;
use crate::errno::Errno;
use crate::lru::Lru;
use crate::page::{PageMeta, PageTable};
use crate::region::{Kind, LockMode, Region, RegionTree};
use crate::slots::SlotAllocator;
use crate::types::{Addr, PageIdx, PageRange};
use file_table::FileTable;
use locks::Locks;
use options::Options;
use pressure::Pressure;
use swap::SwapSpace;
use zaps::Zaps;

mod evict;
mod fault;
mod file;
mod file_table;
mod fork;
mod frames;
mod introspect;
mod locks;
mod madvise;
mod mlock;
mod mseal;
mod options;
mod plan;
mod policy;
mod pressure;
mod range;
mod reclaim;
mod release;
mod swap;
mod swap_ahead;
mod swapcache;
mod unpark;
mod validate;
mod vma;
mod volatile;
mod window;
mod zap;
mod zaps;

pub use fork::HandSrc;
pub use introspect::state_bits;
pub use madvise::is_attribute_advice;
pub use mlock::lock_populate_errno;
pub use plan::*;
pub use reclaim::{OOM_ROUNDS, OOM_ROUNDS_BUSY};
pub use swap_ahead::{SwapAhead, AHEAD_STREAK};
pub use window::{
    BLOCK_MIN_REGION_PAGES, BLOCK_PAGES, FAULT_AROUND_BYTES, IN_THREAD_ZERO_WINDOW_PAGES, MAX_WINDOW_PAGES,
    READAHEAD_DEPTH, SMALL_BLOCK_PAGES, STREAM_GAP_PAGES, SWAP_CLUSTER_PAGES,
};

/// The highest user address on x86-64 with 4-level paging (Linux TASK_SIZE).
pub const TASK_SIZE: u64 = 0x7fff_ffff_f000;

/// The core's configuration, in pages.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// First address of the reservation.
    pub base: u64,
    pub reserve_pages: u64,
    pub page_shift: u32,
    pub budget_pages: u64,
    pub swap_slots: u32,
    pub staging_slots: u32,
    pub max_regions: usize,
    /// Lock limit in pages; `u64::MAX` is unlimited, 0 refuses every lock.
    pub memlock_pages: u64,
    /// Whether locks may be asked for at all: false for a lock limit of 0
    /// bytes (`EPERM`, Linux's `can_do_mlock`); a limit below one page is
    /// `memlock_pages == 0` and gives `ENOMEM`/`EAGAIN`, as on Linux.
    pub mlock_allowed: bool,
    /// Never fault around the touched page.
    pub exact_faults: bool,
}

/// Event counters (the `umm_stats` fields that count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub faults: u64,
    pub major_faults: u64,
    pub minor_faults: u64,
    pub zero_fills: u64,
    pub swapins: u64,
    pub swapouts: u64,
    /// Evictions that wrote nothing: the page's swap copy was exact.
    pub clean_evictions: u64,
    pub writebacks: u64,
    pub lazyfree_discards: u64,
    pub volatile_purges: u64,
    /// Of `volatile_purges`, those the host kernel did (found out when the
    /// page was mapped back).
    pub host_purges: u64,
    pub evictions: u64,
    pub deactivations: u64,
    /// Parked pages mapped back in bulk when pressure eased (`unpark.rs`)
    /// or ahead of a swap stream (`swap_ahead.rs`): no fault, no use counted.
    pub unparked: u64,
    /// Pages read ahead of a swap-in stream (`swap_ahead.rs`), also counted
    /// in `swapins`.
    pub swap_ahead: u64,
    pub oom_sigbus: u64,
    pub swap_read_errors: u64,
    pub swap_write_errors: u64,
    /// Zapped pages an eviction found touched (the reference scan's hits):
    /// they stayed, back on the active list.
    pub scan_hits: u64,
}

/// A snapshot of the gauges and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub budget_pages: u64,
    pub resident_pages: u64,
    pub resident_pages_max: u64,
    pub inactive_pages: u64,
    pub locked_pages: u64,
    pub locked_charged_pages: u64,
    pub swapped_pages: u64,
    pub lazyfree_pages: u64,
    pub volatile_pages: u64,
    /// Resident pages whose swap slot still holds their data (`swapcache.rs`).
    pub swap_cached_pages: u64,
    /// Swap slots freed but kept for a forked child (`core/fork.rs`).
    pub swap_fork_held_pages: u64,
    pub regions: u64,
    pub counters: Counters,
}

pub struct Core {
    cfg: CoreConfig,
    regions: RegionTree,
    zaps: Zaps,
    pages: PageTable,
    lru: Lru,
    swap: SwapSpace,
    staging: SlotAllocator,
    pressure: Pressure,
    locks: Locks,
    options: Options,
    files: FileTable,
    counters: Counters,
    /// Pages of sampled regions filled under pressure, with the generation
    /// of their active-list entry: the next reclaim round zaps them first
    /// (`policy.rs`, "new pages prove themselves").
    fresh: Vec<(PageIdx, u32)>,
}

/// An error result: the argument checks of every concern return through it.
fn bad<T>(e: Errno) -> Result<T, Errno> {
    Err(e)
}

/// Queries (see "Methods by kind" in `core.rs`).
impl Core {
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }
    pub fn page_size(&self) -> u64 {
        1 << self.cfg.page_shift
    }
    pub fn regions(&self) -> &RegionTree {
        &self.regions
    }
    /// `(addr, len)` of every locked region: where a page that maps the
    /// zero page is counted locked here but not by Linux (see
    /// `Space::stats`).
    pub fn locked_extents(&self) -> Vec<(u64, u64)> {
        self.regions
            .iter()
            .filter(|r| r.lock() != LockMode::None)
            .map(|r| {
                let a = self.addr_of(r.range().start).0;
                (a, self.addr_of(r.range().end).0 - a)
            })
            .collect()
    }
    pub fn page(&self, p: PageIdx) -> PageMeta {
        self.pages.get(p)
    }
    pub fn free_frames(&self) -> u64 {
        self.cfg.budget_pages.saturating_sub(self.pages.census().resident)
    }
    pub fn resident(&self) -> u64 {
        self.pages.census().resident
    }
    pub fn held(&self) -> &[PageRange] {
        self.zaps.held()
    }
    pub fn addr_of(&self, p: PageIdx) -> Addr {
        Addr(self.cfg.base + (p.0 << self.cfg.page_shift))
    }
    /// The page containing `a`, if it is inside the reservation.
    pub fn page_of(&self, a: Addr) -> Option<PageIdx> {
        let off = a.0.checked_sub(self.cfg.base)?;
        let p = off >> self.cfg.page_shift;
        (p < self.cfg.reserve_pages).then_some(PageIdx(p))
    }
    fn aligned(&self, a: u64) -> bool {
        a & (self.page_size() - 1) == 0
    }
    /// `len` rounded up to whole pages, as a page count (None on overflow).
    fn len_pages(&self, len: u64) -> Option<u64> {
        let ps = self.page_size();
        len.checked_add(ps - 1).map(|l| l >> self.cfg.page_shift)
    }
    /// `len` rounded up to whole pages as Linux's `PAGE_ALIGN` does it, with
    /// wrap-around (`SIZE_MAX` becomes 0).
    fn page_align_wrapping(&self, len: u64) -> u64 {
        let ps = self.page_size();
        len.wrapping_add(ps - 1) & !(ps - 1)
    }
    /// The part of `[addr, addr+pages)` inside the reservation, as page indices.
    fn clip(&self, addr: u64, pages: u64) -> PageRange {
        let lo = addr.max(self.cfg.base);
        let top = self.cfg.base + (self.cfg.reserve_pages << self.cfg.page_shift);
        let end = addr.saturating_add(pages << self.cfg.page_shift).min(top);
        if lo >= end {
            return PageRange::new(0, 0);
        }
        PageRange::new((lo - self.cfg.base) >> self.cfg.page_shift, (end - self.cfg.base) >> self.cfg.page_shift)
    }
    fn in_reservation(&self, addr: u64, pages: u64) -> bool {
        let top = self.cfg.base + (self.cfg.reserve_pages << self.cfg.page_shift);
        addr >= self.cfg.base && self.range_end(addr, pages).is_some_and(|e| e <= top)
    }
}

/// Configuration (see "Methods by kind" in `core.rs`).
impl Core {
    pub fn new(cfg: CoreConfig) -> Core {
        assert!(cfg.page_shift >= 12 && cfg.page_shift <= 21);
        assert_eq!(cfg.base & ((1 << cfg.page_shift) - 1), 0, "base aligned");
        Core {
            pages: PageTable::new(cfg.reserve_pages),
            swap: SwapSpace::new(cfg.swap_slots),
            staging: SlotAllocator::new(cfg.staging_slots),
            cfg,
            regions: RegionTree::default(),
            zaps: Zaps::default(),
            lru: Lru::default(),
            pressure: Pressure::default(),
            locks: Locks::default(),
            options: Options::default(),
            files: FileTable::default(),
            counters: Counters::default(),
            fresh: Vec::new(),
        }
    }

    /// Anonymous private regions are backed so that a parked page stays
    /// where it is and its next touch is the host's minor fault, seen by a
    /// reference scan, not by usermm ([`Transfer::Zap`]; docs/design.md,
    /// "Budget, LRU and reclaim": measured slower than faults alone, so no
    /// executor sets it). Set before the first region is mapped.
    pub fn set_sampled_refs(&mut self, on: bool) {
        self.options.set_sampled_refs(on);
    }

    /// The executor can have the host discard clean lazily freed pages.
    pub fn set_host_lazyfree(&mut self, on: bool) {
        self.options.set_host_lazyfree(on);
    }

    /// `UMM_F_PURGE_VOLATILE_FIRST`: reclaim takes the pages that were
    /// resident when marked volatile before any other page, oldest mark
    /// first, whatever their recency (SPEC §3's "a space option may purge
    /// volatile pages first").
    pub fn set_purge_volatile_first(&mut self, on: bool) {
        self.options.set_purge_volatile_first(on);
    }
}

impl Core {
    /// Whether the pages of `reg` are sampled by zap and scan
    /// ([`Core::set_sampled_refs`]).
    pub(crate) fn sampled(&self, reg: &Region) -> bool {
        self.options.sampled_refs() && reg.kind() == Kind::AnonPrivate
    }

    /// How a page of `reg` is parked: zapped where it is in a sampled
    /// region, else as [`transfer_for`] its protection says.
    pub(crate) fn transfer_of(&self, reg: &Region) -> Transfer {
        self.transfer_by(reg.kind(), reg.prot())
    }

    /// [`Core::transfer_of`] a region of kind `kind` and protection `prot`.
    pub(crate) fn transfer_by(&self, kind: Kind, prot: i32) -> Transfer {
        if self.options.sampled_refs() && kind == Kind::AnonPrivate {
            Transfer::Zap
        } else {
            transfer_for(prot)
        }
    }

    /// Whether page `p` is parked by [`Transfer::Zap`] (or would be).
    pub(crate) fn zapped_at(&self, p: PageIdx) -> bool {
        // (Every eviction asks: no region lookup unless sampling is on.)
        self.options.sampled_refs() && self.regions.find(p).is_some_and(|r| self.sampled(r))
    }
}

/// How a page of a region with protection `prot` leaves for staging (see
/// [`Transfer`]); both faults (a reactivation maps it back the same way) and
/// reclaim ask.
fn transfer_for(prot: i32) -> Transfer {
    if prot == PROT_READ | PROT_WRITE {
        Transfer::Move
    } else {
        Transfer::Copy { readable: prot & PROT_READ != 0 }
    }
}
