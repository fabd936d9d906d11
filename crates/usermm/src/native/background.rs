//! The background thread: reclaim ahead of the program, spare metadata,
//! `MADV_WILLNEED` read-in and file read-ahead chaining.

use super::reclaimer::RECLAIM_BATCH;
use super::serve::{Caller, Next, Retries};
use super::*;

/// What a background reclaim round did.
pub(super) enum Round {
    /// The core wanted no reclaim ahead and no aging.
    Idle,
    Evicted,
    NothingEvicted,
    Aged,
    NothingAged,
}

impl Inner {
    pub(super) fn background_loop(&self, reclaim: bool) {
        // Where a calm stretch began: `Core::calm_mark` then, and when.
        let mut calm: Option<(u64, std::time::Instant)> = None;
        loop {
            let mut unpark = false;
            {
                let mut c = lock(&self.core);
                loop {
                    if self.threads_stop() {
                        return;
                    }
                    if c.spares_low() {
                        drop(c);
                        self.refill_spares();
                        c = lock(&self.core);
                        continue;
                    }
                    if c.swap_holds_any() && self.holds_ask_due() {
                        // (Forked children gone free the swap slots they
                        // held: asked outside the core lock.)
                        drop(c);
                        self.end_gone_holds();
                        c = lock(&self.core);
                        continue;
                    }
                    if matches!(self.plat.store(Store::KeepAliveDue), Ok(true)) {
                        // (No I/O under the core lock.)
                        drop(c);
                        let _ = self.plat.store(Store::KeepAlive);
                        c = lock(&self.core);
                        continue;
                    }
                    // (While the page store is backed off from, no
                    // reclaim ahead: it would only meet pages that wait for
                    // a write. Woken when the next try is due.)
                    let paused = self.store_retry_due(&mut c);
                    let watch = reclaim && !paused && c.unpark_due();
                    if self.calm_over(&mut c, &mut calm, watch) {
                        unpark = true;
                        break;
                    }
                    let need = reclaim && !paused && (self.reclaimer.ahead_want(&mut c) > 0 || c.needs_aging());
                    if need || c.swap_release_pending() || self.reclaimer.queued() {
                        break;
                    }
                    let idle = std::time::Duration::from_millis(if watch { CALM_MS } else { BACKGROUND_IDLE_MS });
                    let wait = if paused { self.backoff.retry_in().map_or(idle, |d| d.min(idle)) } else { idle };
                    // (Resting, under the core lock, as fills poke: a fill
                    // after this pokes again.)
                    c = self.reclaimer.wait(c, wait, true);
                }
            }
            if unpark {
                self.unpark_parked();
                continue;
            }
            self.serve_willneed();
            self.release_swap();
            if !reclaim {
                continue;
            }
            match self.reclaim_ahead_round() {
                Round::Idle | Round::Evicted | Round::Aged => {}
                // Nothing evicted this time (the round only aged pages, or
                // nothing is evictable): give the program a moment to touch
                // what was just deactivated, instead of spinning.
                Round::NothingEvicted => self.pause(std::time::Duration::from_millis(NOTHING_EVICTED_PAUSE_MS)),
                // Nothing could be aged (the active list holds only pages
                // that cannot leave, e.g. writable non-RW ones): wait for
                // the program instead of spinning on a CPU.
                Round::NothingAged => self.pause(std::time::Duration::from_millis(NOTHING_AGED_PAUSE_MS)),
            }
        }
    }

