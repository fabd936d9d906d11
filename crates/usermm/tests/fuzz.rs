//! Differential fuzzer (issue 16, "Nothing hangs, nothing is lost"): seeded
//! sequences of memory calls applied in lockstep to the host kernel (the
//! oracle, on a private arena) and to a usermm space under a small budget
//! with swap, so that reclaim, swap-out and swap-in run all the time. Every
//! call's result is compared at once; contents and residency are checked
//! after every call (sampled) and in full every [`FULL_CHECK_EVERY`] calls.
//! Now and then the fuzzer forks (`Op::Fork`): the child checks both sides'
//! copies against the model as of the fork, pages its copy of the space out
//! and checks it again.
//!
//! ```text
//!   base                                   base + AREA_PAGES pages        base + 1 GiB
//!   | anon private | anon shared | file A (shared) | file B (private) |  hole ...  |
//!   '---------- the fuzzed area: any kind anywhere, MAP_FIXED over each other -----'
//! ```
//!
//! File mappings are identity-mapped (area page `p` maps file page `p`), so
//! that a file page is never mapped at two addresses of one side: file A is
//! only ever mapped `MAP_SHARED`, file B only `MAP_PRIVATE` (B is never
//! written, so a private page is the file's until its first write). Each side
//! has its own two files with the same initial contents.
//!
//! # The model
//! Each side has a model of the contents of every page: a set of allowed
//! alternatives, each one bytes (or zeros) and possibly *lazy* (`MADV_FREE`:
//! it may read back as zeros at any moment until written). Reading a page
//! narrows the set to what was seen; writing applies the write to every
//! alternative (a lazy one forks into "old + write" and "zeros + write",
//! since the discard may race with the write). A call that fails after
//! advising part of its range (holes, a locked region met half-way) makes
//! its effect possible rather than certain: the set is the union of before
//! and after. The mapping layout (kind, protection, lock) is shared by both
//! sides and follows the kernel's results; it is checked against
//! `/proc/self/maps` and usermm's smaps in every full check.
//!
//! # Residency
//! usermm evicts under its budget pages the kernel keeps (the kernel here
//! has no pressure), so only one direction must hold: a page usermm reports
//! resident is resident on the kernel too, or in the host's swap. The kernel's `mincore` of shared memory and file pages
//! reports the page cache (present whether mapped or not), and fault-around
//! and THP only add kernel residency, so the direction stays true for every
//! kind. Right after a successful `mlock2(.., 0)` every accessible page of the
//! range is resident on both sides. Without swap the kernel's
//! `MADV_PAGEOUT` drops only clean pages; with a swap area on the host
//! (`/proc/swaps`: ours, `USERMM_FUZZ_HOST_SWAP=1`, or one turned on
//! outside the test) it swaps written ones out too, and a page whose kernel
//! copy is in that swap (pagemap, smaps) is exempt (DEVIATIONS,
//! "host-swapped").
//!
//! # Environment
//! - `USERMM_FUZZ_SEED`: the base seed (default: [`DEFAULT_SEED`], so that
//!   the suite is the same every time; random seeds are
//!   `scripts/fuzz-campaign.sh`'s). Sequence `i` of a test uses
//!   `seed + i * SEQ_STRIDE`, so a failing sequence is rerun alone with its
//!   own seed as the base seed. Without it, every seed that ever diverged
//!   ([`REGRESSIONS`]) runs first.
//! - `USERMM_FUZZ_CALLS`: the total calls of `fuzz_lockstep` (default
//!   200,000), split into sequences of [`SEQ_CALLS`] on fresh backends; the
//!   two-fault-thread variant runs a quarter of it.
//! - `USERMM_FUZZ_HOST_SWAP=1`: a 256 MiB host swap file is active while the
//!   tests run (removed at the end, on panic, and by a watcher process if
//!   this one dies).
//! - `USERMM_FUZZ_TRACE=1`: print every call before it is made (a crash by
//!   a signal leaves no other report), with usermm's stats and every page
//!   check.
//! - `USERMM_FUZZ_WATCH=N`: print both sides' residency of area page `N`
//!   after every call (to find the call that made them part).
//!
//! `fuzz_lockstep` runs usermm with direct reclaim only, so that a sequence
//! replays the same way (the shrinker needs that); `fuzz_two_fault_threads`
//! adds the background reclaim thread and a second fault thread, whose
//! timing makes a divergence there harder to replay.
//!
//! On a divergence the test shrinks the sequence (delta debugging over the
//! call list, each candidate replayed on fresh backends) and panics with the
//! seed, the call index, both results and the shortest failing call list.

mod common;
mod conform;

use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use conform::{KernelMm, Mm, UserMm, PAGE};
use usermm::consts::*;
use usermm::{Config, Errno};
use usermm_sys::thread::ChildExit;

/// Pages of the fuzzed area (3 MiB), from `base()`.
const AREA_PAGES: usize = 768;
/// usermm's budget: a sixth of the area, so reclaim runs constantly.
const BUDGET_PAGES: usize = 128;
/// The most pages the model lets be locked (or lock-on-fault) at once: a
/// quarter of the budget, so that usermm can always hold them and a fault
/// never finds the budget full of locked pages (which is SIGBUS by design).
const LOCK_CAP_PAGES: usize = BUDGET_PAGES / 4;
/// The most pages usermm cannot evict at once: locked ones and those of
/// writable regions that are not exactly read-write (DEVIATIONS:
/// "unevictable-writable-non-rw"). Half the budget.
const PIN_CAP_PAGES: usize = BUDGET_PAGES / 2;
/// Calls per sequence (fresh backends each).
const SEQ_CALLS: usize = 4000;
/// Full check (every page, layout, stats, `validate`) period.
const FULL_CHECK_EVERY: usize = 1000;
/// Full residency comparison period.
const RESIDENCY_EVERY: usize = 50;
const SEQ_STRIDE: u64 = 0x9e37_79b9_7f4a_7c15;
/// A call that takes longer than this is a hang.
const HANG_SECS: u64 = 120;

/// Where usermm and Linux are allowed to differ, each with its reason. The
/// fuzzer accepts a difference only through one of these names, and counts
/// how often each was used.
const DEVIATIONS: &[(&str, &str)] = &[
    (
        "mlock-over-budget",
        "mlock2(.., 0) of more pages than the budget can hold: Linux locks and populates \
         (its memory is the machine's; ENOMEM if a PROT_NONE part stops the populate); \
         usermm fails with EAGAIN and locks nothing new (SPEC §3, 'a deliberate improvement \
         on Linux'; its budget check comes before the populate). Only the over-budget call checks it; \
         afterwards both sides are put back to the lock state they had.",
    ),
    (
        "residency-under-budget",
        "usermm evicts pages to stay within its budget; the kernel here keeps them. \
         Residency is compared one way only (usermm resident => kernel resident).",
    ),
    (
        "unevictable-writable-non-rw",
        "Pages of writable regions whose protection is not exactly PROT_READ|PROT_WRITE \
         (RWX, write-only, WX) are never evicted by usermm (docs/design.md: UFFDIO_MOVE needs \
         equal protection on both sides and a copy would race with writes): more of them \
         than the budget leaves every other fault without a frame (SIGBUS). The generator \
         caps them with the locked pages (PIN_CAP_PAGES) so that usermm can always hold them. \
         The same pages stay resident through MADV_PAGEOUT (even lazily freed clean ones, \
         which the kernel drops): their residency is exempt from the one-way rule.",
    ),
    (
        "populate-over-budget",
        "MADV_POPULATE_READ/WRITE over a mapped run longer than the budget: Linux populates \
         it (and goes on to the error of a later region, e.g. EINVAL for PROT_NONE); usermm \
         stops with ENOMEM once one segment has populated more pages than the budget holds, \
         since they cannot all be resident at once (docs/design.md, deviation table).",
    ),
    (
        "unsupported-advice",
        "MADV_COLLAPSE (Linux 6.1: collapse to a huge page now) is EINVAL on usermm, which has \
         no huge pages; Linux succeeds or fails (ENOMEM over holes, EAGAIN/EINVAL otherwise). \
         It changes no byte and only adds kernel residency, so the rest stays comparable. \
         MADV_DONTNEED_LOCKED (Linux 5.18) is EINVAL on usermm too, but is not generated: \
         Linux drops the pages (locked ones included), usermm keeps them, and the sides' \
         contents and residency would part for good (an open gap, reported).",
    ),
    (
        "zero-shmem-page-kept",
        "A shared page (anonymous, or of file A) that was only read, or punched, holds zeros: \
         the kernel's MADV_PAGEOUT drops its clean page-cache page, and its MADV_WILLNEED \
         leaves a hole a hole (mincore 0); usermm keeps the zero page mapped, and its \
         WILLNEED read-ahead maps the file's zeros (mincore 1). No byte differs; residency of such pages is \
         exempt from the one-way rule.",
    ),
    (
        "zero-anon-page-residency",
        "This kernel (6.18) drops zero-filled private anonymous pages on MADV_PAGEOUT even \
         without swap (observed: populated, never written, paged out: mincore 0), where \
         usermm swaps them out and reads them back with their swapped neighbours (its swap \
         read-around, like Linux's with swap): a page of zeros on both sides is exempt from \
         the one-way residency rule, as is a lazily freed one (either side may have \
         discarded it, or not). (Contents are still compared.)",
    ),
    (
        "host-swapped",
        "With a swap area on the host (USERMM_FUZZ_HOST_SWAP=1, or one turned on outside the \
         test), the kernel's MADV_PAGEOUT writes dirty anonymous and shared pages to it (mincore \
         0), where usermm may keep them resident: a page of a writable non-read-write region it \
         never evicts, which stays resident after an mprotect makes it evictable, or a page its \
         swap read-around brought back. A page usermm has resident is exempt from the one-way \
         rule when the kernel's copy is in the host's swap: a swap entry in pagemap (bit 62), \
         or, for shared and file pages (whose swap entries shmem keeps in the file), not mapped \
         in a mapping whose smaps reports swap.",
    ),
    (
        "lazyfree-discard",
        "A page freed with MADV_FREE reads back as its old contents or as zeros until \
         written, on either side independently (usermm discards under its budget, the \
         kernel on MADV_PAGEOUT): the model allows both.",
    ),
];

/// The forked child's exit codes ([`Run::child_check`]).
const CHILD_NOT_COPIED: i32 = 77;
const CHILD_CODES: &[(i32, &str)] = &[
    (CHILD_NOT_COPIED, "the space was not copied into the child (its calls fail with ESTALE)"),
    (2, "the two sides' mappings differ in the child"),
    (3, "usermm's copy of a page the kernel's fork wiped (MADV_WIPEONFORK) is not zeros"),
    (4, "the kernel's copy of a page differs from the model (a fuzzer bug)"),
    (5, "usermm's copy of a page differs from the model as of the fork"),
    (6, "usermm's copy of a page differs from the model after the child paged it out"),
    (101, "the child panicked (usermm's validate, or the check itself)"),
];

// ---------------------------------------------------------------- randomness

use usermm_core::rng::Rng;

/// The initial contents of page `p` of file `id` (0: A, 1: B).
fn file_page(id: u64, p: usize) -> Box<[u8]> {
    let mut b = vec![0u8; PAGE].into_boxed_slice();
    Rng::new(id.wrapping_mul(1_000_003).wrapping_add(p as u64 + 1)).fill(&mut b);
    b
}

// ---------------------------------------------------------------- calls

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileSel {
    Anon,
    A,
    B,
}

