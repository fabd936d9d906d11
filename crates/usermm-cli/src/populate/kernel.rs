//! The kernel side of `populate`: one measurement on a host mapping
//! (anonymous or of the test file).

use usermm::consts::MAP_POPULATE;
use usermm_sys::host::{HostFileMap, HostMap};
use usermm_sys::now_ns;

use super::file::TestFile;
use super::touch::{prefault, verify};
use super::MapKind;
use crate::common::PAGE;

/// A kernel mapping of either kind.
enum KernelMap {
    Anon(HostMap),
    File(HostFileMap),
}

impl KernelMap {
    fn addr(&self) -> usize {
        match self {
            KernelMap::Anon(m) => m.addr(),
            KernelMap::File(m) => m.addr(),
        }
    }
    fn madvise(&mut self, advice: i32) -> Result<(), usermm::Errno> {
        match self {
            KernelMap::Anon(m) => m.madvise(advice),
            KernelMap::File(m) => m.madvise(advice),
        }
    }
    fn unmap(self) -> Result<(), usermm::Errno> {
        match self {
            KernelMap::Anon(m) => m.unmap(),
            KernelMap::File(m) => m.unmap(),
        }
    }
}

/// One measurement: `(ns, pages read back wrong)`.
pub(super) fn kernel_one(
    size: usize,
    kind: MapKind,
    method: &str,
    file: Option<&TestFile>,
) -> Result<(u64, usize), String> {
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let m = match (kind, file) {
        (MapKind::Private, _) => HostMap::anon(size, extra).map(KernelMap::Anon),
        (MapKind::Shared, _) => HostMap::shared_anon(size, extra).map(KernelMap::Anon),
        (_, Some(f)) => HostFileMap::open_rw(&f.file, size, kind.shared(), extra).map(KernelMap::File),
        (_, None) => return Err("populate: a file kind without its test file".into()),
    };
    let mut m = m.map_err(|e| format!("kernel mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let addr = m.addr();
    let ns = prefault(method, map_ns, addr, pages, kind, |adv| {
        m.madvise(adv).map_err(|e| format!("kernel madvise({adv}): {e:?}"))
    })?;
    let bad = verify(m.addr(), pages, method, kind);
    m.unmap().map_err(|e| format!("kernel munmap: {e:?}"))?;
    Ok((ns, bad))
}
