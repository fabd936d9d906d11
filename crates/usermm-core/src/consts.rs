//! Linux's constant values (x86-64), spelled out so that the core needs no
//! `libc`. The C ABI uses exactly these values.

pub const PROT_NONE: i32 = 0;
pub const PROT_READ: i32 = 1;
pub const PROT_WRITE: i32 = 2;
pub const PROT_EXEC: i32 = 4;
/// Every protection bit usermm understands.
pub const PROT_MASK: i32 = PROT_READ | PROT_WRITE | PROT_EXEC;

pub const MAP_SHARED: i32 = 0x01;
pub const MAP_PRIVATE: i32 = 0x02;
pub const MAP_SHARED_VALIDATE: i32 = 0x03;
/// Droppable private anonymous memory (Linux 6.11): a mapping type a space
/// does not build (`EINVAL`, as an unknown type).
pub const MAP_DROPPABLE: i32 = 0x08;
pub const MAP_TYPE: i32 = 0x0f;
pub const MAP_FIXED: i32 = 0x10;
pub const MAP_ANONYMOUS: i32 = 0x20;
pub const MAP_GROWSDOWN: i32 = 0x0100;
pub const MAP_DENYWRITE: i32 = 0x0800;
pub const MAP_EXECUTABLE: i32 = 0x1000;
pub const MAP_LOCKED: i32 = 0x2000;
pub const MAP_NORESERVE: i32 = 0x4000;
pub const MAP_POPULATE: i32 = 0x8000;
pub const MAP_NONBLOCK: i32 = 0x10000;
pub const MAP_STACK: i32 = 0x20000;
pub const MAP_HUGETLB: i32 = 0x40000;
pub const MAP_SYNC: i32 = 0x80000;
pub const MAP_FIXED_NOREPLACE: i32 = 0x100000;
/// usermm's own flag: the new region is lock-on-fault (the seed's V3
/// `MAP_LOCKONFAULT`). Linux does not use this bit.
pub const UMM_MAP_LOCKONFAULT: i32 = 0x0800_0000;
/// usermm's own flag: the new region's faults are resolved in the faulting
/// thread (the per-region form of `UMM_F_INTHREAD_FAULTS`). Linux does not
/// use this bit (and ignores it).
pub const UMM_MAP_INTHREAD: i32 = 0x1000_0000;

/// `MAP_32BIT` (x86-64).
pub const MAP_32BIT: i32 = 0x40;
/// `MAP_UNINITIALIZED` (honoured on no-MMU kernels only).
pub const MAP_UNINITIALIZED: i32 = 0x400_0000;
/// `MAP_HUGE_2MB` and `MAP_HUGE_1GB`: sizes for `MAP_HUGETLB`, in the bits
/// from 26 (`MAP_HUGE_SHIFT`).
pub const MAP_HUGE_2MB: i32 = 21 << 26;
pub const MAP_HUGE_1GB: i32 = 30 << 26;

/// The flags `MAP_SHARED_VALIDATE` accepts on any file (Linux's
/// `LEGACY_MAP_MASK`; a file system that supports `MAP_SYNC` adds it).
pub const LEGACY_MAP_MASK: i32 = MAP_SHARED
    | MAP_PRIVATE
    | MAP_FIXED
    | MAP_ANONYMOUS
    | MAP_DENYWRITE
    | MAP_EXECUTABLE
    | MAP_32BIT
    | MAP_UNINITIALIZED
    | MAP_HUGE_2MB
    | MAP_HUGE_1GB
    | MAP_GROWSDOWN
    | MAP_LOCKED
    | MAP_NORESERVE
    | MAP_POPULATE
    | MAP_NONBLOCK
    | MAP_STACK
    | MAP_HUGETLB;

pub const MADV_NORMAL: i32 = 0;
pub const MADV_RANDOM: i32 = 1;
pub const MADV_SEQUENTIAL: i32 = 2;
pub const MADV_WILLNEED: i32 = 3;
pub const MADV_DONTNEED: i32 = 4;
pub const MADV_FREE: i32 = 8;
pub const MADV_REMOVE: i32 = 9;
/// Linux 6.13's guard pages: a touch raises SIGSEGV; they survive
/// `MADV_DONTNEED` and go with `munmap` or `MADV_GUARD_REMOVE`.
pub const MADV_GUARD_INSTALL: i32 = 102;
pub const MADV_GUARD_REMOVE: i32 = 103;
pub const MADV_DONTFORK: i32 = 10;
pub const MADV_DOFORK: i32 = 11;
pub const MADV_MERGEABLE: i32 = 12;
pub const MADV_UNMERGEABLE: i32 = 13;
pub const MADV_HUGEPAGE: i32 = 14;
pub const MADV_NOHUGEPAGE: i32 = 15;
pub const MADV_DONTDUMP: i32 = 16;
pub const MADV_DODUMP: i32 = 17;
pub const MADV_WIPEONFORK: i32 = 18;
pub const MADV_KEEPONFORK: i32 = 19;
pub const MADV_COLD: i32 = 20;
pub const MADV_PAGEOUT: i32 = 21;
pub const MADV_POPULATE_READ: i32 = 22;
pub const MADV_POPULATE_WRITE: i32 = 23;
pub const MADV_HWPOISON: i32 = 100;

