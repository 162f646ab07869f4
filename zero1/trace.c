/* zero1/trace.c: see trace.h. Errors end the program (fatal). */
#include "zero1/trace.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run/files.h"

double zero1_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

Zero1Tracer* zero1_tracer_create(int rank) {
    Zero1Tracer* t = (Zero1Tracer*)callocCheck(1, sizeof(Zero1Tracer));
    t->rank = rank;
    t->recording = 1;
    t->window_start_us = -DBL_MAX;
    return t;
}

void zero1_tracer_set_clock(Zero1Tracer* t, Zero1TraceClock clock, double skew_us) {
    t->clock = clock;
    t->skew_us = skew_us;
}

void zero1_tracer_set_steps(Zero1Tracer* t, int from, int to) {
    t->from = from;
    t->to = to;
    t->recording = 0;
}

// Room for one more element of size bytes in *array.
static void* grow_array(void* array, size_t* capacity, size_t count, size_t size) {
    if (count < *capacity) return array;
    *capacity = *capacity ? 2 * *capacity : 1024;
    array = realloc(array, *capacity * size);
    if (!array) fatal("out of memory growing the trace");
    return array;
}

static void add_event(Zero1Tracer* t, int lane, double start_us, double end_us, const char* name) {
    t->events = (Zero1TraceEvent*)grow_array(t->events, &t->capacity, t->count, sizeof(Zero1TraceEvent));
    Zero1TraceEvent* e = &t->events[t->count++];
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->lane = lane;
    e->start_us = start_us;
    e->end_us = end_us;
}

void zero1_trace(Zero1Tracer* t, int lane, double start_us, double end_us, const char* fmt, ...) {
    if (t == NULL || !t->recording || start_us < t->window_start_us) return;
    char name[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    add_event(t, lane, start_us, end_us, name);
}

void zero1_tracer_use_device(Zero1Tracer* t, const Zero1Device* dev) {
    if (!t || !dev->ops->event_create_timed) return;
    t->dev = dev;
    t->base = dev->ops->event_create_timed(dev->ctx);
    dev->ops->record(dev->ctx, t->base, dev->compute);
    dev->ops->sync_event(dev->ctx, t->base);
    t->base_us = zero1_now_us();
}

int zero1_tracer_has_device_clock(const Zero1Tracer* t) { return t && t->dev; }

Zero1Event zero1_trace_begin(Zero1Tracer* t, Zero1Stream s) {
    if (!zero1_tracer_has_device_clock(t) || !t->recording) return NULL;
    Zero1Event e = t->dev->ops->event_create_timed(t->dev->ctx);
    t->dev->ops->record(t->dev->ctx, e, s);
    return e;
}

void zero1_trace_end(Zero1Tracer* t, int lane, Zero1Event start, Zero1Stream s, const char* fmt, ...) {
    if (!zero1_tracer_has_device_clock(t) || !start) return;
    t->spans = (Zero1DeviceSpan*)grow_array(t->spans, &t->span_capacity, t->span_count, sizeof(Zero1DeviceSpan));
    Zero1DeviceSpan* sp = &t->spans[t->span_count++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sp->name, sizeof(sp->name), fmt, ap);
    va_end(ap);
    sp->lane = lane;
    sp->start = start;
    sp->end = t->dev->ops->event_create_timed(t->dev->ctx);
    t->dev->ops->record(t->dev->ctx, sp->end, s);
}

void zero1_tracer_resolve(Zero1Tracer* t) {
    if (!zero1_tracer_has_device_clock(t)) return;
    const Zero1DeviceOps* ops = t->dev->ops;
    void* ctx = t->dev->ctx;
    for (size_t i = 0; i < t->span_count; i++) {
        Zero1DeviceSpan* sp = &t->spans[i];
        ops->sync_event(ctx, sp->end);
        double start = t->base_us + 1e3 * ops->elapsed_ms(ctx, t->base, sp->start);
        double end = t->base_us + 1e3 * ops->elapsed_ms(ctx, t->base, sp->end);
        add_event(t, sp->lane, start, end, sp->name);
        ops->event_destroy(ctx, sp->start);
        ops->event_destroy(ctx, sp->end);
    }
    t->span_count = 0;
}

void zero1_tracer_step_begin(Zero1Tracer* t, int step, Zero1Stream s) {
    if (!t) return;
    if (t->from) {
        t->recording = step >= t->from && step <= t->to;
        t->window_start_us = zero1_now_us();
    }
    if (!t->recording) return;
    t->step = step;
    t->step_start_us = zero1_now_us();
    t->step_start = zero1_trace_begin(t, s);
}

void zero1_tracer_step_end(Zero1Tracer* t, Zero1Stream s) {
    if (!t || !t->step) return;
    if (zero1_tracer_has_device_clock(t)) zero1_trace_end(t, TRACE_STEP, t->step_start, s, "step %d", t->step);
    else zero1_trace(t, TRACE_STEP, t->step_start_us, zero1_now_us(), "step %d", t->step);
    t->step = 0;
    if (t->from) t->recording = 0;  // what runs between steps (evaluations) is outside the range
}

void zero1_tracer_write(Zero1Tracer* t, const char* path) {
    static const char* lanes[TRACE_LANES] = {"compute", "grad reduce", "param gather", "blocked in wait", "step"};
    zero1_tracer_resolve(t);
    if (t->has_file && t->written == t->count) return;
    char tmp[PATH_MAX_LEN];
    FILE* f = file_replace_open(path, tmp);
    // Host clock -> rank 0's clock, 0 at the measurement: each event's ts.
    double shift = t->skew_us + t->clock.offset_us - t->clock.origin_us;
    fprintf(f, "{\"otherData\": {\"clock\": \"rank 0's, Cristian's method (docs/zero1.md)\", \"clock_offset_us\": %.3f, "
            "\"clock_error_bound_us\": %.3f},\n\"traceEvents\": [\n", t->clock.offset_us, t->clock.bound_us);
    for (int lane = 0; lane < TRACE_LANES; lane++) {
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}},\n",
                t->rank, lane, lanes[lane]);
    }
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}", t->rank,
            t->rank);
    for (size_t i = 0; i < t->count; i++) {
        const Zero1TraceEvent* e = &t->events[i];
        fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}", e->name,
                t->rank, e->lane, e->start_us + shift, e->end_us - e->start_us);
    }
    fprintf(f, "\n], \"displayTimeUnit\": \"ms\"}\n");
    file_replace_commit(f, tmp, path, "trace");
    t->written = t->count;
    t->has_file = 1;
}

void zero1_tracer_destroy(Zero1Tracer* t) {
    if (!t) return;
    zero1_tracer_resolve(t);
    if (t->dev) t->dev->ops->event_destroy(t->dev->ctx, t->base);
    free(t->spans);
    free(t->events);
    free(t);
}
