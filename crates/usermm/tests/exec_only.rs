//! Exec-only pages (`PROT_EXEC` without `PROT_READ`, issue 71 item 3): a
//! JIT's page that is written, made exec-only and evicted is brought back by
//! its next call, and a data load of it ends as the host kernel's does (on
//! x86 with protection keys, `SIGSEGV` `SEGV_PKUERR`; without them exec
//! implies read and the load returns the byte). Each test runs the same
//! sequence on the host's own memory first, as the oracle.
//!
//! ```text
//!   page:  [ mov eax, 42; ret | zeros ]   RW, write the code
//!          → mprotect(PROT_EXEC) → evicted (MADV_PAGEOUT, or the budget)
//!          → call it (42), load a byte (as the host)
//! ```
//!
//! A fault there must not be taken for one that raced with `mprotect`: the
//! kernel reports a fault only where the protection allows the access, so a
//! wrong "retry" sends the thread back into the same fault for good (a hang,
//! which `common::within` turns into a failure).

mod common;

use common::within;
use usermm::consts::*;
use usermm::Space;
use usermm_sys::kernel::{self, KernelArena};
use usermm_sys::testing::{read_in_child, LoadOutcome};

const PAGE: usize = 4096;
/// x86-64 `mov eax, 42; ret`.
const CODE: [u8; 6] = [0xb8, 42, 0, 0, 0, 0xc3];
const RESULT: i32 = 42;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn write_code(a: usize) {
    for (i, b) in CODE.iter().enumerate() {
        kernel::poke(a + i, *b);
    }
}

/// The host kernel's answers for the sequence on its own memory: what the
/// call returns, how a load of the written page ends, and how a load of an
/// exec-only page never written ends.
fn host_answers() -> (i32, LoadOutcome, LoadOutcome) {
    let arena = KernelArena::new(1 << 30).expect("arena");
    let a = arena.mmap(arena.base(), 2 * PAGE, RW, ANON | MAP_FIXED, 0).expect("host mmap");
    write_code(a);
    arena.mprotect(a, 2 * PAGE, PROT_EXEC).expect("host mprotect");
    arena.madvise(a, 2 * PAGE, MADV_PAGEOUT).expect("host pageout");
    let ret = kernel::call_code(a);
    let load = read_in_child(a, 10).expect("fork");
    let untouched = read_in_child(a + PAGE, 10).expect("fork");
    (ret, load, untouched)
}

/// A user-mode load of `a` ends as `host` says a load there ends on the
/// host's memory; a load that succeeds there returns `want`.
fn check_load(a: usize, host: LoadOutcome, want: u8, what: &str) {
    match host {
        LoadOutcome::Loaded => assert_eq!(within(10, what, move || kernel::peek(a)), want, "{what}"),
        // (In a forked child: the signal would end this process.)
        other => assert_eq!(read_in_child(a, 10).expect("fork"), other, "{what}"),
    }
}

/// Calls the code at `a` on a thread with a deadline.
fn call(a: usize, what: &str) -> i32 {
    within(10, what, move || kernel::call_code(a))
}

fn state(space: &Space, a: usize) -> u32 {
    let mut s = [0u32];
    space.page_state(a, 1, &mut s).expect("page_state");
    s[0]
}

/// `MADV_PAGEOUT` through the space swaps the exec-only pages out; a call
/// brings its page back (with and without a load first), as does a load,
/// each time the page is evicted again.
///
/// ```text
///   0: code, called first   1: code, loaded first   2: never written
/// ```
#[test]
fn exec_only_pages_are_served_after_pageout() {
    let (host_ret, host_load, host_untouched) = host_answers();
    assert_eq!(host_ret, RESULT, "the host runs the code");
    let space = common::space(16, 64);
    let a = space.mmap(0, 3 * PAGE, RW, ANON, -1, 0).expect("mmap");
    write_code(a);
    write_code(a + PAGE);
    space.mprotect(a, 3 * PAGE, PROT_EXEC).expect("mprotect");
    for round in 0..3 {
        space.madvise(a, 3 * PAGE, MADV_PAGEOUT).expect("pageout");
        for p in [a, a + PAGE] {
            let s = state(&space, p);
            assert!(s & UMM_PAGE_SWAPPED != 0 && s & UMM_PAGE_RESIDENT == 0, "round {round}: not swapped out: {s:#x}");
        }
        assert_eq!(call(a, "a call of a swapped exec-only page"), RESULT, "round {round}");
        check_load(a, host_load, CODE[0], "a load of the called page");
        check_load(a + PAGE, host_load, CODE[0], "a load of a swapped exec-only page");
        assert_eq!(call(a + PAGE, "a call of the loaded page"), RESULT, "round {round}");
        check_load(a + 2 * PAGE, host_untouched, 0, "a load of an untouched exec-only page");
    }
    space.validate();
}

/// Under a budget of 64 pages, writes to 256 other pages between calls
/// evict the exec-only page; every call still returns its result.
#[test]
fn an_exec_only_page_is_served_after_reclaim() {
    let (host_ret, host_load, _) = host_answers();
    assert_eq!(host_ret, RESULT, "the host runs the code");
    let space = common::space_pages(64, 1024, 0);
    let code = space.mmap(0, PAGE, RW, ANON, -1, 0).expect("mmap code");
    write_code(code);
    space.mprotect(code, PAGE, PROT_EXEC).expect("mprotect");
    let data = space.mmap(0, 256 * PAGE, RW, ANON, -1, 0).expect("mmap data");
    let mut evicted = 0;
    for round in 0..20u8 {
        common::fill(data, 0..256, round);
        if state(&space, code) & UMM_PAGE_RESIDENT == 0 {
            evicted += 1;
        }
        assert_eq!(call(code, "a call after reclaim"), RESULT, "round {round}");
    }
    assert!(evicted > 0, "the budget never evicted the exec-only page");
    common::fill(data, 0..256, 99);
    check_load(code, host_load, CODE[0], "a load after reclaim");
    space.validate();
}
