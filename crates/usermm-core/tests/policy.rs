//! The replacement policy on access traces, with no kernel: a trace of page
//! touches is replayed against the core as the host presents it to usermm
//! (a touch of a page the core holds mapped is invisible — a hit; anything
//! else is a fault, served at once), with background reclaim run whenever
//! the core asks for it, as the executor's thread does. The misses are
//! compared with an exact LRU of the same capacity on the same trace.

mod common;

use usermm_core::page::PState;
use usermm_core::{Addr, Core, CoreConfig, FaultPlan, PageIdx, PageRange};

use common::{map_at, BASE};

/// A core with `budget` pages, swap for everything, and one read-write
/// anonymous region of `n` pages at page 0.
fn core_with(budget: u64, n: u64) -> Core {
    let mut c = Core::new(CoreConfig {
        base: BASE,
        reserve_pages: n + 64,
        page_shift: 12,
        budget_pages: budget,
        swap_slots: (n + budget) as u32,
        staging_slots: budget as u32,
        max_regions: 100,
        memlock_pages: u64::MAX,
        mlock_allowed: true,
        exact_faults: true,
    });
    map_at(&mut c, 0, n);
    c
}

/// Misses seen while replaying: touches that found the page out of memory
/// (swapped, or never touched: a major fault, unless read-around brought
/// it in) and touches that found it parked (a minor fault).
/// With a sampled core (`set_sampled_refs`), `soft` counts the touches of
/// zapped pages: the host's minor faults (about 1 µs), which usermm does
/// not see.
#[derive(Default, Debug, Clone, Copy)]
struct Misses {
    major: u64,
    minor: u64,
    soft: u64,
}

/// The host's side of a sampled core: the zapped pages touched since they
/// were zapped (mapped again by the host, as a reference scan finds them).
#[derive(Default)]
struct Host {
    sampled: bool,
    present: std::collections::HashSet<u64>,
}

impl Host {
    fn sampled() -> Host {
        Host { sampled: true, ..Host::default() }
    }
}

/// A core as [`core_with`] makes it, its anonymous region sampled by zap
/// and scan.
fn sampled_core_with(budget: u64, n: u64) -> Core {
    let mut c = core_with(budget, n);
    c.set_sampled_refs(true);
    c
}

/// Runs one reclaim plan with every step succeeding (with `host`'s view of
/// zapped pages: an eviction's scan finds the touched ones).
fn reclaim(c: &mut Core, host: &mut Host, want: u64) {
    let plan = c.reclaim_plan(want);
    for d in &plan.deactivate {
        c.deactivate_done(d, true);
        host.present.remove(&d.page.0);
    }
    for e in &plan.evict {
        if e.zapped && host.present.remove(&e.page.0) {
            c.evict_touched(e);
        } else {
            c.evict_done(e, true);
        }
    }
}

/// Replays `trace` (page indices); counts the misses of its part from
/// `measure_from` on.
fn replay(c: &mut Core, trace: &[u64], measure_from: usize) -> Misses {
    replay_rw(c, trace, measure_from, false)
}

/// `replay`, every touch a write if `write`.
fn replay_rw(c: &mut Core, trace: &[u64], measure_from: usize, write: bool) -> Misses {
    replay_host(c, &mut Host::default(), trace, measure_from, write)
}

