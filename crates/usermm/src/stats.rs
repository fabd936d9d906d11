//! What the calls report: [`Stats`] (`struct umm_stats`),
//! [`PopulateReport`] (`struct umm_populate_report`) and [`PurgeReport`]
//! (`struct umm_purge_report`).

/// Defines [`Stats`] from one list of fields (each a `u64`) and
/// [`Stats::fields`], which names them: the C ABI's `struct umm_stats`
/// words and `usermm run --stats` are taken from it by name, and a test
/// checks the header's struct against it.
macro_rules! stats {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// Statistics of a space (`struct umm_stats`, plus usermm's own fields).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Stats {
            /// Every field with its name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name), )*]
            }

            /// The field named `name`, if there is one.
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $( stringify!($name) => Some(self.$name), )*
                    _ => None,
                }
            }
        }
    };
}

stats! {
    budget_pages,
    resident_pages,
    resident_pages_max,
    locked_pages,
    locked_charged_pages,
    swapped_pages,
    lazyfree_pages,
    volatile_pages,
    faults,
    major_faults,
    zero_fills,
    swapins,
    swapouts,
    writebacks,
    lazyfree_discards,
    volatile_purges,
    /// Of `volatile_purges`, the pages the host kernel purged (Rust API
    /// only; not in `struct umm_stats`).
    host_purges,
    evictions,
    oom_sigbus,
    write_lock_hold_ns_max,
    // usermm's own:
    /// Resident pages parked on the inactive list (counted in `resident_pages`).
    inactive_pages,
    /// Faults that mapped an inactive page back (no I/O).
    minor_faults,
    deactivations,
    swap_read_errors,
    swap_write_errors,
    regions,
    /// 1 when the space runs on the user-mode-only userfaultfd fallback.
    user_mode_only,
    /// 1 when swap I/O bypasses the host page cache (O_DIRECT).
    swap_direct_io,
    /// Zaps (munmap, `MADV_DONTNEED`, `MAP_FIXED`) the host refused at
    /// first because the pages were locked behind usermm's back (a raw
    /// `mlock` syscall): the range was unlocked, or replaced by a fresh
    /// mapping, so that no old byte is ever seen again.
    host_refusals,
    /// Store writes (a call writing a run of up to 256 pages) that failed:
    /// with `swap_backoff_ms`, how a swap file system that is full or a
    /// Redis server that is down shows (`swap_write_errors` counts the
    /// pages those writes kept resident).
    swap_write_fails,
    /// While the page store refuses writes: the pause before it is tried
    /// again (ms, doubling with each failure up to 1,000; its pages stay
    /// resident meanwhile); 0 when it takes writes.
    swap_backoff_ms,
    /// Pages a host `UFFDIO_MOVE` moved without saying so (it answered an
    /// error or a shorter count; found in the host's page tables and taken
    /// as moved, see `Arena::moved_unreported`). Not in `struct umm_stats`.
    host_unreported_moves,
    /// Resident pages whose swap slot still holds exactly their data (read
    /// since their swap-in, never written): evicting one writes nothing.
    /// Not in `struct umm_stats`.
    swap_cached_pages,
    /// Evictions that wrote nothing, the page's swap copy being exact (not
    /// counted in `swapouts`). Not in `struct umm_stats`.
    clean_evictions,
    /// Frames in the space's pool of recycled frames now (counted in the
    /// budget as free frames). Not in `struct umm_stats`.
    pool_frames,
    /// Pages installed by moving a pool frame in (a zero fill or a swap-in
    /// with no frame allocated). Not in `struct umm_stats`.
    pool_fills,
    /// Parked pages mapped back in bulk, without a fault, when pressure
    /// eased (docs/design.md, "Pressure's end") or ahead of a stream of
    /// swap faults ("Swap read-ahead"). Not in `struct umm_stats`.
    unparked_pages,
    /// Pages read ahead of a stream of swap faults, from wherever they sit
    /// in swap (docs/design.md, "Swap read-ahead"); also counted in
    /// `swapins`. Not in `struct umm_stats`.
    swap_ahead_pages,
    /// Swap slots freed here but kept as they are for a forked child that
    /// may still read them in place, until it (and every process it
    /// forked) has exited or exec'd (docs/design.md, "fork"). Not in
    /// `struct umm_stats`.
    swap_fork_held_pages,
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
