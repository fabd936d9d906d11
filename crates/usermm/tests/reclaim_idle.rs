//! Background reclaim that has nothing to age must sleep, not spin. Alone in
//! its own test binary on purpose: the measurement sums the CPU time of the
//! process's threads named `usermm-reclaim`, and a concurrently running test's
//! space (the suite runs two tests at a time) has one of those too — in
//! `no_hang.rs` that made this test fail when a neighbour's reclaim was busy.

use std::time::Duration;

use usermm::consts::*;

mod common;
use common::{fill, space_pages as space};

const PS: usize = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// How many of this process's threads are named `name`, and their CPU time
/// (user + system, in clock ticks).
fn thread_cpu_ticks(name: &str) -> (usize, u64) {
    let (mut threads, mut total) = (0, 0);
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime is the 12th,
        // stime the 13th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        threads += 1;
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    (threads, total)
}

/// Background reclaim that cannot age anything (the active list holds only
/// pages that cannot leave: writable non-RW ones) must not spin: it spun on
/// a whole CPU (seen by the differential fuzzer, 65% of its run).
#[test]
fn background_reclaim_does_not_spin_when_nothing_can_be_aged() {
    let s = space(256, 4096, 0);
    let rwx = s.mmap(0, 220 * PS, RW | PROT_EXEC, ANON, -1, 0).unwrap();
    fill(rwx, 0..220, 1);
    let rw = s.mmap(0, 512 * PS, RW, ANON, -1, 0).unwrap();
    fill(rw, 0..512, 2);
    // Let reclaim settle, then measure an idle second.
    std::thread::sleep(Duration::from_millis(300));
    let (_, t0) = thread_cpu_ticks("usermm-reclaim");
    std::thread::sleep(Duration::from_secs(1));
    let (threads, t1) = thread_cpu_ticks("usermm-reclaim");
    let used = t1 - t0;
    let hz = 100; // USER_HZ on Linux
    assert_eq!(threads, 1, "one space, one reclaim thread");
    assert!(used * 100 < 20 * hz, "background reclaim used {used} ticks of {hz} in an idle second: {:?}", s.stats());
    s.validate();
}
