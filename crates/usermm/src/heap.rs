//! A heap on a space: `malloc` for memory that usermm serves.
//!
//! Every [`Space`] has one heap. [`Space::heap`] hands out a [`Heap`], a
//! `Copy` handle that is an `allocator_api2` `Allocator`
//! (`allocator_api2::alloc::Allocator`): hashbrown's `HashMap::new_in`,
//! `allocator_api2`'s `Vec::new_in` and `Box::new_in` keep their data in the
//! space, under its budget, reclaim and swap. [`GlobalHeap`] is a
//! `#[global_allocator]` that opens a space of its own on the first
//! allocation, and the C ABI has `umm_malloc`, `umm_calloc`, `umm_realloc`,
//! `umm_aligned_alloc` and `umm_free` (with `USERMM_MALLOC=1` routing the
//! plain names in `usermm_compat.h`).
//!
//! # How it works
//! - **Small allocations** (up to [`SMALL_MAX_BYTES`], at an alignment up
//!   to a page) come from 36 size classes served from slabs of
//!   [`SLAB_BYTES`], each slab one class's, with a per-thread cache of
//!   blocks per class in front (no lock on the common path). What a free
//!   needs (the class, whether the block is live) is in a side table
//!   indexed by slab, not in the block: a free reads and writes nothing of
//!   the block, and a double free is refused. See `heap/small.rs`.
//! - **Medium allocations** come from [talc](https://docs.rs/talc),
//!   a boundary-tagged, binned allocator that only ever manages memory it is
//!   handed (`claim`) and never calls the host. The heap hands it *arenas*:
//!   private anonymous regions of the space, the first [`FIRST_ARENA_BYTES`],
//!   each next one twice the last up to [`MAX_ARENA_BYTES`] (or as large as
//!   one allocation needs), mapped with the space's own `mmap`.
//! - **Large allocations** (at least [`LARGE_BYTES`], a size that rises up
//!   to [`LARGE_MAX_BYTES`] as large ones are freed) are regions of their
//!   own, as glibc's `mmap` threshold does: freeing one `munmap`s it, which
//!   gives its pages and swap slots back to the space at once; shrinking one
//!   unmaps its tail; growing one maps the pages after it when they are free
//!   (`MAP_FIXED_NOREPLACE`), with no copy.
//! - **Freed memory** goes back with `MADV_FREE`: a slab whose every block
//!   is free again (when its class has another slab with room), and inside
//!   arenas, when a free releases at least [`FREE_RUN_BYTES`], the whole
//!   pages inside it (clear of talc's boundary tags at either end).
//!   `MADV_FREE` rather than `MADV_DONTNEED` because the heap reuses memory
//!   soon and often: lazily freed pages are reused with no fault and no
//!   zeroing while the space has room, and reclaim drops them first,
//!   without writing them to swap, when it has not (seed 001's point).
//!   Smaller frees that merge into a large free run are not returned (as
//!   glibc, which trims only the top of its heap). An arena run's pages
//!   wait on a short list first, so that a block freed and allocated again
//!   at once costs no call (see `heap/deferred.rs`).
//!
//! # Deadlocks it cannot have
//! The heap's lock is never held while the heap calls into a space on behalf
//! of another allocation of the same heap: a [`GlobalHeap`] routes every
//! allocation made while its own slow path runs (mapping an arena, unmapping
//! a large region, `MADV_FREE`) to the system allocator, and so does every
//! thread usermm itself starts (fault handlers, background reclaim), so that
//! a fault handler never waits on a fault it must serve. Frees are routed by
//! address: a pointer inside the space's reservation goes back to the heap,
//! any other to the system allocator.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

pub use crate::thread_role::SystemOnly;
use crate::{Config, Errno, Space, Stats};

pub(crate) mod deferred;
pub(crate) mod small;

