//! The ranges of a handler-thread space whose faults are resolved in the
//! faulting thread (`UMM_MAP_INTHREAD` regions) and the second userfaultfd
//! they are registered with (see docs/design.md, "Per region").

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use usermm_core::Errno;
use usermm_sys::uffd::{Uffd, UffdMode, UFFDIO_REGISTER_MODE_MISSING};

/// Address ranges `(start, end)`, sorted.
type Parts = Vec<(usize, usize)>;

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
        Ok((InThreadRanges::inside(&m, a, e), InThreadRanges::outside(&m, a, e)))
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
            (main, it, missing, InThreadRanges::outside(&m, a, e))
        } else {
            (it, main, main_mode, InThreadRanges::inside(&m, a, e))
        };
        for (s, t) in parts {
            from.unregister(s, t - s)?;
            if let Err(err) = to.register_mode(s, t - s, to_mode) {
                // Back as it was: never a range no userfaultfd serves.
                let _ = from.register_mode(s, t - s, if on { main_mode } else { missing });
                return Err(err);
            }
            InThreadRanges::record(&mut m, s, t, on);
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

    /// The parts of `[a, e)` registered with `uffd`.
    fn inside(m: &BTreeMap<usize, usize>, a: usize, e: usize) -> Parts {
        let first = m.range(..=a).next_back().map_or(a, |(&s, _)| s);
        m.range(first..e).map(|(&s, &t)| (s.max(a), t.min(e))).filter(|(s, t)| s < t).collect()
    }

    /// The parts of `[a, e)` not registered with `uffd`.
    fn outside(m: &BTreeMap<usize, usize>, a: usize, e: usize) -> Parts {
        let mut gaps = Vec::new();
        let mut at = a;
        for (s, t) in InThreadRanges::inside(m, a, e) {
            if at < s {
                gaps.push((at, s));
            }
            at = t;
        }
        if at < e {
            gaps.push((at, e));
        }
        gaps
    }

    /// Records `[a, e)` as registered (`on`) or not.
    fn record(m: &mut BTreeMap<usize, usize>, a: usize, e: usize, on: bool) {
        let (mut lo, mut hi) = (a, e);
        let touching: Vec<(usize, usize)> = {
            let first = m.range(..=a).next_back().map_or(a, |(&s, _)| s);
            m.range(first..=e).map(|(&s, &t)| (s, t)).filter(|&(s, t)| t >= a && s <= e).collect()
        };
        for (s, t) in touching {
            m.remove(&s);
            if on {
                lo = lo.min(s);
                hi = hi.max(t);
            } else {
                if s < a {
                    m.insert(s, a);
                }
                if t > e {
                    m.insert(e, t);
                }
            }
        }
        if on {
            m.insert(lo, hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::InThreadRanges;
    use std::collections::BTreeMap;

    /// `record`, `inside` and `outside` against a bitmap of 64 units, with
    /// random ranges (a fixed-seed generator): the map stays sorted,
    /// disjoint and never adjacent, and says exactly what the bitmap says.
    #[test]
    fn the_range_set_matches_a_bitmap() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut m = BTreeMap::new();
        let mut bits = [false; 64];
        for _ in 0..5000 {
            let a = next(64) as usize;
            let e = (a + 1 + next(12) as usize).min(64);
            let on = next(2) == 0;
            let (ins, outs) = (InThreadRanges::inside(&m, a, e), InThreadRanges::outside(&m, a, e));
            let mut covered = [None; 64];
            for (s, t) in &ins {
                covered[*s..*t].iter_mut().for_each(|c| *c = Some(true));
            }
            for (s, t) in &outs {
                covered[*s..*t].iter_mut().for_each(|c| *c = Some(false));
            }
            for i in 0..64 {
                let want = (a..e).contains(&i).then_some(bits[i]);
                assert_eq!(covered[i], want, "unit {i} of [{a}, {e}) in {m:?}");
            }
            // As `set_in_thread` does: each part that changes, one by one.
            for (s, t) in if on { outs } else { ins } {
                InThreadRanges::record(&mut m, s, t, on);
            }
            bits[a..e].iter_mut().for_each(|b| *b = on);
            let mut prev_end = None;
            for (&s, &t) in &m {
                assert!(s < t, "{m:?}");
                assert!(prev_end.is_none_or(|p| p < s), "disjoint, never adjacent: {m:?}");
                prev_end = Some(t);
            }
            for (i, &b) in bits.iter().enumerate() {
                let in_map = m.range(..=i).next_back().is_some_and(|(_, &t)| i < t);
                assert_eq!(in_map, b, "unit {i}: {m:?}");
            }
        }
    }
}
