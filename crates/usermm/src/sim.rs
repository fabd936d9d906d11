//! A seeded simulation of a space: the real core and the real executor
//! over a simulated platform — memory as byte arrays, the program's faults
//! served by calling the executor's fault handler in the faulting "thread",
//! signals recorded — driven by a program of random calls and touches, with
//! the background thread's work run as steps between them, and checked
//! against a model of every page's bytes after each step. One seed is one
//! run; a failure says `reproduce with USERMM_SIM_SEED=…`.
//!
//! The platform injects what the host can do to the executor, from the
//! seed: swap reads and writes that fail (`EIO`), fills and moves that stop
//! short (a prefix installed), moves that are refused (the executor falls
//! back to copies). It does not model the host's own reclaim (no lazy free
//! handed to the host), file regions, or threads running at once: the
//! scheduler interleaves whole steps (a call, a touch, a background round).
//!
//! Built with the `test-hooks` feature (usermm's own tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use usermm_core::consts::*;
use usermm_core::page::PState;
use usermm_core::region::LockMode;
use usermm_core::Errno;
use usermm_sys::file::MappedFile;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::UffdMsg;

use crate::native::Inner;
use crate::platform::Platform;
use crate::Config;

const PS: usize = 4096;
/// The simulated reservation's address: never dereferenced.
const BASE: usize = 0x6000_0000_0000;
/// Pages of the reservation the program uses.
const PAGES: usize = 96;
/// The faulting thread's id.
const TID: u32 = 7;

/// xorshift64*: the simulation's only source of choices.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// A page of the simulated program range.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Pg {
    /// The shared zero page (a read fault's mapping; a write copies it).
    Zero,
    Data(Box<[u8]>),
    /// A poison marker: a touch raises SIGBUS.
    Poison,
}

/// What the simulated host holds.
struct Host {
    /// Program range, by page index.
    prog: HashMap<usize, Pg>,
    /// Host protection by page index (the reservation starts `PROT_NONE`).
    prot: HashMap<usize, i32>,
    staging: HashMap<u32, Box<[u8]>>,
    /// Swap, by page offset.
    swap: HashMap<u64, Box<[u8]>>,
    /// Signals queued: (thread, signal, address).
    signals: Vec<(u32, i32, usize)>,
    rng: Rng,
    /// One in how many operations fail (0: none).
    fail_one_in: u64,
    can_move: bool,
    has_swap: bool,
    injected: u64,
}

/// The simulated host.
pub(crate) struct SimPlatform {
    host: Mutex<Host>,
    /// The space, for preemption: another thread's reclaim round run at a
    /// platform call of this one (set once the space is built).
    inner: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// One in how many platform calls is a preemption point (0: none).
    preempt_one_in: u64,
    /// A preempting round is running (no preemption inside it).
    preempting: std::sync::atomic::AtomicBool,
    preemptions: std::sync::atomic::AtomicU64,
}

fn page_of(a: usize) -> usize {
    (a - BASE) / PS
}

fn zeros() -> Box<[u8]> {
    vec![0u8; PS].into_boxed_slice()
}

impl SimPlatform {
    fn host(&self) -> std::sync::MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// A preemption point: now and then (from the seed), another thread —
    /// the background reclaim — runs a round here, as it may on the host
    /// whenever this thread holds neither the core lock nor the region lock
    /// exclusively.
    fn preempt(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.preempt_one_in == 0 || self.preempting.load(Relaxed) {
            return;
        }
        let want = {
            let mut h = self.host();
            if !h.rng.chance(self.preempt_one_in) {
                return;
            }
            1 + h.rng.below(8)
        };
        let Some(inner) = self.inner.get().and_then(|w| w.upgrade()) else { return };
        self.preempting.store(true, Relaxed);
        if inner.reclaim_if_unblocked(want) {
            self.preemptions.fetch_add(1, Relaxed);
        }
        self.preempting.store(false, Relaxed);
    }
    /// Checks a range of the program range (`EFAULT` outside, as `Arena`).
    fn check(a: usize, l: usize) -> Result<(), Errno> {
        if a >= BASE && a.is_multiple_of(PS) && l.is_multiple_of(PS) && a + l <= BASE + PAGES * PS {
            Ok(())
        } else {
            Err(Errno::EFAULT)
        }
    }
}

