//! The program's threads in the simulation: the faulting thread's touches
//! and the second thread's, which run at preemption points; and what the
//! executor asks about threads (`Platform::thread`).

use std::sync::Arc;

use usermm_core::consts::{PROT_NONE, PROT_READ, PROT_WRITE};
use usermm_core::Errno;
use usermm_sys::inthread::Resolve;

use super::host::{libc_sig, zeros, Host, Pg, SimPlatform};
use super::{Rng, Touch, BASE, PAGES, PS};
use crate::native::Inner;
use crate::platform::{Signal, ThreadOps};

/// The faulting thread's id.
pub(super) const TID: u32 = 7;
/// The second program thread's id.
pub(super) const OTHER_TID: u32 = 8;

/// A second program thread: at a preemption point of the step in progress
/// (a call, a touch, a background round), now and then, it touches a page
/// outside the pages that step works on — whose expected bytes the step
/// therefore cannot change — and the simulation checks what it saw after
/// the step.
pub(super) struct OtherThread {
    pub(super) rng: Rng,
    /// One in how many preemption points it touches a page (0: never).
    pub(super) one_in: u64,
    /// The pages the step in progress works on: `[start, end)`.
    pub(super) busy: (usize, usize),
    /// Its touches, to check: (page, stamp written, outcome).
    pub(super) touches: Vec<(usize, Option<u64>, Touch)>,
    /// Its stamps: `1 << 40` and up (the first thread's are small).
    pub(super) next_stamp: u64,
}

impl SimPlatform {
    /// The second program thread's touch, if it runs now.
    pub(super) fn other_touch(&self, inner: &Inner) {
        let (p, stamp) = {
            let mut o = self.other.lock().unwrap_or_else(|e| e.into_inner());
            let one_in = o.one_in;
            if one_in == 0 || !o.rng.one_in(one_in) {
                return;
            }
            // Now and then a page just past the step's: where a fill window
            // around the step's page goes on (a stream's page being read,
            // which a waiting handler reads ahead of: `read_ahead_instead`).
            let p = if o.busy.1 > o.busy.0 && o.rng.one_in(4) {
                (o.busy.1 + o.rng.below(8) as usize).min(PAGES - 1)
            } else {
                o.rng.below(PAGES as u64) as usize
            };
            if (o.busy.0..o.busy.1).contains(&p) {
                return;
            }
            let stamp = o.rng.one_in(2).then(|| {
                o.next_stamp += 1;
                o.next_stamp
            });
            (p, stamp)
        };
        if let Some(t) = self.touch(inner, p, stamp, OTHER_TID, false) {
            self.other.lock().unwrap_or_else(|e| e.into_inner()).touches.push((p, stamp, t));
        }
    }

    /// Program thread `tid` touches page `p` (reads its two stamp words, or
    /// writes `stamp` to them), faulting into the executor as the kernel
    /// would. With `wait` false (a thread run at a preemption point) the
    /// touch gives up — `None`, as if the thread had not run yet — where
    /// its fault would wait for a page the preempted thread holds.
    pub(super) fn touch(&self, inner: &Inner, p: usize, stamp: Option<u64>, tid: u32, wait: bool) -> Option<Touch> {
        let a = BASE + p * PS;
        for _ in 0..64 {
            // A write to a write-protected page is a WP fault.
            let wp = stamp.is_some() && self.host().write_protected(p);
            if !wp {
                if let Some(t) = self.host().access(p, stamp) {
                    return Some(t);
                }
            }
            // A missing page: the kernel queues a fault; a handler serves it.
            self.faults.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if wp {
                self.wp_faults.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if wait {
                if wp {
                    inner.resolve_wp(a, Some(tid));
                } else {
                    inner.resolve(a, stamp.is_some(), Some(tid));
                }
            } else if !inner.resolve_unblocked(a, stamp.is_some(), wp, tid) {
                return None;
            }
            let sig = {
                let mut h = self.host();
                let i = h.signals.iter().position(|s| s.0 == tid);
                i.map(|i| h.signals.remove(i))
            };
            match sig {
                Some((_, libc_sig::SIGBUS, at)) => {
                    assert_eq!(at, a, "SIGBUS at another address");
                    return Some(Touch::BusQueued);
                }
                Some((_, _, _)) => return Some(Touch::Segv),
                None => {}
            }
        }
        panic!("the fault at page {p} was never served");
    }
}

impl Host {
    /// Whether a write to page `p` would be a WP fault: the page is there,
    /// writable, and installed write-protected.
    pub(super) fn write_protected(&self, p: usize) -> bool {
        self.wp.contains(&p)
            && self.prog.contains_key(&p)
            && self.prot.get(&p).copied().unwrap_or(PROT_NONE) & PROT_WRITE != 0
    }

    /// A touch of page `p` at the host level: what the access did, or
    /// `None` when the page is missing (a fault).
    pub(super) fn access(&mut self, p: usize, stamp: Option<u64>) -> Option<Touch> {
        let prot = self.prot.get(&p).copied().unwrap_or(PROT_NONE);
        let allowed = if stamp.is_some() { prot & PROT_WRITE != 0 } else { prot & (PROT_READ | PROT_WRITE) != 0 };
        if !allowed {
            return Some(Touch::Segv);
        }
        let pg = self.prog.get_mut(&p)?;
        if *pg == Pg::Poison {
            return Some(Touch::Bus);
        }
        if stamp.is_some() && *pg == Pg::Zero {
            *pg = Pg::Data(zeros());
        }
        if stamp.is_some() {
            self.lazy.pages.remove(&p);
        }
        let (a, b) = match pg {
            Pg::Data(d) => {
                (u64::from_le_bytes(d[..8].try_into().unwrap()), u64::from_le_bytes(d[PS - 8..].try_into().unwrap()))
            }
            _ => (0, 0),
        };
        if let (Some(s), Pg::Data(d)) = (stamp, pg) {
            d[..8].copy_from_slice(&s.to_le_bytes());
            d[PS - 8..].copy_from_slice(&s.to_le_bytes());
        }
        Some(Touch::Done(a, b))
    }
}

/// The program's threads as the executor sees them through the platform:
/// signals queued (and taken by the touch that faulted), one CPU each, the
/// in-thread range recorded (the simulation serves every fault in the
/// faulting thread's step whatever it is).
impl ThreadOps for SimPlatform {
    fn signal(&self, tid: u32, sig: Signal, addr: usize) -> Result<(), Errno> {
        let sig = match sig {
            Signal::Bus(_) => libc_sig::SIGBUS,
            Signal::Segv => libc_sig::SIGSEGV,
        };
        self.host().signals.push((tid, sig, addr));
        Ok(())
    }
    fn signal_pending(&self, tid: u32, sig: i32) -> Result<bool, Errno> {
        Ok(self.host().signals.iter().any(|s| s.0 == tid && s.1 == sig))
    }
    fn shares_cpu(&self, _tid: u32, _max_age_ns: u64) -> Result<bool, Errno> {
        Ok(false)
    }
    fn idle_priority(&self) -> Result<(), Errno> {
        Ok(())
    }
    fn in_thread_on(&self, start: usize, end: usize, _resolver: Arc<dyn Resolve>) -> Result<(), Errno> {
        // (The resolver is not kept: it holds the space, which holds this.)
        let mut h = self.host();
        if h.in_thread.is_none() {
            h.in_thread = Some((start, end));
        }
        Ok(())
    }
    fn in_thread_off(&self) {
        self.host().in_thread = None;
    }
}
