//! usermm's threads never take a signal meant for the program: every thread
//! a space starts (fault handlers, wake-ahead, background reclaim; also in a
//! forked child's copy) blocks every signal a program can handle from its
//! first instruction, and leaves unblocked only those the kernel raises in
//! the thread that caused them (`usermm_sys::thread::USERMM_THREAD_UNBLOCKED`).
//! A process-directed signal that every program thread blocks stays pending
//! for the program, as without usermm. And they carry the program's
//! per-thread credentials (`usermm::threads_follow_credentials`). Alone in
//! its own binary: it reads the process's threads by name.

use usermm::consts::*;

mod common;
use common::{fill, space_pages};

/// (thread id, name, `/proc` status) of each of this process's threads
/// named `usermm-*`.
fn usermm_tasks() -> Vec<(u32, String, String)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.starts_with("usermm-") {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            v.push((t.file_name().to_string_lossy().parse().unwrap(), comm.trim().to_string(), status));
        }
    }
    v
}

/// The line of `status` that starts with `key`.
fn status_line<'a>(status: &'a str, key: &str) -> &'a str {
    status.lines().find(|l| l.starts_with(key)).unwrap_or("")
}

/// (name, blocked mask) of each of this process's threads named `usermm-*`.
fn usermm_threads() -> Vec<(String, u64)> {
    usermm_tasks()
        .into_iter()
        .map(|(_, name, status)| {
            let blk = status_line(&status, "SigBlk:").trim_start_matches("SigBlk:").trim();
            (name, u64::from_str_radix(blk, 16).unwrap())
        })
        .collect()
}

/// Signals 1-64 less the ones a usermm thread leaves unblocked, SIGKILL and
/// SIGSTOP (never blockable) and glibc's SIGCANCEL (32) and SIGSETXID (33),
/// which glibc keeps unblocked in every thread of its own.
fn must_block() -> u64 {
    let mut m = u64::MAX;
    for s in usermm_sys::thread::USERMM_THREAD_UNBLOCKED.into_iter().chain([libc::SIGKILL, libc::SIGSTOP, 32, 33]) {
        m &= !(1u64 << (s - 1));
    }
    m
}

fn assert_blocking(what: &str) {
    let threads = usermm_threads();
    assert!(!threads.is_empty(), "{what}: no usermm thread found");
    for (name, blk) in &threads {
        let missing = must_block() & !blk;
        assert_eq!(missing, 0, "{what}: thread {name} leaves signals {missing:#x} unblocked (SigBlk {blk:#x})");
        for s in usermm_sys::thread::USERMM_THREAD_UNBLOCKED {
            assert_eq!(blk & (1 << (s - 1)), 0, "{what}: thread {name} blocks signal {s}, which the kernel forces");
        }
    }
}

#[test]
fn every_usermm_thread_blocks_the_programs_signals_and_the_caller_keeps_its_mask() {
    // The opening thread's own mask is what it was before (here: nothing
    // blocked but what the harness blocks).
    let before = usermm_sys::thread::blocked_signals();
    let s = space_pages(64, 256, 0);
    assert_eq!(usermm_sys::thread::blocked_signals(), before, "open changed the caller's mask");
    let a = s.mmap(0, 256 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
    fill(a, 0..256, 7);
    assert_blocking("a space");
    let s2 = space_pages(64, 0, UMM_F_NO_WAKE_AHEAD | UMM_F_NO_BACKGROUND_RECLAIM);
    assert_blocking("two spaces");
    drop(s2);
    drop(s);
}

/// In a forked child (one thread: ours) that blocks SIGUSR1: a SIGUSR1 sent
/// to the process stays pending while the space's threads run, and the
/// handler runs on the main thread once it unblocks it. Before the fix the
/// kernel delivered it to a usermm thread at once.
#[test]
fn a_signal_the_program_blocks_waits_for_it() {
    let exit = usermm_sys::thread::fork_run(30, || {
        let s = space_pages(64, 256, 0);
        let a = s.mmap(0, 256 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
        fill(a, 0..256, 3);
        match usermm_sys::testing::signal_waits_for_unblock(libc::SIGUSR1) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(_) => 2,
        }
    })
    .unwrap();
    assert_eq!(
        exit,
        usermm_sys::thread::ChildExit::Exited(0),
        "the signal was taken by another thread (1) or failed (2)"
    );
}

/// The `CapEff:` line of each of this process's threads named `usermm-*`,
/// and of the calling thread.
fn cap_eff() -> (Vec<(u32, String)>, String) {
    let threads =
        usermm_tasks().into_iter().map(|(tid, _, st)| (tid, status_line(&st, "CapEff:").to_string())).collect();
    let mine = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    (threads, status_line(&mine, "CapEff:").to_string())
}

/// `threads_follow_credentials` starts the space's threads again from a
/// calling thread whose own credentials differ (keep-caps; a capability
/// dropped from its effective set with `capset`), so that they carry the
/// same; it leaves them alone when nothing differs; and the space's pages
/// are served by the new threads, every byte kept. In a forked child: the
/// capability change is the child's thread's alone.
#[test]
fn the_spaces_threads_follow_the_callers_credentials() {
    let exit = usermm_sys::thread::fork_run(60, || {
        let s = space_pages(64, 1024, 0);
        let a = s.mmap(0, 256 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
        fill(a, 0..256, 5);
        let (before, _) = cap_eff();
        usermm::threads_follow_credentials();
        if cap_eff().0 != before {
            return 1; // started again with nothing changed
        }
        // SAFETY: PR_SET_KEEPCAPS takes a flag by value.
        unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) };
        usermm::threads_follow_credentials();
        let (after, _) = cap_eff();
        if after.iter().any(|t| before.iter().any(|b| b.0 == t.0)) || after.len() != before.len() {
            return 2; // not all started again
        }
        // Drop CAP_SYS_NICE (23) from this thread's effective set.
        let mut hdr = [0x2008_0522u32, 0];
        let mut data = [0u32; 6];
        // SAFETY: a v3 header and its two data structs.
        unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) };
        data[0] &= !(1 << 23);
        // SAFETY: as above.
        if unsafe { libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()) } != 0 {
            return 3;
        }
        usermm::threads_follow_credentials();
        let (threads, mine) = cap_eff();
        if threads.is_empty() || threads.iter().any(|t| t.1 != mine) {
            return 4; // a usermm thread kept a capability the caller dropped
        }
        usermm::credentials_changed_everywhere();
        for p in 0..256 {
            // SAFETY: the mapping is 256 pages, filled above.
            if unsafe { *((a + p * 4096) as *const u8) } != 5u8.wrapping_add(p as u8) {
                return 5;
            }
        }
        0
    })
    .unwrap();
    assert_eq!(exit, usermm_sys::thread::ChildExit::Exited(0), "see the return codes in the test");
}
