//! The process's forks, for the executor (`native/fork.rs`): the hooks run
//! around each fork, the locks kept across one, and the fork generation.

use std::sync::Arc;

pub(crate) use usermm_sys::thread::{ChildTie, ForkHooks, Kept};

/// Runs `h` around every later fork (`usermm_sys::thread::set_fork_hooks`).
pub(crate) fn set_hooks(h: &'static ForkHooks) {
    usermm_sys::thread::set_fork_hooks(h);
}

/// Keeps the guard `take` returns, a lock of `*owner`, until
/// [`release_kept`] (`usermm_sys::thread::keep_across_fork`; `forget_in_child`:
/// never let go in the child).
pub(crate) fn keep<O: Send + Sync + 'static>(
    owner: Arc<O>,
    take: impl for<'a> FnOnce(&'a O) -> Box<dyn Kept + 'a>,
    forget_in_child: bool,
) {
    usermm_sys::thread::keep_across_fork(owner, take, forget_in_child);
}

/// Keeps a guard of a static lock until [`release_kept`].
pub(crate) fn keep_static(guard: Box<dyn Kept>) {
    usermm_sys::thread::keep_static_across_fork(guard);
}

/// Lets go of every guard this thread kept, the last first (`in_child`:
/// those kept with `forget_in_child` stay held).
pub(crate) fn release_kept(in_child: bool) {
    usermm_sys::thread::release_kept(in_child);
}

/// Writes `msg` to stderr without std's lock, which a parent thread may
/// have held at the fork (`usermm_sys::thread::write_stderr_unlocked`).
pub(crate) fn say(msg: &str) {
    usermm_sys::thread::write_stderr_unlocked(msg);
}

/// The process's fork generation (`usermm_sys::thread::fork_generation`).
pub(crate) fn generation() -> u64 {
    usermm_sys::thread::fork_generation()
}

/// `CLOCK_MONOTONIC` in nanoseconds (`usermm_sys::now_ns`).
pub(crate) fn now_ns() -> u64 {
    usermm_sys::now_ns()
}
