/*
 * zero1's CUDA backend (zero1/device_cuda.cu) against the CPU device (zero1/device_cpu.c,
 * built as the CPU trainer builds it), and the NCCL communicator (zero1/comm_nccl.cu).
 *
 *   test_zero1_cuda                  one process, one GPU: parts 1-7 below
 *   mpirun -np N test_zero1_cuda     N ranks with a GPU each: part 8
 *   ... [--comm-timeout S]           the deadline of its waits (run/mpi_wait.h), 600 s by default
 * Prints TAP (dev/test/check.h) from rank 0; exits 1 on any failure.
 *
 *  1. convert: fp32 -> bf16 on every sign/exponent/high-mantissa pattern with the
 *     rounding-relevant low halves plus 16M random floats; bf16 -> fp32 on all 65536;
 *     same-type copies; bitwise equal to the CPU device
 *  2. adamw over span lists with empty, tiny, unaligned and large (4M) spans, gaps
 *     (bf16 also with stochastic rounding), and round_master (a resume's rebuild)
 *     between them and owned positions in another order; fp32 params with and without
 *     a master, bf16 params; 3 steps; every array bitwise equal to the CPU device
 *  3. sum_squares: same bits twice, "+=" semantics, both it and the CPU's double sum within
 *     the rounding bound of n additions (n * 2^-53) of a long double sum
 *  4. nonfinite_flags: NaN/Inf at span edges and inside, one in a gap (not flagged)
 *  5. norm_and_clip on edge cases, bitwise equal to the CPU device
 *  6. events between two streams; the same launch without the event is seen to race
 *  7. NCCL on one rank (over all ranks, and over a color): reduce-scatter, all-gather,
 *     all-reduce in place are the identity for fp32, bf16, fp64; a collective waits for
 *     the compute stream, and wait() makes the compute stream wait for the collective;
 *     groups; handle table growth; abort
 *  8. under mpirun (2 to 8 ranks, one GPU each), in place of 1-7 and 9: the in-place
 *     offsets and the sums of reduce-scatter, all-gather and all-reduce (fp32, bf16,
 *     fp64; alone and grouped) against the sums worked out here
 *  9. --dp-invariant's ops (zero1/exact_sum.h) bitwise equal to the CPU device:
 *     sum_squares_exact's limbs (the span sets above with the smallest denormal and FLT_MAX
 *     planted, two launches) and norm_and_clip_exact on them, add, sum_slices_pairwise of
 *     1 to 64 slices
 * 10. muon (CUDA_ON_CPU=1 builds, which link the CPU device's: OpenBLAS) on whole matrices of
 *     four shapes (transposed, a split qkvw, square, wide), 3 steps, fp32 master and fp32
 *     params, default and moved settings, --muon-ns-bf16: the momentum bitwise, the weights
 *     within MUON_FP32_TOL (bf16: MUON_BF16_TOL) of lr*scale of the CPU device's
 * Without a GPU it prints the plan "1..0 # SKIP why" (and exits 0).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dev/test/check.h"
#include "llmc/bf16.h"
#include "llmc/cuda_common.cuh"
#include "run/nccl_comm.h"
#include "zero1/comm_nccl.h"
#include "zero1/device_cuda.h"

// The muon op's tolerances, of lr * scale (one step's size; Newton-Schulz's result has entries
// of at most about 1): fp32 against the CPU's fp32 sgemm, bf16 GEMMs against the same.
#define MUON_FP32_TOL 1e-4
#define MUON_BF16_TOL 1e-1
extern "C" void openblas_set_num_threads(int n) __attribute__((weak));

static uint64_t next_u64(uint64_t* s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

// Finite floats over a wide range of magnitudes, with zeros and denormals mixed in.
static float random_float(uint64_t* s) {
    uint64_t r = next_u64(s);
    if (r % 1000 == 0) return 0.0f;
    if (r % 1000 == 1) return ldexpf((float)((r >> 40) & 0xff), -140);  // denormal (below 2^-126)
    float unit = (float)((r >> 11) & 0xffffff) / 16777216.0f - 0.5f;
    return ldexpf(unit, (int)((r >> 36) % 36) - 30);
}

// First index where two byte arrays of elements of `elem` bytes differ, or -1.
static long long first_difference(const void* a, const void* b, size_t n, size_t elem) {
    if (memcmp(a, b, n * elem) == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char*)a + i * elem, (const char*)b + i * elem, elem) != 0) return (long long)i;
    }
    return -1;
}

// ----------------------------------------------------------------------------
// Device helpers

static Zero1Device cpu, gpu;

static void* to_gpu(const void* host, size_t bytes) {
    void* d = gpu.ops->alloc(gpu.ctx, bytes);
    gpu.ops->from_host(gpu.ctx, gpu.compute, d, host, bytes);
    gpu.ops->sync_stream(gpu.ctx, gpu.compute);
    return d;
}

static void* from_gpu(const void* d, size_t bytes) {
    void* host = mallocCheck(bytes);
    gpu.ops->to_host(gpu.ctx, gpu.compute, host, d, bytes);
    gpu.ops->sync_stream(gpu.ctx, gpu.compute);
    return host;
}

// Checks a device array against the CPU device's host array, bit for bit.
static void check_same_bits(const char* what, const char* setting, const void* cpu_array, const void* gpu_array,
                            size_t n, size_t elem) {
    void* got = from_gpu(gpu_array, n * elem);
    long long i = first_difference(cpu_array, got, n, elem);
    if (i < 0) {
        tap_ok(1, "%s: %s bitwise equal (%zu elements)", setting, what, n);
    } else {
        uint32_t a = 0, b = 0;
        memcpy(&a, (const char*)cpu_array + i * elem, elem < 4 ? elem : 4);
        memcpy(&b, (const char*)got + i * elem, elem < 4 ? elem : 4);
        tap_ok(0, "%s: %s differs at %lld: cpu 0x%08x gpu 0x%08x", setting, what, i, a, b);
    }
    free(got);
}

// ----------------------------------------------------------------------------
// 1. convert

static void test_convert(void) {
    uint64_t rng = 42;
    // Every sign/exponent/high-mantissa half with the low halves that decide the rounding
    // (zero, ties, either side of a tie, all ones), then random patterns.
    static const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xfffe, 0xffff};
    const size_t num_lows = sizeof(lows) / sizeof(lows[0]), n_struct = 65536 * num_lows, n = n_struct + (1u << 24);
    uint32_t* bits = (uint32_t*)gpu.ops->alloc_host(gpu.ctx, n * 4);  // page-locked: alloc_host too
    for (size_t hi = 0; hi < 65536; hi++) {
        for (size_t k = 0; k < num_lows; k++) bits[hi * num_lows + k] = (uint32_t)(hi << 16) | lows[k];
    }
    for (size_t i = n_struct; i < n; i++) bits[i] = (uint32_t)next_u64(&rng);
    uint16_t* want = (uint16_t*)mallocCheck(n * 2);
    cpu.ops->convert(cpu.ctx, cpu.compute, want, ZERO1_BF16, bits, ZERO1_FP32, n);
    void* d_src = to_gpu(bits, n * 4);
    void* d_dst = gpu.ops->alloc(gpu.ctx, n * 2);
    gpu.ops->convert(gpu.ctx, gpu.compute, d_dst, ZERO1_BF16, d_src, ZERO1_FP32, n);
    check_same_bits("fp32 -> bf16 (NaN payloads, ties, overflow to inf, denormals)", "convert", want, d_dst, n, 2);

    // bf16 -> fp32 on every pattern, at an odd element offset on both sides.
    uint16_t all16[65536 + 1];
    for (uint32_t i = 0; i < 65536; i++) all16[i + 1] = (uint16_t)i;
    float* want32 = (float*)mallocCheck(65536 * 4);
    cpu.ops->convert(cpu.ctx, cpu.compute, want32, ZERO1_FP32, all16 + 1, ZERO1_BF16, 65536);
    uint16_t* d16 = (uint16_t*)to_gpu(all16, sizeof(all16));
    float* d32 = (float*)gpu.ops->alloc(gpu.ctx, (65536 + 3) * 4);
    gpu.ops->convert(gpu.ctx, gpu.compute, d32 + 3, ZERO1_FP32, d16 + 1, ZERO1_BF16, 65536);
    check_same_bits("bf16 -> fp32 (all 65536)", "convert", want32, d32 + 3, 65536, 4);

    // Same type: a plain copy, fp32 and bf16 (odd offsets); n = 0 leaves dst alone.
    gpu.ops->convert(gpu.ctx, gpu.compute, d32, ZERO1_FP32, (float*)d_src + 5, ZERO1_FP32, 65536);
    check_same_bits("fp32 -> fp32 copy", "convert", bits + 5, d32, 65536, 4);
    gpu.ops->convert(gpu.ctx, gpu.compute, (uint16_t*)d_dst + 1, ZERO1_BF16, d16 + 1, ZERO1_BF16, 65535);
    check_same_bits("bf16 -> bf16 copy", "convert", all16 + 1, (uint16_t*)d_dst + 1, 65535, 2);
    gpu.ops->fill(gpu.ctx, gpu.compute, d32, 0x7f, 16);
    gpu.ops->convert(gpu.ctx, gpu.compute, d32, ZERO1_FP32, d16, ZERO1_BF16, 0);
    uint32_t filled[4];
    memset(filled, 0x7f, sizeof(filled));
    check_same_bits("fill 0x7f, then an empty convert leaves it", "convert", filled, d32, 4, 4);

    gpu.ops->free_host(gpu.ctx, bits);
    free(want);
    free(want32);
    gpu.ops->free(gpu.ctx, d_src);
    gpu.ops->free(gpu.ctx, d_dst);
    gpu.ops->free(gpu.ctx, d16);
    gpu.ops->free(gpu.ctx, d32);
}

// ----------------------------------------------------------------------------
// Span sets: gaps between spans in the buffer, owned positions in reverse span order.

typedef struct {
    const char* name;
    Zero1Span* spans;
    int count;
    size_t numel, buffer_numel, owned_numel;
} SpanSet;

static SpanSet make_spans(const char* name, const size_t* sizes, int count, uint64_t* rng) {
    SpanSet s = {name, (Zero1Span*)callocCheck((size_t)count, sizeof(Zero1Span)), count, 0, 0, 0};
    size_t pos = 5;
    for (int i = 0; i < count; i++) {
        s.spans[i].buffer = pos + 1 + next_u64(rng) % 17;  // a gap of >= 1 before every span
        s.spans[i].n = sizes[i];
        s.spans[i].param = i;
        s.spans[i].decays = (int)(next_u64(rng) % 2);
        s.spans[i].model = 3 * s.numel + 11;  // model space: neither the buffer nor the owned place
        pos = s.spans[i].buffer + sizes[i];
        s.numel += sizes[i];
    }
    s.buffer_numel = pos + 11;
    size_t owned = 3;
    for (int i = count - 1; i >= 0; i--) {
        s.spans[i].owned = owned + next_u64(rng) % 5;
        owned = s.spans[i].owned + sizes[i];
    }
    s.owned_numel = owned + 7;
    return s;
}

static Zero1SpanList span_list(const Zero1Device* dev, const SpanSet* s) {
    Zero1SpanList l = {s->count, s->numel, s->spans, dev->ops->upload_spans(dev->ctx, s->spans, s->count)};
    return l;
}
// The two devices' lists of one span set (span_list on the CPU device and on the GPU), freed.
static void span_lists_free(const Zero1SpanList* cpu_list, const Zero1SpanList* gpu_list) {
    cpu.ops->free(cpu.ctx, (void*)cpu_list->device);
    gpu.ops->free(gpu.ctx, (void*)gpu_list->device);
}

static float* random_array(size_t n, uint64_t* rng, int non_negative) {
    float* x = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = non_negative ? fabsf(random_float(rng)) : random_float(rng);
    return x;
}

// ----------------------------------------------------------------------------
// 2. adamw

static void test_adamw(const SpanSet* set, Zero1Dtype param_type, int with_master, int stochastic) {
    char setting[128];
    snprintf(setting, sizeof(setting), "adamw %s, %s params, %s%s", set->name, param_type == ZERO1_BF16 ? "bf16" : "fp32",
             with_master ? "fp32 master" : "params are the master", stochastic ? ", stochastic rounding" : "");
    uint64_t rng = 7 + (uint64_t)param_type * 3 + (uint64_t)with_master;
    size_t nb = set->buffer_numel, no = set->owned_numel, pbytes = zero1_dtype_size(param_type);
    float* grads = random_array(nb, &rng, 0);
    float* m = random_array(no, &rng, 0);
    float* v = random_array(no, &rng, 1);
    float* master = with_master ? random_array(no, &rng, 0) : NULL;
    float* params_f = random_array(nb, &rng, 0);
    void* params = params_f;
    if (param_type == ZERO1_BF16) {
        params = mallocCheck(nb * 2);
        cpu.ops->convert(cpu.ctx, cpu.compute, params, ZERO1_BF16, params_f, ZERO1_FP32, nb);
    }
    void* d_params = to_gpu(params, nb * pbytes);
    float* d_grads = (float*)to_gpu(grads, nb * 4);
    float* d_m = (float*)to_gpu(m, no * 4);
    float* d_v = (float*)to_gpu(v, no * 4);
    float* d_master = with_master ? (float*)to_gpu(master, no * 4) : NULL;
    float* d_scale = (float*)gpu.ops->alloc(gpu.ctx, sizeof(float));
    Zero1SpanList cpu_list = span_list(&cpu, set), gpu_list = span_list(&gpu, set);

    static const float scales[3] = {1.0f, 0.37f, 2.5f};
    for (int t = 1; t <= 3; t++) {
        // grad_scale in the step is a decoy: the factor must come from device memory.
        AdamWStep step = adamw_step_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1000.0f);
        adamw_step_stochastic(&step, stochastic, 42);
        cpu.ops->adamw(cpu.ctx, cpu.compute, &cpu_list, params, param_type, master, grads, m, v, &step, &scales[t - 1]);
        gpu.ops->from_host(gpu.ctx, gpu.compute, d_scale, &scales[t - 1], sizeof(float));
        gpu.ops->adamw(gpu.ctx, gpu.compute, &gpu_list, d_params, param_type, d_master, d_grads, d_m, d_v, &step, d_scale);
    }
    check_same_bits("params after 3 steps", setting, params, d_params, nb, pbytes);
    check_same_bits("m", setting, m, d_m, no, 4);
    check_same_bits("v", setting, v, d_v, no, 4);
    if (with_master) check_same_bits("master", setting, master, d_master, no, 4);
    if (with_master) {  // a resume's rebuild: the master rounded again with step 3's rounding
        AdamWStep step = adamw_step_params(0.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0f);
        adamw_step_stochastic(&step, stochastic, 42);
        memset(params, 0, nb * pbytes);
        gpu.ops->fill(gpu.ctx, gpu.compute, d_params, 0, nb * pbytes);
        cpu.ops->round_master(cpu.ctx, cpu.compute, &cpu_list, params, param_type, master, &step);
        gpu.ops->round_master(gpu.ctx, gpu.compute, &gpu_list, d_params, param_type, d_master, &step);
        check_same_bits("round_master", setting, params, d_params, nb, pbytes);
    }

    if (param_type == ZERO1_BF16) free(params);
    free(params_f);
    free(grads);
    free(m);
    free(v);
    free(master);
    span_lists_free(&cpu_list, &gpu_list);
    gpu.ops->free(gpu.ctx, d_params);
    gpu.ops->free(gpu.ctx, d_grads);
    gpu.ops->free(gpu.ctx, d_m);
    gpu.ops->free(gpu.ctx, d_v);
    gpu.ops->free(gpu.ctx, d_master);
    gpu.ops->free(gpu.ctx, d_scale);
}

// ----------------------------------------------------------------------------
// 3. sum_squares, 4. nonfinite_flags

static double gpu_sum_squares(const Zero1SpanList* l, const float* d_grads, double start, int calls) {
    double* d_acc = (double*)to_gpu(&start, sizeof(double));
    for (int i = 0; i < calls; i++) gpu.ops->sum_squares(gpu.ctx, gpu.compute, l, d_grads, d_acc);
    double* got = (double*)from_gpu(d_acc, sizeof(double));
    double r = *got;
    free(got);
    gpu.ops->free(gpu.ctx, d_acc);
    return r;
}

static void test_sum_squares(const SpanSet* set) {
    uint64_t rng = 99;
    float* grads = random_array(set->buffer_numel, &rng, 0);
    float* d_grads = (float*)to_gpu(grads, set->buffer_numel * 4);
    Zero1SpanList cpu_list = span_list(&cpu, set), gpu_list = span_list(&gpu, set);

    double cpu_acc = 0.25;
    cpu.ops->sum_squares(cpu.ctx, cpu.compute, &cpu_list, grads, &cpu_acc);
    double first = gpu_sum_squares(&gpu_list, d_grads, 0.25, 1), second = gpu_sum_squares(&gpu_list, d_grads, 0.25, 1);
    long double ref = 0.25L;
    for (int i = 0; i < set->count; i++) {
        for (size_t j = 0; j < set->spans[i].n; j++) {
            long double g = grads[set->spans[i].buffer + j];
            ref += g * g;
        }
    }
    // Both sum n + 1 non-negative doubles (the squares of floats are exact in double), each
    // in its own order; any order's relative error is at most n * 2^-53 (every addition
    // rounds once, relative to a partial sum no larger than the total). So the two differ by
    // at most twice that: the bound, not a guess (a fixed 1e-12 was once tighter than the
    // CPU's own measured 2.2e-12 error on the 4M-element edge spans).
    size_t n = 0;
    for (int i = 0; i < set->count; i++) n += set->spans[i].n;
    double bound = (double)(n + 1) * ldexp(1.0, -53);
    double rel_cpu = fabs(first - cpu_acc) / fabs(cpu_acc);
    double rel_gpu_ref = (double)(fabsl(first - ref) / ref), rel_cpu_ref = (double)(fabsl(cpu_acc - ref) / ref);
    tap_ok(memcmp(&first, &second, sizeof(double)) == 0, "sum_squares %s: same bits twice (%.17g)", set->name, first);
    tap_ok(rel_cpu <= 2 * bound && rel_gpu_ref <= bound && rel_cpu_ref <= bound,
           "sum_squares %s: within the summation bound %.2e of the exact sum, so within %.2e of the CPU (rel %.2e; vs "
           "long double: gpu %.2e, cpu %.2e)", set->name, bound, 2 * bound, rel_cpu, rel_gpu_ref, rel_cpu_ref);
    // From 0, one call gives S exactly as summed and a second adds S again: 2S exactly.
    double once = gpu_sum_squares(&gpu_list, d_grads, 0.0, 1), twice = gpu_sum_squares(&gpu_list, d_grads, 0.0, 2);
    tap_ok(twice == 2.0 * once && once > 0.0, "sum_squares %s: accumulates into acc[0] (%.17g = 2 x %.17g)", set->name,
           twice, once);

    free(grads);
    span_lists_free(&cpu_list, &gpu_list);
    gpu.ops->free(gpu.ctx, d_grads);
}

static void test_sum_squares_empty(void) {
    size_t sizes[3] = {0, 0, 0};
    uint64_t rng = 5;
    SpanSet empty_spans = make_spans("empty spans", sizes, 3, &rng);
    Zero1SpanList none = {0, 0, NULL, NULL}, empties = span_list(&gpu, &empty_spans);
    float* d_grads = (float*)gpu.ops->alloc(gpu.ctx, empty_spans.buffer_numel * 4);
    double a = gpu_sum_squares(&none, d_grads, 1.5, 1), b = gpu_sum_squares(&empties, d_grads, 1.5, 1);
    tap_ok(a == 1.5 && b == 1.5, "sum_squares: no spans / only empty spans leave acc alone (%g, %g)", a, b);
    gpu.ops->free(gpu.ctx, (void*)empties.device);
    gpu.ops->free(gpu.ctx, d_grads);
    free(empty_spans.spans);
}

static void test_nonfinite_flags(const SpanSet* set) {
    uint64_t rng = 1234;
    float* grads = random_array(set->buffer_numel, &rng, 0);
    // Plant: NaN at the first element of the first non-empty span, -inf at the last of
    // the last one, +inf in the middle of the largest, a NaN in the gap before a span.
    int first = -1, last = -1, largest = 0;
    for (int i = 0; i < set->count; i++) {
        if (set->spans[i].n == 0) continue;
        if (first < 0) first = i;
        last = i;
        if (set->spans[i].n > set->spans[largest].n) largest = i;
    }
    int gap_span = (first + 1 < set->count) ? first + 1 : first;
    grads[set->spans[first].buffer] = nanf("");
    grads[set->spans[last].buffer + set->spans[last].n - 1] = -INFINITY;
    grads[set->spans[largest].buffer + set->spans[largest].n / 2] = INFINITY;
    grads[set->spans[gap_span].buffer - 1] = nanf("");  // in no span: make_spans leaves a gap before each
    float* flags = (float*)mallocCheck((size_t)set->count * 4);
    for (int i = 0; i < set->count; i++) flags[i] = 0.5f;  // "untouched" is visible
    float* d_flags = (float*)to_gpu(flags, (size_t)set->count * 4);
    float* d_grads = (float*)to_gpu(grads, set->buffer_numel * 4);
    Zero1SpanList cpu_list = span_list(&cpu, set), gpu_list = span_list(&gpu, set);
    cpu.ops->nonfinite_flags(cpu.ctx, cpu.compute, &cpu_list, grads, flags);
    gpu.ops->nonfinite_flags(gpu.ctx, gpu.compute, &gpu_list, d_grads, d_flags);
    char setting[96];
    snprintf(setting, sizeof(setting), "nonfinite_flags %s", set->name);
    check_same_bits("flags", setting, flags, d_flags, (size_t)set->count, 4);
    // And against what was planted, independently of the CPU device.
    int expected_ok = 1;
    for (int i = 0; i < set->count; i++) {
        int planted = (i == first || i == last || i == largest);
        expected_ok &= flags[i] == (planted ? 1.0f : 0.5f);
    }
    tap_ok(expected_ok, "%s: exactly the spans with a planted NaN/inf are flagged, the gap's NaN is not", setting);

    free(grads);
    free(flags);
    span_lists_free(&cpu_list, &gpu_list);
    gpu.ops->free(gpu.ctx, d_flags);
    gpu.ops->free(gpu.ctx, d_grads);
}

// ----------------------------------------------------------------------------
// 5. norm_and_clip

static void test_norm_and_clip(void) {
    static const double sumsq[] = {0.0, 4.0, 0.25, 1.0, 1e-300, 1e300, 2.0, 3.0, 7.123456789e5, 1.0000001, 9.0};
    static const float max_norm[] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 1.5f, 100.0f, 1.0f, -1.0f};
    const int k = (int)(sizeof(sumsq) / sizeof(sumsq[0]));
    float want[2 * 16];
    double* d_sumsq = (double*)to_gpu(sumsq, sizeof(sumsq));
    float* d_out = (float*)gpu.ops->alloc(gpu.ctx, 2 * (size_t)k * sizeof(float));
    int independent_ok = 1;
    for (int i = 0; i < k; i++) {
        cpu.ops->norm_and_clip(cpu.ctx, cpu.compute, &sumsq[i], max_norm[i], &want[2 * i]);
        gpu.ops->norm_and_clip(gpu.ctx, gpu.compute, d_sumsq + i, max_norm[i], d_out + 2 * i);
        float norm = (float)sqrt(sumsq[i]);
        independent_ok &= want[2 * i] == norm &&
                          want[2 * i + 1] == ((max_norm[i] > 0 && norm > max_norm[i]) ? max_norm[i] / norm : 1.0f);
    }
    tap_ok(independent_ok, "norm_and_clip: CPU device gives sqrt in double rounded once, and the clip rule");
    check_same_bits("norm and clip factor (incl. 0, inf norm, no clipping)", "norm_and_clip", want, d_out, 2 * (size_t)k,
                    4);
    gpu.ops->free(gpu.ctx, d_sumsq);
    gpu.ops->free(gpu.ctx, d_out);
}

// ----------------------------------------------------------------------------
// 9. --dp-invariant's ops

static void test_dp_invariant_ops(const SpanSet* set) {
    uint64_t rng = 77;
    float* grads = random_array(set->buffer_numel, &rng, 0);
    for (int i = 0; i < set->count; i++) {  // the extremes, in the first span that holds two
        if (set->spans[i].n < 2) continue;
        grads[set->spans[i].buffer] = ldexpf(1.0f, -149);
        grads[set->spans[i].buffer + 1] = -3.4028234663852886e38f;
        break;
    }
    float* d_grads = (float*)to_gpu(grads, set->buffer_numel * 4);
    Zero1SpanList cpu_list = span_list(&cpu, set), gpu_list = span_list(&gpu, set);
    double words[ZERO1_EXACT_WORDS] = {0};
    double* d_words = (double*)to_gpu(words, sizeof(words));
    for (int call = 0; call < 2; call++) {
        cpu.ops->sum_squares_exact(cpu.ctx, cpu.compute, &cpu_list, grads, words);
        gpu.ops->sum_squares_exact(gpu.ctx, gpu.compute, &gpu_list, d_grads, d_words);
    }
    char setting[96];
    snprintf(setting, sizeof(setting), "sum_squares_exact %s", set->name);
    check_same_bits("limbs after two launches", setting, words, d_words, ZERO1_EXACT_WORDS, 8);
    const float max_norm[3] = {0.0f, 1e-3f, 1e30f};
    float want[6];
    float* d_out = (float*)gpu.ops->alloc(gpu.ctx, sizeof(want));
    for (int i = 0; i < 3; i++) {
        cpu.ops->norm_and_clip_exact(cpu.ctx, cpu.compute, words, max_norm[i], want + 2 * i);
        gpu.ops->norm_and_clip_exact(gpu.ctx, gpu.compute, d_words, max_norm[i], d_out + 2 * i);
    }
    snprintf(setting, sizeof(setting), "norm_and_clip_exact %s", set->name);
    check_same_bits("norm and clip factor", setting, want, d_out, 6, 4);

    size_t n = set->buffer_numel;
    float* b = random_array(n, &rng, 0);
    float* d_b = (float*)to_gpu(b, n * 4);
    cpu.ops->add(cpu.ctx, cpu.compute, b, grads, b, n);
    gpu.ops->add(gpu.ctx, gpu.compute, d_b, d_grads, d_b, n);
    snprintf(setting, sizeof(setting), "add %s", set->name);
    check_same_bits("a + b", setting, b, d_b, n, 4);
    for (int count = 1; count <= 64; count *= 4) {
        size_t per = n / (size_t)count;
        float* d_sum = (float*)gpu.ops->alloc(gpu.ctx, per * 4);
        cpu.ops->sum_slices_pairwise(cpu.ctx, cpu.compute, b, grads, count, per);
        gpu.ops->sum_slices_pairwise(gpu.ctx, gpu.compute, d_sum, d_grads, count, per);
        snprintf(setting, sizeof(setting), "sum_slices_pairwise %s, %d slices", set->name, count);
        check_same_bits("the tree's sums", setting, b, d_sum, per, 4);
        gpu.ops->free(gpu.ctx, d_sum);
    }
    free(grads);
    free(b);
    span_lists_free(&cpu_list, &gpu_list);
    void* all[] = {d_grads, d_words, d_out, d_b};
    for (int i = 0; i < 4; i++) gpu.ops->free(gpu.ctx, all[i]);
}

// ----------------------------------------------------------------------------
// 6. events; 7. NCCL

// Busy for `cycles` of the SM clock (clock64: no inline PTX, so this also runs on the CPU
// execution layer for CUDA).
__global__ void spin_kernel(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void pattern_kernel(float* buf, size_t n, float base) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = base + (float)i;
    }
}

#define SPIN_NS 200000000ull  // 200 ms: far longer than any launch latency
#define PATTERN_N (1u << 20)

static void spin(Zero1Stream s) {
    int clock_khz = 0;
    cudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    spin_kernel<<<1, 1, 0, (cudaStream_t)s>>>((long long)clock_khz * (long long)(SPIN_NS / 1000000));
    cudaCheckLaunch();
}
static void pattern(Zero1Stream s, float* buf, float base) {
    pattern_kernel<<<256, 256, 0, (cudaStream_t)s>>>(buf, PATTERN_N, base);
    cudaCheckLaunch();
}

static int holds_pattern(const float* d, float base) {
    float* got = (float*)from_gpu(d, PATTERN_N * 4);
    int ok = 1;
    for (size_t i = 0; i < PATTERN_N; i++) ok &= got[i] == base + (float)i;
    free(got);
    return ok;
}

// A slow writer on stream a, the reader on stream b: with the event the reader sees the
// write; without it the reader runs at once and sees the old contents (which shows the
// first check can fail).
static void test_events(void) {
    Zero1Stream a = gpu.ops->stream_create(gpu.ctx), b = gpu.ops->stream_create(gpu.ctx);
    Zero1Event written = gpu.ops->event_create(gpu.ctx), copied = gpu.ops->event_create(gpu.ctx);
    float* src = (float*)gpu.ops->alloc(gpu.ctx, PATTERN_N * 4);
    float* dst = (float*)gpu.ops->alloc(gpu.ctx, PATTERN_N * 4);
    tap_ok(gpu.ops->query_event(gpu.ctx, written) == 1, "events: an event never recorded is complete");
    for (int ordered = 1; ordered >= 0; ordered--) {
        gpu.ops->fill(gpu.ctx, a, src, 0, PATTERN_N * 4);
        gpu.ops->sync_stream(gpu.ctx, a);
        spin(a);
        pattern(a, src, 3.0f);
        gpu.ops->record(gpu.ctx, written, a);
        if (ordered) gpu.ops->wait_event(gpu.ctx, b, written);
        gpu.ops->copy(gpu.ctx, b, dst, src, PATTERN_N * 4);
        gpu.ops->record(gpu.ctx, copied, b);
        if (ordered) {
            usleep(50 * 1000);
            tap_ok(gpu.ops->query_event(gpu.ctx, written) == 0 && gpu.ops->query_event(gpu.ctx, copied) == 0,
                   "events: query_event says 0 while the writer runs, and the waiting reader is not done");
            gpu.ops->sync_event(gpu.ctx, copied);
            tap_ok(gpu.ops->query_event(gpu.ctx, copied) == 1 && gpu.ops->query_event(gpu.ctx, written) == 1,
                   "events: sync_event waits; both events complete after it");
            tap_ok(holds_pattern(dst, 3.0f), "events: the reader on stream b sees stream a's write (record + wait_event)");
        } else {
            gpu.ops->sync_stream(gpu.ctx, b);
            tap_ok(!holds_pattern(dst, 3.0f), "events (control): without wait_event the reader runs early");
            gpu.ops->sync_stream(gpu.ctx, a);
        }
    }
    gpu.ops->free(gpu.ctx, src);
    gpu.ops->free(gpu.ctx, dst);
    gpu.ops->event_destroy(gpu.ctx, written);
    gpu.ops->event_destroy(gpu.ctx, copied);
    gpu.ops->stream_destroy(gpu.ctx, a);
    gpu.ops->stream_destroy(gpu.ctx, b);
}

// With one rank every in-place collective is the identity, in every dtype.
static void test_nccl_identity(Zero1Comm* c, const char* over) {
    static const Zero1Dtype types[3] = {ZERO1_FP32, ZERO1_BF16, ZERO1_FP64};
    static const char* type_names[3] = {"fp32", "bf16", "fp64"};
    const size_t n = 1000003;
    uint64_t rng = 77;
    for (int t = 0; t < 3; t++) {
        size_t bytes = n * zero1_dtype_size(types[t]);
        unsigned char* host = (unsigned char*)mallocCheck(bytes);
        for (size_t i = 0; i < bytes; i += 2) {  // finite values: no NaN/inf bit patterns
            float f = random_float(&rng);
            uint16_t h = float_to_bf16(f);
            memcpy(host + i, &h, 2);
        }
        void* d = to_gpu(host, bytes);
        for (int op = 0; op < 3; op++) {
            Zero1Handle h = op == 0   ? zero1_comm_reduce_scatter(c, d, n, types[t], ZERO1_SUM, op)
                            : op == 1 ? zero1_comm_all_gather(c, d, n, types[t], op)
                                      : zero1_comm_all_reduce(c, d, n, types[t], ZERO1_SUM, op);
            zero1_comm_wait(c, h);
        }
        char what[96];
        snprintf(what, sizeof(what), "reduce-scatter, all-gather, all-reduce in place (%s)", type_names[t]);
        char setting[64];
        snprintf(setting, sizeof(setting), "nccl 1 rank, over %s", over);
        check_same_bits(what, setting, host, d, n, zero1_dtype_size(types[t]));
        free(host);
        gpu.ops->free(gpu.ctx, d);
    }
}

static void test_nccl_ordering(Zero1Comm* c) {
    float* buf = (float*)gpu.ops->alloc(gpu.ctx, PATTERN_N * 4);
    float* out = (float*)gpu.ops->alloc(gpu.ctx, PATTERN_N * 4);
    Zero1Stream comm_stream = (Zero1Stream)zero1_comm_nccl_stream(c);
    Zero1Event queued = gpu.ops->event_create(gpu.ctx);

    // Ordering in: the collective waits for the compute stream's (slow) write.
    spin(gpu.compute);
    pattern(gpu.compute, buf, 1.0f);
    Zero1Handle h = zero1_comm_all_reduce(c, buf, PATTERN_N, ZERO1_FP32, ZERO1_SUM, 0);
    usleep(50 * 1000);
    tap_ok(zero1_comm_test(c, h) == 0, "nccl: a collective is not complete while the compute work before it runs");
    zero1_comm_wait(c, h);
    gpu.ops->copy(gpu.ctx, gpu.compute, out, buf, PATTERN_N * 4);
    tap_ok(holds_pattern(out, 1.0f), "nccl: compute write -> all-reduce -> compute read sees the write");

    // wait(h) orders the compute stream after the collective: a slow write on the comm
    // stream before the collective must be visible to the compute work after wait.
    spin(comm_stream);
    pattern(comm_stream, buf, 2.0f);
    h = zero1_comm_reduce_scatter(c, buf, PATTERN_N, ZERO1_FP32, ZERO1_SUM, 1);
    zero1_comm_wait(c, h);
    gpu.ops->copy(gpu.ctx, gpu.compute, out, buf, PATTERN_N * 4);
    gpu.ops->record(gpu.ctx, queued, gpu.compute);
    usleep(50 * 1000);
    tap_ok(gpu.ops->query_event(gpu.ctx, queued) == 0, "nccl: wait() holds the compute stream until the collective is done");
    tap_ok(holds_pattern(out, 2.0f), "nccl: compute work after wait() sees the communication stream's result");

    // Groups: handles are not complete before group_end, ordering in still holds after it.
    float* more = (float*)gpu.ops->alloc(gpu.ctx, PATTERN_N * 4);
    spin(gpu.compute);
    pattern(gpu.compute, buf, 4.0f);
    zero1_comm_group_begin(c);
    Zero1Handle g1 = zero1_comm_reduce_scatter(c, buf, PATTERN_N, ZERO1_FP32, ZERO1_SUM, 0);
    Zero1Handle g2 = zero1_comm_all_gather(c, more, PATTERN_N, ZERO1_FP32, 1);
    tap_ok(zero1_comm_test(c, g1) == 0, "nccl group: a handle is not complete before group_end");
    zero1_comm_group_end(c);
    usleep(50 * 1000);
    tap_ok(zero1_comm_test(c, g2) == 0, "nccl group: after group_end the collectives still wait for the compute stream");
    zero1_comm_wait(c, g1);
    zero1_comm_wait(c, g2);
    tap_ok(holds_pattern(buf, 4.0f), "nccl group: identity after the grouped collectives");

    // Many handles in flight at once (the handle table grows), finished by test or wait.
    Zero1Handle hs[40];
    for (int i = 0; i < 40; i++) hs[i] = zero1_comm_all_reduce(c, buf, PATTERN_N, ZERO1_FP32, ZERO1_SUM, i);
    zero1_comm_progress(c);
    gpu.ops->sync_stream(gpu.ctx, comm_stream);
    int all_done = 1;
    for (int i = 0; i < 40; i += 2) all_done &= zero1_comm_test(c, hs[i]) == 1;
    for (int i = 1; i < 40; i += 2) zero1_comm_wait(c, hs[i]);
    tap_ok(all_done && holds_pattern(buf, 4.0f), "nccl: 40 handles in flight, finished by test and wait");
    tap_ok(zero1_comm_test(c, -1) == 1 && zero1_comm_all_reduce(c, buf, 0, ZERO1_FP32, ZERO1_SUM, 0) == -1,
           "nccl: handle -1 and empty collectives");

    gpu.ops->sync_stream(gpu.ctx, gpu.compute);
    gpu.ops->event_destroy(gpu.ctx, queued);
    gpu.ops->free(gpu.ctx, buf);
    gpu.ops->free(gpu.ctx, out);
    gpu.ops->free(gpu.ctx, more);
}

static void test_nccl(void) {
    Zero1Comm* c = zero1_comm_nccl_create(&gpu, -1);
    tap_ok(c->rank == 0 && c->size == 1, "nccl over all ranks: rank 0 of 1");
    test_nccl_identity(c, "all ranks");
    test_nccl_ordering(c);
    zero1_comm_destroy(c);

    c = zero1_comm_nccl_create(&gpu, 3);
    tap_ok(c->rank == 0 && c->size == 1, "nccl over color 3: rank 0 of 1");
    test_nccl_identity(c, "color 3");
    // A second communicator of the device (as --dist-opt-instances makes) queues on the same
    // stream, so the two never run collectives at once; the stream outlives either.
    Zero1Comm* other = zero1_comm_nccl_create(&gpu, 5);
    tap_ok(zero1_comm_nccl_stream(other) == zero1_comm_nccl_stream(c),
           "nccl: two communicators of one device share one communication stream");
    zero1_comm_destroy(other);
    test_nccl_identity(c, "color 3, the other one destroyed");
    tap_ok(zero1_comm_abort(c) == 0, "nccl: abort returns 0");
    zero1_comm_destroy(c);
}

// ----------------------------------------------------------------------------
// 8. Several ranks. Rank k contributes (k+1)*(i%8) at position i: every partial sum is
// an integer <= 8*9/2*7 = 252, exact in bf16 too, so the sums are checked exactly.

static int world_rank = 0, world_size = 1;

// Every rank's verdict; rank 0 reports; every rank counts the failure (exit status).
static void check_all_ranks(int ok, const char* what) {
    int all_ok = 0;
    mpiCheck(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    tap_ok(all_ok, "%s (%d ranks)", what, world_size);
}

static void put_value(void* buf, Zero1Dtype t, size_t i, double x) {
    if (t == ZERO1_FP64) ((double*)buf)[i] = x;
    else if (t == ZERO1_FP32) ((float*)buf)[i] = (float)x;
    else ((uint16_t*)buf)[i] = float_to_bf16((float)x);
}

static double get_value(const void* buf, Zero1Dtype t, size_t i) {
    if (t == ZERO1_FP64) return ((const double*)buf)[i];
    if (t == ZERO1_FP32) return ((const float*)buf)[i];
    return bf16_to_float(((const uint16_t*)buf)[i]);
}

// Small integers: their sums are exact in every order NCCL may add them (ring, tree, NVLS),
// so the bitwise checks below hold whatever the algorithm (docs/gpu.md#what-is-bitwise-on-a-gpu).
static double contribution(int rank, size_t i) { return (double)((rank + 1) * (int)(i % 8)); }

enum { RS = 0, AG = 1, AR = 2 };

// The input of `op` on this rank: everything for reduce-scatter and all-reduce; for
// all-gather only this rank's slot, the rest NaN bytes (the gather must overwrite them).
static void* multirank_input(int op, Zero1Dtype t, size_t n, int rank, int size) {
    size_t elem = zero1_dtype_size(t), count = n / (size_t)size;
    unsigned char* host = (unsigned char*)mallocCheck(n * elem);
    memset(host, 0xff, n * elem);
    for (size_t i = 0; i < n; i++) {
        if (op != AG || i / count == (size_t)rank) put_value(host, t, i, contribution(rank, i));
    }
    void* d = to_gpu(host, n * elem);
    free(host);
    return d;
}

// Whether this rank's result of `op` is right: its slot after reduce-scatter, all of buf otherwise.
static int multirank_output_ok(int op, Zero1Dtype t, const void* d, size_t n, int rank, int size) {
    size_t count = n / (size_t)size;
    void* host = from_gpu(d, n * zero1_dtype_size(t));
    int ok = 1;
    double ranks_sum = size * (size + 1) / 2.0;
    for (size_t i = (op == RS ? rank * count : 0); i < (op == RS ? (rank + 1) * count : n); i++) {
        double want = op == AG ? contribution((int)(i / count), i) : (double)(i % 8) * ranks_sum;
        ok &= get_value(host, t, i) == want;
    }
    free(host);
    return ok;
}

static Zero1Handle issue(Zero1Comm* c, int op, void* buf, size_t n, Zero1Dtype t) {
    if (op == RS) return zero1_comm_reduce_scatter(c, buf, n, t, ZERO1_SUM, op);
    if (op == AG) return zero1_comm_all_gather(c, buf, n, t, op);
    return zero1_comm_all_reduce(c, buf, n, t, ZERO1_SUM, op);
}

static void test_nccl_multirank(Zero1Comm* c) {
    static const Zero1Dtype types[3] = {ZERO1_FP32, ZERO1_BF16, ZERO1_FP64};
    static const char* type_names[3] = {"fp32", "bf16", "fp64"};
    static const char* op_names[3] = {"reduce-scatter", "all-gather", "all-reduce"};
    const size_t n = 100003 * (size_t)c->size;  // an odd slot length: no alignment to lean on
    char what[160];
    check_all_ranks(c->rank == world_rank && c->size == world_size, "nccl: rank and size are MPI's");
    for (int t = 0; t < 3; t++) {
        for (int op = 0; op < 3; op++) {
            void* d = multirank_input(op, types[t], n, c->rank, c->size);
            zero1_comm_wait(c, issue(c, op, d, n, types[t]));
            snprintf(what, sizeof(what), "nccl: %s in place, %s: slots and sums exact", op_names[op], type_names[t]);
            check_all_ranks(multirank_output_ok(op, types[t], d, n, c->rank, c->size), what);
            gpu.ops->free(gpu.ctx, d);
        }
    }
    // The three at once in one group, finished by test() in a loop (never blocks).
    void* d[3];
    Zero1Handle h[3];
    for (int op = 0; op < 3; op++) d[op] = multirank_input(op, ZERO1_FP32, n, c->rank, c->size);
    zero1_comm_group_begin(c);
    for (int op = 0; op < 3; op++) h[op] = issue(c, op, d[op], n, ZERO1_FP32);
    zero1_comm_group_end(c);
    int ok = 1;
    for (int op = 0; op < 3; op++) {
        while (!zero1_comm_test(c, h[op])) zero1_comm_progress(c);
        ok &= multirank_output_ok(op, ZERO1_FP32, d[op], n, c->rank, c->size);
        gpu.ops->free(gpu.ctx, d[op]);
    }
    check_all_ranks(ok, "nccl: reduce-scatter + all-gather + all-reduce in one group");
}

// ----------------------------------------------------------------------------
// 10. muon

// Uniform in [-1, 1): Muon's inputs need no extreme magnitudes (sums of squares, not rounding).
static float* uniform_array(size_t n, uint64_t* rng) {
    float* x = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)((next_u64(rng) >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return x;
}

// Largest |a - b| over the spans' elements, each divided by that matrix's step bound
// lr * scale (the update's size before Newton-Schulz's error); outside the spans a and b must
// be equal (gaps: -1 when not).
static double muon_max_error(const float* a, const float* b, const SpanSet* set, const Zero1MatrixShape* shapes,
                             int at_buffer, size_t total, float lr, const MuonConfig* cfg) {
    double worst = 0.0;
    char* in_span = (char*)callocCheck(total, 1);
    for (int i = 0; i < set->count; i++) {
        const Zero1Span* sp = &set->spans[i];
        Zero1MatrixShape sh = shapes[sp->param];
        int parts = sh.qkv && cfg->split_qkv ? 3 : 1;
        double bound = (double)lr * muon_scale_factor(cfg->scale, sh.rows / parts, sh.cols) * cfg->extra_scale;
        size_t start = at_buffer ? sp->buffer : sp->owned;
        for (size_t j = 0; j < sp->n; j++) {
            double e = fabs((double)a[start + j] - (double)b[start + j]) / bound;
            worst = e > worst ? e : worst;
            in_span[start + j] = 1;
        }
    }
    for (size_t k = 0; k < total; k++) {
        if (!in_span[k] && memcmp(&a[k], &b[k], sizeof(float)) != 0) worst = -1.0;
    }
    free(in_span);
    return worst;
}

// The CUDA muon op against the CPU device's over 3 steps: the momentum bitwise (elementwise
// arithmetic), the weights within tol of the step bound (Newton-Schulz's sums run in another
// order: fp32 GEMMs of cuBLASLt against OpenBLAS's sgemm), and moved by far more than tol.
static void test_muon(const SpanSet* set, const Zero1MatrixShape* shapes, const MuonConfig* cfg, int with_master,
                      int ns_bf16, double tol, const char* name) {
    char setting[160];
    snprintf(setting, sizeof(setting), "muon %s, %s%s", name, with_master ? "fp32 master" : "params are the master",
             ns_bf16 ? ", --muon-ns-bf16" : "");
    uint64_t rng = 99 + (uint64_t)with_master;
    size_t nb = set->buffer_numel, no = set->owned_numel, nw = with_master ? no : nb;
    float* grads = uniform_array(nb, &rng);
    float* m = uniform_array(no, &rng);
    float* w = uniform_array(nw, &rng);  // the master, or the params
    float* w0 = (float*)mallocCheck(nw * sizeof(float));
    memcpy(w0, w, nw * sizeof(float));
    float *d_grads = (float*)to_gpu(grads, nb * 4), *d_m = (float*)to_gpu(m, no * 4), *d_w = (float*)to_gpu(w, nw * 4);
    float* d_scale = (float*)gpu.ops->alloc(gpu.ctx, sizeof(float));
    Zero1SpanList cpu_list = span_list(&cpu, set), gpu_list = span_list(&gpu, set);
    static const float scales[3] = {1.0f, 0.37f, 2.5f};
    const float lr = 0.02f;
    // The CPU's steps first: its OpenBLAS calls do not overlap the layer's GEMMs (CUDA_ON_CPU).
    for (int t = 0; t < 3; t++) {
        Zero1MuonStep cpu_step = {lr, 0.1f, *cfg, 0};
        cpu.ops->muon(cpu.ctx, cpu.compute, &cpu_list, shapes, with_master ? NULL : w, with_master ? w : NULL, grads, m,
                      &cpu_step, &scales[t]);
    }
    for (int t = 0; t < 3; t++) {
        Zero1MuonStep gpu_step = {lr, 0.1f, *cfg, ns_bf16};
        gpu.ops->from_host(gpu.ctx, gpu.compute, d_scale, &scales[t], sizeof(float));
        gpu.ops->muon(gpu.ctx, gpu.compute, &gpu_list, shapes, with_master ? NULL : d_w, with_master ? d_w : NULL,
                      d_grads, d_m, &gpu_step, d_scale);
    }
    check_same_bits("momentum", setting, m, d_m, no, 4);
    float* got = (float*)from_gpu(d_w, nw * 4);
    double err = muon_max_error(w, got, set, shapes, !with_master, nw, lr, cfg);
    double moved = muon_max_error(w, w0, set, shapes, !with_master, nw, lr, cfg);
    tap_ok(err >= 0.0 && err <= tol, "%s: weights within %g of lr*scale of the CPU device's (max %.3g; gaps untouched)",
           setting, tol, err);
    tap_ok(moved > 10.0 * tol, "%s: 3 steps moved the weights (max %.3g of lr*scale)", setting, moved);
    free(got);
    free(grads);
    free(m);
    free(w);
    free(w0);
    span_lists_free(&cpu_list, &gpu_list);
    gpu.ops->free(gpu.ctx, d_grads);
    gpu.ops->free(gpu.ctx, d_m);
    gpu.ops->free(gpu.ctx, d_w);
    gpu.ops->free(gpu.ctx, d_scale);
}

static void test_muon_all(void) {
    if (zero1_device_cpu_muon == NULL) {
        tap_skip("this build has no CPU muon op (OpenBLAS: CUDA_ON_CPU=1 builds link it)", "muon against the CPU device");
        return;
    }
    // The CPU op calls sgemm from several OpenMP threads at once, which OpenBLAS's threaded build
    // survives only single-threaded (as the trainer runs it: run/threads.h); else it scribbles.
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    // Transposed (24 x 8), a split qkvw, a square that shares the thirds' shape, two of one wide shape.
    static const Zero1MatrixShape shapes[] = {{24, 8, 0}, {24, 8, 1}, {8, 8, 0}, {8, 32, 0}, {24, 8, 0}, {8, 32, 0}};
    int count = (int)(sizeof(shapes) / sizeof(shapes[0]));
    size_t sizes[8];
    for (int i = 0; i < count; i++) sizes[i] = (size_t)shapes[i].rows * shapes[i].cols;
    uint64_t rng = 5;
    SpanSet set = make_spans("6 matrices", sizes, count, &rng);
    MuonConfig cfg = {0.95f, 0, 5, MUON_COEFFICIENTS_QUINTIC, MUON_SCALE_SPECTRAL, 1.0f, 1};
    MuonConfig other = {0.9f, 1, 3, MUON_COEFFICIENTS_SIMPLE, MUON_SCALE_SHAPE_SCALING, 2.0f, 0};
    test_muon(&set, shapes, &cfg, 1, 0, MUON_FP32_TOL, "defaults");
    test_muon(&set, shapes, &cfg, 0, 0, MUON_FP32_TOL, "defaults");
    test_muon(&set, shapes, &other, 1, 0, MUON_FP32_TOL, "every setting moved");
    test_muon(&set, shapes, &cfg, 1, 1, MUON_BF16_TOL, "defaults");
    free(set.spans);
}

int main(int argc, char** argv) {
    const char* why_none = NULL;
    int count = cuda_device_count(&why_none);
    if (count == 0) {
        tap_skip_all("no GPU (%s): the CUDA device ops and the NCCL communicator were NOT tested", why_none);
        return 0;
    }
    MPI_Init(&argc, &argv);
    // --comm-timeout S: the deadline of the job's waits, the communicators' destroy's too
    // (dev/test/peer_killed.sh kills a rank there).
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--comm-timeout") == 0) mpi_wait_set_timeout(atof(argv[i + 1]));
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    utils_set_rank(world_rank, world_size);
    tap_rank = world_rank;
    int local_world, local_rank = mpi_local_rank(&local_world);
    cudaCheck(cudaSetDevice(local_rank % count));
    // The trainer's own check (NCCL refuses two ranks on one GPU); collective, so every rank asks.
    int distinct = gpus_distinct_on_node();
    if (world_size > 1 && (!distinct || world_size > 8)) {
        tap_skip_all("%d ranks need 2 to 8 GPUs of their own (%d found)", world_size, count);
        MPI_Finalize();
        return 0;
    }
    cudaStream_t compute;
    cudaCheck(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    cpu = zero1_device_cpu();
    gpu = zero1_device_cuda_create(compute);
    if (world_size > 1) {
        Zero1Comm* c = zero1_comm_nccl_create(&gpu, -1);
        test_nccl_multirank(c);
        zero1_comm_destroy(c);
        zero1_device_cuda_destroy(&gpu);
        cudaCheck(cudaStreamDestroy(compute));
        MPI_Finalize();
        return done_testing();
    }

    test_convert();
    uint64_t rng = 2024;
    static const size_t edge_sizes[] = {0, 1, 3, 0, 7, 2047, 2048, 2049, 1000, 0, 4194319, 5, 0};
    SpanSet edge = make_spans("edge spans", edge_sizes, (int)(sizeof(edge_sizes) / sizeof(edge_sizes[0])), &rng);
    size_t many_sizes[3000];
    for (int i = 0; i < 3000; i++) many_sizes[i] = next_u64(&rng) % 400;  // some empty, many chunk crossings
    SpanSet many = make_spans("3000 small spans", many_sizes, 3000, &rng);
    const SpanSet* sets[2] = {&edge, &many};
    for (int s = 0; s < 2; s++) {
        test_adamw(sets[s], ZERO1_FP32, 0, 0);
        test_adamw(sets[s], ZERO1_FP32, 1, 0);
        test_adamw(sets[s], ZERO1_BF16, 1, 0);
        test_adamw(sets[s], ZERO1_BF16, 1, 1);
        test_sum_squares(sets[s]);
        test_nonfinite_flags(sets[s]);
        test_dp_invariant_ops(sets[s]);
    }
    test_sum_squares_empty();
    test_norm_and_clip();
    test_events();
    test_nccl();
    test_muon_all();

    free(edge.spans);
    free(many.spans);
    zero1_device_cuda_destroy(&gpu);
    cudaCheck(cudaStreamDestroy(compute));
    MPI_Finalize();
    return done_testing();
}