/// One call. Offsets are bytes from `base()` (possibly unaligned or outside
/// the area, to reach the errno paths); `salt` chooses which pages the
/// per-call check samples, so that a replayed call checks the same pages.
#[derive(Clone, Debug)]
enum Op {
    Mmap {
        off: usize,
        len: usize,
        prot: i32,
        flags: i32,
        file: FileSel,
        foff: i64,
        salt: u64,
    },
    Munmap {
        off: usize,
        len: usize,
        salt: u64,
    },
    Mprotect {
        off: usize,
        len: usize,
        prot: i32,
        salt: u64,
    },
    Madvise {
        off: usize,
        len: usize,
        advice: i32,
        salt: u64,
    },
    Mlock {
        off: usize,
        len: usize,
        flags: u32,
        salt: u64,
    },
    /// A fully mapped range larger than the budget; both sides are put back
    /// to the previous lock state afterwards.
    MlockOverBudget {
        off: usize,
        len: usize,
    },
    Munlock {
        off: usize,
        len: usize,
        salt: u64,
    },
    Mincore {
        off: usize,
        len: usize,
    },
    Msync {
        off: usize,
        len: usize,
        flags: i32,
        salt: u64,
    },
    /// Random bytes (from `seed`) at `at..at+len` of page `page`, if the
    /// model has it mapped writable.
    Write {
        page: usize,
        at: usize,
        len: usize,
        seed: u64,
    },
    /// Reads page `page` on both sides and checks it, if mapped readable.
    Read {
        page: usize,
    },
    /// Forks: the child checks both sides' every page against the model as
    /// of the fork, pages out its copy of the space and checks it again;
    /// then the parent checks everything. (Shared regions and locked file
    /// windows, which usermm does not copy, are unmapped first.)
    Fork,
}

fn hexlen(len: usize) -> String {
    if len > usize::MAX / 2 {
        format!("usize::MAX-{:#x}", usize::MAX - len)
    } else {
        format!("{len:#x}")
    }
}

fn prot_str(p: i32) -> String {
    let mut v = Vec::new();
    for (b, n) in [(PROT_READ, "R"), (PROT_WRITE, "W"), (PROT_EXEC, "X")] {
        if p & b != 0 {
            v.push(n.to_string());
        }
    }
    if p & !PROT_MASK != 0 {
        v.push(format!("{:#x}", p & !PROT_MASK));
    }
    if v.is_empty() {
        "PROT_NONE".into()
    } else {
        format!("PROT_{}", v.join("|"))
    }
}

fn map_flags_str(f: i32) -> String {
    let names = [
        (MAP_SHARED, "SHARED"),
        (MAP_PRIVATE, "PRIVATE"),
        (MAP_FIXED, "FIXED"),
        (MAP_ANONYMOUS, "ANONYMOUS"),
        (MAP_LOCKED, "LOCKED"),
        (MAP_POPULATE, "POPULATE"),
        (MAP_NORESERVE, "NORESERVE"),
        (MAP_FIXED_NOREPLACE, "FIXED_NOREPLACE"),
    ];
    let mut v = Vec::new();
    let mut rest = f;
    for (b, n) in names {
        if f & b == b && b != 0 {
            v.push(format!("MAP_{n}"));
            rest &= !b;
        }
    }
    if rest != 0 {
        v.push(format!("{rest:#x}"));
    }
    v.join("|")
}

fn advice_str(a: i32) -> String {
    let n = match a {
        MADV_NORMAL => "NORMAL",
        MADV_RANDOM => "RANDOM",
        MADV_SEQUENTIAL => "SEQUENTIAL",
        MADV_WILLNEED => "WILLNEED",
        MADV_DONTNEED => "DONTNEED",
        MADV_FREE => "FREE",
        MADV_REMOVE => "REMOVE",
        MADV_DONTFORK => "DONTFORK",
        MADV_DOFORK => "DOFORK",
        MADV_MERGEABLE => "MERGEABLE",
        MADV_UNMERGEABLE => "UNMERGEABLE",
        MADV_HUGEPAGE => "HUGEPAGE",
        MADV_NOHUGEPAGE => "NOHUGEPAGE",
        MADV_DONTDUMP => "DONTDUMP",
        MADV_DODUMP => "DODUMP",
        MADV_WIPEONFORK => "WIPEONFORK",
        MADV_KEEPONFORK => "KEEPONFORK",
        MADV_COLD => "COLD",
        MADV_PAGEOUT => "PAGEOUT",
        MADV_POPULATE_READ => "POPULATE_READ",
        MADV_POPULATE_WRITE => "POPULATE_WRITE",
        MADV_DONTNEED_LOCKED => "DONTNEED_LOCKED",
        MADV_COLLAPSE => "COLLAPSE",
        _ => return format!("{a}"),
    };
    format!("MADV_{n}")
}

/// Linux 5.18's `MADV_DONTNEED_LOCKED` and 6.1's `MADV_COLLAPSE`.
const MADV_DONTNEED_LOCKED: i32 = 24;
const MADV_COLLAPSE: i32 = 25;

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Mmap { off, len, prot, flags, file, foff, .. } => {
                let fd = match file {
                    FileSel::Anon => "-1",
                    FileSel::A => "fdA",
                    FileSel::B => "fdB",
                };
                write!(
                    f,
                    "mmap(base+{off:#x}, {}, {}, {}, {fd}, {foff:#x})",
                    hexlen(len),
                    prot_str(prot),
                    map_flags_str(flags)
                )
            }
            Op::Munmap { off, len, .. } => write!(f, "munmap(base+{off:#x}, {})", hexlen(len)),
            Op::Mprotect { off, len, prot, .. } => {
                write!(f, "mprotect(base+{off:#x}, {}, {})", hexlen(len), prot_str(prot))
            }
            Op::Madvise { off, len, advice, .. } => {
                write!(f, "madvise(base+{off:#x}, {}, {})", hexlen(len), advice_str(advice))
            }
            Op::Mlock { off, len, flags, .. } => {
                let fl = if flags == MLOCK_ONFAULT { "MLOCK_ONFAULT".to_string() } else { format!("{flags:#x}") };
                write!(f, "mlock2(base+{off:#x}, {}, {fl})", hexlen(len))
            }
            Op::MlockOverBudget { off, len } => {
                write!(f, "mlock2(base+{off:#x}, {}, 0) /* over budget; lock state restored after */", hexlen(len))
            }
            Op::Munlock { off, len, .. } => write!(f, "munlock(base+{off:#x}, {})", hexlen(len)),
            Op::Mincore { off, len } => write!(f, "mincore(base+{off:#x}, {})", hexlen(len)),
            Op::Msync { off, len, flags, .. } => write!(f, "msync(base+{off:#x}, {}, {flags:#x})", hexlen(len)),
            Op::Write { page, at, len, seed } => {
                write!(f, "write(base+{:#x}, {len} random bytes of seed {seed:#x})", page * PAGE + at)
            }
            Op::Read { page } => write!(f, "read+check(base+{:#x}, one page)", page * PAGE),
            Op::Fork => write!(f, "fork (the child checks every page, pages out and checks again)"),
        }
    }
}

// ---------------------------------------------------------------- the model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Anon,
    Shared,
    FileA,
    FileB,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    No,
    Now,
    OnFault,
}

/// One allowed contents of a page: bytes (`None`: zeros), and whether it is
/// lazily freed (it may also read back as zeros, at any moment).
#[derive(Clone, PartialEq, Eq)]
struct Alt {
    data: Option<Box<[u8]>>,
    lazy: bool,
}

impl Alt {
    fn exact(data: Option<Box<[u8]>>) -> Alt {
        Alt { data, lazy: false }
    }
    fn matches(&self, actual: &[u8], actual_zero: bool) -> bool {
        match &self.data {
            None => actual_zero,
            Some(d) => **d == *actual || self.lazy && actual_zero,
        }
    }
}

/// The allowed contents of a page on one side. Invariant: never empty.
#[derive(Clone, PartialEq, Eq)]
struct Alts(Vec<Alt>);

impl Alts {
    fn zero() -> Alts {
        Alts(vec![Alt::exact(None)])
    }
    fn bytes(b: Box<[u8]>) -> Alts {
        Alts(vec![Alt::exact(Some(b))])
    }
    fn dedup(&mut self) {
        let mut out: Vec<Alt> = Vec::new();
        for a in self.0.drain(..) {
            let a = match a.data {
                Some(d) if d.iter().all(|&b| b == 0) => Alt { data: None, lazy: false },
                Some(d) => Alt { data: Some(d), lazy: a.lazy },
                None => Alt { data: None, lazy: false },
            };
            if !out.contains(&a) {
                out.push(a);
            }
        }
        self.0 = out;
    }
    /// Narrows to what was read; `Err` if nothing allowed matches.
    fn observe(&mut self, actual: &[u8]) -> Result<(), String> {
        let zero = actual.iter().all(|&b| b == 0);
        let mut out = Vec::new();
        for a in &self.0 {
            if !a.matches(actual, zero) {
                continue;
            }
            match &a.data {
                Some(d) if **d == *actual => out.push(a.clone()),
                // A lazy page seen discarded stays zero until written.
                _ => out.push(Alt::exact(None)),
            }
        }
        if out.is_empty() {
            return Err(self.describe_mismatch(actual));
        }
        self.0 = out;
        self.dedup();
        Ok(())
    }
    fn describe_mismatch(&self, actual: &[u8]) -> String {
        let mut s = format!("read {}; allowed:", summary(actual));
        for a in &self.0 {
            let d = a.data.as_deref().map(summary).unwrap_or_else(|| "zeros".into());
            s += &format!(" [{d}{}]", if a.lazy { " or zeros (lazily freed)" } else { "" });
            if let Some(d) = &a.data {
                if let Some(i) = d.iter().zip(actual).position(|(x, y)| x != y) {
                    s += &format!(" (first difference at byte {i}: {:#04x} expected, {:#04x} read)", d[i], actual[i]);
                }
            }
        }
        s
    }
    fn write(&mut self, at: usize, data: &[u8]) {
        let mut out = Vec::new();
        for a in &self.0 {
            let mut bases = vec![a.data.clone()];
            if a.lazy && a.data.is_some() {
                bases.push(None);
            }
            for b in bases {
                let mut page = b.unwrap_or_else(|| vec![0u8; PAGE].into_boxed_slice());
                page[at..at + data.len()].copy_from_slice(data);
                out.push(Alt::exact(Some(page)));
            }
        }
        self.0 = out;
        self.dedup();
    }
    fn free(&mut self) {
        for a in &mut self.0 {
            a.lazy = a.data.is_some();
        }
        self.dedup();
    }
    fn union(&mut self, other: Alts) {
        self.0.extend(other.0);
        self.dedup();
    }
}

fn summary(b: &[u8]) -> String {
    if b.iter().all(|&x| x == 0) {
        return "zeros".into();
    }
    let h = b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3));
    format!("bytes {:02x?}.. (fnv {h:016x})", &b[..8])
}

#[derive(Clone)]
struct Slot {
    kind: Kind,
    prot: i32,
    lock: Lock,
    /// Per side (0 kernel, 1 usermm); unused for file A (the file holds it).
    data: [Alts; 2],
}

struct Model {
    pages: Vec<Option<Slot>>,
    /// File A's contents per side.
    file_a: [Vec<Alts>; 2],
    file_b: Vec<Box<[u8]>>,
}

/// Writable but not exactly read-write: unevictable in usermm.
fn pins(prot: i32) -> bool {
    prot & PROT_WRITE != 0 && prot & PROT_MASK != PROT_READ | PROT_WRITE
}

fn readable(prot: i32) -> bool {
    prot & (PROT_READ | PROT_WRITE) != 0
}

