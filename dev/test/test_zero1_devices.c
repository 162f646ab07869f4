/*
 * The test devices and communicators of zero1/ against their contracts (device_ops.h,
 * comm.h): the deferred device (zero1/testing/device_deferred.c) and the hazard communicator
 * (zero1/testing/comm_hazard.c).
 *
 *   test_zero1_devices          the deferred device: device pointers fault on the host
 *                               (the host view does not), stream order, late execution (a
 *                               missing event shows), NaN before a sync, every arithmetic
 *                               op bitwise equal to the CPU device (itself checked against
 *                               adamw_element written out here), bad input; the hazard
 *                               communicator over the single communicator on both devices,
 *                               and its handle and group rules
 *   mpirun -np N test_zero1_devices --mpi
 *                               the hazard communicator over MPI: direct on the CPU device,
 *                               staged on the deferred device
 * Prints TAP (dev/test/check.h): a line per group of checks (rank 0; with --mpi also one for
 * every rank's checks together); exit 0 on pass.
 */
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/adamw.h"
#include "llmc/bf16.h"
#include "run/files.h"
#include "zero1/comm.h"
#include "zero1/device_ops.h"
#include "zero1/testing/test_doubles.h"

#include "dev/test/check.h"

// ---- helpers: device transfers, bytes, random numbers, child processes ----

static void* upload(const Zero1Device* d, const void* host, size_t bytes) {
    void* p = d->ops->alloc(d->ctx, bytes);
    d->ops->from_host(d->ctx, d->compute, p, host, bytes);
    d->ops->sync_stream(d->ctx, d->compute);  // from_host reads its source when it runs
    return p;
}

static void download(const Zero1Device* d, Zero1Stream s, void* host, const void* p, size_t bytes) {
    d->ops->to_host(d->ctx, s, host, p, bytes);
    d->ops->sync_stream(d->ctx, s);
}

static int all_bytes(const void* p, size_t n, unsigned char b) {
    for (size_t i = 0; i < n; i++) {
        if (((const unsigned char*)p)[i] != b) return 0;
    }
    return 1;
}

static uint64_t rng_state = 42;
static float uniform(float lo, float hi) {  // a 64-bit LCG's top 24 bits
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)(rng_state >> 40) / 16777216.0f;
}
static void fill_uniform(float* x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
}

