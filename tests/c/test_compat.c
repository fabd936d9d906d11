/*
 * test_compat.c: a program written against the plain calls (mmap, munmap,
 * madvise, mincore), compiled against usermm through usermm_compat.h and
 * run by crates/usermm/tests/c_abi.rs.
 *
 * It configures the default space through the environment (setenv without
 * overwriting, so that the runner can pass other values): a 4 MiB budget and
 * a 64 MiB swap file. Run as `test_compat bad-env` it expects the runner to
 * have set a malformed USERMM_BUDGET_BYTES, and checks that the calls then
 * fail with EINVAL.
 *
 * The last line of output is "N passed, M failed"; the exit status is 0 only
 * when nothing failed.
 */
#define _GNU_SOURCE
#include <sys/mman.h>

#include "usermm_compat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (cond) {                                                            \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
        }                                                                      \
    } while (0)

#define PAGE 4096UL
#define LEN (16UL << 20)
#define NPAGES (LEN / PAGE)

static int finish(void) {
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

static void bad_env(void) {
    errno = 0;
    void *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p == MAP_FAILED);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(umm_default_space() == NULL);
    CHECK(errno == EINVAL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "bad-env") == 0) {
        bad_env();
        return finish();
    }
    setenv("USERMM_BUDGET_BYTES", "4m", 0);
    setenv("USERMM_SWAP_BYTES", "64M", 0);
    setenv("USERMM_RESERVE_BYTES", "0x40000000", 0);

    unsigned char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED) {
        perror("mmap");
        return finish();
    }
    umm_space *s = umm_default_space();
    CHECK(s != NULL);
    CHECK(umm_default_space() == s); /* opened once */

    /* 4x the budget: the pattern survives eviction to swap. */
    for (size_t i = 0; i < NPAGES; i++)
        memset(p + i * PAGE, (int)(i % 251) + 1, PAGE);
    size_t bad = 0;
    for (size_t i = 0; i < NPAGES; i++)
        for (size_t j = 0; j < PAGE; j += 512)
            bad += p[i * PAGE + j] != (unsigned char)(i % 251 + 1);
    CHECK(bad == 0);

    /* MADV_DONTNEED drops the pages: they read back as zeros. */
    CHECK(madvise(p, 64 * PAGE, MADV_DONTNEED) == 0);
    size_t nonzero = 0;
    for (size_t i = 0; i < 64 * PAGE; i++)
        nonzero += p[i] != 0;
    CHECK(nonzero == 0);
    CHECK(p[64 * PAGE] == (unsigned char)(64 % 251 + 1));

    unsigned char vec[4];
    CHECK(mincore(p, 4 * PAGE, vec) == 0);
    CHECK((vec[0] & 1) == 1);

    struct umm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.faults > 0);
    CHECK(st.budget_pages == (4UL << 20) / PAGE);
    CHECK(st.swapouts > 0);
    CHECK(st.resident_pages_max <= st.budget_pages);
    CHECK(st.regions == 1);

    errno = 0;
    CHECK(umm_close(s) == -1 && errno == EINVAL); /* the default space stays */

    CHECK(munmap(p, LEN) == 0);
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.regions == 0);
    CHECK(st.resident_pages == 0);
    errno = 0;
    CHECK(munmap(p + 1, PAGE) == -1 && errno == EINVAL);

    return finish();
}
