/*
 * usermm_compat.h: compile an existing program against usermm unchanged
 * (SPEC section 2, last paragraph).
 *
 * Including this header after the system headers maps the plain names
 *
 *     mmap munmap mprotect madvise mincore mlock mlock2 munlock
 *     mlockall munlockall msync
 *
 * onto the same calls of a process-wide default space (umm_default_space()),
 * by function-like macros: `mmap(a, l, p, f, fd, o)` becomes
 * `umm_mmap(umm_default_space(), a, l, p, f, fd, o)`. Only calls written in
 * the translation units that include this header are redirected; the C
 * library's own mappings (malloc, stdio, thread stacks) stay with the kernel,
 * and taking a function's address (`&mmap`) still names the kernel's call.
 *
 * Raw syscalls bypass usermm. Code that calls the kernel directly on a
 * space's memory -- syscall(__NR_mlock2, ...), syscall(__NR_madvise, ...),
 * or a raw mlock, mprotect, munmap or mremap (both upstream test suites, LTP
 * and the kernel's mm selftests, do this) -- changes the host mapping while
 * usermm's regions, page states, locks and statistics stay as they were:
 *
 *   mlock/mlock2  the pages are locked in the host only (not in
 *                 locked_pages, Locked: or UMM_PAGE_LOCKED, not charged to
 *                 the lock limit); usermm's next zap of them (munmap,
 *                 MAP_FIXED, MADV_DONTNEED) unlocks or replaces them, counted
 *                 in umm_stats.host_refusals.
 *   madvise       MADV_DONTNEED drops frames usermm holds as resident: the
 *                 next touch refills such a page with zeros (as Linux reads
 *                 it); usermm still counts it resident.
 *   mprotect      only the host's protection changes (SIGSEGV SEGV_ACCERR
 *                 from the kernel; umm_smaps shows usermm's protection).
 *   munmap/mremap the host mapping is gone: a touch of the old range is a
 *                 kernel SIGSEGV (SEGV_MAPERR) until usermm's own munmap of
 *                 it, which replaces the mapping (host_refusals).
 *
 * Use the redirected names (or the umm_ calls) on space memory. Every
 * deviation from Linux, with its reason, is in docs/design.md, "Deviations
 * from Linux (and from the SPEC)"; these are under "Raw syscalls on space
 * memory".
 *
 * The default space is opened once, lazily, by the first call (thread-safe),
 * from these environment variables; unset or empty means usermm's default:
 *
 *   USERMM_BUDGET_BYTES    resident budget          (default: 1/4 of RAM)
 *   USERMM_RESERVE_BYTES   virtual range reserved   (default: 64 GiB)
 *   USERMM_SWAP_BYTES      largest swap file; 0: no swap (default: 8 GiB)
 *   USERMM_SWAP_DIR        swap file directory      (default: $TMPDIR or /tmp)
 *   USERMM_SWAP_URL        a page store instead of the swap file, e.g.
 *                          redis://127.0.0.1:6379/?prefix=app: (default: none)
 *   USERMM_MEMLOCK_BYTES   lock limit (RLIMIT_MEMLOCK analogue); 0: every
 *                          lock request is EPERM     (default: unlimited)
 *   USERMM_MAX_REGIONS     region limit              (default: 65530)
 *   USERMM_PAGE_SHIFT      log2 of the page size, 12..21 (default: 12)
 *   USERMM_FAULT_THREADS   fault handler threads     (default: 1 up to 2 CPUs,
 *                          2 up to 8, then 4)
 *   USERMM_FLAGS           UMM_F_* bits, as a number (default: 0)
 *   USERMM_LAZYFREE_MAX_BYTES  most lazily freed bytes kept; 0: no bound
 *                          (default: 0)
 *
 * Byte counts are decimal or 0x-prefixed hex, with an optional binary suffix
 * k, m, g or t (USERMM_BUDGET_BYTES=64m); "unlimited" (or "max") means
 * SIZE_MAX. A malformed value makes the open fail with EINVAL.
 *
 * If the default space cannot be opened, a message on stderr says why (once)
 * and every redirected call fails with EINVAL (mmap returns MAP_FAILED).
 * The default space is never closed: at exit its memory simply goes away,
 * so write shared file mappings back with msync or munmap before exiting.
 * Its swap file has no name and goes with the process; the keys of a
 * USERMM_SWAP_URL server are deleted once the process has gone, exit
 * handlers and all (a process killed outright: at the next open on that
 * server after its lease lapsed; docs/design.md, "Page stores").
 * umm_close(umm_default_space()) is EINVAL.
 *
 * After fork, the child has a copy of the default space (every byte, at the
 * same addresses; MAP_SHARED regions stay shared with the parent, as the
 * host's memory from that fork on). Where the copy fails (no descriptor
 * left, for one) the parent's regions are not accessible in the child (a touch raises SIGSEGV), and its first
 * redirected call opens a default space of its own (same environment),
 * empty. docs/design.md, "fork".
 */
