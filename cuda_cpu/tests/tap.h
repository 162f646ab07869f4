/*
 * cuda_cpu/tests/tap.h: TAP (the Test Anything Protocol) for the layer's C++ and CUDA tests,
 * as tap.sh prints it for its scripts, so that the layer tests on its own:
 *   tap_ok(pass, fmt, ...)   "ok N - what" or "not ok N - what"; returns pass
 *   tap_skip(why, fmt, ...)  "ok N - what # SKIP why", and "# SKIPPED: what: why" for the runner
 *   done_testing()           the plan "1..N"; returns the exit status, 1 iff a line was not ok
 * Under MPI (test_nccl) a rank other than tap_rank 0 prints only what failed, on stderr.
 */
#ifndef CUDA_CPU_TESTS_TAP_H
#define CUDA_CPU_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>

static int tap_rank = 0, tap_count = 0, tap_not_ok = 0;

__attribute__((format(printf, 2, 0))) static void tap_line(int pass, const char* fmt, va_list ap) {
    tap_count++;
    tap_not_ok += !pass;
    if (tap_rank != 0) {  // another rank speaks only of what failed
        if (!pass) fprintf(stderr, "# rank %d: not ok - ", tap_rank), vfprintf(stderr, fmt, ap), fputc('\n', stderr);
        return;
    }
    printf("%sok %d - ", pass ? "" : "not ", tap_count);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
}

__attribute__((format(printf, 2, 3))) static int tap_ok(int pass, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tap_line(pass, fmt, ap);
    va_end(ap);
    return pass;
}

__attribute__((format(printf, 2, 3))) static void tap_skip(const char* why, const char* fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    tap_ok(1, "%s # SKIP %s", what, why);
    if (tap_rank == 0) printf("# SKIPPED: %s: %s\n", what, why);
}

static int done_testing(void) {
    if (tap_count == 0) tap_ok(0, "the program ran no check");
    if (tap_rank == 0) printf("1..%d\n", tap_count), fflush(stdout);
    return tap_not_ok > 0;
}

#endif
