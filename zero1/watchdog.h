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
 * calls done(ctx) until it answers 1: back to back for the first 0.25 s (as MPI_Wait polls;
 * Open MPI yields the core inside each call where ranks outnumber cores), then with naps
 * between calls, 20 us doubling up to 1 ms, so that a rank stalled for seconds (a stopped
 * peer) uses about 2% of a core. Why not nap sooner: Open MPI moves a collective on only
 * while some rank polls it, so a napping rank slows its peers down. Measured at np=2:
 * naps from the first poll made a 4 KB reduce-scatter plus all-gather take 0.46 ms instead
 * of MPI_Wait's 0.003 ms, made a rank arriving 20 ms late wait 1.1 ms instead of 0.2 ms for
 * a 400 KB reduce-scatter, and (naps after 50 ms) the plain trainer's 64 MB gradient
 * all-reduce lose 50 ms a step; a healthy wait rarely lasts 0.25 s. Past timeout_s (0:
 * never) it asks describe() what it was waiting for and calls zero1_abort_job:
 *
 *   error: [rank 2] zero1: reduce-scatter of bucket 1 at step 5 did not complete within
 *   10 s (a rank stopped or its network is gone); aborting the job
 *
 * Time this process did not run does not count: a gap of more than 1 s between two polls
 * means it was stopped (SIGSTOP, a scheduler's suspend) or not scheduled, and the deadline
 * moves by the gap. Otherwise a job suspended and resumed as a whole would abort at once,
 * and a rank that was itself stopped would blame the others when it is continued.
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
#define ZERO1_POLL_SPIN_S 0.25     // polls back to back this long, then naps
#define ZERO1_POLL_FIRST_US 20
#define ZERO1_POLL_MAX_US 1000
#define ZERO1_STOPPED_GAP_S 1.0     // a longer gap between polls: this process did not run

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

// How long a rank that timed out waits before it speaks: 0.25 s per rank number, at most 3 s.
static inline long zero1_speak_delay_us_(int rank) { return 250000L * (rank < 12 ? rank : 12); }

static void zero1_watchdog_alarm_(int sig) {
    (void)sig;
    _exit(1);  // async-signal-safe: the job is over, nothing is left to flush
}

// Ends the job: "error: [rank R] <message>" on stderr, then end_job (NULL: this process
// only). Never returns; the alarm armed first ends the process if end_job blocks.
static inline void zero1_abort_job(const char* message, void (*end_job)(void)) LLMC_NORETURN;
static inline void zero1_abort_job(const char* message, void (*end_job)(void)) {
    int rank = utils_rank();
    zero1_sleep_us(zero1_speak_delay_us_(rank));  // let a lower rank speak and abort first
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
    double last_poll = deadline.start_s;
    long sleep_us = ZERO1_POLL_FIRST_US;
    while (!done(ctx)) {
        double now = zero1_monotonic_s();
        if (now - last_poll > ZERO1_STOPPED_GAP_S) deadline.start_s += now - last_poll;  // we were not running
        last_poll = now;
        if (zero1_deadline_expired(&deadline)) {
            char what[256];
            zero1_timeout_abort(describe(ctx, what, sizeof(what)), timeout_s, end_job);
        }
        if (now - deadline.start_s < ZERO1_POLL_SPIN_S) continue;
        zero1_sleep_us(sleep_us);
        sleep_us = sleep_us * 2 < ZERO1_POLL_MAX_US ? sleep_us * 2 : ZERO1_POLL_MAX_US;
    }
}

#ifdef __cplusplus
}
#endif
#endif
