//! The program's memory calls: the routing policy of `route.rs` applied (space,
//! kernel, or both, piece by piece).

use super::*;

// The program's calls: the policy of `route.rs`.

pub(super) extern "C" fn program_mmap(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    guard(libc::MAP_FAILED, || {
        let a = a as usize;
        let why = match program_call() {
            Err(w) => w,
            Ok(()) => match route_mmap(a, len, flags) {
                MapRoute::Space => match with_space(|sp| sp.mmap(a, len, prot, flags, fd, off)) {
                    Ok(Ok(p)) => {
                        count(Why::Space);
                        return p as *mut c_void;
                    }
                    Ok(Err(e)) if e == Errno::ENOMEM && flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == 0 => {
                        Why::Refused
                    }
                    Ok(Err(e)) => {
                        count(Why::Space);
                        return fail(e.0, libc::MAP_FAILED);
                    }
                    Err(w) => w,
                },
                MapRoute::FileAtHint(hint) => {
                    let fixed = flags | libc::MAP_FIXED_NOREPLACE;
                    match with_space(|sp| sp.mmap(hint, len, prot, fixed, fd, off)) {
                        Ok(Ok(p)) => {
                            count(Why::Space);
                            return p as *mut c_void;
                        }
                        // Taken (`EEXIST`), or refused: the kernel's
                        // answer, at another address (it never maps
                        // inside the reservation), or its error.
                        Ok(Err(_)) => Why::File,
                        Err(w) => w,
                    }
                }
                MapRoute::Kernel(w) => w,
                MapRoute::Fail(e, w) => {
                    count(w);
                    return fail(e, libc::MAP_FAILED);
                }
            },
        };
        count(why);
        kernel_mmap(a, len, prot, flags, fd, off)
    })
}

/// A range call: the pieces of `[addr, addr + len)` outside the reservation
/// go to the kernel (`kernel`, which returns the raw result), the piece
/// inside to the space (`space`), in address order. With `all`, every
/// piece is acted on whatever the others gave (as Linux's `munmap` and
/// `madvise` act on every mapped part), otherwise the first failure stops
/// the rest (as Linux's `mprotect` and `mlock` stop at a hole). In a forked
/// child a range that overlaps its parent's memory is a hole: 0 with
/// `hole_ok` (`munmap`), `ENOMEM` otherwise. A call that fails before
/// looking at the range (an unaligned address, a zero or overflowing
/// length) goes to the kernel whole, which says so.
pub(super) fn range_call(
    addr: usize,
    len: usize,
    all: bool,
    hole_ok: bool,
    kernel: impl Fn(usize, usize) -> c_long,
    space: impl Fn(&Space, usize, usize) -> Result<(), Errno>,
) -> c_int {
    if let Err(w) = program_call() {
        count(w);
        return ret(kernel(addr, len)) as c_int;
    }
    if len == 0 || addr.checked_add(len).is_none() || !addr.is_multiple_of(PAGE) {
        count(Why::Invalid);
        return ret(kernel(addr, len)) as c_int;
    }
    if crate::overlaps_ancestors(addr, len) {
        // A forked child's call on its parent's memory, which is not here:
        // a hole (`munmap` of one is fine, every other call `ENOMEM`). The
        // placeholder there must stay (`after_fork_child`).
        count(Why::Child);
        return if hole_ok { 0 } else { fail(libc::ENOMEM, -1) };
    }
    if place(addr, len) == Place::Outside {
        count(Why::Outside);
        return ret(kernel(addr, len)) as c_int;
    }
    let mut first = 0;
    for (a, l, inside) in pieces(addr, len) {
        let e = if inside {
            match with_space(|sp| space(sp, a, l)) {
                Ok(r) => {
                    count(Why::Space);
                    r.err().map_or(0, |e| e.0)
                }
                Err(w) => {
                    count(w);
                    kernel_errno(kernel(a, l))
                }
            }
        } else {
            count(Why::Outside);
            kernel_errno(kernel(a, l))
        };
        if e != 0 {
            if first == 0 {
                first = e;
            }
            if !all {
                break;
            }
        }
    }
    if first != 0 {
        fail(first, -1)
    } else {
        0
    }
}

