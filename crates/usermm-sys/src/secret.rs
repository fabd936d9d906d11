//! A value kept in memory of its own that is locked (never swapped), left
//! out of core dumps, reads as zeros in a forked child (unless kept for it:
//! [`Locked::keep_on_fork`]), and is zeroed when dropped: for key material
//! (a page store's sealing key).

use std::ptr::NonNull;

use crate::{last_errno, Errno};

/// `T` in a locked mapping of its own (see the module doc).
pub struct Locked<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: `Locked<T>` owns its `T` as a `Box<T>` would; the mapping is
// private to it.
unsafe impl<T: Send> Send for Locked<T> {}
// SAFETY: as above: `&Locked<T>` only hands out `&T`.
unsafe impl<T: Sync> Sync for Locked<T> {}

impl<T> Locked<T> {
    /// Moves `v` into a fresh locked mapping. Errors: those of `mmap` and
    /// `mlock` (`EPERM`/`ENOMEM` past `RLIMIT_MEMLOCK`); nothing is left
    /// mapped then.
    pub fn new(v: T) -> Result<Locked<T>, Errno> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let len = std::mem::size_of::<T>().max(1).div_ceil(page) * page;
        assert!(std::mem::align_of::<T>() <= page, "a page-aligned mapping");
        let addr = crate::mem::map_rw(len)?;
        // SAFETY: `[addr, addr+len)` is the fresh mapping just made; no
        // reference points into it. Locking, `MADV_DONTDUMP` and
        // `MADV_WIPEONFORK` change no byte of it.
        let r = unsafe {
            if libc::mlock(addr as *const libc::c_void, len) != 0
                || libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTDUMP) != 0
                || libc::madvise(addr as *mut libc::c_void, len, libc::MADV_WIPEONFORK) != 0
            {
                Err(last_errno())
            } else {
                Ok(())
            }
        };
        if let Err(e) = r {
            // SAFETY: nothing uses the mapping.
            let _ = unsafe { crate::mem::unmap(addr, len) };
            return Err(e);
        }
        let ptr = addr as *mut T;
        // SAFETY: `ptr` is page-aligned (so aligned for `T`), writable and
        // `len >= size_of::<T>()` bytes long; nothing was there.
        unsafe { ptr.write(v) };
        Ok(Locked { ptr: NonNull::new(ptr).expect("mmap never returns 0 here"), len })
    }
}

impl<T> Locked<T> {
    /// A forked child gets a copy of the value (`MADV_KEEPONFORK`): the
    /// child is a copy of this process and may need it (a sealing key, to
    /// read the pages this process sealed). The copy is locked only once
    /// the child calls [`Locked::lock_again`] (locks are not inherited).
    pub fn keep_on_fork(&self) -> Result<(), Errno> {
        // SAFETY: our own mapping; the advice changes no byte of it.
        crate::check(unsafe { libc::madvise(self.ptr.as_ptr() as *mut libc::c_void, self.len, libc::MADV_KEEPONFORK) })
            .map(drop)
    }

    /// In a forked child: locks its copy of the value again.
    pub fn lock_again(&self) -> Result<(), Errno> {
        crate::mem::mlock2(self.ptr.as_ptr() as usize, self.len, 0)
    }
}

impl<T> std::ops::Deref for Locked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `ptr` holds a live `T` until `drop`, shared only as `&T`.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for Locked<T> {
    fn drop(&mut self) {
        let p = self.ptr.as_ptr();
        // SAFETY: the `T` is live and dropped once, here; then its bytes
        // (nothing refers to them any more) are overwritten with zeros
        // byte by byte through volatile writes, so the compiler keeps
        // them, and the mapping released.
        unsafe {
            std::ptr::drop_in_place(p);
            let b = p as *mut u8;
            for i in 0..self.len {
                b.add(i).write_volatile(0);
            }
            let _ = crate::mem::unmap(p as usize, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_lives_locked_and_is_zeroed_when_dropped() {
        let k = Locked::new([7u8; 32]).expect("one locked page (RLIMIT_MEMLOCK)");
        assert_eq!(*k, [7u8; 32]);
        let addr = &*k as *const [u8; 32] as usize;
        let status = std::fs::read_to_string("/proc/self/smaps").unwrap();
        // The mapping's own smaps entry says it is locked and not dumped.
        let entry: String = status
            .split("\n")
            .skip_while(|l| !l.starts_with(&format!("{addr:x}-")))
            .take_while(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(entry.contains("Locked:") && !entry.contains("Locked:              0 kB"), "{entry}");
        assert!(entry.contains(" dd"), "MADV_DONTDUMP: {entry}");
        assert!(entry.contains(" wf"), "MADV_WIPEONFORK: {entry}");
        drop(k);
    }
}
