//! The host kernel's own memory, for baselines: what `usermm report` measures
//! usermm against.
//!
//! - [`HostMap`]: an anonymous private kernel mapping (plain `mmap`), owned,
//!   that derefs to a byte slice and unmaps on drop or by [`HostMap::unmap`].
//!   Invariant: `[addr, addr+len)` is a readable and writable mapping of this
//!   process for as long as the `HostMap` lives, and nothing else unmaps it.
//!   [`HostMap::shared_anon`] makes the same kind of owned mapping with
//!   `MAP_SHARED | MAP_ANONYMOUS` (shmem-backed; this process never forks it
//!   away, so it stays ours alone).
//! - [`process_faults`]: the process's minor and major page-fault counts
//!   (`getrusage(RUSAGE_SELF)`), to count the kernel's faults in a run;
//!   [`thread_faults`], the calling thread's (`RUSAGE_THREAD`).
//! - [`reset_peak_rss`] / [`rss_kib`]: `/proc/self/clear_refs` "5" (resets
//!   `VmHWM` to the current RSS) and the `VmRSS` / `VmHWM` lines of
//!   `/proc/self/status`: the process-wide resident peak of a run.
//! - [`map_unmap_pair`]: one `mmap` + `munmap` of a small fresh region (the
//!   "second thread" of the munmap experiment; the caller times it).
//! - [`disk_write_bandwidth`]: the sequential `O_DIRECT` write bandwidth of
//!   the file system holding a directory (the yardstick for swap-out
//!   throughput).
//! - [`HostFileMap`], [`fadvise`], [`peek_u64`]: a read-only shared file
//!   mapping read by volatile 8-byte loads, `posix_fadvise`, and an 8-byte
//!   volatile load at an address (a usermm space's memory): the `outofcore`
//!   experiment's baselines.
//! - [`HostFileMap::open_prot`], [`HostFileMap::mlock`]/[`HostFileMap::mlock2`]/
//!   [`HostFileMap::mprotect`], [`SegvBatchLocker`], [`peek_u8`] and
//!   [`page_cache_layout`]: the `lockonfault` experiment's kernel rows (the
//!   seed's mlock variants and its SIGSEGV + `mprotect`/`mlock` batch
//!   handler) and the check of how the host page cache holds the file
//!   (4 KiB pages or large folios).
//! - [`SigbusFloorMap`]: an anonymous mapping whose faults raise SIGBUS in
//!   the faulting thread and are resolved by usermm's SIGBUS handler with
//!   one ioctl each (the `fault` experiment's floor under in-thread faults).
//!
//! # Fault model
//! Every call can fail with the errno the kernel gives; nothing here panics
//! on a syscall error.
//!
//! # Where each concern lives
//!
//! | file                 | what                                                       |
//! |----------------------|------------------------------------------------------------|
//! | `host/anon.rs`       | `HostMap`, `map_unmap_pair`                                |
//! | `host/usage.rs`      | `process_faults`, `thread_faults`, `reset_peak_rss`, `rss_kib` |
//! | `host/disk.rs`       | `DiskWrite`, `disk_write_bandwidth`                        |
//! | `host/file.rs`       | `HostFileMap` and its lock calls, `fadvise`, `peek_*`      |
//! | `host/segv.rs`       | `SegvBatchLocker` and its SIGSEGV handler                  |
//! | `host/page_cache.rs` | `page_cache_layout` (`PageCacheLayout`, `FolioSample`), `resident_pages` |
//! | `host/sigbus_floor.rs` | `SigbusFloorMap`: faults resolved in the faulting thread with one ioctl each |
//!
//! Everything is re-exported here: paths stay `usermm_sys::host::X`.

mod anon;
mod disk;
mod file;
mod page_cache;
mod segv;
mod sigbus_floor;
mod usage;

pub use anon::{map_unmap_pair, HostMap};
pub use disk::{disk_write_bandwidth, DiskWrite};
pub use file::{fadvise, peek_u64, peek_u8, HostFileMap};
pub use page_cache::{page_cache_layout, resident_pages, FolioSample, PageCacheLayout};
pub use segv::SegvBatchLocker;
pub use sigbus_floor::SigbusFloorMap;
pub use usage::{process_faults, reset_peak_rss, rss_kib, thread_faults};

/// The `posix_fadvise` advice values [`fadvise`] takes.
pub use libc::{POSIX_FADV_DONTNEED, POSIX_FADV_NORMAL, POSIX_FADV_RANDOM, POSIX_FADV_SEQUENTIAL};
