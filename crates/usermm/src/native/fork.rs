//! fork: a child gets a copy of every space that can be copied
//! (docs/design.md, "fork").
//!
//! # How
//! The reservation and staging area of such a space are not
//! `MADV_DONTFORK`: the host copies them as it copies any private memory
//! (resident and parked pages shared copy-on-write). Around the fork:
//! - **prepare** (the forking thread, before the fork): every such space's
//!   region lock exclusively — no page is in flight, no handler, reclaim or
//!   zap is half done —, its shared regions handed to the host
//!   (`hand_shared_to_host`: they stay shared with the child), and its core
//!   lock, kept until after the fork (`platform::fork::keep`), with the
//!   registry's lock;
//! - **child** (its only thread, before anything else runs there): the
//!   locks let go; then, per space, the host side taken over
//!   (`Platform::fork_child`: a userfaultfd of its own with the reservation
//!   and staging area registered before any touch — an inherited mapping is
//!   registered with nothing, and a missing page read there would be the
//!   zero page for good —, `/proc` files and an eventfd of its own, a swap
//!   file of its own holding the parent's slots in use), the swap copies of
//!   resident pages dropped (the fork dropped their write protection),
//!   threads of its own started, every lock undone (`munlockall`: locks are
//!   not inherited). A space
//!   that cannot be copied (no descriptor for the tie, 16 forks deep, a
//!   host side that cannot be taken over) is made inaccessible
//!   (`PROT_NONE`: a touch is SIGSEGV, never another process's bytes or a
//!   zero) and stays the parent's (its calls `ESTALE`), with a message;
//! - **parent**: the locks let go.
//!
//! Shared pages: `UFFDIO_MOVE` refuses a page a fork left shared (`EBUSY`,
//! in both processes, even after the other exits) until a write fault has
//! made it the process's own; so in a space that went through a fork,
//! reclaim write-faults a page that would not move (`MADV_POPULATE_WRITE`: a
//! copy while the other still shares it, a reuse after; its swap copy
//! dropped and its write protection lifted first) and moves it again
//! (`native/reclaim.rs`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

use super::open::ThreadPlan;
use super::*;
use crate::platform::fork::{ChildTie, ForkHooks};

/// The API layer's record of live handles (`Space`'s `Mapping`s): kept here,
/// beside the space's locks, so that a fork holds them too (a parent thread
/// inside an address-based call holds `gate`; its child would wait on it for
/// good).
#[derive(Default)]
pub(crate) struct Handles {
    /// The ranges of the live `Mapping`s (and `Purgeable`s): safe code may
    /// hold a `&[u8]` into them, so the address-based calls that would
    /// change or remove their bytes refuse them (`EBUSY`); the handle's own
    /// methods, which hold it by `&mut` or by value, do it instead.
    pub(crate) owned: Mutex<Vec<(usize, usize)>>,
    /// Makes a range check and the call it guards one step: the
    /// address-based calls hold it shared from their check to their end,
    /// and a new handle holds it exclusively from its `mmap` to its
    /// registration in `owned` (otherwise a `munmap` that found a hole
    /// could unmap the handle `map_anon` had just placed there). Lock
    /// order: `gate`, `owned`, then the region and core locks. (std's: let
    /// go in a child, it wakes no parent thread that was waiting on it.)
    pub(crate) gate: std::sync::RwLock<()>,
}

/// Locks of the API layer a fork must hold too, before the space's own (a
/// space's heap, whose threads call into the space under them).
pub(crate) trait ForkLocks: Send + Sync {
    /// Keeps every such lock across the fork in progress
    /// (`platform::fork::keep`).
    fn keep_across_fork(self: Arc<Self>);
}

