/* zero1/trace_clock.c: see trace_clock.h. */
#include "zero1/trace_clock.h"

#include <float.h>
#include <mpi.h>

#include "run/mpi_wait.h"
#include "zero1/trace.h"

#define TRACE_CLOCK_TAG 7401  // point-to-point messages on MPI_COMM_WORLD are this module's only

// Blocking point-to-point under the deadline: the peer may have stopped.
static void exchange(void* buf, int count, MPI_Datatype type, int peer, int sending) {
    MPI_Request request;
    if (sending) mpiCheck(MPI_Isend(buf, count, type, peer, TRACE_CLOCK_TAG, MPI_COMM_WORLD, &request));
    else mpiCheck(MPI_Irecv(buf, count, type, peer, TRACE_CLOCK_TAG, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "trace clock measurement (--trace)", -1);
}

Zero1TraceClock zero1_trace_clock_sync(double skew_us) {
    int rank, world;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world));
    Zero1TraceClock c = {0.0, 0.0, 0.0};
    char ping = 0;
    if (rank == 0) {  // answers each rank in turn: its time, and the origin
        double reply[2] = {0.0, zero1_now_us() + skew_us};
        c.origin_us = reply[1];
        for (int r = 1; r < world; r++) {
            for (int i = 0; i < TRACE_CLOCK_ROUNDS; i++) {
                exchange(&ping, 1, MPI_CHAR, r, 0);
                reply[0] = zero1_now_us() + skew_us;
                exchange(reply, 2, MPI_DOUBLE, r, 1);
            }
        }
        return c;
    }
    double best = DBL_MAX;
    for (int i = 0; i < TRACE_CLOCK_ROUNDS; i++) {
        double reply[2];
        double t0 = zero1_now_us() + skew_us;
        exchange(&ping, 1, MPI_CHAR, 0, 1);
        exchange(reply, 2, MPI_DOUBLE, 0, 0);
        double t1 = zero1_now_us() + skew_us;
        if (t1 - t0 < best) {
            best = t1 - t0;
            c.offset_us = reply[0] - 0.5 * (t0 + t1);
            c.origin_us = reply[1];
        }
    }
    c.bound_us = 0.5 * best;
    return c;
}
