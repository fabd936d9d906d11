//! The memory a space owns, with safe operations on it.
//!
//! An `Arena` owns three mappings: the *reservation* (the program's range),
//! the *staging area* (one page slot per budget page, where inactive pages are
//! parked) and a *zero buffer*. Every method checks that the addresses it is
//! given lie inside the arena, so that the executor can drive page movement
//! without `unsafe`: no Rust reference ever points into these mappings; the
//! kernel moves the bytes (userfaultfd ioctls, `pread`/`pwritev`).

use crate::file::{pread_upto, pwrite_all, MappedFile, ProcMem};
use crate::lend::Lender;
use crate::uffd::Uffd;
use crate::{mem, Errno};

const ZERO_BUF_BYTES: usize = 1 << 20;

pub struct Arena {
    pub base: usize,
    pub reserve_len: usize,
    pub staging_base: usize,
    pub staging_len: usize,
    pub page_size: usize,
    zero_buf: usize,
    zero_len: usize,
    staging_wp_only: bool,
    /// The reservation is registered in MISSING and WP mode (see
    /// [`Arena::tracks_writes`]).
    program_wp: bool,
    pagemap: Option<crate::file::Pagemap>,
    /// The frame pool: `pool_cap` page slots from `pool_base`, of which the
    /// first `len` hold ready frames, and the `taken` above them frames
    /// taken by fills in flight (see [`Arena::recycle_slots`]); both under
    /// the lock. `pool_cap` 0: no pool.
    pool_base: usize,
    pool_cap: usize,
    pool_len: std::sync::Mutex<PoolState>,
    /// Pages moved from the pool into the program's range so far.
    pool_installed: std::sync::atomic::AtomicU64,
}

impl Arena {
    /// Reserves `reserve_len` bytes (`PROT_NONE`, aligned to 2 MiB) and
    /// `staging_slots` staging pages; applies `MADV_DONTFORK` and
    /// `MADV_NOHUGEPAGE` to both and registers both with `uffd`.
    pub fn new(uffd: &Uffd, reserve_len: usize, staging_slots: usize, page_size: usize) -> Result<Arena, Errno> {
        Arena::with_pool(uffd, reserve_len, staging_slots, page_size, 0)
    }

    /// As `new`, with a frame pool of `pool_pages` (0: none; see
    /// [`Arena::recycle_slots`]).
    pub fn with_pool(
        uffd: &Uffd,
        reserve_len: usize,
        staging_slots: usize,
        page_size: usize,
        pool_pages: usize,
    ) -> Result<Arena, Errno> {
        let base = mem::reserve(reserve_len, page_size.max(1 << 21))?;
        let mut a = Arena {
            base,
            reserve_len,
            staging_base: 0,
            staging_len: staging_slots * page_size,
            page_size,
            zero_buf: 0,
            zero_len: ZERO_BUF_BYTES.max(page_size),
            staging_wp_only: false,
            program_wp: false,
            pagemap: None,
            pool_base: 0,
            pool_cap: 0,
            pool_len: std::sync::Mutex::new(PoolState::default()),
            pool_installed: std::sync::atomic::AtomicU64::new(0),
        };
        a.staging_base = mem::map_rw(a.staging_len)?;
        a.zero_buf = mem::map_rw(a.zero_len)?;
        for (s, l) in [(a.base, a.reserve_len), (a.staging_base, a.staging_len)] {
            // SAFETY: this arena's memory (checked range or own slot): no reference into it.
            unsafe { mem::advise(s, l, libc::MADV_DONTFORK) }?;
            // SAFETY: this arena's memory (checked range or own slot): no reference into it.
            unsafe { mem::advise(s, l, libc::MADV_NOHUGEPAGE) }?;
        }
        // Parked copies of the program's pages stay out of core dumps: a
        // page the program marked `MADV_DONTDUMP` (a secret) would
        // otherwise be dumped from its staging slot while parked.
        // SAFETY: this arena's own staging memory: no reference into it.
        unsafe { mem::advise(a.staging_base, a.staging_len, libc::MADV_DONTDUMP) }?;
        // The program's range in WP mode too, so that a swapped-in page can
        // be mapped write-protected and its first write seen (a clean page
        // keeps its swap copy: `tracks_writes`). Only with kernel-mode
        // faults handled: under UFFD_USER_MODE_ONLY a write by the kernel
        // (`read(2)` into the page) would fail with EFAULT instead of
        // faulting into usermm.
        a.program_wp = uffd.mode == crate::uffd::UffdMode::Full
            && uffd.has(crate::uffd::UFFD_FEATURE_PAGEFAULT_FLAG_WP)
            && uffd.register_mode(a.base, a.reserve_len, Arena::program_mode(true)).is_ok();
        if !a.program_wp {
            uffd.register(a.base, a.reserve_len)?;
        }
        // The staging area must be registered with the same userfaultfd (it
        // is a UFFDIO_MOVE destination), but in write-protect mode only, so
        // that a missing staging page (one the host discarded) reads as the
        // zero page instead of faulting into our own handlers. Kernels
        // without anonymous write-protect fall back to MISSING mode, and then
        // no page is ever handed to the host to discard.
        a.staging_wp_only =
            uffd.register_mode(a.staging_base, a.staging_len, crate::uffd::UFFDIO_REGISTER_MODE_WP).is_ok();
        if !a.staging_wp_only {
            uffd.register(a.staging_base, a.staging_len)?;
        }
        a.pagemap = crate::file::Pagemap::open().ok();
        // The pool, where `UFFDIO_MOVE` can reach it both ways (a
        // destination must be registered: write-protect mode only, as
        // staging), out of forks and core dumps. Without `UFFDIO_MOVE` or
        // a write-protect registration, no pool.
        if pool_pages > 0 && a.staging_wp_only && uffd.has(crate::uffd::UFFD_FEATURE_MOVE) {
            let len = pool_pages * page_size;
            let pb = mem::map_rw(len)?;
            let set_up = [libc::MADV_DONTFORK, libc::MADV_NOHUGEPAGE, libc::MADV_DONTDUMP]
                .iter()
                // SAFETY: the pool mapping is ours, just made: no reference into it.
                .try_for_each(|&adv| unsafe { mem::advise(pb, len, adv) })
                .and_then(|_| uffd.register_mode(pb, len, crate::uffd::UFFDIO_REGISTER_MODE_WP));
            match set_up {
                Ok(()) => {
                    a.pool_base = pb;
                    a.pool_cap = pool_pages;
                }
                // SAFETY: ours, unused.
                Err(_) => unsafe {
                    let _ = mem::unmap(pb, len);
                },
            }
        }
        Ok(a)
    }

