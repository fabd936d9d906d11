//! The executor's platform: every host operation the executor asks for, as
//! one trait, so that the executor can run against the host kernel
//! ([`Native`]) or against a simulated one (memory as byte arrays,
//! userfaultfd as a queue: see issue 18's seeded simulation).
//!
//! The methods are the executor's vocabulary, not the kernel's: "install
//! zeros at these pages and wake the waiters", "move these pages to those
//! staging slots", "read this run from swap into the program's range". Each
//! says what it guarantees when it returns `Ok`, and what a partial result
//! means (a prefix, in bytes). Addresses are in the space's reservation
//! (program range) or name a staging slot; the implementation checks them.
//!
//! [`Native`] delegates to `usermm_sys` (`Arena`, `Uffd`, the swap file,
//! `/proc/self/mem`, `/proc/self/pagemap`, signals and threads, host
//! locks), all of it opened by `Native::open` (`platform/open.rs`); it
//! keeps the per-thread bounce buffers the swap and file reads need.

use usermm_core::Errno;
use usermm_sys::arena::{Arena, Bounce};
/// Where the bytes of a range handed to the host come from, and what it
/// becomes a mapping of (`Platform::share`).
pub(crate) use usermm_sys::arena::{ShareSrc, ShareTo};
use usermm_sys::file::{MappedFile, Pagemap, ProcMem};

use crate::store::PageStore;
pub(crate) use in_thread::InThreadRanges;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::{Uffd, UffdMsg, UFFD_FEATURE_MOVE, UFFD_FEATURE_SIGBUS};

mod direct;
pub(crate) mod fork;
mod in_thread;
mod open;
mod ops;
mod ranges;
mod thread;
pub(crate) use thread::{program_signals_blocked, thread_creds, ThreadCreds};

pub(crate) use direct::DirectWindows;
pub(crate) use open::Setup;
pub(crate) use ops::{
    Caps, Fill, FillOps, Range, RangeOps, Runs, Signal, Staging, StagingOps, Store, StoreOps, Thread, ThreadOps,
    Upkeep, Window, Zero,
};

/// What the executor asks of the host. `Send + Sync`: handler threads, the
/// background thread and callers share one.
pub(crate) trait Platform: Send + Sync {
    /// What the host can do: fixed once the space is open.
    fn caps(&self) -> Caps;

    // ---- userfaultfd events
    /// Waits up to `timeout_ms` for a fault event or a poke of `wake`;
    /// `Ok(true)` when an event may be ready.
    fn wait_events(&self, wake: &EventFd, timeout_ms: i32) -> Result<bool, Errno>;
    /// Reads pending fault events into `buf`; returns how many.
    fn read_events(&self, buf: &mut [UffdMsg]) -> Result<usize, Errno>;

