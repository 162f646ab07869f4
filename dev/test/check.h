/*
 * TAP (the Test Anything Protocol) for the C, C++ and CUDA tests, the lines
 * dev/test/test_lib.sh prints for the shell tests:
 *
 *   tap_ok(pass, fmt, ...)      one TAP line, "ok N - what" or "not ok N - what"; returns pass
 *   tap_skip(why, fmt, ...)     "ok N - what # SKIP why" and a "# SKIPPED: what: why" line
 *   CHECK(cond, fmt, ...)       one assertion of a group: counted in `checks`; a failure counted
 *                               in `failures` and printed to stderr as "file:line: check failed:
 *                               cond: message" (the first 30, so a broken loop does not flood)
 *   tap_checks(fmt, ...)        one TAP line for the CHECKs since the last one: ok when none of
 *                               them failed
 *   CHECK_GROUP(call)           call (a function full of CHECKs), then tap_checks named by its text
 *   tap_skip_all(fmt, ...)      the plan "1..0 # SKIP why": the program cannot test anything here
 *   done_testing()              the plan "1..N"; returns the exit status, 1 iff a line was not ok
 *
 * Under MPI only rank 0 prints TAP: a test sets tap_rank to its rank, and another rank's line
 * that is not ok goes to stderr as "# rank R: not ok - what" (its ok lines are not printed);
 * its done_testing returns 1 as well, so the job's exit status carries it. Lines are flushed
 * at once (mpirun and pipes interleave them with other output).
 */
#ifndef DEV_TEST_CHECK_H
#define DEV_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;  // CHECKs that failed, in all
static int checks = 0;    // CHECKs made, in all
static int tap_rank = 0;
static int tap_count = 0, tap_failed = 0, tap_group_checks = 0, tap_group_failures = 0;

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

static inline void tap_vline(int pass, const char* directive, const char* fmt, va_list ap) {
    tap_count++;
    if (!pass) tap_failed++;
    if (tap_rank != 0 && pass) return;
    FILE* out = tap_rank == 0 ? stdout : stderr;
    // One write per line: stderr is unbuffered, and mpirun merges the ranks' output, so a line
    // written in pieces can have another rank's line land inside it.
    char line[2048];
    int n = tap_rank == 0 ? snprintf(line, sizeof(line), "%s %d - ", pass ? "ok" : "not ok", tap_count)
                          : snprintf(line, sizeof(line), "# rank %d: not ok - ", tap_rank);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    if (n < (int)sizeof(line)) snprintf(line + n, sizeof(line) - (size_t)n, "%s\n", directive ? directive : "");
    size_t len = strlen(line);
    if (len == 0 || line[len - 1] != '\n') strcpy(line + sizeof(line) - 5, "...\n");  // cut to its start
    fputs(line, out);
    fflush(out);
}

#if defined(__GNUC__)
#define TAP_PRINTF(i, j) __attribute__((format(printf, i, j)))
#else
#define TAP_PRINTF(i, j)
#endif

// A variadic function's fmt and arguments as text in the array buf (va_start must be in
// that function, so a macro).
#define TAP_FORMAT(buf, fmt)                          \
    do {                                              \
        va_list tap_ap_;                              \
        va_start(tap_ap_, fmt);                       \
        vsnprintf(buf, sizeof(buf), fmt, tap_ap_);    \
        va_end(tap_ap_);                              \
    } while (0)

static inline TAP_PRINTF(2, 3) int tap_ok(int pass, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tap_vline(pass, NULL, fmt, ap);
    va_end(ap);
    return pass;
}

static inline TAP_PRINTF(2, 3) void tap_skip(const char* why, const char* fmt, ...) {
    char directive[512];
    snprintf(directive, sizeof(directive), " # SKIP %s", why);
    va_list ap;
    va_start(ap, fmt);
    tap_vline(1, directive, fmt, ap);
    va_end(ap);
    if (tap_rank == 0) {
        printf("# SKIPPED: ");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf(": %s\n", why);
        fflush(stdout);
    }
}

static inline TAP_PRINTF(1, 2) int tap_checks(const char* fmt, ...) {
    char what[512];
    TAP_FORMAT(what, fmt);
    int n = checks - tap_group_checks, bad = failures - tap_group_failures;
    tap_group_checks = checks;
    tap_group_failures = failures;
    if (bad) return tap_ok(0, "%s (%d of %d checks failed)", what, bad, n);
    return tap_ok(1, "%s (%d checks)", what, n);
}

#define CHECK_GROUP(...)                  \
    do {                                  \
        __VA_ARGS__;                      \
        tap_checks("%s", #__VA_ARGS__);   \
    } while (0)

static inline TAP_PRINTF(1, 2) void tap_skip_all(const char* fmt, ...) {
    char why[512];
    TAP_FORMAT(why, fmt);
    if (tap_rank == 0) printf("1..0 # SKIP %s\n# SKIPPED: %s\n", why, why);
    fflush(stdout);
}

static inline int done_testing(void) {
    if (tap_count == 0) tap_ok(0, "the program ran no check");
    if (tap_rank == 0) printf("1..%d\n", tap_count);
    fflush(stdout);
    return tap_failed > 0;
}

#endif