/// Allocations of at least this many bytes are regions of their own, until
/// a large one is freed (see [`LARGE_MAX_BYTES`]).
pub const LARGE_BYTES: usize = 256 << 10;
/// Freeing a large allocation of up to this many bytes raises the size
/// from which allocations are regions to just above its size, as glibc's
/// dynamic `mmap` threshold (`DEFAULT_MMAP_THRESHOLD_MAX`, 32 MiB): a
/// program that allocates and frees a buffer of the same size over and over
/// then reuses arena memory instead of mapping, faulting in and unmapping a
/// region each time.
pub const LARGE_MAX_BYTES: usize = 32 << 20;
/// A free of at least this many bytes inside an arena lazily frees the
/// whole pages it releases.
pub const FREE_RUN_BYTES: usize = 64 << 10;
/// The first arena's size.
pub const FIRST_ARENA_BYTES: usize = 1 << 20;
/// The largest arena mapped ahead of need (an allocation that needs more
/// gets an arena of its own size).
pub const MAX_ARENA_BYTES: usize = 64 << 20;
/// The most arenas one heap maps (with the sizes above, at least
/// 60 GiB of small allocations).
pub const MAX_ARENAS: usize = 1024;
/// Bytes kept clear of talc's boundary tags at each end of a freed run
/// before its whole pages are lazily freed (talc keeps a gap's list links
/// at its low end and its size at its high end, a few words each).
pub(crate) const TAG_MARGIN: usize = 64;

/// The largest small block: allocations up to this size (at an alignment
/// up to a page) come from size classes in slabs.
pub const SMALL_MAX_BYTES: usize = 16 << 10;
/// A slab's size (and alignment from the reservation's base).
pub const SLAB_BYTES: usize = 1 << SLAB_SHIFT;
pub(crate) const SLAB_SHIFT: usize = 16;
/// Size classes: 16..128 in steps of 16, then eight per doubling up to
/// [`SMALL_MAX_BYTES`] (at most 12.5% of a block is rounding: with four,
/// as jemalloc, CPython's 1 KiB bytes objects (1,057 bytes) took 1,280 and
/// Redis's 4 KiB values (4,102) 5,120, a quarter more pages to fault and
/// swap).
pub(crate) const NCLASSES: usize = 8 + 8 * 7;

const CLASS_SIZES: [u32; NCLASSES] = {
    let mut t = [0u32; NCLASSES];
    let mut i = 0;
    while i < 8 {
        t[i] = 16 * (i as u32 + 1);
        i += 1;
    }
    let mut k = 7;
    while i < NCLASSES {
        let mut j = 1;
        while j <= 8 {
            t[i] = (1 << k) + j * (1 << (k - 3));
            i += 1;
            j += 1;
        }
        k += 1;
    }
    t
};

/// `ceil(2^32 / size)` of each class: `(off * m) >> 32` is `off / size`
/// exactly for every offset in a slab (`off * size < 2^32`).
const CLASS_RECIPROCALS: [u64; NCLASSES] = {
    let mut t = [0u64; NCLASSES];
    let mut i = 0;
    while i < NCLASSES {
        t[i] = (1u64 << 32).div_ceil(CLASS_SIZES[i] as u64);
        i += 1;
    }
    t
};

/// The block size of class `c`.
#[inline]
pub(crate) fn class_size(c: usize) -> usize {
    CLASS_SIZES[c] as usize
}

/// `off / class_size(c)` for an offset inside a slab, with no division.
#[inline]
pub(crate) fn slot_of(c: usize, off: usize) -> usize {
    debug_assert!(off < SLAB_BYTES);
    ((off as u64 * CLASS_RECIPROCALS[c]) >> 32) as usize
}

/// Blocks per slab of class `c`.
#[inline]
pub(crate) fn slab_slots(c: usize) -> usize {
    SLAB_BYTES / class_size(c)
}

/// How many blocks of class `c` a thread caches at most: 32, fewer for
/// blocks above 1 KiB (at most 32 KiB of a class, at least 4 blocks).
#[inline]
pub(crate) fn cache_cap(c: usize) -> usize {
    CACHE_CAPS[c] as usize
}

