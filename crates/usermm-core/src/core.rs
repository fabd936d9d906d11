//! The space's state machine: every decision, no action.
//!
//! See the crate documentation for the plan / act / done protocol. Fault
//! model: the executor may fail any action (I/O error, `EAGAIN`, a lost
//! race); every `*_done` call takes `ok` and leaves the state consistent
//! either way — a failed fill leaves the page where its data was, a failed
//! eviction keeps the page resident, a failed zap is impossible by
//! construction (it only drops).

use crate::consts::*;
use crate::errno::Errno;
use crate::lru::Lru;
use crate::page::{pf, PState, PageMeta, PageTable};
use crate::region::{Advice, Kind, LockMode, Region, RegionTree, FILE_OBJECT};
use crate::slots::SlotAllocator;
use crate::types::{Addr, PageIdx, PageRange};

/// The highest user address on x86-64 with 4-level paging (Linux TASK_SIZE).
pub const TASK_SIZE: u64 = 0x7fff_ffff_f000;

/// Largest fault-around window, in pages.
pub const MAX_WINDOW_PAGES: u64 = 256;
/// Swap-in cluster for `MADV_NORMAL` regions, in pages.
pub const SWAP_CLUSTER_PAGES: u64 = 32;
/// Fault-around block for dense access in large regions, in pages.
pub const BLOCK_PAGES: u64 = 64;
/// Linux's `fault_around_bytes` (default 64 KiB): the aligned window a read
/// fault in a file mapping maps, and so locks in a lock-on-fault region.
pub const FAULT_AROUND_BYTES: u64 = 64 << 10;
/// Regions at least this large (pages) get block fault-around on dense access.
pub const BLOCK_MIN_REGION_PAGES: u64 = 8192;

/// Spare metadata buffers the executor allocates outside the core lock and
/// hands over with [`Core::add_spares`].
#[derive(Default)]
pub struct Spares {
    pub leaves: Vec<crate::page::Leaf>,
    pub active: Vec<crate::lru::Chunk<(PageIdx, u16)>>,
    pub inactive: Vec<crate::lru::Chunk<(PageIdx, u16)>>,
}

impl Spares {
    /// Allocates `(leaves, active chunks, inactive chunks)` buffers.
    pub fn alloc((leaves, active, inactive): (usize, usize, usize)) -> Spares {
        Spares {
            leaves: (0..leaves).map(|_| PageTable::new_leaf()).collect(),
            active: (0..active).map(|_| crate::lru::Fifo::alloc_chunk()).collect(),
            inactive: (0..inactive).map(|_| crate::lru::Fifo::alloc_chunk()).collect(),
        }
    }
}

/// Below this many spare leaves (of 256) or chunks (of 8), the executor is
/// asked to refill.
const SPARES_LOW_LEAVES: usize = 192;
const SPARES_LOW_CHUNKS: usize = 4;

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
    pub writebacks: u64,
    pub lazyfree_discards: u64,
    pub volatile_purges: u64,
    /// Of `volatile_purges`, those the host kernel did (found out when the
    /// page was mapped back).
    pub host_purges: u64,
    pub evictions: u64,
    pub deactivations: u64,
    pub oom_sigbus: u64,
    pub swap_read_errors: u64,
    pub swap_write_errors: u64,
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
    pub regions: u64,
    pub counters: Counters,
}

/// How a page leaves the program's range for the staging area.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Transfer {
    /// `UFFDIO_MOVE`: atomic, zero-copy; needs a `PROT_READ|PROT_WRITE` region.
    Move,
    /// Copy then drop: safe because the region is not writable, so nothing
    /// can change the page in between. `readable` says whether the executor
    /// can read it directly or must go through `/proc/self/mem`.
    Copy { readable: bool },
}

/// What the executor must do for a fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// Nothing to install (the page is there, or the fault raced with a
    /// protection change): wake the thread so that it retries.
    Wake,
    /// The address is in no region (unmapped, or being unmapped: munmap
    /// leaves the host protection as it was): make the unmapped range
    /// around it, `gap`, `PROT_NONE` (the whole gap, so that touches leave
    /// one host VMA, not one per page) and wake the thread, which then
    /// takes SIGSEGV (never a zero page).
    Segv { gap: PageRange },
    /// A busy page: wait for the core to change, then plan again.
    Wait,
    /// No free frame: reclaim at least `want` frames, then plan again.
    Reclaim { want: u64 },
    /// Install zero pages on `run` (claimed, frames charged).
    ZeroFill { run: PageRange },
    /// Read the consecutive swap slots `slot..` into the pages of `run`
    /// (claimed, frames charged). A run longer than one page is swap-in
    /// clustering: the evictor wrote neighbours to neighbouring slots.
    SwapIn { run: PageRange, slot: u32 },
    /// Map the parked page back from staging slot `slot` (claimed). With
    /// `checked`, the slot was handed to the host to discard (a volatile
    /// page): copy it through a buffer and check that the slot still held
    /// the page afterwards; if not, the host purged it (`reactivate_lost`).
    Reactivate { page: PageIdx, slot: u32, how: Transfer, checked: bool },
    /// The page cannot be served (poisoned): raise SIGBUS.
    Sigbus,
    /// Read the file into the pages of `run` (claimed, frames charged):
    /// `file_page` is the file page of `run.start`.
    FileRead { run: PageRange, file: u32, file_page: u64 },
    /// A lazily freed page the host kernel discarded: install a zero page
    /// (its frame is still charged), as a discard reads back as zeros.
    Refill { page: PageIdx },
}

/// A file mapping's description, from the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMap {
    /// The executor's id for the open file (never 0).
    pub id: u32,
    /// Whether the descriptor is open for writing.
    pub writable: bool,
    /// The mapping's offset in the file, in pages.
    pub off_pages: u64,
}

/// One page of a shared file region to write to its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writeback {
    pub page: PageIdx,
    /// Staging slot when the page is parked (evictions), else None (the
    /// data is at the page's address).
    pub staging: Option<u32>,
    pub file: u32,
    pub file_page: u64,
    /// The page cannot differ from its file: drop it, write nothing.
    pub clean: bool,
}

/// One deactivation: move `page` to staging slot `slot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deactivate {
    pub page: PageIdx,
    pub slot: u32,
    pub how: Transfer,
    /// A volatile page: once parked, hand its slot to the host to discard
    /// under the host's own memory pressure (`MADV_FREE`).
    pub host_free: bool,
}

/// One eviction: write staging slot `staging` to swap slot `swap`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evict {
    pub page: PageIdx,
    pub staging: u32,
    pub swap: u32,
}

/// One lazily freed page to discard: ask the host to drop staging slot
/// `staging` (clean lazily freed memory is dropped at once, no I/O); if the
/// program wrote it since, the host keeps it and it is swapped to `swap`
/// instead (when there is a slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discard {
    pub page: PageIdx,
    pub staging: u32,
    pub swap: Option<u32>,
}

/// What reclaim should do now.
#[derive(Clone, Debug, Default)]
pub struct ReclaimPlan {
    pub deactivate: Vec<Deactivate>,
    pub evict: Vec<Evict>,
    /// Volatile pages to purge instead of swapping: `(page, staging slot)`.
    pub purge: Vec<(PageIdx, u32)>,
    /// Lazily freed pages to discard (or, if written since, swap).
    pub discard: Vec<Discard>,
    /// Parked pages of shared file regions to write to their files.
    pub writeback: Vec<Writeback>,
    /// Clean pages of shared file regions advised `MADV_SEQUENTIAL`, to drop
    /// where they are (`MADV_DONTNEED`): no staging, no I/O — a streaming
    /// read's pages are used once (the kernel drops them behind the stream
    /// too), and the next touch reads the file again.
    pub drop: Vec<PageIdx>,
}

impl ReclaimPlan {
    pub fn is_empty(&self) -> bool {
        self.deactivate.is_empty()
            && self.evict.is_empty()
            && self.purge.is_empty()
            && self.discard.is_empty()
            && self.writeback.is_empty()
            && self.drop.is_empty()
    }
}

/// What `mnovolatile` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoVolatile {
    /// Purged pages, in address order.
    pub purged: Vec<PageIdx>,
    /// Parked volatile pages whose slots the host may discard: nothing was
    /// changed; the executor maps these back (a checked reactivation, which
    /// finds out whether the host purged them) and calls again.
    pub reactivate: Vec<PageIdx>,
}

/// A range detached by `munmap` (or replaced by `MAP_FIXED`): held back from
/// reuse until its pages are zapped and `unhold` is called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    pub ranges: Vec<PageRange>,
    /// The parts that were locked (the executor unlocks them in the host).
    pub locked: Vec<PageRange>,
    /// The parts that mapped shared files (written back before the zap).
    pub files: Vec<FileRange>,
}

/// A range of a shared file region being unmapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRange {
    pub range: PageRange,
    pub file: u32,
    /// The file page of `range.start`.
    pub file_page: u64,
}

/// Pages claimed for dropping.
#[derive(Clone, Debug, Default)]
pub struct ZapClaim {
    pub range: PageRange,
    /// Staging slots whose frames the executor must drop.
    pub staging: Vec<u32>,
    /// Whether any page in the range was in the program's range (the executor
    /// can skip the `MADV_DONTNEED` when none was).
    pub mapped: bool,
}

/// A lock decision: what changed (for the host and for undo), which parked
/// pages must be mapped back, and the call's result.
#[derive(Clone, Debug)]
pub struct LockPlan {
    /// Segments whose lock mode changed, with their old mode.
    pub changed: Vec<(PageRange, LockMode)>,
    /// Parked (inactive) pages in newly locked segments.
    pub reactivate: Vec<PageIdx>,
    pub result: Result<(), Errno>,
    /// Populate failures other than the budget are ignored (`mlockall`:
    /// Linux's `__mm_populate(.., ignore_errors)`); otherwise they fail the
    /// call with `ENOMEM` and leave the range locked, as `mlock` does.
    pub populate_best_effort: bool,
    /// `mlock2(.., 0)`: every segment of the range (in address order) to
    /// populate, whether its lock changed or not: Linux's `__mm_populate`
    /// walks the whole range, so an already locked `PROT_NONE` region fails
    /// the call too. Empty: populate the changed segments.
    pub populate: Vec<PageRange>,
}

impl Default for LockPlan {
    fn default() -> LockPlan {
        LockPlan {
            changed: Vec::new(),
            reactivate: Vec::new(),
            result: Ok(()),
            populate_best_effort: false,
            populate: Vec::new(),
        }
    }
}

/// The result of a successful `mmap` decision.
#[derive(Clone, Debug)]
pub struct MmapPlan {
    pub range: PageRange,
    pub prot: i32,
    /// Regions replaced by `MAP_FIXED`: zap them before the call returns.
    pub replaced: Option<Detached>,
}

/// One step of a `madvise` plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdviceOp {
    /// Drop the pages (private anonymous memory).
    Zap(PageRange),
    /// Move the resident pages to the inactive list.
    Cold(PageRange),
    /// Reclaim the pages now.
    Pageout(PageRange),
    /// Start reading the swapped pages in.
    WillNeed(PageRange),
    /// Drop the pages and poison them (MADV_HWPOISON, a test hook).
    Poison(PageRange),
    /// Lazily free the pages (MADV_FREE).
    Free(PageRange),
    /// Write the pages back to their file, then drop them (DONTNEED on a
    /// shared file region: the file keeps the data, a touch re-reads it).
    WritebackZap(PageRange),
    /// Free the file's blocks under the pages (`fallocate(PUNCH_HOLE)`),
    /// then drop the pages without write-back (MADV_REMOVE on a shared file
    /// region: it reads back as zeros).
    PunchZap { range: PageRange, file: u32, file_page: u64 },
    /// Pass the advice down to the host kernel on the range (MADV_DONTDUMP,
    /// MADV_DODUMP, MADV_GUARD_INSTALL after a zap, MADV_GUARD_REMOVE).
    Host(PageRange, i32),
}

/// The reply to `mmap`: either a plan, or "wait for a zap in progress".
#[derive(Clone, Debug)]
pub enum MmapReply {
    Done(MmapPlan),
    /// `MAP_FIXED` over a range still being unmapped: wait and call again.
    WaitUnmapping,
}

pub struct Core {
    cfg: CoreConfig,
    regions: RegionTree,
    /// Ranges detached by munmap whose pages are still being zapped.
    held: Vec<PageRange>,
    /// Chunks being zapped (between `zap_begin` and `zap_end`): a fault or
    /// populate step in one waits, so that no page is filled while the
    /// host drops the chunk's pages (the fill would be dropped with them, or
    /// an old swapped page brought back after the call).
    /// Invariant: every page of a chunk is settled or `Zapping`.
    zapping: Vec<PageRange>,
    pages: PageTable,
    lru: Lru,
    swap: SlotAllocator,
    staging: SlotAllocator,
    /// Invariant: the number of pages whose state holds a frame.
    resident: u64,
    resident_max: u64,
    /// Invariant: the number of `Inactive` pages.
    inactive: u64,
    /// Invariant: the number of `Swapped` pages.
    swapped: u64,
    /// Pages charged to the lock limit (VmLck).
    locked_charged: u64,
    /// Invariant: the number of pages with the `LOCKED` flag (resident in a
    /// locked region).
    locked_pages: u64,
    /// Invariant: the number of pages with the `VOLATILE` flag.
    volatile_pages: u64,
    /// Invariant: the number of pages with the `LAZYFREE` flag.
    lazyfree_pages: u64,
    /// Whether the executor passes MADV_FREE down to the host and can have
    /// the host discard clean lazily freed pages (`set_host_lazyfree`).
    host_lazyfree: bool,
    /// Reclaim purges volatile pages before anything else
    /// (`set_purge_volatile_first`).
    purge_volatile_first: bool,
    /// Most lazily freed pages kept (`set_lazyfree_max`).
    lazyfree_max: u64,
    /// Write-back errors not reported yet: `(file, errno)`.
    file_errors: Vec<(u32, Errno)>,
    /// Invariant: pages of live regions mapping each file (splits and merges
    /// do not change it; mmap adds, detach subtracts).
    file_pages: std::collections::HashMap<u32, u64>,
    /// `mlockall(MCL_FUTURE)` flags in force.
    lock_future: Option<LockMode>,
    next_object: u64,
    counters: Counters,
}

