//! What a space was opened with and the host allowed, fixed for its life:
//! read by every part, changed by none (no setter).

pub(crate) struct Settings {
    /// `UMM_F_FRAME_POOL`: fills may take recycled frames
    /// (`Arena::recycle_slots`).
    frame_pool: bool,
    /// Faults come only from user mode (the host's userfaultfd serves no
    /// kernel-mode access).
    user_mode_only: bool,
    /// `UMM_F_INTHREAD_FAULTS`: faults are resolved in the faulting thread.
    in_thread: bool,
    /// Lazily freed pages are passed down to the host (`MADV_FREE`) and
    /// discarded through it (see `Arena::host_lazyfree`).
    host_lazyfree: bool,
    /// The swap's size in bytes (for `Space::swap_contents`).
    #[cfg(feature = "test-hooks")]
    swap_bytes: u64,
    /// Why the host fell back to a weaker mode, if it did.
    fallback_reason: Option<String>,
}

impl Settings {
    /// The settings, in the order of the fields.
    pub(super) fn new(
        frame_pool: bool,
        user_mode_only: bool,
        in_thread: bool,
        host_lazyfree: bool,
        swap_bytes: u64,
        fallback_reason: Option<String>,
    ) -> Settings {
        #[cfg(not(feature = "test-hooks"))]
        let _ = swap_bytes;
        Settings {
            frame_pool,
            user_mode_only,
            in_thread,
            host_lazyfree,
            #[cfg(feature = "test-hooks")]
            swap_bytes,
            fallback_reason,
        }
    }

    pub(super) fn frame_pool(&self) -> bool {
        self.frame_pool
    }

    pub(super) fn user_mode_only(&self) -> bool {
        self.user_mode_only
    }

    pub(super) fn in_thread(&self) -> bool {
        self.in_thread
    }

    pub(super) fn host_lazyfree(&self) -> bool {
        self.host_lazyfree
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn swap_bytes(&self) -> u64 {
        self.swap_bytes
    }

    pub(super) fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }
}
