//! The C ABI (`include/usermm.h`): a thin layer over [`Space`].
//!
//! Invariants of this module:
//! - Nothing panics or unwinds into C: every body runs under
//!   [`std::panic::catch_unwind`] (the crate is built with `panic=unwind`), and
//!   a panic is reported as `-1`/`EIO`.
//! - Errors are `-1` (or `MAP_FAILED` for `umm_mmap`) with `errno` set to
//!   exactly what the Rust API returned; a NULL space is `EINVAL`.
//! - Caller memory is read and written the way the kernel reads and writes
//!   user pointers (except by the heap calls, which read the header of the
//!   blocks they handed out directly, as `free(3)` does): never dereferenced, only copied with
//!   [`copy_from_own_memory`](usermm_sys::ffi::copy_from_own_memory) /
//!   [`copy_to_own_memory`](usermm_sys::ffi::copy_to_own_memory) (`process_vm_readv` /
//!   `process_vm_writev` on our own pid), so a read-only, `PROT_NONE` or
//!   unmapped pointer is `EFAULT`, never a signal. Results are computed into
//!   an internal buffer first and copied out afterwards; the range's own
//!   errors (`EINVAL`, `ENOMEM`) come before `EFAULT`, as on Linux. On the
//!   user-mode-only fallback, caller memory in the call's own space is
//!   populated through the space before a copy is retried
//!   (`copy::retry_populated`).
//! - No lock of the space is held while caller memory is read or written:
//!   this module only touches caller memory before calling the Rust API
//!   (arguments) or after it returned (results). Caller memory may itself
//!   live in the space: the copy is then a kernel-mode fault that the
//!   space's handler threads serve.
//! - A `umm_space *` is a `Box<Space>` turned into a raw pointer by
//!   `umm_open` and back by `umm_close`, except for the process-wide default
//!   space (`umm_default_space`, for `usermm_compat.h`), which lives in a
//!   leaked per-fork-generation cell and is never closed.
//! - fork: a handle of a space opened before a fork is stale in the child;
//!   every call on it is `ESTALE` at once ([`Space::check_owner`], an atomic
//!   load before any lock), and `umm_close` only forgets it.
//! - Every exported function that takes a space handle is an `unsafe extern
//!   "C" fn`: the handle is the one pointer it trusts (the header's
//!   contract); turning it into a `&Space` is the only dereference, in
//!   `space`.
//!
//! # Where each concern lives
//!
//! | file                    | what                                                                       |
//! |-------------------------|----------------------------------------------------------------------------|
//! | `capi.rs` (this)        | the C structs, `guard` (errors, panics), `space` (the handle)              |
//! | `capi/copy.rs`          | caller memory: `access_ok`, `copy_in`/`copy_out`, populate retry           |
//! | `capi/lifecycle.rs`     | `struct umm_config`, `umm_config_init`, `umm_open`, `umm_close`            |
//! | `capi/default_space.rs` | `umm_default_space` and its `USERMM_*` configuration                       |
//! | `capi/memory.rs`        | `umm_mmap`, `umm_munmap`, `umm_mprotect`, `umm_msync`, `umm_madvise`, `umm_mseal` |
//! | `capi/lock.rs`          | `umm_mlock`, `umm_mlock2`, `umm_munlock`, `umm_mlockall`, `umm_munlockall` |
//! | `capi/volatile.rs`      | `umm_mvolatile`, `umm_mnovolatile`, `umm_populate`, their reports          |
//! | `capi/introspect.rs`    | `umm_mincore`, `umm_page_state`, `umm_stats`, `umm_smaps`, test hook       |
//! | `capi/heap.rs`          | `umm_malloc`, `umm_calloc`, `umm_realloc`, `umm_aligned_alloc`, `umm_free` |
//!
//! Every exported symbol is re-exported here, so its Rust path stays
//! `usermm::capi::umm_*`.

#![deny(unsafe_op_in_unsafe_fn)]

mod copy;
mod default_space;
mod heap;
mod introspect;
mod lifecycle;
mod lock;
mod memory;
mod volatile;

use std::ffi::{c_char, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use usermm_sys::ffi::{as_ref, set_errno};

use crate::{Errno, Space};

pub use default_space::umm_default_space;
pub use heap::{
    umm_aligned_alloc, umm_calloc, umm_free, umm_heap_owns, umm_heap_stats, umm_malloc, umm_malloc_usable_size,
    umm_realloc,
};
pub use introspect::{
    umm_debug_inject_swap_errors, umm_mincore, umm_page_state, umm_smaps, umm_stats, STATS_SIZE, STATS_WORDS,
};
pub use lifecycle::{umm_close, umm_config_init, umm_open};
pub use lock::{umm_mlock, umm_mlock2, umm_mlockall, umm_munlock, umm_munlockall};
pub use memory::{umm_madvise, umm_mmap, umm_mprotect, umm_mseal, umm_msync, umm_munmap};
pub use volatile::{umm_mnovolatile, umm_mvolatile, umm_populate, umm_sigbus_action};

/// The opaque `umm_space` of the C ABI (really a [`Space`]).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_space {
    _private: [u8; 0],
}

