/*
 * The trainers' own collectives (the loss and validation all-reduces, the replica check,
 * the replicated optimizer's gradient all-reduce) with a deadline.
 *
 * A blocking MPI call waits forever for a rank that stopped. These post the non-blocking
 * form and wait for it through run/watchdog.h (the deadline the zero1/ communicators use
 * too): past --comm-timeout the rank names the collective and the step and aborts the job
 * (`error: [rank 2] loss all-reduce at step 5 did not complete within 10 s (...)`).
 * The deadline is the job's, set once from the command line (mpi_wait_set_timeout, right
 * after the flags are parsed, so a resume's load has it too); until then it is
 * WATCHDOG_DEFAULT_TIMEOUT_S. Calls that cannot be polled (MPI-IO's collective reads and
 * writes) run between mpi_blocking_begin and mpi_blocking_end, under the same deadline.
 */
#ifndef RUN_MPI_WAIT_H
#define RUN_MPI_WAIT_H

#include <mpi.h>
#include <stdio.h>

#include "run/files.h"
#include "run/watchdog.h"

#ifdef __cplusplus
extern "C" {
#endif

// Seconds a host collective may wait (0: forever).
void mpi_wait_set_timeout(double seconds);

void mpi_abort_world(void);

// Around one collective call that can only block (MPI-IO): the same deadline, kept by the
// watchdog thread of run/watchdog.h; `what` names the call, the file and the phase.
void mpi_blocking_begin(const char* what);
void mpi_blocking_end(void);
// Every other MPI call that waits for the other ranks (MPI_Init, communicator splits, dups and
// frees, a broadcast or gather at set-up, MPI_Finalize) runs under the same deadline this way:
// a rank stopped inside one ends the job naming `what`, never a hang.
#define mpiDeadline(what, call)        \
    do {                               \
        mpi_blocking_begin(what);      \
        mpiCheck(call);                \
        mpi_blocking_end();            \
    } while (0)

typedef struct {
    MPI_Request* requests;
    int count;
    const char* what;
    int step;
} MpiPending;

void mpi_wait_deadline(MPI_Request* request, const char* what, int step);

// A large all-reduce goes as several of this many elements, all in flight at once: Open
// MPI's non-blocking all-reduce of one 64 MB buffer took 77 ms at np=2 against 31 ms
// blocking (it picks a slower algorithm), in 256K-element pieces 57 ms (76 against 83
// at np=4).
#define MPI_WAIT_ALLREDUCE_PIECE (1 << 18)

// In-place sum over MPI_COMM_WORLD.
void mpi_allreduce_sum_deadline(void* buf, size_t count, MPI_Datatype type, const char* what, int step);

// Every rank's `count` items of `type` from mine into all (rank order).
void mpi_allgather_deadline(const void* mine, void* all, int count, MPI_Datatype type, const char* what,
                            int step);

void mpi_barrier_deadline(const char* what, int step);

// MPI_Init, this process's rank and the world size; the error policy learns the rank.
void mpi_start(int* argc, char*** argv, int* rank, int* world);

#ifdef __cplusplus
}
#endif
#endif
