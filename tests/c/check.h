/* The C tests' check: counts passes and failures, and says where a check
 * failed. Each test prints the counts and exits non-zero on a failure. */
#ifndef USERMM_TEST_CHECK_H
#define USERMM_TEST_CHECK_H

#include <stdio.h>

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

#endif