/// `replay_rw` with `host`'s view of zapped pages (a sampled core's).
fn replay_host(c: &mut Core, host: &mut Host, trace: &[u64], measure_from: usize, write: bool) -> Misses {
    let budget = c.config().budget_pages;
    let low = (budget / 32).clamp(1, 4096);
    let mut m = Misses::default();
    for (i, &p) in trace.iter().enumerate() {
        let count = i >= measure_from;
        let zapped = host.sampled && c.page(PageIdx(p)).state == PState::Inactive;
        if count {
            match c.page(PageIdx(p)).state {
                PState::Resident => {}
                PState::Inactive if zapped => m.soft += u64::from(!host.present.contains(&p)),
                PState::Inactive => m.minor += 1,
                _ => m.major += 1,
            }
        }
        if zapped {
            // The host maps a zapped page back on its own.
            host.present.insert(p);
        }
        // A mapped page: the host reports nothing (a hit).
        while !zapped && c.page(PageIdx(p)).state != PState::Resident {
            let plan = c.fault(Addr(BASE + p * 4096), write);
            match plan {
                FaultPlan::Reclaim { want } => reclaim(c, host, want),
                FaultPlan::SwapIn { run, .. } | FaultPlan::ZeroFill { run } => c.fill_done(&plan, run.pages()),
                FaultPlan::Reactivate { .. } => c.fill_done(&plan, 1),
                other => panic!("unexpected plan {other:?}"),
            }
        }
        // The background thread: pressure's end once a run of parked
        // touches shows the working set in memory, reclaim ahead of the
        // program and aging.
        let mark = c.calm_mark();
        if c.calm_by_touches() && c.ease_if_calm(mark, low) {
            unpark_all(c);
            host.present.clear();
        }
        let want = c.reclaim_ahead_want(low, 2 * low);
        if want > 0 || c.needs_aging() {
            reclaim(c, host, want);
        }
    }
    c.validate();
    m
}

/// Maps every parked page back, as the executor does once pressure eased;
/// returns how many rounds of 64 it took.
fn unpark_all(c: &mut Core) -> u32 {
    let mut rounds = 0;
    loop {
        let plans = c.unpark_plan(64);
        if plans.is_empty() {
            return rounds;
        }
        let done: Vec<(FaultPlan, u64)> = plans.into_iter().map(|p| (p, 1)).collect();
        c.unpark_done(&done);
        rounds += 1;
    }
}

/// An exact LRU of `cap` pages on `trace`: its misses from `measure_from` on.
fn lru_misses(trace: &[u64], cap: usize, measure_from: usize) -> u64 {
    let mut last_use = std::collections::HashMap::new();
    let mut by_time = std::collections::BTreeMap::new();
    let mut misses = 0;
    for (t, &p) in trace.iter().enumerate() {
        match last_use.insert(p, t) {
            Some(old) => {
                by_time.remove(&old);
            }
            None => {
                misses += (t >= measure_from) as u64;
                if by_time.len() == cap {
                    let (_, victim) = by_time.pop_first().expect("full");
                    last_use.remove(&victim);
                }
            }
        }
        by_time.insert(t, p);
    }
    misses
}

use usermm_core::rng::Rng;

/// YCSB's scrambled zipfian over `0..n` (as the `reclaim` experiment's).
fn zipfian(n: u64, theta: f64, len: usize, rng: &mut Rng) -> Vec<u64> {
    let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
    let zetan = zeta(n);
    let alpha = 1.0 / (1.0 - theta);
    let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta(2) / zetan);
    let mult = (0x9E37_79B9 % n) | 1; // odd: coprime with a power of two
    (0..len)
        .map(|_| {
            let u = rng.next_u64() as f64 / u64::MAX as f64;
            let uz = u * zetan;
            let rank = if uz < 1.0 {
                0
            } else if uz < 1.0 + 0.5f64.powf(theta) {
                1
            } else {
                ((n as f64) * (eta * u - eta + 1.0).powf(alpha)) as u64
            };
            rank.min(n - 1) * mult % n
        })
        .collect()
}

/// The scan-resistance trace: a budget of 512 pages, a hot set of a tenth
/// of it touched three times, then a scan of 8× the budget with a hot touch
/// per page scanned. Returns `(budget, pages, hot pages, trace, where the
/// scan starts)`.
fn hot_set_and_scan() -> (u64, u64, u64, Vec<u64>, usize) {
    let (budget, n) = (512u64, 8 * 512 + 64);
    let hot = budget / 10;
    let mut rng = Rng::new(7);
    let mut trace: Vec<u64> = (0..3).flat_map(|_| 0..hot).collect();
    let warm = trace.len();
    for p in hot..n {
        trace.push(p);
        trace.push(rng.below(hot));
    }
    (budget, n, hot, trace, warm)
}

