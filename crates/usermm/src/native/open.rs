//! Opening a space: `open` sets up the host platform (`Native`), builds
//! the space's state over it (`build`, which the simulation calls with its
//! own platform) and starts the space's threads: the fault handlers, the
//! wake-ahead thread and the background thread.

use super::*;
use crate::platform::Setup;

#[cfg(feature = "test-hooks")]
thread_local! {
    /// Test hook: the next space this thread opens is not copied into a
    /// forked child (`Space::open_not_copied`).
    pub(crate) static NOT_COPIED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Inner {
    /// Opens a space; a forked child gets a copy of it where the
    /// configuration allows (`native/fork.rs`).
    pub fn open(cfg: &Config) -> Result<Arc<Inner>, Errno> {
        let shift = if cfg.page_shift == 0 { 12 } else { cfg.page_shift };
        if !(12..=21).contains(&shift) {
            return Err(Errno::EINVAL);
        }
        if cfg.flags & !UMM_F_ALL != 0 {
            return Err(Errno::EINVAL);
        }
        let ps = 1usize << shift;
        let budget_bytes = cfg.budget_or_default();
        let budget_pages = (budget_bytes / ps).max(1) as u64;
        let reserve = if cfg.reserve_bytes == 0 { crate::DEFAULT_RESERVE_BYTES } else { cfg.reserve_bytes };
        let reserve = reserve.checked_add(ps - 1).ok_or(Errno::EINVAL)? & !(ps - 1);
        if reserve == 0 || reserve as u64 > (1u64 << 46) {
            return Err(Errno::EINVAL);
        }
        let swap_slots = (cfg.swap_bytes / ps).min(u32::MAX as usize - 1) as u32;
        if budget_pages > u32::MAX as u64 / 2 {
            return Err(Errno::EINVAL);
        }
        let in_thread = cfg.flags & UMM_F_INTHREAD_FAULTS != 0;
        let staging_slots = budget_pages as usize;
        // The frame pool (`Arena::recycle_slots`), opt-in: an eighth of the
        // budget, 16 to 512 frames.
        let pool_pages = if cfg.flags & UMM_F_FRAME_POOL == 0 { 0 } else { (staging_slots / 8).clamp(16, 512) };
        // A child's copy re-arms the host side (`Platform::fork_child`; a
        // frame pool starts empty there, in-thread faults are registered
        // again in the SIGBUS handler's table).
        #[cfg(feature = "test-hooks")]
        let fork_copies = !NOT_COPIED.with(|n| n.get());
        #[cfg(not(feature = "test-hooks"))]
        let fork_copies = true;
        let native = Native::open(&Setup {
            cfg,
            page_size: ps,
            reserve_bytes: reserve,
            staging_slots,
            pool_pages,
            swap_slots,
            fork_copies,
        })?;
        let fork_copies = native.fork_copies;
        let (user_mode_only, fallback_reason) = (native.user_mode_only(), native.fallback_reason());
        let plat: Box<dyn Platform> = Box::new(native);
        let inner = Inner::build(cfg, plat, user_mode_only, fallback_reason)?;
        // In-thread faults: no fault ever reaches a handler thread.
        let plan = ThreadPlan {
            handlers: if in_thread {
                0
            } else if cfg.fault_threads == 0 {
                default_fault_threads(inner.plat.caps().cpus)
            } else {
                cfg.fault_threads.min(64) as usize
            },
            wake_ahead: cfg.flags & UMM_F_NO_WAKE_AHEAD == 0 && inner.plat.caps().cpus > 1,
            background_reclaim: cfg.flags & UMM_F_NO_BACKGROUND_RECLAIM == 0,
        };
        let threads = inner.start_threads(plan)?;
        inner.fork.set(fork_copies, plan, threads);
        if in_thread {
            let (start, end) = (inner.base, inner.base + inner.reserve_len);
            let resolver = Arc::new(fault::InThread(inner.clone()));
            if let Err(e) = inner.plat.thread(Thread::InThreadOn { start, end, resolver }) {
                inner.shut();
                return Err(e);
            }
        }
        if fork_copies {
            fork::register(&inner);
        }
        Ok(inner)
    }

    /// Starts the space's threads as `plan` says: the fault handlers, the
    /// wake-ahead thread and the background thread (at `open`, and again in
    /// a forked child that got a copy of the space).
    pub(super) fn start_threads(self: &Arc<Inner>, plan: ThreadPlan) -> Result<Threads, Errno> {
        let inner = self;
        let mut handles = Vec::new();
        // Each thread says when it has started and marked itself as
        // usermm's own (`thread_role::mark_usermm_thread`), and `open` waits
        // for that: a `GlobalHeap` opening its space routes every allocation
        // to the system allocator until then, so that what std allocates
        // while starting a thread never waits on the heap its own space
        // serves.
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        // Each thread starts with every signal a program can handle blocked
        // (inherited from this mask, so from its first instruction): a
        // signal for the program never runs its handler on a thread of
        // usermm's (which may be the one that must serve that handler's
        // faults), and one every program thread blocks waits for them.
        let _mask = crate::platform::program_signals_blocked()?;
        // They inherit this thread's credentials whole (`native/creds.rs`).
        if let Some(c) = crate::platform::thread_creds() {
            inner.set_thread_creds(c);
        }
        for i in 0..plan.handlers {
            let me = inner.clone();
            let tx = started_tx.clone();
            let h = std::thread::Builder::new()
                .name(format!("usermm-fault-{i}"))
                .spawn(move || {
                    crate::thread_role::mark_usermm_thread();
                    crate::platform::warm_thread_locals();
                    let _ = tx.send(());
                    drop(tx);
                    me.handler_loop()
                })
                .map_err(|_| Errno::EAGAIN)?;
            handles.push(h);
        }
        // (In-thread faults: the thread installs half of a lock-on-fault
        // window's file read, `Inner::install_split`.)
        if plan.wake_ahead {
            inner.service.wake_ahead().enable();
            inner.service.wake_ahead().track_handler_cpu();
            let me = inner.clone();
            let tx = started_tx.clone();
            let h = std::thread::Builder::new()
                .name("usermm-awake".into())
                .spawn(move || {
                    crate::thread_role::mark_usermm_thread();
                    crate::platform::warm_thread_locals();
                    // (Best effort: at the normal policy it would only
                    // compete a little more for a CPU no one wanted.)
                    let _ = me.plat.thread(Thread::IdlePriority);
                    let _ = tx.send(());
                    drop(tx);
                    let ps = me.page_size;
                    me.service.wake_ahead().run(
                        &|| me.threads_stop(),
                        ps,
                        &|a, pages| {
                            let _ = me.plat.range(Range::Wake, a, pages * ps);
                        },
                        &|| me.plat.help(),
                    )
                })
                .map_err(|_| Errno::EAGAIN)?;
            handles.push(h);
        }
        {
            // The background thread also serves MADV_WILLNEED; with
            // UMM_F_NO_BACKGROUND_RECLAIM it only does that.
            let me = inner.clone();
            let bg = plan.background_reclaim;
            let h = std::thread::Builder::new()
                .name("usermm-reclaim".into())
                .spawn(move || {
                    crate::thread_role::mark_usermm_thread();
                    crate::platform::warm_thread_locals();
                    let _ = started_tx.send(());
                    drop(started_tx);
                    me.background_loop(bg)
                })
                .map_err(|_| Errno::EAGAIN)?;
            handles.push(h);
        }
        // Every sender is gone once every thread has sent (or died).
        while started.recv().is_ok() {}
        Ok(Threads { handles })
    }

    /// The space's state over a platform (no threads started). The
    /// configuration has been checked by `open`.
    pub(crate) fn build(
        cfg: &Config,
        plat: Box<dyn Platform>,
        user_mode_only: bool,
        fallback_reason: Option<String>,
    ) -> Result<Arc<Inner>, Errno> {
        let shift = if cfg.page_shift == 0 { 12 } else { cfg.page_shift };
        let ps = 1usize << shift;
        let budget_bytes = cfg.budget_or_default();
        let budget_pages = (budget_bytes / ps).max(1) as u64;
        let reserve = if cfg.reserve_bytes == 0 { crate::DEFAULT_RESERVE_BYTES } else { cfg.reserve_bytes };
        let reserve = reserve.checked_add(ps - 1).ok_or(Errno::EINVAL)? & !(ps - 1);
        let swap_slots = (cfg.swap_bytes / ps).min(u32::MAX as usize - 1) as u32;
        let staging_slots = budget_pages as u32;
        let caps = plat.caps();
        let base = caps.base;
        let core = Core::new(CoreConfig {
            base: base as u64,
            reserve_pages: (reserve / ps) as u64,
            page_shift: shift,
            budget_pages,
            swap_slots,
            staging_slots,
            max_regions: if cfg.max_regions == 0 { 65530 } else { cfg.max_regions },
            memlock_pages: if cfg.memlock_bytes == usize::MAX { u64::MAX } else { (cfg.memlock_bytes / ps) as u64 },
            mlock_allowed: cfg.memlock_bytes != 0,
            exact_faults: cfg.flags & UMM_F_EXACT_FAULTS != 0,
        });
        let host_lazyfree = caps.host_lazyfree && ps == 4096 && !user_mode_only;
        let mut core = core;
        core.set_host_lazyfree(host_lazyfree);
        core.set_swap_release_granule(caps.swap_release_granule);
        // (Not with faults that cannot come from the kernel: a `read(2)`
        // into a page swapped in write-protected would fail with EFAULT.)
        let kernel_faults = !user_mode_only && cfg.flags & UMM_F_INTHREAD_FAULTS == 0;
        core.set_tracks_writes(caps.tracks_writes && kernel_faults);
        core.set_purge_volatile_first(cfg.flags & UMM_F_PURGE_VOLATILE_FIRST != 0);
        if cfg.lazyfree_max_bytes != 0 {
            core.set_lazyfree_max((cfg.lazyfree_max_bytes / ps) as u64);
        }
        let wake_fd = EventFd::new()?;
        let settings = settings::Settings::new(
            cfg.flags & UMM_F_FRAME_POOL != 0,
            user_mode_only,
            cfg.flags & UMM_F_INTHREAD_FAULTS != 0,
            host_lazyfree,
            swap_slots as u64 * ps as u64,
            fallback_reason,
        );
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            base,
            reserve_len: reserve,
            page_size: ps,
            plat: inject::Injecting::new(plat),
            mm_locks: (0..fork::MM_LOCKS).map(|_| RwLock::new(())).collect(),
            mm_ix: std::sync::atomic::AtomicUsize::new(0),
            core: Mutex::new(core),
            settled: Settled::default(),
            shutdown: AtomicBool::new(false),
            wake_fd,
            settings,
            service: service::FaultService::new(),
            reclaimer: reclaimer::Reclaimer::new(budget_pages),
            backoff: backoff::StoreBackoff::new(),
            files: files::FileTable::new(
                cfg.flags & UMM_F_KEEP_FILE_CACHE != 0,
                cfg.flags & UMM_F_COPY_LOCKED_FILES == 0,
            ),
            counters: counters::HostCounters::default(),
            hooks: hooks::TestHooks::new(),
            fork: fork::ForkState::new(),
        });
        Ok(inner)
    }
}

/// The threads a space runs (`Inner::start_threads`).
#[derive(Clone, Copy, Default)]
pub(crate) struct ThreadPlan {
    /// Fault handler threads (0: faults are resolved in the faulting thread).
    pub handlers: usize,
    /// The wake-ahead thread.
    pub wake_ahead: bool,
    /// Reclaim ahead of the program in the background thread (which also
    /// serves `MADV_WILLNEED` either way).
    pub background_reclaim: bool,
}

/// Handler threads when the configuration says 0. One spinning handler
/// serves a single faulting thread fastest (measured on 2 vCPUs: 13–16 µs a
/// fault against 18–21 µs for two pinned handlers, which race each other
/// for every message); more help when many threads fault at once and swap-in
/// I/O waits.
fn default_fault_threads(cpus: usize) -> usize {
    match cpus {
        0..=2 => 1,
        3..=8 => 2,
        _ => 4,
    }
}
