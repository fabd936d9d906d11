//! Two backends behind one trait, so that a scenario can run against the host
//! kernel (the oracle) and against usermm and have its results compared.
//!
//! Addresses are absolute, but every scenario computes them from `base()`:
//! the kernel backend's base is the start of a private [`KernelArena`] (a
//! real hole in the address space), usermm's is the start of the space's
//! reservation. Both are at least 1 GiB long, and scenarios stay inside that
//! first GiB, where "unmapped" means the same thing on both sides.
//!
//! ```text
//!   kernel:  base ............ (hole) ............ base+1G
//!   usermm:  base ...... (reserved, unmapped) .... base+1G ... reserve end
//! ```

#![allow(dead_code)]

use usermm::consts::*;
use usermm::{Config, Errno, Space};
use usermm_sys::kernel::{self, KernelArena};

pub const PAGE: usize = 4096;
pub const ARENA_BYTES: usize = 1 << 30;
pub const RW: i32 = PROT_READ | PROT_WRITE;
/// What a vector holds before [`Mm::mincore_into`] (neither 0 nor 1).
pub const VEC_FILL: u8 = 0x55;
pub const ANON_PRIVATE: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
pub const FIXED_PRIVATE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
pub const FIXED_SHARED: i32 = MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED;

/// The address-based calls both backends share.
pub trait Mm {
    fn name(&self) -> &'static str;
    /// The first address scenarios use (page aligned, at least 1 GiB usable).
    fn base(&self) -> usize;
    /// `mmap(addr, len, prot, flags, -1, off)`.
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, off: i64) -> Result<usize, Errno>;
    /// `mmap(addr, len, prot, flags, fd, off)` of a file.
    fn mmap_fd(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno>;
    fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno>;
    fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno>;
    fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno>;
    /// `mincore`: on error only the errno is compared.
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno>;
    /// `mincore` into a vector of only `vec_len` bytes, whatever the
    /// range's page count: the kernel's with unmapped memory right after
    /// the vector (a NULL vector for 0), usermm's with a slice that long.
    fn mincore_short(&self, addr: usize, len: usize, vec_len: usize) -> Result<Vec<u8>, Errno> {
        let (r, v) = self.mincore_into(addr, len, vec_len);
        r.map(|()| v)
    }
    /// [`Mm::mincore_short`] with a vector of `VEC_FILL` bytes, and what
    /// the vector holds afterwards, also on error.
    fn mincore_into(&self, addr: usize, len: usize, vec_len: usize) -> (Result<(), Errno>, Vec<u8>);
    /// `msync(addr, len, flags)`.
    fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno>;
    /// User-mode loads of `out.len()` bytes from `addr` (the range must be
    /// mapped readable).
    fn read_bytes(&self, addr: usize, out: &mut [u8]) {
        read_bytes(addr, out)
    }
    /// User-mode stores of `data` at `addr` (the range must be mapped
    /// writable).
    fn write_bytes(&self, addr: usize, data: &[u8]) {
        write_bytes(addr, data)
    }
    /// A user-mode load (the address must be mapped readable).
    fn read_byte(&self, addr: usize) -> u8 {
        kernel::peek(addr)
    }
    /// A user-mode store (the address must be mapped writable).
    fn write_byte(&self, addr: usize, v: u8) {
        kernel::poke(addr, v)
    }
    /// Resident or not, per page (panics if the range has a hole).
    fn residency(&self, addr: usize, pages: usize) -> Vec<bool> {
        let v = self.mincore(addr, pages * PAGE).unwrap_or_else(|e| panic!("{}: mincore: {e}", self.name()));
        v.iter().map(|b| b & 1 != 0).collect()
    }
    /// The `/proc/PID/maps`-style header lines of the regions inside the
    /// scenario area, as `(start, end, perms)`.
    fn regions(&self) -> Vec<(usize, usize, String)>;
    /// `rw-p`-style permissions of the region containing `addr`, or `none`.
    fn perms(&self, addr: usize) -> String {
        self.regions()
            .into_iter()
            .find(|(s, e, _)| *s <= addr && addr < *e)
            .map(|(_, _, p)| p)
            .unwrap_or_else(|| "none".to_string())
    }
    /// How many regions the scenario area holds.
    fn region_count(&self) -> usize;
    /// `mlock2(addr, len, flags)`.
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno>;
    /// `munlock(addr, len)`.
    fn munlock(&self, addr: usize, len: usize) -> Result<(), Errno>;
    /// The smaps text (whole process for the kernel, the space for usermm).
    fn smaps_text(&self) -> String;
    /// `mseal(addr, len, flags)` (syscall 462).
    fn mseal(&self, addr: usize, len: usize, flags: u64) -> Result<(), Errno>;
    /// Whether the region containing `addr` is sealed (`sl` in its
    /// `VmFlags`), or `None` if nothing is mapped there.
    fn sealed(&self, addr: usize) -> Option<bool> {
        let text = self.smaps_text();
        let mut inside = false;
        for line in text.lines() {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                if inside {
                    return Some(flags.split_whitespace().any(|f| f == "sl"));
                }
                continue;
            }
            let mut f = line.split_whitespace();
            if let Some((a, b)) = f.next().and_then(|r| r.split_once('-')) {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    inside = s <= addr && addr < e;
                }
            }
        }
        None
    }
    /// Makes every page installed so far visible to the backend's reclaim:
    /// the host kernel holds a just-faulted page in the faulting CPU's LRU
    /// batch, where `MADV_FREE` does not mark it and `MADV_PAGEOUT` cannot
    /// take it, and drains only the calling CPU's (a thread that migrated
    /// leaves pages behind). usermm drains the host's batches itself.
    fn drain_lru(&self, _addr: usize) {}
    /// Of the region containing `addr`: its `Locked:` kB and its lock
    /// VmFlags (`lo`, `lf`), as `"Locked: N kB lo lf"`, or `"unmapped"`.
    fn lock_info(&self, addr: usize) -> String {
        let text = self.smaps_text();
        let mut inside = false;
        let (mut locked, mut flags) = (None, String::new());
        for line in text.lines() {
            let mut f = line.split_whitespace();
            if let Some((a, b)) = f.next().and_then(|r| r.split_once('-')) {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    if inside {
                        break;
                    }
                    inside = s <= addr && addr < e;
                    continue;
                }
            }
            if !inside {
                continue;
            }
            if let Some(v) = line.strip_prefix("Locked:") {
                locked = Some(v.trim().to_string());
            }
            if let Some(v) = line.strip_prefix("VmFlags:") {
                flags = v.split_whitespace().filter(|f| *f == "lo" || *f == "lf").collect::<Vec<_>>().join(" ");
            }
        }
        match locked {
            Some(l) => format!("Locked: {l} [{flags}]"),
            None => "unmapped".to_string(),
        }
    }
}

