/*
 * cuda_cpu/tests/launch_resources.cuh: a kernel's launch resources as an H100 (sm_90) has
 * them, in test_layer (which includes this file: one TAP count). The limits are the CUDA
 * Runtime API's: a launch of more threads than the kernel's maxThreadsPerBlock (its
 * __launch_bounds__) fails with cudaErrorLaunchOutOfResources; dynamic shared memory above
 * maxDynamicSharedSizeBytes (48 KiB - the static size, or the cudaFuncSetAttribute opt-in)
 * with cudaErrorInvalidValue; the opt-in may not take static + dynamic past
 * cudaDevAttrMaxSharedMemoryPerBlockOptin, 232448 bytes on sm_90 (cudaErrorInvalidValue);
 * a pointer that is no kernel gives cudaErrorInvalidDeviceFunction. The static sizes below are
 * worked out from the declarations (ptxas -v on the real nvcc reports the same smem bytes).
 * The calls that pass a kernel itself (not a const void*) are cuda_runtime.h's C++ overloads:
 * this file compiling is their check.
 */
#ifndef CUDA_CPU_TESTS_LAUNCH_RESOURCES_CUH
#define CUDA_CPU_TESTS_LAUNCH_RESOURCES_CUH

#include <cuda_runtime.h>
#include <string.h>

#include "cuda_cpu/tests/layer_test.h"

__global__ void __launch_bounds__(128) bounded_128(int* out) { out[threadIdx.y * blockDim.x + threadIdx.x] = 1; }

