//! A space's configuration from the `USERMM_*` environment variables: the
//! one place this crate parses them, for the C ABI's default space and for
//! `GlobalHeap::from_env` alike.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::{Config, Errno};

/// A `USERMM_*` variable that does not parse (`usermm run` refuses to start
/// a program whose space would refuse to open for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    /// The variable's name.
    pub name: &'static str,
    /// Its value, as far as it is text.
    pub value: String,
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={}: not a value the space can read (decimal or 0x hex, with an optional k, m, g, t; \
             sizes also unlimited; counts and flags at most 2^32-1)",
            self.name, self.value
        )
    }
}

/// A byte count from variable `name` (read with `get`): decimal or `0x`
/// hex, with an optional binary suffix `k`, `m`, `g`, `t`; `unlimited` (or
/// `max`) is `SIZE_MAX`. Unset or empty: `None`.
fn var_size(get: &dyn Fn(&str) -> Option<OsString>, name: &'static str) -> Result<Option<usize>, EnvError> {
    let Some(raw) = get(name) else {
        return Ok(None);
    };
    let bad = || EnvError { name, value: raw.to_string_lossy().into_owned() };
    let v = raw.to_str().ok_or_else(bad)?.trim().to_ascii_lowercase();
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
    .map_err(|_| bad())?;
    n.checked_mul(1usize << shift).map(Some).ok_or_else(bad)
}

fn var_u32(get: &dyn Fn(&str) -> Option<OsString>, name: &'static str) -> Result<Option<u32>, EnvError> {
    match var_size(get, name)? {
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| EnvError { name, value: get(name).unwrap_or_default().to_string_lossy().into_owned() }),
        None => Ok(None),
    }
}

/// The directory of a swap file whose configuration names none
/// (`Config::swap_dir` unset): `$TMPDIR`, else `/tmp`.
pub(crate) fn default_swap_dir() -> PathBuf {
    std::env::var_os("TMPDIR").filter(|v| !v.is_empty()).map_or_else(|| "/tmp".into(), PathBuf::from)
}

/// A configuration from the `USERMM_*` variables documented in
/// `usermm_compat.h`: an unset or empty variable keeps [`Config::default`]'s
/// value; one that does not parse is `EINVAL`.
pub(crate) fn from_env() -> Result<Config, Errno> {
    config_from_vars(&|name| std::env::var_os(name)).map_err(|_| Errno::EINVAL)
}

/// A configuration from the `USERMM_*` variables as `get` reads them (the
/// rules a space's `from_env` opens with; `usermm run` checks a program's
/// environment with it before starting it): the first that does not parse
/// is the error.
pub fn config_from_vars(get: &dyn Fn(&str) -> Option<OsString>) -> Result<Config, EnvError> {
    let d = Config::default();
    Ok(Config {
        budget_bytes: var_size(get, "USERMM_BUDGET_BYTES")?.unwrap_or(d.budget_bytes),
        reserve_bytes: var_size(get, "USERMM_RESERVE_BYTES")?.unwrap_or(d.reserve_bytes),
        memlock_bytes: var_size(get, "USERMM_MEMLOCK_BYTES")?.unwrap_or(d.memlock_bytes),
        swap_bytes: var_size(get, "USERMM_SWAP_BYTES")?.unwrap_or(d.swap_bytes),
        swap_dir: get("USERMM_SWAP_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
        swap_url: match get("USERMM_SWAP_URL").filter(|v| !v.is_empty()) {
            Some(v) => Some(
                v.into_string()
                    .map_err(|v| EnvError { name: "USERMM_SWAP_URL", value: v.to_string_lossy().into_owned() })?,
            ),
            None => None,
        },
        max_regions: var_size(get, "USERMM_MAX_REGIONS")?.unwrap_or(d.max_regions),
        page_shift: var_u32(get, "USERMM_PAGE_SHIFT")?.unwrap_or(d.page_shift),
        fault_threads: var_u32(get, "USERMM_FAULT_THREADS")?.unwrap_or(d.fault_threads),
        flags: var_u32(get, "USERMM_FLAGS")?.unwrap_or(d.flags),
        lazyfree_max_bytes: var_size(get, "USERMM_LAZYFREE_MAX_BYTES")?.unwrap_or(d.lazyfree_max_bytes),
    })
}
