//! The wake-ahead thread (`UMM_F_NO_WAKE_AHEAD`, docs/design.md
//! "Wake-ahead"): one per handler-thread space, at `SCHED_IDLE`, none with
//! the flag or with in-thread faults, asleep when no fault is in flight; and
//! swap-ins served while it runs bring every byte back. Alone in its own
//! test binary, and one test: it counts the process's threads by name.

use std::time::Duration;

use usermm::consts::*;

mod common;
use common::{fill, space_pages};

const PS: usize = 4096;

/// This process's threads named `usermm-awake`: (thread id, policy, CPU
/// ticks).
fn awake_threads() -> Vec<(u32, u32, u64)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != "usermm-awake" {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime is the 12th,
        // stime the 13th, policy the 39th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let tid = t.file_name().to_string_lossy().parse().unwrap();
        v.push((tid, f[38].parse().unwrap(), f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()));
    }
    v
}

#[test]
fn one_idle_priority_wake_ahead_thread_per_space_asleep_when_no_fault_is_in_flight() {
    let in_thread = common::in_thread_run();
    let multi = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    {
        // 2,048 pages through a 256-page budget: swap-ins, every byte
        // checked.
        let s = space_pages(256, 4096, 0);
        let threads = awake_threads();
        // (In-thread spaces too: it takes half of a lock-on-fault window.)
        let expected = usize::from(multi);
        assert_eq!(threads.len(), expected, "wake-ahead threads of one space (in-thread: {in_thread}): {threads:?}");
        for &(_, policy, _) in &threads {
            assert_eq!(policy, libc::SCHED_IDLE as u32, "the wake-ahead thread must run at SCHED_IDLE");
        }
        let pages = 2048;
        let a = s.mmap(0, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
        for round in 0..2u8 {
            fill(a, 0..pages, round * 3 + 1);
            for p in 0..pages {
                let want = (round * 3 + 1).wrapping_add(p as u8);
                assert_eq!(usermm_sys::kernel::peek(a + p * PS), want, "page {p} round {round}");
                assert_eq!(usermm_sys::kernel::peek(a + p * PS + PS - 1), want, "page {p} round {round}");
            }
        }
        assert!(s.stats().swapins > 0, "the test must swap in: {:?}", s.stats());
        // Idle: the thread sleeps (well under 10% of a CPU over a second).
        std::thread::sleep(Duration::from_millis(300));
        let t0: u64 = awake_threads().iter().map(|t| t.2).sum();
        std::thread::sleep(Duration::from_secs(1));
        let t1: u64 = awake_threads().iter().map(|t| t.2).sum();
        assert!((t1 - t0) < 10, "the wake-ahead thread used {} ticks of 100 in an idle second", t1 - t0);
        s.close().unwrap();
        assert!(awake_threads().is_empty(), "the wake-ahead thread must end with its space");
    }
    {
        let s = space_pages(256, 1024, UMM_F_NO_WAKE_AHEAD);
        assert!(awake_threads().is_empty(), "UMM_F_NO_WAKE_AHEAD: no wake-ahead thread");
        s.close().unwrap();
    }
}