/// Whose a space is and what a fork does with it.
pub(crate) struct ForkState {
    /// The fork generation of the process the space belongs to
    /// (`platform::fork::generation`): its opener's, or a forked
    /// child's that took over a copy.
    generation: AtomicU64,
    /// Whether a child gets a copy, and with which threads.
    copies: AtomicBool,
    /// Whether the space went through a fork in this process.
    forked: AtomicBool,
    pub(super) plan: Mutex<ThreadPlan>,
    /// The space's threads, joined at close.
    pub(super) threads: Mutex<Option<Threads>>,
    /// Set while the threads are stopped to be started again
    /// (`native/creds.rs`).
    pub(super) renewing: AtomicBool,
    /// Set from then until the new threads have started: a heap on the
    /// space sends allocations to the system allocator meanwhile (what std
    /// and the C library allocate in a starting thread, before it is
    /// marked usermm's, must not fault on a space with no handler).
    pub(super) starting: AtomicBool,
    /// The per-thread credentials the threads have (`native/creds.rs`).
    pub(super) creds: Mutex<crate::platform::ThreadCreds>,
    /// See [`Handles`].
    handles: Handles,
    /// The forked children that may read this space's swap slots in place
    /// (the core's swap holds, by id), with their ties.
    holds: Mutex<Vec<(u64, Arc<ChildTie>)>>,
    /// When the ties were last asked (`CLOCK_MONOTONIC` ns).
    holds_asked: AtomicU64,
    /// See [`ForkLocks`] (set once, as the space opens, before anything
    /// can use it).
    extra: std::sync::OnceLock<Weak<dyn ForkLocks>>,
}

impl ForkState {
    pub(super) fn new() -> ForkState {
        ForkState {
            generation: AtomicU64::new(crate::platform::fork::generation()),
            copies: AtomicBool::new(false),
            forked: AtomicBool::new(false),
            plan: Mutex::new(ThreadPlan::default()),
            threads: Mutex::new(None),
            renewing: AtomicBool::new(false),
            starting: AtomicBool::new(false),
            creds: Mutex::new(crate::platform::ThreadCreds::default()),
            handles: Handles::default(),
            holds: Mutex::new(Vec::new()),
            holds_asked: AtomicU64::new(0),
            extra: std::sync::OnceLock::new(),
        }
    }

    pub(super) fn set(&self, copies: bool, plan: ThreadPlan, threads: Threads) {
        self.copies.store(copies, Ordering::Relaxed);
        *lock(&self.plan) = plan;
        *lock(&self.threads) = Some(threads);
    }
}

/// Region locks a space has (`Inner::mm_locks`): one for its opener and
/// one for each generation of forked children that copied it.
pub(super) const MM_LOCKS: usize = 16;

/// The spaces a fork copies (weak: a closed space leaves by itself).
static SPACES: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

static HOOKS: ForkHooks = ForkHooks { prepare: on_prepare, parent: on_parent, child: on_child };

/// The spaces held across a fork, and the child's tie with its hold id
/// (`None`: no pipe could be had, and no space is copied).
type Forking = (Vec<Arc<Inner>>, Option<(u64, ChildTie)>);

thread_local! {
    /// The spaces held across the fork in progress (the forking thread's).
    static FORKING: std::cell::RefCell<Forking> = const { std::cell::RefCell::new((Vec::new(), None)) };
}

/// The next swap hold's id (one for each fork that copies spaces).
static NEXT_HOLD: AtomicU64 = AtomicU64::new(1);

/// How often the background thread asks whether a forked child holding
/// swap slots is gone (ms).
const HOLDS_ASK_MS: u64 = 10;

/// Makes a fork copy `inner` (see the module's documentation).
pub(super) fn register(inner: &Arc<Inner>) {
    crate::platform::fork::set_hooks(&HOOKS);
    let mut s = lock(&SPACES);
    s.retain(|w| w.strong_count() > 0);
    s.push(Arc::downgrade(inner));
}

/// The spaces of this process (not those an ancestor opened and this
/// process did not take over).
pub(super) fn spaces_here() -> Vec<Arc<Inner>> {
    lock(&SPACES).iter().filter_map(Weak::upgrade).filter(|i| i.owned_here()).collect()
}

