//! Memory mappings: reserve, protect, advise, release, and raw page copies.

use crate::{check, last_errno, Errno};

/// Reserves `len` bytes of address space: `PROT_NONE`, private, anonymous,
/// no swap reservation. Returns the start address.
pub fn reserve(len: usize, align: usize) -> Result<usize, Errno> {
    // Over-reserve to align, then trim the edges.
    let total = len.checked_add(align).ok_or(Errno::ENOMEM)?;
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    let raw = p as usize;
    let start = (raw + align - 1) & !(align - 1);
    if start > raw {
        // SAFETY: [raw, start) is part of the mapping just made and unused.
        unsafe { libc::munmap(raw as *mut libc::c_void, start - raw) };
    }
    let end = start + len;
    if raw + total > end {
        // SAFETY: [end, raw+total) is part of the mapping just made and unused.
        unsafe { libc::munmap(end as *mut libc::c_void, raw + total - end) };
    }
    Ok(start)
}

/// Maps fresh private anonymous read-write memory (for staging and buffers).
pub fn map_rw(len: usize) -> Result<usize, Errno> {
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    Ok(p as usize)
}

/// Releases a mapping made by `reserve` or `map_rw`.
///
/// # Safety
/// Nothing may use `[addr, addr+len)` afterwards.
pub unsafe fn unmap(addr: usize, len: usize) -> Result<(), Errno> {
    // SAFETY: the caller guarantees the range is no longer used.
    check(unsafe { libc::munmap(addr as *mut libc::c_void, len) }).map(|_| ())
}

/// `mprotect` on memory owned by a space.
///
/// # Safety
/// No Rust reference may point into `[addr, addr+len)` while it loses
/// access it needs (usermm's callers pass ranges of a space's reservation).
pub unsafe fn protect(addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
    // SAFETY: the caller's contract: the range is memory no Rust reference
    // depends on (a space's); the kernel validates the rest.
    check(unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) }).map(|_| ())
}

/// Replaces `[addr, addr+len)` of a space's reservation with a fresh,
/// empty anonymous mapping of protection `prot` (`MAP_FIXED`): whatever the
/// old pages were (locked, pinned), they are gone.
///
/// # Safety
/// `[addr, addr+len)` must be memory of this process that nothing else
/// (no Rust reference, no other mapping's owner) relies on: a space's
/// reservation.
pub unsafe fn replace_anon(addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
    // SAFETY: the caller's contract: the range is a space's, and its pages
    // are ones usermm has decided to drop.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    Ok(())
}

/// Maps `[addr, addr+len)` of a space's reservation to the file `fd` at
/// `off`, shared and read-only (`MAP_FIXED`), its pages mapped at once from
/// the page cache (`MAP_POPULATE`), and locked (`MAP_LOCKED`) if `locked`:
/// the kernel's own pages of the file, in place of the anonymous ones.
///
/// # Safety
/// As [`replace_anon`]: the range is a space's, with no page there that
/// anything relies on (the range's pages are being filled).
pub unsafe fn map_file_fixed(addr: usize, len: usize, fd: i32, off: u64, locked: bool) -> Result<(), Errno> {
    let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE | if locked { libc::MAP_LOCKED } else { 0 };
    // SAFETY: the caller's contract: the range is a space's, being filled.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, libc::PROT_READ, flags, fd, off as libc::off_t) };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    Ok(())
}

/// Maps `[addr, addr+len)` of a space's reservation to `fd` from byte
/// `off`, shared, with protection `prot` (`MAP_FIXED`).
///
/// # Safety
/// As [`replace_anon`]: the range is a space's, and its old bytes are no
/// longer needed (`fd` holds them).
pub unsafe fn map_shared_fixed(addr: usize, len: usize, prot: i32, fd: i32, off: u64) -> Result<(), Errno> {
    // SAFETY: the caller's contract.
    let p = unsafe {
        libc::mmap(addr as *mut libc::c_void, len, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd, off as libc::off_t)
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    Ok(())
}

/// `mincore(addr, len)` (the syscall itself): one byte per host (4 KiB)
/// page. Reading page tables has no effect on memory, so any address may
/// be asked about.
pub fn mincore(addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
    let mut v = vec![0u8; len.div_ceil(4096).max(1)];
    // SAFETY: `v` holds one byte per host page of the range (at least one).
    check(unsafe { libc::syscall(libc::SYS_mincore, addr, len, v.as_mut_ptr()) } as libc::c_int)?;
    v.truncate(len.div_ceil(4096));
    Ok(v)
}

/// `madvise` on memory owned by a space (DONTNEED drops its pages).
///
/// # Safety
/// Advice such as `MADV_DONTNEED`, `MADV_FREE` or `MADV_REMOVE` changes the
/// bytes of the range: no Rust reference may point into it (usermm's
/// callers pass ranges of a space's reservation or its own staging area).
pub unsafe fn advise(addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
    // SAFETY: the caller's contract: no Rust reference points into the
    // range; the kernel validates the rest.
    check(unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) }).map(|_| ())
}

