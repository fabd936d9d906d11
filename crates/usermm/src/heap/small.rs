//! Small blocks: size classes served from slabs, with per-thread caches.
//!
//! ```text
//!  reservation  |..talc arena..|S S S S S S S S|....large....|S S S S|
//!                               \ slab segment /              (64 KiB slabs)
//!  slab (class 64 B):  [b0][b1][b2] ... [b1023]    blocks only, no headers
//!  side table:  slab number -> SlabMeta { class, live bytes, avail bits }
//!  thread cache: per class, a stack of block addresses (in TLS)
//! ```
//!
//! - A *slab* is [`SLAB_BYTES`] of the space, aligned to that size from the
//!   reservation's base, carved from a *slab segment* (a region mapped for
//!   slabs) and given to one size class at a time, so that blocks of one
//!   class share pages only with their own class.
//! - Everything a free needs is in the side table ([`SlabMeta`], in the
//!   system allocator's memory, never in the space): a *live* byte per 16
//!   bytes of the slab (the class plus one where a live block starts, else
//!   0), an avail bitmap per slot, the slab's class. Neither an allocation
//!   nor a free reads or writes the block itself, so freeing a swapped-out
//!   block does not swap it in, and a free of a live block reads one line of
//!   the side table (its live byte says the class too).
//! - A slot is in one of three states: *live* (the program has it: its
//!   byte in `live` is set), *cached* (in a thread cache: neither set),
//!   *avail* (in its slab, for any thread: its bit in `avail` set, under its
//!   class's lock). Invariant: no slot is both live and avail. A free
//!   clears the live byte with a plain store (no locked instruction: the
//!   common `malloc` and `free` are a few loads and stores) and refuses the
//!   block when it was already clear (a double free, or a pointer that was
//!   never handed out): nothing else of the heap changes. Two frees of one
//!   block at the same instant in two threads may both pass the check.
//! - Each thread keeps up to [`cache_cap`] blocks per class (a stack of
//!   addresses in its thread-local storage: no lock, no shared cache line on
//!   the common path). An empty stack is refilled from its class's slabs
//!   (half full, under the class's lock), a full one gives its older half
//!   back. A thread's cache goes back when it exits (its TLS destructor), or
//!   when the thread turns to another space's heap. A thread that frees
//!   another's block keeps it in its own cache (as jemalloc's tcache).
//! - A slab whose every slot is back in it (avail) is released when its
//!   class has another slab with room: its class cleared, its pages lazily
//!   freed (`MADV_FREE`, outside every lock, before any class can have it
//!   again), and it is reused by whichever class needs a slab next.
//! - Slab segments are never unmapped, so the side table's entry of an
//!   address never goes away.
//!
//! The cache of a thread names its heap by an `Arc` of the heap's shared
//! state, so a cache flushed after its space was closed updates only side
//! tables that are still allocated, and touches no memory of the space.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::Arc;

use std::sync::{Mutex, MutexGuard};