impl Host {
    fn fail(&mut self) -> bool {
        if self.fail_one_in != 0 && self.rng.chance(self.fail_one_in) {
            self.injected += 1;
            true
        } else {
            false
        }
    }
    /// How many of `n` pages an operation gets through (all, or a shorter
    /// prefix when a failure is injected).
    fn prefix(&mut self, n: usize) -> usize {
        if n > 0 && self.fail() {
            self.rng.below(n as u64) as usize
        } else {
            n
        }
    }
    /// Installs `pages` at the missing pages from `dst`, stopping at the
    /// first present one (`EEXIST`: a prefix). Returns bytes installed.
    fn install(&mut self, dst: usize, pages: Vec<Pg>) -> usize {
        let first = page_of(dst);
        let n = self.prefix(pages.len());
        let mut done = 0;
        for (k, pg) in pages.into_iter().take(n).enumerate() {
            if self.prog.contains_key(&(first + k)) {
                break;
            }
            self.prog.insert(first + k, pg);
            done += 1;
        }
        done * PS
    }
}

impl Platform for SimPlatform {
    fn base(&self) -> usize {
        BASE
    }
    fn host_lazyfree(&self) -> bool {
        false
    }
    fn can_move(&self) -> bool {
        self.host().can_move
    }
    fn wait_events(&self, _wake: &EventFd, _timeout_ms: i32) -> Result<bool, Errno> {
        Ok(false)
    }
    fn read_events(&self, _buf: &mut [UffdMsg]) -> Result<usize, Errno> {
        Ok(0)
    }
    fn zero_fill(&self, dst: usize, len: usize) -> Result<usize, Errno> {
        self.zero_fill_wake(dst, len, false)
    }
    fn zero_fill_wake(&self, dst: usize, len: usize, _wake: bool) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, len)?;
        Ok(self.host().install(dst, vec![Pg::Data(zeros()); len / PS]))
    }
    fn zero_map(&self, dst: usize, len: usize) -> Result<usize, Errno> {
        self.zero_map_wake(dst, len, false)
    }
    fn zero_map_wake(&self, dst: usize, len: usize, _wake: bool) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, len)?;
        Ok(self.host().install(dst, vec![Pg::Zero; len / PS]))
    }
    fn swap_in(&self, off: u64, dst: usize, len: usize) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, len)?;
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        let first = off / PS as u64;
        let pages =
            (0..(len / PS) as u64).map(|k| Pg::Data(h.swap.get(&(first + k)).cloned().unwrap_or_else(zeros))).collect();
        Ok(h.install(dst, pages))
    }
    fn file_in(&self, _file: &MappedFile, _off: u64, _dst: usize, _len: usize) -> Result<(usize, bool), Errno> {
        Err(Errno::ENOSYS)
    }
    fn wake(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)
    }
    fn poison(&self, a: usize, l: usize) -> Result<(), Errno> {
        Self::check(a, l)?;
        let mut h = self.host();
        for p in page_of(a)..page_of(a) + l / PS {
            h.prog.entry(p).or_insert(Pg::Poison);
        }
        Ok(())
    }
    fn protect(&self, a: usize, l: usize, prot: i32) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)?;
        let mut h = self.host();
        for p in page_of(a)..page_of(a) + l / PS {
            h.prot.insert(p, prot);
        }
        Ok(())
    }
    fn zap(&self, a: usize, l: usize, _prot: i32) -> Result<bool, Errno> {
        self.dontneed(a, l)?;
        Ok(false)
    }
    fn dontneed(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)?;
        let mut h = self.host();
        for p in page_of(a)..page_of(a) + l / PS {
            h.prog.remove(&p);
        }
        Ok(())
    }
    fn host_advise(&self, a: usize, l: usize, _advice: i32) -> Result<(), Errno> {
        Self::check(a, l)
    }
    fn host_free(&self, a: usize, l: usize) -> Result<(), Errno> {
        Self::check(a, l)
    }
    fn host_populate_write(&self, a: usize, l: usize) -> Result<(), Errno> {
        // Breaks the copy-on-write of zero pages (the executor asks for
        // those); a missing page would fault into the handlers, which the
        // simulation does not do from inside the platform: it is left.
        Self::check(a, l)?;
        let mut h = self.host();
        for p in page_of(a)..page_of(a) + l / PS {
            if h.prog.get(&p) == Some(&Pg::Zero) {
                h.prog.insert(p, Pg::Data(zeros()));
            }
        }
        Ok(())
    }
    fn host_lock(&self, a: usize, l: usize, _locked: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)
    }
    fn page_gone(&self, _a: usize) -> bool {
        false
    }
    fn zero_pfn_ranges(&self, addr: usize, len: usize) -> Vec<(usize, usize)> {
        let h = self.host();
        let mut out: Vec<(usize, usize)> = Vec::new();
        for p in page_of(addr)..page_of(addr) + len / PS {
            if h.prog.get(&p) == Some(&Pg::Zero) {
                let a = BASE + p * PS;
                match out.last_mut() {
                    Some(r) if r.1 == a => r.1 = a + PS,
                    _ => out.push((a, a + PS)),
                }
            }
        }
        out
    }
    fn slot_to_page(&self, slot: u32, dst: usize, _try_move: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(dst, PS)?;
        let mut h = self.host();
        let p = page_of(dst);
        if h.prog.contains_key(&p) {
            return Err(Errno::EEXIST);
        }
        if h.fail() {
            return Err(Errno::ENOMEM);
        }
        let data = h.staging.remove(&slot).expect("slot_to_page: an empty staging slot");
        h.prog.insert(p, Pg::Data(data));
        Ok(())
    }
    fn slot_to_page_checked(&self, slot: u32, dst: usize) -> Result<bool, Errno> {
        self.slot_to_page(slot, dst, false).map(|()| true)
    }
    fn pages_to_slots_move(&self, src: usize, slot: u32, n: usize) -> Result<usize, Errno> {
        self.preempt();
        Self::check(src, n * PS)?;
        let mut h = self.host();
        if !h.can_move {
            return Err(Errno::EINVAL);
        }
        let n = h.prefix(n);
        let first = page_of(src);
        for k in 0..n {
            let s = slot + k as u32;
            assert!(!h.staging.contains_key(&s), "move into the occupied staging slot {s}");
            let data = match h.prog.get(&(first + k)) {
                Some(Pg::Data(d)) => d.clone(),
                Some(Pg::Zero) => zeros(),
                // UFFDIO_MOVE: ENOENT at a missing page.
                _ => return if k > 0 { Ok(k) } else { Err(Errno::ENOENT) },
            };
            h.prog.remove(&(first + k));
            h.staging.insert(s, data);
        }
        Ok(n)
    }
    fn page_to_slot_copy(&self, src: usize, slot: u32, _unreadable: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(src, PS)?;
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EAGAIN);
        }
        let data = match h.prog.get(&page_of(src)) {
            Some(Pg::Data(d)) => d.clone(),
            Some(Pg::Zero) => zeros(),
            _ => return Err(Errno::EFAULT),
        };
        assert!(!h.staging.contains_key(&slot), "copy into the occupied staging slot {slot}");
        h.staging.insert(slot, data);
        h.prog.remove(&page_of(src));
        Ok(())
    }
    fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno> {
        let mut h = self.host();
        for s in slot..slot + n as u32 {
            h.staging.remove(&s);
        }
        Ok(())
    }
    fn discard_slot(&self, _slot: u32) -> bool {
        false
    }
    fn host_free_slot(&self, _slot: u32) -> Result<(), Errno> {
        Ok(())
    }
    fn drain_host_lru(&self) {}
    fn host_reclaim_staging(&self) {}
    fn has_swap(&self) -> bool {
        self.host().has_swap
    }
    fn swap_direct_io(&self) -> bool {
        false
    }
    fn swap_write(&self, slots: &[u32], off: u64) -> Result<(), Errno> {
        self.preempt();
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        let first = off / PS as u64;
        for (k, s) in slots.iter().enumerate() {
            let data = h.staging.get(s).cloned().expect("swap write of an empty staging slot");
            h.swap.insert(first + k as u64, data);
        }
        Ok(())
    }
    fn swap_contents(&self, _len: u64) -> Result<Vec<u8>, Errno> {
        Ok(Vec::new())
    }
    fn page_out_to_file(
        &self,
        _file: &MappedFile,
        _src: Option<usize>,
        _slot: Option<u32>,
        _off: u64,
    ) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn sigbus(&self, tid: u32, addr: usize) -> Result<(), Errno> {
        self.host().signals.push((tid, libc_sig::SIGBUS, addr));
        Ok(())
    }
    fn sigsegv(&self, tid: u32, addr: usize) -> Result<(), Errno> {
        self.host().signals.push((tid, libc_sig::SIGSEGV, addr));
        Ok(())
    }
}

