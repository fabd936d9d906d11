//! Shared helpers of the native integration tests: checksummed page contents.
//!
//! A written page holds a header (page id, version) and a body derived from
//! both by a cheap hash, so that wrong data, stale data (an older version)
//! and zeros where data was are all detected. Version 0 means "never written
//! since the last map / DONTNEED": the page must read as zeros.

#![allow(dead_code)]

/// splitmix64's finaliser: a cheap, well-mixed hash of a word.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The expected word `i` (0-based, in 8-byte units) of page `id` at
/// `version`; words 0 and 1 are the header.
pub fn word(id: u64, version: u64, i: usize) -> u64 {
    match i {
        0 => id,
        1 => version,
        _ => {
            if version == 0 {
                0
            } else {
                mix(id.rotate_left(17) ^ version.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (i as u64))
            }
        }
    }
}

/// Fills one page (`page.len()` a multiple of 8) with the contents of
/// (`id`, `version`). `version` must not be 0.
pub fn fill_page(page: &mut [u8], id: u64, version: u64) {
    debug_assert!(version != 0);
    for (i, w) in page.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(id, version, i).to_le_bytes());
    }
}

/// Counts the bytes of `page` that differ from (`id`, `version`); version 0
/// expects an all-zero page.
pub fn bad_bytes(page: &[u8], id: u64, version: u64) -> usize {
    let mut bad = 0;
    for (i, w) in page.chunks_exact(8).enumerate() {
        let got = u64::from_le_bytes(w.try_into().unwrap());
        let want = if version == 0 { 0 } else { word(id, version, i) };
        if got != want {
            bad += (got ^ want).to_le_bytes().iter().filter(|&&b| b != 0).count();
        }
    }
    bad
}

#[allow(unused_imports)] // (not every test that includes this module draws numbers)
pub use usermm_core::rng::Rng;
