/*
 * zero1/device_ops.h: the device that holds the runtime's buffers, as the runtime sees it.
 *
 * The contract is the GPU's, and every backend keeps it, so the runtime written against
 * it is correct on any of them:
 *  - Work is queued on a stream and runs in queue order. Work on two streams is unordered
 *    unless an event orders it: record(e, s1) then wait_event(s2, e) makes what is queued
 *    on s2 afterwards run after what was queued on s1 before the record.
 *  - The host may read what the device wrote (to_host into host memory) only after a
 *    sync that covers it: sync_stream, or sync_event on an event recorded after it.
 *  - Source and destination ranges of copy and convert do not overlap.
 *  - Device pointers may not be host-addressable (host_addressable == 0): then only these
 *    ops touch device memory. Pointer arithmetic on device pointers (base + offset) is fine.
 *  - Arithmetic ops read every scalar they need that the device computed (the clip factor)
 *    from device memory, so nothing in a step needs the host to wait for the device.
 *
 * Backends: zero1_device_cpu (host memory; every op runs at once on the calling thread),
 * the CUDA backend (zero1/device_cuda.h: kernels on CUDA streams), and for tests the
 * deferred device (zero1/testing/test_doubles.h: host memory behind pointers the host
 * cannot dereference, every op run as late as the ordering rules allow, so a missing event
 * or an early host read gives a wrong result on the CPU instead of a race on a GPU).
 */
#ifndef ZERO1_DEVICE_OPS_H
#define ZERO1_DEVICE_OPS_H

#include <stddef.h>

#include "llmc/adamw.h"
#include "llmc/bf16.h"
#include "llmc/muon.h"
#include "zero1/exact_sum.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZERO1_FP32 = 0, ZERO1_BF16 = 1, ZERO1_FP64 = 2 } Zero1Dtype;

static inline size_t zero1_dtype_size(Zero1Dtype t) { return t == ZERO1_FP64 ? 8 : t == ZERO1_FP32 ? 4 : 2; }

// sum_slices' arithmetic, one formula for every device: element i of `count` slices of n
// elements (fp32 or bf16) summed in fp32 in slice order, slice 0 first (the first term
// is taken as it is, so a lone -0.0 stays -0.0), then multiplied by scale once (scale 1:
// exactly the sum).
LLMC_HOST_DEVICE static inline float zero1_sum_slices_element(const void* src, Zero1Dtype src_type, int count,
                                                              size_t n, size_t i, float scale) {
    float acc = 0.0f;
    for (int r = 0; r < count; r++) {
        size_t k = (size_t)r * n + i;
        float x = src_type == ZERO1_BF16 ? bf16_to_float(((const uint16_t*)src)[k]) : ((const float*)src)[k];
        acc = r == 0 ? x : acc + x;
    }
    return acc * scale;
}

// norm_and_clip's arithmetic: the norm in double rounded to float once, and the clip factor
// (max_norm / norm where clipping bites, else 1) into out[0..1].
LLMC_HOST_DEVICE static inline void zero1_norm_and_clip_of(double sumsq, float max_norm, float* out) {
    float norm = (float)sqrt(sumsq);
    out[0] = norm;
    out[1] = (max_norm > 0.0f && norm > max_norm) ? max_norm / norm : 1.0f;
}

// A parameter's shape for the muon op (rows 0: not one of Muon's matrices); qkv: a fused
// [Q; K; V] that --muon-split-qkv orthogonalizes by thirds.
typedef struct {
    int rows, cols, qkv;
} Zero1MatrixShape;

// One Muon step (llmc/muon.h): the step's learning rate, the weight decay and the settings;
// ns_bf16: Newton-Schulz's GEMMs in bf16 with fp32 accumulation (--muon-ns-bf16, GPU only).
typedef struct {
    float lr, weight_decay;
    MuonConfig config;
    int ns_bf16;
} Zero1MuonStep;

typedef struct Zero1StreamImpl* Zero1Stream;  // cudaStream_t on the GPU
typedef struct Zero1EventImpl* Zero1Event;    // cudaEvent_t on the GPU

// A contiguous run of one parameter inside this rank's work (an owned view, or a whole
// parameter of a bucket): where it sits in the param/grad buffers and in the owned arrays
// (fp32 master, m, v), its length, the parameter it belongs to, and where it starts in
// model space (the parameters back to back in definition order, no padding): the index
// that the stochastic rounding's bits are counted by, the same for any DP or bucket size.
typedef struct {
    size_t buffer;   // start in the param and grad buffers (elements)
    size_t owned;    // start in the owned arrays (elements); unused where no owned array is read
    size_t n;
    int param;       // definition index
    int decays;      // weight decay applies
    size_t model;    // model-space index of the first element
} Zero1Span;