const CACHE_CAPS: [u8; NCLASSES] = {
    let mut t = [0u8; NCLASSES];
    let mut i = 0;
    while i < NCLASSES {
        let n = 32 * 1024 / CLASS_SIZES[i] as usize;
        t[i] = if n < 4 {
            4
        } else if n > small::CACHE_MAX {
            small::CACHE_MAX as u8
        } else {
            n as u8
        };
        i += 1;
    }
    t
};

/// The smallest class that holds `size` bytes (1..=[`SMALL_MAX_BYTES`]).
#[inline]
pub(crate) fn class_of(size: usize) -> usize {
    if size <= 128 {
        return size.max(1).div_ceil(16) - 1;
    }
    let k = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    8 + (k - 7) * 8 + ((size - 1 - (1 << k)) >> (k - 3))
}

/// The class for a block of `size` bytes at `align`: the smallest class
/// that holds it whose size is a multiple of `align` (blocks lie at
/// multiples of their size from a slab's start, which is page aligned).
/// `None` for blocks the slabs do not serve.
#[inline]
pub(crate) fn small_class(size: usize, align: usize, page: usize) -> Option<usize> {
    if size > SMALL_MAX_BYTES || align > page {
        return None;
    }
    let mut c = class_of(size.max(align));
    while !class_size(c).is_multiple_of(align) {
        c += 1;
        if c == NCLASSES {
            return None;
        }
    }
    Some(c)
}

/// What a heap holds, from its own counters (the space's [`Stats`] say what
/// of it is resident, swapped or lazily freed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes of the arenas mapped for medium allocations and of the slab
    /// segments mapped for small ones.
    pub arena_bytes: u64,
    /// Arenas and slab segments mapped.
    pub arenas: u64,
    /// Bytes of the regions of live large allocations.
    pub large_bytes: u64,
    /// Live large allocations (one region each).
    pub large_regions: u64,
    /// Bytes of live allocations: the size asked, for small ones their
    /// size class's (counted from the slabs' side table when asked).
    pub live_bytes: u64,
    /// Live allocations (every kind; blocks in threads' caches are not
    /// live).
    pub live_allocations: u64,
    /// Bytes given back to the space with `MADV_FREE` so far.
    pub lazily_freed_bytes: u64,
}

/// The heap's counters kept outside its lock (the arenas' live counts are
/// kept under it).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) arena_bytes: AtomicU64,
    pub(crate) arenas: AtomicU64,
    pub(crate) large_bytes: AtomicU64,
    pub(crate) large_regions: AtomicU64,
    pub(crate) live_bytes: AtomicU64,
    pub(crate) live_allocations: AtomicU64,
    pub(crate) lazily_freed_bytes: AtomicU64,
}

impl Counters {
    pub(crate) const fn new() -> Counters {
        Counters {
            arena_bytes: AtomicU64::new(0),
            arenas: AtomicU64::new(0),
            large_bytes: AtomicU64::new(0),
            large_regions: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            live_allocations: AtomicU64::new(0),
            lazily_freed_bytes: AtomicU64::new(0),
        }
    }

