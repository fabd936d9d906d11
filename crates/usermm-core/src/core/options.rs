//! What the executor's host can do, and the space's reclaim options: set
//! when the space is opened (or when the host's answer is known), read by
//! the plans. Plain settings: they keep no invariant.

pub(super) struct Options {
    /// Whether the executor passes MADV_FREE down to the host and can have
    /// the host discard clean lazily freed pages (`set_host_lazyfree`).
    host_lazyfree: bool,
    /// Whether swapped-in pages can be mapped write-protected, so that a
    /// clean page keeps its swap copy (`set_tracks_writes`, `swapcache.rs`).
    tracks_writes: bool,
    /// Reclaim purges volatile pages before anything else
    /// (`set_purge_volatile_first`).
    purge_volatile_first: bool,
    /// Most lazily freed pages kept (`set_lazyfree_max`).
    lazyfree_max: u64,
    /// Anonymous private regions are sampled by zap and scan
    /// (`set_sampled_refs`, `Transfer::Zap`).
    sampled_refs: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            host_lazyfree: false,
            tracks_writes: false,
            purge_volatile_first: false,
            lazyfree_max: u64::MAX,
            sampled_refs: false,
        }
    }
}

impl Options {
    pub(super) fn set_host_lazyfree(&mut self, on: bool) {
        self.host_lazyfree = on;
    }

    /// Whether the host can discard clean lazily freed pages.
    pub(super) fn host_lazyfree(&self) -> bool {
        self.host_lazyfree
    }

    pub(super) fn set_tracks_writes(&mut self, on: bool) {
        self.tracks_writes = on;
    }

    /// Whether swapped-in pages can be mapped write-protected.
    pub(super) fn tracks_writes(&self) -> bool {
        self.tracks_writes
    }

    pub(super) fn set_purge_volatile_first(&mut self, on: bool) {
        self.purge_volatile_first = on;
    }

    /// Whether reclaim purges volatile pages before anything else.
    pub(super) fn purge_volatile_first(&self) -> bool {
        self.purge_volatile_first
    }

    pub(super) fn set_sampled_refs(&mut self, on: bool) {
        self.sampled_refs = on;
    }

    /// Whether anonymous private regions are sampled by zap and scan.
    pub(super) fn sampled_refs(&self) -> bool {
        self.sampled_refs
    }

    pub(super) fn set_lazyfree_max(&mut self, pages: u64) {
        self.lazyfree_max = pages;
    }

    /// Lazily freed pages beyond the bound, of `lazyfree` kept.
    pub(super) fn lazyfree_excess(&self, lazyfree: u64) -> u64 {
        lazyfree.saturating_sub(self.lazyfree_max)
    }
}
