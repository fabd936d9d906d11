//! Sets of address ranges: `start -> end` in a `BTreeMap`, sorted,
//! disjoint and never adjacent (the in-thread ranges of a space, its file
//! windows mapped from the page cache).

use std::collections::BTreeMap;

/// Address ranges `(start, end)`, sorted.
pub(super) type Parts = Vec<(usize, usize)>;

/// The parts of `[a, e)` in the set `m`.
pub(super) fn inside(m: &BTreeMap<usize, usize>, a: usize, e: usize) -> Parts {
    let first = m.range(..=a).next_back().map_or(a, |(&s, _)| s);
    m.range(first..e).map(|(&s, &t)| (s.max(a), t.min(e))).filter(|(s, t)| s < t).collect()
}

/// The parts of `[a, e)` not in the set `m`.
pub(super) fn outside(m: &BTreeMap<usize, usize>, a: usize, e: usize) -> Parts {
    let mut gaps = Vec::new();
    let mut at = a;
    for (s, t) in inside(m, a, e) {
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

/// Adds `[a, e)` to the set `m` (`on`) or takes it out.
pub(super) fn record(m: &mut BTreeMap<usize, usize>, a: usize, e: usize, on: bool) {
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

#[cfg(test)]
mod tests {
    use super::{inside, outside, record};
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
            let (ins, outs) = (inside(&m, a, e), outside(&m, a, e));
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
                record(&mut m, s, t, on);
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
