//! The fault service's shared state: which handler spins for the next
//! message, the wake-ahead thread it keeps awake, and the signals sent to
//! faulting threads, kept so that one access never gets two
//! (`native/fault.rs`, "Answered faults").
//!
//! Invariant: `signalled` holds at most one entry a thread (its last
//! signal), and an entry's `taken` batch is never later than
//! `read_batches`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::awake::WakeAhead;
use super::lock;
use crate::platform::{Platform, Thread};

/// A thread sent a fault's signal.
#[derive(Clone, Copy)]
struct Signalled {
    tid: u32,
    sig: i32,
    /// `Some(b)` once the thread was seen to have taken the signal, when
    /// `b` batches of messages had been read: messages of later batches
    /// are new faults, those of batches up to `b` may have been read before
    /// it took it.
    taken: Option<u64>,
}

impl Signalled {
    /// Whether a message of the thread from read batch `batch` was for
    /// the fault this signal answers.
    fn answers(&self, batch: u64) -> bool {
        self.taken.is_none_or(|b| batch <= b)
    }
}

pub(crate) struct FaultService {
    /// Whether a handler thread is spinning for the next message.
    spinning: AtomicBool,
    /// Keeps the faulting thread's CPU awake while its fault is served
    /// (`native/awake.rs`).
    wake_ahead: WakeAhead,
    /// Threads sent a fault's signal (`Inner::report`), one entry a thread
    /// (the last signal): a message of such a thread read before it took
    /// the signal was for the fault the signal answers.
    signalled: Mutex<Vec<Signalled>>,
    /// Batches of fault messages read so far: the number of each batch
    /// orders its reads against the observations that a thread took its
    /// signal (`Signalled::taken`).
    read_batches: AtomicU64,
    /// Whether `signalled` is kept: not in the simulation, whose faults are
    /// served in the touching step (no messages, nothing to answer twice).
    tracks_signals: AtomicBool,
}

impl FaultService {
    /// Its locks, held across a fork (leaves: `native/fork.rs`).
    pub(super) fn fork_guards(&self) -> Vec<Box<dyn crate::platform::fork::Kept + '_>> {
        vec![Box::new(lock(&self.signalled)), Box::new(self.wake_ahead.fork_guard())]
    }

    pub(super) fn new() -> FaultService {
        FaultService {
            spinning: AtomicBool::new(false),
            wake_ahead: WakeAhead::default(),
            signalled: Mutex::new(Vec::new()),
            read_batches: AtomicU64::new(0),
            tracks_signals: AtomicBool::new(true),
        }
    }

    pub(super) fn wake_ahead(&self) -> &WakeAhead {
        &self.wake_ahead
    }

    /// Makes the calling handler the one that spins, unless another one
    /// is; whether it is now.
    pub(super) fn start_spinning(&self) -> bool {
        self.spinning.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// The spinning handler stops.
    pub(super) fn stop_spinning(&self) {
        self.spinning.store(false, Ordering::Release);
    }

    /// The number of the batch of fault messages about to be read, after
    /// noting which signalled threads have taken their signal (`/proc`'s
    /// `SigPnd`, through `plat`; only while one may not have): see
    /// `answered`.
    pub(super) fn next_read_batch(&self, plat: &dyn Platform) -> u64 {
        let mut s = lock(&self.signalled);
        if s.iter().any(|e| e.taken.is_none()) {
            let now = self.read_batches.load(Ordering::SeqCst);
            for e in s.iter_mut().filter(|e| e.taken.is_none()) {
                if plat.thread(Thread::SignalPending { tid: e.tid, sig: e.sig }) != Ok(true) {
                    e.taken = Some(now);
                }
            }
        }
        drop(s);
        self.read_batches.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether a fault message of thread `tid`, read in batch `batch`, was
    /// answered already by a signal (`native/fault.rs`, "Answered faults").
    pub(super) fn answered(&self, tid: u32, batch: u64) -> bool {
        lock(&self.signalled).iter().any(|e| e.tid == tid && e.answers(batch))
    }

    /// Records that thread `tid` is sent `sig` for the fault of a message
    /// of read batch `batch`, and returns true; false when an earlier
    /// signal answers that fault: it is not sent.
    pub(super) fn signal_sent(&self, tid: u32, sig: i32, batch: u64) -> bool {
        if !self.tracks_signals.load(Ordering::Relaxed) {
            return true;
        }
        let mut s = lock(&self.signalled);
        if let Some(e) = s.iter_mut().find(|e| e.tid == tid) {
            if e.answers(batch) {
                return false;
            }
            *e = Signalled { tid, sig, taken: None };
        } else {
            s.push(Signalled { tid, sig, taken: None });
        }
        true
    }

    /// Stops keeping `signalled` (the simulation).
    #[cfg(feature = "test-hooks")]
    pub(super) fn set_tracks_signals(&self, on: bool) {
        self.tracks_signals.store(on, Ordering::Relaxed);
    }
}