pub(super) extern "C" fn program_munmap(a: *mut c_void, len: usize) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            true,
            true,
            // SAFETY: the program's own unmap of memory outside the
            // reservation (the pieces never reach into it).
            |a, l| unsafe { sys(libc::SYS_munmap, a, l, 0, 0, 0, 0) },
            |sp, a, l| sp.munmap(a, l),
        )
    })
}

pub(super) extern "C" fn program_mprotect(a: *mut c_void, len: usize, prot: c_int) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            false,
            false,
            // SAFETY: as in `program_munmap`.
            |a, l| unsafe { sys(libc::SYS_mprotect, a, l, prot as usize, 0, 0, 0) },
            |sp, a, l| sp.mprotect(a, l, prot),
        )
    })
}

pub(super) fn madvise_call(a: usize, len: usize, advice: c_int) -> c_int {
    range_call(
        a,
        len,
        true,
        false,
        // SAFETY: as in `program_munmap`.
        |a, l| unsafe { sys(libc::SYS_madvise, a, l, advice as usize, 0, 0, 0) },
        |sp, a, l| sp.madvise(a, l, advice),
    )
}

pub(super) extern "C" fn program_madvise(a: *mut c_void, len: usize, advice: c_int) -> c_int {
    guard(-1, || madvise_call(a as usize, len, advice))
}

pub(super) extern "C" fn program_posix_madvise(a: *mut c_void, len: usize, advice: c_int) -> c_int {
    guard(libc::ENOMEM, || {
        if advice == libc::POSIX_MADV_DONTNEED {
            return 0;
        }
        let saved = errno();
        let r = madvise_call(a as usize, len, advice);
        let e = if r == 0 { 0 } else { errno() };
        set_errno(saved);
        e
    })
}

/// The mlock family's range: the address rounded down to a page, the length
/// widened to match (Linux's rule).
pub(super) fn lock_range(a: *const c_void, len: usize) -> (usize, usize) {
    let a = a as usize;
    let start = a & !(PAGE - 1);
    (start, len.saturating_add(a - start))
}

pub(super) extern "C" fn program_mlock(a: *const c_void, len: usize) -> c_int {
    program_mlock2(a, len, 0)
}

pub(super) extern "C" fn program_mlock2(a: *const c_void, len: usize, flags: c_uint) -> c_int {
    guard(-1, || {
        let (a, len) = lock_range(a, len);
        range_call(
            a,
            len,
            false,
            false,
            // SAFETY: locking changes no memory.
            |a, l| unsafe { sys(libc::SYS_mlock2, a, l, flags as usize, 0, 0, 0) },
            |sp, a, l| sp.mlock2(a, l, flags),
        )
    })
}

pub(super) extern "C" fn program_munlock(a: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        let (a, len) = lock_range(a, len);
        range_call(
            a,
            len,
            false,
            false,
            // SAFETY: unlocking changes no memory.
            |a, l| unsafe { sys(libc::SYS_munlock, a, l, 0, 0, 0, 0) },
            |sp, a, l| sp.munlock(a, l),
        )
    })
}

/// The end of the user address space (x86-64's `TASK_SIZE_MAX`, 4-level
/// page tables): Linux's `access_ok` refuses a range that ends past it.
const USER_END: u64 = 0x7fff_ffff_f000;