/// `process_madvise`'s name for the calling process (`PIDFD_SELF`, Linux
/// 6.15's uapi; older kernels refuse it with `EBADF`).
const PIDFD_SELF_THREAD_GROUP: i32 = -10001;
/// The most ranges one `process_madvise` takes (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// `advise` on many ranges with one `process_madvise` per 1,024 of them,
/// which flushes the TLB once per call rather than once per range: with
/// another thread of the process running on the other CPU, dropping 4,096
/// scattered pages took 14 µs a page one `madvise` at a time and 0.8 µs in
/// batches here (Linux 6.18, 2 vCPUs). Falls back to one `madvise` per
/// range where the kernel refuses the batch (before 6.15), or for the
/// ranges a batch left undone.
///
/// # Safety
/// As [`advise`], for every range.
pub unsafe fn advise_many(ranges: &[(usize, usize)], advice: i32) -> Result<(), Errno> {
    for chunk in ranges.chunks(IOV_MAX) {
        let iov: Vec<libc::iovec> =
            chunk.iter().map(|&(a, l)| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: l }).collect();
        // SAFETY: the caller's contract, for every range; `iov` lives
        // across the call and holds `chunk.len()` entries.
        let r = unsafe {
            libc::syscall(libc::SYS_process_madvise, PIDFD_SELF_THREAD_GROUP, iov.as_ptr(), iov.len(), advice, 0u32)
        };
        // Bytes advised, in order: the call stops at its first failure.
        let mut left = usize::try_from(r).unwrap_or(0);
        // The ranges the call did not cover (all of them if it failed):
        // advised one by one, where an error is the range's own.
        for &(a, l) in chunk {
            if l <= left {
                left -= l;
                continue;
            }
            left = 0;
            // SAFETY: the caller's contract for this range.
            unsafe { advise(a, l, advice) }?;
        }
    }
    Ok(())
}

/// `mlock2` on memory owned by a space.
pub fn mlock2(addr: usize, len: usize, flags: u32) -> Result<(), Errno> {
    // SAFETY: locking has no memory-safety effect.
    let r = unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// Flushes every CPU's pending LRU batches in the host
/// (`lru_add_drain_all`), by asking `move_pages` to move the page at `addr`
/// (one of ours, resident) to the node it is already on: page migration
/// drains all batches first. Pages created on another CPU wait in that CPU's
/// batch, invisible to reclaim, until then.
pub fn lru_drain_all(addr: usize) -> Result<(), Errno> {
    let pages = [addr as *mut libc::c_void];
    let mut status: libc::c_int = -1;
    // SAFETY: one page pointer, a NULL node list (query only), one status
    // slot; the kernel only reads `pages` and writes `status`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            &mut status as *mut libc::c_int,
            0,
        )
    };
    if r < 0 {
        return Err(last_errno());
    }
    let node: libc::c_int = status.max(0);
    // SAFETY: as above, with one target node that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            pages.as_ptr(),
            &node as *const libc::c_int,
            &mut status as *mut libc::c_int,
            0,
        )
    };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// `munlock` on memory owned by a space.
pub fn munlock(addr: usize, len: usize) -> Result<(), Errno> {
    // SAFETY: unlocking has no memory-safety effect.
    check(unsafe { libc::munlock(addr as *const libc::c_void, len) }).map(|_| ())
}

/// Copies one page between two addresses usermm owns.
///
/// # Safety
/// Both ranges must be mapped, `src` readable and `dst` writable, for `len`
/// bytes, and must not overlap.
pub unsafe fn copy(dst: usize, src: usize, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
}

/// Fills memory usermm owns with zeros.
///
/// # Safety
/// `[dst, dst+len)` must be mapped and writable.
pub unsafe fn zero(dst: usize, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::write_bytes(dst as *mut u8, 0, len) };
}

/// What the host's `mlock` says for memory it may not populate although it
/// is accessible: an exec-only private anonymous page. Linux 6.18 builds
/// differ (measured here: `ENOMEM` on one, 0 with nothing populated on a
/// later one); usermm answers as its host does. Probed on a scratch
/// mapping, never a space's.
pub fn host_mlock_exec_only() -> Result<(), Errno> {
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_EXEC, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    let r = mlock2(p as usize, 4096, 0);
    // SAFETY: the scratch mapping made above, referenced by nothing.
    unsafe { libc::munmap(p, 4096) };
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `advise_many` drops exactly the ranges it is given, past one
    /// `process_madvise` batch (1,024 ranges), and its fallback does the
    /// same one range at a time.
    #[test]
    fn advise_many_drops_exactly_its_ranges() {
        let ps = 4096;
        let n = 3200;
        let base = map_rw(n * ps).expect("map");
        let byte = |i: usize| (base + i * ps) as *mut u8;
        for i in 0..n {
            // SAFETY: page `i` of the fresh mapping above, not referenced.
            unsafe { byte(i).write_volatile(1 + (i % 200) as u8) };
        }
        // Every third page, and a run of two pages, as (address, length).
        let mut ranges: Vec<(usize, usize)> = (0..n - 2).step_by(3).map(|i| (base + i * ps, ps)).collect();
        ranges.push((base + (n - 2) * ps, 2 * ps));
        assert!(ranges.len() > IOV_MAX);
        // SAFETY: ranges of the mapping above; no reference into it.
        unsafe { advise_many(&ranges, libc::MADV_DONTNEED) }.expect("advise_many");
        for i in 0..n {
            let dropped = i % 3 == 0 || i >= n - 2;
            // SAFETY: as above.
            let v = unsafe { byte(i).read_volatile() };
            assert_eq!(v, if dropped { 0 } else { 1 + (i % 200) as u8 }, "page {i}");
        }
        // A range that is not mapped: the error is the kernel's.
        // SAFETY: the range is the mapping's and nothing else after it is
        // touched.
        unsafe { unmap(base, n * ps) }.expect("unmap");
        // SAFETY: an unmapped range: madvise changes nothing there.
        let r = unsafe { advise_many(&[(base, ps)], libc::MADV_DONTNEED) };
        assert_eq!(r, Err(Errno::ENOMEM));
    }
}