use super::{cache_cap, class_size, slab_slots, slot_of, NCLASSES, SLAB_BYTES, SLAB_SHIFT};
use crate::consts::{MADV_FREE, MADV_POPULATE_WRITE, MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use crate::thread_role::SystemOnly;
use crate::Space;
use usermm_sys::lazy::LazyChunks;

pub(crate) mod cache;
use crate::thread_role::{Thread, THREAD};

/// Slabs per chunk of the side table (chunks are allocated as slabs are
/// carved in their address range: 512 KiB of reservation each). The table
/// of chunks is one pointer per chunk, zeroed memory of the system
/// allocator (1 MiB for the preload's 64 GiB, none of it written at a
/// process's start: a table written in full was a fifth of the CPU time
/// `usermm run -- /bin/true` added), so a lookup is one load. A chunk is
/// written whole when made (its entries are 4.3 KiB each): 8 entries are
/// 9 pages, where 64 were 73 pages a program's first `malloc` faulted in.
const CHUNK_SLABS: usize = 8;
/// The most slots of a slab (the smallest class), and its granules (the
/// live bytes: every class is a multiple of 16 bytes).
const MAX_SLOTS: usize = SLAB_BYTES / 16;
const GRANULE_SHIFT: usize = 4;
const GRANULE_MASK: usize = (1 << GRANULE_SHIFT) - 1;
const WORDS: usize = MAX_SLOTS / 64;
/// The first slab segment's size; each next one doubles up to
/// [`MAX_SEGMENT_BYTES`].
const FIRST_SEGMENT_BYTES: usize = 1 << 20;

/// Released slabs that wait for one `MADV_FREE` (512 KiB): a program
/// freeing its objects (CPython's at exit) releases slabs one by one, and a
/// call per slab cost it a tenth of its run; neighbours go out in one call.
const PURGE_BATCH_SLABS: usize = 8;
const MAX_SEGMENT_BYTES: usize = 32 << 20;
/// "No slab" in the partial lists (slab numbers are stored plus one).
const NIL: u32 = 0;
/// The most blocks any class's cache holds.
pub(crate) const CACHE_MAX: usize = 32;

/// One slab's side-table entry. Aligned to a cache line, with the live
/// bytes on lines of their own: the class and the list fields are written
/// under the class's lock (the class read by every free), the live bytes by
/// every `malloc` and `free`, and two threads writing either must not share
/// a line (adjacent entries sharing one made two threads' malloc+free pairs
/// 2.4× slower).
#[repr(C, align(64))]
struct SlabMeta {
    /// Live blocks, a byte per 16-byte granule of the slab (every class is
    /// a multiple of 16): the class plus one at the granule where a live
    /// block starts, set by an allocation and cleared by a free; 0 at every
    /// other granule. A byte, not a bit: each block's state is a memory
    /// location of its own, so a `malloc` or `free` changes it with a plain
    /// store, no locked read-modify-write (threads allocating and freeing
    /// blocks of one slab at once would otherwise serialize on its words);
    /// and the class in it, so that a free needs no other line. By granule,
    /// not by slot: a slab's slots pass between threads (a block given back
    /// by one is taken by another), and with a byte per slot 64 neighbouring
    /// blocks, of both threads, shared a line (two threads' alloc+free pairs
    /// went from ~80 to ~130 ns once the slabs were mixed; one thread gained
    /// nothing measurable).
    live: Live,
    /// Avail slots, changed only under the class's lock (atomics so the
    /// entry can be shared; `Relaxed`, the lock orders them).
    avail: [AtomicU64; WORDS],
    avail_n: AtomicU32,
    /// The class plus one; 0 when the slab is not carved for a class.
    class: AtomicU8,
    /// Held by a thread cache (see [`Shared::take`]): in no list. Under the
    /// class's lock.
    held: AtomicBool,
    /// The class's partial list (slab numbers plus one), under its lock.
    next: AtomicU32,
    prev: AtomicU32,
}

#[repr(C, align(64))]
struct Live([AtomicU8; MAX_SLOTS]);

impl SlabMeta {
    fn new() -> SlabMeta {
        SlabMeta {
            live: Live([const { AtomicU8::new(0) }; MAX_SLOTS]),
            avail: [const { AtomicU64::new(0) }; WORDS],
            avail_n: AtomicU32::new(0),
            class: AtomicU8::new(0),
            held: AtomicBool::new(false),
            next: AtomicU32::new(NIL),
            prev: AtomicU32::new(NIL),
        }
    }
}

/// A class's share of the slabs, under its lock: the slabs with avail
/// slots (a doubly linked list through [`SlabMeta::next`]/`prev`).
struct Bin {
    head: u32,
    /// Slabs this class took so far: from its second on, a slab is
    /// populated as it is taken ([`Shared::carve`]).
    carved: u32,
}

/// Where new slabs come from.
struct Pool {
    /// The current segment's uncarved part `[at, end)`.
    at: usize,
    end: usize,
    /// The last segment's length (the next doubles it).
    last: usize,
    /// Released slabs whose pages were lazily freed (or never touched).
    clean: Vec<u32>,
    /// Released slabs not yet lazily freed (released without a space at
    /// hand: a thread's exit). They are not handed out before.
    dirty: Vec<u32>,
    /// Every segment's slabs `(start, len)`, for the counters (the part
    /// of the segment from its first slab boundary).
    segments: Vec<(usize, usize)>,
}

/// The state of one heap's small blocks that threads' caches share.
pub(crate) struct Shared {
    base: usize,
    len: usize,
    /// The side table: a chunk of `CHUNK_SLABS` entries, allocated as the
    /// first of them is carved.
    chunks: LazyChunks<SlabMeta>,
    bins: Box<[CachePadded<Mutex<Bin>>]>,
    pool: Mutex<Pool>,
    /// Bytes of the slab segments, and bytes given back with `MADV_FREE`.
    pub(crate) segment_bytes: AtomicU64,
    pub(crate) segments: AtomicU64,
    pub(crate) lazily_freed_bytes: AtomicU64,
}

#[repr(align(128))]
struct CachePadded<T>(T);

/// What [`Small::alloc_cached`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cached {
    /// The thread's allocations must come from the system allocator.
    System,
    /// Nothing cached for this class of this heap: take the slow path.
    Miss,
    /// A block, marked live.
    Block(usize),
}

