/*
 * usermm.h: the C ABI of usermm, a user-space virtual-memory manager.
 *
 * A program opens a space (umm_open); the space reserves a virtual range,
 * maps regions in it and serves every page fault in them itself (through
 * userfaultfd), under a resident-memory budget with its own LRU reclaim and
 * swap file. The contract is SPEC.md (section 2 for this header, section 3
 * for the semantics of each call); where it is silent, usermm does what Linux
 * does. Every deviation from Linux, with its reason, is in one table:
 * docs/design.md, "Deviations from Linux (and from the SPEC)".
 *
 * Conventions (SPEC section 2):
 *   - Every call is thread-safe.
 *   - Calls that Linux makes as syscalls return what the syscall returns:
 *     -1 with errno set on error (MAP_FAILED for umm_mmap), with the errno
 *     Linux gives for the same situation.
 *   - Constants are Linux's own (PROT_*, MAP_*, MLOCK_ONFAULT, MCL_*, MADV_*,
 *     MS_*): code written against the syscalls is ported by adding the umm_
 *     prefix and the space argument.
 *   - A NULL space is EINVAL. No call panics or unwinds into C; an internal
 *     error is reported as EIO.
 *   - Caller memory (mincore's vec, the states, stats, report and config
 *     structs, a purge bitmap, swap_dir) is read and written the way the
 *     kernel reads and writes user pointers: memory the caller cannot read
 *     or write (unmapped, read-only, PROT_NONE) is EFAULT, never a signal,
 *     reported after the range's own errors (EINVAL, ENOMEM) as Linux does.
 *     Results are copied out after the call's work is done (a call that
 *     changes state, such as umm_mnovolatile or umm_populate, has made the
 *     change when it reports EFAULT, as wait4 has reaped the child whose
 *     status it cannot store). Caller memory may lie in a space.
 *   - fork: a forked child gets a copy of every space of its parent, as
 *     Linux gives it a copy of its memory (every byte at the same address,
 *     served by the child's own threads under a budget of its own; locks
 *     not inherited; MADV_DONTFORK regions absent, MADV_WIPEONFORK ones
 *     zeros), whatever parent threads held at the fork. A space that cannot
 *     be copied (a MAP_SHARED region, in-thread faults, a frame pool or a
 *     page store) is PROT_NONE in the child (a touch raises SIGSEGV, never a
 *     silent zero), every call on it there fails at once with ESTALE
 *     ("stale handle"), and umm_close only forgets the handle (0); the
 *     default space of usermm_compat.h is then re-opened in the child by its
 *     first call. Done by pthread_atfork handlers: a child made by a raw
 *     clone(2) or vfork is not detected.
 *   - File regions: MAP_SHARED pages are written back on reclaim, msync,
 *     munmap and umm_close; MAP_PRIVATE written pages go to swap, never to
 *     the file. A touch past the end of the file raises SIGBUS. A region's
 *     pages are usermm's copies, not the page cache: a store reaches the
 *     file (and read(2), other mappings) only when the page is written
 *     back (also umm_msync with MS_ASYNC, MADV_DONTNEED), and a write(2) to
 *     the file is seen only by pages read after it.
 *
 * Link with -lusermm (libusermm.so), or with libusermm.a plus
 * -lpthread -ldl -lm.
 */
#ifndef USERMM_H
#define USERMM_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>

/*
 * Linux constants that older C library headers (Debian 12's glibc, or any
 * header in strict ISO C mode) may lack. The values are Linux's (x86-64).
 * <sys/mman.h> and <errno.h> are included above so that these guards see
 * the system's own definitions first, whatever order a program includes
 * headers in.
 */
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS 0x20
#endif
#ifndef MAP_LOCKED
#define MAP_LOCKED 0x2000
#endif
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0x4000
#endif
#ifndef MAP_POPULATE
#define MAP_POPULATE 0x8000
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MADV_FREE
#define MADV_FREE 8
#endif
#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_HWPOISON
#define MADV_HWPOISON 100
#endif
#ifndef MADV_GUARD_INSTALL /* Linux 6.13 */
#define MADV_GUARD_INSTALL 102
#endif
#ifndef MADV_GUARD_REMOVE
#define MADV_GUARD_REMOVE 103
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MCL_CURRENT
#define MCL_CURRENT 1
#endif
#ifndef MCL_FUTURE
#define MCL_FUTURE 2
#endif
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif
#ifndef EHWPOISON
#define EHWPOISON 133
#endif

