//! Fill mechanics: zero fills, zero-page maps, swap-ins and file reads into the
//! pages of a run, and a parked page moved back.

use super::*;

impl Inner {
    /// Installs zero pages on `run` a piece of `SMALL_FILL_PAGES` at a time,
    /// each piece waking the threads that wait in it; returns how many pages
    /// (a prefix) went in. A fault-around window of 256 pages takes 0.3 ms
    /// to fill (1.5 ms on memory the host must fault in), and the faulting
    /// thread resumes after the first piece instead of after the whole
    /// window. The pages stay `Filling` until the caller commits: the woken
    /// thread may touch them, but every observer (introspection, advice,
    /// reclaim, zap) waits for the commit.
    /// `pooled`: the region may take recycled frames (`pool_fits`).
    pub(super) fn zero_fill_pieces(&self, run: PageRange, pooled: bool) -> u64 {
        let mut done = 0;
        let mut s = run.start.0;
        while s < run.end.0 {
            let piece = PageRange::new(s, (s + SMALL_FILL_PAGES).min(run.end.0));
            let len = piece.pages() as usize * self.page_size;
            let n = if pooled {
                self.plat.fill(Fill::Zero { how: Zero::Pooled, wake: true }, self.addr(piece.start), len)
            } else {
                self.plat.fill(Fill::Zero { how: Zero::Fill, wake: true }, self.addr(piece.start), len)
            }
            .unwrap_or(0);
            done += (n / self.page_size) as u64;
            if n < len {
                break;
            }
            s = piece.end.0;
            if s < run.end.0 {
                // The woken thread may be queued on this CPU: let it run.
                std::thread::yield_now();
            }
        }
        done
    }

    /// Installs zero pages on `run`; returns how many (a prefix) went in.
    pub(super) fn zero_fill(&self, run: PageRange) -> u64 {
        let len = run.pages() as usize * self.page_size;
        let done = self.plat.fill(Fill::Zero { how: Zero::Fill, wake: false }, self.addr(run.start), len).unwrap_or(0);
        (done / self.page_size) as u64
    }

    /// Reads the swap slots `slot..` into the pages of `run`; returns how
    /// many pages (a prefix) were installed.
    /// Maps the zero page on `run` (a read fault). The frame a later write
    /// allocates (the kernel's copy-on-write) is already charged: the page
    /// counts as resident from now on, so the budget stays hard.
    pub(super) fn zero_map(&self, run: PageRange) -> u64 {
        let len = run.pages() as usize * self.page_size;
        match self.plat.fill(Fill::Zero { how: Zero::Map, wake: false }, self.addr(run.start), len) {
            Ok(done) => (done / self.page_size) as u64,
            Err(_) => self.zero_fill(run),
        }
    }

    /// Reads `run` from swap at `slot`, write-protected if `wp` (the pages
    /// keep their swap copies); returns how many pages were installed.
    pub(super) fn swap_in(&self, run: PageRange, slot: u32, wp: bool) -> u64 {
        if !self.plat.caps().has_swap {
            return 0;
        }
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        self.plat
            .fill(Fill::SwapIn { off: self.swap_off(slot), wp }, self.addr(run.start), len)
            .map(|n| (n / ps) as u64)
            .unwrap_or(0)
    }

    /// The read-ahead after a fault's swap-in of `run`
    /// (`Core::swap_ahead_plan`), after the faulting thread was woken: the
    /// `AHEAD_FIRST_PAGES` swapped pages nearest it, which the program
    /// reaches first, read in one batch (`Platform::swap_gather`); the
    /// window's parked pages mapped back with moves; the rest of its
    /// swapped pages in batches of `AHEAD_BATCH_PAGES`, nearest first, each
    /// installed and committed as it completes, so the program goes on
    /// over them meanwhile. A thread that touches a page not yet in waits
    /// for its commit (its fault is `Busy`).
    pub(super) fn swap_ahead(&self, run: PageRange) {
        let mut a = lock(&self.core).swap_ahead_plan(run);
        let parked = std::mem::take(&mut a.parked);
        let (near, mut rest) = a.split_nearest(AHEAD_FIRST_PAGES);
        self.swap_ahead_read(near);
        if !parked.is_empty() {
            let done = self.reactivate_all(parked);
            let mut c = lock(&self.core);
            c.swap_ahead_unparked(&done);
            self.after_fill(&mut c);
        }
        while !rest.pages.is_empty() {
            let (batch, more) = rest.split_nearest(AHEAD_BATCH_PAGES);
            self.swap_ahead_read(batch);
            rest = more;
        }
    }

    /// Reads and installs the pages of `part` of a read-ahead, and commits.
    fn swap_ahead_read(&self, part: usermm_core::SwapAhead) {
        if part.pages.is_empty() {
            return;
        }
        let installed = if self.plat.caps().has_swap {
            let reads: Vec<(u64, usize)> = part.pages.iter().map(|&(p, s)| (self.swap_off(s), self.addr(p))).collect();
            self.plat.swap_gather(&reads, self.page_size, part.keep)
        } else {
            Vec::new()
        };
        let mut c = lock(&self.core);
        c.swap_ahead_done(&part, &installed);
        self.after_fill(&mut c);
    }

    /// Reads file pages into `run` (its first page is file page
    /// `file_page`); returns how many (a prefix) were installed — 0 when the
    /// run starts past the end of the file — and, if a drop of the host's
    /// page-cache copy is still due, the file to drop it from.
    ///
    /// That copy (of a read through the page cache; a single page is read
    /// with `O_DIRECT` where possible and leaves none) is dropped here
    /// unless `defer_drop`, when the caller drops it once the faulting
    /// thread is woken: the drop costs 3 µs for a single page and 0.5 µs a
    /// page in a window, and the thread need not wait for it.
    pub(super) fn file_in(
        &self,
        run: PageRange,
        file: u32,
        file_page: u64,
        defer_drop: bool,
    ) -> Result<(u64, Option<Arc<MappedFile>>), Errno> {
        let f = self.files.get(file).ok_or(Errno::EIO)?;
        let ps = self.page_size;
        let len = run.pages() as usize * ps;
        let off = file_page * ps as u64;
        let (n, cached) = self.plat.file_in(&f, off, self.addr(run.start), len)?;
        if !cached || n == 0 {
            return Ok(((n / ps) as u64, None));
        }
        if !defer_drop {
            f.drop_cache(off, n);
            return Ok(((n / ps) as u64, None));
        }
        Ok(((n / ps) as u64, Some(f)))
    }

    /// Maps the page parked in `slot` back at `page`: moved where it can
    /// be, else copied; copied write-protected if `wp` (it keeps its swap
    /// copy: a move would map it writable). A copied page's frame leaves
    /// its slot now if `release`; otherwise the caller drops the slot
    /// (`Staging::DropList`) before it can be used again.
    pub(super) fn reactivate(&self, page: PageIdx, slot: u32, how: Transfer, wp: bool, release: bool) -> bool {
        let mv = how == Transfer::Move && self.plat.caps().can_move && !wp;
        self.plat.staging(Staging::ToPage { slot, dst: self.addr(page), try_move: mv, wp, release }).is_ok()
    }
}
