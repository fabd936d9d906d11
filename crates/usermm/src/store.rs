//! Where swapped pages go: the page store interface.
//!
//! The core decides which pages go out and come back and at which swap
//! offset (a slot of `page_size` bytes); a [`PageStore`] only moves bytes:
//! it writes a run of pages at an offset, reads a run back, and may release
//! slots. Two stores:
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

pub(crate) use self::redis::RedisStore;

use usermm_core::Errno;
use usermm_sys::file::SwapFile;

/// A place for swapped pages. Offsets are byte offsets of whole pages
/// (`slot × page_size`), as the core assigns them.
pub(crate) trait PageStore: Send + Sync {
    /// Reads `buf.len()` bytes (whole pages) stored at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno>;
    /// Writes `pages` (each one page) at `off`, `off + page_size`, ….
    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno>;
    /// Whether reads and writes bypass the host's page cache.
    fn direct_io(&self) -> bool;
    /// The first `len` bytes, as a file (a test hook; only the swap file
    /// has it).
    #[cfg(feature = "test-hooks")]
    fn contents(&self, _len: u64) -> Result<Vec<u8>, Errno> {
        Err(Errno::ENOSYS)
    }
}

/// The local swap file.
pub(crate) struct LocalFile(pub(crate) SwapFile);

impl PageStore for LocalFile {
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.0.read_at(buf, off)
    }
    fn write(&self, off: u64, pages: &[&[u8]]) -> Result<(), Errno> {
        self.0.write_at(pages, off)
    }
    fn direct_io(&self) -> bool {
        self.0.direct
    }
    #[cfg(feature = "test-hooks")]
    fn contents(&self, len: u64) -> Result<Vec<u8>, Errno> {
        self.0.read_all(len)
    }
}

/// The header a remote store keeps in front of each page: which space and
/// slot it belongs to and a checksum of its bytes, all checked on read (a
/// stale, foreign or corrupted value is an error, never installed).
pub(crate) const HEADER: usize = 32;
const MAGIC: u64 = u64::from_le_bytes(*b"UMMPAGE1");

/// FNV-1a (64 bits) of `bytes`, seeded.
pub(crate) fn checksum(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for c in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        h ^= u64::from_le_bytes(w);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `page` with its header for `slot` of space `space`.
pub(crate) fn seal(space: u64, slot: u64, page: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + page.len());
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&space.to_le_bytes());
    v.extend_from_slice(&slot.to_le_bytes());
    v.extend_from_slice(&checksum(space ^ slot.rotate_left(32), page).to_le_bytes());
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
}