#ifndef USERMM_COMPAT_H
#define USERMM_COMPAT_H

/* The system's declarations first, so that the macros below do not rewrite
 * them. */
#include <sys/mman.h>

#include "usermm.h"

#undef mmap
#undef munmap
#undef mprotect
#undef madvise
#undef mincore
#undef mlock
#undef mlock2
#undef munlock
#undef mlockall
#undef munlockall
#undef msync

#define mmap(addr, len, prot, flags, fd, off) \
    umm_mmap(umm_default_space(), (addr), (len), (prot), (flags), (fd), (off))
#define munmap(addr, len) umm_munmap(umm_default_space(), (addr), (len))
#define mprotect(addr, len, prot) umm_mprotect(umm_default_space(), (addr), (len), (prot))
#define madvise(addr, len, advice) umm_madvise(umm_default_space(), (addr), (len), (advice))
#define mincore(addr, len, vec) umm_mincore(umm_default_space(), (addr), (len), (vec))
#define mlock(addr, len) umm_mlock(umm_default_space(), (addr), (len))
#define mlock2(addr, len, flags) umm_mlock2(umm_default_space(), (addr), (len), (flags))
#define munlock(addr, len) umm_munlock(umm_default_space(), (addr), (len))
#define mlockall(flags) umm_mlockall(umm_default_space(), (flags))
#define munlockall() umm_munlockall(umm_default_space())
#define msync(addr, len, flags) umm_msync(umm_default_space(), (addr), (len), (flags))

/*
 * Opt-in: the C heap too. Compiled with USERMM_MALLOC defined to 1
 * (-DUSERMM_MALLOC=1, or #define before including this header), every
 * allocation entry point of the C library,
 *
 *     malloc calloc realloc reallocarray free aligned_alloc posix_memalign
 *     memalign valloc pvalloc malloc_usable_size
 *
 * written in these translation units -- called, or taken as a function
 * pointer -- allocates from the default space's heap (umm_malloc and
 * friends, usermm.h): the blocks live under its budget, reclaim, swap and
 * locks, so that mlock() of a malloc'd buffer locks space memory. free,
 * realloc, reallocarray and malloc_usable_size take any pointer: one
 * outside the default space (from strdup, getline or another translation
 * unit's malloc) goes to the C library's own. If the default space cannot
 * be opened, the allocating calls fail with ENOMEM (the message above says
 * why), and the C library's pointers still work. Semantics are glibc's:
 * posix_memalign returns EINVAL for an alignment that is not a power of two
 * multiple of sizeof(void *); memalign and aligned_alloc (glibc 2.36's)
 * round any other alignment up to a power of two (EINVAL above 2^63,
 * ENOMEM when no block has it: the heap aligns up to 1 GiB); valloc and pvalloc align to the page,
 * pvalloc rounds the size up to whole pages; reallocarray fails with ENOMEM
 * when n * size overflows. umm_heap_stats (usermm.h) says what the heap
 * holds.
 *
 * The names are object-like macros (so that `free` passed as a pointer is
 * the space's too), defined after <stdlib.h> and <malloc.h> (<cstdlib> in
 * C++) are included here, so including those again later changes nothing.
 * One consequence: any other identifier spelled like one of the names in
 * these translation units (a struct member called `free`) is renamed with
 * it, consistently.
 */
#if defined(USERMM_MALLOC) && USERMM_MALLOC
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<malloc.h>)
#include <malloc.h>
#define USERMM_COMPAT_HAVE_MALLOC_H 1
#endif
#endif
#ifdef __cplusplus
#include <cstdlib>
#endif

