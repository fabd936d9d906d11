//! Write-back of shared file pages: by reclaim, msync, munmap, DONTNEED and
//! close.

use super::*;

impl Inner {
    /// Writes pages of shared file regions to their files. Returns one
    /// result per item.
    pub(super) fn write_pages(&self, ws: &[Writeback]) -> Vec<Result<(), Errno>> {
        let files = self.files.snapshot();
        let ps = self.page_size as u64;
        let mut touched = Vec::new();
        let out = ws
            .iter()
            .map(|w| {
                let f = files.get(&w.file).ok_or(Errno::EIO)?;
                let src = if w.staging.is_none() { Some(self.addr(w.page)) } else { None };
                let r = self.plat.page_out_to_file(f, src, w.staging, w.file_page * ps);
                if r.is_ok() && !touched.contains(&w.file) {
                    touched.push(w.file);
                }
                r
            })
            .collect();
        for id in touched {
            if let Some(f) = files.get(&id) {
                f.drop_cache(0, 0);
            }
        }
        out
    }

    /// Evicts parked pages of shared file regions to their files.
    pub(super) fn writeback_all(&self, ws: &[Writeback]) -> u64 {
        if ws.is_empty() {
            return 0;
        }
        // Clean pages are dropped without I/O.
        let dirty: Vec<Writeback> = ws.iter().filter(|w| !w.clean).cloned().collect();
        let mut written = self.write_pages(&dirty).into_iter();
        let results: Vec<Result<(), Errno>> =
            ws.iter().map(|w| if w.clean { Ok(()) } else { written.next().unwrap_or(Err(Errno::EIO)) }).collect();
        let mut ok_slots = Vec::new();
        for (w, r) in ws.iter().zip(&results) {
            if r.is_ok() {
                if let Some(s) = w.staging {
                    let _ = self.plat.staging(Staging::Drop { slot: s, n: 1 });
                    ok_slots.push(s);
                }
            }
        }
        let mut c = lock(&self.core);
        let mut freed = 0;
        for (w, r) in ws.iter().zip(results) {
            freed += u64::from(r.is_ok());
            c.writeback_done(w, r);
        }
        self.settled.notify_all();
        freed
    }

    /// Writes the data of the shared file pages of `r` to their files (for
    /// msync, munmap, DONTNEED, close). `detached` describes shared file
    /// ranges already removed from the region tree. Returns the first error.
    pub(super) fn writeback_range(&self, r: PageRange, detached: &[FileRange]) -> Result<Vec<u32>, Errno> {
        let mut claimed = {
            let bytes = r.pages() as usize * self.page_size;
            let mut c = self.settled_core_all(self.addr(r.start), bytes, true);
            c.writeback_claim(r, detached)
        };
        let mut files: Vec<u32> = claimed.iter().map(|w| w.file).collect();
        files.sort_unstable();
        files.dedup();
        if !claimed.is_empty() {
            self.hooks.stall_writeback();
        }
        let mut results = self.write_pages(&claimed);
        // Nothing left to write for these (their release is skipped).
        let mut done = vec![false; claimed.len()];
        // A page listed where it was whose copy failed (`EFAULT`: it was not
        // there) was moved meanwhile: parked (`MADV_COLD`, background
        // reclaim: moved to staging), or evicted and perhaps faulted back
        // in since. Where the copy's kernel-mode fault is served it brings
        // the page back; where it is not (in-thread faults), msync said
        // EIO for a page that was only parked, or evicted (written) and
        // back in place (the fuzzer's in-thread pass, the file tests in
        // that mode). So the page is claimed again where it is now and
        // written from there: its slot if parked, in place if back; one
        // evicted is done (its eviction wrote it), one clean is too. A
        // write that failed (the file's error, not `EFAULT`) keeps it.
        for _ in 0..4 {
            let failed: Vec<usize> = (0..claimed.len())
                .filter(|&i| results[i] == Err(Errno::EFAULT) && claimed[i].staging.is_none() && !done[i])
                .collect();
            if failed.is_empty() {
                break;
            }
            for i in failed {
                let p = claimed[i].page;
                // (Once a parking or eviction in flight is done with it.)
                let again = {
                    let mut c = self.settled_core_all(self.addr(p), self.page_size, true);
                    if c.page(p).state.holds_frame() {
                        c.writeback_claim(PageRange::new(p.0, p.0 + 1), detached).pop()
                    } else {
                        None
                    }
                };
                match again {
                    Some(w) => {
                        results[i] = self.write_pages(std::slice::from_ref(&w)).pop().unwrap_or(Err(Errno::EIO));
                        claimed[i] = w;
                    }
                    None => done[i] = true,
                }
            }
        }
        let first = {
            let mut c = lock(&self.core);
            let released: Vec<Result<(), Errno>> = claimed
                .iter()
                .zip(results)
                .zip(&done)
                .filter(|(_, &d)| !d)
                .map(|((w, res), _)| c.writeback_release(w, res))
                .collect();
            released.into_iter().find_map(|r| r.err())
        };
        self.settled.notify_all();
        match first {
            Some(e) => Err(e),
            None => Ok(files),
        }
    }

    /// Forgets the files no region maps any more.
    pub(super) fn release_files(&self) {
        let used = lock(&self.core).files_in_use();
        self.files.retain(&used);
    }
}