impl Model {
    fn new() -> Model {
        let a: Vec<Alts> = (0..AREA_PAGES).map(|p| Alts::bytes(file_page(0, p))).collect();
        Model {
            pages: vec![None; AREA_PAGES],
            file_a: [a.clone(), a],
            file_b: (0..AREA_PAGES).map(|p| file_page(1, p)).collect(),
        }
    }
    fn alts(&mut self, side: usize, p: usize) -> &mut Alts {
        let s = self.pages[p].as_mut().expect("mapped page");
        match s.kind {
            Kind::FileA => &mut self.file_a[side][p],
            _ => &mut s.data[side],
        }
    }
    fn fresh(&self, kind: Kind, p: usize) -> Alts {
        match kind {
            Kind::Anon | Kind::Shared | Kind::FileA => Alts::zero(),
            Kind::FileB => Alts::bytes(self.file_b[p].clone()),
        }
    }
    fn mapped(&self, p: usize) -> bool {
        p < AREA_PAGES && self.pages[p].is_some()
    }
    fn locked_pages(&self) -> usize {
        self.pages.iter().flatten().filter(|s| s.lock != Lock::No).count()
    }
    /// Pages usermm never evicts: locked, or in a writable region that is
    /// not exactly read-write.
    fn pinned_pages(&self) -> usize {
        self.pages.iter().flatten().filter(|s| s.lock != Lock::No || pins(s.prot)).count()
    }
    /// Whether mapping `[lo, hi)` afresh with `prot` (locked if `lock`)
    /// keeps the pinned pages within the cap.
    fn pin_fits(&self, lo: usize, hi: usize, prot: i32, lock: bool) -> bool {
        let hi = hi.min(AREA_PAGES);
        let gone =
            (lo..hi).filter(|&p| self.pages[p].as_ref().is_some_and(|s| s.lock != Lock::No || pins(s.prot))).count();
        let added = if pins(prot) || lock { hi.saturating_sub(lo) } else { 0 };
        self.pinned_pages() - gone + added <= PIN_CAP_PAGES
    }
    /// Whether making `[lo, hi)` `prot` (locks kept) keeps the pinned pages
    /// within the cap.
    fn prot_fits(&self, lo: usize, hi: usize, prot: i32) -> bool {
        let hi = hi.min(AREA_PAGES);
        let newly =
            (lo..hi).filter(|&p| self.pages[p].as_ref().is_some_and(|s| s.lock == Lock::No && !pins(s.prot))).count();
        !pins(prot) || self.pinned_pages() + newly <= PIN_CAP_PAGES
    }
    /// The end of the run of mapped pages from `lo` (at most `hi`): `lo`
    /// when `lo` is unmapped.
    fn mapped_prefix_end(&self, lo: usize, hi: usize) -> usize {
        (lo..hi).find(|&p| !self.mapped(p)).unwrap_or(hi)
    }
    /// Runs of mapped pages inside `[lo, hi)`.
    fn runs(&self, lo: usize, hi: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut p = lo;
        while p < hi.min(AREA_PAGES) {
            if self.pages[p].is_none() {
                p += 1;
                continue;
            }
            let s = p;
            while p < hi.min(AREA_PAGES) && self.pages[p].is_some() {
                p += 1;
            }
            out.push((s, p));
        }
        out
    }
    /// What a content-changing advice does to page `p` on one side when it
    /// is applied (`None`: nothing).
    fn advised(&self, side: usize, p: usize, advice: i32) -> Option<Alts> {
        let s = self.pages[p].as_ref()?;
        let cur = match s.kind {
            Kind::FileA => &self.file_a[side][p],
            _ => &s.data[side],
        };
        match (advice, s.kind) {
            (MADV_DONTNEED | MADV_DONTNEED_LOCKED, Kind::Anon) => Some(Alts::zero()),
            (MADV_DONTNEED | MADV_DONTNEED_LOCKED, Kind::FileB) => Some(self.fresh(Kind::FileB, p)),
            (MADV_FREE, Kind::Anon) => {
                let mut a = cur.clone();
                a.free();
                Some(a)
            }
            (MADV_REMOVE, Kind::Shared | Kind::FileA) => Some(Alts::zero()),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------- backends

/// A temporary file in /dev/shm (tmpfs: its page cache is never dropped
/// without swap, so the kernel's `mincore` of it is stable), unlinked at
/// once.
fn temp_file(tag: &str, id: u64) -> std::fs::File {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let path = format!("{dir}/usermm-fuzz-{}-{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("temp file");
    std::fs::remove_file(&path).expect("unlink temp file");
    let mut all = Vec::with_capacity(AREA_PAGES * PAGE);
    for p in 0..AREA_PAGES {
        all.extend_from_slice(&file_page(id, p));
    }
    use std::io::Write;
    (&f).write_all(&all).expect("fill temp file");
    f
}

#[derive(Clone, Copy, Debug)]
struct Variant {
    name: &'static str,
    fault_threads: u32,
    /// usermm's background reclaim thread on (else reclaim is direct only,
    /// in faults and calls: deterministic, which the shrinker likes).
    background_reclaim: bool,
    /// The test runs `USERMM_FUZZ_CALLS` divided by this many calls.
    calls_divisor: usize,
    /// The `#[test]` that runs it (named in the reproduction hint).
    test: &'static str,
}

struct Sides {
    k: KernelMm,
    u: UserMm,
    /// Per side: file A, file B.
    files: [[std::fs::File; 2]; 2],
}

impl Sides {
    fn new(v: Variant) -> Sides {
        let cfg = Config {
            budget_bytes: BUDGET_PAGES * PAGE,
            reserve_bytes: 2 << 30,
            swap_bytes: 64 << 20,
            // The swap file on tmpfs where there is one: the same swap code
            // (buffered I/O instead of O_DIRECT), at memory speed, so that
            // the calls, not the disk, set the pace.
            swap_dir: std::path::Path::new("/dev/shm").is_dir().then(|| "/dev/shm".into()),
            // Unlimited, as for root on the kernel side (CAP_IPC_LOCK): the
            // lock cap is the fuzzer's own (LOCK_CAP_PAGES).
            memlock_bytes: usize::MAX,
            fault_threads: v.fault_threads,
            // Exact faults: Linux's residency. Full userfaultfd or fail
            // loudly (no user-mode-only fallback).
            flags: UMM_F_EXACT_FAULTS
                | UMM_F_REQUIRE_FULL_UFFD
                | if v.background_reclaim { 0 } else { UMM_F_NO_BACKGROUND_RECLAIM },
            ..Config::default()
        };
        let u = UserMm { space: common::open_mode(&cfg).expect("usermm space (needs full userfaultfd: run as root)") };
        let files = [0, 1].map(|_| [temp_file("A", 0), temp_file("B", 1)]);
        Sides { k: KernelMm::new(), u, files }
    }
    fn mm(&self, side: usize) -> &dyn Mm {
        if side == 0 {
            &self.k
        } else {
            &self.u
        }
    }
}

// ---------------------------------------------------------------- results

#[derive(Clone, Debug, PartialEq)]
enum Res {
    Addr(Result<usize, Errno>),
    Unit(Result<(), Errno>),
    Core(Result<Vec<u8>, Errno>),
    Skip,
}

impl fmt::Display for Res {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Res::Addr(Ok(a)) => write!(f, "base+{a:#x}"),
            Res::Unit(Ok(())) => write!(f, "0"),
            Res::Core(Ok(v)) => {
                write!(f, "[{}]", v.iter().map(|b| if b & 1 != 0 { '1' } else { '0' }).collect::<String>())
            }
            Res::Addr(Err(e)) | Res::Unit(Err(e)) | Res::Core(Err(e)) => write!(f, "{e:?}"),
            Res::Skip => write!(f, "(skipped: not mapped as needed)"),
        }
    }
}

impl Res {
    fn err(&self) -> Option<Errno> {
        match self {
            Res::Addr(Err(e)) | Res::Unit(Err(e)) | Res::Core(Err(e)) => Some(*e),
            _ => None,
        }
    }
    fn ok(&self) -> bool {
        self.err().is_none()
    }
}

/// A divergence: where, what, and both sides' results.
#[derive(Debug)]
struct Divergence {
    index: usize,
    op: String,
    what: String,
}

// ---------------------------------------------------------------- the run

struct Run {
    sides: Sides,
    model: Model,
    trace: bool,
    deviations: [u64; DEVIATIONS.len()],
    calls: usize,
    /// Forks whose child checked a copy of both sides.
    forks: usize,
    /// The calls made, with both results (for the reproduction).
    log: Vec<(String, String, String)>,
}

fn page_span(off: usize, len: usize) -> (usize, usize) {
    let lo = off / PAGE;
    let hi = off.saturating_add(len).saturating_add(PAGE - 1) / PAGE;
    (lo.min(AREA_PAGES), hi.min(AREA_PAGES))
}

/// The pages `mlock2`/`munlock` act on: Linux widens the range with
/// wrap-around, and a length that wraps to 0 is an empty range (a no-op
/// that succeeds).
fn lock_span(off: usize, len: usize) -> (usize, usize) {
    let bytes = len.wrapping_add(off & (PAGE - 1)).wrapping_add(PAGE - 1) & !(PAGE - 1);
    if bytes == 0 {
        return (0, 0);
    }
    page_span(off & !(PAGE - 1), bytes)
}

fn arg_ok(off: usize, len: usize) -> bool {
    off.is_multiple_of(PAGE) && off.checked_add(len).is_some_and(|e| e <= (1 << 30))
}

impl Run {
    fn new(v: Variant) -> Run {
        Run {
            sides: Sides::new(v),
            model: Model::new(),
            trace: std::env::var_os("USERMM_FUZZ_TRACE").is_some(),
            deviations: [0; DEVIATIONS.len()],
            calls: 0,
            forks: 0,
            log: Vec::new(),
        }
    }

    fn base(&self, side: usize) -> usize {
        self.sides.mm(side).base()
    }

    fn deviation(&mut self, name: &str) {
        let i = DEVIATIONS.iter().position(|(n, _)| *n == name).expect("a listed deviation");
        self.deviations[i] += 1;
    }

    fn fd(&self, side: usize, file: FileSel) -> i32 {
        match file {
            FileSel::Anon => -1,
            FileSel::A => self.sides.files[side][0].as_raw_fd(),
            FileSel::B => self.sides.files[side][1].as_raw_fd(),
        }
    }

    /// Makes `op` on one side.
    fn exec(&self, side: usize, op: &Op) -> Res {
        let mm = self.sides.mm(side);
        let b = mm.base();
        match *op {
            Op::Mmap { off, len, prot, flags, file, foff, .. } => {
                let r = mm.mmap_fd(b + off, len, prot, flags, self.fd(side, file), foff);
                Res::Addr(r.map(|a| a - b))
            }
            Op::Munmap { off, len, .. } => Res::Unit(mm.munmap(b + off, len)),
            Op::Mprotect { off, len, prot, .. } => Res::Unit(mm.mprotect(b + off, len, prot)),
            Op::Madvise { off, len, advice, .. } => Res::Unit(mm.madvise(b + off, len, advice)),
            Op::Mlock { off, len, flags, .. } => Res::Unit(mm.mlock2(b + off, len, flags)),
            Op::MlockOverBudget { off, len } => Res::Unit(mm.mlock2(b + off, len, 0)),
            Op::Munlock { off, len, .. } => Res::Unit(mm.munlock(b + off, len)),
            Op::Mincore { off, len } => Res::Core(mm.mincore(b + off, len)),
            Op::Msync { off, len, flags, .. } => Res::Unit(mm.msync(b + off, len, flags)),
            Op::Write { .. } | Op::Read { .. } | Op::Fork => Res::Skip,
        }
    }

    fn diverge(&self, index: usize, op: &Op, what: String) -> Divergence {
        Divergence { index, op: op.to_string(), what }
    }

    /// Applies one call to both sides and checks everything it may have
    /// changed.
    fn step(&mut self, index: usize, op: &Op) -> Result<(), Divergence> {
        self.calls += 1;
        let (k, u) = match op {
            Op::Write { page, at, len, seed } => {
                self.write(index, op, *page, *at, *len, *seed)?;
                (Res::Skip, Res::Skip)
            }
            Op::Read { page } => {
                if self.model.mapped(*page) && readable(self.model.pages[*page].as_ref().unwrap().prot) {
                    self.check_page(index, op, *page)?;
                }
                (Res::Skip, Res::Skip)
            }
            Op::Fork => {
                self.fork(index, op)?;
                (Res::Skip, Res::Skip)
            }
            Op::MlockOverBudget { off, len } => {
                let (k, u) = (self.exec(0, op), self.exec(1, op));
                if k != u {
                    // (The kernel says ENOMEM when the range has a
                    // PROT_NONE part, whose populate fails after the pages
                    // before it were populated; usermm checks its budget
                    // first.)
                    if (k.ok() || k.err() == Some(Errno::ENOMEM)) && u.err() == Some(Errno::EAGAIN) {
                        self.deviation("mlock-over-budget");
                    } else {
                        return Err(self.diverge(index, op, format!("kernel {k}, usermm {u}")));
                    }
                }
                self.restore_locks(index, op, *off, *len)?;
                (k, u)
            }
            // A hint is only given where the model has nothing (elsewhere
            // the kernel would map outside the arena): a call of a shrunk
            // list that no longer finds its range free is skipped.
            Op::Mmap { off, len, flags, .. }
                if *flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) == 0
                    && *len < (1 << 30)
                    && (*off / PAGE..(*off + *len).div_ceil(PAGE)).any(|p| p >= AREA_PAGES || self.model.mapped(p)) =>
            {
                (Res::Skip, Res::Skip)
            }
            _ => {
                let (k, u) = (self.exec(0, op), self.exec(1, op));
                if let (Res::Core(Ok(kv)), Res::Core(Ok(uv))) = (&k, &u) {
                    if kv.len() != uv.len() {
                        return Err(self.diverge(index, op, format!("mincore lengths: kernel {k}, usermm {u}")));
                    }
                    // (Page numbers of an aligned range inside the area;
                    // anything else gets no exemption.)
                    let first = match *op {
                        Op::Mincore { off, .. } if off % PAGE == 0 && off / PAGE < AREA_PAGES => off / PAGE,
                        _ => usize::MAX / 2,
                    };
                    self.residency_ok(index, op, first, kv, uv)?;
                } else if k != u {
                    match accepted(op, &k, &u) {
                        Some(name) => self.deviation(name),
                        None => return Err(self.diverge(index, op, format!("kernel {k}, usermm {u}"))),
                    }
                }
                self.update(index, op, &k, &u)?;
                (k, u)
            }
        };
        self.log.push((op.to_string(), k.to_string(), u.to_string()));
        self.post_check(index, op)?;
        if (index + 1).is_multiple_of(FULL_CHECK_EVERY) {
            self.full_check(index, op)?;
        } else if (index + 1).is_multiple_of(RESIDENCY_EVERY) {
            self.check_residency(index, op, 0, AREA_PAGES)?;
        }
        Ok(())
    }

    fn write(
        &mut self,
        index: usize,
        op: &Op,
        page: usize,
        at: usize,
        len: usize,
        seed: u64,
    ) -> Result<(), Divergence> {
        let Some(s) = self.model.pages.get(page).and_then(|s| s.as_ref()) else {
            return Ok(());
        };
        if s.prot & PROT_WRITE == 0 {
            return Ok(());
        }
        // Narrow the page first where it has alternatives (a lazy page
        // forks on write: see the model); an exact page needs no read.
        let exact = (0..2).all(|side| {
            let s = self.model.pages[page].as_ref().unwrap();
            let a = if s.kind == Kind::FileA { &self.model.file_a[side][page] } else { &s.data[side] };
            a.0.len() == 1 && !a.0[0].lazy
        });
        if !exact {
            self.check_page(index, op, page)?;
        }
        let mut data = vec![0u8; len];
        Rng::new(seed).fill(&mut data);
        for side in 0..2 {
            let a = self.base(side) + page * PAGE + at;
            self.sides.mm(side).write_bytes(a, &data);
            self.model.alts(side, page).write(at, &data);
        }
        Ok(())
    }

    /// Reads page `p` on both sides and checks each against its model.
    /// [`Op::Fork`]: a child (of this process, so of both sides) checks
    /// its copies ([`Run::child_check`]); the parent then checks that the
    /// child changed nothing of its own.
    fn fork(&mut self, index: usize, op: &Op) -> Result<(), Divergence> {
        let out = usermm_sys::thread::fork_run(60, || self.child_check());
        match out {
            Ok(ChildExit::Exited(0)) => self.forks += 1,
            other => {
                let what = match other {
                    Ok(ChildExit::Exited(c)) => {
                        CHILD_CODES.iter().find(|x| x.0 == c).map_or_else(|| format!("exit {c}"), |x| x.1.to_string())
                    }
                    _ => format!("{other:?}"),
                };
                return Err(self.diverge(index, op, format!("the forked child's check: {what}")));
            }
        }
        self.full_check(index, op)
    }

    /// In a forked child: both sides' copies against the model as of the
    /// fork (a range neither side has is `MADV_DONTFORK`'s; one the kernel
    /// reads as zeros where the model has bytes, `MADV_WIPEONFORK`'s, and
    /// usermm must read zeros there too); then usermm's copy paged out and
    /// read again. Returns 0, or a code of [`CHILD_CODES`].
    fn child_check(&mut self) -> i32 {
        let b = self.base(1);
        if self.sides.u.space.madvise(b, AREA_PAGES * PAGE, MADV_NORMAL) == Err(Errno::ESTALE) {
            return CHILD_NOT_COPIED;
        }
        let (pk, pu) = (self.perms(0), self.perms(1));
        if pk != pu {
            return 2;
        }
        let mut bufs = [vec![0u8; PAGE], vec![0u8; PAGE]];
        let mut wiped = vec![false; AREA_PAGES];
        for p in 0..AREA_PAGES {
            if pk[p].is_none() || !self.model.pages[p].as_ref().is_some_and(|s| readable(s.prot)) {
                continue;
            }
            for (side, buf) in bufs.iter_mut().enumerate() {
                self.sides.mm(side).read_bytes(self.base(side) + p * PAGE, buf);
            }
            if bufs[0].iter().all(|&x| x == 0) && self.model.alts(0, p).clone().observe(&bufs[0]).is_err() {
                wiped[p] = true;
                if bufs[1].iter().any(|&x| x != 0) {
                    return 3;
                }
                continue;
            }
            for (side, buf) in bufs.iter().enumerate() {
                if self.model.alts(side, p).observe(buf).is_err() {
                    return 4 + side as i32;
                }
            }
        }
        // The child's own evictions (its swap file; the parent's slots read
        // in place), then every page again.
        let _ = self.sides.u.space.madvise(b, AREA_PAGES * PAGE, MADV_PAGEOUT);
        for p in 0..AREA_PAGES {
            if pk[p].is_none() || !self.model.pages[p].as_ref().is_some_and(|s| readable(s.prot)) {
                continue;
            }
            self.sides.u.read_bytes(b + p * PAGE, &mut bufs[1]);
            let ok = if wiped[p] {
                bufs[1].iter().all(|&x| x == 0)
            } else {
                self.model.alts(1, p).observe(&bufs[1]).is_ok()
            };
            if !ok {
                return 6;
            }
        }
        self.sides.u.space.validate();
        0
    }

    fn check_page(&mut self, index: usize, op: &Op, p: usize) -> Result<(), Divergence> {
        let mut buf = vec![0u8; PAGE];
        for side in 0..2 {
            if self.trace {
                eprintln!("fuzz:   check page {p} on side {side}");
            }
            self.sides.mm(side).read_bytes(self.base(side) + p * PAGE, &mut buf);
            if let Err(e) = self.model.alts(side, p).observe(&buf) {
                let who = ["kernel", "usermm"][side];
                let s = self.model.pages[p].as_ref().unwrap();
                let what = format!(
                    "contents of page {p} (base+{:#x}, {:?} {} lock {:?}) on {who}: {e}{}",
                    p * PAGE,
                    s.kind,
                    prot_str(s.prot),
                    s.lock,
                    if side == 0 { " [the kernel disagrees with the model: a fuzzer bug]" } else { "" }
                );
                return Err(self.diverge(index, op, what));
            }
        }
        Ok(())
    }

    /// usermm resident => kernel resident (see the module comment).
    fn residency_ok(&mut self, index: usize, op: &Op, first: usize, k: &[u8], u: &[u8]) -> Result<(), Divergence> {
        for (i, (kb, ub)) in k.iter().zip(u).enumerate() {
            if ub & 1 != 0 && kb & 1 == 0 {
                if self.zero_shmem(first + i) {
                    self.deviation("zero-shmem-page-kept");
                    continue;
                }
                if self.zero_anon(first + i) {
                    self.deviation("zero-anon-page-residency");
                    continue;
                }
                // usermm never evicts (nor discards, after MADV_FREE) a page
                // of a writable region that is not exactly read-write; the
                // kernel's MADV_PAGEOUT drops such a page when clean.
                if self.model.pages.get(first + i).and_then(|s| s.as_ref()).is_some_and(|s| pins(s.prot)) {
                    self.deviation("unevictable-writable-non-rw");
                    continue;
                }
                if self.kernel_swapped(first + i) {
                    self.deviation("host-swapped");
                    continue;
                }
                let info = self.page_info(first + i);
                let swap = if host_swap_active() { "; a host swap is active" } else { "" };
                return Err(self.diverge(
                    index,
                    op,
                    format!(
                        "residency: page {} ({info}; of the mincore range from page {first}) resident on usermm, not on the kernel: kernel [{}] usermm [{}]{swap}",
                        first + i,
                        bits(k),
                        bits(u)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What the model knows of page `p`, for messages.
    fn page_info(&self, p: usize) -> String {
        match self.model.pages.get(p).and_then(|s| s.as_ref()) {
            None => "unmapped".into(),
            Some(s) => {
                let alts = |side: usize| {
                    let a = if s.kind == Kind::FileA { &self.model.file_a[side][p] } else { &s.data[side] };
                    a.0.iter()
                        .map(|x| {
                            let d = x.data.as_deref().map(summary).unwrap_or_else(|| "zeros".into());
                            format!("{d}{}", if x.lazy { " (lazy)" } else { "" })
                        })
                        .collect::<Vec<_>>()
                        .join(" | ")
                };
                format!("{:?} {} lock {:?}, kernel {}, usermm {}", s.kind, prot_str(s.prot), s.lock, alts(0), alts(1))
            }
        }
    }

    /// Page `p` is shared memory (anonymous or file A) whose contents may be
    /// zeros on both sides (a hole): the kernel may drop its clean
    /// page-cache page (MADV_PAGEOUT) or have none (a hole MADV_REMOVE
    /// punched, which MADV_WILLNEED does not fill) where usermm keeps or
    /// maps a page of zeros.
    fn zero_shmem(&self, p: usize) -> bool {
        let Some(s) = self.model.pages.get(p).and_then(|s| s.as_ref()) else {
            return false;
        };
        let zero = |side: usize| {
            let a = if s.kind == Kind::FileA { &self.model.file_a[side][p] } else { &s.data[side] };
            a.0.iter().any(|x| x.data.is_none())
        };
        matches!(s.kind, Kind::Shared | Kind::FileA) && zero(0) && zero(1)
    }

    /// Page `p` is private anonymous memory that may hold zeros on both
    /// sides: zeros, or lazily freed (see DEVIATIONS,
    /// "zero-anon-page-residency" and "lazyfree-discard").
    fn zero_anon(&self, p: usize) -> bool {
        let Some(s) = self.model.pages.get(p).and_then(|s| s.as_ref()) else {
            return false;
        };
        let zero = |side: usize| s.data[side].0.iter().any(|a| a.data.is_none() || a.lazy);
        s.kind == Kind::Anon && zero(0) && zero(1)
    }

    /// The kernel's copy of page `p` is in the host's swap (see DEVIATIONS,
    /// "host-swapped"): a private page's page-table entry is a swap entry
    /// (`/proc/self/pagemap` bit 62); a shared or file page has no entry
    /// then (shmem keeps its swap entries in the file, out of pagemap's
    /// sight), so it counts when the kernel's mapping of it is not present
    /// and that mapping's smaps reports swap.
    fn kernel_swapped(&self, p: usize) -> bool {
        let Some(s) = self.model.pages.get(p).and_then(|s| s.as_ref()) else {
            return false;
        };
        let addr = self.base(0) + p * PAGE;
        let Some(e) = pagemap_entry(addr) else {
            return false;
        };
        const PRESENT: u64 = 1 << 63;
        const SWAPPED: u64 = 1 << 62;
        if e & SWAPPED != 0 {
            return true;
        }
        e & PRESENT == 0 && s.kind != Kind::Anon && smaps_swap_kb(addr) > 0
    }

    fn mincore_both(&self, lo: usize, hi: usize) -> [Result<Vec<u8>, Errno>; 2] {
        [0, 1].map(|s| self.sides.mm(s).mincore(self.base(s) + lo * PAGE, (hi - lo) * PAGE))
    }

    /// Residency of the mapped runs of `[lo, hi)`.
    fn check_residency(&mut self, index: usize, op: &Op, lo: usize, hi: usize) -> Result<(), Divergence> {
        let mut n = 0;
        for (s, e) in self.model.runs(lo, hi) {
            let [k, u] = self.mincore_both(s, e);
            match (k, u) {
                (Ok(k), Ok(u)) => self.residency_ok(index, op, s, &k, &u)?,
                (k, u) => {
                    return Err(self.diverge(
                        index,
                        op,
                        format!("mincore of mapped pages {s}..{e}: kernel {:?}, usermm {:?}", k.err(), u.err()),
                    ))
                }
            }
            n += e - s;
        }
        if n > 0 {
            self.deviation("residency-under-budget");
        }
        Ok(())
    }

    /// After each call: residency of its range, the contents of two pages of
    /// its range and of one page anywhere (chosen by the call's salt).
    fn post_check(&mut self, index: usize, op: &Op) -> Result<(), Divergence> {
        let (range, salt) = match *op {
            Op::Mmap { off, len, salt, .. }
            | Op::Munmap { off, len, salt }
            | Op::Mprotect { off, len, salt, .. }
            | Op::Madvise { off, len, salt, .. }
            | Op::Mlock { off, len, salt, .. }
            | Op::Munlock { off, len, salt }
            | Op::Msync { off, len, salt, .. } => (Some(page_span(off, len)), salt),
            _ => (None, 0),
        };
        let Some((lo, hi)) = range else {
            return Ok(());
        };
        self.check_residency(index, op, lo, hi)?;
        let mut r = Rng::new(salt);
        let mut cands: Vec<usize> = Vec::new();
        if hi > lo {
            cands.push(lo + r.index(hi - lo));
            cands.push(lo + r.index(hi - lo));
        }
        cands.push(r.index(AREA_PAGES));
        for p in cands {
            if self.model.pages[p].as_ref().is_some_and(|s| readable(s.prot)) {
                self.check_page(index, op, p)?;
            }
        }
        Ok(())
    }

    /// Every readable page, both layouts against the model, stats, and the
    /// core's invariants.
    fn full_check(&mut self, index: usize, op: &Op) -> Result<(), Divergence> {
        for p in 0..AREA_PAGES {
            if self.model.pages[p].as_ref().is_some_and(|s| readable(s.prot)) {
                self.check_page(index, op, p)?;
            }
        }
        self.check_residency(index, op, 0, AREA_PAGES)?;
        self.check_layout(index, op)?;
        let st = self.sides.u.space.stats();
        if st.resident_pages > st.budget_pages || st.resident_pages_max > st.budget_pages {
            return Err(self.diverge(
                index,
                op,
                format!(
                    "usermm over budget: resident {} (max {}) of {}",
                    st.resident_pages, st.resident_pages_max, st.budget_pages
                ),
            ));
        }
        if st.locked_charged_pages as usize > LOCK_CAP_PAGES.max(self.model.locked_pages()) {
            return Err(self.diverge(
                index,
                op,
                format!(
                    "usermm charges {} locked pages, the model has {}",
                    st.locked_charged_pages,
                    self.model.locked_pages()
                ),
            ));
        }
        self.sides.u.space.validate();
        Ok(())
    }

    /// The per-page `rwxp` of the area on one side (`None`: unmapped).
    fn perms(&self, side: usize) -> Vec<Option<String>> {
        let b = self.base(side);
        let mut out = vec![None; AREA_PAGES];
        for (s, e, p) in self.sides.mm(side).regions() {
            for (q, slot) in out.iter_mut().enumerate() {
                let a = b + q * PAGE;
                if s <= a && a < e {
                    *slot = Some(p.clone());
                }
            }
        }
        out
    }

    fn check_layout(&mut self, index: usize, op: &Op) -> Result<(), Divergence> {
        let (k, u) = (self.perms(0), self.perms(1));
        for p in 0..AREA_PAGES {
            let want = self.model.pages[p].as_ref().map(|s| {
                let r = |b, c| if s.prot & b != 0 { c } else { '-' };
                let t = if matches!(s.kind, Kind::Shared | Kind::FileA) { 's' } else { 'p' };
                format!("{}{}{}{t}", r(PROT_READ, 'r'), r(PROT_WRITE, 'w'), r(PROT_EXEC, 'x'))
            });
            if k[p] != u[p] || k[p] != want {
                return Err(self.diverge(
                    index,
                    op,
                    format!("layout at page {p}: kernel {:?}, usermm {:?}, model {want:?}", k[p], u[p]),
                ));
            }
        }
        Ok(())
    }

    /// Puts both sides back to the model's lock state on `[off, off+len)`.
    fn restore_locks(&mut self, index: usize, op: &Op, off: usize, len: usize) -> Result<(), Divergence> {
        let (lo, hi) = page_span(off, len);
        let mut res = Vec::new();
        for side in 0..2 {
            let mm = self.sides.mm(side);
            let b = mm.base();
            let mut r = vec![mm.munlock(b + lo * PAGE, (hi - lo) * PAGE)];
            let mut p = lo;
            while p < hi {
                let l = self.model.pages[p].as_ref().map_or(Lock::No, |s| s.lock);
                let s = p;
                while p < hi && self.model.pages[p].as_ref().map_or(Lock::No, |s| s.lock) == l {
                    p += 1;
                }
                if l != Lock::No {
                    let f = if l == Lock::OnFault { MLOCK_ONFAULT } else { 0 };
                    r.push(mm.mlock2(b + s * PAGE, (p - s) * PAGE, f));
                }
            }
            res.push(r);
        }
        if res[0] != res[1] {
            return Err(self.diverge(
                index,
                op,
                format!("restoring the lock state: kernel {:?}, usermm {:?}", res[0], res[1]),
            ));
        }
        Ok(())
    }

    /// Follows a call's effect in the model (from the kernel's result, equal
    /// to usermm's by now).
    /// Content changes follow each side's own result (`u` differs from `k`
    /// only through an accepted deviation).
    fn update(&mut self, index: usize, op: &Op, r: &Res, u: &Res) -> Result<(), Divergence> {
        match *op {
            Op::Mmap { len, prot, flags, file, .. } => {
                let Res::Addr(Ok(a)) = *r else {
                    return Ok(());
                };
                let (lo, hi) = page_span(a, len);
                assert!(a % PAGE == 0 && hi * PAGE >= a + len, "mmap landed outside the area: {op}");
                let kind = match file {
                    FileSel::A => Kind::FileA,
                    FileSel::B => Kind::FileB,
                    FileSel::Anon if flags & MAP_SHARED != 0 => Kind::Shared,
                    FileSel::Anon => Kind::Anon,
                };
                let lock = if flags & MAP_LOCKED != 0 { Lock::Now } else { Lock::No };
                for p in lo..hi {
                    let d = self.model.fresh(kind, p);
                    self.model.pages[p] = Some(Slot { kind, prot: prot & PROT_MASK, lock, data: [d.clone(), d] });
                }
            }
            Op::Munmap { off, len, .. } if r.ok() => {
                let (lo, hi) = page_span(off, len);
                for p in lo..hi {
                    self.model.pages[p] = None;
                }
            }
            Op::Mprotect { off, len, prot, .. } => {
                let (lo, hi) = page_span(off, len);
                if r.ok() {
                    for s in self.model.pages[lo..hi].iter_mut().flatten() {
                        s.prot = prot & PROT_MASK;
                    }
                } else if r.err() != Some(Errno::EINVAL) {
                    // A prefix may have changed (up to a hole, or a region
                    // that refused): take the kernel's word, and check that
                    // usermm agrees.
                    let k = self.perms(0);
                    for (s, pr) in self.model.pages[lo..hi].iter_mut().zip(&k[lo..hi]) {
                        if let (Some(s), Some(pr)) = (s.as_mut(), pr) {
                            let b = pr.as_bytes();
                            s.prot = ((b[0] == b'r') as i32 * PROT_READ)
                                | ((b[1] == b'w') as i32 * PROT_WRITE)
                                | ((b[2] == b'x') as i32 * PROT_EXEC);
                        }
                    }
                    self.check_layout(index, op)?;
                }
            }
            Op::Madvise { off, len, advice, .. } => {
                let (lo, hi) = page_span(off, len);
                let mut maybe = Vec::new();
                for p in lo..hi {
                    // Only pages whose two models agree before the call can
                    // be compared across sides after it (a lazily freed
                    // page may already differ: one side discarded it).
                    let agreed = self.model.pages[p].as_ref().is_some_and(|s| match s.kind {
                        Kind::FileA => self.model.file_a[0][p] == self.model.file_a[1][p],
                        _ => s.data[0] == s.data[1] && s.data[0].0.iter().all(|a| !a.lazy) && s.data[0].0.len() == 1,
                    });
                    for side in 0..2 {
                        let Some(new) = self.model.advised(side, p, advice) else {
                            continue;
                        };
                        let r = if side == 0 { r } else { u };
                        if r.ok() {
                            *self.model.alts(side, p) = new;
                        } else if arg_ok(off, len) {
                            // Failed part-way (a hole, or a region that
                            // refuses the advice): maybe applied.
                            self.model.alts(side, p).union(new);
                            if agreed {
                                maybe.push(p);
                            }
                        }
                    }
                }
                // Both sides must have made the same partial effect: read
                // those pages now, and where both are then exact, they
                // must be equal.
                maybe.dedup();
                for p in maybe {
                    let Some(s) = self.model.pages[p].as_ref() else { continue };
                    if !readable(s.prot) {
                        continue;
                    }
                    self.check_page(index, op, p)?;
                    let s = self.model.pages[p].as_ref().unwrap();
                    let [k, u] = [0, 1].map(|side| {
                        if s.kind == Kind::FileA {
                            self.model.file_a[side][p].clone()
                        } else {
                            s.data[side].clone()
                        }
                    });
                    let exact = |a: &Alts| a.0.len() == 1 && !a.0[0].lazy;
                    if exact(&k) && exact(&u) && k != u {
                        let what =
                            format!("partial effect of a failed call differs on page {p}: {}", self.page_info(p));
                        return Err(self.diverge(index, op, what));
                    }
                }
                if r.ok() && advice == MADV_FREE {
                    self.deviation("lazyfree-discard");
                }
            }
            Op::Mlock { off, len, flags, .. } => {
                let (lo, hi) = lock_span(off, len);
                let mode = if flags & MLOCK_ONFAULT != 0 { Lock::OnFault } else { Lock::Now };
                // On ENOMEM Linux has locked the mapped prefix of the range
                // (apply_vma_lock_flags stops at the first gap, and nothing
                // is locked when the start is unmapped; a populate that
                // failed on a PROT_NONE part comes after the whole range
                // was locked).
                let hi = if r.ok() { hi } else { self.model.mapped_prefix_end(lo, hi) };
                if r.ok() || r.err() == Some(Errno::ENOMEM) {
                    for s in self.model.pages[lo..hi].iter_mut().flatten() {
                        s.lock = mode;
                    }
                }
                if r.ok() && mode == Lock::Now && hi > lo {
                    // Linux populates every accessible page of the range.
                    for (s, e) in self.model.runs(lo, hi) {
                        let [k, u] = self.mincore_both(s, e);
                        let (k, u) = (k.unwrap_or_default(), u.unwrap_or_default());
                        for p in s..e {
                            let acc = self.model.pages[p].as_ref().unwrap().prot & PROT_MASK != 0;
                            let i = p - s;
                            if acc && (k.get(i).is_none_or(|b| b & 1 == 0) || u.get(i).is_none_or(|b| b & 1 == 0)) {
                                return Err(self.diverge(
                                    index,
                                    op,
                                    format!(
                                        "page {p} not resident after mlock: kernel [{}] usermm [{}]",
                                        bits(&k),
                                        bits(&u)
                                    ),
                                ));
                            }
                        }
                    }
                }
            }
            // (On ENOMEM, the mapped prefix as for mlock.)
            Op::Munlock { off, len, .. } if r.ok() || r.err() == Some(Errno::ENOMEM) => {
                let (lo, hi) = lock_span(off, len);
                let hi = if r.ok() { hi } else { self.model.mapped_prefix_end(lo, hi) };
                for s in self.model.pages[lo..hi].iter_mut().flatten() {
                    s.lock = Lock::No;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The end of a sequence: a full check, everything unmapped (shared
    /// file pages are written back), and the files' contents checked.
    fn finish(&mut self, index: usize) -> Result<(), Divergence> {
        let op = Op::Munmap { off: 0, len: AREA_PAGES * PAGE, salt: 0 };
        self.full_check(index, &op)?;
        let (k, u) = (self.exec(0, &op), self.exec(1, &op));
        if k != u || !k.ok() {
            return Err(self.diverge(index, &op, format!("kernel {k}, usermm {u}")));
        }
        self.update(index, &op, &k, &k)?;
        let mut buf = vec![0u8; PAGE];
        for side in 0..2 {
            use std::os::unix::fs::FileExt;
            for p in 0..AREA_PAGES {
                self.sides.files[side][0].read_exact_at(&mut buf, (p * PAGE) as u64).expect("pread file A");
                if let Err(e) = self.model.file_a[side][p].observe(&buf) {
                    let who = ["kernel", "usermm"][side];
                    return Err(self.diverge(index, &op, format!("file A page {p} after munmap on {who}: {e}")));
                }
            }
        }
        self.sides.u.space.validate();
        Ok(())
    }
}

/// The DEVIATIONS entry that allows results `k` (kernel) and `u` (usermm)
/// of `op` to differ, if any.
fn accepted(op: &Op, k: &Res, u: &Res) -> Option<&'static str> {
    match *op {
        Op::Madvise { advice: MADV_COLLAPSE, .. }
            if u.err() == Some(Errno::EINVAL) && k.err() != Some(Errno::EINVAL) =>
        {
            Some("unsupported-advice")
        }
        Op::Madvise { len, advice: MADV_POPULATE_READ | MADV_POPULATE_WRITE, .. }
            if u.err() == Some(Errno::ENOMEM) && k.err() != Some(Errno::ENOMEM) && len / PAGE > BUDGET_PAGES =>
        {
            Some("populate-over-budget")
        }
        _ => None,
    }
}

fn bits(v: &[u8]) -> String {
    v.iter().map(|b| if b & 1 != 0 { '1' } else { '0' }).collect()
}

// ---------------------------------------------------------------- generation

const PROTS: &[i32] = &[
    PROT_NONE,
    PROT_READ,
    PROT_READ | PROT_WRITE,
    PROT_READ | PROT_WRITE,
    PROT_READ | PROT_WRITE,
    PROT_WRITE,
    PROT_READ | PROT_EXEC,
    PROT_READ | PROT_WRITE | PROT_EXEC,
];

const ADVICES: &[i32] = &[
    MADV_NORMAL,
    MADV_RANDOM,
    MADV_SEQUENTIAL,
    MADV_WILLNEED,
    MADV_WILLNEED,
    MADV_DONTNEED,
    MADV_DONTNEED,
    MADV_DONTNEED,
    MADV_FREE,
    MADV_FREE,
    MADV_FREE,
    MADV_FREE,
    MADV_REMOVE,
    MADV_COLD,
    MADV_COLD,
    MADV_PAGEOUT,
    MADV_PAGEOUT,
    MADV_PAGEOUT,
    MADV_POPULATE_READ,
    MADV_POPULATE_READ,
    MADV_POPULATE_WRITE,
    MADV_POPULATE_WRITE,
    MADV_DONTFORK,
    MADV_DOFORK,
    MADV_MERGEABLE,
    MADV_UNMERGEABLE,
    MADV_HUGEPAGE,
    MADV_NOHUGEPAGE,
    MADV_DONTDUMP,
    MADV_DODUMP,
    MADV_WIPEONFORK,
    MADV_KEEPONFORK,
];

/// Advice Linux rejects (EINVAL), or that this kernel knows and usermm may
/// not.
const ODD_ADVICES: &[i32] = &[5, 6, 7, 26, 99, 104, 1000, -1, MADV_COLLAPSE];

struct Gen<'a> {
    r: &'a mut Rng,
    m: &'a Model,
}

impl Gen<'_> {
    /// A page-aligned range inside the area, usually short.
    fn range(&mut self) -> (usize, usize) {
        let len = match self.r.index(10) {
            0..=5 => 1 + self.r.index(8),
            6..=8 => 1 + self.r.index(48),
            _ => 1 + self.r.index(256),
        };
        let lo = self.r.index(AREA_PAGES);
        let hi = (lo + len).min(AREA_PAGES);
        (lo * PAGE, (hi - lo) * PAGE)
    }
    /// A mapped page-aligned range, if the area has any mapping.
    fn mapped_range(&mut self) -> (usize, usize) {
        let runs = self.m.runs(0, AREA_PAGES);
        if runs.is_empty() || self.r.ratio(1, 5) {
            return self.range();
        }
        let (s, e) = self.r.pick(&runs);
        let lo = s + self.r.index(e - s);
        let most = if self.r.ratio(1, 4) { 64 } else { 8 };
        let n = 1 + self.r.index(most);
        (lo * PAGE, (lo + n).min(e) * PAGE - lo * PAGE)
    }
    /// Sometimes bad arguments: unaligned, empty, overflowing, or a range
    /// outside the area (far into the hole, or running past its end).
    fn maybe_bad(&mut self, (off, len): (usize, usize)) -> (usize, usize) {
        if !self.r.ratio(1, 12) {
            return (off, len);
        }
        match self.r.index(7) {
            0 => (off + 1 + self.r.index(PAGE - 1), len),
            1 => (off, 0),
            2 => (off, usize::MAX - self.r.index(3 * PAGE)),
            3 => (off, len + 1 + self.r.index(PAGE - 1)),
            4 => ((AREA_PAGES + self.r.index(1 << 16)) * PAGE, len),
            5 => ((AREA_PAGES - 2) * PAGE, 8 * PAGE),
            _ => (off, len.saturating_mul(1 << 10).min(256 << 20)),
        }
    }

    fn op(&mut self) -> Op {
        let salt = self.r.next_u64();
        match self.r.index(100) {
            0..=24 => {
                // A write to a writable mapped page, if there is one.
                let runs = self.m.runs(0, AREA_PAGES);
                let page = if runs.is_empty() {
                    self.r.index(AREA_PAGES)
                } else {
                    let (s, e) = self.r.pick(&runs);
                    s + self.r.index(e - s)
                };
                let (at, len) = match self.r.index(4) {
                    0 => (0, PAGE),
                    1 => {
                        let l = 1 + self.r.index(PAGE);
                        (self.r.index(PAGE - l + 1), l)
                    }
                    _ => {
                        let l = 1 + self.r.index(64);
                        (self.r.index(PAGE - l + 1), l)
                    }
                };
                Op::Write { page, at, len, seed: self.r.next_u64() }
            }
            25 if self.r.ratio(1, 8) => Op::Fork,
            25..=32 => Op::Read { page: self.r.index(AREA_PAGES) },
            33..=44 => self.mmap(salt),
            45..=50 => {
                let (off, len) = if self.r.ratio(1, 2) { self.mapped_range() } else { self.range() };
                let (off, len) = self.maybe_bad((off, len));
                Op::Munmap { off, len, salt }
            }
            51..=58 => {
                let range = self.mapped_range();
                let (off, len) = self.maybe_bad(range);
                let mut prot =
                    if self.r.ratio(1, 30) { self.r.pick(&[0x8, 0x10, 0x0100_0000]) } else { self.r.pick(PROTS) };
                let (lo, hi) = page_span(off, len);
                if !self.m.prot_fits(lo, hi, prot) {
                    prot = PROT_READ | PROT_WRITE;
                }
                Op::Mprotect { off, len, prot, salt }
            }
            59..=80 => {
                let range = self.mapped_range();
                let (off, len) = self.maybe_bad(range);
                let advice = if self.r.ratio(1, 20) { self.r.pick(ODD_ADVICES) } else { self.r.pick(ADVICES) };
                Op::Madvise { off, len, advice, salt }
            }
            81..=87 => self.lock(salt),
            88..=92 => {
                let (off, len) = if self.r.ratio(1, 10) {
                    let range = self.range();
                    self.maybe_bad(range)
                } else {
                    self.mapped_range()
                };
                // mincore allocates a byte per page of the length on the
                // kernel side: never an overflowing one.
                let len = if len > (1 << 30) { PAGE } else { len };
                Op::Mincore { off, len }
            }
            _ => {
                let range = self.mapped_range();
                let (off, len) = self.maybe_bad(range);
                let flags = match self.r.index(12) {
                    0 => MS_ASYNC | MS_SYNC,
                    1 => 8,
                    2 => MS_INVALIDATE,
                    3 => MS_SYNC | MS_INVALIDATE,
                    4..=7 => MS_SYNC,
                    _ => MS_ASYNC,
                };
                Op::Msync { off, len, flags, salt }
            }
        }
    }

    fn mmap(&mut self, salt: u64) -> Op {
        let (off, len) = self.range();
        let mut prot = if self.r.ratio(1, 40) { PROT_READ | 0x8 } else { self.r.pick(PROTS) };
        let file = match self.r.index(10) {
            0..=4 => FileSel::Anon,
            5..=6 => FileSel::Anon,
            7..=8 => FileSel::A,
            _ => FileSel::B,
        };
        let mut flags = match file {
            FileSel::A => MAP_SHARED,
            FileSel::B => MAP_PRIVATE,
            FileSel::Anon if self.r.ratio(2, 7) => MAP_SHARED | MAP_ANONYMOUS,
            FileSel::Anon => MAP_PRIVATE | MAP_ANONYMOUS,
        };
        let foff = if file == FileSel::Anon { 0 } else { off as i64 };
        let (lo, hi) = page_span(off, len);
        let free = (lo..hi).all(|p| !self.m.mapped(p));
        match self.r.index(20) {
            // A hint, where the model says the range is free (the kernel
            // then takes the hint; elsewhere it would map outside the arena).
            0..=1 if free => {}
            2..=3 => flags |= MAP_FIXED_NOREPLACE,
            _ => flags |= MAP_FIXED,
        }
        if self.r.ratio(1, 15) {
            flags |= MAP_POPULATE;
        }
        if !self.m.pin_fits(lo, hi, prot, false) {
            prot = PROT_READ | PROT_WRITE;
        }
        if self.r.ratio(1, 20)
            && self.m.locked_pages() + (hi - lo) <= LOCK_CAP_PAGES
            && self.m.pin_fits(lo, hi, prot, true)
        {
            // MAP_FIXED replaces what was there: the old locks go, so the
            // count above is an upper bound.
            flags |= MAP_LOCKED;
        }
        let mut op = Op::Mmap { off, len, prot, flags, file, foff, salt };
        if self.r.ratio(1, 12) {
            // Bad arguments (with MAP_FIXED kept inside the area).
            if let Op::Mmap { off, len, flags, foff, .. } = &mut op {
                match self.r.index(6) {
                    0 => *len = 0,
                    // (Never for a hint: the kernel would round it up to
                    // a page that may not be free.)
                    1 if *flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 => *off += 1 + self.r.index(PAGE - 1),
                    1 => *len = 0,
                    2 => *flags &= !(MAP_SHARED | MAP_PRIVATE),
                    3 => *foff += 1 + self.r.index(PAGE - 1) as i64,
                    4 => *flags &= !MAP_ANONYMOUS,
                    _ => {
                        *len = usize::MAX - self.r.index(2 * PAGE);
                    }
                }
            }
        }
        op
    }

    fn lock(&mut self, salt: u64) -> Op {
        if self.r.ratio(1, 60) {
            // More than the budget, all mapped.
            for (s, e) in self.m.runs(0, AREA_PAGES) {
                if e - s > BUDGET_PAGES + 8 {
                    let n = BUDGET_PAGES + 8 + self.r.index(e - s - BUDGET_PAGES - 8);
                    let lo = s + self.r.index(e - s - n + 1);
                    return Op::MlockOverBudget { off: lo * PAGE, len: n * PAGE };
                }
            }
        }
        let (off, len) = self.mapped_range();
        let (off, len) = if self.r.ratio(1, 10) {
            // Unaligned start and length are fine for mlock: widened.
            (off + self.r.index(PAGE), len.saturating_sub(self.r.index(PAGE)))
        } else {
            self.maybe_bad((off, len))
        };
        let (lo, hi) = page_span(off, len);
        let newly = (lo..hi).filter(|&p| self.m.pages[p].as_ref().is_some_and(|s| s.lock == Lock::No)).count();
        let pin_newly =
            (lo..hi).filter(|&p| self.m.pages[p].as_ref().is_some_and(|s| s.lock == Lock::No && !pins(s.prot))).count();
        if self.r.ratio(1, 3)
            || self.m.locked_pages() + newly > LOCK_CAP_PAGES
            || self.m.pinned_pages() + pin_newly > PIN_CAP_PAGES
        {
            return Op::Munlock { off, len, salt };
        }
        let flags = match self.r.index(10) {
            0..=4 => 0,
            5..=8 => MLOCK_ONFAULT,
            _ => 2,
        };
        Op::Mlock { off, len, flags, salt }
    }
}

// ---------------------------------------------------------------- host swap

/// Whether the host has a swap area on (`/proc/swaps` lists one), ours
/// (`USERMM_FUZZ_HOST_SWAP=1`) or turned on outside the test.
fn host_swap_active() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|t| t.lines().skip(1).any(|l| !l.trim().is_empty()))
}

/// This process's `/proc/self/pagemap` entry of the page at `addr`.
fn pagemap_entry(addr: usize) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (addr / PAGE * 8) as u64).ok()?;
    Some(u64::from_le_bytes(b))
}

/// The `Swap:` kilobytes of this process's mapping that holds `addr`
/// (`/proc/self/smaps`; 0 if none does).
fn smaps_swap_kb(addr: usize) -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    for line in text.lines() {
        let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
        if let Some((a, b)) = range {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a <= addr && addr < b;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("Swap:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

// ---------------------------------------------------------------- driving

/// Host swap (USERMM_FUZZ_HOST_SWAP=1), shared by the tests of this binary.
static HOST_SWAP: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

struct HostSwapGuard(bool);

fn host_swap_wanted() -> bool {
    std::env::var("USERMM_FUZZ_HOST_SWAP").is_ok_and(|v| v == "1")
}

fn sh(cmd: &str) -> bool {
    std::process::Command::new("sh").arg("-c").arg(cmd).status().is_ok_and(|s| s.success())
}

impl HostSwapGuard {
    fn acquire() -> HostSwapGuard {
        if !host_swap_wanted() {
            return HostSwapGuard(false);
        }
        let mut g = HOST_SWAP.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0 {
            let path = format!("/tmp/usermm-fuzz-swap-{}", std::process::id());
            let _ = std::fs::remove_file(&path);
            assert!(
                sh(&format!(
                    "fallocate -l 256M {path} && chmod 600 {path} && mkswap {path} >/dev/null && swapon {path}"
                )),
                "USERMM_FUZZ_HOST_SWAP=1: cannot activate a host swap file (needs root, fallocate, mkswap, swapon)"
            );
            // A watcher outlives a crash of this process (SIGSEGV, abort):
            // it turns the swap file off and removes it when we are gone.
            let pid = std::process::id();
            let _ = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "while kill -0 {pid} 2>/dev/null; do sleep 1; done; swapoff {path} 2>/dev/null; rm -f {path}"
                ))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
            eprintln!("fuzz: host swap file {path} (256 MiB) active");
            g.1 = Some(path);
        }
        g.0 += 1;
        HostSwapGuard(true)
    }
}

fn host_swap_off() {
    let mut g = HOST_SWAP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = g.1.take() {
        let _ = sh(&format!("swapoff {path}"));
        let _ = std::fs::remove_file(&path);
        eprintln!("fuzz: host swap file {path} off and removed");
    }
}

impl Drop for HostSwapGuard {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        let last = {
            let mut g = HOST_SWAP.lock().unwrap_or_else(|e| e.into_inner());
            g.0 -= 1;
            g.0 == 0
        };
        // On a panic, off at once whatever the other tests do.
        if last || std::thread::panicking() {
            host_swap_off();
        }
    }
}

/// Progress for the hang watchdog: milliseconds since `START` of the last
/// call, and what is running.
static LAST_MS: AtomicU64 = AtomicU64::new(0);
static CURRENT: Mutex<String> = Mutex::new(String::new());
static WATCHDOG: Once = Once::new();

fn start() -> Instant {
    static T: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *T.get_or_init(Instant::now)
}

fn heartbeat() {
    LAST_MS.store(start().elapsed().as_millis() as u64, Ordering::Relaxed);
}

fn watchdog() {
    WATCHDOG.call_once(|| {
        heartbeat();
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(1));
            let idle = start().elapsed().as_millis() as u64 - LAST_MS.load(Ordering::Relaxed);
            if idle > HANG_SECS * 1000 {
                let cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // (Straight to descriptor 2: the test harness captures
                // `eprintln!` of the test's threads, and the abort below
                // would lose it.)
                usermm_sys::thread::write_stderr_unlocked(&format!(
                    "fuzz: HANG: no call finished for {} s; running: {cur}\n",
                    idle / 1000
                ));
                host_swap_off();
                std::process::abort();
            }
        });
    });
}

/// Runs `ops` (given, or generated from `seed` up to `calls`) on fresh
/// backends; returns the calls made and the divergence, if any.
fn run_seq(v: Variant, seed: u64, calls: usize, given: Option<&[Op]>) -> (Vec<Op>, Run, Option<Divergence>) {
    let mut run = Run::new(v);
    let mut rng = Rng::new(seed);
    let mut ops = Vec::new();
    let n = given.map_or(calls, |g| g.len());
    // USERMM_FUZZ_TRACE=1: every call is printed before it is made (for a
    // crash: a signal kills the process before any report).
    let trace = std::env::var_os("USERMM_FUZZ_TRACE").is_some();
    // USERMM_FUZZ_WATCH=N: the residency of area page N after every call.
    let watch: Option<usize> = std::env::var("USERMM_FUZZ_WATCH").ok().and_then(|s| s.parse().ok());
    for i in 0..n {
        let op = match given {
            Some(g) => g[i].clone(),
            None => Gen { r: &mut rng, m: &run.model }.op(),
        };
        ops.push(op.clone());
        if trace {
            let st = run.sides.u.space.stats();
            eprintln!(
                "fuzz: call {i}: {op}  [usermm resident {} inactive {} locked {} charged {} swapped {} lazyfree {} sigbus {}]",
                st.resident_pages,
                st.inactive_pages,
                st.locked_pages,
                st.locked_charged_pages,
                st.swapped_pages,
                st.lazyfree_pages,
                st.oom_sigbus
            );
        }
        if let Err(d) = run.step(i, &op) {
            return (ops, run, Some(d));
        }
        if let Some(w) = watch {
            if run.model.mapped(w) {
                let [k, u] = run.mincore_both(w, w + 1);
                eprintln!("fuzz:   watch page {w}: kernel {k:?} usermm {u:?} ({})", run.page_info(w));
            }
        }
        heartbeat();
    }
    let d = run.finish(n).err();
    (ops, run, d)
}

/// What kind of divergence `d` is: the call's name and the kind of check
/// (a shorter sequence must fail the same way to count).
fn signature(d: &Divergence) -> String {
    // A result differs at one call; a state (contents, residency, layout)
    // is found by whichever check comes next, whatever the call.
    if d.what.starts_with("kernel ") {
        format!("{}/result", d.op.split('(').next().unwrap_or(""))
    } else {
        d.what.split([':', ' ']).next().unwrap_or("").to_string()
    }
}

/// Whether `ops` still diverges the same way (a panic counts: it is a
/// failure too).
fn fails(v: Variant, ops: &[Op], sig: &str) -> Option<usize> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seq(v, 0, 0, Some(ops)).2));
    match r {
        Ok(Some(d)) if signature(&d) == sig => Some(d.index.min(ops.len().saturating_sub(1))),
        Ok(_) => None,
        Err(_) => Some(ops.len().saturating_sub(1)),
    }
}