fn bad<T>(e: Errno) -> Result<T, Errno> {
    Err(e)
}

impl Core {
    pub fn new(cfg: CoreConfig) -> Core {
        assert!(cfg.page_shift >= 12 && cfg.page_shift <= 21);
        assert_eq!(cfg.base & ((1 << cfg.page_shift) - 1), 0, "base aligned");
        Core {
            pages: PageTable::new(cfg.reserve_pages),
            swap: SlotAllocator::new(cfg.swap_slots),
            staging: SlotAllocator::new(cfg.staging_slots),
            cfg,
            regions: RegionTree::default(),
            held: Vec::new(),
            zapping: Vec::new(),
            lru: Lru::default(),
            resident: 0,
            resident_max: 0,
            inactive: 0,
            swapped: 0,
            locked_charged: 0,
            locked_pages: 0,
            volatile_pages: 0,
            lazyfree_pages: 0,
            host_lazyfree: false,
            purge_volatile_first: false,
            lazyfree_max: u64::MAX,
            file_errors: Vec::new(),
            file_pages: std::collections::HashMap::new(),
            lock_future: None,
            next_object: 1,
            counters: Counters::default(),
        }
    }

    /// The executor can have the host discard clean lazily freed pages.
    pub fn set_host_lazyfree(&mut self, on: bool) {
        self.host_lazyfree = on;
    }

