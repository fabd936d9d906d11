/*
 * test_malloc.c: a program written against malloc/calloc/realloc/
 * aligned_alloc/free, compiled with USERMM_MALLOC=1 against
 * usermm_compat.h (so its heap is the default space's), and the umm_malloc
 * family on a space of its own. Run by crates/usermm/tests/c_abi.rs.
 *
 * The default space gets a 4 MiB budget (setenv without overwriting): the
 * program allocates some 40 MiB in blocks of 1 byte to 1 MiB, so most of
 * its heap is swapped out while every byte is checked. It also checks the
 * LTP mlock01 case (mlock of a malloc'd buffer locks space memory), C
 * library pointers through the redirected free/realloc, a refused double
 * free (also of blocks of 256 KiB and more, whose memory the first free
 * unmapped), two threads allocating and freeing at once, every other
 * allocation entry point of the C library (posix_memalign, memalign, valloc,
 * pvalloc, reallocarray, malloc_usable_size, and free and malloc taken as
 * function pointers), and umm_heap_stats.
 *
 * The last line of output is "N passed, M failed"; the exit status is 0 only
 * when nothing failed.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define USERMM_MALLOC 1
#include "usermm_compat.h"

/* After the compat header: nothing of it undone, no clash. */
#include <malloc.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The byte at offset i of block k. */
static unsigned char pat(size_t k, size_t i) { return (unsigned char)(k * 131 + i * 7 + (i >> 12)); }

static void fill(unsigned char *p, size_t k, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = pat(k, i);
}

/* The number of bytes of block k that are wrong. */
static size_t wrong(const unsigned char *p, size_t k, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != pat(k, i);
    return bad;
}

static struct umm_stats stats(umm_space *s) {
    struct umm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(umm_stats(s, &st) == 0);
    return st;
}

#define NBLOCKS 1500

static void under_pressure(void) {
    static unsigned char *blk[NBLOCKS];
    static size_t len[NBLOCKS];
    size_t total = 0, bad = 0;
    for (size_t k = 0; k < NBLOCKS; k++) {
        uint64_t r = rng();
        /* Mostly small and medium, one in 50 large (a region of its own). */
        len[k] = r % 50 == 0 ? (256u << 10) + r % (768u << 10) : 1 + (r >> 8) % (48u << 10);
        blk[k] = malloc(len[k]);
        if (!blk[k]) {
            CHECK(blk[k] != NULL);
            return;
        }
        CHECK(((uintptr_t)blk[k] & 15) == 0);
        fill(blk[k], k, len[k]);
        total += len[k];
    }
    CHECK(total > (32u << 20));
    for (size_t k = 0; k < NBLOCKS; k++)
        bad += wrong(blk[k], k, len[k]);
    CHECK(bad == 0);
    /* Free every other block; grow or shrink the rest (contents kept). */
    for (size_t k = 0; k < NBLOCKS; k += 2) {
        free(blk[k]);
        blk[k] = NULL;
    }
    for (size_t k = 1; k < NBLOCKS; k += 2) {
        size_t n = k % 4 == 1 ? len[k] * 2 + 1 : len[k] / 2 + 1;
        unsigned char *q = realloc(blk[k], n);
        CHECK(q != NULL);
        if (!q)
            continue;
        size_t keep = n < len[k] ? n : len[k];
        bad += wrong(q, k, keep);
        blk[k] = q;
        len[k] = n;
        fill(q, k, n);
    }
    CHECK(bad == 0);
    /* Reuse the freed room, then check everything once more. */
    for (size_t k = 0; k < NBLOCKS; k += 2) {
        len[k] = 1 + rng() % 4000;
        blk[k] = calloc(1, len[k]);
        CHECK(blk[k] != NULL);
        if (!blk[k])
            continue;
        size_t nonzero = 0;
        for (size_t i = 0; i < len[k]; i++)
            nonzero += blk[k][i] != 0;
        CHECK(nonzero == 0);
        fill(blk[k], k, len[k]);
    }
    for (size_t k = 0; k < NBLOCKS; k++)
        bad += blk[k] ? wrong(blk[k], k, len[k]) : 0;
    CHECK(bad == 0);
    struct umm_stats st = stats(umm_default_space());
    printf("pressure: %zu MiB in %d blocks; budget %llu pages, swapouts %llu, swapins %llu\n", total >> 20, NBLOCKS,
           (unsigned long long)st.budget_pages, (unsigned long long)st.swapouts, (unsigned long long)st.swapins);
    CHECK(st.swapouts > 0);
    CHECK(st.swapins > 0);
    for (size_t k = 0; k < NBLOCKS; k++)
        free(blk[k]);
}

