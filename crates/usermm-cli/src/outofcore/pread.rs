//! The `pread-cache` system of `outofcore`: a hand-written user-space page
//! cache of the budget's size (LRU over 4 KiB slots, one `pread` per miss,
//! the host's copy of each page dropped after it is read).

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::unix::fs::FileExt;

use usermm_sys::host::{fadvise, POSIX_FADV_DONTNEED, POSIX_FADV_RANDOM, POSIX_FADV_SEQUENTIAL};

use super::workload::drive;
use super::{Measured, Setup};
use crate::common::PAGE;

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

/// One workload on the pread cache.
pub(super) fn run_pread(s: &Setup, workload: &str, offs: &[usize]) -> Result<Measured, String> {
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
    Ok(Measured { out, peak, misses, writebacks: 0, pct: None, pages_read: None, oom_kills: 0 })
}
