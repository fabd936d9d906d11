//! Polled reads: a read submitted to an io_uring of the space's, whose
//! completion the reading thread waits for by polling the completion ring
//! in memory (yielding the CPU each turn) for a while before it sleeps in
//! `io_uring_enter`.
//!
//! Why: a thread that reads a page from disk for a fault sleeps in `pread`
//! and is woken by the completion; on this VM the wake-up of an idle vCPU
//! costs 5–40 µs, a sizeable part of a 4 KiB read's 45–65 µs. A random
//! `O_DIRECT` 4 KiB read from one thread, 3,000 of them, p50: `pread`
//! 58.7–65.0 µs, io_uring waited for by sleeping 57.7–65.6 µs, io_uring polled
//! 43.6–56.0 µs (three interleaved rounds).
//!
//! A [`RingPool`] belongs to a space: a reader takes a ring (making one when
//! all are in use), reads, and gives it back; the rings close with the
//! space. Where io_uring cannot be set up (an old kernel,
//! `io_uring_disabled`, a seccomp filter) [`RingPool::pread_polled`] says so
//! and the caller reads with `pread`. A ring belongs to the process that
//! made it: a fork child makes its own (the parent's rings are shared memory
//! with the parent's kernel instance).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use crate::Errno;

/// How long a read is polled for before its thread sleeps (a 4 KiB
/// `O_DIRECT` read here takes 40–80 µs).
const POLL_NS: u64 = 200_000;

/// Entries of a ring's submission queue: reads submitted at once.
const RING_ENTRIES: u32 = 32;

/// A ring, and the process it was made in.
struct Ring {
    ring: IoUring,
    pid: u32,
}

/// A space's io_uring instances, one per thread reading at a time.
#[derive(Default)]
pub struct RingPool {
    idle: Mutex<Vec<Ring>>,
    /// Setting up a ring failed: reads go to `pread` from then on.
    unavailable: AtomicBool,
}

impl RingPool {
    pub fn new() -> RingPool {
        RingPool::default()
    }

    /// In a forked child: no ring of the pool is ever used again (their
    /// queues are shared with the parent's: a submission here would run
    /// there, or complete into its queue); reads go to `pread`. The rings
    /// are left as they are (closing one here could not harm the parent,
    /// but a parent thread may have held the pool's lock at the fork).
    pub fn forget_in_child(&self) {
        self.unavailable.store(true, Ordering::Relaxed);
        if let Ok(mut idle) = self.idle.try_lock() {
            std::mem::forget(std::mem::take(&mut *idle));
        }
    }

    /// Reads up to `len` bytes of `fd` at `off` into `dst` with one read
    /// on a ring of the pool, polling for its completion for up to
    /// `POLL_NS` (then sleeping). Returns the count (short at the end of
    /// the file), or `None` if no ring is to be had (the caller reads with
    /// `pread`). Never returns while the kernel may still write into
    /// `dst`. Safe in usermm's SIGBUS handler (in-thread faults), which runs
    /// with every other signal blocked: no syscall here waits for a lock
    /// another thread may hold long.
    ///
    /// (Like `pread`'s, a buffer the kernel must fault in through a
    /// userfaultfd waits for that userfaultfd's handler.)
    ///
    /// # Safety
    /// `[dst, dst+len)` must be writable memory that nothing else reads or
    /// writes until this returns.
    pub unsafe fn pread_polled(&self, fd: i32, dst: usize, len: usize, off: u64) -> Option<Result<usize, Errno>> {
        if self.unavailable.load(Ordering::Relaxed) {
            return None;
        }
        let mut r = self.take()?;
        // SAFETY: the caller's guarantee on `dst`; the completion is waited
        // for before this returns, whatever happens.
        match unsafe { read_one(&mut r.ring, fd, dst, len, off, POLL_NS) } {
            Done::Read(res) => {
                self.give(r);
                Some(res)
            }
            // The entry may still sit in the submission queue, pointing at
            // `dst`: the ring goes (closing it drops the entry), and this
            // read is the caller's `pread`.
            Done::NotSubmitted => None,
        }
    }
}

