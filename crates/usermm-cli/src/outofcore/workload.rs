//! The workloads of `outofcore`: the test file (every 8-byte word a hash of
//! its index, so the checksum of any read list can be worked out), the read
//! offsets of each workload, and the timed read loop every system runs.

use std::fs::File;
use std::io::Write as _;

use usermm_sys::host::{fadvise, POSIX_FADV_DONTNEED};
use usermm_sys::now_ns;

use crate::common::{Rng, MIB, PAGE};

/// The file's 8-byte word number `w` (splitmix64's finalizer of `w ^ seed`).
pub(super) fn word(w: u64, seed: u64) -> u64 {
    let mut z = (w ^ seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The test file; deleted when dropped.
pub(super) struct TestFile {
    pub(super) path: String,
}

impl TestFile {
    pub(super) fn create(dir: &str, bytes: usize, seed: u64) -> Result<TestFile, String> {
        let path = format!("{dir}/usermm-outofcore-{}-{}.dat", std::process::id(), now_ns());
        let t = TestFile { path };
        let mut f = File::create_new(&t.path).map_err(|e| format!("create {}: {e}", t.path))?;
        let mut buf = vec![0u8; MIB];
        let mut w = 0u64;
        for _ in 0..bytes / MIB {
            for c in buf.chunks_exact_mut(8) {
                c.copy_from_slice(&word(w, seed).to_le_bytes());
                w += 1;
            }
            f.write_all(&buf).map_err(|e| format!("write {}: {e}", t.path))?;
        }
        f.sync_all().map_err(|e| format!("fsync {}: {e}", t.path))?;
        fadvise(&f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| format!("fadvise: {e:?}"))?;
        Ok(t)
    }

    /// Opens the file afresh (so that one system's `posix_fadvise` advice,
    /// kept per open file, does not leak into another's) with its page cache
    /// dropped: every workload starts cold.
    pub(super) fn open_cold(&self, rdwr: bool) -> Result<File, String> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(rdwr)
            .open(&self.path)
            .map_err(|e| format!("open {}: {e}", self.path))?;
        fadvise(&f, 0, 0, POSIX_FADV_DONTNEED).map_err(|e| format!("fadvise(DONTNEED): {e:?}"))?;
        Ok(f)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The byte offsets of one workload's reads.
pub(super) fn offsets(
    workload: &str,
    pages: usize,
    reads: usize,
    hot_pages: usize,
    hot_touch: u64,
    seed: u64,
) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ workload.len() as u64);
    match workload {
        "random" => (0..reads).map(|_| rng.below(pages as u64) as usize * PAGE).collect(),
        "hotcold" => {
            let cold = (pages - hot_pages).max(1) as u64;
            (0..reads)
                .map(|_| {
                    let p = if rng.below(100) < hot_touch {
                        rng.below(hot_pages as u64) as usize
                    } else {
                        hot_pages + rng.below(cold) as usize
                    };
                    p * PAGE
                })
                .collect()
        }
        _ => (0..pages).map(|p| p * PAGE).collect(),
    }
}

/// One workload's timing: the whole loop, and every `every`th read alone.
pub(super) struct Outcome {
    pub(super) ns: u64,
    pub(super) sum: u64,
    pub(super) lat: Vec<f64>,
}

#[inline(always)]
pub(super) fn drive(offs: &[usize], every: usize, mut read: impl FnMut(usize) -> u64) -> Outcome {
    let mut sum = 0u64;
    let mut lat = Vec::with_capacity(offs.len() / every + 1);
    let t0 = now_ns();
    for (i, &off) in offs.iter().enumerate() {
        if i % every == 0 {
            let t = now_ns();
            sum = sum.wrapping_add(read(off));
            lat.push((now_ns() - t) as f64);
        } else {
            sum = sum.wrapping_add(read(off));
        }
    }
    Outcome { ns: now_ns() - t0, sum, lat }
}
