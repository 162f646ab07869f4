/* zero1/trace.c: see trace.h. */
#include "zero1/trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llmc/utils.h"

double zero1_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

Zero1Tracer* zero1_tracer_create(int rank) {
    Zero1Tracer* t = (Zero1Tracer*)callocCheck(1, sizeof(Zero1Tracer));
    t->rank = rank;
    return t;
}

void zero1_trace(Zero1Tracer* t, int lane, double start_us, double end_us, const char* fmt, ...) {
    if (t == NULL) return;
    if (t->count == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 1024;
        t->events = (Zero1TraceEvent*)realloc(t->events, t->capacity * sizeof(Zero1TraceEvent));
        if (!t->events) fatal("out of memory growing the trace");
    }
    Zero1TraceEvent* e = &t->events[t->count++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof(e->name), fmt, ap);
    va_end(ap);
    e->lane = lane;
    e->start_us = start_us;
    e->end_us = end_us;
}

int zero1_tracer_write(const Zero1Tracer* t, const char* path) {
    static const char* lanes[] = {"compute", "grad reduce", "param gather", "blocked in wait"};
    char tmp[PATH_MAX_LEN];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "w");
    if (!f) return -1;
    double t0 = t->count ? t->events[0].start_us : 0.0;
    for (size_t i = 0; i < t->count; i++) t0 = t->events[i].start_us < t0 ? t->events[i].start_us : t0;
    fprintf(f, "{\"traceEvents\": [\n");
    for (int lane = 0; lane < 4; lane++) {
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}},\n",
                t->rank, lane, lanes[lane]);
    }
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}", t->rank,
            t->rank);
    for (size_t i = 0; i < t->count; i++) {
        const Zero1TraceEvent* e = &t->events[i];
        fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}", e->name,
                t->rank, e->lane, e->start_us - t0, e->end_us - e->start_us);
    }
    fprintf(f, "\n], \"displayTimeUnit\": \"ms\"}\n");
    if (fclose(f) != 0) return -1;
    return rename(tmp, path) == 0 ? 0 : -1;
}

void zero1_tracer_destroy(Zero1Tracer* t) {
    if (!t) return;
    free(t->events);
    free(t);
}
