//! A seeded simulation of a space: the real core and the real executor
//! over a simulated platform — memory as byte arrays, the program's faults
//! served by calling the executor's fault handler in the faulting "thread",
//! signals recorded — driven by a program of random calls and touches, with
//! the background thread's work run as steps between them, and checked
//! against a model of every page's bytes after each step. One seed is one
//! run; a failure says `reproduce with USERMM_SIM_SEED=…`.
//!
//! The platform injects what the host can do to the executor, from the
//! seed: swap reads and writes that fail (`EIO`), fills and moves that stop
//! short (a prefix installed), moves that are refused (the executor falls
//! back to copies). Shared file regions map real (unlinked) temporary
//! files, read and written by the simulated host: after `msync`, `munmap`
//! or a `MAP_FIXED` replacement each file holds the last bytes written to
//! its pages. The scheduler interleaves whole steps (a call, a touch, a
//! background round) and, at preemption points inside a step (a platform
//! call), a background reclaim round or a second program thread's touch
//! (see `threads::OtherThread`). The host's own lazy free drops clean lazily
//! freed pages and slots by itself (see `lazy::HostLazy`).
//!
//! Built with the `test-hooks` feature (usermm's own tests).

mod calls;
mod files;
mod host;
mod lazy;
mod staging;
mod threads;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use host::{Host, Shared, SimPlatform};
use threads::{OtherThread, OTHER_TID, TID};
use usermm_core::consts::*;
use usermm_core::page::PState;

use crate::native::Inner;
use crate::Config;

const PS: usize = 4096;
/// The simulated reservation's address: never dereferenced.
const BASE: usize = 0x6000_0000_0000;
/// Pages of the reservation the program uses.
const PAGES: usize = 96;

/// The simulation's only source of choices.
use usermm_core::rng::Rng;

/// The model of one page: what Linux would give the program.
#[derive(Clone, Copy, Debug)]
struct Model {
    prot: i32,
    /// 0: private; else the shared mapping's identity.
    object: u64,
    locked: bool,
    /// The last stamp written (0: zeros).
    stamp: u64,
    /// Lazily freed (`MADV_FREE`) and not written since: reads the stamp or
    /// zeros.
    lazy: bool,
    /// Volatile (`mvolatile`): may be purged; a touch of a purged page is
    /// SIGBUS until `mnovolatile`.
    volatile: bool,
    /// Seen purged (a touch raised SIGBUS) since it became volatile.
    purged: bool,
    /// Locked and touched since (or present when locked): it must stay in
    /// memory until unlocked.
    pinned: bool,
    /// A shared file region's page: the file's id and the page's index in
    /// it.
    file: Option<(u64, u64)>,
}

impl Model {
    fn new(prot: i32, object: u64) -> Model {
        Model {
            prot,
            object,
            locked: false,
            stamp: 0,
            lazy: false,
            volatile: false,
            purged: false,
            pinned: false,
            file: None,
        }
    }
}

/// What a run did (a guard against a vacuous simulation).
#[derive(Clone, Debug, Default)]
pub struct SimSummary {
    /// The run's configuration, drawn from its seed.
    pub what: String,
    pub steps: u64,
    pub touches: u64,
    pub faults: u64,
    pub swapins: u64,
    pub swapouts: u64,
    /// Evictions that wrote nothing (the page's swap copy was exact).
    pub clean_evictions: u64,
    /// Writes to write-protected pages (WP faults).
    pub wp_faults: u64,
    pub sigbus: u64,
    pub injected: u64,
    /// Background rounds run at a preemption point inside another step.
    pub preemptions: u64,
    /// File pages checked in their files (after msync, munmap, replacement).
    pub file_checks: u64,
    /// Touches by the second program thread, at preemption points.
    pub other_touches: u64,
    /// Lazily freed pages and slots the host dropped by itself.
    pub host_drops: u64,
    /// Parked pages mapped back in bulk when pressure eased.
    pub unparked: u64,
    /// Pages read ahead of a stream of swap faults.
    pub swap_ahead: u64,
}

struct Sim {
    inner: Arc<Inner>,
    plat: Arc<SimPlatform>,
    rng: Rng,
    model: Vec<Option<Model>>,
    next_stamp: u64,
    next_object: u64,
    /// The files of shared file regions, by id (one file per `mmap`).
    files: HashMap<u64, std::fs::File>,
    log: Vec<String>,
    sum: SimSummary,
}

