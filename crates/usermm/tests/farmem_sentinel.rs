//! Far memory through Redis Sentinel (`redis+sentinel://`): the store asks
//! the Sentinel for the master at each new connection, so a master killed
//! under a running program is replaced by its promoted replica and the
//! program goes on — every byte right — without being told.
//!
//! Needs `redis-server` (it runs as the Sentinel too; `scripts/test.sh`
//! installs it when missing). Without it this test fails, saying so.

mod common;
mod paging;
mod pattern;
mod redis_server;

use std::time::Instant;

use paging::{bad_in, fill, pageout_all, PAGE};
use pattern::bad_bytes;
use redis_server::SentinelGroup;
use usermm::consts::UMM_PAGE_SWAPPED;
use usermm::Config;

#[test]
fn a_master_killed_under_a_running_program_loses_nothing() {
    let mut g = SentinelGroup::start("usermm-test");
    let old = g.master.port;
    // (`replicas=1`: a page is written only once the replica has it. Reads
    // wait out the failover: up to 30 s on a loaded machine.)
    let url = format!("{}&replicas=1&failover_ms=30000", g.url("sent:"));
    let s = common::open_mode(&Config {
        budget_bytes: 2 << 20,
        swap_bytes: 64 << 20,
        swap_url: Some(url),
        ..Config::default()
    })
    .expect("open a space on the Sentinel group's master");
    let mut m = s.map_anon(8 << 20).expect("mmap"); // 4x the budget
    fill(&mut m, 5, 1);
    assert_eq!(bad_in(&m, 5, 1), 0, "before the failover");
    let st = pageout_all(&s, &mut m);
    assert!(st.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0), "not every page swapped out");
    assert!(!g.master.keys("sent:*").is_empty(), "no page on the master");
    g.master.kill();
    let t0 = Instant::now();
    // Read back while the Sentinel fails over (a quarter of the budget's
    // worth: the pages fit, so no write has to wait for the new master).
    let n = (2 << 20) / PAGE / 4;
    let bad: usize = (0..n).map(|p| bad_bytes(&m[p * PAGE..(p + 1) * PAGE], 5 << 32 | p as u64, 1)).sum();
    eprintln!("read {n} pages back in {:?}; stats {:?}", t0.elapsed(), s.stats());
    assert_eq!(bad, 0, "wrong bytes after the failover");
    let now = g.master_port();
    assert!(now.is_some_and(|p| p != old && p == g.replica.port), "the Sentinel names {now:?}, not the replica");
    assert_eq!(s.stats().swap_read_errors, 0);
    drop(m);
    s.validate();
}
