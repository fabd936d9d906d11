//! The core ↔ executor protocol: every plan the core hands out, every
//! outcome the executor reports back, and every reply of a decision.
//!
//! These types carry no behaviour of their own (a few constructors and
//! predicates aside); the decisions that fill them live in the concern
//! modules next to this one, and the executor (crate `usermm`) carries them
//! out. They are re-exported from `usermm_core::core` and the crate root, so
//! `usermm_core::FaultPlan` and `usermm_core::core::FaultPlan` both name them.

use crate::errno::Errno;
use crate::page::PageTable;
use crate::region::LockMode;
use crate::types::{PageIdx, PageRange};

/// Spare metadata buffers the executor allocates outside the core lock and
/// hands over with [`Core::add_spares`](super::Core::add_spares).
#[derive(Default)]
pub struct Spares {
    pub leaves: Vec<crate::page::Leaf>,
    pub active: Vec<crate::lru::Chunk<(PageIdx, u32)>>,
    pub inactive: Vec<crate::lru::Chunk<(PageIdx, u32)>>,
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

/// How a page leaves the program's range for the staging area.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Transfer {
    /// `UFFDIO_MOVE`: atomic, zero-copy; needs a `PROT_READ|PROT_WRITE` region.
    Move,
    /// Copy then drop: safe because the region is not writable, so nothing
    /// can change the page in between. `readable` says whether the executor
    /// can read it directly or must go through `/proc/self/mem`.
    Copy { readable: bool },
    /// A sampled region's page (`Core::set_sampled_refs`): its mapping is
    /// dropped and its data stays where it is, in the memory that backs the
    /// region (no staging slot is used); the program's next touch maps it
    /// back with no fault usermm sees, and a reference scan finds it mapped
    /// (see [`Evict::zapped`]). Mapping it back is the host's.
    Zap,
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
    /// A busy page (see [`Busy`]): wait for the core to change, then plan
    /// again.
    Busy,
    /// No free frame: reclaim at least `want` frames (the core's batch for
    /// the caller: small for a fault, larger for a populate), then plan
    /// again; [`Core::out_of_memory`](super::Core::out_of_memory) says when
    /// to give up.
    Reclaim { want: u64 },
    /// Install zero pages on `run` (claimed, frames charged).
    ZeroFill { run: PageRange },
    /// Read the consecutive swap slots `slot..` into the pages of `run`
    /// (claimed, frames charged). A run longer than one page is swap-in
    /// clustering: the evictor wrote neighbours to neighbouring slots.
    /// With `keep`, the pages are installed write-protected and keep their
    /// slots as swap copies (`swapcache.rs`).
    SwapIn { run: PageRange, slot: u32, keep: bool },
    /// A write to a write-protected page (its swap copy already dropped):
    /// lift the protection and wake the writer (page claimed).
    Unprotect { page: PageIdx },
    /// Map the parked page back from staging slot `slot` (claimed). With
    /// `checked`, the slot was handed to the host to discard (a volatile
    /// page): copy it through a buffer and check that the slot still held
    /// the page afterwards; if not, the host purged it (`reactivate_lost`).
    /// With `wp`, the page keeps its swap copy: copy it in write-protected
    /// (a move would map it writable).
    Reactivate { page: PageIdx, slot: u32, how: Transfer, checked: bool, wp: bool },
    /// The page cannot be served (poisoned): raise SIGBUS.
    Sigbus,
    /// Read the file into the pages of `run` (claimed, frames charged):
    /// `file_page` is the file page of `run.start`.
    FileRead { run: PageRange, file: u32, file_page: u64 },
    /// A fault on a page held as resident: a lazily freed page the host
    /// kernel discarded, or one dropped by a raw `madvise` behind usermm's
    /// back. Install a zero page (its frame is still charged), as a discard
    /// reads back as zeros; if the page is there (the fault raced with its
    /// fill), the copy installs nothing.
    Refill { page: PageIdx },
}

impl FaultPlan {
    /// What it means when this plan's fill did not install the page it was
    /// made for: backing that cannot be read (swap, a file, past its end),
    /// or a fill the host refused that a retry may get past.
    pub fn unfilled(&self) -> Failure {
        match self {
            FaultPlan::SwapIn { .. } | FaultPlan::FileRead { .. } => Failure::Unreadable,
            _ => Failure::NotFilled,
        }
    }
}