/// A hot set of a tenth of the budget survives a scan of 8× the budget,
/// touched once per page scanned (the `reclaim` experiment's scan
/// resistance). An exact LRU keeps nearly all of it (2 misses); usermm,
/// which learns of a hot page's use only when it touches it parked, loses
/// a hot page whose trip through the inactive list saw no touch of it:
/// 1.7% of the hot touches missed here (71 of 4,109), bounded at 3% below.
/// (Without the second chance of referenced pages, this test fails.)
#[test]
fn a_hot_set_survives_a_scan_eight_times_the_budget() {
    let (budget, n, hot, trace, warm) = hot_set_and_scan();
    let mut c = core_with(budget, n);
    let m = replay(&mut c, &trace, warm);
    let scanned = n - hot;
    // Every scanned page is a first touch; the hot set's touches hits, but
    // for a few.
    let hot_misses = m.major - scanned;
    assert!(m.major >= scanned, "{m:?}");
    assert!(hot_misses * 100 < 3 * scanned, "{hot_misses} of {scanned} hot touches missed: {m:?}");
    // (Each hot page's trip through the inactive list ends in a minor
    // fault: 250 here, 6% of the hot touches.)
    assert!(m.minor * 10 < scanned, "hot pages kept being parked: {m:?}");
    let lru_hot = lru_misses(&trace, budget as usize, warm) - scanned;
    assert!(lru_hot <= hot_misses && lru_hot * 100 < scanned, "exact LRU: {lru_hot} hot misses");
}

/// Sampled by zap and scan, the hot set survives the same scan better: 20
/// of its 4,109 touches missed (71 with faults alone), bounded at 1%
/// below, for 204 touches of zapped pages (host minor faults, where faults
/// alone took 250 of usermm's).
#[test]
fn a_sampled_hot_set_survives_a_scan_eight_times_the_budget() {
    let (budget, n, hot, trace, warm) = hot_set_and_scan();
    let mut c = sampled_core_with(budget, n);
    let mut host = Host::sampled();
    let m = replay_host(&mut c, &mut host, &trace, warm, false);
    let scanned = n - hot;
    let hot_misses = m.major - scanned;
    assert!(m.major >= scanned && m.minor == 0, "{m:?}");
    assert!(hot_misses * 100 < scanned, "{hot_misses} of {scanned} hot touches missed: {m:?}");
}

/// The control: a hot set not touched during the scan is evicted by it.
#[test]
fn a_hot_set_left_alone_during_a_scan_is_evicted() {
    let (budget, n) = (512u64, 8 * 512 + 64);
    let hot = budget / 10;
    let mut c = core_with(budget, n);
    let mut trace: Vec<u64> = (0..3).flat_map(|_| 0..hot).collect();
    trace.extend(hot..n);
    replay(&mut c, &trace, trace.len());
    let kept = (0..hot).filter(|&p| c.page(PageIdx(p)).state.holds_frame()).count();
    assert_eq!(kept, 0, "{}", common::draw_pages(&c, 0, hot));
}

/// A zipfian trace (`theta`, 4× the budget) replayed: usermm's misses,
/// which see no touch of a mapped page, and an exact LRU's, which sees
/// every touch, over the trace's second half; printed.
fn zipfian_against_lru(theta: f64) -> (u64, u64) {
    zipfian_against_lru_on(theta, Host::default()).0
}

/// [`zipfian_against_lru`] with `host` (sampled or not): also the misses.
fn zipfian_against_lru_on(theta: f64, mut host: Host) -> ((u64, u64), Misses) {
    let (budget, n) = (4096u64, 4 * 4096);
    let mut rng = Rng::new(11);
    let trace = zipfian(n, theta, 8 * n as usize, &mut rng);
    let from = trace.len() / 2;
    let mut c = if host.sampled { sampled_core_with(budget, n) } else { core_with(budget, n) };
    let m = replay_host(&mut c, &mut host, &trace, from, false);
    let lru = lru_misses(&trace, budget as usize, from);
    let measured = (trace.len() - from) as f64;
    println!(
        "zipfian θ={theta}, sampled {}: usermm {:.1}% misses ({:.2}× LRU's; {:.1}% minor faults, {:.1}% touches of zapped pages), exact LRU {:.1}%",
        host.sampled,
        100.0 * m.major as f64 / measured,
        m.major as f64 / lru as f64,
        100.0 * m.minor as f64 / measured,
        100.0 * m.soft as f64 / measured,
        100.0 * lru as f64 / measured
    );
    assert!(lru > 0 && m.major > 0);
    ((m.major, lru), m)
}

