/*
 * The trainers' own collectives (the loss and validation all-reduces, the replica check,
 * the replicated optimizer's gradient all-reduce) with a deadline.
 *
 * A blocking MPI call waits forever for a rank that stopped. These post the non-blocking
 * form and wait for it through llmc/watchdog.h (the deadline the zero1/ communicators use
 * too): past --comm-timeout the rank names the collective and the step and aborts the job
 * (`error: [rank 2] loss all-reduce at step 5 did not complete within 10 s (...)`).
 * The deadline is the job's, set once from the command line (mpi_wait_set_timeout, right
 * after the flags are parsed, so a resume's load has it too); until then it is
 * WATCHDOG_DEFAULT_TIMEOUT_S. Calls that cannot be polled (MPI-IO's collective reads and
 * writes) run between mpi_blocking_begin and mpi_blocking_end, under the same deadline.
 */
#ifndef LLMC_MPI_WAIT_H
#define LLMC_MPI_WAIT_H

#include <mpi.h>
#include <stdio.h>

#include "llmc/utils.h"
#include "llmc/watchdog.h"

#ifdef __cplusplus
extern "C" {
#endif

static double mpi_wait_timeout_s_ = WATCHDOG_DEFAULT_TIMEOUT_S;

// Seconds a host collective may wait (0: forever).
static inline void mpi_wait_set_timeout(double seconds) { mpi_wait_timeout_s_ = seconds; }

static inline void mpi_abort_world(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

// Around one collective call that can only block (MPI-IO): the same deadline, kept by the
// watchdog thread of llmc/watchdog.h; `what` names the call, the file and the phase.
static inline void mpi_blocking_begin(const char* what) { watchdog_arm(what, mpi_wait_timeout_s_, mpi_abort_world); }
static inline void mpi_blocking_end(void) { watchdog_disarm(); }

typedef struct {
    MPI_Request* requests;
    int count;
    const char* what;
    int step;
} MpiPending;

static inline int mpi_pending_done(void* ctx) {
    MpiPending* p = (MpiPending*)ctx;
    int done = 0;
    mpiCheck(MPI_Testall(p->count, p->requests, &done, MPI_STATUSES_IGNORE));
    return done;
}

static inline const char* mpi_pending_describe(void* ctx, char* buf, size_t n) {
    const MpiPending* p = (const MpiPending*)ctx;
    if (p->step >= 0) snprintf(buf, n, "%s at step %d", p->what, p->step);
    else snprintf(buf, n, "%s", p->what);
    return buf;
}

// Waits for all `count` requests; past the deadline ends the job naming `what` (and
// `step`, 1-based as the step lines count; < 0: none).
static inline void mpi_wait_all_deadline(int count, MPI_Request* requests, const char* what, int step) {
    MpiPending p = {requests, count, what, step};
    watchdog_poll_until(mpi_pending_done, &p, mpi_wait_timeout_s_, mpi_pending_describe, mpi_abort_world);
}

static inline void mpi_wait_deadline(MPI_Request* request, const char* what, int step) {
    mpi_wait_all_deadline(1, request, what, step);
}

// A large all-reduce goes as several of this many elements, all in flight at once: Open
// MPI's non-blocking all-reduce of one 64 MB buffer took 77 ms at np=2 against 31 ms
// blocking (it picks a slower algorithm), in 256K-element pieces 57 ms (76 against 83
// at np=4).
#define MPI_WAIT_ALLREDUCE_PIECE (1 << 18)

// In-place sum over MPI_COMM_WORLD.
static inline void mpi_allreduce_sum_deadline(void* buf, size_t count, MPI_Datatype type, const char* what, int step) {
    int type_bytes;
    mpiCheck(MPI_Type_size(type, &type_bytes));
    int pieces = (int)((count + MPI_WAIT_ALLREDUCE_PIECE - 1) / MPI_WAIT_ALLREDUCE_PIECE);
    MPI_Request* requests = (MPI_Request*)mallocCheck((size_t)(pieces > 0 ? pieces : 1) * sizeof(MPI_Request));
    for (int i = 0; i < pieces; i++) {
        size_t at = (size_t)i * MPI_WAIT_ALLREDUCE_PIECE, n = count - at;
        if (n > MPI_WAIT_ALLREDUCE_PIECE) n = MPI_WAIT_ALLREDUCE_PIECE;
        mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, (char*)buf + at * (size_t)type_bytes, (int)n, type, MPI_SUM,
                                MPI_COMM_WORLD, &requests[i]));
    }
    mpi_wait_all_deadline(pieces, requests, what, step);
    free(requests);
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