fn on_prepare() {
    // (Here and in the other two: what usermm allocates comes from the
    // system allocator, never from a space's heap, which is held across.)
    let _system = crate::thread_role::SystemOnly::enter();
    let reg = lock(&SPACES);
    let spaces: Vec<Arc<Inner>> = reg
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|i| i.fork.copies.load(Ordering::Relaxed) && i.owned_here())
        .collect();
    crate::platform::fork::keep_static(Box::new(reg));
    let tie = match spaces.is_empty() {
        true => None,
        false => ChildTie::new().ok().map(|t| (NEXT_HOLD.fetch_add(1, Ordering::Relaxed), t)),
    };
    let hold = tie.as_ref().map(|t| t.0);
    for i in &spaces {
        // The API layer's first (the heap's), then the fork state's own (each taken alone elsewhere):
        // held by a parent thread at the fork, the child would wait on them
        // for good.
        if let Some(x) = i.fork.extra.get().and_then(Weak::upgrade) {
            x.keep_across_fork();
        }
        crate::platform::fork::keep(i.clone(), |i| Box::new(lock(&i.fork.threads)), false);
        crate::platform::fork::keep(i.clone(), |i| Box::new(lock(&i.fork.plan)), false);
        crate::platform::fork::keep(i.clone(), |i| Box::new(lock(&i.fork.holds)), false);
        // Lock order: the handles' gate and list, the region lock, then the
        // core's (`native.rs`).
        crate::platform::fork::keep(
            i.clone(),
            |i| Box::new(i.fork.handles.gate.write().unwrap_or_else(|e| e.into_inner())),
            false,
        );
        crate::platform::fork::keep(i.clone(), |i| Box::new(lock(&i.fork.handles.owned)), false);
        // (The child takes the next region lock: `mm_locks`.)
        crate::platform::fork::keep(i.clone(), |i| Box::new(i.mm().write()), true);
        // Shared regions stay shared: the host's from now on.
        i.hand_shared_to_host();
        // (The swap slots in use now stay unwritten while the child may
        // read them in place: the hold, under the lock kept across.)
        crate::platform::fork::keep(
            i.clone(),
            move |i| {
                let mut c = lock(&i.core);
                if let Some(id) = hold {
                    c.swap_hold(id);
                }
                Box::new(c)
            },
            false,
        );
        // Last, the leaf locks (nothing is taken under them, so a thread
        // holding one lets it go without waiting on the locks held above):
        // the fault service's, the read-ahead queue's, the file table's and
        // each mapped file's (no file is mapped meanwhile: the region lock
        // is held).
        crate::platform::fork::keep(i.clone(), |i| Box::new(i.service.fork_guards()), false);
        crate::platform::fork::keep(i.clone(), |i| Box::new(i.reclaimer.fork_guard()), false);
        for f in i.files.all() {
            crate::platform::fork::keep(f, |f| Box::new(f.fork_guard()), false);
        }
        crate::platform::fork::keep(i.clone(), |i| Box::new(i.files.fork_guard()), false);
    }
    if !spaces.is_empty() {
        // The page stores' list of open stores (a leaf lock too).
        crate::platform::fork::keep_static(Box::new(crate::store::fork_guard()));
    }
    FORKING.with(|f| *f.borrow_mut() = (spaces, tie));
}

fn on_parent() {
    let _system = crate::thread_role::SystemOnly::enter();
    crate::platform::fork::release_kept(false);
    let (spaces, tie) = FORKING.with(|f| std::mem::take(&mut *f.borrow_mut()));
    let tie = tie.map(|(id, t)| (id, Arc::new(t.in_parent())));
    for i in spaces {
        i.fork.forked.store(true, Ordering::Relaxed);
        if let Some((id, t)) = &tie {
            if lock(&i.core).swap_holds_any() {
                lock(&i.fork.holds).push((*id, t.clone()));
                i.plat.child_tie(t);
            }
        }
    }
}

