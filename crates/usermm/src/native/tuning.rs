//! Every spin budget, wait and size the executor trades latency for, in one
//! place: what each trades, and the measurement that decided it where there
//! was one (the numbers are this project's 2-vCPU VM's; docs/design.md
//! gives the context). Nothing else in the executor spins, polls or waits
//! on a timer of its own.
//!
//! # Under the core lock
//! The only work done under the core lock that these numbers bound:
//! [`SMALL_FILL_PAGES`] (a small fill's install and wake-up), and the
//! spinning acquisition of the lock itself ([`LOCK_SPIN_NS`], by a thread
//! that does not hold it). Every wait below sleeps on a condition variable
//! with the core lock let go, or holds no lock at all.

// ---- the core lock

/// How long a thread that a faulting thread waits on (a handler, an
/// in-thread resolve) tries for the core lock before it sleeps on it
/// (`native::lock_spinning`): the longest holds by other threads are a large
/// unmap's per-chunk bookkeeping (30–90 µs). Sleeping there lets the vCPU
/// halt, and the hypervisor then wakes it up to a millisecond late while a
/// large unmap frees memory (`perf`: a handler blocked on the core lock
/// held by the zap's chunk bookkeeping, woken 18 µs later, running again
/// 0.9–1.5 ms later, the faulting thread waiting all that time;
/// docs/design.md, "Seed 003").
pub(super) const LOCK_SPIN_NS: u64 = 150_000;

// ---- the handler threads

/// How long a handler spins for the next fault after serving one: a
/// program that faults in a loop faults again a few microseconds after it
/// is woken, and catching that without a wake-up of the handler saves most
/// of a round trip. Only one handler spins at a time, never for longer
/// than this, yielding the CPU on every turn.
pub(super) const HANDLER_SPIN_NS: u64 = 100_000;

/// How long an idle handler sleeps for a fault message or a poke of the
/// space's eventfd before it looks at shutdown again (ms). Close pokes
/// the eventfd, so this only bounds a missed poke.
pub(super) const HANDLER_POLL_MS: i32 = 200;

/// How old an answer of where a faulting thread runs may be
/// (`Inner::delegates_wake`): a thread moves between CPUs far less often
/// than it faults, and a read of it costs about 1 µs.
pub(super) const THREAD_CPU_AGE_NS: u64 = 100_000;

/// Fills up to this many pages are installed, and their thread woken,
/// under the core lock, with their commit: the woken thread observes
/// nothing before the commit, and its wake-up overlaps the commit instead
/// of waiting for a separate wake ioctl. Larger runs (fault-around and
/// read-around windows) are installed without it, in pieces of this many
/// pages that wake their waiters as they go in (a 256-page window takes
/// 0.3 ms to fill, 1.5 ms on memory the host must fault in).
pub(super) const SMALL_FILL_PAGES: u64 = 16;

/// An in-thread fault's file read of at least this many pages is installed
/// in two halves at once (`Inner::install_split`); below, the hand-off
/// costs more than half the copy saves.
pub(super) const SPLIT_MIN_PAGES: usize = 4;

/// Spare page-table leaves a top-up hands the core at a time
/// (`Inner::refill_spares`): a program that faults one page per leaf uses a
/// leaf every few microseconds, and the first leaves must reach the core
/// before the whole top-up is made.
pub(super) const SPARE_LEAVES_BATCH: usize = 16;

// ---- the wake-ahead thread (`native/awake.rs`)

/// The longest the wake-ahead thread spins for one wake-up (a fault
/// waiting on reclaim or on I/O may take longer: the CPU then idles as it
/// would without it).
pub(super) const WAKE_AHEAD_MAX_SPIN_NS: u64 = 2_000_000;

/// How long the wake-ahead thread spins while only brief fills are in
/// flight and none is served (`WakeAhead::guard_brief`): a small zero fill
/// takes 2–50 µs, and a handler queued behind the `SCHED_IDLE` spinner on
/// its CPU waited the whole 2 ms cap beside a large unmap.
pub(super) const WAKE_AHEAD_BRIEF_SPIN_NS: u64 = 200_000;

/// How long the wake-ahead thread goes on spinning after the last fault is
/// served: a program faulting in a loop faults again within microseconds,
/// and its CPU is then still awake.
pub(super) const WAKE_AHEAD_GRACE_NS: u64 = 100_000;