static void semantics(void) {
    umm_space *s = umm_default_space();
    CHECK(s != NULL);

    void *z = malloc(0);
    void *z2 = malloc(0);
    CHECK(z != NULL && z2 != NULL && z != z2);
    free(z);
    free(z2);
    free(NULL);

    void *a = aligned_alloc(4096, 10000);
    CHECK(a != NULL && ((uintptr_t)a & 4095) == 0);
    memset(a, 0x5a, 10000);
    unsigned char *a2 = realloc(a, 20000);
    CHECK(a2 != NULL && ((uintptr_t)a2 & 4095) == 0 && a2[9999] == 0x5a);
    free(a2);
    /* glibc 2.36's aligned_alloc is memalign: any alignment rounded up to
     * a power of two; EINVAL above 2^63, ENOMEM when none is found. */
    void *a3 = aligned_alloc(3, 64);
    CHECK(a3 != NULL && ((uintptr_t)a3 & 3) == 0);
    free(a3);
    errno = 0;
    CHECK(aligned_alloc(((size_t)1 << 63) + 1, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(aligned_alloc((size_t)1 << 40, 64) == NULL && errno == ENOMEM);
    void *pm = NULL;
    CHECK(posix_memalign(&pm, (size_t)1 << 40, 64) == ENOMEM && pm == NULL);

    errno = 0;
    CHECK(calloc(SIZE_MAX / 2, 4) == NULL && errno == ENOMEM);
    CHECK(umm_malloc_usable_size(s, NULL) == 0);
    void *u = malloc(123);
    CHECK(umm_malloc_usable_size(s, u) >= 123);
    CHECK(umm_heap_owns(s, u) == 1);
    /* realloc(p, 0) frees p and returns NULL (glibc). */
    CHECK(realloc(u, 0) == NULL);

    /* C library pointers go back to the C library. */
    char *d = strdup("not from the space");
    CHECK(d != NULL && umm_heap_owns(s, d) == 0);
    d = realloc(d, 4096);
    CHECK(d != NULL && strcmp(d, "not from the space") == 0 && umm_heap_owns(s, d) == 0);
    free(d);

    /* A double free is refused, and the heap goes on working. */
    char *x = malloc(100);
    memset(x, 1, 100);
    free(x);
    free(x);
    char *y = malloc(100);
    CHECK(y != NULL);
    memset(y, 2, 100);
    free(y);

    /* LTP mlock01: mlock of a malloc'd buffer locks space memory. */
    size_t n = 1u << 20;
    char *buf = malloc(n);
    CHECK(buf != NULL);
    CHECK(mlock(buf, n) == 0);
    struct umm_stats st = stats(s);
    CHECK(st.locked_pages >= (n >> 12) - 1);
    CHECK(munlock(buf, n) == 0);
    free(buf);
}

static struct umm_heap_stats heap_stats(umm_space *s) {
    struct umm_heap_stats h;
    memset(&h, 0, sizeof h);
    h.size = sizeof h;
    CHECK(umm_heap_stats(s, &h) == 0);
    return h;
}

/* Every entry point, glibc's semantics, on the default space's heap. */
static void entry_points(void) {
    umm_space *s = umm_default_space();
    CHECK(s != NULL);
    if (!s)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    void *p = (void *)1;
    CHECK(posix_memalign(&p, 3, 10) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, sizeof(void *) / 2, 10) == EINVAL);
    CHECK(posix_memalign(&p, 256, 1000) == 0 && ((uintptr_t)p & 255) == 0 && umm_heap_owns(s, p));
    memset(p, 3, 1000);
    CHECK(malloc_usable_size(p) >= 1000);
    free(p);

    unsigned char *m = memalign(100, 10); /* rounded up to 128 */
    CHECK(m != NULL && ((uintptr_t)m & 127) == 0 && umm_heap_owns(s, m));
    free(m);
    m = valloc(10);
    CHECK(m != NULL && ((uintptr_t)m & (page - 1)) == 0 && umm_heap_owns(s, m));
    free(m);
    m = pvalloc(1);
    CHECK(m != NULL && ((uintptr_t)m & (page - 1)) == 0 && malloc_usable_size(m) >= page);
    memset(m, 4, page);
    free(m);
    errno = 0;
    CHECK(pvalloc(SIZE_MAX - 10) == NULL && errno == ENOMEM);

    errno = 0;
    CHECK(reallocarray(NULL, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
    unsigned char *r = reallocarray(NULL, 10, 10);
    CHECK(r != NULL && umm_heap_owns(s, r) && malloc_usable_size(r) >= 100);
    if (r) {
        fill(r, 9, 100);
        unsigned char *r2 = reallocarray(r, 100, 10);
        CHECK(r2 != NULL && wrong(r2, 9, 100) == 0);
        free(r2);
    }

    /* malloc_usable_size of the C library's blocks is the C library's. */
    char *d = strdup("the C library's");
    CHECK(d != NULL && !umm_heap_owns(s, d) && malloc_usable_size(d) >= 16);
    free(d);
    CHECK(malloc_usable_size(NULL) == 0);

    /* Taken as function pointers, they are the space's too. */
    void *(*mal)(size_t) = malloc;
    void (*fre)(void *) = free;
    void *(*rea)(void *, size_t) = realloc;
    struct umm_heap_stats h0 = heap_stats(s);
    unsigned char *f = mal(50);
    CHECK(f != NULL && umm_heap_owns(s, f));
    struct umm_heap_stats h1 = heap_stats(s);
    CHECK(h1.live_allocations == h0.live_allocations + 1 && h1.live_bytes >= h0.live_bytes + 50);
    f = rea(f, 60);
    CHECK(f != NULL && umm_heap_owns(s, f));
    fre(f);
    struct umm_heap_stats h2 = heap_stats(s);
    CHECK(h2.live_allocations == h0.live_allocations && h2.arenas >= 1 && h2.arena_bytes > 0);

    /* A large block shows in the large counters until it is freed (past
     * 32 MiB: a smaller one comes from an arena once a large block of its
     * size was freed, as glibc's dynamic mmap threshold). */
    void *big = malloc(40u << 20);
    struct umm_heap_stats h3 = heap_stats(s);
    CHECK(big != NULL && h3.large_regions == h2.large_regions + 1 && h3.large_bytes >= h2.large_bytes + (40u << 20));
    free(big);
    CHECK(heap_stats(s).large_regions == h2.large_regions);

    /* umm_heap_stats' errors, and a short struct gets only what fits. */
    errno = 0;
    CHECK(umm_heap_stats(s, NULL) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(umm_heap_stats(NULL, &h0) == -1 && errno == EINVAL);
    struct umm_heap_stats tiny;
    memset(&tiny, 0x77, sizeof tiny);
    tiny.size = 4;
    errno = 0;
    CHECK(umm_heap_stats(s, &tiny) == -1 && errno == EINVAL);
    tiny.size = 16;
    CHECK(umm_heap_stats(s, &tiny) == 0 && tiny.arena_bytes > 0 && tiny.arenas == 0x7777777777777777ULL);
    errno = 0;
    CHECK(umm_heap_stats(s, (struct umm_heap_stats *)8) == -1 && errno == EFAULT);

    /* A pointer into a small block, or at a free slot of a slab, is
     * refused, and the block is still whole. */
    unsigned char *sm = malloc(64);
    CHECK(sm != NULL);
    if (sm) {
        fill(sm, 5, 64);
        free(sm + 16);
        CHECK(malloc_usable_size(sm + 16) == 0 && wrong(sm, 5, 64) == 0 && malloc_usable_size(sm) >= 64);
        free(sm);
        free(sm);
        CHECK(malloc_usable_size(sm) == 0);
    }
}

static void *churn(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    size_t bad = 0;
    unsigned char *keep[64] = {0};
    size_t klen[64] = {0};
    for (int i = 0; i < 20000; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int j = (int)((seed >> 33) % 64);
        if (keep[j]) {
            bad += wrong(keep[j], (size_t)j + (size_t)arg, klen[j]);
            free(keep[j]);
        }
        klen[j] = 1 + (seed >> 40) % 20000;
        keep[j] = malloc(klen[j]);
        if (!keep[j])
            return (void *)1;
        fill(keep[j], (size_t)j + (size_t)arg, klen[j]);
    }
    for (int j = 0; j < 64; j++) {
        bad += wrong(keep[j], (size_t)j + (size_t)arg, klen[j]);
        free(keep[j]);
    }
    return (void *)(uintptr_t)(bad != 0);
}

static void threads(void) {
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, churn, (void *)(i * 1000 + 1)) == 0);
    for (int i = 0; i < 2; i++) {
        void *r = NULL;
        CHECK(pthread_join(t[i], &r) == 0);
        CHECK(r == NULL);
    }
}

/* The umm_ calls on a space of the program's own. */
static void own_space(void) {
    struct umm_config c;
    umm_config_init(&c);
    c.budget_bytes = 1u << 20;
    c.swap_bytes = 64u << 20;
    umm_space *s = umm_open(&c);
    CHECK(s != NULL);
    if (!s)
        return;
    unsigned char *p[64];
    for (size_t k = 0; k < 64; k++) {
        p[k] = umm_malloc(s, 64u << 10);
        CHECK(p[k] != NULL && umm_heap_owns(s, p[k]) == 1 && umm_heap_owns(umm_default_space(), p[k]) == 0);
        fill(p[k], k, 64u << 10);
    }
    size_t bad = 0;
    for (size_t k = 0; k < 64; k++)
        bad += wrong(p[k], k, 64u << 10);
    CHECK(bad == 0);
    for (size_t k = 0; k < 64; k++)
        umm_free(s, p[k]);
    errno = 0;
    CHECK(umm_malloc(NULL, 1) == NULL && errno == EINVAL);
    CHECK(umm_close(s) == 0);
}

/* Frees, reallocs and usable sizes of pointers that are not live blocks are
 * refused (umm_free: nothing freed; umm_realloc: NULL + EINVAL;
 * umm_malloc_usable_size: 0), never a crash, whatever the block's size:
 * a large block (256 KiB or more) is a region of its own that its first
 * free unmapped, so its header must not be read again. */
static void refused_after_free(void) {
    struct umm_config c;
    umm_config_init(&c);
    c.budget_bytes = 8u << 20;
    c.swap_bytes = 64u << 20;
    umm_space *s = umm_open(&c);
    CHECK(s != NULL);
    if (!s)
        return;
    static const size_t sizes[] = {1, 100, 100u << 10, (256u << 10) - 16, 256u << 10, 1u << 20, 5u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int aligned = 0; aligned < 2; aligned++) {
            size_t n = sizes[k];
            unsigned char *p = aligned ? umm_aligned_alloc(s, 4096, n) : umm_malloc(s, n);
            CHECK(p != NULL);
            if (!p)
                continue;
            fill(p, k, n);
            CHECK(wrong(p, k, n) == 0 && umm_malloc_usable_size(s, p) >= n);
            umm_free(s, p);
            CHECK(umm_malloc_usable_size(s, p) == 0);
            errno = 0;
            CHECK(umm_realloc(s, p, n + 1) == NULL && errno == EINVAL);
            CHECK(umm_realloc(s, p, 0) == NULL);
            umm_free(s, p);
            /* The heap goes on working, and a new block of the same size
             * is whole. */
            unsigned char *q = umm_malloc(s, n);
            CHECK(q != NULL);
            if (q) {
                fill(q, k + 1, n);
                CHECK(wrong(q, k + 1, n) == 0);
                umm_free(s, q);
            }
        }
    }
    /* A pointer into the middle of a live large block, and one into a
     * region that is no block (mapped, then unmapped): refused. */
    unsigned char *big = umm_malloc(s, 1u << 20);
    CHECK(big != NULL);
    if (big) {
        fill(big, 7, 1u << 20);
        umm_free(s, big + 8192);
        CHECK(umm_malloc_usable_size(s, big + 8192) == 0);
        CHECK(wrong(big, 7, 1u << 20) == 0 && umm_malloc_usable_size(s, big) == 1u << 20);
        /* Grown in place or moved, then shrunk: still one live block. */
        big = umm_realloc(s, big, 3u << 20);
        CHECK(big != NULL && wrong(big, 7, 1u << 20) == 0);
        big = umm_realloc(s, big, 300u << 10);
        CHECK(big != NULL && wrong(big, 7, 300u << 10) == 0 && umm_malloc_usable_size(s, big) == 300u << 10);
        umm_free(s, big);
        CHECK(umm_malloc_usable_size(s, big) == 0);
        umm_free(s, big);
    }
    unsigned char *m = umm_mmap(s, NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    if (m != MAP_FAILED) {
        CHECK(umm_munmap(s, m, 1u << 20) == 0);
        umm_free(s, m + 64);
        CHECK(umm_malloc_usable_size(s, m + 64) == 0);
    }
    struct umm_stats st = stats(s);
    CHECK(st.resident_pages <= st.budget_pages);
    CHECK(umm_close(s) == 0);
}

int main(void) {
    setenv("USERMM_BUDGET_BYTES", "4m", 0);
    setenv("USERMM_SWAP_BYTES", "256M", 0);
    setenv("USERMM_RESERVE_BYTES", "0x100000000", 0);
    semantics();
    entry_points();
    under_pressure();
    threads();
    own_space();
    refused_after_free();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