pub const MLOCK_ONFAULT: u32 = 1;
pub const MCL_CURRENT: i32 = 1;
pub const MCL_FUTURE: i32 = 2;
pub const MCL_ONFAULT: i32 = 4;

pub const MS_ASYNC: i32 = 1;
pub const MS_INVALIDATE: i32 = 2;
pub const MS_SYNC: i32 = 4;

/// `UMM_PAGE_*` bits of `umm_page_state`.
pub const UMM_PAGE_RESIDENT: u32 = 1 << 0;
pub const UMM_PAGE_SWAPPED: u32 = 1 << 1;
pub const UMM_PAGE_LOCKED: u32 = 1 << 2;
pub const UMM_PAGE_LAZYFREE: u32 = 1 << 3;
pub const UMM_PAGE_VOLATILE: u32 = 1 << 4;
pub const UMM_PAGE_PURGED: u32 = 1 << 5;
pub const UMM_PAGE_DIRTY: u32 = 1 << 6;
pub const UMM_PAGE_POISONED: u32 = 1 << 7;
/// usermm's own: the page is resident but on the inactive list (unmapped from
/// the program, parked in the staging area; its next touch is a minor fault).
pub const UMM_PAGE_INACTIVE: u32 = 1 << 8;

/// `UMM_F_*` bits of `umm_config.flags`.
/// Fault exactly the touched page, never around it (Linux's residency; a
/// read fault in a lock-on-fault file region still maps the aligned 64 KiB
/// window, as Linux's fault-around does there).
pub const UMM_F_EXACT_FAULTS: u32 = 1 << 0;
/// Refuse the user-mode-only fallback: `umm_open` fails with `EPERM` instead.
pub const UMM_F_REQUIRE_FULL_UFFD: u32 = 1 << 1;
/// Do not run the background reclaim thread (reclaim is then direct only).
pub const UMM_F_NO_BACKGROUND_RECLAIM: u32 = 1 << 2;
/// Use the user-mode-only userfaultfd even where full userfaultfd is
/// available (to test and measure the unprivileged fallback).
pub const UMM_F_FORCE_USER_MODE: u32 = 1 << 3;
/// Leave file pages in the host page cache after usermm reads or writes
/// them. By default they are dropped behind (`POSIX_FADV_DONTNEED`): the
/// space holds the copy it needs, and a second one would be memory its
/// budget does not see. Keeping them makes a re-read after eviction (or by
/// the next space) a page-cache hit instead of a disk read.
pub const UMM_F_KEEP_FILE_CACHE: u32 = 1 << 4;
/// Reclaim purges volatile pages before it evicts, discards or purges any
/// other page, whatever their recency (SPEC §3's option).
pub const UMM_F_PURGE_VOLATILE_FIRST: u32 = 1 << 5;
/// Faults are resolved in the faulting thread, from a SIGBUS handler usermm
/// installs (`UFFD_FEATURE_SIGBUS`), instead of by a handler thread: no
/// round trip to another thread. Its cost: a kernel-mode access to a page
/// that is not resident (`read(2)` into it, `O_DIRECT`, another process's
/// `process_vm_readv`) fails with `EFAULT`, as in the user-mode-only
/// fallback; a thread that blocks SIGBUS must not touch the space. See
/// docs/design.md, "Faults in the faulting thread".
pub const UMM_F_INTHREAD_FAULTS: u32 = 1 << 6;
/// No wake-ahead thread: while a handler thread serves a fault, nothing keeps
/// the faulting thread's idle CPU awake (by default a `SCHED_IDLE` thread
/// spins there until the fault is served, so that the faulting thread's
/// wake-up does not wait for a halted CPU; it uses CPU time no other thread
/// wanted; with `UMM_F_INTHREAD_FAULTS` it installs half of a read-only
/// lock-on-fault window instead). See docs/design.md, "Wake-ahead".
pub const UMM_F_NO_WAKE_AHEAD: u32 = 1 << 7;
/// A pool of recycled frames (opt-in): the frames of evicted, purged and
/// dropped parked pages are kept (up to an eighth of the budget, 16 to 512
/// frames, counted in the budget as free frames) instead of going back to
/// the host, and zero fills and write-fault swap-ins of read-write, unlocked
/// regions move them in (`UFFDIO_MOVE`, zeroed or overwritten first)
/// instead of allocating fresh frames (`UFFDIO_COPY`). Off by default: on
/// this project's benchmarks it measured within noise (see docs/design.md,
/// "Recycled frames").
pub const UMM_F_FRAME_POOL: u32 = 1 << 8;
/// Copy the pages of read-only shared file regions that are locked or read
/// sequentially into usermm's own frames as every other file page is,
/// instead of mapping the page cache's pages there (the default:
/// docs/design.md, "File windows from the page cache").
pub const UMM_F_COPY_LOCKED_FILES: u32 = 1 << 9;
/// Every `UMM_F_*` bit.
pub const UMM_F_ALL: u32 = UMM_F_EXACT_FAULTS
    | UMM_F_REQUIRE_FULL_UFFD
    | UMM_F_NO_BACKGROUND_RECLAIM
    | UMM_F_FORCE_USER_MODE
    | UMM_F_KEEP_FILE_CACHE
    | UMM_F_PURGE_VOLATILE_FIRST
    | UMM_F_INTHREAD_FAULTS
    | UMM_F_NO_WAKE_AHEAD
    | UMM_F_FRAME_POOL
    | UMM_F_COPY_LOCKED_FILES;
