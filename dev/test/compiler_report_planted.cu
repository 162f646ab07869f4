// Small kernels for dev/test/test_compiler_report.sh: built as they are, each passes
// dev/test/check_compiler_report.py against dev/test/compiler_report_planted_budgets.txt;
// each PLANT_* macro plants one fault the report must fail on. Compiled only (sm_90), never run.
#include <cuda_bf16.h>
#include <mma.h>

// Live values a thread keeps across a loop of run-time length: K of them need K registers.
template <int K>
__device__ __forceinline__ float keep_live(const float* in, int n) {
    float acc[K];
#pragma unroll
    for (int k = 0; k < K; k++) acc[k] = in[threadIdx.x + k * 1024];
    for (int i = 0; i < n; i++) {
#pragma unroll
        for (int k = 0; k < K; k++) acc[k] = acc[k] * acc[(k + 1) % K] + 1.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) s += acc[k];
    return s;
}

// A large array in registers under the 64 registers a 1024-thread block leaves each thread:
// with PLANT_SPILL it outgrows them and ptxas spills.
#ifdef PLANT_SPILL
#define SPILL_VALUES 96
#else
#define SPILL_VALUES 24
#endif
__global__ void __launch_bounds__(1024) planted_spill_kernel(float* out, const float* in, int n) {
    out[threadIdx.x] = keep_live<SPILL_VALUES>(in, n);
}

// Launched with 1024 threads (the budget says so) and no __launch_bounds__: with
// PLANT_WIDE it takes 80 registers (nvcc 13), 80 x 1024 more than an SM has: the launch fails.
#ifdef PLANT_WIDE
#define WIDE_VALUES 74
#else
#define WIDE_VALUES 24
#endif
__global__ void planted_wide_kernel(float* out, const float* in, int n) {
    out[threadIdx.x] = keep_live<WIDE_VALUES>(in, n);
}

// LayerNorm's pattern: a 128-bit pack of 8 bf16, or one element where the row is not
// aligned. A loop over the pack whose bound is known at run time indexes it, so nvcc puts
// the pack in local memory (PLANT_LOCAL_PACK); a fixed trip count keeps it in registers.
struct alignas(16) Pack8 {
    __nv_bfloat16 v[8];
};
__global__ void planted_pack_kernel(float* out, const __nv_bfloat16* x, int C, int vec) {
    const int step = vec ? 8 : 1;
    float sum = 0.0f;
    for (int c = threadIdx.x * step; c < C; c += blockDim.x * step) {
        Pack8 p;
        if (vec) p = *reinterpret_cast<const Pack8*>(x + c);
        else p.v[0] = x[c];
#ifdef PLANT_LOCAL_PACK
        for (int k = 0; k < step; k++) sum += __bfloat162float(p.v[k]);
#else
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (k < step) sum += __bfloat162float(p.v[k]);
        }
#endif
    }
    out[threadIdx.x] = sum;
}

// A 16x16x16 bf16 product on the tensor cores (HMMA), or (PLANT_NO_TENSOR_CORES) the same
// sum on the CUDA cores.
__global__ void __launch_bounds__(32) planted_mma_kernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b) {
#ifdef PLANT_NO_TENSOR_CORES
    for (int i = threadIdx.x; i < 256; i += 32) {
        float s = 0.0f;
        for (int k = 0; k < 16; k++) s += __bfloat162float(a[i / 16 * 16 + k]) * __bfloat162float(b[k * 16 + i % 16]);
        c[i] = s;
    }
#else
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
#endif
}

// A packed copy: 128-bit loads and stores, or (PLANT_SCALAR_COPY) 2 bytes at a time.
__global__ void planted_copy_kernel(__nv_bfloat16* out, const __nv_bfloat16* in, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 > n) return;
#ifdef PLANT_SCALAR_COPY
    for (int k = 0; k < 8; k++) out[i + k] = in[i + k];
#else
    *reinterpret_cast<Pack8*>(out + i) = *reinterpret_cast<const Pack8*>(in + i);
#endif
}