/// How long the wake-ahead thread sleeps before it looks at shutdown again
/// (ms): a `begin` or close wakes it sooner.
pub(super) const WAKE_AHEAD_SLEEP_MS: u64 = 200;

// ---- out of frames, and a store that refuses writes (`native/reclaim.rs`)

/// How long a fault or populate that found no frame waits for reclaim in
/// flight elsewhere to settle before it plans again (µs; 0 in the
/// simulation, where nothing runs meanwhile).
pub(super) const OOM_WAIT_US: u64 = 5_000;

/// The first pause after a failed store write.
pub(super) const STORE_BACKOFF_FIRST_NS: u64 = 1_000_000;

/// The longest pause between two tries of a store that keeps failing: at
/// most one failing write a second once it is reached (about a dozen in
/// the first two seconds).
pub(super) const STORE_BACKOFF_MAX_NS: u64 = 1_000_000_000;

/// How long after its start a fault short of frames still waits for the
/// store's next try rather than being out of memory: pauses of 1, 2, 4, 8
/// and 16 ms fit (five failures in a row), so a fault behind a store that
/// is down gets its SIGBUS within about 30 ms. A store that comes back by
/// itself (a Redis Cluster with replicas, during a failover:
/// `PageStore::outage_wait`) is waited for that long instead.
pub(super) const STORE_RETRY_WAIT_NS: u64 = 40_000_000;

// ---- the background thread (`native/background.rs`)

/// How long the background thread sleeps with nothing to do before it
/// looks again (ms): a fill that leaves free frames low pokes it sooner.
pub(super) const BACKGROUND_IDLE_MS: u64 = 100;

/// How long pressure must stay calm — the budget never ran out, no refill
/// to the high watermark began, free frames at or above the low one —
/// before it is over and the parked pages go back (ms; `Core::ease_if_calm`,
/// docs/design.md "Pressure's end"). Pressure that goes on stirs it every
/// few hundred microseconds (a refill per `low` frames claimed); a program
/// that pauses longer than this between bursts pays a bulk map-back (about
/// 1 µs a parked page, in the background) instead of a fault (5-15 µs) per
/// parked page it touches after the pause.
pub(super) const CALM_MS: u64 = 10;

/// Parked pages the background thread maps back per core-lock round once
/// pressure is over: a fault on one of them waits for at most this many
/// moves.
pub(super) const UNPARK_BATCH: usize = 64;

/// The background thread's pause after a round that evicted nothing (it
/// only aged pages, or nothing is evictable): a moment for the program to
/// touch what was just deactivated, instead of spinning (ms). A queued
/// read-in cuts it short (`Inner::pause`).
pub(super) const NOTHING_EVICTED_PAUSE_MS: u64 = 2;

/// The background thread's pause after a round that could age nothing
/// (the active list holds only pages that cannot leave): it waits for the
/// program instead of spinning on a CPU (ms).
pub(super) const NOTHING_AGED_PAUSE_MS: u64 = 10;

// ---- region calls and zaps

/// How long a `MAP_FIXED` over a range still being unmapped waits for the
/// unmap to settle before it tries again (ms; a settle wakes it sooner).
pub(super) const MMAP_BUSY_WAIT_MS: u64 = 10;

/// Zap and unmap work is done in chunks of this many bytes, so that neither
/// usermm's region lock nor the kernel's mmap lock is held for long.
pub(super) const ZAP_CHUNK_BYTES: usize = 4 << 20;

/// A chunk's pages are dropped this many bytes at a time, with a yield of
/// the CPU between two slices: a thread woken on this CPU (a fault just
/// served) waits for one slice, not for the whole chunk.
pub(super) const ZAP_SLICE_BYTES: usize = 512 << 10;

/// A swap read-ahead's first batch: the pages nearest the fault that
/// started it (the program, walking on, reaches them first and waits for
/// their batch; one batch of a whole window, 25-50 pages, took 0.5-1 ms
/// here, 4 pages take 0.09 ms).
pub(super) const AHEAD_FIRST_PAGES: usize = 4;

/// The batches the rest of a read-ahead window is read in, nearest first,
/// each installed as it completes, so that the program walks on over them
/// meanwhile (16 random reads: 0.25 ms here). (Reading the rest in the
/// background thread instead freed the handler sooner but delayed the
/// window behind reclaim: `bench reclaim` seq-read 0.8x, scan 0.65x, and
/// ~175 evictions in `fits`.)
pub(super) const AHEAD_BATCH_PAGES: usize = 16;
