// run/preempt.c: what run/preempt.h declares.
#include "run/preempt.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t preempt_signal;

static void preempt_on_signal(int sig) {
    preempt_signal = sig;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, NULL);  // a second signal ends the process (async-signal-safe)
    sigaction(SIGINT, &dfl, NULL);
}

void preempt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = preempt_on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int preempt_request(double running_ms, double exit_minutes) {
    if (preempt_signal) return preempt_signal;
    return exit_minutes > 0 && running_ms >= exit_minutes * 60e3 ? PREEMPT_DURATION : 0;
}
