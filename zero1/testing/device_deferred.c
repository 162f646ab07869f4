/*
 * zero1/testing/device_deferred.c: the deferred test device. It keeps device_ops.h's contract and
 * nothing more, so that a runtime which leans on anything else fails on the CPU, every
 * time, instead of one run in a thousand on a GPU:
 *  - Device memory is host memory behind pointers the host cannot dereference (a tag in
 *    the unused top bits makes them non-canonical): a host read or write of a device
 *    pointer faults at once. Every op checks that its ranges lie inside one live
 *    allocation of this device, then drops the tag.
 *  - A stream is a FIFO queue of ops, each a function with its arguments copied at
 *    enqueue. Ops run on the host thread as LATE as the rules allow: a stream runs when
 *    the host syncs it or an event on it, or when an op queued on another stream after a
 *    wait_event on it needs it. So a missing wait_event runs the consumer before the
 *    producer, deterministically.
 *  - to_host fills its host destination with 0xFF bytes (NaN in fp32, bf16 and fp64) at
 *    enqueue, so a host read before the covering sync sees NaN.
 *  - Arithmetic runs zero1_device_cpu_ops' functions, so results are bitwise the CPU
 *    device's. Span launches read the spans from their device copy (upload_spans), as a
 *    GPU kernel does; at enqueue that copy must equal the host array.
 * free and free_host run every queue first, as cudaFree and cudaFreeHost wait for the
 * device. Ops still queued at destroy are dropped unrun (their host memory may be gone).
 * A model that computes on the host (the CPU trainer) reaches the buffers through
 * zero1_device_deferred_host_view, only where it has synced the compute stream.
 */
#include <stdint.h>

#include "run/files.h"
#include "zero1/testing/test_doubles.h"

// Added to a host address to make a device pointer. Bit 62 makes it non-canonical on
// x86-64 (4- and 5-level paging); aarch64 ignores the top byte (TBI), so bit 55 is set
// too, which no user address has there. Interior pointers (base + offset) keep the tag.
#define DEVICE_TAG (((uintptr_t)1 << 62) | ((uintptr_t)1 << 55))

typedef struct Deferred Deferred;
typedef struct DeferredOp DeferredOp;

// One queued op: the function and its arguments, by value, with host (untagged) pointers.
struct DeferredOp {
    void (*run)(Deferred* d, const DeferredOp* op);
    union {
        struct { void* dst; const void* src; size_t bytes; } copy;  // copy, to_host, from_host
        struct { void* p; int byte; size_t bytes; } fill;
        struct { void* dst; Zero1Dtype dst_type; const void* src; Zero1Dtype src_type; size_t n; } convert;
        struct { float* dst; const void* src; Zero1Dtype src_type; int count; size_t n; float scale; } sum_slices;
        struct { float* dst; const float *a, *b; size_t n; } add;
        struct {
            Zero1SpanList spans;
            void* params;
            Zero1Dtype param_type;
            float *master, *m, *v;
            const float *grads, *grad_scale;
            AdamWStep step;
        } adamw;
        struct {
            Zero1SpanList spans;
            const Zero1MatrixShape* shapes;
            float *params, *master, *momentum;
            const float *grads, *grad_scale;
            Zero1MuonStep step;
        } muon;
        struct { Zero1SpanList spans; const float* grads; void* out; } span_reduce;  // sum_squares, nonfinite_flags
        struct { const double* sumsq; float max_norm; float* out; } norm;
        struct { float* grads; const float* rows; Zero1RowPlan plan; } add_rows;
        struct { int stream_id; size_t seq; } wait;  // an event's point, captured when queued
    } a;
};

// Ops [head, count) of `ops` are queued; op i has sequence number base_seq + i.
typedef struct {
    int id;        // > 0; events and queued waits name streams by id, so a stream can go first
    int running;   // its ops are being run (a wait op may re-enter, but never needs more)
    DeferredOp* ops;
    size_t head, count, cap, base_seq;
} DeferredStream;

