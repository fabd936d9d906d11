//! A space's lifecycle and configuration: `struct umm_config` to and from
//! its bytes and [`Config`], `umm_config_init`, `umm_open`, `umm_close`.

use std::ffi::{c_char, c_int, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use usermm_sys::ffi::c_string_from_own_memory;

use super::copy::{copy_in, copy_out, read_usize, PATH_MAX};
use super::default_space::default_cell;
use super::{guard, space, umm_config, umm_space, SPEC_CONFIG_SIZE};
use crate::{Config, Errno, Space};

/// `sizeof(struct umm_config)`.
const CONFIG_SIZE: usize = std::mem::size_of::<umm_config>();

/// The bytes of `struct umm_config` (padding zeroed), field by field.
fn config_to_bytes(c: &umm_config) -> [u8; CONFIG_SIZE] {
    use std::mem::offset_of;
    let mut b = [0u8; CONFIG_SIZE];
    let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    put(offset_of!(umm_config, size), &c.size.to_ne_bytes());
    put(offset_of!(umm_config, budget_bytes), &c.budget_bytes.to_ne_bytes());
    put(offset_of!(umm_config, reserve_bytes), &c.reserve_bytes.to_ne_bytes());
    put(offset_of!(umm_config, memlock_bytes), &c.memlock_bytes.to_ne_bytes());
    put(offset_of!(umm_config, swap_bytes), &c.swap_bytes.to_ne_bytes());
    put(offset_of!(umm_config, swap_dir), &(c.swap_dir as usize).to_ne_bytes());
    put(offset_of!(umm_config, max_regions), &c.max_regions.to_ne_bytes());
    put(offset_of!(umm_config, page_shift), &c.page_shift.to_ne_bytes());
    put(offset_of!(umm_config, fault_threads), &c.fault_threads.to_ne_bytes());
    put(offset_of!(umm_config, flags), &c.flags.to_ne_bytes());
    put(offset_of!(umm_config, lazyfree_max_bytes), &c.lazyfree_max_bytes.to_ne_bytes());
    put(offset_of!(umm_config, swap_url), &(c.swap_url as usize).to_ne_bytes());
    b
}

/// `struct umm_config` from its bytes (the inverse of [`config_to_bytes`]).
fn config_from_bytes(b: &[u8; CONFIG_SIZE]) -> umm_config {
    use std::mem::offset_of;
    let word = |off: usize| usize::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"));
    let half = |off: usize| u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"));
    umm_config {
        size: word(offset_of!(umm_config, size)),
        budget_bytes: word(offset_of!(umm_config, budget_bytes)),
        reserve_bytes: word(offset_of!(umm_config, reserve_bytes)),
        memlock_bytes: word(offset_of!(umm_config, memlock_bytes)),
        swap_bytes: word(offset_of!(umm_config, swap_bytes)),
        swap_dir: word(offset_of!(umm_config, swap_dir)) as *const c_char,
        max_regions: word(offset_of!(umm_config, max_regions)),
        page_shift: half(offset_of!(umm_config, page_shift)),
        fault_threads: half(offset_of!(umm_config, fault_threads)),
        flags: half(offset_of!(umm_config, flags)),
        lazyfree_max_bytes: word(offset_of!(umm_config, lazyfree_max_bytes)),
        swap_url: word(offset_of!(umm_config, swap_url)) as *const c_char,
    }
}

/// Reads the caller's `struct umm_config` at `addr` (non-null): `EFAULT`
/// for unreadable memory (the struct or its `swap_dir` string),
/// `ENAMETOOLONG` for a `swap_dir` with no NUL in `PATH_MAX` bytes,
/// `EINVAL` for a `size` too small.
fn read_config(addr: usize) -> Result<Config, Errno> {
    // Read the size first: an older caller's struct may be shorter than
    // ours, and then the rest must not be read.
    let size = read_usize(None, addr)?;
    if size < SPEC_CONFIG_SIZE {
        return Err(Errno::EINVAL);
    }
    // A shorter struct (SPEC's, or an older usermm's): read its whole
    // fields, default the rest (same layout, a prefix of ours; usermm's own
    // fields are 8 bytes each).
    let mut b = config_to_bytes(&config_to_c(&Config::default()));
    let n = size.min(CONFIG_SIZE) / 8 * 8;
    copy_in(None, &mut b[..n], addr)?;
    let c = config_from_bytes(&b);
    let swap_dir = if c.swap_dir.is_null() {
        None
    } else {
        let bytes = c_string_from_own_memory(c.swap_dir as usize, PATH_MAX)?;
        Some(PathBuf::from(OsStr::from_bytes(&bytes)))
    };
    let swap_url = if c.swap_url.is_null() {
        None
    } else {
        let bytes = c_string_from_own_memory(c.swap_url as usize, PATH_MAX)?;
        Some(String::from_utf8(bytes).map_err(|_| Errno::EINVAL)?)
    };
    Ok(Config {
        budget_bytes: c.budget_bytes,
        reserve_bytes: c.reserve_bytes,
        memlock_bytes: c.memlock_bytes,
        swap_bytes: c.swap_bytes,
        swap_dir,
        swap_url,
        max_regions: c.max_regions,
        page_shift: c.page_shift,
        fault_threads: c.fault_threads,
        flags: c.flags,
        lazyfree_max_bytes: c.lazyfree_max_bytes,
    })
}

fn config_to_c(c: &Config) -> umm_config {
    umm_config {
        size: std::mem::size_of::<umm_config>(),
        budget_bytes: c.budget_bytes,
        reserve_bytes: c.reserve_bytes,
        memlock_bytes: c.memlock_bytes,
        swap_bytes: c.swap_bytes,
        swap_dir: std::ptr::null(),
        max_regions: c.max_regions,
        page_shift: c.page_shift,
        fault_threads: c.fault_threads,
        flags: c.flags,
        lazyfree_max_bytes: c.lazyfree_max_bytes,
        swap_url: std::ptr::null(),
    }
}

/// `umm_config_init`: fills `*cfg` with `Config::default()`. NULL is
/// ignored; memory that cannot be written sets `errno` to `EFAULT` (the call
/// returns nothing).
#[no_mangle]
pub extern "C" fn umm_config_init(cfg: *mut umm_config) {
    guard((), || {
        if cfg.is_null() {
            return Ok(());
        }
        copy_out(None, cfg as usize, &config_to_bytes(&config_to_c(&Config::default())))
    })
}

/// `umm_open`: NULL + errno on error; `cfg` NULL means the defaults. A `cfg`
/// (or its `swap_dir`) that cannot be read is `EFAULT`.
#[no_mangle]
pub extern "C" fn umm_open(cfg: *const umm_config) -> *mut umm_space {
    guard(std::ptr::null_mut(), || {
        let config = if cfg.is_null() { Config::default() } else { read_config(cfg as usize)? };
        let s = Space::open(&config)?;
        Ok(Box::into_raw(Box::new(s)) as *mut umm_space)
    })
}

/// `umm_close`: closes and frees the space. `EINVAL` for NULL or the default
/// space (which lives in a static). In a forked child, a space of the parent
/// (the default one included) is only forgotten: 0, and nothing of it is
/// touched.
///
/// # Safety
/// `s` must be NULL or a live handle; it is dangling after this call.
#[no_mangle]
pub unsafe extern "C" fn umm_close(s: *mut umm_space) -> c_int {
    guard(-1, || {
        // SAFETY: `s` is NULL or a live handle (this function's contract).
        match unsafe { space(s) } {
            Err(e) if e == Errno::ESTALE => return Ok(0),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if let Some(Ok(d)) = default_cell().get() {
            if std::ptr::eq(d, s as *const Space) {
                return Err(Errno::EINVAL);
            }
        }
        // SAFETY: a non-null handle other than the default space came from
        // `Box::into_raw` in `umm_open` and, by the ABI's contract, has not
        // been closed yet; it is not used again after this call.
        let space = unsafe { Box::from_raw(s as *mut Space) };
        space.close()?;
        Ok(0)
    })
}
