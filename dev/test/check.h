/*
 * CHECK(cond, fmt, ...) for the C unit tests: counts the check in `checks`; on failure
 * counts it in `failures` and prints "file:line: check failed: cond: message" to stderr
 * (the first 30 only, so a broken loop does not flood the log). The test keeps going and
 * reports the counts.
 */
#ifndef DEV_TEST_CHECK_H
#define DEV_TEST_CHECK_H

#include <stdio.h>

static int failures = 0;
static int checks = 0;
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        checks++;                                                                            \
        if (!(cond)) {                                                                       \
            failures++;                                                                      \
            if (failures <= 30) {                                                            \
                fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);     \
                fprintf(stderr, __VA_ARGS__);                                                \
                fprintf(stderr, "\n");                                                       \
            }                                                                                \
        }                                                                                    \
    } while (0)

#endif