// Runs fn(d) in a forked child (no core dump); returns its wait status and, in err, what
// it wrote on stderr.
static int in_child(void (*fn)(const Zero1Device*), const Zero1Device* d, char* err, size_t err_cap) {
    int fds[2];
    if (pipe(fds) != 0) fatal("pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fatal("fork failed");
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        close(fds[0]);
        dup2(fds[1], 2);
        fn(d);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    char rest[256];
    for (;;) {  // read to the end, keeping what fits, so the child never blocks on a full pipe
        ssize_t k = len < err_cap - 1 ? read(fds[0], err + len, err_cap - 1 - len) : read(fds[0], rest, sizeof(rest));
        if (k <= 0) break;
        if (len < err_cap - 1) len += (size_t)k;
    }
    err[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

// ---- the deferred device: memory ----

static void* crash_target;
static void read_device_pointer(const Zero1Device* d) { printf("%f\n", *(volatile float*)crash_target); }
static void write_device_pointer(const Zero1Device* d) { *(volatile float*)crash_target = 1.0f; }

static void check_host_cannot_dereference(const Zero1Device* d) {
    char* p = (char*)d->ops->alloc(d->ctx, 256);
    void (*const accesses[2])(const Zero1Device*) = {read_device_pointer, write_device_pointer};
    char* const targets[2] = {p, p + 100};  // the base and an interior pointer
    char err[512];
    for (int a = 0; a < 2; a++) {
        for (int t = 0; t < 2; t++) {
            crash_target = targets[t];
            int status = in_child(accesses[a], d, err, sizeof(err));
            CHECK(WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS),
                  "a host %s of device pointer %p did not fault (status %#x)", a ? "write" : "read", crash_target,
                  status);
        }
    }
    // The harness itself: host memory from alloc_host is ordinary memory.
    crash_target = d->ops->alloc_host(d->ctx, 64);
    int status = in_child(write_device_pointer, d, err, sizeof(err));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a write to alloc_host memory failed (status %#x)", status);
    d->ops->free_host(d->ctx, crash_target);
    d->ops->free(d->ctx, p);
}

// The host view reaches the same memory as the device pointer, interior pointers included.
static void check_host_view(const Zero1Device* d) {
    unsigned char* p = (unsigned char*)d->ops->alloc(d->ctx, 64);
    unsigned char* view = (unsigned char*)zero1_device_deferred_host_view(d, p + 16, 48);
    d->ops->fill(d->ctx, d->compute, p, 7, 64);
    d->ops->sync_stream(d->ctx, d->compute);
    CHECK(all_bytes(view, 48, 7), "the host view does not see what the device wrote");
    memset(view, 9, 48);
    unsigned char host[64];
    download(d, d->compute, host, p, 64);
    CHECK(all_bytes(host, 16, 7) && all_bytes(host + 16, 48, 9), "the device does not see what the host view wrote");
    d->ops->free(d->ctx, p);
}

// ---- the deferred device: streams and events ----

// One stream runs its ops in queue order, and not before the host syncs.
static void check_stream_order(const Zero1Device* d) {
    const Zero1DeviceOps* o = d->ops;
    unsigned char* a = (unsigned char*)o->alloc(d->ctx, 64);
    unsigned char* b = (unsigned char*)o->alloc(d->ctx, 64);
    Zero1Event done = o->event_create(d->ctx);
    o->fill(d->ctx, d->compute, a, 1, 64);
    o->copy(d->ctx, d->compute, b, a, 32);            // b[0,32) = 1
    o->fill(d->ctx, d->compute, a + 8, 2, 16);        // a = 1 x8, 2 x16, 1 x40
    o->copy(d->ctx, d->compute, b + 32, a + 4, 32);   // b[32,64) = a[4,36)
    o->record(d->ctx, done, d->compute);
    unsigned char host[64];
    CHECK(o->query_event(d->ctx, done) == 0, "queued ops ran before any sync");
    download(d, d->compute, host, b, 64);
    CHECK(o->query_event(d->ctx, done) == 1, "sync_stream left the event pending");
    for (int i = 0; i < 64; i++) {
        int want = i < 32 ? 1 : (i - 32 + 4 >= 8 && i - 32 + 4 < 24) ? 2 : 1;
        CHECK(host[i] == want, "b[%d] = %d, want %d", i, host[i], want);
    }
    o->event_destroy(d->ctx, done);
    o->free(d->ctx, a);
    o->free(d->ctx, b);
}

// A producer on one stream and a consumer on another: without an event the consumer runs
// first and sees the old data; with record + wait_event it sees the new. wait_event
// captures the event's point when queued (a later record moves the event, not the wait).
static void check_late_execution(const Zero1Device* d) {
    const Zero1DeviceOps* o = d->ops;
    Zero1Stream other = o->stream_create(d->ctx);
    Zero1Event e = o->event_create(d->ctx);
    unsigned char* data = (unsigned char*)o->alloc(d->ctx, 16);
    unsigned char* seen = (unsigned char*)o->alloc(d->ctx, 16);
    unsigned char host[16];

    o->fill(d->ctx, d->compute, data, 0x11, 16);    // producer
    o->copy(d->ctx, other, seen, data, 16);         // consumer, no event
    download(d, other, host, seen, 16);
    CHECK(all_bytes(host, 16, 0x00), "without an event the consumer saw the producer's data (%#x)", host[0]);
    o->sync_stream(d->ctx, d->compute);

    o->fill(d->ctx, d->compute, data, 0x22, 16);
    o->record(d->ctx, e, d->compute);
    o->wait_event(d->ctx, other, e);
    o->fill(d->ctx, d->compute, data, 0x33, 16);    // after the record: not waited for
    o->record(d->ctx, e, d->compute);               // moves e, not the queued wait
    o->copy(d->ctx, other, seen, data, 16);
    download(d, other, host, seen, 16);
    CHECK(all_bytes(host, 16, 0x22), "after wait_event the consumer saw %#x, want 0x22", host[0]);
    CHECK(o->query_event(d->ctx, e) == 0, "the stream ran past the waited-for point");
    o->sync_event(d->ctx, e);
    CHECK(o->query_event(d->ctx, e) == 1, "sync_event left its event pending");
    download(d, other, host, data, 16);
    CHECK(all_bytes(host, 16, 0x33), "sync_event did not run up to the event (%#x)", host[0]);

    Zero1Event never = o->event_create(d->ctx);
    CHECK(o->query_event(d->ctx, never) == 1, "an event never recorded is not complete");
    o->sync_event(d->ctx, never);
    o->event_destroy(d->ctx, never);
    o->event_destroy(d->ctx, e);
    o->stream_destroy(d->ctx, other);
    o->free(d->ctx, data);
    o->free(d->ctx, seen);
}

// sync_event runs a stream up to its event and no further; query_event runs nothing.
static void check_sync_event(const Zero1Device* d) {
    const Zero1DeviceOps* o = d->ops;
    Zero1Stream reader = o->stream_create(d->ctx);
    Zero1Event first = o->event_create(d->ctx), second = o->event_create(d->ctx);
    unsigned char* x = (unsigned char*)o->alloc(d->ctx, 8);
    unsigned char* y = (unsigned char*)o->alloc(d->ctx, 8);
    unsigned char hx[8], hy[8];
    o->fill(d->ctx, d->compute, x, 1, 8);
    o->record(d->ctx, first, d->compute);
    o->fill(d->ctx, d->compute, y, 2, 8);
    o->record(d->ctx, second, d->compute);
    CHECK(o->query_event(d->ctx, first) == 0 && o->query_event(d->ctx, second) == 0, "query_event ran work");
    o->sync_event(d->ctx, first);
    CHECK(o->query_event(d->ctx, first) == 1 && o->query_event(d->ctx, second) == 0, "sync_event ran too little or much");
    download(d, reader, hx, x, 8);  // the reader does not wait: it sees the current state
    download(d, reader, hy, y, 8);
    CHECK(all_bytes(hx, 8, 1) && all_bytes(hy, 8, 0), "after sync_event(first): x %d y %d, want 1 0", hx[0], hy[0]);
    o->sync_event(d->ctx, second);
    download(d, reader, hy, y, 8);
    CHECK(all_bytes(hy, 8, 2), "after sync_event(second): y %d, want 2", hy[0]);
    o->event_destroy(d->ctx, first);
    o->event_destroy(d->ctx, second);
    o->stream_destroy(d->ctx, reader);
    o->free(d->ctx, x);
    o->free(d->ctx, y);
}

// to_host: NaN (0xFF bytes) in the host buffer until a sync covers the copy.
static void check_to_host_before_sync(const Zero1Device* d) {
    const Zero1DeviceOps* o = d->ops;
    float values[5] = {1.0f, -2.5f, 0.0f, 3e8f, -1e-20f};
    double wide[2] = {1.0, 2.0};
    float* dv = (float*)upload(d, values, sizeof(values));
    double* dw = (double*)upload(d, wide, sizeof(wide));
    float* host = (float*)o->alloc_host(d->ctx, sizeof(values));
    double host_wide[2] = {0, 0};
    o->to_host(d->ctx, d->compute, host, dv, sizeof(values));
    o->to_host(d->ctx, d->compute, host_wide, dw, sizeof(wide));
    for (int i = 0; i < 5; i++) CHECK(isnan(host[i]), "host[%d] = %g before the sync, want NaN", i, host[i]);
    CHECK(isnan(host_wide[0]) && isnan(host_wide[1]), "fp64 before the sync: %g %g, want NaN", host_wide[0], host_wide[1]);
    CHECK(isnan(bf16_to_float(0xFFFF)), "0xFFFF is not a bf16 NaN");
    o->sync_stream(d->ctx, d->compute);
    CHECK(memcmp(host, values, sizeof(values)) == 0 && memcmp(host_wide, wide, sizeof(wide)) == 0,
          "after the sync the host does not hold the values");
    o->free_host(d->ctx, host);
    o->free(d->ctx, dv);
    o->free(d->ctx, dw);
}

// free and free_host wait for queued work (cudaFree does); destroy drops what is queued.
static void check_free_and_destroy_with_queued_work(void) {
    Zero1Device d = zero1_device_deferred_create();
    const Zero1DeviceOps* o = d.ops;
    float* x = (float*)o->alloc(d.ctx, 1024);
    float* y = (float*)o->alloc(d.ctx, 1024);
    float* pinned = (float*)o->alloc_host(d.ctx, 1024);
    Zero1Event e = o->event_create(d.ctx);
    o->fill(d.ctx, d.compute, x, 0x40, 1024);
    o->to_host(d.ctx, d.compute, pinned, x, 1024);
    o->record(d.ctx, e, d.compute);
    o->free(d.ctx, y);
    CHECK(o->query_event(d.ctx, e) == 1, "free did not run the queued work first");
    CHECK(all_bytes(pinned, 1024, 0x40), "the queued to_host did not land before free returned");
    o->to_host(d.ctx, d.compute, pinned, x, 1024);
    o->free_host(d.ctx, pinned);  // must not write into freed memory later
    o->fill(d.ctx, d.compute, x, 1, 1024);
    Zero1Stream extra = o->stream_create(d.ctx);
    o->copy(d.ctx, extra, x, x, 512);
    zero1_device_deferred_destroy(&d);  // queued ops and the un-destroyed event/stream go
    CHECK(d.ops == NULL && d.ctx == NULL, "destroy did not clear the device");
}

// ---- the deferred device: arithmetic, bitwise against the CPU device ----

#define BUFFER_N 1000
#define OWNED_N 501
#define NUM_PARAMS 4
#define NUM_FLAGS 6
static const Zero1Span SPANS[] = {  // the last field: model-space index (the bits' element count)
    {10, 0, 100, 0, 1, 0}, {200, 100, 37, 1, 0, 100}, {500, 137, 300, 3, 1, 201}, {900, 437, 64, 2, 0, 137},
};
#define NUM_SPANS 4
#define SPANS_NUMEL 501

typedef struct {
    unsigned char params[BUFFER_N * 4];  // fp32 or bf16
    float master[OWNED_N], grads[BUFFER_N], m[OWNED_N], v[OWNED_N];
} AdamwState;

// One AdamW launch on device d from `in`; the results land in `out`. The step and the
// host span array are changed right after the launch is queued: the device must have
// copied them.
static void adamw_on(const Zero1Device* d, Zero1Dtype ptype, int with_master, float scale, AdamWStep step,
                     const AdamwState* in, AdamwState* out) {
    const Zero1DeviceOps* o = d->ops;
    size_t pbytes = BUFFER_N * zero1_dtype_size(ptype);
    void* params = upload(d, in->params, pbytes);
    float* master = with_master ? (float*)upload(d, in->master, sizeof(in->master)) : NULL;
    float* grads = (float*)upload(d, in->grads, sizeof(in->grads));
    float* m = (float*)upload(d, in->m, sizeof(in->m));
    float* v = (float*)upload(d, in->v, sizeof(in->v));
    float* dscale = (float*)upload(d, &scale, sizeof(scale));
    Zero1Span spans[NUM_SPANS];
    memcpy(spans, SPANS, sizeof(spans));
    void* dspans = o->upload_spans(d->ctx, spans, NUM_SPANS);
    Zero1SpanList list = {NUM_SPANS, SPANS_NUMEL, spans, dspans};
    o->adamw(d->ctx, d->compute, &list, params, ptype, master, grads, m, v, &step, dscale);
    step.lr = 1e9f;
    memset(spans, 0, sizeof(spans));
    memset(out, 0, sizeof(*out));
    download(d, d->compute, out->params, params, pbytes);
    if (with_master) download(d, d->compute, out->master, master, sizeof(out->master));
    download(d, d->compute, out->m, m, sizeof(out->m));
    download(d, d->compute, out->v, v, sizeof(out->v));
    void* all[] = {params, master, grads, m, v, dscale, dspans};
    for (int i = 0; i < 7; i++) o->free(d->ctx, all[i]);
}

// The contract written out: adamw_element over every span element, master/m/v at owned,
// params/grads at buffer, the new master rounded into params.
static void adamw_reference(Zero1Dtype ptype, int with_master, float scale, AdamWStep step, AdamwState* s) {
    step.grad_scale = scale;
    for (int k = 0; k < NUM_SPANS; k++) {
        const Zero1Span* sp = &SPANS[k];
        for (size_t j = 0; j < sp->n; j++) {
            size_t b = sp->buffer + j, w = sp->owned + j;
            float* fp = (float*)s->params;
            float p = with_master ? s->master[w] : fp[b];
            p = adamw_element(p, s->grads[b], &s->m[w], &s->v[w], &step, sp->decays);
            if (with_master) s->master[w] = p;
            if (ptype == ZERO1_FP32) fp[b] = p;
            else ((uint16_t*)s->params)[b] = adamw_round_bf16(p, &step, sp->model + j);
        }
    }
}

static void check_adamw(const Zero1Device* d, Zero1Dtype ptype, int with_master, int stochastic) {
    static AdamwState in, on_cpu, on_deferred, reference;
    float* fp = (float*)in.params;
    fill_uniform(in.grads, BUFFER_N, -1.0f, 1.0f);
    fill_uniform(in.m, OWNED_N, -0.1f, 0.1f);
    fill_uniform(in.v, OWNED_N, 0.0f, 0.01f);
    fill_uniform(in.master, OWNED_N, -1.0f, 1.0f);
    for (int i = 0; i < BUFFER_N; i++) {
        float x = uniform(-1.0f, 1.0f);
        if (ptype == ZERO1_FP32) fp[i] = x;
        else ((uint16_t*)in.params)[i] = float_to_bf16(x);
    }
    AdamWStep step = adamw_step_params(1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 123.0f /* ignored: from device */);
    adamw_step_stochastic(&step, stochastic, 42);
    float scale = 0.75f;
    Zero1Device cpu = zero1_device_cpu();
    adamw_on(&cpu, ptype, with_master, scale, step, &in, &on_cpu);
    adamw_on(d, ptype, with_master, scale, step, &in, &on_deferred);
    reference = in;
    adamw_reference(ptype, with_master, scale, step, &reference);
    size_t pbytes = BUFFER_N * zero1_dtype_size(ptype);
    const char* what = ptype == ZERO1_FP32 ? (with_master ? "fp32 params, master" : "fp32 params")
                       : stochastic        ? "bf16 params, stochastic rounding"
                                           : "bf16 params";
    CHECK(memcmp(on_cpu.params, reference.params, pbytes) == 0 && memcmp(on_cpu.m, reference.m, sizeof(in.m)) == 0 &&
              memcmp(on_cpu.v, reference.v, sizeof(in.v)) == 0 &&
              (!with_master || memcmp(on_cpu.master, reference.master, sizeof(in.master)) == 0),
          "adamw (%s): the CPU device differs from adamw_element", what);
    CHECK(memcmp(on_deferred.params, on_cpu.params, pbytes) == 0 && memcmp(on_deferred.m, on_cpu.m, sizeof(in.m)) == 0 &&
              memcmp(on_deferred.v, on_cpu.v, sizeof(in.v)) == 0 &&
              memcmp(on_deferred.master, on_cpu.master, sizeof(in.master)) == 0,
          "adamw (%s): the deferred device differs from the CPU device", what);
    CHECK(memcmp(on_cpu.params, in.params, pbytes) != 0, "adamw (%s) changed nothing", what);
}

// ---- stochastic rounding (llmc/bf16.h, llmc/adamw.h) ----

// The bf16 neighbours of x: lo toward zero (x truncated), hi one bf16 step away from zero.
static void bf16_neighbours(float x, bf16_bits* lo, bf16_bits* hi) {
    uint32_t u;
    memcpy(&u, &x, 4);
    *lo = (bf16_bits)(u >> 16);
    *hi = (bf16_bits)(*lo + 1);
}

// Over 2^20 element indices the mean of SR(x) is x: the count of round-ups is binomial
// with p = (x - lo) / (hi - lo), and must lie within 6 sigma of N p; every result is one
// of the two neighbours.
static void check_stochastic_rounding_unbiased(void) {
    const uint64_t seed = 42, step = 3;
    const size_t N = (size_t)1 << 20;
    float xs[14];
    int count = 0;
    for (int k = 1; k <= 7; k++) xs[count++] = 1.0f + (float)k * 0x1p-10f;  // p = k/8
    xs[count++] = -(1.0f + 3 * 0x1p-10f);
    xs[count++] = -3.3f;
    xs[count++] = 0.1f;
    xs[count++] = 3e-40f;   // fp32 subnormal; bf16's spacing there is 2^-133
    xs[count++] = 3e38f;    // near the top of bf16's range
    xs[count++] = -7.7e-39f;
    for (int c = 0; c < count; c++) {
        float x = xs[c];
        bf16_bits lo, hi;
        bf16_neighbours(x, &lo, &hi);
        double p = ((double)x - bf16_to_float(lo)) / ((double)bf16_to_float(hi) - bf16_to_float(lo));
        size_t ups = 0, others = 0;
        for (size_t i = 0; i < N; i++) {
            bf16_bits r = float_to_bf16_stochastic(x, stochastic_rounding_bits(seed, step, i));
            if (r == hi) ups++;
            else if (r != lo) others++;
        }
        double sigma = sqrt((double)N * p * (1.0 - p));
        CHECK(p > 0.0 && p < 1.0 && others == 0, "SR(%a): p %g, %zu results are neither neighbour", (double)x, p, others);
        CHECK(fabs((double)ups - (double)N * p) <= 6.0 * sigma, "SR(%a): %zu of %zu rounded up, want %.1f +- 6*%.1f",
              (double)x, ups, N, (double)N * p, sigma);
    }
}

// Exact bf16 values and +-Inf are kept whatever the bits; NaN stays a quiet NaN, the
// same one float_to_bf16 gives.
static void check_stochastic_rounding_specials(void) {
    const uint32_t exact[] = {0x3f800000u, 0xc0200000u, 0x00000000u, 0x80000000u, 0x00010000u, 0x7f7f0000u,
                              0x7f800000u, 0xff800000u};
    const uint32_t bits[] = {0u, 1u, 0x8000u, 0xffffu, 0xffffffffu, 0x12345678u};
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) {
        float x;
        memcpy(&x, &exact[i], 4);
        for (size_t j = 0; j < sizeof(bits) / sizeof(bits[0]); j++) {
            bf16_bits r = float_to_bf16_stochastic(x, bits[j]);
            CHECK(r == (bf16_bits)(exact[i] >> 16), "SR(%#x, bits %#x) = %#x, want it unchanged", exact[i], bits[j], r);
        }
    }
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffbfffffu};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        float x;
        memcpy(&x, &nans[i], 4);
        for (size_t j = 0; j < sizeof(bits) / sizeof(bits[0]); j++) {
            bf16_bits r = float_to_bf16_stochastic(x, bits[j]);
            CHECK(isnan(bf16_to_float(r)) && r == float_to_bf16(x), "SR(NaN %#x) = %#x, want %#x", nans[i], r,
                  float_to_bf16(x));
        }
    }
}