// The point recorded last: stream `stream_id` has run its first `seq` ops. 0: never recorded.
typedef struct {
    int stream_id;
    size_t seq;
} DeferredEvent;

typedef struct {
    char* base;  // host address
    size_t bytes;
} Allocation;

struct Deferred {
    Allocation* allocs;
    int num_allocs, cap_allocs;
    DeferredStream** streams;
    int num_streams, cap_streams, next_stream_id;
    DeferredEvent** events;
    int num_events, cap_events;
};

// Grows an array of `size`-byte items to hold one more than *count.
static void* grow(void* items, int count, int* cap, size_t size) {
    if (count < *cap) return items;
    *cap = *cap ? 2 * *cap : 8;
    void* p = realloc(items, (size_t)*cap * size);
    if (!p) fatal("deferred device: out of memory");
    return p;
}

// ---- pointers ----

static int is_device_pointer(const void* p) { return ((uintptr_t)p & DEVICE_TAG) == DEVICE_TAG; }

// The host address of `bytes` bytes at device pointer p, which must lie in a live allocation.
static char* device_range(Deferred* d, const void* p, size_t bytes, const char* what) {
    if (!is_device_pointer(p)) fatal("deferred device: %s: %p is not a device pointer", what, p);
    char* h = (char*)((uintptr_t)p - DEVICE_TAG);
    for (int i = 0; i < d->num_allocs; i++) {
        const Allocation* a = &d->allocs[i];
        if (h >= a->base && h <= a->base + a->bytes && bytes <= (size_t)(a->base + a->bytes - h)) return h;
    }
    fatal("deferred device: %s: %zu bytes at %p are not inside one live allocation of this device", what, bytes, p);
}

static void* host_range(const void* p, const char* what) {
    if (is_device_pointer(p)) fatal("deferred device: %s: %p is a device pointer, not host memory", what, p);
    return (void*)p;
}

// ---- streams and events ----

static size_t queued_seq(const DeferredStream* s) { return s->base_seq + s->count; }
static size_t done_seq(const DeferredStream* s) { return s->base_seq + s->head; }

static DeferredStream* find_stream(Deferred* d, int id) {
    for (int i = 0; i < d->num_streams; i++) {
        if (d->streams[i]->id == id) return d->streams[i];
    }
    return NULL;  // never recorded, or its stream is gone (having run everything)
}

// Runs s's ops until its first `seq` have run.
static void run_until(Deferred* d, DeferredStream* s, size_t seq) {
    if (done_seq(s) >= seq) return;
    // Waits only name points queued before them, so a wait that re-enters a running
    // stream finds its point already run; getting here means the queue is corrupt.
    if (s->running) fatal("deferred device: circular wait between streams");
    s->running = 1;
    while (done_seq(s) < seq) {
        DeferredOp op = s->ops[s->head++];
        op.run(d, &op);
    }
    s->running = 0;
}

static void run_all(Deferred* d) {
    for (int i = 0; i < d->num_streams; i++) run_until(d, d->streams[i], queued_seq(d->streams[i]));
}

static void run_wait(Deferred* d, const DeferredOp* op) {
    DeferredStream* s = find_stream(d, op->a.wait.stream_id);
    if (s) run_until(d, s, op->a.wait.seq);
}

static DeferredStream* as_stream(Zero1Stream s) {
    if (!s) fatal("deferred device: NULL stream");
    return (DeferredStream*)s;
}

static void enqueue(Zero1Stream stream, const DeferredOp* op) {
    DeferredStream* s = as_stream(stream);
    if (s->head == s->count) {  // everything has run: start the array over
        s->base_seq += s->count;
        s->head = s->count = 0;
    }
    if (s->count == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ops = (DeferredOp*)realloc(s->ops, s->cap * sizeof(DeferredOp));
        if (!s->ops) fatal("deferred device: out of memory");
    }
    s->ops[s->count++] = *op;
}