fn on_child() {
    // (A `GlobalHeap` program's own allocations come from a space's heap:
    // one here could fault before the space has threads to serve it.)
    let _system = crate::thread_role::SystemOnly::enter();
    crate::platform::fork::release_kept(true);
    let (spaces, tie) = FORKING.with(|f| std::mem::take(&mut *f.borrow_mut()));
    let mut copied = false;
    for i in spaces {
        // (The parent's other children's ties are not this process's.)
        lock(&i.fork.holds).clear();
        copied |= i.take_over_in_child(tie.is_some());
    }
    // The tie's write end stays open here while a copied space may read
    // its parent's swap file (until this process exits or execs).
    if let Some((_, t)) = tie.filter(|_| copied) {
        t.in_child();
    }
}

impl Inner {
    /// Whether the space belongs to this process (not a forked child's copy
    /// it was not given).
    #[inline]
    pub(crate) fn owned_here(&self) -> bool {
        self.fork.generation.load(Ordering::Relaxed) == crate::platform::fork::generation()
    }

    /// Has a fork hold `l`'s locks too ([`ForkLocks`]).
    pub(crate) fn set_fork_locks(&self, l: Weak<dyn ForkLocks>) {
        let _ = self.fork.extra.set(l);
    }

    /// The API layer's record of live handles.
    pub(crate) fn handles(&self) -> &Handles {
        &self.fork.handles
    }

    /// Whether a forked child gets a copy of the space.
    pub(crate) fn fork_copies(&self) -> bool {
        self.fork.copies.load(Ordering::Relaxed)
    }

    /// Stops the space's threads (`close`), if it has them here.
    pub(crate) fn shut(&self) {
        // (Not under the lock: a fork meanwhile waits for it.)
        let t = lock(&self.fork.threads).take();
        if let Some(t) = t {
            self.close(t);
        }
    }

    /// Whether the space went through a fork here (as the parent, or as
    /// the child that took it over): pages may be shared with another
    /// process, and a move of one is refused (`native/reclaim.rs`).
    pub(crate) fn forked_since_open(&self) -> bool {
        self.fork.forked.load(Ordering::Relaxed)
    }

    /// Whether the forked children holding swap slots are due to be asked
    /// whether they are gone (every [`HOLDS_ASK_MS`]; the background
    /// thread asks).
    pub(super) fn holds_ask_due(&self) -> bool {
        let now = crate::platform::fork::now_ns();
        now.saturating_sub(self.fork.holds_asked.load(Ordering::Relaxed)) >= HOLDS_ASK_MS * 1_000_000
    }

    /// Ends the swap holds of forked children that are gone.
    pub(super) fn end_gone_holds(&self) {
        self.fork.holds_asked.store(crate::platform::fork::now_ns(), Ordering::Relaxed);
        let mut gone = Vec::new();
        lock(&self.fork.holds).retain(|(id, t)| {
            let g = t.gone();
            if g {
                gone.push(*id);
            }
            !g
        });
        if !gone.is_empty() {
            let mut c = lock(&self.core);
            gone.into_iter().for_each(|id| c.swap_hold_end(id));
        }
    }