/// `mincore`: Linux checks the address (`EINVAL`), the range (`ENOMEM`) and
/// that the vector lies in the user address space (`EFAULT`), then walks
/// region by region and copies each region's bytes to the vector (`EFAULT`)
/// before it looks past the region (`ENOMEM` at a hole). A space's piece
/// does the same: its bytes up to the first hole are copied out first.
pub(super) extern "C" fn program_mincore(a: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    guard(-1, || {
        let base = a as usize;
        let pages = len.div_ceil(PAGE);
        let range_ok = base.checked_add(len).is_some_and(|e| e as u64 <= USER_END);
        let vec_ok = (vec as usize).checked_add(pages).is_some_and(|e| e as u64 <= USER_END);
        if base.is_multiple_of(PAGE) && range_ok && !vec_ok {
            // The kernel's EFAULT before the walk (no piece may answer
            // ENOMEM first), whole, as for an unaligned address.
            count(Why::Invalid);
            // SAFETY: the kernel refuses a vector past the user address
            // space before it walks the range or writes anything.
            return ret(unsafe { sys(libc::SYS_mincore, base, len, vec as usize, 0, 0, 0) }) as c_int;
        }
        range_call(
            base,
            len,
            false,
            false,
            // SAFETY: `vec` holds a byte per page of the whole range (the
            // program's promise), so from the piece's page on too.
            |a, l| unsafe { sys(libc::SYS_mincore, a, l, vec.add((a - base) / PAGE) as usize, 0, 0, 0) },
            |sp, a, l| {
                // Into a buffer of ours first: a bad `vec` is `EFAULT`, as
                // the kernel's copy to the program gives, never a SIGSEGV
                // here.
                let (v, walked) = sp.mincore_walk(a, l)?;
                if !v.is_empty() {
                    copy_to_program(sp, vec.wrapping_add((a - base) / PAGE), &v)?;
                }
                walked
            },
        )
    })
}

/// Copies `src` to the program's `dst` as the kernel copies a system
/// call's result out: `EFAULT` when `dst` is not mapped writable. The
/// kernel writes it (`process_vm_writev` to this process), so a bad address
/// is an error, not a fault in this library; inside the reservation, where
/// the kernel cannot fault a page in for itself when the space resolves
/// faults in the faulting thread, the space's own regions say whether
/// `dst` is writable and this thread writes it.
pub(super) fn copy_to_program(sp: &Space, dst: *mut u8, src: &[u8]) -> Result<(), Errno> {
    let local = libc::iovec { iov_base: src.as_ptr() as *mut c_void, iov_len: src.len() };
    let remote = libc::iovec { iov_base: dst.cast(), iov_len: src.len() };
    // SAFETY: the kernel reads `src` (ours, `src.len()` bytes) and writes
    // the program's range only if it is mapped writable, else fails.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == src.len() as isize {
        return Ok(());
    }
    let at = dst as usize;
    if place(at, src.len()) == Place::Inside {
        if let Some((prot, _, end)) = region_at(&sp.smaps(), at) {
            if prot & libc::PROT_WRITE != 0 && at + src.len() <= end {
                // SAFETY: the space maps `dst..dst + len` writable (its
                // faults are served, in this thread or a handler's).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
                return Ok(());
            }
        }
    }
    Err(Errno::EFAULT)
}

pub(super) extern "C" fn program_msync(a: *mut c_void, len: usize, flags: c_int) -> c_int {
    guard(-1, || {
        range_call(
            a as usize,
            len,
            false,
            false,
            // SAFETY: msync changes no memory.
            |a, l| unsafe { sys(libc::SYS_msync, a, l, flags as usize, 0, 0, 0) },
            |sp, a, l| sp.msync(a, l, flags),
        )
    })
}

