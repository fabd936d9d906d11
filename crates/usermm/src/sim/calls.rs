//! The program's calls in the simulation: each picks its arguments from the
//! seed, makes the call on the executor and updates (and checks) the model.

use usermm_core::consts::*;
use usermm_core::region::LockMode;
use usermm_core::Errno;

use super::host::page_of;
use super::{files, Model, Sim, PS};

impl Sim {
    /// `mmap` with `MAP_FIXED` of a random range: private or shared
    /// anonymous, or shared of a new file of the range's size. The file
    /// pages it replaces must be in their files once it returns.
    pub(super) fn op_mmap(&mut self) {
        let (s, l) = self.random_range();
        let prot = [PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE][self.rng.below(4) as usize];
        let kind = self.rng.below(8);
        let (shared, file) = (kind < 2, kind == 2);
        let replaced = self.file_pages(s, l);
        let r = if file {
            self.next_object += 1;
            let f = files::temp_file(self.next_object, l);
            use std::os::fd::AsRawFd;
            self.log.push(format!("mmap p{s}+{l} prot {prot} shared file {}", self.next_object));
            let r = self.inner.mmap(Self::addr(s), l * PS, prot, MAP_FIXED | MAP_SHARED, f.as_raw_fd(), 0);
            self.files.insert(self.next_object, f);
            r
        } else {
            let flags = MAP_FIXED | MAP_ANONYMOUS | if shared { MAP_SHARED } else { MAP_PRIVATE };
            self.log.push(format!("mmap p{s}+{l} prot {prot} shared {shared}"));
            self.inner.mmap(Self::addr(s), l * PS, prot, flags, -1, 0)
        };
        assert_eq!(r, Ok(Self::addr(s)), "mmap");
        self.check_files(&replaced, "replaced by mmap");
        let object = if shared || file {
            if shared {
                self.next_object += 1;
            }
            self.next_object
        } else {
            0
        };
        for q in s..s + l {
            let mut m = Model::new(prot, object);
            if file {
                m.file = Some((object, (q - s) as u64));
            }
            self.model[q] = Some(m);
        }
    }

    /// `munmap` of a random range.
    pub(super) fn op_munmap(&mut self) {
        let (s, l) = self.random_range();
        self.log.push(format!("munmap p{s}+{l}"));
        let leaving = self.file_pages(s, l);
        assert_eq!(self.inner.munmap(Self::addr(s), l * PS), Ok(()), "munmap");
        self.check_files(&leaving, "unmapped");
        for q in s..s + l {
            self.model[q] = None;
        }
    }

    /// `mprotect` of a random range: the mapped prefix changes (Linux), a hole is `ENOMEM`.
    pub(super) fn op_mprotect(&mut self) {
        let (s, l) = self.random_range();
        let prot = [PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE][self.rng.below(3) as usize];
        self.log.push(format!("mprotect p{s}+{l} prot {prot}"));
        let r = self.inner.mprotect(Self::addr(s), l * PS, prot);
        let mut hole = false;
        for q in s..s + l {
            match &mut self.model[q] {
                Some(m) if !hole => m.prot = prot,
                Some(_) => {}
                None => hole = true,
            }
        }
        assert_eq!(r, if hole { Err(Errno::ENOMEM) } else { Ok(()) }, "mprotect");
    }

    /// `madvise` with a random advice; the model follows DONTNEED and FREE.
    pub(super) fn op_madvise(&mut self) {
        let (s, l) = self.random_range();
        let advice = [
            MADV_DONTNEED,
            MADV_COLD,
            MADV_PAGEOUT,
            MADV_WILLNEED,
            MADV_POPULATE_READ,
            MADV_POPULATE_WRITE,
            MADV_NORMAL,
            MADV_SEQUENTIAL,
            MADV_FREE,
            MADV_FREE,
        ][self.rng.below(10) as usize];
        if ![MADV_DONTNEED, MADV_FREE].contains(&advice) {
            // Advice that changes no byte: the second thread may touch the
            // range meanwhile.
            self.set_busy(0, 0);
        }
        self.log.push(format!("madvise p{s}+{l} advice {advice}"));
        let r = self.inner.madvise(Self::addr(s), l * PS, advice);
        // Errors follow Linux's rules, which the core's own
        // simulation checks; here: the bytes.
        if advice == MADV_DONTNEED {
            let mut stop = false;
            for q in s..s + l {
                if let Some(m) = &mut self.model[q] {
                    if m.locked {
                        stop = true;
                    }
                    if !stop && m.object == 0 {
                        m.stamp = 0;
                        m.lazy = false;
                        m.volatile = false;
                        m.purged = false;
                    }
                }
            }
            if !stop && (s..s + l).all(|q| self.model[q].is_some()) {
                assert_eq!(r, Ok(()), "madvise(DONTNEED)");
            }
        }
        if advice == MADV_FREE {
            // Linux: only private anonymous memory, never locked;
            // the walk stops with EINVAL at any other mapping.
            for q in s..s + l {
                if let Some(m) = &mut self.model[q] {
                    if m.locked || m.object != 0 {
                        break;
                    }
                    m.lazy = true;
                }
            }
        }
    }