/// Delta debugging over the call list: drop chunks while the rest still
/// diverges, within a time budget.
fn shrink(v: Variant, ops: Vec<Op>, sig: &str) -> Vec<Op> {
    let t = Instant::now();
    let budget = Duration::from_secs(120);
    let mut ops = ops;
    let mut n = 2usize;
    while ops.len() >= 2 && t.elapsed() < budget {
        let chunk = ops.len().div_ceil(n);
        let mut reduced = false;
        let parts = n;
        for i in 0..parts {
            if t.elapsed() >= budget {
                break;
            }
            let (a, b) = (i * chunk, ((i + 1) * chunk).min(ops.len()));
            if a >= b {
                continue;
            }
            let cand: Vec<Op> = ops[..a].iter().chain(&ops[b..]).cloned().collect();
            if let Some(at) = fails(v, &cand, sig) {
                ops = cand[..=at.min(cand.len() - 1)].to_vec();
                n = (n - 1).max(2);
                reduced = true;
                break;
            }
            heartbeat();
        }
        if !reduced {
            if n >= ops.len() {
                break;
            }
            n = (2 * n).min(ops.len());
        }
    }
    ops
}

/// The base seed of the campaign when `USERMM_FUZZ_SEED` is not given: a
/// fixed one, so that the suite replays the same sequences every time
/// (random seeds are `scripts/fuzz-campaign.sh`'s).
const DEFAULT_SEED: u64 = 0x75e7_4d6d_f022_0001;