/// Whether Linux's `mlock`/`munlock` of `[addr, addr+len)` touches nothing:
/// the page-rounded length wraps to 0 (an empty range) or the end overflows
/// (`EINVAL`). Such calls may be passed to the host whatever the arena.
fn no_effect(addr: usize, len: usize) -> bool {
    let bytes = len.wrapping_add(addr & (PAGE - 1)).wrapping_add(PAGE - 1) & !(PAGE - 1);
    bytes == 0 || (addr & !(PAGE - 1)).checked_add(bytes).is_none()
}

/// Parses `start-end perms ...` header lines (maps or smaps text), keeping
/// those inside `[lo, hi)`.
pub fn parse_maps(text: &str, lo: usize, hi: usize) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if s >= lo && e <= hi {
            out.push((s, e, perms.to_string()));
        }
    }
    out
}

/// The host kernel, on a private arena.
pub struct KernelMm {
    pub arena: KernelArena,
}

impl KernelMm {
    pub fn new() -> KernelMm {
        KernelMm { arena: KernelArena::new(ARENA_BYTES).expect("kernel arena") }
    }
}

impl Mm for KernelMm {
    fn name(&self) -> &'static str {
        "kernel"
    }
    fn base(&self) -> usize {
        self.arena.base()
    }
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, off: i64) -> Result<usize, Errno> {
        self.arena.mmap(addr, len, prot, flags, off)
    }
    fn mmap_fd(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        self.arena.mmap_fd(addr, len, prot, flags, fd, off)
    }
    fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.arena.munmap(addr, len)
    }
    fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        self.arena.mprotect(addr, len, prot)
    }
    fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.arena.madvise(addr, len, advice)
    }
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
        kernel::mincore(addr, len)
    }
    fn mincore_into(&self, addr: usize, len: usize, vec_len: usize) -> (Result<(), Errno>, Vec<u8>) {
        assert!(vec_len <= PAGE);
        // Two pages of our own, the second unmapped again: the vector ends
        // where the first one does.
        // SAFETY: a fresh anonymous mapping, outside the arena, ours alone.
        let m = unsafe { libc::mmap(std::ptr::null_mut(), 2 * PAGE, RW, ANON_PRIVATE, -1, 0) };
        assert_ne!(m, libc::MAP_FAILED);
        let m = m as usize;
        // SAFETY: the second page of the mapping just made.
        assert_eq!(unsafe { libc::munmap((m + PAGE) as *mut libc::c_void, PAGE) }, 0);
        let vec = if vec_len == 0 { 0 } else { m + PAGE - vec_len };
        // SAFETY: the first page of the mapping just made, ours alone.
        unsafe { std::ptr::write_bytes(m as *mut u8, VEC_FILL, PAGE) };
        // SAFETY: mincore writes at most `vec_len` bytes at `vec` before it
        // faults on the unmapped page (EFAULT); it changes no mapping.
        let r = unsafe { libc::syscall(libc::SYS_mincore, addr, len, vec) };
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let mut out = vec![0u8; vec_len];
        if vec_len > 0 {
            // SAFETY: `[vec, vec + vec_len)` lies in the first page, mapped.
            out.copy_from_slice(unsafe { std::slice::from_raw_parts(vec as *const u8, vec_len) });
        }
        // SAFETY: the first page, ours.
        unsafe { libc::munmap(m as *mut libc::c_void, PAGE) };
        (if r < 0 { Err(Errno(e)) } else { Ok(()) }, out)
    }
    fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno> {
        // msync only writes pages back; it changes no memory. The range is
        // still kept inside the arena (or overflowing: rejected unseen).
        assert!(no_effect(addr, len) || self.arena.contains(addr & !(PAGE - 1), len), "kernel msync outside the arena");
        // SAFETY: msync reads page tables and writes file pages back; it
        // neither maps nor unmaps anything.
        let r = unsafe { libc::syscall(libc::SYS_msync, addr, len, flags) };
        if r < 0 {
            return Err(Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)));
        }
        Ok(())
    }
    fn regions(&self) -> Vec<(usize, usize, String)> {
        let text = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        parse_maps(&text, self.arena.base(), self.arena.base() + self.arena.len())
    }
    fn region_count(&self) -> usize {
        self.regions().len()
    }
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
        assert!(
            no_effect(addr, len) || self.arena.contains(addr & !(PAGE - 1), len),
            "kernel mlock2 outside the arena"
        );
        usermm_sys::mem::mlock2(addr, len, flags)
    }
    fn munlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        assert!(
            no_effect(addr, len) || self.arena.contains(addr & !(PAGE - 1), len),
            "kernel munlock outside the arena"
        );
        usermm_sys::mem::munlock(addr, len)
    }
    fn smaps_text(&self) -> String {
        std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps")
    }
    fn mseal(&self, addr: usize, len: usize, flags: u64) -> Result<(), Errno> {
        // A sealed mapping stays for the process's life (the arena's drop
        // cannot unmap it): only inside the arena, or a call that fails
        // before looking at any mapping.
        assert!(
            no_effect(addr, len) || addr & (PAGE - 1) != 0 || flags != 0 || self.arena.contains(addr, len),
            "kernel mseal outside the arena"
        );
        // SAFETY: sealing changes no byte and no mapping but the arena's.
        let r = unsafe { libc::syscall(462, addr, len, flags) };
        if r < 0 {
            return Err(Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)));
        }
        Ok(())
    }
    fn drain_lru(&self, addr: usize) {
        usermm_sys::mem::lru_drain_all(addr).expect("lru_drain_all");
    }
}

