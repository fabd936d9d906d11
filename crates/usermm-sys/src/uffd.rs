//! userfaultfd: open, API handshake, register, and the resolving ioctls.
//!
//! Facts handled here (see KERNEL-FACTS and Firecracker's handler notes):
//! - the fd is non-blocking: `read` returns `EAGAIN` when another handler
//!   thread took the message;
//! - resolving ioctls return `EAGAIN` while a mapping change is in flight
//!   (`mmap_changing`) or a page is busy in the host (`UFFDIO_MOVE`):
//!   retried here, [`EAGAIN_TRIES`] times at most;
//! - `EEXIST` from `UFFDIO_COPY` means the page is already there: reported as
//!   the count of bytes that were not installed, for the caller to decide;
//! - REMOVE/UNMAP events are never enabled: they make `MADV_DONTNEED` and
//!   `munmap` of our own range block until the event is read.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::{check, Errno};

const UFFDIO: u64 = 0xAA;
const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (UFFDIO << 8) | nr
}

pub const UFFD_API: u64 = 0xAA;
pub const UFFDIO_API: u64 = iowr(0x3F, 24);
pub const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
pub const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
pub const UFFDIO_WAKE: u64 = ior(0x02, 16);
pub const UFFDIO_COPY: u64 = iowr(0x03, 40);
pub const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
pub const UFFDIO_MOVE: u64 = iowr(0x05, 40);
pub const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
pub const UFFDIO_POISON: u64 = iowr(0x08, 32);
/// `/dev/userfaultfd`'s ioctl: `_IO(0xAA, 0x00)`.
pub const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8; // _IO(0xAA, 0x00)
pub const UFFD_USER_MODE_ONLY: i32 = 1;

pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const UFFD_FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
pub const UFFD_FEATURE_EXACT_ADDRESS: u64 = 1 << 11;
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub const UFFD_FEATURE_POISON: u64 = 1 << 14;
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;

pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 2;
pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1;
pub const UFFDIO_COPY_MODE_WP: u64 = 2;
pub const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1;
pub const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 2;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}

/// A message read from the fd (`struct uffd_msg`, 32 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default, Debug)]
pub struct UffdMsg {
    pub event: u8,
    pub reserved1: u8,
    pub reserved2: u16,
    pub reserved3: u32,
    /// `arg.pagefault.flags`
    pub flags: u64,
    /// `arg.pagefault.address`
    pub address: u64,
    /// `arg.pagefault.feat.ptid` (with `UFFD_FEATURE_THREAD_ID`)
    pub ptid: u32,
    pub pad: u32,
}

/// How the userfaultfd was obtained.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum UffdMode {
    /// `/dev/userfaultfd` or the syscall with kernel-mode faults handled.
    Full,
    /// `UFFD_USER_MODE_ONLY`: faults from inside the kernel (`read(2)` into a
    /// missing page, `MADV_POPULATE_*`) are not handled and fail with EFAULT.
    UserModeOnly,
}

/// An open, initialised userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
    pub mode: UffdMode,
    pub features: u64,
    /// Why the fallback was taken, if it was.
    pub fallback_reason: Option<String>,
}

/// The features usermm asks for, if the kernel has them.
pub const WANTED_FEATURES: u64 = UFFD_FEATURE_THREAD_ID
    | UFFD_FEATURE_MOVE
    | UFFD_FEATURE_POISON
    | UFFD_FEATURE_EXACT_ADDRESS
    | UFFD_FEATURE_PAGEFAULT_FLAG_WP;

