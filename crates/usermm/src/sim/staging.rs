//! The simulated staging area and swap: parked pages' slots as byte
//! arrays (moved back, copied in, dropped, handed to the host's lazy free)
//! and the page store, by page offset, with failures injected from the
//! seed.

use usermm_core::Errno;

use super::host::{page_of, zeros, Pg, SimPlatform};
use super::PS;
use crate::platform::{StagingOps, StoreOps};

impl StagingOps for SimPlatform {
    fn slot_to_page(&self, slot: u32, dst: usize, try_move: bool, wp: bool, release: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(dst, PS)?;
        let mut h = self.host();
        h.slot_back(slot, page_of(dst), try_move, release)?;
        if wp && !try_move && h.tracks_writes {
            h.wp.insert(page_of(dst));
        }
        Ok(())
    }
    fn slot_to_page_checked(&self, slot: u32, dst: usize) -> Result<bool, Errno> {
        // (The check and the copy are one step: the native copy reads the
        // slot first and checks it held its page after.)
        self.preempt();
        Self::check(dst, PS)?;
        let mut h = self.host();
        if h.lazy.dropped.contains(&slot) {
            // The host purged it: nothing installed, the slot emptied.
            h.empty_slot(slot);
            return Ok(false);
        }
        h.slot_back(slot, page_of(dst), false, true).map(|()| true)
    }
    fn page_to_slot_copy(&self, src: usize, slot: u32, _unreadable: bool) -> Result<(), Errno> {
        self.preempt();
        Self::check(src, PS)?;
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EAGAIN);
        }
        let data = match h.prog.get(&page_of(src)) {
            Some(Pg::Data(d)) => d.clone(),
            Some(Pg::Zero) => zeros(),
            _ => return Err(Errno::EFAULT),
        };
        assert!(!h.staging.contains_key(&slot), "copy into the occupied staging slot {slot}");
        h.fill_slot(slot, data, false);
        h.prog.remove(&page_of(src));
        h.wp.remove(&page_of(src));
        h.lazy.pages.remove(&page_of(src));
        Ok(())
    }
    fn drop_slots(&self, slot: u32, n: usize) -> Result<(), Errno> {
        let mut h = self.host();
        for s in slot..slot + n as u32 {
            h.empty_slot(s);
        }
        Ok(())
    }
    fn drop_slot_list(&self, slots: &[u32]) -> Result<(), Errno> {
        let mut h = self.host();
        for &s in slots {
            h.empty_slot(s);
        }
        Ok(())
    }
    fn discard_slot(&self, slot: u32) -> bool {
        // MADV_PAGEOUT of the slot: a clean lazily freed page goes at once;
        // a dirty one stays (and is no longer lazily freed).
        let mut h = self.host();
        if !h.lazy.on {
            return false;
        }
        if h.lazy.slots.contains(&slot) || h.lazy.dropped.contains(&slot) {
            h.drop_slot(slot);
            return true;
        }
        false
    }
    fn moved_unreported(&self, src: usize, slot: u32) -> bool {
        let h = self.host();
        !h.prog.contains_key(&page_of(src)) && h.staging.contains_key(&slot)
    }
    fn host_free_slot(&self, slot: u32) -> Result<(), Errno> {
        let mut h = self.host();
        if h.lazy.on && h.staging.contains_key(&slot) {
            h.lazy.slots.insert(slot);
        }
        Ok(())
    }
}

impl StoreOps for SimPlatform {
    fn swap_write(&self, slots: &[u32], off: u64) -> Result<(), Errno> {
        self.preempt();
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        let first = off / PS as u64;
        for (k, s) in slots.iter().enumerate() {
            let data = h.slot_data(*s, "swap write");
            h.swap.insert(first + k as u64, data);
        }
        Ok(())
    }
    fn swap_release(&self, runs: &[(u32, u32)]) -> Result<(), Errno> {
        self.preempt();
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        // Gone for good: a slot released while in use reads back as zeros.
        for &(first, n) in runs {
            for s in first..first + n {
                h.swap.remove(&u64::from(s));
            }
        }
        Ok(())
    }
    fn swap_scrub(&self, slots: &[u32]) -> Result<(), Errno> {
        self.preempt();
        let mut h = self.host();
        if h.fail() {
            return Err(Errno::EIO);
        }
        // Overwritten with zeros: a slot scrubbed while in use (a missing
        // reservation) reads back wrong, and the simulation's check sees it.
        for &s in slots {
            h.swap.insert(u64::from(s), vec![0u8; PS].into_boxed_slice());
        }
        Ok(())
    }
}