    /// Pages moved from the pool into the program's range so far.
    pub fn pool_installed(&self) -> u64 {
        self.pool_installed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Frames in the pool now.
    pub fn pool_frames(&self) -> usize {
        self.pool().len
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.pool_len.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops pool frames until at most `max` are left (the budget counts
    /// them: the caller keeps the pool within the space's free frames).
    pub fn pool_trim(&self, max: usize) {
        if self.pool_cap == 0 {
            return;
        }
        let mut p = self.pool();
        if p.len > max {
            let ps = self.page_size;
            let n = p.len - max;
            // SAFETY: ready pool slots of ours: no reference into them.
            let _ = unsafe { mem::advise(self.pool_base + max * ps, n * ps, libc::MADV_DONTNEED) };
            p.len = max;
            if p.taken > 0 {
                // The taken frames stay where they are, above the slots
                // just emptied (they leave the pool with their fills).
                p.hole += n;
            }
        }
    }

    /// Takes `n` frames off the top of the ready ones (consecutive, the
    /// caller's alone until it gives them back with [`Arena::pool_release`]
    /// once they are moved out or dropped): their address, or `None` when
    /// the pool has fewer.
    fn pool_take(&self, n: usize) -> Option<usize> {
        let mut p = self.pool();
        if n == 0 || p.len < n || p.hole > 0 {
            return None;
        }
        p.len -= n;
        p.taken += n;
        Some(self.pool_base + p.len * self.page_size)
    }

    /// `n` taken frames have left the pool (moved out or dropped: their
    /// slots are empty).
    fn pool_release(&self, n: usize) {
        let mut p = self.pool();
        p.taken -= n;
        if p.taken == 0 {
            p.hole = 0;
        }
    }

    /// Drops the frames of the `n` consecutive slots from `slot`, as
    /// [`Arena::drop_slots`], keeping as many as the pool has room for: they
    /// are moved (`UFFDIO_MOVE`, no copy, no allocation) to the top of the
    /// pool instead of being given back to the host, and a later fill moves
    /// them into the program's range ([`Arena::zero_fill_pooled`],
    /// [`Arena::install_bounce`]'s pooled form) instead of allocating fresh
    /// frames for `UFFDIO_COPY`. Their bytes are the evicted pages': every
    /// use overwrites a whole frame first. When this returns `Ok`, the
    /// slots are empty, as after `drop_slots`.
    pub fn recycle_slots(&self, uffd: &Uffd, slot: u32, n: usize) -> Result<(), Errno> {
        let ps = self.page_size;
        self.slot_addr(slot + n as u32 - 1);
        let src = self.slot_addr(slot);
        let mut moved = 0;
        if self.pool_cap > 0 {
            let mut p = self.pool();
            // (Frames taken by fills in flight sit right above the ready
            // ones: nothing is pushed until they are gone.)
            let k = if p.taken > 0 { 0 } else { n.min(self.pool_cap - p.len) };
            if k > 0 {
                let dst = self.pool_base + p.len * ps;
                // SAFETY: staging slots and pool slots of ours: no reference
                // into either; the pool slots above `len` are empty.
                moved = unsafe { uffd.mv(dst, src, k * ps, false) }.unwrap_or(0) / ps;
                if moved < k {
                    // A move that stopped short may have moved more than it
                    // said: the pool slots past the count must be empty for
                    // the next push, so whatever landed there goes.
                    // SAFETY: pool slots of ours: no reference into them.
                    let _ = unsafe { mem::advise(dst + moved * ps, (k - moved) * ps, libc::MADV_DONTNEED) };
                }
                p.len += moved;
            }
        }
        if moved < n {
            // SAFETY: this arena's own staging slots: no reference into them.
            unsafe { mem::advise(src + moved * ps, (n - moved) * ps, libc::MADV_DONTNEED) }?;
        }
        Ok(())
    }

    /// Installs zero pages at `[dst, dst+len)` of the reservation from pool
    /// frames, zeroed first and moved in (`UFFDIO_MOVE`), waking the
    /// waiters if `wake`; with fewer frames in the pool than pages, or
    /// where the move is refused (a region whose host mapping is not
    /// plainly read-write and unlocked: the caller passes only those), as
    /// `zero_fill_wake`. Returns the bytes installed (a prefix).
    pub fn zero_fill_pooled(&self, uffd: &Uffd, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        self.check(dst, len)?;
        let n = len / self.page_size;
        let Some(frames) = self.pool_take(n) else { return self.zero_fill_wake(uffd, dst, len, wake) };
        // SAFETY: `n` pool frames taken by this call alone, mapped and
        // writable (they hold an evicted page's bytes until now).
        unsafe { mem::zero(frames, len) };
        self.install_frames(uffd, dst, frames, len, wake, false)
    }

    /// Moves the `len` bytes of taken pool frames at `frames` to `dst`
    /// (waking if `wake`); the part that does not move is copied (write-
    /// protected if `wp`) and its frames dropped. Returns the bytes
    /// installed (a prefix).
    fn install_frames(
        &self,
        uffd: &Uffd,
        dst: usize,
        frames: usize,
        len: usize,
        wake: bool,
        wp: bool,
    ) -> Result<usize, Errno> {
        let ps = self.page_size;
        // (A move carries no write protection: a frame installed `wp` is
        // copied, never moved.)
        // SAFETY: taken pool frames (the caller's alone) and an empty run of
        // the reservation the caller's core claims: no reference into either.
        let moved = if wp { 0 } else { unsafe { uffd.mv(dst, frames, len, wake) }.unwrap_or(0) };
        self.pool_installed.fetch_add((moved / ps) as u64, std::sync::atomic::Ordering::Relaxed);
        let mut done = moved;
        if done < len {
            // A frame that moved without being counted left its pool slot
            // empty, which reads as the zero page: the copy then stops at
            // the page already there (`EEXIST`), a prefix, as any fill.
            // SAFETY: the rest of the taken frames, mapped and readable.
            let c = unsafe {
                uffd.copy_wp(dst + done, (frames + done) as *const u8, len - done, wake, wp && self.program_wp)
            };
            done += c.unwrap_or(0);
            // SAFETY: the frames are ours and nothing else uses them.
            let _ = unsafe { mem::advise(frames + moved, len - moved, libc::MADV_DONTNEED) };
        }
        self.pool_release(len / ps);
        debug_assert!(done % ps == 0);
        Ok(done)
    }

    /// Whether swapped-in pages can be mapped write-protected, their first
    /// write reported as a WP fault (the reservation is registered in WP
    /// mode as well as MISSING mode).
    pub fn tracks_writes(&self) -> bool {
        self.program_wp
    }

    /// The mode the reservation is registered in with the space's
    /// userfaultfd (MISSING, and WP where swap-ins are tracked).
    pub fn program_register_mode(&self) -> u64 {
        Arena::program_mode(self.program_wp)
    }

    /// The reservation's registration mode, with or without WP.
    fn program_mode(wp: bool) -> u64 {
        use crate::uffd::{UFFDIO_REGISTER_MODE_MISSING, UFFDIO_REGISTER_MODE_WP};
        UFFDIO_REGISTER_MODE_MISSING | if wp { UFFDIO_REGISTER_MODE_WP } else { 0 }
    }

    /// Whether the host kernel may be handed lazily freed pages to discard
    /// (the staging area is registered WP-only, and pagemap can tell what the
    /// host dropped).
    pub fn host_lazyfree(&self) -> bool {
        self.staging_wp_only && self.pagemap.is_some()
    }

    /// `MADV_FREE` in the host on `[a, a+l)` of the reservation: the host may
    /// drop the pages under its own memory pressure (a write cancels it).
    pub fn host_free(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(a, l, libc::MADV_FREE) }
    }

    /// `MADV_FREE` in the host on a staging slot.
    pub fn host_free_slot(&self, slot: u32) -> Result<(), Errno> {
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(self.slot_addr(slot), self.page_size, libc::MADV_FREE) }
    }

    /// Test hook: the host's own reclaim of the whole staging area, as its
    /// memory pressure would do it (`MADV_PAGEOUT`: clean lazily freed
    /// pages are discarded; other pages, with no host swap, stay).
    pub fn host_reclaim_staging(&self) {
        self.drain_host_lru();
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        let _ = unsafe { mem::advise(self.staging_base, self.staging_len, libc::MADV_PAGEOUT) };
    }

    /// Flushes every CPU's pending LRU batches in the host, so that pages
    /// just installed or just lazily freed on another CPU can be reclaimed
    /// by the next `MADV_PAGEOUT` (measured on Linux 6.18: without it, the
    /// last up to 15 pages a handler thread installed on the other CPU stay
    /// out of reach). `move_pages` drains them all; `mlock` is the fallback
    /// for kernels without page migration. Best effort.
    pub fn drain_host_lru(&self) {
        if mem::lru_drain_all(self.zero_buf).is_ok() {
            return;
        }
        if mem::mlock2(self.zero_buf, self.page_size.min(4096), 0).is_ok() {
            let _ = mem::munlock(self.zero_buf, self.page_size.min(4096));
        }
    }

    /// Asks the host to reclaim the page parked in `slot` now and says
    /// whether it dropped it: a clean lazily freed page is dropped at once
    /// (no I/O); a page written since `MADV_FREE` stays — or, on a host with
    /// swap of its own, goes to the host's swap, which is not a drop: the
    /// data is still there (read back by the next access).
    pub fn discard_slot(&self, slot: u32) -> bool {
        let a = self.slot_addr(slot);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        let _ = unsafe { mem::advise(a, self.page_size, libc::MADV_PAGEOUT) };
        self.gone(a)
    }

    /// Whether the host dropped the page at `a` of the reservation (a lazily
    /// freed page it discarded): no page and no host swap entry. False when
    /// it cannot tell.
    pub fn page_gone(&self, a: usize) -> bool {
        self.in_reserve(a, self.page_size) && self.gone(a)
    }

    /// After a move of the page at `src` to `slot` that did not report it
    /// moved (an error, or a count short of it): whether it moved all the
    /// same. The host's answer is not to be trusted there: this kernel
    /// (6.18, batched `UFFDIO_MOVE`) was seen answering `EEXIST` for a run
    /// whose pages sat in their slots, gone from the program's range. Read
    /// from the host's page tables: gone from `src` and present in the slot.
    /// When they cannot be read, the page is moved back if it is in the
    /// slot, and the answer is no (a move back that moves nothing finds the
    /// slot empty: the page never left).
    pub fn moved_unreported(&self, uffd: &Uffd, src: usize, slot: u32) -> bool {
        let parked = self.slot_addr(slot);
        if !self.in_reserve(src, self.page_size) {
            return false;
        }
        if let Some(moved) = self.moved_per_pagemap(src, parked) {
            return moved;
        }
        // Back from the slot to `src`, if it is there.
        // SAFETY: this arena's memory (checked range and own slot): no reference into it.
        let _ = unsafe { uffd.mv(src, parked, self.page_size, false) };
        false
    }

    /// Whether the host's page tables say the page at `from` went to `to`
    /// (gone from `from`, present at `to`); `None` when they cannot be read.
    fn moved_per_pagemap(&self, from: usize, to: usize) -> Option<bool> {
        let pm = self.pagemap.as_ref()?;
        Some(pm.gone(from).ok()? && !pm.gone(to).ok()?)
    }

    fn gone(&self, a: usize) -> bool {
        match &self.pagemap {
            Some(pm) => pm.gone(a).unwrap_or(false),
            None => false,
        }
    }

    fn in_reserve(&self, a: usize, l: usize) -> bool {
        a >= self.base && a.checked_add(l).is_some_and(|e| e <= self.base + self.reserve_len)
    }

    pub fn slot_addr(&self, slot: u32) -> usize {
        let a = self.staging_base + slot as usize * self.page_size;
        assert!(a + self.page_size <= self.staging_base + self.staging_len, "staging slot {slot} out of range");
        a
    }

    fn check(&self, a: usize, l: usize) -> Result<(), Errno> {
        if self.in_reserve(a, l) {
            Ok(())
        } else {
            Err(Errno::EFAULT)
        }
    }

    /// Installs zero pages at `[dst, dst+len)` of the reservation, waking
    /// the waiters when `wake` (else the caller commits, then wakes).
    /// Returns the bytes installed (a prefix).
    pub fn zero_fill_wake(&self, uffd: &Uffd, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        self.check(dst, len)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.zero_len);
            // SAFETY: the zero buffer is ours, mapped and readable for zero_len.
            let c = unsafe { uffd.copy(dst + done, self.zero_buf as *const u8, n, wake) }?;
            done += c;
            if c < n {
                break;
            }
        }
        Ok(done)
    }

    /// Wakes the threads waiting on `[a, a+l)` of the reservation (outside
    /// it: `EFAULT`).
    pub fn wake(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: inside the reservation; the caller wakes pages its core
        // says are settled.
        unsafe { uffd.wake(a, l) }
    }

    /// Places poison markers on the missing pages of `[a, a+l)` of the
    /// reservation: a touch raises SIGBUS there (outside it: `EFAULT`).
    pub fn poison(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: inside the reservation: memory no Rust reference points at.
        unsafe { uffd.poison(a, l) }
    }

    /// Maps the shared zero page at `[dst, dst+len)` of the reservation (a
    /// read fault: no frame is allocated until the program writes, and then
    /// the kernel copies on write without a userfaultfd round trip), waking
    /// the waiters when `wake`.
    pub fn zero_map_wake(&self, uffd: &Uffd, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        self.check(dst, len)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { uffd.zeropage(dst, len, wake) }
    }

    /// Maps the page parked in `slot` back at `dst` (without waking):
    /// `UFFDIO_MOVE` when `try_move`, else a copy and a drop of the slot's
    /// frame.
    pub fn slot_to_page(&self, uffd: &Uffd, slot: u32, dst: usize, try_move: bool, wp: bool) -> Result<(), Errno> {
        let ps = self.page_size;
        self.check(dst, ps)?;
        let src = self.slot_addr(slot);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        if try_move && matches!(unsafe { uffd.mv(dst, src, ps, false) }, Ok(n) if n == ps) {
            return Ok(());
        }
        // A move that failed may have moved the page all the same (see
        // `moved_unreported`): then the slot is empty and `dst` holds it.
        if try_move && self.moved_per_pagemap(src, dst) == Some(true) {
            return Ok(());
        }
        // SAFETY: the slot is ours and holds a page (the caller's claim), so
        // it is mapped and readable.
        let n = unsafe { uffd.copy_wp(dst, src as *const u8, ps, false, wp && self.program_wp) }?;
        if n != ps {
            return Err(Errno::EEXIST);
        }
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(src, ps, libc::MADV_DONTNEED) }
    }

    /// Maps the page parked in `slot` at the empty page `dst` (without
    /// waking) when the slot may have been discarded by the host
    /// (`MADV_FREE`): the page is read into `bounce` first, then the slot is
    /// checked to still hold a page of its own. A discarded slot reads as
    /// the zero page, and nothing but us ever puts a page back in a slot, so
    /// a slot that still holds its page after the read held it during the
    /// read. Returns `Ok(false)` when the host discarded it (nothing is
    /// installed). The slot is emptied in both cases.
    pub fn slot_to_page_checked(&self, uffd: &Uffd, slot: u32, dst: usize, bounce: &Bounce) -> Result<bool, Errno> {
        let ps = self.page_size;
        self.check(dst, ps)?;
        if bounce.len < ps {
            return Err(Errno::EINVAL);
        }
        let pm = self.pagemap.as_ref().ok_or(Errno::ENOSYS)?;
        let src = self.slot_addr(slot);
        // SAFETY: the slot and the bounce buffer are ours, mapped readable
        // and writable for at least one page each, and do not overlap; a
        // discarded slot reads as the zero page (no fault reaches a handler:
        // staging is registered for write-protect only).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, bounce.addr as *mut u8, ps) };
        let intact = pm.present_not_zero(src)?;
        if intact {
            // SAFETY: the bounce buffer is ours and holds `ps` readable bytes.
            let n = unsafe { uffd.copy(dst, bounce.addr as *const u8, ps, false) }?;
            if n != ps {
                return Err(Errno::EEXIST);
            }
        }
        // A slot that cannot be emptied is found occupied when next used
        // (its move fails and the page stays where it is).
        // SAFETY: a staging slot of ours, read above into the bounce buffer.
        let _ = unsafe { mem::advise(src, ps, libc::MADV_DONTNEED) };
        Ok(intact)
    }

    /// Moves the `n` resident pages at `src` into the empty consecutive
    /// slots from `slot` with `UFFDIO_MOVE` (atomic per page: a concurrent
    /// touch faults and waits). Returns the pages moved (a prefix).
    pub fn pages_to_slots_move(&self, uffd: &Uffd, src: usize, slot: u32, n: usize) -> Result<usize, Errno> {
        let ps = self.page_size;
        self.check(src, ps * n)?;
        self.slot_addr(slot + n as u32 - 1);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        Ok(unsafe { uffd.mv(self.slot_addr(slot), src, ps * n, false) }? / ps)
    }

    /// Copies the resident page at `src` into the empty `slot`, then drops it
    /// from `src`. Only race-free when nothing can write `src` meanwhile (a
    /// non-writable region). Through `/proc/self/mem` when `src` is not
    /// readable.
    pub fn page_to_slot_copy(
        &self,
        uffd: &Uffd,
        src: usize,
        slot: u32,
        procmem: Option<&ProcMem>,
    ) -> Result<(), Errno> {
        let ps = self.page_size;
        self.check(src, ps)?;
        let dst = self.slot_addr(slot);
        match procmem {
            None => {
                // SAFETY: `src` is inside the reservation; the kernel's copy
                // from it faults like any user access (no Rust reference).
                let n = unsafe { uffd.copy(dst, src as *const u8, ps, false) }?;
                if n != ps {
                    return Err(Errno::EEXIST);
                }
            }
            Some(pm) => {
                let buf = mem::map_rw(ps)?;
                // SAFETY: `buf` is a fresh page of ours; `src` is resident.
                let r = unsafe { pm.read(buf, src, ps) }.and_then(|_| {
                    // SAFETY: `buf` is ours and readable.
                    unsafe { uffd.copy(dst, buf as *const u8, ps, false) }
                });
                // SAFETY: `buf` is ours and no longer used.
                unsafe {
                    let _ = mem::unmap(buf, ps);
                }
                if r? != ps {
                    return Err(Errno::EEXIST);
                }
            }
        }
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(src, ps, libc::MADV_DONTNEED) }
    }

    /// Runs `f` on the pages of `slots`, in order (a page store writes them
    /// out from there).
    pub fn with_slots<R>(&self, slots: &[u32], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let pages: Vec<&[u8]> = slots
            .iter()
            // SAFETY: the slots are ours and hold pages nothing writes while
            // they are being written out (the caller's claim); the slices
            // live only for the call.
            .map(|&s| unsafe { std::slice::from_raw_parts(self.slot_addr(s) as *const u8, self.page_size) })
            .collect();
        f(&pages)
    }

    /// Reads `len` bytes from a page store (`read` fills the buffer it is
    /// given) and installs them at `dst` (of the reservation, without
    /// waking), write-protected if `wp` (see `tracks_writes`). Returns the
    /// bytes installed (a prefix).
    #[allow(clippy::too_many_arguments)]
    pub fn store_in(
        &self,
        uffd: &Uffd,
        dst: usize,
        len: usize,
        wp: bool,
        bounce: &Bounce,
        read: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
    ) -> Result<usize, Errno> {
        self.check(dst, len)?;
        assert!(bounce.len >= len);
        {
            // SAFETY: the bounce buffer is a private mapping owned by
            // `bounce`, writable for `bounce.len >= len` bytes, and this
            // thread's alone (`with_bounce`): no other reference into it
            // while `read` runs; the slice dies before the copy below.
            let buf = unsafe { std::slice::from_raw_parts_mut(bounce.addr as *mut u8, len) };
            read(buf)?;
        }
        // SAFETY: as above, readable.
        unsafe { uffd.copy_wp(dst, bounce.addr as *const u8, len, false, wp && self.program_wp) }
    }

    /// Reads `len` bytes from a page store into `bounce` (`read` fills the
    /// buffer it is given), for a later [`Arena::install_bounce`].
    pub fn store_read(
        &self,
        len: usize,
        bounce: &Bounce,
        read: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        assert!(bounce.len >= len);
        // SAFETY: the bounce buffer is a private mapping owned by `bounce`,
        // writable for `bounce.len >= len` bytes, and this thread's alone
        // (`with_bounce`): no other reference into it while `read` runs.
        let buf = unsafe { std::slice::from_raw_parts_mut(bounce.addr as *mut u8, len) };
        read(buf)
    }

    /// Installs the first `len` bytes of `bounce` at `dst` (of the
    /// reservation), write-protected if `wp` (see `tracks_writes`), waking
    /// the waiters if `wake`. Returns the bytes installed (a prefix).
    pub fn install_bounce(
        &self,
        uffd: &Uffd,
        dst: usize,
        len: usize,
        wp: bool,
        wake: bool,
        bounce: &Bounce,
    ) -> Result<usize, Errno> {
        self.install_bounce_part(uffd, dst, 0, len, wp, wake, bounce)
    }

    /// [`Arena::install_bounce`] of `len` bytes in two halves at once: bytes
    /// `[mid, len)` are offered to a helper thread (`lender`, served by
    /// [`Arena::help_install`] on another CPU) while this thread installs
    /// `[0, mid)`; a half no helper claimed is installed here after. No
    /// wake-up and no write protection (for a caller no thread waits on).
    /// Returns the bytes installed of each half (each a prefix of its half:
    /// the second may be in when the first is short).
    #[allow(clippy::too_many_arguments)]
    pub fn install_bounce_split(
        &self,
        uffd: &Uffd,
        lender: &Lender,
        dst: usize,
        mid: usize,
        len: usize,
        bounce: &Bounce,
    ) -> (Result<usize, Errno>, Result<usize, Errno>) {
        assert!(mid <= len && bounce.len >= len);
        if let Err(e) = self.check(dst, len) {
            return (Err(e), Err(e));
        }
        let job = [dst + mid, bounce.addr + mid, len - mid];
        let (head, tail) = lender.lend(
            job,
            || self.install_bounce_part(uffd, dst, 0, mid, false, false, bounce),
            |_| errno_or_len(self.install_bounce_part(uffd, dst, mid, len - mid, false, false, bounce)),
        );
        (head, len_or_errno(tail))
    }

    /// The helper's side of [`Arena::install_bounce_split`]: installs a half
    /// offered in `lender`, if any. Returns whether it did.
    pub fn help_install(&self, uffd: &Uffd, lender: &Lender) -> bool {
        lender.help(|[dst, src, len]| {
            errno_or_len(self.check(dst, len).and_then(|()| {
                // SAFETY: only `install_bounce_split` offers jobs, with a
                // source inside its bounce buffer (`bounce.addr + mid`, `len
                // - mid` bytes), which it keeps borrowed until the job is
                // settled (`Lender::lend`): readable for `len` bytes.
                unsafe { uffd.copy_wp(dst, src as *const u8, len, false, false) }
            }))
        })
    }

    /// [`Arena::install_bounce`] of bytes `[from, from + len)` of `bounce`,
    /// at `dst + from`.
    #[allow(clippy::too_many_arguments)]
    pub fn install_bounce_part(
        &self,
        uffd: &Uffd,
        dst: usize,
        from: usize,
        len: usize,
        wp: bool,
        wake: bool,
        bounce: &Bounce,
    ) -> Result<usize, Errno> {
        self.check(dst + from, len)?;
        assert!(bounce.len >= from + len);
        // SAFETY: the bounce buffer is ours and readable for `from + len`
        // bytes.
        unsafe { uffd.copy_wp(dst + from, (bounce.addr + from) as *const u8, len, wake, wp && self.program_wp) }
    }

    /// A swap-in's read into pool frames (see `recycle_slots`): takes
    /// `len / page` frames off the pool and reads the store into them;
    /// `Ok(None)` when the pool has too few (read with `store_read` then).
    /// The frames are then the caller's until [`Arena::install_taken`].
    pub fn store_read_pooled(
        &self,
        len: usize,
        read: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
    ) -> Result<Option<Taken>, Errno> {
        let Some(frames) = self.pool_take(len / self.page_size) else { return Ok(None) };
        let taken = Taken { addr: frames, len };
        // SAFETY: pool frames this call took, mapped and writable, the
        // caller's alone (taken under the pool lock): no other reference.
        let buf = unsafe { std::slice::from_raw_parts_mut(frames as *mut u8, len) };
        match read(buf) {
            Ok(()) => Ok(Some(taken)),
            Err(e) => {
                self.drop_taken(taken);
                Err(e)
            }
        }
    }

    /// Installs taken frames (a `store_read_pooled`) at `dst`: moved where
    /// they can be, copied (write-protected if `wp`) where not. Returns
    /// the bytes installed (a prefix).
    pub fn install_taken(&self, uffd: &Uffd, dst: usize, t: Taken, wp: bool, wake: bool) -> Result<usize, Errno> {
        if let Err(e) = self.check(dst, t.len) {
            self.drop_taken(t);
            return Err(e);
        }
        self.install_frames(uffd, dst, t.addr, t.len, wake, wp)
    }

    /// Gives taken frames back to the host.
    pub fn drop_taken(&self, t: Taken) {
        // SAFETY: taken pool frames: ours, nothing else uses them.
        let _ = unsafe { mem::advise(t.addr, t.len, libc::MADV_DONTNEED) };
        self.pool_release(t.len / self.page_size);
    }

    /// Drops the frame of `slot` (the slot becomes empty).
    pub fn drop_slot(&self, slot: u32) -> Result<(), Errno> {
        self.drop_slots(slot, 1)
    }

    /// Drops the frames of the `n` consecutive slots from `slot`.
    pub fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno> {
        self.slot_addr(slot + n as u32 - 1);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(self.slot_addr(slot), self.page_size * n, libc::MADV_DONTNEED) }
    }

    /// Reads `len` bytes of `file` at `off` and installs them at `dst` (of
    /// the reservation), without waking the waiters (the caller commits,
    /// then wakes). Bytes past the end of the file read as zeros up to the
    /// end of the last page that holds file data. Returns
    /// the bytes installed (a whole number of pages; 0 when `off` is at or
    /// past the end of the file), and whether the read went through the
    /// host page cache (a single page is read with `O_DIRECT` where the file
    /// system allows it, on a ring of `rings`; see
    /// `MappedFile::read_page_direct`).
    #[allow(clippy::too_many_arguments)]
    pub fn file_in(
        &self,
        uffd: &Uffd,
        file: &MappedFile,
        off: u64,
        dst: usize,
        len: usize,
        bounce: &Bounce,
        rings: &crate::ring::RingPool,
    ) -> Result<(usize, bool), Errno> {
        self.check(dst, len)?;
        let (pages_len, cached) = self.file_read(file, off, len, bounce, rings)?;
        if pages_len == 0 {
            return Ok((0, cached));
        }
        self.install_bounce(uffd, dst, pages_len, false, false, bounce).map(|n| (n, cached))
    }

    /// The read of [`Arena::file_in`], into `bounce`: the bytes to install
    /// (whole pages, the tail past the end of the file zeroed; 0 when `off`
    /// is at or past the end), and whether the read went through the host
    /// page cache.
    pub fn file_read(
        &self,
        file: &MappedFile,
        off: u64,
        len: usize,
        bounce: &Bounce,
        rings: &crate::ring::RingPool,
    ) -> Result<(usize, bool), Errno> {
        let ps = self.page_size;
        assert!(bounce.len >= len);
        // A single page past the page cache where the file system allows it
        // (its short count says where the file ends: no fstat needed).
        // SAFETY: the bounce buffer is ours, page-aligned and at least a page.
        let direct = if len == ps { unsafe { file.read_page_direct(bounce.addr, ps, off, rings) } } else { None };
        let cached = direct.is_none();
        let done = match direct {
            Some(r) => r?,
            // Through the page cache: `pread` stops at the end of the file
            // (its count says where, as the single page's does: an `fstat`
            // first was one more syscall per fault).
            // SAFETY: the bounce buffer is ours and writable for its length.
            None => unsafe { pread_upto(file.read_fd(), bounce.addr, len, off) }?,
        };
        if done == 0 {
            return Ok((0, cached));
        }
        let pages_len = done.div_ceil(ps) * ps;
        // SAFETY: the tail of the last page is inside the bounce buffer.
        unsafe { mem::zero(bounce.addr + done, pages_len - done) };
        Ok((pages_len, cached))
    }

    /// Writes one page of the space — at `src` (mapped) or in staging `slot`
    /// — to `file` at `off`, never past the end of the file.
    pub fn page_out_to_file(
        &self,
        file: &MappedFile,
        src: Option<usize>,
        procmem: Option<&ProcMem>,
        slot: Option<u32>,
        off: u64,
    ) -> Result<(), Errno> {
        let ps = self.page_size;
        let addr = match (src, slot) {
            (_, Some(s)) => self.slot_addr(s),
            (Some(a), None) => {
                self.check(a, ps)?;
                a
            }
            (None, None) => return Err(Errno::EINVAL),
        };
        let size = file.size()?;
        if off >= size {
            return Ok(());
        }
        let len = ps.min((size - off) as usize);
        if slot.is_some() {
            // SAFETY: a parked page in staging, readable for a page (it
            // never faults: staging is ours, not registered).
            return unsafe { pwrite_all(file.raw(), addr, len, off) };
        }
        // A page of the space is copied out first, never written from
        // where it is: between the caller's snapshot and this write the
        // page may be evicted, and a `pwrite` that faults on it does so
        // holding the file's inode lock, while the handler may wait for
        // reclaim, whose own write-back waits for that lock (a deadlock
        // seen in the file tests). The copy's fault takes no lock of ours.
        thread_local! {
            static PAGE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        PAGE.with(|b| {
            let mut b = b.borrow_mut();
            b.resize(len, 0);
            // `process_vm_readv` first: a page evicted since the snapshot
            // is faulted back in through the handlers (a `/proc/self/mem`
            // read cannot wait for a userfault: its GUP may not retry, and
            // the read fails with EIO — seen as a spurious munmap EIO by
            // the fuzzer with a host swap file). `/proc/self/mem` where the
            // region is not readable (PROT_NONE, write-only: FOLL_FORCE).
            // A page that cannot be read either way is `EFAULT`, whatever
            // the reader said: the caller tells it from the file's errors
            // (it may find the page elsewhere now and try again).
            if crate::ffi::copy_from_own_memory(&mut b[..len], addr).is_err() {
                let pm = procmem.ok_or(Errno::EFAULT)?;
                // SAFETY: `b` is our own buffer, writable for `len` bytes.
                unsafe { pm.read(b.as_mut_ptr() as usize, addr, len) }.map_err(|_| Errno::EFAULT)?;
            }
            // SAFETY: `b` is our own buffer, readable for `len` bytes.
            let r = unsafe { pwrite_all(file.raw(), b.as_ptr() as usize, len, off) };
            // No copy of the page stays behind (a core dump would show it,
            // though its region is `MADV_DONTDUMP`).
            b.fill(0);
            r
        })
    }

    /// `mprotect` inside the reservation.
    pub fn protect(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::protect(a, l, prot) }
    }

    /// The host's `MADV_POPULATE_WRITE` inside the reservation: breaks the
    /// copy-on-write of pages that map the zero page and dirties present
    /// pages. A missing page faults into the space's handlers: the caller
    /// must hold no lock that they take.
    pub fn host_populate_write(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(a, l, MADV_POPULATE_WRITE) }
    }

    /// Drops the pages of `[a, a+l)` of the reservation, whatever the host
    /// says: `MADV_DONTNEED`; if the host refuses (pages locked behind
    /// usermm's back with a raw `mlock`: `EINVAL`), the range is unlocked
    /// and dropped again; if it still refuses, the range is replaced by a
    /// fresh mapping of protection `prot`, which `register` registers with
    /// a userfaultfd again. A zapped range never shows its old bytes to the
    /// next region there. Returns whether the host refused at first (for
    /// the stats).
    pub fn zap(
        &self,
        a: usize,
        l: usize,
        prot: i32,
        register: &dyn Fn(usize, usize) -> Result<(), Errno>,
    ) -> Result<bool, Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        if unsafe { mem::advise(a, l, libc::MADV_DONTNEED) }.is_ok() {
            return Ok(false);
        }
        let _ = mem::munlock(a, l);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        if unsafe { mem::advise(a, l, libc::MADV_DONTNEED) }.is_ok() {
            return Ok(true);
        }
        self.replace(a, l, prot, register)?;
        Ok(true)
    }

    /// Replaces `[a, a+l)` of the reservation by a fresh, empty anonymous
    /// mapping of protection `prot`, set up as the reservation is
    /// (`MADV_DONTFORK`, `MADV_NOHUGEPAGE`), which `register` registers with
    /// a userfaultfd: whatever was mapped there (pages the host would not
    /// drop, a file window of [`Arena::map_file`]) is gone.
    pub fn replace(
        &self,
        a: usize,
        l: usize,
        prot: i32,
        register: &dyn Fn(usize, usize) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range): no reference into it.
        unsafe { mem::replace_anon(a, l, prot) }?;
        // SAFETY: this arena's memory (checked range): no reference into it.
        unsafe { mem::advise(a, l, libc::MADV_DONTFORK) }?;
        // SAFETY: this arena's memory (checked range): no reference into it.
        unsafe { mem::advise(a, l, libc::MADV_NOHUGEPAGE) }?;
        register(a, l)
    }

    /// Maps `[a, a+l)` of the reservation to `file` at `off`: the page
    /// cache's own pages, shared, read-only, all mapped now and locked if
    /// `locked`, and left out of a `fork` as the reservation is. On failure
    /// the range is an empty anonymous mapping again, registered by
    /// `register` (as `replace` leaves it).
    pub fn map_file(
        &self,
        a: usize,
        l: usize,
        file: &MappedFile,
        off: u64,
        locked: bool,
        register: &dyn Fn(usize, usize) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range), whose pages are
        // being filled: nothing relies on them.
        let r = unsafe { mem::map_file_fixed(a, l, file.raw(), off, locked) }
            // SAFETY: as above (the new mapping).
            .and_then(|()| unsafe { mem::advise(a, l, libc::MADV_DONTFORK) });
        if let Err(e) = r {
            // (A failed MAP_FIXED may have taken the old mapping away.)
            let _ = self.replace(a, l, libc::PROT_READ, register);
            return Err(e);
        }
        Ok(())
    }

    /// Advice passed down to the host inside the reservation: only advice
    /// that changes no byte usermm holds (`MADV_DONTDUMP`, `MADV_DODUMP`,
    /// `MADV_GUARD_INSTALL` on pages usermm has dropped, `MADV_GUARD_REMOVE`).
    pub fn host_advise(&self, a: usize, l: usize, advice: i32) -> Result<(), Errno> {
        self.check(a, l)?;
        match advice {
            // SAFETY: this arena's memory (checked range or own slot): no reference into it.
            libc::MADV_DONTDUMP | libc::MADV_DODUMP | 102 | 103 => unsafe { mem::advise(a, l, advice) },
            _ => Err(Errno::EINVAL),
        }
    }

    /// Lifts the write protection of `[a, a+l)` of the reservation and
    /// wakes the threads waiting there (a WP fault resolved).
    pub fn unprotect(&self, uffd: &Uffd, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range); the caller's core
        // has settled the page (the writer's retry goes through).
        unsafe { uffd.unprotect(a, l) }
    }

    /// `MADV_DONTNEED` inside the reservation.
    pub fn dontneed(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.check(a, l)?;
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(a, l, libc::MADV_DONTNEED) }
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14; newer than some libc headers).
const MADV_POPULATE_WRITE: i32 = 23;

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the arena owns these mappings; its owner drops it only when
        // the space is closed and its threads are gone.
        unsafe {
            let _ = mem::unmap(self.base, self.reserve_len);
            if self.staging_base != 0 {
                let _ = mem::unmap(self.staging_base, self.staging_len);
            }
            if self.zero_buf != 0 {
                let _ = mem::unmap(self.zero_buf, self.zero_len);
            }
            if self.pool_base != 0 {
                let _ = mem::unmap(self.pool_base, self.pool_cap * self.page_size);
            }
        }
    }
}