/// θ = 0.99 (YCSB's, the `reclaim` experiment's): usermm misses 20.1% of
/// the touches, LRU 19.6% (1.03×; with the referenced bit as the only
/// second chance, 1.06×; the kernel under the same limit, in the `reclaim`
/// experiment, misses 1.17× LRU's): bounded at 1.1× below. The issue's
/// goal, 0.9× LRU's misses, needs a reference bit.
#[test]
fn a_zipfian_trace_misses_close_to_an_exact_lru() {
    let (usermm, lru) = zipfian_against_lru(0.99);
    assert!(usermm * 10 <= lru * 11, "usermm {usermm} against LRU's {lru} misses");
}

/// Sampled by zap and scan, the same traces miss less than an exact LRU:
/// 0.92× its misses at θ 0.99, 0.93× at 0.8 (without the passes a touch
/// earns, `SAMPLED_TRIPS`, 1.00×; the goal is 0.9×), bounded at
/// 0.95× below, with no usermm fault but the misses: the reference bits
/// cost touches of zapped pages, the host's minor faults.
#[test]
fn a_sampled_zipfian_trace_misses_less_than_an_exact_lru() {
    for theta in [0.99, 0.8] {
        let ((usermm, lru), m) = zipfian_against_lru_on(theta, Host::sampled());
        assert!(usermm * 100 <= lru * 95, "θ={theta}: usermm {usermm} against LRU's {lru} misses");
        assert_eq!(m.minor, 0, "a fault on a zapped page: {m:?}");
        assert!(m.soft > 0, "nothing was zapped: {m:?}");
    }
}

/// Sampled: the pages a pass under pressure fills are zapped; an eviction
/// keeps the one the program touched since (found mapped: back on the
/// active list, nothing written) and writes the others to swap.
#[test]
fn an_eviction_keeps_a_zapped_page_touched_since() {
    let (budget, n) = (64u64, 256);
    let mut c = sampled_core_with(budget, n);
    let mut host = Host::sampled();
    replay_host(&mut c, &mut host, &(0..n).collect::<Vec<_>>(), usize::MAX, true);
    let zapped: Vec<u64> = (0..n).filter(|&p| c.page(PageIdx(p)).state == PState::Inactive).collect();
    assert!(zapped.len() >= 2 && host.present.is_empty(), "{zapped:?}");
    let (touched, untouched) = (zapped[0], zapped[1]);
    host.present.insert(touched);
    let before = c.stats().counters;
    reclaim(&mut c, &mut host, zapped.len() as u64);
    let after = c.stats().counters;
    assert_eq!(c.page(PageIdx(touched)).state, PState::Resident);
    assert_eq!(c.page(PageIdx(untouched)).state, PState::Swapped);
    assert_eq!(after.scan_hits - before.scan_hits, 1);
    assert_eq!(after.swapouts - before.swapouts, zapped.len() as u64 - 1);
    c.validate();
}

/// θ = 0.8, a flatter skew: usermm misses 38.5%, LRU 37.6% (1.02×),
/// bounded as above.
#[test]
fn a_flatter_zipfian_trace_misses_close_to_an_exact_lru() {
    let (usermm, lru) = zipfian_against_lru(0.8);
    assert!(usermm * 10 <= lru * 11, "usermm {usermm} against LRU's {lru} misses");
}

/// What [`experiment_phases`] measured in the `fits` phase.
struct Fits {
    misses: Misses,
    touches: u64,
    /// Evictions during the phase (after the warm-up).
    evictions: u64,
    /// Hot-set pages out of memory after the warm-up.
    hot_out: usize,
    /// Pages mapped back in bulk in the phases before (under pressure).
    unparked_before_fits: u64,
}

