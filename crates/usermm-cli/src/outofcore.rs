//! `outofcore`: reading a file 4× the budget through a file mapping.
//!
//! One file of `file_mib` (random-ish content: every 8-byte word is a hash of
//! its index) is created once in `dir` and deleted at the end. Three
//! workloads, each a fixed list of 8-byte reads at 4 KiB-aligned offsets,
//! every value read summed into a checksum that is compared with the one the
//! content implies (so no row can skip work):
//! 1. `random`: `reads` uniform random reads over the whole file;
//! 2. `hotcold`: `reads` reads, `hot_touch_pct`% to the first `hot_pct`% of
//!    the file (the hot part), the rest uniform over the remainder;
//! 3. `seq-scan`: one sequential scan reading 8 bytes of every page.
//!
//! Systems, usermm and kernel-memcg swapping places run by run, each
//! workload starting cold (the
//! file's host page cache dropped before it):
//! - `usermm`: a fresh space with a `budget_mib` budget and no swap, the file
//!   mapped `MAP_SHARED` `PROT_READ`, `MADV_RANDOM` (random, hotcold) or
//!   `MADV_SEQUENTIAL` (seq-scan) on the region (usermm reads through its
//!   own open file descriptions of the file, so `posix_fadvise` on the
//!   program's descriptor would not reach its reads);
//! - `kernel-memcg`: the kernel under the same limit (`BENCHMARKS.md`, "Same
//!   limit"; `memcg.rs`): a child process (`usermm __kernel-memcg-child
//!   outofcore …`) in a memory cgroup limited to the budget maps the file
//!   as `kernel-mmap` does and runs the same reads; the page cache it fills
//!   is charged to its group. usermm's space here has no swap, so neither
//!   has the kernel: no swap file. The throughput goals compare with it;
//! - `kernel-mmap`: the host's own `mmap` of the file, no limit (an upper
//!   bound: the page cache takes what it wants), with the same advice as
//!   `madvise` and `posix_fadvise`;
//! - `pread-cache`: a hand-written page cache of `budget_mib` (LRU, one
//!   4 KiB `pread` per miss, `POSIX_FADV_DONTNEED` on each page read so that
//!   the host keeps no second copy).

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use usermm::consts::{MADV_RANDOM, MADV_SEQUENTIAL, MAP_SHARED, PROT_READ};
use usermm::Space;
use usermm_sys::host::{
    fadvise, peek_u64, process_faults, reset_peak_rss, rss_kib, HostFileMap, POSIX_FADV_DONTNEED, POSIX_FADV_RANDOM,
    POSIX_FADV_SEQUENTIAL,
};
use usermm_sys::now_ns;

use crate::common::{config, default_swap_dir, p50_p99_max, Progress, Rng, MIB, PAGE};
use crate::memcg::{self, KernelLimit};
use crate::params::{Kind, Params};
use crate::report::{fmt_num, Experiment, Goal};

pub fn params(full: bool) -> Params {
    Params::default()
        .def("file_mib", Kind::Int, if full { 4096 } else { 256 }, "file size (MiB); 4× the budget by default")
        .def("budget_mib", Kind::Int, if full { 1024 } else { 64 }, "usermm's and pread-cache's budget (MiB)")
        .def(
            "reads",
            Kind::Int,
            if full { 800_000 } else { 50_000 },
            "8-byte reads of the random and hotcold workloads",
        )
        .def("runs", Kind::Int, if full { 5 } else { 3 }, "measured runs (systems rotate run by run)")
        .def("hot_pct", Kind::Int, 10, "hot part: this % of the file, from its start")
        .def("hot_touch_pct", Kind::Int, 90, "% of hotcold reads that go to the hot part")
        .def("latency_every", Kind::Int, 16, "time every Nth read with now_ns() (1: every read)")
        .def("dir", Kind::Text, default_swap_dir(), "directory of the test file (not a tmpfs: it must have a disk)")
        .def("usermm_rdwr", Kind::Int, 0, "0: usermm's descriptor is opened O_RDONLY, as the others'; 1: O_RDWR")
        .def("seed", Kind::Int, 7, "PRNG seed of the read offsets and of the file's content")
        .def("workloads", Kind::Text, WORKLOADS.join(","), "workloads to run: random, hotcold, seq-scan")
}

