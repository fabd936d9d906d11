//! The memory a space owns, with safe operations on it.
//!
//! An `Arena` owns three mappings: the *reservation* (the program's range),
//! the *staging area* (one page slot per budget page, where inactive pages are
//! parked) and a *zero buffer*. Every method checks that the addresses it is
//! given lie inside the arena, so that the executor can drive page movement
//! without `unsafe`: no Rust reference ever points into these mappings; the
//! kernel moves the bytes (userfaultfd ioctls, `pread`/`pwritev`).

use crate::file::{MappedFile, ProcMem};
use crate::uffd::Uffd;
use crate::{mem, Errno};

mod io;
pub use io::warm_thread_locals;
mod pool;
mod share;
pub use io::Bounce;
use pool::PoolState;
pub use pool::Taken;
pub use share::{ShareSrc, ShareTo};

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
    /// Whether a forked child gets a copy of the reservation and the
    /// staging area (else they are `MADV_DONTFORK`: [`Arena::with_pool`]).
    fork_copies: bool,
}

/// Page addresses as `(address, length)` runs, neighbours in order merged.
fn page_runs(addrs: impl Iterator<Item = usize>, ps: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for a in addrs {
        match runs.last_mut() {
            Some((b, l)) if *b + *l == a => *l += ps,
            _ => runs.push((a, ps)),
        }
    }
    runs
}

impl Arena {
    /// Reserves `reserve_len` bytes (`PROT_NONE`, aligned to 2 MiB) and
    /// `staging_slots` staging pages; applies `MADV_DONTFORK` and
    /// `MADV_NOHUGEPAGE` to both and registers both with `uffd`.
    pub fn new(uffd: &Uffd, reserve_len: usize, staging_slots: usize, page_size: usize) -> Result<Arena, Errno> {
        Arena::with_pool(uffd, reserve_len, staging_slots, page_size, 0, false)
    }