/// The `reclaim` experiment's phases at a quarter of its quick scale (a
/// budget of 4,096 pages, a working set of 4×), one after the other on one
/// core as the experiment runs them; prints each phase's misses per 1,000
/// touches and its estimated cost, at 70 µs a major fault and 20 µs a
/// minor one (this machine's, `docs/design.md`), and 1.5 µs a touch of a
/// zapped page (`host` sampled).
fn experiment_phases(mut host: Host) -> Fits {
    let (budget, n) = (4096u64, 4 * 4096);
    let hot = budget / 10;
    let mut c = if host.sampled { sampled_core_with(budget, n) } else { core_with(budget, n) };
    let mut rng = Rng::new(7);
    let mix = 2 * n as usize;
    // Pages mapped back in bulk by pressure's end (`calm_by_touches`)
    // during the phases before `fits`.
    let mut unparked_before_fits = 0;
    let mut phase = |name: &str, trace: Vec<u64>, write: bool, c: &mut Core, host: &mut Host| {
        let before = c.stats().counters.unparked;
        let m = replay_host(c, host, &trace, 0, write);
        let unparked = c.stats().counters.unparked - before;
        if name != "fits" {
            unparked_before_fits += unparked;
        }
        let k = 1000.0 / trace.len() as f64;
        println!(
            "{name:10} major/1k {:6.1} minor/1k {:6.1} zapped/1k {:6.1} cost/touch {:5.2} µs, {unparked} unparked",
            m.major as f64 * k,
            m.minor as f64 * k,
            m.soft as f64 * k,
            (m.major as f64 * 70.0 + m.minor as f64 * 20.0 + m.soft as f64 * 1.5) / trace.len() as f64
        );
        m
    };
    phase("seq-write", (0..n).collect(), true, &mut c, &mut host);
    phase("seq-read", (0..n).collect(), false, &mut c, &mut host);
    let hotcold =
        (0..mix).map(|_| if rng.below(100) < 90 { rng.below(hot) } else { hot + rng.below(n - hot) }).collect();
    phase("hotcold", hotcold, false, &mut c, &mut host);
    phase("uniform", (0..mix).map(|_| rng.below(n)).collect(), false, &mut c, &mut host);
    phase("zipfian", zipfian(n, 0.99, mix, &mut rng), false, &mut c, &mut host);
    phase("scan", (0..n).flat_map(|p| [p, rng.below(hot)]).collect(), false, &mut c, &mut host);
    // Fits: one pass over 90% of the budget (the hot set first: touched
    // while mapped, which usermm cannot see), then random touches of it.
    let fits = budget * 9 / 10;
    replay_host(&mut c, &mut host, &(0..fits).collect::<Vec<_>>(), usize::MAX, false);
    let hot_out = (0..hot).filter(|&p| !c.page(PageIdx(p)).state.holds_frame()).count();
    let before = c.stats().counters.evictions;
    let touches = 4 * fits;
    let misses = phase("fits", (0..touches).map(|_| rng.below(fits)).collect(), false, &mut c, &mut host);
    let evictions = c.stats().counters.evictions - before;
    println!("fits: {evictions} evictions after the warm-up, {hot_out} of {hot} hot pages out after it");
    Fits { misses, touches, evictions, hot_out, unparked_before_fits }
}

/// The `reclaim` experiment's `fits`, in its place after the other phases:
/// nothing may be evicted after the warm-up pass over a working set of 90%
/// of the budget. The hot set, touched parked all through the scan phase
/// and then once, mapped, by the warm-up, must outlive the scan's pages:
/// with the referenced bit as a page's only second chance
/// (`PROVEN_TRIPS` = 0) the warm-up evicted 212 of its 409 pages, and 258
/// pages were evicted after it; refilling the inactive list to its target
/// on any claim parked the working set again (153 minor faults per 1,000
/// touches; 57 with that bounded, and 2.2 now that a run of parked-page
/// touches with no claim ends the pressure at once, `calm_by_touches`,
/// which never fires in the phases under pressure before it). With proven
/// pages on one list with the rest, trips alone kept it, and 15 of its
/// pages were out after the warm-up (a touch of a mapped page is invisible
/// to usermm); on the proven list, which the warm-up's new pages pass by,
/// none.
#[test]
fn a_working_set_that_fits_is_not_evicted_after_warm_up() {
    let f = experiment_phases(Host::default());
    assert_eq!(f.evictions, 0, "{:?}", f.misses);
    assert_eq!(f.hot_out, 0, "hot pages out after the warm-up");
    assert!(f.misses.minor * 100 < f.touches, "the working set kept being parked: {:?}", f.misses);
    assert_eq!(f.unparked_before_fits, 0, "pressure ended in a phase under pressure");
}

