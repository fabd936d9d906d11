//! What runs when a process ends: an `atexit` hook, and a process of its
//! own that outlives this one to clean up after it (a page store's keys).

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

/// Runs `f` in a process of its own once this process has ended: the
/// clean-up of what must outlive every access of this process (a page
/// store's keys, which a thread may still read while the process exits).
///
/// A double fork: the child forks the process that waits and exits at once
/// (reaped here), so the waiter is nobody's child to wait for; it leaves
/// the session and process group (a signal to the group does not reach
/// it), has `/dev/null` as stdin, stdout and stderr and no other inherited
/// descriptor (a pipe the caller's parent reads to its end is not held
/// open), waits on a pidfd of this process until the whole process is gone,
/// then runs `f` with a 60 s alarm and exits.
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
pub fn run_after_exit(f: impl FnOnce()) -> Result<(), Errno> {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    // SAFETY: pidfd_open takes a pid and flags by value; the result is a
    // new descriptor (close-on-exec) or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, me, 0) } as libc::c_int;
    if pidfd < 0 {
        return Err(crate::last_errno());
    }
    // SAFETY: fork has no preconditions; the child below only forks, makes
    // system calls and runs `f`, as documented.
    let child = unsafe { libc::fork() };
    if child < 0 {
        let e = crate::last_errno();
        // SAFETY: our own descriptor.
        unsafe { libc::close(pidfd) };
        return Err(e);
    }
    if child == 0 {
        // SAFETY: fork has no preconditions. The child exits at once
        // (`_exit`: no atexit handler, no stdio flush of the copy).
        let grandchild = unsafe { libc::fork() };
        if grandchild != 0 {
            // SAFETY: _exit ends the process.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: the waiter's set-up, system calls on its own descriptors
        // and signal dispositions; `pidfd` is open here (inherited).
        let gone = unsafe {
            libc::setsid();
            let keep = libc::fcntl(pidfd, libc::F_DUPFD_CLOEXEC, 3);
            if keep < 0 {
                libc::_exit(1);
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            for fd in 0..3 {
                if null >= 0 {
                    libc::dup2(null, fd);
                } else {
                    libc::close(fd);
                }
            }
            if keep != 3 {
                libc::dup2(keep, 3);
            }
            if libc::close_range(4, u32::MAX, 0) != 0 {
                for fd in 4..4096 {
                    libc::close(fd);
                }
            }
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGALRM, libc::SIG_DFL);
            let mut p = libc::pollfd { fd: 3, events: libc::POLLIN, revents: 0 };
            while libc::poll(&mut p, 1, -1) < 0 && *libc::__errno_location() == libc::EINTR {}
            libc::close(3);
            libc::alarm(60);
            // (Anything but "exited" or "reaped" — an error, an invalid descriptor —
            // says nothing about the process: `f` does not run.)
            p.revents & (libc::POLLIN | libc::POLLHUP) != 0
        };
        if gone {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        // SAFETY: _exit ends the process without running this copy's
        // atexit handlers.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: our own descriptor; the child exits at once.
    unsafe {
        libc::close(pidfd);
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
    }
    Ok(())
}
