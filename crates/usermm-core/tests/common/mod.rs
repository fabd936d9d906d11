//! Shared helpers for the core's integration tests: a configuration, an
//! ASCII drawing of the address space, and a synchronous executor that
//! resolves every plan at once (single-threaded, so no page is ever left
//! busy between calls).

#![allow(dead_code)]

use usermm_core::consts::*;
use usermm_core::page::PState;
use usermm_core::{Addr, AdviceOp, Core, CoreConfig, Errno, FaultPlan, MmapReply, PageIdx, PageRange};

pub const BASE: u64 = 0x10_0000_0000;
pub const PS: u64 = 4096;

/// The configuration of the brief: 1024 pages reserved, a budget of 16.
pub fn cfg() -> CoreConfig {
    CoreConfig {
        base: BASE,
        reserve_pages: 1024,
        page_shift: 12,
        budget_pages: 16,
        swap_slots: 64,
        staging_slots: 16,
        max_regions: 100,
        memlock_pages: u64::MAX,
        mlock_allowed: true,
        exact_faults: true,
    }
}

pub fn core() -> Core {
    Core::new(cfg())
}

/// The address of page `p` of the reservation.
pub fn at(p: u64) -> u64 {
    BASE + p * PS
}

/// `n` pages, in bytes.
pub fn pages(n: u64) -> u64 {
    n * PS
}

pub const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
pub const RW: i32 = PROT_READ | PROT_WRITE;

/// One character per page of `[from, to)`: `.` for unmapped, a letter per
/// region (`A`, `B`, … in address order, counting from the first region drawn).
pub fn draw(c: &Core, from: u64, to: u64) -> String {
    let mut s = String::new();
    let mut letter = b'A';
    let mut last: Option<u64> = None;
    for p in from..to {
        match c.regions().find(PageIdx(p)) {
            Some(r) => {
                if let Some(prev) = last {
                    if prev != r.range().start.0 {
                        letter += 1;
                    }
                }
                last = Some(r.range().start.0);
                s.push(letter as char);
            }
            None => s.push('.'),
        }
    }
    s
}

/// One character per page of `[from, to)` for its state: `.` unmapped (and
/// no page metadata), `_` absent, `R` resident, `I` inactive, `S` swapped,
/// `*` busy.
pub fn draw_pages(c: &Core, from: u64, to: u64) -> String {
    (from..to)
        .map(|p| {
            let mapped = c.regions().find(PageIdx(p)).is_some();
            match c.page(PageIdx(p)).state {
                PState::Absent if !mapped => '.',
                PState::Absent => '_',
                PState::Resident => 'R',
                PState::Inactive => 'I',
                PState::Swapped => 'S',
                _ => '*',
            }
        })
        .collect()
}

/// `mmap` carried out: a `MAP_FIXED` replacement is zapped and released.
pub fn mmap(c: &mut Core, addr: u64, len: u64, prot: i32, flags: i32) -> Result<u64, Errno> {
    match c.mmap(addr, len, prot, flags)? {
        MmapReply::Done(plan) => {
            if let Some(d) = &plan.replaced {
                for r in &d.ranges {
                    zap(c, *r);
                }
                c.unhold(d);
            }
            c.validate();
            Ok(c.addr_of(plan.range.start).0)
        }
        MmapReply::Busy => panic!("mmap: nothing is being unmapped in a synchronous test"),
    }
}

/// Maps `n` read-write private pages at page `p` (MAP_FIXED).
pub fn map_at(c: &mut Core, p: u64, n: u64) {
    let a = mmap(c, at(p), pages(n), RW, ANON | MAP_FIXED).expect("map_at");
    assert_eq!(a, at(p));
}

/// Drops the pages of `r` (zap_begin / zap_end).
pub fn zap(c: &mut Core, r: PageRange) {
    let claim = c.zap_begin(r).expect("no busy page in a synchronous test");
    c.zap_end(&claim);
}

/// `munmap` carried out in its three phases.
pub fn munmap(c: &mut Core, addr: u64, len: u64) -> Result<(), Errno> {
    if let Some(d) = c.munmap(addr, len)? {
        c.validate();
        for r in &d.ranges {
            zap(c, *r);
        }
        c.unhold(&d);
    }
    c.validate();
    Ok(())
}

/// `mprotect`; returns the call's result (the segments are the executor's).
pub fn mprotect(c: &mut Core, addr: u64, len: u64, prot: i32) -> Result<(), Errno> {
    let (_, r) = c.mprotect(addr, len, prot);
    c.validate();
    r
}

