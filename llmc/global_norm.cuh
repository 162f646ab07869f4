/*
 * Global L2 norm of the fp32 grad buffer, and the clip factor, both left on the device
 * (the AdamW kernel reads the factor from there; the host reads the norm only to print).
 * Deterministic: a fixed grid (independent of the GPU) with a grid-stride loop, double
 * accumulation, per-block partials summed in block order by one final block.
 */
#ifndef LLMC_GLOBAL_NORM_CUH
#define LLMC_GLOBAL_NORM_CUH

#include "llmc/cuda_common.cuh"

#define GLOBAL_NORM_BLOCKS 512
#define GLOBAL_NORM_THREADS 512  // the block of both kernels: their __launch_bounds__ and launches

__global__ void __launch_bounds__(GLOBAL_NORM_THREADS)
    global_norm_partial_kernel(double* partial, const float* grads, size_t n) {
    double sum = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double g = grads[i];
        sum += g * g;
    }
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// norm_out[0] = sqrt(sum); scale_out[0] = clip / norm when clipping applies, else 1.
__global__ void __launch_bounds__(GLOBAL_NORM_THREADS)
    global_norm_final_kernel(float* norm_out, float* scale_out, const double* partial, int num_partials, float clip) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) sum += partial[i];
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(sum);
        norm_out[0] = norm;
        scale_out[0] = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    }
}

// scratch: GLOBAL_NORM_BLOCKS doubles.
static void global_norm(float* norm_out, float* scale_out, double* scratch, const float* grads, size_t n, float clip,
                        cudaStream_t stream) {
    global_norm_partial_kernel<<<GLOBAL_NORM_BLOCKS, GLOBAL_NORM_THREADS, 0, stream>>>(scratch, grads, n);
    cudaCheckLaunch();
    global_norm_final_kernel<<<1, GLOBAL_NORM_THREADS, 0, stream>>>(norm_out, scale_out, scratch, GLOBAL_NORM_BLOCKS,
                                                                    clip);
    cudaCheckLaunch();
}

#endif