static Zero1Stream deferred_stream_create(void* ctx) {
    Deferred* d = (Deferred*)ctx;
    DeferredStream* s = (DeferredStream*)callocCheck(1, sizeof(DeferredStream));
    s->id = ++d->next_stream_id;
    d->streams = (DeferredStream**)grow(d->streams, d->num_streams, &d->cap_streams, sizeof(DeferredStream*));
    d->streams[d->num_streams++] = s;
    return (Zero1Stream)s;
}

static void drop_stream(Deferred* d, int index) {
    free(d->streams[index]->ops);
    free(d->streams[index]);
    d->streams[index] = d->streams[--d->num_streams];
}

// Like cudaStreamDestroy, queued work still happens; here it happens now.
static void deferred_stream_destroy(void* ctx, Zero1Stream stream) {
    Deferred* d = (Deferred*)ctx;
    DeferredStream* s = as_stream(stream);
    run_until(d, s, queued_seq(s));
    for (int i = 0; i < d->num_streams; i++) {
        if (d->streams[i] == s) {
            drop_stream(d, i);
            return;
        }
    }
    fatal("deferred device: destroying a stream this device does not have");
}

static Zero1Event deferred_event_create(void* ctx) {
    Deferred* d = (Deferred*)ctx;
    DeferredEvent* e = (DeferredEvent*)callocCheck(1, sizeof(DeferredEvent));
    d->events = (DeferredEvent**)grow(d->events, d->num_events, &d->cap_events, sizeof(DeferredEvent*));
    d->events[d->num_events++] = e;
    return (Zero1Event)e;
}

static void deferred_event_destroy(void* ctx, Zero1Event event) {
    Deferred* d = (Deferred*)ctx;
    for (int i = 0; i < d->num_events; i++) {
        if (d->events[i] == (DeferredEvent*)event) {
            free(d->events[i]);
            d->events[i] = d->events[--d->num_events];
            return;
        }
    }
    fatal("deferred device: destroying an event this device does not have");
}

static DeferredEvent* as_event(Zero1Event e) {
    if (!e) fatal("deferred device: NULL event");
    return (DeferredEvent*)e;
}

static void deferred_record(void* ctx, Zero1Event event, Zero1Stream stream) {
    DeferredEvent* e = as_event(event);
    DeferredStream* s = as_stream(stream);
    e->stream_id = s->id;
    e->seq = queued_seq(s);
}

static void deferred_wait_event(void* ctx, Zero1Stream s, Zero1Event event) {
    DeferredOp op;
    op.run = run_wait;
    op.a.wait.stream_id = as_event(event)->stream_id;
    op.a.wait.seq = as_event(event)->seq;
    enqueue(s, &op);
}

static void deferred_sync_event(void* ctx, Zero1Event event) {
    Deferred* d = (Deferred*)ctx;
    DeferredStream* s = find_stream(d, as_event(event)->stream_id);
    if (s) run_until(d, s, as_event(event)->seq);
}

static int deferred_query_event(void* ctx, Zero1Event event) {
    DeferredStream* s = find_stream((Deferred*)ctx, as_event(event)->stream_id);
    return s == NULL || done_seq(s) >= as_event(event)->seq;
}

static void deferred_sync_stream(void* ctx, Zero1Stream stream) {
    DeferredStream* s = as_stream(stream);
    run_until((Deferred*)ctx, s, queued_seq(s));
}

// ---- memory ----

static void* deferred_alloc(void* ctx, size_t bytes) {
    Deferred* d = (Deferred*)ctx;
    char* h = (char*)callocCheck(bytes ? bytes : 1, 1);
    if (is_device_pointer(h)) fatal("deferred device: the host gave an address with the device tag bits set");
    d->allocs = (Allocation*)grow(d->allocs, d->num_allocs, &d->cap_allocs, sizeof(Allocation));
    d->allocs[d->num_allocs].base = h;
    d->allocs[d->num_allocs].bytes = bytes;
    d->num_allocs++;
    return (void*)((uintptr_t)h + DEVICE_TAG);
}

