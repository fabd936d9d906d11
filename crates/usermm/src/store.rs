//! Where swapped pages go: the page store interface.
//!
//! The core decides which pages go out and come back and at which swap
//! offset (a slot of `page_size` bytes); a [`PageStore`] only moves bytes:
//! it writes a run of pages at an offset, reads a run back, and may give
//! back the space of freed slots, a granule at a time. Two stores:
//! - [`LocalFile`], the space's swap file (`swap_dir`; the default, and
//!   the only behaviour when `swap_url` is not set);
//! - `RedisStore` (`store/redis.rs`), a Redis-protocol server (Redis,
//!   Valkey) named by `swap_url`.
//!
//! Every store reports failure as an error (the executor turns a failed
//! read into the transient SIGBUS of a swap read error, and a failed write
//! into pages kept resident): a store never returns bytes it cannot vouch
//! for.

mod redis;
mod seal;
pub(crate) use seal::Sealer;

pub(crate) use self::redis::{fork_guard, RedisStore};

use std::sync::Arc;
use usermm_core::Errno;
use usermm_sys::file::SwapFile;

use crate::platform::fork::ChildTie;

use usermm_sys::ring::RingPool;

/// A place for swapped pages. Offsets are byte offsets of whole pages
/// (`slot × page_size`), as the core assigns them.
pub(crate) trait PageStore: Send + Sync {
    /// Reads `buf.len()` bytes (whole pages) stored at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno>;
    /// Reads the pages stored at `offs` into `buf` (one page each, in
    /// order); says for each whether it was read. By default one `read` a
    /// page; a store that can serves them at once.
    fn read_pages(&self, offs: &[u64], buf: &mut [u8]) -> Vec<bool> {
        let ps = buf.len() / offs.len().max(1);
        offs.iter().zip(buf.chunks_mut(ps.max(1))).map(|(&off, b)| self.read(off, b).is_ok()).collect()
    }
    /// Writes `pages` (each one page) at `off`, `off + page_size`, ….
    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno>;
    /// Whether reads and writes bypass the host's page cache.
    fn direct_io(&self) -> bool;
    /// Whether a read's thread polls for the store's reply (and so keeps
    /// its CPU busy) rather than sleeping until it comes (`store::redis`'s
    /// `Link`).
    fn read_polls(&self) -> bool {
        false
    }
    /// Pages the store gives back at a time (its `release` takes whole
    /// runs of this many); 0: it gives nothing back (slots are overwritten
    /// when reused).
    fn release_granule(&self) -> u32 {
        0
    }
    /// In a forked child: a store of the child's own for every write from
    /// now on, still reading the parent's byte runs `runs` (`(offset,
    /// length)`, the slots in use at the fork) until they are written here
    /// (the parent keeps them as they are meanwhile: the core's swap
    /// holds). `ENOTSUP`: the store cannot be shared.
    fn fork_child(&self, _runs: &[(u64, u64)]) -> Result<(), Errno> {
        Err(Errno::EOPNOTSUPP)
    }
    /// Whether a forked child can have a copy ([`PageStore::fork_child`]).
    fn forks(&self) -> bool {
        false
    }
    /// In the parent after a fork: `tie` says when the child (and every
    /// process it forks in turn) is gone, and with it every reader of the
    /// slots it shared; a store whose bytes outlive the process (a
    /// server's keys) keeps them until then.
    fn child_tie(&self, _tie: &Arc<ChildTie>) {}
    /// Pages the store writes as a group that can fail while the others
    /// go through (a cluster's hash slots, on different nodes: one whose
    /// master lost its replicas cannot acknowledge a write); 0: a write
    /// fails or goes through as a whole. The executor writes each group
    /// apart, so that one failing group keeps only its own pages resident.
    fn write_granule(&self) -> u32 {
        0
    }
    /// Gives back the space of the runs `(off, len)` (bytes; whole
    /// granules), whose slots the core no longer uses.
    fn release(&self, _runs: &[(u64, u64)]) -> Result<(), Errno> {
        Ok(())
    }
    /// Whether [`PageStore::keep_alive`] is due (cheap: asked on every
    /// turn of the space's background thread).
    fn keep_alive_due(&self) -> bool {
        false
    }
    /// Tells the store the space is alive (a remote store's lease, which
    /// lets other spaces delete the keys of a process killed outright).
    fn keep_alive(&self) {}
    /// How long a store whose writes fail may take to come back by itself
    /// (`None`: it does not, as far as the store knows): a fault short of
    /// frames behind it waits that long for the back-off's next try before
    /// it is out of memory. A Redis Cluster with replicas promotes one when
    /// a master dies (its `failover_ms`); a single server or a swap file
    /// that refuses writes stays down until someone acts.
    fn outage_wait(&self) -> Option<std::time::Duration> {
        None
    }
    /// The first `len` bytes, as a file (a test hook; only the swap file
    /// has it).
    #[cfg(feature = "test-hooks")]
    fn contents(&self, _len: u64) -> Result<Vec<u8>, Errno> {
        Err(Errno::ENOSYS)
    }
}

/// The local swap file; reads go on a ring of `rings` (the space's, shared
/// with its file reads), polled for (`usermm_sys::ring`).
pub(crate) struct LocalFile {
    pub(crate) file: SwapFile,
    pub(crate) rings: Arc<RingPool>,
}

impl PageStore for LocalFile {
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.file.read_at_polled(buf, off, &self.rings)
    }
    fn read_pages(&self, offs: &[u64], buf: &mut [u8]) -> Vec<bool> {
        self.file.read_pages(offs, buf, &self.rings)
    }
    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno> {
        self.file.write_at(pages, off)
    }
    fn fork_child(&self, runs: &[(u64, u64)]) -> Result<(), Errno> {
        self.file.share_for_child(runs)
    }
    fn forks(&self) -> bool {
        true
    }
    fn direct_io(&self) -> bool {
        self.file.direct
    }
    #[cfg(feature = "test-hooks")]
    fn contents(&self, len: u64) -> Result<Vec<u8>, Errno> {
        self.file.read_all(len)
    }
}

