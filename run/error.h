/*
 * The error policy of every program of this project: fatal() (declared in llmc/utils.h)
 * ends the program with one message and exit status 1.
 *
 * Most input errors (a bad flag, model file or token shard) are seen by every rank alike,
 * since all ranks read the same inputs; so that the user sees the message once, rank 0
 * prints at once and exits, which makes mpirun end the whole job. Another rank first waits
 * 3 s: if the error was shared, mpirun ends it during the wait and it stays quiet; if only
 * that rank saw it, it prints (with its rank) and exits. Nothing hangs either way.
 * Programs under MPI call utils_set_rank() once they know their rank; before that (and in
 * programs without MPI) the rank is the one the launcher exported, or 0 of 1.
 */
#ifndef RUN_ERROR_H
#define RUN_ERROR_H

#include <stddef.h>

#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

int utils_rank(void);
int utils_world(void);
void utils_set_rank(int rank, int world);

// What may explain any error of this process better than the failing call can: it writes
// that explanation into buf and returns 1, or returns 0 (run/run_dir.h's: the output
// directory was removed under the job, so "cannot open .../model.bin" is not the story).
// fatal() asks it once; NULL: nothing to add.
typedef int (*FatalCause)(char* buf, size_t n);
void fatal_set_cause(FatalCause cause);
FatalCause fatal_cause(void);

// For MPI calls (the macro needs <mpi.h> only where it is used).
#define mpiCheck(call)                                                                                   \
    do {                                                                                                 \
        int mpi_status_ = (call);                                                                        \
        if (mpi_status_ != MPI_SUCCESS) fatal("MPI error %d at %s:%d", mpi_status_, __FILE__, __LINE__); \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