static void deferred_free(void* ctx, void* p) {
    Deferred* d = (Deferred*)ctx;
    if (!p) return;
    run_all(d);
    char* h = (char*)((uintptr_t)p - DEVICE_TAG);
    for (int i = 0; i < d->num_allocs; i++) {
        if (is_device_pointer(p) && d->allocs[i].base == h) {
            free(h);
            d->allocs[i] = d->allocs[--d->num_allocs];
            return;
        }
    }
    fatal("deferred device: free(%p): not the start of a live allocation of this device", p);
}

static void* deferred_alloc_host(void* ctx, size_t bytes) { return callocCheck(bytes ? bytes : 1, 1); }

static void deferred_free_host(void* ctx, void* p) {
    run_all((Deferred*)ctx);
    free(host_range(p, "free_host"));
}

// ---- data movement ----

static void run_copy(Deferred* d, const DeferredOp* op) { memmove(op->a.copy.dst, op->a.copy.src, op->a.copy.bytes); }
static void run_fill(Deferred* d, const DeferredOp* op) { memset(op->a.fill.p, op->a.fill.byte, op->a.fill.bytes); }

static void enqueue_copy(Zero1Stream s, void* dst, const void* src, size_t bytes) {
    DeferredOp op;
    op.run = run_copy;
    op.a.copy.dst = dst;
    op.a.copy.src = src;
    op.a.copy.bytes = bytes;
    enqueue(s, &op);
}

static void deferred_fill(void* ctx, Zero1Stream s, void* p, int byte, size_t bytes) {
    DeferredOp op;
    op.run = run_fill;
    op.a.fill.p = device_range((Deferred*)ctx, p, bytes, "fill");
    op.a.fill.byte = byte;
    op.a.fill.bytes = bytes;
    enqueue(s, &op);
}

static void deferred_copy(void* ctx, Zero1Stream s, void* dst, const void* src, size_t bytes) {
    Deferred* d = (Deferred*)ctx;
    enqueue_copy(s, device_range(d, dst, bytes, "copy destination"), device_range(d, src, bytes, "copy source"),
                 bytes);
}

static void deferred_to_host(void* ctx, Zero1Stream s, void* host_dst, const void* src, size_t bytes) {
    const char* from = device_range((Deferred*)ctx, src, bytes, "to_host source");
    void* to = host_range(host_dst, "to_host destination");
    if (bytes) memset(to, 0xFF, bytes);  // what the host sees until a sync covers the copy
    enqueue_copy(s, to, from, bytes);
}

static void deferred_from_host(void* ctx, Zero1Stream s, void* dst, const void* host_src, size_t bytes) {
    enqueue_copy(s, device_range((Deferred*)ctx, dst, bytes, "from_host destination"),
                 host_range(host_src, "from_host source"), bytes);
}

// ---- arithmetic: zero1_device_cpu_ops on host addresses, when the op runs ----

static void run_convert(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.convert(NULL, NULL, op->a.convert.dst, op->a.convert.dst_type, op->a.convert.src,
                                 op->a.convert.src_type, op->a.convert.n);
}

static void deferred_convert(void* ctx, Zero1Stream s, void* dst, Zero1Dtype dst_type, const void* src,
                             Zero1Dtype src_type, size_t n) {
    Deferred* d = (Deferred*)ctx;
    DeferredOp op;
    op.run = run_convert;
    op.a.convert.dst = device_range(d, dst, n * zero1_dtype_size(dst_type), "convert destination");
    op.a.convert.dst_type = dst_type;
    op.a.convert.src = device_range(d, src, n * zero1_dtype_size(src_type), "convert source");
    op.a.convert.src_type = src_type;
    op.a.convert.n = n;
    enqueue(s, &op);
}

static void run_sum_slices(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.sum_slices(NULL, NULL, op->a.sum_slices.dst, op->a.sum_slices.src, op->a.sum_slices.src_type,
                                    op->a.sum_slices.count, op->a.sum_slices.n, op->a.sum_slices.scale);
}

