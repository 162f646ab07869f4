/*
 * zero1/trace.h: a Chrome trace-event recorder (loadable in Perfetto or chrome://tracing).
 *
 * Events are kept in memory as complete ("X") events, one file per rank, which the owner
 * rewrites atomically every few steps and at the end (zero1_tracer_write), so a killed run
 * leaves the steps up to the last rewrite. Lanes (tid): 0 compute (forward/backward per
 * layer), 1 reduce-scatter or all-reduce per bucket, 2 all-gather per bucket, 3 time
 * blocked in waits, 4 a marker "step N" per step. Times are written on rank 0's clock
 * (zero1/trace_clock.h), 0 when the clock was measured, so the ranks' files line up.
 * A NULL tracer records nothing, so call sites need no checks.
 */
#ifndef ZERO1_TRACE_H
#define ZERO1_TRACE_H

#include <stddef.h>

#include "zero1/device_ops.h"
#include "zero1/trace_clock.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { TRACE_COMPUTE = 0, TRACE_GRAD_COMM = 1, TRACE_PARAM_COMM = 2, TRACE_WAIT = 3, TRACE_STEP = 4, TRACE_LANES = 5 };

typedef struct {
    char name[40];
    int lane;
    double start_us, end_us;
} Zero1TraceEvent;

// A span timed on a device: two timed events, resolved to host time at the end.
typedef struct {
    char name[40];
    int lane;
    Zero1Event start, end;
} Zero1DeviceSpan;

typedef struct {
    int rank;
    Zero1TraceEvent* events;
    size_t count, capacity;
    const Zero1Device* dev;      // set by zero1_tracer_use_device
    Zero1Event base;             // completed when the host clock read base_us
    double base_us;
    Zero1DeviceSpan* spans;
    size_t span_count, span_capacity;
    Zero1TraceClock clock;       // this rank's clock against rank 0's
    double skew_us;              // a test build's planted skew of this rank's clock
    // Steps (1-based): with a range, events are kept only inside the steps from..to.
    int from, to;                // 0: every step, and what runs between steps
    int recording;
    double window_start_us;      // events that began earlier belong to an unrecorded step
    int step;                    // the step whose marker is open, or 0
    double step_start_us;
    Zero1Event step_start;
    size_t written;              // events in the file written last
    int has_file;
} Zero1Tracer;

double zero1_now_us(void);
Zero1Tracer* zero1_tracer_create(int rank);
void zero1_trace(Zero1Tracer* t, int lane, double start_us, double end_us, const char* fmt, ...);
// Device spans (work that runs later than the host queues it, e.g. on a GPU): needs a
// device with a clock (ops->event_create_timed). zero1_trace_begin records a timed event
// on stream s and returns it; zero1_trace_end records the end and keeps the span. Both
// return/do nothing without a tracer or a device clock, so call sites need no checks.
void zero1_tracer_use_device(Zero1Tracer* t, const Zero1Device* dev);
int zero1_tracer_has_device_clock(const Zero1Tracer* t);
Zero1Event zero1_trace_begin(Zero1Tracer* t, Zero1Stream s);
void zero1_trace_end(Zero1Tracer* t, int lane, Zero1Event start, Zero1Stream s, const char* fmt, ...);
// Waits for every recorded span and turns them into ordinary events on the host clock.
void zero1_tracer_resolve(Zero1Tracer* t);
// The clock measured at start (skew_us: a test build's, already in clock's measurement).
void zero1_tracer_set_clock(Zero1Tracer* t, Zero1TraceClock clock, double skew_us);
// Record only steps from..to (1-based, inclusive); until then nothing is recorded.
void zero1_tracer_set_steps(Zero1Tracer* t, int from, int to);
// A step's marker, "step N", on the device's clock where there is one (stream s), else the
// host's. With a range, begin starts recording when step is in it, end stops it.
void zero1_tracer_step_begin(Zero1Tracer* t, int step, Zero1Stream s);
void zero1_tracer_step_end(Zero1Tracer* t, Zero1Stream s);
// Resolves the device spans and rewrites path with every event so far (run/files.h's
// file_replace_*: path.tmp, flushed, renamed over path), unless nothing was recorded since
// the last write. A trace it cannot write ends the program.
void zero1_tracer_write(Zero1Tracer* t, const char* path);
void zero1_tracer_destroy(Zero1Tracer* t);

#ifdef __cplusplus
}
#endif
#endif