impl RingPool {
    /// [`RingPool::pread_polled`] of many reads at once, `(dst, len, off)`
    /// each, submitted together (`RING_ENTRIES` at a time), so the device
    /// serves them in parallel; polled for only if `poll` (a read nobody
    /// waits for sleeps, leaving the CPU to the program). Says for each what it read, or `None` for a
    /// read not done (no ring to be had, or the kernel did not take it: the
    /// caller reads it with `pread`). Never returns while the kernel may
    /// still write into a buffer.
    ///
    /// # Safety
    /// Each `[dst, dst+len)` must be writable memory that nothing else reads
    /// or writes until this returns, and no two may overlap.
    pub unsafe fn pread_batch(
        &self,
        fd: i32,
        reads: &[(usize, usize, u64)],
        poll: bool,
    ) -> Vec<Option<Result<usize, Errno>>> {
        let mut out = vec![None; reads.len()];
        if self.unavailable.load(Ordering::Relaxed) {
            return out;
        }
        for (k, chunk) in reads.chunks(RING_ENTRIES as usize).enumerate() {
            let Some(mut r) = self.take() else { return out };
            // SAFETY: the caller's guarantee on the buffers; every read the
            // kernel took is reaped before this returns.
            let (done, whole) = unsafe { read_batch(&mut r.ring, fd, chunk, if poll { POLL_NS } else { 0 }) };
            out[k * RING_ENTRIES as usize..][..chunk.len()].copy_from_slice(&done);
            if !whole {
                // Entries the kernel did not take may sit in the
                // submission queue: the ring goes (closing drops them).
                return out;
            }
            self.give(r);
        }
        out
    }

    /// A ring of this process's from the pool, or a new one; `None` (and
    /// the pool unavailable from then on) when none can be set up.
    fn take(&self) -> Option<Ring> {
        let pid = std::process::id();
        loop {
            let popped = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match popped {
                Some(r) if r.pid == pid => return Some(r),
                // A fork child's copy of its parent's ring: closed here
                // (the child's descriptor and mappings only).
                Some(_) => {}
                None => match IoUring::new(RING_ENTRIES) {
                    Ok(ring) => return Some(Ring { ring, pid }),
                    Err(_) => {
                        self.unavailable.store(true, Ordering::Relaxed);
                        return None;
                    }
                },
            }
        }
    }

    /// Gives back a ring with nothing in flight.
    fn give(&self, r: Ring) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }
}

/// `reads` (at most the ring's size) on `ring`, which has nothing in
/// flight: what each read (`None`: not taken by the kernel), and whether
/// the kernel took them all (if not, the ring must be closed).
///
/// # Safety
/// As [`RingPool::pread_batch`].
unsafe fn read_batch(
    ring: &mut IoUring,
    fd: i32,
    reads: &[(usize, usize, u64)],
    poll_ns: u64,
) -> (Vec<Option<Result<usize, Errno>>>, bool) {
    let mut out = vec![None; reads.len()];
    let mut pushed = 0;
    for (i, &(dst, len, off)) in reads.iter().enumerate() {
        let Ok(len32) = u32::try_from(len) else {
            out[i] = Some(Err(Errno::EINVAL));
            continue;
        };
        let sqe = opcode::Read::new(types::Fd(fd), dst as *mut u8, len32).offset(off).build().user_data(i as u64);
        // SAFETY: the buffer stays valid and untouched until the completion
        // is reaped below (the caller's guarantee), or the ring is closed.
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            break;
        }
        pushed += 1;
    }
    let mut taken = 0;
    while taken < pushed {
        match ring.submit() {
            Ok(n) if n > 0 => taken += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            _ => break,
        }
    }
    let whole = taken == pushed;
    let until = crate::now_ns() + poll_ns;
    let mut reaped = 0;
    while reaped < taken {
        let before = reaped;
        for c in ring.completion() {
            let res = c.result();
            out[c.user_data() as usize] = Some(if res < 0 { Err(Errno(-res)) } else { Ok(res as usize) });
            reaped += 1;
        }
        if reaped >= taken || reaped > before {
            continue;
        }
        if crate::now_ns() < until || !whole {
            // (Not taken in full: entering the kernel to wait would submit
            // the rest, whose buffers the caller reads with `pread`.)
            std::thread::yield_now();
            continue;
        }
        let _ = ring.submitter().submit_and_wait(taken - reaped);
    }
    (out, whole)
}

/// How [`read_one`] ended.
enum Done {
    /// The read completed (or failed) in the kernel.
    Read(Result<usize, Errno>),
    /// The kernel did not take the read.
    NotSubmitted,
}