/// The same, sampled by zap and scan: nothing is evicted after the
/// warm-up either, and the hot set stays (the pages zapped under
/// pressure cost the phase a host minor fault each when first touched).
#[test]
fn a_sampled_working_set_that_fits_is_not_evicted_after_warm_up() {
    let f = experiment_phases(Host::sampled());
    assert_eq!(f.evictions, 0, "{:?}", f.misses);
    assert_eq!(f.hot_out, 0, "hot pages out after the warm-up");
    assert_eq!((f.misses.major, f.misses.minor), (0, 0), "{:?}", f.misses);
}

/// [`experiment_phases`], for comparing policies:
/// `cargo test --release -p usermm-core --test policy -- --ignored --nocapture`.
#[test]
#[ignore]
fn policy_table() {
    experiment_phases(Host::default());
    println!("sampled by zap and scan:");
    experiment_phases(Host::sampled());
}

/// A core of 4,096 pages after pressure (4× the budget written) and a
/// warm-up read of a working set that fits (90% of the budget), with pages
/// parked: the core, the pages mapped, the working set's and the low
/// watermark.
fn pressure_then_fits() -> (Core, u64, u64, u64) {
    let (budget, n) = (4096u64, 4 * 4096);
    let mut c = core_with(budget, n);
    replay_rw(&mut c, &(0..n).collect::<Vec<_>>(), usize::MAX, true);
    let fits = budget * 9 / 10;
    replay(&mut c, &(0..fits).collect::<Vec<_>>(), usize::MAX);
    (c, n, fits, budget / 32)
}

/// Pressure's end (`core/unpark.rs`): after pressure and a warm-up of a
/// working set that fits, a calm stretch — the executor reads the same
/// calm mark a while apart — ends the pressure, every parked page goes back
/// in bulk (no fault, no use counted), and the working set then runs with
/// no fault at all; nothing is aged until the budget runs out again. A
/// claim in between keeps the pressure on.
#[test]
fn parked_pages_go_back_in_bulk_when_pressure_eases() {
    let (mut c, n, fits, low) = pressure_then_fits();
    let before = c.stats();
    assert!(before.inactive_pages > 0 && c.unpark_due(), "nothing parked: {before:?}");
    // A claim since the mark was read: not calm.
    let mark = c.calm_mark();
    replay(&mut c, &[n / 2], usize::MAX);
    assert!(!c.ease_if_calm(mark, low), "eased although a frame was claimed");
    // Calm: the same mark a while later.
    let parked = c.stats().inactive_pages;
    let mark = c.calm_mark();
    assert!(c.ease_if_calm(mark, low));
    let mut rounds = 0;
    loop {
        let plans = c.unpark_plan(64);
        if plans.is_empty() {
            break;
        }
        assert!(plans.iter().all(|p| matches!(p, FaultPlan::Reactivate { .. })));
        let done: Vec<(FaultPlan, u64)> = plans.into_iter().map(|p| (p, 1)).collect();
        c.unpark_done(&done);
        rounds += 1;
    }
    let after = c.stats();
    assert!(rounds > 0 && after.inactive_pages == 0, "{after:?}");
    assert_eq!(after.counters.unparked, parked);
    assert_eq!(after.counters.minor_faults, before.counters.minor_faults);
    assert!(!c.unpark_due() && !c.needs_aging());
    c.validate();
    let mut rng = Rng::new(3);
    let m = replay(&mut c, &(0..4 * fits).map(|_| rng.below(fits)).collect::<Vec<_>>(), 0);
    assert_eq!((m.major, m.minor), (0, 0), "faults in a working set that fits, after pressure ended");
    assert_eq!(c.stats().counters.evictions, after.counters.evictions);
    // Pressure again: reclaim parks and evicts as before.
    replay(&mut c, &(fits..n).collect::<Vec<_>>(), usize::MAX);
    let again = c.stats();
    assert!(again.counters.evictions > after.counters.evictions && again.inactive_pages > 0, "{again:?}");
    c.validate();
}

