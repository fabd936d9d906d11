//! Freed runs of the arenas whose pages wait to be lazily freed.
//!
//! A program that frees a block of [`FREE_RUN_BYTES`](super::FREE_RUN_BYTES)
//! or more and allocates one of the same size again at once — zlib's
//! windows in git, a parser's buffers — would make one `MADV_FREE` a free
//! (a system call under the heap's lock and a TLB flush on every CPU the
//! process ran on, usermm's threads among them), for pages it writes again
//! a moment later. So a freed run's whole pages wait in a short list; an
//! allocation placed over them takes them off it, and the list is lazily
//! freed in one go once it holds [`Deferred::max_bytes`] or
//! [`DEFERRED_RUNS`] runs.
//!
//! Invariant (kept by the heap, under its lock): every page on the list
//! lies in free memory of an arena, clear of talc's tags — a run is added
//! from a block just freed (less its tag margins), and every block talc
//! places, with the tags it writes beside it, is taken off first
//! ([`Deferred::take`]). Lazily freeing a listed page therefore loses no
//! byte anybody reads.

/// The most runs the list holds.
pub(crate) const DEFERRED_RUNS: usize = 64;

/// The list: `[start, end)` runs of whole pages, disjoint, unsorted.
pub(crate) struct Deferred {
    runs: [(usize, usize); DEFERRED_RUNS],
    n: usize,
    bytes: usize,
    max_bytes: usize,
}

impl Deferred {
    /// An empty list lazily freed past `max_bytes`.
    pub(crate) const fn new(max_bytes: usize) -> Deferred {
        Deferred { runs: [(0, 0); DEFERRED_RUNS], n: 0, bytes: 0, max_bytes }
    }

    /// The bound for a space of `budget_bytes`: a sixty-fourth of it,
    /// between 256 KiB and 8 MiB (the pages the list holds are resident and
    /// not yet known free: under pressure they are written to swap, not
    /// dropped).
    pub(crate) fn bound_for(budget_bytes: usize) -> usize {
        (budget_bytes / 64).clamp(256 << 10, 8 << 20)
    }

    /// Bytes on the list.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether no run can be added (drain it first).
    pub(crate) fn is_full(&self) -> bool {
        self.n == DEFERRED_RUNS
    }

    /// Adds the run `[start, end)` (disjoint from every listed one; the
    /// list not full); whether the list is now due to be lazily freed
    /// ([`Deferred::drain`]).
    pub(crate) fn add(&mut self, start: usize, end: usize) -> bool {
        debug_assert!(start < end);
        debug_assert!(self.runs[..self.n].iter().all(|&(s, e)| end <= s || e <= start), "runs overlap");
        assert!(!self.is_full(), "a run added to a full list");
        self.runs[self.n] = (start, end);
        self.n += 1;
        self.bytes += end - start;
        self.n == DEFERRED_RUNS || self.bytes > self.max_bytes
    }

    /// Takes `[lo, hi)` off every run (memory about to be written). A run
    /// split in two keeps both halves while there is room, else the larger.
    pub(crate) fn take(&mut self, lo: usize, hi: usize) {
        let mut i = 0;
        while i < self.n {
            let (s, e) = self.runs[i];
            if hi <= s || e <= lo {
                i += 1;
                continue;
            }
            let below = (s, lo.max(s));
            let above = (hi.min(e), e);
            self.bytes -= e - s;
            let keep = |r: (usize, usize)| r.0 < r.1;
            match (keep(below), keep(above)) {
                (false, false) => {
                    self.n -= 1;
                    self.runs[i] = self.runs[self.n];
                    continue;
                }
                (true, false) => self.runs[i] = below,
                (false, true) => self.runs[i] = above,
                (true, true) => {
                    if self.n < DEFERRED_RUNS {
                        self.runs[i] = below;
                        self.runs[self.n] = above;
                        self.n += 1;
                        self.bytes += above.1 - above.0;
                    } else if below.1 - below.0 >= above.1 - above.0 {
                        self.runs[i] = below;
                    } else {
                        self.runs[i] = above;
                    }
                }
            }
            self.bytes += self.runs[i].1 - self.runs[i].0;
            i += 1;
        }
    }

    /// Empties the list, calling `f(start, len)` for each run of adjacent
    /// listed pages, in address order.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(usize, usize)) {
        let runs = &mut self.runs[..self.n];
        runs.sort_unstable();
        let mut i = 0;
        while i < runs.len() {
            let (start, mut end) = runs[i];
            i += 1;
            while i < runs.len() && runs[i].0 == end {
                end = runs[i].1;
                i += 1;
            }
            f(start, end - start);
        }
        self.n = 0;
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list against a bitmap of pages: whatever runs are added and
    /// taken, the drained pages are exactly those added and not taken
    /// since (save the smaller half of a split when the list is full, which
    /// is only ever left out, never added).
    #[test]
    fn the_list_drains_what_was_freed_and_not_taken() {
        const PAGES: usize = 512;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n) as usize
        };
        for _round in 0..200 {
            let mut d = Deferred::new(usize::MAX);
            let mut listed = [false; PAGES];
            for _ in 0..100 {
                let a = next(PAGES as u64);
                let b = (a + 1 + next(24)).min(PAGES);
                if next(2) == 0 {
                    if listed[a..b].iter().any(|&x| x) || d.is_full() {
                        continue;
                    }
                    d.add(a, b);
                    listed[a..b].iter_mut().for_each(|x| *x = true);
                } else {
                    d.take(a, b);
                    listed[a..b].iter_mut().for_each(|x| *x = false);
                }
                let on: usize = d.runs[..d.n].iter().map(|&(s, e)| e - s).sum();
                assert_eq!(on, d.bytes());
            }
            let mut drained = [false; PAGES];
            let mut last_end = 0;
            d.drain(|s, len| {
                assert!(s >= last_end, "in address order, merged");
                last_end = s + len;
                drained[s..s + len].iter_mut().for_each(|x| *x = true);
            });
            for p in 0..PAGES {
                assert!(!drained[p] || listed[p], "page {p} drained but never freed or taken since");
            }
            assert!(d.is_empty() && d.bytes() == 0);
        }
    }

    #[test]
    fn the_list_is_due_past_its_bound_or_full() {
        let mut d = Deferred::new(10);
        assert!(!d.add(0, 6));
        assert!(d.add(10, 16), "12 bytes > 10");
        d.drain(|_, _| {});
        let mut d = Deferred::new(usize::MAX);
        for i in 0..DEFERRED_RUNS - 1 {
            assert!(!d.add(2 * i, 2 * i + 1));
        }
        assert!(d.add(1000, 1001), "full");
        assert_eq!(Deferred::bound_for(64 << 20), 1 << 20);
        assert_eq!(Deferred::bound_for(1 << 20), 256 << 10);
        assert_eq!(Deferred::bound_for(64 << 30), 8 << 20);
    }

    /// A take inside a run keeps both ends; with the list full, the larger.
    #[test]
    fn a_take_in_the_middle_splits_the_run() {
        let mut d = Deferred::new(usize::MAX);
        d.add(0, 100);
        d.take(10, 20);
        assert_eq!(d.bytes(), 90);
        let mut got = vec![];
        d.drain(|s, l| got.push((s, l)));
        assert_eq!(got, vec![(0, 10), (20, 80)]);
        let mut d = Deferred::new(usize::MAX);
        for i in 0..DEFERRED_RUNS {
            d.add(1000 * i, 1000 * i + 100);
        }
        d.take(10, 20);
        assert_eq!(d.bytes(), 100 * DEFERRED_RUNS - 100 + 80);
    }
}