/// One read on `ring` (which has nothing in flight), waited for.
///
/// # Safety
/// As [`pread_polled`].
unsafe fn read_one(ring: &mut IoUring, fd: i32, dst: usize, len: usize, off: u64, poll_ns: u64) -> Done {
    let Ok(len32) = u32::try_from(len) else {
        return Done::Read(Err(Errno::EINVAL));
    };
    let sqe = opcode::Read::new(types::Fd(fd), dst as *mut u8, len32).offset(off).build().user_data(1);
    // SAFETY: the buffer stays valid and untouched until the completion is
    // reaped below (the caller's guarantee), or the ring is closed.
    if unsafe { ring.submission().push(&sqe) }.is_err() {
        return Done::NotSubmitted;
    }
    loop {
        match ring.submit() {
            Ok(n) if n >= 1 => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            _ => return Done::NotSubmitted,
        }
    }
    let until = crate::now_ns() + poll_ns;
    let res = loop {
        if let Some(c) = ring.completion().next() {
            break c.result();
        }
        if crate::now_ns() < until {
            std::thread::yield_now();
            continue;
        }
        // Sleep until it completes (EINTR: again; the read is in flight
        // and must be reaped before the buffer is given back).
        let _ = ring.submitter().submit_and_wait(1);
    };
    Done::Read(if res < 0 { Err(Errno(-res)) } else { Ok(res as usize) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_batch_reads_what_pread_reads() {
        let path = std::env::temp_dir().join(format!("usermm-ring-batch-{}", std::process::id()));
        let pages = 100usize;
        let data: Vec<u8> = (0..pages * 4096).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let pool = RingPool::new();
        // More reads than a ring takes at once, scattered, one past the end
        // of the file (0 bytes) and one that ends there (short).
        let mut buf = vec![0xeeu8; 80 * 4096];
        let base = buf.as_mut_ptr() as usize;
        let mut reads: Vec<(usize, usize, u64)> =
            (0..78).map(|i| (base + i * 4096, 4096, ((i * 37) % pages) as u64 * 4096)).collect();
        reads.push((base + 78 * 4096, 4096, (pages as u64) * 4096));
        reads.push((base + 79 * 4096, 4096, (pages as u64) * 4096 - 100));
        for poll in [true, false] {
            // SAFETY: `buf` is ours, plain memory, cut into disjoint pages,
            // untouched until the call returns.
            let got = unsafe { pool.pread_batch(f.as_raw_fd(), &reads, poll) };
            assert_eq!(got.len(), reads.len());
            for (i, (r, &(_, _, off))) in got.iter().zip(&reads).enumerate() {
                let want = (data.len() as u64).saturating_sub(off).min(4096) as usize;
                assert_eq!(*r, Some(Ok(want)), "read {i} at {off}");
                assert_eq!(&buf[i * 4096..i * 4096 + want], &data[off as usize..off as usize + want], "read {i}");
            }
        }
        // A read error is the kernel's errno, read by read.
        // SAFETY: as above.
        let bad = unsafe { pool.pread_batch(i32::MAX - 7, &reads[..3], true) };
        assert!(bad.iter().all(|r| *r == Some(Err(Errno::EBADF))), "{bad:?}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_polled_read_reads_what_pread_reads() {
        let path = std::env::temp_dir().join(format!("usermm-ring-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096u32 + 100).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let pool = RingPool::new();
        let mut buf = vec![0u8; 4096];
        for (off, want) in [(0u64, 4096usize), (4096, 4096), (3 * 4096, 100), (4 * 4096, 0)] {
            buf.fill(0xee);
            // SAFETY: `buf` is ours, plain memory, untouched until the call returns.
            let got = unsafe { pool.pread_polled(f.as_raw_fd(), buf.as_mut_ptr() as usize, 4096, off) };
            let n = got.expect("io_uring is there on this machine").expect("read");
            assert_eq!(n, want, "at {off}");
            if n > 0 {
                assert_eq!(&buf[..n], &data[off as usize..off as usize + n], "at {off}");
            }
        }
        assert_eq!(pool.idle.lock().unwrap().len(), 1, "one ring, reused");
        // A read error is the kernel's errno: a descriptor that is not open.
        // SAFETY: as above.
        let bad = unsafe { pool.pread_polled(i32::MAX - 7, buf.as_mut_ptr() as usize, 4096, 0) };
        assert_eq!(bad.expect("a ring").unwrap_err(), Errno::EBADF);
        // Threads reading at once each get a ring; all come back.
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (pool, fd, data) = (&pool, f.as_raw_fd(), &data);
                sc.spawn(move || {
                    let mut b = vec![0u8; 4096];
                    for i in 0..200u64 {
                        let off = ((i + t) % 3) * 4096;
                        // SAFETY: as above.
                        let r = unsafe { pool.pread_polled(fd, b.as_mut_ptr() as usize, 4096, off) };
                        assert_eq!(r.unwrap().unwrap(), 4096);
                        assert_eq!(&b[..], &data[off as usize..off as usize + 4096]);
                    }
                });
            }
        });
        let rings = pool.idle.lock().unwrap().len();
        assert!((1..=4).contains(&rings), "{rings} rings for 4 threads");
        // A fork child makes a ring of its own and reads right.
        // SAFETY: the child only reads a file and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut b = vec![0u8; 4096];
            // SAFETY: as above.
            let r = unsafe { pool.pread_polled(f.as_raw_fd(), b.as_mut_ptr() as usize, 4096, 4096) };
            let ok = matches!(r, Some(Ok(4096))) && b[..] == data[4096..8192];
            // SAFETY: leaving the child at once, nothing to unwind.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: `st` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "the fork child's read: {st:#x}");
        let _ = std::fs::remove_file(&path);
    }
}