/// Signal numbers (x86-64).
mod libc_sig {
    pub const SIGBUS: i32 = 7;
    pub const SIGSEGV: i32 = 11;
}

/// The model of one page: what Linux would give the program.
#[derive(Clone, Copy, Debug)]
struct Model {
    prot: i32,
    /// 0: private; else the shared mapping's identity.
    object: u64,
    locked: bool,
    /// The last stamp written (0: zeros).
    stamp: u64,
    /// Lazily freed (`MADV_FREE`) and not written since: reads the stamp or
    /// zeros.
    lazy: bool,
    /// Volatile (`mvolatile`): may be purged; a touch of a purged page is
    /// SIGBUS until `mnovolatile`.
    volatile: bool,
    /// Seen purged (a touch raised SIGBUS) since it became volatile.
    purged: bool,
    /// Locked and touched since (or present when locked): it must stay in
    /// memory until unlocked.
    pinned: bool,
}

impl Model {
    fn new(prot: i32, object: u64) -> Model {
        Model { prot, object, locked: false, stamp: 0, lazy: false, volatile: false, purged: false, pinned: false }
    }
}

/// What a run did (a guard against a vacuous simulation).
#[derive(Clone, Debug, Default)]
pub struct SimSummary {
    /// The run's configuration, drawn from its seed.
    pub what: String,
    pub steps: u64,
    pub touches: u64,
    pub faults: u64,
    pub swapins: u64,
    pub swapouts: u64,
    pub sigbus: u64,
    pub injected: u64,
    /// Background rounds run at a preemption point inside another step.
    pub preemptions: u64,
}

