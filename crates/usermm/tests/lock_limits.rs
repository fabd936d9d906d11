//! Process-wide lock calls and lock limits, compared with the host kernel.
//!
//! `mlockall` acts on a whole process and root's `CAP_IPC_LOCK` lifts
//! `RLIMIT_MEMLOCK`, so the kernel's side of each scenario runs in a child
//! process (this test binary, re-run on its ignored entry point): it sets
//! the limit, drops root where the scenario needs a limit (uid 65534), runs
//! the scenario on the host's own calls and prints its transcript. usermm's
//! side runs here, on a space whose `memlock_bytes` is the same limit. The
//! transcripts must be equal line for line.

use usermm::consts::*;
use usermm::{Config, Errno, Space};

mod common;

const PAGE: usize = 4096;
const CASE_ENV: &str = "USERMM_LOCK_LIMITS_CASE";

/// The calls a scenario makes; `limit` starts over with a new lock limit
/// (the kernel: a lower soft `RLIMIT_MEMLOCK`; usermm: a new space).
trait LockOps {
    fn limit(&mut self, bytes: u64);
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32) -> Result<usize, Errno>;
    fn mlock(&self, addr: usize, len: usize) -> Result<(), Errno>;
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno>;
    fn mlockall(&self, flags: i32) -> Result<(), Errno>;
    fn munlockall(&self) -> Result<(), Errno>;
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno>;
}

fn res<T>(r: Result<T, Errno>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("{e:?}"),
    }
}

fn resident(v: Result<Vec<u8>, Errno>) -> String {
    match v {
        Ok(v) => v.iter().map(|b| if b & 1 != 0 { '1' } else { '0' }).collect(),
        Err(e) => format!("{e:?}"),
    }
}

/// The scenarios, by name: each returns its transcript.
fn scenario(case: &str, m: &mut dyn LockOps) -> Vec<String> {
    let mut t = Vec::new();
    match case {
        // umm_mmap's error order: length/alignment, NOREPLACE overlap, the
        // lock limit, the mapping type; then mlock's limits.
        "mmap-precedence" => {
            m.limit(4096);
            let a = m.mmap(0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            let locked = MAP_ANONYMOUS | MAP_LOCKED;
            t.push(format!("no type + lock over limit: {}", res(m.mmap(0, 4 * PAGE, PROT_READ, locked))));
            t.push(format!(
                "unaligned NOREPLACE + lock over limit: {}",
                res(m.mmap(a + 1, 4 * PAGE, PROT_READ, locked | MAP_PRIVATE | MAP_FIXED_NOREPLACE))
            ));
            t.push(format!(
                "NOREPLACE overlap + lock over limit: {}",
                res(m.mmap(a, 4 * PAGE, PROT_READ, locked | MAP_PRIVATE | MAP_FIXED_NOREPLACE))
            ));
            t.push(format!(
                "NOREPLACE overlap + no type: {}",
                res(m.mmap(a, 4 * PAGE, PROT_READ, MAP_ANONYMOUS | MAP_FIXED_NOREPLACE))
            ));
            t.push(format!("mlock 2 pages over a 1-page limit: {}", res(m.mlock(a, 2 * PAGE))));
            m.limit(100);
            let b = m.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            t.push(format!("mlock 1 byte, limit below a page: {}", res(m.mlock(b, 1))));
            m.limit(0);
            let c = m.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            t.push(format!("mlock 1 byte, limit 0: {}", res(m.mlock(c, 1))));
        }
        // LTP's layout: 100 random mlock/mlock2(MLOCK_ONFAULT) calls in the
        // first 128 KiB of a 384 KiB region, limit 256 KiB (srand(7)).
        "random-locks" => {
            m.limit(256 << 10);
            let a = m.mmap(0, 384 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            // SAFETY: srand/rand touch only libc's own generator state.
            unsafe { libc::srand(7) };
            for i in 0..100 {
                // SAFETY: as above.
                let off = unsafe { libc::rand() } as usize % (128 << 10);
                // SAFETY: as above.
                let len = unsafe { libc::rand() } as usize % ((128 << 10) - off) + 1;
                let r = if i % 2 == 0 { m.mlock(a + off, len) } else { m.mlock2(a + off, len, MLOCK_ONFAULT) };
                t.push(format!("call {i} [{off:#x}, +{len:#x}): {}", res(r)));
            }
        }
        "mlockall-onfault-map-locked" => {
            t.push(format!("mlockall FUTURE|ONFAULT: {}", res(m.mlockall(MCL_FUTURE | MCL_ONFAULT))));
            let a = m.mmap(0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED);
            t.push(format!("MAP_LOCKED: {}", res(a)));
            t.push(format!("resident: {}", resident(m.mincore(a.unwrap(), 4 * PAGE))));
            t.push(format!("munlockall: {}", res(m.munlockall())));
        }
        "mlockall-current-prot-none" => {
            let a = m.mmap(0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            let n = m.mmap(0, 4 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
            t.push(format!("mlockall CURRENT: {}", res(m.mlockall(MCL_CURRENT))));
            t.push(format!("rw resident: {}", resident(m.mincore(a, 4 * PAGE))));
            t.push(format!("none resident: {}", resident(m.mincore(n, 4 * PAGE))));
            t.push(format!("munlockall: {}", res(m.munlockall())));
        }
        _ => panic!("unknown case {case}"),
    }
    t
}

fn last_errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// The host kernel's calls (in the child process).
struct Host;

impl LockOps for Host {
    fn limit(&mut self, bytes: u64) {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `r` is a valid rlimit to fill.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
        assert!(bytes <= r.rlim_max, "RLIMIT_MEMLOCK's hard limit {} is below {bytes}", r.rlim_max);
        r.rlim_cur = bytes;
        // SAFETY: a plain setrlimit of this process (the soft limit, at
        // most the hard one).
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) }, 0, "setrlimit {bytes}: {:?}", last_errno());
    }
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32) -> Result<usize, Errno> {
        // SAFETY: new anonymous memory (MAP_FIXED_NOREPLACE never replaces
        // a mapping); nothing in this process refers to where it lands.
        let p = unsafe { libc::mmap(addr as *mut _, len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(p as usize)
    }
    fn mlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        // SAFETY: mlock changes no memory contents.
        if unsafe { libc::mlock(addr as *const _, len) } != 0 {
            return Err(last_errno());
        }
        Ok(())
    }
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
        // SAFETY: as mlock.
        if unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) } != 0 {
            return Err(last_errno());
        }
        Ok(())
    }
    fn mlockall(&self, flags: i32) -> Result<(), Errno> {
        // SAFETY: as mlock.
        if unsafe { libc::mlockall(flags) } != 0 {
            return Err(last_errno());
        }
        Ok(())
    }
    fn munlockall(&self) -> Result<(), Errno> {
        // SAFETY: as mlock.
        if unsafe { libc::munlockall() } != 0 {
            return Err(last_errno());
        }
        Ok(())
    }
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: `v` holds one byte per page of the range.
        if unsafe { libc::mincore(addr as *mut _, len, v.as_mut_ptr()) } != 0 {
            return Err(last_errno());
        }
        Ok(v)
    }
}