/// usermm, on a space of its own.
pub struct UserMm {
    pub space: Space,
}

impl UserMm {
    /// A space for conformance scenarios: exact faults (Linux's residency),
    /// and a budget that never forces reclaim in a scenario.
    pub fn new() -> UserMm {
        UserMm::with(Config {
            budget_bytes: 256 << 20,
            reserve_bytes: 2 << 30,
            swap_bytes: 256 << 20,
            flags: UMM_F_EXACT_FAULTS,
            ..Config::default()
        })
    }
    pub fn with(cfg: Config) -> UserMm {
        UserMm { space: Space::open(&cfg).expect("usermm space") }
    }
}

impl Mm for UserMm {
    fn name(&self) -> &'static str {
        "usermm"
    }
    fn base(&self) -> usize {
        self.space.reservation().0
    }
    fn mmap(&self, addr: usize, len: usize, prot: i32, flags: i32, off: i64) -> Result<usize, Errno> {
        self.space.mmap(addr, len, prot, flags, -1, off)
    }
    fn mmap_fd(&self, addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, Errno> {
        self.space.mmap(addr, len, prot, flags, fd, off)
    }
    fn munmap(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.space.munmap(addr, len)
    }
    fn mprotect(&self, addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
        self.space.mprotect(addr, len, prot)
    }
    fn madvise(&self, addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
        self.space.madvise(addr, len, advice)
    }
    fn mincore(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; len.div_ceil(self.space.page_size())];
        self.space.mincore(addr, len, &mut v).map(|_| v)
    }
    fn mincore_into(&self, addr: usize, len: usize, vec_len: usize) -> (Result<(), Errno>, Vec<u8>) {
        let mut v = vec![VEC_FILL; vec_len];
        (self.space.mincore(addr, len, &mut v), v)
    }
    fn msync(&self, addr: usize, len: usize, flags: i32) -> Result<(), Errno> {
        self.space.msync(addr, len, flags)
    }
    fn regions(&self) -> Vec<(usize, usize, String)> {
        let (b, l) = self.space.reservation();
        parse_maps(&self.space.smaps(), b, b + l)
    }
    fn region_count(&self) -> usize {
        let n = self.space.stats().regions as usize;
        // The smaps dump and the stats must agree.
        assert_eq!(n, self.regions().len(), "usermm: stats().regions vs smaps entries");
        n
    }
    fn mlock2(&self, addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
        self.space.mlock2(addr, len, flags)
    }
    fn munlock(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.space.munlock(addr, len)
    }
    fn smaps_text(&self) -> String {
        self.space.smaps()
    }
    fn mseal(&self, addr: usize, len: usize, flags: u64) -> Result<(), Errno> {
        self.space.mseal(addr, len, flags)
    }
}

