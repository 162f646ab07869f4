/*
 * CHECK(cond, fmt, ...) for the C unit tests: on failure prints "check failed: ..." to
 * stderr and counts it in `failures`; the test keeps going and reports the count.
 */
#ifndef DEV_TEST_CHECK_H
#define DEV_TEST_CHECK_H

#include <stdio.h>

static int failures = 0;
#define CHECK(cond, ...)                         \
    do {                                         \
        if (!(cond)) {                           \
            fprintf(stderr, "  check failed: "); \
            fprintf(stderr, __VA_ARGS__);        \
            fprintf(stderr, "\n");               \
            failures++;                          \
        }                                        \
    } while (0)

#endif
