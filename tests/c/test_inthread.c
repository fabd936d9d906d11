/*
 * test_inthread.c: a space opened with UMM_F_INTHREAD_FAULTS from C. Run by
 * crates/usermm/tests/c_abi.rs.
 *
 * Checks: 16 MiB through a 2 MiB budget, every page's bytes right after
 * swap-out and swap-in (faults resolved in this thread, by usermm's SIGBUS
 * handler); a program SIGBUS handler installed after umm_open with
 * umm_sigbus_action gets the SIGBUS of a poisoned page, with its address,
 * and leaves it with siglongjmp (as LTP's tests do), after which the space
 * still serves faults; a handler installed with plain sigaction after the
 * open replaces usermm's, and the next in-thread umm_open puts usermm's back
 * in front of it; read(2) into a page not yet touched is EFAULT. Then a
 * handler-thread space with one region mapped UMM_MAP_INTHREAD: read(2) into
 * an untouched page of that region is EFAULT, into one of the other region
 * it works, and the in-thread region's pages come in when touched; a
 * handler installed with plain sigaction since is put behind usermm's by the
 * next UMM_MAP_INTHREAD mapping.
 *
 * The last line of output is "N passed, M failed"; the exit status is 0 only
 * when nothing failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "usermm.h"

#include "check.h"

#define PS 4096u

static sigjmp_buf env;
static volatile void *sigbus_addr;
static volatile int sigbus_count;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    sigbus_addr = si->si_addr;
    sigbus_count++;
    siglongjmp(env, 1);
}

static umm_space *open_inthread(size_t budget, size_t swap) {
    struct umm_config c;
    umm_config_init(&c);
    c.budget_bytes = budget;
    c.swap_bytes = swap;
    c.flags = UMM_F_INTHREAD_FAULTS;
    return umm_open(&c);
}

static int touch_poisoned(volatile unsigned char *p) {
    if (sigsetjmp(env, 1) == 0) {
        (void)*p;
        return 0;
    }
    return 1;
}

int main(void) {
    umm_space *s = open_inthread(2u << 20, 64u << 20);
    CHECK(s != NULL);
    if (!s)
        return 1;
    size_t len = 16u << 20;
    unsigned char *a = umm_mmap(s, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED);
    if (a == MAP_FAILED)
        return 1;

    /* The documented cost: read(2) into a page not yet touched. */
    int fds[2];
    CHECK(pipe(fds) == 0);
    CHECK(write(fds[1], "xy", 2) == 2);
    errno = 0;
    CHECK(read(fds[0], a + 5 * PS, 2) == -1 && errno == EFAULT);
    close(fds[0]);
    close(fds[1]);

    for (size_t p = 0; p < len / PS; p++) {
        a[p * PS] = (unsigned char)(p * 7);
        a[p * PS + PS - 1] = (unsigned char)(p * 13);
    }
    size_t bad = 0;
    for (size_t p = 0; p < len / PS; p++)
        bad += a[p * PS] != (unsigned char)(p * 7) || a[p * PS + PS - 1] != (unsigned char)(p * 13);
    CHECK(bad == 0);
    struct umm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(umm_stats(s, &st) == 0);
    CHECK(st.swapouts > 0 && st.swapins > 0);

    /* A handler installed after the open, through umm_sigbus_action. */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    CHECK(umm_sigbus_action(&sa, &old) == 0);
    CHECK(umm_madvise(s, a + 3 * PS, PS, MADV_HWPOISON) == 0);
    CHECK(touch_poisoned(a + 3 * PS + 17) == 1);
    CHECK(sigbus_count == 1 && sigbus_addr == a + 3 * PS + 17);
    /* The space still serves faults after the siglongjmp. */
    bad = 0;
    for (size_t p = 4; p < len / PS; p += 3)
        bad += a[p * PS] != (unsigned char)(p * 7);
    CHECK(bad == 0);
    CHECK(sigbus_count == 1);

    /* Plain sigaction replaces usermm's handler; the next in-thread open
     * puts it back, chaining to ours. */
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0);
    umm_space *s2 = open_inthread(1u << 20, 16u << 20);
    CHECK(s2 != NULL);
    bad = 0;
    for (size_t p = 1; p < len / PS; p += 5)
        bad += a[p * PS] != (unsigned char)(p * 7);
    CHECK(bad == 0);
    CHECK(sigbus_count == 1);
    CHECK(touch_poisoned(a + 3 * PS) == 1);
    CHECK(sigbus_count == 2 && sigbus_addr == a + 3 * PS);
    if (s2)
        CHECK(umm_close(s2) == 0);

    CHECK(umm_sigbus_action(&old, NULL) == 0);
    CHECK(umm_munmap(s, a, len) == 0);
    CHECK(umm_close(s) == 0);

    /* One region in-thread in a space of handler threads. */
    struct umm_config c;
    umm_config_init(&c);
    c.budget_bytes = 1u << 20;
    umm_space *h = umm_open(&c);
    CHECK(h != NULL);
    if (!h)
        return 1;
    unsigned char *ha = umm_mmap(h, NULL, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *it =
        umm_mmap(h, NULL, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | UMM_MAP_INTHREAD, -1, 0);
    CHECK(ha != MAP_FAILED && it != MAP_FAILED);
    if (ha == MAP_FAILED || it == MAP_FAILED)
        return 1;
    CHECK(pipe(fds) == 0);
    CHECK(write(fds[1], "abcd", 4) == 4);
    errno = 0;
    CHECK(read(fds[0], it + 2 * PS, 2) == -1 && errno == EFAULT);
    CHECK(read(fds[0], ha + 2 * PS, 2) == 2 && ha[2 * PS + 1] == 'b');
    close(fds[0]);
    close(fds[1]);
    for (size_t p = 0; p < 16; p++)
        it[p * PS + 5] = (unsigned char)(p + 40);
    bad = 0;
    for (size_t p = 0; p < 16; p++)
        bad += it[p * PS + 5] != (unsigned char)(p + 40) || it[p * PS] != 0;
    CHECK(bad == 0);
    /* A plain sigaction replaces usermm's handler; the next UMM_MAP_INTHREAD
     * mapping puts usermm's back in front of it: a fault there is resolved,
     * never handed to the program's handler. */
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0);
    int before = sigbus_count;
    unsigned char *it2 =
        umm_mmap(h, NULL, 4 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | UMM_MAP_INTHREAD, -1, 0);
    CHECK(it2 != MAP_FAILED);
    if (it2 != MAP_FAILED) {
        CHECK(touch_poisoned(it2 + PS) == 0);
        CHECK(sigbus_count == before);
    }
    CHECK(umm_close(h) == 0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