/// Runs `scenario` on both backends and asserts equal results. The scenario
/// writes a transcript (one line per observation, addresses relative to
/// `base()`) so that a mismatch shows both sides in full.
pub fn conform<F>(name: &str, scenario: F)
where
    F: Fn(&dyn Mm, &mut Transcript),
{
    conform_on(name, UserMm::new, scenario)
}

/// [`conform`] with usermm's default fault-around (no
/// `UMM_F_EXACT_FAULTS`): for scenarios whose residency must be Linux's
/// whatever the space's flags.
pub fn conform_fault_around<F>(name: &str, scenario: F)
where
    F: Fn(&dyn Mm, &mut Transcript),
{
    let open = || {
        UserMm::with(Config {
            budget_bytes: 256 << 20,
            reserve_bytes: 2 << 30,
            swap_bytes: 256 << 20,
            flags: 0,
            ..Config::default()
        })
    };
    conform_on(name, open, scenario)
}

/// [`conform`] on a space without swap: as on this swapless host, anonymous
/// pages can only leave memory by being dropped (`MADV_PAGEOUT` keeps
/// dirty ones resident), so residency after a page-out compares exactly.
pub fn conform_swapless<F>(name: &str, scenario: F)
where
    F: Fn(&dyn Mm, &mut Transcript),
{
    let open = || {
        UserMm::with(Config {
            budget_bytes: 256 << 20,
            reserve_bytes: 2 << 30,
            swap_bytes: 0,
            flags: UMM_F_EXACT_FAULTS,
            ..Config::default()
        })
    };
    conform_on(name, open, scenario)
}

fn conform_on<F>(name: &str, open: impl FnOnce() -> UserMm, scenario: F)
where
    F: Fn(&dyn Mm, &mut Transcript),
{
    let k = KernelMm::new();
    let mut tk = Transcript::new(k.base());
    scenario(&k, &mut tk);
    drop(k);
    let u = open();
    let mut tu = Transcript::new(u.base());
    scenario(&u, &mut tu);
    u.space.validate();
    drop(u);
    if tk.lines != tu.lines {
        let mut msg = format!("scenario {name}: kernel and usermm disagree\n");
        let n = tk.lines.len().max(tu.lines.len());
        for i in 0..n {
            let a = tk.lines.get(i).map(String::as_str).unwrap_or("<none>");
            let b = tu.lines.get(i).map(String::as_str).unwrap_or("<none>");
            let mark = if a == b { "  " } else { "!!" };
            msg += &format!("{mark} kernel: {a}\n   usermm: {b}\n");
        }
        panic!("{msg}");
    }
    assert!(!tk.lines.is_empty(), "scenario {name} observed nothing");
    // `CONFORM_SHOW=1 cargo test --test conformance -- --nocapture` prints
    // the agreed transcripts.
    if std::env::var_os("CONFORM_SHOW").is_some() {
        eprintln!("scenario {name}:\n  {}", tk.lines.join("\n  "));
    }
}