struct Sim {
    inner: Arc<Inner>,
    plat: Arc<SimPlatform>,
    rng: Rng,
    model: Vec<Option<Model>>,
    next_stamp: u64,
    next_object: u64,
    log: Vec<String>,
    sum: SimSummary,
}

/// The platform as the executor holds it (a `Box<dyn Platform>`) while the
/// simulation keeps a handle on the same host.
struct Shared(Arc<SimPlatform>);

macro_rules! forward {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $name(&self, $($a: $t),*) -> $r { self.0.$name($($a),*) })*
    };
}

impl Platform for Shared {
    forward! {
        base() -> usize;
        host_lazyfree() -> bool;
        can_move() -> bool;
        wait_events(wake: &EventFd, timeout_ms: i32) -> Result<bool, Errno>;
        read_events(buf: &mut [UffdMsg]) -> Result<usize, Errno>;
        zero_fill(dst: usize, len: usize) -> Result<usize, Errno>;
        zero_fill_wake(dst: usize, len: usize, wake: bool) -> Result<usize, Errno>;
        zero_map(dst: usize, len: usize) -> Result<usize, Errno>;
        zero_map_wake(dst: usize, len: usize, wake: bool) -> Result<usize, Errno>;
        swap_in(off: u64, dst: usize, len: usize) -> Result<usize, Errno>;
        file_in(file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno>;
        wake(a: usize, l: usize) -> Result<(), Errno>;
        poison(a: usize, l: usize) -> Result<(), Errno>;
        protect(a: usize, l: usize, prot: i32) -> Result<(), Errno>;
        zap(a: usize, l: usize, prot: i32) -> Result<bool, Errno>;
        dontneed(a: usize, l: usize) -> Result<(), Errno>;
        host_advise(a: usize, l: usize, advice: i32) -> Result<(), Errno>;
        host_free(a: usize, l: usize) -> Result<(), Errno>;
        host_populate_write(a: usize, l: usize) -> Result<(), Errno>;
        host_lock(a: usize, l: usize, locked: bool) -> Result<(), Errno>;
        page_gone(a: usize) -> bool;
        zero_pfn_ranges(addr: usize, len: usize) -> Vec<(usize, usize)>;
        slot_to_page(slot: u32, dst: usize, try_move: bool) -> Result<(), Errno>;
        slot_to_page_checked(slot: u32, dst: usize) -> Result<bool, Errno>;
        pages_to_slots_move(src: usize, slot: u32, n: usize) -> Result<usize, Errno>;
        page_to_slot_copy(src: usize, slot: u32, unreadable: bool) -> Result<(), Errno>;
        drop_slots(slot: u32, n: usize) -> Result<(), Errno>;
        discard_slot(slot: u32) -> bool;
        host_free_slot(slot: u32) -> Result<(), Errno>;
        drain_host_lru() -> ();
        host_reclaim_staging() -> ();
        has_swap() -> bool;
        swap_direct_io() -> bool;
        swap_write(slots: &[u32], off: u64) -> Result<(), Errno>;
        swap_contents(len: u64) -> Result<Vec<u8>, Errno>;
        page_out_to_file(file: &MappedFile, src: Option<usize>, slot: Option<u32>, off: u64) -> Result<(), Errno>;
        sigbus(tid: u32, addr: usize) -> Result<(), Errno>;
        sigsegv(tid: u32, addr: usize) -> Result<(), Errno>;
    }
}

/// The outcome of a touch.
#[derive(Debug, PartialEq, Eq)]
enum Touch {
    /// The bytes read (a read) or written over (a write).
    Done(u64, u64),
    Segv,
    /// SIGBUS raised by the host at a poison marker (a purged page).
    Bus,
    /// SIGBUS queued by the executor (a swap read error, out of memory).
    BusQueued,
}

impl Sim {
    fn addr(p: usize) -> usize {
        BASE + p * PS
    }

