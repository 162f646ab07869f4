/*
 * AdamW on the GPU: fp32 master weights, m, v; the updated master is rounded once into
 * the floatX param buffer (bf16: llmc/adamw.h's adamw_round_bf16, round-to-nearest-even
 * or --stochastic-rounding, with each element's model-space index). The per-element arithmetic is
 * adamw_element() from llmc/adamw.h, the very function the CPU trainer and zero1/ use.
 * The clip factor is read from device memory (written by global_norm), so the update
 * is queued without the host waiting for the norm.
 */
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "llmc/adamw.h"
#include "llmc/cuda_common.cuh"

// The write-back of a master value into a param; element: its model-space index.
__device__ __forceinline__ void store_rounded(float* p, float x, const AdamWStep& s, size_t element) { *p = x; }
__device__ __forceinline__ void store_rounded(__nv_bfloat16* p, float x, const AdamWStep& s, size_t element) {
    *(bf16_bits*)p = adamw_round_bf16(x, &s, element);
}

// model: the model-space index of element 0 (the range's dense canonical offset).
__global__ void adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                             size_t model, AdamWStep s, const float* grad_scale, int decays) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    s.grad_scale = grad_scale[0];
    float p = adamw_element(master[i], grads[i], &m[i], &v[i], &s, decays);
    master[i] = p;
    store_rounded(&params[i], p, s, model + i);
}

// One contiguous range (a tensor or a piece of one) starting at model-space index model;
// decays says whether weight decay applies.
static void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                         size_t model, const AdamWStep* s, const float* grad_scale, int decays, cudaStream_t stream) {
    if (n == 0) return;
    adamw_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(params, master, grads, m, v, n, model, *s, grad_scale,
                                                                 decays);
    cudaCheckLaunch();
}

// params = the master as step s's write-back rounds it (params and master dense canonical,
// from model-space index 0): after loading weights (a step-0 AdamWStep rounds to nearest)
// or a resume (the checkpoint's step).
__global__ void copy_master_to_params_kernel(floatX* params, const float* master, size_t n, AdamWStep s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_rounded(&params[i], master[i], s, i);
}

static void copy_master_to_params(floatX* params, const float* master, size_t n, const AdamWStep* s,
                                  cudaStream_t stream) {
    copy_master_to_params_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(params, master, n, *s);
    cudaCheckLaunch();
}

#endif