/*
 * usermm's own mmap flag (a bit Linux does not use; the seed's V3
 * MAP_LOCKONFAULT): alone or with MAP_LOCKED it makes the new region
 * lock-on-fault, charged to the lock limit at once, populated never.
 */
#define UMM_MAP_LOCKONFAULT 0x08000000
/*
 * usermm's own mmap flag (a bit Linux does not use, and ignores): the new
 * region's faults are resolved in the faulting thread, as with
 * UMM_F_INTHREAD_FAULTS for a whole space, while the space's other regions
 * keep its handler threads. The same costs, for this region only: a
 * kernel-mode access (read(2) into it, O_DIRECT, process_vm_readv) to a page
 * not resident fails with EFAULT, threads touching it must not block
 * SIGBUS, and from the first such region on every SIGBUS of the process
 * passes through usermm's handler (umm_sigbus_action; each such mmap puts
 * usermm's handler back in front of one installed since with plain
 * sigaction). Its VmFlags show "it". EOPNOTSUPP where the kernel lacks
 * UFFD_FEATURE_SIGBUS; ENOMEM when 64 spaces already have in-thread faults.
 */
#define UMM_MAP_INTHREAD 0x10000000

/*
 * A fault usermm cannot serve for now (no frame after reclaim, a swap or file
 * read that failed) raises SIGBUS in the faulting thread with si_code
 * SI_QUEUE (-1), si_addr the address touched and si_errno the cause: ENOMEM
 * (no frame), EIO (the page could not be read). If the handler returns, the
 * access is retried. A purged volatile or poisoned page is BUS_ADRERR.
 */

/* umm_page_state bits: one 32-bit word per page. */
#define UMM_PAGE_RESIDENT 0x001u  /* the page has a frame in the space */
#define UMM_PAGE_SWAPPED  0x002u  /* the page's data is in the swap file */
#define UMM_PAGE_LOCKED   0x004u  /* reclaim never touches the page */
#define UMM_PAGE_LAZYFREE 0x008u  /* MADV_FREE'd and not written since */
#define UMM_PAGE_VOLATILE 0x010u  /* umm_mvolatile'd: may be purged */
#define UMM_PAGE_PURGED   0x020u  /* purged while volatile */
#define UMM_PAGE_DIRTY    0x040u  /* differs from its backing (swap or file) */
#define UMM_PAGE_POISONED 0x080u  /* MADV_HWPOISON'd: touching it is SIGBUS */
#define UMM_PAGE_INACTIVE 0x100u  /* usermm's own: resident, parked on the
                                     inactive list; next touch is a minor
                                     fault */

/* umm_config.flags bits. */
#define UMM_F_EXACT_FAULTS          0x1u /* fault exactly the touched page */
#define UMM_F_REQUIRE_FULL_UFFD     0x2u /* no user-mode-only fallback: EPERM */
#define UMM_F_NO_BACKGROUND_RECLAIM 0x4u /* direct reclaim only */
#define UMM_F_FORCE_USER_MODE       0x8u /* use the user-mode-only fallback */
#define UMM_F_KEEP_FILE_CACHE      0x10u /* leave file pages in the host page
                                            cache (default: dropped behind) */
#define UMM_F_PURGE_VOLATILE_FIRST 0x20u /* reclaim purges volatile pages
                                            before any other page leaves */
#define UMM_F_INTHREAD_FAULTS      0x40u /* faults resolved in the faulting
                                            thread (a SIGBUS handler usermm
                                            installs): a kernel-mode access
                                            to a non-resident page is EFAULT;
                                            threads must not block SIGBUS */
