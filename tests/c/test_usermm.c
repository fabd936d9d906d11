/*
 * test_usermm.c: the C ABI end to end, compiled against include/usermm.h
 * and linked to libusermm (crates/usermm/tests/c_abi.rs builds and runs it,
 * with -std=c11 -Wall -Wextra -Werror).
 *
 * A space with an 8 MiB budget and swap maps 32 MiB, writes a pattern to
 * every page and reads it back (so pages are evicted to swap and swapped
 * in), then checks statistics, errno values, mincore, page states, the smaps
 * dump and MAP_FIXED_NOREPLACE.
 *
 * The last line of output is "N passed, M failed"; the exit status is 0 only
 * when nothing failed.
 */
#define _GNU_SOURCE
#include "usermm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>

#include "check.h"

/* `expr` (an int call) must fail with -1 and errno `err`. */
#define CHECK_ERR(expr, err)                                                   \
    do {                                                                       \
        errno = 0;                                                             \
        int r_ = (expr);                                                       \
        int e_ = errno;                                                        \
        if (r_ == -1 && e_ == (err)) {                                         \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: %s: got %d errno %d (%s), want -1 %s\n",   \
                    __FILE__, __LINE__, #expr, r_, e_, strerror(e_), #err);    \
        }                                                                      \
    } while (0)

/* `expr` (an umm_mmap call) must fail with MAP_FAILED and errno `err`. */
#define CHECK_MAP_ERR(expr, err)                                               \
    do {                                                                       \
        errno = 0;                                                             \
        void *p_ = (expr);                                                     \
        int e_ = errno;                                                        \
        if (p_ == MAP_FAILED && e_ == (err)) {                                 \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: %s: got %p errno %d (%s), want %s\n",      \
                    __FILE__, __LINE__, #expr, p_, e_, strerror(e_), #err);    \
        }                                                                      \
    } while (0)

#define PAGE 4096UL
#define BUDGET (8UL << 20)
#define MAP_LEN (32UL << 20)
#define NPAGES (MAP_LEN / PAGE)

static uint64_t pattern(size_t page, size_t word) {
    return (uint64_t)page * 0x9E3779B97F4A7C15ULL ^ (uint64_t)word * 0x100000001B3ULL ^ 0x5555;
}

/* Reads fd (positioned at 0) into a NUL-terminated heap buffer. */
static char *slurp(int fd) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = 0;
    return buf;
}

/* Whether `line` looks like "xxxxxxxx-xxxxxxxx rw-p 00000000 00:00 0". */
static int is_smaps_header(const char *line, const char *perms) {
    unsigned long start, end, off, inode;
    unsigned maj, min;
    char p[5];
    if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu", &start, &end, p, &off, &maj, &min, &inode) != 7)
        return 0;
    return start < end && strcmp(p, perms) == 0 && off == 0 && maj == 0 && min == 0 && inode == 0;
}

static void test_config_and_open(void) {
    struct umm_config cfg;
    memset(&cfg, 0xff, sizeof cfg);
    umm_config_init(&cfg);
    CHECK(cfg.size == sizeof cfg);
    CHECK(cfg.swap_dir == NULL);
    CHECK(cfg.memlock_bytes == SIZE_MAX);
    CHECK(cfg.flags == 0);
    CHECK(cfg.page_shift == 0);

    /* A size smaller than the fields the library reads is EINVAL. */
    cfg.size = 16;
    errno = 0;
    CHECK(umm_open(&cfg) == NULL);
    CHECK(errno == EINVAL);

    /* A struct as SPEC 2 defines it (up to `flags`, without usermm's own
     * fields) is accepted; those fields keep their defaults. */
    umm_config_init(&cfg);
    cfg.size = offsetof(struct umm_config, lazyfree_max_bytes);
    cfg.budget_bytes = 4UL << 20;
    cfg.swap_bytes = 0;
    cfg.reserve_bytes = 64UL << 20;
    umm_space *spec_sized = umm_open(&cfg);
    CHECK(spec_sized != NULL);
    if (spec_sized)
        CHECK(umm_close(spec_sized) == 0);

    /* A bad value is the library's EINVAL. */
    umm_config_init(&cfg);
    cfg.page_shift = 30;
    errno = 0;
    CHECK(umm_open(&cfg) == NULL);
    CHECK(errno == EINVAL);

    /* A NULL space is EINVAL everywhere. */
    struct umm_stats st = {.size = sizeof st};
    CHECK_ERR(umm_munmap(NULL, NULL, PAGE), EINVAL);
    CHECK_ERR(umm_stats(NULL, &st), EINVAL);
    CHECK_ERR(umm_close(NULL), EINVAL);
    CHECK_MAP_ERR(umm_mmap(NULL, NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), EINVAL);
}

static void test_evict_and_swap(umm_space *s) {
    unsigned char *p = umm_mmap(s, NULL, MAP_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    CHECK(((uintptr_t)p & (PAGE - 1)) == 0);

    /* Every word of every page: 4x the budget, so most pages go to swap. */
    for (size_t i = 0; i < NPAGES; i++) {
        uint64_t *w = (uint64_t *)(p + i * PAGE);
        for (size_t j = 0; j < PAGE / 8; j++)
            w[j] = pattern(i, j);
    }
    size_t bad = 0;
    for (size_t i = 0; i < NPAGES; i++) {
        const uint64_t *w = (const uint64_t *)(p + i * PAGE);
        for (size_t j = 0; j < PAGE / 8; j++)
            bad += w[j] != pattern(i, j);
    }
    CHECK(bad == 0);
    if (bad)
        fprintf(stderr, "%zu words differ after eviction and swap-in\n", bad);

    struct umm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.size == sizeof st);
    CHECK(st.budget_pages == BUDGET / PAGE);
    CHECK(st.swapouts > 0);
    CHECK(st.swapins > 0);
    CHECK(st.evictions > 0);
    CHECK(st.faults > 0);
    CHECK(st.resident_pages_max <= st.budget_pages);
    CHECK(st.resident_pages <= st.budget_pages);
    CHECK(st.regions == 1);
    CHECK(st.user_mode_only <= 1);
    CHECK(st.swap_direct_io <= 1);
    fprintf(stderr,
            "stats: budget %llu resident %llu max %llu faults %llu swapouts %llu swapins %llu evictions %llu\n",
            (unsigned long long)st.budget_pages, (unsigned long long)st.resident_pages,
            (unsigned long long)st.resident_pages_max, (unsigned long long)st.faults,
            (unsigned long long)st.swapouts, (unsigned long long)st.swapins,
            (unsigned long long)st.evictions);

    /* mincore and page states agree: resident pages fit the budget, and
     * every page is either resident or swapped. */
    unsigned char *vec = malloc(NPAGES);
    uint32_t *states = malloc(NPAGES * sizeof *states);
    CHECK(vec && states);
    if (vec && states) {
        /* The two calls are two snapshots, and background reclaim may move a
         * page between them: retry until they agree (reclaim settles at its
         * watermark). */
        size_t resident = 0, swapped = 0, disagree = 0, neither = 0;
        for (int attempt = 0; attempt < 100; attempt++) {
            CHECK(umm_mincore(s, p, MAP_LEN, vec) == 0);
            CHECK(umm_page_state(s, p, NPAGES, states) == 0);
            resident = swapped = disagree = neither = 0;
            for (size_t i = 0; i < NPAGES; i++) {
                resident += vec[i] & 1;
                swapped += (states[i] & UMM_PAGE_SWAPPED) != 0;
                disagree += (vec[i] & 1) != ((states[i] & UMM_PAGE_RESIDENT) != 0);
                neither += (states[i] & (UMM_PAGE_RESIDENT | UMM_PAGE_SWAPPED)) == 0;
            }
            if (disagree == 0)
                break;
            usleep(10000);
        }
        CHECK(resident > 0);
        CHECK(resident <= BUDGET / PAGE);
        CHECK(swapped > 0);
        CHECK(disagree == 0);
        CHECK(neither == 0);
    }
    free(vec);
    free(states);

    /* Dropped pages read back as zeros and are neither resident nor
     * swapped. */
    CHECK(umm_madvise(s, p, 4 * PAGE, MADV_DONTNEED) == 0);
    size_t nonzero = 0;
    for (size_t i = 0; i < 4 * PAGE; i++)
        nonzero += p[i] != 0;
    CHECK(nonzero == 0);

    CHECK(umm_munmap(s, p, MAP_LEN) == 0);
}

static void test_stats_sizes(umm_space *s) {
    /* The struct can grow: only whole fields inside `size` are written, and
     * fields past the library's struct are zeroed. */
    uint64_t buf[sizeof(struct umm_stats) / 8 + 4];
    memset(buf, 0xAA, sizeof buf);
    buf[0] = 16; /* size + budget_pages */
    CHECK(umm_stats(s, (struct umm_stats *)buf) == 0);
    CHECK(buf[0] == 16);
    CHECK(buf[1] == BUDGET / PAGE);
    CHECK(buf[2] == 0xAAAAAAAAAAAAAAAAULL);

    size_t n = sizeof(struct umm_stats) / 8;
    memset(buf, 0xAA, sizeof buf);
    buf[0] = (n + 2) * 8;
    CHECK(umm_stats(s, (struct umm_stats *)buf) == 0);
    CHECK(buf[1] == BUDGET / PAGE);
    CHECK(buf[n] == 0);
    CHECK(buf[n + 1] == 0);
    CHECK(buf[n + 2] == 0xAAAAAAAAAAAAAAAAULL);

    /* The header's struct is the SPEC's 19 fields plus usermm's 11. */
    CHECK(sizeof(struct umm_stats) == 8 * (1 + 19 + 11));

    struct umm_stats st;
    st.size = 4;
    CHECK_ERR(umm_stats(s, &st), EINVAL);
    CHECK_ERR(umm_stats(s, NULL), EINVAL);
}

static void test_errno(umm_space *s) {
    unsigned char *p = umm_mmap(s, NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    unsigned char vec[16];

    /* mmap */
    CHECK_MAP_ERR(umm_mmap(s, NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), EINVAL);
    CHECK_MAP_ERR(umm_mmap(s, NULL, PAGE, PROT_READ, MAP_ANONYMOUS, -1, 0), EINVAL);
    CHECK_MAP_ERR(umm_mmap(s, NULL, PAGE, PROT_READ, MAP_PRIVATE, 12345, 0), EBADF);
    CHECK_MAP_ERR(umm_mmap(s, p + 4 * PAGE, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
                  EEXIST);

    /* munmap */
    CHECK_ERR(umm_munmap(s, p + 1, PAGE), EINVAL);
    CHECK_ERR(umm_munmap(s, p, 0), EINVAL);

    /* madvise / mprotect */
    CHECK_ERR(umm_madvise(s, p, PAGE, 12345), EINVAL);
    CHECK_ERR(umm_madvise(s, p + 1, PAGE, MADV_DONTNEED), EINVAL);
    CHECK_ERR(umm_mprotect(s, p + 1, PAGE, PROT_READ), EINVAL);

    /* mincore: unaligned, NULL vec (after the range checks), holes, outside
     * the space, and a huge length (an errno, never a huge allocation). */
    CHECK_ERR(umm_mincore(s, p + 1, PAGE, vec), EINVAL);
    CHECK_ERR(umm_mincore(s, p, PAGE, NULL), EFAULT);
    CHECK(umm_munmap(s, p + 8 * PAGE, PAGE) == 0); /* p: AAAAAAAA.AAAAAAA */
    CHECK_ERR(umm_mincore(s, p + 8 * PAGE, PAGE, vec), ENOMEM);
    CHECK_ERR(umm_mincore(s, p + 8 * PAGE, PAGE, NULL), ENOMEM);
    memset(vec, 0xEE, sizeof vec);
    p[0] = 1;
    CHECK_ERR(umm_mincore(s, p, 16 * PAGE, vec), ENOMEM);
    CHECK((vec[0] & 1) == 1); /* filled up to the hole, as Linux does */
    /* A NULL vec over mapped pages and then a hole: Linux fails copying out
     * the mapped part's bytes (EFAULT) before it reaches the hole. Checked
     * on the host kernel too. */
    CHECK_ERR(umm_mincore(s, p, 16 * PAGE, NULL), EFAULT);
    {
        char *h = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(h != MAP_FAILED);
        CHECK(munmap(h + 2 * PAGE, PAGE) == 0);
        errno = 0;
        CHECK(mincore(h, 3 * PAGE, NULL) == -1 && errno == EFAULT);
        munmap(h, 2 * PAGE);
    }
    CHECK_ERR(umm_mincore(s, (void *)((uintptr_t)vec & ~(PAGE - 1)), PAGE, vec), ENOMEM);
    CHECK_ERR(umm_mincore(s, p, SIZE_MAX - 2 * PAGE, vec), ENOMEM);
    CHECK(umm_mincore(s, p, 0, NULL) == 0);

    /* page_state: the same rules. */
    uint32_t states[16];
    CHECK_ERR(umm_page_state(s, p + 1, 1, states), EINVAL);
    CHECK_ERR(umm_page_state(s, p + 8 * PAGE, 1, states), ENOMEM);
    CHECK_ERR(umm_page_state(s, p, 1, NULL), EFAULT);
    CHECK_ERR(umm_page_state(s, p, SIZE_MAX / 2, states), ENOMEM);
    CHECK(umm_page_state(s, p, 1, states) == 0);
    CHECK((states[0] & UMM_PAGE_RESIDENT) != 0);
    CHECK((states[0] & UMM_PAGE_SWAPPED) == 0);

    /* MAP_FIXED_NOREPLACE into the hole works; over a region it is EEXIST. */
    void *q = umm_mmap(s, p + 8 * PAGE, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(q == p + 8 * PAGE);
    CHECK_MAP_ERR(umm_mmap(s, p + 8 * PAGE, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
                  EEXIST);
    CHECK(umm_mincore(s, p, 16 * PAGE, vec) == 0);

    CHECK(umm_munmap(s, p, 16 * PAGE) == 0);
    CHECK(umm_munmap(s, p, 16 * PAGE) == 0); /* holes are fine */
}

/* A touch of an unmapped page: SIGSEGV, caught here and turned back into a
 * return value. usermm's munmap leaves the host protection of the range as
 * it was (an mprotect would hold the kernel's mmap lock exclusively), so the
 * touch reaches the fault handler, which must make it a SIGSEGV — never a
 * zero page. */
static sigjmp_buf segv_jmp;
static volatile sig_atomic_t segv_addr_ok;
static volatile uintptr_t segv_expect;

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    segv_addr_ok = (uintptr_t)si->si_addr == segv_expect;
    siglongjmp(segv_jmp, 1);
}

/* 1 when touching `a` (a write if `write`) raises SIGSEGV at `a`, 0 when it
 * completes (a read stores the byte in *got). */
static int touch_segv(volatile unsigned char *a, int write, unsigned char *got) {
    struct sigaction sa = {0}, old;
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old);
    segv_expect = (uintptr_t)a;
    segv_addr_ok = 0;
    int faulted = 0;
    if (sigsetjmp(segv_jmp, 1) == 0) {
        if (write)
            *a = 0x77;
        else
            *got = *a;
    } else {
        faulted = segv_addr_ok ? 1 : -1;
    }
    sigaction(SIGSEGV, &old, NULL);
    return faulted;
}

/* How many host mappings (lines of /proc/self/maps) overlap [a, a+len). */
static int host_vmas(const void *a, size_t len) {
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0)
        return -1;
    char *maps = slurp(fd);
    close(fd);
    if (!maps)
        return -1;
    int n = 0;
    uintptr_t lo = (uintptr_t)a, hi = lo + len;
    for (char *line = maps; *line;) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx", &start, &end) == 2 && start < hi && end > lo)
            n++;
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    free(maps);
    return n;
}

static void test_touch_after_munmap(umm_space *s) {
    enum { N = 64 };
    unsigned char *p = umm_mmap(s, NULL, N * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    memset(p, 0xab, N * PAGE);
    CHECK(umm_munmap(s, p + 8 * PAGE, 48 * PAGE) == 0);
    unsigned char got = 0;
    /* Resident before the unmap, read and written; never touched again. */
    CHECK(touch_segv(p + 8 * PAGE, 0, &got) == 1);
    CHECK(touch_segv(p + 9 * PAGE + 100, 1, &got) == 1);
    CHECK(touch_segv(p + 55 * PAGE, 0, &got) == 1);
    /* The same page again (now PROT_NONE on the host). */
    CHECK(touch_segv(p + 8 * PAGE, 1, &got) == 1);
    /* The whole hole was made PROT_NONE at the first touch: one host
     * mapping, not one per touched page (the kernel's map count is finite). */
    CHECK(host_vmas(p + 8 * PAGE, 48 * PAGE) == 1);
    /* The neighbours are untouched. */
    CHECK(touch_segv(p + 7 * PAGE, 0, &got) == 0 && got == 0xab);
    CHECK(touch_segv(p + 56 * PAGE, 0, &got) == 0 && got == 0xab);
    /* A new mapping over the hole has its own protection and zero pages:
     * read-only here, so a write is SIGSEGV and a read sees 0. */
    void *q = umm_mmap(s, p + 8 * PAGE, 16 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(q == p + 8 * PAGE);
    CHECK(touch_segv(p + 8 * PAGE, 0, &got) == 0 && got == 0);
    CHECK(touch_segv(p + 9 * PAGE, 1, &got) == 1);
    CHECK(touch_segv(p + 10 * PAGE, 0, &got) == 0 && got == 0);
    /* And read-write: written and read back. */
    void *r = umm_mmap(s, p + 24 * PAGE, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(r == p + 24 * PAGE);
    CHECK(touch_segv(p + 24 * PAGE, 1, &got) == 0);
    CHECK(touch_segv(p + 24 * PAGE, 0, &got) == 0 && got == 0x77);
    /* Still unmapped between the new mappings. */
    CHECK(touch_segv(p + 40 * PAGE, 0, &got) == 1);
    CHECK(umm_munmap(s, p, N * PAGE) == 0);
    CHECK(touch_segv(p, 0, &got) == 1);
    CHECK(touch_segv(p + 24 * PAGE, 0, &got) == 1);
}

static void test_smaps(umm_space *s) {
    unsigned char *p = umm_mmap(s, NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    p[0] = 1;
    p[PAGE] = 2;

    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    int fd = fileno(f);
    CHECK(umm_smaps(s, fd) == 0);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    char *text = slurp(fd);
    fclose(f);
    CHECK(text != NULL);
    if (!text)
        return;
    char first[256] = {0};
    sscanf(text, "%255[^\n]", first);
    CHECK(is_smaps_header(first, "rw-p"));
    unsigned long start = 0, end = 0;
    CHECK(sscanf(first, "%lx-%lx", &start, &end) == 2);
    CHECK(start == (uintptr_t)p && end == (uintptr_t)p + 8 * PAGE);
    CHECK(strstr(text, "\nRss:") != NULL);
    CHECK(strstr(text, "\nSwap:") != NULL);
    CHECK(strstr(text, "\nLocked:") != NULL);
    CHECK(strstr(text, "\nLazyFree:") != NULL);
    CHECK(strstr(text, "\nVmFlags:") != NULL);
    const char *rss = strstr(text, "\nRss:");
    unsigned long rss_kb = 0;
    if (rss)
        CHECK(sscanf(rss, "\nRss: %lu kB", &rss_kb) == 1);
    CHECK(rss_kb >= 8 && rss_kb <= 32);
    if (failed)
        fprintf(stderr, "smaps:\n%s", text);
    free(text);

    CHECK_ERR(umm_smaps(s, -1), EBADF);
    CHECK(umm_munmap(s, p, 8 * PAGE) == 0);
}

static void test_lock_and_populate(umm_space *s) {
    unsigned char *p = umm_mmap(s, NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    uint32_t states[16];

    /* mlock2: unknown flags, holes; lock on fault locks touched pages. */
    CHECK_ERR(umm_mlock2(s, p, PAGE, 2), EINVAL);
    CHECK_ERR(umm_mlockall(s, 0), EINVAL);
    CHECK_ERR(umm_mlockall(s, MCL_ONFAULT), EINVAL);
    CHECK(umm_mlock2(s, p, 4 * PAGE, MLOCK_ONFAULT) == 0);
    p[0] = 7;
    CHECK(umm_page_state(s, p, 1, states) == 0);
    CHECK((states[0] & UMM_PAGE_RESIDENT) != 0);
    CHECK((states[0] & UMM_PAGE_LOCKED) != 0);
    struct umm_stats st = {.size = sizeof st};
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.locked_charged_pages == 4);
    CHECK(umm_munlock(s, p, 4 * PAGE) == 0);
    CHECK(umm_page_state(s, p, 1, states) == 0);
    CHECK((states[0] & UMM_PAGE_LOCKED) == 0);
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.locked_charged_pages == 0);
    CHECK(umm_mlock(s, p + 1, PAGE) == 0); /* widened to the whole page */
    CHECK(umm_page_state(s, p, 1, states) == 0);
    CHECK((states[0] & UMM_PAGE_LOCKED) != 0);
    CHECK(umm_munlockall(s) == 0);

    /* populate: the report says how far it got. */
    struct umm_populate_report rep;
    memset(&rep, 0xff, sizeof rep);
    CHECK(umm_populate(s, p, 8 * PAGE, MADV_POPULATE_WRITE, &rep) == 0);
    CHECK(rep.populated_bytes == 8 * PAGE);
    CHECK(rep.fail_addr == NULL);
    CHECK(umm_page_state(s, p, 8, states) == 0);
    size_t resident = 0;
    for (int i = 0; i < 8; i++)
        resident += (states[i] & UMM_PAGE_RESIDENT) != 0;
    CHECK(resident == 8);
    CHECK(umm_munmap(s, p + 12 * PAGE, PAGE) == 0); /* AAAAAAAAAAAA.AAA */
    memset(&rep, 0xff, sizeof rep);
    CHECK_ERR(umm_populate(s, p + 8 * PAGE, 8 * PAGE, MADV_POPULATE_READ, &rep), ENOMEM);
    CHECK(rep.populated_bytes == 4 * PAGE);
    CHECK(rep.fail_addr == p + 12 * PAGE);
    CHECK_ERR(umm_populate(s, p, PAGE, MADV_DONTNEED, NULL), EINVAL);
    CHECK_ERR(umm_madvise(s, p + 8 * PAGE, 8 * PAGE, MADV_POPULATE_WRITE), ENOMEM);

    CHECK(umm_munmap(s, p, 16 * PAGE) == 0);
}

/* Seed 002 through the C ABI: even chunks volatile, pressure, then
 * umm_mnovolatile reports exactly the purged pages and the odd chunks are
 * intact. */
static void test_volatile(umm_space *s) {
    enum { CHUNKS = 26, CHUNK = 4 * PAGE };
    unsigned char *p = umm_mmap(s, NULL, CHUNKS * CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    for (int i = 0; i < CHUNKS; i++)
        memset(p + i * CHUNK, 'A' + i, CHUNK);
    CHECK_ERR(umm_mvolatile(s, p + 1, PAGE), EINVAL);
    for (int i = 0; i < CHUNKS; i += 2)
        CHECK(umm_mvolatile(s, p + i * CHUNK, CHUNK) == 0);
    /* Pressure: 4x the budget. */
    size_t big = 4 * BUDGET;
    unsigned char *q = umm_mmap(s, NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(q != MAP_FAILED);
    for (int round = 0; round < 2 && q != MAP_FAILED; round++)
        for (size_t off = 0; off < big; off += PAGE)
            q[off] = (unsigned char)round;
    size_t purged_total = 0;
    for (int i = 0; i < CHUNKS; i++) {
        unsigned char *c = p + i * CHUNK;
        if (i % 2) {
            int ok = 1;
            for (int j = 0; j < CHUNK; j++)
                ok &= c[j] == 'A' + i;
            CHECK(ok);
            continue;
        }
        uint64_t bitmap[1] = {~0ULL};
        struct umm_purge_report rep = {.bitmap = bitmap, .bitmap_words = 1};
        int r = umm_mnovolatile(s, c, CHUNK, &rep);
        CHECK(r == (rep.purged_pages > 0));
        purged_total += rep.purged_pages;
        for (int pg = 0; pg < (int)(CHUNK / PAGE); pg++) {
            int was_purged = (bitmap[0] >> pg) & 1;
            CHECK(c[pg * PAGE] == (was_purged ? 0 : 'A' + i));
        }
    }
    struct umm_stats st = {.size = sizeof st};
    CHECK(umm_stats(s, &st) == 0);
    CHECK(purged_total == st.volatile_purges);
    CHECK(purged_total > 0);
    if (q != MAP_FAILED)
        CHECK(umm_munmap(s, q, big) == 0);
    CHECK(umm_munmap(s, p, CHUNKS * CHUNK) == 0);
}

/* Bad caller pointers (issue 16 item 8, LTP mincore01): memory the caller
 * cannot write (a read-only page, an unmapped page, a kernel address) is
 * EFAULT, as the kernel's own mincore says, never a signal. Each call runs
 * under a SIGSEGV/SIGBUS catcher, so that a call that crashes counts as one
 * failed check (and says so) instead of killing the whole program. */
static sigjmp_buf crash_jmp;
static volatile sig_atomic_t crash_sig;

static void on_crash(int sig) {
    crash_sig = sig;
    siglongjmp(crash_jmp, 1);
}

/* `expr` (an int call) must fail with -1 and errno `err`, without a signal. */
#define CHECK_ERR_NOCRASH(expr, err)                                           \
    do {                                                                       \
        struct sigaction sa_ = {0}, osegv_, obus_;                             \
        sa_.sa_handler = on_crash;                                             \
        sigemptyset(&sa_.sa_mask);                                             \
        sigaction(SIGSEGV, &sa_, &osegv_);                                     \
        sigaction(SIGBUS, &sa_, &obus_);                                       \
        crash_sig = 0;                                                         \
        if (sigsetjmp(crash_jmp, 1) == 0) {                                    \
            CHECK_ERR(expr, err);                                              \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: %s: killed by signal %d, want -1 %s\n",    \
                    __FILE__, __LINE__, #expr, (int)crash_sig, #err);          \
        }                                                                      \
        sigaction(SIGSEGV, &osegv_, NULL);                                     \
        sigaction(SIGBUS, &obus_, NULL);                                       \
    } while (0)

/* Runs `stmt` under the catcher; 1 if it was killed by a signal. */
#define CRASHED(stmt)                                                          \
    ({                                                                         \
        struct sigaction sa_ = {0}, osegv_, obus_;                             \
        sa_.sa_handler = on_crash;                                             \
        sigemptyset(&sa_.sa_mask);                                             \
        sigaction(SIGSEGV, &sa_, &osegv_);                                     \
        sigaction(SIGBUS, &sa_, &obus_);                                       \
        crash_sig = 0;                                                         \
        if (sigsetjmp(crash_jmp, 1) == 0) {                                    \
            stmt;                                                              \
        }                                                                      \
        sigaction(SIGSEGV, &osegv_, NULL);                                     \
        sigaction(SIGBUS, &obus_, NULL);                                       \
        crash_sig != 0;                                                        \
    })

static void test_bad_pointers(umm_space *s) {
    /* A read-only page whose first word is a plausible struct size, and an
     * unmapped page, both the host kernel's. */
    unsigned char *ro = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *gone = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED && gone != MAP_FAILED);
    if (ro == MAP_FAILED || gone == MAP_FAILED)
        return;
    memset(ro, 0, PAGE);
    *(size_t *)ro = sizeof(struct umm_stats);
    CHECK(mprotect(ro, PAGE, PROT_READ) == 0);
    CHECK(munmap(gone, PAGE) == 0);
    unsigned char *kernel = (unsigned char *)(uintptr_t)0xffffffffff600000ULL;

    unsigned char *p = umm_mmap(s, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *q = umm_mmap(s, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *qro = umm_mmap(s, NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED && q != MAP_FAILED && qro != MAP_FAILED);
    if (p == MAP_FAILED || q == MAP_FAILED || qro == MAP_FAILED)
        return;
    p[0] = 1;
    CHECK(umm_munmap(s, p + 2 * PAGE, PAGE) == 0); /* p: AA.A */

    /* The host kernel's mincore, the reference: on a host page. */
    CHECK_ERR(mincore(ro, PAGE, ro), EFAULT);
    CHECK_ERR(mincore(ro, PAGE, gone), EFAULT);
    CHECK_ERR(mincore(ro, PAGE, kernel), EFAULT);
    CHECK_ERR(mincore(ro + 1, PAGE, ro), EINVAL);  /* the range first */
    CHECK_ERR(mincore(gone, PAGE, ro), ENOMEM);    /* a hole before the copy */
    CHECK_ERR(mincore(gone, PAGE, kernel), EFAULT); /* access_ok before the walk */

    /* usermm's, on a space page: the same answers. */
    CHECK_ERR_NOCRASH(umm_mincore(s, p, PAGE, ro), EFAULT);
    CHECK_ERR_NOCRASH(umm_mincore(s, p, PAGE, gone), EFAULT);
    CHECK_ERR_NOCRASH(umm_mincore(s, p, PAGE, kernel), EFAULT);
    CHECK_ERR_NOCRASH(umm_mincore(s, p + 1, PAGE, ro), EINVAL);
    CHECK_ERR_NOCRASH(umm_mincore(s, p + 2 * PAGE, PAGE, ro), ENOMEM);
    CHECK_ERR_NOCRASH(umm_mincore(s, p + 2 * PAGE, PAGE, kernel), EFAULT);
    /* Pages before the hole are copied first: EFAULT, as Linux's first batch. */
    CHECK_ERR_NOCRASH(umm_mincore(s, p, 4 * PAGE, ro), EFAULT);
    CHECK_ERR_NOCRASH(umm_mincore(s, p, 4 * PAGE, gone), EFAULT);
    /* A vec in a read-only region of the space; a vec in an untouched
     * region of the space (the copy faults it in through the handlers). */
    CHECK_ERR_NOCRASH(umm_mincore(s, p, PAGE, qro), EFAULT);
    CHECK(umm_mincore(s, p, 2 * PAGE, q + PAGE + 7) == 0);
    CHECK(q[PAGE + 7] == 1 && q[PAGE + 8] == 0);

    /* page_state: the same rules. */
    CHECK_ERR_NOCRASH(umm_page_state(s, p, 1, (uint32_t *)ro), EFAULT);
    CHECK_ERR_NOCRASH(umm_page_state(s, p, 1, (uint32_t *)gone), EFAULT);
    CHECK_ERR_NOCRASH(umm_page_state(s, p, 1, (uint32_t *)kernel), EFAULT);
    CHECK_ERR_NOCRASH(umm_page_state(s, p + 2 * PAGE, 1, (uint32_t *)ro), ENOMEM);
    CHECK_ERR_NOCRASH(umm_page_state(s, p, 1, (uint32_t *)qro), EFAULT);
    CHECK(umm_page_state(s, p, 1, (uint32_t *)(q + 2 * PAGE)) == 0);
    CHECK((*(uint32_t *)(q + 2 * PAGE) & UMM_PAGE_RESIDENT) != 0);

    /* stats: a size that reads fine but a struct that cannot be written;
     * a struct that cannot be read. */
    CHECK_ERR_NOCRASH(umm_stats(s, (struct umm_stats *)ro), EFAULT);
    CHECK_ERR_NOCRASH(umm_stats(s, (struct umm_stats *)gone), EFAULT);
    CHECK_ERR_NOCRASH(umm_stats(s, (struct umm_stats *)qro), EINVAL); /* size 0 */

    /* populate: a report that cannot be written after a populate that
     * succeeded is EFAULT; a failed populate keeps its own errno. */
    CHECK_ERR_NOCRASH(umm_populate(s, p, PAGE, MADV_POPULATE_READ, (struct umm_populate_report *)ro), EFAULT);
    CHECK_ERR_NOCRASH(umm_populate(s, p, PAGE, MADV_POPULATE_READ, (struct umm_populate_report *)gone), EFAULT);
    CHECK_ERR_NOCRASH(umm_populate(s, p + 2 * PAGE, PAGE, MADV_POPULATE_READ, (struct umm_populate_report *)ro),
                      ENOMEM);

    /* mnovolatile: the report, or its bitmap, cannot be written. */
    CHECK(umm_mvolatile(s, p, PAGE) == 0);
    CHECK_ERR_NOCRASH(umm_mnovolatile(s, p, PAGE, (struct umm_purge_report *)ro), EFAULT);
    CHECK(umm_mvolatile(s, p, PAGE) == 0);
    CHECK_ERR_NOCRASH(umm_mnovolatile(s, p, PAGE, (struct umm_purge_report *)gone), EFAULT);
    uint32_t st0 = 0;
    CHECK(umm_page_state(s, p, 1, &st0) == 0);
    CHECK((st0 & UMM_PAGE_VOLATILE) == 0); /* made non-volatile all the same */
    struct umm_purge_report rep = {.bitmap = (uint64_t *)ro, .bitmap_words = 1};
    CHECK(umm_mvolatile(s, p, PAGE) == 0);
    CHECK_ERR_NOCRASH(umm_mnovolatile(s, p, PAGE, &rep), EFAULT);
    rep.bitmap = (uint64_t *)gone;
    CHECK(umm_mvolatile(s, p, PAGE) == 0);
    CHECK_ERR_NOCRASH(umm_mnovolatile(s, p, PAGE, &rep), EFAULT);
    CHECK_ERR_NOCRASH(umm_mnovolatile(s, p + 1, PAGE, (struct umm_purge_report *)ro), EINVAL);

    /* config: umm_config_init cannot report but sets errno; umm_open of an
     * unreadable struct or swap_dir is EFAULT. */
    errno = 0;
    CHECK(!CRASHED(umm_config_init((struct umm_config *)ro)));
    CHECK(errno == EFAULT);
    errno = 0;
    CHECK(!CRASHED(umm_config_init((struct umm_config *)gone)));
    CHECK(errno == EFAULT);
    umm_space *volatile bad = NULL;
    errno = 0;
    CHECK(!CRASHED(bad = umm_open((const struct umm_config *)gone)));
    CHECK(bad == NULL && errno == EFAULT);
    struct umm_config cfg;
    umm_config_init(&cfg);
    cfg.reserve_bytes = 64UL << 20;
    cfg.swap_dir = (const char *)gone;
    errno = 0;
    CHECK(!CRASHED(bad = umm_open(&cfg)));
    CHECK(bad == NULL && errno == EFAULT);

    CHECK(umm_munmap(s, p, 4 * PAGE) == 0);
    CHECK(umm_munmap(s, q, 4 * PAGE) == 0);
    CHECK(umm_munmap(s, qro, PAGE) == 0);
    munmap(ro, PAGE);
}

/* On the user-mode-only fallback the kernel's own faults in a space are not
 * served, and usermm copies results out the way the kernel does: an output
 * buffer in an untouched page of that space must still work (usermm
 * populates it first), and a read-only one is still EFAULT. */
static void test_user_mode_copy_out(void) {
    struct umm_config cfg;
    umm_config_init(&cfg);
    cfg.flags = UMM_F_FORCE_USER_MODE;
    cfg.budget_bytes = 4UL << 20;
    cfg.swap_bytes = 0;
    cfg.reserve_bytes = 64UL << 20;
    umm_space *s = umm_open(&cfg);
    CHECK(s != NULL);
    if (!s)
        return;
    unsigned char *p = umm_mmap(s, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *q = umm_mmap(s, NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *qro = umm_mmap(s, NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED && q != MAP_FAILED && qro != MAP_FAILED);
    if (p == MAP_FAILED || q == MAP_FAILED || qro == MAP_FAILED)
        return;
    p[0] = 1;
    CHECK(umm_mincore(s, p, 2 * PAGE, q + 5) == 0);
    CHECK(q[5] == 1 && q[6] == 0);
    CHECK(umm_page_state(s, p, 1, (uint32_t *)(q + 2 * PAGE)) == 0);
    CHECK((*(uint32_t *)(q + 2 * PAGE) & UMM_PAGE_RESIDENT) != 0);
    struct umm_populate_report *rep = (struct umm_populate_report *)(q + 3 * PAGE);
    CHECK(umm_populate(s, p, PAGE, MADV_POPULATE_READ, rep) == 0);
    CHECK(rep->populated_bytes == PAGE);
    CHECK_ERR_NOCRASH(umm_mincore(s, p, PAGE, qro), EFAULT);
    CHECK(umm_close(s) == 0);
}

int main(void) {
    test_config_and_open();

    struct umm_config cfg;
    umm_config_init(&cfg);
    cfg.budget_bytes = BUDGET;
    cfg.swap_bytes = 64UL << 20;
    cfg.reserve_bytes = 1UL << 30;
    umm_space *s = umm_open(&cfg);
    CHECK(s != NULL);
    if (!s) {
        fprintf(stderr, "umm_open: %s\n", strerror(errno));
        printf("%d passed, %d failed\n", passed, failed);
        return 1;
    }
    test_evict_and_swap(s);
    test_stats_sizes(s);
    test_errno(s);
    test_smaps(s);
    test_touch_after_munmap(s);
    test_lock_and_populate(s);
    test_volatile(s);
    test_bad_pointers(s);
    test_user_mode_copy_out();
    CHECK(umm_close(s) == 0);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