/// Why a plan could not serve the page it was made for. The executor's one
/// dispatcher (`serve`) meets these the same way for every caller; only the
/// report differs: a fault reports with a signal (or lets the thread retry),
/// a populate with the errno [`Failure::populate_errno`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The address is in no region (unmapped meanwhile): SIGSEGV.
    Gone,
    /// No frame can be had ([`Core::out_of_memory`](super::Core::out_of_memory)):
    /// SIGBUS (the kernel would OOM-kill).
    OutOfMemory,
    /// A poisoned or purged page: SIGBUS.
    Poisoned,
    /// Swap or the file could not be read (an I/O error, past the end of
    /// the file): a SIGBUS.
    Unreadable,
    /// The host installed nothing (a transient refusal): the thread faults
    /// again.
    NotFilled,
}

impl Failure {
    /// The `si_errno` of the SIGBUS a fault gets for it (`SI_QUEUE`): no
    /// frame is `ENOMEM`, an I/O error or a page past the end of its file
    /// `EIO`, a poisoned page `EHWPOISON` (0 for a failure that is no
    /// SIGBUS).
    pub fn signal_errno(self) -> Errno {
        match self {
            Failure::OutOfMemory => Errno::ENOMEM,
            Failure::Unreadable => Errno::EIO,
            Failure::Poisoned => Errno::EHWPOISON,
            Failure::Gone | Failure::NotFilled => Errno(0),
        }
    }

    /// The errno a populate (`MADV_POPULATE_*`, `umm_populate`, a lock's
    /// population) returns for it, as Linux's `faultin_page` maps a fault's
    /// `VM_FAULT_*`: no VMA is `ENOMEM`, `VM_FAULT_OOM` is `ENOMEM`,
    /// `VM_FAULT_HWPOISON` is `EHWPOISON`, `VM_FAULT_SIGBUS` is `EFAULT`.
    pub fn populate_errno(self) -> Errno {
        match self {
            Failure::Gone | Failure::OutOfMemory => Errno::ENOMEM,
            Failure::Poisoned => Errno::EHWPOISON,
            Failure::Unreadable | Failure::NotFilled => Errno::EFAULT,
        }
    }
}

/// A file mapping's description, from the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMap {
    /// The executor's id for the open file (never 0).
    pub id: u32,
    /// Whether the descriptor is open for writing.
    pub writable: bool,
    /// Whether the descriptor is open for reading (`EACCES` otherwise).
    pub readable: bool,
    /// Whether the file's type can be mapped (`ENODEV` otherwise).
    pub mappable: bool,
    /// The file is `/dev/zero`: once checked, the mapping is anonymous
    /// memory (private, or shared), as Linux's `mmap_zero` makes it.
    pub zero: bool,
    /// The end no mapping of the file may pass, in bytes (Linux's
    /// `file_mmap_size_max`; `EOVERFLOW` past it).
    pub size_max_bytes: u64,
    /// The mapping's offset in the file, in pages.
    pub off_pages: u64,
}

impl FileMap {
    /// A mappable, readable file's description (`size_max_bytes` that of a
    /// regular file).
    pub fn regular(id: u32, writable: bool, off_pages: u64) -> FileMap {
        FileMap {
            id,
            writable,
            readable: true,
            mappable: true,
            zero: false,
            size_max_bytes: i64::MAX as u64,
            off_pages,
        }
    }
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

/// One eviction: write staging slot `staging` to swap slot `swap`; with
/// `clean`, `swap` already holds the page's data (its swap copy): write
/// nothing, drop the staging frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evict {
    pub page: PageIdx,
    pub staging: u32,
    pub swap: u32,
    pub clean: bool,
    /// The page was parked by [`Transfer::Zap`]: its data is in the region's
    /// backing memory, not in `staging`, and the program may have touched
    /// it since. The executor write-protects it, and if a reference scan
    /// finds it mapped commits `evict_touched` instead (it stays);
    /// otherwise it writes it from the backing memory and frees it there.
    pub zapped: bool,
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

/// The core's one "busy, come back later" reply: a page (or range) the
/// call needs is being worked on by an executor (filled, parked, evicted,
/// zapped, unmapped). The caller waits for the executor's `settled` signal
/// and calls again. Plans say it as `FaultPlan::Busy` and
/// `MmapReply::Busy`; calls that return a `Result` say `Err(Busy)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

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
    /// `MAP_FIXED` over a range still being unmapped (see [`Busy`]): wait
    /// and call again.
    Busy,
}