/// `mlockall`: the space's regions through the space (`umm_mlockall`), every
/// other mapping of the process through the kernel, one `mlock2` per line of
/// `/proc/self/maps` (the kernel's own `mlockall(MCL_CURRENT)` would lock
/// and populate the space's reservation behind usermm's back, and
/// `MCL_FUTURE` would lock usermm's own later host mappings). So
/// `MCL_FUTURE` holds for the space's later regions only.
pub(super) extern "C" fn program_mlockall(flags: c_int) -> c_int {
    guard(-1, || {
        if let Err(w) = program_call() {
            count(w);
            // SAFETY: locking changes no memory.
            return ret(unsafe { sys(libc::SYS_mlockall, flags as usize, 0, 0, 0, 0, 0) }) as c_int;
        }
        let r = with_space(|sp| {
            sp.mlockall(flags)?;
            if flags & libc::MCL_CURRENT == 0 {
                return Ok(());
            }
            let onfault = if flags & libc::MCL_ONFAULT != 0 { libc::MLOCK_ONFAULT as usize } else { 0 };
            let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| Errno::ENOMEM)?;
            for line in maps.lines() {
                let Some((range, rest)) = line.split_once(' ') else { continue };
                let Some((a, b)) = range.split_once('-') else { continue };
                let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
                // Inaccessible mappings (guard pages, other reservations)
                // are locked by Linux but never populated: left alone.
                if place(a, b - a) != Place::Outside || rest.starts_with("---") || line.ends_with("[vsyscall]") {
                    continue;
                }
                // SAFETY: locking changes no memory.
                let e = kernel_errno(unsafe { sys(libc::SYS_mlock2, a, b - a, onfault, 0, 0, 0) });
                if e != 0 && e != libc::ENOMEM {
                    return Err(Errno(e));
                }
            }
            Ok(())
        });
        match r {
            Ok(Ok(())) => {
                count(Why::Space);
                0
            }
            Ok(Err(e)) => {
                count(Why::Space);
                fail(e.0, -1)
            }
            Err(w) => {
                count(w);
                // SAFETY: locking changes no memory.
                ret(unsafe { sys(libc::SYS_mlockall, flags as usize, 0, 0, 0, 0, 0) }) as c_int
            }
        }
    })
}

pub(super) extern "C" fn program_munlockall() -> c_int {
    guard(-1, || {
        // SAFETY: unlocking changes no memory; the space's own host locks
        // go too, and the space's call below clears every lock they stood
        // for.
        let r = ret(unsafe { sys(libc::SYS_munlockall, 0, 0, 0, 0, 0, 0) }) as c_int;
        if program_call().is_err() {
            return r;
        }
        match with_space(|sp| sp.munlockall()) {
            Ok(Err(e)) => fail(e.0, -1),
            _ => r,
        }
    })
}

pub(super) extern "C" fn program_mremap(
    o: *mut c_void,
    ol: usize,
    nl: usize,
    flags: c_int,
    n: *mut c_void,
) -> *mut c_void {
    guard(libc::MAP_FAILED, || {
        let (o, n) = (o as usize, n as usize);
        // SAFETY: the program's own mremap of memory outside the
        // reservation (checked below before this runs).
        let kernel = || ret(unsafe { sys(libc::SYS_mremap, o, ol, nl, flags as usize, n, 0) }) as *mut c_void;
        if let Err(w) = program_call() {
            count(w);
            return kernel();
        }
        let fixed = flags & libc::MREMAP_FIXED != 0;
        if crate::overlaps_ancestors(o, ol.max(1)) || (fixed && crate::overlaps_ancestors(n, nl.max(1))) {
            // A forked child's call on its parent's memory, which is not
            // here (`range_call`): the old range is not mapped.
            count(Why::Child);
            return fail(
                if crate::overlaps_ancestors(o, ol.max(1)) { libc::EFAULT } else { libc::EINVAL },
                libc::MAP_FAILED,
            );
        }
        match place(o, ol) {
            Place::Outside if fixed && place(n, nl) != Place::Outside => {
                count(Why::Straddling);
                fail(libc::EINVAL, libc::MAP_FAILED)
            }
            Place::Outside => {
                count(Why::Outside);
                kernel()
            }
            // Linux: the old range must lie in one mapping.
            Place::Straddling => {
                count(Why::Straddling);
                fail(libc::EFAULT, libc::MAP_FAILED)
            }
            Place::Inside if fixed && place(n, nl) != Place::Inside => {
                count(Why::Straddling);
                fail(libc::EINVAL, libc::MAP_FAILED)
            }
            Place::Inside => match with_space(|sp| space_mremap(sp, o, ol, nl, flags, n)) {
                Ok(r) => {
                    count(Why::Space);
                    r.map_or_else(|e| fail(e.0, libc::MAP_FAILED), |a| a as *mut c_void)
                }
                Err(w) => {
                    count(w);
                    kernel()
                }
            },
        }
    })
}

