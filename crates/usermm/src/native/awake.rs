//! Wake-ahead: a `SCHED_IDLE` thread that keeps an idle CPU busy while a
//! fault is being served, so that the faulting thread, woken when its page
//! is in, finds its CPU running instead of halted.
//!
//! A thread that faults blocks in the kernel until a handler thread installs
//! its page; its CPU then has nothing to run and goes idle. On a virtual
//! machine an idle vCPU halts, and waking the faulting thread means waking
//! that vCPU through the hypervisor: measured on this 2-vCPU VM, 15–20 µs
//! per fault on top of the fill itself (`usermm bench lockonfault`, handler
//! thread: 45.8 µs a 16-page window with the CPUs left idle, 27.4 µs with
//! two `SCHED_IDLE` busy loops keeping them awake; the kernel's own fault
//! and in-thread faults never leave their CPU).
//!
//! So the handler, as it reads fault messages, tells the wake-ahead thread
//! (`begin`): if it sleeps, a futex wake starts it — on the idle CPU, i.e. the
//! faulting thread's, and in parallel with the fill, so the vCPU is up by the
//! time the page is in. It spins there until every fault read is served
//! (`end`), yielding nothing to do, then sleeps. At `SCHED_IDLE` it never takes
//! a CPU from a thread that has work: the woken faulting thread preempts it at
//! once. It spins at most `WAKE_AHEAD_MAX_SPIN_NS` per wake-up. Off with
//! `UMM_F_NO_WAKE_AHEAD` and on one CPU.
//!
//! While it spins it also does wake-ups handed to it (`post`): a handler
//! installs a page without waking and posts the wake-up; this thread, on
//! the faulting thread's CPU, does it there without an inter-processor
//! interrupt (a `UFFDIO_COPY`'s wake-up of a thread on another vCPU cost the
//! handler 4 µs of `perf` samples a lock-on-fault window), while the handler
//! goes on (the rest of the window, the commit). The handler takes back a
//! post not taken by the time it is done (`unpost`) and wakes itself: a
//! wake-up is never left undone.
//!
//! With in-thread faults no thread waits for a handler, but the faulting
//! thread copies its whole lock-on-fault window itself, and its fresh
//! frames are most of the cost: while it spins, this thread installs the
//! second half of the window (`help`, `Platform::file_install_split`) as
//! the faulting thread installs the first, on the other CPU.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use usermm_sys::now_ns;

use super::tuning::{WAKE_AHEAD_BRIEF_SPIN_NS, WAKE_AHEAD_GRACE_NS, WAKE_AHEAD_MAX_SPIN_NS, WAKE_AHEAD_SLEEP_MS};

#[derive(Default)]
pub(crate) struct WakeAhead {
    /// Faults read by handlers and not yet served.
    inflight: AtomicU32,
    /// Of those, the brief ones (`guard_brief`).
    brief: AtomicU32,
    /// Faults served so far (`end`): the spinner's sign of progress.
    served: AtomicU64,
    /// Threads that sleep (or are about to), counted under `lock`.
    sleepers: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
    /// Whether a wake-ahead thread runs at all.
    enabled: AtomicBool,
    /// Whether it spins now (and so takes posted wake-ups).
    spinning: AtomicBool,
    /// A wake-up handed to it (`post`): the address of a run and its
    /// pages in the low bits; 0 when none.
    mail: AtomicU64,
    /// The CPU of the handler that last began serving faults, plus one
    /// (0: not known, or not tracked).
    handler_cpu: AtomicU32,
    track_cpu: AtomicBool,
}

impl WakeAhead {
    /// Its lock, held across a fork (a leaf: `native/fork.rs`).
    pub(crate) fn fork_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// Makes `begin` note the handler's CPU, where the thread then yields
    /// at every turn instead of spinning (`spin`). (Off in the unit tests
    /// below, whose "handler" is the test's thread and may share a CPU with
    /// the spinner.)
    pub(crate) fn track_handler_cpu(&self) {
        self.track_cpu.store(true, Ordering::Relaxed);
    }

