//! Purgeable buffers: a safe, cache-shaped API over volatile ranges (seed 002).
//!
//! A [`Purgeable`] owns a private anonymous mapping in a [`Space`]. While it
//! is *unlocked* its pages are volatile: under memory pressure usermm's
//! reclaim may purge them (drop them without writing them to swap) instead of
//! swapping them. To read or write the bytes, [`Purgeable::lock`] (or
//! [`Purgeable::lock_range`] for a part) makes the pages non-volatile and
//! says exactly which ones were lost ([`Contents`]); the returned
//! [`PurgeableGuard`] derefs to the bytes, and dropping it makes them volatile
//! again.
//!
//! ```no_run
//! use usermm::{Config, Contents, Purgeable, Space};
//!
//! let space = Space::open(&Config { budget_bytes: 8 << 20, ..Config::default() }).unwrap();
//! let mut item = Purgeable::new(&space, 256 << 10).unwrap();
//! {
//!     // A new buffer is non-volatile and zero-filled: fill it.
//!     let (mut bytes, contents) = item.lock().unwrap();
//!     assert_eq!(contents, Contents::Intact);
//!     bytes.fill(7);
//! } // the guard drops: the buffer is volatile and may be purged from here on
//!
//! // Later: pin it again and find out what was lost.
//! let (mut bytes, contents) = item.lock().unwrap();
//! let ps = space.page_size();
//! for page in contents.purged_page_indices() {
//!     // Purged pages read as zeros: regenerate exactly those.
//!     bytes[page * ps..(page + 1) * ps].fill(7);
//! }
//! assert!(bytes.iter().all(|&b| b == 7));
//! ```
//!
//! # Invariants
//! - Outside a guard, the buffer is either entirely non-volatile (it was
//!   created with [`Purgeable::new`] and never locked since) or entirely
//!   volatile (`volatile == true`). Only one guard exists at a time (it
//!   borrows the buffer mutably), and while it lives, the pages it covers are
//!   non-volatile: nothing it derefs to can be purged, so safe code never
//!   touches a purged volatile page and never sees SIGBUS.
//! - Purged pages read back as zeros once locked (the space drops their
//!   markers in `mnovolatile`).
//!
//! # Fault model
//! Re-marking the bytes volatile when a guard drops can fail only if someone
//! else changed the mapping behind the buffer's back through the raw
//! [`Space`] calls (`mlock` on it: `EINVAL`; `munmap` of part of it:
//! `ENOMEM`). `Drop` ignores that error: it is not counted or logged
//! anywhere, and the pages simply stay non-volatile (they are then swapped
//! instead of purged, and no data is lost). Call [`PurgeableGuard::unlock`]
//! to see it.

use crate::{Errno, Mapping, Space};

/// What [`Purgeable::lock`] found: whether any page of the locked range was
/// purged while the buffer was volatile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// Every page of the range kept its data.
    Intact,
    /// Some pages were purged; they now read as zeros.
    Purged {
        /// How many pages of the range were purged.
        pages: usize,
        /// Byte offset, from the start of the locked range, of the first
        /// purged page (a multiple of the page size).
        first: usize,
        /// One bit per page of the locked range (bit `i % 64` of word
        /// `i / 64` is page `i`): set when the page was purged.
        bitmap: Vec<u64>,
    },
}

impl Contents {
    /// True when nothing was purged.
    pub fn is_intact(&self) -> bool {
        matches!(self, Contents::Intact)
    }

    /// How many pages were purged.
    pub fn purged_pages(&self) -> usize {
        match self {
            Contents::Intact => 0,
            Contents::Purged { pages, .. } => *pages,
        }
    }

    /// True when page `i` of the locked range was purged.
    pub fn is_page_purged(&self, i: usize) -> bool {
        match self {
            Contents::Intact => false,
            Contents::Purged { bitmap, .. } => bitmap.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1),
        }
    }

    /// The indices (in pages, from the start of the locked range) of the
    /// purged pages, in increasing order.
    pub fn purged_page_indices(&self) -> impl Iterator<Item = usize> + '_ {
        let bitmap: &[u64] = match self {
            Contents::Intact => &[],
            Contents::Purged { bitmap, .. } => bitmap,
        };
        bitmap
            .iter()
            .enumerate()
            .flat_map(|(w, &word)| (0..64).filter(move |b| word >> b & 1 == 1).map(move |b| w * 64 + b))
    }
}

/// A buffer whose contents the space may throw away under memory pressure
/// while it is unlocked — a cache entry that can be regenerated.
///
/// The bytes are reachable only through a [`PurgeableGuard`], which pins
/// them (makes them non-volatile) for as long as it lives. Dropping the
/// `Purgeable` unmaps its memory.
pub struct Purgeable<'a> {
    space: &'a Space,
    map: Mapping<'a>,
    /// Invariant: when true and no guard is alive, every page of `map` is
    /// volatile; when false, none is (see the module's invariants).
    volatile: bool,
}