static void deferred_sum_slices(void* ctx, Zero1Stream s, float* dst, const void* src, Zero1Dtype src_type, int count,
                                size_t n, float scale) {
    Deferred* d = (Deferred*)ctx;
    DeferredOp op;
    op.run = run_sum_slices;
    op.a.sum_slices.dst = (float*)device_range(d, dst, n * sizeof(float), "sum_slices destination");
    op.a.sum_slices.src =
        device_range(d, src, (size_t)(count > 0 ? count : 0) * n * zero1_dtype_size(src_type), "sum_slices source");
    op.a.sum_slices.src_type = src_type;
    op.a.sum_slices.count = count;
    op.a.sum_slices.n = n;
    op.a.sum_slices.scale = scale;
    enqueue(s, &op);
}

static void* deferred_upload_spans(void* ctx, const Zero1Span* spans, int count) {
    size_t bytes = (size_t)count * sizeof(Zero1Span);
    void* p = deferred_alloc(ctx, bytes);
    if (bytes) memcpy(device_range((Deferred*)ctx, p, bytes, "upload_spans"), spans, bytes);
    return p;
}

// Where a launch's spans reach: ends in the param/grad buffers and in the owned arrays
// (elements), and one past the largest parameter index.
typedef struct {
    size_t buffer_end, owned_end;
    int params_end;
} SpanReach;

// The spans a launch will read: the device copy, checked against the host array (a GPU
// kernel reads the device copy, so a stale one would go wrong there), as a list whose
// `host` is that copy's host address. Also where the spans reach.
static Zero1SpanList launch_spans(Deferred* d, const Zero1SpanList* list, SpanReach* reach, const char* what) {
    Zero1SpanList out = *list;
    memset(reach, 0, sizeof(*reach));
    if (list->count == 0) {
        out.host = NULL;
        out.device = NULL;
        return out;
    }
    size_t bytes = (size_t)list->count * sizeof(Zero1Span);
    const Zero1Span* spans = (const Zero1Span*)device_range(d, list->device, bytes, what);
    if (memcmp(spans, list->host, bytes) != 0)
        fatal("deferred device: %s: the spans' device copy differs from their host array", what);
    size_t numel = 0;
    for (int i = 0; i < list->count; i++) {
        const Zero1Span* sp = &spans[i];
        numel += sp->n;
        if (sp->buffer + sp->n > reach->buffer_end) reach->buffer_end = sp->buffer + sp->n;
        if (sp->owned + sp->n > reach->owned_end) reach->owned_end = sp->owned + sp->n;
        if (sp->param + 1 > reach->params_end) reach->params_end = sp->param + 1;
    }
    if (numel != list->numel) fatal("deferred device: %s: numel %zu, but the spans hold %zu", what, list->numel, numel);
    out.host = spans;
    out.device = spans;
    return out;
}

static void run_adamw(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.adamw(NULL, NULL, &op->a.adamw.spans, op->a.adamw.params, op->a.adamw.param_type,
                               op->a.adamw.master, op->a.adamw.grads, op->a.adamw.m, op->a.adamw.v, &op->a.adamw.step,
                               op->a.adamw.grad_scale);
}

static void deferred_adamw(void* ctx, Zero1Stream s, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                           float* master, const float* grads, float* m, float* v, const AdamWStep* step,
                           const float* grad_scale) {
    Deferred* d = (Deferred*)ctx;
    SpanReach r;
    DeferredOp op;
    op.run = run_adamw;
    op.a.adamw.spans = launch_spans(d, spans, &r, "adamw spans");
    op.a.adamw.params = device_range(d, params, r.buffer_end * zero1_dtype_size(param_type), "adamw params");
    op.a.adamw.param_type = param_type;
    op.a.adamw.master = master ? (float*)device_range(d, master, r.owned_end * 4, "adamw master") : NULL;
    op.a.adamw.grads = (const float*)device_range(d, grads, r.buffer_end * 4, "adamw grads");
    op.a.adamw.m = (float*)device_range(d, m, r.owned_end * 4, "adamw m");
    op.a.adamw.v = (float*)device_range(d, v, r.owned_end * 4, "adamw v");
    op.a.adamw.step = *step;
    op.a.adamw.grad_scale = (const float*)device_range(d, grad_scale, sizeof(float), "adamw grad_scale");
    enqueue(s, &op);
}

