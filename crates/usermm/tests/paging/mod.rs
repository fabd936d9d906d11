//! Helpers of the swap tests (`swap_errors.rs`, `farmem.rs`): whole
//! mappings filled and checked with `pattern`'s checksummed pages, page
//! states, and paging a mapping out.

#![allow(dead_code)]

use std::time::Duration;

use usermm::consts::{MADV_PAGEOUT, UMM_PAGE_SWAPPED};
use usermm::{Mapping, Space};

use crate::pattern::{bad_bytes, fill_page, Rng};

pub const PAGE: usize = 4096;

/// Writes every page of `m` as page `tag << 32 | index` at `version`.
pub fn fill(m: &mut Mapping<'_>, tag: u64, version: u64) {
    for p in 0..m.len() / PAGE {
        fill_page(&mut m[p * PAGE..(p + 1) * PAGE], tag << 32 | p as u64, version);
    }
}

/// The wrong bytes of `m` against [`fill`]'s contents.
pub fn bad_in(m: &Mapping<'_>, tag: u64, version: u64) -> usize {
    (0..m.len() / PAGE).map(|p| bad_bytes(&m[p * PAGE..(p + 1) * PAGE], tag << 32 | p as u64, version)).sum()
}

/// `umm_page_state` of every page of `m`.
pub fn states(s: &Space, m: &Mapping<'_>) -> Vec<u32> {
    let mut v = vec![0u32; m.len() / PAGE];
    s.page_state(m.addr(), v.len(), &mut v).expect("page_state");
    v
}

/// `MADV_PAGEOUT` until every page of `m` is swapped out (at most 1 s).
/// Page-out is advisory and skips pages whose fill is still being committed:
/// the faulting thread is woken by `UFFDIO_COPY` a moment before the handler
/// records the page as resident, so a page-out right after the touch can
/// miss the last page(s) touched.
pub fn pageout_all(s: &Space, m: &mut Mapping<'_>) -> Vec<u32> {
    let mut st = Vec::new();
    for _ in 0..1000 {
        m.advise(MADV_PAGEOUT).expect("MADV_PAGEOUT");
        st = states(s, m);
        if st.iter().all(|&b| b & UMM_PAGE_SWAPPED != 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    st
}

/// Writes and checks random pages of a mapping of `bytes` of `s` until
/// `deadline`: each touch checks the page's last version and writes the
/// next. Returns the wrong bytes seen (including a final pass over every
/// written page).
pub fn random_writer(s: &Space, bytes: usize, tag: u64, deadline: std::time::Instant) -> usize {
    let mut m = s.map_anon(bytes).expect("mmap");
    let n = m.len() / PAGE;
    let mut version = vec![0u64; n];
    let mut rng = Rng::new(tag + 1);
    let mut bad = 0;
    while std::time::Instant::now() < deadline {
        let p = rng.index(n);
        let page = &mut m[p * PAGE..(p + 1) * PAGE];
        if version[p] > 0 {
            bad += bad_bytes(page, tag << 32 | p as u64, version[p]);
        }
        version[p] += 1;
        fill_page(page, tag << 32 | p as u64, version[p]);
    }
    for p in 0..n {
        if version[p] > 0 {
            bad += bad_bytes(&m[p * PAGE..(p + 1) * PAGE], tag << 32 | p as u64, version[p]);
        }
    }
    bad
}