const WORKLOADS: [&str; 3] = ["random", "hotcold", "seq-scan"];
const MEMCG: &str = "kernel-memcg";

/// The systems of run `r`: usermm and kernel-memcg swap places every run
/// (A B, B A, …), and so do the two others.
fn order(r: usize) -> [&'static str; 4] {
    if r.is_multiple_of(2) {
        ["usermm", MEMCG, "kernel-mmap", "pread-cache"]
    } else {
        [MEMCG, "usermm", "pread-cache", "kernel-mmap"]
    }
}

/// The file's 8-byte word number `w` (splitmix64's finalizer of `w ^ seed`).
fn word(w: u64, seed: u64) -> u64 {
    let mut z = (w ^ seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The test file; deleted when dropped.
struct TestFile {
    path: String,
}

impl TestFile {
    fn create(dir: &str, bytes: usize, seed: u64) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-outofcore-{}-{}.dat", std::process::id(), now_ns());
        let t = TestFile { path };
        let mut f = File::create_new(&t.path).map_err(|e| format!("create {}: {e}", t.path))?;
        let mut buf = vec![0u8; MIB];
        let mut w = 0u64;
        for _ in 0..bytes / MIB {
            for c in buf.chunks_exact_mut(8) {
                c.copy_from_slice(&word(w, seed).to_le_bytes());
                w += 1;
            }
            f.write_all(&buf).map_err(|e| format!("write {}: {e}", t.path))?;
        }
        f.sync_all().map_err(|e| format!("fsync {}: {e}", t.path))?;
        fadvise(&f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| format!("fadvise: {e:?}"))?;
        Ok(t)
    }

    /// Opens the file afresh (so that one system's `posix_fadvise` advice,
    /// kept per open file, does not leak into another's) with its page cache
    /// dropped: every workload starts cold.
    fn open_cold(&self, rdwr: bool) -> Result<File, String> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(rdwr)
            .open(&self.path)
            .map_err(|e| format!("open {}: {e}", self.path))?;
        fadvise(&f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| format!("fadvise(DONTNEED): {e:?}"))?;
        Ok(f)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The byte offsets of one workload's reads.
fn offsets(workload: &str, pages: usize, reads: usize, hot_pages: usize, hot_touch: u64, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ workload.len() as u64);
    match workload {
        "random" => (0..reads).map(|_| rng.below(pages as u64) as usize * PAGE).collect(),
        "hotcold" => {
            let cold = (pages - hot_pages).max(1) as u64;
            (0..reads)
                .map(|_| {
                    let p = if rng.below(100) < hot_touch {
                        rng.below(hot_pages as u64) as usize
                    } else {
                        hot_pages + rng.below(cold) as usize
                    };
                    p * PAGE
                })
                .collect()
        }
        _ => (0..pages).map(|p| p * PAGE).collect(),
    }
}

/// One workload's timing: the whole loop, and every `every`th read alone.
struct Outcome {
    ns: u64,
    sum: u64,
    lat: Vec<f64>,
}

#[inline(always)]
fn drive(offs: &[usize], every: usize, mut read: impl FnMut(usize) -> u64) -> Outcome {
    let mut sum = 0u64;
    let mut lat = Vec::with_capacity(offs.len() / every + 1);
    let t0 = now_ns();
    for (i, &off) in offs.iter().enumerate() {
        if i % every == 0 {
            let t = now_ns();
            sum = sum.wrapping_add(read(off));
            lat.push((now_ns() - t) as f64);
        } else {
            sum = sum.wrapping_add(read(off));
        }
    }
    Outcome { ns: now_ns() - t0, sum, lat }
}

/// A multiplicative hash for page numbers (the pread cache's map; SipHash
/// would make every hit slower than it needs to be).
#[derive(Default)]
struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

const NIL: u32 = u32::MAX;

/// A user-space page cache: `slots` 4 KiB slots in one arena, a map from
/// page to slot, and an intrusive doubly linked LRU list over the slots
/// (head: most recently used).
struct PreadCache<'f> {
    file: &'f File,
    arena: Vec<u8>,
    map: HashMap<u64, u32, BuildHasherDefault<PageHasher>>,
    page_of: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    used: u32,
    misses: u64,
    err: Option<String>,
}

