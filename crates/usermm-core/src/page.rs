//! Per-page state and the two-level page table that holds it.
//!
//! Page metadata is keyed by the page's index in the reservation, not owned by
//! regions: splitting, merging and detaching a region touches no page, which
//! is what keeps `munmap`'s exclusive phase independent of the number of
//! resident pages (seed 003).
//!
//! Invariant: a leaf exists only while at least one of its entries is not
//! `PageMeta::default()` (`live[leaf]` counts those entries).
//!
//! Every change of a page goes through [`PageTable::set`] (`update` calls
//! it): the one place that changes a page's state. It checks the change
//! against the transition table ([`PState::may_become`]; docs/design.md,
//! "Page states"), records where a busy page came from
//! ([`PageMeta::from`]), and keeps the [`Census`]: every count derived from
//! the pages (resident, parked, swapped, locked, volatile, lazily freed,
//! swap copies, busy), which `validate` recounts exactly.

use crate::types::{PageIdx, PageRange};

/// Where a page's data is, and whether somebody is working on it.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
#[repr(u8)]
pub enum PState {
    /// Never touched, or dropped: reads as zeros; no frame, no slot.
    #[default]
    Absent = 0,
    /// Mapped in the program's range; holds a frame.
    Resident,
    /// Parked in staging slot `slot` (on the inactive list); holds a frame;
    /// the next touch is a minor fault that maps it back.
    Inactive,
    /// Written to swap slot `slot`; holds no frame.
    Swapped,
    /// Busy: being filled (zero-fill, swap-in or reactivation); frame charged.
    Filling,
    /// Busy: being moved from the program's range to staging slot `slot`.
    Deactivating,
    /// Busy: staging slot `slot` being written to swap.
    Evicting,
    /// Busy: being dropped (DONTNEED, munmap); frame still charged.
    Zapping,
}

impl PState {
    /// Whether a page in this state holds (or is charged for) a frame.
    pub fn holds_frame(self) -> bool {
        !matches!(self, PState::Absent | PState::Swapped)
    }
    /// Whether an executor is working on the page.
    pub fn busy(self) -> bool {
        matches!(self, PState::Filling | PState::Deactivating | PState::Evicting | PState::Zapping)
    }

    /// The transition table: whether a page in state `self` may become
    /// `to` (a busy page that came `from` a settled state). A busy page
    /// ends where its work leads or, when that work fails, back where it
    /// came from; nothing else changes state in one step.
    pub fn may_become(self, to: PState, from: PState) -> bool {
        use PState::*;
        self == to
            || match (self, to) {
                (Absent, Filling) => true,
                (Resident, Filling | Deactivating | Zapping) => true,
                (Inactive, Filling | Evicting | Zapping) => true,
                (Swapped, Filling | Absent) => true,
                // A fill installs (Resident) or gives the page back: to
                // zeros, to its slot, to staging; a parked page the host
                // discarded reads as zeros. A swap-in that fails leaves the
                // page in its slot, never zeros.
                (Filling, Resident) => true,
                (Filling, Absent) => from != Swapped,
                (Filling, Swapped | Inactive) => from == to,
                (Deactivating, Inactive | Resident | Absent) => true,
                // (Resident: a zapped page the program touched since it was
                // parked, found mapped by the eviction's reference scan.)
                (Evicting, Swapped | Absent | Inactive | Resident) => true,
                (Zapping, Absent | Resident) => true,
                _ => false,
            }
    }
}

/// Page flag bits (`PageMeta::flags`).
pub mod pf {
    /// Touched again since it was last put on a list (second chance).
    pub const REFERENCED: u8 = 1 << 0;
    /// Locked: reclaim never touches it.
    pub const LOCKED: u8 = 1 << 1;
    /// Lazily freed (MADV_FREE) and not written since.
    pub const LAZYFREE: u8 = 1 << 2;
    /// Marked volatile.
    pub const VOLATILE: u8 = 1 << 3;
    /// Purged while volatile.
    pub const PURGED: u8 = 1 << 4;
    /// Poisoned (MADV_HWPOISON): touching raises SIGBUS.
    pub const POISONED: u8 = 1 << 5;
    /// The swap slot could not be read: the data is kept, touching raises SIGBUS.
    pub const IOERR: u8 = 1 << 6;
    /// The page has been resident while its region was writable, so it may
    /// differ from its file: a shared file page without this bit is clean
    /// and is never written back.
    pub const MAYBE_DIRTY: u8 = 1 << 7;
}