/// `madvise` carried out: every op is executed, all actions succeed.
pub fn madvise(c: &mut Core, addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
    let (ops, res) = c.madvise(addr, len, advice);
    for op in ops {
        match op {
            AdviceOp::Zap(r) | AdviceOp::PunchZap { range: r, .. } => zap(c, r),
            // Host-only advice changes no page state.
            AdviceOp::Host(..) => {}
            AdviceOp::Cold(r) => {
                for d in c.deactivate_range(r) {
                    c.deactivate_done(&d, true);
                }
            }
            AdviceOp::Pageout(r) => {
                for d in c.pageout_range(r) {
                    c.deactivate_done(&d, true);
                }
                // Linux reclaims every page of the range, including those
                // that were already inactive (as the executor: one plan;
                // lazily freed pages are clean here, and discarded).
                let plan = c.evict_range(r, usize::MAX);
                for e in &plan.evict {
                    c.evict_done(e, true);
                }
                for d in &plan.discard {
                    c.discard_done(d, true, false);
                }
                assert!(plan.writeback.is_empty(), "no file regions here");
                c.pageout_done(r);
            }
            AdviceOp::Poison(r) => {
                zap(c, r);
                c.set_poison(r);
            }
            AdviceOp::Free(r) => {
                c.lazyfree(r);
            }
            AdviceOp::WritebackZap(r) => zap(c, r),
            AdviceOp::WillNeed(r) => {
                for p in c.swapped_in(r) {
                    touch(c, p.0, false);
                }
            }
        }
        c.validate();
    }
    c.validate();
    res
}

/// Executes one reclaim plan of `want` frames with every action succeeding.
/// Returns (deactivated, evicted) pages.
pub fn reclaim(c: &mut Core, want: u64) -> (Vec<PageIdx>, Vec<PageIdx>) {
    // No validate() between the plan and its done calls: it miscounts an
    // eviction in flight (see `pages::validate_accepts_an_eviction_in_flight`).
    let plan = c.reclaim_plan(want);
    for d in &plan.deactivate {
        c.deactivate_done(d, true);
    }
    for e in &plan.evict {
        c.evict_done(e, true);
    }
    c.validate();
    (plan.deactivate.iter().map(|d| d.page).collect(), plan.evict.iter().map(|e| e.page).collect())
}

/// Validates after a fault plan. A swap-in or a reactivation in flight is
/// not validated: `Core::validate` miscounts it (see
/// `pages::validate_accepts_a_swap_in_in_flight`, a reported core bug).
pub fn validate_planned(c: &Core, plan: &FaultPlan) {
    if !matches!(plan, FaultPlan::SwapIn { .. } | FaultPlan::Reactivate { .. }) {
        c.validate();
    }
}

/// What a touch of a page came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touch {
    /// The page is (now) resident; the plans that served it, in order.
    Served(Vec<FaultPlan>),
    /// No frame could be found: SIGBUS.
    Oom,
    /// The core said Wake without installing anything (protection).
    Woken,
    Segv,
}

/// The program touches page `p`: faults are served until the page is
/// resident, reclaiming (one plan per `Reclaim`) as asked.
pub fn touch(c: &mut Core, p: u64, write: bool) -> Touch {
    let mut plans = Vec::new();
    let mut idle = 0;
    loop {
        let plan = c.fault(Addr(at(p)), write);
        validate_planned(c, &plan);
        match plan {
            FaultPlan::Wake => {
                return if c.page(PageIdx(p)).state == PState::Resident { Touch::Served(plans) } else { Touch::Woken };
            }
            FaultPlan::Segv { .. } => return Touch::Segv,
            FaultPlan::Busy => panic!("page {p} busy in a synchronous test"),
            FaultPlan::Sigbus => return Touch::Oom,
            FaultPlan::Unprotect { .. } => panic!("a WP fault without write tracking"),
            FaultPlan::Refill { page } => {
                // A lazily freed page the host discarded gets zeros; a page
                // that is there (a race) gets nothing installed.
                let lazy = c.page(page).flags & usermm_core::page::pf::LAZYFREE != 0;
                c.fill_done(&plan, u64::from(lazy));
                plans.push(plan);
                return Touch::Served(plans);
            }
            FaultPlan::FileRead { run, .. } => {
                c.fill_done(&plan, run.pages());
                plans.push(plan);
            }
            FaultPlan::Reclaim { want } => {
                let (d, e) = reclaim(c, want);
                if d.is_empty() && e.is_empty() {
                    idle += 1;
                    if idle > 3 {
                        c.fault_oom();
                        return Touch::Oom;
                    }
                }
                plans.push(plan);
            }
            FaultPlan::ZeroFill { run } => {
                c.fill_done(&plan, run.pages());
                plans.push(plan);
            }
            FaultPlan::SwapIn { run, .. } => {
                c.fill_done(&plan, run.pages());
                plans.push(plan);
            }
            FaultPlan::Reactivate { .. } => {
                c.fill_done(&plan, 1);
                plans.push(plan);
            }
        }
        c.validate();
    }
}