/// `mremap` of a space region, which the space has no call for: a shrink
/// unmaps the tail; a grow maps the pages right after the region when they
/// are free, as its continuation (`Space::grow_region`: a file region's
/// next pages of its file); otherwise (with
/// `MREMAP_MAYMOVE`, or `MREMAP_FIXED`) a new region is mapped, the bytes
/// copied (faulting in the old pages, each through the budget) and the old
/// range unmapped. Only anonymous regions of one protection are moved; a
/// lock on the old range is not carried over; `old_len == 0` is `EINVAL`.
/// `MREMAP_DONTUNMAP` (Linux's rules: with `MREMAP_MAYMOVE`, same length)
/// always moves, and then leaves the old range mapped, unlocked and empty
/// (its pages dropped, reading as zeros), as Linux leaves a private one;
/// on a shared region it is `EINVAL`: the new region could not share the
/// old one's pages.
pub(super) fn space_mremap(
    sp: &Space,
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    to: usize,
) -> Result<usize, Errno> {
    let page = sp.page_size();
    let (maymove, fixed) = (flags & libc::MREMAP_MAYMOVE != 0, flags & libc::MREMAP_FIXED != 0);
    let dontunmap = flags & libc::MREMAP_DONTUNMAP != 0;
    if flags & !(libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0
        || !old.is_multiple_of(page)
        || (fixed && (!maymove || !to.is_multiple_of(page)))
    {
        return Err(Errno::EINVAL);
    }
    let round = |n: usize| n.checked_next_multiple_of(page).ok_or(Errno::EINVAL);
    let (old_len, new_len) = (round(old_len)?, round(new_len)?);
    if old_len == 0 || new_len == 0 || (dontunmap && (!maymove || old_len != new_len)) {
        return Err(Errno::EINVAL);
    }
    if fixed && to < old + old_len && old < to + new_len {
        return Err(Errno::EINVAL);
    }
    let smaps = sp.smaps();
    let (prot, shared, end) = region_at(&smaps, old).ok_or(Errno::EFAULT)?;
    // Linux (check_prep_vma): a sealed mapping is never remapped.
    if region_sealed(&smaps, old) {
        return Err(Errno::EPERM);
    }
    if old + old_len > end {
        return Err(Errno::EFAULT);
    }
    if dontunmap && shared {
        return Err(Errno::EINVAL);
    }
    let kind = if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } | libc::MAP_ANONYMOUS;
    if !fixed && !dontunmap {
        if new_len <= old_len {
            if new_len < old_len {
                sp.munmap(old + new_len, old_len - new_len)?;
            }
            return Ok(old);
        }
        let grow = new_len - old_len;
        if old + old_len == end && sp.grow_region(end, grow).is_ok() {
            return Ok(old);
        }
        if !maymove {
            return Err(Errno::ENOMEM);
        }
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let new = sp.mmap(to, new_len, rw, kind | if fixed { libc::MAP_FIXED } else { 0 }, -1, 0)?;
    if prot & libc::PROT_READ == 0 {
        sp.mprotect(old, old_len, prot | libc::PROT_READ)?;
    }
    // SAFETY: both ranges are mapped regions of the space, readable (old)
    // and writable (new), and disjoint (a fresh region, or a fixed target
    // checked above); their pages fault in through the space's handler.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_len.min(new_len)) };
    if prot != rw {
        sp.mprotect(new, new_len, prot)?;
    }
    if dontunmap {
        // Linux clears the old range's lock and moves its pages away: what
        // stays is an empty mapping of the old protection.
        sp.munlock(old, old_len)?;
        sp.madvise(old, old_len, libc::MADV_DONTNEED)?;
        if prot & libc::PROT_READ == 0 {
            sp.mprotect(old, old_len, prot)?;
        }
        return Ok(new);
    }
    sp.munmap(old, old_len)?;
    Ok(new)
}

/// `mseal(2)` (`syscall(SYS_mseal, …)`: glibc has no wrapper): inside the
/// reservation the space's (`Space::mseal`), outside it the kernel's. A
/// call that fails before looking at the range (bad flags, an unaligned
/// address, an overflowing length) goes to the kernel, which says so; a
/// range straddling the reservation's edge, or on a forked child's
/// parent's memory, is `ENOMEM` (an unmapped page for the space; Linux
/// seals nothing then either).
pub(super) fn program_mseal(a: usize, len: usize, flags: usize) -> c_long {
    guard(-1, || {
        // SAFETY: sealing changes no byte; the kernel checks the range.
        let kernel = || ret(unsafe { sys(SYS_MSEAL, a, len, flags, 0, 0, 0) });
        if let Err(w) = program_call() {
            count(w);
            return kernel();
        }
        if flags != 0 || len == 0 || a.checked_add(len).is_none() || !a.is_multiple_of(PAGE) {
            count(Why::Invalid);
            return kernel();
        }
        if crate::overlaps_ancestors(a, len) {
            count(Why::Child);
            return fail(libc::ENOMEM, -1);
        }
        match place(a, len) {
            Place::Outside => {
                count(Why::Outside);
                kernel()
            }
            Place::Straddling => {
                count(Why::Straddling);
                fail(libc::ENOMEM, -1)
            }
            Place::Inside => match with_space(|sp| sp.mseal(a, len, 0)) {
                Ok(r) => {
                    count(Why::Space);
                    r.map_or_else(|e| fail(e.0, -1), |()| 0)
                }
                Err(w) => {
                    count(w);
                    kernel()
                }
            },
        }
    })
}

/// `mseal`'s system call number (x86-64; glibc's headers may lack it).
const SYS_MSEAL: c_long = 462;

#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn program_syscall(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let p = |v: c_long| v as *mut c_void;
    match nr {
        libc::SYS_mmap => program_mmap(p(a1), a2 as usize, a3 as c_int, a4 as c_int, a5 as c_int, a6) as c_long,
        libc::SYS_mprotect => program_mprotect(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_munmap => program_munmap(p(a1), a2 as usize) as c_long,
        libc::SYS_mremap => program_mremap(p(a1), a2 as usize, a3 as usize, a4 as c_int, p(a5)) as c_long,
        libc::SYS_msync => program_msync(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_mincore => program_mincore(p(a1), a2 as usize, a3 as *mut u8) as c_long,
        libc::SYS_madvise => program_madvise(p(a1), a2 as usize, a3 as c_int) as c_long,
        libc::SYS_mlock => program_mlock(p(a1), a2 as usize) as c_long,
        libc::SYS_munlock => program_munlock(p(a1), a2 as usize) as c_long,
        libc::SYS_mlockall => program_mlockall(a1 as c_int) as c_long,
        libc::SYS_munlockall => program_munlockall() as c_long,
        libc::SYS_mlock2 => program_mlock2(p(a1), a2 as usize, a3 as c_uint) as c_long,
        SYS_MSEAL => program_mseal(a1 as usize, a2 as usize, a3 as usize),
        // SAFETY: the program's own call, passed on as glibc's `syscall`
        // would.
        _ => ret(unsafe { sys(nr, a1 as usize, a2 as usize, a3 as usize, a4 as usize, a5 as usize, a6 as usize) }),
    }
}