static void run_muon(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.muon(NULL, NULL, &op->a.muon.spans, op->a.muon.shapes, op->a.muon.params, op->a.muon.master,
                              op->a.muon.grads, op->a.muon.momentum, &op->a.muon.step, op->a.muon.grad_scale);
}

static void deferred_muon(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                          float* params, float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                          const float* grad_scale) {
    Deferred* d = (Deferred*)ctx;
    if (zero1_device_cpu_ops.muon == NULL) fatal("deferred device: no Muon in this build (zero1/device_cpu_muon.c)");
    SpanReach r;
    DeferredOp op;
    op.run = run_muon;
    op.a.muon.spans = launch_spans(d, spans, &r, "muon spans");
    op.a.muon.shapes = shapes;  // host memory, by the op's contract
    op.a.muon.params = master ? NULL : (float*)device_range(d, params, r.buffer_end * 4, "muon params");
    op.a.muon.master = master ? (float*)device_range(d, master, r.owned_end * 4, "muon master") : NULL;
    op.a.muon.grads = (const float*)device_range(d, grads, r.buffer_end * 4, "muon grads");
    op.a.muon.momentum = (float*)device_range(d, momentum, r.owned_end * 4, "muon momentum");
    op.a.muon.step = *step;
    op.a.muon.grad_scale = (const float*)device_range(d, grad_scale, sizeof(float), "muon grad_scale");
    enqueue(s, &op);
}

// The adamw record without grads, m, v and grad_scale.
static void run_round_master(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.round_master(NULL, NULL, &op->a.adamw.spans, op->a.adamw.params, op->a.adamw.param_type,
                                      op->a.adamw.master, &op->a.adamw.step);
}

static void deferred_round_master(void* ctx, Zero1Stream s, const Zero1SpanList* spans, void* params,
                                  Zero1Dtype param_type, const float* master, const AdamWStep* step) {
    Deferred* d = (Deferred*)ctx;
    SpanReach r;
    DeferredOp op;
    memset(&op, 0, sizeof(op));
    op.run = run_round_master;
    op.a.adamw.spans = launch_spans(d, spans, &r, "round_master spans");
    op.a.adamw.params = device_range(d, params, r.buffer_end * zero1_dtype_size(param_type), "round_master params");
    op.a.adamw.param_type = param_type;
    op.a.adamw.master = (float*)device_range(d, master, r.owned_end * 4, "round_master master");
    op.a.adamw.step = *step;
    enqueue(s, &op);
}

static void run_sum_squares(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.sum_squares(NULL, NULL, &op->a.span_reduce.spans, op->a.span_reduce.grads,
                                     (double*)op->a.span_reduce.out);
}

static void run_nonfinite_flags(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.nonfinite_flags(NULL, NULL, &op->a.span_reduce.spans, op->a.span_reduce.grads,
                                         (float*)op->a.span_reduce.out);
}

// sum_squares and nonfinite_flags: spans over grads, into `out`, one out_size item (or one
// per parameter the spans name).
static void enqueue_span_reduce(Deferred* d, Zero1Stream s, void (*run)(Deferred*, const DeferredOp*),
                                const Zero1SpanList* spans, const float* grads, void* out, int per_param,
                                size_t out_size, const char* what) {
    SpanReach r;
    DeferredOp op;
    op.run = run;
    op.a.span_reduce.spans = launch_spans(d, spans, &r, what);
    op.a.span_reduce.grads = (const float*)device_range(d, grads, r.buffer_end * 4, what);
    op.a.span_reduce.out = device_range(d, out, (per_param ? (size_t)r.params_end : 1) * out_size, what);
    enqueue(s, &op);
}

static void deferred_sum_squares(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads,
                                 double* acc) {
    enqueue_span_reduce((Deferred*)ctx, s, run_sum_squares, spans, grads, acc, 0, sizeof(double), "sum_squares");
}

static void deferred_nonfinite_flags(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads,
                                     float* flags) {
    enqueue_span_reduce((Deferred*)ctx, s, run_nonfinite_flags, spans, grads, flags, 1, sizeof(float),
                        "nonfinite_flags");
}

