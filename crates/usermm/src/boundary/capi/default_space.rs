//! The process-wide default space of `usermm_compat.h`: one per fork
//! generation, configured from the `USERMM_*` environment
//! (`umm_default_space`).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use super::{guard, umm_space};
use crate::{Errno, Space};

/// The process-wide default space of `usermm_compat.h` for one fork
/// generation; the error is kept so that every call reports it.
struct DefaultCell {
    fork_generation: std::sync::atomic::AtomicU64,
    space: OnceLock<Result<Space, Errno>>,
}

/// The default space's cell of the current fork generation: a forked child
/// keeps its parent's when the parent's space was copied into it, and
/// otherwise gets a fresh cell (and so a fresh space, opened by its first
/// call), never waiting on the parent's, whose `OnceLock` a parent thread
/// may have been initialising at the fork (every fork after the first call
/// is counted: see `default_cell`). Cells are leaked, never freed: one per
/// generation that called `umm_default_space`.
static DEFAULT_CELL: AtomicPtr<DefaultCell> = AtomicPtr::new(std::ptr::null_mut());

pub(super) fn default_cell() -> &'static OnceLock<Result<Space, Errno>> {
    // The fork handler is registered before a cell is made (the space's
    // open would register it only inside the cell's initialisation): a
    // fork while a thread initialises this generation's cell then always
    // gives the child a new generation, and so a cell of its own. (If it
    // cannot be registered, the open fails the same way.)
    let generation = usermm_sys::thread::watch_forks().unwrap_or_else(|_| usermm_sys::thread::fork_generation());
    let mut cur = DEFAULT_CELL.load(Ordering::Acquire);
    loop {
        // SAFETY: DEFAULT_CELL holds NULL or a pointer from `Box::leak`
        // below, never freed, so it is valid for 'static.
        if let Some(cell) = unsafe { cur.as_ref() } {
            let g = cell.fork_generation.load(Ordering::Acquire);
            if g == generation {
                return &cell.space;
            }
            // A forked child that was given a copy of the parent's default
            // space keeps it (its memory is the parent's, copied).
            if g < generation && matches!(cell.space.get(), Some(Ok(sp)) if sp.check_owner().is_ok()) {
                let _ = cell.fork_generation.compare_exchange(g, generation, Ordering::AcqRel, Ordering::Acquire);
                continue;
            }
        }
        let new: &'static mut DefaultCell = Box::leak(Box::new(DefaultCell {
            fork_generation: std::sync::atomic::AtomicU64::new(generation),
            space: OnceLock::new(),
        }));
        match DEFAULT_CELL.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return &new.space,
            // Another thread installed a cell first: use it if it is this
            // generation's (ours stays leaked, a few bytes, at most once per
            // racing thread).
            Err(other) => cur = other,
        }
    }
}

/// `umm_default_space`: the process-wide default space, opened once (the
/// first caller opens it; concurrent callers wait) from the `USERMM_*`
/// environment. NULL + errno if it could not be opened (a message says why,
/// once, on stderr). It is never closed (its swap file, or its Redis keys,
/// go after the process exits: `store/redis.rs`). A forked child has its
/// copy of the parent's (`docs/design.md`, "fork"); where it was not
/// copied, the child's first call opens the child's own (the parent's is
/// stale there).
#[no_mangle]
pub extern "C" fn umm_default_space() -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let r = default_cell().get_or_init(|| {
            let r = crate::config::from_env().and_then(|c| Space::open(&c));
            if let Err(e) = &r {
                eprintln!("usermm: cannot open the default space (USERMM_* environment): {e}");
            }
            r
        });
        match r {
            Ok(sp) => Ok(sp as *const Space as *mut umm_space),
            Err(e) => Err(*e),
        }
    })
}
