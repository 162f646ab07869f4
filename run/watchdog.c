// run/watchdog.c: what run/watchdog.h declares.
#include "run/watchdog.h"

#include "run/seams.h"

double watchdog_monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static WatchdogClock watchdog_clock_start(void) {
    WatchdogClock c = {watchdog_monotonic_s(), 0.0};
    return c;
}

// Reads the clock once; returns the seconds run so far.
static double watchdog_clock_tick(WatchdogClock* c) {
    double now = watchdog_monotonic_s(), interval = now - c->last_s;
    c->last_s = now;
    if (interval > 0 && interval <= WATCHDOG_STOPPED_GAP_S) c->ran_s += interval;
    return c->ran_s;
}

// timeout_s <= 0: never expires.
static int watchdog_expired(double ran_s, double timeout_s) { return timeout_s > 0 && ran_s >= timeout_s; }

void watchdog_sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

// How long a rank that timed out waits before it speaks: 0.25 s per rank number, at most 3 s.
static long watchdog_speak_delay_us_(int rank) { return 250000L * (rank < 12 ? rank : 12); }

static void watchdog_alarm_(int sig) {
    (void)sig;
    _exit(1);  // async-signal-safe: the job is over, nothing is left to flush
}

void watchdog_abort_job(const char* message, void (*end_job)(void)) {
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
static void watchdog_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) LLMC_NORETURN;

static void watchdog_timeout_abort(const char* what, double timeout_s, void (*end_job)(void)) {
    char message[PATH_MAX_LEN + 256];
    snprintf(message, sizeof(message),
             "%s did not complete within %g s (a rank stopped or its network is gone); aborting the job", what,
             timeout_s);
    watchdog_abort_job(message, end_job);
}

void watchdog_poll_until(int (*done)(void* ctx), void* ctx, double timeout_s,
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
            seam_stop_in_wait(describe(ctx, what, sizeof(what)));
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

void watchdog_arm(const char* what, double timeout_s, void (*end_job)(void)) {
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

void watchdog_disarm(void) {
    pthread_mutex_lock(&watchdog_thread_.lock);
    watchdog_thread_.armed = 0;
    pthread_mutex_unlock(&watchdog_thread_.lock);
}