    pub(crate) fn snapshot(&self) -> HeapStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HeapStats {
            arena_bytes: r(&self.arena_bytes),
            arenas: r(&self.arenas),
            large_bytes: r(&self.large_bytes),
            large_regions: r(&self.large_regions),
            live_bytes: r(&self.live_bytes),
            live_allocations: r(&self.live_allocations),
            lazily_freed_bytes: r(&self.lazily_freed_bytes),
        }
    }

    pub(crate) fn allocated(&self, bytes: usize) {
        self.live_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.live_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn freed(&self, bytes: usize) {
        self.live_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
        self.live_allocations.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The size of the next arena: twice the last (the first
/// [`FIRST_ARENA_BYTES`]) up to [`MAX_ARENA_BYTES`], and at least `need`
/// rounded up to whole pages.
pub(crate) fn next_arena_bytes(last: usize, need: usize, page: usize) -> usize {
    let ahead = if last == 0 { FIRST_ARENA_BYTES } else { last.saturating_mul(2).min(MAX_ARENA_BYTES) };
    ahead.max(need.checked_next_multiple_of(page).unwrap_or(usize::MAX))
}

/// The whole pages inside the freed run `[addr, addr+len)` that are clear of
/// talc's tags: `(start, len)`, or `None` when there is no such page.
pub(crate) fn free_run_pages(addr: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    let start = addr.checked_add(TAG_MARGIN)?.checked_next_multiple_of(page)?;
    let end = (addr + len).checked_sub(TAG_MARGIN)? / page * page;
    (end > start).then(|| (start, end - start))
}

/// Whether the calling thread's allocations must not come from a space's
/// heap: one of usermm's own threads (a fault handler that allocated on
/// the heap it serves could fault on it and wait on itself), or a thread
/// inside a heap's slow path, [`GlobalHeap::with_space`] or a
/// [`SystemOnly`] guard. An allocator that stands in for the C library's
/// `malloc` (the `usermm run` preload library) sends such allocations to
/// the C library's own allocator.
#[inline]
pub fn thread_is_system_only() -> bool {
    crate::thread_role::system_only()
}

/// A [`Space`]'s heap as an `allocator_api2` `Allocator` (and so for
/// hashbrown's collections): see the [module docs](self).
///
/// ```no_run
/// use usermm::{Config, Space};
/// let space = Space::open(&Config { budget_bytes: 64 << 20, ..Config::default() }).unwrap();
/// let mut map = hashbrown::HashMap::new_in(space.heap());
/// map.insert(1u64, [0u8; 1000]);
/// let mut v = allocator_api2::vec::Vec::new_in(space.heap());
/// v.extend_from_slice(&[1u32, 2, 3]);
/// ```
#[derive(Clone, Copy)]
pub struct Heap<'a> {
    pub(crate) space: &'a Space,
}

impl std::fmt::Debug for Heap<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap").field("reservation", &self.space.reservation()).finish()
    }
}

impl<'a> Heap<'a> {
    /// The space the heap lives in.
    pub fn space(&self) -> &'a Space {
        self.space
    }

    /// The heap's own counters.
    pub fn stats(&self) -> HeapStats {
        self.space.heap.stats()
    }

    /// Gives the small blocks the calling thread keeps cached for this heap
    /// back to their slabs, and lazily frees the slabs left wholly free (a
    /// thread's exit does the same).
    pub fn flush_thread_cache(&self) {
        self.space.heap.flush_thread_cache(self.space);
    }
}

/// What [`GlobalHeap::malloc_cached`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedMalloc {
    /// The calling thread's allocations must come from the system
    /// allocator ([`thread_is_system_only`]).
    System,
    /// Nothing cached for that size (or no space open): take the full path
    /// (`umm_malloc`).
    Slow,
    /// A live block of at least the size asked, 16-byte aligned.
    Block(usize),
}

/// Where a [`GlobalHeap`] takes its space's configuration from.
#[derive(Clone, Copy)]
enum ConfigFrom {
    Fn(fn() -> Config),
    Env,
}

