//! [`disk_write_bandwidth`]: the sequential `O_DIRECT` write bandwidth of a
//! directory's file system (the yardstick for swap-out throughput).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::HostMap;
use crate::{check, check_isize, last_errno, Errno};

/// The result of [`disk_write_bandwidth`].
#[derive(Clone, Copy, Debug)]
pub struct DiskWrite {
    pub bytes: u64,
    /// From the first write to the end of `fsync`.
    pub ns: u64,
    /// Whether the writes bypassed the page cache (`O_DIRECT`).
    pub direct: bool,
}

/// Writes `bytes` (rounded up to `chunk`) to a fresh file in `dir` in
/// sequential `chunk`-sized writes with `O_DIRECT` (buffered if the file
/// system refuses it; `DiskWrite::direct` says which), `fsync`s it and
/// deletes it. The buffer is non-zero data so that no layer can elide it.
pub fn disk_write_bandwidth(dir: &str, bytes: u64, chunk: usize) -> Result<DiskWrite, Errno> {
    if chunk == 0 || !chunk.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    let name = format!("{dir}/usermm-diskbw-{}-{}", std::process::id(), crate::now_ns());
    let cname = CString::new(name).map_err(|_| Errno::EINVAL)?;
    let mut fd = None;
    let mut last = Errno::EIO;
    for direct in [true, false] {
        let dflag = if direct { libc::O_DIRECT } else { 0 };
        // SAFETY: `cname` is NUL-terminated.
        let r = unsafe {
            libc::open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | dflag, 0o600)
        };
        if r >= 0 {
            // SAFETY: a new descriptor we own.
            fd = Some((unsafe { OwnedFd::from_raw_fd(r) }, direct));
            break;
        }
        last = last_errno();
    }
    let Some((fd, direct)) = fd else {
        return Err(last);
    };
    // Page-aligned buffer, as O_DIRECT requires.
    let mut buf = HostMap::anon(chunk, 0)?;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    let run = || -> Result<u64, Errno> {
        let t0 = crate::now_ns();
        let mut off = 0u64;
        while off < bytes {
            let mut done = 0usize;
            while done < chunk {
                // SAFETY: `buf[done..]` is readable for `chunk - done` bytes.
                let r = unsafe {
                    libc::pwrite(
                        fd.as_raw_fd(),
                        buf[done..].as_ptr() as *const libc::c_void,
                        chunk - done,
                        (off + done as u64) as libc::off_t,
                    )
                };
                let n = check_isize(r)?;
                if n == 0 {
                    return Err(Errno::EIO);
                }
                done += n;
            }
            off += chunk as u64;
        }
        // SAFETY: fsync takes its argument by value.
        check(unsafe { libc::fsync(fd.as_raw_fd()) })?;
        Ok(crate::now_ns() - t0)
    };
    let res = run();
    // SAFETY: `cname` is NUL-terminated.
    unsafe { libc::unlink(cname.as_ptr()) };
    let ns = res?;
    let written = bytes.div_ceil(chunk as u64) * chunk as u64;
    Ok(DiskWrite { bytes: written, ns, direct })
}