    /// `UMM_F_PURGE_VOLATILE_FIRST`: reclaim takes the pages that were
    /// resident when marked volatile before any other page, oldest mark
    /// first, whatever their recency (SPEC §3's "a space option may purge
    /// volatile pages first").
    pub fn set_purge_volatile_first(&mut self, on: bool) {
        self.purge_volatile_first = on;
    }

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
            .filter(|r| r.lock != LockMode::None)
            .map(|r| {
                let a = self.addr_of(r.range.start).0;
                (a, self.addr_of(r.range.end).0 - a)
            })
            .collect()
    }
    pub fn page(&self, p: PageIdx) -> PageMeta {
        self.pages.get(p)
    }
    pub fn free_frames(&self) -> u64 {
        self.cfg.budget_pages.saturating_sub(self.resident)
    }
    pub fn resident(&self) -> u64 {
        self.resident
    }
    pub fn held(&self) -> &[PageRange] {
        &self.held
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
        addr >= self.cfg.base
            && pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)).is_some_and(|e| e <= top)
    }

    // ------------------------------------------------------------------
    // mmap / munmap / mprotect

    /// Decides an anonymous `mmap`. `anon` is false for a file mapping, which
    /// the executor has validated (the descriptor) before calling.
    pub fn mmap(&mut self, addr: u64, len: u64, prot: i32, flags: i32) -> Result<MmapReply, Errno> {
        self.mmap_in(addr, len, prot, flags, None)
    }

    /// Decides a file `mmap`: the executor has checked the descriptor (EBADF,
    /// ENODEV, EACCES for a descriptor not open for reading) and gives the
    /// file's id, whether it is open for writing, and the offset in pages.
    pub fn mmap_file(&mut self, addr: u64, len: u64, prot: i32, flags: i32, file: FileMap) -> Result<MmapReply, Errno> {
        self.mmap_in(addr, len, prot, flags & !MAP_ANONYMOUS, Some(file))
    }

    fn mmap_in(
        &mut self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<FileMap>,
    ) -> Result<MmapReply, Errno> {
        // Linux's order (do_mmap): the length, the offset, the address
        // (alignment, MAP_FIXED_NOREPLACE overlap), the lock limit, and only
        // then the mapping type and the file's checks.
        if len == 0 {
            return bad(Errno::EINVAL);
        }
        if flags & MAP_HUGETLB != 0 {
            return bad(Errno::EINVAL);
        }
        let pages = self.len_pages(len).ok_or(Errno::ENOMEM)?;
        if pages == 0 {
            return bad(Errno::ENOMEM);
        }
        if let Some(f) = &file {
            if f.off_pages.checked_add(pages).is_none() {
                return bad(Errno::EOVERFLOW);
            }
        }
        let fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
        // Linux (`__get_unmapped_area`): a length past TASK_SIZE, or with
        // MAP_FIXED a range ending past it, is ENOMEM, before the address's
        // alignment is looked at.
        let bytes = pages << self.cfg.page_shift;
        if bytes > TASK_SIZE || fixed && addr > TASK_SIZE - bytes {
            return bad(Errno::ENOMEM);
        }
        let fixed_range = if fixed {
            if !self.aligned(addr) {
                return bad(Errno::EINVAL);
            }
            if !self.in_reservation(addr, pages) {
                return bad(Errno::EINVAL);
            }
            let r = self.clip(addr, pages);
            if flags & MAP_FIXED_NOREPLACE != 0 && (self.regions.any_in(r) || self.held.iter().any(|h| h.overlaps(&r)))
            {
                return bad(Errno::EEXIST);
            }
            Some(r)
        } else {
            None
        };
        let lock = if flags & UMM_MAP_LOCKONFAULT != 0 {
            LockMode::OnFault
        } else if flags & MAP_LOCKED != 0 {
            // Under mlockall(MCL_FUTURE | MCL_ONFAULT), MAP_LOCKED adds
            // VM_LOCKED to the default VM_LOCKED | VM_LOCKONFAULT: still
            // lock-on-fault (Linux).
            if self.lock_future == Some(LockMode::OnFault) {
                LockMode::OnFault
            } else {
                LockMode::Locked
            }
        } else {
            self.lock_future.unwrap_or(LockMode::None)
        };
        if lock != LockMode::None {
            if !self.cfg.mlock_allowed {
                return bad(Errno::EPERM);
            }
            if self.locked_charged.saturating_add(pages) > self.cfg.memlock_pages {
                return bad(Errno::EAGAIN);
            }
        }
        let shared = match flags & MAP_TYPE {
            MAP_SHARED => true,
            MAP_PRIVATE => false,
            MAP_SHARED_VALIDATE => {
                // Linux validates flags only for file mappings; an anonymous
                // MAP_SHARED_VALIDATE is EINVAL whatever the flags.
                if flags & MAP_ANONYMOUS != 0 {
                    return bad(Errno::EINVAL);
                }
                if flags & !(LEGACY_MAP_MASK | MAP_FIXED_NOREPLACE | UMM_MAP_LOCKONFAULT | MAP_SHARED_VALIDATE) != 0 {
                    return bad(Errno::EOPNOTSUPP);
                }
                true
            }
            _ => return bad(Errno::EINVAL),
        };
        if flags & MAP_ANONYMOUS == 0 && file.is_none() {
            // The executor maps files through `mmap_file`.
            return bad(Errno::ENODEV);
        }
        if let Some(f) = &file {
            // Linux: a shared writable mapping needs a descriptor open for
            // writing.
            if shared && prot & PROT_WRITE != 0 && !f.writable {
                return bad(Errno::EACCES);
            }
        }
        let start = if let Some(r) = fixed_range {
            if self.held.iter().any(|h| h.overlaps(&r)) {
                return Ok(MmapReply::WaitUnmapping);
            }
            r.start.0
        } else {
            let ps = self.page_size();
            // x86-64 Linux rounds an unaligned hint down.
            let hint = addr & !(ps - 1);
            let hinted = (hint != 0 && self.in_reservation(hint, pages)).then(|| self.clip(hint, pages));
            match hinted {
                Some(r) if !self.regions.any_in(r) && !self.held.iter().any(|h| h.overlaps(&r)) => r.start.0,
                _ => self.regions.find_gap(pages, 0, self.cfg.reserve_pages, &self.held).ok_or(Errno::ENOMEM)?,
            }
        };
        let range = PageRange::new(start, start + pages);
        // Region count: the new region, plus splits of regions it cuts.
        let mut new_count = self.regions.len() + 1;
        let cut = self.regions.overlapping(range);
        new_count -= cut.len();
        new_count += self.regions.split_cost(range.start) + self.regions.split_cost(range.end);
        let would_merge = self.merge_neighbours(range, prot, shared || file.is_some(), lock, flags);
        if new_count - would_merge > self.cfg.max_regions {
            return bad(Errno::ENOMEM);
        }
        let replaced = if cut.is_empty() { None } else { Some(self.detach(range)) };
        let object = match &file {
            Some(f) => FILE_OBJECT | f.id as u64,
            None if shared => {
                let o = self.next_object;
                self.next_object += 1;
                o
            }
            None => 0,
        };
        if lock != LockMode::None {
            self.locked_charged += pages;
        }
        if let Some(f) = &file {
            *self.file_pages.entry(f.id).or_insert(0) += pages;
        }
        self.regions.insert(Region {
            range,
            prot: prot & PROT_MASK,
            kind: match (&file, shared) {
                (Some(_), true) => Kind::FileShared,
                (Some(_), false) => Kind::FilePrivate,
                (None, true) => Kind::AnonShared,
                (None, false) => Kind::AnonPrivate,
            },
            advice: Advice::Normal,
            noreserve: flags & MAP_NORESERVE != 0,
            lock,
            object,
            pgoff: file.as_ref().map_or(0, |f| f.off_pages),
            next_fault: u64::MAX,
            streak: 0,
            may_write: file.as_ref().is_none_or(|f| f.writable || !shared),
        });
        self.regions.merge_around(range);
        // A MAP_FIXED replacement's pages must be gone before the new region
        // is seen; the executor zaps `replaced` under the exclusive lock. The
        // range is held until then so that faults in it wait.
        Ok(MmapReply::Done(MmapPlan { range, prot: prot & PROT_MASK, replaced }))
    }

    /// How many neighbours (0..=2) a new region would merge with.
    fn merge_neighbours(&self, range: PageRange, prot: i32, shared: bool, lock: LockMode, flags: i32) -> usize {
        if shared {
            return 0;
        }
        let probe = Region {
            range,
            prot: prot & PROT_MASK,
            kind: Kind::AnonPrivate,
            advice: Advice::Normal,
            noreserve: flags & MAP_NORESERVE != 0,
            lock,
            object: 0,
            pgoff: 0,
            next_fault: 0,
            streak: 0,
            may_write: true,
        };
        let mut n = 0;
        if range.start.0 > 0 {
            if let Some(prev) = self.regions.find(PageIdx(range.start.0 - 1)) {
                if prev.range.end == range.start && prev.can_merge(&probe) {
                    n += 1;
                }
            }
        }
        if let Some(next) = self.regions.find(range.end) {
            if probe.can_merge(next) {
                n += 1;
            }
        }
        n
    }

    /// Splits at the boundaries of `r`, removes the regions inside, holds the
    /// parts that had regions, and uncharges their locks. O(regions + log n):
    /// no page is touched (seed 003).
    fn detach(&mut self, r: PageRange) -> Detached {
        self.regions.split_at(r.start);
        self.regions.split_at(r.end);
        let removed = self.regions.remove_range(r);
        let mut ranges: Vec<PageRange> = Vec::new();
        let mut locked = Vec::new();
        let mut files = Vec::new();
        for reg in &removed {
            if reg.lock != LockMode::None {
                self.locked_charged -= reg.range.pages();
                locked.push(reg.range);
            }
            if reg.kind == Kind::FileShared {
                files.push(FileRange { range: reg.range, file: reg.file().expect("file"), file_page: reg.pgoff });
            }
            if let Some(f) = reg.file() {
                let n = self.file_pages.entry(f).or_insert(0);
                *n -= reg.range.pages();
                if *n == 0 {
                    self.file_pages.remove(&f);
                }
            }
            match ranges.last_mut() {
                Some(last) if last.end == reg.range.start => last.end = reg.range.end,
                _ => ranges.push(reg.range),
            }
        }
        self.held.extend(ranges.iter().copied());
        Detached { ranges, locked, files }
    }

    /// Phase 1 of `munmap`, under the exclusive lock: validate and detach.
    /// Returns `None` when nothing was mapped there.
    pub fn munmap(&mut self, addr: u64, len: u64) -> Result<Option<Detached>, Errno> {
        if !self.aligned(addr) || addr > TASK_SIZE || len > TASK_SIZE - addr {
            return bad(Errno::EINVAL);
        }
        let pages = self.len_pages(len).ok_or(Errno::EINVAL)?;
        if pages == 0 {
            return bad(Errno::EINVAL);
        }
        if !self.in_reservation(addr, pages) {
            return bad(Errno::EINVAL);
        }
        let r = self.clip(addr, pages);
        if !self.regions.any_in(r) {
            return Ok(None);
        }
        // Unmapping the middle of a region adds one region (Linux checks the
        // limit before splitting).
        if let Some(reg) = self.regions.find(r.start) {
            if reg.range.start < r.start && r.end < reg.range.end && self.regions.len() >= self.cfg.max_regions {
                return bad(Errno::ENOMEM);
            }
        }
        Ok(Some(self.detach(r)))
    }

    /// The last phase of `munmap`: the range may be reused.
    pub fn unhold(&mut self, d: &Detached) {
        for r in &d.ranges {
            let i = self.held.iter().position(|h| h == r).expect("held range");
            self.held.swap_remove(i);
        }
    }

    /// Decides `mprotect`. Returns the segments to apply (in order) and the
    /// call's result; on error the segments before the failure are applied,
    /// as Linux does.
    pub fn mprotect(&mut self, addr: u64, len: u64, prot: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        const PROT_SEM: i32 = 0x8;
        const PROT_GROWSDOWN: i32 = 0x0100_0000;
        const PROT_GROWSUP: i32 = 0x0200_0000;
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        if len == 0 {
            return (vec![], Ok(()));
        }
        let Some(pages) = self.len_pages(len).filter(|p| *p > 0) else {
            return (vec![], bad(Errno::ENOMEM));
        };
        if pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)).is_none() {
            return (vec![], bad(Errno::ENOMEM));
        }
        if prot & !(PROT_MASK | PROT_SEM | PROT_GROWSDOWN | PROT_GROWSUP) != 0
            || prot & (PROT_GROWSDOWN | PROT_GROWSUP) == PROT_GROWSDOWN | PROT_GROWSUP
        {
            return (vec![], bad(Errno::EINVAL));
        }
        if prot & (PROT_GROWSDOWN | PROT_GROWSUP) != 0 {
            // No region grows: Linux finds the first mapping in the range
            // (none: ENOMEM), then refuses it for not growing (EINVAL).
            let r = self.clip(addr, pages);
            let any = !r.is_empty() && self.regions.any_in(r);
            return (vec![], bad(if any { Errno::EINVAL } else { Errno::ENOMEM }));
        }
        let prot = prot & PROT_MASK;
        if !self.in_reservation(addr, pages) {
            // Partly outside: Linux applies the mapped prefix; the reservation
            // edge is a hole.
            let r = self.clip(addr, pages);
            if r.is_empty() || self.addr_of(r.start).0 != addr {
                return (vec![], bad(Errno::ENOMEM));
            }
            let (v, _) = self.mprotect_range(r, prot);
            return (v, bad(Errno::ENOMEM));
        }
        let r = self.clip(addr, pages);
        self.mprotect_range(r, prot)
    }

    fn mprotect_range(&mut self, r: PageRange, prot: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        let segs = self.regions.overlapping(r);
        let mut applied = Vec::new();
        let mut at = r.start;
        for reg in segs {
            if reg.range.start > at {
                break;
            }
            let seg = reg.range.intersect(&r);
            if prot & PROT_WRITE != 0 && !reg.may_write {
                // Linux: PROT_WRITE on a shared mapping of a descriptor not
                // open for writing (the parts before were changed).
                self.regions.merge_around(r);
                return (applied, bad(Errno::EACCES));
            }
            if reg.prot != prot {
                // Split, change and merge first, then check the count: a
                // change that merges into a neighbour only moves a boundary
                // (Linux succeeds at the limit then). Undo if over.
                self.regions.split_at(seg.start);
                self.regions.split_at(seg.end);
                self.regions.find_mut(seg.start).expect("split").prot = prot;
                if prot & PROT_WRITE != 0 {
                    for (p, m) in self.pages.live_in(seg) {
                        if m.state.holds_frame() {
                            self.pages.update(p, |m| m.flags |= pf::MAYBE_DIRTY);
                        }
                    }
                }
                self.regions.merge_around(seg);
                if self.regions.len() > self.cfg.max_regions {
                    self.regions.split_at(seg.start);
                    self.regions.split_at(seg.end);
                    self.regions.find_mut(seg.start).expect("split").prot = reg.prot;
                    self.regions.merge_around(r);
                    return (applied, bad(Errno::ENOMEM));
                }
                applied.push(seg);
            }
            at = seg.end;
            if at >= r.end {
                break;
            }
        }
        self.regions.merge_around(r);
        if at < r.end {
            return (applied, bad(Errno::ENOMEM));
        }
        (applied, Ok(()))
    }

    // ------------------------------------------------------------------
    // Locks (seed 000)

    /// Decides `mlock2` (`mode` Locked or OnFault) and `munlock` (`mode`
    /// None). `addr` need not be aligned: the range is widened to whole pages
    /// (Linux). Returns the plan; on error after a partial apply (a hole),
    /// `plan.result` is the error and `plan.changed` what was applied.
    pub fn lock_range(&mut self, addr: u64, len: u64, mode: LockMode) -> LockPlan {
        let mut plan = LockPlan::default();
        if mode != LockMode::None && !self.cfg.mlock_allowed {
            plan.result = bad(Errno::EPERM);
            return plan;
        }
        // Linux (do_mlock, apply_vma_lock_flags): the length is widened to
        // whole pages with wrap-around; an empty result is a no-op (0), and
        // `start + len` overflowing is EINVAL — after the limit check.
        let ps = self.page_size();
        let start = addr & !(ps - 1);
        let bytes = self.page_align_wrapping(len.wrapping_add(addr & (ps - 1)));
        let pages = bytes >> self.cfg.page_shift;
        if mode != LockMode::None && self.cfg.memlock_pages != u64::MAX {
            let r = self.clip(start, pages);
            let already: u64 = self
                .regions
                .overlapping(r)
                .iter()
                .filter(|g| g.lock != LockMode::None)
                .map(|g| g.range.intersect(&r).pages())
                .sum();
            if self.locked_charged + pages - already.min(pages) > self.cfg.memlock_pages {
                plan.result = bad(Errno::ENOMEM);
                return plan;
            }
        }
        let Some(end) = start.checked_add(bytes) else {
            plan.result = bad(Errno::EINVAL);
            return plan;
        };
        if end == start {
            return plan;
        }
        if !self.in_reservation(start, pages) && self.page_of(Addr(start)).is_none() {
            plan.result = bad(Errno::ENOMEM);
            return plan;
        }
        let r = self.clip(start, pages);
        if mode != LockMode::None && self.any_volatile(r) {
            plan.result = bad(Errno::EINVAL);
            return plan;
        }
        let mut at = r.start;
        let mut hole = !self.in_reservation(start, pages);
        for reg in self.regions.overlapping(r) {
            if reg.range.start > at {
                hole = true;
                break;
            }
            let seg = reg.range.intersect(&r);
            at = seg.end;
            if mode == LockMode::Locked {
                plan.populate.push(seg);
            }
            if reg.lock == mode {
                continue;
            }
            let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
            if self.regions.len() + cost > self.cfg.max_regions {
                hole = true;
                break;
            }
            self.set_lock(seg, mode, &mut plan);
            plan.changed.push((seg, reg.lock));
        }
        if at < r.end {
            hole = true;
        }
        self.regions.merge_around(r);
        if hole {
            plan.result = bad(Errno::ENOMEM);
        }
        plan
    }

    /// Sets the lock mode of `seg` (inside one region) and its pages.
    fn set_lock(&mut self, seg: PageRange, mode: LockMode, plan: &mut LockPlan) {
        self.regions.split_at(seg.start);
        self.regions.split_at(seg.end);
        let reg = self.regions.find_mut(seg.start).expect("split");
        let old = reg.lock;
        reg.lock = mode;
        match (old == LockMode::None, mode == LockMode::None) {
            (true, false) => self.locked_charged += seg.pages(),
            (false, true) => self.locked_charged -= seg.pages(),
            _ => {}
        }
        for (p, m) in self.pages.live_in(seg) {
            if mode == LockMode::None {
                if m.has(pf::LOCKED) {
                    self.pages.update(p, |m| m.flags &= !pf::LOCKED);
                    self.locked_pages -= 1;
                    if m.state == PState::Resident {
                        self.push_active(p);
                    }
                }
            } else if m.state == PState::Resident && !m.has(pf::LOCKED) {
                self.pages.update(p, |m| m.flags |= pf::LOCKED);
                self.locked_pages += 1;
            } else if m.state == PState::Inactive {
                // Parked pages are resident: they must come back and be
                // locked now (the executor maps them back).
                plan.reactivate.push(p);
            }
        }
    }

    /// Undoes a lock plan's changes (the host refused, or the budget could
    /// not hold a full lock).
    pub fn lock_revert(&mut self, plan: &LockPlan) {
        let mut scratch = LockPlan::default();
        for &(seg, old) in plan.changed.iter().rev() {
            let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
            if self.regions.len() + cost > self.cfg.max_regions + 2 {
                continue;
            }
            self.set_lock(seg, old, &mut scratch);
            self.regions.merge_around(seg);
        }
    }

    /// Decides `mlockall`: returns the plan for `MCL_CURRENT`'s changes.
    pub fn mlockall(&mut self, flags: i32) -> LockPlan {
        let mut plan = LockPlan { populate_best_effort: true, ..LockPlan::default() };
        if flags == 0 || flags & !(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0 || flags == MCL_ONFAULT {
            plan.result = bad(Errno::EINVAL);
            return plan;
        }
        if !self.cfg.mlock_allowed {
            plan.result = bad(Errno::EPERM);
            return plan;
        }
        let mode = if flags & MCL_ONFAULT != 0 { LockMode::OnFault } else { LockMode::Locked };
        if flags & MCL_CURRENT != 0 {
            let total: u64 = self.regions.iter().map(|r| r.range.pages()).sum();
            if self.cfg.memlock_pages != u64::MAX && total > self.cfg.memlock_pages {
                plan.result = bad(Errno::ENOMEM);
                return plan;
            }
        }
        self.lock_future = (flags & MCL_FUTURE != 0).then_some(mode);
        if flags & MCL_CURRENT != 0 {
            let regs: Vec<Region> = self.regions.iter().cloned().collect();
            for reg in regs {
                if reg.lock != mode {
                    self.set_lock(reg.range, mode, &mut plan);
                    plan.changed.push((reg.range, reg.lock));
                }
            }
            self.regions.merge_around(PageRange::new(0, self.cfg.reserve_pages));
        }
        plan
    }

    /// Decides `munlockall`: every region unlocked, the future flag cleared.
    pub fn munlockall(&mut self) -> LockPlan {
        let mut plan = LockPlan::default();
        self.lock_future = None;
        let regs: Vec<Region> = self.regions.iter().cloned().collect();
        for reg in regs {
            if reg.lock != LockMode::None {
                self.set_lock(reg.range, LockMode::None, &mut plan);
                plan.changed.push((reg.range, reg.lock));
            }
        }
        self.regions.merge_around(PageRange::new(0, self.cfg.reserve_pages));
        plan
    }

    /// Pages a full lock of `segs` would need resident at once, and whether
    /// the budget can hold them (the locked pages elsewhere stay).
    pub fn lock_fits(&self, segs: &[PageRange]) -> bool {
        let mut need = 0;
        for s in segs {
            let mut resident_locked = 0;
            self.pages.for_each_live(*s, |_, m| {
                if m.has(pf::LOCKED) {
                    resident_locked += 1;
                }
            });
            need += s.pages() - resident_locked;
        }
        self.locked_pages + need <= self.cfg.budget_pages
    }

    /// The region containing `p` (for the executor's lock population).
    pub fn region_at(&self, p: PageIdx) -> Option<&Region> {
        self.regions.find(p)
    }

    // ------------------------------------------------------------------
    // madvise

    /// Decides `madvise`. Attribute advice (NORMAL/RANDOM/SEQUENTIAL) is
    /// applied to the regions here (the executor holds the exclusive lock for
    /// it); page advice comes back as ops for the executor, in address order.
    /// On error, the ops before the failing region still apply (Linux).
    pub fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> (Vec<AdviceOp>, Result<(), Errno>) {
        match advice {
            MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL | MADV_WILLNEED | MADV_DONTNEED | MADV_COLD | MADV_PAGEOUT
            | MADV_HWPOISON | MADV_FREE => {}
            // Advice Linux knows whose effect usermm does not need: fork
            // (the reservation is always MADV_DONTFORK), KSM, THP (usermm
            // installs 4 KiB pages), core dumps. Accepted, no effect.
            MADV_DONTFORK | MADV_DOFORK | MADV_MERGEABLE | MADV_UNMERGEABLE | MADV_HUGEPAGE | MADV_NOHUGEPAGE
            | MADV_WIPEONFORK | MADV_KEEPONFORK => {}
            // Passed down to the host (a secret kept in a space stays out
            // of core dumps), freeing the backing, and guard pages.
            MADV_DONTDUMP | MADV_DODUMP | MADV_REMOVE | MADV_GUARD_INSTALL | MADV_GUARD_REMOVE => {}
            _ => return (vec![], bad(Errno::EINVAL)),
        }
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        let Some(pages) = self.len_pages(len) else {
            return (vec![], bad(Errno::EINVAL));
        };
        if len != 0 && pages == 0 {
            return (vec![], bad(Errno::EINVAL));
        }
        let Some(end) = pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)) else {
            return (vec![], bad(Errno::EINVAL));
        };
        if end == addr {
            return (vec![], Ok(()));
        }
        let r = self.clip(addr, pages);
        let mut hole = !self.in_reservation(addr, pages);
        let segs = self.regions.overlapping(r);
        if segs.is_empty() {
            return (vec![], bad(Errno::ENOMEM));
        }
        let mut ops = Vec::new();
        let mut at = r.start;
        for reg in segs {
            if reg.range.start > at {
                hole = true;
            }
            let seg = reg.range.intersect(&r);
            at = seg.end;
            let locked = reg.lock != LockMode::None;
            match advice {
                MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL => {
                    let want = match advice {
                        MADV_RANDOM => Advice::Random,
                        MADV_SEQUENTIAL => Advice::Sequential,
                        _ => Advice::Normal,
                    };
                    if reg.advice != want {
                        let cost = self.regions.split_cost(seg.start) + self.regions.split_cost(seg.end);
                        if self.regions.len() + cost > self.cfg.max_regions {
                            // Linux: a split beyond vm.max_map_count in madvise is EAGAIN.
                            self.regions.merge_around(r);
                            return (ops, bad(Errno::EAGAIN));
                        }
                        self.regions.split_at(seg.start);
                        self.regions.split_at(seg.end);
                        let reg = self.regions.find_mut(seg.start).expect("split");
                        reg.advice = want;
                        reg.streak = 0;
                    }
                }
                MADV_DONTNEED => {
                    if locked {
                        return (ops, bad(Errno::EINVAL));
                    }
                    match reg.kind {
                        Kind::AnonPrivate | Kind::FilePrivate => ops.push(AdviceOp::Zap(seg)),
                        Kind::FileShared => ops.push(AdviceOp::WritebackZap(seg)),
                        Kind::AnonShared => {}
                    }
                    // Shared anonymous memory keeps its data (shmem): the
                    // pages are only unmapped on Linux, and stay resident.
                }
                MADV_COLD => {
                    if locked {
                        return (ops, bad(Errno::EINVAL));
                    }
                    ops.push(AdviceOp::Cold(seg));
                }
                MADV_PAGEOUT => {
                    if locked {
                        return (ops, bad(Errno::EINVAL));
                    }
                    ops.push(AdviceOp::Pageout(seg));
                }
                MADV_WILLNEED => ops.push(AdviceOp::WillNeed(seg)),
                MADV_HWPOISON => ops.push(AdviceOp::Poison(seg)),
                MADV_FREE => {
                    // Linux: only anonymous private memory, never locked.
                    if reg.kind != Kind::AnonPrivate || locked {
                        return (ops, bad(Errno::EINVAL));
                    }
                    ops.push(AdviceOp::Free(seg));
                }
                MADV_WIPEONFORK if reg.kind != Kind::AnonPrivate => return (ops, bad(Errno::EINVAL)),
                MADV_DONTDUMP | MADV_DODUMP => ops.push(AdviceOp::Host(seg, advice)),
                MADV_REMOVE => {
                    // Linux (madvise_remove): locked EINVAL, no backing
                    // object EINVAL, not shared and writable EACCES.
                    if locked || reg.kind == Kind::AnonPrivate {
                        return (ops, bad(Errno::EINVAL));
                    }
                    if !matches!(reg.kind, Kind::AnonShared | Kind::FileShared) || !reg.may_write {
                        return (ops, bad(Errno::EACCES));
                    }
                    match reg.file() {
                        Some(file) => {
                            ops.push(AdviceOp::PunchZap { range: seg, file, file_page: reg.file_page(seg.start) })
                        }
                        // Shared anonymous memory is shmem: its pages and
                        // their data go.
                        None => ops.push(AdviceOp::Zap(seg)),
                    }
                }
                MADV_GUARD_INSTALL => {
                    // Guard pages on private memory (Linux 6.13; shared
                    // regions are refused here, see docs/design.md), never
                    // locked: the pages are dropped, then the host installs
                    // its markers (a touch raises SIGSEGV without reaching
                    // usermm; MADV_DONTNEED keeps them; munmap removes them).
                    if locked || !matches!(reg.kind, Kind::AnonPrivate | Kind::FilePrivate) {
                        return (ops, bad(Errno::EINVAL));
                    }
                    ops.push(AdviceOp::Zap(seg));
                    ops.push(AdviceOp::Host(seg, advice));
                }
                MADV_GUARD_REMOVE => ops.push(AdviceOp::Host(seg, advice)),
                _ => {}
            }
        }
        if matches!(advice, MADV_NORMAL | MADV_RANDOM | MADV_SEQUENTIAL) {
            self.regions.merge_around(r);
        }
        if at < r.end {
            hole = true;
        }
        (ops, if hole { bad(Errno::ENOMEM) } else { Ok(()) })
    }

    // ------------------------------------------------------------------
    // Faults

    /// Plans the resolution of a fault at `a`.
    pub fn fault(&mut self, a: Addr, write: bool) -> FaultPlan {
        self.fault_in(a, write, None)
    }

    /// Plans one step of populating `[p, end)` (MADV_POPULATE_*): like a
    /// fault at `p`, with the largest window, bounded by `end`. The caller
    /// checked the range with `populate_check`. Returns `None` when `p` is
    /// already resident and mapped.
    pub fn populate_step(&mut self, p: PageIdx, end: PageIdx, write: bool) -> Option<FaultPlan> {
        let plan = self.fault_in(self.addr_of(p), write, Some(end));
        match plan {
            FaultPlan::Wake => None,
            other => Some(other),
        }
    }

    /// Checks a `MADV_POPULATE_READ/WRITE` range: returns the segments to
    /// populate, in order, and the error to return after populating them
    /// (Linux populates up to the failing region: a hole is `ENOMEM`, a
    /// region without the needed protection `EINVAL`).
    pub fn populate_check(&self, addr: u64, len: u64, write: bool) -> (Vec<PageRange>, Result<(), Errno>) {
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        let Some(pages) = self.len_pages(len) else {
            return (vec![], bad(Errno::EINVAL));
        };
        if len != 0 && pages == 0 {
            return (vec![], bad(Errno::EINVAL));
        }
        if pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)).is_none() {
            return (vec![], bad(Errno::EINVAL));
        }
        if pages == 0 {
            return (vec![], Ok(()));
        }
        if !self.in_reservation(addr, pages) && self.page_of(Addr(addr)).is_none() {
            return (vec![], bad(Errno::ENOMEM));
        }
        let r = self.clip(addr, pages);
        let mut segs = Vec::new();
        let mut at = r.start;
        for reg in self.regions.overlapping(r) {
            if reg.range.start > at {
                return (segs, bad(Errno::ENOMEM));
            }
            let need = if write { PROT_WRITE } else { PROT_READ };
            if reg.prot & need == 0 {
                return (segs, bad(Errno::EINVAL));
            }
            let seg = reg.range.intersect(&r);
            segs.push(seg);
            at = seg.end;
        }
        if at < r.end || !self.in_reservation(addr, pages) {
            return (segs, bad(Errno::ENOMEM));
        }
        (segs, Ok(()))
    }

    /// Whether `want` more frames could ever be had: the pages that can be
    /// evicted (resident, unlocked, with swap room) plus the free frames.
    pub fn frames_obtainable(&self) -> u64 {
        let evictable = if self.swap.capacity() == 0 { 0 } else { self.resident.min(self.swap.free() as u64) };
        self.free_frames() + evictable
    }

    fn fault_in(&mut self, a: Addr, write: bool, populate: Option<PageIdx>) -> FaultPlan {
        let Some(p) = self.page_of(a) else {
            return FaultPlan::Wake;
        };
        let free = self.free_frames();
        let exact = self.cfg.exact_faults;
        let Some(reg) = self.regions.find_mut(p) else {
            // Unmapped (or being unmapped): munmap leaves the range's host
            // protection as it was, so the touch reached the handler.
            return FaultPlan::Segv { gap: self.regions.gap_around(p, self.cfg.reserve_pages) };
        };
        if populate.is_none() && (reg.prot & PROT_READ == 0 && reg.prot & PROT_WRITE == 0 || (write && !reg.writable()))
        {
            // The kernel checks protection before it reports a fault; this
            // one raced with mprotect. The retry sees the new protection.
            return FaultPlan::Wake;
        }
        // Shared anonymous memory is shmem on Linux: a fault allocates
        // exactly the touched page (no fault-around, no mTHP-like blocks).
        let exact = exact || reg.kind == Kind::AnonShared;
        let mut region = match populate {
            Some(end) => PageRange { start: reg.range.start, end: reg.range.end.min(end) },
            None => reg.range,
        };
        // A window never reaches into a chunk being zapped.
        for z in &self.zapping {
            if z.end <= p && z.end > region.start {
                region.start = z.end;
            }
            if z.start > p && z.start < region.end {
                region.end = z.start;
            }
        }
        let prot = reg.prot;
        let m = self.pages.get(p);
        if m.state.busy() || self.zapping.iter().any(|z| z.contains(p)) {
            return FaultPlan::Wait;
        }
        match m.state {
            // A fault on a page we hold as resident: either a race (it is
            // there by now) or a lazily freed page the host discarded. (A
            // populate treats it as resident: the executor asks the host to
            // populate lazily freed pages, which faults here if the host
            // dropped one.)
            PState::Resident if m.has(pf::LAZYFREE) && populate.is_none() => {
                self.pages.update(p, |m| m.state = PState::Filling);
                FaultPlan::Refill { page: p }
            }
            PState::Resident => FaultPlan::Wake,
            PState::Inactive => {
                self.pages.update(p, |m| m.state = PState::Filling);
                let checked = self.host_lazyfree && m.has(pf::VOLATILE);
                FaultPlan::Reactivate { page: p, slot: m.slot, how: transfer_for(prot), checked }
            }
            PState::Swapped => {
                if free == 0 {
                    return FaultPlan::Reclaim { want: 1 };
                }
                let window = if populate.is_some() {
                    MAX_WINDOW_PAGES
                } else if reg.advice == Advice::Random || reg.lock != LockMode::None {
                    1
                } else if reg.advice == Advice::Sequential {
                    MAX_WINDOW_PAGES
                } else {
                    SWAP_CLUSTER_PAGES
                };
                let limit = free.min(window);
                let mut run = PageRange::new(p.0, p.0 + 1);
                while run.pages() < limit && run.end < region.end {
                    let n = self.pages.get(run.end);
                    if n.state != PState::Swapped || n.slot != m.slot + run.pages() as u32 {
                        break;
                    }
                    run.end.0 += 1;
                }
                self.claim_frames(run.pages());
                for q in run.start.0..run.end.0 {
                    self.pages.update(PageIdx(q), |m| m.state = PState::Filling);
                }
                FaultPlan::SwapIn { run, slot: m.slot }
            }
            PState::Absent => {
                if m.has(pf::POISONED) || (m.has(pf::PURGED) && m.has(pf::VOLATILE)) {
                    return FaultPlan::Sigbus;
                }
                if free == 0 {
                    return FaultPlan::Reclaim { want: 1 };
                }
                // Fault-around: how many pages past (and around) `p`.
                let window = if populate.is_some() {
                    MAX_WINDOW_PAGES
                } else if exact || reg.lock != LockMode::None {
                    1
                } else {
                    match reg.advice {
                        Advice::Random => 1,
                        Advice::Sequential => MAX_WINDOW_PAGES,
                        Advice::Normal => {
                            if p.0 == reg.next_fault {
                                reg.streak = reg.streak.saturating_add(1);
                            } else {
                                reg.streak = 0;
                            }
                            if reg.streak >= 3 {
                                (BLOCK_PAGES << (reg.streak - 3).min(4)).min(MAX_WINDOW_PAGES)
                            } else {
                                1
                            }
                        }
                    }
                };
                let mut run = PageRange::new(p.0, p.0 + 1);
                let limit = free.min(window);
                while run.pages() < limit && run.end < region.end && self.pages.get(run.end) == PageMeta::default() {
                    run.end.0 += 1;
                }
                if window == 1
                    && populate.is_none()
                    && !exact
                    && reg.advice == Advice::Normal
                    && reg.lock == LockMode::None
                    && region.pages() >= BLOCK_MIN_REGION_PAGES
                {
                    // Dense access in a large region: a second fault in an
                    // aligned block fills the block (like a 64 KiB mTHP).
                    let b0 = (p.0 / BLOCK_PAGES) * BLOCK_PAGES;
                    let block = PageRange::new(b0, b0 + BLOCK_PAGES).intersect(&region);
                    let mut seen = false;
                    self.pages.for_each_live(block, |_, _| seen = true);
                    if seen {
                        grow_run(&self.pages, &mut run, block, free);
                    }
                }
                let reg = self.regions.find_mut(p).expect("region");
                if populate.is_none() && !write && reg.lock != LockMode::None && reg.file().is_some() {
                    // Linux maps (and so locks, in a VM_LOCKONFAULT vma) the
                    // whole fault-around window of a file read fault (64 KiB
                    // around the page, within the vma). That is
                    // Linux's residency, so UMM_F_EXACT_FAULTS keeps it too.
                    // do_fault_around(): the window starts at the aligned
                    // block or the region's start, whichever is later, and
                    // keeps its length up to the region's end or the page
                    // table's (512 entries).
                    let n = (FAULT_AROUND_BYTES >> self.cfg.page_shift).max(1);
                    let from = ((p.0 / n) * n).max(region.start.0);
                    let table_end = (p.0 / 512 + 1) * 512;
                    let block = PageRange::new(from, (from + n).min(table_end).min(region.end.0));
                    grow_run(&self.pages, &mut run, block, free);
                }
                if populate.is_none() {
                    reg.next_fault = run.end.0;
                }
                let file = reg.file().map(|f| (f, reg.file_page(run.start)));
                self.claim_frames(run.pages());
                for q in run.start.0..run.end.0 {
                    self.pages.update(PageIdx(q), |m| m.state = PState::Filling);
                }
                match file {
                    Some((file, file_page)) => FaultPlan::FileRead { run, file, file_page },
                    None => FaultPlan::ZeroFill { run },
                }
            }
            _ => unreachable!("busy handled above"),
        }
    }

    fn claim_frames(&mut self, n: u64) {
        self.resident += n;
        debug_assert!(self.resident <= self.cfg.budget_pages, "claim beyond budget");
        self.resident_max = self.resident_max.max(self.resident);
    }

    /// A page just became resident: lock it if its region is locked.
    fn note_resident(&mut self, p: PageIdx) {
        if self.regions.find(p).is_some_and(|r| r.writable()) {
            self.pages.update(p, |m| m.flags |= pf::MAYBE_DIRTY);
        }
        let locked = self.regions.find(p).is_some_and(|r| r.lock != LockMode::None);
        if locked {
            if !self.pages.get(p).has(pf::LOCKED) {
                self.pages.update(p, |m| m.flags |= pf::LOCKED);
                self.locked_pages += 1;
            }
        } else {
            self.push_active(p);
        }
    }

    fn push_active(&mut self, p: PageIdx) {
        let mut m = self.pages.get(p);
        m.gen = m.gen.wrapping_add(1);
        self.pages.set(p, m);
        self.lru.active.push_back((p, m.gen));
        // Zaps compact the lists (they make entries stale in bulk); a fault
        // sweeps only as a safety net, should stale entries pile up another
        // way, since a fault's commit must stay short.
        if self.lru.len() > 8 * self.resident as usize + (1 << 20) {
            self.maybe_compact(1);
        }
    }

    fn push_inactive(&mut self, p: PageIdx) {
        let mut m = self.pages.get(p);
        m.gen = m.gen.wrapping_add(1);
        self.pages.set(p, m);
        self.lru.inactive.push_back((p, m.gen));
    }

    /// The spare metadata buffers the core would take (see [`Spares`]).
    pub fn spares_wanted(&self) -> (usize, usize, usize) {
        (self.pages.spare_wanted(), self.lru.active.spare_wanted(), self.lru.inactive.spare_wanted())
    }

    /// Whether the spares ran low: a fault would soon call the allocator.
    pub fn spares_low(&self) -> bool {
        let (l, a, i) = self.spares_wanted();
        l > SPARES_LOW_LEAVES || a > SPARES_LOW_CHUNKS || i > SPARES_LOW_CHUNKS
    }

    /// Takes spare metadata buffers allocated outside the core lock: a
    /// fault's commit then never calls the allocator, whose heap growth (an
    /// `mprotect` of a thread arena) waits for the kernel's mmap lock —
    /// behind a concurrent `munmap`'s zap, for hundreds of microseconds.
    pub fn add_spares(&mut self, s: Spares) {
        self.pages.add_spare(s.leaves);
        self.lru.active.add_spare(s.active);
        self.lru.inactive.add_spare(s.inactive);
    }

    /// Drops stale LRU entries when they dominate, sweeping at most
    /// `chunks` chunks of 512 entries, so that every call stays short. A
    /// zap, which is what leaves entries stale in bulk, sweeps two chunks
    /// for every chunk's worth it zapped.
    fn maybe_compact(&mut self, chunks: usize) {
        let live = self.resident as usize;
        if self.lru.compacting == 0 && self.lru.len() > 2 * live + 4096 {
            self.lru.compacting = 1;
        }
        let pages = &self.pages;
        let lru = &mut self.lru;
        let swept = match lru.compacting {
            0 => return,
            1 => lru.active.sweep(chunks, |(p, g)| {
                let m = pages.get(*p);
                m.gen == *g && m.state == PState::Resident
            }),
            2 => lru.inactive.sweep(chunks, |(p, g)| {
                let m = pages.get(*p);
                m.gen == *g && m.state == PState::Inactive
            }),
            3 => lru.lazy.sweep(chunks, |p| pages.get(*p).has(pf::LAZYFREE)),
            _ => lru.volatile.sweep(chunks, |p| {
                let m = pages.get(*p);
                m.has(pf::VOLATILE) && !m.has(pf::PURGED) && m.state.holds_frame()
            }),
        };
        if swept {
            lru.compacting = (lru.compacting + 1) % 5;
        }
    }

    /// Commits a fill. `installed` is how many pages of the plan the executor
    /// installed (a prefix of the run); the rest are released.
    pub fn fill_done(&mut self, plan: &FaultPlan, installed: u64) {
        self.counters.faults += 1;
        match *plan {
            FaultPlan::ZeroFill { run } | FaultPlan::FileRead { run, .. } => {
                for q in run.start.0..run.end.0 {
                    let p = PageIdx(q);
                    if q - run.start.0 < installed {
                        self.pages.update(p, |m| m.state = PState::Resident);
                        self.note_resident(p);
                    } else {
                        self.pages.update(p, |m| m.state = PState::Absent);
                        self.resident -= 1;
                    }
                }
                if matches!(plan, FaultPlan::FileRead { .. }) {
                    self.counters.major_faults += u64::from(installed > 0);
                } else {
                    self.counters.zero_fills += installed;
                }
            }
            FaultPlan::SwapIn { run, slot } => {
                for q in run.start.0..run.end.0 {
                    let p = PageIdx(q);
                    let k = q - run.start.0;
                    if k < installed {
                        self.swap.release(slot + k as u32);
                        self.swapped -= 1;
                        self.pages.update(p, |m| {
                            m.state = PState::Resident;
                            m.slot = 0;
                        });
                        self.note_resident(p);
                    } else {
                        self.pages.update(p, |m| m.state = PState::Swapped);
                        self.resident -= 1;
                    }
                }
                if installed > 0 {
                    self.counters.swapins += installed;
                    self.counters.major_faults += 1;
                } else {
                    self.counters.swap_read_errors += 1;
                }
            }
            FaultPlan::Refill { page } => {
                // The frame stays charged either way; the page is no longer
                // lazily freed (a discard reads back as zeros, and the
                // program is about to use it).
                self.pages.update(page, |m| {
                    m.state = PState::Resident;
                    m.flags &= !pf::LAZYFREE;
                });
                self.lazyfree_pages -= 1;
                if installed > 0 {
                    self.counters.lazyfree_discards += 1;
                }
            }
            FaultPlan::Reactivate { page, slot, .. } => {
                if installed > 0 {
                    self.staging.release(slot);
                    self.inactive -= 1;
                    self.pages.update(page, |m| {
                        m.state = PState::Resident;
                        m.slot = 0;
                        m.flags |= pf::REFERENCED;
                    });
                    self.note_resident(page);
                    self.counters.minor_faults += 1;
                } else {
                    self.pages.update(page, |m| m.state = PState::Inactive);
                    self.push_inactive(page);
                }
            }
            _ => {}
        }
    }

    /// Counts a fault that could get no frame (SIGBUS raised).
    pub fn fault_oom(&mut self) {
        self.counters.oom_sigbus += 1;
    }

    // ------------------------------------------------------------------
    // Reclaim

    /// Plans reclaim of up to `want` frames: evictions from the inactive
    /// list, and deactivations that refill it.
    pub fn reclaim_plan(&mut self, want: u64) -> ReclaimPlan {
        let mut plan = ReclaimPlan::default();
        if self.swap.capacity() == 0
            && self.volatile_pages == 0
            && (self.lazyfree_pages == 0 || !self.host_lazyfree)
            && !self.regions.iter().any(|r| r.kind == Kind::FileShared)
        {
            // No swap: anonymous pages are unevictable (as on a swapless
            // Linux), so there is nothing to age either; only volatile pages
            // could be purged.
            return plan;
        }
        if self.purge_volatile_first && !self.lru.volatile.is_empty() {
            self.plan_volatile(&mut plan, want);
            if !plan.purge.is_empty() || !plan.deactivate.is_empty() {
                // Volatile pages go first: nothing else leaves while they
                // are on their way out (parked now, purged next round).
                return plan;
            }
        }
        // Lazily freed pages first: a clean one is discarded with no I/O.
        self.plan_lazy(&mut plan, want.max(32));
        if ((plan.deactivate.len() + plan.discard.len()) as u64) >= want {
            // Enough lazily freed pages are on their way out (parked now,
            // discarded by the next round): nothing dirty is evicted before
            // them. With fewer, the rest of the round evicts as usual (every
            // lazily freed page is already in this plan), so that lazily
            // freed pages that cannot be parked never stop reclaim.
            return plan;
        }
        // Evict the oldest inactive pages. A page that cannot go anywhere
        // (no swap slot) is kept at the head and the scan goes on, so that
        // volatile pages behind it can still be purged.
        let mut kept = Vec::new();
        let mut scanned = 0;
        let scan_max = self.lru.inactive.len();
        while ((plan.evict.len() + plan.purge.len() + plan.discard.len()) as u64) < want && scanned < scan_max {
            scanned += 1;
            let Some((p, g)) = self.lru.inactive.pop_front() else { break };
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Inactive {
                continue;
            }
            if self.regions.find(p).is_none() {
                continue; // being unmapped: the zap frees it
            }
            if m.has(pf::VOLATILE) {
                // Volatile: purged instead of swapped, no I/O.
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.purge.push((p, m.slot));
                continue;
            }
            let file_shared = self.regions.find(p).filter(|r| r.kind == Kind::FileShared).cloned();
            if let Some(reg) = file_shared {
                // A shared file page goes back to its file, never to swap.
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.writeback.push(Writeback {
                    page: p,
                    staging: Some(m.slot),
                    file: reg.file().expect("file region"),
                    file_page: reg.file_page(p),
                    clean: !m.has(pf::MAYBE_DIRTY),
                });
                continue;
            }
            if m.has(pf::LAZYFREE) && self.host_lazyfree {
                let swap = self.swap.alloc();
                self.pages.update(p, |m| m.state = PState::Evicting);
                plan.discard.push(Discard { page: p, staging: m.slot, swap });
                continue;
            }
            let Some(swap) = self.swap.alloc() else {
                kept.push((p, g));
                continue;
            };
            self.pages.update(p, |m| m.state = PState::Evicting);
            plan.evict.push(Evict { page: p, staging: m.slot, swap });
        }
        for e in kept.into_iter().rev() {
            self.lru.inactive.push_front(e);
        }
        // Refill the inactive list from the head of the active list.
        let target = self.inactive_target();
        let short = want.saturating_sub((plan.evict.len() + plan.purge.len() + plan.discard.len()) as u64);
        let mut scanned = 0;
        let scan_max = self.lru.active.len();
        while ((self.inactive + plan.deactivate.len() as u64) < target
            || ((plan.deactivate.len() + plan.drop.len()) as u64) < short)
            && scanned < scan_max
        {
            scanned += 1;
            let Some((p, g)) = self.lru.active.pop_front() else { break };
            let m = self.pages.get(p);
            if m.gen != g || m.state != PState::Resident {
                continue;
            }
            let Some(reg) = self.regions.find(p) else { continue };
            if reg.lock != LockMode::None || m.has(pf::LOCKED) {
                continue; // unevictable: off the LRU until unlocked
            }
            if reg.writable() && reg.prot != PROT_READ | PROT_WRITE {
                // Writable but not plain RW (e.g. RWX): neither MOVE nor a
                // race-free copy is possible; keep it (documented).
                self.lru.active.push_back((p, g));
                continue;
            }
            if m.has(pf::REFERENCED) {
                self.pages.update(p, |m| m.flags &= !pf::REFERENCED);
                self.lru.active.push_back((p, g));
                continue;
            }
            if reg.kind == Kind::FileShared
                && reg.advice == Advice::Sequential
                && !m.has(pf::MAYBE_DIRTY)
                && !m.has(pf::VOLATILE)
            {
                if (plan.drop.len() as u64) >= short {
                    // Only as many as the round wants (never age a stream
                    // into staging): the rest stays, oldest first.
                    self.lru.active.push_front((p, g));
                    break;
                }
                // (Zapping: being dropped where it is, frame still charged.)
                self.pages.update(p, |m| m.state = PState::Zapping);
                plan.drop.push(p);
                continue;
            }
            if !m.has(pf::VOLATILE)
                && reg.kind != Kind::FileShared
                && self.swap.free() as u64 <= plan.deactivate.len() as u64
            {
                // No swap room: only volatile pages can leave.
                self.lru.active.push_back((p, g));
                continue;
            }
            let Some(slot) = self.staging.alloc() else { break };
            let how = transfer_for(reg.prot);
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
            });
            let host_free = self.host_lazyfree && m.has(pf::VOLATILE);
            plan.deactivate.push(Deactivate { page: p, slot, how, host_free });
        }
        plan
    }

    /// The inactive list's target length: a quarter of the budget.
    pub fn inactive_target(&self) -> u64 {
        (self.cfg.budget_pages / 4).max(1)
    }

    /// Whether the inactive list should be refilled ahead of need: once the
    /// budget is half full, pages start aging (deactivation, no eviction), so
    /// that the first evictions come from a list the program has had time
    /// to touch — the hot pages prove themselves before any page leaves.
    pub fn needs_aging(&self) -> bool {
        // Only with swap: without it nothing aged could be evicted but
        // volatile pages, which are purged when pressure comes anyway, and
        // parking them early only costs the program minor faults.
        self.swap.capacity() > 0
            && self.resident * 2 >= self.cfg.budget_pages
            && self.inactive < self.inactive_target()
            && !self.lru.active.is_empty()
    }

    /// Plans work on lazily freed pages, oldest first, up to `want` pages:
    /// parked ones are discarded now; mapped ones are parked this round (and
    /// discarded by the next).
    fn plan_lazy(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let mut parked = Vec::new();
        let mut scanned = 0;
        let lazy_max = self.lru.lazy.len();
        while ((plan.discard.len() + plan.deactivate.len()) as u64) < want && scanned < lazy_max {
            scanned += 1;
            let Some(p) = self.lru.lazy.pop_front() else { break };
            let m = self.pages.get(p);
            if !m.has(pf::LAZYFREE) || m.has(pf::VOLATILE) || self.regions.find(p).is_none() {
                continue;
            }
            if m.has(pf::LOCKED) || self.regions.find(p).is_some_and(|r| r.lock != LockMode::None) {
                // Locked since it was freed (mlock after MADV_FREE): never
                // reclaimed while locked, and no longer a lazy candidate.
                continue;
            }
            match m.state {
                PState::Inactive if self.host_lazyfree => {
                    let swap = self.swap.alloc();
                    self.pages.update(p, |m| m.state = PState::Evicting);
                    plan.discard.push(Discard { page: p, staging: m.slot, swap });
                }
                PState::Resident if self.host_lazyfree => {
                    let Some(reg) = self.regions.find(p) else { continue };
                    if reg.prot != PROT_READ | PROT_WRITE {
                        continue;
                    }
                    let Some(slot) = self.staging.alloc() else {
                        self.lru.lazy.push_front(p);
                        break;
                    };
                    self.pages.update(p, |m| {
                        m.state = PState::Deactivating;
                        m.slot = slot;
                    });
                    plan.deactivate.push(Deactivate { page: p, slot, how: Transfer::Move, host_free: false });
                    // To the front: the next round discards it first (a round
                    // that parks lazy pages evicts nothing else).
                    parked.push(p);
                }
                _ => self.lru.lazy.push_back(p),
            }
        }
        for p in parked.into_iter().rev() {
            self.lru.lazy.push_front(p);
        }
    }

    /// Plans the purge of volatile pages, oldest mark first, up to `want`
    /// pages (`set_purge_volatile_first`): parked ones are purged now;
    /// mapped ones are parked this round (and purged by the next, unless
    /// touched meanwhile, which parks them again the round after).
    fn plan_volatile(&mut self, plan: &mut ReclaimPlan, want: u64) {
        let mut parked = Vec::new();
        let mut scanned = 0;
        let max = self.lru.volatile.len();
        while ((plan.purge.len() + plan.deactivate.len()) as u64) < want && scanned < max {
            scanned += 1;
            let Some(p) = self.lru.volatile.pop_front() else { break };
            let m = self.pages.get(p);
            if !m.has(pf::VOLATILE) || m.has(pf::PURGED) {
                continue;
            }
            let Some(reg) = self.regions.find(p).cloned() else { continue };
            match m.state {
                PState::Inactive => {
                    self.pages.update(p, |m| m.state = PState::Evicting);
                    plan.purge.push((p, m.slot));
                }
                PState::Resident => {
                    if reg.lock != LockMode::None || m.has(pf::LOCKED) {
                        continue;
                    }
                    if reg.writable() && reg.prot != PROT_READ | PROT_WRITE {
                        continue; // cannot be parked (see reclaim_plan)
                    }
                    let Some(slot) = self.staging.alloc() else {
                        self.lru.volatile.push_front(p);
                        break;
                    };
                    self.pages.update(p, |m| {
                        m.state = PState::Deactivating;
                        m.slot = slot;
                        m.flags &= !pf::REFERENCED;
                    });
                    let host_free = self.host_lazyfree;
                    plan.deactivate.push(Deactivate { page: p, slot, how: transfer_for(reg.prot), host_free });
                    parked.push(p);
                }
                PState::Absent | PState::Swapped => {}
                _ => self.lru.volatile.push_back(p),
            }
        }
        for p in parked.into_iter().rev() {
            self.lru.volatile.push_front(p);
        }
    }

    /// Lazily freed pages beyond the space's bound (`set_lazyfree_max`).
    pub fn lazyfree_excess(&self) -> u64 {
        self.lazyfree_pages.saturating_sub(self.lazyfree_max)
    }

    /// Plans the eager discard of the lazily freed pages beyond the bound.
    pub fn lazyfree_trim_plan(&mut self) -> ReclaimPlan {
        let mut plan = ReclaimPlan::default();
        let excess = self.lazyfree_excess();
        if excess > 0 && self.host_lazyfree {
            self.plan_lazy(&mut plan, excess);
        }
        plan
    }

    /// Bounds how many lazily freed pages the space keeps (`u64::MAX`:
    /// unbounded); past it, `MADV_FREE` discards the oldest at once.
    pub fn set_lazyfree_max(&mut self, pages: u64) {
        self.lazyfree_max = pages;
    }

    /// How many frames a fault that finds none reclaims at once: enough to
    /// amortise the work, never so many that a small budget is flushed.
    pub fn direct_reclaim_batch(&self) -> u64 {
        (self.cfg.budget_pages / 8).clamp(1, 16)
    }

    /// Plans the deactivation (MADV_COLD) or deactivation-then-eviction
    /// (MADV_PAGEOUT) of the resident pages of `r`.
    pub fn deactivate_range(&mut self, r: PageRange) -> Vec<Deactivate> {
        let mut v = Vec::new();
        let Some(reg) = self.regions.find(r.start).cloned() else { return v };
        if reg.lock != LockMode::None || self.swap.capacity() == 0 {
            return v;
        }
        if reg.writable() && reg.prot != PROT_READ | PROT_WRITE {
            return v;
        }
        let how = transfer_for(reg.prot);
        for (p, m) in self.pages.live_in(r) {
            if m.state != PState::Resident || m.has(pf::LOCKED) {
                continue;
            }
            let Some(slot) = self.staging.alloc() else { break };
            self.pages.update(p, |m| {
                m.state = PState::Deactivating;
                m.slot = slot;
                m.flags &= !pf::REFERENCED;
            });
            let host_free = self.host_lazyfree && m.has(pf::VOLATILE);
            v.push(Deactivate { page: p, slot, how, host_free });
        }
        v
    }

    /// Plans the eviction of the given inactive pages (skipping the others).
    pub fn evict_pages(&mut self, pages: &[PageIdx]) -> Vec<Evict> {
        let mut v = Vec::new();
        for &p in pages {
            let m = self.pages.get(p);
            if m.state != PState::Inactive || m.has(pf::VOLATILE) {
                continue;
            }
            let Some(swap) = self.swap.alloc() else { break };
            self.pages.update(p, |m| m.state = PState::Evicting);
            v.push(Evict { page: p, staging: m.slot, swap });
        }
        v
    }

    /// Plans the eviction of every inactive page of `r` (MADV_PAGEOUT, after
    /// `deactivate_range`), at most `max`.
    ///
    /// Parked pages of shared file regions go back to their files, never to
    /// swap (the second list, as reclaim plans them): a page of a file
    /// swapped here was lost to the file (munmap, msync and close write back
    /// only resident and parked pages).
    pub fn evict_range(&mut self, r: PageRange, max: usize) -> (Vec<Evict>, Vec<Writeback>) {
        let mut v = Vec::new();
        let mut wb = Vec::new();
        for (p, m) in self.pages.live_in(r) {
            if v.len() + wb.len() >= max {
                break;
            }
            if m.state != PState::Inactive || m.has(pf::VOLATILE) {
                continue;
            }
            if let Some(reg) = self.regions.find(p).filter(|g| g.kind == Kind::FileShared) {
                let (file, file_page) = (reg.file().expect("file region"), reg.file_page(p));
                self.pages.update(p, |m| m.state = PState::Evicting);
                wb.push(Writeback { page: p, staging: Some(m.slot), file, file_page, clean: !m.has(pf::MAYBE_DIRTY) });
                continue;
            }
            let Some(swap) = self.swap.alloc() else { break };
            self.pages.update(p, |m| m.state = PState::Evicting);
            v.push(Evict { page: p, staging: m.slot, swap });
        }
        (v, wb)
    }

    pub fn deactivate_done(&mut self, d: &Deactivate, ok: bool) {
        debug_assert_eq!(self.pages.get(d.page).state, PState::Deactivating);
        if ok {
            self.pages.update(d.page, |m| m.state = PState::Inactive);
            self.inactive += 1;
            self.push_inactive(d.page);
            self.counters.deactivations += 1;
        } else {
            self.staging.release(d.slot);
            self.pages.update(d.page, |m| {
                m.state = PState::Resident;
                m.slot = 0;
            });
            // The region may have been locked while the page was in flight.
            self.note_resident(d.page);
        }
    }

    /// Commits a deactivation that found the page gone from the host: a
    /// lazily freed page the host discarded under its own pressure (its
    /// `MADV_FREE` was passed down). The page is discarded exactly as a
    /// discard by reclaim would leave it (reads back as zeros) and its frame
    /// is free; returns true. Any other page cannot be gone: the
    /// deactivation just failed (returns false).
    pub fn deactivate_lost(&mut self, d: &Deactivate) -> bool {
        let m = self.pages.get(d.page);
        if !m.has(pf::LAZYFREE) || m.has(pf::VOLATILE) {
            self.deactivate_done(d, false);
            return false;
        }
        debug_assert_eq!(m.state, PState::Deactivating);
        self.staging.release(d.slot);
        self.resident -= 1;
        self.lazyfree_pages -= 1;
        self.pages.update(d.page, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags &= !(pf::LAZYFREE | pf::REFERENCED | pf::MAYBE_DIRTY);
        });
        self.counters.lazyfree_discards += 1;
        self.counters.evictions += 1;
        true
    }

    /// Commits the drop of a clean page of a streaming file region (see
    /// `ReclaimPlan::drop`): on success the page is gone (the next touch
    /// reads the file); otherwise it stays resident.
    pub fn drop_done(&mut self, p: PageIdx, ok: bool) {
        debug_assert_eq!(self.pages.get(p).state, PState::Zapping);
        if ok {
            self.pages.set(p, PageMeta::default());
            self.resident -= 1;
        } else {
            self.pages.update(p, |m| m.state = PState::Resident);
            self.note_resident(p);
        }
    }

    /// Commits an eviction. On success the executor has written the data to
    /// swap and dropped the staging frame.
    pub fn evict_done(&mut self, e: &Evict, ok: bool) {
        debug_assert_eq!(self.pages.get(e.page).state, PState::Evicting);
        if ok {
            self.staging.release(e.staging);
            self.inactive -= 1;
            self.swapped += 1;
            self.resident -= 1;
            let was_lazy = self.pages.get(e.page).has(pf::LAZYFREE);
            if was_lazy {
                self.lazyfree_pages -= 1;
            }
            self.pages.update(e.page, |m| {
                m.state = PState::Swapped;
                m.slot = e.swap;
                m.flags &= !pf::LAZYFREE;
            });
            self.counters.swapouts += 1;
            self.counters.evictions += 1;
        } else {
            // The page stays resident (parked); the slot is not reused blindly.
            self.swap.release(e.swap);
            self.pages.update(e.page, |m| m.state = PState::Inactive);
            self.push_inactive(e.page);
            self.counters.swap_write_errors += 1;
        }
    }

    /// Commits a purge: the executor dropped the staging frame and put a
    /// poison marker at the page's address.
    pub fn purge_done(&mut self, p: PageIdx, staging: u32) {
        debug_assert_eq!(self.pages.get(p).state, PState::Evicting);
        self.staging.release(staging);
        self.inactive -= 1;
        self.resident -= 1;
        if self.pages.get(p).has(pf::LAZYFREE) {
            self.lazyfree_pages -= 1;
        }
        self.pages.update(p, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags = (m.flags | pf::PURGED) & !pf::LAZYFREE;
        });
        self.counters.volatile_purges += 1;
        self.counters.evictions += 1;
    }

    /// Commits a checked reactivation that found the staging slot empty: the
    /// host discarded the parked volatile page (`Reactivate { checked }`).
    /// The page is purged exactly as a purge by reclaim would leave it; the
    /// executor has dropped the slot and installed nothing.
    pub fn reactivate_lost(&mut self, plan: &FaultPlan) {
        let FaultPlan::Reactivate { page, slot, .. } = *plan else { return };
        debug_assert_eq!(self.pages.get(page).state, PState::Filling);
        self.staging.release(slot);
        self.inactive -= 1;
        self.resident -= 1;
        let m = self.pages.get(page);
        if m.has(pf::LAZYFREE) {
            self.lazyfree_pages -= 1;
        }
        let purged = if m.has(pf::VOLATILE) { pf::PURGED } else { 0 };
        self.pages.update(page, |m| {
            m.state = PState::Absent;
            m.slot = 0;
            m.flags = (m.flags | purged) & !(pf::LAZYFREE | pf::REFERENCED);
        });
        if purged != 0 {
            self.counters.volatile_purges += 1;
            self.counters.host_purges += 1;
        }
    }

    /// Commits a discard attempt. `dropped`: the host dropped the clean
    /// page (no I/O); otherwise the program wrote it since `MADV_FREE`, and
    /// `written` says whether the executor wrote it to `d.swap`.
    pub fn discard_done(&mut self, d: &Discard, dropped: bool, written: bool) {
        debug_assert_eq!(self.pages.get(d.page).state, PState::Evicting);
        self.lazyfree_pages -= 1;
        if dropped {
            if let Some(s) = d.swap {
                self.swap.release(s);
            }
            self.staging.release(d.staging);
            self.inactive -= 1;
            self.resident -= 1;
            self.pages.update(d.page, |m| {
                m.state = PState::Absent;
                m.slot = 0;
                m.flags &= !pf::LAZYFREE;
            });
            self.counters.lazyfree_discards += 1;
            self.counters.evictions += 1;
            return;
        }
        // Written since: an ordinary dirty page now.
        self.pages.update(d.page, |m| m.flags &= !pf::LAZYFREE);
        match (d.swap, written) {
            (Some(swap), true) => {
                self.staging.release(d.staging);
                self.inactive -= 1;
                self.swapped += 1;
                self.resident -= 1;
                self.pages.update(d.page, |m| {
                    m.state = PState::Swapped;
                    m.slot = swap;
                });
                self.counters.swapouts += 1;
                self.counters.evictions += 1;
            }
            (swap, _) => {
                if let Some(s) = swap {
                    self.swap.release(s);
                }
                self.pages.update(d.page, |m| m.state = PState::Inactive);
                self.push_inactive(d.page);
            }
        }
    }

    /// Commits an eviction to a file: on success the page is dropped (a
    /// touch re-reads it); on failure it stays resident and parked, and the
    /// error is kept for the next `msync`/`munmap` of the file (as fsync
    /// reports write-back errors).
    pub fn writeback_done(&mut self, w: &Writeback, result: Result<(), Errno>) {
        debug_assert_eq!(self.pages.get(w.page).state, PState::Evicting);
        let slot = w.staging.expect("evicted page is parked");
        match result {
            Ok(()) => {
                self.staging.release(slot);
                self.inactive -= 1;
                self.resident -= 1;
                let m = self.pages.get(w.page);
                if m.has(pf::LAZYFREE) {
                    self.lazyfree_pages -= 1;
                }
                if m.has(pf::VOLATILE) {
                    self.volatile_pages -= 1;
                }
                self.pages.set(w.page, PageMeta::default());
                if !w.clean {
                    self.counters.writebacks += 1;
                }
                self.counters.evictions += 1;
            }
            Err(e) => {
                self.pages.update(w.page, |m| m.state = PState::Inactive);
                self.push_inactive(w.page);
                self.file_errors.push((w.file, e));
            }
        }
    }

    /// Records a write-back error for `file` (reported by the next msync or
    /// munmap of it).
    pub fn note_file_error(&mut self, file: u32, e: Errno) {
        self.file_errors.push((file, e));
    }

    /// Counts one page written back to its file; a page of a region that
    /// is no longer writable is clean from now on.
    pub fn count_writeback(&mut self, p: PageIdx) {
        self.counters.writebacks += 1;
        if self.regions.find(p).is_some_and(|r| !r.writable()) {
            self.pages.update(p, |m| {
                if m.state.holds_frame() {
                    m.flags &= !pf::MAYBE_DIRTY
                }
            });
        }
    }

    /// The first write-back error recorded for `file` since the last call,
    /// cleared (fsync semantics).
    pub fn take_file_error(&mut self, file: u32) -> Option<Errno> {
        let i = self.file_errors.iter().position(|(f, _)| *f == file)?;
        let e = self.file_errors[i].1;
        self.file_errors.retain(|(f, _)| *f != file);
        Some(e)
    }

    /// The pages of `r` that belong to shared file regions (live or being
    /// unmapped, described by `files`) and hold data: what a write-back of
    /// `r` must write. Busy pages are skipped (the caller settles first).
    pub fn writeback_snapshot(&self, r: PageRange, detached: &[FileRange]) -> Vec<Writeback> {
        let mut v = Vec::new();
        let mut push = |seg: PageRange, file: u32, file_page_of_start: u64| {
            self.pages.for_each_live(seg, |p, m| {
                let staging = match m.state {
                    PState::Resident => None,
                    PState::Inactive => Some(m.slot),
                    _ => return,
                };
                if !m.has(pf::MAYBE_DIRTY) {
                    return; // clean: nothing to write
                }
                v.push(Writeback {
                    page: p,
                    staging,
                    file,
                    file_page: file_page_of_start + (p.0 - seg.start.0),
                    clean: false,
                });
            });
        };
        for reg in self.regions.overlapping(r) {
            if reg.kind == Kind::FileShared {
                let seg = reg.range.intersect(&r);
                push(seg, reg.file().expect("file"), reg.file_page(seg.start));
            }
        }
        for f in detached {
            let seg = f.range.intersect(&r);
            if !seg.is_empty() {
                push(seg, f.file, f.file_page + (seg.start.0 - f.range.start.0));
            }
        }
        v
    }

    /// Decides `msync`: returns the shared file segments to write back (in
    /// order) and the result (Linux: `EINVAL` for bad flags or an unaligned
    /// start, `ENOMEM` for holes — after syncing the mapped parts — and
    /// `EBUSY` for `MS_INVALIDATE` over locked pages).
    pub fn msync(&self, addr: u64, len: u64, flags: i32) -> (Vec<PageRange>, Result<(), Errno>) {
        if flags & !(MS_ASYNC | MS_INVALIDATE | MS_SYNC) != 0 || !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        if flags & MS_ASYNC != 0 && flags & MS_SYNC != 0 {
            return (vec![], bad(Errno::EINVAL));
        }
        // Linux rounds the length up with wrap-around (a length that wraps
        // to 0 is an empty range), then `start + len` overflowing is ENOMEM.
        let bytes = self.page_align_wrapping(len);
        let Some(end) = addr.checked_add(bytes) else {
            return (vec![], bad(Errno::ENOMEM));
        };
        if end == addr {
            return (vec![], Ok(()));
        }
        let pages = bytes >> self.cfg.page_shift;
        let r = self.clip(addr, pages);
        let mut hole = !self.in_reservation(addr, pages);
        let mut segs = Vec::new();
        let mut at = r.start;
        let regs = self.regions.overlapping(r);
        if regs.is_empty() {
            return (vec![], bad(Errno::ENOMEM));
        }
        for reg in regs {
            if reg.range.start > at {
                hole = true;
            }
            if flags & MS_INVALIDATE != 0 && reg.lock != LockMode::None {
                return (segs, bad(Errno::EBUSY));
            }
            let seg = reg.range.intersect(&r);
            if reg.kind == Kind::FileShared {
                segs.push(seg);
            }
            at = seg.end;
        }
        if at < r.end {
            hole = true;
        }
        (segs, if hole { bad(Errno::ENOMEM) } else { Ok(()) })
    }

    /// The file ids still mapped by a live region.
    pub fn files_in_use(&self) -> Vec<u32> {
        self.file_pages.iter().filter(|(_, n)| **n > 0).map(|(f, _)| *f).collect()
    }

    /// Every shared file segment of the space (for `close`).
    pub fn shared_file_ranges(&self) -> Vec<PageRange> {
        self.regions.iter().filter(|r| r.kind == Kind::FileShared).map(|r| r.range).collect()
    }

    /// Decides `mvolatile`: marks the pages of the range volatile. A locked
    /// region is `EINVAL`, holes `ENOMEM` (after marking the mapped parts).
    /// Returns the staging slots of the parked pages it marked: with host
    /// discards on (`set_host_lazyfree`), the executor hands them to the
    /// host (`MADV_FREE`), as it does for pages parked later while volatile.
    pub fn mvolatile(&mut self, addr: u64, len: u64) -> (Vec<u32>, Result<(), Errno>) {
        let (segs, res) = self.volatile_segments(addr, len, true);
        let mut parked = Vec::new();
        for seg in segs {
            for q in seg.start.0..seg.end.0 {
                let p = PageIdx(q);
                let m = self.pages.get(p);
                if !m.has(pf::VOLATILE) {
                    self.pages.update(p, |m| m.flags |= pf::VOLATILE);
                    self.volatile_pages += 1;
                    if self.host_lazyfree && m.state == PState::Inactive {
                        parked.push(m.slot);
                    }
                    if self.purge_volatile_first && m.state.holds_frame() {
                        self.lru.volatile.push_back(p);
                    }
                }
            }
        }
        (parked, res)
    }

    /// The segments of a volatile call, and its result.
    fn volatile_segments(&self, addr: u64, len: u64, refuse_locked: bool) -> (Vec<PageRange>, Result<(), Errno>) {
        if !self.aligned(addr) {
            return (vec![], bad(Errno::EINVAL));
        }
        let Some(pages) = self.len_pages(len) else {
            return (vec![], bad(Errno::EINVAL));
        };
        if pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)).is_none() {
            return (vec![], bad(Errno::EINVAL));
        }
        if pages == 0 {
            return (vec![], Ok(()));
        }
        let r = self.clip(addr, pages);
        let regs = self.regions.overlapping(r);
        if refuse_locked && regs.iter().any(|g| g.lock != LockMode::None) {
            return (vec![], bad(Errno::EINVAL));
        }
        let mut segs = Vec::new();
        let mut at = r.start;
        let mut hole = !self.in_reservation(addr, pages) || regs.is_empty();
        for reg in regs {
            if reg.range.start > at {
                hole = true;
            }
            let seg = reg.range.intersect(&r);
            segs.push(seg);
            at = seg.end;
        }
        if at < r.end {
            hole = true;
        }
        (segs, if hole { bad(Errno::ENOMEM) } else { Ok(()) })
    }

    /// Decides `mnovolatile`: `Err(None)` means a page of the range is busy
    /// (a purge may be in flight): wait and call again. Otherwise the range is
    /// no longer volatile when this returns (no purge can start: purges are
    /// planned under the same lock), and the purged pages are reported; the
    /// executor removes their markers so that they read back as zeros.
    pub fn mnovolatile(&mut self, addr: u64, len: u64) -> Result<(NoVolatile, Result<(), Errno>), Option<Errno>> {
        let (segs, res) = self.volatile_segments(addr, len, false);
        if segs.is_empty() {
            if let Err(e) = res {
                return Err(Some(e));
            }
        }
        for seg in &segs {
            if self.pages.live_in(*seg).iter().any(|(_, m)| m.state.busy()) {
                return Err(None);
            }
        }
        let mut out = NoVolatile::default();
        if self.host_lazyfree {
            // A parked volatile page's slot may be discarded by the host at
            // any time: only mapping it back tells (atomically) whether it
            // was. Pages in the program's range never are (only parked
            // pages are handed to the host).
            for seg in &segs {
                for (p, m) in self.pages.live_in(*seg) {
                    if m.state == PState::Inactive && m.has(pf::VOLATILE) {
                        out.reactivate.push(p);
                    }
                }
            }
            if !out.reactivate.is_empty() {
                return Ok((out, res));
            }
        }
        for seg in segs {
            for (p, m) in self.pages.live_in(seg) {
                if m.has(pf::VOLATILE) {
                    self.volatile_pages -= 1;
                }
                if m.has(pf::PURGED) {
                    out.purged.push(p);
                }
                self.pages.update(p, |m| m.flags &= !(pf::VOLATILE | pf::PURGED));
            }
        }
        Ok((out, res))
    }

    /// Whether any page of the `pages` pages from `a` is being filled (or,
    /// with `any_busy`, is busy in any way).
    pub fn any_filling(&self, a: Addr, pages: u64, any_busy: bool) -> bool {
        let Some(p) = self.page_of(a) else { return false };
        let end = p.0.saturating_add(pages).min(self.cfg.reserve_pages);
        let mut busy = false;
        self.pages.for_each_live(PageRange::new(p.0, end), |_, m| {
            busy |= m.state == PState::Filling || (any_busy && m.state.busy())
        });
        busy
    }

    /// How many pages of `r` are marked volatile (purged ones included).
    pub fn volatile_in(&self, r: PageRange) -> u64 {
        let mut n = 0;
        self.pages.for_each_live(r, |_, m| n += u64::from(m.has(pf::VOLATILE)));
        n
    }

    /// Whether any page of `r` is volatile (mlock refuses them).
    pub fn any_volatile(&self, r: PageRange) -> bool {
        let mut v = false;
        self.pages.for_each_live(r, |_, m| v |= m.has(pf::VOLATILE));
        v
    }

    /// `MADV_FREE` on `r`: swapped pages are freed at once (their slots
    /// released; they read back as zeros); resident pages become lazily
    /// freed and keep their data. Busy pages are left alone (Linux's
    /// MADV_FREE is best effort too).
    ///
    /// The core does not know whether a lazily freed page is written after
    /// the call; the host kernel does (the executor passes MADV_FREE down and
    /// the PTE's dirty bit follows the page). Reclaim therefore takes lazily
    /// freed pages first and plans a `Discard`: the host drops a clean page,
    /// keeps a written one (which is then swapped). The flag is cleared when
    /// the page leaves memory or is refilled, as Linux settles its LazyFree
    /// count at reclaim.
    /// Returns the staging slots of the parked pages it marked (the executor
    /// passes MADV_FREE down for those too).
    pub fn lazyfree(&mut self, r: PageRange) -> Vec<u32> {
        let mut parked = Vec::new();
        for (p, m) in self.pages.live_in(r) {
            if m.state == PState::Inactive && !m.has(pf::LAZYFREE) {
                parked.push(m.slot);
            }
            match m.state {
                PState::Swapped => {
                    self.swap.release(m.slot);
                    self.swapped -= 1;
                    if m.has(pf::VOLATILE) {
                        self.volatile_pages -= 1;
                    }
                    self.pages.set(p, PageMeta::default());
                }
                PState::Resident | PState::Inactive if !m.has(pf::LAZYFREE) => {
                    self.pages.update(p, |m| m.flags |= pf::LAZYFREE);
                    self.lazyfree_pages += 1;
                    self.lru.lazy.push_back(p);
                }
                _ => {}
            }
        }
        parked
    }

    /// The runs of resident, lazily freed pages of `r` (a write populate
    /// passes them to the host, which then treats them as written, as
    /// Linux's populate does: `FOLL_WRITE` dirties the folio).
    pub fn lazyfree_runs(&self, r: PageRange) -> Vec<PageRange> {
        let mut runs: Vec<PageRange> = Vec::new();
        self.pages.for_each_live(r, |p, m| {
            if m.state == PState::Resident && m.has(pf::LAZYFREE) {
                match runs.last_mut() {
                    Some(last) if last.end == p => last.end.0 += 1,
                    _ => runs.push(PageRange::new(p.0, p.0 + 1)),
                }
            }
        });
        runs
    }

    /// Marks every page of `r` poisoned (after the executor zapped them).
    pub fn set_poison(&mut self, r: PageRange) {
        for q in r.start.0..r.end.0 {
            self.pages.update(PageIdx(q), |m| {
                debug_assert_eq!(m.state, PState::Absent);
                m.flags |= pf::POISONED;
            });
        }
    }

    /// Swapped pages of `r` to read in (MADV_WILLNEED); none are claimed: the
    /// executor touches them through the normal fault path.
    pub fn swapped_in(&self, r: PageRange) -> Vec<PageIdx> {
        let mut v = Vec::new();
        self.pages.for_each_live(r, |p, m| {
            if m.state == PState::Swapped {
                v.push(p)
            }
        });
        // In file regions, absent pages are read from the file (read-ahead),
        // a window at a time: one page per window is enough, the fault plan
        // reads the run after it.
        for reg in self.regions.overlapping(r) {
            if reg.file().is_none() {
                continue;
            }
            let seg = reg.range.intersect(&r);
            let mut q = seg.start.0;
            while q < seg.end.0 {
                let m = self.pages.get(PageIdx(q));
                if m == PageMeta::default() {
                    v.push(PageIdx(q));
                    q += MAX_WINDOW_PAGES;
                } else {
                    q += 1;
                }
            }
        }
        v.sort_unstable();
        v
    }

    // ------------------------------------------------------------------
    // Zap

    /// Claims the pages of `r` for dropping. `Err(())` means a page is busy:
    /// wait and call again.
    #[allow(clippy::result_unit_err)]
    pub fn zap_begin(&mut self, r: PageRange) -> Result<ZapClaim, ()> {
        let live = self.pages.live_in(r);
        if live.iter().any(|(_, m)| m.state.busy()) {
            return Err(());
        }
        self.zapping.push(r);
        let mut claim = ZapClaim { range: r, staging: Vec::new(), mapped: false };
        for (p, m) in live {
            if m.has(pf::POISONED) || m.has(pf::PURGED) {
                // The poison marker must go with the page.
                claim.mapped = true;
            }
            match m.state {
                PState::Resident => {
                    claim.mapped = true;
                    self.pages.update(p, |m| m.state = PState::Zapping);
                }
                PState::Inactive => {
                    claim.staging.push(m.slot);
                    self.pages.update(p, |m| m.state = PState::Zapping);
                }
                _ => {}
            }
        }
        Ok(claim)
    }

    /// Drops the pages of a claim: the executor has dropped the frames.
    pub fn zap_end(&mut self, c: &ZapClaim) {
        if let Some(i) = self.zapping.iter().position(|z| *z == c.range) {
            self.zapping.swap_remove(i);
        }
        for (p, m) in self.pages.live_in(c.range) {
            if m.has(pf::LOCKED) {
                self.locked_pages -= 1;
            }
            if m.has(pf::VOLATILE) {
                self.volatile_pages -= 1;
            }
            if m.has(pf::LAZYFREE) {
                self.lazyfree_pages -= 1;
            }
            match m.state {
                PState::Zapping => self.resident -= 1,
                PState::Swapped => {
                    self.swap.release(m.slot);
                    self.swapped -= 1;
                }
                PState::Absent => {}
                s => panic!("zap_end: page {p:?} in state {s:?}"),
            }
            self.pages.set(p, PageMeta::default());
        }
        self.maybe_compact(2 * c.range.pages().div_ceil(512) as usize);
        for &s in &c.staging {
            self.staging.release(s);
            self.inactive -= 1;
        }
    }

    // ------------------------------------------------------------------
    // Introspection

    fn introspect_range(&self, addr: u64, pages: u64) -> Result<PageRange, Errno> {
        if !self.aligned(addr) {
            return bad(Errno::EINVAL);
        }
        if pages.checked_shl(self.cfg.page_shift).and_then(|b| addr.checked_add(b)).is_none_or(|e| e > TASK_SIZE) {
            return bad(Errno::ENOMEM);
        }
        Ok(self.clip(addr, pages))
    }

    /// `mincore`: one byte per page (bit 0: resident) up to the first hole,
    /// where it stops with `ENOMEM`. `out` must hold `ceil(len/page)` bytes.
    pub fn mincore(&self, addr: u64, len: u64, out: &mut [u8]) -> Result<(), Errno> {
        let pages = self.len_pages(len).ok_or(Errno::ENOMEM)?;
        // A poisoned page counts as present, as Linux's hwpoison entries do.
        self.walk_pages(addr, pages, |i, m| {
            out[i] = u8::from(m.state.holds_frame() || m.has(pf::POISONED));
        })
    }

    /// `umm_page_state`: one word of `UMM_PAGE_*` bits per page.
    pub fn page_state(&self, addr: u64, npages: u64, out: &mut [u32]) -> Result<(), Errno> {
        self.walk_pages(addr, npages, |i, m| out[i] = state_bits(m))
    }

    fn walk_pages(&self, addr: u64, pages: u64, mut f: impl FnMut(usize, PageMeta)) -> Result<(), Errno> {
        let r = self.introspect_range(addr, pages)?;
        if pages == 0 {
            return Ok(());
        }
        if r.is_empty() || self.addr_of(r.start).0 != addr {
            return bad(Errno::ENOMEM);
        }
        let mut i = 0usize;
        let mut at = r.start;
        for reg in self.regions.overlapping(r) {
            if reg.range.start > at {
                return bad(Errno::ENOMEM);
            }
            let seg = reg.range.intersect(&r);
            for q in seg.start.0..seg.end.0 {
                f(i, self.pages.get(PageIdx(q)));
                i += 1;
            }
            at = seg.end;
        }
        if (i as u64) < pages {
            return bad(Errno::ENOMEM);
        }
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        Stats {
            budget_pages: self.cfg.budget_pages,
            resident_pages: self.resident,
            resident_pages_max: self.resident_max,
            inactive_pages: self.inactive,
            locked_pages: self.locked_pages,
            locked_charged_pages: self.locked_charged,
            swapped_pages: self.swapped,
            lazyfree_pages: self.lazyfree_pages,
            volatile_pages: self.volatile_pages,
            regions: self.regions.len() as u64,
            counters: self.counters.clone(),
        }
    }

    /// Per-region page counts for smaps: (resident, swapped, lazily freed
    /// and resident, locked).
    pub fn region_usage(&self, r: PageRange) -> (u64, u64, u64, u64) {
        let (mut res, mut sw, mut lazy, mut locked) = (0, 0, 0, 0);
        self.pages.for_each_live(r, |_, m| {
            if m.state.holds_frame() {
                res += 1;
                lazy += u64::from(m.has(pf::LAZYFREE));
                locked += u64::from(m.has(pf::LOCKED));
            }
            if m.state == PState::Swapped {
                sw += 1;
            }
        });
        (res, sw, lazy, locked)
    }

    /// Walks the whole state and asserts every invariant.
    pub fn validate(&self) {
        self.regions.validate(self.cfg.reserve_pages);
        assert!(self.regions.len() <= self.cfg.max_regions, "region limit");
        for h in &self.held {
            assert!(!self.regions.any_in(*h), "held range {h:?} has regions");
        }
        self.pages.validate();
        self.swap.validate();
        self.staging.validate();
        let all = PageRange::new(0, self.cfg.reserve_pages);
        let (mut res, mut ina, mut sw, mut staged, mut evicting, mut zapping, mut filling) =
            (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        let mut swap_seen = std::collections::HashSet::new();
        let mut staging_seen = std::collections::HashSet::new();
        self.pages.for_each_live(all, |p, m| {
            if m.state != PState::Absent {
                assert!(
                    self.regions.find(p).is_some() || self.held.iter().any(|h| h.contains(p)),
                    "page {p:?} ({:?}) outside every region",
                    m.state
                );
            }
            if m.state.holds_frame() {
                res += 1;
            }
            match m.state {
                PState::Inactive | PState::Deactivating | PState::Evicting => {
                    staged += 1;
                    assert!(self.staging.is_used(m.slot), "staging slot of {p:?}");
                    assert!(staging_seen.insert(m.slot), "staging slot shared");
                    match m.state {
                        PState::Inactive => ina += 1,
                        PState::Evicting => evicting += 1,
                        _ => {}
                    }
                }
                PState::Swapped => {
                    sw += 1;
                    assert!(self.swap.is_used(m.slot), "swap slot of {p:?}");
                    assert!(swap_seen.insert(m.slot), "swap slot shared");
                }
                PState::Zapping => zapping += 1,
                PState::Filling => filling += 1,
                _ => {}
            }
        });
        assert_eq!(res, self.resident, "resident count");
        assert!(self.resident <= self.cfg.budget_pages, "over budget");
        assert!(self.resident_max <= self.cfg.budget_pages, "max over budget");
        assert!(self.resident <= self.resident_max, "max below current");
        // A page being filled (swap-in, reactivation) still holds its old
        // slot and counts where it came from until `fill_done`.
        assert!(sw <= self.swapped && self.swapped <= sw + filling, "swapped count");
        let su = self.swap.used() as u64;
        // (A lazily freed page being discarded may hold no swap slot.)
        assert!(su >= sw && su <= sw + evicting + filling, "swap slots in use");
        let used = self.staging.used() as u64;
        assert!(used >= staged && used <= staged + zapping + filling, "staging slots in use");
        assert!(self.inactive >= ina && self.inactive <= ina + evicting + zapping + filling, "inactive count");
        let locked: u64 = self.regions.iter().filter(|r| r.lock != LockMode::None).map(|r| r.range.pages()).sum();
        assert_eq!(locked, self.locked_charged, "lock charge");
        let mut lp = 0;
        self.pages.for_each_live(all, |p, m| {
            if m.has(pf::LOCKED) {
                lp += 1;
                assert!(
                    self.regions.find(p).is_some_and(|r| r.lock != LockMode::None)
                        || self.held.iter().any(|h| h.contains(p)),
                    "locked page {p:?} outside a locked region"
                );
            }
        });
        assert_eq!(lp, self.locked_pages, "locked pages count");
        let mut fp: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for r in self.regions.iter() {
            if let Some(f) = r.file() {
                *fp.entry(f).or_insert(0) += r.range.pages();
            }
        }
        assert_eq!(fp, self.file_pages, "pages per file");
        let (mut vp, mut lz) = (0, 0);
        self.pages.for_each_live(all, |_, m| {
            vp += u64::from(m.has(pf::VOLATILE));
            lz += u64::from(m.has(pf::LAZYFREE));
        });
        assert_eq!(vp, self.volatile_pages, "volatile pages count");
        assert_eq!(lz, self.lazyfree_pages, "lazyfree pages count");
    }
}

