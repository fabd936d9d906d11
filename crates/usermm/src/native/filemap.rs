//! File windows from the page cache: a fault in a read-only shared file
//! region that is locked or read sequentially (`MADV_SEQUENTIAL`) maps the
//! file's own page-cache pages in place (`Platform::file_map`) instead of
//! copying them into fresh frames, and they are made usermm's copies again
//! the moment the region stops being read-only or locked
//! (`unmap_file_windows`). See docs/design.md, "File windows from the page
//! cache".
//!
//! Why only there: such a page is never written, and leaves memory only
//! by a drop (a locked page never; a stream's clean pages dropped behind
//! it, `Inner::drop_all`, with their page-cache pages) or by a copy to
//! staging (`MADV_COLD`, aging after the advice changed), both of which
//! replace the window: nothing of usermm's page life cycle needs it to be
//! an anonymous frame, and the core keeps it as a resident page like any
//! other. Every zap replaces a window by an empty anonymous mapping
//! (`Native::zap`).

use super::serve::{Caller, Next};
use super::*;

impl Inner {
    /// Whether a file read of `run` may map the page cache — the space maps
    /// windows, the region is a shared file region, read-only, and locked
    /// or read sequentially (`MADV_SEQUENTIAL`), and no read error is to be
    /// injected (a test hook the copy takes) — and if so, whether the
    /// window is locked.
    pub(super) fn file_window(&self, c: &Core, run: PageRange) -> Option<bool> {
        if !self.files.maps_windows() || self.plat.reads_pending() {
            return None;
        }
        let r = c.region_at(run.start)?;
        let locked = r.lock() != LockMode::None;
        (r.kind() == Kind::FileShared
            && r.prot() & PROT_MASK == PROT_READ
            && (locked || r.advice() == usermm_core::region::Advice::Sequential))
            .then_some(locked)
    }

    /// Serves a file read of `run` by mapping the page cache's pages
    /// there; `None` when the host would not (the caller copies instead).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_file_map(
        &self,
        plan: &FaultPlan,
        run: PageRange,
        file: u32,
        file_page: u64,
        page_addr: usize,
        caller: Caller,
        locked: bool,
    ) -> Option<Next<'_>> {
        let f = self.files.get(file)?;
        let (a, len) = (self.addr(run.start), run.pages() as usize * self.page_size);
        let off = file_page * self.page_size as u64;
        self.plat.window(Window::Map { file: &f, off, dst: a, len, locked }).ok()?;
        // The wake-up under the core lock, before the commit, as a small
        // copy's is (the woken thread finds the pages committed whatever it
        // calls), and handed to the spinning wake-ahead thread, on the
        // faulting thread's CPU (`hand_off_wake`): done here, it cost the
        // handler 12 µs a window, against the 9 µs of the mapping itself.
        let c = lock(&self.core);
        let handed = if self.delegates_wake(caller) {
            self.hand_off_wake(a, len)
        } else {
            if caller.waits() {
                let _ = self.plat.range(Range::Wake, a, len);
            }
            None
        };
        if caller.waits() && (page_addr < a || page_addr >= a + len) {
            let _ = self.plat.range(Range::Wake, page_addr, self.page_size);
        }
        let r = self.commit_small(c, plan, run, len, page_addr, caller);
        self.settle_wake(handed, a, len);
        Some(r)
    }

    /// Makes the page-cache windows in `r` usermm's own copies again (with
    /// the same bytes, still resident): before `r` stops being locked or
    /// read-only. A window that cannot be copied is dropped (its pages are
    /// the file's, unwritten): the core then reads them again on the next
    /// touch. The caller holds the region lock exclusively.
    pub(super) fn unmap_file_windows(&self, r: PageRange) {
        let ps = self.page_size;
        // (Most spaces have no window: an atomic load, no region walk.)
        if !self.files.maps_windows()
            || self.plat.runs(Runs::FileWindows, self.addr(r.start), r.pages() as usize * ps).is_empty()
        {
            return;
        }
        let regions = lock(&self.core).regions().overlapping(r);
        for g in regions {
            let seg = g.range().intersect(&r);
            let Some(file) = g.file() else { continue };
            let f = self.files.get(file);
            for (s, t) in self.plat.runs(Runs::FileWindows, self.addr(seg.start), seg.pages() as usize * ps) {
                let p = PageIdx(g.range().start.0 + ((s - self.addr(g.range().start)) / ps) as u64);
                let off = g.file_page(p) * ps as u64;
                let copied = f.as_ref().is_some_and(|f| {
                    self.plat.window(Window::Unmap { file: f, off, a: s, l: t - s, prot: g.prot() & PROT_MASK }).is_ok()
                });
                if !copied {
                    self.zap_range(PageRange::new(p.0, p.0 + ((t - s) / ps) as u64));
                } else if g.lock() != LockMode::None {
                    // (Still locked, made writable: the fresh mapping is
                    // locked in the host as the region's others are.)
                    let _ = self.plat.range(Range::Lock(true), s, t - s);
                }
            }
        }
    }
}
