//! The region calls: `mmap`, `munmap`, `msync`, `mprotect`, and `madvise`'s
//! entry.

use super::*;
use usermm_core::MmapPlan;

impl Inner {
    pub fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        if off & (self.page_size as i64 - 1) != 0 {
            return Err(Errno::EINVAL);
        }
        // A file mapping: Linux takes the descriptor before any other check
        // but the offset's alignment (`EBADF` for one that is not open, or
        // is `O_PATH`); the core then checks the rest in do_mmap's order,
        // the descriptor's access and type last. The space keeps a
        // duplicate of it.
        let file = if flags & MAP_ANONYMOUS == 0 {
            // One entry (and one descriptor) per open file, however many
            // regions map it: 100,000 regions of one file need one fd.
            Some(self.files.open(fd)?)
        } else {
            None
        };
        let result = self.mmap_locked(addr, len, prot, flags, off, file.as_ref());
        // A refused file, or `/dev/zero` (mapped as anonymous memory), is no
        // region's: its entry goes.
        if file.as_ref().is_some_and(|(_, f)| result.is_err() || f.zero) {
            self.release_files();
        }
        result
    }

    pub(super) fn mmap_locked(
        &self,
        addr: usize,
        len: usize,
        prot: i32,
        flags: i32,
        off: i64,
        file: Option<&(u32, Arc<MappedFile>)>,
    ) -> Result<usize, Errno> {
        loop {
            let mm = self.mm().write();
            let t0 = now_ns();
            let reply = match file {
                Some((id, f)) => lock(&self.core).mmap_file(
                    addr as u64,
                    len as u64,
                    prot,
                    flags,
                    FileMap {
                        id: *id,
                        writable: f.writable,
                        readable: f.readable,
                        mappable: f.mappable,
                        zero: f.zero,
                        size_max_bytes: f.size_max_bytes,
                        off_pages: off as u64 / self.page_size as u64,
                    },
                ),
                None => lock(&self.core).mmap(addr as u64, len as u64, prot, flags),
            }?;
            match reply {
                MmapReply::Busy => {
                    drop(mm);
                    let c = lock(&self.core);
                    let _ = self.settled.wait_timeout(c, std::time::Duration::from_millis(MMAP_BUSY_WAIT_MS));
                    continue;
                }
                MmapReply::Done(plan) => {
                    if let Some(d) = &plan.replaced {
                        self.zap_replaced(d);
                    }
                    let (a, l) = (self.addr(plan.range.start), plan.range.pages() as usize * self.page_size);
                    let mode = self.mmap_host_setup(&plan)?;
                    self.note_hold(t0);
                    drop(mm);
                    // Best effort: never fails the mmap (Linux). A
                    // lock-on-fault region is never populated, even with
                    // MAP_POPULATE (Linux skips VM_LOCKONFAULT).
                    // MAP_NONBLOCK with MAP_POPULATE populates nothing
                    // (do_mmap: only a lock, or MAP_POPULATE alone).
                    let populate = mode == LockMode::Locked
                        || (flags & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE && mode != LockMode::OnFault);
                    if populate && plan.prot != PROT_NONE {
                        let _ = self.populate(a, l, plan.prot & PROT_WRITE != 0);
                    }
                    return Ok(a);
                }
            }
        }
    }

    /// `mremap`'s grow in place: maps `[end, end + grow)` as the
    /// continuation of the region that ends at `end` (its protection and
    /// kind; a file region's next pages of the same file, a locked
    /// region's locked), `MAP_FIXED_NOREPLACE` (`EEXIST` when anything is
    /// there). `EFAULT` when no region ends at `end`.
    pub fn grow_region(&self, end: usize, grow: usize) -> Result<(), Errno> {
        if end <= self.base || !end.is_multiple_of(self.page_size) {
            return Err(Errno::EFAULT);
        }
        let (prot, kind, lock, noreserve, file, pgoff) = {
            let c = lock(&self.core);
            let last = c.page_of(Addr((end - self.page_size) as u64)).ok_or(Errno::EFAULT)?;
            let r = c.region_at(last).ok_or(Errno::EFAULT)?;
            if self.addr(r.range().end) != end {
                return Err(Errno::EFAULT);
            }
            (r.prot(), r.kind(), r.lock(), r.noreserve(), r.file(), r.file_page(r.range().end))
        };
        let mut flags = MAP_FIXED_NOREPLACE
            | match kind {
                Kind::AnonPrivate => MAP_PRIVATE | MAP_ANONYMOUS,
                Kind::AnonShared => MAP_SHARED | MAP_ANONYMOUS,
                Kind::FileShared => MAP_SHARED,
                Kind::FilePrivate => MAP_PRIVATE,
            };
        if lock == LockMode::Locked {
            flags |= MAP_LOCKED;
        }
        if noreserve {
            flags |= MAP_NORESERVE;
        }
        let file = match file {
            Some(id) => Some((id, self.files.get(id).ok_or(Errno::EFAULT)?)),
            None => None,
        };
        let off = (pgoff as usize * self.page_size) as i64;
        self.mmap_locked(end, grow, prot, flags, off, file.as_ref()).map(drop)
    }

    /// A `MAP_FIXED` replacement's old pages (`MmapPlan::replaced`): shared
    /// file pages written back, host locks dropped, host advice cleared, the
    /// pages zapped, and the range released to the new region.
    fn zap_replaced(&self, d: &Detached) {
        for f in &d.files {
            let _ = self.writeback_range(f.range, &d.files);
        }
        for r in &d.locked {
            let _ = self.host_lock(*r, LockMode::None);
        }
        self.clear_host_advice(&d.ranges);
        for r in &d.ranges {
            self.zap_range(*r);
        }
        lock(&self.core).unhold(d);
    }

    /// A new mapping's host side: its protection, then its host lock (if
    /// its region is locked). On failure the mapping is undone in the core
    /// (and its protection reset if the lock failed). Its lock mode.
    fn mmap_host_setup(&self, plan: &MmapPlan) -> Result<LockMode, Errno> {
        let a = self.addr(plan.range.start);
        let l = plan.range.pages() as usize * self.page_size;
        if let Err(e) = self.plat.range(Range::Protect(plan.prot), a, l) {
            // Undo: the kernel refused (out of its map count).
            let d = lock(&self.core).munmap(a as u64, l as u64);
            if let Ok(Some(d)) = d {
                lock(&self.core).unhold(&d);
            }
            return Err(e);
        }
        let (mode, in_thread) =
            lock(&self.core).region_at(plan.range.start).map_or((LockMode::None, false), |r| (r.lock(), r.in_thread()));
        if let Err(e) = self.set_in_thread(a, l, in_thread) {
            let d = lock(&self.core).munmap(a as u64, l as u64);
            if let Ok(Some(d)) = d {
                lock(&self.core).unhold(&d);
            }
            let _ = self.plat.range(Range::Protect(PROT_NONE), a, l);
            return Err(e);
        }
        if mode != LockMode::None {
            if let Err(e) = self.host_lock(plan.range, mode) {
                let d = lock(&self.core).munmap(a as u64, l as u64);
                if let Ok(Some(d)) = d {
                    lock(&self.core).unhold(&d);
                }
                let _ = self.plat.range(Range::Protect(PROT_NONE), a, l);
                return Err(if e == Errno::ENOMEM || e == Errno::EPERM { Errno::EAGAIN } else { e });
            }
        }
        Ok(mode)
    }

    /// A new region's faults resolved in the faulting thread
    /// (`UMM_MAP_INTHREAD`) or by the handler threads: the range goes to
    /// the userfaultfd of its kind, and the first such region puts the
    /// reservation in the SIGBUS handler's table (`Thread::InThreadOn`).
    fn set_in_thread(&self, a: usize, l: usize, on: bool) -> Result<(), Errno> {
        if self.settings.in_thread() {
            // Every fault of the space is resolved in the faulting thread.
            return Ok(());
        }
        if on {
            // (64 spaces at most have in-thread faults: `ENOSPC` there,
            // `ENOMEM` to mmap, Linux's "no room for another mapping".)
            // (Once the reservation is there, a handler a program installed
            // since with plain sigaction is put behind usermm's.)
            let no_room = |e: Errno| if e == Errno::ENOSPC { Errno::ENOMEM } else { e };
            let resolver = Arc::new(fault::InThread(self.me.upgrade().ok_or(Errno::EBADF)?));
            let (start, end) = (self.base, self.base + self.reserve_len);
            self.plat.thread(Thread::InThreadOn { start, end, resolver }).map_err(no_room)?;
        }
        self.plat.range(Range::InThread(on), a, l).map(drop)
    }

    /// Removes what advice passed down to the host left on ranges that are
    /// leaving (guard markers, `VM_DONTDUMP`), so that a new region there
    /// starts as a fresh mapping would. Nothing to do, and no syscall, in a
    /// space that never used them.
    pub(super) fn clear_host_advice(&self, ranges: &[PageRange]) {
        let (guards, dump) = self.counters.marks_used();
        for r in ranges {
            let (a, l) = (self.addr(r.start), r.pages() as usize * self.page_size);
            if guards {
                let _ = self.plat.range(Range::Advise(MADV_GUARD_REMOVE), a, l);
            }
            if dump {
                let _ = self.plat.range(Range::Advise(MADV_DODUMP), a, l);
            }
        }
    }

    pub(super) fn note_hold(&self, t0: u64) {
        self.counters.note_hold(now_ns().saturating_sub(t0));
    }

    /// Seed 003: detach under the exclusive lock, then zap chunk by chunk
    /// under the shared lock (re-taken per chunk, so that writers get in
    /// between chunks), with the range held back from reuse until done.
    pub fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let detached: Option<Detached> = {
            let _mm = self.mm().write();
            let t0 = now_ns();
            let d = lock(&self.core).munmap(addr as u64, len as u64)?;
            self.note_hold(t0);
            d
        };
        let Some(d) = detached else { return Ok(()) };
        // Dirty shared file pages reach their file before the call returns.
        let mut wb_err = None;
        for f in &d.files {
            let _mm = self.read_mm();
            if let Err(e) = self.writeback_range(f.range, &d.files) {
                wb_err.get_or_insert(e);
            }
        }
        for r in &d.locked {
            // MADV_DONTNEED refuses VM_LOCKED ranges; the range is leaving.
            let _ = self.host_lock(*r, LockMode::None);
        }
        // The range keeps its host protection: no mprotect(PROT_NONE), which
        // would hold the kernel's mmap lock exclusively while it walks the
        // range's page tables (0.6 ms a GiB), stalling every fault the
        // handlers serve. A touch of an unmapped page reaches a handler,
        // which finds no region and makes the gap around it PROT_NONE (`Segv`).
        self.clear_host_advice(&d.ranges);
        let chunk_pages = (ZAP_CHUNK_BYTES / self.page_size).max(1) as u64;
        for r in &d.ranges {
            let mut s = r.start.0;
            while s < r.end.0 {
                let e = (s + chunk_pages).min(r.end.0);
                self.zap_chunk(PageRange::new(s, e), Some(self.read_mm()), &mut |_| {});
                // Let the handler threads and a waiting writer run: on a
                // machine with few CPUs the zap would otherwise keep one busy
                // for the whole unmap.
                std::thread::yield_now();
                s = e;
            }
        }
        let mut c = lock(&self.core);
        c.unhold(&d);
        let errs: Vec<Errno> = d.files.iter().filter_map(|f| c.take_file_error(f.file)).collect();
        self.settled.notify_all();
        drop(c);
        self.release_files();
        match wb_err.or(errs.first().copied()) {
            // Linux's munmap does not report write-back errors; usermm does
            // (the data could not reach the file), as fsync would.
            Some(e) => Err(if e == Errno::EIO { Errno::EIO } else { e }),
            None => Ok(()),
        }
    }

    /// `mseal`: the core seals the range's regions (under the exclusive
    /// lock, as Linux's mmap write lock); the host's mapping stays
    /// unsealed, since usermm must still zap, protect and lock its pages.
    pub fn mseal(&self, addr: usize, len: usize, flags: u64) -> Result<(), Errno> {
        let _mm = self.mm().write();
        let t0 = now_ns();
        let r = lock(&self.core).mseal(addr as u64, len as u64, flags);
        self.note_hold(t0);
        r
    }

    /// `msync`: writes the shared file pages of the range to their files;
    /// with `MS_SYNC`, also `fdatasync`s them before returning. A write-back
    /// error since the last msync (eviction included) is reported as `EIO`.
    pub fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno> {
        let _mm = self.read_mm();
        let (segs, res) = lock(&self.core).msync(addr as u64, len as u64, flags);
        let mut files = Vec::new();
        let mut err = None;
        for seg in segs {
            match self.writeback_range(seg, &[]) {
                Ok(fs) => files.extend(fs),
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
            // Files of the segment even when no page was resident: their
            // earlier write-back errors are reported here.
            let c = lock(&self.core);
            if let Some(f) = c.region_at(seg.start).and_then(|r| r.file()) {
                files.push(f);
            }
        }
        files.sort_unstable();
        files.dedup();
        if flags & MS_SYNC != 0 {
            let table = self.files.snapshot();
            for f in &files {
                if let Some(mf) = table.get(f) {
                    if let Err(e) = mf.sync() {
                        err.get_or_insert(e);
                    }
                }
            }
        }
        let mut c = lock(&self.core);
        for f in &files {
            if let Some(e) = c.take_file_error(*f) {
                err.get_or_insert(e);
            }
        }
        drop(c);
        if let Some(e) = err {
            return Err(if e == Errno::ENOSPC { e } else { Errno::EIO });
        }
        res
    }

    pub fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        let mm = self.mm().write();
        let t0 = now_ns();
        let (segs, res, populate) = {
            let mut c = lock(&self.core);
            // Linux (mprotect_fixup): a fully locked private range made
            // writable is populated for writing (the zero pages a read
            // mapped get frames of their own); lock-on-fault ones are not.
            let populate: Vec<PageRange> = if prot & PROT_WRITE != 0 {
                let ps = self.page_size as u64;
                let pages = (len as u64).div_ceil(ps);
                c.page_of(Addr(addr as u64))
                    .map(|p0| {
                        let r = PageRange::new(p0.0, p0.0.saturating_add(pages));
                        c.regions()
                            .overlapping(r)
                            .iter()
                            .filter(|g| {
                                g.lock() == LockMode::Locked
                                    && matches!(g.kind(), Kind::AnonPrivate | Kind::FilePrivate)
                                    && g.prot() & PROT_WRITE == 0
                            })
                            .map(|g| g.range().intersect(&r))
                            .collect()
                    })
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let (segs, res) = c.mprotect(addr as u64, len as u64, prot);
            (segs, res, populate)
        };
        for s in &segs {
            if prot & PROT_MASK != PROT_READ {
                // (Windows from the page cache live only in read-only regions.)
                self.unmap_file_windows(*s);
            }
            let a = self.addr(s.start);
            self.plat.range(Range::Protect(prot & PROT_MASK), a, s.pages() as usize * self.page_size)?;
        }
        self.note_hold(t0);
        drop(mm);
        for r in populate.into_iter().filter(|r| segs.iter().any(|s| s.overlaps(r))) {
            let _ = self.populate(self.addr(r.start), r.pages() as usize * self.page_size, true);
        }
        res
    }

    pub fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        if advice == MADV_POPULATE_READ || advice == MADV_POPULATE_WRITE {
            return self.populate(addr, len, advice == MADV_POPULATE_WRITE).1;
        }
        let attr = usermm_core::is_attribute_advice(advice);
        let (ops, res) = if attr {
            let _mm = self.mm().write();
            let t0 = now_ns();
            let r = lock(&self.core).madvise(addr as u64, len as u64, advice);
            self.note_hold(t0);
            r
        } else {
            let mm = self.read_mm();
            // Fills of this range in flight (other threads' faults) land
            // first: the advice applies to them.
            let r = self.settled_core_all(addr, len, advice == MADV_FREE).madvise(addr as u64, len as u64, advice);
            let mut err = None;
            for op in &r.0 {
                if let Err(e) = self.advice_op(&mm, op) {
                    err.get_or_insert(e);
                }
            }
            (Vec::new(), r.1.and(err.map_or(Ok(()), Err)))
        };
        debug_assert!(ops.is_empty());
        res
    }
}