    /// In a forked child: the space becomes the child's (see the module's
    /// documentation), or, when it cannot, inaccessible here. `tied`: the
    /// parent keeps the swap slots in use for the child (`ChildTie`).
    /// Whether it became the child's.
    fn take_over_in_child(self: Arc<Inner>, tied: bool) -> bool {
        // The parent's threads did not come along.
        let t = lock(&self.fork.threads).take();
        let closing = t.is_none();
        std::mem::forget(t);
        // The parent's region lock stays held here (see `mm_locks`): the
        // next one is this process's.
        let next = self.mm_ix.load(Ordering::Relaxed) + 1;
        let rearmed = if closing {
            // (A parent thread was closing it: no handle to it is left here.)
            Err("it was being closed at the fork".to_string())
        } else if !tied {
            Err("no pipe to tie the child to its parent".to_string())
        } else if next < self.mm_locks.len() {
            self.mm_ix.store(next, Ordering::Relaxed);
            self.rearm_in_child()
        } else {
            Err(format!("forked more than {MM_LOCKS} times deep"))
        };
        if let Err(why) = rearmed {
            let _ = self.plat.range(Range::Protect(PROT_NONE), self.base, self.reserve_len);
            crate::platform::fork::say(&format!(
                "usermm: pid {}: the space at {:#x} is not copied into this forked child ({why}): its memory is \
                 not accessible here, and its calls fail with ESTALE\n",
                std::process::id(),
                self.base
            ));
            return false;
        }
        self.fork.forked.store(true, Ordering::Relaxed);
        let plan = *lock(&self.fork.plan);
        // The space becomes this process's once its threads have started:
        // until then a `GlobalHeap` on it sends every allocation to the
        // system allocator (what std and the C library allocate while
        // starting a thread, before it marks itself usermm's, would
        // otherwise come from the heap this very thread is to serve, and
        // could fault there and wait on itself), as it does while it opens.
        match self.start_threads(plan) {
            Ok(t) => {
                *lock(&self.fork.threads) = Some(t);
                self.fork.generation.store(crate::platform::fork::generation(), Ordering::Relaxed);
            }
            Err(e) => {
                // (Faults would wait for handlers that do not exist.)
                let _ = self.plat.range(Range::Protect(PROT_NONE), self.base, self.reserve_len);
                crate::platform::fork::say(&format!(
                    "usermm: pid {}: the space at {:#x} is not copied into this forked child (its threads: {e}): \
                     its memory is not accessible here\n",
                    std::process::id(),
                    self.base
                ));
                return false;
            }
        }
        // Locks are not inherited (as on Linux); nor are `MADV_DONTFORK`
        // regions, and `MADV_WIPEONFORK` ones read zeros.
        let _ = self.lock_call(|c| c.munlockall());
        let (dont, wipe) = lock(&self.core).fork_advised();
        for r in dont {
            let _ = self.munmap(self.addr(r.start), r.pages() as usize * self.page_size);
        }
        for r in wipe {
            let _ = self.madvise(self.addr(r.start), r.pages() as usize * self.page_size, MADV_DONTNEED);
        }
        true
    }

    /// The host side and the core made the child's (no thread started).
    fn rearm_in_child(&self) -> Result<(), String> {
        let (blocker, swap_runs) = {
            let mut c = lock(&self.core);
            c.swap_holds_forget_after_fork();
            (c.fork_blocker(), c.swap_used_runs())
        };
        if let Some(b) = blocker {
            return Err(b.into());
        }
        let ps = self.page_size as u64;
        let runs: Vec<(u64, u64)> = swap_runs.iter().map(|&(s, n)| (u64::from(s) * ps, u64::from(n) * ps)).collect();
        self.plat.fork_child(&runs).map_err(|e| format!("its host side: {e}"))?;
        // In-thread faults: the SIGBUS handler passes over the parent's
        // entry in its table (a child's handler must not run the parent's
        // threads' work); the child's own goes in, before any touch.
        let in_thread = self.settings.in_thread() || lock(&self.core).regions().iter().any(|r| r.in_thread());
        if in_thread {
            let _ = self.plat.thread(Thread::InThreadOff);
            let resolver = Arc::new(super::fault::InThread(self.me.upgrade().ok_or("the space is closing")?));
            let (start, end) = (self.base, self.base + self.reserve_len);
            self.plat
                .thread(Thread::InThreadOn { start, end, resolver })
                .map_err(|e| format!("the SIGBUS handler's table: {e}"))?;
        }
        self.wake_fd.replace_in_child().map_err(|e| format!("an eventfd: {e}"))?;
        // The zaps parent threads had under way (see `zaps_after_fork`).
        let (claims, held) = lock(&self.core).zaps_after_fork();
        for c in &claims {
            self.drop_claimed(c);
            lock(&self.core).zap_end(c);
        }
        for h in held {
            let claim = lock(&self.core).zap_begin(h).map_err(|_| "a range being unmapped at the fork".to_string())?;
            self.drop_claimed(&claim);
            let mut c = lock(&self.core);
            c.zap_end(&claim);
            c.unhold_after_fork(h);
        }
        let mut c = lock(&self.core);
        if c.busy_pages() > 0 {
            return Err(format!("{} pages in flight at the fork", c.busy_pages()));
        }
        c.forget_copies_after_fork();
        Ok(())
    }

