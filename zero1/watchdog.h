/*
 * zero1/watchdog.h: deadlines for host waits on communication, the one place that decides
 * how long a rank waits and how the job ends when it waited too long.
 *
 * A collective never completes when another rank stopped (a crash inside a kernel, a
 * SIGSTOP, a host whose network went away): MPI_Wait and cudaStreamSynchronize then block
 * forever and the job hangs until a person notices. Every host wait on communication
 * (zero1/comm_mpi.c's wait, the trainers' own collectives through llmc/mpi_wait.h, the GPU
 * step's one sync through zero1/watchdog_cuda.h) polls instead, with this file's deadline:
 *
 *   zero1_poll_until(done, ctx, timeout_s, describe, end_job)
 *
 * calls done(ctx) until it answers 1: back to back for the first millisecond (as MPI_Wait
 * polls; Open MPI yields the core inside each call where ranks outnumber cores), then with
 * naps between calls, 20 us doubling up to 100 us, and after 50 ms of waiting up to 1 ms.
 * Why not nap from the start: Open MPI moves a collective on only while some call polls it,
 * so a napping rank delays its peers. Naps from the first call made a 4 KB reduce-scatter
 * plus all-gather at np=2 take 0.46 ms instead of MPI_Wait's 0.003 ms; 1 ms naps made a rank
 * that arrives 20 ms late wait 1.1 ms for a 400 KB reduce-scatter instead of 0.2 ms (0.35
 * with 100 us naps). A rank stalled for seconds (a stopped peer) polls every ~1 ms: 2% of
 * a core, against 10% with 100 us naps. Past timeout_s (0: never) it asks describe() what
 * it was waiting for and calls zero1_abort_job:
 *
 *   error: [rank 2] zero1: reduce-scatter of bucket 1 at step 5 did not complete within
 *   10 s (a rank stopped or its network is gone); aborting the job
 *
 * zero1_abort_job prints that line, arms an alarm that ends this process a few seconds
 * later whatever happens, and calls end_job (MPI_Abort): MPI_Abort itself can block when
 * the launcher cannot be reached, e.g. from a host whose link is down. The other ranks time
 * out too; so that one of them speaks, a rank first waits 0.25 s per rank number (at most
 * 3 s), and in the usual case the lowest live rank's abort ends the rest before they print.
 *
 * Header only, no MPI and no CUDA (callers pass end_job), C11 and C++.
 */
#ifndef ZERO1_WATCHDOG_H
#define ZERO1_WATCHDOG_H

#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO1_DEFAULT_TIMEOUT_S 600.0
#define ZERO1_ABORT_GRACE_S 5        // after end_job is called, the alarm ends the process
#define ZERO1_POLL_SPIN_US 1000     // polls back to back this long, then naps
#define ZERO1_POLL_FIRST_US 20
#define ZERO1_POLL_SHORT_MAX_US 100  // the longest nap while the wait is short
#define ZERO1_POLL_LONG_S 0.05       // a wait longer than this is a long one
#define ZERO1_POLL_MAX_US 1000

static inline double zero1_monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// timeout_s <= 0: the deadline never expires.
typedef struct {
    double start_s, timeout_s;
} Zero1Deadline;

static inline Zero1Deadline zero1_deadline_start(double timeout_s) {
    Zero1Deadline d = {zero1_monotonic_s(), timeout_s};
    return d;
}

static inline int zero1_deadline_expired(const Zero1Deadline* d) {
    return d->timeout_s > 0 && zero1_monotonic_s() - d->start_s >= d->timeout_s;
}

static inline void zero1_sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void zero1_watchdog_alarm_(int sig) {
    (void)sig;
    _exit(1);  // async-signal-safe: the job is over, nothing is left to flush
}

// Ends the job: "error: [rank R] <message>" on stderr, then end_job (NULL: this process
// only). Never returns; the alarm armed first ends the process if end_job blocks.
static inline void zero1_abort_job(const char* message, void (*end_job)(void)) LLMC_NORETURN;
static inline void zero1_abort_job(const char* message, void (*end_job)(void)) {
    int rank = utils_rank();
    zero1_sleep_us(250000L * (rank < 12 ? rank : 12));  // let a lower rank speak and abort first
    fflush(stdout);
    fprintf(stderr, "error: [rank %d] %s\n", rank, message);
    fflush(stderr);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = zero1_watchdog_alarm_;
    sigaction(SIGALRM, &sa, NULL);
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alarm_only, NULL);
    alarm(ZERO1_ABORT_GRACE_S);
    if (end_job) end_job();
    _exit(1);
}

// "<what> did not complete within T s (...); aborting the job", then zero1_abort_job.
static inline void zero1_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) LLMC_NORETURN;
static inline void zero1_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) {
    char message[512];
    snprintf(message, sizeof(message),
             "%s did not complete within %g s (a rank stopped or its network is gone); aborting the job", what,
             timeout_s);
    zero1_abort_job(message, end_job);
}

// Polls done(ctx) until it returns 1 (the schedule above); past timeout_s (<= 0: never)
// ends the job, naming what describe(ctx, buf, n) says was waited for. done() is called
// once before the clock starts, so a completed wait costs one call.
static inline void zero1_poll_until(int (*done)(void* ctx), void* ctx, double timeout_s,
                                    const char* (*describe)(void* ctx, char* buf, size_t n), void (*end_job)(void)) {
    if (done(ctx)) return;
    Zero1Deadline deadline = zero1_deadline_start(timeout_s);
    long sleep_us = ZERO1_POLL_FIRST_US;
    while (!done(ctx)) {
        if (zero1_deadline_expired(&deadline)) {
            char what[256];
            zero1_timeout_abort(describe(ctx, what, sizeof(what)), timeout_s, end_job);
        }
        double waited = zero1_monotonic_s() - deadline.start_s;
        if (waited < ZERO1_POLL_SPIN_US * 1e-6) continue;
        zero1_sleep_us(sleep_us);
        long cap = waited < ZERO1_POLL_LONG_S ? ZERO1_POLL_SHORT_MAX_US : ZERO1_POLL_MAX_US;
        sleep_us = sleep_us * 2 < cap ? sleep_us * 2 : cap;
    }
}

#ifdef __cplusplus
}
#endif
#endif