/// What a scenario observed, in order.
pub struct Transcript {
    base: usize,
    pub lines: Vec<String>,
}

impl Transcript {
    pub fn new(base: usize) -> Transcript {
        Transcript { base, lines: Vec::new() }
    }
    /// Records a free-form observation.
    pub fn note(&mut self, what: impl Into<String>) {
        self.lines.push(what.into());
    }
    /// Records a call's result, turning a returned address into an offset.
    /// Returns the address on success.
    pub fn addr(&mut self, what: &str, r: Result<usize, Errno>) -> Option<usize> {
        let s = match &r {
            Ok(a) if *a >= self.base => format!("{what} = base+{:#x}", a - self.base),
            Ok(a) => format!("{what} = {a:#x} (below base)"),
            Err(e) => format!("{what} = {e:?}"),
        };
        self.lines.push(s);
        r.ok()
    }
    /// Records a unit call's result. Returns whether it succeeded.
    pub fn unit(&mut self, what: &str, r: Result<(), Errno>) -> bool {
        self.lines.push(match &r {
            Ok(()) => format!("{what} = 0"),
            Err(e) => format!("{what} = {e:?}"),
        });
        r.is_ok()
    }
    /// Records a `mincore` result (bit 0 per page; the vector only on success).
    pub fn mincore(&mut self, what: &str, r: Result<Vec<u8>, Errno>) {
        self.lines.push(match r {
            Ok(v) => format!("{what} = [{}]", bits(v.iter().map(|b| b & 1 != 0))),
            Err(e) => format!("{what} = {e:?}"),
        });
    }
    /// Records a `mincore` result and the bytes its vector holds after it
    /// (also on error: what Linux copied out before it failed).
    pub fn mincore_into(&mut self, what: &str, (r, v): (Result<(), Errno>, Vec<u8>)) {
        let bytes: Vec<String> = v.iter().map(|b| format!("{b:x}")).collect();
        self.lines.push(format!("{what} = {r:?} [{}]", bytes.join(" ")));
    }
    /// Records the regions inside the scenario area, relative to base.
    pub fn layout(&mut self, what: &str, mm: &dyn Mm) {
        let regs: Vec<String> = mm
            .regions()
            .into_iter()
            .map(|(s, e, p)| format!("[{:#x}-{:#x} {p}]", s - self.base, e - self.base))
            .collect();
        self.lines.push(format!("{what}: {}", regs.join(" ")));
    }
}

/// Volatile user-mode loads of `out.len()` bytes from `addr`, a word at a
/// time where aligned (each load takes the page faults a program's would).
pub fn read_bytes(addr: usize, out: &mut [u8]) {
    let mut i = 0;
    while i < out.len() {
        let a = addr + i;
        if a & 7 == 0 && out.len() - i >= 8 {
            // SAFETY: the caller names memory mapped readable that no Rust
            // reference points at (a space's or an arena's), as for `peek`.
            let w = unsafe { std::ptr::read_volatile(a as *const u64) };
            out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            out[i] = kernel::peek(a);
            i += 1;
        }
    }
}

/// Volatile user-mode stores of `data` at `addr`, a word at a time where
/// aligned.
pub fn write_bytes(addr: usize, data: &[u8]) {
    let mut i = 0;
    while i < data.len() {
        let a = addr + i;
        if a & 7 == 0 && data.len() - i >= 8 {
            let w = u64::from_ne_bytes(data[i..i + 8].try_into().unwrap());
            // SAFETY: the caller names memory mapped writable that no Rust
            // reference points at, as for `poke`.
            unsafe { std::ptr::write_volatile(a as *mut u64, w) };
            i += 8;
        } else {
            kernel::poke(a, data[i]);
            i += 1;
        }
    }
}

/// Renders residency as `1011...`.
pub fn bits(v: impl Iterator<Item = bool>) -> String {
    v.map(|b| if b { '1' } else { '0' }).collect()
}

/// Writes `v(i)` to the first byte of each of `pages` pages from `addr`.
pub fn fill(mm: &dyn Mm, addr: usize, pages: usize, v: impl Fn(usize) -> u8) {
    for i in 0..pages {
        mm.write_byte(addr + i * PAGE, v(i));
    }
}

/// Reads the first byte of each of `pages` pages from `addr`.
pub fn dump(mm: &dyn Mm, addr: usize, pages: usize) -> Vec<u8> {
    (0..pages).map(|i| mm.read_byte(addr + i * PAGE)).collect()
}