/// Pressure's end with a few pages of the working set still in swap: the
/// program touches ten parked pages per swapped one (the `reclaim`
/// experiment's `fits` after its warm-up: a quarter of the working set
/// parked, one page in 45 swapped). Its working set is in memory; those
/// swap-ins must not hold the pressure on while the parked pages are
/// touched one fault each. With every claim starting the count of parked
/// touches again, pressure never ended here (the executor: 737 parked-page
/// faults and 693 new deactivations in `fits`); with each frame claimed
/// cancelling four (`PARKED_TOUCHES_PER_CLAIM`), it ends after a few dozen.
#[test]
fn a_few_swapped_pages_do_not_hold_the_pressure_on() {
    let (mut c, n, _, _) = pressure_then_fits();
    let of = |c: &Core, st: PState| -> Vec<u64> { (0..n).filter(|&p| c.page(PageIdx(p)).state == st).collect() };
    let (parked, swapped) = (of(&c, PState::Inactive), of(&c, PState::Swapped));
    assert!(parked.len() >= 400 && swapped.len() >= 40 * 64, "{} parked, {} swapped", parked.len(), swapped.len());
    // Far apart, so that no swap-in reads around into the next one.
    let trace: Vec<u64> =
        (0..40).flat_map(|i| parked[i * 10..i * 10 + 10].iter().copied().chain([swapped[i * 64]])).collect();
    let before = c.stats().counters;
    let m = replay(&mut c, &trace, 0);
    let after = c.stats().counters;
    assert!(
        after.unparked > before.unparked,
        "pressure held on through {} parked-page faults ({} swap-ins)",
        m.minor,
        m.major
    );
    assert!(m.minor < 64, "pressure ended only after {} parked-page faults", m.minor);
}

/// Pressure's end during an explicit `MADV_PAGEOUT`: the pages the page-out
/// parked stay parked (`unpark_plan` skips them) until its `evict_range`
/// has evicted them, as Linux's drops them; the other parked pages go back.
/// Once `pageout_done`, nothing of the range is held back.
#[test]
fn pressure_ending_during_a_pageout_leaves_its_pages_to_it() {
    let (mut c, _, fits, low) = pressure_then_fits();
    let pages = |r: PageRange| (r.start.0..r.end.0).map(PageIdx);
    let resident = |c: &Core, r: PageRange| pages(r).filter(|&p| c.page(p).state == PState::Resident).count();
    // A range of mapped pages, paged out: parked first.
    let r =
        (0..fits - 64).map(|s| PageRange::new(s, s + 64)).find(|&r| resident(&c, r) == 64).expect("64 mapped pages");
    let ds = c.pageout_range(r);
    assert_eq!(ds.len(), 64);
    for d in &ds {
        c.deactivate_done(d, true);
    }
    // Pressure ends before the eviction: the others go back, not these.
    let mark = c.calm_mark();
    assert!(c.ease_if_calm(mark, low));
    let mut unparked = Vec::new();
    loop {
        let plans = c.unpark_plan(64);
        if plans.is_empty() {
            break;
        }
        unparked.extend(plans.iter().map(|p| match *p {
            FaultPlan::Reactivate { page, .. } => page,
            ref other => panic!("unexpected plan {other:?}"),
        }));
        let done: Vec<(FaultPlan, u64)> = plans.into_iter().map(|p| (p, 1)).collect();
        c.unpark_done(&done);
    }
    assert!(!unparked.is_empty(), "nothing else was parked");
    assert!(unparked.iter().all(|&p| !r.contains(p)), "pressure's end mapped back a page being paged out");
    assert!(pages(r).all(|p| c.page(p).state == PState::Inactive));
    let plan = c.evict_range(r, usize::MAX);
    assert_eq!(plan.evict.len(), 64);
    for e in &plan.evict {
        c.evict_done(e, true);
    }
    c.pageout_done(r);
    assert!(pages(r).all(|p| c.page(p).state == PState::Swapped));
    c.validate();
    // Once the page-out is over, a page of its range parked again goes back.
    let q = r.start;
    replay(&mut c, &[q.0], usize::MAX);
    let ds = c.deactivate_range(PageRange::new(q.0, q.0 + 1));
    assert_eq!(ds.len(), 1);
    c.deactivate_done(&ds[0], true);
    let plans = c.unpark_plan(64);
    assert!(plans.iter().any(|p| matches!(*p, FaultPlan::Reactivate { page, .. } if page == q)), "{plans:?}");
    let done: Vec<(FaultPlan, u64)> = plans.into_iter().map(|p| (p, 1)).collect();
    c.unpark_done(&done);
    c.validate();
}
