//! The seeded simulation of a space (see `usermm::sim`): the real core and
//! executor over a simulated host, many seeds, every byte checked.
//!
//! - `USERMM_SIM_SEED=<seed>`: run that seed alone (as a failure prints).
//! - `USERMM_SIM_SEEDS=<n>`: how many seeds (default 2,000 of 300 steps).
//! - `USERMM_SIM_FIRST=<seed>`: the first of them (default 0), to search
//!   further than the suite does (seed 14,739 once hung `mnovolatile`).

use usermm::sim;

#[test]
fn seeded_simulation_of_core_and_executor() {
    let parse = |s: &str| {
        let s = s.trim();
        s.strip_prefix("0x").map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
    };
    if let Some(seed) = std::env::var("USERMM_SIM_SEED").ok().and_then(|s| parse(&s)) {
        match sim::run(seed, 300) {
            Ok(s) => eprintln!("{s:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let seeds: u64 = std::env::var("USERMM_SIM_SEEDS").ok().and_then(|s| parse(&s)).unwrap_or(2_000);
    let mut total = sim::SimSummary::default();
    let first: u64 = std::env::var("USERMM_SIM_FIRST").ok().and_then(|s| parse(&s)).unwrap_or(0);
    for seed in first..first + seeds {
        match sim::run(seed, 300) {
            Ok(s) => {
                total.steps += s.steps;
                total.touches += s.touches;
                total.faults += s.faults;
                total.swapins += s.swapins;
                total.swapouts += s.swapouts;
                total.clean_evictions += s.clean_evictions;
                total.wp_faults += s.wp_faults;
                total.sigbus += s.sigbus;
                total.injected += s.injected;
                total.preemptions += s.preemptions;
                total.file_checks += s.file_checks;
                total.other_touches += s.other_touches;
                total.host_drops += s.host_drops;
                total.unparked += s.unparked;
                total.swap_ahead += s.swap_ahead;
            }
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("{seeds} seeds: {total:?}");
    // Every path is reached (a guard against a vacuous simulation).
    assert!(total.faults > seeds * 10 && total.swapins > seeds && total.swapouts > seeds, "{total:?}");
    // The swap cache is exercised: clean evictions, and writes that end a
    // swap copy.
    assert!(total.clean_evictions > seeds && total.wp_faults > seeds / 25, "{total:?}");
    assert!(total.sigbus > 0 && total.injected > seeds && total.preemptions > seeds, "{total:?}");
    assert!(total.file_checks > seeds && total.other_touches > seeds && total.host_drops > seeds / 2, "{total:?}");
    // Pressure's end: parked pages mapped back in bulk.
    assert!(total.unparked > seeds, "{total:?}");
    // Swap read-ahead of a stream, checked byte by byte like every fill.
    assert!(total.swap_ahead > 0, "{total:?}");
}

/// The simulation catches an executor bug: an eviction whose swap write
/// failed taken as done (`sim::Bug::LostSwapWrite`) must fail a seed within
/// the first 300.
#[test]
fn the_simulation_catches_an_injected_executor_bug() {
    let caught = (0..300u64).find_map(|seed| sim::run_with(seed, 300, Some(sim::Bug::LostSwapWrite)).err());
    let e = caught.expect("Bug::LostSwapWrite survived 300 seeds");
    eprintln!("caught: {}", e.lines().next().unwrap_or_default());
}