impl<'f> PreadCache<'f> {
    fn new(file: &'f File, slots: usize) -> PreadCache<'f> {
        PreadCache {
            file,
            arena: vec![0u8; slots * PAGE],
            map: HashMap::with_capacity_and_hasher(slots, BuildHasherDefault::default()),
            page_of: vec![0; slots],
            prev: vec![NIL; slots],
            next: vec![NIL; slots],
            head: NIL,
            tail: NIL,
            used: 0,
            misses: 0,
            err: None,
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NIL {
            self.tail = s;
        }
    }

    /// The 8 bytes at file offset `off` (within one page).
    #[inline(always)]
    fn read(&mut self, off: usize) -> u64 {
        let page = (off / PAGE) as u64;
        let s = match self.map.get(&page) {
            Some(&s) => {
                if self.head != s {
                    self.unlink(s);
                    self.push_front(s);
                }
                s
            }
            None => self.miss(page),
        };
        let at = s as usize * PAGE + off % PAGE;
        u64::from_le_bytes(self.arena[at..at + 8].try_into().expect("8 bytes"))
    }

    #[inline(never)]
    fn miss(&mut self, page: u64) -> u32 {
        self.misses += 1;
        let s = if (self.used as usize) < self.page_of.len() {
            self.used += 1;
            self.used - 1
        } else {
            let s = self.tail;
            self.unlink(s);
            self.map.remove(&self.page_of[s as usize]);
            s
        };
        let buf = &mut self.arena[s as usize * PAGE..(s as usize + 1) * PAGE];
        let off = page * PAGE as u64;
        if let Err(e) = self.file.read_exact_at(buf, off) {
            self.err.get_or_insert(format!("pread at {off}: {e}"));
        }
        let _ = fadvise(self.file, off, PAGE as u64, POSIX_FADV_DONTNEED);
        self.page_of[s as usize] = page;
        self.map.insert(page, s);
        self.push_front(s);
        s
    }
}

/// What one (system, workload) run measured.
struct Measured {
    out: Outcome,
    /// Resident peak in bytes (see the notes for each system's meaning).
    peak: f64,
    /// usermm: faults (`Stats::faults`); kernel-mmap: the process's major faults;
    /// pread-cache: misses (preads).
    misses: u64,
    writebacks: u64,
    /// kernel-memcg: (p50, p99) of the timed reads, worked out by the child
    /// (its `out.lat` is empty).
    pct: Option<(f64, f64)>,
    /// kernel-memcg: pages read from the disk (`read_bytes` of the child's
    /// `/proc/self/io` / 4 KiB).
    pages_read: Option<u64>,
}

struct Setup<'a> {
    file: &'a TestFile,
    len: usize,
    budget: usize,
    every: usize,
    usermm_rdwr: bool,
}

fn run_usermm(s: &Setup, workload: &str, offs: &[usize]) -> Result<Measured, String> {
    let f = s.file.open_cold(s.usermm_rdwr)?;
    let space = Space::open(&config(s.budget, 0, None)).map_err(|e| format!("usermm open: {e:?}"))?;
    let a = space.mmap(0, s.len, PROT_READ, MAP_SHARED, f.as_raw_fd(), 0).map_err(|e| format!("usermm mmap: {e:?}"))?;
    let advice = if workload == "seq-scan" { MADV_SEQUENTIAL } else { MADV_RANDOM };
    space.madvise(a, s.len, advice).map_err(|e| format!("usermm madvise({advice}): {e:?}"))?;
    let st0 = space.stats();
    let out = drive(offs, s.every, |off| peek_u64(a + off));
    let st1 = space.stats();
    let unmapped = space.munmap(a, s.len);
    let st2 = space.stats();
    if let Err(e) = unmapped {
        return Err(format!("usermm munmap: {e:?} (an O_RDONLY descriptor? see --usermm-rdwr)"));
    }
    let page = space.page_size() as f64;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok(Measured {
        out,
        peak: st1.resident_pages_max as f64 * page,
        misses: st1.faults - st0.faults,
        writebacks: st2.writebacks - st0.writebacks,
        pct: None,
        pages_read: None,
    })
}

fn run_kernel(s: &Setup, workload: &str, offs: &[usize]) -> Result<Measured, String> {
    let f = s.file.open_cold(false)?;
    let (madv, fadv) = if workload == "seq-scan" {
        (MADV_SEQUENTIAL, POSIX_FADV_SEQUENTIAL)
    } else {
        (MADV_RANDOM, POSIX_FADV_RANDOM)
    };
    fadvise(&f, 0, 0, fadv).map_err(|e| format!("kernel fadvise: {e:?}"))?;
    let m = HostFileMap::open(&f, s.len).map_err(|e| format!("kernel mmap: {e:?}"))?;
    m.madvise(madv).map_err(|e| format!("kernel madvise: {e:?}"))?;
    reset_peak_rss().map_err(|e| format!("clear_refs: {e:?}"))?;
    let (rss0, _) = rss_kib().map_err(|e| format!("rss: {e:?}"))?;
    let (_, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let out = drive(offs, s.every, |off| m.read_u64(off));
    let (_, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let (_, hwm) = rss_kib().map_err(|e| format!("rss: {e:?}"))?;
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    let _ = fadvise(&f, 0, 0, POSIX_FADV_DONTNEED);
    Ok(Measured {
        out,
        peak: hwm.saturating_sub(rss0) as f64 * 1024.0,
        misses: maj1 - maj0,
        writebacks: 0,
        pct: None,
        pages_read: None,
    })
}

fn run_pread(s: &Setup, workload: &str, offs: &[usize]) -> Result<Measured, String> {
    let f = s.file.open_cold(false)?;
    let fadv = if workload == "seq-scan" { POSIX_FADV_SEQUENTIAL } else { POSIX_FADV_RANDOM };
    fadvise(&f, 0, 0, fadv).map_err(|e| format!("pread fadvise: {e:?}"))?;
    let mut c = PreadCache::new(&f, s.budget / PAGE);
    let out = drive(offs, s.every, |off| c.read(off));
    if let Some(e) = c.err.take() {
        return Err(format!("pread-cache: {e}"));
    }
    let peak = c.used as f64 * PAGE as f64;
    let misses = c.misses;
    drop(c);
    let _ = fadvise(&f, 0, 0, POSIX_FADV_DONTNEED);
    Ok(Measured { out, peak, misses, writebacks: 0, pct: None, pages_read: None })
}

/// The workload's shape, passed to the kernel-memcg child, which works out
/// the same offsets.
struct Work<'a> {
    workload: &'a str,
    pages: usize,
    reads: usize,
    hot_pages: usize,
    hot_touch: u64,
    seed: u64,
}

fn run_memcg(s: &Setup, limit: &KernelLimit, w: &Work) -> Result<Measured, String> {
    // The file's page cache dropped: the child starts cold, as the others.
    drop(s.file.open_cold(false)?);
    let mut args = vec!["outofcore".to_string(), s.file.path.clone(), w.workload.to_string()];
    args.extend(
        [s.len as u64, w.pages as u64, w.reads as u64, w.hot_pages as u64, w.hot_touch, w.seed, s.every as u64]
            .map(|v| v.to_string()),
    );
    let c = limit.run_child(&args)?;
    let bad = || format!("unexpected output of the kernel-memcg child:\n{}", c.stdout);
    let line = c.stdout.lines().find_map(|l| l.strip_prefix("result ")).ok_or_else(bad)?;
    let v: Vec<&str> = line.split_whitespace().collect();
    if v.len() != 6 {
        return Err(bad());
    }
    let int = |i: usize| v[i].parse::<u64>().map_err(|_| bad());
    let float = |i: usize| v[i].parse::<f64>().map_err(|_| bad());
    Ok(Measured {
        out: Outcome { ns: int(0)?, sum: int(1)?, lat: Vec::new() },
        peak: c.peak_charge_bytes as f64,
        misses: int(4)?,
        writebacks: 0,
        pct: Some((float(2)?, float(3)?)),
        pages_read: Some(int(5)? / PAGE as u64),
    })
}

/// `read_bytes` of `/proc/self/io`: bytes this process caused to be read
/// from storage (its faults' reads and read-ahead).
fn io_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `usermm __kernel-memcg-child outofcore PATH WORKLOAD LEN PAGES READS
/// HOT_PAGES HOT_TOUCH SEED EVERY`: works out the workload's offsets (before
/// it joins its memory group: the other systems' offset lists live outside
/// their budgets too), waits for the go byte, then maps the file and reads
/// as `kernel-mmap` does. Prints `result NS SUM P50 P99 MAJFLT READ_BYTES`.
pub fn kernel_memcg_child(a: &[String]) -> Result<(), String> {
    let n = |i: usize| -> Result<u64, String> {
        a.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {a:?} is no number"))
    };
    let (path, workload) = match a {
        [p, w, ..] => (p, w.as_str()),
        _ => return Err(format!("bad arguments {a:?}")),
    };
    let (len, pages, reads, hot_pages, hot_touch, seed, every) =
        (n(2)? as usize, n(3)? as usize, n(4)? as usize, n(5)? as usize, n(6)?, n(7)?, n(8)?.max(1) as usize);
    let offs = offsets(workload, pages, reads, hot_pages, hot_touch, seed);
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let f = File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let (madv, fadv) = if workload == "seq-scan" {
        (MADV_SEQUENTIAL, POSIX_FADV_SEQUENTIAL)
    } else {
        (MADV_RANDOM, POSIX_FADV_RANDOM)
    };
    fadvise(&f, 0, 0, fadv).map_err(|e| format!("fadvise: {e:?}"))?;
    let m = HostFileMap::open(&f, len).map_err(|e| format!("mmap: {e:?}"))?;
    m.madvise(madv).map_err(|e| format!("madvise: {e:?}"))?;
    let (_, maj0) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let io0 = io_read_bytes();
    let out = drive(&offs, every, |off| m.read_u64(off));
    let (_, maj1) = process_faults().map_err(|e| format!("getrusage: {e:?}"))?;
    let io1 = io_read_bytes();
    m.unmap().map_err(|e| format!("munmap: {e:?}"))?;
    let mut lat = out.lat;
    let (p50, p99, _) = p50_p99_max(&mut lat);
    println!("result {} {} {p50} {p99} {} {}", out.ns, out.sum, maj1 - maj0, io1 - io0);
    Ok(())
}

pub fn run(p: &Params, prog: &Progress) -> Result<Experiment, String> {
    let len = p.int("file_mib") as usize * MIB;
    let budget = p.int("budget_mib") as usize * MIB;
    let reads = p.int("reads") as usize;
    let runs = p.int("runs").max(1) as usize;
    let every = p.int("latency_every").max(1) as usize;
    let hot_touch = p.int("hot_touch_pct").min(100);
    let dir = p.text("dir");
    let seed = p.int("seed");
    let pages = len / PAGE;
    let hot_pages = (pages * p.int("hot_pct").min(100) as usize / 100).max(1);
    if budget < PAGE || len == 0 || reads == 0 || hot_pages >= pages {
        return Err(
            "outofcore: need file_mib ≥ 1, budget_mib ≥ 1, reads ≥ 1 and a hot part smaller than the file".into()
        );
    }
    let mut e = Experiment::new("outofcore", "a file 4× the budget: random, hot/cold and sequential reads", p.pairs());
    prog.say(&format!("creating a {} MiB file in {dir}", len / MIB));
    let t = now_ns();
    let file = TestFile::create(&dir, len, seed)?;
    prog.say(&format!("file written in {:.1} s", (now_ns() - t) as f64 / 1e9));
    let wanted = p.text("workloads");
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
    if let Some(w) = wanted.iter().find(|w| !WORKLOADS.contains(w)) {
        return Err(format!("outofcore: unknown workload {w:?} (known: {})", WORKLOADS.join(", ")));
    }
    let work: Vec<(&str, Vec<usize>, u64)> = WORKLOADS
        .iter()
        .filter(|w| wanted.contains(w))
        .map(|w| {
            let offs = offsets(w, pages, reads, hot_pages, hot_touch, seed);
            let want = offs.iter().fold(0u64, |a, &o| a.wrapping_add(word((o / 8) as u64, seed)));
            (*w, offs, want)
        })
        .collect();
    let setup = Setup { file: &file, len, budget, every, usermm_rdwr: p.int("usermm_rdwr") != 0 };
    let mut errors = Vec::new();
    let mut usermm_peak_max = 0f64;
    let mut writebacks = 0u64;
    // The kernel under the same limit: a fresh memory group per child (one
    // child per workload and run); no swap file (usermm's space has none).
    let mut limit = KernelLimit::setup(budget, 0, &dir);
    if let Err(why) = &limit {
        prog.say(&format!("{MEMCG}: not measured: {why}"));
    }
    let mut memcg_peak_max = 0f64;
    for r in 0..runs {
        for sys in order(r) {
            if sys == MEMCG && limit.is_err() {
                continue;
            }
            prog.say(&format!("{sys} run {}/{runs}", r + 1));
            for (w, offs, want) in &work {
                let m = match sys {
                    "usermm" => run_usermm(&setup, w, offs)?,
                    "kernel-mmap" => run_kernel(&setup, w, offs)?,
                    MEMCG => {
                        let Ok(l) = &limit else { break };
                        let shape = Work { workload: w, pages, reads, hot_pages, hot_touch, seed };
                        match run_memcg(&setup, l, &shape) {
                            Ok(m) => m,
                            Err(why) => {
                                let msg = format!("{MEMCG} {w} run {}: {why}", r + 1);
                                prog.say(&format!("ERROR: {msg}"));
                                errors.push(msg.clone());
                                limit = Err(msg);
                                break;
                            }
                        }
                    }
                    _ => run_pread(&setup, w, offs)?,
                };
                if m.out.sum != *want {
                    let msg = format!("{sys} {w} run {}: checksum {:#x}, expected {want:#x}", r + 1, m.out.sum);
                    prog.say(&format!("ERROR: {msg}"));
                    errors.push(msg);
                }
                let mut lat = m.out.lat;
                let (p50, p99) = m.pct.unwrap_or_else(|| {
                    let (p50, p99, _) = p50_p99_max(&mut lat);
                    (p50, p99)
                });
                e.add(sys, w, "throughput", "reads/s", offs.len() as f64 / (m.out.ns as f64 / 1e9));
                e.add(sys, w, "p50", "ns", p50);
                e.add(sys, w, "p99", "ns", p99);
                e.add(sys, w, "resident_peak", "MiB", m.peak / MIB as f64);
                let miss = match sys {
                    "usermm" => "faults",
                    "kernel-mmap" | MEMCG => "major_faults",
                    _ => "misses",
                };
                e.add(sys, w, miss, "count", m.misses as f64);
                e.add(sys, w, &format!("{miss}_per_1k_reads"), "count", m.misses as f64 * 1000.0 / offs.len() as f64);
                if let Some(pr) = m.pages_read {
                    e.add(sys, w, "pages_read", "pages", pr as f64);
                    e.add(sys, w, "pages_read_per_1k_reads", "pages", pr as f64 * 1000.0 / offs.len() as f64);
                }
                if sys == MEMCG {
                    memcg_peak_max = memcg_peak_max.max(m.peak);
                }
                if sys == "usermm" {
                    e.add(sys, w, "writebacks", "pages", m.writebacks as f64);
                    usermm_peak_max = usermm_peak_max.max(m.peak);
                    writebacks += m.writebacks;
                }
            }
        }
    }
    drop(file);
    let memcg_note = match &limit {
        Ok(_) => format!(
            "**`{MEMCG}`**: the kernel under the same limit. For each workload and run, a child process (`usermm {} \
             outofcore …`) is put into a fresh cgroup v1 memory group `{}<pid>-<n>` with `memory.limit_in_bytes` = \
             the budget ({} MiB) before it maps anything, then maps the file (`MAP_SHARED`, `PROT_READ`, the same \
             `madvise`/`posix_fadvise` as `kernel-mmap`) and makes the same reads, from a cold page cache. The page \
             cache it fills is charged to its group and reclaimed (MGLRU) at the limit; no swap file (usermm's space \
             here has no swap). Its offsets are worked out before it joins the group (the other systems' offset \
             lists are outside their budgets too). `resident_peak` = the group's `memory.max_usage_in_bytes` \
             (everything charged to it: page cache and the child's own memory; largest seen: {} MiB); \
             `major_faults` its `ru_majflt`; `pages_read` = `read_bytes` of its `/proc/self/io` / 4 KiB (read-ahead \
             included). The group is made and removed by the benchmark (also on error, SIGINT and SIGTERM).",
            memcg::CHILD_CMD,
            memcg::CGROUP_PREFIX,
            budget / MIB,
            fmt_num(memcg_peak_max / MIB as f64),
        ),
        Err(why) => format!("**`{MEMCG}` not measured**: {why}. The goals against it read \"not measured\"."),
    };
    let base = if limit.is_ok() { MEMCG } else { "(kernel-memcg not measured)" };
    drop(limit);
    let ratio = |what: &str, variant: &str, base: &str, threshold: f64, goal: f64| Goal {
        what: what.into(),
        how: format!("usermm/{base}, {variant} throughput"),
        value: e.med("usermm", variant, "throughput") / e.med(base, variant, "throughput"),
        unit: "×".into(),
        at_least: true,
        threshold,
        goal,
    };
    let g1 = ratio("hot/cold reads vs a hand-written pread cache", "hotcold", "pread-cache", 1.0, 1.5);
    let g2 = ratio("sequential scan vs the kernel under the same limit", "seq-scan", base, 1.0, 1.0);
    let g3 = ratio("random reads vs the kernel under the same limit", "random", base, 0.8, 1.0);
    let g4 = ratio("hot/cold reads vs the kernel under the same limit", "hotcold", base, 0.8, 1.0);
    if wanted.contains(&"random") {
        e.goals.push(g3);
    }
    if wanted.contains(&"hotcold") {
        e.goals.push(g4);
        e.goals.push(g1);
    }
    if wanted.contains(&"seq-scan") {
        e.goals.push(g2);
    }
    let budget_mib = (budget / MIB) as f64;
    e.goals.push(Goal {
        what: "usermm resident peak within the budget".into(),
        how: "max over runs and workloads of resident_pages_max × page size".into(),
        value: usermm_peak_max / MIB as f64,
        unit: " MiB".into(),
        at_least: false,
        threshold: budget_mib,
        goal: budget_mib,
    });
    e.notes.push(format!(
        "File {} MiB ({} pages) in `{dir}`, written once with random-ish content (every 8-byte word a hash of its \
         index) and deleted at the end; budget {} MiB for usermm and for the pread cache. `random`: {reads} uniform \
         random 8-byte reads at 4 KiB-aligned offsets; `hotcold`: {reads} reads, {hot_touch}% of them to the first \
         {} pages ({}% of the file), the rest to the remainder; `seq-scan`: 8 bytes of every page in order ({} \
         reads). The same offsets for every system and run; every value read is summed and the sum checked against \
         the one the content implies. Each (system, workload) starts cold: the file is opened afresh and its host \
         page cache dropped (`POSIX_FADV_DONTNEED` on the whole file) before it; usermm uses a fresh space for each.",
        len / MIB,
        pages,
        budget / MIB,
        hot_pages,
        p.int("hot_pct"),
        pages,
    ));
    e.notes.push(format!(
        "`throughput` = reads / wall time of the whole loop. `p50`/`p99`: latency of every {every}th read alone \
         (timed with `now_ns()` around the read; the loop's other reads are not timed, so the timer's cost barely \
         touches throughput)."
    ));
    e.notes.push(
        "`usermm`: `MAP_SHARED` `PROT_READ` mapping of the file in a space with no swap; `MADV_RANDOM` on the \
         region for `random` and `hotcold` (a fault reads exactly its page), `MADV_SEQUENTIAL` for `seq-scan` \
         (usermm reads through its own open file descriptions of the file, one per reading thread, so \
         `posix_fadvise` on the program's descriptor would not reach its reads). \
         `resident_peak` = `Stats::resident_pages_max` × page size; usermm also drops the host page cache behind \
         its reads, so that is all the memory the file costs it, apart from the host's read-ahead ahead of a \
         stream (up to the disk's `read_ahead_kb`). `faults` = delta of `Stats::faults` \
         (`Stats::major_faults` stays 0 for pages read from a file, so it is not shown). `writebacks` = delta \
         of `Stats::writebacks` over the workload and its `munmap`."
            .into(),
    );
    e.notes.push(memcg_note);
    e.notes.push(
        "**`kernel-mmap` is an upper bound and no goal's yardstick: the page cache takes what it wants** (no budget). Plain host `mmap` \
         (`MAP_SHARED`, `PROT_READ`) with `madvise` + `posix_fadvise` `RANDOM` (`random`, `hotcold`) or \
         `SEQUENTIAL` (`seq-scan`). Its `resident_peak` is **approximate**: `VmHWM` at the end − `VmRSS` before \
         (peak reset through `/proc/self/clear_refs`), i.e. the file pages mapped into this process; pages the \
         page cache holds unmapped (readahead) are not counted. `major_faults` are the whole process's \
         (`getrusage`)."
            .into(),
    );
    e.notes.push(
        "`pread-cache`: a user-space page cache of the same budget (LRU over 4 KiB slots in one arena, a hash map \
         page → slot, one 4 KiB `pread` per miss, then `POSIX_FADV_DONTNEED` on that page; `posix_fadvise` \
         `RANDOM`/`SEQUENTIAL` on its descriptor as for the kernel). `resident_peak` = slots filled × 4 KiB (≤ the \
         budget by construction); in `seq-scan` the kernel's readahead window may briefly hold a few pages more in \
         the page cache. `misses` = preads."
            .into(),
    );
    e.notes.push(format!(
        "usermm's descriptor is opened `{}` (`--usermm-rdwr`). usermm writes back only pages that were resident \
         while their region was writable, so a `PROT_READ` mapping never writes: its clean pages are dropped with \
         no I/O when evicted.",
        if p.int("usermm_rdwr") != 0 { "O_RDWR" } else { "O_RDONLY" }
    ));
    if writebacks > 0 {
        e.notes.push(format!(
            "**odd**: usermm wrote back {writebacks} pages of a `PROT_READ` mapping that no one wrote (see above)."
        ));
    }
    e.notes.push(
        "Quick mode uses a 256 MiB file and a 64 MiB budget with 50,000 reads (the same 4× ratio and reads per page \
         as `--full`'s 4 GiB / 1 GiB / 800,000): at 1 GiB / 256 MiB / 200,000 reads one run of the three systems \
         takes about a minute on this 2-vCPU VM (a random 4 KiB read from disk costs ~35-50 µs)."
            .into(),
    );
    for m in errors {
        e.notes.push(format!("**ERROR**: {m}"));
    }
    Ok(e)
}
