//! Volatile ranges (seed 002): `mvolatile` and `mnovolatile`.

use super::*;

impl Inner {
    /// `mvolatile`.
    pub fn mvolatile(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let _mm = self.read_mm();
        let mut c = lock(&self.core);
        let (parked, res) = c.mvolatile(addr as u64, len as u64);
        // Under the core lock: no parked page can be mapped back (and its
        // slot reused) meanwhile.
        if !parked.is_empty() {
            self.plat.drain_host_lru();
        }
        for slot in parked {
            let _ = self.plat.host_free_slot(slot);
        }
        res
    }

    /// `mnovolatile`: returns the purged pages (in address order) and the
    /// call's result.
    pub fn mnovolatile(&self, addr: usize, len: usize) -> Result<(Vec<usize>, Result<(), Errno>), Errno> {
        let mut mm = self.read_mm();
        let mut c = lock(&self.core);
        let (nv, res) = loop {
            match c.mnovolatile(addr as u64, len as u64)? {
                Ok((nv, _)) if !nv.reactivate.is_empty() => {
                    // Parked pages the host may have purged: map them back
                    // (which finds out), then decide again.
                    drop(c);
                    drop(mm);
                    for p in nv.reactivate {
                        self.resolve(self.addr(p), false, None);
                    }
                    mm = self.read_mm();
                    c = lock(&self.core);
                }
                Ok(r) => break r,
                Err(Busy) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
            }
        };
        drop(c);
        // Purged pages read back as zeros from now on: remove the markers.
        let mut i = 0;
        while i < nv.purged.len() {
            let mut j = i + 1;
            while j < nv.purged.len() && nv.purged[j].0 == nv.purged[j - 1].0 + 1 {
                j += 1;
            }
            let _ = self.plat.dontneed(self.addr(nv.purged[i]), (j - i) * self.page_size);
            i = j;
        }
        Ok((nv.purged.iter().map(|&p| self.addr(p)).collect(), res))
    }
}
