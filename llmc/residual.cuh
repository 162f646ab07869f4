/*
 * Residual add: out = a + b (fp32 math, one rounding to floatX). Each thread adds one
 * 128-bit pack (PACK_X elements, llmc/cuda_common.cuh), scalar where a pointer is not
 * 16-byte aligned or for the tail of n. The residual add fused into the next LayerNorm
 * is layernorm_fused_residual_forward (llmc/layernorm.cuh).
 */
#ifndef LLMC_RESIDUAL_CUH
#define LLMC_RESIDUAL_CUH

#include "llmc/cuda_common.cuh"

__device__ __forceinline__ floatX residual_add(floatX a, floatX b) { return from_float<floatX>(to_float(a) + to_float(b)); }

// vec: every pointer 16-byte aligned (the host checks once).
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n, int vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK_X;
    if (i >= n) return;
    if (vec && i + PACK_X <= n) {
        Packed128<floatX> x = load128(a + i), y = load128(b + i), r;
        for (int k = 0; k < PACK_X; k++) r.v[k] = residual_add(x.v[k], y.v[k]);
        store128(out + i, r);
    } else {
        for (size_t j = i; j < n && j < i + PACK_X; j++) out[j] = residual_add(a[j], b[j]);
    }
}

static void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n, cudaStream_t stream) {
    int vec = aligned16(out) && aligned16(a) && aligned16(b);
    residual_forward_kernel<<<packed_blocks(n, 256), 256, 0, stream>>>(out, a, b, n, vec);
    cudaCheckLaunch();
}

#endif