/// `struct umm_config` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umm_config {
    pub size: usize,
    pub budget_bytes: usize,
    pub reserve_bytes: usize,
    pub memlock_bytes: usize,
    pub swap_bytes: usize,
    pub swap_dir: *const c_char,
    pub max_regions: usize,
    pub page_shift: c_uint,
    pub fault_threads: c_uint,
    pub flags: c_uint,
    /// usermm's own, read only when `size` covers them.
    pub lazyfree_max_bytes: usize,
    pub swap_url: *const c_char,
}

/// The size of `struct umm_config` as SPEC §2 defines it (up to `flags`):
/// a caller built against that struct passes this size, and usermm's own
/// fields then keep their defaults.
const SPEC_CONFIG_SIZE: usize = std::mem::offset_of!(umm_config, lazyfree_max_bytes);

/// `struct umm_purge_report` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_purge_report {
    pub purged_pages: usize,
    pub first_purged: *mut c_void,
    pub bitmap: *mut u64,
    pub bitmap_words: usize,
}

/// `struct umm_populate_report` (SPEC §2).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct umm_populate_report {
    pub populated_bytes: usize,
    pub fail_addr: *mut c_void,
}

/// `MAP_FAILED`.
const MAP_FAILED: *mut c_void = !0usize as *mut c_void;

/// Runs `f`, turning an error into `errno` + `fail` and a panic into
/// `errno = EIO` + `fail`.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, Errno>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e.raw());
            fail
        }
        Err(payload) => {
            // Dropping the payload could itself panic; forgetting it leaks a
            // few bytes once per bug, which is the lesser evil at an ABI.
            std::mem::forget(payload);
            set_errno(Errno::EIO.raw());
            fail
        }
    }
}

/// The space behind a C handle; `EINVAL` for NULL, `ESTALE` for a space
/// opened by the parent of a forked child (checked before anything else,
/// see [`Space::check_owner`]).
///
/// # Safety
/// `s` must be NULL or a live handle: returned by `umm_open` and not yet
/// passed to `umm_close`, or returned by `umm_default_space` (in this
/// process or, before a fork, in its parent: the handle's memory was copied
/// into the child). The space must stay open for `'a`.
unsafe fn space<'a>(s: *mut umm_space) -> Result<&'a Space, Errno> {
    // SAFETY: guaranteed by the caller; a live handle points to a `Space`,
    // which is `Sync`.
    let sp = unsafe { as_ref(s as *const Space) }.ok_or(Errno::EINVAL)?;
    sp.check_owner()?;
    Ok(sp)
}

#[cfg(test)]
mod tests {
    use std::ffi::c_int;

    use super::introspect::stats_words;
    use super::*;
    use crate::Stats;

    /// `struct umm_stats` in include/usermm.h: `size`, then exactly
    /// `STATS_FIELDS`, each a `uint64_t` and a field of `Stats`.
    #[test]
    fn stats_fields_match_the_header() {
        use super::introspect::STATS_FIELDS;
        let h = include_str!("../../../../include/usermm.h");
        let body = h.split("struct umm_stats {").nth(1).expect("struct umm_stats in the header");
        let mut body = &body[..body.find("};").expect("its end")];
        // The declarations, comments (some over several lines) left out.
        let mut code = String::new();
        while let Some(i) = body.find("/*") {
            code += &body[..i];
            body = &body[i + body[i..].find("*/").expect("comment end") + 2..];
        }
        code += body;
        let fields: Vec<(&str, &str)> = code
            .split(';')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                let (ty, name) = d.rsplit_once(char::is_whitespace).expect("type and name");
                (ty.trim(), name)
            })
            .collect();
        assert_eq!(fields[0], ("size_t", "size"));
        let names: Vec<&str> = fields[1..].iter().map(|f| f.1).collect();
        assert_eq!(names, STATS_FIELDS, "the header's fields, in order");
        assert!(fields[1..].iter().all(|f| f.0 == "uint64_t"), "{fields:?}");
        let s = Stats::default();
        let unknown: Vec<&str> = STATS_FIELDS.iter().copied().filter(|n| s.get(n).is_none()).collect();
        assert!(unknown.is_empty(), "header fields Stats does not have: {unknown:?}");
    }

    #[test]
    fn stats_layout_matches_header() {
        // The header's struct: size_t size + 19 SPEC fields + 11 of usermm's.
        assert_eq!(STATS_WORDS, 19 + 11);
        assert_eq!(stats_words(&Stats::default()).len(), STATS_WORDS);
        // SPEC §2's struct is 72 bytes on x86-64; usermm's own fields follow.
        assert_eq!(SPEC_CONFIG_SIZE, 72);
        assert_eq!(std::mem::size_of::<umm_config>(), 88);
    }

    #[test]
    fn null_space_is_einval() {
        // SAFETY: NULL is a valid argument (EINVAL).
        let r = unsafe { umm_munmap(std::ptr::null_mut(), std::ptr::null_mut(), 4096) };
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EINVAL.raw()));
        // SAFETY: as above.
        assert_eq!(unsafe { umm_close(std::ptr::null_mut()) }, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EINVAL.raw()));
    }

    #[test]
    fn panic_becomes_eio() {
        let r: c_int = guard(-1, || panic!("boom"));
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(Errno::EIO.raw()));
    }
}