/// The header a remote store keeps in front of each page: which space and
/// slot it belongs to and a checksum of its bytes, all checked on read (a
/// stale, foreign or corrupted value is an error, never installed).
pub(crate) const HEADER: usize = 32;
const MAGIC: u64 = u64::from_le_bytes(*b"UMMPAGE2");

/// A 64-bit checksum of `bytes`, seeded: four lanes of multiply-rotate over
/// 8-byte words (independent chains: 0.22 µs a 4 KiB page here, against
/// 1.56 µs for one FNV-1a chain), folded with a final mix. For detecting
/// corruption and misplaced values, not an adversary.
pub(crate) fn checksum(seed: u64, bytes: &[u8]) -> u64 {
    const P: [u64; 4] = [0x9e37_79b9_7f4a_7c15, 0xc2b2_ae3d_27d4_eb4f, 0x1656_67b1_9e37_79f9, 0x85eb_ca77_c2b2_ae63];
    let mut h = [seed ^ P[0], seed ^ P[1], seed.rotate_left(17) ^ P[2], seed.rotate_left(43) ^ P[3]];
    let word = |c: &[u8]| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    };
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (i, lane) in h.iter_mut().enumerate() {
            let w = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(P[i]).rotate_left(29);
        }
    }
    for (i, c) in blocks.remainder().chunks(8).enumerate() {
        h[i] = (h[i] ^ word(c)).wrapping_mul(P[i]).rotate_left(29);
    }
    let mut x = (bytes.len() as u64) ^ h[0] ^ h[1].rotate_left(16) ^ h[2].rotate_left(32) ^ h[3].rotate_left(48);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The header of `page` as `slot` of space `space`.
pub(crate) fn header(space: u64, slot: u64, page: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&space.to_le_bytes());
    h[16..24].copy_from_slice(&slot.to_le_bytes());
    h[24..].copy_from_slice(&checksum(space ^ slot.rotate_left(32), page).to_le_bytes());
    h
}

/// Writes `page` as `slot` of space `space` to `out`: its header and its
/// bytes, sealed by `sealer` if the store seals (`seal.rs`).
pub(crate) fn put_page(sealer: Option<&Sealer>, space: u64, slot: u64, page: &[u8], out: &mut impl std::io::Write) {
    // (The stores write into Vecs, which cannot fail.)
    match sealer {
        None => {
            let _ = out.write_all(&header(space, slot, page));
            let _ = out.write_all(page);
        }
        Some(s) => {
            let mut sealed = vec![0u8; page.len()];
            let h = s.seal(space, slot, page, &mut sealed);
            let _ = out.write_all(&h);
            let _ = out.write_all(&sealed);
        }
    }
}

/// The page of a stored value as [`open_sealed`] or, if the store seals,
/// [`Sealer::open`] opens it.
pub(crate) fn open_page(sealer: Option<&Sealer>, space: u64, slot: u64, value: &[u8], out: &mut [u8]) -> bool {
    match sealer {
        None => open_sealed(space, slot, value, out),
        Some(s) => s.open(space, slot, value, out),
    }
}

/// `page` with its header for `slot` of space `space`.
#[cfg(test)]
pub(crate) fn seal(space: u64, slot: u64, page: &[u8]) -> Vec<u8> {
    let mut v = header(space, slot, page).to_vec();
    v.extend_from_slice(page);
    v
}

/// The page of a stored value, if its header says it is `slot` of `space`
/// and its checksum matches; `out` gets the page.
pub(crate) fn open_sealed(space: u64, slot: u64, value: &[u8], out: &mut [u8]) -> bool {
    if value.len() != HEADER + out.len() {
        return false;
    }
    let word = |i: usize| u64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let page = &value[HEADER..];
    if word(0) != MAGIC
        || word(1) != space
        || word(2) != slot
        || word(3) != checksum(space ^ slot.rotate_left(32), page)
    {
        return false;
    }
    out.copy_from_slice(page);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_page_opens_only_as_itself() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let v = seal(11, 5, &page);
        let mut out = vec![0u8; 4096];
        assert!(open_sealed(11, 5, &v, &mut out));
        assert_eq!(out, page);
        // Another slot, another space, a flipped byte, a short value.
        assert!(!open_sealed(11, 6, &v, &mut out));
        assert!(!open_sealed(12, 5, &v, &mut out));
        let mut bad = v.clone();
        bad[HEADER + 100] ^= 1;
        assert!(!open_sealed(11, 5, &bad, &mut out));
        assert!(!open_sealed(11, 5, &v[..v.len() - 1], &mut out));
    }

    #[test]
    fn every_single_bit_flip_and_word_swap_changes_the_checksum() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
        let c = checksum(3, &page);
        let mut p = page.clone();
        for bit in 0..page.len() * 8 {
            p[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(checksum(3, &p), c, "bit {bit}");
            p[bit / 8] ^= 1 << (bit % 8);
        }
        // Two words trading places, within a lane and across lanes.
        for (a, b) in [(0, 32), (0, 8), (8, 4088)] {
            let mut p = page.clone();
            for i in 0..8 {
                p.swap(a + i, b + i);
            }
            assert_ne!(checksum(3, &p), c, "words at {a} and {b}");
        }
        assert_ne!(checksum(4, &page), c, "the seed counts");
        // Lengths that are not a multiple of the block.
        assert_ne!(checksum(3, &page[..4095]), checksum(3, &page[..4094]));
    }
}
