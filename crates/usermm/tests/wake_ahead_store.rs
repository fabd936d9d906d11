//! The wake-ahead thread (docs/design.md "Wake-ahead") stays asleep while
//! single-page swap-ins read a Redis server over TCP through a handler
//! thread that polls for the reply (`Link`): there the faulting thread, the
//! handler and the server share a CPU, and a thread spinning on the other
//! one only makes the round trip longer (docs/design.md "Page stores").
//! Every byte read back is checked. Alone in its own test binary: it reads
//! the CPU time of the process's `usermm-awake` thread.
//!
//! Needs `redis-server` (`scripts/test.sh` installs it when missing).

mod paging;
mod pattern;
mod redis_server;

use std::time::{Duration, Instant};

use paging::{bad_in, fill, pageout_all, PAGE};
use redis_server::Server;
use usermm::consts::UMM_PAGE_SWAPPED;
use usermm::{Config, Space};

/// CPU ticks (1/100 s) of this process's `usermm-awake` threads, and how
/// many there are.
fn awake_ticks() -> (u64, usize) {
    let (mut ticks, mut n) = (0, 0);
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != "usermm-awake" {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // utime and stime: the 12th and 13th fields after the command.
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        n += 1;
    }
    (ticks, n)
}

#[test]
fn the_wake_ahead_thread_sleeps_through_swap_ins_that_poll_a_redis_server() {
    let srv = Server::start(&[]);
    let cfg =
        Config { budget_bytes: 1 << 20, swap_bytes: 64 << 20, swap_url: Some(srv.url("wa:")), ..Config::default() };
    let s = Space::open(&cfg).expect("open a space on the Redis store");
    let multi = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    assert_eq!(awake_ticks().1, usize::from(multi), "one wake-ahead thread on more than one CPU");
    if !multi {
        eprintln!("NOT CHECKED: one CPU, so no wake-ahead thread to watch");
        return;
    }
    let mut m = s.map_anon(8 << 20).expect("mmap"); // 8x the budget
    let pages = m.len() / PAGE;
    fill(&mut m, 7, 1);
    let st = pageout_all(&s, &mut m);
    assert!(st.iter().filter(|&&b| b & UMM_PAGE_SWAPPED != 0).count() > pages / 2, "paged out");
    // Single pages read back one at a time for half a second: each a
    // round trip to the server (and, the budget being full, an eviction).
    let (t0, in0) = (awake_ticks().0, s.stats().swapins);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let until = Instant::now() + Duration::from_millis(500);
    let mut reads = 0u64;
    while Instant::now() < until {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::hint::black_box(m[(x % pages as u64) as usize * PAGE]);
        reads += 1;
    }
    let (t1, in1) = (awake_ticks().0, s.stats().swapins);
    let st = s.stats();
    eprintln!("{reads} reads, {} swap-ins, wake-ahead {} ticks: {st:?}", in1 - in0, t1 - t0);
    assert!(in1 - in0 > 1000, "the test must swap in: {st:?}");
    // Spinning through each round trip and the grace period after it, it
    // took 23 of the 50 ticks (measured with the store's polling ignored).
    assert!(t1 - t0 <= 5, "the wake-ahead thread used {} ticks of the 50 of polled swap-ins", t1 - t0);
    assert_eq!(bad_in(&m, 7, 1), 0, "every byte read back");
    assert_eq!((st.swap_read_errors, st.swap_write_errors), (0, 0));
    drop(m);
    s.close().unwrap();
}
