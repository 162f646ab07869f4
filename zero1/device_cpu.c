/*
 * zero1/device_cpu.c: the device for host memory (the CPU trainer). Every op runs at once
 * on the calling thread, so streams and events are trivially complete; the arithmetic is
 * the reference the other backends are compared with (zero1/testing/device_deferred.c calls it).
 * Errors end the program (fatal).
 */
#include <math.h>
#include <stdint.h>

#include "llmc/bf16.h"
#include "run/files.h"
#include "zero1/device_ops.h"

// Streams and events carry no state here; any non-NULL token will do.
static char cpu_token;

static void* cpu_alloc(void* ctx, size_t bytes) { return callocCheck(bytes, 1); }
static void cpu_free(void* ctx, void* p) { free(p); }
static Zero1Stream cpu_stream_create(void* ctx) { return (Zero1Stream)&cpu_token; }
static void cpu_stream_destroy(void* ctx, Zero1Stream s) {}
static Zero1Event cpu_event_create(void* ctx) { return (Zero1Event)&cpu_token; }
static void cpu_event_destroy(void* ctx, Zero1Event e) {}
static void cpu_record(void* ctx, Zero1Event e, Zero1Stream s) {}
static void cpu_wait_event(void* ctx, Zero1Stream s, Zero1Event e) {}
static void cpu_sync_event(void* ctx, Zero1Event e) {}
static int cpu_query_event(void* ctx, Zero1Event e) { return 1; }
static void cpu_sync_stream(void* ctx, Zero1Stream s) {}

static void cpu_fill(void* ctx, Zero1Stream s, void* p, int byte, size_t bytes) { memset(p, byte, bytes); }
static void cpu_copy(void* ctx, Zero1Stream s, void* dst, const void* src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_convert(void* ctx, Zero1Stream st, void* dst, Zero1Dtype dst_type, const void* src,
                        Zero1Dtype src_type, size_t n) {
    if (dst_type == src_type) {
        cpu_copy(ctx, st, dst, src, n * zero1_dtype_size(dst_type));
    } else if (dst_type == ZERO1_BF16 && src_type == ZERO1_FP32) {
        uint16_t* d = (uint16_t*)dst;
        const float* s = (const float*)src;
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) d[i] = float_to_bf16(s[i]);
    } else if (dst_type == ZERO1_FP32 && src_type == ZERO1_BF16) {
        float* d = (float*)dst;
        const uint16_t* s = (const uint16_t*)src;
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) d[i] = bf16_to_float(s[i]);
    } else {
        fatal("zero1: unsupported conversion %d -> %d", (int)src_type, (int)dst_type);
    }
}

static void cpu_sum_slices(void* ctx, Zero1Stream st, float* dst, const void* src, Zero1Dtype src_type, int count,
                           size_t n, float scale) {
    if (src_type != ZERO1_FP32 && src_type != ZERO1_BF16) fatal("zero1: sum_slices of dtype %d", (int)src_type);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) dst[i] = zero1_sum_slices_element(src, src_type, count, n, i, scale);
}

static void* cpu_upload_spans(void* ctx, const Zero1Span* spans, int count) {
    void* p = mallocCheck((size_t)count * sizeof(Zero1Span));
    if (count) memcpy(p, spans, (size_t)count * sizeof(Zero1Span));
    return p;
}

// The write-back of one span: its master rounded into the params (adamw_round_bf16).
static void round_span(void* params, Zero1Dtype param_type, const float* master, const Zero1Span* sp,
                       const AdamWStep* s) {
    if (param_type == ZERO1_FP32) {
        memcpy((float*)params + sp->buffer, master, sp->n * sizeof(float));
        return;
    }
    if (param_type != ZERO1_BF16) fatal("zero1: params of dtype %d", (int)param_type);
    uint16_t* p = (uint16_t*)params + sp->buffer;
#pragma omp parallel for
    for (size_t j = 0; j < sp->n; j++) p[j] = adamw_round_bf16(master[j], s, sp->model + j);
}

static void cpu_round_master(void* ctx, Zero1Stream st, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                             const float* master, const AdamWStep* step) {
    for (int i = 0; i < spans->count; i++) {
        round_span(params, param_type, master + spans->host[i].owned, &spans->host[i], step);
    }
}

static void cpu_adamw(void* ctx, Zero1Stream st, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                      float* master, const float* grads, float* m, float* v, const AdamWStep* step,
                      const float* grad_scale) {
    AdamWStep s = *step;
    s.grad_scale = grad_scale[0];
    if (master == NULL && param_type != ZERO1_FP32) fatal("zero1: bf16 params need an fp32 master");
    for (int i = 0; i < spans->count; i++) {
        const Zero1Span* sp = &spans->host[i];
        float* p = master ? master + sp->owned : (float*)params + sp->buffer;
        adamw_update_range(p, grads + sp->buffer, m + sp->owned, v + sp->owned, sp->n, &s, sp->decays);
        if (master) round_span(params, param_type, p, sp, &s);
    }
}

