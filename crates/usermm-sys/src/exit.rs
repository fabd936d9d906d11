//! What runs when a process ends: an `atexit` hook, and a process of its
//! own that outlives this one to clean up after it (a page store's keys).

use std::os::fd::RawFd;

use crate::Errno;

/// Registers `f` to run at the process's normal exit (`atexit(3)`: `exit`,
/// or a return from `main`; not `_exit`, a fatal signal or `SIGKILL`).
pub fn at_exit(f: extern "C" fn()) -> Result<(), Errno> {
    // SAFETY: `f` is a function of C ABI that lives as long as the program
    // (a function item, not a closure); atexit only stores it.
    if unsafe { libc::atexit(f) } != 0 {
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// Runs `f` in a process of its own once this process has ended (if
/// `exit`) and every descriptor of `ties` reads end-of-file or hangs up
/// (the read ends of pipes whose write ends other processes hold: a forked
/// child's `thread::ChildTie`): the clean-up of what must outlive every
/// access of this process and of those (a page store's keys, which a
/// thread may still read while the process exits, and which a forked child
/// reads in place).
///
/// A double fork, quiet (`thread::fork_quietly`: no space is copied): the
/// child forks the process that waits and exits at once (reaped here), so
/// the waiter is nobody's child to wait for; it leaves the session and
/// process group (a signal to the group does not reach it), has
/// `/dev/null` as stdin, stdout and stderr and no other inherited
/// descriptor than those it waits on (a pipe the caller's parent reads to
/// its end is not held open), waits on a pidfd of this process until the
/// whole process is gone, then on `ties`, then runs `f` with a 60 s alarm
/// and exits.
///
/// `f` runs in a forked copy of one thread of a process that may have had
/// others: it must not take a lock that another thread could have held at
/// the fork, nor touch memory that is not inherited (a space's reservation,
/// `MADV_DONTFORK`). Err if no pidfd or no process could be had (nothing
/// then runs `f`).
///
/// # Why?
/// A pidfd becomes readable when the process (every thread) has exited,
/// which a pipe's end of file or `PR_SET_PDEATHSIG` do not say: a pipe's
/// write end may be held by a child forked without `exec`, and the death
/// signal follows a thread, not the process.
pub fn run_after(exit: bool, ties: &[RawFd], f: impl FnOnce()) -> Result<(), Errno> {
    // The descriptors the waiter keeps, in order from 3: the pidfd (if
    // `exit`), then the ties.
    let mut keep: Vec<RawFd> = Vec::with_capacity(ties.len() + 1);
    if exit {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        // SAFETY: pidfd_open takes a pid and flags by value; the result is
        // a new descriptor (close-on-exec) or -1.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, me, 0) } as RawFd;
        if pidfd < 0 {
            return Err(crate::last_errno());
        }
        keep.push(pidfd);
    }
    let n_own = keep.len();
    keep.extend_from_slice(ties);
    // (Where the waiter moves them first; allocated here: a forked child
    // of a threaded process must not allocate.)
    let mut high: Vec<RawFd> = vec![0; keep.len()];
    let close_own = |keep: &[RawFd]| {
        for &fd in &keep[..n_own] {
            // SAFETY: our own descriptor (the pidfd).
            unsafe { libc::close(fd) };
        }
    };
    // SAFETY: fork has no preconditions; the child below only forks, makes
    // system calls and runs `f`, as documented.
    let child = crate::thread::fork_quietly(|| unsafe { libc::fork() });
    if child < 0 {
        let e = crate::last_errno();
        close_own(&keep);
        return Err(e);
    }
    if child == 0 {
        // SAFETY: fork has no preconditions. The child exits at once
        // (`_exit`: no atexit handler, no stdio flush of the copy).
        let grandchild = crate::thread::fork_quietly(|| unsafe { libc::fork() });
        if grandchild != 0 {
            // SAFETY: _exit ends the process.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: the waiter's set-up, system calls on its own descriptors
        // (inherited: `keep`) and signal dispositions; `keep` was allocated
        // before the fork and is only read.
        let gone = unsafe {
            libc::setsid();
            // Out of the way first (above 3..3+n, where they go next; not
            // far above: `F_DUPFD` past `RLIMIT_NOFILE`, often 1,024, is
            // `EINVAL`), then to 3, 4, ….
            let n = keep.len();
            for (h, &fd) in high.iter_mut().zip(&keep) {
                *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3 + n as RawFd);
                if *h < 0 {
                    libc::_exit(1);
                }
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            for fd in 0..3 {
                if null >= 0 {
                    libc::dup2(null, fd);
                } else {
                    libc::close(fd);
                }
            }
            for (i, &h) in high.iter().enumerate() {
                libc::dup2(h, 3 + i as RawFd);
            }
            let end = 3 + n as u32;
            if libc::close_range(end, u32::MAX, 0) != 0 {
                for fd in end as RawFd..4096 {
                    libc::close(fd);
                }
            }
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGALRM, libc::SIG_DFL);
            // (Anything but "exited", "reaped" or "hung up" — an error, an
            // invalid descriptor — says nothing: `f` does not run.)
            let mut all = true;
            for fd in 3..end as RawFd {
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                while libc::poll(&mut p, 1, -1) < 0 && *libc::__errno_location() == libc::EINTR {}
                all &= p.revents & (libc::POLLIN | libc::POLLHUP) != 0;
                libc::close(fd);
            }
            libc::alarm(60);
            all
        };
        if gone {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        // SAFETY: _exit ends the process without running this copy's
        // atexit handlers.
        unsafe { libc::_exit(0) };
    }
    close_own(&keep);
    // SAFETY: the child exits at once.
    unsafe {
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
    }
    Ok(())
}