#define UMM_F_NO_WAKE_AHEAD        0x80u /* no SCHED_IDLE thread keeping the
                                            faulting thread's idle CPU awake
                                            while its fault is served (and,
                                            in-thread, taking half of a
                                            read-only lock-on-fault window) */
#define UMM_F_FRAME_POOL          0x100u /* opt-in: recycle evicted frames into
                                            zero fills and swap-ins of
                                            read-write unlocked regions */
#define UMM_F_COPY_LOCKED_FILES   0x200u /* copy the pages of read-only
                                            MAP_SHARED file regions that are
                                            locked or MADV_SEQUENTIAL into
                                            usermm's frames instead of mapping
                                            the page cache's own pages */

#ifdef __cplusplus
extern "C" {
#endif

/* A space: opaque; created by umm_open, freed by umm_close. */
typedef struct umm_space umm_space;

struct umm_config {
    size_t size;            /* sizeof(struct umm_config): lets the struct grow */
    size_t budget_bytes;    /* resident budget; 0: a quarter of physical memory */
    size_t reserve_bytes;   /* virtual range reserved for the space; 0: 64 GiB */
    size_t memlock_bytes;   /* lock limit; SIZE_MAX: unlimited; 0: mlock -> EPERM */
    size_t swap_bytes;      /* largest swap file; 0: no swap (anon pages unevictable) */
    const char *swap_dir;   /* where the swap file lives; NULL: $TMPDIR or /tmp */
    size_t max_regions;     /* 0: 65530, as vm.max_map_count */
    unsigned page_shift;    /* 0: 12 (4 KiB); up to 21 */
    unsigned fault_threads; /* 0: default (1 on up to 2 CPUs, 2 up to 8, then 4) */
    unsigned flags;         /* UMM_F_* */
    /* usermm's own fields (read only when `size` covers them): */
    size_t lazyfree_max_bytes; /* most lazily freed (MADV_FREE) bytes kept; past
                                * it the oldest are discarded at once; 0: no bound */
    const char *swap_url;   /* a page store instead of the swap file, e.g.
                             * "redis://127.0.0.1:6379/?prefix=app:" (Redis or
                             * Valkey; docs/design.md "Page stores"); NULL: the
                             * swap file. swap_bytes still bounds what goes there.
                             * The space's keys go at umm_close, after the
                             * process exits if it never closes it, and, if it
                             * is killed, at the next open on the server once
                             * its lease (lease_ms=, 30 s) has lapsed. */
};

/* Filled by umm_mnovolatile when `out` is not NULL. */
struct umm_purge_report {
    size_t purged_pages;   /* pages purged since the range was made volatile */
    void *first_purged;    /* lowest purged address, NULL if none */
    uint64_t *bitmap;      /* caller's buffer (one bit per page), may be NULL */
    size_t bitmap_words;   /* words in bitmap */
};

/* Filled by umm_populate when `out` is not NULL. */
struct umm_populate_report {
    size_t populated_bytes; /* bytes made resident as asked */
    void *fail_addr;        /* first failing address, NULL on success */
};

/*
 * Statistics. The caller sets `size` (normally sizeof(struct umm_stats));
 * umm_stats fills only the whole fields that fit in it, so that the struct
 * can grow. Fields a newer caller knows and this library does not are
 * zeroed.
 */
struct umm_stats {
    size_t size;                  /* sizeof, set by the caller */
    uint64_t budget_pages;        /* the budget, in pages */
    uint64_t resident_pages;      /* pages with a frame now */
    uint64_t resident_pages_max;  /* high-water mark of resident_pages */
    uint64_t locked_pages;        /* locked resident pages */
    uint64_t locked_charged_pages;/* pages charged to the lock limit */
    uint64_t swapped_pages;       /* pages whose data is in the swap file */
    uint64_t lazyfree_pages;      /* MADV_FREE'd pages not discarded yet */
    uint64_t volatile_pages;      /* volatile pages not purged yet */
    uint64_t faults;              /* faults served */
    uint64_t major_faults;        /* faults that did I/O (swap or file) */
    uint64_t zero_fills;          /* faults served with a zeroed frame */
    uint64_t swapins;             /* pages read from swap */
    uint64_t swapouts;            /* pages written to swap */
    uint64_t writebacks;          /* shared-file pages written back */
    uint64_t lazyfree_discards;   /* lazily freed pages discarded */
    uint64_t volatile_purges;     /* volatile pages purged */
    uint64_t evictions;           /* pages made non-resident by reclaim */
    uint64_t oom_sigbus;          /* faults that got no frame: one SIGBUS each */
    uint64_t write_lock_hold_ns_max; /* longest exclusive hold of the region lock */
    /* usermm's own fields: */
    uint64_t inactive_pages;      /* resident pages on the inactive list */
    uint64_t minor_faults;        /* faults that mapped an inactive page back */
    uint64_t deactivations;       /* pages moved to the inactive list */
    uint64_t swap_read_errors;    /* swap reads that failed */
    uint64_t swap_write_errors;   /* swap writes that failed */
    uint64_t regions;             /* regions mapped now */
    uint64_t user_mode_only;      /* 1: user-mode-only userfaultfd fallback */
    uint64_t swap_direct_io;      /* 1: swap I/O bypasses the page cache */
    uint64_t host_refusals;       /* zaps the host refused at first (pages locked
                                     behind usermm's back): unlocked or replaced */
    uint64_t swap_write_fails;    /* swap store writes (one call, a run of up to
                                     256 pages) that failed */
    uint64_t swap_backoff_ms;     /* the store refuses writes: pause before it is
                                     tried again (1 ms doubling to 1,000; its pages
                                     stay resident meanwhile); 0: it takes writes */
};

/* Fills *cfg with the defaults (size = sizeof, swap_dir = NULL). NULL is
 * ignored; memory that cannot be written sets errno to EFAULT. */
void umm_config_init(struct umm_config *cfg);

/*
 * Opens a space. cfg NULL: the defaults. NULL + errno on error: EINVAL for
 * a cfg->size smaller than this header's struct or a bad value, EPERM where
 * userfaultfd is refused, ENOMEM when the range cannot be reserved, EFAULT
 * for a cfg or swap_dir that cannot be read, ENAMETOOLONG for a swap_dir
 * with no NUL in PATH_MAX (4096) bytes. With a swap_url, what its server
 * says when open writes, reads and deletes a key of the prefix (its words
 * on stderr): EACCES for a login or key permission refused (WRONGPASS,
 * NOAUTH, NOPERM), ENOMEM for OOM, EROFS for a read-only replica, EAGAIN
 * while it loads its data or a cluster has no master, EIO when it does not
 * answer; EBUSY while another space owns the URL's prefix (holds its lease,
 * waited for 2 s, or is still connected past it: the prefix is one space's;
 * with lease_ms=0 there is no lease, and no such guard).
 */
umm_space *umm_open(const struct umm_config *cfg);

/*
 * Unmaps everything, writes back shared files, stops the space's threads
 * and frees it; nothing may touch its memory afterwards. 0, or -1/EINVAL for
 * NULL or the default space of usermm_compat.h (which is never closed). In
 * a forked child, a space of the parent that was not copied (default or
 * not) is only forgotten: 0.
 */
int umm_close(umm_space *s);

/*
 * mmap(2) (SPEC 3): MAP_FAILED + errno, in Linux's order. EINVAL: unaligned
 * off (first), len 0, not exactly one of MAP_PRIVATE/MAP_SHARED; EBADF: the
 * fd is not open, or is O_PATH (checked right after off); EEXIST:
 * MAP_FIXED_NOREPLACE over a region; ENOMEM: no room or too many regions;
 * EAGAIN/EPERM: MAP_LOCKED beyond the lock limit; EOVERFLOW: a file mapping
 * that would end past the largest file offset (a negative off, or one near
 * INT64_MAX); EOPNOTSUPP: MAP_SHARED_VALIDATE with an unknown flag, or
 * MAP_SYNC; EACCES: the fd's access mode; ENODEV: not a regular file, a
 * block device or /dev/zero (which maps as anonymous memory).
 */
void *umm_mmap(umm_space *s, void *addr, size_t len, int prot, int flags, int fd, off_t off);

/* munmap(2): EINVAL for unaligned addr or len 0; holes are fine. Two-phase
 * (seed 003). Dirty shared-file pages are written back before it returns.
 * EPERM (nothing unmapped) when a region of the range is sealed. */
int umm_munmap(umm_space *s, void *addr, size_t len);

/* mseal(2): seals the range's regions for good. EINVAL: flags not 0, addr
 * unaligned, len rounding or addr+len overflowing; ENOMEM: any page of the
 * range unmapped (nothing sealed). A sealed region refuses umm_munmap,
 * umm_mprotect, MAP_FIXED over it, a mremap (under usermm run) and
 * discarding advice (MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MADV_DONTFORK,
 * MADV_WIPEONFORK, MADV_GUARD_INSTALL) on private anonymous memory that is
 * not writable, with EPERM, as Linux 6.18. */
int umm_mseal(umm_space *s, void *addr, size_t len, unsigned long flags);

/* mprotect(2): EINVAL unaligned/bad prot, ENOMEM holes, EACCES PROT_WRITE on
 * a shared mapping of a read-only fd. */
int umm_mprotect(umm_space *s, void *addr, size_t len, int prot);

/* msync(2): MS_ASYNC/MS_SYNC/MS_INVALIDATE; writes the shared file pages of
 * the range to their files before returning (both modes); MS_SYNC also
 * fdatasyncs the files. EINVAL bad flags or unaligned, ENOMEM holes (the
 * mapped parts are synced), EBUSY MS_INVALIDATE over locked pages, EIO a
 * write-back error since the last msync (reclaim included). */
int umm_msync(umm_space *s, void *addr, size_t len, int flags);

/* mlock(2) = umm_mlock2(s, addr, len, 0). */
int umm_mlock(umm_space *s, const void *addr, size_t len);

/* mlock2(2) (seed 000): EINVAL unknown flags or a volatile page, ENOMEM holes
 * or over the lock limit, EPERM lock limit 0, EAGAIN budget cannot hold the
 * pages (nothing newly locked). MLOCK_ONFAULT: lock on first touch. A
 * locked page swapped in leaves swap: its slot is freed and its stored copy
 * overwritten (the swap file's page, a Redis server's value) before the call
 * returns, or after a fault by the background thread. */
int umm_mlock2(umm_space *s, const void *addr, size_t len, unsigned flags);

/* munlock(2): clears both kinds of lock and uncharges; ENOMEM holes. */
int umm_munlock(umm_space *s, const void *addr, size_t len);

/* mlockall(2): MCL_CURRENT/MCL_FUTURE[/MCL_ONFAULT]; EINVAL 0, unknown bits
 * or MCL_ONFAULT alone; ENOMEM over the lock limit. */
int umm_mlockall(umm_space *s, int flags);

/* munlockall(2): clears every lock and the future flag. */
int umm_munlockall(umm_space *s);

/*
 * madvise(2) (SPEC 3): MADV_NORMAL/RANDOM/SEQUENTIAL, MADV_WILLNEED,
 * MADV_DONTNEED, MADV_FREE (seed 001), MADV_REMOVE (shared regions),
 * MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ/WRITE (seed 004),
 * MADV_DONTDUMP/DODUMP (passed to the host: the pages stay out of core
 * dumps), MADV_GUARD_INSTALL/REMOVE (private regions: a touch raises
 * SIGSEGV), MADV_HWPOISON; fork, KSM and THP advice are accepted with no
 * effect; MADV_COLLAPSE and MADV_DONTNEED_LOCKED are EINVAL. The table of
 * what each does on a space: docs/design.md, "Advice on a space". EINVAL
 * unknown advice or unaligned; ENOMEM holes (the mapped parts are still
 * advised).
 */
int umm_madvise(umm_space *s, void *addr, size_t len, int advice);

/* Seed 002: marks the range volatile: its pages may be purged at any time
 * (instead of being swapped) until umm_mnovolatile; until then they keep
 * their data and are accessed with no fault. Touching a purged page while it
 * is volatile raises SIGBUS in the touching thread with si_code BUS_ADRERR
 * and si_addr the address touched. EINVAL unaligned or a locked page in the
 * range; ENOMEM holes (the mapped parts are marked). */
int umm_mvolatile(umm_space *s, void *addr, size_t len);

/* Seed 002: makes the range non-volatile; returns 1 if any page was purged
 * since it was marked volatile, 0 if none, -1 on error. When it returns no
 * page of the range can be purged any more; purged pages read back as zeros.
 * Fills *out when not NULL: the count, the first purged address, and (when
 * out->bitmap is not NULL) one bit per page of the range in out->bitmap
 * (out->bitmap_words words; bit i%64 of word i/64 is page i). May be called
 * from a SIGBUS handler. EFAULT: *out or its bitmap cannot be read or
 * written (the range has been made non-volatile all the same). */
int umm_mnovolatile(umm_space *s, void *addr, size_t len, struct umm_purge_report *out);

/* sigaction(SIGBUS, act, oldact) for programs with spaces opened with
 * UMM_F_INTHREAD_FAULTS (or regions mapped with UMM_MAP_INTHREAD): while usermm's SIGBUS handler is installed, act
 * becomes the handler it chains to (the SIGBUS that are not a space's
 * faults: a purged or poisoned page, a transient failure, a fault outside
 * every space) and oldact receives the previous one, instead of replacing
 * usermm's handler; otherwise plain sigaction. Either pointer may be NULL.
 * The chained handler runs with its sa_mask but never with SIGBUS blocked
 * (it may touch space memory). 0, or -1 with errno. */
struct sigaction;
int umm_sigbus_action(const struct sigaction *act, struct sigaction *oldact);

/*
 * mincore(2): one byte per page in vec (bit 0: resident), ceil(len/page)
 * bytes. Errors in Linux's order: EINVAL unaligned addr; ENOMEM a range past
 * the user address space; EFAULT a vec past it; then the walk: the bytes up
 * to the first hole are copied to vec (EFAULT if vec cannot take them: NULL,
 * read-only, unmapped) and a hole (or memory outside the space) is ENOMEM.
 */
int umm_mincore(umm_space *s, void *addr, size_t len, unsigned char *vec);

/* One word of UMM_PAGE_* bits per page for npages pages from addr (aligned);
 * errors as umm_mincore (states NULL, read-only or unmapped is EFAULT). */
int umm_page_state(umm_space *s, const void *addr, size_t npages, uint32_t *states);

/* Seed 004: madvise(MADV_POPULATE_READ/WRITE) that also reports, in *out
 * when not NULL (on failure too), how many bytes from addr were populated
 * and the first failing address (NULL on success). Errors as madvise:
 * EINVAL other advice or protection, ENOMEM holes/budget, EFAULT backing
 * I/O, EHWPOISON, EINTR interrupted (Linux: a fatal signal; usermm: the
 * space is being closed — a populate stops at a page boundary and reports
 * exactly what it did). EFAULT: *out cannot be written after a populate
 * that succeeded (the range is populated; a failed populate reports its own
 * errno). */
int umm_populate(umm_space *s, void *addr, size_t len, int advice, struct umm_populate_report *out);

/* Statistics (see struct umm_stats): EINVAL for NULL or out->size < 8,
 * EFAULT for an out (of out->size bytes) that cannot be read or written. */
int umm_stats(umm_space *s, struct umm_stats *out);

/* Writes one entry per region in /proc/PID/smaps's layout to fd; VmFlags
 * has usermm's own "um" (served by usermm) and "uo" (user-mode-only
 * fallback). Errors: write(2)'s (EBADF, ...). */
int umm_smaps(umm_space *s, int fd);

/* usermm extension, a test hook: the next `reads` swap reads and `writes`
 * swap writes fail with EIO. 0, or -1/EINVAL for NULL. */
int umm_debug_inject_swap_errors(umm_space *s, unsigned reads, unsigned writes);

/* usermm extension (usermm_compat.h): the process-wide default space,
 * opened once from the USERMM_* environment variables (see
 * usermm_compat.h); NULL + errno if it could not be opened. Never closed.
 * A forked child has its copy (where it was not copied, the child's first
 * call opens a default space of its own). */
umm_space *umm_default_space(void);

/* usermm extension: a heap on the space (docs/design.md, "A heap on a
 * space"). Blocks up to 16 KiB come from size classes on slabs of the
 * space (a per-thread cache in front), larger ones from arenas of the
 * space (talc) or, from 256 KiB, from regions of their own, so they live
 * under the space's budget,
 * reclaim, swap and locks like any of its memory. Semantics of malloc(3)
 * and friends: 16-byte alignment; umm_malloc(s, 0) gives a unique pointer;
 * umm_realloc(s, NULL, n) is umm_malloc, umm_realloc(s, p, 0) frees p and
 * returns NULL, and on failure leaves p alone; umm_calloc zeroes and fails
 * with ENOMEM when n * size overflows; umm_aligned_alloc takes a power of
 * two up to 1 GiB (EINVAL otherwise). Failure: NULL + ENOMEM (EINVAL for a
 * NULL space). umm_free(s, NULL) does nothing. A pointer that is not a live
 * block -- freed already (a double free, of a block of any size), never
 * allocated here, or pointing into a block rather than at its start -- is
 * refused, never a crash: umm_free frees nothing (and writes a message on
 * stderr, once a process), umm_realloc returns NULL with errno EINVAL and
 * leaves everything alone, umm_malloc_usable_size returns 0. Two limits,
 * as with free(3): a freed pointer that a later allocation returned again
 * is live again, and a pointer into the heap's memory that no call here
 * returned (e.g. into a block, where the block's own bytes happen to form
 * a valid header) is undefined. A double free that races with a thread
 * reusing the block's emptied slab may go unnoticed. Slabs left wholly
 * free and freed blocks of 64 KiB or more give their whole pages back
 * with MADV_FREE; freed large blocks are unmapped. */
void *umm_malloc(umm_space *s, size_t size);
void *umm_calloc(umm_space *s, size_t n, size_t size);
void *umm_realloc(umm_space *s, void *p, size_t size);
void *umm_aligned_alloc(umm_space *s, size_t align, size_t size);
void umm_free(umm_space *s, void *p);
/* At least the size the block was asked with, all of it usable: the size
 * class's for blocks up to 16 KiB, the size asked above; 0 for NULL or a
 * pointer that is not a live block (a freed one included). */
size_t umm_malloc_usable_size(umm_space *s, void *p);
/* 1 if p lies in the space's reservation (umm_free's, not libc's), else 0. */
int umm_heap_owns(umm_space *s, const void *p);

/* What the heap holds, from its own counters (struct umm_stats says what of
 * it is resident, swapped or lazily freed). */
struct umm_heap_stats {
    size_t size;                  /* sizeof, set by the caller */
    uint64_t arena_bytes;         /* arenas (medium blocks) and slab segments (small) mapped */
    uint64_t arenas;              /* arenas and slab segments */
    uint64_t large_bytes;         /* regions of live large blocks (256 KiB and up) */
    uint64_t large_regions;       /* live large blocks, a region each */
    uint64_t live_bytes;          /* live blocks: small ones at their class's size */
    uint64_t live_allocations;    /* live blocks of every size */
    uint64_t lazily_freed_bytes;  /* given back to the space with MADV_FREE so far */
};

/* The heap's counters into *out: the whole words after out->size that fit
 * in out->size bytes (a larger struct's tail zeroed). 0, or -1 with errno:
 * EINVAL for a NULL space or out, or out->size < 8; EFAULT for an out (of
 * out->size bytes) that cannot be read or written. */
int umm_heap_stats(umm_space *s, struct umm_heap_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* USERMM_H */
