//! Zap: dropping the pages of detached or replaced ranges, in chunks and slices
//! (seed 003).

use super::*;

impl Inner {
    /// Drops the pages of `r` (the caller holds `mm`, shared or exclusive).
    pub(super) fn zap_range(&self, r: PageRange) {
        let chunk_pages = (ZAP_CHUNK_BYTES / self.page_size).max(1) as u64;
        let mut s = r.start.0;
        while s < r.end.0 {
            let e = (s + chunk_pages).min(r.end.0);
            self.zap_chunk(PageRange::new(s, e), None, &mut |_| {});
            s = e;
        }
    }

    /// Drops the pages of `r` like [`Inner::zap_range`], and runs `also` on
    /// each chunk after its frames are gone and before its pages are
    /// released: while a chunk is claimed no write-back of it is in flight
    /// or can start, and a fault in it waits.
    pub(super) fn zap_range_and(&self, r: PageRange, also: &mut dyn FnMut(PageRange)) {
        let chunk_pages = (ZAP_CHUNK_BYTES / self.page_size).max(1) as u64;
        let mut s = r.start.0;
        while s < r.end.0 {
            let e = (s + chunk_pages).min(r.end.0);
            self.zap_chunk(PageRange::new(s, e), None, also);
            s = e;
        }
    }

    /// Drops the pages of one chunk. With `mm` (munmap's shared hold of the
    /// region lock), the lock is let go during the yields between slices,
    /// so a waiting writer (another thread's mmap or munmap) waits for one
    /// slice, not for the chunk; without it the caller holds the lock
    /// throughout. (munmap's range is detached and held back from reuse:
    /// nothing a writer does while the lock is let go touches it. Not
    /// holding the lock at all was measured too: the writers then collide
    /// with the slices' `MADV_DONTNEED` on the kernel's own mmap lock, and
    /// the map/unmap loop's p99 stall was 0.45–0.5 ms instead of 0.13.)
    pub(super) fn zap_chunk<'a>(
        &'a self,
        r: PageRange,
        mut mm: Option<RwLockReadGuard<'a, ()>>,
        also: &mut dyn FnMut(PageRange),
    ) {
        let start = self.addr(r.start);
        let len = r.pages() as usize * self.page_size;
        let (claim, prot) = {
            let mut c = lock(&self.core);
            loop {
                match c.zap_begin(r) {
                    // (A detached range is PROT_NONE to the program: a
                    // touch is SIGSEGV; see `Arena::zap` for the prot.)
                    Ok(claim) => break (claim, c.region_at(r.start).map_or(PROT_NONE, |g| g.prot() & PROT_MASK)),
                    Err(Busy) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
                }
            }
        };
        // (The host's pages of a region handed to it are none of the
        // core's: the platform's zap replaces them.)
        if claim.mapped || !self.plat.runs(Runs::Shared, start, len).is_empty() {
            // In slices with a yield between them, like the kernel's zap
            // with its cond_resched(): a thread woken on this CPU (a fault
            // just served) waits for one slice, not for the whole chunk.
            let mut off = 0;
            while off < len {
                let n = (len - off).min(ZAP_SLICE_BYTES);
                // Whatever the host says, the pages go (a range locked
                // behind our back is unlocked, or replaced): a new region
                // here must never show them.
                if !matches!(self.plat.range(Range::Zap(prot), start + off, n), Ok(false)) {
                    self.counters.host_refused();
                }
                off += n;
                if off < len {
                    // A fair unlock hands the lock to a parked writer at
                    // once, instead of letting this thread take it back
                    // first.
                    let held = mm.take().map(RwLockReadGuard::unlock_fair).is_some();
                    std::thread::yield_now();
                    if held {
                        mm = Some(self.read_mm());
                    }
                }
            }
        }
        for &s in &claim.staging {
            let _ = self.plat.staging(Staging::Drop { slot: s, n: 1 });
        }
        also(r);
        let mut c = lock(&self.core);
        c.zap_end(&claim);
        self.settled.notify_all();
    }
}