// The same parameters laid out two ways, as two DPs or bucket sizes would: the buffer
// places, the owned order and the cuts between spans differ, the model-space index does
// not. AdamW with stochastic rounding must store the same bf16 bits in both, on the CPU
// and the deferred device, and round_master (a resume's rebuild) must repeat them.
#define LAYOUT_MODEL_N 877     // parameters of 300, 77, 500 elements
#define LAYOUT_BUFFER_N 1000
static const Zero1Span LAYOUT_A[] = {  // one bucket, aligned: buffer = owned
    {0, 0, 300, 0, 1, 0}, {304, 304, 77, 1, 0, 300}, {384, 384, 500, 2, 1, 377},
};
static const Zero1Span LAYOUT_B[] = {  // reversed buffer, parameters cut by shard bounds, owned permuted
    {350, 0, 250, 2, 1, 627}, {600, 250, 123, 0, 1, 0}, {16, 373, 77, 1, 0, 300},
    {100, 450, 250, 2, 1, 377}, {723, 700, 177, 0, 1, 123},
};

typedef struct {
    float master[LAYOUT_MODEL_N], grads[LAYOUT_MODEL_N], m[LAYOUT_MODEL_N], v[LAYOUT_MODEL_N];
} ModelState;

typedef struct {
    bf16_bits params[LAYOUT_MODEL_N], rebuilt[LAYOUT_MODEL_N];  // after adamw; round_master of its master
    float master[LAYOUT_MODEL_N];
} LayoutResult;

