//! SPEC §4 "fork": a child process gets no space, and never silently reads
//! zeros where the parent had data. usermm marks the reservation
//! `MADV_DONTFORK`, so the child has no mapping there at all: any touch of a
//! space's memory in the child raises SIGSEGV.

use usermm::{Config, Space};
use usermm_sys::thread::{fork_probe_read, ProbeOutcome};

#[test]
fn child_gets_sigsegv_never_zeros() {
    let s = Space::open(&Config { budget_bytes: 8 << 20, swap_bytes: 64 << 20, ..Config::default() }).unwrap();
    let mut m = s.map_anon(1 << 20).unwrap();
    m.fill(0x5a);
    // A resident page, and a page that is not resident in the parent.
    let resident = m.addr();
    let untouched = s.map_anon(1 << 20).unwrap();
    for addr in [resident, untouched.addr()] {
        match fork_probe_read(addr).unwrap() {
            ProbeOutcome::Signaled(sig) => assert_eq!(sig, libc::SIGSEGV, "child killed by {sig}"),
            ProbeOutcome::Read(v) => panic!("child read {v:#x} at {addr:#x}: it must have no mapping there"),
        }
    }
    // The parent is unaffected.
    assert!(m.iter().all(|&b| b == 0x5a));
    s.validate();
}