    /// As `new`, with a frame pool of `pool_pages` (0: none; see
    /// [`Arena::recycle_slots`]); `fork_copies`: the reservation and the
    /// staging area are left to forks (a child gets a copy, and re-arms it:
    /// [`Arena::rearm_in_child`]) instead of `MADV_DONTFORK`. The pool
    /// always stays out of forks.
    pub fn with_pool(
        uffd: &Uffd,
        reserve_len: usize,
        staging_slots: usize,
        page_size: usize,
        pool_pages: usize,
        fork_copies: bool,
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
            fork_copies,
        };
        a.staging_base = mem::map_rw(a.staging_len)?;
        a.zero_buf = mem::map_rw(a.zero_len)?;
        for (s, l) in [(a.base, a.reserve_len), (a.staging_base, a.staging_len)] {
            if !fork_copies {
                // SAFETY: this arena's memory (checked range or own slot): no reference into it.
                unsafe { mem::advise(s, l, libc::MADV_DONTFORK) }?;
            }
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

    /// In a forked child whose `uffd` was just replaced
    /// ([`Uffd::replace_in_child`]): registers the reservation and the
    /// staging area with it again, as at the start (a child's inherited
    /// mappings are registered with no userfaultfd: a missing page there
    /// would read as the zero page), and opens pagemap again (the inherited
    /// one shows the parent's pages); a frame pool (left out of forks)
    /// starts again empty (`rearm_pool_in_child`). `ENOTSUP` for one made
    /// without `fork_copies`. The ranges `skip` (sorted, disjoint: the
    /// host's, `share_out`) stay registered with nothing.
    pub fn rearm_in_child(&self, uffd: &Uffd, skip: &[(usize, usize)]) -> Result<(), Errno> {
        if !self.fork_copies {
            return Err(Errno(libc::ENOTSUP));
        }
        self.rearm_pool_in_child(uffd)?;
        let mut at = self.base;
        for &(s, t) in skip.iter().chain([(self.base + self.reserve_len, self.base + self.reserve_len)].iter()) {
            if s > at {
                uffd.register_mode(at, s - at, self.program_register_mode())?;
            }
            at = at.max(t);
        }
        let staging_mode = if self.staging_wp_only {
            crate::uffd::UFFDIO_REGISTER_MODE_WP
        } else {
            crate::uffd::UFFDIO_REGISTER_MODE_MISSING
        };
        uffd.register_mode(self.staging_base, self.staging_len, staging_mode)?;
        if let Some(pm) = &self.pagemap {
            pm.reopen_in_child()?;
        }
        Ok(())
    }

    /// Whether a forked child gets a copy of the arena (see
    /// [`Arena::with_pool`]).
    pub fn fork_copies(&self) -> bool {
        self.fork_copies
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
    pub fn slot_to_page(
        &self,
        uffd: &Uffd,
        slot: u32,
        dst: usize,
        try_move: bool,
        wp: bool,
        release: bool,
    ) -> Result<(), Errno> {
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
        if !release {
            return Ok(()); // the caller drops the slot (`drop_slot_list`)
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

    /// Moves the pages parked in the `n` consecutive slots from `slot` back
    /// to the `n` empty pages at `dst` with `UFFDIO_MOVE` (without waking).
    /// Returns the pages moved (a prefix).
    pub fn slots_to_pages_move(&self, uffd: &Uffd, slot: u32, dst: usize, n: usize) -> Result<usize, Errno> {
        let ps = self.page_size;
        self.check(dst, ps * n)?;
        self.slot_addr(slot + n as u32 - 1);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        Ok(unsafe { uffd.mv(dst, self.slot_addr(slot), ps * n, false) }? / ps)
    }

    /// Copies the resident page at `src` into the empty `slot` through
    /// `/proc/self/mem` (`src` is not readable), then drops it from `src`.
    /// Only race-free when nothing can write `src` meanwhile (a
    /// non-writable region). Readable pages: `pages_to_slots_copy`.
    pub fn page_to_slot_copy_unreadable(&self, uffd: &Uffd, src: usize, slot: u32, pm: &ProcMem) -> Result<(), Errno> {
        let ps = self.page_size;
        self.check(src, ps)?;
        let dst = self.slot_addr(slot);
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
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(src, ps, libc::MADV_DONTNEED) }
    }

    /// Copies the page at each `src` into its `slot`, then drops the
    /// copied pages from the program range with batched advice (one TLB
    /// flush per 1,024 runs of them, not one a page: `mem::advise_many`).
    /// Only for pages nothing writes meanwhile (a read-only region's): a
    /// write between a copy and the drop would be lost. Returns which pages
    /// are in their slots and gone from the range.
    pub fn pages_to_slots_copy(&self, uffd: &Uffd, pairs: &[(usize, u32)]) -> Vec<bool> {
        let ps = self.page_size;
        let mut ok: Vec<bool> = pairs
            .iter()
            .map(|&(src, slot)| {
                if self.check(src, ps).is_err() {
                    return false;
                }
                let dst = self.slot_addr(slot);
                // SAFETY: `src` is inside the reservation; the kernel's copy
                // from it faults like any user access (no Rust reference).
                matches!(unsafe { uffd.copy(dst, src as *const u8, ps, false) }, Ok(n) if n == ps)
            })
            .collect();
        let runs = page_runs(pairs.iter().zip(&ok).filter(|(_, ok)| **ok).map(|(&(src, _), _)| src), ps);
        // SAFETY: checked ranges of this arena's reservation: no reference
        // into them.
        if unsafe { mem::advise_many(&runs, libc::MADV_DONTNEED) }.is_err() {
            // (Which were dropped is unknown: each again, on its own.)
            for (&(src, _), ok) in pairs.iter().zip(&mut ok).filter(|(_, ok)| **ok) {
                // SAFETY: as above, for this one page.
                *ok = unsafe { mem::advise(src, ps, libc::MADV_DONTNEED) }.is_ok();
            }
        }
        ok
    }

    /// Drops the frame of `slot` (the slot becomes empty).
    pub fn drop_slot(&self, slot: u32) -> Result<(), Errno> {
        self.drop_slots(slot, 1)
    }

    /// Drops the frames of `slots` (neighbours coalesced) with batched
    /// advice: one TLB flush per 1,024 runs, not one per slot
    /// (`mem::advise_many`).
    pub fn drop_slot_list(&self, slots: &[u32]) -> Result<(), Errno> {
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let runs = page_runs(sorted.iter().map(|&s| self.slot_addr(s)), self.page_size);
        // SAFETY: this arena's own staging slots (`slot_addr` checks each):
        // no reference into them.
        unsafe { mem::advise_many(&runs, libc::MADV_DONTNEED) }
    }

    /// Drops the frames of the `n` consecutive slots from `slot`.
    pub fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno> {
        self.slot_addr(slot + n as u32 - 1);
        // SAFETY: this arena's memory (checked range or own slot): no reference into it.
        unsafe { mem::advise(self.slot_addr(slot), self.page_size * n, libc::MADV_DONTNEED) }
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
        if !self.fork_copies {
            // SAFETY: this arena's memory (checked range): no reference into it.
            unsafe { mem::advise(a, l, libc::MADV_DONTFORK) }?;
        }
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