/// What a free of an address found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SmallFree {
    /// Not in a slab: the heap's other kinds of block.
    NotSmall,
    /// In a slab but not a live block's start (double free, or never
    /// handed out): nothing freed.
    Refused,
    /// Freed; the block's class size.
    Freed(usize),
}

/// `m` locked (a poisoned lock's data is whole: nothing panics under it).
/// std's, not parking_lot's: held across a fork and let go in the child
/// (`Small::keep_across_fork`); its waiters sleep on its own word, not in a
/// table the whole process shares, which a parent thread may have left
/// locked at the fork.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A heap's small blocks (the handle the heap keeps).
pub(crate) struct Small {
    shared: Arc<Shared>,
}

impl Small {
    /// Small blocks for the reservation `[base, base + len)`.
    pub(crate) fn new(base: usize, len: usize) -> Small {
        let _system = SystemOnly::enter();
        let slabs = len >> SLAB_SHIFT;
        let chunks = LazyChunks::new(slabs.div_ceil(CHUNK_SLABS), CHUNK_SLABS);
        Small {
            shared: Arc::new(Shared {
                base,
                len,
                chunks,
                bins: (0..NCLASSES).map(|_| CachePadded(Mutex::new(Bin { head: NIL, carved: 0 }))).collect(),
                pool: Mutex::new(Pool {
                    at: 0,
                    end: 0,
                    last: 0,
                    clean: Vec::new(),
                    dirty: Vec::new(),
                    segments: Vec::new(),
                }),
                segment_bytes: AtomicU64::new(0),
                segments: AtomicU64::new(0),
                lazily_freed_bytes: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Keeps every lock of the small blocks (each class's, then the slab
    /// pool's, the order a carve takes them in) across the fork in
    /// progress: a thread holding one at the fork would leave it held in
    /// the child for good.
    pub(crate) fn keep_across_fork(&self) {
        for c in 0..NCLASSES {
            crate::platform::fork::keep(self.shared.clone(), move |s| Box::new(lock(&s.bins[c].0)), false);
        }
        crate::platform::fork::keep(self.shared.clone(), |s| Box::new(lock(&s.pool)), false);
    }

    /// A block of `class`, marked live; `None` when the space has no room
    /// for a new slab.
    #[inline]
    pub(crate) fn alloc(&self, sp: &Space, class: usize) -> Option<usize> {
        if let Ok(Some(p)) = THREAD.try_with(|t| pop(&t.heap_cache, &self.shared, class)) {
            self.mark_live(class, p);
            return Some(p);
        }
        self.alloc_slow(sp, class)
    }

    /// [`Small::alloc`] when the thread's cache has no block of `class`
    /// (or is another heap's): refilled from the slabs.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, sp: &Space, class: usize) -> Option<usize> {
        let got = THREAD.try_with(|t| {
            let Ok(mut c) = t.heap_cache.try_borrow_mut() else { return Err(()) };
            if !c.adopt(&self.shared) {
                return Err(());
            }
            let cap = cache_cap(class);
            let c = &mut *c;
            let blocks = &mut c.blocks[class];
            if c.n[class] == 0 {
                let want = (cap / 2).max(1);
                let n = self.shared.take(sp, class, &mut blocks[..want], Some(&mut c.held[class]));
                // Taken in address order, handed out from the end: reversed,
                // a run of allocations gets ascending addresses, so a
                // program that walks its objects in the order it made them
                // walks its pages forwards (and the space's fault-around and
                // swap read-around see a stream).
                blocks[..n].reverse();
                c.n[class] = n as u8;
            }
            if c.n[class] == 0 {
                return Ok(None);
            }
            c.n[class] -= 1;
            Ok(Some(blocks[c.n[class] as usize]))
        });
        let p = match got {
            Ok(Ok(p)) => p?,
            // No cache (the thread is tearing down its thread-locals, or
            // this is a re-entrant call): straight from the slabs.
            _ => {
                let mut one = [0usize; 1];
                if self.shared.take(sp, class, &mut one, None) == 0 {
                    return None;
                }
                one[0]
            }
        };
        self.mark_live(class, p);
        Some(p)
    }

    /// A block of `class` from the calling thread's cache, if it has one
    /// for this heap: the common `malloc`, one thread-local lookup and no
    /// lock. [`Cached::System`] for a thread whose allocations must come
    /// from the system allocator ([`SystemOnly`]).
    #[inline]
    pub(crate) fn alloc_cached(&self, class: usize) -> Cached {
        // The thread is tearing down its thread-locals: `System`.
        let got = THREAD.try_with(|t| pop_cached(t, &self.shared, class)).unwrap_or(Cached::System);
        if let Cached::Block(p) = got {
            self.mark_live(class, p);
        }
        got
    }

    /// Marks the cached block `p` of `class` live.
    #[inline]
    fn mark_live(&self, class: usize, p: usize) {
        let (m, slab) = self.shared.meta(p).expect("a cached block lies in a carved slab");
        let g = (p - slab) >> GRANULE_SHIFT;
        debug_assert_eq!(m.live.0[g].load(Relaxed), 0, "a cached block was live");
        m.live.0[g].store(class as u8 + 1, Release);
    }

    /// The class of the slab block that starts at `p` and is live, without
    /// changing anything: `Ok(class)`, `Err(SmallFree::NotSmall)` outside every
    /// carved slab, `Err(SmallFree::Refused)` for any other address in one.
    #[inline]
    pub(crate) fn live_class(&self, p: usize) -> Result<usize, SmallFree> {
        self.shared.live_at(p).map(|(_, _, class)| class)
    }

    /// Frees the block at `p` (see [`SmallFree`]). `sp` is the space when the
    /// caller has it (a slab released on the way is then lazily freed now).
    #[inline]
    pub(crate) fn free(&self, sp: Option<&Space>, p: usize) -> SmallFree {
        // A check and a store, not one atomic operation: two threads that
        // free one block at the same instant may both get past the check
        // (a double free is refused when the frees are not simultaneous).
        let (m, g, class) = match self.shared.live_at(p) {
            Ok(s) => s,
            Err(f) => return f,
        };
        m.live.0[g].store(0, Release);
        // The common case inline: the block pushed on the thread's cache of
        // this heap, which has room.
        let pushed = THREAD.try_with(|t| push_cached(&t.heap_cache, &self.shared, class, p)).unwrap_or(false);
        if !pushed {
            self.free_slow(sp, class, p);
        }
        SmallFree::Freed(class_size(class))
    }

    /// [`Small::free`] of a block (no longer live) that the thread's cache
    /// could not take as it is: a full bin (its older half goes back to the
    /// slabs first), another heap's cache, or no cache at all.
    #[cold]
    #[inline(never)]
    fn free_slow(&self, sp: Option<&Space>, class: usize, p: usize) {
        let pushed = THREAD.try_with(|t| {
            let Ok(mut c) = t.heap_cache.try_borrow_mut() else { return false };
            if !c.adopt(&self.shared) {
                return false;
            }
            let cap = cache_cap(class);
            let c = &mut *c;
            let blocks = &mut c.blocks[class];
            if c.n[class] as usize >= cap {
                // Give the older half back.
                let half = cap / 2;
                if self.shared.give(class, &blocks[..half]) {
                    if let Some(sp) = sp {
                        self.shared.purge(sp, false);
                    }
                }
                blocks.copy_within(half..cap, 0);
                c.n[class] -= half as u8;
            }
            blocks[c.n[class] as usize] = p;
            c.n[class] += 1;
            true
        });
        if !pushed.unwrap_or(false) && self.shared.give(class, &[p]) {
            if let Some(sp) = sp {
                self.shared.purge(sp, false);
            }
        }
    }

    /// Gives the calling thread's cached blocks of this heap back to their
    /// slabs (tests; a thread's exit does it by itself).
    pub(crate) fn flush_thread_cache(&self, sp: &Space) {
        let _ = THREAD.try_with(|t| {
            if let Ok(mut c) = t.heap_cache.try_borrow_mut() {
                if c.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, &self.shared)) {
                    c.flush();
                }
            }
        });
        self.shared.purge(sp, true);
    }

    /// `(live blocks, their bytes at class size)`, from the side table (a
    /// walk of every carved slab: for statistics, not for a hot path).
    pub(crate) fn live(&self) -> (u64, u64) {
        let s = &self.shared;
        let segments: Vec<(usize, usize)> = {
            let _system = SystemOnly::enter();
            lock(&s.pool).segments.clone()
        };
        let (mut n, mut bytes) = (0u64, 0u64);
        for (start, len) in segments {
            let mut at = start;
            while at + SLAB_BYTES <= start + len {
                if let Some((m, _)) = s.meta(at) {
                    let c = m.class.load(Acquire);
                    if c != 0 {
                        let k: u64 = m.live.0.iter().map(|b| (b.load(Relaxed) != 0) as u64).sum();
                        n += k;
                        bytes += k * class_size(c as usize - 1) as u64;
                    }
                }
                at += SLAB_BYTES;
            }
        }
        (n, bytes)
    }
}

/// [`Small::alloc_cached`]'s work on the thread's state.
#[inline(always)]
fn pop_cached(t: &Thread, shared: &Arc<Shared>, class: usize) -> Cached {
    if t.system_only() {
        return Cached::System;
    }
    match pop(&t.heap_cache, shared, class) {
        Some(p) => Cached::Block(p),
        None => Cached::Miss,
    }
}

/// A block of `class` off the thread's cache of this heap, if it has one.
#[inline(always)]
fn pop(l: &RefCell<cache::Cache>, shared: &Arc<Shared>, class: usize) -> Option<usize> {
    let mut c = l.try_borrow_mut().ok()?;
    if !c.owned_by(shared) {
        return None;
    }
    let n = c.n[class];
    if n == 0 {
        return None;
    }
    c.n[class] = n - 1;
    Some(c.blocks[class][n as usize - 1])
}

/// [`Small::free`]'s common case on the thread's state: `p` pushed on the
/// thread's cache of this heap if it has room (`false`: nothing done).
#[inline(always)]
fn push_cached(l: &RefCell<cache::Cache>, shared: &Arc<Shared>, class: usize, p: usize) -> bool {
    let Ok(mut c) = l.try_borrow_mut() else { return false };
    if !c.owned_by(shared) {
        return false;
    }
    let n = c.n[class];
    if n as usize >= cache_cap(class) {
        return false;
    }
    c.blocks[class][n as usize] = p;
    c.n[class] = n + 1;
    true
}

impl Shared {
    /// The side-table entry of the slab holding `p` and the slab's start;
    /// `None` outside the reservation or where no slab was ever carved.
    #[inline]
    fn meta(&self, p: usize) -> Option<(&SlabMeta, usize)> {
        let off = p.wrapping_sub(self.base);
        if off >= self.len {
            return None;
        }
        let s = off >> SLAB_SHIFT;
        let chunk = self.chunks.get(s / CHUNK_SLABS)?;
        Some((&chunk[s % CHUNK_SLABS], self.base + (s << SLAB_SHIFT)))
    }

    fn meta_of(&self, slab: u32) -> &SlabMeta {
        let s = slab as usize - 1;
        &self.chunks.get(s / CHUNK_SLABS).expect("a listed slab's chunk")[s % CHUNK_SLABS]
    }

    fn slab_start(&self, slab: u32) -> usize {
        self.base + ((slab as usize - 1) << SLAB_SHIFT)
    }

    /// The live block that starts at `p`: `(entry, granule, class)`;
    /// `Err(NotSmall)` outside every carved slab, `Err(Refused)` for any
    /// other address in one (a block freed already, or not a block's
    /// start). A live block's start reads one line (its live byte); only
    /// the others read the slab's class.
    #[inline]
    fn live_at(&self, p: usize) -> Result<(&SlabMeta, usize, usize), SmallFree> {
        let (m, slab) = self.meta(p).ok_or(SmallFree::NotSmall)?;
        let off = p - slab;
        let g = off >> GRANULE_SHIFT;
        let c = if off & GRANULE_MASK == 0 { m.live.0[g].load(Acquire) } else { 0 };
        if c == 0 {
            return Err(if m.class.load(Acquire) == 0 { SmallFree::NotSmall } else { SmallFree::Refused });
        }
        Ok((m, g, c as usize - 1))
    }

    /// Moves up to `out.len()` avail blocks of `class` into `out` (carving
    /// a new slab when the class has none); how many.
    ///
    /// `held`: the caller's *held* slab of the class (its thread cache's,
    /// `NIL` for none), which is out of the class's list and only that
    /// cache takes from: blocks come from it while it has any, then from a
    /// slab taken off the list (or carved), which becomes the held one. So
    /// two threads allocating at once take blocks of different slabs, and
    /// do not write the same cache lines of the side table. `None`: no
    /// cache (blocks from the list's first slab).
    fn take(&self, sp: &Space, class: usize, out: &mut [usize], mut held: Option<&mut u32>) -> usize {
        let _system = SystemOnly::enter();
        let size = class_size(class);
        let mut bin = lock(&self.bins[class].0);
        let mut got = 0;
        while got < out.len() {
            let slab = match held.as_deref_mut() {
                Some(h) if *h != NIL && self.meta_of(*h).avail_n.load(Relaxed) > 0 => *h,
                Some(h) => {
                    if *h != NIL {
                        // Used up: out of every list until a block comes back.
                        self.meta_of(*h).held.store(false, Relaxed);
                        *h = NIL;
                    }
                    let Some(slab) = self.first(sp, class, &mut bin) else { break };
                    self.unlink(&mut bin, slab);
                    self.meta_of(slab).held.store(true, Relaxed);
                    *h = slab;
                    slab
                }
                None => {
                    let Some(slab) = self.first(sp, class, &mut bin) else { break };
                    slab
                }
            };
            let m = self.meta_of(slab);
            let start = self.slab_start(slab);
            let mut taken = 0u32;
            for (w, word) in m.avail.iter().enumerate() {
                let mut bits = word.load(Relaxed);
                while bits != 0 && got < out.len() {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    out[got] = start + (w * 64 + b) * size;
                    got += 1;
                    taken += 1;
                }
                word.store(bits, Relaxed);
                if got == out.len() {
                    break;
                }
            }
            let left = m.avail_n.load(Relaxed) - taken;
            m.avail_n.store(left, Relaxed);
            if left == 0 && !m.held.load(Relaxed) {
                self.unlink(&mut bin, slab);
            }
        }
        got
    }

    /// The first slab of the class's list, carving one when it is empty.
    fn first(&self, sp: &Space, class: usize, bin: &mut Bin) -> Option<u32> {
        if bin.head == NIL {
            let slab = self.carve(sp, class, bin.carved > 0)?;
            bin.carved = bin.carved.saturating_add(1);
            self.link(bin, slab);
        }
        Some(bin.head)
    }

    /// A thread cache lets go of its held slab of `class` (see
    /// [`Shared::take`]): back in the class's list if it has avail blocks.
    fn unhold(&self, class: usize, slab: u32) {
        if slab == NIL {
            return;
        }
        let _system = SystemOnly::enter();
        let mut bin = lock(&self.bins[class].0);
        let m = self.meta_of(slab);
        m.held.store(false, Relaxed);
        if m.avail_n.load(Relaxed) > 0 {
            self.link(&mut bin, slab);
        }
    }

    /// Puts `blocks` of `class` (not live, in no cache) back in their
    /// slabs; whether a slab was released on the way (to be lazily freed by
    /// [`Shared::purge`]).
    fn give(&self, class: usize, blocks: &[usize]) -> bool {
        let _system = SystemOnly::enter();
        let slots = slab_slots(class) as u32;
        let mut released = false;
        let mut bin = lock(&self.bins[class].0);
        for &p in blocks {
            let (m, start) = self.meta(p).expect("a cached block lies in a carved slab");
            let slab = ((start - self.base) >> SLAB_SHIFT) as u32 + 1;
            let i = slot_of(class, p - start);
            let old = m.avail[i / 64].fetch_or(1 << (i % 64), Relaxed);
            debug_assert_eq!(old & (1 << (i % 64)), 0, "a block given back twice");
            let n = m.avail_n.load(Relaxed) + 1;
            m.avail_n.store(n, Relaxed);
            // A held slab is in no list, and its cache takes from it next.
            let held = m.held.load(Relaxed);
            if n == 1 && !held {
                self.link(&mut bin, slab);
            }
            // Wholly avail, and the class has another slab with room:
            // release it.
            if n == slots && !held && (bin.head != slab || m.next.load(Relaxed) != NIL) {
                self.unlink(&mut bin, slab);
                for w in &m.avail {
                    w.store(0, Relaxed);
                }
                m.avail_n.store(0, Relaxed);
                m.class.store(0, Release);
                lock(&self.pool).dirty.push(slab);
                released = true;
            }
        }
        released
    }

    /// Lazily frees the released slabs' pages and makes them reusable: all
    /// of them when `all`, else once [`PURGE_BATCH_SLABS`] are waiting (a
    /// released slab is reused as it is meanwhile, which needs no call).
    fn purge(&self, sp: &Space, all: bool) {
        let _system = SystemOnly::enter();
        let mut dirty = {
            let mut pool = lock(&self.pool);
            if pool.dirty.is_empty() || (!all && pool.dirty.len() < PURGE_BATCH_SLABS) {
                return;
            }
            std::mem::take(&mut pool.dirty)
        };
        dirty.sort_unstable();
        let mut i = 0;
        while i < dirty.len() {
            let mut j = i + 1;
            while j < dirty.len() && dirty[j] == dirty[j - 1] + 1 {
                j += 1;
            }
            let len = (j - i) * SLAB_BYTES;
            if sp.madvise(self.slab_start(dirty[i]), len, MADV_FREE).is_ok() {
                self.lazily_freed_bytes.fetch_add(len as u64, Relaxed);
            }
            i = j;
        }
        lock(&self.pool).clean.extend_from_slice(&dirty);
    }

    /// A slab for `class`: a released one, or a new one from a segment
    /// (mapping the next segment when the current one is used up).
    /// Called under the class's lock, with [`SystemOnly`] entered.
    /// `busy`: the class took a slab before, so this one will fill too: its
    /// pages are populated at once, one call instead of a fault per page
    /// (a class's first slab faults page by page, so a class used once
    /// costs only the pages it touches).
    fn carve(&self, sp: &Space, class: usize, busy: bool) -> Option<u32> {
        let mut pool = lock(&self.pool);
        let slab = match pool.clean.pop().or_else(|| pool.dirty.pop()) {
            Some(s) => s,
            None => {
                if pool.at + SLAB_BYTES > pool.end {
                    let len = if pool.last == 0 { FIRST_SEGMENT_BYTES } else { (pool.last * 2).min(MAX_SEGMENT_BYTES) };
                    // Room to start at a slab boundary (the slack is never
                    // touched, so it costs no memory).
                    let addr = sp
                        .mmap(0, len + SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                        .ok()?;
                    let at = self.base + (addr - self.base).next_multiple_of(SLAB_BYTES);
                    pool.segments.push((at, len));
                    (pool.at, pool.end, pool.last) = (at, at + len, len);
                    self.segment_bytes.fetch_add((len + SLAB_BYTES) as u64, Relaxed);
                    self.segments.fetch_add(1, Relaxed);
                }
                let at = pool.at;
                pool.at += SLAB_BYTES;
                ((at - self.base) >> SLAB_SHIFT) as u32 + 1
            }
        };
        drop(pool);
        if busy {
            // (A failure leaves the pages to fault as they are touched.)
            let _ = sp.populate(self.slab_start(slab), SLAB_BYTES, MADV_POPULATE_WRITE);
        }
        let s = slab as usize - 1;
        let chunk = self.chunks.get_or_init(s / CHUNK_SLABS, SlabMeta::new);
        let m = &chunk[s % CHUNK_SLABS];
        let slots = slab_slots(class);
        for (w, word) in m.avail.iter().enumerate() {
            let n = slots.saturating_sub(w * 64).min(64);
            word.store(if n == 64 { u64::MAX } else { (1u64 << n) - 1 }, Relaxed);
        }
        debug_assert!(m.live.0.iter().all(|b| b.load(Relaxed) == 0), "a new slab has live blocks");
        m.avail_n.store(slots as u32, Relaxed);
        m.class.store(class as u8 + 1, Release);
        Some(slab)
    }

    fn link(&self, bin: &mut Bin, slab: u32) {
        let m = self.meta_of(slab);
        m.prev.store(NIL, Relaxed);
        m.next.store(bin.head, Relaxed);
        if bin.head != NIL {
            self.meta_of(bin.head).prev.store(slab, Relaxed);
        }
        bin.head = slab;
    }

    fn unlink(&self, bin: &mut Bin, slab: u32) {
        let m = self.meta_of(slab);
        let (prev, next) = (m.prev.load(Relaxed), m.next.load(Relaxed));
        if prev == NIL {
            bin.head = next;
        } else {
            self.meta_of(prev).next.store(next, Relaxed);
        }
        if next != NIL {
            self.meta_of(next).prev.store(prev, Relaxed);
        }
        m.prev.store(NIL, Relaxed);
        m.next.store(NIL, Relaxed);
    }
}
