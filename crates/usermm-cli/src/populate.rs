//! `populate` (seed 004): prefault a fresh region, host kernel vs usermm.
//!
//! For every size and kind (private anonymous, shared anonymous) and method:
//! - `read`: one 1-byte read per page (a user-mode load);
//! - `write`: one 1-byte write per page;
//! - `read-write`: one read and one write back of the same byte per page (the
//!   "don't overwrite existing data" prefault of QEMU and databases);
//! - `populate-read` / `populate-write`: one `madvise(MADV_POPULATE_*)` call
//!   over the region;
//! - `map-populate`: `mmap(MAP_POPULATE)` (the mmap call itself is timed).
//!
//! Every measurement maps a fresh region (on the usermm side in a fresh space
//! whose budget holds it, no swap), times only the prefault, verifies every
//! page untimed, and unmaps. The result is wall time per 4 KiB page; a row's
//! min is the fastest of its runs (what the seed reports), its value the
//! median.

use usermm::consts::{
    MADV_POPULATE_READ, MADV_POPULATE_WRITE, MAP_ANONYMOUS, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED, PROT_READ,
    PROT_WRITE,
};
use usermm::Space;
use usermm_sys::host::HostMap;
use usermm_sys::kernel::{peek, poke};
use usermm_sys::now_ns;

use crate::common::{config, systems, Progress, MIB, PAGE};
use crate::params::{Kind, Params};
use crate::report::{Experiment, Goal};

pub fn params(full: bool) -> Params {
    Params::default()
        .def(
            "sizes_mib",
            Kind::IntList,
            if full { "2,1024,4096" } else { "2,256" },
            "region sizes (MiB); goals use the largest, private",
        )
        .def("kinds", Kind::Text, "private,shared", "mapping kinds: private, shared (both anonymous)")
        .def("methods", Kind::Text, METHODS.join(","), "prefault methods (see the report's notes)")
        .def("runs", Kind::Int, if full { 10 } else { 5 }, "measured runs (fresh regions) per row")
        .def("warmup", Kind::Int, 1, "unmeasured warm-up runs before the measured ones")
}

const METHODS: [&str; 6] = ["read", "write", "read-write", "populate-read", "populate-write", "map-populate"];

/// The byte every page's first byte holds after `method` (fresh memory is 0;
/// only `write` stores something else).
fn expected(method: &str) -> u8 {
    u8::from(method == "write")
}

/// The timed loop over `pages` pages at `addr` (never a Rust reference).
fn touch_loop(addr: usize, pages: usize, method: &str) {
    match method {
        "read" => {
            let mut sum = 0u8;
            for p in 0..pages {
                sum = sum.wrapping_add(peek(addr + p * PAGE));
            }
            std::hint::black_box(sum);
        }
        "write" => {
            for p in 0..pages {
                poke(addr + p * PAGE, 1);
            }
        }
        _ => {
            for p in 0..pages {
                let a = addr + p * PAGE;
                poke(a, peek(a));
            }
        }
    }
}

/// Pages whose first byte is not what `method` leaves (untimed).
fn verify(addr: usize, pages: usize, method: &str) -> usize {
    let want = expected(method);
    (0..pages).filter(|&p| peek(addr + p * PAGE) != want).count()
}

fn advice(method: &str) -> i32 {
    if method == "populate-read" {
        MADV_POPULATE_READ
    } else {
        MADV_POPULATE_WRITE
    }
}

