//! The prefaults of `populate`, the same for both systems: the byte every
//! page holds before and after each method, the timed touch loops, the
//! `madvise` and `MAP_POPULATE` methods, and the untimed verification.

use usermm::consts::{MADV_POPULATE_READ, MADV_POPULATE_WRITE, MADV_RANDOM};
use usermm_sys::kernel::{peek, poke};
use usermm_sys::now_ns;

use super::{loop_of, MapKind, ONE_BY_ONE};
use crate::common::PAGE;

/// The byte the test file holds in every byte of page `p` (never 0, so that
/// a page read from anywhere but the file reads back wrong).
#[inline(always)]
pub(super) fn pattern(p: usize) -> u8 {
    (p % 251) as u8 + 1
}

/// The byte `write` stores into page `p`: 1 for anonymous memory; for a
/// shared file the page's own pattern byte (the file keeps its content, so
/// every run maps the same file); for a private file the pattern's
/// complement (only the private copy changes: the verification proves the
/// copy was made and the file was not written).
#[inline(always)]
fn stored(kind: MapKind, p: usize) -> u8 {
    match kind {
        MapKind::Private | MapKind::Shared => 1,
        MapKind::FileShared => pattern(p),
        MapKind::FilePrivate => !pattern(p),
    }
}

/// The byte every page's first byte holds after `method` (fresh anonymous
/// memory is 0, a file page its pattern; only `write` stores something
/// else).
fn expected(kind: MapKind, method: &str, p: usize) -> u8 {
    match (kind.file(), method == "write") {
        (_, true) => stored(kind, p),
        (false, false) => 0,
        (true, false) => pattern(p),
    }
}

/// The timed loop over `pages` pages at `addr` (never a Rust reference).
fn touch_loop(addr: usize, pages: usize, method: &str, kind: MapKind) {
    match method {
        "read" => {
            let mut sum = 0u8;
            for p in 0..pages {
                sum = sum.wrapping_add(peek(addr + p * PAGE));
            }
            std::hint::black_box(sum);
        }
        "write" => match kind {
            MapKind::Private | MapKind::Shared => {
                for p in 0..pages {
                    poke(addr + p * PAGE, 1);
                }
            }
            _ => {
                for p in 0..pages {
                    poke(addr + p * PAGE, stored(kind, p));
                }
            }
        },
        _ => {
            for p in 0..pages {
                let a = addr + p * PAGE;
                poke(a, peek(a));
            }
        }
    }
}

/// Pages whose first byte is not what `method` leaves (untimed).
pub(super) fn verify(addr: usize, pages: usize, method: &str, kind: MapKind) -> usize {
    (0..pages).filter(|&p| peek(addr + p * PAGE) != expected(kind, loop_of(method), p)).count()
}

fn advice(method: &str) -> i32 {
    if method == "populate-read" {
        MADV_POPULATE_READ
    } else {
        MADV_POPULATE_WRITE
    }
}

/// Times `method`'s prefault of the `pages` pages at `addr` (ns); `advise`
/// is the system's `madvise` over the region. `map-populate` is the mmap
/// itself (`map_ns`); `write-1by1` advises `MADV_RANDOM` first, untimed.
pub(super) fn prefault(
    method: &str,
    map_ns: u64,
    addr: usize,
    pages: usize,
    kind: MapKind,
    mut advise: impl FnMut(i32) -> Result<(), String>,
) -> Result<u64, String> {
    Ok(match method {
        "map-populate" => map_ns,
        "populate-read" | "populate-write" => {
            let t = now_ns();
            advise(advice(method))?;
            now_ns() - t
        }
        _ => {
            if method == ONE_BY_ONE {
                advise(MADV_RANDOM)?;
            }
            let t = now_ns();
            touch_loop(addr, pages, loop_of(method), kind);
            now_ns() - t
        }
    })
}