// Sequential on purpose: a fixed summation order makes the sum the same bits for any
// thread count, which the bitwise comparisons between runs rely on.
static void cpu_sum_squares(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads, double* acc) {
    double total = 0.0;
    for (int i = 0; i < spans->count; i++) {
        const float* g = grads + spans->host[i].buffer;
        for (size_t j = 0; j < spans->host[i].n; j++) total += (double)g[j] * g[j];
    }
    acc[0] += total;
}

static void cpu_nonfinite_flags(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads,
                                float* flags) {
    for (int i = 0; i < spans->count; i++) {
        const float* g = grads + spans->host[i].buffer;
        for (size_t j = 0; j < spans->host[i].n; j++) {
            if (!isfinite(g[j])) {
                flags[spans->host[i].param] = 1.0f;
                break;
            }
        }
    }
}

// One entry per destination row; each element sums its source rows in plan order.
static void cpu_add_rows(void* ctx, Zero1Stream st, float* grads, const float* rows, const Zero1RowPlan* plan) {
    for (int e = 0; e < plan->count; e++) {
        const Zero1RowAdd* a = &plan->adds[e];
        const int* src = plan->sources + a->first;
        for (int i = 0; i < a->len; i++) {
            float sum = 0.0f;
            for (int j = 0; j < a->count; j++) sum += rows[(size_t)src[j] * plan->width + a->skip + i];
            grads[a->dst + i] += sum * plan->scale;
        }
    }
}

static void cpu_norm_and_clip(void* ctx, Zero1Stream st, const double* sumsq, float max_norm, float* out) {
    zero1_norm_and_clip_of(sumsq[0], max_norm, out);
}

static void cpu_add(void* ctx, Zero1Stream st, float* dst, const float* a, const float* b, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

static void cpu_sum_slices_pairwise(void* ctx, Zero1Stream st, float* dst, const float* src, int count, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) dst[i] = zero1_pairwise_slices_element(src, count, n, i);
}

// Each thread sums its share into limbs of its own; the limbs are integers, so how the
// elements fall to threads cannot change the result.
static void cpu_sum_squares_exact(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads,
                                  double* words) {
    long long total[ZERO1_EXACT_WORDS] = {0};
#pragma omp parallel
    {
        long long mine[ZERO1_EXACT_WORDS] = {0};
        size_t since_carry = 0;
        for (int i = 0; i < spans->count; i++) {
            const float* g = grads + spans->host[i].buffer;
#pragma omp for schedule(static) nowait
            for (size_t j = 0; j < spans->host[i].n; j++) {
                zero1_exact_add_square(g[j], mine);
                if (++since_carry == ZERO1_EXACT_BATCH) {
                    zero1_exact_normalize(mine);
                    since_carry = 0;
                }
            }
        }
        zero1_exact_normalize(mine);
#pragma omp critical
        for (int w = 0; w < ZERO1_EXACT_WORDS; w++) total[w] += mine[w];
    }
    zero1_exact_merge(words, total);
}

static void cpu_norm_and_clip_exact(void* ctx, Zero1Stream st, const double* words, float max_norm, float* out) {
    zero1_norm_and_clip_of(zero1_exact_value(words), max_norm, out);
}

const Zero1DeviceOps zero1_device_cpu_ops = {
    "cpu", 1,
    cpu_alloc, cpu_free, cpu_alloc, cpu_free,
    cpu_stream_create, cpu_stream_destroy, cpu_event_create, cpu_event_destroy,
    cpu_record, cpu_wait_event, cpu_sync_event, cpu_query_event, cpu_sync_stream,
    cpu_fill, cpu_copy, cpu_copy, cpu_copy,
    cpu_convert, cpu_sum_slices, cpu_upload_spans, cpu_adamw, cpu_round_master, cpu_sum_squares, cpu_nonfinite_flags, cpu_add_rows,
    cpu_norm_and_clip,
    NULL, NULL,  // no clock of its own: traces use the host's
    cpu_add, cpu_sum_slices_pairwise, cpu_sum_squares_exact, cpu_norm_and_clip_exact,
    zero1_device_cpu_muon,  // weak: NULL unless zero1/device_cpu_muon.c is linked in
};

Zero1Device zero1_device_cpu(void) {
    Zero1Device d = {&zero1_device_cpu_ops, NULL, (Zero1Stream)&cpu_token};
    return d;
}