/// A sequence that once diverged, run before the campaign on every run
/// without `USERMM_FUZZ_SEED`.
struct Regression {
    /// The `#[test]` it diverged in (it runs there).
    test: &'static str,
    /// The sequence's own seed (`USERMM_FUZZ_SEED=` of its reproduction).
    seed: u64,
    /// Its calls (one sequence: at most [`SEQ_CALLS`]).
    calls: usize,
    /// How it was found and what it found.
    what: &'static str,
}

/// Every seed that ever diverged: each failing seed joins this list.
const REGRESSIONS: &[Regression] = &[Regression {
    test: "fuzz_two_fault_threads",
    seed: 0x6c70_c01c_a4b4_4a93,
    calls: SEQ_CALLS,
    what: "USERMM_TEST_INTHREAD=1 USERMM_TEST_FRAME_POOL=1 with a host swap turned on outside the test: \
           the kernel's MADV_PAGEOUT swapped out a written page of a PROT_READ|WRITE|EXEC region that \
           usermm keeps resident, and once an mprotect made it PROT_NONE the one-way residency rule \
           failed (DEVIATIONS, host-swapped)",
}];

/// `USERMM_FUZZ_SEED`, if given (a reproduction, or a campaign's round).
fn given_seed() -> Option<u64> {
    let s = std::env::var("USERMM_FUZZ_SEED").ok()?;
    let s = s.trim();
    let v = if let Some(h) = s.strip_prefix("0x") { u64::from_str_radix(h, 16) } else { s.parse() };
    Some(v.expect("USERMM_FUZZ_SEED: a number (decimal or 0x-hex)"))
}

