//! The space's threads carry the program's credentials: they are started
//! again from a program thread whose own credentials (capabilities,
//! securebits, keep-caps: `usermm_sys::creds`) differ from theirs, before
//! the C library's `set*id` broadcast reaches them, so that it succeeds or
//! fails there as in the calling thread (a mismatch aborts the process).
//!
//! Invariant: `ForkState::creds` is the per-thread credentials every thread
//! of the space has — those of the thread that started them, changed since
//! only by `set*id` broadcasts that changed the caller's the same way
//! ([`credentials_changed_everywhere`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::platform::{thread_creds, ThreadCreds};

use super::{fork, lock, Inner};

impl Inner {
    /// Whether the space's threads are to leave their loops: the space
    /// closes, or they are being started again.
    pub(super) fn threads_stop(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed) || self.fork.renewing.load(Ordering::Relaxed)
    }

    /// Wakes every thread of the space out of its wait (it then looks at
    /// [`Inner::threads_stop`]).
    pub(super) fn wake_threads(&self) {
        self.wake_fd.signal();
        {
            let _c = lock(&self.core);
            self.reclaimer.notify();
            self.settled.notify_all();
        }
        self.service.wake_ahead().shut();
    }

    /// Starts the space's threads again from the calling thread when its
    /// credentials `now` differ from theirs. Faults meanwhile wait in the
    /// kernel for the new handlers. A space closing (no threads) is left.
    fn follow_creds(self: &Arc<Inner>, now: ThreadCreds) {
        let mut slot = lock(&self.fork.threads);
        if slot.is_none() || *lock(&self.fork.creds) == now {
            return;
        }
        let old = slot.take().expect("checked above");
        self.fork.starting.store(true, Ordering::SeqCst);
        self.fork.renewing.store(true, Ordering::SeqCst);
        self.wake_threads();
        for h in old.handles {
            let _ = h.join();
        }
        self.fork.renewing.store(false, Ordering::SeqCst);
        let plan = *lock(&self.fork.plan);
        // A thread that cannot be started (no memory for its stack) is
        // tried again: faults would wait for a handler that is not there.
        for attempt in 0.. {
            match self.start_threads(plan) {
                Ok(t) => {
                    *slot = Some(t);
                    self.fork.starting.store(false, Ordering::SeqCst);
                    return;
                }
                Err(_) if attempt < 1000 => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => {
                    crate::platform::fork::say(&format!(
                        "usermm: pid {}: the space at {:#x} cannot start its threads again ({e}) after a \
                         credential change\n",
                        std::process::id(),
                        self.base
                    ));
                    std::process::abort();
                }
            }
        }
    }

    /// Whether the space's threads are being started again (a heap on it
    /// then allocates from the system allocator).
    pub(crate) fn threads_starting(&self) -> bool {
        self.fork.starting.load(Ordering::Relaxed)
    }

    /// Records `creds` as its threads' (the thread that starts them, or a
    /// broadcast that changed every thread alike).
    pub(super) fn set_thread_creds(&self, creds: ThreadCreds) {
        *lock(&self.fork.creds) = creds;
    }
}

/// Makes the threads of every space of this process carry the calling
/// thread's per-thread credentials (capabilities, securebits, keep-caps),
/// starting them again where they differ. Call it before a `set*id` or
/// `setgroups` call of the C library (which runs the call in every thread
/// and aborts on a mismatch), and after the calling thread changed its own
/// (`capset`, `prctl`). `usermm run`'s preload calls it for the program.
pub fn threads_follow_credentials() {
    let Some(now) = thread_creds() else { return };
    let _system = crate::thread_role::SystemOnly::enter();
    for i in fork::spaces_here() {
        i.follow_creds(now);
    }
}

/// After a `set*id` or `setgroups` call of the C library (run in every
/// thread, from credentials [`threads_follow_credentials`] made equal):
/// every thread of every space now has the calling thread's credentials.
pub fn credentials_changed_everywhere() {
    let Some(now) = thread_creds() else { return };
    for i in fork::spaces_here() {
        i.set_thread_creds(now);
    }
}
