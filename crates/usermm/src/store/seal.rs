//! Sealed pages (a page store's `seal=1`): each page goes out encrypted and
//! authenticated with ChaCha20-Poly1305 under a key the space draws at open
//! and keeps only in its own process and the processes forked from it (a
//! child reads the pages its parent sealed, and seals its own under a key
//! of its own), in a locked page (`usermm_sys::secret::Locked`: never
//! swapped, not in core dumps). The store sees no plaintext, and cannot hand back a
//! page it made up, a page of another slot, or one of another space: the
//! associated data is the space's id and the slot, and the tag is checked
//! before a byte is installed (a failed check is a read error: the faulting
//! thread's SIGBUS, never the bytes).
//!
//! The 32-byte header of a sealed page (in place of the checksum header,
//! `HEADER`): a magic word (4 bytes), the nonce (12: the space's count of
//! pages sealed, never the same twice under one key), the tag (16). The
//! process keeps each slot's last nonce (8 bytes a slot, 0.2% of the swap's
//! size, untouched slots costing no memory), and a value opens only with
//! it: an older copy of the same slot, which the store could serve again in
//! place of the newer one, is refused too.
//!
//! Not covered: the key's passage through the stack at open, and the
//! cipher's working state during a call, on the stack of the thread that
//! seals or opens.

use std::sync::atomic::{AtomicU64, Ordering};

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};
use usermm_core::Errno;
use usermm_sys::secret::Locked;

use super::HEADER;

const MAGIC: [u8; 4] = *b"UMS1";

/// A space's sealing key and nonce count.
pub(crate) struct Sealer {
    cipher: Locked<ChaCha20Poly1305>,
    sealed: AtomicU64,
    /// Each slot's last nonce (0: never sealed). A zeroed `Vec` (calloc:
    /// the pages of untouched slots are never made), behind a lock a seal
    /// or an open holds for a load or a store.
    last: std::sync::Mutex<Vec<u64>>,
}

impl Sealer {
    /// A sealer of `slots` slots with a fresh random key. Errors: `EIO`
    /// without a source of randomness; `EPERM`/`ENOMEM` when the key's page
    /// cannot be locked (`RLIMIT_MEMLOCK`).
    pub(crate) fn new(slots: u64) -> Result<Sealer, Errno> {
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
            .map_err(|_| Errno::EIO)?;
        let cipher = Locked::new(ChaCha20Poly1305::new(&key.into()));
        // The stack's copy cleared (`black_box`: the stores are kept).
        key.fill(0);
        std::hint::black_box(&key);
        let cipher = cipher?;
        cipher.keep_on_fork()?;
        let last = std::sync::Mutex::new(vec![0u64; usize::try_from(slots).map_err(|_| Errno::ENOMEM)?]);
        Ok(Sealer { cipher, sealed: AtomicU64::new(0), last })
    }

    /// In a forked child: the key, a copy of the parent's, locked again
    /// (locks are not inherited), for the pages its parent sealed.
    pub(crate) fn lock_in_child(&self) -> Result<(), Errno> {
        self.cipher.lock_again()
    }

    /// Seals `page` as `slot` of space `space` into `out` (its length):
    /// returns the header that goes in front. From now on only this value
    /// opens as the slot.
    pub(crate) fn seal(&self, space: u64, slot: u64, page: &[u8], out: &mut [u8]) -> [u8; HEADER] {
        let n = self.sealed.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(l) = self.last.lock().unwrap_or_else(|e| e.into_inner()).get_mut(slot as usize) {
            *l = n;
        }
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(&MAGIC);
        h[4..12].copy_from_slice(&n.to_le_bytes());
        out.copy_from_slice(page);
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&h[4..16]), &aad(space, slot), out)
            .expect("a page is far below ChaCha20-Poly1305's message limit");
        h[16..].copy_from_slice(&tag);
        h
    }

    /// Opens a stored value (header and sealed page) as `slot` of `space`
    /// into `out`: false, with `out` zeroed, unless it is the value this
    /// sealer last sealed as that slot of that space, unchanged.
    pub(crate) fn open(&self, space: u64, slot: u64, value: &[u8], out: &mut [u8]) -> bool {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).get(slot as usize).copied().unwrap_or(0);
        if value.len() != HEADER + out.len() || value[..4] != MAGIC || last == 0 || value[4..12] != last.to_le_bytes() {
            out.fill(0);
            return false;
        }
        out.copy_from_slice(&value[HEADER..]);
        let ok = self
            .cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(&value[4..16]),
                &aad(space, slot),
                out,
                Tag::from_slice(&value[16..HEADER]),
            )
            .is_ok();
        if !ok {
            out.fill(0);
        }
        ok
    }
}

/// The associated data of a page: its space and slot.
fn aad(space: u64, slot: u64) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&space.to_le_bytes());
    a[8..].copy_from_slice(&slot.to_le_bytes());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u8) -> Vec<u8> {
        (0..4096u32).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn a_sealed_page_opens_only_as_itself() {
        let s = Sealer::new(64).expect("a sealer (one locked page)");
        let p = page(3);
        let mut sealed = vec![0u8; 4096];
        let h = s.seal(11, 5, &p, &mut sealed);
        assert_ne!(sealed, p, "no plaintext");
        assert!(
            sealed.windows(16).all(|w| !p.windows(16).take(64).any(|q| q == w)),
            "no 16 bytes of plaintext in place"
        );
        let mut v = h.to_vec();
        v.extend_from_slice(&sealed);
        let mut out = vec![0u8; 4096];
        assert!(s.open(11, 5, &v, &mut out));
        assert_eq!(out, p);
        // Another slot, another space, another key, a flipped bit anywhere,
        // a short value: refused, and nothing of the page handed out.
        assert!(!s.open(11, 6, &v, &mut out));
        assert!(out.iter().all(|&b| b == 0));
        assert!(!s.open(12, 5, &v, &mut out));
        assert!(!Sealer::new(64).unwrap().open(11, 5, &v, &mut out));
        for at in [0, 5, 20, HEADER, HEADER + 4095] {
            let mut bad = v.clone();
            bad[at] ^= 1;
            assert!(!s.open(11, 5, &bad, &mut out), "bit flipped at {at}");
        }
        assert!(!s.open(11, 5, &v[..v.len() - 1], &mut out[..4095]));
        // Sealed again: the older copy no longer opens, the newer does; a
        // slot never sealed, or past the sealer's, opens nothing.
        let mut newer = vec![0u8; 4096];
        let h2 = s.seal(11, 5, &page(4), &mut newer);
        assert!(!s.open(11, 5, &v, &mut out), "an older copy of the slot was taken");
        let mut v2 = h2.to_vec();
        v2.extend_from_slice(&newer);
        assert!(s.open(11, 5, &v2, &mut out));
        assert_eq!(out, page(4));
        assert!(!s.open(11, 7, &v2, &mut out) && !s.open(11, 64, &v2, &mut out));
    }

    #[test]
    fn the_same_page_seals_differently_each_time() {
        let s = Sealer::new(64).unwrap();
        let p = page(9);
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        let ha = s.seal(1, 2, &p, &mut a);
        let hb = s.seal(1, 2, &p, &mut b);
        assert_ne!(ha[4..16], hb[4..16], "a nonce is never reused");
        assert_ne!(a, b);
    }
}