/// The state of one page: 16 bytes.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct PageMeta {
    pub state: PState,
    pub flags: u8,
    /// What the replacement policy remembers of the page's use: extra
    /// trips past the active list's head it has earned by being touched
    /// while parked, and how often it was (read and written by
    /// `core/policy.rs` alone).
    pub uses: u8,
    /// Generation of the page's LRU entry; an entry whose generation differs
    /// is stale and skipped.
    pub gen: u32,
    /// Swap slot (`Swapped`, `Evicting`: the target slot) or staging slot
    /// (`Inactive`, `Deactivating`, `Evicting`: see `PageTable` users).
    pub slot: u32,
    /// The swap cache: 1 + the swap slot that still holds exactly this
    /// page's data (a page swapped in and not written since, see
    /// `core/swapcache.rs`), or 0. Only a page holding a frame has one.
    pub cache: u32,
    /// A busy page's last settled state (`Absent` for a settled page): a
    /// page being read in from swap still counts as swapped, one being
    /// reactivated, evicted or zapped from staging as parked, until its
    /// work is committed. Kept by [`PageTable::set`]; what callers put
    /// here is ignored.
    pub from: PState,
}

impl PageMeta {
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

const LEAF_SHIFT: u32 = 9;
const LEAF_PAGES: u64 = 1 << LEAF_SHIFT;
const LEAF_MASK: u64 = LEAF_PAGES - 1;

pub type Leaf = Box<[PageMeta; LEAF_PAGES as usize]>;

/// Emptied leaves kept for reuse, at most (2 MiB of them): a fault then
/// finds a leaf without calling the allocator, whose heap growth (an
/// `mprotect` of a thread arena) waits for the kernel's mmap lock — behind a
/// concurrent `munmap`'s zap, for hundreds of microseconds.
const SPARE_LEAVES_MAX: usize = 256;
/// Spare leaves kept at least (128 KiB). Between this and
/// [`SPARE_LEAVES_MAX`] the pool is as large as the table has leaves in use:
/// a program's start (`usermm run`) does not pay for 2 MiB of leaves it
/// never uses (256 allocations, each a heap growth under the mmap lock, in
/// the background thread while the program starts: CPython's start had 230
/// `mprotect` calls from it).
const SPARE_LEAVES_MIN: usize = 16;

/// The counts derived from the pages, kept by [`PageTable::set`].
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct Census {
    /// Pages holding (or charged for) a frame ([`PState::holds_frame`]).
    pub resident: u64,
    /// Parked pages: `Inactive`, and busy pages that came from staging.
    pub inactive: u64,
    /// Pages in swap: `Swapped`, and pages being read in from it.
    pub swapped: u64,
    /// Pages with [`pf::LOCKED`].
    pub locked: u64,
    /// Pages with [`pf::VOLATILE`] (purged ones included).
    pub volatile: u64,
    /// Pages with [`pf::LAZYFREE`].
    pub lazyfree: u64,
    /// Pages with a swap copy ([`PageMeta::cache`]).
    pub swap_cached: u64,
    /// Pages in a busy state ([`PState::busy`]): work in flight, whose end
    /// may free frames (what an out-of-memory decision waits for).
    pub busy: u64,
}

impl Census {
    /// Adds (`d` 1) or removes (`d` `u64::MAX`, i.e. -1) page `m`.
    fn count(&mut self, m: &PageMeta, d: u64) {
        let from = |s: PState| m.state == s || (m.state.busy() && m.from == s);
        let add = |field: &mut u64, yes: bool| {
            if yes {
                *field = field.wrapping_add(d);
            }
        };
        add(&mut self.resident, m.state.holds_frame());
        add(&mut self.inactive, from(PState::Inactive));
        add(&mut self.swapped, from(PState::Swapped));
        add(&mut self.locked, m.has(pf::LOCKED));
        add(&mut self.volatile, m.has(pf::VOLATILE));
        add(&mut self.lazyfree, m.has(pf::LAZYFREE));
        add(&mut self.swap_cached, m.cache != 0);
        add(&mut self.busy, m.state.busy());
    }
}

/// A sparse table of `PageMeta`, allocated 512 pages at a time.
pub struct PageTable {
    leaves: Vec<Option<Leaf>>,
    live: Vec<u16>,
    pages: u64,
    /// Empty leaves ready for reuse (see [`SPARE_LEAVES_MAX`]).
    spare: Vec<Leaf>,
    /// Invariant: the number of leaves in use (`Some` in `leaves`).
    in_use: usize,
    /// Invariant: the counts of the pages in the table.
    census: Census,
    /// The most pages that have held a frame at once.
    resident_max: u64,
}

impl PageTable {
    pub fn new(pages: u64) -> PageTable {
        let n = pages.div_ceil(LEAF_PAGES) as usize;
        PageTable {
            // (`vec!` of `None` is zeroed memory from the allocator, fresh
            // pages for a large table, where filling it wrote 256 KiB, 64
            // page faults, at every space's open: the default reservation
            // is 64 GiB.)
            leaves: vec![None; n],
            live: vec![0; n],
            pages,
            spare: Vec::new(),
            in_use: 0,
            census: Census::default(),
            resident_max: 0,
        }
    }