/// Grows `run` backwards and forwards over untouched pages, within `block`
/// and up to `max` pages.
fn grow_run(pages: &PageTable, run: &mut PageRange, block: PageRange, max: u64) {
    while run.start > block.start && run.pages() < max && pages.get(PageIdx(run.start.0 - 1)) == PageMeta::default() {
        run.start.0 -= 1;
    }
    while run.end < block.end && run.pages() < max && pages.get(run.end) == PageMeta::default() {
        run.end.0 += 1;
    }
}

fn transfer_for(prot: i32) -> Transfer {
    if prot == PROT_READ | PROT_WRITE {
        Transfer::Move
    } else {
        Transfer::Copy { readable: prot & PROT_READ != 0 }
    }
}

/// The `UMM_PAGE_*` bits of a page.
pub fn state_bits(m: PageMeta) -> u32 {
    let mut b = 0;
    if m.state.holds_frame() {
        b |= UMM_PAGE_RESIDENT;
    }
    if m.state == PState::Inactive {
        b |= UMM_PAGE_INACTIVE;
    }
    if m.state == PState::Swapped {
        b |= UMM_PAGE_SWAPPED;
    }
    if m.has(pf::LOCKED) {
        b |= UMM_PAGE_LOCKED;
    }
    if m.has(pf::LAZYFREE) {
        b |= UMM_PAGE_LAZYFREE;
    }
    if m.has(pf::VOLATILE) {
        b |= UMM_PAGE_VOLATILE;
    }
    if m.has(pf::PURGED) {
        b |= UMM_PAGE_PURGED;
    }
    if m.has(pf::POISONED) {
        b |= UMM_PAGE_POISONED;
    }
    if m.state.holds_frame() {
        // Anonymous pages are dirty from their first fill (never backed by a
        // file); a clean-swap-cache optimisation would refine this.
        b |= UMM_PAGE_DIRTY;
    }
    b
}