    // ---- the program range: fills (bytes installed, a prefix)
    /// Installs `len` bytes at `dst` of the program range as `op` says;
    /// returns the bytes installed (a prefix).
    fn fill(&self, op: Fill, dst: usize, len: usize) -> Result<usize, Errno>;
    /// Frames in the pool now, and pages installed from it so far.
    fn pool_stats(&self) -> (u64, u64);
    /// The first half of a swap-in installed under the core lock: reads
    /// `len` bytes of swap at `off` into this thread's buffer, or, if
    /// `pooled` (a read-write, unlocked region, not write-protected), into
    /// frames of the space's pool where it has enough.
    fn swap_read(&self, off: u64, len: usize, pooled: bool) -> Result<(), Errno>;
    /// Reads the swap pages at byte offsets `reads[i].0` (one page of `ps`
    /// bytes each) and installs each at `reads[i].1` of the program range,
    /// write-protected if `wp`, waking nobody; says for each whether it
    /// went in. By default one `Fill::SwapIn` a page; a host that can
    /// reads them in one batch.
    fn swap_gather(&self, reads: &[(u64, usize)], ps: usize, wp: bool) -> Vec<bool> {
        reads.iter().map(|&(off, dst)| self.fill(Fill::SwapIn { off, wp }, dst, ps) == Ok(ps)).collect()
    }
    /// Reads a file run into the program range (the tail past the end of
    /// the file reads zeros); also whether the page cache was used.
    fn file_in(&self, file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno>;
    /// The first half of a file read installed under the core lock: reads
    /// into this thread's buffer; returns the bytes to install (whole
    /// pages, the tail past the end of the file zeros; 0 past the end) and
    /// whether the page cache was used.
    fn file_read(&self, file: &MappedFile, off: u64, len: usize) -> Result<(usize, bool), Errno>;
    /// `file_install` of the last `file_read`'s `len` bytes at `dst` in two
    /// halves at once: `[mid, len)` by the spinning wake-ahead thread
    /// (`help`) while this thread installs `[0, mid)`, with no wake-up.
    /// Returns the bytes installed of each half (each a prefix of its half;
    /// the second may be in when the first is short). By default one half
    /// after the other, the second first: what a helper that finishes
    /// first leaves.
    fn file_install_split(&self, dst: usize, mid: usize, len: usize) -> (usize, usize) {
        let tail = self.fill(Fill::FileRead { from: mid, wake: false }, dst, len - mid).unwrap_or(0);
        (self.fill(Fill::FileRead { from: 0, wake: false }, dst, mid).unwrap_or(0), tail)
    }
    /// The wake-ahead thread's share of a `file_install_split` offered now,
    /// if any; whether it did one.
    fn help(&self) -> bool {
        false
    }
    /// Maps a window of the page cache into the program range, or takes
    /// one back (`Window`). A host without windows refuses every `Map`
    /// (the caller copies as usual) and has none to take back.
    fn window(&self, op: Window<'_>) -> Result<(), Errno> {
        match op {
            Window::Map { .. } => Err(Errno::EOPNOTSUPP),
            Window::Unmap { .. } => Ok(()),
        }
    }

    // ---- the program range: other
    /// Does `op` to `[a, a+l)` of the program range. `Ok(false)` only for
    /// a `Range::Zap` the host refused at first.
    fn range(&self, op: Range, a: usize, l: usize) -> Result<bool, Errno>;
    /// The runs `(start, end)` of `[a, a+l)` that are `what`.
    fn runs(&self, what: Runs, a: usize, l: usize) -> Vec<(usize, usize)>;

    // ---- staging
    /// Moves `n` neighbouring pages to `n` neighbouring slots; returns how
    /// many moved (a prefix).
    fn pages_to_slots_move(&self, src: usize, slot: u32, n: usize) -> Result<usize, Errno>;
    /// Moves the pages parked in `n` neighbouring slots back to `n`
    /// neighbouring empty pages at `dst`; returns how many moved (a prefix).
    fn slots_to_pages_move(&self, slot: u32, dst: usize, n: usize) -> Result<usize, Errno>;
    /// Parks readable pages nothing writes (a non-writable region's) by a
    /// copy each into its slot, then drops them from the program range in
    /// one batch; returns which are parked. By default one
    /// `Staging::FromPageCopy` a page.
    fn pages_to_slots_copy(&self, pairs: &[(usize, u32)]) -> Vec<bool> {
        pairs
            .iter()
            .map(|&(src, slot)| self.staging(Staging::FromPageCopy { src, slot, unreadable: false }).is_ok())
            .collect()
    }
    /// Does `op` with the staging area. `Ok(false)`: a `ToPageChecked` found the page
    /// discarded, a `Discard` or `MovedUnreported` said no; otherwise `Ok(true)`.
    fn staging(&self, op: Staging<'_>) -> Result<bool, Errno>;
    /// Upkeep of the host's side: the frame pool, the host's LRU.
    fn upkeep(&self, op: Upkeep);

    // ---- swap
    /// Does `op` with the page store. `Ok(false)`: a `KeepAliveDue` that is
    /// not due; otherwise `Ok(true)`.
    fn store(&self, op: Store<'_>) -> Result<bool, Errno>;
    #[cfg(feature = "test-hooks")]
    /// The whole swap file (a test hook).
    fn swap_contents(&self, len: u64) -> Result<Vec<u8>, Errno>;

    // ---- files
    /// Writes a page (from the program range at `src`, or from `slot`) to
    /// the file at `off` (never past its end).
    fn page_out_to_file(&self, file: &MappedFile, src: Option<usize>, slot: Option<u32>, off: u64)
        -> Result<(), Errno>;

    // ---- threads
    /// Does `op` with a thread of the process: signals, where threads run,
    /// the wake-ahead thread's policy, the in-thread faults' resolver
    /// (`Thread`). `Ok(false)`: a `SignalPending` whose signal was taken, a
    /// `SharesCpu` on another CPU; otherwise `Ok(true)`.
    fn thread(&self, op: Thread) -> Result<bool, Errno>;

    // ---- fork
    /// In a forked child, before anything touches the space: takes the
    /// host side over from the parent's — a userfaultfd of the child's own
    /// with the reservation and staging area registered again, `/proc`
    /// files opened again, no io_uring of the parent's used, and a swap
    /// file of the child's own for its writes, the parent's byte runs
    /// `swap_runs` (`(offset, length)`) read in place until written there
    /// (the parent keeps them: the core's swap holds). `ENOTSUP` where the
    /// host side cannot be
    /// copied (a page store that cannot be shared, page-cache
    /// windows); the space is then not the child's.
    fn fork_child(&self, _swap_runs: &[(u64, u64)]) -> Result<(), Errno> {
        Err(Errno::EOPNOTSUPP)
    }
    /// In the parent after a fork that shared swap slots with the child:
    /// the page store keeps what the child may read until `tie` says it is
    /// gone (`PageStore::child_tie`).
    fn child_tie(&self, _tie: &std::sync::Arc<fork::ChildTie>) {}
    /// Hands `[a, a+l)` (a shared region, before a fork: see
    /// `Core::hand_to_host`) to the host as shared memory: its writers wait
    /// (write protection) while the bytes of `pages` (`(offset from a,
    /// where)`) are copied to host memory — a memfd of its own, whose other
    /// pages read zeros, or the region's file — which is then mapped there
    /// with protection `prot`, served by the host and shared with forked
    /// children. From then on a zap of any
    /// part replaces it with the reservation's own mapping, advice and
    /// `Runs::SharedResident` go to the host's pages, and a forked child's
    /// userfaultfd leaves it alone. `EOPNOTSUPP` where the host cannot; on
    /// an error the range holds what it held (writers fault as a swap
    /// copy's first write does).
    fn share(
        &self,
        _a: usize,
        _l: usize,
        _prot: i32,
        _to: ShareTo<'_>,
        _pages: &[(usize, ShareSrc)],
    ) -> Result<(), Errno> {
        Err(Errno::EOPNOTSUPP)
    }
}

/// The host kernel.
pub(crate) struct Native {
    pub arena: Arena,
    pub uffd: Uffd,
    pub swap: Option<Box<dyn PageStore>>,
    pub procmem: Option<ProcMem>,
    pub pagemap: Option<Pagemap>,
    pub page_size: usize,
    /// The space's io_uring instances, for file reads and the swap file's
    /// (`usermm_sys::ring`).
    pub rings: std::sync::Arc<usermm_sys::ring::RingPool>,
    /// Halves of installs lent to the wake-ahead thread
    /// (`file_install_split`).
    pub lender: usermm_sys::lend::Lender,
    /// The ranges of `UMM_MAP_INTHREAD` regions, in a space whose other
    /// faults go to handler threads.
    pub in_thread: InThreadRanges,
    /// The windows mapped from the page cache (`file_map`).
    pub direct: DirectWindows,
    /// The ranges handed to the host as shared memory (`Platform::share`).
    pub shared: DirectWindows,
    /// `caps()`, worked out at its first call (one load after that: it is
    /// asked on every swap-in).
    pub caps: std::sync::OnceLock<Caps>,
    /// The reservation's entry in the SIGBUS handler's table, from the
    /// first `Thread::InThreadOn` to `Thread::InThreadOff`.
    pub in_thread_entry: std::sync::Mutex<Option<usermm_sys::inthread::Registration>>,
    /// Whether a forked child gets a copy: asked for (`Setup`), and the
    /// page store can be shared (`PageStore::forks`).
    pub fork_copies: bool,
}

impl Native {
    /// Registers `[a, a+l)`, a fresh mapping, with the userfaultfd each
    /// part had: the second one where `UMM_MAP_INTHREAD` regions were
    /// (MISSING mode), the space's own elsewhere.
    fn register_again(&self, a: usize, l: usize) -> Result<(), Errno> {
        let mode = self.arena.program_register_mode();
        let Some(it) = self.in_thread.uffd() else { return self.uffd.register_mode(a, l, mode) };
        let (inside, outside) = self.in_thread.split(a, l)?;
        for (s, t) in inside {
            it.register_mode(s, t - s, usermm_sys::uffd::UFFDIO_REGISTER_MODE_MISSING)?;
        }
        for (s, t) in outside {
            self.uffd.register_mode(s, t - s, mode)?;
        }
        Ok(())
    }

    /// Replaces the windows from the page cache in `[a, a+l)` (`file_map`)
    /// by empty anonymous mappings of protection `prot`, registered again.
    fn replace_windows(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        for (s, t) in self.direct.inside(a, l) {
            self.direct.record(s, t - s, false);
            self.arena.replace(s, t - s, prot, &|s, n| self.register_again(s, n))?;
        }
        Ok(())
    }

    /// Replaces the ranges handed to the host in `[a, a+l)` (`share`) by
    /// empty anonymous mappings of protection `prot`, registered again.
    fn replace_shared(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        for (s, t) in self.shared.inside(a, l) {
            self.shared.record(s, t - s, false);
            self.arena.replace(s, t - s, prot, &|s, n| self.register_again(s, n))?;
        }
        Ok(())
    }

    /// The userfaultfd that may move a page to `dst` (`UFFDIO_MOVE`
    /// checks the destination's own).
    fn dst_uffd(&self, dst: usize) -> &Uffd {
        self.in_thread.covering(dst).unwrap_or(&self.uffd)
    }
}

std::thread_local! {
    /// Pool frames this thread's last `swap_read` read into, for its
    /// `swap_install`.
    static TAKEN: std::cell::Cell<Option<usermm_sys::arena::Taken>> = const { std::cell::Cell::new(None) };
}

/// Bounce buffers are per thread, grown to the largest request seen.
const BOUNCE_MIN_BYTES: usize = 1 << 20;

thread_local! {
    static BOUNCE: std::cell::RefCell<Option<Bounce>> = const { std::cell::RefCell::new(None) };
}

/// Registers, in a thread usermm starts, every thread-local with a
/// destructor that its work may touch, before it does any: the C library
/// registers such a destructor (`__cxa_thread_atexit_impl`) under the
/// dynamic loader's lock, and a program thread that faults on the space
/// while holding that lock (`dlclose` freeing a scope array from the heap,
/// as PAM's `pam_end` does) would wait on a handler that waits on it.
pub(crate) fn warm_thread_locals() {
    TAKEN.with(|_| ());
    BOUNCE.with(|_| ());
    thread::warm_thread_locals();
    usermm_sys::arena::warm_thread_locals();
}

fn with_bounce<R>(len: usize, f: impl FnOnce(&Bounce) -> R) -> Option<R> {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().is_none_or(|x| x.len() < len) {
            // (The old buffer goes first: never two at once.)
            *b = None;
            *b = Bounce::new(len.max(BOUNCE_MIN_BYTES)).ok();
        }
        b.as_ref().map(f)
    })
}

impl RangeOps for Native {
    fn page_gone(&self, a: usize) -> bool {
        self.arena.page_gone(a)
    }
    fn unprotect(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.arena.unprotect(&self.uffd, a, l)
    }
    fn wake(&self, a: usize, l: usize) -> Result<(), Errno> {
        if self.uffd.has(UFFD_FEATURE_SIGBUS) {
            // In-thread faults: no thread ever waits in the kernel.
            return Ok(());
        }
        self.arena.wake(&self.uffd, a, l)
    }
    fn poison(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.arena.poison(&self.uffd, a, l)
    }
    fn set_in_thread(&self, a: usize, l: usize, on: bool) -> Result<(), Errno> {
        self.in_thread.set(&self.uffd, self.arena.program_register_mode(), a, l, on)
    }
    fn protect(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        self.arena.protect(a, l, prot)
    }
    fn zap(&self, a: usize, l: usize, prot: i32) -> Result<bool, Errno> {
        // A window mapped from the page cache is a file mapping, which
        // MADV_DONTNEED would leave in place (the next touch would map the
        // file's page behind usermm's back): it is replaced instead; so is
        // memory handed to the host (`share`).
        self.replace_windows(a, l, prot)?;
        self.replace_shared(a, l, prot)?;
        // (Only a range the host refused to drop is mapped afresh, and then
        // registered again: each part with the userfaultfd it had.)
        self.arena.zap(a, l, prot, &|s, n| self.register_again(s, n))
    }
    fn dontneed(&self, a: usize, l: usize) -> Result<(), Errno> {
        // (Windows from the page cache are in locked regions, whose pages
        // are never dropped this way; one that were would be replaced, as
        // a zap replaces it.)
        self.replace_windows(a, l, usermm_core::consts::PROT_READ)?;
        self.arena.dontneed(a, l)
    }
    fn host_advise(&self, a: usize, l: usize, advice: i32) -> Result<(), Errno> {
        let shared = self.shared.inside(a, l);
        if shared.is_empty() {
            return self.arena.host_advise(a, l, advice);
        }
        // (The core asks this only of whole regions of one kind.)
        for (s, t) in shared {
            self.arena.shared_advise(s, t - s, advice)?;
        }
        Ok(())
    }
    fn host_free(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.arena.host_free(a, l)
    }
    fn host_populate_write(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.arena.host_populate_write(a, l)
    }
    fn host_lock(&self, a: usize, l: usize, locked: bool) -> Result<(), Errno> {
        if locked {
            usermm_sys::mem::mlock2(a, l, usermm_core::consts::MLOCK_ONFAULT)
        } else {
            usermm_sys::mem::munlock(a, l)
        }
    }
}

impl StagingOps for Native {
    fn slot_to_page(&self, slot: u32, dst: usize, try_move: bool, wp: bool, release: bool) -> Result<(), Errno> {
        self.arena.slot_to_page(self.dst_uffd(dst), slot, dst, try_move, wp, release)
    }
    fn slot_to_page_checked(&self, slot: u32, dst: usize) -> Result<bool, Errno> {
        with_bounce(self.page_size, |b| self.arena.slot_to_page_checked(&self.uffd, slot, dst, b))
            .unwrap_or(Err(Errno::ENOMEM))
    }
    fn page_to_slot_copy(&self, src: usize, slot: u32, unreadable: bool) -> Result<(), Errno> {
        if unreadable {
            let pm = self.procmem.as_ref().ok_or(Errno::EFAULT)?;
            self.arena.page_to_slot_copy_unreadable(&self.uffd, src, slot, pm)
        } else {
            // (A batch of one.)
            match self.pages_to_slots_copy(&[(src, slot)])[..] {
                [true] => Ok(()),
                _ => Err(Errno::EEXIST),
            }
        }
    }
    fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno> {
        // (Into the pool as far as it has room: `Arena::recycle_slots`.)
        self.arena.recycle_slots(&self.uffd, slot, n)
    }
    fn drop_slot_list(&self, slots: &[u32]) -> Result<(), Errno> {
        self.arena.drop_slot_list(slots)
    }
    fn discard_slot(&self, slot: u32) -> bool {
        self.arena.discard_slot(slot)
    }
    fn moved_unreported(&self, src: usize, slot: u32) -> bool {
        self.arena.moved_unreported(self.dst_uffd(src), src, slot)
    }
    fn host_free_slot(&self, slot: u32) -> Result<(), Errno> {
        self.arena.host_free_slot(slot)
    }
}

impl StoreOps for Native {
    fn swap_write(&self, slots: &[u32], off: u64) -> Result<(), Errno> {
        let swap = self.swap.as_ref().ok_or(Errno::EIO)?;
        self.arena.with_slots(slots, |pages| swap.write(off, pages))
    }
    fn swap_release(&self, runs: &[(u32, u32)]) -> Result<(), Errno> {
        let swap = self.swap.as_ref().ok_or(Errno::EIO)?;
        let ps = self.page_size as u64;
        let bytes: Vec<(u64, u64)> = runs.iter().map(|&(s, n)| (u64::from(s) * ps, u64::from(n) * ps)).collect();
        swap.release(&bytes)
    }
    fn swap_scrub(&self, slots: &[u32]) -> Result<(), Errno> {
        let swap = self.swap.as_ref().ok_or(Errno::EIO)?;
        // Runs of consecutive slots, one write each (a slot's write replaces
        // all of it: the file's page, the Redis store's header and page).
        // (Page-aligned, as the swap file's `O_DIRECT` writes want.)
        let ps = self.page_size;
        let buf = vec![0u8; 2 * ps];
        let at = buf.as_ptr().align_offset(ps);
        let zero = &buf[at..at + ps];
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 && j - i < 64 {
                j += 1;
            }
            let pages: Vec<&[u8]> = vec![zero; j - i];
            swap.write(u64::from(slots[i]) * self.page_size as u64, &pages)?;
            i = j;
        }
        Ok(())
    }
    fn swap_keep_alive_due(&self) -> bool {
        self.swap.as_ref().is_some_and(|s| s.keep_alive_due())
    }
    fn swap_keep_alive(&self) {
        if let Some(s) = &self.swap {
            s.keep_alive()
        }
    }
}