impl<'a> Purgeable<'a> {
    /// Maps `len` bytes (rounded up to whole pages for the mapping) of
    /// zero-filled private anonymous memory. The buffer starts non-volatile
    /// (nothing can be purged until the first guard drops); errors are
    /// `mmap`'s (`EINVAL` for a zero length, `ENOMEM` when the space has no
    /// room).
    pub fn new(space: &'a Space, len: usize) -> Result<Purgeable<'a>, Errno> {
        let map = space.map_anon(len)?;
        Ok(Purgeable { space, map, volatile: false })
    }

    /// As [`Purgeable::new`], but the buffer is volatile from the start: the
    /// first [`lock`](Purgeable::lock) reports `Intact` (untouched pages hold
    /// zeros and are never purged) unless pages were written, unlocked and
    /// purged in between.
    pub fn new_volatile(space: &'a Space, len: usize) -> Result<Purgeable<'a>, Errno> {
        let mut p = Purgeable::new(space, len)?;
        space.mvolatile_owned(p.map.addr(), p.span_bytes(0, p.map.len()))?;
        p.volatile = true;
        Ok(p)
    }

    /// The buffer's length in bytes, as passed to `new`.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True for a zero-length buffer (never: `new` refuses one).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The buffer's address in the space (for `page_state`, `mincore`, …).
    pub fn addr(&self) -> usize {
        self.map.addr()
    }

    /// True when the buffer is volatile while unlocked (after its first
    /// guard dropped, or from `new_volatile`).
    pub fn is_volatile(&self) -> bool {
        self.volatile
    }

    /// Pins the whole buffer: makes it non-volatile and reports which pages
    /// were purged since it was last unlocked. Purged pages read as zeros.
    pub fn lock(&mut self) -> Result<(PurgeableGuard<'_, 'a>, Contents), Errno> {
        let len = self.map.len();
        self.lock_range(0, len)
    }

    /// Pins the bytes `offset..offset + len` only, so that a cache holding
    /// many items in one buffer pays for (and protects) only the item it
    /// reads; the rest stays volatile. `offset` must be a multiple of the
    /// page size; the pages covering the range are pinned, and the guard
    /// derefs to exactly `len` bytes. [`Contents`] numbers pages from
    /// `offset`. `EINVAL`: `offset` not page-aligned, `len` zero, or the
    /// range past the end of the buffer.
    pub fn lock_range(&mut self, offset: usize, len: usize) -> Result<(PurgeableGuard<'_, 'a>, Contents), Errno> {
        let ps = self.space.page_size();
        if !offset.is_multiple_of(ps) || len == 0 || offset.checked_add(len).is_none_or(|end| end > self.map.len()) {
            return Err(Errno::EINVAL);
        }
        let base = self.map.addr() + offset;
        let (purged, report) = self.space.mnovolatile(base, self.span_bytes(offset, len))?;
        let contents = if purged {
            Contents::Purged { pages: report.purged_pages, first: report.first_purged - base, bitmap: report.bitmap }
        } else {
            Contents::Intact
        };
        Ok((PurgeableGuard { buf: self, offset, len }, contents))
    }

    /// The page-rounded length of `offset..offset + len` (clipped to the
    /// mapping, which `mmap` rounded up to whole pages).
    fn span_bytes(&self, offset: usize, len: usize) -> usize {
        let ps = self.space.page_size();
        (offset + len).div_ceil(ps) * ps - offset
    }
}

/// Pinned access to (part of) a [`Purgeable`]: derefs to the bytes, which
/// cannot be purged while it lives. Dropping it makes the buffer volatile
/// again (ignoring errors; see [`PurgeableGuard::unlock`]).
pub struct PurgeableGuard<'g, 'a> {
    buf: &'g mut Purgeable<'a>,
    offset: usize,
    len: usize,
}

impl PurgeableGuard<'_, '_> {
    /// The guard's offset in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Unpins now and reports whether re-marking the range volatile worked.
    /// On error the pages stay non-volatile (they are swapped rather than
    /// purged; no data is lost).
    pub fn unlock(mut self) -> Result<(), Errno> {
        let r = self.unpin();
        // `unpin` has run: make `Drop` a no-op.
        self.len = 0;
        r
    }

    /// Makes the pinned range volatile again; the first unpin of a buffer
    /// created non-volatile makes the whole buffer volatile, so that the
    /// invariant "entirely volatile outside a guard" holds from then on.
    fn unpin(&mut self) -> Result<(), Errno> {
        if self.len == 0 {
            return Ok(());
        }
        let b = &mut *self.buf;
        let (offset, len) = if b.volatile { (self.offset, self.len) } else { (0, b.map.len()) };
        b.space.mvolatile_owned(b.map.addr() + offset, b.span_bytes(offset, len))?;
        b.volatile = true;
        Ok(())
    }
}

impl std::ops::Deref for PurgeableGuard<'_, '_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.map[self.offset..self.offset + self.len]
    }
}

impl std::ops::DerefMut for PurgeableGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf.map[self.offset..self.offset + self.len]
    }
}

impl Drop for PurgeableGuard<'_, '_> {
    fn drop(&mut self) {
        // Errors are ignored, not counted or logged: see the module's fault
        // model.
        let _ = self.unpin();
    }
}
