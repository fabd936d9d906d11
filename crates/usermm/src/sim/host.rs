//! The simulated host: the program range, staging and swap as byte
//! arrays, signals recorded, failures and preemption points injected from
//! the seed; and `Shared`, the handle the executor holds on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use usermm_core::Errno;
use usermm_sys::file::MappedFile;
use usermm_sys::thread::EventFd;
use usermm_sys::uffd::UffdMsg;

use super::lazy::HostLazy;
use super::threads::OtherThread;
use super::{Rng, BASE, PAGES, PS};
use crate::native::Inner;
use crate::platform::{Caps, Fill, FillOps, Platform, Range, RangeOps, Runs, Staging, Store, Thread, Upkeep, Zero};

/// A page of the simulated program range.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) enum Pg {
    /// The shared zero page (a read fault's mapping; a write copies it).
    Zero,
    Data(Box<[u8]>),
    /// A poison marker: a touch raises SIGBUS.
    Poison,
}

/// What the simulated host holds.
pub(super) struct Host {
    /// Program range, by page index.
    pub(super) prog: HashMap<usize, Pg>,
    /// Host protection by page index (the reservation starts `PROT_NONE`).
    pub(super) prot: HashMap<usize, i32>,
    pub(super) staging: HashMap<u32, Box<[u8]>>,
    /// Swap, by page offset.
    pub(super) swap: HashMap<u64, Box<[u8]>>,
    /// Signals queued and not yet taken: (thread, signal, address).
    pub(super) signals: Vec<(u32, i32, usize)>,
    /// The range whose faults are resolved in the faulting thread
    /// (`Thread::InThreadOn`; the simulation's are, whatever it says).
    pub(super) in_thread: Option<(usize, usize)>,
    pub(super) rng: Rng,
    /// One in how many operations fail (0: none).
    pub(super) fail_one_in: u64,
    pub(super) can_move: bool,
    /// The program range is registered in WP mode too (`tracks_writes`).
    pub(super) tracks_writes: bool,
    /// Pages installed write-protected: a write to one is a WP fault. Any
    /// page that leaves the program range or is installed anew loses it
    /// (a move does not carry the bit).
    pub(super) wp: std::collections::HashSet<usize>,
    pub(super) has_swap: bool,
    /// Swap slots the simulated store gives back at a time (0: none).
    pub(super) release_granule: u32,
    pub(super) injected: u64,
    /// The host's own lazy free: `MADV_FREE` passed down to it, and the
    /// pages it may drop by itself under its own pressure.
    pub(super) lazy: HostLazy,
}

/// The simulated host.
pub(crate) struct SimPlatform {
    pub(super) host: Mutex<Host>,
    /// The space, for preemption: another thread's reclaim round run at a
    /// platform call of this one (set once the space is built).
    pub(super) inner: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// One in how many platform calls is a preemption point (0: none).
    pub(super) preempt_one_in: u64,
    /// A preempting round is running (no preemption inside it).
    pub(super) preempting: std::sync::atomic::AtomicBool,
    pub(super) preemptions: std::sync::atomic::AtomicU64,
    /// The second program thread, which touches pages at preemption points.
    pub(super) other: Mutex<OtherThread>,
    /// Faults taken by either program thread.
    pub(super) faults: std::sync::atomic::AtomicU64,
    /// Of those, WP faults.
    pub(super) wp_faults: std::sync::atomic::AtomicU64,
}

pub(super) fn page_of(a: usize) -> usize {
    (a - BASE) / PS
}

pub(super) fn zeros() -> Box<[u8]> {
    vec![0u8; PS].into_boxed_slice()
}

impl SimPlatform {
    pub(super) fn host(&self) -> std::sync::MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// A preemption point: now and then (from the seed), another thread —
    /// the background reclaim — runs a round here, as it may on the host
    /// whenever this thread holds neither the core lock nor the region lock
    /// exclusively; and now and then the second program thread touches a
    /// page.
    pub(super) fn preempt(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.preempting.load(Relaxed) {
            return;
        }
        let Some(inner) = self.inner.get().and_then(|w| w.upgrade()) else { return };
        self.preempting.store(true, Relaxed);
        let want = (self.preempt_one_in != 0)
            .then(|| {
                let mut h = self.host();
                h.rng.one_in(self.preempt_one_in).then(|| 1 + h.rng.below(8))
            })
            .flatten();
        if want.is_some_and(|want| inner.reclaim_if_unblocked(want)) {
            self.preemptions.fetch_add(1, Relaxed);
        }
        self.host().host_drops_one();
        self.other_touch(&inner);
        self.preempting.store(false, Relaxed);
    }