// AdamW over one layout on device d; the results mapped back to model space.
static void adamw_in_layout(const Zero1Device* d, const Zero1Span* spans, int count, const ModelState* in,
                            AdamWStep step, LayoutResult* out) {
    static bf16_bits params[LAYOUT_BUFFER_N];
    static float master[LAYOUT_BUFFER_N], grads[LAYOUT_BUFFER_N], m[LAYOUT_BUFFER_N], v[LAYOUT_BUFFER_N];
    memset(params, 0, sizeof(params));
    memset(master, 0, sizeof(master));
    memset(grads, 0, sizeof(grads));
    memset(m, 0, sizeof(m));
    memset(v, 0, sizeof(v));
    size_t numel = 0;
    for (int k = 0; k < count; k++) {
        const Zero1Span* sp = &spans[k];
        for (size_t j = 0; j < sp->n; j++) {
            size_t e = sp->model + j;
            master[sp->owned + j] = in->master[e];
            m[sp->owned + j] = in->m[e];
            v[sp->owned + j] = in->v[e];
            grads[sp->buffer + j] = in->grads[e];
            params[sp->buffer + j] = float_to_bf16(in->master[e]);
        }
        numel += sp->n;
    }
    const Zero1DeviceOps* o = d->ops;
    float scale = 1.0f;
    void* dparams = upload(d, params, sizeof(params));
    void* drebuilt = o->alloc(d->ctx, sizeof(params));
    float* dmaster = (float*)upload(d, master, sizeof(master));
    float* dgrads = (float*)upload(d, grads, sizeof(grads));
    float* dm = (float*)upload(d, m, sizeof(m));
    float* dv = (float*)upload(d, v, sizeof(v));
    float* dscale = (float*)upload(d, &scale, sizeof(scale));
    void* dspans = o->upload_spans(d->ctx, spans, count);
    Zero1SpanList list = {count, numel, spans, dspans};
    o->adamw(d->ctx, d->compute, &list, dparams, ZERO1_BF16, dmaster, dgrads, dm, dv, &step, dscale);
    o->round_master(d->ctx, d->compute, &list, drebuilt, ZERO1_BF16, dmaster, &step);
    download(d, d->compute, params, dparams, sizeof(params));
    download(d, d->compute, master, dmaster, sizeof(master));
    static bf16_bits rebuilt[LAYOUT_BUFFER_N];
    download(d, d->compute, rebuilt, drebuilt, sizeof(rebuilt));
    for (int k = 0; k < count; k++) {
        const Zero1Span* sp = &spans[k];
        for (size_t j = 0; j < sp->n; j++) {
            out->params[sp->model + j] = params[sp->buffer + j];
            out->rebuilt[sp->model + j] = rebuilt[sp->buffer + j];
            out->master[sp->model + j] = master[sp->owned + j];
        }
    }
    void* all[] = {dparams, drebuilt, dmaster, dgrads, dm, dv, dscale, dspans};
    for (int i = 0; i < 8; i++) o->free(d->ctx, all[i]);
}

static void check_rounding_across_layouts(const Zero1Device* deferred) {
    static ModelState in;
    fill_uniform(in.master, LAYOUT_MODEL_N, -1.0f, 1.0f);
    fill_uniform(in.grads, LAYOUT_MODEL_N, -1.0f, 1.0f);
    fill_uniform(in.m, LAYOUT_MODEL_N, -0.1f, 0.1f);
    fill_uniform(in.v, LAYOUT_MODEL_N, 0.0f, 0.01f);
    AdamWStep step = adamw_step_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f);
    adamw_step_stochastic(&step, 1, 42);
    Zero1Device cpu = zero1_device_cpu();
    const Zero1Device* devices[2] = {&cpu, deferred};
    static LayoutResult r[2][2];  // [device][layout]
    for (int k = 0; k < 2; k++) {
        adamw_in_layout(devices[k], LAYOUT_A, 3, &in, step, &r[k][0]);
        adamw_in_layout(devices[k], LAYOUT_B, 5, &in, step, &r[k][1]);
    }
    for (int k = 0; k < 2; k++) {
        for (int l = 0; l < 2; l++) {
            CHECK(memcmp(&r[k][l], &r[0][0], sizeof(r[0][0])) == 0,
                  "stochastic AdamW on the %s device, layout %c: differs from the CPU device's layout A",
                  devices[k]->ops->name, "AB"[l]);
            CHECK(memcmp(r[k][l].rebuilt, r[k][l].params, sizeof(r[k][l].params)) == 0,
                  "round_master on the %s device, layout %c: differs from adamw's write-back", devices[k]->ops->name,
                  "AB"[l]);
        }
    }
    int stochastic_changed = 0, neighbours = 1;
    for (size_t e = 0; e < LAYOUT_MODEL_N; e++) {
        bf16_bits lo, hi;
        bf16_neighbours(r[0][0].master[e], &lo, &hi);
        if (r[0][0].params[e] != float_to_bf16(r[0][0].master[e])) stochastic_changed++;
        if (r[0][0].params[e] != lo && r[0][0].params[e] != hi) neighbours = 0;
    }
    // The far neighbour's probability is spread over [0, 1/2): about a quarter of the
    // elements round away from nearest, far more than 100 of 877.
    CHECK(neighbours && stochastic_changed > 100, "stochastic write-back: %d of %d elements differ from nearest%s",
          stochastic_changed, LAYOUT_MODEL_N, neighbours ? "" : ", some are no neighbour of the master");
}

// sum_squares, nonfinite_flags and norm_and_clip on device d.
typedef struct {
    double sumsq;
    float flags[NUM_FLAGS];
    float norm[3][2];
} ReductionResults;

static const float MAX_NORMS[3] = {1.0f, 0.0f, 1e6f};  // clips; clipping off; no clip needed

static void reductions_on(const Zero1Device* d, const float* grads, ReductionResults* r) {
    const Zero1DeviceOps* o = d->ops;
    double acc0 = 1.5;
    float flags0[NUM_FLAGS] = {0, 0.5f, 0, 0, 7, 0};
    float* dgrads = (float*)upload(d, grads, BUFFER_N * sizeof(float));
    double* acc = (double*)upload(d, &acc0, sizeof(acc0));
    float* flags = (float*)upload(d, flags0, sizeof(flags0));
    float* norm = (float*)o->alloc(d->ctx, 3 * 2 * sizeof(float));
    void* dspans = o->upload_spans(d->ctx, SPANS, NUM_SPANS);
    Zero1SpanList list = {NUM_SPANS, SPANS_NUMEL, SPANS, dspans};
    o->sum_squares(d->ctx, d->compute, &list, dgrads, acc);
    o->nonfinite_flags(d->ctx, d->compute, &list, dgrads, flags);
    for (int i = 0; i < 3; i++) o->norm_and_clip(d->ctx, d->compute, acc, MAX_NORMS[i], norm + 2 * i);
    download(d, d->compute, &r->sumsq, acc, sizeof(double));
    download(d, d->compute, r->flags, flags, sizeof(r->flags));
    download(d, d->compute, r->norm, norm, sizeof(r->norm));
    void* all[] = {dgrads, acc, flags, norm, dspans};
    for (int i = 0; i < 5; i++) o->free(d->ctx, all[i]);
}

static void check_reductions(const Zero1Device* d) {
    float grads[BUFFER_N];
    fill_uniform(grads, BUFFER_N, -2.0f, 2.0f);
    grads[5] = INFINITY;  // outside every span: flags nothing, not in the sum
    ReductionResults cpu_r, def_r;
    Zero1Device cpu = zero1_device_cpu();
    reductions_on(&cpu, grads, &cpu_r);
    reductions_on(d, grads, &def_r);
    CHECK(memcmp(&cpu_r, &def_r, sizeof(cpu_r)) == 0, "reductions: the deferred device differs from the CPU device");
    long double ref = 1.5L;
    for (int k = 0; k < NUM_SPANS; k++) {
        for (size_t j = 0; j < SPANS[k].n; j++) ref += (long double)grads[SPANS[k].buffer + j] * grads[SPANS[k].buffer + j];
    }
    CHECK(fabsl(cpu_r.sumsq - ref) <= 1e-12L * ref, "sum_squares %.17g, want %.17Lg", cpu_r.sumsq, ref);
    float norm = (float)sqrt(cpu_r.sumsq);
    CHECK(norm > 1.0f && cpu_r.norm[0][0] == norm && cpu_r.norm[0][1] == 1.0f / norm, "clip: %g %g (norm %g)",
          cpu_r.norm[0][0], cpu_r.norm[0][1], norm);
    CHECK(cpu_r.norm[1][1] == 1.0f && cpu_r.norm[2][1] == 1.0f, "no clip: %g %g", cpu_r.norm[1][1], cpu_r.norm[2][1]);
    const float no_flags[NUM_FLAGS] = {0, 0.5f, 0, 0, 7, 0};
    CHECK(memcmp(cpu_r.flags, no_flags, sizeof(no_flags)) == 0, "finite grads raised a flag");

    grads[SPANS[0].buffer + 50] = NAN;      // param 0
    grads[SPANS[2].buffer + 299] = -INFINITY;  // param 3, the span's last element
    reductions_on(&cpu, grads, &cpu_r);
    reductions_on(d, grads, &def_r);
    CHECK(memcmp(&cpu_r.flags, &def_r.flags, sizeof(cpu_r.flags)) == 0, "flags: deferred differs from CPU");
    const float want[NUM_FLAGS] = {1, 0.5f, 0, 1, 7, 0};
    CHECK(memcmp(cpu_r.flags, want, sizeof(want)) == 0, "flags %g %g %g %g %g %g, want 1 0.5 0 1 7 0", cpu_r.flags[0],
          cpu_r.flags[1], cpu_r.flags[2], cpu_r.flags[3], cpu_r.flags[4], cpu_r.flags[5]);
}

