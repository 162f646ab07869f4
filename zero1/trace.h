/*
 * zero1/trace.h: a Chrome trace-event recorder (loadable in Perfetto or chrome://tracing).
 *
 * Events are kept in memory as complete ("X") events and written once at the end, one
 * file per rank. Lanes (tid): 0 compute (forward/backward per layer), 1 reduce-scatter or
 * all-reduce per bucket, 2 all-gather per bucket, 3 time blocked in waits.
 * A NULL tracer records nothing, so call sites need no checks.
 */
#ifndef ZERO1_TRACE_H
#define ZERO1_TRACE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { TRACE_COMPUTE = 0, TRACE_GRAD_COMM = 1, TRACE_PARAM_COMM = 2, TRACE_WAIT = 3 };

typedef struct {
    char name[40];
    int lane;
    double start_us, end_us;
} Zero1TraceEvent;

typedef struct {
    int rank;
    Zero1TraceEvent* events;
    size_t count, capacity;
} Zero1Tracer;

double zero1_now_us(void);
Zero1Tracer* zero1_tracer_create(int rank);
void zero1_trace(Zero1Tracer* t, int lane, double start_us, double end_us, const char* fmt, ...);
// Writes path (atomically: path.tmp, then rename). Returns 0, or -1 if it cannot.
int zero1_tracer_write(const Zero1Tracer* t, const char* path);
void zero1_tracer_destroy(Zero1Tracer* t);

#ifdef __cplusplus
}
#endif
#endif