    /// A copy of the program page at `a`, as `process_vm_readv` makes it:
    /// a missing page faults in through the executor's handler first (the
    /// copy runs with no lock of the executor held).
    fn copy_out(&self, a: usize) -> Result<Box<[u8]>, Errno> {
        Self::check(a, PS)?;
        for _ in 0..64 {
            {
                let h = self.host();
                match h.prog.get(&page_of(a)) {
                    Some(Pg::Data(d)) => return Ok(d.clone()),
                    Some(Pg::Zero) => return Ok(zeros()),
                    Some(Pg::Poison) => return Err(Errno::EFAULT),
                    None => {}
                }
            }
            let inner = self.inner.get().and_then(|w| w.upgrade()).ok_or(Errno::EFAULT)?;
            inner.resolve(a, false, None);
        }
        Err(Errno::EFAULT)
    }
    /// Checks a range of the program range (`EFAULT` outside, as `Arena`).
    pub(super) fn check(a: usize, l: usize) -> Result<(), Errno> {
        if a >= BASE && a.is_multiple_of(PS) && l.is_multiple_of(PS) && a + l <= BASE + PAGES * PS {
            Ok(())
        } else {
            Err(Errno::EFAULT)
        }
    }
}

impl Host {
    pub(super) fn fail(&mut self) -> bool {
        if self.fail_one_in != 0 && self.rng.one_in(self.fail_one_in) {
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
            self.wp.remove(&(first + k));
            done += 1;
        }
        done * PS
    }
}

impl SimPlatform {
    /// The pages of `file` from `off`, up to `len` bytes and the end of the
    /// file (the last one's tail zeros; none past the end), read for real;
    /// an injected failure is `EIO`.
    fn read_file_pages(&self, file: &MappedFile, off: u64, len: usize) -> Result<Vec<Pg>, Errno> {
        let size = file.size()?;
        if off >= size {
            return Ok(Vec::new());
        }
        if self.host().fail() {
            return Err(Errno::EIO);
        }
        let want = len.min((size - off) as usize);
        let mut buf = vec![0u8; want.div_ceil(PS) * PS];
        let done = file.read_at(&mut buf[..want], off)?;
        Ok((0..done.div_ceil(PS)).map(|k| Pg::Data(buf[k * PS..(k + 1) * PS].to_vec().into_boxed_slice())).collect())
    }
}

std::thread_local! {
    /// What this thread's last `swap_read` (or `file_read`) read, for its
    /// `swap_install` (`file_install`).
    static SWAP_READ: std::cell::RefCell<Vec<Pg>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl SimPlatform {
    fn zero_page_runs(&self, addr: usize, len: usize) -> Vec<(usize, usize)> {
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
}

impl RangeOps for SimPlatform {
    fn page_gone(&self, a: usize) -> bool {
        let h = self.host();
        h.lazy.on && !h.prog.contains_key(&page_of(a))
    }
    fn unprotect(&self, a: usize, l: usize) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)?;
        let mut h = self.host();
        for p in page_of(a)..page_of(a) + l / PS {
            h.wp.remove(&p);
        }
        Ok(())
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
            h.wp.remove(&p);
            h.lazy.pages.remove(&p);
        }
        Ok(())
    }
    fn host_advise(&self, a: usize, l: usize, _advice: i32) -> Result<(), Errno> {
        Self::check(a, l)
    }
    fn host_free(&self, a: usize, l: usize) -> Result<(), Errno> {
        Self::check(a, l)?;
        let mut h = self.host();
        if h.lazy.on {
            // (The zero page is nobody's to free.)
            for p in page_of(a)..page_of(a) + l / PS {
                if matches!(h.prog.get(&p), Some(Pg::Data(_))) {
                    h.lazy.pages.insert(p);
                }
            }
        }
        Ok(())
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
            // A write populate dirties a lazily freed page: kept.
            h.lazy.pages.remove(&p);
        }
        Ok(())
    }
    fn host_lock(&self, a: usize, l: usize, _locked: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(a, l)
    }
}