fn total_calls() -> usize {
    std::env::var("USERMM_FUZZ_CALLS").ok().map_or(200_000, |s| s.trim().parse().expect("USERMM_FUZZ_CALLS: a number"))
}

/// What a run's outcome depends on besides its seed and calls, as
/// environment settings for its reproduction: the mode `tests/common` reads,
/// and a host swap (ours, or one that was on outside the test).
fn mode() -> String {
    let mut m: String = ["USERMM_TEST_INTHREAD", "USERMM_TEST_FRAME_POOL"]
        .iter()
        .filter(|k| std::env::var(k).is_ok_and(|v| v == "1"))
        .map(|k| format!("{k}=1 "))
        .collect();
    if host_swap_active() {
        m += "USERMM_FUZZ_HOST_SWAP=1 ";
    }
    m
}

/// Sums of one test's sequences, for its closing line.
#[derive(Default)]
struct Tally {
    calls: usize,
    forks: usize,
    dev: [u64; DEVIATIONS.len()],
}

/// Runs sequence `i` (seed `s`, `n` calls); panics with its reproduction
/// and the shrunk call list if it diverges.
fn sequence(v: Variant, i: usize, s: u64, n: usize, tally: &mut Tally) {
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) =
        format!("test {} sequence {i}: USERMM_FUZZ_SEED={s:#x} USERMM_FUZZ_CALLS={}", v.test, n * v.calls_divisor);
    let (ops, run, d) = run_seq(v, s, n, None);
    if let Some(d) = d {
        let failing = ops[..=d.index.min(ops.len() - 1)].to_vec();
        let mut msg = format!(
            "fuzz[{}]: DIVERGENCE in sequence {i} ({}USERMM_FUZZ_SEED={s:#x} USERMM_FUZZ_CALLS={} \
             cargo test --release -p usermm --test fuzz {} reproduces it; add the seed to REGRESSIONS), \
             call {}: {}\n  {}\n  last calls (call / kernel / usermm):\n",
            v.name,
            mode(),
            n * v.calls_divisor,
            v.test,
            d.index,
            d.op,
            d.what
        );
        for (c, k, u) in run.log.iter().rev().take(8).rev() {
            msg += &format!("    {c}  ->  {k} / {u}\n");
        }
        drop(run);
        eprintln!("{msg}  shrinking {} calls ...", failing.len());
        let small = shrink(v, failing, &signature(&d));
        let (_, run2, d2) = run_seq(v, 0, 0, Some(&small));
        msg += &format!("  minimal reproduction ({} calls, fresh backends):\n", small.len());
        for (j, (c, k, u)) in run2.log.iter().enumerate() {
            msg += &format!("    {j:4}: {c}  ->  kernel {k}, usermm {u}\n");
        }
        match d2 {
            Some(d2) => msg += &format!("    diverges at call {}: {}: {}\n", d2.index, d2.op, d2.what),
            None => msg += "    (the reduced list no longer diverges: flaky)\n",
        }
        panic!("{msg}");
    }
    for (a, b) in tally.dev.iter_mut().zip(run.deviations) {
        *a += b;
    }
    tally.forks += run.forks;
    tally.calls += n;
}

