//! A space's configuration from the `USERMM_*` environment variables: the
//! one place this crate parses them, for the C ABI's default space and for
//! `GlobalHeap::from_env` alike.

use std::path::PathBuf;

use crate::{Config, Errno};

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

/// A configuration from the `USERMM_*` variables documented in
/// `usermm_compat.h`: an unset or empty variable keeps [`Config::default`]'s
/// value; one that does not parse is `EINVAL`.
/// The directory of a swap file whose configuration names none
/// (`Config::swap_dir` unset): `$TMPDIR`, else `/tmp`.
pub(crate) fn default_swap_dir() -> PathBuf {
    std::env::var_os("TMPDIR").filter(|v| !v.is_empty()).map_or_else(|| "/tmp".into(), PathBuf::from)
}

pub(crate) fn from_env() -> Result<Config, Errno> {
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
