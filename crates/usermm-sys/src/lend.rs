//! Lending part of an install to a helper thread: a thread that copies a
//! run into the reservation offers its second half to a thread spinning on
//! another CPU and copies the first half meanwhile; it then waits for the
//! helper's half, or takes the half back and copies it itself if no helper
//! claimed it.
//!
//! The only job ever offered is a part of a bounce buffer's install
//! ([`crate::arena::Arena::install_bounce_split`]), which keeps the buffer
//! borrowed until `Lender::lend` returns, and `lend` returns (or unwinds)
//! only once the job is settled: taken back unstarted, or done by the
//! helper. So a helper's copy never reads a buffer that is gone or reused.
//!
//! A helper that claimed a job and then lost its CPU (it is a `SCHED_IDLE`
//! thread in usermm) is waited for by spinning `SPIN_NS`, then with a futex:
//! the lender's CPU goes idle, where the helper can be moved to run.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};

use crate::now_ns;

/// No job; the lender may offer one.
const IDLE: u32 = 0;
/// A lender fills the job in, or does it itself.
const BUSY: u32 = 1;
/// A job waits for a helper.
const OFFERED: u32 = 2;
/// A helper does the job.
const CLAIMED: u32 = 3;
/// A helper does the job and the lender sleeps on `state` (futex).
const WAITED: u32 = 4;
/// The helper is done; `res` holds its result.
const DONE: u32 = 5;

/// How long a lender spins for a claimed job before it sleeps.
const SPIN_NS: u64 = 100_000;

/// A lent job: three words (for an install: destination, source, length).
pub(crate) type Job = [usize; 3];

/// One job's mailbox between lenders and a helper.
#[derive(Default)]
pub struct Lender {
    state: AtomicU32,
    job: [AtomicUsize; 3],
    res: AtomicI64,
}

impl Lender {
    /// Offers `job` to a helper, runs `own` meanwhile, then settles the job:
    /// its result from the helper, or `work(job)` here if no helper claimed
    /// it. Several lenders at once: the others do their job themselves.
    pub(crate) fn lend<R>(&self, job: Job, own: impl FnOnce() -> R, work: impl FnOnce(Job) -> i64) -> (R, i64) {
        if self.state.compare_exchange(IDLE, BUSY, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            let r = own();
            return (r, work(job));
        }
        for (w, v) in self.job.iter().zip(job) {
            w.store(v, Ordering::SeqCst);
        }
        self.state.store(OFFERED, Ordering::SeqCst);
        let settle = Settle(self);
        let r = own();
        let t = if self.state.compare_exchange(OFFERED, BUSY, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            work(job)
        } else {
            self.wait_done();
            self.res.load(Ordering::SeqCst)
        };
        drop(settle);
        (r, t)
    }

    /// Waits until a claimed job is done.
    fn wait_done(&self) {
        let t0 = now_ns();
        loop {
            match self.state.load(Ordering::SeqCst) {
                DONE => return,
                CLAIMED if now_ns() - t0 > SPIN_NS => {
                    if self.state.compare_exchange(CLAIMED, WAITED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                        crate::thread::futex_wait(&self.state, WAITED);
                    }
                }
                WAITED => crate::thread::futex_wait(&self.state, WAITED),
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// Whether a job waits for a helper (a cheap check before `help`).
    pub fn offered(&self) -> bool {
        self.state.load(Ordering::Relaxed) == OFFERED
    }

    /// The helper's side: claims an offered job, if any, and does it with
    /// `work`. Returns whether it did one.
    pub(crate) fn help(&self, work: impl FnOnce(Job) -> i64) -> bool {
        if !self.offered() || self.state.compare_exchange(OFFERED, CLAIMED, Ordering::SeqCst, Ordering::SeqCst).is_err()
        {
            return false;
        }
        let job = [0, 1, 2].map(|i| self.job[i].load(Ordering::SeqCst));
        self.res.store(work(job), Ordering::SeqCst);
        if self.state.swap(DONE, Ordering::SeqCst) == WAITED {
            crate::thread::futex_wake(&self.state);
        }
        true
    }
}

/// Frees the mailbox when the lender is done, and first waits for a
/// claimed job (also when `own` unwinds).
struct Settle<'a>(&'a Lender);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        let l = self.0;
        if l.state.compare_exchange(OFFERED, BUSY, Ordering::SeqCst, Ordering::SeqCst).is_err()
            && l.state.load(Ordering::SeqCst) != BUSY
        {
            l.wait_done();
        }
        l.state.store(IDLE, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_job_with_no_helper_is_done_by_the_lender() {
        let l = Lender::default();
        let (r, t) = l.lend([1, 2, 3], || 7, |j| (j[0] + j[1] + j[2]) as i64);
        assert_eq!((r, t), (7, 6));
        assert!(!l.offered(), "the mailbox is free again");
        assert!(!l.help(|_| panic!("no job")));
    }

    #[test]
    fn a_claimed_job_is_done_once_by_the_helper_and_waited_for() {
        let l = Arc::new(Lender::default());
        let stop = Arc::new(AtomicBool::new(false));
        let helped = Arc::new(AtomicUsize::new(0));
        let h = {
            let (l, stop, helped) = (l.clone(), stop.clone(), helped.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if l.help(|j| {
                        // A slow helper: the lender spins, then sleeps.
                        std::thread::sleep(std::time::Duration::from_micros(j[0] as u64));
                        j[1] as i64
                    }) {
                        helped.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let (mut by_helper, mut by_lender) = (0, 0);
        for i in 0..400usize {
            let slow = if i % 50 == 0 { 300 } else { 0 };
            let mine = AtomicBool::new(false);
            let (r, t) = l.lend(
                [slow, i, 0],
                || {
                    // Give the helper a moment to claim it.
                    let t0 = now_ns();
                    while now_ns() - t0 < 20_000 {
                        std::hint::spin_loop();
                    }
                    i * 2
                },
                |j| {
                    mine.store(true, Ordering::SeqCst);
                    j[1] as i64
                },
            );
            assert_eq!((r, t), (i * 2, i as i64), "the job's result, whoever did it");
            if mine.load(Ordering::SeqCst) {
                by_lender += 1;
            } else {
                by_helper += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap();
        assert_eq!(helped.load(Ordering::SeqCst), by_helper, "every job done exactly once");
        assert!(by_helper > 0, "the helper took some jobs ({by_lender} taken back)");
    }
}