// sum_slices from fp32 and bf16 slices, with scale 1 and 1/3: the CPU device against the
// fp32 fold in slice order written out here, the deferred device bitwise against the CPU.
static void check_sum_slices(const Zero1Device* d) {
    enum { COUNT = 5, N = 203 };
    float f[COUNT * N];
    uint16_t b[COUNT * N];
    fill_uniform(f, COUNT * N, -3.0f, 3.0f);
    f[0] = -0.0f;  // a lone -0.0 in slice 0 of a one-slice sum stays -0.0
    for (int i = 0; i < COUNT * N; i++) b[i] = float_to_bf16(uniform(-3.0f, 3.0f));
    const float scales[2] = {1.0f, 1.0f / 3.0f};
    Zero1Device cpu = zero1_device_cpu();
    for (int c = 0; c < 8; c++) {
        Zero1Dtype t = c & 1 ? ZERO1_BF16 : ZERO1_FP32;
        int count = c & 2 ? COUNT : 1;
        float scale = scales[(c >> 2) & 1];
        const void* src = t == ZERO1_BF16 ? (const void*)b : (const void*)f;
        float out[2][N];
        const Zero1Device* devs[2] = {&cpu, d};
        for (int k = 0; k < 2; k++) {
            const Zero1Device* dv = devs[k];
            void* dsrc = upload(dv, src, (size_t)count * N * zero1_dtype_size(t));
            float* ddst = (float*)dv->ops->alloc(dv->ctx, N * sizeof(float));
            dv->ops->sum_slices(dv->ctx, dv->compute, ddst, dsrc, t, count, N, scale);
            download(dv, dv->compute, out[k], ddst, N * sizeof(float));
            dv->ops->free(dv->ctx, dsrc);
            dv->ops->free(dv->ctx, ddst);
        }
        int wrong = 0;
        for (int i = 0; i < N; i++) {
            float acc = t == ZERO1_BF16 ? bf16_to_float(b[i]) : f[i];
            for (int r = 1; r < count; r++) acc += t == ZERO1_BF16 ? bf16_to_float(b[r * N + i]) : f[r * N + i];
            acc *= scale;
            wrong += memcmp(&acc, &out[0][i], 4) != 0;
        }
        CHECK(wrong == 0, "sum_slices case %d: %d of %d CPU results differ from the slice-order fp32 sum", c, wrong, N);
        CHECK(memcmp(out[0], out[1], sizeof(out[0])) == 0, "sum_slices case %d: the deferred device differs from the CPU",
              c);
    }
}

// convert in every supported direction, including NaN, infinities and ties.
static void check_convert(const Zero1Device* d) {
    enum { N = 300 };
    float f[N];
    uint16_t b[N];
    fill_uniform(f, N, -100.0f, 100.0f);
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.00390625f /* a tie */, 3.4e38f, 1e-40f};
    memcpy(f, specials, sizeof(specials));
    for (int i = 0; i < N; i++) b[i] = (uint16_t)(i * 251);
    struct { Zero1Dtype to, from; const void* src; } cases[] = {
        {ZERO1_BF16, ZERO1_FP32, f}, {ZERO1_FP32, ZERO1_BF16, b}, {ZERO1_FP32, ZERO1_FP32, f}, {ZERO1_BF16, ZERO1_BF16, b}};
    Zero1Device cpu = zero1_device_cpu();
    for (int c = 0; c < 4; c++) {
        unsigned char out[2][N * 4];
        const Zero1Device* devs[2] = {&cpu, d};
        for (int k = 0; k < 2; k++) {
            const Zero1Device* dv = devs[k];
            void* src = upload(dv, cases[c].src, N * zero1_dtype_size(cases[c].from));
            void* dst = dv->ops->alloc(dv->ctx, N * 4);
            dv->ops->convert(dv->ctx, dv->compute, dst, cases[c].to, src, cases[c].from, N);
            download(dv, dv->compute, out[k], dst, N * zero1_dtype_size(cases[c].to));
            dv->ops->free(dv->ctx, src);
            dv->ops->free(dv->ctx, dst);
        }
        size_t bytes = N * zero1_dtype_size(cases[c].to);
        CHECK(memcmp(out[0], out[1], bytes) == 0, "convert case %d: the deferred device differs from the CPU device", c);
        int ok = 1;
        for (int i = 0; i < N; i++) {
            if (cases[c].to == ZERO1_BF16 && cases[c].from == ZERO1_FP32) ok &= ((uint16_t*)out[0])[i] == float_to_bf16(f[i]);
            if (cases[c].to == ZERO1_FP32 && cases[c].from == ZERO1_BF16) ok &= ((uint32_t*)out[0])[i] == (uint32_t)b[i] << 16;
        }
        CHECK(ok && (cases[c].to != cases[c].from || memcmp(out[0], cases[c].src, bytes) == 0), "convert case %d is wrong", c);
    }
}

// --dp-invariant's ops (zero1/exact_sum.h). add and sum_slices_pairwise: the CPU device
// against the formulas written out here (the tree recursively), the deferred device bitwise
// against the CPU. sum_squares_exact: exact (integer multiples of 2^-10, whose squares a
// double sums exactly; the smallest denormal's square lands in limb 0; FLT_MAX's square
// keeps the top), the same words for any split of the spans (one span or reversed pieces,
// one launch or two, two ranks' words added as doubles as the all-reduce adds them), NaN
// and infinity; norm_and_clip_exact on them.
static float pairwise_reference(const float* src, int count, size_t n, size_t i) {
    if (count == 1) return src[i];
    return pairwise_reference(src, count / 2, n, i) + pairwise_reference(src + (size_t)(count / 2) * n, count / 2, n, i);
}

static void exact_words_on(const Zero1Device* d, const float* grads, size_t n, const Zero1Span* spans, int count,
                           int launches, double* words, float out[2]) {
    const Zero1DeviceOps* o = d->ops;
    float* dgrads = (float*)upload(d, grads, n * sizeof(float));
    double* dwords = (double*)o->alloc(d->ctx, ZERO1_EXACT_WORDS * sizeof(double));
    float* dout = (float*)o->alloc(d->ctx, 2 * sizeof(float));
    int per = (count + launches - 1) / launches;
    for (int first = 0; first < count; first += per) {
        int k = count - first < per ? count - first : per;
        size_t numel = 0;
        for (int i = 0; i < k; i++) numel += spans[first + i].n;
        void* dspans = o->upload_spans(d->ctx, spans + first, k);
        Zero1SpanList list = {k, numel, spans + first, dspans};
        o->sum_squares_exact(d->ctx, d->compute, &list, dgrads, dwords);
        o->sync_stream(d->ctx, d->compute);
        o->free(d->ctx, dspans);
    }
    o->norm_and_clip_exact(d->ctx, d->compute, dwords, 1.0f, dout);
    download(d, d->compute, words, dwords, ZERO1_EXACT_WORDS * sizeof(double));
    download(d, d->compute, out, dout, 2 * sizeof(float));
    void* all[] = {dgrads, dwords, dout};
    for (int i = 0; i < 3; i++) o->free(d->ctx, all[i]);
}