// N threads at most; N floats of static shared memory (4N bytes).
template <int N>
__global__ void __launch_bounds__(N, 2) bounded_template(float* out) {
    __shared__ float tile[N];
    tile[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = tile[N - 1 - threadIdx.x];
}

// 40,960 bytes of static shared memory and n ints of dynamic: out[0] = sum of 0..n-1 through
// both (the static array holds 0..min(n, 10240)-1 first).
__global__ void static_40k(int* out, int n) {
    __shared__ int fixed[10240];
    extern __shared__ int dyn[];
    if (threadIdx.x == 0) {
        long long sum = 0;
        for (int i = 0; i < n; i++) dyn[i] = i;
        for (int i = 0; i < n && i < 10240; i++) fixed[i] = dyn[i];
        for (int i = 0; i < n; i++) sum += i < 10240 ? fixed[i] : dyn[i];
        out[0] = (int)sum;
    }
}

// Static shared memory in a __device__ function (4,096 bytes) besides the kernel's own (1,024):
// the layer counts the former from the kernel's first block on (docs/cuda_cpu.md).
__device__ void fill_device_shared(int* out) {
    __shared__ int part[1024];
    part[threadIdx.x] = 1;
    out[1] = part[threadIdx.x];
}
__global__ void device_shared(int* out) {
    __shared__ int own[256];
    own[threadIdx.x] = 2;
    fill_device_shared(out);
    out[0] = own[threadIdx.x];
}

static void not_a_kernel(int* out) { out[0] = 0; }

// A child process's case: a block whose static memory, __device__ functions' included, and
// dynamic memory exceed 48 KiB only as it runs: a fault (sticky), naming the kernel.
static int launch_resources_case(const char* name) {
    int* d;
    cudaMalloc(&d, 8 * sizeof(int));
    if (strcmp(name, "launch_device_shared") == 0) {
        // 1,024 + 45,000 fit 48 KiB at the launch; with the device function's 4,096 they do not.
        device_shared<<<1, 32, 45000>>>(d);
        fprintf(stderr, "launch=%s\n", cudaGetErrorName(cudaGetLastError()));
    }
    cudaError_t sync = cudaDeviceSynchronize();
    fprintf(stderr, "sync=%s\n", cudaGetErrorName(sync));
    return sync == cudaSuccess ? 0 : 3;
}

static void expect_attributes(cudaError_t got, const cudaFuncAttributes& a, int threads, size_t shared, int dynamic,
                              const char* what) {
    int ok = got == cudaSuccess && a.maxThreadsPerBlock == threads && a.sharedSizeBytes == shared &&
             a.maxDynamicSharedSizeBytes == dynamic && a.numRegs == 0;
    check(ok, what);
    if (!ok)
        printf("    %s: maxThreadsPerBlock %d sharedSizeBytes %zu maxDynamicSharedSizeBytes %d numRegs %d\n",
               cudaGetErrorName(got), a.maxThreadsPerBlock, a.sharedSizeBytes, a.maxDynamicSharedSizeBytes, a.numRegs);
}

static void test_launch_bounds(void) {
    int* d;
    cudaMalloc(&d, 1024 * sizeof(int));
    (void)cudaGetLastError();
    bounded_128<<<1, 129>>>(d);
    cudaError_t e = cudaGetLastError();
    check(e == cudaErrorLaunchOutOfResources &&
              strcmp(cudaGetErrorString(e), "too many resources requested for launch") == 0,
          "__launch_bounds__(128), a block of 129: cudaErrorLaunchOutOfResources, \"too many resources requested for "
          "launch\"");
    bounded_128<<<1, dim3(8, 32)>>>(d);
    check(cudaGetLastError() == cudaErrorLaunchOutOfResources, "  ... 8 x 32 = 256 threads: refused (the bound counts all)");
    bounded_128<<<1, dim3(4, 32)>>>(d);
    check(cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
          "  ... 4 x 32 = 128: runs (the refusals were not sticky)");
    bounded_template<64><<<1, 128>>>((float*)d);
    check(cudaGetLastError() == cudaErrorLaunchOutOfResources, "__launch_bounds__(N) of a template, N = 64, 128 threads: refused");
    bounded_template<256><<<1, 256>>>((float*)d);
    float last = 0.0f;
    cudaMemcpy(&last, (float*)d + 255, sizeof(float), cudaMemcpyDeviceToHost);
    check(cudaGetLastError() == cudaSuccess && last == 0.0f, "  ... N = 256, 256 threads: runs (out[255] = tile[0] = 0)");
    cudaFree(d);
}

static void test_shared_limits(void) {
    int* d;
    cudaMalloc(&d, 8 * sizeof(int));
    (void)cudaGetLastError();
    // 40,960 static + 8,192 dynamic = 49,152: exactly 48 KiB, the most without the opt-in.
    static_40k<<<1, 32, 8192>>>(d, 2048);
    int sum = 0;
    cudaMemcpy(&sum, d, sizeof(int), cudaMemcpyDeviceToHost);
    check(cudaGetLastError() == cudaSuccess && sum == 2048 * 2047 / 2,
          "40,960 B static + 8,192 B dynamic = 48 KiB: runs (sum 0..2047 = 2,096,128)");
    static_40k<<<1, 32, 8196>>>(d, 2049);
    check(cudaGetLastError() == cudaErrorInvalidValue, "  ... + 8,196 B dynamic, one int over 48 KiB: cudaErrorInvalidValue");
    static_40k<<<1, 32, 16384>>>(d, 4096);
    check(cudaGetLastError() == cudaErrorInvalidValue,
          "  ... + 16 KiB dynamic without cudaFuncSetAttribute: cudaErrorInvalidValue (each alone is under 48 KiB)");
    // The opt-in: static + dynamic at most 232,448 B, so 191,488 B of dynamic; one byte more is refused.
    check(cudaFuncSetAttribute(static_40k, cudaFuncAttributeMaxDynamicSharedMemorySize, 191489) == cudaErrorInvalidValue,
          "cudaFuncSetAttribute: 40,960 + 191,489 B > 232,448 (sharedMemPerBlockOptin): cudaErrorInvalidValue");
    (void)cudaGetLastError();
    check(cudaFuncSetAttribute(static_40k, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384) == cudaSuccess,
          "  ... 16,384 B: accepted");
    static_40k<<<1, 32, 16384>>>(d, 4096);
    cudaMemcpy(&sum, d, sizeof(int), cudaMemcpyDeviceToHost);
    check(cudaGetLastError() == cudaSuccess && sum == 4096 * 4095 / 2,
          "  ... then 16 KiB of dynamic runs (sum 0..4095 = 8,386,560)");
    static_40k<<<1, 32, 16388>>>(d, 4097);
    check(cudaGetLastError() == cudaErrorInvalidValue, "  ... and 4 bytes more than opted in to: cudaErrorInvalidValue");
    check(cudaFuncSetAttribute(static_40k, cudaFuncAttributeMaxDynamicSharedMemorySize, 191488) == cudaSuccess,
          "  ... 191,488 B (40,960 + 191,488 = 232,448): accepted");
    static_40k<<<1, 32, 191488>>>(d, 47872);
    cudaMemcpy(&sum, d, sizeof(int), cudaMemcpyDeviceToHost);
    check(cudaGetLastError() == cudaSuccess && sum == (int)(47872LL * 47871 / 2),
          "  ... and a block of 227 KiB in all runs (sum 0..47871 = 1,145,840,256)");
    check(cudaFuncSetAttribute(static_40k, cudaFuncAttributeMaxDynamicSharedMemorySize, -1) == cudaErrorInvalidValue,
          "cudaFuncSetAttribute: -1 bytes: cudaErrorInvalidValue");
    (void)cudaGetLastError();
    cudaFree(d);
}

static void test_attributes(void) {
    cudaFuncAttributes a;
    memset(&a, 0xff, sizeof(a));
    expect_attributes(cudaFuncGetAttributes(&a, bounded_128), a, 128, 0, 49152,
                      "cudaFuncGetAttributes(bounded_128): 128 threads, no static, 48 KiB dynamic, numRegs 0");
    expect_attributes(cudaFuncGetAttributes(&a, bounded_template<64>), a, 64, 256, 49152 - 256,
                      "  ... bounded_template<64>: 64 threads, 256 B static, 48,896 B dynamic");
    expect_attributes(cudaFuncGetAttributes(&a, bounded_template<256>), a, 256, 1024, 49152 - 1024,
                      "  ... bounded_template<256>: 256 threads, 1,024 B static, 48,128 B dynamic");
    expect_attributes(cudaFuncGetAttributes(&a, (const void*)static_40k), a, 1024, 40960, 191488,
                      "  ... static_40k (the C API): no bounds: 1024; 40,960 B static; the opt-in, 191,488 B");
    // The kernel's own 256 ints before it ran; its __device__ function's 1,024 too once it has.
    expect_attributes(cudaFuncGetAttributes(&a, device_shared), a, 1024, 1024, 48128,
                      "  ... device_shared before its first launch: its own 1,024 B static");
    int* d;
    cudaMalloc(&d, 8 * sizeof(int));
    device_shared<<<1, 32>>>(d);
    cudaDeviceSynchronize();
    expect_attributes(cudaFuncGetAttributes(&a, device_shared), a, 1024, 5120, 44032,
                      "  ... after it: 5,120 B static (the __device__ function's 4,096 learned), 44,032 dynamic");
    device_shared<<<1, 32, 45000>>>(d);
    check(cudaGetLastError() == cudaErrorInvalidValue, "  ... and 5,120 + 45,000 B is then refused at the launch");
    cudaFree(d);
    check(cudaFuncGetAttributes(&a, not_a_kernel) == cudaErrorInvalidDeviceFunction,
          "cudaFuncGetAttributes of a host function: cudaErrorInvalidDeviceFunction");
    (void)cudaGetLastError();
    check(cudaFuncSetAttribute(not_a_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 0) ==
              cudaErrorInvalidDeviceFunction,
          "cudaFuncSetAttribute of a host function: cudaErrorInvalidDeviceFunction");
    (void)cudaGetLastError();
    check(cudaFuncGetAttributes(NULL, bounded_128) == cudaErrorInvalidValue, "cudaFuncGetAttributes(NULL, ...): cudaErrorInvalidValue");
    (void)cudaGetLastError();
}

static void test_launch_resources(const char* self) {
    test_launch_bounds();
    test_shared_limits();
    test_attributes();
    char err[4096];
    int code = run_case(self, "launch_device_shared", NULL, err, sizeof(err));
    int ok = code == 3 && strstr(err, "sync=cudaErrorLaunchFailure") &&
             strstr(err, "kernel device_shared (launched at cuda_cpu/tests/launch_resources.cuh") &&
             strstr(err, "5120 bytes of static and 45000 of dynamic shared memory exceed the 48 KiB");
    check(ok, "a __device__ function's static shared memory over 48 KiB with the dynamic: a fault at its first block");
    if (!ok) printf("    exit %d, stderr:\n%s\n", code, err);
}

#endif