impl FillOps for Native {
    fn zero(&self, how: Zero, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        match how {
            Zero::Fill => self.arena.zero_fill_wake(&self.uffd, dst, len, wake),
            Zero::Map => self.arena.zero_map_wake(&self.uffd, dst, len, wake),
            Zero::Pooled => self.arena.zero_fill_pooled(self.dst_uffd(dst), dst, len, wake),
        }
    }
    fn swap_in(&self, off: u64, dst: usize, len: usize, wp: bool) -> Result<usize, Errno> {
        let swap = self.swap.as_ref().ok_or(Errno::EIO)?;
        with_bounce(len, |b| self.arena.store_in(&self.uffd, dst, len, wp, b, |buf| swap.read(off, buf)))
            .unwrap_or(Err(Errno::ENOMEM))
    }
    fn swap_install(&self, dst: usize, len: usize, wp: bool, wake: bool) -> Result<usize, Errno> {
        if let Some(taken) = TAKEN.with(|t| t.take()) {
            return self.arena.install_taken(self.dst_uffd(dst), dst, taken, wp, wake);
        }
        with_bounce(len, |b| self.arena.install_bounce(&self.uffd, dst, len, wp, wake, b)).unwrap_or(Err(Errno::ENOMEM))
    }
    fn file_install(&self, dst: usize, from: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        with_bounce(from + len, |b| self.arena.install_bounce_part(&self.uffd, dst, from, len, false, wake, b))
            .unwrap_or(Err(Errno::ENOMEM))
    }
}

