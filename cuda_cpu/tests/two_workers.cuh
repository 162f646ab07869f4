/*
 * cuda_cpu/tests/two_workers.cuh: kernels that run their blocks at once on block workers of
 * their own (CUDA_CPU_BLOCK_WORKERS), for the layer's tests (test_layer.cu, test_numerics.cu
 * and its second translation unit).
 */
#ifndef CUDA_CPU_TESTS_TWO_WORKERS_H
#define CUDA_CPU_TESTS_TWO_WORKERS_H

#define CUDA_CPU_TEST_MINUTE (60LL * 1980000000LL)  // clock64's emulated SM clock: 1.98 GHz

// The block arrives and waits (at most `cycles` of clock64) until every block of the grid has:
// whether they all had (were in flight at once).
static __device__ int meet_all(int* arrived, long long cycles) {
    atomicAdd(arrived, 1);
    long long start = clock64();
    while (atomicAdd(arrived, 0) < (int)gridDim.x && clock64() - start < cycles) {
    }
    return atomicAdd(arrived, 0) == (int)gridDim.x;
}

// <<<2, 1>>>: the two blocks meet, then each multiplies a denormal by 1 (in[0] * in[1]):
// out[b] the product, out[2 + b] whether they met. Flushing denormals is each worker
// thread's own setting, and each translation unit's (--use_fast_math).
static __global__ void denormal_on_two_workers(float* out, const float* in, int* arrived) {
    out[2 + blockIdx.x] = meet_all(arrived, CUDA_CPU_TEST_MINUTE);
    out[blockIdx.x] = in[0] * in[1];
}

#endif