// The plan's arrays are read from their device copies when the op runs (as a kernel
// would), and every entry is checked against the bounds the caller gave.
static void run_add_rows(Deferred* d, const DeferredOp* op) {
    const Zero1RowPlan* p = &op->a.add_rows.plan;
    for (int e = 0; e < p->count; e++) {
        const Zero1RowAdd* a = &p->adds[e];
        if (a->dst + a->len > p->grads_n || a->skip + a->len > (int)p->width || a->first + a->count > p->num_sources)
            fatal("deferred device: add_rows entry %d reaches outside its buffers", e);
        for (int j = 0; j < a->count; j++) {
            if ((size_t)(p->sources[a->first + j] + 1) * p->width > p->rows_n)
                fatal("deferred device: add_rows entry %d reads a row outside the rows buffer", e);
        }
    }
    zero1_device_cpu_ops.add_rows(NULL, NULL, op->a.add_rows.grads, op->a.add_rows.rows, p);
}

static void deferred_add_rows(void* ctx, Zero1Stream s, float* grads, const float* rows, const Zero1RowPlan* plan) {
    Deferred* d = (Deferred*)ctx;
    DeferredOp op;
    op.run = run_add_rows;
    op.a.add_rows.grads = (float*)device_range(d, grads, plan->grads_n * 4, "add_rows grads");
    op.a.add_rows.rows = (const float*)device_range(d, rows, plan->rows_n * 4, "add_rows rows");
    op.a.add_rows.plan = *plan;
    op.a.add_rows.plan.adds = (const Zero1RowAdd*)device_range(d, plan->adds, (size_t)plan->count * sizeof(Zero1RowAdd),
                                                               "add_rows entries");
    op.a.add_rows.plan.sources = (const int*)device_range(d, plan->sources, (size_t)plan->num_sources * sizeof(int),
                                                          "add_rows sources");
    enqueue(s, &op);
}

static void run_norm_and_clip(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.norm_and_clip(NULL, NULL, op->a.norm.sumsq, op->a.norm.max_norm, op->a.norm.out);
}

// norm_and_clip and norm_and_clip_exact: `words` doubles of sums into the norm and clip factor.
static void enqueue_norm(Deferred* d, Zero1Stream s, void (*run)(Deferred*, const DeferredOp*), const double* sumsq,
                         size_t words, float max_norm, float* out, const char* what) {
    DeferredOp op;
    op.run = run;
    op.a.norm.sumsq = (const double*)device_range(d, sumsq, words * sizeof(double), what);
    op.a.norm.max_norm = max_norm;
    op.a.norm.out = (float*)device_range(d, out, 2 * sizeof(float), what);
    enqueue(s, &op);
}

static void deferred_norm_and_clip(void* ctx, Zero1Stream s, const double* sumsq, float max_norm, float* out) {
    enqueue_norm((Deferred*)ctx, s, run_norm_and_clip, sumsq, 1, max_norm, out, "norm_and_clip");
}

// --dp-invariant's ops: zero1_device_cpu_ops' functions as well.
static void run_add(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.add(NULL, NULL, op->a.add.dst, op->a.add.a, op->a.add.b, op->a.add.n);
}

static void deferred_add(void* ctx, Zero1Stream s, float* dst, const float* a, const float* b, size_t n) {
    Deferred* d = (Deferred*)ctx;
    DeferredOp op;
    op.run = run_add;
    op.a.add.dst = (float*)device_range(d, dst, n * sizeof(float), "add destination");
    op.a.add.a = (const float*)device_range(d, a, n * sizeof(float), "add a");
    op.a.add.b = (const float*)device_range(d, b, n * sizeof(float), "add b");
    op.a.add.n = n;
    enqueue(s, &op);
}

static void run_sum_slices_pairwise(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.sum_slices_pairwise(NULL, NULL, op->a.sum_slices.dst, (const float*)op->a.sum_slices.src,
                                             op->a.sum_slices.count, op->a.sum_slices.n);
}