    /// Waits `d` before the next reclaim round, or less when a read-in
    /// (`MADV_WILLNEED`, a stream's read-ahead window) is queued meanwhile:
    /// a stream must not wait for reclaim's pause (a plain 2 ms sleep here
    /// kept the `outofcore` scan's read-ahead waiting 90 ms of every 800).
    fn pause(&self, d: std::time::Duration) {
        let until = std::time::Instant::now() + d;
        let mut c = lock(&self.core);
        // (Under the core lock, as a fill queues a window and then notifies.)
        while !self.reclaimer.queued() && !self.threads_stop() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            c = self.reclaimer.wait(c, left, false);
        }
    }

    /// Gives the store back the space of wholly freed granules of swap
    /// slots (`core/release.rs`), reserved in the core while it deletes
    /// them. A failure keeps the store's copies (overwritten when the
    /// slots are reused, deleted at close).
    pub(super) fn release_swap(&self) {
        // Scrubbed first: a scrubbed slot's granule is then deleted with the
        // others when wholly free (the other order could write a deleted
        // chunk back).
        self.scrub_swap();
        loop {
            let runs = lock(&self.core).swap_release_plan(1024);
            if runs.is_empty() {
                return;
            }
            // (Nothing is lost either way: the slots are free.)
            let _ = self.plat.store(Store::Release { runs: &runs });
            lock(&self.core).swap_release_done(&runs);
        }
    }

    /// Overwrites the stored copies of freed swap slots whose pages came
    /// back into a locked region (`Core::swap_scrub_plan`), reserved in the
    /// core meanwhile. A failure ends the call and keeps the slots for the
    /// next one (a lock call, a populate, the background thread's next
    /// round); the slots are free either way, and one a page takes first is
    /// overwritten by its write.
    pub(super) fn scrub_swap(&self) {
        loop {
            let slots = lock(&self.core).swap_scrub_plan(256);
            if slots.is_empty() {
                return;
            }
            let ok = self.plat.store(Store::Scrub { slots: &slots }).is_ok();
            lock(&self.core).swap_scrub_done(&slots, ok);
            if !ok {
                return;
            }
        }
    }

    /// Serves the queued `MADV_WILLNEED` pages and file read-ahead windows.
    pub(super) fn serve_willneed(&self) {
        let pending = self.reclaimer.take_queued();
        for a in pending {
            let (swapped, file) = {
                let c = lock(&self.core);
                let p = c.page_of(Addr(a as u64));
                (
                    p.is_some_and(|p| c.page(p).state == usermm_core::page::PState::Swapped),
                    p.and_then(|p| c.region_at(p)).is_some_and(|r| r.file().is_some()),
                )
            };
            if swapped {
                self.resolve(a, false, None);
            } else if file {
                // File read-ahead: a window from `a` (up to a hole or the
                // end of the file; best effort, errors ignored), chained to
                // the next while the stream goes on (the core decides both).
                let (here, window) = {
                    let c = lock(&self.core);
                    let Some(here) = c.page_of(Addr(a as u64)) else { continue };
                    (here, c.readahead_window(here) as usize * self.page_size)
                };
                let (n, whole) = self.read_ahead(a, window);
                let next = a + n;
                let chain = if whole {
                    let c = lock(&self.core);
                    c.page_of(Addr(next as u64)).and_then(|q| c.readahead_chains(here, q)).map(|q| self.addr(q))
                } else {
                    None
                };
                if let Some(next) = chain {
                    self.reclaimer.queue([next]);
                }
            }
        }
    }

    /// Reads a stream's read-ahead window `[a, a+len)` in, as a read
    /// populate would, but stops at a page another thread is reading (a
    /// handler's window, `Core::readahead_instead_of_wait`) instead of
    /// waiting for it: the read-in would otherwise sit idle for that whole
    /// window. Returns the bytes read in (up to where it stopped) and
    /// whether the stream goes on from there (all read, or stopped at
    /// another thread's window; not after a failure).
    fn read_ahead(&self, a: usize, len: usize) -> (usize, bool) {
        let mm = self.read_mm();
        let mut retries = Retries::default();
        let mut done = 0;
        while done < len {
            if self.threads_stop() {
                return (done, false);
            }
            let mut c = lock(&self.core);
            let Some(p) = c.page_of(Addr((a + done) as u64)) else { return (done, false) };
            let end = PageIdx(p.0 + ((len - done) / self.page_size) as u64);
            match c.populate_step(p, end, false) {
                // Already read: skipped.
                None => {
                    drop(c);
                    done += self.page_size;
                }
                Some(FaultPlan::Busy) => return (done, true),
                // (Every other plan is served, as a populate's: a plan may
                // have claimed its pages.)
                Some(plan) => match self.serve(c, &plan, a + done, false, Caller::Populate, &mm, &mut retries) {
                    Next::Failed(_) => return (done, false),
                    // (The loop plans the page again: a filled page is
                    // skipped.)
                    Next::Served | Next::Again(_) => {}
                },
            }
        }
        (done, true)
    }

    /// Pressure's end: while parked pages are due to go back (`watch`),
    /// follows the calm stretch in `calm` (the core's calm mark when it
    /// began, and when) and ends pressure once it has lasted `CALM_MS`
    /// (a frame claimed, the budget running out or a refill beginning breaks
    /// it; docs/design.md, "Pressure's end"), or at once after a run of
    /// parked-page touches with no claim (`Core::calm_by_touches`).
    /// Returns whether it ended: the parked pages go back now.
    fn calm_over(&self, c: &mut Core, calm: &mut Option<(u64, std::time::Instant)>, watch: bool) -> bool {
        if !watch {
            *calm = None;
            return false;
        }
        let mark = c.calm_mark();
        if c.calm_by_touches() && self.reclaimer.ease_if_calm(c, mark) {
            // (A run of parked-page touches with no claim: no need to
            // wait for a calm stretch.)
            *calm = None;
            return true;
        }
        match *calm {
            Some((m, since)) if m == mark => {
                let ended = since.elapsed() >= std::time::Duration::from_millis(CALM_MS)
                    && self.reclaimer.ease_if_calm(c, mark);
                if ended {
                    *calm = None;
                }
                ended
            }
            _ => {
                *calm = Some((mark, std::time::Instant::now()));
                false
            }
        }
    }

    /// Maps the parked pages back once pressure is over
    /// (`Core::unpark_plan`): moves, a batch per core-lock round, until
    /// none is left or the budget runs out again. The shared region lock is
    /// held a batch at a time: a `munmap` waiting for it waits for one batch,
    /// not the whole list.
    pub(super) fn unpark_parked(&self) {
        loop {
            if self.threads_stop() {
                return;
            }
            let _mm = self.read_mm();
            let plans = lock(&self.core).unpark_plan(UNPARK_BATCH);
            if plans.is_empty() {
                return;
            }
            let done = self.reactivate_all(plans);
            let mut c = lock(&self.core);
            c.unpark_done(&done);
            self.settled.notify_all();
        }
    }

    /// One background reclaim round when the core wants reclaim ahead or
    /// aging.
    pub(super) fn reclaim_ahead_round(&self) -> Round {
        let mm = self.read_mm();
        let (want, aging) = {
            let mut c = lock(&self.core);
            let want = self.reclaimer.ahead_want(&mut c);
            (want, c.needs_aging())
        };
        if want > 0 {
            let freed = self.reclaim_rounds(&mm, want.min(RECLAIM_BATCH), false);
            if freed > 0 {
                Round::Evicted
            } else {
                Round::NothingEvicted
            }
        } else if aging {
            let before = lock(&self.core).stats().counters.deactivations;
            self.reclaim_rounds(&mm, 0, false);
            if lock(&self.core).stats().counters.deactivations != before {
                Round::Aged
            } else {
                Round::NothingAged
            }
        } else {
            Round::Idle
        }
    }

    /// The background thread's work once, without waiting: spare metadata,
    /// `MADV_WILLNEED`, and a reclaim round if the core wants one (the
    /// simulation's background step).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn background_step(&self) {
        if lock(&self.core).spares_low() {
            self.refill_spares();
        }
        // Pressure's end, as the thread sees it: the same calm mark as at
        // the last step (the simulation's steps stand for the calm stretch).
        let eased = {
            let mut c = lock(&self.core);
            let mark = c.calm_mark();
            let last = self.reclaimer.last_calm_mark(mark);
            c.unpark_due() && (last == Some(mark) || c.calm_by_touches()) && self.reclaimer.ease_if_calm(&mut c, mark)
        };
        if eased {
            self.unpark_parked();
        }
        self.serve_willneed();
        self.release_swap();
        let need = {
            let mut c = lock(&self.core);
            self.reclaimer.ahead_want(&mut c) > 0 || c.needs_aging()
        };
        if need {
            self.reclaim_ahead_round();
        }
    }
}
