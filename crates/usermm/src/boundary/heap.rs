//! The heap's `unsafe` half (the policy and the docs are in `heap.rs`):
//! talc over the space's arenas, large allocations as regions, and the
//! allocator traits (`heap/traits.rs`: [`GlobalAlloc`] for [`GlobalHeap`],
//! `allocator_api2`'s `Allocator` for [`Heap`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::{AllocError, Allocator};
use talc::base::Talc;
use talc::source::Manual;
use talc::DefaultBinning;

use crate::consts::{MADV_FREE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use crate::heap::deferred::Deferred;
use crate::heap::small::{Cached, Small, SmallFree};
use crate::heap::{
    class_of, class_size, free_run_pages, next_arena_bytes, small_class, Counters, GlobalHeap, Heap, HeapStats,
    FREE_RUN_BYTES, LARGE_BYTES, LARGE_MAX_BYTES, MAX_ARENAS, SMALL_MAX_BYTES, TAG_MARGIN,
};
use crate::thread_role::{system_only, SystemOnly};
use crate::Space;

mod traits;

/// talc and the arenas it was handed.
struct Arenas {
    talc: Talc<Manual, DefaultBinning>,
    /// `(base, len)` of each arena, sorted by base; the first `n` are live.
    spans: [(usize, usize); MAX_ARENAS],
    n: usize,
    /// The last arena's size (the next one doubles it).
    last: usize,
    /// Live allocations in the arenas and their requested bytes (counted
    /// under the lock: no atomic operation on the fast path).
    live: u64,
    live_bytes: u64,
    /// The live large allocations: their region's base and length in
    /// bytes. Invariant: an entry's region is mapped (an entry is added
    /// after its `mmap` and removed before its `munmap`, both under this
    /// lock), so memory an entry covers can be read while the lock is held.
    /// Changed only with [`SystemOnly`] entered: a [`GlobalHeap`] must not
    /// allocate the map's nodes from itself while its lock is held.
    large: BTreeMap<usize, usize>,
    /// Freed runs whose pages wait to be lazily freed (`heap/deferred.rs`).
    deferred: Deferred,
}

impl Arenas {
    fn contains(&self, p: usize) -> bool {
        let i = self.spans[..self.n].partition_point(|&(b, _)| b <= p);
        i > 0 && p - self.spans[i - 1].0 < self.spans[i - 1].1
    }

    /// Whether `p` lies in a live large allocation's region.
    fn in_large(&self, p: usize) -> bool {
        self.large.range(..=p).next_back().is_some_and(|(&b, &len)| p - b < len)
    }

    /// talc placed (or grew) a block at `[p, p+size)`: its pages, and those
    /// of the tags talc wrote beside it, leave the deferred runs.
    fn placed(&mut self, p: usize, size: usize, page: usize) {
        if !self.deferred.is_empty() {
            let lo = p.saturating_sub(TAG_MARGIN) / page * page;
            let hi = p.saturating_add(size).saturating_add(TAG_MARGIN).saturating_add(page - 1) / page * page;
            self.deferred.take(lo, hi);
        }
    }

    /// Whether `p` lies in memory the heap holds mapped: an arena (never
    /// unmapped) or a live large allocation.
    fn holds(&self, p: usize) -> bool {
        self.contains(p) || self.in_large(p)
    }
}

/// A space's heap: see `heap.rs`. Every method takes the space it belongs
/// to (the space owns its heap).
pub(crate) struct HeapCore {
    /// Small blocks: size classes in slabs, per-thread caches (no lock on
    /// the common path).
    small: Small,
    /// Medium blocks (talc) and the large ones' set.
    arenas: Mutex<Arenas>,
    counters: Counters,
    /// Allocations of at least this many bytes are regions of their own:
    /// [`LARGE_BYTES`], raised past each large allocation freed of up to
    /// [`LARGE_MAX_BYTES`].
    large_min: AtomicUsize,
}

/// Allocations of size 0 are served (and freed) as size 1.
fn nonzero(l: Layout) -> Layout {
    if l.size() == 0 {
        // An alignment that came in a `Layout` stays valid with size 1.
        Layout::from_size_align(1, l.align()).unwrap_or(l)
    } else {
        l
    }
}

const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

impl HeapCore {
    /// The heap of a space whose reservation is `[base, base + len)`.
    /// `budget_bytes`: the space's budget (it bounds the freed pages that
    /// wait to be lazily freed).
    pub(crate) fn new(base: usize, len: usize, budget_bytes: usize) -> HeapCore {
        HeapCore {
            small: Small::new(base, len),
            arenas: Mutex::new(Arenas {
                talc: Talc::new(Manual),
                spans: [(0, 0); MAX_ARENAS],
                n: 0,
                last: 0,
                live: 0,
                live_bytes: 0,
                large: BTreeMap::new(),
                deferred: Deferred::new(Deferred::bound_for(budget_bytes)),
            }),
            counters: Counters::new(),
            large_min: AtomicUsize::new(LARGE_BYTES),
        }
    }

    /// The heap's counters: the large allocations' from the atomics, the
    /// arenas' from under the lock.
    pub(crate) fn stats(&self) -> HeapStats {
        let mut s = self.counters.snapshot();
        {
            let a = self.lock();
            s.live_allocations += a.live;
            s.live_bytes += a.live_bytes;
        }
        let (n, bytes) = self.small.live();
        s.live_allocations += n;
        s.live_bytes += bytes;
        use std::sync::atomic::Ordering::Relaxed;
        let sh = self.small.shared();
        s.arena_bytes += sh.segment_bytes.load(Relaxed);
        s.arenas += sh.segments.load(Relaxed);
        s.lazily_freed_bytes += sh.lazily_freed_bytes.load(Relaxed);
        s
    }

    fn lock(&self) -> MutexGuard<'_, Arenas> {
        self.arenas.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fork holds every lock of the heap (a thread holding one at the fork
/// would leave it held in the child for good), before the space's own: the
/// heap calls into its space under them.
impl crate::native::ForkLocks for HeapCore {
    fn keep_across_fork(self: std::sync::Arc<Self>) {
        crate::platform::fork::keep(self.clone(), |h| Box::new(h.lock()), false);
        self.small.keep_across_fork();
    }
}

impl HeapCore {
    /// Allocates `layout`; also says whether the memory is a fresh region
    /// (and so reads as zeros). `None` when the space gives no more memory
    /// (or in a forked child). `slabs`: whether a small layout may come
    /// from a slab (the C calls' blocks with a header may not: a free tells
    /// slab blocks by address).
    fn alloc_inner(&self, sp: &Space, layout: Layout, slabs: bool) -> Option<(NonNull<u8>, bool)> {
        sp.check_owner().ok()?;
        let layout = nonzero(layout);
        if let Some(class) = small_class(layout.size(), layout.align(), sp.page_size()).filter(|_| slabs) {
            if let Some(p) = self.small.alloc(sp, class) {
                return NonNull::new(p as *mut u8).map(|p| (p, false));
            }
            // No room for a new slab: try the arenas.
        }
        if layout.size() >= self.large_min.load(Relaxed) && layout.align() <= sp.page_size() {
            if let Some(p) = self.map_large(sp, layout.size()) {
                self.counters.allocated(layout.size());
                return Some((p, true));
            }
            // The region limit, or no room left in the reservation for a
            // region: try the arenas.
        }
        let mut a = self.lock();
        loop {
            // SAFETY: `nonzero` made the size nonzero.
            if let Some(p) = unsafe { a.talc.try_allocate(layout) } {
                a.live += 1;
                a.live_bytes += layout.size() as u64;
                a.placed(p.as_ptr() as usize, layout.size(), sp.page_size());
                return Some((p, false));
            }
            self.grow(&mut a, sp, layout)?;
        }
    }

    pub(crate) fn alloc(&self, sp: &Space, layout: Layout) -> Option<NonNull<u8>> {
        self.alloc_inner(sp, layout, true).map(|(p, _)| p)
    }

    pub(crate) fn alloc_zeroed(&self, sp: &Space, layout: Layout) -> Option<NonNull<u8>> {
        self.alloc_zeroed_in(sp, layout, true)
    }

    /// A block for a C allocation with a header: never from a slab.
    pub(crate) fn alloc_headed(&self, sp: &Space, layout: Layout, zeroed: bool) -> Option<NonNull<u8>> {
        if zeroed {
            self.alloc_zeroed_in(sp, layout, false)
        } else {
            self.alloc_inner(sp, layout, false).map(|(p, _)| p)
        }
    }

    fn alloc_zeroed_in(&self, sp: &Space, layout: Layout, slabs: bool) -> Option<NonNull<u8>> {
        let (p, fresh) = self.alloc_inner(sp, layout, slabs)?;
        if !fresh {
            // SAFETY: `p` is a new allocation of at least `layout.size()`
            // bytes, ours to write.
            unsafe { p.as_ptr().write_bytes(0, layout.size()) };
        }
        Some(p)
    }

    /// Maps the next arena, big enough for `layout`, and gives it to talc.
    /// Called with the arenas locked; the space's calls allocate from the
    /// system allocator meanwhile (a [`GlobalHeap`] would otherwise come
    /// back here).
    fn grow(&self, a: &mut Arenas, sp: &Space, layout: Layout) -> Option<()> {
        if a.n == MAX_ARENAS {
            return None;
        }
        let page = sp.page_size();
        // Room for the allocation at any alignment, its tags, and (in the
        // first arena) talc's bin table.
        let need = layout.size().checked_add(layout.align())?.checked_add(2 * page)?;
        let len = next_arena_bytes(a.last, need, page);
        let _system = SystemOnly::enter();
        let base = sp.mmap(0, len, RW, ANON, -1, 0).ok()?;
        // SAFETY: `[base, base+len)` is a fresh private region of the space
        // that nothing else knows of; the heap never unmaps it, so it stays
        // valid for as long as talc (in the space) lives.
        if unsafe { a.talc.claim(base as *mut u8, len) }.is_none() {
            let _ = sp.munmap(base, len);
            return None;
        }
        let i = a.spans[..a.n].partition_point(|&(b, _)| b < base);
        a.spans.copy_within(i..a.n, i + 1);
        a.spans[i] = (base, len);
        a.n += 1;
        a.last = len;
        self.counters.arena_bytes.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        self.counters.arenas.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(())
    }

    fn map_large(&self, sp: &Space, size: usize) -> Option<NonNull<u8>> {
        let len = size.checked_next_multiple_of(sp.page_size())?;
        let _system = SystemOnly::enter();
        let addr = sp.mmap(0, len, RW, ANON, -1, 0).ok()?;
        self.lock().large.insert(addr, len);
        self.counters.large_bytes.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        self.counters.large_regions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        NonNull::new(addr as *mut u8)
    }

    /// Unmaps a large allocation's region of `len` bytes, already removed
    /// from [`Arenas::large`].
    fn unmap_large(&self, sp: &Space, addr: usize, len: usize) {
        let _system = SystemOnly::enter();
        if sp.munmap(addr, len).is_ok() {
            self.counters.large_bytes.fetch_sub(len as u64, std::sync::atomic::Ordering::Relaxed);
            self.counters.large_regions.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A small block of at least `size` bytes (16-byte aligned) for the C
    /// calls, which tell small blocks by address ([`HeapCore::free_small`]):
    /// `None` when `size` is not small; `Some(None)` when the space has no
    /// room for it.
    pub(crate) fn alloc_small(&self, sp: &Space, size: usize, zeroed: bool) -> Option<Option<NonNull<u8>>> {
        let class = small_class(size.max(1), 16, sp.page_size())?;
        if sp.check_owner().is_err() {
            return Some(None);
        }
        let Some(p) = self.small.alloc(sp, class).and_then(|p| NonNull::new(p as *mut u8)) else { return Some(None) };
        if zeroed {
            // SAFETY: `p` is a new block of `class_size(class)` bytes, ours
            // to write.
            unsafe { p.as_ptr().write_bytes(0, class_size(class)) };
        }
        Some(Some(p))
    }

    /// [`HeapCore::alloc_small`]'s common case: a block from the calling
    /// thread's cache (see [`Small::alloc_cached`]); every class is a
    /// multiple of 16 bytes, the C calls' alignment.
    #[inline]
    pub(crate) fn alloc_small_cached(&self, size: usize) -> Cached {
        if size > SMALL_MAX_BYTES {
            return Cached::Miss;
        }
        self.small.alloc_cached(class_of(size.max(1)))
    }

    /// The class a C block of `size` bytes gets (`None`: not small).
    pub(crate) fn alloc_small_class(&self, sp: &Space, size: usize) -> Option<usize> {
        small_class(size.max(1), 16, sp.page_size())
    }

    /// Frees `p` if it lies in a slab (see [`SmallFree`]): the free of a C
    /// block reads nothing of the block.
    #[inline]
    pub(crate) fn free_small(&self, sp: &Space, p: usize) -> SmallFree {
        if sp.check_owner().is_err() {
            return SmallFree::Refused;
        }
        self.small.free(Some(sp), p)
    }

    /// The usable size of the live small block at `p`; `Err` as for
    /// [`HeapCore::free_small`].
    pub(crate) fn small_usable(&self, p: usize) -> Result<usize, SmallFree> {
        self.small.live_class(p).map(class_size)
    }

    /// Gives the calling thread's cached small blocks back to their slabs.
    pub(crate) fn flush_thread_cache(&self, sp: &Space) {
        self.small.flush_thread_cache(sp);
    }

    /// Runs `f` under the heap's lock if `addr` lies in memory the heap
    /// holds mapped (an arena, or a live large allocation), so that `f` may
    /// read it: a freed large allocation's memory is unmapped. `None` (and
    /// `f` not run) otherwise.
    pub(crate) fn with_held<R>(&self, addr: usize, f: impl FnOnce() -> R) -> Option<R> {
        let a = self.lock();
        a.holds(addr).then(f)
    }

    /// Frees the allocation that `block` names, under one hold of the lock:
    /// `block` runs only if `at` lies in memory the heap holds mapped (see
    /// [`HeapCore::with_held`]) and returns the allocation's pointer and
    /// layout, or `None` to refuse. Whether it was freed: `false` when `at`
    /// is not held, `block` refused, or the pointer is neither in an arena
    /// nor a live large allocation's start.
    ///
    /// # Safety
    /// A pointer and layout `block` returns that lie in an arena are a live
    /// allocation of this heap with that layout (a large one is checked
    /// against [`Arenas::large`]).
    pub(crate) unsafe fn dealloc_checked(
        &self,
        sp: &Space,
        at: usize,
        block: impl FnOnce() -> Option<(*mut u8, Layout)>,
    ) -> bool {
        if sp.check_owner().is_err() {
            return false;
        }
        let a = self.lock();
        if !a.holds(at) {
            return false;
        }
        let Some((ptr, layout)) = block() else { return false };
        // SAFETY: the caller's.
        unsafe { self.dealloc_locked(sp, a, ptr, layout) }
    }

    /// Frees `ptr`.
    ///
    /// # Safety
    /// `ptr` came from this heap's `alloc`/`alloc_zeroed`/`realloc` with
    /// `layout` (the size and alignment of its last (re)allocation) and was
    /// not freed since.
    pub(crate) unsafe fn dealloc(&self, sp: &Space, ptr: *mut u8, layout: Layout) {
        if sp.check_owner().is_err() {
            // A forked child: the parent's heap is not there to free into.
            return;
        }
        if self.small.free(Some(sp), ptr as usize) != SmallFree::NotSmall {
            return;
        }
        let a = self.lock();
        // SAFETY: the caller's.
        unsafe { self.dealloc_locked(sp, a, ptr, layout) };
    }

    /// [`HeapCore::dealloc`] with the lock held (and released here).
    /// Whether `ptr` was freed: a pointer neither in an arena nor the start
    /// of a live large allocation is left alone.
    ///
    /// # Safety
    /// As for [`HeapCore::dealloc`], for a pointer in an arena.
    unsafe fn dealloc_locked(&self, sp: &Space, mut a: MutexGuard<'_, Arenas>, ptr: *mut u8, layout: Layout) -> bool {
        let layout = nonzero(layout);
        if !a.contains(ptr as usize) {
            // Removing may free the map's nodes, which came from the system
            // allocator (they were allocated with `SystemOnly` entered).
            let Some(len) = a.large.remove(&(ptr as usize)) else { return false };
            drop(a);
            if len <= LARGE_MAX_BYTES {
                self.large_min.fetch_max(len + 1, Relaxed);
            }
            self.counters.freed(layout.size());
            self.unmap_large(sp, ptr as usize, len);
            return true;
        }
        a.live -= 1;
        a.live_bytes -= layout.size() as u64;
        // SAFETY: the caller's: `ptr` is a live allocation of `layout`
        // from talc (it lies in an arena).
        unsafe { a.talc.deallocate(ptr, layout) };
        if layout.size() >= FREE_RUN_BYTES {
            if let Some((start, len)) = free_run_pages(ptr as usize, layout.size(), sp.page_size()) {
                if a.deferred.is_full() {
                    self.lazily_free_deferred(&mut a, sp);
                }
                if a.deferred.add(start, start + len) {
                    self.lazily_free_deferred(&mut a, sp);
                }
            }
        }
        true
    }

    /// Lazily frees the deferred runs' pages. Under the lock: nothing is
    /// placed in a run before its pages are marked lazily free.
    fn lazily_free_deferred(&self, a: &mut Arenas, sp: &Space) {
        let _system = SystemOnly::enter();
        let freed = &self.counters.lazily_freed_bytes;
        a.deferred.drain(|start, len| {
            if sp.madvise(start, len, MADV_FREE).is_ok() {
                freed.fetch_add(len as u64, Relaxed);
            }
        });
    }

    /// Resizes `ptr` to `new_size` bytes (same alignment), in place when it
    /// can: a small allocation through talc, a large one by unmapping its
    /// tail or mapping the pages after it. `None` (and `ptr` untouched)
    /// when there is no memory.
    ///
    /// # Safety
    /// As for [`HeapCore::dealloc`].
    pub(crate) unsafe fn realloc(
        &self,
        sp: &Space,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: the caller's.
        unsafe { self.realloc_in(sp, ptr, layout, new_size, true) }
    }

    /// [`HeapCore::realloc`] of a C block with a header (never moved into
    /// a slab).
    ///
    /// # Safety
    /// As for [`HeapCore::dealloc`].
    pub(crate) unsafe fn realloc_headed(
        &self,
        sp: &Space,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: the caller's.
        unsafe { self.realloc_in(sp, ptr, layout, new_size, false) }
    }

    /// # Safety
    /// As for [`HeapCore::dealloc`].
    unsafe fn realloc_in(
        &self,
        sp: &Space,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
        slabs: bool,
    ) -> Option<NonNull<u8>> {
        sp.check_owner().ok()?;
        let old = nonzero(layout);
        let new = Layout::from_size_align(new_size.max(1), old.align()).ok()?;
        if let Ok(class) = self.small.live_class(ptr as usize) {
            if small_class(new.size(), new.align(), sp.page_size()) == Some(class) {
                return NonNull::new(ptr);
            }
            let p = self.alloc(sp, new)?;
            // SAFETY: both allocations are live and distinct; the old one
            // has at least `old.size()` bytes, the new one `new.size()`.
            unsafe { std::ptr::copy_nonoverlapping(ptr, p.as_ptr(), old.size().min(new.size())) };
            self.small.free(Some(sp), ptr as usize);
            return Some(p);
        }
        let mut a = self.lock();
        if a.contains(ptr as usize) {
            // SAFETY: the caller's; the new size is nonzero.
            if unsafe { a.talc.try_realloc_in_place(ptr, old, new.size()) } {
                a.live_bytes = a.live_bytes - old.size() as u64 + new.size() as u64;
                a.placed(ptr as usize, old.size().max(new.size()), sp.page_size());
                return NonNull::new(ptr);
            }
            drop(a);
        } else {
            let Some(&len) = a.large.get(&(ptr as usize)) else {
                // Not a live allocation: the caller broke the contract.
                return None;
            };
            drop(a);
            if let Some(p) = self.resize_large(sp, ptr, len, new.size()) {
                self.counters.freed(old.size());
                self.counters.allocated(new.size());
                return Some(p);
            }
        }
        // Move it: allocate, copy, free.
        let (p, _) = self.alloc_inner(sp, new, slabs)?;
        // SAFETY: both allocations are live, distinct, and at least the
        // smaller size long.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr, p.as_ptr(), old.size().min(new.size()));
            self.dealloc(sp, ptr, old);
        }
        Some(p)
    }

    /// A large allocation's region (`old_len` bytes) resized in place for
    /// `new` bytes: its tail unmapped, or the pages after it mapped when
    /// nothing is there. [`Arenas::large`] follows: shrunk before the
    /// tail is unmapped, grown after the pages are mapped.
    fn resize_large(&self, sp: &Space, ptr: *mut u8, old_len: usize, new: usize) -> Option<NonNull<u8>> {
        let page = sp.page_size();
        let new_len = new.checked_next_multiple_of(page)?;
        let addr = ptr as usize;
        let _system = SystemOnly::enter();
        let set_len = |len: usize| {
            if let Some(l) = self.lock().large.get_mut(&addr) {
                *l = len;
            }
        };
        use std::sync::atomic::Ordering::Relaxed;
        if new_len < old_len {
            set_len(new_len);
            if sp.munmap(addr + new_len, old_len - new_len).is_err() {
                set_len(old_len);
                return None;
            }
            self.counters.large_bytes.fetch_sub((old_len - new_len) as u64, Relaxed);
        } else if new_len > old_len {
            let more = new_len - old_len;
            let at = sp.mmap(addr + old_len, more, RW, ANON | MAP_FIXED_NOREPLACE, -1, 0).ok()?;
            if at != addr + old_len {
                let _ = sp.munmap(at, more);
                return None;
            }
            set_len(new_len);
            self.counters.large_bytes.fetch_add(more as u64, Relaxed);
        }
        NonNull::new(ptr)
    }
}