/// The page-cache windows behind `Platform::window` (`platform/direct.rs`).
impl Native {
    fn map_window(&self, file: &MappedFile, off: u64, dst: usize, len: usize, locked: bool) -> Result<(), Errno> {
        // (Pages wholly past the end of the file would be SIGBUS to the
        // program in a file mapping, but resident to the core: copied.)
        let ps = self.page_size as u64;
        if !self.direct.room() || off + len as u64 > file.size()?.div_ceil(ps) * ps {
            return Err(Errno::ENOMEM);
        }
        if let Err(e) = self.arena.map_file(dst, len, file, off, locked, &|s, n| self.register_again(s, n)) {
            // (The range is an unlocked anonymous mapping again: locked
            // again, as the region's others are, for the copy to come.)
            self.direct.refuse();
            if locked {
                let _ = self.host_lock(dst, len, true);
            }
            return Err(e);
        }
        self.direct.record(dst, len, true);
        Ok(())
    }
    fn unmap_window(&self, file: &MappedFile, off: u64, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        // The bytes from the file (the page cache the window maps: the
        // same bytes, without touching a mapping that could fault), then a
        // fresh anonymous mapping with them copied in.
        with_bounce(l, |b| {
            let n = self.arena.file_read(file, off, l, b, &self.rings)?.0;
            self.direct.record(a, l, false);
            self.arena.replace(a, l, prot, &|s, n| self.register_again(s, n))?;
            let done = self.arena.install_bounce(&self.uffd, a, n.min(l), false, false, b)?;
            if done < l {
                return Err(Errno::EIO);
            }
            Ok(())
        })
        .unwrap_or(Err(Errno::ENOMEM))
    }
}