impl FillOps for SimPlatform {
    fn zero(&self, how: Zero, dst: usize, len: usize, _wake: bool) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, len)?;
        // (The simulated host has no frames to recycle: a pooled fill is a
        // fill.)
        let pg = if how == Zero::Map { Pg::Zero } else { Pg::Data(zeros()) };
        Ok(self.host().install(dst, vec![pg; len / PS]))
    }
    fn swap_in(&self, off: u64, dst: usize, len: usize, wp: bool) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, len)?;
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        let first = off / PS as u64;
        let pages =
            (0..(len / PS) as u64).map(|k| Pg::Data(h.swap.get(&(first + k)).cloned().unwrap_or_else(zeros))).collect();
        let done = h.install(dst, pages);
        if wp && h.tracks_writes {
            let p0 = page_of(dst);
            h.wp.extend(p0..p0 + done / PS);
        }
        Ok(done)
    }
    fn swap_install(&self, dst: usize, len: usize, wp: bool, _wake: bool) -> Result<usize, Errno> {
        // (Taken before the preemption point: a fault served there reads
        // and installs its own.)
        let pages = SWAP_READ.with(|r| std::mem::take(&mut *r.borrow_mut()));
        self.preempt();
        Self::check(dst, len)?;
        if pages.len() * PS < len {
            return Err(Errno::EINVAL);
        }
        let mut h = self.host();
        let done = h.install(dst, pages.into_iter().take(len / PS).collect());
        if wp && h.tracks_writes {
            let p0 = page_of(dst);
            h.wp.extend(p0..p0 + done / PS);
        }
        Ok(done)
    }
    fn file_install(&self, dst: usize, from: usize, len: usize, _wake: bool) -> Result<usize, Errno> {
        // (Read before the preemption point, as in `swap_install`; a run
        // is installed in parts, so the read stays for the next part.)
        let pages: Option<Vec<_>> = SWAP_READ.with(|r| r.borrow().get(from / PS..(from + len) / PS).map(<[_]>::to_vec));
        self.preempt();
        Self::check(dst + from, len)?;
        let Some(pages) = pages else { return Err(Errno::EINVAL) };
        Ok(self.host().install(dst + from, pages))
    }
}

impl Platform for SimPlatform {
    fn runs(&self, what: Runs, a: usize, l: usize) -> Vec<(usize, usize)> {
        match what {
            Runs::ZeroPage => self.zero_page_runs(a, l),
            // (No file windows here, nor memory handed to the host: the
            // simulated host refuses `share`.)
            Runs::FileWindows | Runs::Shared | Runs::SharedResident => Vec::new(),
        }
    }
    fn upkeep(&self, _op: Upkeep) {}
    fn fill(&self, op: Fill, dst: usize, len: usize) -> Result<usize, Errno> {
        op.dispatch(self, dst, len)
    }
    fn store(&self, op: Store<'_>) -> Result<bool, Errno> {
        op.dispatch(self)
    }
    fn staging(&self, op: Staging<'_>) -> Result<bool, Errno> {
        op.dispatch(self)
    }
    fn range(&self, op: Range, a: usize, l: usize) -> Result<bool, Errno> {
        op.dispatch(self, a, l)
    }
    fn caps(&self) -> Caps {
        let h = self.host();
        Caps {
            base: BASE,
            host_lazyfree: h.lazy.on,
            can_move: h.can_move,
            tracks_writes: h.tracks_writes,
            has_swap: h.has_swap,
            swap_release_granule: h.release_granule,
            swap_write_granule: h.release_granule,
            // (Two CPUs, as the machine usermm is measured on; the host's
            // mlock refuses exec-only memory, as Linux 6.18's first builds.)
            cpus: 2,
            mlock_exec_only: false,
            ..Caps::default()
        }
    }
    fn wait_events(&self, _wake: &EventFd, _timeout_ms: i32) -> Result<bool, Errno> {
        Ok(false)
    }
    fn read_events(&self, _buf: &mut [UffdMsg]) -> Result<usize, Errno> {
        Ok(0)
    }
    fn pool_stats(&self) -> (u64, u64) {
        (0, 0)
    }
    fn swap_read(&self, off: u64, len: usize, _pooled: bool) -> Result<(), Errno> {
        self.preempt();
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        let first = off / PS as u64;
        let pages: Vec<Pg> =
            (0..(len / PS) as u64).map(|k| Pg::Data(h.swap.get(&(first + k)).cloned().unwrap_or_else(zeros))).collect();
        SWAP_READ.with(|r| *r.borrow_mut() = pages);
        Ok(())
    }
    fn file_in(&self, file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno> {
        // The file is a real memfd (the executor's file table holds it):
        // its bytes are read for real, installed as the host would.
        self.preempt();
        Self::check(dst, len)?;
        let pgs = self.read_file_pages(file, off, len)?;
        Ok((self.host().install(dst, pgs), true))
    }
    fn file_read(&self, file: &MappedFile, off: u64, len: usize) -> Result<(usize, bool), Errno> {
        self.preempt();
        let pgs = self.read_file_pages(file, off, len)?;
        let bytes = pgs.len() * PS;
        SWAP_READ.with(|r| *r.borrow_mut() = pgs);
        Ok((bytes, true))
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
            // (UFFDIO_MOVE does not carry the write protection.)
            h.wp.remove(&(first + k));
            let clean = h.lazy.pages.remove(&(first + k));
            h.fill_slot(s, data, clean);
        }
        // The host's count is not to be trusted after a failure (seen on
        // 6.18: `EEXIST` for a run whose pages had all moved): now and then
        // it says fewer pages than it moved.
        if n > 0 && h.fail() {
            let said = h.rng.below(n as u64) as usize;
            return if said > 0 { Ok(said) } else { Err(Errno::EEXIST) };
        }
        Ok(n)
    }
    fn slots_to_pages_move(&self, slot: u32, dst: usize, n: usize) -> Result<usize, Errno> {
        self.preempt();
        Self::check(dst, n * PS)?;
        let mut h = self.host();
        if !h.can_move {
            return Err(Errno::EINVAL);
        }
        let n = h.prefix(n);
        for k in 0..n {
            if let Err(e) = h.slot_back(slot + k as u32, page_of(dst) + k, true, true) {
                return if k > 0 { Ok(k) } else { Err(e) };
            }
        }
        Ok(n)
    }
    fn swap_contents(&self, _len: u64) -> Result<Vec<u8>, Errno> {
        Ok(Vec::new())
    }
    fn page_out_to_file(
        &self,
        file: &MappedFile,
        src: Option<usize>,
        slot: Option<u32>,
        off: u64,
    ) -> Result<(), Errno> {
        self.preempt();
        let size = file.size()?;
        if off >= size {
            return Ok(());
        }
        let data = match (slot, src) {
            // (No failure injected: a failed write-back at munmap loses the
            // page, reported as EIO — a documented deviation, not checked.)
            (Some(s), _) => self.host().staging.get(&s).cloned().expect("write-back of an empty staging slot"),
            (None, Some(a)) => self.copy_out(a)?,
            (None, None) => return Err(Errno::EINVAL),
        };
        let len = PS.min((size - off) as usize);
        file.write_at(&data[..len], off)
    }
    fn thread(&self, op: Thread) -> Result<bool, Errno> {
        op.dispatch(self)
    }
}

