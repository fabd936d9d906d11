/*
 * test_compat.c: a program written against the plain calls (mmap, munmap,
 * madvise, mincore), compiled against usermm through usermm_compat.h and
 * run by crates/usermm/tests/c_abi.rs. It also forks (while a thread keeps
 * the default space busy): each child gets its copy of the parent's default
 * space (or, where spaces are not copied, a fresh one of its own) and never
 * hangs on the parent's.
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

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

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

/* A thread that keeps the default space's locks busy (map, populate,
 * unmap) until told to stop: forks happen while it holds them. */
static volatile int hammer_stop;

static void *hammer(void *arg) {
    (void)arg;
    while (!hammer_stop) {
        size_t len = 4UL << 20;
        unsigned char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED)
            continue;
        madvise(a, len, MADV_POPULATE_WRITE);
        munmap(a, len);
    }
    return NULL;
}

/* In a forked child: the plain calls go to the child's copy of the parent's
 * default space, or, where it was not copied (its copy failed), to a
 * fresh default space of the child's own; a
 * parent's space the child was given works there, one it was not is stale
 * (ESTALE) and umm_close only forgets it. Returns the number of failed
 * checks. */
/* A failed check of the child, counted in `bad` and said with its line. */
#define CHILD_CHECK(ok)                                                            \
    do {                                                                           \
        if (!(ok)) {                                                               \
            bad++;                                                                 \
            fprintf(stderr, "child: check at line %d failed (errno %d)\n", __LINE__, errno); \
        }                                                                          \
    } while (0)

static int child_after_fork(umm_space *parent_default, umm_space *parent_other) {
    alarm(10); /* a child that hangs is killed by SIGALRM */
    int bad = 0;
    unsigned char *q = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHILD_CHECK(q != MAP_FAILED);
    if (q != MAP_FAILED) {
        for (size_t i = 0; i < 64 * PAGE; i++)
            q[i] = (unsigned char)(i * 7);
        for (size_t i = 0; i < 64 * PAGE; i++)
            CHILD_CHECK(q[i] == (unsigned char)(i * 7));
        unsigned char v[64];
        CHILD_CHECK(mincore(q, 64 * PAGE, v) == 0 && (v[0] & 1) == 1);
        CHILD_CHECK(munmap(q, 64 * PAGE) == 0);
    }
    umm_space *mine = umm_default_space();
    CHILD_CHECK(mine != NULL);
    struct umm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (mine == parent_default) {
        /* The copy: it works, and is never closed. */
        CHILD_CHECK(umm_stats(parent_default, &st) == 0);
        errno = 0;
        CHILD_CHECK(umm_close(parent_default) == -1 && errno == EINVAL);
    } else {
        errno = 0;
        CHILD_CHECK(umm_stats(parent_default, &st) == -1 && errno == ESTALE);
        if (mine) {
            CHILD_CHECK(umm_stats(mine, &st) == 0 && st.regions == 0);
        }
        CHILD_CHECK(umm_close(parent_default) == 0);
    }
    errno = 0;
    if (umm_stats(parent_other, &st) == 0) {
        /* The child's copy of the other space. */
        CHILD_CHECK(umm_munmap(parent_other, NULL, PAGE) == 0 || errno != ESTALE);
        void *m = umm_mmap(parent_other, NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHILD_CHECK(m != MAP_FAILED);
    } else {
        CHILD_CHECK(errno == ESTALE);
        errno = 0;
        CHILD_CHECK(umm_munmap(parent_other, NULL, PAGE) == -1 && errno == ESTALE);
        errno = 0;
        CHILD_CHECK(umm_mmap(parent_other, NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED &&
                    errno == ESTALE);
    }
    CHILD_CHECK(umm_close(parent_other) == 0);
    return bad;
}

/* Forks `n` children, each running child_after_fork; CHECKs that each
 * exited with 0 (not killed by SIGALRM: hung). */
static void fork_children(int n, umm_space *parent_default, umm_space *parent_other) {
    for (int i = 0; i < n; i++) {
        usleep(500 + 100 * (i % 7));
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid < 0)
            return;
        if (pid == 0)
            _exit(child_after_fork(parent_default, parent_other) ? 1 : 0);
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (WIFSIGNALED(status))
            fprintf(stderr, "child %d killed by signal %d%s\n", i, WTERMSIG(status),
                    WTERMSIG(status) == SIGALRM ? " (hung)" : "");
        else if (WEXITSTATUS(status) != 0)
            fprintf(stderr, "child %d: a check failed\n", i);
    }
}

/* fork (issue 16 item 9, LTP madvise09): the parent's data stays intact,
 * children never hang, even when a parent thread holds the space's locks
 * at the fork. */
static void test_fork(unsigned char *p) {
    umm_space *s = umm_default_space();
    struct umm_config cfg;
    umm_config_init(&cfg);
    cfg.budget_bytes = 4UL << 20;
    cfg.swap_bytes = 0;
    cfg.reserve_bytes = 64UL << 20;
    umm_space *other = umm_open(&cfg);
    CHECK(other != NULL);
    if (!other)
        return;
    fork_children(1, s, other);
    pthread_t t;
    hammer_stop = 0;
    CHECK(pthread_create(&t, NULL, hammer, NULL) == 0);
    fork_children(10, s, other);
    hammer_stop = 1;
    pthread_join(t, NULL);
    size_t bad = 0;
    for (size_t i = 64; i < NPAGES; i++)
        bad += p[i * PAGE] != (unsigned char)(i % 251 + 1);
    CHECK(bad == 0);
    CHECK(umm_close(other) == 0);
}

/* MAP_SHARED anonymous memory stays shared with a forked child, as on
 * Linux (the pattern of LTP's and the kernel's tests: a child reports
 * through it), with most of it swapped out at the fork; a private page
 * beside it stays private. */
static void test_shared_fork(void) {
    umm_space *s = umm_default_space();
    size_t n = 2048; /* 8 MiB, twice the budget */
    unsigned char *sh = mmap(NULL, n * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    unsigned char *pv = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED && pv != MAP_FAILED);
    if (sh == MAP_FAILED || pv == MAP_FAILED)
        return;
    for (size_t i = 0; i < n; i++)
        sh[i * PAGE] = (unsigned char)(i % 251 + 3);
    pv[0] = 9;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        if (umm_default_space() != s)
            _exit(3);
        for (size_t i = 0; i < n; i++)
            if (sh[i * PAGE] != (unsigned char)(i % 251 + 3))
                _exit(4);
        for (size_t i = 0; i < n; i++)
            sh[i * PAGE] = (unsigned char)(i % 251 + 5);
        pv[0] = 1;
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += sh[i * PAGE] != (unsigned char)(i % 251 + 5);
    CHECK(bad == 0); /* the child's writes, seen by the parent */
    CHECK(pv[0] == 9);
    /* Still shmem in the parent: MADV_DONTNEED keeps the bytes. */
    CHECK(madvise(sh, n * PAGE, MADV_DONTNEED) == 0);
    CHECK(sh[5 * PAGE] == (unsigned char)(5 % 251 + 5));
    CHECK(munmap(sh, n * PAGE) == 0);
    CHECK(munmap(pv, PAGE) == 0);
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

    test_shared_fork();
    test_fork(p);

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