    /// A new, empty leaf (the executor allocates them outside its locks and
    /// hands them over with [`PageTable::add_spare`]).
    pub fn new_leaf() -> Leaf {
        Box::new([PageMeta::default(); LEAF_PAGES as usize])
    }

    /// How many spare leaves the table keeps (see [`SPARE_LEAVES_MIN`]).
    fn spare_target(&self) -> usize {
        self.in_use.clamp(SPARE_LEAVES_MIN, SPARE_LEAVES_MAX)
    }

    /// How many spare leaves the table would take to be full.
    pub fn spare_wanted(&self) -> usize {
        self.spare_target().saturating_sub(self.spare.len())
    }

    /// Whether the spare leaves are down to a quarter of the pool: time to
    /// refill before a fault has to call the allocator.
    pub fn spare_low(&self) -> bool {
        self.spare.len() * 4 < self.spare_target()
    }

    /// Adds empty leaves to the spare pool (beyond its size, they are freed).
    pub fn add_spare(&mut self, leaves: Vec<Leaf>) {
        for l in leaves {
            debug_assert!(l.iter().all(|m| *m == PageMeta::default()));
            if self.spare.len() < SPARE_LEAVES_MAX {
                self.spare.push(l);
            }
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// How many pages are busy (being filled, parked, evicted or zapped).
    pub fn busy(&self) -> u64 {
        self.census.busy
    }

    /// The counts derived from the pages.
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// Where busy page `p` came from (`Absent` for a settled page).
    pub fn page_from(&self, p: PageIdx) -> PState {
        self.get(p).from
    }

    /// The most pages that have held a frame at once.
    pub fn resident_max(&self) -> u64 {
        self.resident_max
    }

    pub fn get(&self, p: PageIdx) -> PageMeta {
        let l = (p.0 >> LEAF_SHIFT) as usize;
        match &self.leaves[l] {
            Some(leaf) => leaf[(p.0 & LEAF_MASK) as usize],
            None => PageMeta::default(),
        }
    }

    /// Changes page `p` to `m`: the one place a page's state changes.
    /// Debug builds check the change against the transition table
    /// ([`PState::may_become`]); the census follows it, and `m.from` is
    /// set here (see [`PageMeta::from`]).
    pub fn set(&mut self, p: PageIdx, mut m: PageMeta) {
        let l = (p.0 >> LEAF_SHIFT) as usize;
        let i = (p.0 & LEAF_MASK) as usize;
        let empty = PageMeta::default();
        let old = self.get(p);
        debug_assert!(
            old.state.may_become(m.state, old.from),
            "page {p:?}: {:?} (from {:?}) may not become {:?}",
            old.state,
            old.from,
            m.state
        );
        m.from = match (old.state.busy(), m.state.busy()) {
            (_, false) => PState::Absent,
            (true, true) => old.from,
            (false, true) => old.state,
        };
        self.census.count(&old, u64::MAX);
        self.census.count(&m, 1);
        self.resident_max = self.resident_max.max(self.census.resident);
        match &mut self.leaves[l] {
            Some(leaf) => {
                let was = leaf[i] != empty;
                let is = m != empty;
                leaf[i] = m;
                match (was, is) {
                    (false, true) => self.live[l] += 1,
                    (true, false) => {
                        self.live[l] -= 1;
                        if self.live[l] == 0 {
                            if let Some(leaf) = self.leaves[l].take() {
                                self.in_use -= 1;
                                if self.spare.len() < SPARE_LEAVES_MAX {
                                    self.spare.push(leaf);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            None => {
                if m == empty {
                    return;
                }
                let mut leaf: Leaf = self.spare.pop().unwrap_or_else(PageTable::new_leaf);
                leaf[i] = m;
                self.leaves[l] = Some(leaf);
                self.in_use += 1;
                self.live[l] = 1;
            }
        }
    }

    /// Updates a page in place.
    pub fn update(&mut self, p: PageIdx, f: impl FnOnce(&mut PageMeta)) {
        let mut m = self.get(p);
        f(&mut m);
        self.set(p, m);
    }

    /// Calls `f` for every page in `r` whose meta is not the default, in order.
    /// Empty leaves are skipped without looking at their pages.
    pub fn for_each_live(&self, r: PageRange, mut f: impl FnMut(PageIdx, PageMeta)) {
        let mut p = r.start.0;
        while p < r.end.0 {
            let l = (p >> LEAF_SHIFT) as usize;
            let leaf_end = ((l as u64) + 1) << LEAF_SHIFT;
            let stop = leaf_end.min(r.end.0);
            if let Some(leaf) = &self.leaves[l] {
                for q in p..stop {
                    let m = leaf[(q & LEAF_MASK) as usize];
                    if m != PageMeta::default() {
                        f(PageIdx(q), m);
                    }
                }
            }
            p = stop;
        }
    }

    /// The live pages of `r`, collected (for callers that mutate as they go).
    pub fn live_in(&self, r: PageRange) -> Vec<(PageIdx, PageMeta)> {
        let mut v = Vec::new();
        self.for_each_live(r, |p, m| v.push((p, m)));
        v
    }

    /// Number of allocated leaves (for tests of the sparse invariant).
    pub fn leaves_allocated(&self) -> usize {
        self.leaves.iter().filter(|l| l.is_some()).count()
    }

    /// Checks the leaf invariant.
    pub fn validate(&self) {
        let mut census = Census::default();
        for (l, leaf) in self.leaves.iter().enumerate() {
            match leaf {
                Some(leaf) => {
                    let n = leaf.iter().filter(|m| **m != PageMeta::default()).count();
                    assert_eq!(n, self.live[l] as usize, "leaf {l} live count");
                    assert!(n > 0, "empty leaf {l} kept");
                    for m in leaf.iter() {
                        assert!(m.state.busy() || m.from == PState::Absent, "settled page with an origin: {m:?}");
                        census.count(m, 1);
                    }
                }
                None => assert_eq!(self.live[l], 0),
            }
        }
        assert_eq!(census, self.census, "page counts");
        assert!(self.census.resident <= self.resident_max, "max below current");
        assert_eq!(self.leaves_allocated(), self.in_use, "leaves in use");
    }
}