    /// The program touches page `p` (reads its two stamp words, or writes
    /// `stamp` to them), faulting into the executor as the kernel would.
    fn touch(&mut self, p: usize, write: Option<u64>) -> Touch {
        for _ in 0..64 {
            {
                let mut h = self.plat.host();
                let prot = h.prot.get(&p).copied().unwrap_or(PROT_NONE);
                let allowed =
                    if write.is_some() { prot & PROT_WRITE != 0 } else { prot & (PROT_READ | PROT_WRITE) != 0 };
                if !allowed {
                    return Touch::Segv;
                }
                match h.prog.get_mut(&p) {
                    Some(Pg::Poison) => return Touch::Bus,
                    Some(pg) => {
                        if write.is_some() && *pg == Pg::Zero {
                            *pg = Pg::Data(zeros());
                        }
                        let (a, b) = match pg {
                            Pg::Data(d) => (
                                u64::from_le_bytes(d[..8].try_into().unwrap()),
                                u64::from_le_bytes(d[PS - 8..].try_into().unwrap()),
                            ),
                            _ => (0, 0),
                        };
                        if let (Some(s), Pg::Data(d)) = (write, pg) {
                            d[..8].copy_from_slice(&s.to_le_bytes());
                            d[PS - 8..].copy_from_slice(&s.to_le_bytes());
                        }
                        return Touch::Done(a, b);
                    }
                    None => {}
                }
            }
            // A missing page: the kernel queues a fault; a handler serves it.
            self.sum.faults += 1;
            self.inner.resolve(Self::addr(p), write.is_some(), Some(TID));
            let sig = {
                let mut h = self.plat.host();
                let i = h.signals.iter().position(|s| s.0 == TID);
                i.map(|i| h.signals.remove(i))
            };
            match sig {
                Some((_, libc_sig::SIGBUS, a)) => {
                    assert_eq!(a, Self::addr(p), "SIGBUS at another address");
                    return Touch::BusQueued;
                }
                Some((_, _, _)) => return Touch::Segv,
                None => {}
            }
        }
        panic!("the fault at page {p} was never served");
    }

    fn random_range(&mut self) -> (usize, usize) {
        let start = self.rng.below(PAGES as u64) as usize;
        let long = self.rng.chance(4);
        let len = 1 + self.rng.below(if long { 32 } else { 8 }) as usize;
        (start, len.min(PAGES - start))
    }

