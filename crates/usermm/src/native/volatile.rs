//! Volatile ranges (seed 002): `mvolatile` and `mnovolatile`.

use super::serve::{Caller, Next, Retries};
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
            self.plat.upkeep(Upkeep::DrainLru);
        }
        for slot in parked {
            let _ = self.plat.staging(Staging::HostFree { slot });
        }
        res
    }

    /// `mnovolatile`: returns the purged pages (in address order) and the
    /// call's result.
    pub fn mnovolatile(&self, addr: usize, len: usize) -> Result<(Vec<usize>, Result<(), Errno>), Errno> {
        let mm = self.read_mm();
        let mut c = lock(&self.core);
        let (nv, res) = loop {
            match c.mnovolatile(addr as u64, len as u64)? {
                Ok((nv, _)) if !nv.reactivate.is_empty() => {
                    // Parked pages the host may have purged: map them back
                    // (which finds out), then decide again.
                    drop(c);
                    for p in nv.reactivate {
                        self.reactivate_parked(&mm, p);
                    }
                    c = lock(&self.core);
                }
                Ok(r) => break r,
                Err(Busy) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
            }
        };
        drop(c);
        drop(mm);
        // Purged pages read back as zeros from now on: remove the markers.
        let mut i = 0;
        while i < nv.purged.len() {
            let mut j = i + 1;
            while j < nv.purged.len() && nv.purged[j].0 == nv.purged[j - 1].0 + 1 {
                j += 1;
            }
            let _ = self.plat.range(Range::Dontneed, self.addr(nv.purged[i]), (j - i) * self.page_size);
            i = j;
        }
        Ok((nv.purged.iter().map(|&p| self.addr(p)).collect(), res))
    }

    /// Maps the parked page `p` back (for `mnovolatile`, or a lock), whatever
    /// its region's protection (`Core::reactivate_step`), as a populate
    /// does: no thread waits for it. A reactivation that finds the page
    /// purged by the host plans again and finds it no longer parked.
    pub(super) fn reactivate_parked(&self, mm: &RwLockReadGuard<'_, ()>, p: PageIdx) {
        let mut retries = Retries::default();
        let mut c = lock(&self.core);
        loop {
            match c.reactivate_step(p) {
                None => return,
                Some(FaultPlan::Busy) => c = self.settled.wait(c).unwrap_or_else(|e| e.into_inner()),
                Some(plan) => match self.serve(c, &plan, self.addr(p), false, Caller::Populate, mm, &mut retries) {
                    Next::Again(g) => c = g,
                    Next::Served | Next::Failed(_) => return,
                },
            }
        }
    }
}
