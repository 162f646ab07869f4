/* zero1/device_cpu.c: the device operations for host memory (the CPU trainer). */
#include <math.h>
#include <stdint.h>

#include "llmc/bf16.h"
#include "llmc/utils.h"
#include "zero1/device_ops.h"

static void* cpu_alloc(size_t bytes) { return callocCheck(bytes, 1); }
static void cpu_free(void* p) { free(p); }
static void cpu_zero(void* p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }

static void cpu_convert(void* dst, Zero1Dtype dst_type, const void* src, Zero1Dtype src_type, size_t n) {
    if (dst_type == src_type) {
        memcpy(dst, src, n * zero1_dtype_size(dst_type));
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

static long long cpu_first_nonfinite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return (long long)i;
    }
    return -1;
}

static double cpu_sum_squares(const float* x, size_t n) {
    double s = 0.0;
#pragma omp parallel for reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void cpu_adamw(void* params, Zero1Dtype param_type, float* master, const float* grads, float* m, float* v,
                      size_t n, const AdamWStep* s, int decays) {
    if (master == NULL) {
        if (param_type != ZERO1_FP32) fatal("zero1: bf16 params need an fp32 master");
        adamw_update_range((float*)params, grads, m, v, n, s, decays);
        return;
    }
    adamw_update_range(master, grads, m, v, n, s, decays);
    cpu_convert(params, param_type, master, ZERO1_FP32, n);
}

const Zero1DeviceOps zero1_device_cpu = {cpu_alloc, cpu_free, cpu_zero, cpu_copy, cpu_convert,
                                         cpu_first_nonfinite, cpu_sum_squares, cpu_adamw};