/// The outcome of a touch.
#[derive(Debug, PartialEq, Eq)]
enum Touch {
    /// The bytes read (a read) or written over (a write).
    Done(u64, u64),
    Segv,
    /// SIGBUS raised by the host at a poison marker (a purged page).
    Bus,
    /// SIGBUS queued by the executor (a swap read error, out of memory).
    BusQueued,
}

impl Sim {
    fn addr(p: usize) -> usize {
        BASE + p * PS
    }

    /// The program touches page `p` (reads its two stamp words, or writes
    /// `stamp` to them), faulting into the executor as the kernel would.
    fn touch(&mut self, p: usize, write: Option<u64>) -> Touch {
        self.set_busy(p, 1);
        self.plat.touch(&self.inner, p, write, TID, true).expect("a waiting touch always ends")
    }

    /// The pages the step in progress works on (the second thread keeps out).
    fn set_busy(&self, start: usize, len: usize) {
        self.plat.other.lock().unwrap_or_else(|e| e.into_inner()).busy = (start, start + len);
    }

    /// The pages the second thread wrote during the step so far.
    fn other_writes(&self) -> Vec<usize> {
        let o = self.plat.other.lock().unwrap_or_else(|e| e.into_inner());
        o.touches.iter().filter(|t| t.1.is_some()).map(|t| t.0).collect()
    }

    /// Checks the second thread's touches made during the last step.
    fn check_other_touches(&mut self) {
        let touches = std::mem::take(&mut self.plat.other.lock().unwrap_or_else(|e| e.into_inner()).touches);
        for (p, stamp, got) in touches {
            self.sum.other_touches += 1;
            self.log.push(format!("  (thread {OTHER_TID} touched p{p} write {})", stamp.is_some()));
            self.check_touch(p, stamp, got);
        }
    }

    /// A random range for a call, which the second thread keeps out of
    /// until the step ends.
    fn random_range(&mut self) -> (usize, usize) {
        let start = self.rng.below(PAGES as u64) as usize;
        let long = self.rng.one_in(4);
        let len = 1 + self.rng.below(if long { 32 } else { 8 }) as usize;
        let len = len.min(PAGES - start);
        self.set_busy(start, len);
        (start, len)
    }

    fn step(&mut self) {
        self.sum.steps += 1;
        // (No page is the step's until it says which: a background round
        // works on none.)
        self.set_busy(0, 0);
        match self.rng.below(25) {
            0..=2 => self.op_mmap(),
            3 => self.op_munmap(),
            4 => self.op_mprotect(),
            5..=7 => self.op_madvise(),
            8 => self.op_lock(),
            9..=10 => {
                self.log.push("background step".into());
                self.inner.background_step();
            }
            11 => self.op_mvolatile(),
            12 => self.op_mnovolatile(),
            13 => self.op_msync(),
            _ => {
                let p = self.rng.below(PAGES as u64) as usize;
                let write = self.rng.one_in(2);
                self.touch_checked(p, write);
                if !write && self.rng.one_in(4) {
                    // Read, then write the same page: a page a read swapped
                    // in carries its swap copy, and this write must end it
                    // (a WP fault) before it lands.
                    self.touch_checked(p, true);
                }
            }
        }
        self.check_other_touches();
        self.inner.validate_core();
        // Locked pages that were touched never leave memory.
        for (q, m) in self.model.iter().enumerate() {
            if m.is_some_and(|m| m.pinned) {
                let st = self.inner.page_state(Self::addr(q));
                assert!(matches!(st, PState::Resident | PState::Inactive), "p{q}: locked and touched, but {st:?}");
            }
        }
    }

    /// A touch, checked against the model.
    fn touch_checked(&mut self, p: usize, write: bool) {
        self.sum.touches += 1;
        let stamp = if write {
            self.next_stamp += 1;
            Some(self.next_stamp)
        } else {
            None
        };
        self.log.push(format!("touch p{p} write {write}"));
        let got = self.touch(p, stamp);
        self.check_touch(p, stamp, got);
    }

