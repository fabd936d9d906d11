//! Opening the host platform of a space (`Native::open`): the userfaultfd,
//! the reservation and staging area (`Arena`), the io_uring pool, the page
//! store, and the `/proc` files the platform reads. The executor decides
//! the sizes (`Setup`); everything the host is asked for to set them up is
//! asked here, so that the executor's `open` makes no host call of its own.

use usermm_core::consts::{UMM_F_FORCE_USER_MODE, UMM_F_INTHREAD_FAULTS, UMM_F_REQUIRE_FULL_UFFD};
use usermm_core::Errno;
use usermm_sys::arena::Arena;
use usermm_sys::file::{Pagemap, ProcMem, SwapFile};
use usermm_sys::ring::RingPool;
use usermm_sys::uffd::{Uffd, UffdMode};

use super::{DirectWindows, Native};
use crate::store::PageStore;
use crate::Config;

/// What a space's host platform is opened with: the configuration, checked
/// by the executor's `open`, and the sizes it worked out.
pub(crate) struct Setup<'a> {
    pub cfg: &'a Config,
    pub page_size: usize,
    /// The reservation (the program range), whole pages.
    pub reserve_bytes: usize,
    /// One staging slot per budget page.
    pub staging_slots: usize,
    /// Frames of the space's pool (0: no pool; `Arena::recycle_slots`).
    pub pool_pages: usize,
    /// Swap slots (0: no swap).
    pub swap_slots: u32,
    /// A forked child gets a copy of the space (the reservation and staging
    /// area are not `MADV_DONTFORK`).
    pub fork_copies: bool,
}

impl Native {
    /// Opens the host side of a space. `ENOSYS`: the host has no usable
    /// userfaultfd.
    pub(crate) fn open(s: &Setup<'_>) -> Result<Native, Errno> {
        let (cfg, ps) = (s.cfg, s.page_size);
        let in_thread = cfg.flags & UMM_F_INTHREAD_FAULTS != 0;
        let uffd =
            Uffd::open(cfg.flags & UMM_F_REQUIRE_FULL_UFFD != 0, cfg.flags & UMM_F_FORCE_USER_MODE != 0, in_thread)
                .map_err(|e| if e == Errno::ENOSYS || e == Errno::EOPNOTSUPP { Errno::ENOSYS } else { e })?;
        // One pool of io_urings for the space's reads, swap and files.
        let rings = std::sync::Arc::new(RingPool::new());
        let swap: Option<Box<dyn PageStore>> = if s.swap_slots == 0 {
            None
        } else if let Some(url) = &cfg.swap_url {
            // (Polling for a read's reply saves a handler thread a wake-up;
            // a faulting thread resolving its own fault is better off
            // sleeping: `store/redis/link.rs`.)
            Some(Box::new(crate::store::RedisStore::open(url, ps, u64::from(s.swap_slots), !in_thread)?))
        } else {
            let dir = cfg.swap_dir.clone().unwrap_or_else(crate::config::default_swap_dir);
            Some(Box::new(crate::store::LocalFile {
                file: SwapFile::create(&dir.to_string_lossy(), u64::from(s.swap_slots) * ps as u64)?,
                rings: rings.clone(),
            }))
        };
        let fork_copies = s.fork_copies && swap.as_ref().is_none_or(|st| st.forks());
        let arena = Arena::with_pool(&uffd, s.reserve_bytes, s.staging_slots, ps, s.pool_pages, fork_copies)?;
        Ok(Native {
            arena,
            uffd,
            swap,
            procmem: ProcMem::open().ok(),
            pagemap: Pagemap::open().ok(),
            page_size: ps,
            rings,
            lender: Default::default(),
            in_thread: Default::default(),
            direct: DirectWindows::new(),
            shared: DirectWindows::new(),
            caps: Default::default(),
            in_thread_entry: Default::default(),
            fork_copies,
        })
    }

    /// `Platform::fork_child`'s host part, the page store done: the
    /// userfaultfd, the arena's registration, the `/proc` files, the rings.
    pub(super) fn fork_child_host(&self) -> Result<(), Errno> {
        self.uffd.replace_in_child()?;
        // (The memory handed to the host is the host's here too: shared
        // with the parent, served by no userfaultfd; the ranges of
        // `UMM_MAP_INTHREAD` regions go to the second userfaultfd.)
        let (base, len) = (self.arena.base, self.arena.reserve_len);
        let shared = self.shared.inside(base, len);
        let in_thread = match self.in_thread.uffd() {
            Some(_) => self.in_thread.split(base, len)?.0,
            None => Vec::new(),
        };
        let mut skip: Vec<(usize, usize)> = shared.iter().chain(in_thread.iter()).copied().collect();
        skip.sort_unstable();
        self.arena.rearm_in_child(&self.uffd, &skip)?;
        if let Some(it) = self.in_thread.uffd() {
            it.replace_in_child()?;
            for (s, t) in in_thread.into_iter().flat_map(|(s, t)| self.shared.outside(s, t - s)) {
                it.register_mode(s, t - s, usermm_sys::uffd::UFFDIO_REGISTER_MODE_MISSING)?;
            }
        }
        if let Some(pm) = &self.pagemap {
            pm.reopen_in_child()?;
        }
        if let Some(pm) = &self.procmem {
            pm.reopen_in_child()?;
        }
        self.rings.forget_in_child();
        Ok(())
    }

    /// Whether the userfaultfd serves user-mode faults only (kernel
    /// accesses to missing pages fail with `EFAULT`).
    pub(crate) fn user_mode_only(&self) -> bool {
        self.uffd.mode == UffdMode::UserModeOnly
    }

    /// Why the userfaultfd fell back to user-mode faults, if it did.
    pub(crate) fn fallback_reason(&self) -> Option<String> {
        self.uffd.fallback_reason.clone()
    }
}

/// Whether the host's `mlock` of exec-only memory succeeds
/// (`Caps::mlock_exec_only`; asked once a process, on a scratch mapping;
/// two spaces opening at once may both ask). Not a `OnceLock`: a fork
/// while another thread initialised one would leave the child's copy
/// waiting forever.
pub(super) fn host_mlock_exec_only_ok() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static OK: AtomicU8 = AtomicU8::new(0); // 0: not asked; 1: yes; 2: no
    match OK.load(Ordering::Relaxed) {
        0 => {
            let ok = usermm_sys::mem::host_mlock_exec_only().is_ok();
            OK.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            ok
        }
        v => v == 1,
    }
}
