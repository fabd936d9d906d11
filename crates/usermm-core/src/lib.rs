//! The pure core of usermm.
//!
//! This crate decides; it never acts. It holds the region tree, the per-page
//! state table, the LRU lists, the budget, the swap-slot and staging-slot
//! allocators, and makes every errno decision of the contract (SPEC §3). It has
//! no `libc`, performs no syscalls, reads no clock and contains no `unsafe`.
//! The native executor (crate `usermm`) carries its decisions out with
//! userfaultfd, `madvise` and file I/O and reports the outcome back.
//!
//! # Call protocol
//!
//! Every operation that touches pages is split in phases, as Linux's `mm/`
//! splits metadata changes from page work:
//!
//! 1. a *plan* call (`fault`, `reclaim_plan`, `zap_begin`, …) validates, changes
//!    metadata, and *claims* the pages it hands out by putting them in a busy
//!    state (`Filling`, `Deactivating`, `Evicting`, `Zapping`);
//! 2. the executor performs the page work without holding the core;
//! 3. a *done* call (`fill_done`, `deactivate_done`, `evict_done`, `zap_end`)
//!    commits the outcome and releases the claim.
//!
//! A plan never hands out a busy page, so two executors never work on the
//! same page at once; a fault on a busy page is told to wait.
//!
//! `Core::validate` walks the whole state and asserts every invariant; tests
//! call it after each step.

#![forbid(unsafe_code)]

pub mod consts;
pub mod core;
pub mod errno;
pub mod lru;
pub mod page;
pub mod region;
pub mod rng;
pub mod slots;
pub mod smaps;
pub mod types;

pub use crate::core::*;
pub use errno::Errno;
pub use types::*;
