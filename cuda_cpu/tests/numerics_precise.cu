/*
 * test_numerics.cu's second translation unit: GPU numerics without --use_fast_math and with
 * -fmad=false (as zero1/'s CUDA objects are built): no contraction, no flushing, the standard
 * functions' documented errors.
 */
#include <cuda_runtime.h>

#include "cuda_cpu/tests/two_workers.cuh"

// out[0] = a*b + c, out[1] = x*y, out[2] = expf(in[0]), out[3] = logf(in[1]),
// out[4] = tanhf(in[2]), out[5] = sqrtf(in[3]), out[6] = rsqrtf(in[4]).
__global__ void precise_math(float* out, const float* in, float a, float b, float c, float x, float y) {
    out[0] = a * b + c;
    out[1] = x * y;
    out[2] = expf(in[0]);
    out[3] = logf(in[1]);
    out[4] = tanhf(in[2]);
    out[5] = sqrtf(in[3]);
    out[6] = rsqrtf(in[4]);
}

void run_precise_math(float* out, const float* in, float a, float b, float c, float x, float y) {
    precise_math<<<1, 1>>>(out, in, a, b, c, x, y);
}

void run_precise_denormal_on_two_workers(float* out, const float* in, int* arrived) {
    denormal_on_two_workers<<<2, 1>>>(out, in, arrived);
}
