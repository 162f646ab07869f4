/*
 * Residual add: out = a + b (fp32 math, one rounding to floatX).
 */
#ifndef LLMC_RESIDUAL_CUH
#define LLMC_RESIDUAL_CUH

#include "llmc/cuda_common.cuh"

__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<floatX>(to_float(a[i]) + to_float(b[i]));
}

static void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n, cudaStream_t stream) {
    residual_forward_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(out, a, b, n);
    cudaCheckLaunch();
}

#endif