/// The pool's counts (see `Arena::pool_len`).
#[derive(Default)]
struct PoolState {
    /// Ready frames, in slots `0..len`.
    len: usize,
    /// Frames taken by fills in flight, in the slots right above.
    taken: usize,
    /// Ready slots trimmed while frames were taken (empty slots below the
    /// taken ones): no take until the taken are gone, so that a take's
    /// frames are always ready ones.
    hole: usize,
}

/// Frames taken off a space's pool, read into and not yet installed.
pub struct Taken {
    addr: usize,
    len: usize,
}

/// A page-aligned private buffer (for O_DIRECT reads).
pub struct Bounce {
    addr: usize,
    len: usize,
}

impl Bounce {
    pub fn new(len: usize) -> Result<Bounce, Errno> {
        let b = Bounce { addr: mem::map_rw(len)?, len };
        // Copies of the program's pages (swap and file I/O) stay out of
        // core dumps, as the staging area does.
        // SAFETY: the buffer is ours, just mapped: no reference into it.
        unsafe { mem::advise(b.addr, b.len, libc::MADV_DONTDUMP) }?;
        Ok(b)
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: the buffer is ours and dropped with us.
        unsafe {
            let _ = mem::unmap(self.addr, self.len);
        }
    }
}

/// A copy's result in one word for a [`Lender`]: the bytes, or `-errno`.
fn errno_or_len(r: Result<usize, Errno>) -> i64 {
    match r {
        Ok(n) => n as i64,
        Err(e) => -(e.0 as i64),
    }
}

/// The other way round.
fn len_or_errno(v: i64) -> Result<usize, Errno> {
    if v < 0 {
        Err(Errno(-v as i32))
    } else {
        Ok(v as usize)
    }
}
