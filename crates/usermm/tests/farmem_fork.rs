//! SPEC §4 "fork" with a page store on a Redis server: a forked child reads
//! every page its parent had swapped out at the fork, in place in the
//! parent's keys, while the parent rewrites its pages and then closes its
//! space or exits; the child's own swap-outs go to keys of its own; once
//! both are gone, no key of either is left on the server (the parent's keys
//! wait for the child, `store/redis/fork.rs`). A child killed outright
//! leaves the parent's keys to its parent, which frees their slots, and
//! its own keys go at once (a process of its own waits for its end).
//!
//! Each scenario runs in a process of its own (this binary again, with
//! `USERMM_FARMEM_FORK` set): a fork copies every space of the process, and
//! other tests' spaces must not be held by this test's child.

mod common;
mod paging;
mod pattern;
mod redis_server;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

use paging::{pageout_all, PAGE};
use pattern::{bad_bytes, fill_page};
use redis_server::Server;
use usermm::consts::UMM_PAGE_SWAPPED;
use usermm::{Config, Mapping};

const FORK_ENV: &str = "USERMM_FARMEM_FORK";
const URL_ENV: &str = "USERMM_FARMEM_URL";
const TAG: u64 = 5;

/// Waits up to 60 s for `w` to hold `v`.
fn wait_for(w: &AtomicU32, v: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(60);
    while w.load(SeqCst) != v {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Writes pages `pages` of `m` at `version`.
fn fill(m: &mut Mapping<'_>, pages: std::ops::Range<usize>, version: u64) {
    for p in pages {
        fill_page(&mut m[p * PAGE..(p + 1) * PAGE], TAG << 32 | p as u64, version);
    }
}

/// The wrong bytes of pages `pages` of `m` against `version`.
fn bad(m: &Mapping<'_>, pages: std::ops::Range<usize>, version: u64) -> usize {
    pages.map(|p| bad_bytes(&m[p * PAGE..(p + 1) * PAGE], TAG << 32 | p as u64, version)).sum()
}

/// The scenario's process (nothing unless `USERMM_FARMEM_FORK` is set: to
/// "close", "exit" or "kill", how the parent's side ends). 4 MiB swapped
/// out under a 1 MiB budget, then a fork. The child reads the first half as
/// of the fork, writes it (swapped out to keys of its own) and reads it
/// back; meanwhile the parent rewrites every page (its slots of the fork
/// kept for the child) and, once the child is done, reads its own pages
/// back. Then the parent closes its space ("close") or exits without
/// closing it ("exit"), and the child, after that, reads the second half
/// as of the fork (still in the parent's keys) and exits through `exit`.
/// With "kill", the parent kills the child once it wrote its half, and
/// checks that the slots it kept for it are freed. Exit status 0 when every check passed;
/// what failed is said on stderr.
#[test]
#[ignore = "child-process entry point of the fork tests"]
fn fork_scenario() {
    let Ok(how) = std::env::var(FORK_ENV) else { return };
    // (The clean-up process must work under a user's usual descriptor
    // limit: it once moved its descriptors past 1,024, and with that limit
    // never ran.)
    usermm_sys::testing::lower_nofile(1024).expect("RLIMIT_NOFILE");
    let url = std::env::var(URL_ENV).expect("URL");
    let word = usermm_sys::testing::shared_word();
    let cfg = Config { budget_bytes: 1 << 20, swap_bytes: 32 << 20, swap_url: Some(url), ..Config::default() };
    let s = Box::leak(Box::new(common::open_mode(&cfg).expect("open a space on the Redis store")));
    let mut m = s.map_anon(4 << 20).expect("mmap");
    let (n, half) = (m.len() / PAGE, m.len() / PAGE / 2);
    fill(&mut m, 0..n, 1);
    let st = pageout_all(s, &mut m);
    assert!(st.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0), "not all swapped out");
    let parent = std::process::id() as i32;
    // SAFETY: fork; the child runs the checks below and leaves through
    // `exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: `alarm` takes no pointer.
        unsafe { libc::alarm(60) };
        let why = (|| {
            word.store(1, SeqCst);
            if !wait_for(word, 2) {
                return "the parent did not go on";
            }
            if bad(&m, 0..half, 1) != 0 {
                return "the first half as of the fork";
            }
            fill(&mut m, 0..half, 2);
            if bad(&m, 0..half, 2) != 0 {
                return "the child's own writes, swapped out and back";
            }
            word.store(3, SeqCst);
            if !wait_for(word, 4) {
                return "the parent did not let go of its space";
            }
            // SAFETY: `getppid` takes no pointer.
            while how == "exit" && unsafe { libc::getppid() } == parent {
                std::thread::sleep(Duration::from_millis(1));
            }
            if bad(&m, half..n, 1) != 0 {
                return "the second half as of the fork, after the parent let go";
            }
            if bad(&m, 0..half, 2) != 0 {
                return "the child's own writes, at the end";
            }
            ""
        })();
        eprintln!("fork child: {}", if why.is_empty() { "ok" } else { why });
        let st = s.stats();
        eprintln!(
            "fork child: stats swapouts {} swapins {} read errors {}",
            st.swapouts, st.swapins, st.swap_read_errors
        );
        std::mem::forget(m);
        // SAFETY: `exit` in the forked child, its only thread: its exit
        // handlers (usermm's among them) run.
        unsafe { libc::exit(if why.is_empty() { 0 } else { 1 }) };
    }
    assert!(wait_for(word, 1), "the child did not start");
    fill(&mut m, 0..n, 3);
    pageout_all(s, &mut m);
    assert_eq!(bad(&m, 0..n, 3), 0, "the parent's own pages");
    let held = s.stats().swap_fork_held_pages;
    assert!(held as usize >= n / 2, "the slots of the fork are kept for the child: {held}");
    word.store(2, SeqCst);
    assert!(wait_for(word, 3), "the child's first checks");
    if how == "kill" {
        // (With keys of its own by now: its own process deletes them.)
        // SAFETY: our child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_eq!(bad(&m, 0..n, 3), 0, "the parent's pages after the child's writes");
    eprintln!("fork parent: its pages read back ({held} slots kept for the child)");
    match how.as_str() {
        "kill" => {
            let until = Instant::now() + Duration::from_secs(10);
            while s.stats().swap_fork_held_pages != 0 {
                assert!(Instant::now() < until, "held slots never freed: {:?}", s.stats());
                std::thread::sleep(Duration::from_millis(5));
            }
            pageout_all(s, &mut m);
            assert_eq!(bad(&m, 0..n, 3), 0, "the parent's pages, with the child's slots free again");
        }
        "close" => {
            drop(m);
            // SAFETY: the space was leaked above; nothing refers to it now.
            let s = unsafe { Box::from_raw(s as *mut usermm::Space) };
            s.close().expect("close");
            word.store(4, SeqCst);
        }
        _ => {
            std::mem::forget(m);
            word.store(4, SeqCst);
            std::process::exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: our child; `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 100 + libc::WTERMSIG(status) };
    eprintln!("fork parent: the child ended with {code}");
    std::process::exit(if how == "kill" || code == 0 { 0 } else { 1 });
}

/// Runs [`fork_scenario`] in `how` against `srv` and checks that it passed
/// and that no key outlives it.
fn run(how: &str) {
    run_with(how, "");
}

/// [`run`] with `options` after the store URL's.
fn run_with(how: &str, options: &str) {
    let srv = Server::start(&[]);
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", "fork_scenario", "--ignored", "--nocapture", "--test-threads=1"])
        .env(FORK_ENV, how)
        .env(URL_ENV, srv.url("fk:") + options)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the scenario");
    // (To its end: the forked child holds it too, past its parent's exit.)
    let mut log = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut log);
    let status = child.wait().expect("wait");
    eprintln!("{how}: {status:?}\n{log}");
    assert!(status.success(), "the scenario failed ({how}):\n{log}");
    if how != "kill" {
        assert!(log.contains("fork child: ok"), "the child's checks ({how}):\n{log}");
    }
    let t0 = Instant::now();
    while srv.dbsize() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "keys outlived both processes: {:?}", srv.keys("*"));
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{how}: no key left {:?} after both ended", t0.elapsed());
}

#[test]
fn a_child_reads_its_parents_keys_after_the_parent_closed_its_space() {
    run("close");
}

#[test]
fn a_child_reads_its_parents_keys_after_the_parent_exited() {
    run("exit");
}

#[test]
fn a_killed_childs_slots_are_freed_and_its_parents_keys_stay_its_own() {
    run("kill");
}

/// A sealing store (`seal=1`): the child opens its parent's sealed pages
/// with its copy of the parent's key and seals its own under a key of its
/// own.
#[test]
fn a_child_reads_its_parents_sealed_keys_and_seals_its_own() {
    run_with("close", "&seal=1");
}