static void check_dp_invariant_ops(const Zero1Device* d) {
    enum { N = 1000, COUNT = 16 };
    Zero1Device cpu = zero1_device_cpu();
    const Zero1Device* devs[2] = {&cpu, d};
    static float a[N], b[N], slices[COUNT * N], out[2][COUNT * N];
    fill_uniform(a, N, -3.0f, 3.0f);
    fill_uniform(b, N, -3.0f, 3.0f);
    for (int k = 0; k < 2; k++) {
        float* da = (float*)upload(devs[k], a, sizeof(a));
        float* db = (float*)upload(devs[k], b, sizeof(b));
        devs[k]->ops->add(devs[k]->ctx, devs[k]->compute, da, da, db, N);  // in place, as the runtime adds
        download(devs[k], devs[k]->compute, out[k], da, sizeof(a));
        devs[k]->ops->free(devs[k]->ctx, da);
        devs[k]->ops->free(devs[k]->ctx, db);
    }
    int ok = memcmp(out[0], out[1], sizeof(a)) == 0;
    for (int i = 0; i < N; i++) ok &= out[0][i] == a[i] + b[i];
    CHECK(ok, "add: not a + b, or the deferred device differs from the CPU device");

    fill_uniform(slices, COUNT * N, -3.0f, 3.0f);
    // Element 0's slices 1e8, 1, -1e8, 1: pairwise (1e8 + 1) + (-1e8 + 1) = 0 in fp32, in
    // slice order 1: the formula's association shows.
    const float order[4] = {1e8f, 1.0f, -1e8f, 1.0f};
    for (int r = 0; r < 4; r++) slices[(size_t)r * N] = order[r];
    for (int count = 1; count <= COUNT; count *= 2) {
        for (int k = 0; k < 2; k++) {
            float* src = (float*)upload(devs[k], slices, (size_t)count * N * sizeof(float));
            float* dst = (float*)devs[k]->ops->alloc(devs[k]->ctx, N * sizeof(float));
            devs[k]->ops->sum_slices_pairwise(devs[k]->ctx, devs[k]->compute, dst, src, count, N);
            download(devs[k], devs[k]->compute, out[k], dst, N * sizeof(float));
            devs[k]->ops->free(devs[k]->ctx, src);
            devs[k]->ops->free(devs[k]->ctx, dst);
        }
        ok = memcmp(out[0], out[1], N * sizeof(float)) == 0;
        for (int i = 0; i < N; i++) ok &= out[0][i] == pairwise_reference(slices, count, N, (size_t)i);
        CHECK(ok, "sum_slices_pairwise of %d slices: not the pairwise tree, or deferred != CPU", count);
        if (count == 4) CHECK(out[0][0] == 0.0f, "sum_slices_pairwise: 1e8, 1, -1e8, 1 gave %g, the tree gives 0", out[0][0]);
    }

    // Multiples of 2^-10 up to 1000 in magnitude: every square and every partial sum is exact in double.
    static float g[N];
    double exact = 0.0;
    for (int i = 0; i < N; i++) {
        g[i] = ldexpf((float)((int)(uniform(0.0f, 2048000.0f)) - 1024000), -10);
        exact += (double)g[i] * g[i];
    }
    Zero1Span whole = {0, 0, N, 0, 0, 0}, pieces[7];
    const size_t cuts[8] = {0, 1, 130, 131, 500, 777, 998, N};
    for (int i = 0; i < 7; i++) pieces[i] = (Zero1Span){cuts[6 - i], 0, cuts[7 - i] - cuts[6 - i], 0, 0, 0};
    double words[4][ZERO1_EXACT_WORDS];
    float norms[4][2];
    exact_words_on(&cpu, g, N, &whole, 1, 1, words[0], norms[0]);
    exact_words_on(&cpu, g, N, pieces, 7, 3, words[1], norms[1]);  // reversed pieces, three launches
    exact_words_on(d, g, N, pieces, 7, 1, words[2], norms[2]);
    CHECK(memcmp(words[0], words[1], sizeof(words[0])) == 0 && memcmp(words[0], words[2], sizeof(words[0])) == 0 &&
          memcmp(norms[0], norms[1], sizeof(norms[0])) == 0 && memcmp(norms[0], norms[2], sizeof(norms[0])) == 0,
          "sum_squares_exact: other spans, launches or the deferred device gave other words");
    CHECK(zero1_exact_value(words[0]) == exact && norms[0][0] == (float)sqrt(exact) && norms[0][1] == 1.0f / norms[0][0],
          "sum_squares_exact: %.17g (norm %g, clip %g), want %.17g exactly", zero1_exact_value(words[0]), norms[0][0],
          norms[0][1], exact);
    // Two ranks' halves, their words added as doubles (the grad norm's all-reduce).
    Zero1Span half[2] = {{0, 0, 400, 0, 0, 0}, {400, 0, N - 400, 0, 0, 0}};
    exact_words_on(&cpu, g, N, &half[0], 1, 1, words[1], norms[1]);
    exact_words_on(&cpu, g, N, &half[1], 1, 1, words[2], norms[2]);
    for (int w = 0; w < ZERO1_EXACT_WORDS; w++) words[3][w] = words[1][w] + words[2][w];
    float* dout = (float*)cpu.ops->alloc(cpu.ctx, 2 * sizeof(float));
    cpu.ops->norm_and_clip_exact(cpu.ctx, cpu.compute, words[3], 1.0f, dout);
    CHECK(memcmp(dout, norms[0], sizeof(norms[0])) == 0, "sum_squares_exact: two halves' words added: norm %g, want %g",
          dout[0], norms[0][0]);
    // The extremes: the smallest denormal's square is limb 0's lowest bit; FLT_MAX's dominates.
    const float ends[3] = {ldexpf(1.0f, -149), 3.4028234663852886e38f, 1.0f};
    Zero1Span three = {0, 0, 3, 0, 0, 0};
    exact_words_on(&cpu, ends, 3, &three, 1, 1, words[1], norms[1]);
    double top = (double)ends[1] * ends[1];
    CHECK(words[1][0] == 1.0 && zero1_exact_value(words[1]) == top + 1.0 && norms[1][0] == (float)sqrt(top),
          "sum_squares_exact of 2^-149, FLT_MAX, 1: limb 0 %g, value %.17g (want %.17g)", words[1][0],
          zero1_exact_value(words[1]), top + 1.0);
    float specials[3] = {1.0f, INFINITY, 2.0f};
    exact_words_on(&cpu, specials, 3, &three, 1, 1, words[1], norms[1]);
    specials[0] = NAN;
    exact_words_on(d, specials, 3, &three, 1, 1, words[2], norms[2]);
    CHECK(isinf(norms[1][0]) && isnan(norms[2][0]), "sum_squares_exact: an infinity gave norm %g, a NaN %g", norms[1][0],
          norms[2][0]);
    cpu.ops->free(cpu.ctx, dout);
}

// ---- bad input stops with one message: the deferred device, the hazard communicator ----

static char* bad_alloc(const Zero1Device* d, size_t n) { return (char*)d->ops->alloc(d->ctx, n); }
static void bad_host_source(const Zero1Device* d) {
    static char host[8];
    d->ops->copy(d->ctx, d->compute, bad_alloc(d, 8), host, 8);
}
static void bad_device_destination(const Zero1Device* d) {
    char* p = bad_alloc(d, 8);
    d->ops->to_host(d->ctx, d->compute, p, p, 8);
}
static void bad_out_of_bounds(const Zero1Device* d) { d->ops->fill(d->ctx, d->compute, bad_alloc(d, 64) + 32, 0, 33); }
static void bad_interior_free(const Zero1Device* d) { d->ops->free(d->ctx, bad_alloc(d, 64) + 8); }
static void bad_use_after_free(const Zero1Device* d) {
    char* p = bad_alloc(d, 64);
    d->ops->free(d->ctx, p);
    d->ops->fill(d->ctx, d->compute, p, 0, 8);
}
static void bad_stale_spans(const Zero1Device* d) {
    Zero1Span spans[1] = {{0, 0, 4, 0, 0, 0}};
    void* dspans = d->ops->upload_spans(d->ctx, spans, 1);
    spans[0].n = 8;  // changed after the upload
    Zero1SpanList list = {1, 8, spans, dspans};
    char* g = bad_alloc(d, 64);
    d->ops->sum_squares(d->ctx, d->compute, &list, (float*)g, (double*)g);
}
static void bad_span_past_buffer(const Zero1Device* d) {
    Zero1Span spans[1] = {{10, 0, 7, 0, 0, 0}};  // grads[10,17): 68 bytes of a 64-byte buffer
    Zero1SpanList list = {1, 7, spans, d->ops->upload_spans(d->ctx, spans, 1)};
    d->ops->sum_squares(d->ctx, d->compute, &list, (float*)bad_alloc(d, 64), (double*)bad_alloc(d, 8));
}

static void bad_host_view(const Zero1Device* d) { zero1_device_deferred_host_view(d, bad_alloc(d, 64) + 8, 57); }

// The hazard communicator holds the caller to comm.h's handle and group rules.
static Zero1Comm* bad_hazard(const Zero1Device* d, void** buf) {
    *buf = bad_alloc(d, 64);
    return zero1_comm_hazard_create(zero1_comm_single_create(d), d, 1);
}
static void bad_wait_in_group(const Zero1Device* d) {
    void* buf;
    Zero1Comm* c = bad_hazard(d, &buf);
    zero1_comm_group_begin(c);
    zero1_comm_wait(c, zero1_comm_all_reduce(c, buf, 16, ZERO1_FP32, ZERO1_SUM, 3));
}
static void bad_wait_twice(const Zero1Device* d) {
    void* buf;
    Zero1Comm* c = bad_hazard(d, &buf);
    Zero1Handle h = zero1_comm_all_gather(c, buf, 16, ZERO1_FP32, 0);
    zero1_comm_wait(c, h);
    zero1_comm_wait(c, h);
}
static void bad_nested_group(const Zero1Device* d) {
    void* buf;
    Zero1Comm* c = bad_hazard(d, &buf);
    zero1_comm_group_begin(c);
    zero1_comm_group_begin(c);
}

