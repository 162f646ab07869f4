/*
 * AdamW on the GPU: fp32 master weights, m, v; the updated master is rounded once
 * (round-to-nearest-even) into the floatX param buffer. The per-element arithmetic is
 * adamw_element() from llmc/adamw.h, the very function the CPU trainer and zero1/ use.
 * The clip factor is read from device memory (written by global_norm), so the update
 * is queued without the host waiting for the norm.
 */
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "llmc/adamw.h"
#include "llmc/cuda_common.cuh"

__global__ void adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                             AdamWStep s, const float* grad_scale, int decays) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    s.grad_scale = grad_scale[0];
    float p = adamw_element(master[i], grads[i], &m[i], &v[i], &s, decays);
    master[i] = p;
    params[i] = from_float<floatX>(p);
}

// One contiguous range (a tensor or a piece of one); decays says whether weight decay applies.
static void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                         const AdamWStep* s, const float* grad_scale, int decays, cudaStream_t stream) {
    if (n == 0) return;
    adamw_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(params, master, grads, m, v, n, *s, grad_scale, decays);
    cudaCheckLaunch();
}

// params = floatX(master), e.g. after loading weights.
__global__ void copy_master_to_params_kernel(floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] = from_float<floatX>(master[i]);
}

static void copy_master_to_params(floatX* params, const float* master, size_t n, cudaStream_t stream) {
    copy_master_to_params_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(params, master, n);
    cudaCheckLaunch();
}

#endif
