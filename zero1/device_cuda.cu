/*
 * zero1/device_cuda.cu: the device table for GPU memory (see zero1/device_cuda.h).
 *
 * Span launches. A span list is the concatenation of its spans: position p of the list
 * is element p - prefix[s] of span s, where prefix holds the spans' exclusive prefix
 * sums (upload_spans stores them on the device next to the spans). Each block of a
 * launch takes a contiguous chunk of positions, finds the span of its first position by
 * a binary search of the prefix sums and walks on through the spans; the threads of a
 * block take consecutive positions, so reads and writes within a span are coalesced.
 * One launch covers every span however many there are, empty ones included.
 *
 * Exactness: AdamW (llmc/adamw.h's adamw_element), the bf16 rounding and the norm
 * must give zero1/device_cpu.c's bits, so the Makefile compiles this file without
 * --use_fast_math (approximate division and sqrt, flushed denormals) and with
 * -fmad=false (the CPU build, ISO C, does not fuse multiply-adds either).
 * Errors (CUDA's, bad arguments) end the program (fatal).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "llmc/adamw.h"
#include "llmc/bf16.h"
#include "llmc/cuda_common.cuh"
#include "run/nccl_comm.h"
#include "zero1/device_cuda.h"
#include "zero1/device_cuda_muon.h"

// sum_squares: a fixed grid, whatever the GPU and the input, so that the summation
// order (and so the bits of the result) depends on the spans alone.
#define SUMSQ_BLOCKS 512
#define SUMSQ_THREADS 512  // the sum_squares kernels' block: their __launch_bounds__ and launches
// Element-wise span launches: positions per block (8 per thread).
#define SPAN_THREADS 256
#define SPAN_CHUNK (SPAN_THREADS * 8)
#define FLAT_THREADS 256

typedef struct {
    cudaStream_t setup;  // private stream for the synchronous ops (alloc's zero-fill, uploads)
    Zero1CudaMuon* muon;  // the muon op's cuBLASLt and plans, made on its first call
} CudaDeviceCtx;

static cudaStream_t stream_of(Zero1Stream s) { return (cudaStream_t)s; }
static cudaEvent_t event_of(Zero1Event e) { return (cudaEvent_t)e; }
static CudaDeviceCtx* ctx_of(void* ctx) { return (CudaDeviceCtx*)ctx; }

// ----------------------------------------------------------------------------
// The span table on the device: one allocation holding, in this order,
//   Zero1Span spans[count]; size_t prefix[count + 1]; double partials[SUMSQ_BLOCKS];
//   long long exact[ZERO1_EXACT_WORDS]
// (partials: sum_squares' per-block scratch, exact: sum_squares_exact's limbs, zero between
// launches; so each list has its own).

static_assert(sizeof(Zero1Span) % sizeof(size_t) == 0, "prefix sums follow the spans unpadded");

typedef struct {
    const Zero1Span* spans;
    const size_t* prefix;  // prefix[i] = sum of spans[0..i).n; prefix[count] = numel
    double* partials;
    long long* exact;
    int count;
    size_t numel;
} SpanTable;

static size_t span_prefix_offset(int count) { return (size_t)count * sizeof(Zero1Span); }
static size_t span_partials_offset(int count) { return span_prefix_offset(count) + ((size_t)count + 1) * sizeof(size_t); }
static size_t span_exact_offset(int count) { return span_partials_offset(count) + SUMSQ_BLOCKS * sizeof(double); }
static size_t span_table_bytes(int count) { return span_exact_offset(count) + ZERO1_EXACT_WORDS * sizeof(long long); }

// The device view of a list, after checking that the list is what upload_spans made.
static SpanTable span_table(const Zero1SpanList* list) {
    SpanTable t = {NULL, NULL, NULL, NULL, list->count, list->numel};
    if (list->count < 0) fatal("zero1 cuda: span list with %d spans", list->count);
    size_t total = 0;
    for (int i = 0; i < list->count; i++) total += list->host[i].n;
    if (total != list->numel) fatal("zero1 cuda: span list says %zu elements, its spans hold %zu", list->numel, total);
    if (list->count > 0) {
        if (list->device == NULL) fatal("zero1 cuda: span list of %d spans was not uploaded", list->count);
        const char* base = (const char*)list->device;
        t.spans = (const Zero1Span*)base;
        t.prefix = (const size_t*)(base + span_prefix_offset(list->count));
        t.partials = (double*)(base + span_partials_offset(list->count));
        t.exact = (long long*)(base + span_exact_offset(list->count));
    }
    return t;
}

// The span holding position pos (< numel): the largest s with prefix[s] <= pos. An
// empty span shares its prefix with the span after it, so the largest such s is never
// empty: prefix[s] <= pos < prefix[s + 1].
__device__ static int span_at(const SpanTable& t, size_t pos) {
    int lo = 0, hi = t.count - 1;  // prefix[lo] <= pos always (prefix[0] = 0)
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;  // lo < mid <= hi: the range shrinks every step
        if (t.prefix[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Calls f(span, j) for element j of every span, for the positions [begin, end) of the
// list; thread k of the block takes positions begin + k, begin + k + blockDim.x, ...
// within each span. While pos < numel some span at or after s holds it, so s stays
// below count.
template <typename F>
__device__ static void for_each_span_element(const SpanTable& t, size_t begin, size_t end, F f) {
    if (end > t.numel) end = t.numel;
    if (begin >= end) return;
    int s = span_at(t, begin);
    for (size_t pos = begin; pos < end; s++) {
        size_t span_start = t.prefix[s], span_end = t.prefix[s + 1];
        size_t stop = span_end < end ? span_end : end;
        const Zero1Span span = t.spans[s];
        for (size_t i = pos + threadIdx.x; i < stop; i += blockDim.x) f(span, i - span_start);
        pos = stop;
    }
}

// ----------------------------------------------------------------------------
// Kernels

// llmc/bf16.h's rounding itself (__float2bfloat16_rn would give a canonical NaN).
__device__ static uint16_t bf16_round(float f) { return float_to_bf16(f); }

// The write-back of an updated master into a param (llmc/adamw.h's adamw_round_bf16 for
// bf16), element: its model-space index.
__device__ static void store_param(float* p, float x, const AdamWStep& step, size_t element) { *p = x; }
__device__ static void store_param(uint16_t* p, float x, const AdamWStep& step, size_t element) {
    *p = adamw_round_bf16(x, &step, element);
}

static __global__ void fp32_to_bf16_kernel(uint16_t* dst, const float* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = bf16_round(src[i]);
    }
}

static __global__ void bf16_to_fp32_kernel(float* dst, const uint16_t* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = bf16_to_float(src[i]);
    }
}

// zero1_sum_slices_element for every element: one thread each, grid-stride.
static __global__ void sum_slices_kernel(float* dst, const void* src, Zero1Dtype src_type, int count, size_t n,
                                         float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = zero1_sum_slices_element(src, src_type, count, n, i, scale);
    }
}

// With a master (kHasMaster): master, m and v at span.owned, the rounded result into
// params at span.buffer. Without: fp32 params at span.buffer are the master.
template <typename ParamT, bool kHasMaster>
static __global__ void adamw_spans_kernel(SpanTable t, ParamT* params, float* master, const float* grads, float* m, float* v,
                                   AdamWStep step, const float* grad_scale) {
    step.grad_scale = grad_scale[0];
    size_t begin = (size_t)blockIdx.x * SPAN_CHUNK;
    for_each_span_element(t, begin, begin + SPAN_CHUNK, [&](const Zero1Span& span, size_t j) {
        size_t b = span.buffer + j, o = span.owned + j;
        float* p = kHasMaster ? master + o : (float*)params + b;
        float m_new = m[o], v_new = v[o];
        float updated = adamw_element(*p, grads[b], &m_new, &v_new, &step, span.decays);
        m[o] = m_new;
        v[o] = v_new;
        *p = updated;
        if (kHasMaster) store_param(params + b, updated, step, span.model + j);
    });
}

// The adamw kernel's write-back alone: master at span.owned into params at span.buffer.
template <typename ParamT>
static __global__ void round_master_kernel(SpanTable t, ParamT* params, const float* master, AdamWStep step) {
    size_t begin = (size_t)blockIdx.x * SPAN_CHUNK;
    for_each_span_element(t, begin, begin + SPAN_CHUNK, [&](const Zero1Span& span, size_t j) {
        store_param(params + span.buffer + j, master[span.owned + j], step, span.model + j);
    });
}

// Threads of any block may flag one parameter: an atomic store each, so that no two plain
// stores race (the value, 1.0f, is the same either way).
static __global__ void nonfinite_flags_kernel(SpanTable t, const float* grads, float* flags) {
    size_t begin = (size_t)blockIdx.x * SPAN_CHUNK;
    for_each_span_element(t, begin, begin + SPAN_CHUNK, [&](const Zero1Span& span, size_t j) {
        uint32_t bits = __float_as_uint(grads[span.buffer + j]);
        if ((bits & 0x7f800000u) == 0x7f800000u) atomicExch(&flags[span.param], 1.0f);  // exponent all ones: inf or NaN
    });
}

// Block b sums the squares of positions [b*chunk, (b+1)*chunk) into partials[b]; g*g of a
// float is exact in double, so only the additions round, in a fixed order.
static __global__ void __launch_bounds__(SUMSQ_THREADS)
    sum_squares_partial_kernel(SpanTable t, size_t chunk, const float* grads) {
    double sum = 0.0;
    size_t begin = (size_t)blockIdx.x * chunk;
    for_each_span_element(t, begin, begin + chunk, [&](const Zero1Span& span, size_t j) {
        double g = grads[span.buffer + j];
        sum += g * g;
    });
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) t.partials[blockIdx.x] = sum;
}

static __global__ void __launch_bounds__(SUMSQ_THREADS)
    sum_squares_final_kernel(const double* partials, double* acc) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < SUMSQ_BLOCKS; i += blockDim.x) sum += partials[i];
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) acc[0] += sum;
}

// One thread, zero1/device_cpu.c's arithmetic: the norm in double, rounded to float once.
static __global__ void norm_and_clip_kernel(const double* sumsq, float max_norm, float* out) {
    zero1_norm_and_clip_of(sumsq[0], max_norm, out);
}

// --dp-invariant's kernels (zero1/exact_sum.h): the CPU device's formulas, so its bits.
static __global__ void add_kernel(float* dst, const float* a, const float* b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = a[i] + b[i];
    }
}

static __global__ void sum_slices_pairwise_kernel(float* dst, const float* src, int count, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = zero1_pairwise_slices_element(src, count, n, i);
    }
}

// Each thread adds its positions' squares into limbs of its own, the block's threads add
// theirs into shared limbs and the block its, normalized, into the list's scratch, all by
// integer atomics: in any order the same sums.
static __global__ void __launch_bounds__(SUMSQ_THREADS)
    sum_squares_exact_partial_kernel(SpanTable t, size_t chunk, const float* grads) {
    __shared__ unsigned long long block[ZERO1_EXACT_WORDS];
    for (int w = threadIdx.x; w < ZERO1_EXACT_WORDS; w += blockDim.x) block[w] = 0;
    __syncthreads();
    long long mine[ZERO1_EXACT_WORDS];
    for (int w = 0; w < ZERO1_EXACT_WORDS; w++) mine[w] = 0;
    size_t begin = (size_t)blockIdx.x * chunk;
    for_each_span_element(t, begin, begin + chunk, [&](const Zero1Span& span, size_t j) {
        zero1_exact_add_square(grads[span.buffer + j], mine);
    });
    zero1_exact_normalize(mine);
    for (int w = 0; w < ZERO1_EXACT_WORDS; w++) {
        if (mine[w]) atomicAdd(&block[w], (unsigned long long)mine[w]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        long long sum[ZERO1_EXACT_WORDS];
        for (int w = 0; w < ZERO1_EXACT_WORDS; w++) sum[w] = (long long)block[w];
        zero1_exact_normalize(sum);
        for (int w = 0; w < ZERO1_EXACT_WORDS; w++) {
            if (sum[w]) atomicAdd((unsigned long long*)&t.exact[w], (unsigned long long)sum[w]);
        }
    }
}

// One thread: the launch's limbs into the words, and the scratch cleared for the next launch.
static __global__ void sum_squares_exact_final_kernel(long long* scratch, double* words) {
    long long acc[ZERO1_EXACT_WORDS];
    for (int w = 0; w < ZERO1_EXACT_WORDS; w++) {
        acc[w] = scratch[w];
        scratch[w] = 0;
    }
    zero1_exact_merge(words, acc);
}

static __global__ void norm_and_clip_exact_kernel(const double* words, float max_norm, float* out) {
    zero1_norm_and_clip_of(zero1_exact_value(words), max_norm, out);
}

// One block per entry; each thread sums its elements' source rows in plan order, as
// zero1/device_cpu.c does, so the bits agree.
static __global__ void add_rows_kernel(float* grads, const float* rows, Zero1RowPlan plan) {
    Zero1RowAdd a = plan.adds[blockIdx.x];
    const int* src = plan.sources + a.first;
    for (int i = threadIdx.x; i < a.len; i += blockDim.x) {
        float sum = 0.0f;
        for (int j = 0; j < a.count; j++) sum += rows[(size_t)src[j] * plan.width + a.skip + i];
        grads[a.dst + i] += sum * plan.scale;
    }
}

// ----------------------------------------------------------------------------
// Memory, streams, events

// Returns once the device memory is written, so that work queued on any stream later
// sees it: the setup stream is non-blocking and synchronized right away (a plain
// cudaMemset/cudaMemcpy may return before the device has finished, on the default
// stream, which non-blocking streams do not wait for).
static void setup_fill(CudaDeviceCtx* c, void* p, int byte, size_t bytes) {
    cudaCheck(cudaMemsetAsync(p, byte, bytes, c->setup));
    cudaCheck(cudaStreamSynchronize(c->setup));
}

static void setup_upload(CudaDeviceCtx* c, void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->setup));
    cudaCheck(cudaStreamSynchronize(c->setup));
}

static void* cuda_alloc(void* ctx, size_t bytes) {
    void* p = cudaMallocCheck(bytes);
    setup_fill(ctx_of(ctx), p, 0, bytes);
    return p;
}

// cudaFree may wait for the whole device: never inside a step.
static void cuda_free(void* ctx, void* p) {
    if (p) cudaCheck(cudaFree(p));
}

static void* cuda_alloc_host(void* ctx, size_t bytes) {
    void* p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) fatal("cannot allocate %zu bytes of page-locked host memory: %s", bytes, cudaGetErrorString(err));
    memset(p, 0, bytes);
    return p;
}

static void cuda_free_host(void* ctx, void* p) {
    if (p) cudaCheck(cudaFreeHost(p));
}

static Zero1Stream cuda_stream_create(void* ctx) {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return (Zero1Stream)s;
}

static void cuda_stream_destroy(void* ctx, Zero1Stream s) { cudaCheck(cudaStreamDestroy(stream_of(s))); }

static Zero1Event cuda_event_create(void* ctx) {
    cudaEvent_t e;
    cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (Zero1Event)e;
}

static void cuda_event_destroy(void* ctx, Zero1Event e) { cudaCheck(cudaEventDestroy(event_of(e))); }

// Timed events are only for traces (timing makes every record slightly dearer).
static Zero1Event cuda_event_create_timed(void* ctx) {
    cudaEvent_t e;
    cudaCheck(cudaEventCreate(&e));
    return (Zero1Event)e;
}

static float cuda_elapsed_ms(void* ctx, Zero1Event from, Zero1Event to) {
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, event_of(from), event_of(to)));
    return ms;
}
static void cuda_record(void* ctx, Zero1Event e, Zero1Stream s) { cudaCheck(cudaEventRecord(event_of(e), stream_of(s))); }
static void cuda_wait_event(void* ctx, Zero1Stream s, Zero1Event e) {
    cudaCheck(cudaStreamWaitEvent(stream_of(s), event_of(e), 0));
}
// The runtime's host waits (a checkpoint's reads after the parameters' all-gathers, the NaN
// flags' all-reduce, a resume's gathers, a trace's collective spans) include NCCL work.
static void cuda_sync_event(void* ctx, Zero1Event e) {
    cudaDeadline("zero1: a host wait for a GPU event (NCCL collectives before it)", cudaEventSynchronize(event_of(e)));
}
static void cuda_sync_stream(void* ctx, Zero1Stream s) {
    cudaDeadline("zero1: a host wait for the GPU stream (NCCL collectives before it)",
                 cudaStreamSynchronize(stream_of(s)));
}

cudaError_t zero1_cuda_event_status(cudaEvent_t e) {
    cudaError_t status = cudaEventQuery(e);
    // "Not ready" is an answer, not a failure: make sure a later launch check
    // (cudaGetLastError) does not report it.
    if (status == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return status;
}

static int cuda_query_event(void* ctx, Zero1Event e) {
    cudaError_t status = zero1_cuda_event_status(event_of(e));
    if (status == cudaErrorNotReady) return 0;
    cudaCheck(status);
    return 1;
}

// ----------------------------------------------------------------------------
// Data movement

static void cuda_fill(void* ctx, Zero1Stream s, void* p, int byte, size_t bytes) {
    if (bytes) cudaCheck(cudaMemsetAsync(p, byte, bytes, stream_of(s)));
}

static int ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    const char *x = (const char*)a, *y = (const char*)b;
    return x < y + b_bytes && y < x + a_bytes;
}

// Overlapping ranges are a caller error here (cudaMemcpyAsync does not handle them),
// except the copy onto itself, which is nothing to do.
static void cuda_copy(void* ctx, Zero1Stream s, void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    if (ranges_overlap(dst, bytes, src, bytes)) fatal("zero1 cuda: copy between overlapping ranges (%zu bytes)", bytes);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(s)));
}

static void cuda_to_host(void* ctx, Zero1Stream s, void* host_dst, const void* src, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(s)));
}

static void cuda_from_host(void* ctx, Zero1Stream s, void* dst, const void* host_src, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_of(s)));
}

// ----------------------------------------------------------------------------
// Arithmetic

// Grid-stride kernels: enough blocks to fill any GPU, few enough for any n.
static unsigned flat_blocks(size_t n) {
    size_t blocks = CEIL_DIV(n, (size_t)FLAT_THREADS);
    return (unsigned)(blocks < 65536 ? blocks : 65536);
}

static void cuda_convert(void* ctx, Zero1Stream st, void* dst, Zero1Dtype dst_type, const void* src,
                         Zero1Dtype src_type, size_t n) {
    if (dst_type == src_type) {
        cuda_copy(ctx, st, dst, src, n * zero1_dtype_size(dst_type));
        return;
    }
    if (n == 0) return;
    // Threads would read elements that other threads have already overwritten.
    if (ranges_overlap(dst, n * zero1_dtype_size(dst_type), src, n * zero1_dtype_size(src_type))) {
        fatal("zero1 cuda: conversion between overlapping ranges (%zu elements)", n);
    }
    if (dst_type == ZERO1_BF16 && src_type == ZERO1_FP32) {
        fp32_to_bf16_kernel<<<flat_blocks(n), FLAT_THREADS, 0, stream_of(st)>>>((uint16_t*)dst, (const float*)src, n);
    } else if (dst_type == ZERO1_FP32 && src_type == ZERO1_BF16) {
        bf16_to_fp32_kernel<<<flat_blocks(n), FLAT_THREADS, 0, stream_of(st)>>>((float*)dst, (const uint16_t*)src, n);
    } else {
        fatal("zero1 cuda: unsupported conversion %d -> %d", (int)src_type, (int)dst_type);
    }
    cudaCheckLaunch();
}

static void cuda_sum_slices(void* ctx, Zero1Stream st, float* dst, const void* src, Zero1Dtype src_type, int count,
                            size_t n, float scale) {
    if (src_type != ZERO1_FP32 && src_type != ZERO1_BF16) fatal("zero1 cuda: sum_slices of dtype %d", (int)src_type);
    if (n == 0) return;
    sum_slices_kernel<<<flat_blocks(n), FLAT_THREADS, 0, stream_of(st)>>>(dst, src, src_type, count, n, scale);
    cudaCheckLaunch();
}

static void* cuda_upload_spans(void* ctx, const Zero1Span* spans, int count) {
    if (count < 0) fatal("zero1 cuda: upload of %d spans", count);
    if (count == 0) return NULL;
    size_t bytes = span_table_bytes(count);
    char* host = (char*)callocCheck(bytes, 1);  // the partials start at zero (not needed; tidy)
    memcpy(host, spans, (size_t)count * sizeof(Zero1Span));
    size_t* prefix = (size_t*)(host + span_prefix_offset(count));
    prefix[0] = 0;
    for (int i = 0; i < count; i++) prefix[i + 1] = prefix[i] + spans[i].n;
    void* device = cudaMallocCheck(bytes);
    setup_upload(ctx_of(ctx), device, host, bytes);
    free(host);
    return device;
}

static unsigned span_blocks(size_t numel) { return (unsigned)CEIL_DIV(numel, (size_t)SPAN_CHUNK); }

static void cuda_adamw(void* ctx, Zero1Stream st, const Zero1SpanList* spans, void* params, Zero1Dtype param_type,
                       float* master, const float* grads, float* m, float* v, const AdamWStep* step,
                       const float* grad_scale) {
    SpanTable t = span_table(spans);
    if (param_type != ZERO1_FP32 && param_type != ZERO1_BF16) fatal("zero1 cuda: params of dtype %d", (int)param_type);
    if (master == NULL && param_type != ZERO1_FP32) fatal("zero1: bf16 params need an fp32 master");
    if (t.numel == 0) return;
    if (span_blocks(t.numel) > 0x7fffffffu) fatal("zero1 cuda: %zu elements in one AdamW launch", t.numel);
    cudaStream_t s = stream_of(st);
    unsigned blocks = span_blocks(t.numel);
    if (master == NULL) {
        adamw_spans_kernel<float, false><<<blocks, SPAN_THREADS, 0, s>>>(t, (float*)params, NULL, grads, m, v, *step, grad_scale);
    } else if (param_type == ZERO1_FP32) {
        adamw_spans_kernel<float, true><<<blocks, SPAN_THREADS, 0, s>>>(t, (float*)params, master, grads, m, v, *step, grad_scale);
    } else {
        adamw_spans_kernel<uint16_t, true><<<blocks, SPAN_THREADS, 0, s>>>(t, (uint16_t*)params, master, grads, m, v, *step,
                                                                           grad_scale);
    }
    cudaCheckLaunch();
}

static void cuda_round_master(void* ctx, Zero1Stream st, const Zero1SpanList* spans, void* params,
                              Zero1Dtype param_type, const float* master, const AdamWStep* step) {
    SpanTable t = span_table(spans);
    if (param_type != ZERO1_FP32 && param_type != ZERO1_BF16) fatal("zero1 cuda: params of dtype %d", (int)param_type);
    if (t.numel == 0) return;
    if (span_blocks(t.numel) > 0x7fffffffu) fatal("zero1 cuda: %zu elements in one launch", t.numel);
    cudaStream_t s = stream_of(st);
    if (param_type == ZERO1_FP32) {
        round_master_kernel<float><<<span_blocks(t.numel), SPAN_THREADS, 0, s>>>(t, (float*)params, master, *step);
    } else {
        round_master_kernel<uint16_t><<<span_blocks(t.numel), SPAN_THREADS, 0, s>>>(t, (uint16_t*)params, master, *step);
    }
    cudaCheckLaunch();
}

static void cuda_sum_squares(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads, double* acc) {
    SpanTable t = span_table(spans);
    if (t.numel == 0) return;  // acc[0] += 0
    cudaStream_t s = stream_of(st);
    sum_squares_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, s>>>(t, CEIL_DIV(t.numel, (size_t)SUMSQ_BLOCKS), grads);
    cudaCheckLaunch();
    sum_squares_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(t.partials, acc);
    cudaCheckLaunch();
}

static void cuda_nonfinite_flags(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads,
                                 float* flags) {
    SpanTable t = span_table(spans);
    if (t.numel == 0) return;
    if (span_blocks(t.numel) > 0x7fffffffu) fatal("zero1 cuda: %zu elements in one launch", t.numel);
    nonfinite_flags_kernel<<<span_blocks(t.numel), SPAN_THREADS, 0, stream_of(st)>>>(t, grads, flags);
    cudaCheckLaunch();
}

static void cuda_norm_and_clip(void* ctx, Zero1Stream st, const double* sumsq, float max_norm, float* out) {
    norm_and_clip_kernel<<<1, 1, 0, stream_of(st)>>>(sumsq, max_norm, out);
    cudaCheckLaunch();
}

static void cuda_add(void* ctx, Zero1Stream st, float* dst, const float* a, const float* b, size_t n) {
    if (n == 0) return;
    add_kernel<<<flat_blocks(n), FLAT_THREADS, 0, stream_of(st)>>>(dst, a, b, n);
    cudaCheckLaunch();
}

static void cuda_sum_slices_pairwise(void* ctx, Zero1Stream st, float* dst, const float* src, int count, size_t n) {
    if (count < 1 || (count & (count - 1)) != 0) fatal("zero1 cuda: sum_slices_pairwise of %d slices", count);
    if (n == 0) return;
    sum_slices_pairwise_kernel<<<flat_blocks(n), FLAT_THREADS, 0, stream_of(st)>>>(dst, src, count, n);
    cudaCheckLaunch();
}

// A fixed grid as sum_squares'; a thread then adds at most numel / 2^18 squares to its limbs.
static void cuda_sum_squares_exact(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const float* grads,
                                   double* words) {
    SpanTable t = span_table(spans);
    if (t.numel == 0) return;
    if (t.numel / ((size_t)SUMSQ_BLOCKS * SUMSQ_THREADS) >= ZERO1_EXACT_BATCH) {
        fatal("zero1 cuda: %zu elements in one sum_squares_exact launch", t.numel);
    }
    cudaStream_t s = stream_of(st);
    sum_squares_exact_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, s>>>(t, CEIL_DIV(t.numel, (size_t)SUMSQ_BLOCKS),
                                                                           grads);
    cudaCheckLaunch();
    sum_squares_exact_final_kernel<<<1, 1, 0, s>>>(t.exact, words);
    cudaCheckLaunch();
}

static void cuda_norm_and_clip_exact(void* ctx, Zero1Stream st, const double* words, float max_norm, float* out) {
    norm_and_clip_exact_kernel<<<1, 1, 0, stream_of(st)>>>(words, max_norm, out);
    cudaCheckLaunch();
}

static void cuda_add_rows(void* ctx, Zero1Stream st, float* grads, const float* rows, const Zero1RowPlan* plan) {
    if (plan->count == 0) return;
    add_rows_kernel<<<plan->count, FLAT_THREADS, 0, stream_of(st)>>>(grads, rows, *plan);
    cudaCheckLaunch();
}

static void cuda_muon(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const Zero1MatrixShape* shapes, float* params,
                      float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                      const float* grad_scale) {
    zero1_cuda_muon(&ctx_of(ctx)->muon, stream_of(st), spans, shapes, params, master, grads, momentum, step, grad_scale);
}

const Zero1DeviceOps zero1_device_cuda_ops = {
    "cuda", 0,
    cuda_alloc, cuda_free, cuda_alloc_host, cuda_free_host,
    cuda_stream_create, cuda_stream_destroy, cuda_event_create, cuda_event_destroy,
    cuda_record, cuda_wait_event, cuda_sync_event, cuda_query_event, cuda_sync_stream,
    cuda_fill, cuda_copy, cuda_to_host, cuda_from_host,
    cuda_convert, cuda_sum_slices, cuda_upload_spans, cuda_adamw, cuda_round_master, cuda_sum_squares, cuda_nonfinite_flags,
    cuda_add_rows, cuda_norm_and_clip,
    cuda_event_create_timed, cuda_elapsed_ms,
    cuda_add, cuda_sum_slices_pairwise, cuda_sum_squares_exact, cuda_norm_and_clip_exact,
    cuda_muon,
};

Zero1Device zero1_device_cuda_create(cudaStream_t compute) {
    CudaDeviceCtx* c = (CudaDeviceCtx*)callocCheck(1, sizeof(CudaDeviceCtx));
    cudaCheck(cudaStreamCreateWithFlags(&c->setup, cudaStreamNonBlocking));
    Zero1Device d = {&zero1_device_cuda_ops, c, (Zero1Stream)compute};
    return d;
}

void zero1_device_cuda_destroy(Zero1Device* dev) {
    CudaDeviceCtx* c = ctx_of(dev->ctx);
    if (c == NULL) return;
    zero1_cuda_muon_free(c->muon);
    cudaCheck(cudaStreamDestroy(c->setup));
    free(c);
    dev->ctx = NULL;
}
