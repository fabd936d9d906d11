//! What the calls report: [`Stats`] (`struct umm_stats`),
//! [`PopulateReport`] (`struct umm_populate_report`) and [`PurgeReport`]
//! (`struct umm_purge_report`).

/// Statistics of a space (`struct umm_stats`, plus usermm's own fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub budget_pages: u64,
    pub resident_pages: u64,
    pub resident_pages_max: u64,
    pub locked_pages: u64,
    pub locked_charged_pages: u64,
    pub swapped_pages: u64,
    pub lazyfree_pages: u64,
    pub volatile_pages: u64,
    pub faults: u64,
    pub major_faults: u64,
    pub zero_fills: u64,
    pub swapins: u64,
    pub swapouts: u64,
    pub writebacks: u64,
    pub lazyfree_discards: u64,
    pub volatile_purges: u64,
    /// Of `volatile_purges`, the pages the host kernel purged (Rust API
    /// only; not in `struct umm_stats`).
    pub host_purges: u64,
    pub evictions: u64,
    pub oom_sigbus: u64,
    pub write_lock_hold_ns_max: u64,
    // usermm's own:
    /// Resident pages parked on the inactive list (counted in `resident_pages`).
    pub inactive_pages: u64,
    /// Faults that mapped an inactive page back (no I/O).
    pub minor_faults: u64,
    pub deactivations: u64,
    pub swap_read_errors: u64,
    pub swap_write_errors: u64,
    pub regions: u64,
    /// 1 when the space runs on the user-mode-only userfaultfd fallback.
    pub user_mode_only: u64,
    /// 1 when swap I/O bypasses the host page cache (O_DIRECT).
    pub swap_direct_io: u64,
    /// Zaps (munmap, `MADV_DONTNEED`, `MAP_FIXED`) the host refused at
    /// first because the pages were locked behind usermm's back (a raw
    /// `mlock` syscall): the range was unlocked, or replaced by a fresh
    /// mapping, so that no old byte is ever seen again.
    pub host_refusals: u64,
    /// Store writes (a call writing a run of up to 256 pages) that failed:
    /// with `swap_backoff_ms`, how a swap file system that is full or a
    /// Redis server that is down shows (`swap_write_errors` counts the
    /// pages those writes kept resident).
    pub swap_write_fails: u64,
    /// While the page store refuses writes: the pause before it is tried
    /// again (ms, doubling with each failure up to 1,000; its pages stay
    /// resident meanwhile); 0 when it takes writes.
    pub swap_backoff_ms: u64,
    /// Pages a host `UFFDIO_MOVE` moved without saying so (it answered an
    /// error or a shorter count; found in the host's page tables and taken
    /// as moved, see `Arena::moved_unreported`). Not in `struct umm_stats`.
    pub host_unreported_moves: u64,
    /// Resident pages whose swap slot still holds exactly their data (read
    /// since their swap-in, never written): evicting one writes nothing.
    /// Not in `struct umm_stats`.
    pub swap_cached_pages: u64,
    /// Evictions that wrote nothing, the page's swap copy being exact (not
    /// counted in `swapouts`). Not in `struct umm_stats`.
    pub clean_evictions: u64,
    /// Frames in the space's pool of recycled frames now (counted in the
    /// budget as free frames). Not in `struct umm_stats`.
    pub pool_frames: u64,
    /// Pages installed by moving a pool frame in (a zero fill or a swap-in
    /// with no frame allocated). Not in `struct umm_stats`.
    pub pool_fills: u64,
}

/// What `umm_populate` reports (`struct umm_populate_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopulateReport {
    /// Bytes populated from the start of the range (a prefix).
    pub populated_bytes: usize,
    /// The first address that could not be populated (0 on success).
    pub fail_addr: usize,
}

/// What `mnovolatile` reports (`struct umm_purge_report`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Pages of the range purged since it was marked volatile.
    pub purged_pages: usize,
    /// The first purged address (0 when none was).
    pub first_purged: usize,
    /// One bit per page of the range (bit `i % 64` of word `i / 64`): set
    /// when page `i` was purged.
    pub bitmap: Vec<u64>,
}