    /// Before a fork, the region lock held exclusively (so no page is in
    /// flight): every shared region is handed to the host
    /// (`Core::hand_to_host`, `Platform::share`), so that parent and child
    /// share it as Linux's shmem or page cache. One the host cannot take
    /// stays usermm's, and the space is then not copied
    /// (`Core::fork_blocker`).
    fn hand_shared_to_host(&self) {
        let ranges = lock(&self.core).shared_to_hand_over();
        for r in ranges {
            if let Err(e) = self.hand_over(r) {
                crate::platform::fork::say(&format!(
                    "usermm: pid {}: the shared region at {:#x} cannot be shared with a forked child: {e}\n",
                    std::process::id(),
                    self.addr(r.start)
                ));
            }
        }
    }

    /// The runs `(start, end)` of `[a, a+l)` handed to the host
    /// (`hand_over`) whose pages are in memory.
    pub(crate) fn shared_resident(&self, a: usize, l: usize) -> Vec<(usize, usize)> {
        self.plat.runs(Runs::SharedResident, a, l)
    }

    /// One region's part of [`Inner::hand_shared_to_host`].
    fn hand_over(&self, r: PageRange) -> Result<(), Errno> {
        use crate::platform::{ShareSrc, ShareTo};
        use usermm_core::HandSrc;
        let ps = self.page_size;
        let (srcs, prot, mode, file) = {
            let c = lock(&self.core);
            let srcs = c.hand_over_sources(r).ok_or(Errno::EBUSY)?;
            let g = c.region_at(r.start).ok_or(Errno::EINVAL)?;
            let file = g.file().map(|f| (f, g.file_page(r.start)));
            (srcs, g.prot() & PROT_MASK, g.lock(), file)
        };
        let file = match file {
            Some((f, page)) => Some((self.files.get(f).ok_or(Errno::EBADF)?, page * ps as u64)),
            None => None,
        };
        let to = match &file {
            Some((f, off)) => ShareTo::File { file: f, off: *off },
            None => ShareTo::Memfd,
        };
        let pages: Vec<(usize, ShareSrc)> = srcs
            .iter()
            .map(|&(p, s)| {
                let at = (p.0 - r.start.0) as usize * ps;
                let src = match s {
                    HandSrc::Mapped => ShareSrc::Mapped,
                    HandSrc::Parked(slot) => ShareSrc::Slot(slot),
                    HandSrc::Swapped(slot) => ShareSrc::Stored(u64::from(slot) * ps as u64),
                };
                (at, src)
            })
            .collect();
        let (a, l) = (self.addr(r.start), r.pages() as usize * ps);
        self.plat.share(a, l, prot, to, &pages)?;
        // The bytes are the host's now: usermm's copies go (frames, slots).
        let claim = lock(&self.core).zap_begin(r).map_err(|_| Errno::EBUSY)?;
        for &slot in &claim.staging {
            let _ = self.plat.staging(Staging::Drop { slot, n: 1 });
        }
        {
            let mut c = lock(&self.core);
            c.zap_end(&claim);
            c.hand_to_host(r);
        }
        if mode != LockMode::None {
            // (The new mapping is not locked yet.)
            let _ = self.plat.range(Range::Lock(true), a, l);
        }
        Ok(())
    }

    /// Drops the pages of a zap claimed in a forked child: the host's, with
    /// the protection the range has now, and the staging frames.
    fn drop_claimed(&self, claim: &usermm_core::ZapClaim) {
        let prot = lock(&self.core).region_at(claim.range.start).map_or(PROT_NONE, |g| g.prot() & PROT_MASK);
        let (a, l) = (self.addr(claim.range.start), claim.range.pages() as usize * self.page_size);
        let _ = self.plat.range(Range::Zap(prot), a, l);
        for &slot in &claim.staging {
            let _ = self.plat.staging(Staging::Drop { slot, n: 1 });
        }
    }
}
