//! How a small fill's pages go in and who wakes the faulting thread: the
//! head first, a split install shared with the wake-ahead thread, a
//! wake-up handed to it (docs/design.md, "Head first, and the wake-up
//! handed to the wake-ahead thread").

use super::serve::Caller;
use super::*;

/// Whether no thread can write to `run`'s region (see `Inner::may_split`).
fn read_only(c: &Core, run: PageRange) -> bool {
    c.region_at(run.start).is_some_and(|r| r.prot() & PROT_WRITE == 0)
}

impl Inner {
    /// Installs the first `len` bytes of a small file read for `run` (the
    /// core lock held), waking the waiters: the part through the faulting
    /// page first, then the rest. The faulting thread runs again while the
    /// rest is copied, on another CPU (what it waits for is the head's
    /// copy, not the run's). The head's wake-up is handed to the
    /// wake-ahead thread when it spins (`hand_off_wake`): it runs on the
    /// faulting thread's CPU, where the wake-up needs no inter-processor
    /// interrupt, while the handler copies the rest. `lockonfault`'s
    /// usermm row, two interleaved triples: 1.26/1.40 s as one copy,
    /// 1.21/1.27 s head first, 1.06/1.11 s head first with the wake-up
    /// handed off (the kernel's MLOCK_ONFAULT: 0.28–0.31 s). Returns the
    /// bytes installed (a prefix). (At once when no thread waits: a
    /// populate, an in-thread fault.)
    pub(super) fn install_head_first(&self, run: PageRange, len: usize, page_addr: usize, caller: Caller) -> usize {
        let (a, ps) = (self.addr(run.start), self.page_size);
        let waits = caller.waits() && !caller.in_thread() && page_addr >= a && page_addr < a + len;
        let head = if waits { page_addr - a + ps } else { len };
        if head == len {
            return self.plat.fill(Fill::FileRead { from: 0, wake: true }, a, len).unwrap_or(0);
        }
        let delegate = self.delegates_wake(caller);
        let n = self.plat.fill(Fill::FileRead { from: 0, wake: !delegate }, a, head).unwrap_or(0);
        if n < head {
            // (The commit wakes the whole run.)
            return n;
        }
        let handed = if delegate { self.hand_off_wake(a, head) } else { None };
        let m = self.plat.fill(Fill::FileRead { from: head, wake: true }, a, len - head).unwrap_or(0);
        self.settle_wake(handed, a, head);
        head + m
    }

    /// Whether a small file read's `len` bytes for `run` are installed in
    /// two halves at once (`install_split`): an in-thread fault (the
    /// faulting thread copies; no handler does), of at least
    /// `SPLIT_MIN_PAGES`, while the wake-ahead thread spins to take the
    /// other half, in a region no thread can write (the undo of a half
    /// installed beside a failed one drops it: a write there would be lost).
    pub(super) fn may_split(&self, c: &Core, run: PageRange, len: usize) -> bool {
        self.splittable(c, run, len) && self.service.wake_ahead().spinning()
    }

    /// `may_split` but for the spinning helper: also what decides whether
    /// an in-thread file read starts the wake-ahead thread at all.
    pub(super) fn splittable(&self, c: &Core, run: PageRange, len: usize) -> bool {
        len >= SPLIT_MIN_PAGES * self.page_size && read_only(c, run)
    }

    /// Installs the first `len` bytes of a small file read for `run` (the
    /// core lock `c` held) in two halves at once: the second by the
    /// wake-ahead thread, spinning on the other CPU, while the faulting
    /// thread copies the first (`Platform::file_install_split`). An
    /// in-thread fault copies its whole window itself, and a window's 16
    /// fresh frames are most of its cost. `lockonfault`'s in-thread row,
    /// two interleaved pairs: 1.10/1.08 s in one copy, 0.96/0.89 s in two
    /// halves (the SIGSEGV batch-16 handler: 1.47/1.29 s). Returns the
    /// bytes installed (a prefix): a second half in beside a short first
    /// one is dropped again.
    pub(super) fn install_split(&self, c: &Core, run: PageRange, len: usize) -> usize {
        let (a, ps) = (self.addr(run.start), self.page_size);
        let mid = (len / 2) & !(ps - 1);
        let (head, tail) = if self.hooks.split_fails() {
            (0, self.plat.fill(Fill::FileRead { from: mid, wake: false }, a, len - mid).unwrap_or(0))
        } else {
            self.plat.file_install_split(a, mid, len)
        };
        if head == mid {
            return mid + tail;
        }
        if tail > 0 {
            // (Its pages are neither committed nor written: dropped as a
            // zap drops them; a locked region's host lock stays.)
            let (prot, locked) = c
                .region_at(run.start)
                .map_or((PROT_NONE, false), |r| (r.prot() & PROT_MASK, r.lock() != LockMode::None));
            let _ = self.plat.range(Range::Zap(prot), a + mid, tail);
            if locked {
                let _ = self.plat.range(Range::Lock(true), a + mid, tail);
            }
        }
        head
    }

    /// Hands the wake-up of `[a, a + len)` (installed without one) to the
    /// spinning wake-ahead thread (`WakeAhead::post`), or does it now if
    /// the thread would not take it. What it returns goes to
    /// [`Inner::settle_wake`] once the caller's other work is done.
    pub(super) fn hand_off_wake(&self, a: usize, len: usize) -> Option<u64> {
        let post = self.service.wake_ahead().post(a, len / self.page_size);
        if post.is_none() {
            let _ = self.plat.range(Range::Wake, a, len);
        }
        post
    }

    /// Whether the wake-up of the thread waiting for `caller`'s fault is
    /// to be handed to the wake-ahead thread (`hand_off_wake`): it spins,
    /// and the faulting thread waits on another CPU than this handler's.
    /// Where the two share a CPU (the handler ran there once the thread
    /// slept), the handler's own wake-up needs no interrupt and the thread
    /// preempts it at once, while the wake-ahead thread, on the other CPU,
    /// would have to interrupt this one. The thread's CPU is read from
    /// `/proc` (`Thread::SharesCpu`, about 1 µs).
    pub(super) fn delegates_wake(&self, caller: Caller) -> bool {
        let Caller::Fault { tid: Some(tid), in_thread: false, .. } = caller else { return false };
        if !self.service.wake_ahead().spinning() {
            return false;
        }
        // (Unknown: handed off, as to another CPU.)
        self.plat.thread(Thread::SharesCpu { tid, max_age_ns: THREAD_CPU_AGE_NS }) != Ok(true)
    }

    /// Takes back a handed-off wake-up the wake-ahead thread has not taken
    /// (it may not be running) and does it: never a wake-up left undone.
    pub(super) fn settle_wake(&self, handed: Option<u64>, a: usize, len: usize) {
        if handed.is_some_and(|p| self.service.wake_ahead().unpost(p)) {
            let _ = self.plat.range(Range::Wake, a, len);
        }
    }
}
