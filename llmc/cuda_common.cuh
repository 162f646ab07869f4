/*
 * Shared CUDA pieces for the GPU trainer: the compute dtype, checked wrappers that
 * report file:line, reductions, and the library handles (cuBLAS, cuBLASLt).
 *
 * PRECISION (Makefile) picks floatX, the dtype of parameters and activations:
 *   -DENABLE_BF16 (default): __nv_bfloat16 storage, fp32 accumulation everywhere.
 *   -DENABLE_FP32: plain float, no TF32, for the tight oracle test.
 * Gradients of parameters are always fp32 (views into the fp32 grad buffer), and so
 * are the LayerNorm statistics, the losses and every reduction.
 *
 * Packed128<T>: 16 bytes of T (8 bf16 or 4 floats), loaded and stored with one 128-bit
 * access. Elementwise kernels give each thread one pack's worth of elements and take the
 * 128-bit path only where every pointer involved is 16-byte aligned and the pack lies
 * inside the range; otherwise (views into the flat param/grad buffers need not be
 * aligned, a tail shorter than a pack) the same elements go one at a time. The values
 * and the order of the math per element are the same either way: only the access width
 * differs.
 */
#ifndef LLMC_CUDA_COMMON_CUH
#define LLMC_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "llmc/utils.h"

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#define FLOATX_IS_BF16 0
#define CUBLAS_FLOATX CUDA_R_32F
#else
#ifndef ENABLE_BF16
#define ENABLE_BF16
#endif
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#define FLOATX_IS_BF16 1
#define CUBLAS_FLOATX CUDA_R_16BF
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define WARP_SIZE 32

// ----------------------------------------------------------------------------
// Checked wrappers: every failure names the call site, then ends the program.

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fatal("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

static inline void cublas_check(cublasStatus_t st, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) fatal("cuBLAS error %d (%s) at %s:%d", (int)st, cublasGetStatusString(st), file, line);
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// Kernel launches report errors lazily; check the launch itself right away (no sync).
#define cudaCheckLaunch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

static inline void* cuda_malloc_check(size_t bytes, const char* file, int line) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
        fatal("out of GPU memory allocating %.1f MiB (%s) at %s:%d", bytes / 1048576.0, cudaGetErrorString(err), file, line);
    }
    return p;
}
#define cudaMallocCheck(bytes) cuda_malloc_check((bytes), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// Conversions and reductions

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ double warp_reduce_sum_double(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// A reduction over a whole block (blockDim.x a multiple of 32, <= 1024) by warp_reduce, with
// `empty` for the lanes past the last warp; every thread gets the result. The tree has a
// fixed shape, so the result is the same on every run. Each instance has its own shared array.
template <typename T, T (*warp_reduce)(T)>
__device__ inline T block_reduce(T v, T empty) {
    __shared__ T shared[32];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nwarps = blockDim.x / WARP_SIZE;
    v = warp_reduce(v);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : empty;
    return warp_reduce(v);
}
__device__ inline float block_reduce_sum(float v) { return block_reduce<float, warp_reduce_sum>(v, 0.0f); }
__device__ inline float block_reduce_max(float v) { return block_reduce<float, warp_reduce_max>(v, -INFINITY); }
__device__ inline double block_reduce_sum_double(double v) {
    return block_reduce<double, warp_reduce_sum_double>(v, 0.0);
}

// ----------------------------------------------------------------------------
// 128-bit packs (header comment).

template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = (int)(16 / sizeof(T));
    T v[16 / sizeof(T)];
};
#define PACK_X Packed128<floatX>::size  // floatX elements per pack: 8 (bf16) or 4 (fp32)
// 4 elements of T: the floatX that go with one 128-bit pack of fp32 (8 bytes of bf16).
template <typename T>
struct alignas(4 * sizeof(T)) Packed4 {
    T v[4];
};

// Only for 16-byte aligned p (aligned16).
template <typename T> __device__ __forceinline__ Packed128<T> load128(const T* p) {
    return *reinterpret_cast<const Packed128<T>*>(p);
}
template <typename T> __device__ __forceinline__ void store128(T* p, const Packed128<T>& x) {
    *reinterpret_cast<Packed128<T>*>(p) = x;
}
// STEP elements of x at c: PACK_X (a 128-bit pack, x + c 16-byte aligned) or 1. STEP is a
// compile-time width, so the pack's elements stay in registers (a run-time one makes nvcc
// copy the pack to local memory to index it).
template <int STEP>
__device__ __forceinline__ Packed128<floatX> load_pack_or_one(const floatX* x, int c) {
    if (STEP == PACK_X) return load128(x + c);
    Packed128<floatX> p;
    p.v[0] = x[c];
    return p;
}
template <int STEP>
__device__ __forceinline__ void store_pack_or_one(floatX* x, int c, const Packed128<floatX>& p) {
    if (STEP == PACK_X) store128(x + c, p);
    else x[c] = p.v[0];
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }
// Blocks of `threads` threads for n floatX elements, one pack per thread.
static inline unsigned packed_blocks(size_t n, int threads) { return (unsigned)CEIL_DIV(CEIL_DIV(n, (size_t)PACK_X), (size_t)threads); }

