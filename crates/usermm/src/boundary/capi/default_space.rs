//! The process-wide default space of `usermm_compat.h`: one per fork
//! generation, configured from the `USERMM_*` environment
//! (`umm_default_space`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use super::{guard, umm_space};
use crate::{Config, Errno, Space};

/// The process-wide default space of `usermm_compat.h` for one fork
/// generation; the error is kept so that every call reports it.
struct DefaultCell {
    fork_generation: u64,
    space: OnceLock<Result<Space, Errno>>,
}

/// The default space's cell of the current fork generation: a forked child
/// gets a fresh cell (and so a fresh space, opened by its first call) and
/// never waits on the parent's, whose `OnceLock` a parent thread may have
/// been initialising at the fork (every fork after the first call is
/// counted: see `default_cell`). Cells are leaked, never freed: one per
/// generation that called `umm_default_space`.
static DEFAULT_CELL: AtomicPtr<DefaultCell> = AtomicPtr::new(std::ptr::null_mut());

pub(super) fn default_cell() -> &'static OnceLock<Result<Space, Errno>> {
    // The fork handler is registered before a cell is made (the space's
    // open would register it only inside the cell's initialisation): a
    // fork while a thread initialises this generation's cell then always
    // gives the child a new generation, and so a cell of its own. (If it
    // cannot be registered, the open fails the same way.)
    let generation = usermm_sys::thread::watch_forks().unwrap_or_else(|_| usermm_sys::thread::fork_generation());
    let mut cur = DEFAULT_CELL.load(Ordering::Acquire);
    loop {
        // SAFETY: DEFAULT_CELL holds NULL or a pointer from `Box::leak`
        // below, never freed, so it is valid for 'static.
        if let Some(cell) = unsafe { cur.as_ref() } {
            if cell.fork_generation == generation {
                return &cell.space;
            }
        }
        let new: &'static mut DefaultCell =
            Box::leak(Box::new(DefaultCell { fork_generation: generation, space: OnceLock::new() }));
        match DEFAULT_CELL.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return &new.space,
            // Another thread installed a cell first: use it if it is this
            // generation's (ours stays leaked, a few bytes, at most once per
            // racing thread).
            Err(other) => cur = other,
        }
    }
}

/// A byte count from the environment: decimal or `0x` hex, with an optional
/// binary suffix `k`, `m`, `g`, `t`; `unlimited` (or `max`) is `SIZE_MAX`.
/// Unset or empty: `None`.
fn env_size(name: &str) -> Result<Option<usize>, Errno> {
    let Some(v) = std::env::var_os(name) else {
        return Ok(None);
    };
    let v = v.to_str().ok_or(Errno::EINVAL)?.trim().to_ascii_lowercase();
    if v.is_empty() {
        return Ok(None);
    }
    if v == "unlimited" || v == "max" {
        return Ok(Some(usize::MAX));
    }
    let (num, shift) = match v.as_bytes()[v.len() - 1] {
        b'k' => (&v[..v.len() - 1], 10),
        b'm' => (&v[..v.len() - 1], 20),
        b'g' => (&v[..v.len() - 1], 30),
        b't' => (&v[..v.len() - 1], 40),
        _ => (&v[..], 0),
    };
    let n = match num.strip_prefix("0x") {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => num.parse::<usize>(),
    }
    .map_err(|_| Errno::EINVAL)?;
    n.checked_mul(1usize << shift).map(Some).ok_or(Errno::EINVAL)
}

fn env_u32(name: &str) -> Result<Option<u32>, Errno> {
    match env_size(name)? {
        Some(n) => u32::try_from(n).map(Some).map_err(|_| Errno::EINVAL),
        None => Ok(None),
    }
}

/// The default space's configuration, from the `USERMM_*` variables
/// documented in `usermm_compat.h`.
pub(crate) fn config_from_env() -> Result<Config, Errno> {
    let d = Config::default();
    Ok(Config {
        budget_bytes: env_size("USERMM_BUDGET_BYTES")?.unwrap_or(d.budget_bytes),
        reserve_bytes: env_size("USERMM_RESERVE_BYTES")?.unwrap_or(d.reserve_bytes),
        memlock_bytes: env_size("USERMM_MEMLOCK_BYTES")?.unwrap_or(d.memlock_bytes),
        swap_bytes: env_size("USERMM_SWAP_BYTES")?.unwrap_or(d.swap_bytes),
        swap_dir: std::env::var_os("USERMM_SWAP_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
        swap_url: match std::env::var_os("USERMM_SWAP_URL").filter(|v| !v.is_empty()) {
            Some(v) => Some(v.into_string().map_err(|_| Errno::EINVAL)?),
            None => None,
        },
        max_regions: env_size("USERMM_MAX_REGIONS")?.unwrap_or(d.max_regions),
        page_shift: env_u32("USERMM_PAGE_SHIFT")?.unwrap_or(d.page_shift),
        fault_threads: env_u32("USERMM_FAULT_THREADS")?.unwrap_or(d.fault_threads),
        flags: env_u32("USERMM_FLAGS")?.unwrap_or(d.flags),
        lazyfree_max_bytes: env_size("USERMM_LAZYFREE_MAX_BYTES")?.unwrap_or(d.lazyfree_max_bytes),
    })
}

/// `umm_default_space`: the process-wide default space, opened once (the
/// first caller opens it; concurrent callers wait) from the `USERMM_*`
/// environment. NULL + errno if it could not be opened (a message says why,
/// once, on stderr). It is never closed (its swap file, or its Redis keys,
/// go after the process exits: `store/redis.rs`). A forked child's first call opens
/// the child's own default space (the parent's is stale there).
#[no_mangle]
pub extern "C" fn umm_default_space() -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let r = default_cell().get_or_init(|| {
            let r = config_from_env().and_then(|c| Space::open(&c));
            if let Err(e) = &r {
                eprintln!("usermm: cannot open the default space (USERMM_* environment): {e}");
            }
            r
        });
        match r {
            Ok(sp) => Ok(sp as *const Space as *mut umm_space),
            Err(e) => Err(*e),
        }
    })
}