impl Uffd {
    /// Opens a userfaultfd, falling back as the module header says.
    /// `require_full` refuses the user-mode-only fallback (`EPERM`).
    /// `sigbus`: with `UFFD_FEATURE_SIGBUS` (faults raise SIGBUS in the
    /// faulting thread, see `inthread`); `EINVAL` where the kernel lacks it.
    pub fn open(require_full: bool, force_user_mode: bool, sigbus: bool) -> Result<Uffd, Errno> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let mut reason = None;
        let first = if force_user_mode { Err(Errno::EPERM) } else { open_dev(flags) };
        let (fd, mode) = match first {
            Ok(fd) => (fd, UffdMode::Full),
            Err(e1) => match if force_user_mode { Err(Errno::EPERM) } else { syscall_uffd(flags) } {
                Ok(fd) => (fd, UffdMode::Full),
                Err(e2) => {
                    if require_full {
                        return Err(Errno(libc::EPERM));
                    }
                    let fd = syscall_uffd(flags | UFFD_USER_MODE_ONLY)?;
                    reason = Some(format!("/dev/userfaultfd: {e1}; userfaultfd(2): {e2}; using UFFD_USER_MODE_ONLY"));
                    (fd, UffdMode::UserModeOnly)
                }
            },
        };
        // Probe: the first UFFDIO_API with features 0 reports what exists;
        // the handshake can be done only once per fd, so open a second fd
        // for the real one.
        let avail = api(&fd, 0)?;
        let fd2 = match mode {
            UffdMode::Full => open_dev(flags).or_else(|_| syscall_uffd(flags))?,
            UffdMode::UserModeOnly => syscall_uffd(flags | UFFD_USER_MODE_ONLY)?,
        };
        drop(fd);
        let wanted = if sigbus { WANTED_FEATURES | UFFD_FEATURE_SIGBUS } else { WANTED_FEATURES };
        if sigbus && avail & UFFD_FEATURE_SIGBUS == 0 {
            return Err(Errno(libc::EINVAL));
        }
        let features = api(&fd2, avail & wanted)?;
        Ok(Uffd { fd: fd2, mode, features: features & wanted, fallback_reason: reason })
    }

    /// In a forked child: replaces this userfaultfd — which still acts on
    /// the *parent's* memory (an ioctl through it installs, protects or
    /// registers there) — with a new one of the same mode and features,
    /// under the same descriptor number. Nothing is registered with it.
    pub fn replace_in_child(&self) -> Result<(), Errno> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = match self.mode {
            UffdMode::Full => open_dev(flags).or_else(|_| syscall_uffd(flags))?,
            UffdMode::UserModeOnly => syscall_uffd(flags | UFFD_USER_MODE_ONLY)?,
        };
        if api(&fd, self.features)? & self.features != self.features {
            return Err(Errno(libc::EINVAL));
        }
        crate::replace_fd(self.raw(), fd)
    }

    pub fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start+len)` in MISSING mode.
    pub fn register(&self, start: usize, len: usize) -> Result<(), Errno> {
        self.register_mode(start, len, UFFDIO_REGISTER_MODE_MISSING)
    }

    /// Registers `[start, start+len)` with the given `UFFDIO_REGISTER_MODE_*`.
    pub fn register_mode(&self, start: usize, len: usize, mode: u64) -> Result<(), Errno> {
        let mut r = UffdioRegister { range: UffdioRange { start: start as u64, len: len as u64 }, mode, ioctls: 0 };
        self.ioctl(UFFDIO_REGISTER, &mut r as *mut _ as *mut libc::c_void)?;
        Ok(())
    }

    /// Unregisters `[start, start+len)`: every mapping there must be
    /// registered with this userfaultfd or with none (`EINVAL` otherwise).
    /// Threads waiting on a fault there are woken, and fault again.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = UffdioRange { start: start as u64, len: len as u64 };
        self.ioctl(UFFDIO_UNREGISTER, &mut r as *mut _ as *mut libc::c_void)
    }

    fn ioctl(&self, req: u64, arg: *mut libc::c_void) -> Result<(), Errno> {
        // SAFETY: `arg` points to the struct that `req` encodes (sizes are in
        // the request number), valid for reads and writes for the call.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg) }).map(|_| ())
    }

    /// `UFFDIO_COPY`: copies `len` bytes from `src` to the missing pages at
    /// `dst`, waking the waiters. Retries `EAGAIN`. Returns the bytes copied;
    /// `Err(EEXIST)` with a partial count is reported as `Ok(copied)` where
    /// `copied < len`, for the caller to decide.
    ///
    /// # Safety
    /// `src..src+len` must be readable memory of this process.
    pub unsafe fn copy(&self, dst: usize, src: *const u8, len: usize, wake: bool) -> Result<usize, Errno> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.copy_wp(dst, src, len, wake, false) }
    }

    /// `copy`, with the installed pages write-protected when `wp` (mode
    /// `UFFDIO_COPY_MODE_WP`, in a range registered in WP mode): the first
    /// write to one raises a WP fault, resolved by [`Uffd::unprotect`].
    ///
    /// # Safety
    /// As `copy`.
    pub unsafe fn copy_wp(&self, dst: usize, src: *const u8, len: usize, wake: bool, wp: bool) -> Result<usize, Errno> {
        let mode = if wake { 0 } else { UFFDIO_COPY_MODE_DONTWAKE } | if wp { UFFDIO_COPY_MODE_WP } else { 0 };
        let mut done = 0usize;
        let mut tries = 0;
        let mut piece = Piece::new(len);
        while done < len {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                // SAFETY: done < len, so the pointer stays inside the caller's buffer.
                src: unsafe { src.add(done) } as u64,
                len: piece.len(len - done) as u64,
                mode,
                copy: 0,
            };
            let r = self.ioctl(UFFDIO_COPY, &mut c as *mut _ as *mut libc::c_void);
            if c.copy > 0 {
                done += c.copy as usize;
            }
            match r {
                Ok(()) if piece.whole => return Ok(len),
                Ok(()) => done += piece.unreported(c.copy),
                Err(Errno(libc::EAGAIN)) if again(&mut tries) => continue,
                Err(Errno(libc::EEXIST)) => return Ok(done),
                Err(e) if piece.split(e) => continue,
                Err(e) => {
                    if done > 0 {
                        return Ok(done);
                    }
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// `UFFDIO_MOVE`: moves the pages at `src` to the missing `dst`. Returns
    /// the bytes moved (a prefix).
    ///
    /// # Safety
    /// The pages leave `src` and appear at `dst`: no Rust reference may
    /// point into either range.
    pub unsafe fn mv(&self, dst: usize, src: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        let mut done = 0usize;
        let mut tries = 0;
        let mut piece = Piece::new(len);
        while done < len {
            let mut m = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: piece.len(len - done) as u64,
                mode: if wake { 0 } else { UFFDIO_MOVE_MODE_DONTWAKE },
                moved: 0,
            };
            let r = self.ioctl(UFFDIO_MOVE, &mut m as *mut _ as *mut libc::c_void);
            if m.moved > 0 {
                done += m.moved as usize;
            }
            match r {
                Ok(()) if piece.whole => return Ok(len),
                Ok(()) => done += piece.unreported(m.moved),
                Err(Errno(libc::EAGAIN)) if again(&mut tries) => continue,
                Err(e) if piece.split(e) => continue,
                Err(e) => {
                    if done > 0 {
                        return Ok(done);
                    }
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page on the missing pages of
    /// `[dst, dst+len)`, waking waiters. Returns the bytes mapped (a prefix).
    ///
    /// # Safety
    /// No Rust reference may point into the range (its bytes appear).
    pub unsafe fn zeropage(&self, dst: usize, len: usize, wake: bool) -> Result<usize, Errno> {
        let mut done = 0usize;
        let mut tries = 0;
        let mut piece = Piece::new(len);
        while done < len {
            let mut z = UffdioZeropage {
                range: UffdioRange { start: (dst + done) as u64, len: piece.len(len - done) as u64 },
                mode: if wake {
                    0
                } else {
                    1 /* UFFDIO_ZEROPAGE_MODE_DONTWAKE */
                },
                zeropage: 0,
            };
            let r = self.ioctl(UFFDIO_ZEROPAGE, &mut z as *mut _ as *mut libc::c_void);
            if z.zeropage > 0 {
                done += z.zeropage as usize;
            }
            match r {
                Ok(()) if piece.whole => return Ok(len),
                Ok(()) => done += piece.unreported(z.zeropage),
                Err(Errno(libc::EAGAIN)) if again(&mut tries) => continue,
                Err(e) if piece.split(e) => continue,
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
        }
        Ok(done)
    }

    /// `UFFDIO_WAKE` on a range (any number of VMAs).
    ///
    /// # Safety
    /// The threads woken retry their access: the range must be one whose
    /// pages are settled (installed, or to fault again), as the caller's
    /// core says.
    pub unsafe fn wake(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = UffdioRange { start: start as u64, len: len as u64 };
        self.ioctl(UFFDIO_WAKE, &mut r as *mut _ as *mut libc::c_void)
    }

    /// `UFFDIO_WRITEPROTECT` with mode 0: lifts the write protection of
    /// `[start, start+len)` and wakes the threads waiting on it (their
    /// writes go through on retry).
    ///
    /// # Safety
    /// As `wake`: the pages are settled, as the caller's core says.
    pub unsafe fn unprotect(&self, start: usize, len: usize) -> Result<(), Errno> {
        self.writeprotect(start, len, 0)
    }

    /// `UFFDIO_WRITEPROTECT` with mode WP: write-protects the pages of
    /// `[start, start+len)` that are present; a write there then waits in
    /// a WP fault until the protection is lifted or the mapping replaced.
    pub fn write_protect(&self, start: usize, len: usize) -> Result<(), Errno> {
        self.writeprotect(start, len, 1)
    }

    /// `UFFDIO_WRITEPROTECT` with `mode` (1: protect; 0: lift and wake),
    /// retrying `EAGAIN`.
    fn writeprotect(&self, start: usize, len: usize, mode: u64) -> Result<(), Errno> {
        let mut w = UffdioWriteprotect { range: UffdioRange { start: start as u64, len: len as u64 }, mode };
        let mut tries = 0;
        loop {
            match self.ioctl(UFFDIO_WRITEPROTECT, &mut w as *mut _ as *mut libc::c_void) {
                Err(Errno(libc::EAGAIN)) if again(&mut tries) => continue,
                r => return r,
            }
        }
    }

    /// `UFFDIO_POISON`: installs poison markers (touching raises SIGBUS).
    ///
    /// # Safety
    /// No Rust reference may point into the range: a touch raises SIGBUS.
    pub unsafe fn poison(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut tries = 0;
        loop {
            let mut p =
                UffdioPoison { range: UffdioRange { start: start as u64, len: len as u64 }, mode: 0, updated: 0 };
            match self.ioctl(UFFDIO_POISON, &mut p as *mut _ as *mut libc::c_void) {
                Err(Errno(libc::EAGAIN)) if again(&mut tries) => continue,
                Err(Errno(libc::EEXIST)) => return Ok(()),
                r => return r,
            }
        }
    }

    /// Reads up to `buf.len()` messages without blocking.
    pub fn read_msgs(&self, buf: &mut [UffdMsg]) -> Result<usize, Errno> {
        // SAFETY: `buf` is valid for writes of `buf.len()` messages of 32
        // bytes; the kernel writes whole messages only.
        let r = unsafe {
            libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, std::mem::size_of_val(buf))
        };
        crate::check_isize(r).map(|n| n / std::mem::size_of::<UffdMsg>())
    }
}

/// The environment variable that names a descriptor of `/dev/userfaultfd`
/// inherited from a process that could open it (`usermm run` as root
/// leaves one to the program it starts): a process that cannot open the
/// device itself (a server that dropped to its user, then exec'd) makes
/// its userfaultfds with kernel-mode faults through that one. The device's
/// permission is checked when it is opened, not at `USERFAULTFD_IOC_NEW`.
pub const DEVICE_FD_ENV: &str = "USERMM_UFFD_DEVICE_FD";

/// The inherited device descriptor, if [`DEVICE_FD_ENV`] names one that is
/// `/dev/userfaultfd` (same device number), read once (a forked child uses
/// its parent's answer: no environment lock taken in a fork's child).
fn inherited_dev() -> Option<RawFd> {
    static DEV: std::sync::OnceLock<Option<RawFd>> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| {
        let fd: RawFd = std::env::var(DEVICE_FD_ENV).ok()?.trim().parse().ok()?;
        // SAFETY: `stat` is plain data; fstat/stat fill it or fail.
        let (mut a, mut b): (libc::stat, libc::stat) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: `a` is a valid, writable stat; a bad `fd` is EBADF.
        check(unsafe { libc::fstat(fd, &mut a) }).ok()?;
        // SAFETY: the path is NUL-terminated; `b` is valid and writable.
        check(unsafe { libc::stat(c"/dev/userfaultfd".as_ptr(), &mut b) }).ok()?;
        (a.st_mode & libc::S_IFMT == libc::S_IFCHR && a.st_rdev == b.st_rdev).then_some(fd)
    })
}

fn open_dev(flags: i32) -> Result<OwnedFd, Errno> {
    let path = c"/dev/userfaultfd";
    // SAFETY: `path` is a NUL-terminated string.
    let dev = match check(unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }) {
        // SAFETY: `dev` was just opened and is owned by nobody else.
        Ok(dev) => unsafe { OwnedFd::from_raw_fd(dev) },
        Err(e) => {
            let Some(dev) = inherited_dev() else { return Err(e) };
            // SAFETY: USERFAULTFD_IOC_NEW takes its flags by value; `dev`
            // is the device (checked once by `inherited_dev`).
            let fd = check(unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) })?;
            // SAFETY: the ioctl returned a new descriptor that we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    };
    // SAFETY: USERFAULTFD_IOC_NEW takes its flags by value.
    let fd = check(unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) })?;
    // SAFETY: the ioctl returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `/dev/userfaultfd` as a descriptor that programs this process
/// execs inherit (not close-on-exec), at `min` or above, for
/// [`DEVICE_FD_ENV`]; `Err` when this process cannot open it.
pub fn inheritable_device_fd(min: RawFd) -> Result<RawFd, Errno> {
    // SAFETY: the path is NUL-terminated.
    let dev = check(unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: F_DUPFD makes a new descriptor (without close-on-exec).
    let fd = unsafe { libc::fcntl(dev, libc::F_DUPFD, min) };
    // SAFETY: `dev` is ours, not used again.
    unsafe { libc::close(dev) };
    check(fd)
}

fn syscall_uffd(flags: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: userfaultfd(2) takes its flags by value.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(crate::last_errno());
    }
    // SAFETY: the syscall returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn api(fd: &OwnedFd, features: u64) -> Result<u64, Errno> {
    let mut a = UffdioApi { api: UFFD_API, features, ioctls: 0 };
    // SAFETY: `a` is a valid uffdio_api for UFFDIO_API.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut a as *mut UffdioApi) })?;
    Ok(a.features)
}

/// Waits until `fd` (or `wake_fd`) is readable, at most `timeout_ms`.
/// Returns whether `fd` is readable.
pub fn poll2(fd: RawFd, wake_fd: RawFd, timeout_ms: i32) -> Result<bool, Errno> {
    let mut p = [
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: wake_fd, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `p` is a valid array of two pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 2, timeout_ms) };
    if r < 0 {
        let e = crate::last_errno();
        if e.0 == libc::EINTR {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(p[0].revents & libc::POLLIN != 0)
}

/// Reads what the socket `fd` holds now into `buf`, without waiting
/// (`recv` with `MSG_DONTWAIT`): `Ok(None)` when nothing is there yet (or
/// a signal came first), `Ok(Some(0))` at the end of the stream.
pub fn recv_now(fd: RawFd, buf: &mut [u8]) -> Result<Option<usize>, Errno> {
    // SAFETY: `buf` is valid, writable memory of `buf.len()` bytes.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if r < 0 {
        let e = crate::last_errno();
        if e.0 == libc::EAGAIN || e.0 == libc::EWOULDBLOCK || e.0 == libc::EINTR {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as usize))
}

/// Tries of a resolving ioctl that keeps failing with `EAGAIN` before the
/// call gives up with what it did (a prefix, or `EAGAIN`): the caller's
/// fault is then planned again, or its populate fails with `EAGAIN`, rather
/// than spinning here for as long as the host's state lasts.
pub const EAGAIN_TRIES: u32 = 1000;

/// Counts one more `EAGAIN`; whether to try again (see [`EAGAIN_TRIES`]).
fn again(tries: &mut u32) -> bool {
    *tries += 1;
    *tries <= EAGAIN_TRIES
}

/// How much of a range one resolving ioctl asks for. The whole rest at
/// first; but the host refuses a range that spans two of its VMAs (`ENOENT`,
/// or `EINVAL` for a move), and one usermm region can be two host VMAs (two
/// regions written separately and the gap between them mapped later: the
/// host cannot merge VMAs with different `anon_vma`s). Then the rest goes a
/// page at a time, which stays inside one VMA; an error on a single page is
/// the caller's.
struct Piece {
    whole: bool,
}

/// The smallest page size a host VMA boundary can fall on.
const MIN_PAGE: usize = 4096;

impl Piece {
    fn new(len: usize) -> Piece {
        Piece { whole: len > MIN_PAGE }
    }
    fn len(&self, rest: usize) -> usize {
        if self.whole {
            rest
        } else {
            rest.min(MIN_PAGE)
        }
    }
    /// After a success of a single page: what the ioctl did that its count
    /// field (`copy`/`moved`/`zeropage`, added by the caller when positive)
    /// did not say. Never 0, so the loop always goes on.
    fn unreported(&self, counted: i64) -> usize {
        if counted > 0 {
            0
        } else {
            MIN_PAGE
        }
    }
    /// Whether `e` on a multi-page piece is a VMA boundary to go around.
    fn split(&mut self, e: Errno) -> bool {
        if self.whole && (e == Errno(libc::ENOENT) || e == Errno(libc::EINVAL)) {
            self.whole = false;
            return true;
        }
        false
    }
}
