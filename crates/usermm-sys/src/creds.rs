//! A thread's own credentials: what the kernel keeps per thread and the C
//! library's `set*id` broadcast does not carry from one thread to another
//! (capabilities, securebits with keep-caps).
//!
//! # Why?
//! glibc's `setuid`, `setresgid`, `setgroups`, … make the system call in
//! every thread it started (SIGSETXID), and abort the process when one
//! thread fails where the caller succeeded. `capset` and
//! `prctl(PR_SET_KEEPCAPS)` change only the calling thread, so a program
//! that drops privileges the usual way (keep caps, `setresuid`, `capset`,
//! `setresgid`) needs every other thread, usermm's included, to carry the
//! same capabilities at each step. usermm compares the caller's
//! [`ThreadCreds`] with its threads' and, when they differ, starts its
//! threads again from the caller (a new thread inherits its creator's
//! credentials whole).

use crate::{check, Errno};

/// `_LINUX_CAPABILITY_VERSION_3` (`linux/capability.h`): two 32-bit words
/// of each set.
const CAP_V3: u32 = 0x2008_0522;

/// The calling thread's per-thread credentials: effective, permitted and
/// inheritable capabilities (two words each), then the securebits
/// (`PR_GET_SECUREBITS`, keep-caps among them) and `PR_GET_KEEPCAPS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCreds(pub [u32; 8]);

impl ThreadCreds {
    /// The calling thread's.
    pub fn current() -> Result<ThreadCreds, Errno> {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut h = Header { version: CAP_V3, pid: 0 };
        let mut d = [Data::default(); 2];
        // SAFETY: `h` is a v3 header for the calling thread (pid 0) and `d`
        // the two data structs v3 writes.
        check(unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) } as i32)?;
        // (Raw system calls: a preload library that exports `prctl`, as
        // `usermm run`'s does, must not see usermm's own.)
        // SAFETY: these prctl options take no pointer.
        let secure = check(unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_SECUREBITS, 0, 0, 0, 0) } as i32)?;
        // SAFETY: as above.
        let keep = check(unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_KEEPCAPS, 0, 0, 0, 0) } as i32)?;
        Ok(ThreadCreds([
            d[0].effective,
            d[1].effective,
            d[0].permitted,
            d[1].permitted,
            d[0].inheritable,
            d[1].inheritable,
            secure as u32,
            keep as u32,
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_thread_has_its_creators_and_keep_caps_is_the_threads_own() {
        let before = ThreadCreds::current().unwrap();
        let other = std::thread::spawn(|| ThreadCreds::current().unwrap()).join().unwrap();
        assert_eq!(before, other);
        // keep-caps changes on this thread only.
        let was = before.0[7];
        // SAFETY: PR_SET_KEEPCAPS takes a flag by value.
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1 - was as libc::c_ulong, 0, 0, 0) }, 0);
        let changed = ThreadCreds::current().unwrap();
        assert_ne!(changed, before);
        let other = std::thread::spawn(|| ThreadCreds::current().unwrap()).join().unwrap();
        assert_eq!(other, changed, "a new thread inherits its creator's");
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, was as libc::c_ulong, 0, 0, 0) };
    }
}