static void check_bad_input(const Zero1Device* d) {
    struct { void (*fn)(const Zero1Device*); const char* message; } cases[] = {
        {bad_host_source, "is not a device pointer"},
        {bad_device_destination, "is a device pointer, not host memory"},
        {bad_out_of_bounds, "not inside one live allocation"},
        {bad_interior_free, "not the start of a live allocation"},
        {bad_use_after_free, "not inside one live allocation"},
        {bad_stale_spans, "device copy differs from their host array"},
        {bad_span_past_buffer, "not inside one live allocation"},
        {bad_host_view, "host view: 57 bytes"},
        {bad_wait_in_group, "wait for the all-reduce of bucket 3 at step 0 inside its group"},
        {bad_wait_twice, "wait of handle 0, which is not in flight"},
        {bad_nested_group, "groups do not nest"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[1024];
        int status = in_child(cases[i].fn, d, err, sizeof(err));
        int lines = 0;
        for (const char* c = err; *c; c++) lines += *c == '\n';
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && lines == 1 && strncmp(err, "error: ", 7) == 0 &&
                  strstr(err, cases[i].message),
              "bad input case %zu: status %#x, stderr '%s', want one 'error: ...%s' line", i, status, err,
              cases[i].message);
    }
}

// ---- the hazard communicator ----

typedef enum { REDUCE_SCATTER, ALL_GATHER, ALL_REDUCE } Kind;
static const char* const KIND_NAMES[3] = {"reduce-scatter", "all-gather", "all-reduce"};
static const char* const DTYPE_NAMES[3] = {"fp32", "bf16", "fp64"};

// Small integers, exact in bf16 and in sums over a few ranks.
static double contribution(int rank, size_t i) { return (double)((int)((i * 7 + (size_t)rank * 3) % 11) - 5); }

static void store(void* p, Zero1Dtype t, size_t i, double x) {
    if (t == ZERO1_FP64) ((double*)p)[i] = x;
    else if (t == ZERO1_FP32) ((float*)p)[i] = (float)x;
    else ((uint16_t*)p)[i] = float_to_bf16((float)x);
}
static double load(const void* p, Zero1Dtype t, size_t i) {
    return t == ZERO1_FP64 ? ((const double*)p)[i] : t == ZERO1_FP32 ? ((const float*)p)[i] : bf16_to_float(((const uint16_t*)p)[i]);
}

static Zero1Handle issue(Zero1Comm* c, Kind kind, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op, int bucket) {
    if (kind == REDUCE_SCATTER) return zero1_comm_reduce_scatter(c, buf, n, t, op, bucket);
    if (kind == ALL_GATHER) return zero1_comm_all_gather(c, buf, n, t, bucket);
    return zero1_comm_all_reduce(c, buf, n, t, op, bucket);
}

// ZERO1_AVG of a sum on the host backends: the sum (exact here: small integers) times the
// float nearest 1/size, in the dtype (bf16: in fp32, rounded once).
static double averaged(double sum, Zero1Dtype t, int size) {
    if (t == ZERO1_FP64) return sum * (double)zero1_avg_scale(size);
    float x = (float)sum * zero1_avg_scale(size);
    return t == ZERO1_FP32 ? x : bf16_to_float(float_to_bf16(x));
}

// A collective's input on this rank; an all-gather's other slots hold junk to be overwritten.
static void* make_input(const Zero1Device* d, const Zero1Comm* c, Kind kind, size_t n, Zero1Dtype t) {
    size_t es = zero1_dtype_size(t), slot = n / (size_t)c->size;
    void* host = mallocCheck(n * es);
    for (size_t i = 0; i < n; i++) {
        int mine = i / slot == (size_t)c->rank;
        store(host, t, i, kind == ALL_GATHER && !mine ? 99.0 : contribution(c->rank, i));
    }
    void* buf = upload(d, host, n * es);
    free(host);
    return buf;
}

// The region after the collective: the expected values where the result is defined, and
// NaN bytes (the hazard's poison) in the rest of a reduce-scatter's buffer.
static void check_result(const Zero1Device* d, const Zero1Comm* c, Kind kind, const void* buf, size_t n, Zero1Dtype t,
                         Zero1ReduceOp op, const char* label) {
    size_t es = zero1_dtype_size(t), slot = n / (size_t)c->size;
    unsigned char* host = (unsigned char*)mallocCheck(n * es);
    download(d, d->compute, host, buf, n * es);
    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        int owner = (int)(i / slot);
        if (kind == REDUCE_SCATTER && owner != c->rank) {
            wrong += !all_bytes(host + i * es, es, 0xFF);
            continue;
        }
        double want = 0;
        for (int r = 0; r < c->size; r++) want += contribution(r, i);
        if (kind == ALL_GATHER) want = contribution(owner, i);
        else if (op == ZERO1_AVG) want = averaged(want, t, c->size);
        wrong += load(host, t, i) != want;
    }
    CHECK(wrong == 0, "%s: %s%s %s on rank %d: %d of %zu elements wrong", label, KIND_NAMES[kind],
          op == ZERO1_AVG ? " (avg)" : "", DTYPE_NAMES[t], c->rank, wrong, n);
    free(host);
}

static void check_in_flight_is_poisoned(const Zero1Device* d, const void* buf, size_t bytes, const char* label) {
    unsigned char* host = (unsigned char*)mallocCheck(bytes);
    download(d, d->compute, host, buf, bytes);
    CHECK(all_bytes(host, bytes, 0xFF), "%s: the region in flight does not read NaN bytes", label);
    free(host);
}

// test() until it answers 1; returns how often it said "not yet".
static int finish_by_test(Zero1Comm* c, Zero1Handle h, const char* label) {
    int not_yet = 0;
    while (!zero1_comm_test(c, h)) {
        zero1_comm_progress(c);
        if (++not_yet > 100000) {
            CHECK(0, "%s: test() never completed", label);
            zero1_comm_wait(c, h);
            break;
        }
    }
    return not_yet;
}

// The uniform all_to_all_v (what --fp32-accumulation issues): `per` elements for every rank,
// slice j of send for rank j, rank j's slice for this rank at recv[j*per].
static Zero1Handle uniform_all_to_all(Zero1Comm* c, const void* send, void* recv, size_t per, Zero1Dtype t,
                                      int bucket) {
    size_t* counts = (size_t*)mallocCheck(2 * (size_t)c->size * sizeof(size_t));
    size_t* offsets = counts + c->size;
    for (int j = 0; j < c->size; j++) {
        counts[j] = per;
        offsets[j] = (size_t)j * per;
    }
    Zero1Handle h = zero1_comm_all_to_all_v(c, send, counts, offsets, recv, counts, offsets, t, bucket);
    free(counts);  // the contract: read during the call only
    return h;
}

// all_to_all: what rank `from` sends rank `to` as element i of its slice (small integers,
// exact in bf16), so every received element tells where it came from.
static double a2a_value(int from, int to, size_t i) { return (double)((int)((i * 5 + (size_t)from * 7 + (size_t)to * 3) % 23) - 11); }

// One all_to_all of `per` elements per rank: both regions NaN while in flight, then recv[j]
// holds exactly what rank j sent this rank and send is unchanged. Returns test()'s "not yets".
static int check_all_to_all(const Zero1Device* d, Zero1Comm* c, Zero1Dtype t, int use_test, const char* label) {
    size_t per = 37, n = (size_t)c->size * per, es = zero1_dtype_size(t);
    void* host = mallocCheck(n * es);
    for (size_t k = 0; k < n; k++) store(host, t, k, a2a_value(c->rank, (int)(k / per), k % per));
    void* send = upload(d, host, n * es);
    void* recv = d->ops->alloc(d->ctx, n * es);
    Zero1Handle h = uniform_all_to_all(c, send, recv, per, t, 7);
    check_in_flight_is_poisoned(d, send, n * es, label);
    check_in_flight_is_poisoned(d, recv, n * es, label);
    int not_yet = 0;
    if (use_test) not_yet = finish_by_test(c, h, label);
    else zero1_comm_wait(c, h);
    unsigned char* got = (unsigned char*)mallocCheck(n * es);
    download(d, d->compute, got, recv, n * es);
    int wrong = 0;
    for (size_t k = 0; k < n; k++) wrong += load(got, t, k) != a2a_value((int)(k / per), c->rank, k % per);
    download(d, d->compute, got, send, n * es);
    CHECK(wrong == 0 && memcmp(got, host, n * es) == 0, "%s: all-to-all %s on rank %d: %d of %zu received elements "
          "wrong, send %s", label, DTYPE_NAMES[t], c->rank, wrong, n, memcmp(got, host, n * es) ? "changed" : "intact");
    free(got);
    free(host);
    d->ops->free(d->ctx, send);
    d->ops->free(d->ctx, recv);
    return not_yet;
}

// An arbitrary fp32 gradient element of rank r at position k of a bucket.
static float grad_value(int r, size_t k) {
    uint64_t x = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)k * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return ((float)(x % 2000001) - 1000000.0f) * 1.37e-6f;
}