static void deferred_sum_slices_pairwise(void* ctx, Zero1Stream s, float* dst, const float* src, int count, size_t n) {
    Deferred* d = (Deferred*)ctx;
    DeferredOp op;
    memset(&op, 0, sizeof(op));
    op.run = run_sum_slices_pairwise;
    op.a.sum_slices.dst = (float*)device_range(d, dst, n * sizeof(float), "sum_slices_pairwise destination");
    op.a.sum_slices.src = device_range(d, src, (size_t)(count > 0 ? count : 0) * n * sizeof(float),
                                       "sum_slices_pairwise source");
    op.a.sum_slices.count = count;
    op.a.sum_slices.n = n;
    enqueue(s, &op);
}

static void run_sum_squares_exact(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.sum_squares_exact(NULL, NULL, &op->a.span_reduce.spans, op->a.span_reduce.grads,
                                           (double*)op->a.span_reduce.out);
}

static void deferred_sum_squares_exact(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads,
                                       double* words) {
    enqueue_span_reduce((Deferred*)ctx, s, run_sum_squares_exact, spans, grads, words, 0,
                        ZERO1_EXACT_WORDS * sizeof(double), "sum_squares_exact");
}

static void run_norm_and_clip_exact(Deferred* d, const DeferredOp* op) {
    zero1_device_cpu_ops.norm_and_clip_exact(NULL, NULL, op->a.norm.sumsq, op->a.norm.max_norm, op->a.norm.out);
}

static void deferred_norm_and_clip_exact(void* ctx, Zero1Stream s, const double* words, float max_norm, float* out) {
    enqueue_norm((Deferred*)ctx, s, run_norm_and_clip_exact, words, ZERO1_EXACT_WORDS, max_norm, out,
                 "norm_and_clip_exact");
}

const Zero1DeviceOps zero1_device_deferred_ops = {
    "deferred", 0,
    deferred_alloc, deferred_free, deferred_alloc_host, deferred_free_host,
    deferred_stream_create, deferred_stream_destroy, deferred_event_create, deferred_event_destroy,
    deferred_record, deferred_wait_event, deferred_sync_event, deferred_query_event, deferred_sync_stream,
    deferred_fill, deferred_copy, deferred_to_host, deferred_from_host,
    deferred_convert, deferred_sum_slices, deferred_upload_spans, deferred_adamw, deferred_round_master,
    deferred_sum_squares,
    deferred_nonfinite_flags, deferred_add_rows, deferred_norm_and_clip,
    NULL, NULL,  // no clock of its own: traces use the host's
    deferred_add, deferred_sum_slices_pairwise, deferred_sum_squares_exact, deferred_norm_and_clip_exact,
    deferred_muon,
};

// For a model that computes on the host (the CPU trainer) and so stands for the compute
// stream's own work: it may touch device memory only where the compute stream is synced,
// and the caller guarantees that (it syncs before each block). Everything else keeps
// going through the ops.
void* zero1_device_deferred_host_view(const Zero1Device* dev, const void* p, size_t bytes) {
    return device_range((Deferred*)dev->ctx, p, bytes, "host view");
}

Zero1Device zero1_device_deferred_create(void) {
    if (sizeof(void*) != 8) fatal("deferred device: needs 64-bit pointers");
    Deferred* d = (Deferred*)callocCheck(1, sizeof(Deferred));
    Zero1Device dev = {&zero1_device_deferred_ops, d, deferred_stream_create(d)};
    return dev;
}

void zero1_device_deferred_destroy(Zero1Device* dev) {
    Deferred* d = (Deferred*)dev->ctx;
    if (!d) return;
    while (d->num_streams > 0) drop_stream(d, d->num_streams - 1);  // queued ops are dropped unrun
    for (int i = 0; i < d->num_events; i++) free(d->events[i]);
    for (int i = 0; i < d->num_allocs; i++) free(d->allocs[i].base);
    free(d->streams);
    free(d->events);
    free(d->allocs);
    free(d);
    memset(dev, 0, sizeof(*dev));
}
