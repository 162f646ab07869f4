/*
 * zero1/device_ops.h: the element-wise work the ZeRO-1 runtime asks of the device that
 * holds the buffers. The CPU trainer plugs in zero1_device_cpu (plain loops, OpenMP); a
 * GPU trainer plugs in kernels on its streams. The runtime itself never touches buffer
 * memory, so the same state machine drives both.
 *
 * Buffers are addressed as base pointer + element offset; "param" buffers are fp32 or
 * bf16 (Zero1Dtype), grads are always fp32 (the backward accumulates in fp32).
 */
#ifndef ZERO1_DEVICE_OPS_H
#define ZERO1_DEVICE_OPS_H

#include <stddef.h>

#include "llmc/adamw.h"
#include "zero1/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void* (*alloc)(size_t bytes);  // zero-filled
    void (*free)(void* p);
    void (*zero)(void* p, size_t bytes);
    // Copies bytes; either side may be device or host memory (checkpoints move state to the host).
    void (*copy)(void* dst, const void* src, size_t bytes);
    // dst[i] = (dst dtype) src[i] for n elements, between fp32 and bf16 in either direction.
    void (*convert)(void* dst, Zero1Dtype dst_type, const void* src, Zero1Dtype src_type, size_t n);
    // Index of the first non-finite value of an fp32 range, or -1.
    long long (*first_nonfinite)(const float* x, size_t n);
    double (*sum_squares)(const float* x, size_t n);
    // AdamW on n elements. master may be NULL (fp32 params: the param buffer is the master);
    // otherwise master is updated and the param buffer receives its value in param_type.
    void (*adamw)(void* params, Zero1Dtype param_type, float* master, const float* grads, float* m, float* v,
                  size_t n, const AdamWStep* s, int decays);
} Zero1DeviceOps;

extern const Zero1DeviceOps zero1_device_cpu;

#ifdef __cplusplus
}
#endif
#endif