// The fp32-accumulation step end to end: a bucket converted to bf16 (the runtime does that
// before firing), all_to_all, sum_slices with scale 1 and with 1/size, against the fp32
// sum in rank order of the bf16-rounded contributions, computed here, bit for bit.
static void check_exchange_and_sum(const Zero1Device* d, Zero1Comm* c, const char* label) {
    size_t per = 301, n = (size_t)c->size * per;
    uint16_t* bucket = (uint16_t*)mallocCheck(n * 2);
    for (size_t k = 0; k < n; k++) bucket[k] = float_to_bf16(grad_value(c->rank, k));
    void* send = upload(d, bucket, n * 2);
    void* recv = d->ops->alloc(d->ctx, n * 2);
    float* shard = (float*)d->ops->alloc(d->ctx, 2 * per * sizeof(float));
    zero1_comm_wait(c, uniform_all_to_all(c, send, recv, per, ZERO1_BF16, 0));
    float scale = zero1_avg_scale(c->size);
    d->ops->sum_slices(d->ctx, d->compute, shard, recv, ZERO1_BF16, c->size, per, 1.0f);
    d->ops->sum_slices(d->ctx, d->compute, shard + per, recv, ZERO1_BF16, c->size, per, scale);
    float* got = (float*)mallocCheck(2 * per * sizeof(float));
    download(d, d->compute, got, shard, 2 * per * sizeof(float));
    int wrong = 0;
    for (size_t i = 0; i < per; i++) {
        size_t k = (size_t)c->rank * per + i;  // this rank's element of the bucket
        float sum = bf16_to_float(float_to_bf16(grad_value(0, k)));
        for (int r = 1; r < c->size; r++) sum += bf16_to_float(float_to_bf16(grad_value(r, k)));
        float avg = sum * scale;
        wrong += memcmp(&got[i], &sum, 4) != 0;
        wrong += memcmp(&got[per + i], &avg, 4) != 0;
    }
    CHECK(wrong == 0, "%s: all-to-all + sum_slices on rank %d: %d of %zu fp32 sums differ from the rank-order sum",
          label, c->rank, wrong, 2 * per);
    free(got);
    free(bucket);
    void* all[] = {send, recv, shard};
    for (int i = 0; i < 3; i++) d->ops->free(d->ctx, all[i]);
}

// Every kind and dtype, finished by wait or by test; then several collectives in flight at
// once inside a group, finished in reverse order.
static void check_hazard(const Zero1Device* d, Zero1Comm* inner, const char* label) {
    inner->timeout_s = 7.5;
    inner->label = "across instances";
    Zero1Comm* c = zero1_comm_hazard_create(inner, d, 1234);
    char name[80];
    snprintf(name, sizeof(name), "hazard(%s)", inner->name);
    CHECK(strcmp(c->name, name) == 0 && c->rank == inner->rank && c->size == inner->size, "%s: name '%s' rank %d size %d",
          label, c->name, c->rank, c->size);
    CHECK(c->timeout_s == 7.5 && c->label == inner->label, "%s: the wrapper keeps the deadline (%.1f s) and the label",
          label, c->timeout_s);
    size_t n = (size_t)c->size * 24;
    int not_yet = 0, by_test = 0;
    for (int t = 0; t < 3; t++) {
        for (int k = 0; k < 3; k++) {
            for (int v = 0; v < 4; v++) {  // finished by wait or by test; sum or (not the gather) average
                int use_test = v & 1;
                Zero1ReduceOp op = v & 2 ? ZERO1_AVG : ZERO1_SUM;
                if (k == ALL_GATHER && op == ZERO1_AVG) continue;
                void* buf = make_input(d, c, (Kind)k, n, (Zero1Dtype)t);
                c->step = 10 * t + k;
                Zero1Handle h = issue(c, (Kind)k, buf, n, (Zero1Dtype)t, op, k);
                CHECK(inner->step == c->step, "%s: inner step %d, want %d", label, inner->step, c->step);
                check_in_flight_is_poisoned(d, buf, n * zero1_dtype_size((Zero1Dtype)t), label);
                if (use_test) {
                    not_yet += finish_by_test(c, h, label);
                    by_test++;
                } else {
                    zero1_comm_wait(c, h);
                }
                check_result(d, c, (Kind)k, buf, n, (Zero1Dtype)t, op, label);
                d->ops->free(d->ctx, buf);
            }
        }
    }
    for (int t = 0; t < 2; t++) {
        for (int use_test = 0; use_test < 2; use_test++) not_yet += check_all_to_all(d, c, (Zero1Dtype)t, use_test, label);
    }
    check_exchange_and_sum(d, c, label);
    CHECK(not_yet > 0, "%s: in %d collectives finished by test(), it never said \"not yet\"", label, by_test);

    enum { IN_FLIGHT = 3 };
    void* bufs[IN_FLIGHT];
    Zero1Handle handles[IN_FLIGHT];
    zero1_comm_group_begin(c);
    for (int i = 0; i < IN_FLIGHT; i++) {
        bufs[i] = make_input(d, c, (Kind)i, n * (i + 1), ZERO1_FP32);
        handles[i] = issue(c, (Kind)i, bufs[i], n * (i + 1), ZERO1_FP32, ZERO1_SUM, i);
    }
    CHECK(zero1_comm_test(c, handles[0]) == 0, "%s: test() completed a handle before its group ended", label);
    zero1_comm_group_end(c);
    for (int i = 0; i < IN_FLIGHT; i++) check_in_flight_is_poisoned(d, bufs[i], n * (i + 1) * 4, label);
    for (int i = IN_FLIGHT - 1; i >= 0; i--) {
        zero1_comm_wait(c, handles[i]);
        check_result(d, c, (Kind)i, bufs[i], n * (i + 1), ZERO1_FP32, ZERO1_SUM, label);
        d->ops->free(d->ctx, bufs[i]);
    }
    CHECK(zero1_comm_test(c, -1) == 1, "%s: handle -1 is not complete", label);
    zero1_comm_wait(c, -1);
    zero1_comm_destroy(c);
}

// ---- main ----

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--mpi") == 0) {
        int rank, world;
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        utils_set_rank(rank, world);
        tap_rank = rank;
        Zero1Device cpu = zero1_device_cpu();
        CHECK_GROUP(check_hazard(&cpu, zero1_comm_mpi_create(&cpu, -1), "hazard(mpi) on the CPU device"));
        Zero1Device deferred = zero1_device_deferred_create();
        CHECK_GROUP(check_hazard(&deferred, zero1_comm_mpi_create(&deferred, -1),
                                 "hazard(mpi, staged) on the deferred device"));
        zero1_device_deferred_destroy(&deferred);
        int local = failures, total = 0;
        MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        tap_ok(total == 0, "--mpi np=%d: every rank's checks (%d failed)", world, total);
        int rc = done_testing();
        MPI_Finalize();
        return rc;
    }
    if (argc > 1) fatal("usage: test_zero1_devices [--mpi]");
    Zero1Device d = zero1_device_deferred_create();
    CHECK(strcmp(d.ops->name, "deferred") == 0 && d.ops->host_addressable == 0, "deferred device: name '%s'", d.ops->name);
    CHECK_GROUP(check_host_cannot_dereference(&d));
    CHECK_GROUP(check_host_view(&d));
    CHECK_GROUP(check_stream_order(&d));
    CHECK_GROUP(check_late_execution(&d));
    CHECK_GROUP(check_sync_event(&d));
    CHECK_GROUP(check_to_host_before_sync(&d));
    CHECK_GROUP(check_free_and_destroy_with_queued_work());
    CHECK_GROUP(check_adamw(&d, ZERO1_FP32, 0, 0));
    CHECK_GROUP(check_adamw(&d, ZERO1_FP32, 1, 0));
    CHECK_GROUP(check_adamw(&d, ZERO1_BF16, 1, 0));
    CHECK_GROUP(check_adamw(&d, ZERO1_BF16, 1, 1));
    CHECK_GROUP(check_stochastic_rounding_unbiased());
    CHECK_GROUP(check_stochastic_rounding_specials());
    CHECK_GROUP(check_rounding_across_layouts(&d));
    CHECK_GROUP(check_reductions(&d));
    CHECK_GROUP(check_convert(&d));
    CHECK_GROUP(check_sum_slices(&d));
    CHECK_GROUP(check_dp_invariant_ops(&d));
    CHECK_GROUP(check_bad_input(&d));
    Zero1Device cpu = zero1_device_cpu();
    CHECK_GROUP(check_hazard(&cpu, zero1_comm_single_create(&cpu), "hazard(single) on the CPU device"));
    CHECK_GROUP(check_hazard(&d, zero1_comm_single_create(&d), "hazard(single) on the deferred device"));
    zero1_device_deferred_destroy(&d);
    return done_testing();
}