/// Signal numbers (x86-64).
pub(super) mod libc_sig {
    pub const SIGBUS: i32 = 7;
    pub const SIGSEGV: i32 = 11;
}

/// The platform as the executor holds it (a `Box<dyn Platform>`) while the
/// simulation keeps a handle on the same host.
pub(super) struct Shared(pub Arc<SimPlatform>);

macro_rules! forward {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $name(&self, $($a: $t),*) -> $r { self.0.$name($($a),*) })*
    };
}

impl Platform for Shared {
    forward! {
        caps() -> Caps;
        runs(what: Runs, a: usize, l: usize) -> Vec<(usize, usize)>;
        upkeep(op: Upkeep) -> ();
        fill(op: Fill, dst: usize, len: usize) -> Result<usize, Errno>;
        store(op: Store<'_>) -> Result<bool, Errno>;
        staging(op: Staging<'_>) -> Result<bool, Errno>;
        range(op: Range, a: usize, l: usize) -> Result<bool, Errno>;
        wait_events(wake: &EventFd, timeout_ms: i32) -> Result<bool, Errno>;
        read_events(buf: &mut [UffdMsg]) -> Result<usize, Errno>;
        swap_read(off: u64, len: usize, pooled: bool) -> Result<(), Errno>;
        pool_stats() -> (u64, u64);
        file_in(file: &MappedFile, off: u64, dst: usize, len: usize) -> Result<(usize, bool), Errno>;
        file_read(file: &MappedFile, off: u64, len: usize) -> Result<(usize, bool), Errno>;
        pages_to_slots_move(src: usize, slot: u32, n: usize) -> Result<usize, Errno>;
        slots_to_pages_move(slot: u32, dst: usize, n: usize) -> Result<usize, Errno>;
        swap_contents(len: u64) -> Result<Vec<u8>, Errno>;
        page_out_to_file(file: &MappedFile, src: Option<usize>, slot: Option<u32>, off: u64) -> Result<(), Errno>;
        thread(op: Thread) -> Result<bool, Errno>;
    }
}