    fn step(&mut self) {
        self.sum.steps += 1;
        match self.rng.below(24) {
            0..=2 => {
                let (s, l) = self.random_range();
                let prot =
                    [PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE][self.rng.below(4) as usize];
                let shared = self.rng.chance(4);
                let flags = MAP_FIXED | MAP_ANONYMOUS | if shared { MAP_SHARED } else { MAP_PRIVATE };
                self.log.push(format!("mmap p{s}+{l} prot {prot} shared {shared}"));
                let r = self.inner.mmap(Self::addr(s), l * PS, prot, flags, -1, 0);
                assert_eq!(r, Ok(Self::addr(s)), "mmap");
                let object = if shared {
                    self.next_object += 1;
                    self.next_object
                } else {
                    0
                };
                for q in s..s + l {
                    self.model[q] = Some(Model::new(prot, object));
                }
            }
            3 => {
                let (s, l) = self.random_range();
                self.log.push(format!("munmap p{s}+{l}"));
                assert_eq!(self.inner.munmap(Self::addr(s), l * PS), Ok(()), "munmap");
                for q in s..s + l {
                    self.model[q] = None;
                }
            }
            4 => {
                let (s, l) = self.random_range();
                let prot = [PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE][self.rng.below(3) as usize];
                self.log.push(format!("mprotect p{s}+{l} prot {prot}"));
                let r = self.inner.mprotect(Self::addr(s), l * PS, prot);
                let mut hole = false;
                for q in s..s + l {
                    match &mut self.model[q] {
                        Some(m) if !hole => m.prot = prot,
                        Some(_) => {}
                        None => hole = true,
                    }
                }
                assert_eq!(r, if hole { Err(Errno::ENOMEM) } else { Ok(()) }, "mprotect");
            }
            5..=7 => {
                let (s, l) = self.random_range();
                let advice = [
                    MADV_DONTNEED,
                    MADV_COLD,
                    MADV_PAGEOUT,
                    MADV_WILLNEED,
                    MADV_POPULATE_READ,
                    MADV_POPULATE_WRITE,
                    MADV_NORMAL,
                    MADV_FREE,
                ][self.rng.below(8) as usize];
                self.log.push(format!("madvise p{s}+{l} advice {advice}"));
                let r = self.inner.madvise(Self::addr(s), l * PS, advice);
                // Errors follow Linux's rules, which the core's own
                // simulation checks; here: the bytes.
                if advice == MADV_DONTNEED {
                    let mut stop = false;
                    for q in s..s + l {
                        if let Some(m) = &mut self.model[q] {
                            if m.locked {
                                stop = true;
                            }
                            if !stop && m.object == 0 {
                                m.stamp = 0;
                                m.lazy = false;
                                m.volatile = false;
                                m.purged = false;
                            }
                        }
                    }
                    if !stop && (s..s + l).all(|q| self.model[q].is_some()) {
                        assert_eq!(r, Ok(()), "madvise(DONTNEED)");
                    }
                }
                if advice == MADV_FREE {
                    // Linux: only private anonymous memory, never locked;
                    // the walk stops with EINVAL at any other mapping.
                    for q in s..s + l {
                        if let Some(m) = &mut self.model[q] {
                            if m.locked || m.object != 0 {
                                break;
                            }
                            m.lazy = true;
                        }
                    }
                }
            }
            8 => {
                let (s, l) = self.random_range();
                let lock = self.rng.chance(2);
                if lock && (s..s + l).any(|q| self.model[q].is_some_and(|m| m.volatile)) {
                    // EINVAL (SPEC): the core's tests check that.
                    return;
                }
                self.log.push(format!("{} p{s}+{l}", if lock { "mlock2(ONFAULT)" } else { "munlock" }));
                let mode = if lock { LockMode::OnFault } else { LockMode::None };
                let (a, n) = (Self::addr(s) as u64, (l * PS) as u64);
                // (Whether each page is in memory when the call is made: a
                // lock pins it.)
                let present: Vec<bool> =
                    (s..s + l).map(|q| self.inner.page_state(Self::addr(q)).holds_frame()).collect();
                let r = self.inner.lock_call(|c| c.lock_range(a, n, mode));
                let mut hole = false;
                for q in s..s + l {
                    let present = present[q - s];
                    match &mut self.model[q] {
                        Some(m) if !hole => {
                            m.locked = lock;
                            m.pinned = lock && (m.pinned || present);
                        }
                        Some(_) => {}
                        None => hole = true,
                    }
                }
                if !hole {
                    assert_eq!(r, Ok(()), "mlock2/munlock");
                }
            }
            9..=10 => {
                self.log.push("background step".into());
                self.inner.background_step();
            }
            11 => self.op_mvolatile(),
            12 => self.op_mnovolatile(),
            _ => {
                let p = self.rng.below(PAGES as u64) as usize;
                let write = self.rng.chance(2);
                self.touch_checked(p, write);
            }
        }
        self.inner.validate_core();
        // Locked pages that were touched never leave memory.
        for (q, m) in self.model.iter().enumerate() {
            if m.is_some_and(|m| m.pinned) {
                let st = self.inner.page_state(Self::addr(q));
                assert!(matches!(st, PState::Resident | PState::Inactive), "p{q}: locked and touched, but {st:?}");
            }
        }
    }