/// A `#[global_allocator]` on a space of its own, opened by the first
/// allocation (see the [module docs](self)).
///
/// ```no_run
/// use usermm::{Config, GlobalHeap};
///
/// #[global_allocator]
/// static HEAP: GlobalHeap = GlobalHeap::new(|| Config { budget_bytes: 256 << 20, ..Config::default() });
///
/// fn main() {
///     let v: Vec<u64> = (0..1_000_000).collect(); // in the space
///     println!("{:?}", HEAP.stats().map(|s| s.resident_pages));
/// }
/// ```
///
/// - Allocations made by usermm itself (its handler threads, the heap's own
///   slow path, and code run by [`GlobalHeap::with_space`]) come from the
///   system allocator; frees go where the pointer came from (by address).
/// - If the space cannot be opened, a message on stderr says why (once) and
///   every allocation comes from the system allocator.
/// - **fork**: a forked child gets a copy of the space, heap and all (as
///   [`Space`]'s "fork" says), and allocates and frees on it as its parent
///   did. Where the space cannot be copied (in-thread faults, a frame pool,
///   a page store), the child cannot read the parent's heap (SIGSEGV), so it
///   must only `exec` (as `std::process::Command` does, through
///   `posix_spawn`); its own new allocations come from the system
///   allocator.
/// - The space is never closed: at exit its memory simply goes away (its
///   swap file has no name; a Redis store's keys are deleted once the
///   process has gone: `docs/design.md`, "Page stores").
pub struct GlobalHeap {
    config: ConfigFrom,
    space: OnceLock<Result<Space, Errno>>,
    /// Set by the thread that opens the space.
    opening: AtomicBool,
    /// The reservation `[base, end)` once the space is open (0, 0 before):
    /// a free inside it is the heap's.
    pub(crate) base: AtomicUsize,
    pub(crate) end: AtomicUsize,
}