    /// Checks what a touch of page `p` (writing `stamp`, if any) saw
    /// against the model, and updates the model.
    fn check_touch(&mut self, p: usize, stamp: Option<u64>, got: Touch) {
        let write = stamp.is_some();
        let m = self.model[p];
        let allowed =
            m.is_some_and(|m| if write { m.prot & PROT_WRITE != 0 } else { m.prot & (PROT_READ | PROT_WRITE) != 0 });
        match got {
            Touch::Done(a, b) => {
                let m = m.unwrap_or_else(|| panic!("p{p}: touch of an unmapped page succeeded"));
                assert!(allowed, "p{p}: touch with prot {} succeeded", m.prot);
                assert!(!m.purged, "p{p}: a purged volatile page was read");
                let lazy_zero = m.lazy && (a, b) == (0, 0);
                assert!(
                    (a, b) == (m.stamp, m.stamp) || lazy_zero,
                    "p{p}: read stamps {a}/{b}, the model says {}{}",
                    m.stamp,
                    if m.lazy { " or zeros" } else { "" }
                );
                // (Shared anonymous pages are one page per address here:
                // each mapping is its own object.)
                let mm = self.model[p].as_mut().unwrap();
                if lazy_zero {
                    mm.stamp = 0;
                    mm.lazy = false;
                }
                if let Some(s) = stamp {
                    mm.stamp = s;
                    mm.lazy = false;
                }
                if mm.locked {
                    mm.pinned = true;
                }
            }
            Touch::Segv => assert!(!allowed, "p{p}: SIGSEGV on an allowed touch"),
            // A purged volatile page: its data is gone.
            Touch::Bus => {
                assert!(allowed, "p{p}: SIGBUS on a touch that should SIGSEGV");
                let mm = self.model[p].as_mut().unwrap();
                assert!(mm.volatile, "p{p}: a poison marker on a page that is not volatile");
                mm.purged = true;
                self.sum.sigbus += 1;
            }
            // Out of memory (all resident locked) or an injected swap read
            // error: the data stays as it was.
            Touch::BusQueued => {
                assert!(allowed, "p{p}: SIGBUS on a touch that should SIGSEGV");
                self.sum.sigbus += 1;
            }
        }
    }
}

/// Runs one seeded simulation of `steps` steps; `Err` says what failed, the
/// steps before it and how to reproduce it.
pub fn run(seed: u64, steps: usize) -> Result<SimSummary, String> {
    run_with(seed, steps, None)
}

/// Bugs the simulation must catch, injected into the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// An eviction whose swap write failed is taken as done: the page's
    /// data is lost (it reads back whatever the swap slot held).
    LostSwapWrite,
}

/// `run` with an executor bug injected.
pub fn run_with(seed: u64, steps: usize, bug: Option<Bug>) -> Result<SimSummary, String> {
    let mut rng = Rng::new(seed);
    let budget_pages = [8usize, 16, 32][rng.below(3) as usize];
    // Swap: none now and then (anonymous memory is then unevictable, and
    // faults past the budget are out of memory), else some or plenty.
    let swap_pages = if rng.one_in(6) { 0 } else { [32usize, 256][rng.below(2) as usize] };
    let fail_one_in = [0u64, 16, 64][rng.below(3) as usize];
    let can_move = !rng.one_in(4);
    let exact = rng.one_in(2);
    let cfg = Config {
        budget_bytes: budget_pages * PS,
        swap_bytes: swap_pages * PS,
        reserve_bytes: PAGES * PS,
        flags: if exact { UMM_F_EXACT_FAULTS } else { 0 },
        ..Config::default()
    };
    let preempt_one_in = [0u64, 4, 16][rng.below(3) as usize];
    let plat = sim_platform(seed, preempt_one_in, fail_one_in, can_move, swap_pages > 0);
    let lazy = host_lazy(seed);
    let what = format!(
        "seed {seed:#x} (budget {budget_pages}, swap {swap_pages}, fail 1/{fail_one_in}, move {can_move}, exact {exact}, preempt 1/{preempt_one_in}, host lazy free {} 1/{})",
        lazy.on, lazy.drop_one_in
    );
    let inner = Inner::build(&cfg, Box::new(Shared(plat.clone())), false, None).map_err(|e| format!("{what}: {e}"))?;
    inner.set_oom_wait_us(0);
    inner.set_store_backoff_first_ns(0);
    inner.set_tracks_signals(false);
    let _ = plat.inner.set(Arc::downgrade(&inner));
    if bug == Some(Bug::LostSwapWrite) {
        inner.set_sim_bug(crate::native::SIM_BUG_LOST_SWAP_WRITE);
    }
    let mut sim = Sim {
        inner,
        plat,
        rng,
        model: vec![None; PAGES],
        next_stamp: 0,
        next_object: 0,
        files: HashMap::new(),
        log: Vec::new(),
        sum: SimSummary::default(),
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            sim.step();
        }
        // Every page, read back at the end, and every file page in its
        // file after an msync of the whole range.
        for p in 0..PAGES {
            sim.touch_checked(p, false);
            sim.check_other_touches();
        }
        sim.set_busy(0, PAGES);
        let _ = sim.inner.msync(BASE, PAGES * PS, MS_SYNC);
        let all = sim.file_pages(0, PAGES);
        sim.check_files(&all, "final msync");
    }));
    let c = sim.inner.core_counters();
    sim.sum.swapins = c.swapins;
    sim.sum.swapouts = c.swapouts;
    sim.sum.clean_evictions = c.clean_evictions;
    sim.sum.unparked = c.unparked;
    sim.sum.swap_ahead = c.swap_ahead;
    sim.sum.wp_faults = sim.plat.wp_faults.load(std::sync::atomic::Ordering::Relaxed);
    sim.sum.injected = sim.plat.host().injected;
    sim.sum.host_drops = sim.plat.host().lazy.drops;
    sim.sum.preemptions = sim.plat.preemptions.load(std::sync::atomic::Ordering::Relaxed);
    sim.sum.faults = sim.plat.faults.load(std::sync::atomic::Ordering::Relaxed);
    sim.sum.what = what.clone();
    match r {
        Ok(()) => Ok(sim.sum),
        Err(e) => Err(failure_report(&what, seed, &sim.log, e.as_ref())),
    }
}