/// One measurement: `(ns, pages read back wrong)`.
fn kernel_one(size: usize, shared: bool, method: &str) -> Result<(u64, usize), String> {
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let mut m = if shared { HostMap::shared_anon(size, extra) } else { HostMap::anon(size, extra) }
        .map_err(|e| format!("kernel mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let ns = match method {
        "map-populate" => map_ns,
        "populate-read" | "populate-write" => {
            let t = now_ns();
            m.madvise(advice(method)).map_err(|e| format!("kernel madvise({method}): {e:?}"))?;
            now_ns() - t
        }
        _ => {
            let t = now_ns();
            touch_loop(m.addr(), pages, method);
            now_ns() - t
        }
    };
    let bad = verify(m.addr(), pages, method);
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok((ns, bad))
}

fn usermm_one(size: usize, shared: bool, method: &str) -> Result<(u64, usize), String> {
    let space = Space::open(&config(size + 64 * MIB, 0, None)).map_err(|e| format!("usermm open: {e:?}"))?;
    let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let a = space
        .mmap(0, size, PROT_READ | PROT_WRITE, kind | MAP_ANONYMOUS | extra, -1, 0)
        .map_err(|e| format!("usermm mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let ns = match method {
        "map-populate" => map_ns,
        "populate-read" | "populate-write" => {
            let t = now_ns();
            space.madvise(a, size, advice(method)).map_err(|e| format!("usermm madvise({method}): {e:?}"))?;
            now_ns() - t
        }
        _ => {
            let t = now_ns();
            touch_loop(a, pages, method);
            now_ns() - t
        }
    };
    let faults = space.stats().faults;
    let mut bad = verify(a, pages, method);
    if method != "read" && method != "write" && method != "read-write" && space.stats().faults != faults {
        // A prefault that left pages to fault in afterwards did not prefault.
        bad += (space.stats().faults - faults) as usize;
    }
    space.munmap(a, size).map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok((ns, bad))
}

/// Seed 004's numbers (fastest of 10, ms, anonymous 4 KiB pages), measured
/// on other hardware: `(size MiB, kind, method, ms)`.
const SEED: [(u64, &str, &str, f64); 20] = [
    (2, "private", "read", 0.119),
    (2, "private", "write", 0.222),
    (2, "private", "read-write", 0.380),
    (2, "private", "populate-read", 0.060),
    (2, "private", "populate-write", 0.158),
    (4096, "private", "read", 237.940),
    (4096, "private", "write", 708.409),
    (4096, "private", "read-write", 1054.041),
    (4096, "private", "populate-read", 124.310),
    (4096, "private", "populate-write", 572.582),
    (2, "shared", "read", 0.394),
    (2, "shared", "write", 0.348),
    (2, "shared", "read-write", 0.400),
    (2, "shared", "populate-read", 0.326),
    (2, "shared", "populate-write", 0.273),
    (4096, "shared", "read", 1053.090),
    (4096, "shared", "write", 913.642),
    (4096, "shared", "read-write", 1060.350),
    (4096, "shared", "populate-read", 893.691),
    (4096, "shared", "populate-write", 782.885),
];

/// The system name of the seed's reference rows (never used in a ratio).
pub const SEED_SYSTEM: &str = "seed004-other-hw";

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let sizes = p.list("sizes_mib");
    let runs = p.int("runs").max(1) as usize;
    let warmup = p.int("warmup") as usize;
    let split = |name: &str| -> Vec<String> { p.text(name).split(',').map(|s| s.trim().to_string()).collect() };
    let kinds = split("kinds");
    let methods = split("methods");
    if let Some(k) = kinds.iter().find(|k| *k != "private" && *k != "shared") {
        return Err(format!("populate: unknown kind '{k}' (private, shared)"));
    }
    if let Some(m) = methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
        return Err(format!("populate: unknown method '{m}' ({})", METHODS.join(", ")));
    }
    if sizes.contains(&0) {
        return Err("populate: sizes must be ≥ 1 MiB".into());
    }
    let mut e = Experiment::new("populate", "seed 004: prefault a fresh region (ns per 4 KiB page)", p.pairs());
    let variant = |size: u64, kind: &str, method: &str| format!("{size}MiB-{kind}-{method}");
    let mut errors = Vec::new();
    for r in 0..warmup + runs {
        let measured = r >= warmup;
        let which =
            if measured { format!("run {}/{runs}", r - warmup + 1) } else { format!("warm-up {}/{warmup}", r + 1) };
        for &size in &sizes {
            prog.say(&format!("{size} MiB, {which}"));
            for kind in &kinds {
                for method in &methods {
                    for sys in systems(r) {
                        let bytes = size as usize * MIB;
                        let shared = kind == "shared";
                        let (ns, bad) = if sys == "kernel" {
                            kernel_one(bytes, shared, method)?
                        } else {
                            usermm_one(bytes, shared, method)?
                        };
                        let v = variant(size, kind, method);
                        if bad > 0 {
                            let msg = format!("{sys} {v}: {bad} pages wrong or not prefaulted");
                            prog.say(&format!("ERROR: {msg}"));
                            errors.push(msg);
                        }
                        if measured {
                            e.add(sys, &v, "ns_per_page", "ns", ns as f64 / (bytes / PAGE) as f64);
                        }
                    }
                }
            }
        }
    }
    for (size, kind, method, ms) in SEED {
        if kinds.iter().any(|k| k == kind) && methods.iter().any(|m| m == method) {
            let pages = (size as usize * MIB / PAGE) as f64;
            e.add(SEED_SYSTEM, &variant(size, kind, method), "ns_per_page_fastest", "ns", ms * 1e6 / pages);
        }
    }
    let large = sizes.iter().copied().max().unwrap_or(0);
    if kinds.iter().any(|k| k == "private") {
        for m in ["populate-write", "populate-read"] {
            if methods.iter().any(|x| x == m) {
                let what = format!("MADV_{} {large} MiB private", m.to_uppercase().replace('-', "_"));
                e.ratio_goal(&what, &variant(large, "private", m), "ns_per_page", false, 1.5, 1.0);
            }
        }
        if methods.iter().any(|x| x == "write") && methods.iter().any(|x| x == "populate-write") {
            let w = e.med("usermm", &variant(large, "private", "write"), "ns_per_page");
            let pw = e.med("usermm", &variant(large, "private", "populate-write"), "ns_per_page");
            let kw = e.med("kernel", &variant(large, "private", "write"), "ns_per_page");
            let kpw = e.med("kernel", &variant(large, "private", "populate-write"), "ns_per_page");
            e.notes.push(format!(
                "For context on the last goal: the same ratio on the host kernel in this run (write loop / \
                 POPULATE_WRITE, {large} MiB private, medians) is {}×; usermm's write loop is already cheap because \
                 one usermm fault maps a batch of pages (see `fault`), so POPULATE_WRITE has little left to save.",
                crate::report::fmt_num(kw / kpw)
            ));
            e.goals.push(Goal {
                what: format!("usermm POPULATE_WRITE vs its own write loop, {large} MiB private"),
                how: "usermm write ns/page / usermm populate-write ns/page".into(),
                value: w / pw,
                unit: "×".into(),
                at_least: true,
                threshold: 3.0,
                goal: 3.0,
            });
        }
    }
    e.notes.push(format!(
        "Sizes {} MiB{}; kinds: private = `MAP_PRIVATE|MAP_ANONYMOUS`, shared = `MAP_SHARED|MAP_ANONYMOUS`. Every \
         measurement maps a fresh region; usermm: a fresh space per measurement (`Space::mmap`), budget = size + 64 MiB, \
         no swap. Methods: `read` one 1-byte load per page, `write` one 1-byte store per page, `read-write` a load and a \
         store back of the same byte, `populate-read`/`populate-write` one `madvise(MADV_POPULATE_READ/WRITE)` over \
         the region, `map-populate` the `mmap(MAP_POPULATE)` call itself. Only the prefault is timed; afterwards every \
         page is verified (untimed; for usermm's prefault methods, no usermm fault may happen while verifying). \
         `ns_per_page` is wall time / (size / 4 KiB): the value is the median of {runs} fresh regions, the min column the \
         fastest (the seed's statistic), after {warmup} warm-up run(s).",
        sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        if sizes.iter().all(|&s| s < 1024) {
            " (quick scale: 1 GiB is too slow for this mode's runs on 2 vCPUs; `--full` or `--sizes-mib` adds it)"
        } else {
            ""
        },
    ));
    e.notes.push(format!(
        "Rows `{SEED_SYSTEM}` are seed 004's published numbers (fastest of 10, converted from ms to ns per 4 KiB page), \
         measured on other hardware with an older kernel: for reference only, never in a ratio. The seed has no \
         `MAP_POPULATE` and no 1 GiB row. KERNEL-FACTS records this host kernel at 1 GiB private (fastest ns/page): \
         read loop 886, write loop 2022, read+write 3323, POPULATE_READ 575, POPULATE_WRITE 1487, MAP_POPULATE 1494."
    ));
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    Ok(e)
}
