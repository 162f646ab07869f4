/*
 * llmc/watchdog.h: deadlines for host waits on communication, the one place that decides
 * how long a rank waits and how the job ends when it waited too long.
 *
 * A collective never completes when another rank stopped (a crash inside a kernel, a
 * SIGSTOP, a host whose network went away): MPI_Wait and cudaStreamSynchronize then block
 * forever and the job hangs until a person notices. Every host wait on communication
 * (zero1/comm_mpi.c's wait, the trainers' own collectives through llmc/mpi_wait.h, the GPU
 * step's one sync through zero1/watchdog_cuda.h) polls instead, with this file's deadline:
 *
 *   watchdog_poll_until(done, ctx, timeout_s, describe, end_job)
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
 * never) it asks describe() what it was waiting for and calls watchdog_abort_job:
 *
 *   error: [rank 2] zero1: reduce-scatter of bucket 1 at step 5 did not complete within
 *   10 s (a rank stopped or its network is gone); aborting the job
 *
 * A deadline counts the time this process ran, not wall time: the wait adds up the
 * intervals between its own clock reads, and an interval longer than 1 s means the process
 * was stopped (SIGSTOP, a scheduler's suspend or preemption) or not scheduled, so it counts
 * nothing. A job stopped and continued as a whole thus goes on whatever the length of the
 * stop (every rank's clock stood still with it), while ranks that keep running and poll for
 * a peer that stopped alone add up their waiting and end the job; a rank that was itself
 * stopped does not blame the others when it is continued. The check uses the very clock
 * read that the sum took, so a stop between the two cannot count either.
 *
 * watchdog_abort_job prints that line, arms an alarm that ends this process a few seconds
 * later whatever happens, and calls end_job (MPI_Abort): MPI_Abort itself can block when
 * the launcher cannot be reached, e.g. from a host whose link is down. The other ranks time
 * out too; so that one of them speaks, a rank first waits 0.25 s per rank number (at most
 * 3 s), and in the usual case the lowest live rank's abort ends the rest before they print.
 *
 * Some waits cannot be polled: a collective MPI-IO call (MPI_File_open, write_at_all,
 * read_at_all, sync, close) blocks inside the library until every rank has joined, and
 * the non-blocking forms are not an option (Open MPI 4's MPI_File_iwrite_at_all crashed
 * on a full disk). For those a watchdog thread keeps the time instead:
 *
 *   watchdog_arm("checkpoint save: MPI_File_write_at_all of DIR/model.bin at step 4",
 *                timeout_s, end_job);   ... the blocking call ...   watchdog_disarm();
 *
 * The thread (started on the first arm) looks every 50 ms and adds up its own ticks the same
 * way; past timeout_s it ends the job exactly as a poll would, with the same message. It calls end_job
 * from its own thread while the main thread sits inside MPI: MPI_Abort is the one call
 * that must work from anywhere, and the alarm ends the process if it does not.
 *
 * Header only, no MPI and no CUDA (callers pass end_job), C11 and C++.
 */
#ifndef LLMC_WATCHDOG_H
#define LLMC_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "llmc/test_stop.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WATCHDOG_DEFAULT_TIMEOUT_S 600.0
#define WATCHDOG_ABORT_GRACE_S 5        // after end_job is called, the alarm ends the process
#define WATCHDOG_POLL_SPIN_S 0.25     // polls back to back this long, then naps
#define WATCHDOG_POLL_FIRST_US 20
#define WATCHDOG_POLL_MAX_US 1000
#define WATCHDOG_STOPPED_GAP_S 1.0     // a longer gap between polls: this process did not run

static inline double watchdog_monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// The time this process ran since start: the sum of the intervals between its clock reads,
// each at most WATCHDOG_STOPPED_GAP_S (a longer one: the process was not running).
typedef struct {
    double last_s, ran_s;
} WatchdogClock;

static inline WatchdogClock watchdog_clock_start(void) {
    WatchdogClock c = {watchdog_monotonic_s(), 0.0};
    return c;
}

// Reads the clock once; returns the seconds run so far.
static inline double watchdog_clock_tick(WatchdogClock* c) {
    double now = watchdog_monotonic_s(), interval = now - c->last_s;
    c->last_s = now;
    if (interval > 0 && interval <= WATCHDOG_STOPPED_GAP_S) c->ran_s += interval;
    return c->ran_s;
}

// timeout_s <= 0: never expires.
static inline int watchdog_expired(double ran_s, double timeout_s) { return timeout_s > 0 && ran_s >= timeout_s; }

static inline void watchdog_sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

// How long a rank that timed out waits before it speaks: 0.25 s per rank number, at most 3 s.
static inline long watchdog_speak_delay_us_(int rank) { return 250000L * (rank < 12 ? rank : 12); }

static void watchdog_alarm_(int sig) {
    (void)sig;
    _exit(1);  // async-signal-safe: the job is over, nothing is left to flush
}

