/*
 * The trainers' own collectives (the loss and validation all-reduces, the replica check,
 * the checkpoint barrier, the replicated optimizer's gradient all-reduce) with a deadline.
 *
 * A blocking MPI call waits forever for a rank that stopped. These post the non-blocking
 * form and wait for it through zero1/watchdog.h (the deadline the zero1/ communicators use
 * too): past --comm-timeout the rank names the collective and the step and aborts the job
 * (`error: [rank 2] loss all-reduce at step 5 did not complete within 10 s (...)`).
 * The deadline is the job's, set once from the command line (mpi_wait_set_timeout);
 * until then it is ZERO1_DEFAULT_TIMEOUT_S. One exception: a large all-reduce runs in
 * Open MPI's faster blocking form under a timer (mpi_allreduce_sum_armed).
 */
#ifndef LLMC_MPI_WAIT_H
#define LLMC_MPI_WAIT_H

#include <mpi.h>
#include <stdio.h>

#include "llmc/utils.h"
#include "zero1/watchdog.h"

#ifdef __cplusplus
extern "C" {
#endif

static double mpi_wait_timeout_s_ = ZERO1_DEFAULT_TIMEOUT_S;

// Seconds a host collective may wait (0: forever).
static inline void mpi_wait_set_timeout(double seconds) { mpi_wait_timeout_s_ = seconds; }

static inline void mpi_abort_world(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

typedef struct {
    MPI_Request* request;
    const char* what;
    int step;
} MpiPending;

static inline int mpi_pending_done(void* ctx) {
    int done = 0;
    mpiCheck(MPI_Test(((MpiPending*)ctx)->request, &done, MPI_STATUS_IGNORE));
    return done;
}

static inline const char* mpi_pending_describe(void* ctx, char* buf, size_t n) {
    const MpiPending* p = (const MpiPending*)ctx;
    if (p->step >= 0) snprintf(buf, n, "%s at step %d", p->what, p->step);
    else snprintf(buf, n, "%s", p->what);
    return buf;
}

// Waits for *request; past the deadline ends the job naming `what` (and `step`, 1-based as
// the step lines count; < 0: none).
static inline void mpi_wait_deadline(MPI_Request* request, const char* what, int step) {
    MpiPending p = {request, what, step};
    zero1_poll_until(mpi_pending_done, &p, mpi_wait_timeout_s_, mpi_pending_describe, mpi_abort_world);
}

// In-place sum over MPI_COMM_WORLD, blocking under an armed deadline (zero1_deadline_arm):
// for large buffers, where Open MPI's blocking algorithm is the faster one (64 MB at np=2:
// 33 ms blocking, 77 ms non-blocking and polled).
static inline void mpi_allreduce_sum_armed(void* buf, int count, MPI_Datatype type, const char* what, int step) {
    char description[256];
    MpiPending p = {NULL, what, step};
    zero1_deadline_arm(mpi_pending_describe(&p, description, sizeof(description)), mpi_wait_timeout_s_);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf, count, type, MPI_SUM, MPI_COMM_WORLD));
    zero1_deadline_disarm(mpi_wait_timeout_s_);
}

// In-place sum over MPI_COMM_WORLD.
static inline void mpi_allreduce_sum_deadline(void* buf, int count, MPI_Datatype type, const char* what, int step) {
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, MPI_SUM, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, what, step);
}

// Every rank's `count` items of `type` from mine into all (rank order).
static inline void mpi_allgather_deadline(const void* mine, void* all, int count, MPI_Datatype type, const char* what,
                                          int step) {
    MPI_Request request;
    mpiCheck(MPI_Iallgather(mine, count, type, all, count, type, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, what, step);
}

static inline void mpi_barrier_deadline(const char* what, int step) {
    MPI_Request request;
    mpiCheck(MPI_Ibarrier(MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, what, step);
}

#ifdef __cplusplus
}
#endif
#endif