// Spans for one launch: the host array and the device's copy of it (upload_spans).
typedef struct {
    int count;
    size_t numel;            // sum of the spans' n
    const Zero1Span* host;
    const void* device;      // NULL when count == 0
} Zero1SpanList;

// Sparse rows added into the grads (the split embedding, zero1/runtime.h): one entry
// per destination row, CSR over `sources` (row indices into the received rows).
typedef struct {
    size_t dst;      // first grads element this entry adds to
    int skip;        // ... which is element `skip` of each source row
    int len;         // elements added (a row cut by the end of a shard adds part of itself)
    int first;       // sources[first, first + count): the rows summed, in this order
    int count;
} Zero1RowAdd;

// One add_rows launch. adds and sources are device memory (uploaded by the caller);
// grads_n and rows_n bound what the launch may touch (elements), for checking.
typedef struct {
    int count, num_sources;
    size_t width;              // elements per source row
    const Zero1RowAdd* adds;
    const int* sources;
    size_t grads_n, rows_n;
    float scale;               // each element's sum of rows is multiplied by it (1/DP when averaging)
} Zero1RowPlan;

typedef struct {
    const char* name;        // "cpu", "deferred", "cuda"
    int host_addressable;    // 1: device pointers are host pointers (MPI may use them directly)

    // Memory. Synchronous with the host; alloc zero-fills. alloc_host gives host memory
    // the device copies from and to quickly (page-locked on a GPU).
    void* (*alloc)(void* ctx, size_t bytes);
    void (*free)(void* ctx, void* p);
    void* (*alloc_host)(void* ctx, size_t bytes);
    void (*free_host)(void* ctx, void* p);

    // Streams and events.
    Zero1Stream (*stream_create)(void* ctx);
    void (*stream_destroy)(void* ctx, Zero1Stream s);
    Zero1Event (*event_create)(void* ctx);
    void (*event_destroy)(void* ctx, Zero1Event e);
    void (*record)(void* ctx, Zero1Event e, Zero1Stream s);      // e: s has run what was queued so far
    void (*wait_event)(void* ctx, Zero1Stream s, Zero1Event e);  // what s runs next waits for e
    void (*sync_event)(void* ctx, Zero1Event e);                 // the host waits for e
    int (*query_event)(void* ctx, Zero1Event e);                 // 1 if e has completed; never waits
    void (*sync_stream)(void* ctx, Zero1Stream s);               // the host waits for all of s

    // Data movement, queued on a stream.
    void (*fill)(void* ctx, Zero1Stream s, void* p, int byte, size_t bytes);
    void (*copy)(void* ctx, Zero1Stream s, void* dst, const void* src, size_t bytes);  // device to device
    void (*to_host)(void* ctx, Zero1Stream s, void* host_dst, const void* src, size_t bytes);
    void (*from_host)(void* ctx, Zero1Stream s, void* dst, const void* host_src, size_t bytes);

    // Arithmetic, queued on a stream.
    // dst[i] = src[i] for n elements, converting between fp32 and bf16 (round to nearest even).
    void (*convert)(void* ctx, Zero1Stream s, void* dst, Zero1Dtype dst_type, const void* src, Zero1Dtype src_type,
                    size_t n);
    // dst[i] = zero1_sum_slices_element(src, src_type, count, n, i, scale) for i < n: the
    // fp32 sum of the count slices src[r*n, (r+1)*n) in slice order, scaled once. dst does
    // not overlap src. (The fp32 accumulation of an all_to_all's received slices.)
    void (*sum_slices)(void* ctx, Zero1Stream s, float* dst, const void* src, Zero1Dtype src_type, int count,
                       size_t n, float scale);
    // A device copy of spans for the launches below (synchronous); release with free().
    void* (*upload_spans)(void* ctx, const Zero1Span* spans, int count);
    // AdamW over every span in one launch, with llmc/adamw.h's adamw_element. The clip
    // factor is read from grad_scale[0] (device memory); s->grad_scale is ignored.
    // master NULL: fp32 params are the master (updated in place at span.buffer); otherwise
    // master/m/v are addressed at span.owned and params[span.buffer] receives the new
    // master rounded to param_type (bf16: adamw_round_bf16 with element span.model + j,
    // so step->stochastic picks round-to-nearest or stochastic rounding).
    void (*adamw)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                  float* master, const float* grads, float* m, float* v, const AdamWStep* step,
                  const float* grad_scale);
    // The adamw op's write-back alone: params[span.buffer + j] = master[span.owned + j]
    // rounded to param_type exactly as adamw rounds it with this step (a resume rebuilds
    // the params a run stored after step->step).
    void (*round_master)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                         const float* master, const AdamWStep* step);
    // acc[0] += sum over the spans of grads[i]^2, in double. Deterministic: the same
    // inputs give the same bits (fixed summation order). A span list may carry scratch
    // for this: one list is not summed on two streams at once.
    void (*sum_squares)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads, double* acc);
    // flags[span.param] = 1 for every span holding a non-finite grad; other flags untouched.
    void (*nonfinite_flags)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads, float* flags);
    // For every entry a: grads[a.dst + i] += sum over j in order of rows[sources[a.first + j]
    // * width + a.skip + i], for i < a.len: the sum in fp32 first, then one add.
    // Deterministic (a fixed order, no atomics); entries touch disjoint grads.
    void (*add_rows)(void* ctx, Zero1Stream s, float* grads, const float* rows, const Zero1RowPlan* plan);
    // out[0] = sqrt(sumsq[0]); out[1] = max_norm / out[0] if max_norm > 0 and out[0] > max_norm, else 1.
    void (*norm_and_clip)(void* ctx, Zero1Stream s, const double* sumsq, float max_norm, float* out);

    // Device time, for traces of work that runs later than the host queues it. NULL where
    // the device has no clock of its own (the CPU devices: host times are exact there).
    Zero1Event (*event_create_timed)(void* ctx);
    float (*elapsed_ms)(void* ctx, Zero1Event from, Zero1Event to);  // both recorded and completed

    // --dp-invariant's arithmetic (zero1/exact_sum.h), the same bits on every device.
    // dst[i] = a[i] + b[i] for i < n (fp32; dst may be a or b).
    void (*add)(void* ctx, Zero1Stream s, float* dst, const float* a, const float* b, size_t n);
    // dst[i] = zero1_pairwise_slices_element(src, count, n, i) for i < n: the pairwise tree
    // of count (a power of two, at most 2^31) fp32 slices. dst does not overlap src.
    void (*sum_slices_pairwise)(void* ctx, Zero1Stream s, float* dst, const float* src, int count, size_t n);
    // words (ZERO1_EXACT_WORDS doubles, normalized limbs) += the exact sum over the spans of
    // grads[i]^2 (zero1_exact_add_square), normalized again. Like sum_squares, a span list
    // may carry scratch for it.
    void (*sum_squares_exact)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const float* grads,
                              double* words);
    // norm_and_clip of the sum the words hold (zero1_exact_value).
    void (*norm_and_clip_exact)(void* ctx, Zero1Stream s, const double* words, float max_norm, float* out);
    // Muon over spans that each hold one whole matrix of shape shapes[span.param] (a host array
    // that outlives the op): master at span.owned, or with master NULL the fp32 params at
    // span.buffer, updated in place; the momentum at span.owned; the clip factor from
    // grad_scale[0]. bf16 params get the new master from round_master. NULL: no Muon here.
    void (*muon)(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const Zero1MatrixShape* shapes, float* params,
                 float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                 const float* grad_scale);
} Zero1DeviceOps;

// A device as the runtime and the communicators use it: the ops, their context, and the
// compute stream (the model's kernels and the optimizer's run there).
typedef struct {
    const Zero1DeviceOps* ops;
    void* ctx;
    Zero1Stream compute;
} Zero1Device;

extern const Zero1DeviceOps zero1_device_cpu_ops;
// Its muon op, in zero1/device_cpu_muon.c (OpenBLAS): a weak symbol, so the ops table holds NULL
// in the builds that do not link that file (the GPU trainer's, whose zero1/ device is CUDA's).
void zero1_device_cpu_muon(void* ctx, Zero1Stream s, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                           float* params, float* master, const float* grads, float* momentum,
                           const Zero1MuonStep* step, const float* grad_scale) __attribute__((weak));

// The CPU device: host memory, ops run at once (streams and events are trivially complete).
Zero1Device zero1_device_cpu(void);

#ifdef __cplusplus
}
#endif
#endif