/// The simulated host of one run, its random choices made: preemption
/// and failure rates, whether frames can move, whether there is swap.
fn sim_platform(seed: u64, preempt_one_in: u64, fail_one_in: u64, can_move: bool, has_swap: bool) -> Arc<SimPlatform> {
    Arc::new(SimPlatform {
        inner: std::sync::OnceLock::new(),
        preempt_one_in,
        preempting: std::sync::atomic::AtomicBool::new(false),
        preemptions: std::sync::atomic::AtomicU64::new(0),
        other: Mutex::new(OtherThread {
            rng: Rng::new(seed ^ 0x0707),
            one_in: [0u64, 4, 16][Rng::new(seed ^ 0x7070).below(3) as usize],
            busy: (0, 0),
            touches: Vec::new(),
            next_stamp: 1 << 40,
        }),
        faults: std::sync::atomic::AtomicU64::new(0),
        wp_faults: std::sync::atomic::AtomicU64::new(0),
        host: Mutex::new(Host {
            prog: HashMap::new(),
            prot: HashMap::new(),
            staging: HashMap::new(),
            swap: HashMap::new(),
            signals: Vec::new(),
            in_thread: None,
            rng: Rng::new(seed ^ 0x5151),
            fail_one_in,
            can_move,
            // Write tracking (the swap cache) on for three seeds in four.
            tracks_writes: !Rng::new(seed ^ 0x3a3a).one_in(4),
            wp: std::collections::HashSet::new(),
            has_swap,
            // The store gives freed slots back for two seeds in three.
            release_granule: [0, 1, 4][Rng::new(seed ^ 0x2e1e).below(3) as usize],
            injected: 0,
            lazy: host_lazy(seed),
        }),
    })
}

/// The host's own lazy free for a run: on for half the seeds, dropping a
/// page or slot at every, 1 in 4 or 1 in 16 preemption points.
fn host_lazy(seed: u64) -> lazy::HostLazy {
    let mut r = Rng::new(seed ^ 0x1a2e);
    lazy::HostLazy { on: r.one_in(2), drop_one_in: [1u64, 4, 16][r.below(3) as usize], ..Default::default() }
}

/// What a failed run reports: the panic's message, the step, how to
/// reproduce it, and the last steps of `log`.
fn failure_report(what: &str, seed: u64, log: &[String], e: &(dyn std::any::Any + Send)) -> String {
    let msg = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    let tail = log.len().saturating_sub(30);
    format!(
        "{what}: step {}: {msg}\nreproduce with USERMM_SIM_SEED={seed:#x}\nlast steps:\n  {}",
        log.len(),
        log[tail..].join("\n  ")
    )
}
