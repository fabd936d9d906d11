//! The C and Rust API boundary: turning caller-provided pointers into
//! references. The callers of these functions (the C ABI and the `Mapping`
//! handle) are the only places that trust a pointer they did not create.

/// A mutable slice from a C pointer and length; `None` for a null pointer
/// with a non-zero length.
///
/// # Safety
/// If non-null, `ptr` must be valid for writes of `len` elements for `'a`,
/// and not aliased.
pub unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize) -> Option<&'a mut [T]> {
    if len == 0 {
        return Some(&mut []);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A shared reference from a C pointer; `None` for null.
///
/// # Safety
/// If non-null, `ptr` must point to a valid `T` for `'a`.
pub unsafe fn as_ref<'a, T>(ptr: *const T) -> Option<&'a T> {
    // SAFETY: guaranteed by the caller.
    unsafe { ptr.as_ref() }
}

/// A mutable reference from a C pointer; `None` for null.
///
/// # Safety
/// If non-null, `ptr` must point to a valid, unaliased `T` for `'a`.
pub unsafe fn as_mut<'a, T>(ptr: *mut T) -> Option<&'a mut T> {
    // SAFETY: guaranteed by the caller.
    unsafe { ptr.as_mut() }
}

/// A C string as UTF-8 (`None` for null or invalid UTF-8).
///
/// # Safety
/// If non-null, `ptr` must point to a NUL-terminated string valid for `'a`.
pub unsafe fn c_str<'a>(ptr: *const std::ffi::c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::ffi::CStr::from_ptr(ptr) }.to_str().ok()
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Writes all of `data` to a raw descriptor.
pub fn write_fd(fd: i32, data: &[u8]) -> Result<(), crate::Errno> {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: `data[done..]` is readable.
        let r = unsafe { libc::write(fd, data[done..].as_ptr() as *const libc::c_void, data.len() - done) };
        if r < 0 {
            let e = crate::last_errno();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

/// A byte slice over memory a space mapped.
///
/// # Safety
/// `[addr, addr+len)` must stay mapped for `'a`; the bytes may change
/// concurrently only through this process's own writes (as with any shared
/// memory mapping, e.g. memmap2's).
pub unsafe fn mapped_slice<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// Copies `dst.len()` bytes from `src`, an address of this process, the way
/// the kernel reads a user pointer: `process_vm_readv` on our own pid, so an
/// unmapped or unreadable `src` is `EFAULT`, never a signal, and a missing
/// page of a space is a kernel-mode fault its handlers serve. No lock of the
/// caller's may be one the handlers take.
pub fn copy_from_own_memory(dst: &mut [u8], src: usize) -> Result<(), crate::Errno> {
    process_vm(src, dst.as_mut_ptr(), dst.len(), false)
}

/// Copies `src` to `dst`, an address of this process, the way the kernel
/// writes a user pointer (`process_vm_writev`): a read-only, unmapped or
/// `PROT_NONE` `dst` is `EFAULT`, never a signal.
pub fn copy_to_own_memory(dst: usize, src: &[u8]) -> Result<(), crate::Errno> {
    process_vm(dst, src.as_ptr().cast_mut(), src.len(), true)
}

/// Reads a NUL-terminated string at `src`, an address of this process, the
/// way the kernel's `strncpy_from_user` does: `EFAULT` for an unreadable byte
/// before the NUL, `ENAMETOOLONG` when no NUL is found in `max` bytes. The
/// NUL is not returned. Reads never cross a page boundary past the NUL, so a
/// string that ends just before an unmapped page is read whole.
pub fn c_string_from_own_memory(src: usize, max: usize) -> Result<Vec<u8>, crate::Errno> {
    const CHUNK: usize = 4096;
    let mut out = Vec::new();
    let mut at = src;
    while out.len() < max {
        // Up to the end of the page (the smallest page the host uses), so a
        // readable string never makes a read touch the next page.
        let n = (CHUNK - at % CHUNK).min(max - out.len());
        let mut buf = vec![0u8; n];
        copy_from_own_memory(&mut buf, at)?;
        if let Some(z) = buf.iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..z]);
            return Ok(out);
        }
        out.extend_from_slice(&buf);
        at = at.checked_add(n).ok_or(crate::Errno::EFAULT)?;
    }
    Err(crate::Errno::ENAMETOOLONG)
}

fn process_vm(remote: usize, local: *mut u8, len: usize, write: bool) -> Result<(), crate::Errno> {
    // A range that wraps around the address space is no memory at all.
    if remote.checked_add(len).is_none() {
        return Err(crate::Errno::EFAULT);
    }
    let mut done = 0;
    while done < len {
        let l = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
        let r = libc::iovec { iov_base: (remote + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: `local` is our own buffer of `len` bytes (readable, and
        // writable for a read: the callers pass a `&mut [u8]` then); the
        // kernel validates `remote` and fails with EFAULT instead of
        // faulting this process.
        let n = unsafe {
            if write {
                libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0)
            }
        };
        if n < 0 {
            let e = crate::last_errno();
            if e == crate::Errno::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(crate::Errno::EFAULT);
        }
        done += n as usize;
    }
    Ok(())
}
