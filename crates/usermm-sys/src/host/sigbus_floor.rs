//! [`SigbusFloorMap`]: what a fault resolved in the faulting thread costs
//! before any memory manager's work — the floor under usermm's
//! `UMM_F_INTHREAD_FAULTS` faults, measured beside them (`usermm bench
//! fault`).
//!
//! An anonymous private mapping registered (missing pages only) with a
//! userfaultfd of its own that has `UFFD_FEATURE_SIGBUS`, and with usermm's
//! own SIGBUS handler ([`crate::inthread`]), whose resolver does one ioctl
//! and nothing else: `UFFDIO_ZEROPAGE` for a read, `UFFDIO_COPY` of a zero
//! page for a write — the installs usermm makes for a first touch. So a
//! touch costs the fault, the signal's delivery and return, the handler's
//! table lookup and that ioctl: no plan, no commit, no lock, no budget.

use std::sync::Arc;

use crate::host::HostMap;
use crate::inthread::{Outcome, Registration, Resolve};
use crate::uffd::{Uffd, UFFDIO_REGISTER_MODE_MISSING};
use crate::Errno;

/// A page of zeros to copy from (`UFFDIO_COPY` wants its source
/// page-aligned).
#[repr(C, align(4096))]
struct ZeroPage([u8; 4096]);
static ZERO: ZeroPage = ZeroPage([0; 4096]);

/// The resolver: one install per fault.
struct Floor {
    uffd: Uffd,
    start: usize,
    end: usize,
}

impl Resolve for Floor {
    fn resolve(&self, addr: usize, write: bool, _wp: bool) -> Outcome {
        let page = addr & !4095;
        if page < self.start || page + 4096 > self.end {
            return Outcome::ProgramsSigbus;
        }
        let r = if write {
            // SAFETY: `page` is a page of this map's registered range
            // (checked above), which the map owns; ZERO is a readable,
            // page-aligned page of this library's.
            unsafe { self.uffd.copy(page, ZERO.0.as_ptr(), 4096, true) }
        } else {
            // SAFETY: as above.
            unsafe { self.uffd.zeropage(page, 4096, true) }
        };
        match r {
            // (`EEXIST`: another thread installed it first.)
            Ok(_) | Err(Errno::EEXIST) => Outcome::Retry,
            Err(e) => Outcome::TransientSigbus { errno: e.0 },
        }
    }
}

/// A mapping whose faults are resolved in the faulting thread with one
/// ioctl each (see the module). Derefs to its bytes (a first touch of each
/// page is such a fault); unregistered and unmapped on drop.
pub struct SigbusFloorMap {
    /// Declared first: dropped (unregistered from the handler's table)
    /// before the mapping goes.
    reg: Option<Registration>,
    map: HostMap,
}

impl SigbusFloorMap {
    /// Maps `len` bytes (`len > 0`, `MAP_NORESERVE`) and registers them
    /// (with a user-mode-only userfaultfd where that is all this process
    /// may have, as a space falls back). `EINVAL`: the kernel has no
    /// `UFFD_FEATURE_SIGBUS`; `EPERM`: no userfaultfd at all; `ENOSPC`: the
    /// SIGBUS handler's table is full (`inthread::MAX_SPACES`).
    pub fn new(len: usize) -> Result<SigbusFloorMap, Errno> {
        let map = HostMap::anon(len, libc::MAP_NORESERVE)?;
        let uffd = Uffd::open(false, false, true)?;
        uffd.register_mode(map.addr(), map.len(), UFFDIO_REGISTER_MODE_MISSING)?;
        let floor = Floor { uffd, start: map.addr(), end: map.addr() + map.len() };
        let reg = crate::inthread::register(floor.start, floor.end, Arc::new(floor))?;
        Ok(SigbusFloorMap { reg: Some(reg), map })
    }

    /// Advice on the whole mapping (e.g. `MADV_RANDOM`, as the kernel row
    /// gets).
    pub fn madvise(&mut self, advice: i32) -> Result<(), Errno> {
        self.map.madvise(advice)
    }
}

impl std::ops::Deref for SigbusFloorMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl std::ops::DerefMut for SigbusFloorMap {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

impl Drop for SigbusFloorMap {
    fn drop(&mut self) {
        // Out of the handler's table (after every thread inside the
        // resolver has left) before the mapping, and with it the
        // userfaultfd's registration, goes.
        drop(self.reg.take());
    }
}