// ----------------------------------------------------------------------------
// Library handles: one set per process, bound to the one compute stream per call.

// A cuBLASLt plan (llmc/matmul.cuh makes them): what cublasLtMatmul needs besides the data
// pointers, for one key. The key is everything the descriptors and the heuristic's choice
// depend on; bias and aux pointers are set per call, their alignment is in the key.
typedef struct {
    int m, n, k, trans_a, trans_b, epilogue, d_type, bias_type, beta_zero;
    int align[6];  // bytes, as the heuristic was told: A, B, C, D, bias, aux
} MatmulPlanKey;

typedef struct {
    MatmulPlanKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;
    int found;  // 0: the heuristic had no algorithm (fused epilogues then run separate kernels)
    int noted;  // that has been said once
} MatmulPlan;

typedef struct {
    cublasHandle_t cublas;        // strided-batched gemms of attention
    cublasLtHandle_t cublaslt;    // every Linear layer
    void* lt_workspace;
    size_t lt_workspace_size;
    // cuBLASLt plans, made on first use: a growable array of pointers (each plan stays put).
    // Growable because the number of keys depends on the model and the buffer layout (the
    // views' alignments), not on a bound we could name; it stops growing after the first step.
    MatmulPlan** plans;
    int num_plans, cap_plans;
    long heuristic_calls;         // cublasLtMatmulAlgoGetHeuristic calls so far (tests read it)
    int num_sms;
    char device_name[256];
} CudaLibs;

static CudaLibs cuda_libs;

// The GPUs this process can use; with none, 0 and *why_none: the runtime's reason, or "0 devices".
static inline int cuda_device_count(const char** why_none) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return count;
    *why_none = err != cudaSuccess ? cudaGetErrorString(err) : "0 devices";
    return 0;
}

// Picks the GPU for this local rank. Without one, ends with one clear message: a driver
// older than the CUDA the binary was built with (CUDART_VERSION) is told apart from no GPU
// (docs/gpu.md, "The first GPU run").
static inline void cuda_select_device(int local_rank) {
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (driver == 0) {
        fatal("no NVIDIA driver found (libcuda.so.1 could not be loaded): train_gpt2cu needs an NVIDIA GPU and its "
              "driver; use ./train_gpt2 on the CPU");
    }
    if (driver / 1000 < CUDART_VERSION / 1000) {
        fatal("the NVIDIA driver supports CUDA %d.%d, but train_gpt2cu was built with CUDA %d.%d: update the driver "
              "(CUDA 13 needs R580 or newer) or build with a CUDA toolkit no newer than %d.x (CUDA_HOME=...)",
              driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, driver / 1000);
    }
    const char* why_none = NULL;
    int count = cuda_device_count(&why_none);
    if (count == 0) {
        fatal("no usable CUDA GPU (%s; driver CUDA %d.%d, built with CUDA %d.%d): train_gpt2cu needs an NVIDIA GPU; "
              "use ./train_gpt2 on the CPU",
              why_none, driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    }
    cudaCheck(cudaSetDevice(local_rank % count));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, local_rank % count));
    cuda_libs.num_sms = prop.multiProcessorCount;
    snprintf(cuda_libs.device_name, sizeof(cuda_libs.device_name), "%s", prop.name);
}

static inline void cuda_libs_init(void) {
    cublasCheck(cublasCreate(&cuda_libs.cublas));
    // No TF32: the FP32 build must match PyTorch's fp32 closely; BF16 inputs are
    // unaffected by this flag.
    cublasCheck(cublasSetMathMode(cuda_libs.cublas, CUBLAS_DEFAULT_MATH));
    cublasCheck(cublasLtCreate(&cuda_libs.cublaslt));
    cuda_libs.lt_workspace_size = 32u << 20;  // what Hopper's fastest kernels ask for
    cuda_libs.lt_workspace = cudaMallocCheck(cuda_libs.lt_workspace_size);
}

static inline void cuda_libs_free(void) {
    for (int i = 0; i < cuda_libs.num_plans; i++) {
        MatmulPlan* p = cuda_libs.plans[i];
        cublasCheck(cublasLtMatmulPreferenceDestroy(p->pref));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
        free(p);
    }
    free(cuda_libs.plans);
    cuda_libs.plans = NULL;
    cuda_libs.num_plans = cuda_libs.cap_plans = 0;
    cudaCheck(cudaFree(cuda_libs.lt_workspace));
    cublasCheck(cublasLtDestroy(cuda_libs.cublaslt));
    cublasCheck(cublasDestroy(cuda_libs.cublas));
}

#endif
