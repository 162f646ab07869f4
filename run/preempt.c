// run/preempt.c: what run/preempt.h declares.
#include "run/preempt.h"

#include <mpi.h>
#include <signal.h>
#include <string.h>

#include "run/mpi_wait.h"

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

int preempt_agree(double running_ms, double exit_minutes, int step) {
    int mine[2] = {preempt_signal, exit_minutes > 0 && running_ms >= exit_minutes * 60e3}, all[2];
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "the preemption check", step);
    return all[0] ? all[0] : all[1] ? PREEMPT_DURATION : 0;
}
