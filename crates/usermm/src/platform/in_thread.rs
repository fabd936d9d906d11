//! The ranges of a handler-thread space whose faults are resolved in the
//! faulting thread (`UMM_MAP_INTHREAD` regions) and the second userfaultfd
//! they are registered with (see docs/design.md, "Per region").

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use usermm_core::Errno;

use super::ranges::{self, Parts};
use usermm_sys::uffd::{Uffd, UffdMode, UFFDIO_REGISTER_MODE_MISSING};

/// The ranges of a handler-thread space whose faults are resolved in the
/// faulting thread (`UMM_MAP_INTHREAD` regions): registered with a second
/// userfaultfd, with `UFFD_FEATURE_SIGBUS`, opened at the first such region
/// (a mapping is registered with one userfaultfd at a time). The space's
/// own userfaultfd serves every other range, and its `UFFDIO_COPY` and
/// `UFFDIO_ZEROPAGE` install pages in these ranges too (the kernel checks
/// only that the destination is registered, with any userfaultfd of the
/// same process); `UFFDIO_MOVE` wants the destination's own one
/// (`Native::dst_uffd`).
#[derive(Default)]
pub(crate) struct InThreadRanges {
    uffd: OnceLock<Uffd>,
    /// `start -> end` of each range registered with `uffd`: sorted,
    /// disjoint, never adjacent. Not touched while program memory is.
    ranges: Mutex<BTreeMap<usize, usize>>,
}

impl InThreadRanges {
    /// The second userfaultfd, once the first such region opened it.
    pub(super) fn uffd(&self) -> Option<&Uffd> {
        self.uffd.get()
    }

    /// The parts of `[a, a+l)` registered with it, and the others.
    pub(super) fn split(&self, a: usize, l: usize) -> Result<(Parts, Parts), Errno> {
        let e = a.checked_add(l).ok_or(Errno::EINVAL)?;
        let m = self.ranges();
        Ok((ranges::inside(&m, a, e), ranges::outside(&m, a, e)))
    }

    /// Registers `[a, a+l)` with the second userfaultfd (`on`, opened now
    /// if it is not yet) or with the space's own, `main`, in `main_mode`:
    /// each part whose userfaultfd changes is unregistered from the one
    /// and registered with the other. A part that fails is put back.
    pub(super) fn set(&self, main: &Uffd, main_mode: u64, a: usize, l: usize, on: bool) -> Result<(), Errno> {
        if !on && self.uffd.get().is_none() {
            return Ok(());
        }
        let e = a.checked_add(l).ok_or(Errno::EINVAL)?;
        let mut m = self.ranges();
        if self.uffd.get().is_none() {
            let user_mode = main.mode == UffdMode::UserModeOnly;
            let u =
                Uffd::open(false, user_mode, true)
                    .map_err(|e| if e == Errno::EINVAL { Errno::EOPNOTSUPP } else { e })?;
            let _ = self.uffd.set(u);
        }
        let it = self.uffd.get().ok_or(Errno::EOPNOTSUPP)?;
        // (Registered in MISSING mode only: these pages are never installed
        // write-protected, see `Core::keeps_swap_copy`.)
        let missing = UFFDIO_REGISTER_MODE_MISSING;
        let (from, to, to_mode, parts) = if on {
            (main, it, missing, ranges::outside(&m, a, e))
        } else {
            (it, main, main_mode, ranges::inside(&m, a, e))
        };
        for (s, t) in parts {
            from.unregister(s, t - s)?;
            if let Err(err) = to.register_mode(s, t - s, to_mode) {
                // Back as it was: never a range no userfaultfd serves.
                let _ = from.register_mode(s, t - s, if on { main_mode } else { missing });
                return Err(err);
            }
            ranges::record(&mut m, s, t, on);
        }
        Ok(())
    }

    fn ranges(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        self.ranges.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The userfaultfd `a`'s mapping is registered with, if it is this one.
    pub(super) fn covering(&self, a: usize) -> Option<&Uffd> {
        let u = self.uffd.get()?;
        self.ranges().range(..=a).next_back().filter(|(_, &e)| a < e).map(|_| u)
    }
}