impl GlobalHeap {
    /// A global heap whose space is opened with `config()`.
    pub const fn new(config: fn() -> Config) -> GlobalHeap {
        GlobalHeap {
            config: ConfigFrom::Fn(config),
            space: OnceLock::new(),
            opening: AtomicBool::new(false),
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// A global heap configured by the `USERMM_*` environment variables of
    /// `usermm_compat.h`'s default space.
    pub const fn from_env() -> GlobalHeap {
        GlobalHeap {
            config: ConfigFrom::Env,
            space: OnceLock::new(),
            opening: AtomicBool::new(false),
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// Whether the space is open and this process's: in a forked child,
    /// whether the fork copied it here (opens nothing).
    pub fn open_here(&self) -> bool {
        self.space_if_open().is_some()
    }

    /// The space, opened on first use; `None` if it could not be opened,
    /// while another thread is opening it, or in a forked child
    /// (allocations then come from the system allocator).
    #[inline]
    pub(crate) fn space(&self) -> Option<&Space> {
        if let Some(r) = self.space.get() {
            return r.as_ref().ok().filter(|sp| sp.check_owner().is_ok());
        }
        self.open_space()
    }

    /// The space if it is open and this process's (a forked child's is
    /// not), with no attempt to open it.
    #[inline]
    pub(crate) fn space_if_open(&self) -> Option<&Space> {
        self.space.get()?.as_ref().ok().filter(|sp| sp.check_owner().is_ok())
    }

    /// [`GlobalHeap::space`]'s first call. Out of line and cold: a `Space`
    /// is tens of KiB, and a frame that holds one (probed page by page on
    /// every call) would cost the fast path more than the allocation.
    #[cold]
    #[inline(never)]
    fn open_space(&self) -> Option<&Space> {
        // One thread opens the space; others (among them the space's own
        // threads, which std allocates for while starting them) use the
        // system allocator meanwhile instead of waiting for it.
        if self.opening.swap(true, Ordering::AcqRel) {
            return None;
        }
        let r = {
            let _system = SystemOnly::enter();
            let cfg = match self.config {
                ConfigFrom::Fn(f) => Ok(f()),
                ConfigFrom::Env => crate::config::from_env(),
            };
            let r = cfg.and_then(|c| Space::open(&c));
            if let Err(e) = &r {
                eprintln!("usermm: GlobalHeap: cannot open its space ({e}); using the system allocator");
            }
            r
        };
        let r = self.space.get_or_init(|| r);
        if let Ok(sp) = r {
            let (base, len) = sp.reservation();
            self.base.store(base, Ordering::Release);
            self.end.store(base + len, Ordering::Release);
        }
        r.as_ref().ok()
    }

    /// Whether `p` lies in the space's reservation (so a free of it is the
    /// heap's).
    pub(crate) fn owns(&self, p: usize) -> bool {
        p >= self.base.load(Ordering::Acquire) && p < self.end.load(Ordering::Acquire)
    }

    /// Runs `f` on the heap's space (opening it if needed) with every
    /// allocation `f` makes coming from the system allocator: the only safe
    /// way to call the space (a call that allocated from the heap while
    /// holding one of the space's locks could wait on itself). `None` if the
    /// space is not open.
    pub fn with_space<R>(&self, f: impl FnOnce(&Space) -> R) -> Option<R> {
        let _system = SystemOnly::enter();
        self.space().map(f)
    }

    /// The space's [`Stats`] (see [`GlobalHeap::with_space`]).
    pub fn stats(&self) -> Option<Stats> {
        self.with_space(Space::stats)
    }

    /// The heap's own counters.
    pub fn heap_stats(&self) -> Option<HeapStats> {
        self.with_space(|sp| sp.heap.stats())
    }
}

impl Space {
    /// The space's heap, as an `allocator_api2` `Allocator` for collections
    /// (see [`Heap`]).
    pub fn heap(&self) -> Heap<'_> {
        Heap { space: self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_double_up_to_the_cap_and_fit_the_need() {
        let page = 4096;
        assert_eq!(next_arena_bytes(0, 100, page), FIRST_ARENA_BYTES);
        assert_eq!(next_arena_bytes(FIRST_ARENA_BYTES, 100, page), 2 * FIRST_ARENA_BYTES);
        assert_eq!(next_arena_bytes(MAX_ARENA_BYTES, 100, page), MAX_ARENA_BYTES);
        assert_eq!(next_arena_bytes(FIRST_ARENA_BYTES, 3 * MAX_ARENA_BYTES + 1, page), 3 * MAX_ARENA_BYTES + page);
    }

    #[test]
    fn free_runs_keep_clear_of_the_tags() {
        let page = 4096;
        // A run of exactly two pages, page aligned: the margins eat both.
        assert_eq!(free_run_pages(0x10000, 2 * page, page), None);
        // Three pages: only the middle one is clear.
        assert_eq!(free_run_pages(0x10000, 3 * page, page), Some((0x11000, page)));
        // Unaligned: whole pages only.
        assert_eq!(free_run_pages(0x10010, 4 * page, page), Some((0x11000, 2 * page)));
        assert_eq!(free_run_pages(0x10000, 10, page), None);
    }

    #[test]
    fn size_classes_hold_their_sizes_with_little_rounding() {
        assert_eq!(class_size(NCLASSES - 1), SMALL_MAX_BYTES);
        let mut last = 0;
        for c in 0..NCLASSES {
            assert!(class_size(c) > last && class_size(c).is_multiple_of(16), "{c}");
            last = class_size(c);
            assert!(slab_slots(c) >= 4 && slab_slots(c) <= SLAB_BYTES / 16);
            assert!((4..=small::CACHE_MAX).contains(&cache_cap(c)));
        }
        for size in 1..=SMALL_MAX_BYTES {
            let c = class_of(size);
            assert!(class_size(c) >= size, "{size}");
            assert!(c == 0 || class_size(c - 1) < size, "{size}: not the smallest");
            assert!(size <= 128 || class_size(c) * 8 <= size * 9 + 128, "{size}: {} rounds too much", class_size(c));
        }
        for c in 0..NCLASSES {
            for off in (0..SLAB_BYTES).step_by(16) {
                assert_eq!(slot_of(c, off), off / class_size(c), "{c} {off}");
            }
        }
        assert_eq!(small_class(SMALL_MAX_BYTES + 1, 16, 4096), None);
        assert_eq!(small_class(100, 8192, 4096), None);
        for align in [16, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
            for size in [1, 100, 1000, 5000, 9000, 12288] {
                let c = small_class(size, align, 4096).unwrap();
                assert!(class_size(c) >= size && class_size(c).is_multiple_of(align), "{size} {align}");
            }
        }
    }
}