fn fuzz(v: Variant) {
    let calls = total_calls().div_ceil(v.calls_divisor);
    watchdog();
    let _swap = HostSwapGuard::acquire();
    let given = given_seed();
    let seed = given.unwrap_or(DEFAULT_SEED);
    let seqs = calls.div_ceil(SEQ_CALLS).max(1);
    // The listed regressions first, unless a seed is given (a reproduction
    // runs its sequence alone).
    let regressions: Vec<&Regression> =
        if given.is_some() { Vec::new() } else { REGRESSIONS.iter().filter(|r| r.test == v.test).collect() };
    eprintln!(
        "fuzz[{}]: {} regression seed(s), then USERMM_FUZZ_SEED={seed:#x}{}, {calls} calls in {seqs} sequence(s){}",
        v.name,
        regressions.len(),
        if given.is_some() { "" } else { " (the default)" },
        if host_swap_active() {
            if _swap.0 {
                ", host swap on (USERMM_FUZZ_HOST_SWAP=1)"
            } else {
                ", host swap on (turned on outside the test: /proc/swaps)"
            }
        } else {
            ""
        }
    );
    let t = Instant::now();
    let mut tally = Tally::default();
    for (i, r) in regressions.iter().enumerate() {
        eprintln!("fuzz[{}]: regression {i}: USERMM_FUZZ_SEED={:#x}, {} calls ({})", v.name, r.seed, r.calls, r.what);
        sequence(v, i, r.seed, r.calls.min(SEQ_CALLS), &mut tally);
    }
    let mut done = 0;
    for i in 0..seqs {
        let s = seed.wrapping_add(SEQ_STRIDE.wrapping_mul(i as u64));
        let n = SEQ_CALLS.min(calls - done);
        sequence(v, i, s, n, &mut tally);
        done += n;
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "fuzz[{}]: {} calls clean in {secs:.1} s ({:.0} calls/s), {} forks checked; deviations used: {}",
        v.name,
        tally.calls,
        tally.calls as f64 / secs,
        tally.forks,
        DEVIATIONS.iter().zip(tally.dev).map(|((n, _), c)| format!("{n} x{c}")).collect::<Vec<_>>().join(", ")
    );
}

