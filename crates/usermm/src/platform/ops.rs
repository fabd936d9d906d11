//! The values `Platform`'s calls take and give: what the host can do
//! (`Caps`), and the operations a call names (`Range`, `Staging`, `Store`,
//! `Zero`, `Thread`, `Signal`) with the traits a host implements them by.

use std::sync::Arc;

use usermm_core::Errno;
use usermm_sys::file::MappedFile;
use usermm_sys::inthread::Resolve;

/// What a [`Platform`](super::Platform) can do, fixed once the space is open.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Caps {
    /// First address of the reservation (the program range).
    pub base: usize,
    /// Whether lazily freed and parked volatile pages are handed to the
    /// host's own reclaim (`MADV_FREE` passed down, discards found by
    /// `page_gone`).
    pub host_lazyfree: bool,
    /// Whether pages can move (not copy) between the program range and
    /// staging (`UFFDIO_MOVE`).
    pub can_move: bool,
    /// Whether swapped-in pages can be installed write-protected, the first
    /// write to each reported as a WP fault (`Core::set_tracks_writes`).
    pub tracks_writes: bool,
    /// Whether there is swap (a file or a page store).
    pub has_swap: bool,
    /// Whether swap I/O bypasses the host's page cache (`O_DIRECT`).
    pub swap_direct_io: bool,
    /// Whether a swap read polls for the store's reply (`PageStore::read_polls`).
    pub swap_read_polls: bool,
    /// Swap slots the store gives back a granule at a time (0: it keeps
    /// them; `PageStore::release_granule`).
    pub swap_release_granule: u32,
    /// Swap slots the store writes as a group that fails or succeeds apart
    /// from the others (0: a write fails or succeeds as a whole;
    /// `PageStore::write_granule`).
    pub swap_write_granule: u32,
    /// How long a failing page store may take to come back by itself
    /// (`PageStore::outage_wait`).
    pub swap_outage_wait: Option<std::time::Duration>,
    /// CPUs online (at least 1).
    pub cpus: usize,
    /// Whether the host's `mlock` of exec-only memory, which it may not
    /// populate, succeeds (with nothing populated) rather than failing
    /// with `ENOMEM`: builds of Linux 6.18 differ (`host_mlock_exec_only`).
    pub mlock_exec_only: bool,
}

/// What [`Platform::range`](super::Platform::range) does to a range of the program range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Range {
    /// Wakes the threads waiting on it.
    Wake,
    /// Places poison markers: a touch raises SIGBUS.
    Poison,
    /// Lifts the write protection and wakes its waiters.
    Unprotect,
    /// Makes the faults of a new region's range resolved in the faulting
    /// thread (`true`, `UMM_MAP_INTHREAD`) or by the space's handler
    /// threads. Not asked in a space whose faults are all resolved in the
    /// faulting thread; a host without the distinction does nothing.
    InThread(bool),
    /// Sets the host protection (`PROT_*`).
    Protect(i32),
    /// Drops every page whatever the host says (see `Arena::zap`), leaving
    /// the protection given.
    Zap(i32),
    /// Drops the pages (`MADV_DONTNEED`).
    Dontneed,
    /// Passes an advice down to the host as it is.
    Advise(i32),
    /// Hands the pages to the host's lazy free.
    Free,
    /// The host's own write populate (faults into our handlers where a
    /// page is missing).
    PopulateWrite,
    /// Locks (`MLOCK_ONFAULT`, `true`) or unlocks the range in the host.
    Lock(bool),
    /// Asks whether the host dropped the (lazily freed) page at the
    /// range's start: `Ok(true)` if it did.
    Gone,
}

impl Range {
    /// Carries out `op` with the host's range operations.
    pub(crate) fn dispatch<H: RangeOps + ?Sized>(self, h: &H, a: usize, l: usize) -> Result<bool, Errno> {
        let done = match self {
            Range::Wake => h.wake(a, l),
            Range::Poison => h.poison(a, l),
            Range::Unprotect => h.unprotect(a, l),
            Range::InThread(on) => h.set_in_thread(a, l, on),
            Range::Protect(prot) => h.protect(a, l, prot),
            Range::Zap(prot) => return h.zap(a, l, prot),
            Range::Dontneed => h.dontneed(a, l),
            Range::Advise(advice) => h.host_advise(a, l, advice),
            Range::Free => h.host_free(a, l),
            Range::PopulateWrite => h.host_populate_write(a, l),
            Range::Lock(locked) => h.host_lock(a, l, locked),
            Range::Gone => return Ok(h.page_gone(a)),
        };
        done.map(|()| true)
    }
}

