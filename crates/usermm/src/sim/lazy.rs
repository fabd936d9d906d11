//! The simulated host's own lazy free: what it may drop by itself, and the
//! staging slots' bookkeeping around it.

use std::collections::BTreeSet;

use usermm_core::Errno;

use super::host::{zeros, Host, Pg};

/// What the host may drop by itself (its `MADV_FREE`): clean lazily freed
/// pages of the program range, and staging slots holding one (moved there
/// by `UFFDIO_MOVE`, which keeps a page clean) or handed to it
/// (`host_free_slot`: a parked volatile page). A write to a program page
/// makes it dirty (kept). Ordered sets: the seed decides which one goes.
#[derive(Default)]
pub(super) struct HostLazy {
    /// Whether the platform says it frees lazily (else none of this runs).
    pub(super) on: bool,
    /// One in how many preemption points the host drops a page (0: never).
    pub(super) drop_one_in: u64,
    pub(super) pages: BTreeSet<usize>,
    pub(super) slots: BTreeSet<u32>,
    /// Slots the host dropped: they read as the zero page.
    pub(super) dropped: BTreeSet<u32>,
    /// Pages and slots the host dropped by itself.
    pub(super) drops: u64,
}

impl Host {
    /// The host's own reclaim, now and then: it drops one clean lazily
    /// freed page or slot.
    pub(super) fn host_drops_one(&mut self) {
        if !self.lazy.on || self.lazy.drop_one_in == 0 || !self.rng.one_in(self.lazy.drop_one_in) {
            return;
        }
        let n = self.lazy.pages.len() + self.lazy.slots.len();
        if n == 0 {
            return;
        }
        let k = self.rng.below(n as u64) as usize;
        if k < self.lazy.pages.len() {
            let p = *self.lazy.pages.iter().nth(k).expect("k < len");
            self.lazy.pages.remove(&p);
            self.prog.remove(&p);
            self.wp.remove(&p);
        } else {
            let sl = *self.lazy.slots.iter().nth(k - self.lazy.pages.len()).expect("k < len");
            self.drop_slot(sl);
        }
        self.lazy.drops += 1;
    }

    /// The host drops the clean page in slot `sl`: it reads as zeros now.
    pub(super) fn drop_slot(&mut self, sl: u32) {
        self.lazy.slots.remove(&sl);
        self.staging.remove(&sl);
        self.lazy.dropped.insert(sl);
    }

    /// Takes the page out of slot `sl` (a move or copy back, a swap write's
    /// read): its bytes, zeros if the host dropped it. Panics on a slot
    /// that never held a page (an executor bug).
    pub(super) fn slot_data(&mut self, sl: u32, what: &str) -> Box<[u8]> {
        match self.staging.get(&sl) {
            Some(d) => d.clone(),
            None if self.lazy.dropped.contains(&sl) => zeros(),
            None => panic!("{what} of an empty staging slot"),
        }
    }

    /// Slot `sl` gets a page: `clean` (a clean lazily freed page moved
    /// there) or not.
    pub(super) fn fill_slot(&mut self, sl: u32, data: Box<[u8]>, clean: bool) {
        self.staging.insert(sl, data);
        self.lazy.dropped.remove(&sl);
        if clean {
            self.lazy.slots.insert(sl);
        } else {
            self.lazy.slots.remove(&sl);
        }
    }

    /// Slot `sl` is emptied by the executor.
    pub(super) fn empty_slot(&mut self, sl: u32) {
        self.staging.remove(&sl);
        self.lazy.slots.remove(&sl);
        self.lazy.dropped.remove(&sl);
    }

    /// Maps the page parked in `slot` back at the missing page `p`: moved
    /// (`try_move`, where the host can), or copied (the slot keeps its
    /// frame if `!release`, until dropped).
    pub(super) fn slot_back(&mut self, slot: u32, p: usize, try_move: bool, release: bool) -> Result<(), Errno> {
        if self.prog.contains_key(&p) {
            return Err(Errno::EEXIST);
        }
        if self.fail() {
            return Err(Errno::ENOMEM);
        }
        // A move keeps a clean page clean; a copy makes a new page. (A
        // slot the host dropped: the move finds nothing, the copy reads the
        // zero page.)
        let moved_clean = try_move && self.can_move && self.lazy.slots.contains(&slot);
        let data = self.slot_data(slot, "slot_to_page");
        if release || (try_move && self.can_move) {
            self.empty_slot(slot);
        }
        self.prog.insert(p, Pg::Data(data));
        self.wp.remove(&p);
        if moved_clean {
            self.lazy.pages.insert(p);
        }
        Ok(())
    }
}
