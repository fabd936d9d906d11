//! Reclaim's memory of demand: whether the budget ran out under a fault,
//! whether background reclaim is bringing free frames back up, how many
//! frames were claimed since the inactive list was last refilled, whether
//! reclaim parked pages since pressure last eased, and how many parked
//! pages were touched since a frame was last claimed.
//!
//! The state only; what it decides — when reclaim works ahead, how much it
//! frees, how fast pages age — is the policy's (`policy.rs`), which reads
//! and moves it through these methods.

#[derive(Default)]
pub(super) struct Pressure {
    /// Whether the budget ran out under a fault since it was last less
    /// than half full.
    ran_out: bool,
    /// Whether background reclaim is bringing free frames back up to the
    /// high watermark (set below the low one).
    refilling: bool,
    /// Frames faults and populates have claimed since reclaim last
    /// refilled the inactive list.
    demand: u64,
    /// Whether reclaim parked pages (aging or eviction, not `MADV_COLD`)
    /// since pressure last eased.
    aged: bool,
    /// Times frames were claimed, the budget ran out or a refill to the
    /// high watermark began, ever: unchanged over a while, pressure has
    /// eased (`calm_mark`).
    stirs: u64,
    /// Parked pages touched, less a debit for every frame claimed, since
    /// the budget ran out: a high count means the program's working set
    /// is in memory (`Core::calm_by_touches`).
    touched_unclaimed: u64,
    /// The budget ran out while not under pressure, and no reclaim round
    /// has taken note yet (`take_began`).
    began: bool,
    /// Proven pages to age (rotated or parked) that pages read back from
    /// swap soon after their eviction (`policy::refault_earns`) asked for
    /// (`Core::age_proven`).
    activated: u64,
}

impl Pressure {
    /// A fault or populate found no free frame.
    pub(super) fn ran_out(&mut self) {
        self.began |= !self.ran_out;
        self.ran_out = true;
        self.stirs += 1;
        self.touched_unclaimed = 0;
    }

    /// Whether the budget is under pressure: it ran out since it was last
    /// less than half full (`half_full` false: it is now, which ends the
    /// pressure).
    pub(super) fn persists(&mut self, half_full: bool) -> bool {
        if !half_full {
            self.ran_out = false;
        }
        self.ran_out
    }

    /// Whether the budget ran out since it was last seen less than half
    /// full (without looking again).
    pub(super) fn under(&self) -> bool {
        self.ran_out
    }

    /// How many frames to free with `free` free now and watermarks `low`
    /// and `high`: once below `low`, back up to `high`, and nothing while
    /// between the two otherwise.
    pub(super) fn watermark_want(&mut self, free: u64, low: u64, high: u64) -> u64 {
        if free < low {
            self.stirs += u64::from(!self.refilling);
            self.refilling = true;
        } else if free >= high {
            self.refilling = false;
        }
        if self.refilling {
            high.saturating_sub(free)
        } else {
            0
        }
    }

    /// Reclaim no longer works ahead: no refill to the high watermark is
    /// under way.
    pub(super) fn stop_refilling(&mut self) {
        self.refilling = false;
    }

    /// `n` frames are being claimed by a fault or populate; each cancels
    /// `debit` parked-page touches.
    pub(super) fn claimed(&mut self, n: u64, debit: u64) {
        self.demand = self.demand.saturating_add(n);
        self.stirs += 1;
        self.touched_unclaimed = self.touched_unclaimed.saturating_sub(n.saturating_mul(debit));
    }

    /// A parked page was touched (and mapped back).
    pub(super) fn touched_parked(&mut self) {
        self.touched_unclaimed = self.touched_unclaimed.saturating_add(1);
    }

    /// Parked pages touched, less the claims' debits, since the budget ran
    /// out.
    pub(super) fn touched_unclaimed(&self) -> u64 {
        self.touched_unclaimed
    }

    /// A page came back from swap soon after its eviction: the proven
    /// list owes `aging` more pages aged.
    pub(super) fn refault_activated(&mut self, aging: u64) {
        self.activated = self.activated.saturating_add(aging);
    }

    /// Proven pages still to age for the pages that came back from swap
    /// soon after their eviction.
    pub(super) fn activated(&self) -> u64 {
        self.activated
    }

    /// A proven page was aged (taken from the proven list's head).
    pub(super) fn proven_aged(&mut self) {
        self.activated = self.activated.saturating_sub(1);
    }

    /// Frames claimed since the inactive list was last refilled.
    pub(super) fn demand(&self) -> u64 {
        self.demand
    }

    /// A reclaim round refilled the inactive list.
    pub(super) fn demand_met(&mut self) {
        self.demand = 0;
    }

    /// Reclaim parked pages.
    pub(super) fn parked(&mut self) {
        self.aged = true;
    }

    /// Whether reclaim parked pages since pressure last eased.
    pub(super) fn aged(&self) -> bool {
        self.aged
    }

    /// What changes whenever pressure stirs: frames are claimed, the budget
    /// runs out, or a refill to the high watermark begins. The same mark a
    /// while later, with no refill under way, is a calm stretch.
    pub(super) fn calm_mark(&self) -> u64 {
        self.stirs
    }

    /// Whether a refill to the high watermark is under way.
    pub(super) fn refilling(&self) -> bool {
        self.refilling
    }

    /// Pressure is over: nothing runs ahead or ages until the budget runs
    /// out again.
    /// Whether pressure began since the last call.
    pub(super) fn take_began(&mut self) -> bool {
        std::mem::take(&mut self.began)
    }

    pub(super) fn ease(&mut self) {
        self.ran_out = false;
        self.refilling = false;
        self.demand = 0;
        self.aged = false;
        self.touched_unclaimed = 0;
    }
}