    /// `mlock2(MLOCK_ONFAULT)` or `munlock` of a random range.
    pub(super) fn op_lock(&mut self) {
        let (s, l) = self.random_range();
        let lock = self.rng.one_in(2);
        if lock && (s..s + l).any(|q| self.model[q].is_some_and(|m| m.volatile)) {
            // EINVAL (SPEC): the core's tests check that.
            return;
        }
        self.log.push(format!("{} p{s}+{l}", if lock { "mlock2(ONFAULT)" } else { "munlock" }));
        // The second thread may touch the range meanwhile: a page it
        // touches is locked at the end either way (Linux sets the flag
        // before it walks the present pages).
        self.set_busy(0, 0);
        let mode = if lock { LockMode::OnFault } else { LockMode::None };
        let (a, n) = (Self::addr(s) as u64, (l * PS) as u64);
        // (Whether each page is in memory when the call is made: a
        // lock pins it.)
        let present: Vec<bool> = (s..s + l).map(|q| self.inner.page_state(Self::addr(q)).holds_frame()).collect();
        let r = self.inner.lock_call(|c| c.lock_range(a, n, mode));
        let mut hole = false;
        for q in s..s + l {
            let present = present[q - s];
            match &mut self.model[q] {
                Some(m) if !hole => {
                    m.locked = lock;
                    m.pinned = lock && (m.pinned || present);
                }
                Some(_) => {}
                None => hole = true,
            }
        }
        if !hole {
            assert_eq!(r, Ok(()), "mlock2/munlock");
        }
    }

    /// `mvolatile` over a run of mapped private pages (its errors are the
    /// core's to check).
    pub(super) fn op_mvolatile(&mut self) {
        let (s, l) = self.random_range();
        if !(s..s + l).all(|q| self.model[q].is_some_and(|m| m.object == 0 && !m.locked)) {
            return;
        }
        self.log.push(format!("mvolatile p{s}+{l}"));
        assert_eq!(self.inner.mvolatile(Self::addr(s), l * PS), Ok(()), "mvolatile");
        for q in s..s + l {
            self.model[q].as_mut().unwrap().volatile = true;
        }
    }

    /// `mnovolatile`: its purge report is exact — every page seen purged is
    /// in it, and a page in it reads zeros from now on (one not in it keeps
    /// its bytes, which later reads check).
    pub(super) fn op_mnovolatile(&mut self) {
        let (s, l) = self.random_range();
        if !(s..s + l).all(|q| self.model[q].is_some()) {
            return;
        }
        self.log.push(format!("mnovolatile p{s}+{l}"));
        let (purged, r) = self.inner.mnovolatile(Self::addr(s), l * PS).expect("mnovolatile");
        assert_eq!(r, Ok(()), "mnovolatile");
        let purged: Vec<usize> = purged.iter().map(|&a| page_of(a)).collect();
        for q in s..s + l {
            let m = self.model[q].as_mut().unwrap();
            let in_report = purged.contains(&q);
            assert!(!m.purged || in_report, "p{q}: seen purged, not in the purge report {purged:?}");
            assert!(m.volatile || !in_report, "p{q}: reported purged, but it was not volatile");
            if in_report {
                m.stamp = 0;
            }
            m.volatile = false;
            m.purged = false;
            if in_report {
                m.lazy = false;
            }
        }
        self.log.push(format!("  purged {purged:?}"));
    }
}