/// The main run: one fault thread, direct reclaim only (deterministic),
/// `USERMM_FUZZ_CALLS` calls.
#[test]
fn fuzz_lockstep() {
    fuzz(Variant {
        name: "lockstep",
        fault_threads: 1,
        background_reclaim: false,
        calls_divisor: 1,
        test: "fuzz_lockstep",
    });
}

/// Two fault threads and the background reclaim thread (races between the
/// handlers and reclaim).
#[test]
fn fuzz_two_fault_threads() {
    fuzz(Variant {
        name: "two-fault-threads",
        fault_threads: 2,
        background_reclaim: true,
        calls_divisor: 4,
        test: "fuzz_two_fault_threads",
    });
}

/// The case of the first listed regression, by hand: a written page of a
/// `PROT_READ|WRITE|EXEC` region (usermm never evicts it), `MADV_PAGEOUT`,
/// then `PROT_NONE`. Without a host swap the kernel keeps the written page
/// (the premise of the one-way residency rule); with one it swaps it out,
/// and the model must accept usermm's resident copy by "host-swapped".
#[test]
fn a_page_the_kernel_swapped_out_is_modelled() {
    let _swap = HostSwapGuard::acquire();
    let v = Variant { name: "host-swapped", fault_threads: 1, background_reclaim: false, calls_divisor: 1, test: "" };
    let mut run = Run::new(v);
    let rwx = PROT_READ | PROT_WRITE | PROT_EXEC;
    let ops = [
        Op::Mmap {
            off: 0,
            len: 4 * PAGE,
            prot: rwx,
            flags: MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
            file: FileSel::Anon,
            foff: 0,
            salt: 1,
        },
        Op::Write { page: 1, at: 0, len: PAGE, seed: 7 },
        Op::Madvise { off: 0, len: 4 * PAGE, advice: MADV_PAGEOUT, salt: 2 },
    ];
    for (i, op) in ops.iter().enumerate() {
        run.step(i, op).unwrap_or_else(|d| panic!("{d:?}"));
    }
    // The kernel's swap-out is written in the background, and the page
    // stays in its swap cache (mincore 1) unless the write was done when
    // reclaim looked again. Read back (clean, its slot kept) and paged out
    // once more, it leaves at once.
    let swap = host_swap_active();
    let page1 = run.base(0) + PAGE;
    let mut buf = vec![0u8; PAGE];
    for _ in 0..100 {
        if !swap || run.sides.k.mincore(page1, PAGE).unwrap()[0] & 1 == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        run.sides.k.read_bytes(page1, &mut buf);
        run.sides.k.madvise(page1, PAGE, MADV_PAGEOUT).unwrap();
    }
    let ops = [Op::Mprotect { off: 0, len: 4 * PAGE, prot: PROT_NONE, salt: 3 }, Op::Mincore { off: 0, len: 4 * PAGE }];
    for (i, op) in ops.iter().enumerate() {
        run.step(3 + i, op).unwrap_or_else(|d| panic!("{d:?}"));
    }
    let [k, u] = run.mincore_both(1, 2).map(|r| r.unwrap()[0] & 1);
    assert_eq!(u, 1, "usermm evicted a page of a PROT_READ|WRITE|EXEC region");
    let used = run.deviations[DEVIATIONS.iter().position(|d| d.0 == "host-swapped").unwrap()];
    if swap {
        assert_eq!(k, 0, "the kernel kept its written page through MADV_PAGEOUT with a host swap on");
        assert!(used > 0, "the kernel's swapped page was not exempted as host-swapped");
    } else {
        assert_eq!(k, 1, "the kernel dropped a written page on MADV_PAGEOUT without swap");
        assert_eq!(used, 0);
    }
}

/// The deviation table names what it accepts, each with a reason.
#[test]
fn deviations_are_named_with_reasons() {
    for (n, why) in DEVIATIONS {
        assert!(!n.is_empty() && why.len() > 40, "deviation {n} needs a reason");
    }
}