impl Platform for Native {
    fn swap_gather(&self, reads: &[(u64, usize)], ps: usize, wp: bool) -> Vec<bool> {
        let n = reads.len();
        let Some(swap) = self.swap.as_ref() else { return vec![false; n] };
        let offs: Vec<u64> = reads.iter().map(|r| r.0).collect();
        let installed = with_bounce(n * ps, |b| {
            let mut read = Vec::new();
            let _ = self.arena.store_read(n * ps, b, |buf| {
                read = swap.read_pages(&offs, buf);
                Ok(())
            });
            // Page `i` sits at `i * ps` of the buffer; neighbouring pages
            // read are installed with one copy (a prefix of it goes in).
            let mut ok = vec![false; n];
            let mut i = 0;
            while i < n {
                let mut j = i + 1;
                while j < n && read[j] && reads[j].1 == reads[j - 1].1 + ps {
                    j += 1;
                }
                if read.get(i) == Some(&true) {
                    let got = self.arena.install_bounce_part(
                        &self.uffd,
                        reads[i].1 - i * ps,
                        i * ps,
                        (j - i) * ps,
                        wp,
                        false,
                        b,
                    );
                    let pages = got.map_or(0, |len| len / ps);
                    ok[i..i + pages].fill(true);
                } else {
                    j = i + 1;
                }
                i = j;
            }
            ok
        });
        installed.unwrap_or_else(|| vec![false; n])
    }
    fn window(&self, op: Window<'_>) -> Result<(), Errno> {
        match op {
            Window::Map { file, off, dst, len, locked } => self.map_window(file, off, dst, len, locked),
            Window::Unmap { file, off, a, l, prot } => self.unmap_window(file, off, a, l, prot),
        }
    }
    fn runs(&self, what: Runs, a: usize, l: usize) -> Vec<(usize, usize)> {
        match what {
            Runs::ZeroPage => self.pagemap.as_ref().and_then(|p| p.zero_pfn_ranges(a, l).ok()).unwrap_or_default(),
            Runs::FileWindows => self.direct.inside(a, l),
            Runs::Shared => self.shared.inside(a, l),
            Runs::SharedResident => self
                .shared
                .inside(a, l)
                .into_iter()
                .flat_map(|(s, t)| self.arena.shared_resident(s, t - s).unwrap_or_default())
                .collect(),
        }
    }
    fn upkeep(&self, op: Upkeep) {
        match op {
            Upkeep::PoolTrim { max } => self.arena.pool_trim(max.min(usize::MAX as u64) as usize),
            Upkeep::DrainLru => self.arena.drain_host_lru(),
            #[cfg(feature = "test-hooks")]
            Upkeep::ReclaimStaging => self.arena.host_reclaim_staging(),
        }
    }
    fn fill(&self, op: Fill, dst: usize, len: usize) -> Result<usize, Errno> {
        op.dispatch(self, dst, len)
    }
    fn store(&self, op: Store<'_>) -> Result<bool, Errno> {
        op.dispatch(self)
    }
    fn staging(&self, op: Staging<'_>) -> Result<bool, Errno> {
        op.dispatch(self)
    }
    fn range(&self, op: Range, a: usize, l: usize) -> Result<bool, Errno> {
        op.dispatch(self, a, l)
    }
    fn caps(&self) -> Caps {
        *self.caps.get_or_init(|| {
            let swap = self.swap.as_ref();
            Caps {
                base: self.arena.base,
                host_lazyfree: self.arena.host_lazyfree(),
                can_move: self.uffd.has(UFFD_FEATURE_MOVE),
                tracks_writes: self.arena.tracks_writes(),
                has_swap: swap.is_some(),
                swap_direct_io: swap.is_some_and(|s| s.direct_io()),
                swap_read_polls: swap.is_some_and(|s| s.read_polls()),
                swap_release_granule: swap.map_or(0, |s| s.release_granule()),
                swap_write_granule: swap.map_or(0, |s| s.write_granule()),
                swap_outage_wait: swap.and_then(|s| s.outage_wait()),
                cpus: usermm_sys::ncpus(),
                mlock_exec_only: open::host_mlock_exec_only_ok(),
            }
        })
    }
    fn wait_events(&self, wake: &EventFd, timeout_ms: i32) -> Result<bool, Errno> {
        usermm_sys::uffd::poll2(self.uffd.raw(), wake.raw(), timeout_ms)
    }
    fn read_events(&self, buf: &mut [UffdMsg]) -> Result<usize, Errno> {
        self.uffd.read_msgs(buf)
    }
    fn pool_stats(&self) -> (u64, u64) {
        (self.arena.pool_frames() as u64, self.arena.pool_installed())
    }
    fn swap_read(&self, off: u64, len: usize, pooled: bool) -> Result<(), Errno> {
        let swap = self.swap.as_ref().ok_or(Errno::EIO)?;
        if let Some(old) = TAKEN.with(|t| t.take()) {
            self.arena.drop_taken(old);
        }
        if pooled {
            if let Some(taken) = self.arena.store_read_pooled(len, |buf| swap.read(off, buf))? {
                TAKEN.with(|t| t.set(Some(taken)));
                return Ok(());
            }
        }
        with_bounce(len, |b| self.arena.store_read(len, b, |buf| swap.read(off, buf))).unwrap_or(Err(Errno::ENOMEM))
    }
    fn file_in(&self, file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno> {
        with_bounce(len, |b| self.arena.file_in(&self.uffd, file, off, dst, len, b, &self.rings))
            .unwrap_or(Err(Errno::ENOMEM))
    }
    fn file_read(&self, file: &MappedFile, off: u64, len: usize) -> Result<(usize, bool), Errno> {
        with_bounce(len, |b| self.arena.file_read(file, off, len, b, &self.rings)).unwrap_or(Err(Errno::ENOMEM))
    }
    fn file_install_split(&self, dst: usize, mid: usize, len: usize) -> (usize, usize) {
        with_bounce(len, |b| self.arena.install_bounce_split(&self.uffd, &self.lender, dst, mid, len, b))
            .map_or((0, 0), |(h, t)| (h.unwrap_or(0), t.unwrap_or(0)))
    }
    fn help(&self) -> bool {
        self.arena.help_install(&self.uffd, &self.lender)
    }
    fn pages_to_slots_move(&self, src: usize, slot: u32, n: usize) -> Result<usize, Errno> {
        self.arena.pages_to_slots_move(&self.uffd, src, slot, n)
    }
    fn pages_to_slots_copy(&self, pairs: &[(usize, u32)]) -> Vec<bool> {
        let ok = self.arena.pages_to_slots_copy(&self.uffd, pairs);
        // A window's page (a sequential read-only region's, parked by
        // `MADV_COLD` or after its advice changed) is a file mapping, which
        // the drop left in place: replaced, so that the next touch faults
        // through usermm.
        pairs
            .iter()
            .zip(ok)
            .map(|(&(src, _), ok)| {
                ok && self.replace_windows(src, self.page_size, usermm_core::consts::PROT_READ).is_ok()
            })
            .collect()
    }
    fn slots_to_pages_move(&self, slot: u32, dst: usize, n: usize) -> Result<usize, Errno> {
        self.arena.slots_to_pages_move(&self.uffd, slot, dst, n)
    }
    #[cfg(feature = "test-hooks")]
    fn swap_contents(&self, len: u64) -> Result<Vec<u8>, Errno> {
        match &self.swap {
            Some(s) => s.contents(len),
            None => Ok(Vec::new()),
        }
    }
    fn page_out_to_file(
        &self,
        file: &MappedFile,
        src: Option<usize>,
        slot: Option<u32>,
        off: u64,
    ) -> Result<(), Errno> {
        self.arena.page_out_to_file(file, src, self.procmem.as_ref(), slot, off)
    }
    fn thread(&self, op: Thread) -> Result<bool, Errno> {
        op.dispatch(self)
    }

    fn fork_child(&self, swap_runs: &[(u64, u64)]) -> Result<(), Errno> {
        if self.direct.any() {
            return Err(Errno::EOPNOTSUPP);
        }
        let Some(swap) = self.swap.as_ref().map(|s| s.fork_child(swap_runs)) else {
            return self.fork_child_host();
        };
        // (The swap file first: a store that cannot be copied leaves the
        // rest untouched.)
        swap?;
        self.fork_child_host()
    }
    fn child_tie(&self, tie: &std::sync::Arc<fork::ChildTie>) {
        if let Some(s) = &self.swap {
            s.child_tie(tie);
        }
    }
    fn share(&self, a: usize, l: usize, prot: i32, to: ShareTo<'_>, pages: &[(usize, ShareSrc)]) -> Result<(), Errno> {
        // (An in-thread region's range is registered with the second
        // userfaultfd, in MISSING mode only: no write protection.)
        if !self.fork_copies || !self.in_thread.split(a, l)?.0.is_empty() {
            return Err(Errno::EOPNOTSUPP);
        }
        // (Windows from the page cache are registered with nothing, and
        // their pages are the file's already.)
        for (s, t) in self.direct.outside(a, l) {
            self.arena.write_protect(&self.uffd, s, t - s)?;
        }
        // A page the host dropped behind usermm's back (a raw
        // `MADV_DONTNEED`) reads as zeros: copied, it would fault into our
        // own handlers, which wait for the region lock the caller holds.
        let kept: Vec<(usize, ShareSrc)>;
        let pages = match &self.pagemap {
            Some(pm) => {
                kept = pages
                    .iter()
                    .copied()
                    .filter(|&(off, src)| src != ShareSrc::Mapped || pm.gone(a + off) == Ok(false))
                    .collect();
                &kept[..]
            }
            None => pages,
        };
        let swap = self.swap.as_deref();
        let mut read = |offs: &[u64], buf: &mut [u8]| swap.map_or(vec![false; offs.len()], |s| s.read_pages(offs, buf));
        self.arena.share_out(a, l, prot, to, pages, &mut read)?;
        // (Page-cache windows there were replaced with the rest.)
        self.direct.record(a, l, false);
        self.shared.record(a, l, true);
        // (Writers that waited go to the host's pages.)
        let _ = self.arena.wake(&self.uffd, a, l);
        Ok(())
    }
}