    /// A handler read `n` faults: the thread spins until they are served.
    pub(crate) fn begin(&self, n: u32) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        self.inflight.fetch_add(n, Ordering::SeqCst);
        if self.track_cpu.load(Ordering::Relaxed) {
            self.handler_cpu.store(usermm_sys::thread::current_cpu().map_or(0, |c| c + 1), Ordering::Relaxed);
        }
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    /// The `n` faults of a `begin` are served.
    pub(crate) fn end(&self, n: u32) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        self.inflight.fetch_sub(n, Ordering::SeqCst);
        self.served.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// `begin(1)` now and `end(1)` when the guard drops, if `waiting` (a
    /// thread waits for this fill), else nothing.
    pub(crate) fn guard(&self, waiting: bool) -> Guard<'_> {
        self.guard_of(waiting, false)
    }

    /// [`WakeAhead::guard`] for a fill that takes microseconds (a small
    /// zero fill): while only such fills are in flight, the thread spins
    /// at most [`WAKE_AHEAD_BRIEF_SPIN_NS`] without one being served.
    pub(crate) fn guard_brief(&self, waiting: bool) -> Guard<'_> {
        self.guard_of(waiting, true)
    }

    fn guard_of(&self, waiting: bool, brief: bool) -> Guard<'_> {
        let on = waiting && self.enabled.load(Ordering::Relaxed);
        if on {
            self.begin(1);
            // (Counted after `inflight`, and uncounted before it: never
            // more brief fills than fills, so a long fill is never taken
            // for a brief one.)
            if brief {
                self.brief.fetch_add(1, Ordering::SeqCst);
            }
        }
        Guard { wa: self, on, brief: on && brief }
    }

    /// Whether the thread spins now: a wake-up posted now is likely to be
    /// done at once (`post`).
    pub(crate) fn spinning(&self) -> bool {
        self.spinning.load(Ordering::SeqCst)
    }

    /// Hands the wake-up of the `pages` pages at `addr` (page-aligned;
    /// fewer pages than a page has bytes) to the spinning thread, which
    /// runs on the idle CPU the faulting thread left, so the wake-up needs
    /// no inter-processor interrupt and the handler goes on meanwhile.
    /// `None` when it was not taken (the thread does not spin, or holds
    /// another): the caller wakes. Otherwise the caller must
    /// [`WakeAhead::unpost`] it before it is done with the run.
    pub(crate) fn post(&self, addr: usize, pages: usize) -> Option<u64> {
        let m = addr as u64 | pages as u64;
        // (Pages are at least 4 KiB, so an aligned address leaves 12 bits.)
        debug_assert!(pages > 0 && pages < 4096 && addr.is_multiple_of(4096));
        if !self.spinning.load(Ordering::SeqCst) {
            return None;
        }
        self.mail.compare_exchange(0, m, Ordering::SeqCst, Ordering::SeqCst).ok().map(|_| m)
    }

    /// Takes back a posted wake-up the thread has not taken: true when it
    /// had not, and the caller must wake itself.
    pub(crate) fn unpost(&self, m: u64) -> bool {
        self.mail.compare_exchange(m, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Does a posted wake-up, if any.
    fn deliver(&self, page_mask: u64, wake: &dyn Fn(usize, usize)) {
        let m = self.mail.swap(0, Ordering::SeqCst);
        if m != 0 {
            wake((m & !page_mask) as usize, (m & page_mask) as usize);
        }
    }

    /// Wakes the thread (the space closes, or its threads are started
    /// again), to look at its `stop` again.
    pub(crate) fn shut(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }

    /// The thread's loop, until `stop()`; `wake(addr, pages)` does a
    /// posted wake-up (`post`), `page_size` the address's alignment; `help`
    /// does a half of an install lent to it while it spins
    /// (`Platform::file_install_split`).
    pub(crate) fn run(
        &self,
        stop: &dyn Fn() -> bool,
        page_size: usize,
        wake: &dyn Fn(usize, usize),
        help: &dyn Fn() -> bool,
    ) {
        let page_mask = page_size as u64 - 1;
        while !stop() {
            let mut capped = false;
            if self.inflight.load(Ordering::SeqCst) > 0 {
                self.spinning.store(true, Ordering::SeqCst);
                capped = self.spin(page_mask, wake, help);
                self.spinning.store(false, Ordering::SeqCst);
                // (A post that saw it spinning may have landed since.)
                self.deliver(page_mask, wake);
            }
            let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            // (A `begin` that saw no sleeper has bumped `inflight`
            // before this load; one that sees one notifies under the lock,
            // which this thread holds until it waits. A spin that hit
            // its cap waits for the next `begin`.)
            if (capped || self.inflight.load(Ordering::SeqCst) == 0) && !stop() {
                let _ = self.cv.wait_timeout(g, std::time::Duration::from_millis(WAKE_AHEAD_SLEEP_MS));
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// One spell of spinning while faults are in flight, doing posted wake-ups
    /// and lent installs; returns whether it stopped at a cap
    /// (`WAKE_AHEAD_MAX_SPIN_NS`, or `WAKE_AHEAD_BRIEF_SPIN_NS` of brief fills
    /// with none served) rather than after `WAKE_AHEAD_GRACE_NS` with nothing
    /// in flight.
    fn spin(&self, page_mask: u64, wake: &dyn Fn(usize, usize), help: &dyn Fn() -> bool) -> bool {
        let until = now_ns() + WAKE_AHEAD_MAX_SPIN_NS;
        let mut idle_since = 0;
        // Since when faults have been in flight with none served (0: none
        // in flight at the last look).
        let mut busy_since = 0;
        let mut served = self.served.load(Ordering::Relaxed);
        loop {
            let t = now_ns();
            if t >= until {
                return true;
            }
            // Only brief fills in flight, and for longer than one takes:
            // the handler serving them is most likely queued behind this
            // thread on its CPU (the thread it woke preempted it there,
            // then faulted again and slept), and a `SCHED_IDLE` thread
            // keeps a CPU from a queued thread until the scheduler's tick.
            // Stop, so that it runs (docs/design.md, "Wake-ahead").
            let inflight = self.inflight.load(Ordering::Relaxed);
            let now_served = self.served.load(Ordering::Relaxed);
            if inflight == 0 {
                busy_since = 0;
            } else if busy_since == 0 || now_served != served {
                busy_since = t;
                served = now_served;
            } else if t - busy_since >= WAKE_AHEAD_BRIEF_SPIN_NS && self.brief.load(Ordering::Relaxed) >= inflight {
                return true;
            }
            if self.mail.load(Ordering::Relaxed) != 0 {
                self.deliver(page_mask, wake);
            }
            // On the handler's CPU: this thread runs there only because
            // the handler yielded it (polling for its read), and a
            // `SCHED_IDLE` thread that spins on keeps the CPU from the
            // runnable handler until the scheduler's tick: the faulting
            // thread waited 2 ms (the spin's cap) for its page, a fault in
            // three of a walk while the background thread read ahead on
            // the other CPU. Yield back at once.
            let handler_cpu = self.handler_cpu.load(Ordering::Relaxed);
            if inflight > 0 && handler_cpu != 0 && usermm_sys::thread::current_cpu().map(|c| c + 1) == Some(handler_cpu)
            {
                std::thread::yield_now();
                continue;
            }
            help();
            if self.inflight.load(Ordering::Relaxed) > 0 {
                idle_since = 0;
            } else if idle_since == 0 {
                idle_since = t;
            } else if t - idle_since >= WAKE_AHEAD_GRACE_NS {
                return false;
            }
            // (No `sched_yield` here: with one per turn the lock-on-fault
            // row measured 1.24-1.44 s against 1.06-1.30 s without, three
            // interleaved pairs.) The mail is looked at between every two
            // `pause`s: a handler takes a post back about 1 µs after it is
            // made (`unpost`), and 64 `pause`s take longer than that here
            // (a third of the posts of a lock-on-fault loop were taken
            // back, each a 16 µs cross-CPU wake-up instead: 16.3-16.6 µs a
            // window against 10.5-10.8 µs looking at every turn).
            for _ in 0..64 {
                if self.mail.load(Ordering::Relaxed) != 0 {
                    break;
                }
                std::hint::spin_loop();
            }
        }
    }
}

/// An I/O fill a thread waits for (`WakeAhead::guard`).
pub(crate) struct Guard<'a> {
    wa: &'a WakeAhead,
    on: bool,
    brief: bool,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.brief {
            self.wa.brief.fetch_sub(1, Ordering::SeqCst);
        }
        if self.on {
            self.wa.end(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Waits up to 5 s for `cond`.
    fn until(what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(5), "timed out waiting for: {what}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    type Woken = Arc<Mutex<Vec<(usize, usize)>>>;

    /// An enabled `WakeAhead` and its thread, and the wake-ups it did.
    fn start() -> (Arc<WakeAhead>, Arc<AtomicBool>, std::thread::JoinHandle<()>, Woken) {
        let wa = Arc::new(WakeAhead::default());
        wa.enable();
        let stop = Arc::new(AtomicBool::new(false));
        let woken = Woken::default();
        let t = {
            let (wa, stop, woken) = (wa.clone(), stop.clone(), woken.clone());
            std::thread::spawn(move || {
                wa.run(&|| stop.load(Ordering::SeqCst), 4096, &|a, n| woken.lock().unwrap().push((a, n)), &|| false)
            })
        };
        (wa, stop, t, woken)
    }

    /// Ends the thread of `start` (it must end).
    fn finish(wa: &WakeAhead, stop: &AtomicBool, t: std::thread::JoinHandle<()>) {
        stop.store(true, Ordering::SeqCst);
        wa.shut();
        t.join().unwrap();
    }

    /// A `begin` reaches a sleeping thread (no lost wake-up, however the two
    /// interleave), which spins while the fault is in flight and sleeps
    /// again after the grace period; shutdown ends it.
    #[test]
    fn begin_wakes_the_sleeping_thread_and_end_lets_it_sleep() {
        let (wa, stop, t, _) = start();
        for round in 0..200 {
            until("the thread sleeps", || wa.sleepers.load(Ordering::SeqCst) == 1);
            // Most rounds right as it goes to sleep, some while it waits.
            if round % 10 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let g = wa.guard(true);
            until("the thread wakes for a fault in flight", || wa.sleepers.load(Ordering::SeqCst) == 0);
            drop(g);
            assert_eq!(wa.inflight.load(Ordering::SeqCst), 0);
        }
        // A guard of a fill nobody waits for changes nothing.
        until("the thread sleeps", || wa.sleepers.load(Ordering::SeqCst) == 1);
        drop(wa.guard(false));
        assert_eq!(wa.inflight.load(Ordering::SeqCst), 0);
        finish(&wa, &stop, t);
    }

    /// A fault that stays in flight longer than `WAKE_AHEAD_MAX_SPIN_NS` does
    /// not keep the thread spinning: it sleeps until the next `begin`.
    #[test]
    fn a_long_fault_stops_the_spin_at_its_cap() {
        let (wa, stop, t, _) = start();
        until("the thread sleeps", || wa.sleepers.load(Ordering::SeqCst) == 1);
        let g = wa.guard(true);
        until("the thread wakes", || wa.sleepers.load(Ordering::SeqCst) == 0);
        until("the thread gives up spinning at its cap", || wa.sleepers.load(Ordering::SeqCst) == 1);
        drop(g);
        finish(&wa, &stop, t);
    }

    /// A brief fill held past `WAKE_AHEAD_BRIEF_SPIN_NS` (its handler queued
    /// behind the spinner) stops the spin long before the cap; a fill that
    /// reads does not; nor does a brief one beside it.
    #[test]
    fn a_brief_fill_held_too_long_stops_the_spin_early() {
        let (wa, stop, t, _) = start();
        // How long the thread spins for a brief fill held 5 ms (watched
        // without sleeping: the spin is short). The shortest of up to 20
        // tries, so that preemptions of either thread on a loaded machine
        // (load average 5-8 made three tries too few) do not count.
        let mut shortest = Duration::MAX;
        for _ in 0..20 {
            if shortest < Duration::from_nanos(WAKE_AHEAD_MAX_SPIN_NS / 2) {
                break;
            }
            until("the thread sleeps", || wa.sleepers.load(Ordering::SeqCst) == 1);
            let g = wa.guard_brief(true);
            let t0 = Instant::now();
            // (This thread may be off its CPU for the whole brief spin —
            // 0.2 ms — and never see it: such a try counts for nothing.)
            while !wa.spinning() && t0.elapsed() < Duration::from_secs(1) {
                std::hint::spin_loop();
            }
            if !wa.spinning() {
                std::thread::sleep(Duration::from_millis(5).saturating_sub(t0.elapsed()));
                drop(g);
                continue;
            }
            let t1 = Instant::now();
            while wa.spinning() {
                assert!(t1.elapsed() < Duration::from_secs(5), "the thread never stopped");
                std::hint::spin_loop();
            }
            shortest = shortest.min(t1.elapsed());
            std::thread::sleep(Duration::from_millis(5).saturating_sub(t0.elapsed()));
            drop(g);
        }
        // 0.2 ms, well before the 2 ms cap (MAX: no try saw the thread spin).
        assert!(shortest < Duration::from_nanos(WAKE_AHEAD_MAX_SPIN_NS / 2), "spun {shortest:?}");
        assert_eq!(wa.brief.load(Ordering::SeqCst), 0);
        // (Timed from before the guards: the spinner's cap runs from its
        // wake-up, which is later, so no look below comes after the cap
        // however long this thread is off its CPU before it looks.)
        let t0 = Instant::now();
        let long = wa.guard(true);
        let brief = wa.guard_brief(true);
        until("the thread wakes for the read", || wa.sleepers.load(Ordering::SeqCst) == 0);
        while t0.elapsed() < Duration::from_nanos(WAKE_AHEAD_BRIEF_SPIN_NS * 4) {
            let asleep = wa.sleepers.load(Ordering::SeqCst) != 0;
            // (A look after the 2 ms cap proves nothing: this thread was
            // off its CPU that long, and the spinner may have stopped at
            // the cap, as it should.)
            if t0.elapsed() >= Duration::from_nanos(WAKE_AHEAD_MAX_SPIN_NS * 9 / 10) {
                break;
            }
            assert!(!asleep, "a fill that reads is in flight: the thread spins on");
            std::thread::sleep(Duration::from_micros(100));
        }
        drop(brief);
        drop(long);
        finish(&wa, &stop, t);
    }

    /// Every posted wake-up is done exactly once: by the spinning thread, or
    /// by the poster when it takes it back (`unpost`) — whatever the
    /// timing, including posts that race with the thread's stop of its
    /// spin; a post while it sleeps is refused.
    #[test]
    fn a_posted_wake_up_is_done_once_by_the_thread_or_taken_back() {
        let (wa, stop, t, woken) = start();
        until("the thread sleeps", || wa.sleepers.load(Ordering::SeqCst) == 1);
        assert_eq!(wa.post(0x10000, 16), None, "no post while the thread sleeps");
        let (mut by_thread, mut by_poster) = (0, 0);
        for round in 0..2000usize {
            let addr = (round + 1) << 16;
            let g = wa.guard(true);
            if round % 3 == 0 {
                until("the thread spins", || wa.spinning());
            }
            let post = wa.post(addr, 1 + round % 16);
            if round % 7 == 0 {
                // Some runs end (and the spin with them, after its grace)
                // before the poster comes back.
                drop(g);
                std::thread::sleep(Duration::from_micros(50 * (round % 5) as u64));
            } else {
                for _ in 0..round % 500 {
                    std::hint::spin_loop();
                }
                drop(g);
            }
            match post {
                None => {}
                Some(m) if wa.unpost(m) => by_poster += 1,
                Some(_) => {
                    until("the thread does the wake-up", || {
                        woken.lock().unwrap().last() == Some(&(addr, 1 + round % 16))
                    });
                    by_thread += 1;
                }
            }
        }
        let w = woken.lock().unwrap().clone();
        assert_eq!(w.len(), by_thread, "each of the thread's wake-ups once, none of those taken back");
        let mut seen = std::collections::HashSet::new();
        assert!(w.iter().all(|x| seen.insert(*x)), "no wake-up twice");
        assert!(by_thread > 100, "the spinning thread took posts ({by_thread} of 2000; {by_poster} taken back)");
        finish(&wa, &stop, t);
    }
}