/// A space per lock limit.
struct User {
    space: Space,
}

fn user_space(memlock: u64) -> Space {
    common::open_mode(&Config {
        budget_bytes: 64 << 20,
        memlock_bytes: memlock as usize,
        flags: UMM_F_EXACT_FAULTS,
        ..Config::default()
    })
    .expect("usermm space (needs userfaultfd)")
}

impl LockOps for User {
    fn limit(&mut self, bytes: u64) {
        self.space = user_space(bytes);
    }
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32) -> Result<usize, Errno> {
        self.space.mmap(addr, len, prot, flags, -1, 0)
    }
    fn mlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.space.mlock(addr, len)
    }
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
        self.space.mlock2(addr, len, flags)
    }
    fn mlockall(&self, flags: i32) -> Result<(), Errno> {
        self.space.mlockall(flags)
    }
    fn munlockall(&self) -> Result<(), Errno> {
        self.space.munlockall()
    }
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; len.div_ceil(PAGE)];
        self.space.mincore(addr, len, &mut v).map(|_| v)
    }
}

#[test]
#[ignore = "child-process entry point of the lock-limit scenarios (the host kernel's side)"]
fn host_child() {
    let Ok(case) = std::env::var(CASE_ENV) else { return };
    let (case, drop_root) = match case.strip_suffix(":unprivileged") {
        Some(c) => (c.to_string(), true),
        None => (case, false),
    };
    let mut h = Host;
    if drop_root {
        // SAFETY: this process only; it exits after the scenario.
        unsafe {
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
    }
    for line in scenario(&case, &mut h) {
        println!("T: {line}");
    }
}

fn compare(case: &str, drop_root: bool) {
    let arg = if drop_root { format!("{case}:unprivileged") } else { case.to_string() };
    let out = common::run_entry("host_child", &[(CASE_ENV, arg.into())]);
    assert!(out.status.success(), "host child failed: {}", String::from_utf8_lossy(&out.stderr));
    let host: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.find("T: ").map(|i| l[i + 3..].to_string()))
        .collect();
    assert!(!host.is_empty(), "the host child printed nothing: {}", String::from_utf8_lossy(&out.stdout));
    let mut u = User { space: user_space(u64::MAX) };
    let mine = scenario(case, &mut u);
    u.space.validate();
    if host != mine {
        let mut msg = format!("{case}: kernel and usermm disagree\n");
        for i in 0..host.len().max(mine.len()) {
            let a = host.get(i).map(String::as_str).unwrap_or("<none>");
            let b = mine.get(i).map(String::as_str).unwrap_or("<none>");
            msg += &format!("{} kernel: {a}\n   usermm: {b}\n", if a == b { "  " } else { "!!" });
        }
        panic!("{msg}");
    }
}

#[test]
fn mmap_error_precedence_and_lock_limits_as_the_kernel() {
    compare("mmap-precedence", true);
}

#[test]
fn random_locks_within_the_limit_as_the_kernel() {
    compare("random-locks", true);
}

#[test]
fn map_locked_under_mcl_onfault_as_the_kernel() {
    compare("mlockall-onfault-map-locked", false);
}

#[test]
fn mlockall_current_with_a_prot_none_region_as_the_kernel() {
    compare("mlockall-current-prot-none", false);
}