// Ends the job: "error: [rank R] <message>" on stderr, then end_job (NULL: this process
// only). Never returns; the alarm armed first ends the process if end_job blocks.
static inline void watchdog_abort_job(const char* message, void (*end_job)(void)) LLMC_NORETURN;
static inline void watchdog_abort_job(const char* message, void (*end_job)(void)) {
    int rank = utils_rank();
    watchdog_sleep_us(watchdog_speak_delay_us_(rank));  // let a lower rank speak and abort first
    fflush(stdout);
    fprintf(stderr, "error: [rank %d] %s\n", rank, message);
    fflush(stderr);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = watchdog_alarm_;
    sigaction(SIGALRM, &sa, NULL);
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alarm_only, NULL);
    alarm(WATCHDOG_ABORT_GRACE_S);
    if (end_job) end_job();
    _exit(1);
}

// "<what> did not complete within T s (...); aborting the job", then watchdog_abort_job.
static inline void watchdog_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) LLMC_NORETURN;
static inline void watchdog_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) {
    char message[PATH_MAX_LEN + 256];
    snprintf(message, sizeof(message),
             "%s did not complete within %g s (a rank stopped or its network is gone); aborting the job", what,
             timeout_s);
    watchdog_abort_job(message, end_job);
}

// Polls done(ctx) until it returns 1 (the schedule above); past timeout_s (<= 0: never) of
// this process's running time ends the job, naming what describe(ctx, buf, n) says was
// waited for. done() is called once before the clock starts, so a completed wait costs one call.
static inline void watchdog_poll_until(int (*done)(void* ctx), void* ctx, double timeout_s,
                                    const char* (*describe)(void* ctx, char* buf, size_t n), void (*end_job)(void)) {
    if (done(ctx)) return;
    WatchdogClock clock = watchdog_clock_start();
    long sleep_us = WATCHDOG_POLL_FIRST_US;
    int first = 1;
    while (!done(ctx)) {
        double ran = watchdog_clock_tick(&clock);
        if (first) {  // tests: a stop between the clock read and the check used to count in full
            first = 0;
            char what[256];
            test_stop_in_wait(describe(ctx, what, sizeof(what)));
        }
        if (watchdog_expired(ran, timeout_s)) {
            char what[256];
            watchdog_timeout_abort(describe(ctx, what, sizeof(what)), timeout_s, end_job);
        }
        if (ran < WATCHDOG_POLL_SPIN_S) continue;
        watchdog_sleep_us(sleep_us);
        sleep_us = sleep_us * 2 < WATCHDOG_POLL_MAX_US ? sleep_us * 2 : WATCHDOG_POLL_MAX_US;
    }
}

// ----------------------------------------------------------------------------
// The watchdog thread, for calls that block

#define WATCHDOG_THREAD_TICK_US 50000

typedef struct {
    pthread_mutex_t lock;
    int started, armed;
    char what[PATH_MAX_LEN + 128];
    WatchdogClock clock;  // the armed call's running time
    double timeout_s;
    void (*end_job)(void);
} WatchdogThread;

static WatchdogThread watchdog_thread_ = {PTHREAD_MUTEX_INITIALIZER, 0, 0, {0}, {0.0, 0.0}, 0.0, NULL};

static void* watchdog_thread_main_(void* unused) {
    (void)unused;
    WatchdogThread* w = &watchdog_thread_;
    for (;;) {
        watchdog_sleep_us(WATCHDOG_THREAD_TICK_US);
        pthread_mutex_lock(&w->lock);
        if (w->armed) {
            if (watchdog_expired(watchdog_clock_tick(&w->clock), w->timeout_s)) {
                char what[sizeof(w->what)];
                memcpy(what, w->what, sizeof(what));
                double timeout_s = w->timeout_s;
                void (*end_job)(void) = w->end_job;
                pthread_mutex_unlock(&w->lock);
                watchdog_timeout_abort(what, timeout_s, end_job);
            }
        }
        pthread_mutex_unlock(&w->lock);
    }
    return NULL;
}

// Until watchdog_disarm, a blocking call named `what` has timeout_s (<= 0: no deadline).
static inline void watchdog_arm(const char* what, double timeout_s, void (*end_job)(void)) {
    WatchdogThread* w = &watchdog_thread_;
    if (timeout_s <= 0) return;
    pthread_mutex_lock(&w->lock);
    if (!w->started) {
        pthread_t thread;
        sigset_t all, old;  // the thread takes no signals: they stay the main thread's
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&thread, NULL, watchdog_thread_main_, NULL) != 0) fatal("cannot start the watchdog thread");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_detach(thread);
        w->started = 1;
    }
    snprintf(w->what, sizeof(w->what), "%s", what);
    w->clock = watchdog_clock_start();
    w->timeout_s = timeout_s;
    w->end_job = end_job;
    w->armed = 1;
    pthread_mutex_unlock(&w->lock);
}

static inline void watchdog_disarm(void) {
    pthread_mutex_lock(&watchdog_thread_.lock);
    watchdog_thread_.armed = 0;
    pthread_mutex_unlock(&watchdog_thread_.lock);
}

#ifdef __cplusplus
}
#endif
#endif