/// The operations behind [`Platform::range`](super::Platform::range), one a [`Range`], as a host
/// implements them.
pub(crate) trait RangeOps {
    fn wake(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn poison(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn unprotect(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn set_in_thread(&self, a: usize, l: usize, on: bool) -> Result<(), Errno> {
        let _ = (a, l, on);
        Ok(())
    }
    fn protect(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno>;
    fn zap(&self, a: usize, l: usize, prot: i32) -> Result<bool, Errno>;
    fn dontneed(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn host_advise(&self, a: usize, l: usize, advice: i32) -> Result<(), Errno>;
    fn host_free(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn host_populate_write(&self, a: usize, l: usize) -> Result<(), Errno>;
    fn host_lock(&self, a: usize, l: usize, locked: bool) -> Result<(), Errno>;
    fn page_gone(&self, a: usize) -> bool;
}

/// Which runs of a range [`Platform::runs`](super::Platform::runs) lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runs {
    /// Mapped to the shared zero page.
    ZeroPage,
    /// Mapped by a `Window::Map` (the page cache's own pages).
    FileWindows,
    /// Handed to the host (`Platform::share`).
    Shared,
    /// In memory, of the ranges handed to the host.
    SharedResident,
}

/// What [`Platform::window`](super::Platform::window) does.
#[derive(Clone, Copy)]
pub(crate) enum Window<'a> {
    /// Maps the program range `[dst, dst+len)` to `file` at `off`: the
    /// page cache's own pages, read-only, shared, populated (and locked if
    /// `locked`), instead of copies (the window of a read-only shared file
    /// region that is locked or read sequentially). Fails (and the caller
    /// copies as usual) where the host does not or cannot: past the end of
    /// the file, too many windows already, a lock limit. No thread is
    /// woken.
    Map { file: &'a MappedFile, off: u64, dst: usize, len: usize, locked: bool },
    /// Makes the part `[a, a+l)` of a window usermm's own pages again,
    /// keeping their bytes (read from `file` at `off`): an anonymous
    /// mapping of protection `prot` with copies installed.
    Unmap { file: &'a MappedFile, off: u64, a: usize, l: usize, prot: i32 },
}

/// Upkeep of the host's side ([`Platform::upkeep`](super::Platform::upkeep)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upkeep {
    /// Drops pool frames until at most `max` are left.
    PoolTrim { max: u64 },
    /// Flushes the host's per-CPU LRU batches.
    DrainLru,
    /// The host's own reclaim of the whole staging area (a test hook).
    #[cfg(feature = "test-hooks")]
    ReclaimStaging,
}

/// What [`Platform::staging`](super::Platform::staging) does with the staging area (the parked pages' slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Staging<'a> {
    /// Maps a parked page back (`try_move`: move, else copy; a copy
    /// write-protected if `wp`). A copy leaves the slot's frame in place
    /// unless `release` (the caller then drops it with `DropList`, before
    /// the slot is used again).
    ToPage { slot: u32, dst: usize, try_move: bool, wp: bool, release: bool },
    /// Maps a parked page back, checking whether the host discarded it
    /// (`Ok(false)`: it did, nothing installed).
    ToPageChecked { slot: u32, dst: usize },
    /// Copies a page to a slot, then drops it from the program range
    /// (`unreadable`: the region cannot be read by an ordinary copy).
    FromPageCopy { src: usize, slot: u32, unreadable: bool },
    /// Empties `n` slots from `slot` (their frames into the space's pool
    /// as far as it has room).
    Drop { slot: u32, n: usize },
    /// Empties `slots`, wherever they are, in one batch.
    DropList { slots: &'a [u32] },
    /// Whether the host discarded the parked (lazily freed) page.
    Discard { slot: u32 },
    /// After a move of the page at `src` to `slot` that did not report it:
    /// whether it moved all the same (the host's count is not to be trusted
    /// there; see `Arena::moved_unreported`).
    MovedUnreported { src: usize, slot: u32 },
    /// Hands a parked page to the host's lazy free (`MADV_FREE`).
    HostFree { slot: u32 },
}

impl Staging<'_> {
    /// Carries out `op` with the host's staging operations.
    pub(crate) fn dispatch<H: StagingOps + ?Sized>(self, h: &H) -> Result<bool, Errno> {
        match self {
            Staging::ToPage { slot, dst, try_move, wp, release } => {
                h.slot_to_page(slot, dst, try_move, wp, release).map(|()| true)
            }
            Staging::ToPageChecked { slot, dst } => h.slot_to_page_checked(slot, dst),
            Staging::FromPageCopy { src, slot, unreadable } => {
                h.page_to_slot_copy(src, slot, unreadable).map(|()| true)
            }
            Staging::Drop { slot, n } => h.drop_slots(slot, n).map(|()| true),
            Staging::DropList { slots } => h.drop_slot_list(slots).map(|()| true),
            Staging::Discard { slot } => Ok(h.discard_slot(slot)),
            Staging::MovedUnreported { src, slot } => Ok(h.moved_unreported(src, slot)),
            Staging::HostFree { slot } => h.host_free_slot(slot).map(|()| true),
        }
    }
}

/// The operations behind [`Platform::staging`](super::Platform::staging), one a [`Staging`], as a host
/// implements them.
pub(crate) trait StagingOps {
    fn slot_to_page(&self, slot: u32, dst: usize, try_move: bool, wp: bool, release: bool) -> Result<(), Errno>;
    fn slot_to_page_checked(&self, slot: u32, dst: usize) -> Result<bool, Errno>;
    fn page_to_slot_copy(&self, src: usize, slot: u32, unreadable: bool) -> Result<(), Errno>;
    fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno>;
    fn drop_slot_list(&self, slots: &[u32]) -> Result<(), Errno>;
    fn discard_slot(&self, slot: u32) -> bool;
    fn moved_unreported(&self, src: usize, slot: u32) -> bool;
    fn host_free_slot(&self, slot: u32) -> Result<(), Errno>;
}

/// What [`Platform::store`](super::Platform::store) asks of the page store (the swap file, a Redis
/// store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store<'a> {
    /// Writes the pages of `slots`, in order, to swap at `off`.
    Write { slots: &'a [u32], off: u64 },
    /// Gives back the store's copies of the runs `(first slot, slots)`,
    /// whole granules, none of them in use.
    Release { runs: &'a [(u32, u32)] },
    /// Overwrites the store's copies of `slots` (free, none in use) with
    /// pages of zeros: a locked page's old copy must not stay readable.
    Scrub { slots: &'a [u32] },
    /// Whether the store wants to hear that the space is alive
    /// (`PageStore::keep_alive_due`).
    KeepAliveDue,
    /// Tells the store the space is alive (`PageStore::keep_alive`).
    KeepAlive,
}

impl Store<'_> {
    /// Carries out `op` with the host's page-store operations.
    pub(crate) fn dispatch<H: StoreOps + ?Sized>(self, h: &H) -> Result<bool, Errno> {
        match self {
            Store::Write { slots, off } => h.swap_write(slots, off).map(|()| true),
            Store::Release { runs } => h.swap_release(runs).map(|()| true),
            Store::Scrub { slots } => h.swap_scrub(slots).map(|()| true),
            Store::KeepAliveDue => Ok(h.swap_keep_alive_due()),
            Store::KeepAlive => {
                h.swap_keep_alive();
                Ok(true)
            }
        }
    }
}

/// The operations behind [`Platform::store`](super::Platform::store), one a [`Store`], as a host
/// implements them.
pub(crate) trait StoreOps {
    fn swap_write(&self, slots: &[u32], off: u64) -> Result<(), Errno>;
    fn swap_release(&self, runs: &[(u32, u32)]) -> Result<(), Errno>;
    fn swap_scrub(&self, slots: &[u32]) -> Result<(), Errno>;
    fn swap_keep_alive_due(&self) -> bool {
        false
    }
    fn swap_keep_alive(&self) {}
}

/// What [`Platform::fill`](super::Platform::fill) installs, and whether it
/// wakes the waiters on the installed pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Zeros, as `how` says.
    Zero { how: Zero, wake: bool },
    /// Swap read at `off` and installed at once, write-protected if `wp`
    /// (see `Caps::tracks_writes`); nobody woken.
    SwapIn { off: u64, wp: bool },
    /// The second half of a swap-in installed under the core lock: what
    /// this thread's last `swap_read` read, write-protected if `wp`.
    SwapRead { wp: bool, wake: bool },
    /// The second half of a file read: bytes `[from, from + len)` of what
    /// this thread's last `file_read` read (for the run at `dst`), at
    /// `dst + from`.
    FileRead { from: usize, wake: bool },
}

impl Fill {
    /// Carries out `op` with the host's fill operations.
    pub(crate) fn dispatch<H: FillOps + ?Sized>(self, h: &H, dst: usize, len: usize) -> Result<usize, Errno> {
        match self {
            Fill::Zero { how, wake } => h.zero(how, dst, len, wake),
            Fill::SwapIn { off, wp } => h.swap_in(off, dst, len, wp),
            Fill::SwapRead { wp, wake } => h.swap_install(dst, len, wp, wake),
            Fill::FileRead { from, wake } => h.file_install(dst, from, len, wake),
        }
    }
}

/// The operations behind [`Platform::fill`](super::Platform::fill), one a
/// [`Fill`], as a host implements them.
pub(crate) trait FillOps {
    fn zero(&self, how: Zero, dst: usize, len: usize, wake: bool) -> Result<usize, Errno>;
    fn swap_in(&self, off: u64, dst: usize, len: usize, wp: bool) -> Result<usize, Errno>;
    fn swap_install(&self, dst: usize, len: usize, wp: bool, wake: bool) -> Result<usize, Errno>;
    fn file_install(&self, dst: usize, from: usize, len: usize, wake: bool) -> Result<usize, Errno>;
}

/// How zeros go in ([`Fill::Zero`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Zero {
    /// Private frames of zeros.
    Fill,
    /// The shared zero page (a read fault).
    Map,
    /// As `Fill`, with frames from the space's pool where it has enough
    /// (recycled, zeroed, moved in: `Arena::zero_fill_pooled`). Only for a
    /// plainly read-write, unlocked region.
    Pooled,
}

/// A signal a [`Platform`](super::Platform) queues to a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A transient SIGBUS (`si_code = SI_QUEUE`): a swap read error, no
    /// frame; `si_errno` says which (`Failure::signal_errno`).
    Bus(Errno),
    /// A SIGSEGV: a touch of unmapped memory.
    Segv,
}

/// What [`Platform::thread`](super::Platform::thread) does with a thread of
/// the process.
pub(crate) enum Thread {
    /// Queues `sig` for thread `tid` at `addr`.
    Signal { tid: u32, sig: Signal, addr: usize },
    /// Whether signal number `sig`, queued to thread `tid`, is still
    /// pending there and not blocked: `Ok(false)` once the thread has taken
    /// it; an error when that cannot be known (the thread is gone).
    SignalPending { tid: u32, sig: i32 },
    /// Whether thread `tid` last ran on the calling thread's CPU, by an
    /// answer at most `max_age_ns` old; an error when either is unknown.
    SharesCpu { tid: u32, max_age_ns: u64 },
    /// Gives the calling thread the idle policy: it runs only on a CPU with
    /// nothing else to run, and any other thread waking there preempts it
    /// (best effort: callers ignore an error).
    IdlePriority,
    /// Has the faults of `[start, end)` that are raised as a SIGBUS in the
    /// faulting thread (`UFFD_FEATURE_SIGBUS`) resolved there by
    /// `resolver`: the range goes into the SIGBUS handler's table, which
    /// holds `resolver` until `InThreadOff`. Asked again while it is there
    /// (the range and resolver stay the first), it puts usermm's handler
    /// back in front of one a program installed since. `ENOSPC`: the table
    /// is full.
    InThreadOn { start: usize, end: usize, resolver: Arc<dyn Resolve> },
    /// Takes the range out of the table, once every thread inside its
    /// resolver has left it (nothing to do if it is not there).
    InThreadOff,
}

impl Thread {
    /// Carries out `op` with the host's thread operations.
    pub(crate) fn dispatch<H: ThreadOps + ?Sized>(self, h: &H) -> Result<bool, Errno> {
        match self {
            Thread::Signal { tid, sig, addr } => h.signal(tid, sig, addr).map(|()| true),
            Thread::SignalPending { tid, sig } => h.signal_pending(tid, sig),
            Thread::SharesCpu { tid, max_age_ns } => h.shares_cpu(tid, max_age_ns),
            Thread::IdlePriority => h.idle_priority().map(|()| true),
            Thread::InThreadOn { start, end, resolver } => h.in_thread_on(start, end, resolver).map(|()| true),
            Thread::InThreadOff => {
                h.in_thread_off();
                Ok(true)
            }
        }
    }
}

/// The operations behind [`Platform::thread`](super::Platform::thread), one
/// a [`Thread`], as a host implements them.
pub(crate) trait ThreadOps {
    fn signal(&self, tid: u32, sig: Signal, addr: usize) -> Result<(), Errno>;
    fn signal_pending(&self, tid: u32, sig: i32) -> Result<bool, Errno>;
    fn shares_cpu(&self, tid: u32, max_age_ns: u64) -> Result<bool, Errno>;
    fn idle_priority(&self) -> Result<(), Errno>;
    fn in_thread_on(&self, start: usize, end: usize, resolver: Arc<dyn Resolve>) -> Result<(), Errno>;
    fn in_thread_off(&self);
}