    /// `mvolatile` over a run of mapped private pages (its errors are the
    /// core's to check).
    fn op_mvolatile(&mut self) {
        let (s, l) = self.random_range();
        if !(s..s + l).all(|q| self.model[q].is_some_and(|m| m.object == 0 && !m.locked)) {
            return;
        }
        self.log.push(format!("mvolatile p{s}+{l}"));
        assert_eq!(self.inner.mvolatile(Self::addr(s), l * PS), Ok(()), "mvolatile");
        for q in s..s + l {
            self.model[q].as_mut().unwrap().volatile = true;
        }
    }

    /// `mnovolatile`: its purge report is exact — every page seen purged is
    /// in it, and a page in it reads zeros from now on (one not in it keeps
    /// its bytes, which later reads check).
    fn op_mnovolatile(&mut self) {
        let (s, l) = self.random_range();
        if !(s..s + l).all(|q| self.model[q].is_some()) {
            return;
        }
        self.log.push(format!("mnovolatile p{s}+{l}"));
        let (purged, r) = self.inner.mnovolatile(Self::addr(s), l * PS).expect("mnovolatile");
        assert_eq!(r, Ok(()), "mnovolatile");
        let purged: Vec<usize> = purged.iter().map(|&a| page_of(a)).collect();
        for q in s..s + l {
            let m = self.model[q].as_mut().unwrap();
            let in_report = purged.contains(&q);
            assert!(!m.purged || in_report, "p{q}: seen purged, not in the purge report {purged:?}");
            assert!(m.volatile || !in_report, "p{q}: reported purged, but it was not volatile");
            if in_report {
                m.stamp = 0;
            }
            m.volatile = false;
            m.purged = false;
            if in_report {
                m.lazy = false;
            }
        }
        self.log.push(format!("  purged {purged:?}"));
    }

    /// A touch, checked against the model.
    fn touch_checked(&mut self, p: usize, write: bool) {
        self.sum.touches += 1;
        let stamp = if write {
            self.next_stamp += 1;
            Some(self.next_stamp)
        } else {
            None
        };
        self.log.push(format!("touch p{p} write {write}"));
        let m = self.model[p];
        let got = self.touch(p, stamp);
        let allowed =
            m.is_some_and(|m| if write { m.prot & PROT_WRITE != 0 } else { m.prot & (PROT_READ | PROT_WRITE) != 0 });
        match got {
            Touch::Done(a, b) => {
                let m = m.unwrap_or_else(|| panic!("p{p}: touch of an unmapped page succeeded"));
                assert!(allowed, "p{p}: touch with prot {} succeeded", m.prot);
                assert!(!m.purged, "p{p}: a purged volatile page was read");
                let lazy_zero = m.lazy && (a, b) == (0, 0);
                assert!(
                    (a, b) == (m.stamp, m.stamp) || lazy_zero,
                    "p{p}: read stamps {a}/{b}, the model says {}{}",
                    m.stamp,
                    if m.lazy { " or zeros" } else { "" }
                );
                // (Shared anonymous pages are one page per address here:
                // each mapping is its own object.)
                let mm = self.model[p].as_mut().unwrap();
                if lazy_zero {
                    mm.stamp = 0;
                    mm.lazy = false;
                }
                if let Some(s) = stamp {
                    mm.stamp = s;
                    mm.lazy = false;
                }
                if mm.locked {
                    mm.pinned = true;
                }
            }
            Touch::Segv => assert!(!allowed, "p{p}: SIGSEGV on an allowed touch"),
            // A purged volatile page: its data is gone.
            Touch::Bus => {
                assert!(allowed, "p{p}: SIGBUS on a touch that should SIGSEGV");
                let mm = self.model[p].as_mut().unwrap();
                assert!(mm.volatile, "p{p}: a poison marker on a page that is not volatile");
                mm.purged = true;
                self.sum.sigbus += 1;
            }
            // Out of memory (all resident locked) or an injected swap read
            // error: the data stays as it was.
            Touch::BusQueued => {
                assert!(allowed, "p{p}: SIGBUS on a touch that should SIGSEGV");
                self.sum.sigbus += 1;
            }
        }
    }
}

/// Runs one seeded simulation of `steps` steps; `Err` says what failed, the
/// steps before it and how to reproduce it.
pub fn run(seed: u64, steps: usize) -> Result<SimSummary, String> {
    run_with(seed, steps, None)
}

/// Bugs the simulation must catch, injected into the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// An eviction whose swap write failed is taken as done: the page's
    /// data is lost (it reads back whatever the swap slot held).
    LostSwapWrite,
}

