//! A space's configuration: [`Config`] (`struct umm_config`), the defaults
//! its zero fields stand for, and [`from_env`], a configuration from the
//! `USERMM_*` environment.

mod env;

use std::path::PathBuf;

pub use env::{config_from_vars, EnvError};
pub(crate) use env::{default_swap_dir, from_env};

/// The default virtual range a space reserves: 64 GiB of address space (no
/// memory is used until pages are touched).
pub const DEFAULT_RESERVE_BYTES: usize = 64 << 30;
/// The default swap file size limit: 8 GiB (the file is sparse and grows as
/// pages are written).
pub const DEFAULT_SWAP_BYTES: usize = 8 << 30;

/// The default budget: a quarter of physical memory.
pub fn default_budget_bytes() -> usize {
    (usermm_sys::phys_mem_bytes() / 4).max(16 << 20) as usize
}

/// A space's configuration (`struct umm_config`). `Config::default()` gives
/// the same values as `umm_config_init`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Resident budget in bytes; 0: a quarter of physical memory.
    pub budget_bytes: usize,
    /// Virtual range reserved for the space; 0: [`DEFAULT_RESERVE_BYTES`].
    pub reserve_bytes: usize,
    /// Lock limit in bytes (the RLIMIT_MEMLOCK analogue); `usize::MAX`:
    /// unlimited; 0: every lock request fails with `EPERM`.
    pub memlock_bytes: usize,
    /// Largest swap file; 0: no swap (anonymous pages are then unevictable).
    pub swap_bytes: usize,
    /// Directory of the swap file; `None`: `$TMPDIR` or `/tmp`.
    pub swap_dir: Option<PathBuf>,
    /// A page store instead of the swap file: a Redis-protocol server,
    /// `redis://host:port[/db][?prefix=P&timeout_ms=T]` (see
    /// `docs/design.md`, "Page stores"). `swap_bytes` still bounds what
    /// the space puts there; `swap_dir` is then unused.
    pub swap_url: Option<String>,
    /// Region limit; 0: 65530, as `vm.max_map_count`.
    pub max_regions: usize,
    /// log2 of the page size; 0: 12 (4 KiB); up to 21.
    pub page_shift: u32,
    /// Fault handler threads; 0: 2.
    pub fault_threads: u32,
    /// `UMM_F_*` flags.
    pub flags: u32,
    /// Most lazily freed (`MADV_FREE`) bytes the space keeps; past it the
    /// oldest are discarded at once (through the host: clean ones are
    /// dropped, written ones kept). 0: no bound.
    pub lazyfree_max_bytes: usize,
}

impl Config {
    /// The budget in bytes: [`Config::budget_bytes`], or
    /// [`default_budget_bytes`] for 0.
    pub(crate) fn budget_or_default(&self) -> usize {
        if self.budget_bytes == 0 {
            default_budget_bytes()
        } else {
            self.budget_bytes
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            budget_bytes: 0,
            reserve_bytes: 0,
            memlock_bytes: usize::MAX,
            swap_bytes: DEFAULT_SWAP_BYTES,
            swap_dir: None,
            swap_url: None,
            max_regions: 0,
            page_shift: 0,
            fault_threads: 0,
            flags: 0,
            lazyfree_max_bytes: 0,
        }
    }
}
