/*
 * zero1/trace_clock.h: every rank's trace on rank 0's clock, so that the ranks' traces line
 * up in one Perfetto view (docs/zero1.md, "Traces").
 *
 * Cristian's method (NTP's, with one server): each rank r > 0 in turn sends rank 0 a ping
 * at its time t0, rank 0 answers with its own time T, and r reads t1 when the answer comes.
 * T was read somewhere within [t0, t1] of r's clock, so offset = T - (t0 + t1) / 2 is off by
 * at most (t1 - t0) / 2, half the round trip. Of TRACE_CLOCK_ROUNDS round trips the
 * shortest gives the offset and its bound. Measured once, when the trace starts: clocks
 * that drift apart afterwards (NTP keeps hosts within about a millisecond; free-running
 * clocks drift by up to tens of microseconds a second) add that drift to the error.
 */
#ifndef ZERO1_TRACE_CLOCK_H
#define ZERO1_TRACE_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

#define TRACE_CLOCK_ROUNDS 8

typedef struct {
    double offset_us;  // this rank's clock + offset_us = rank 0's clock (0 on rank 0)
    double origin_us;  // rank 0's clock when the measurement began: the traces' time 0
    double bound_us;   // |error of offset_us| <= this: half the shortest round trip
} Zero1TraceClock;

// Collective over MPI_COMM_WORLD, each wait under the job's deadline (run/mpi_wait.h).
// skew_us: added to this rank's clock (a test build's planted skew, run/seams.h; else 0).
Zero1TraceClock zero1_trace_clock_sync(double skew_us);

#ifdef __cplusplus
}
#endif
#endif
