//! Caller memory, read and written the way the kernel does it with user
//! pointers: [`access_ok`], chunked [`copy_out`] / [`copy_in`] through
//! `process_vm_writev` / `process_vm_readv` on our own pid, and the retry
//! after populating on the user-mode-only fallback ([`retry_populated`]).

use usermm_sys::ffi::{copy_from_own_memory, copy_to_own_memory};

use crate::{Errno, Space};

/// Linux's `PATH_MAX`: the longest path, NUL included, `getname` accepts.
pub(super) const PATH_MAX: usize = 4096;

/// Linux's `access_ok`: whether `[addr, addr + len)` lies in the user half of
/// the address space. It says nothing of what is mapped there; the copy
/// itself finds that out.
pub(super) fn access_ok(addr: usize, len: usize) -> bool {
    addr.checked_add(len).is_some_and(|end| end as u64 <= usermm_core::TASK_SIZE)
}

/// The most bytes [`copy_out`] and [`copy_in`] copy at once: what a retry
/// after populating must fit in the budget.
const COPY_CHUNK: usize = 256 << 10;

/// Runs `copy` (of caller memory `[addr, addr + len)`), retrying an `EFAULT`
/// after populating the part of `[addr, addr + len)` that lies in `sp`, when
/// `sp` runs on the user-mode-only userfaultfd fallback.
///
/// # Why?
/// That fallback does not serve faults the kernel takes on the program's
/// behalf (README, "Privileges"), and `process_vm_readv`/`writev` take
/// exactly those: caller memory in an untouched page of the space would be
/// `EFAULT` where a plain store worked. A populate is served by usermm
/// itself. A few retries, because reclaim may evict the pages again in
/// between; a range that cannot be populated (read-only, a hole) stays
/// `EFAULT`.
fn retry_populated(
    sp: Option<&Space>,
    addr: usize,
    len: usize,
    write: bool,
    mut copy: impl FnMut() -> Result<(), Errno>,
) -> Result<(), Errno> {
    let mut tries = 0;
    loop {
        let e = match copy() {
            Err(e) if e == Errno::EFAULT && tries < 3 => e,
            r => return r,
        };
        let Some(sp) = sp.filter(|sp| sp.uffd_mode() == crate::UffdMode::UserModeOnly) else {
            return Err(e);
        };
        let (base, reserve_len) = sp.reservation();
        let ps = sp.page_size();
        let lo = addr.max(base) / ps * ps;
        let hi = addr.saturating_add(len).min(base + reserve_len).div_ceil(ps) * ps;
        if lo >= hi {
            return Err(e);
        }
        let advice = if write { crate::consts::MADV_POPULATE_WRITE } else { crate::consts::MADV_POPULATE_READ };
        if sp.populate(lo, hi - lo, advice).1.is_err() {
            return Err(e);
        }
        tries += 1;
    }
}

/// Copies `src` to caller memory at `dst` (`EFAULT` if it cannot be
/// written), in chunks; `sp` is the space of the call, if any (see
/// [`retry_populated`]).
pub(super) fn copy_out(sp: Option<&Space>, dst: usize, src: &[u8]) -> Result<(), Errno> {
    for (i, chunk) in src.chunks(COPY_CHUNK).enumerate() {
        let at = dst.checked_add(i * COPY_CHUNK).ok_or(Errno::EFAULT)?;
        retry_populated(sp, at, chunk.len(), true, || copy_to_own_memory(at, chunk))?;
    }
    Ok(())
}

/// Fills `buf` from caller memory at `src` (`EFAULT` if it cannot be read);
/// `sp` as for [`copy_out`].
pub(super) fn copy_in(sp: Option<&Space>, buf: &mut [u8], src: usize) -> Result<(), Errno> {
    for (i, chunk) in buf.chunks_mut(COPY_CHUNK).enumerate() {
        let at = src.checked_add(i * COPY_CHUNK).ok_or(Errno::EFAULT)?;
        retry_populated(sp, at, chunk.len(), false, || copy_from_own_memory(chunk, at))?;
    }
    Ok(())
}

/// Writes `head` at `dst` (caller memory), then zeros up to `total` bytes
/// (`head` past `total` is cut). `EFAULT` if any of it cannot be written.
pub(super) fn copy_out_zero_padded(sp: Option<&Space>, dst: usize, head: &[u8], total: usize) -> Result<(), Errno> {
    let n = head.len().min(total);
    copy_out(sp, dst, &head[..n])?;
    let zeros = [0u8; 4096];
    let mut at = n;
    while at < total {
        let k = (total - at).min(zeros.len());
        copy_out(sp, dst.checked_add(at).ok_or(Errno::EFAULT)?, &zeros[..k])?;
        at += k;
    }
    Ok(())
}

/// Fills a caller's sized struct of 64-bit words (`umm_stats`,
/// `umm_heap_stats`): `*out` starts with its `size`, and gets the whole
/// words after it that fit (`words`, then zeros for a newer caller's
/// fields); `size` itself is left as the caller set it. `EINVAL` for NULL
/// or `size < 8`, `EFAULT` for memory that cannot be read or written.
pub(super) fn copy_out_sized_words(sp: &Space, out: usize, words: &[u64]) -> Result<(), Errno> {
    if out == 0 {
        return Err(Errno::EINVAL);
    }
    let size = read_usize(Some(sp), out)?;
    if size < 8 {
        return Err(Errno::EINVAL);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    copy_out_zero_padded(Some(sp), out + 8, &bytes, (size / 8 - 1) * 8)
}

pub(super) fn read_usize(sp: Option<&Space>, addr: usize) -> Result<usize, Errno> {
    let mut b = [0u8; 8];
    copy_in(sp, &mut b, addr)?;
    Ok(usize::from_ne_bytes(b))
}