#undef malloc
#undef calloc
#undef realloc
#undef reallocarray
#undef aligned_alloc
#undef posix_memalign
#undef memalign
#undef valloc
#undef pvalloc
#undef malloc_usable_size
#undef free

/* The default space, or NULL with errno ENOMEM. */
static inline umm_space *usermm_compat_heap(void) {
    umm_space *s = umm_default_space();
    if (!s)
        errno = ENOMEM;
    return s;
}

/* Whether p is a block of the default space's heap. */
static inline int usermm_compat_owns(void *p) {
    umm_space *s = umm_default_space();
    return p && s && umm_heap_owns(s, p);
}

static inline void *usermm_compat_malloc(size_t n) {
    umm_space *s = usermm_compat_heap();
    return s ? umm_malloc(s, n) : NULL;
}

static inline void *usermm_compat_calloc(size_t n, size_t size) {
    umm_space *s = usermm_compat_heap();
    return s ? umm_calloc(s, n, size) : NULL;
}

/* memalign's alignment: a power of two, at least 16 (glibc rounds up);
 * 0 when there is none that large. */
static inline size_t usermm_compat_align(size_t align) {
    size_t a = 16;
    while (a < align && a <= SIZE_MAX / 2)
        a <<= 1;
    return a >= align ? a : 0;
}

static inline void *usermm_compat_memalign(size_t align, size_t n) {
    umm_space *s;
    void *p;
    size_t a = usermm_compat_align(align);
    if (!a) {
        errno = EINVAL;
        return NULL;
    }
    s = usermm_compat_heap();
    if (!s)
        return NULL;
    p = umm_aligned_alloc(s, a, n);
    /* The heap refuses alignments above 1 GiB (EINVAL): glibc says ENOMEM
     * when it cannot find such a block. */
    if (!p && errno == EINVAL)
        errno = ENOMEM;
    return p;
}

static inline void *usermm_compat_aligned_alloc(size_t align, size_t n) {
    return usermm_compat_memalign(align, n);
}

static inline int usermm_compat_posix_memalign(void **out, size_t align, size_t n) {
    void *p;
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    p = usermm_compat_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

static inline size_t usermm_compat_page(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

static inline void *usermm_compat_valloc(size_t n) {
    return usermm_compat_memalign(usermm_compat_page(), n);
}

static inline void *usermm_compat_pvalloc(size_t n) {
    size_t page = usermm_compat_page();
    if (n > SIZE_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    return usermm_compat_memalign(page, n ? (n + page - 1) / page * page : page);
}

static inline void usermm_compat_free(void *p) {
    if (!p)
        return;
    if (usermm_compat_owns(p))
        umm_free(umm_default_space(), p);
    else
        (free)(p);
}

static inline void *usermm_compat_realloc(void *p, size_t n) {
    umm_space *s;
    if (p && !usermm_compat_owns(p))
        return (realloc)(p, n);
    s = usermm_compat_heap();
    return s ? umm_realloc(s, p, n) : NULL;
}

static inline void *usermm_compat_reallocarray(void *p, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return usermm_compat_realloc(p, n * size);
}

static inline size_t usermm_compat_malloc_usable_size(void *p) {
    if (!p)
        return 0;
    if (usermm_compat_owns(p))
        return umm_malloc_usable_size(umm_default_space(), p);
#ifdef USERMM_COMPAT_HAVE_MALLOC_H
    return (malloc_usable_size)(p);
#else
    return 0;
#endif
}

#define malloc usermm_compat_malloc
#define calloc usermm_compat_calloc
#define realloc usermm_compat_realloc
#define reallocarray usermm_compat_reallocarray
#define aligned_alloc usermm_compat_aligned_alloc
#define posix_memalign usermm_compat_posix_memalign
#define memalign usermm_compat_memalign
#define valloc usermm_compat_valloc
#define pvalloc usermm_compat_pvalloc
#define malloc_usable_size usermm_compat_malloc_usable_size
#define free usermm_compat_free
#ifdef __cplusplus
/* std::malloc and friends (<cstdlib>) are the same functions. */
namespace std {
using ::usermm_compat_aligned_alloc;
using ::usermm_compat_calloc;
using ::usermm_compat_free;
using ::usermm_compat_malloc;
using ::usermm_compat_realloc;
} /* namespace std */
#endif
#endif /* USERMM_MALLOC */

#endif /* USERMM_COMPAT_H */
