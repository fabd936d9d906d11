//! The usermm side of `populate`: one measurement in a fresh space whose
//! budget holds the region (no swap; `UMM_F_KEEP_FILE_CACHE` for the file
//! kinds), with no usermm fault allowed after a prefault method.

use std::os::fd::AsRawFd;

use usermm::consts::{
    MAP_ANONYMOUS, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE, UMM_F_KEEP_FILE_CACHE,
};
use usermm::{Config, Space};
use usermm_sys::now_ns;

use super::file::TestFile;
use super::touch::{prefault, verify};
use super::MapKind;
use crate::common::{MIB, PAGE};

/// One measurement: `(ns, pages read back wrong or faulted in after a
/// prefault)`.
pub(super) fn usermm_one(
    size: usize,
    kind: MapKind,
    method: &str,
    file: Option<&TestFile>,
) -> Result<(u64, usize), String> {
    let cfg = Config {
        budget_bytes: size + 64 * MIB,
        swap_bytes: 0,
        flags: if kind.file() { UMM_F_KEEP_FILE_CACHE } else { 0 },
        ..Config::default()
    };
    let (fd, anon) = match (kind.file(), file) {
        (false, _) => (-1, MAP_ANONYMOUS),
        (true, Some(f)) => (f.file.as_raw_fd(), 0),
        (true, None) => return Err("populate: a file kind without its test file".into()),
    };
    let space = Space::open(&cfg).map_err(|e| format!("usermm open: {e:?}"))?;
    let share = if kind.shared() { MAP_SHARED } else { MAP_PRIVATE };
    let extra = if method == "map-populate" { MAP_POPULATE } else { 0 };
    let t0 = now_ns();
    let a = space
        .mmap(0, size, PROT_READ | PROT_WRITE, share | anon | extra, fd, 0)
        .map_err(|e| format!("usermm mmap: {e:?}"))?;
    let map_ns = now_ns() - t0;
    let pages = size / PAGE;
    let ns = prefault(method, map_ns, a, pages, kind, |adv| {
        space.madvise(a, size, adv).map_err(|e| format!("usermm madvise({adv}): {e:?}"))
    })?;
    let faults = space.stats().faults;
    let mut bad = verify(a, pages, method, kind);
    if (method.starts_with("populate") || method == "map-populate") && space.stats().faults != faults {
        // A prefault that left pages to fault in afterwards did not prefault.
        bad += (space.stats().faults - faults) as usize;
    }
    // Untimed: a shared file region is written back here.
    space.munmap(a, size).map_err(|e| format!("usermm munmap: {e:?}"))?;
    space.close().map_err(|e| format!("usermm close: {e:?}"))?;
    Ok((ns, bad))
}
