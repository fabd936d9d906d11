//! The trust boundary with callers: the only module of this crate allowed to
//! contain `unsafe` code. It holds the C ABI, the slice view of a
//! `Mapping` and the heap's allocator (`heap.rs`); all must trust memory
//! the caller vouches for.

#![allow(unsafe_code)]

pub mod capi;
pub(crate) mod heap;

use crate::Mapping;

impl std::ops::Deref for Mapping<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is live until `self` drops (it is unmapped only
        // in `Drop`), `addr..addr+len` is a readable region of the space, and
        // the space serves any fault on it (a file mapping's pages lie within
        // its file: `MapOptions` checks it, and its `unsafe` callers vouch
        // that the file is not truncated meanwhile).
        unsafe { usermm_sys::ffi::mapped_slice(self.addr(), self.len()) }
    }
}

impl std::ops::DerefMut for Mapping<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; `&mut self` makes this the only slice.
        unsafe { usermm_sys::ffi::mapped_slice(self.addr(), self.len()) }
    }
}
