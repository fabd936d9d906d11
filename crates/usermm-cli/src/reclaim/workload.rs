//! The touches of `reclaim`, the same for every system: the seven phases in
//! [`PHASES`](super::PHASES) order (with YCSB's scrambled zipfian generator)
//! and the hot set's hit-rate probe.

use usermm_sys::now_ns;

use super::Shape;
use crate::common::{read8, tag, write8, Rng, PAGE};

pub(super) struct Phase {
    pub(super) ns: u64,
    pub(super) touches: usize,
    pub(super) errors: usize,
    pub(super) swapouts: u64,
    pub(super) swapins: u64,
    pub(super) major_faults: u64,
    /// Pages reclaimed (written or not): usermm's evictions, the kernel's
    /// `pgsteal_anon`.
    pub(super) evictions: u64,
    /// usermm's faults on parked pages (its minor faults: the price of
    /// sampling references, `docs/design.md`); 0 for the kernel.
    pub(super) parked_faults: u64,
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating
/// billion-record synthetic databases"), θ < 1, over `0..n`, scrambled by a
/// multiplicative permutation so that the popular items are spread over the
/// range instead of packed at its start (YCSB's "scrambled zipfian").
struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    mult: u64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2.min(n));
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        // An odd multiplier coprime with n permutes 0..n.
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        let mut mult = (0x9E37_79B9 % n.max(2)) | 1;
        while gcd(mult, n) != 1 {
            mult += 2;
        }
        Zipf { n, theta, alpha, zetan, eta, mult }
    }
    fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_u64() as f64 / u64::MAX as f64;
        let uz = u * self.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            ((self.n as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        (rank.min(self.n - 1) as u128 * self.mult as u128 % self.n as u128) as u64
    }
}

/// Runs the phases on `buf` (in [`PHASES`](super::PHASES) order); `stats` gives
/// (swapouts, swapins, major faults, evictions, parked-page faults) so far; `after_hotcold` runs right
/// after the hot/cold phase (the hot set's probes).
pub(super) fn phases(
    buf: &mut [u8],
    stats: &dyn Fn() -> (u64, u64, u64, u64, u64),
    sh: Shape,
    after_hotcold: &mut dyn FnMut(&mut [u8]),
) -> Vec<Phase> {
    let pages = buf.len() / PAGE;
    let (hot_pages, hot_pct, mix) = (sh.hot_pages, sh.hot_pct, sh.mix);
    let phase = |buf: &mut [u8], f: &mut dyn FnMut(&mut [u8]) -> (usize, usize)| {
        let (o0, i0, f0, e0, m0) = stats();
        let t0 = now_ns();
        let (touches, errors) = f(buf);
        let ns = now_ns() - t0;
        let (o1, i1, f1, e1, m1) = stats();
        Phase {
            ns,
            touches,
            errors,
            swapouts: o1 - o0,
            swapins: i1 - i0,
            major_faults: f1 - f0,
            evictions: e1 - e0,
            parked_faults: m1 - m0,
        }
    };
    let read = |buf: &[u8], p: usize| (read8(buf, p * PAGE) != tag(p)) as usize;
    let mut out = Vec::new();
    out.push(phase(buf, &mut |buf| {
        for p in 0..pages {
            write8(buf, p * PAGE, tag(p));
        }
        (pages, 0)
    }));
    out.push(phase(buf, &mut |buf| ((pages), (0..pages).map(|p| read(buf, p)).sum())));
    let mut rng = Rng::new(sh.seed);
    let cold = (pages - hot_pages).max(1) as u64;
    out.push(phase(buf, &mut |buf| {
        let mut bad = 0;
        for _ in 0..mix {
            let p = if rng.below(100) < hot_pct {
                rng.below(hot_pages as u64) as usize
            } else {
                hot_pages + rng.below(cold) as usize
            };
            bad += read(buf, p);
        }
        (mix, bad)
    }));
    after_hotcold(buf);
    // Uniform random touches over the whole working set.
    out.push(phase(buf, &mut |buf| ((mix), (0..mix).map(|_| read(buf, rng.below(pages as u64) as usize)).sum())));
    // Zipfian (θ = 0.99, as YCSB), scrambled over the working set.
    let z = Zipf::new(pages as u64, 0.99);
    out.push(phase(buf, &mut |buf| ((mix), (0..mix).map(|_| read(buf, z.next(&mut rng) as usize)).sum())));
    // Scan resistance: one pass over the whole working set (4× the budget)
    // while the hot set keeps being touched, one hot touch per page
    // scanned.
    out.push(phase(buf, &mut |buf| {
        let mut bad = 0;
        for p in 0..pages {
            bad += read(buf, p);
            bad += read(buf, rng.below(hot_pages as u64) as usize);
        }
        (2 * pages, bad)
    }));
    // Fits: 90% of the budget touched at random, after one warm-up pass
    // (untimed): nothing should be evicted.
    let fits = (sh.budget_pages * 9 / 10).clamp(1, pages);
    for p in 0..fits {
        read(buf, p);
    }
    out.push(phase(buf, &mut |buf| {
        let n = 4 * fits;
        ((n), (0..n).map(|_| read(buf, rng.below(fits as u64) as usize)).sum())
    }));
    out
}

/// The hot set's hit rate: another `mix` hot/cold touches (continuing the
/// same sequence), untimed, each hot touch bracketed by `swapins()`: the
/// fraction of hot touches that caused no swap-in.
pub(super) fn hot_hit_rate(
    buf: &[u8],
    swapins: &dyn Fn() -> u64,
    hot_pages: usize,
    hot_pct: u64,
    mix: usize,
    seed: u64,
) -> (f64, usize) {
    let pages = buf.len() / PAGE;
    let cold = (pages - hot_pages).max(1) as u64;
    let mut rng = Rng::new(seed ^ 0x5EED);
    let (mut hot, mut missed, mut bad) = (0usize, 0u64, 0usize);
    for _ in 0..mix {
        if rng.below(100) < hot_pct {
            let p = rng.below(hot_pages as u64) as usize;
            let before = swapins();
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
            missed += swapins() - before;
            hot += 1;
        } else {
            let p = hot_pages + rng.below(cold) as usize;
            bad += (read8(buf, p * PAGE) != tag(p)) as usize;
        }
    }
    (1.0 - missed as f64 / hot.max(1) as f64, bad)
}
