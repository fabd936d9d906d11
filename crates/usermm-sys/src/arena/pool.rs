//! The frame pool (`UMM_F_FRAME_POOL`): ready frames in page slots of their
//! own, taken by zero fills and swap-ins and moved into the program's range,
//! refilled from staging frames bound for the host (see
//! [`Arena::recycle_slots`]).
use super::Arena;
use crate::uffd::Uffd;
use crate::{mem, Errno};

impl Arena {
    /// Pages moved from the pool into the program's range so far.
    pub fn pool_installed(&self) -> u64 {
        self.pool_installed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// In a forked child: the pool, `MADV_DONTFORK` and so absent here,
    /// mapped again empty and registered with the child's `uffd`. `EBUSY`
    /// if its count was locked at the fork (the callers hold the space's
    /// region or core lock, which the fork held: never so far).
    pub(super) fn rearm_pool_in_child(&self, uffd: &Uffd) -> Result<(), Errno> {
        if self.pool_cap == 0 {
            return Ok(());
        }
        let mut p = self.pool_len.try_lock().map_err(|_| Errno::EBUSY)?;
        let len = self.pool_cap * self.page_size;
        // SAFETY: the pool's own range, which no mapping of this process
        // holds now (a fork leaves it out) and nothing refers to.
        unsafe { mem::replace_anon(self.pool_base, len, libc::PROT_READ | libc::PROT_WRITE) }?;
        [libc::MADV_DONTFORK, libc::MADV_NOHUGEPAGE, libc::MADV_DONTDUMP]
            .iter()
            // SAFETY: the pool mapping is ours, just made: no reference into it.
            .try_for_each(|&adv| unsafe { mem::advise(self.pool_base, len, adv) })?;
        uffd.register_mode(self.pool_base, len, crate::uffd::UFFDIO_REGISTER_MODE_WP)?;
        *p = PoolState::default();
        Ok(())
    }

    /// Frames in the pool now.
    pub fn pool_frames(&self) -> usize {
        self.pool().len
    }

    pub(super) fn pool(&self) -> std::sync::MutexGuard<'_, PoolState> {
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
    pub(super) fn pool_take(&self, n: usize) -> Option<usize> {
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
    pub(super) fn pool_release(&self, n: usize) {
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
    pub(super) fn install_frames(
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
}

/// The pool's counts (see `Arena::pool_len`).
#[derive(Default)]
pub(super) struct PoolState {
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