/// `run` with an executor bug injected.
pub fn run_with(seed: u64, steps: usize, bug: Option<Bug>) -> Result<SimSummary, String> {
    let mut rng = Rng::new(seed);
    let budget_pages = [8usize, 16, 32][rng.below(3) as usize];
    // Swap: none now and then (anonymous memory is then unevictable, and
    // faults past the budget are out of memory), else some or plenty.
    let swap_pages = if rng.chance(6) { 0 } else { [32usize, 256][rng.below(2) as usize] };
    let fail_one_in = [0u64, 16, 64][rng.below(3) as usize];
    let can_move = !rng.chance(4);
    let exact = rng.chance(2);
    let cfg = Config {
        budget_bytes: budget_pages * PS,
        swap_bytes: swap_pages * PS,
        reserve_bytes: PAGES * PS,
        flags: if exact { UMM_F_EXACT_FAULTS } else { 0 },
        ..Config::default()
    };
    let preempt_one_in = [0u64, 4, 16][rng.below(3) as usize];
    let plat = Arc::new(SimPlatform {
        inner: std::sync::OnceLock::new(),
        preempt_one_in,
        preempting: std::sync::atomic::AtomicBool::new(false),
        preemptions: std::sync::atomic::AtomicU64::new(0),
        host: Mutex::new(Host {
            prog: HashMap::new(),
            prot: HashMap::new(),
            staging: HashMap::new(),
            swap: HashMap::new(),
            signals: Vec::new(),
            rng: Rng::new(seed ^ 0x5151),
            fail_one_in,
            can_move,
            has_swap: swap_pages > 0,
            injected: 0,
        }),
    });
    let what = format!(
        "seed {seed:#x} (budget {budget_pages}, swap {swap_pages}, fail 1/{fail_one_in}, move {can_move}, exact {exact}, preempt 1/{preempt_one_in})"
    );
    let inner = Inner::build(&cfg, Box::new(Shared(plat.clone())), false, None).map_err(|e| format!("{what}: {e}"))?;
    inner.set_oom_wait_us(0);
    let _ = plat.inner.set(Arc::downgrade(&inner));
    if bug == Some(Bug::LostSwapWrite) {
        inner.sim_bug.store(crate::native::SIM_BUG_LOST_SWAP_WRITE, std::sync::atomic::Ordering::Relaxed);
    }
    let mut sim = Sim {
        inner,
        plat,
        rng,
        model: vec![None; PAGES],
        next_stamp: 0,
        next_object: 0,
        log: Vec::new(),
        sum: SimSummary::default(),
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            sim.step();
        }
        // Every page, read back at the end.
        for p in 0..PAGES {
            sim.touch_checked(p, false);
        }
    }));
    let c = sim.inner.core_counters();
    sim.sum.swapins = c.swapins;
    sim.sum.swapouts = c.swapouts;
    sim.sum.injected = sim.plat.host().injected;
    sim.sum.preemptions = sim.plat.preemptions.load(std::sync::atomic::Ordering::Relaxed);
    sim.sum.what = what.clone();
    match r {
        Ok(()) => Ok(sim.sum),
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let tail = sim.log.len().saturating_sub(30);
            Err(format!(
                "{what}: step {}: {msg}\nreproduce with USERMM_SIM_SEED={seed:#x}\nlast steps:\n  {}",
                sim.log.len(),
                sim.log[tail..].join("\n  ")
            ))
        }
    }
}
