/*
 * The CPU execution layer's GPU numerics (make CUDA_CPU_NUMERICS=gpu; cuda_cpu/numerics.cpp)
 * against values worked out by hand: make -C cuda_cpu tests (always built
 * with the numerics: this file with --use_fast_math, numerics_precise.cu with -fmad=false and
 * without it, as zero1/'s CUDA objects).
 *
 * The definitions: nvcc contracts a*b+c into one fused multiply-add (-fmad=true, its
 * default); --use_fast_math flushes denormal inputs and results to zero, maps expf and logf
 * to __expf and __logf, tanhf to tanh.approx and sqrtf to sqrt.approx; the CUDA C++
 * Programming Guide's maximum errors, in ulps of the correctly rounded result: expf 2, logf
 * 1, tanhf 2, rsqrtf 2, sqrtf 0, __expf 2 + floor(|1.173 x|), __logf 3 (absolute 2^-21.41 on
 * [0.5, 2]), __fdividef 2 (0 for 2^126 < |y| < 2^128); the PTX ISA's relative errors:
 * tanh.approx 2^-11 (subnormal inputs passed through), sqrt.approx 2^-23. The layer gives
 * each function its full error, up or down. The
 * correctly rounded float values below are e = 0x402df854, exp(-10) = 0x383e6bce, ln 8 =
 * 0x40051592, ln 1.5 = 0x3ecf991f, sqrt 2 = 0x3fb504f3, 1/3 = 0x3eaaaaab, tanh 0.5 =
 * 0x3eec9a9f, 1/sqrt 4 = 0x3f000000. Prints TAP (tests/tap.h).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda_cpu/tests/layer_test.h"
#include "cuda_cpu/tests/two_workers.cuh"

void run_precise_math(float* out, const float* in, float a, float b, float c, float x, float y);  // numerics_precise.cu
void run_precise_denormal_on_two_workers(float* out, const float* in, int* arrived);              // numerics_precise.cu

// Until the helpers' sitting out (at most 1 s) is over: the work before done, then 1.1 s.
static void sit_out_over(void) {
    cudaDeviceSynchronize();
    usleep(1100000);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
// Steps of the float grid from the correctly rounded value (positive values).
static long steps(float r, uint32_t correct) { return (long)bits(r) - (long)correct; }

__global__ void fast_math(float* out, const float* in, float a, float b, float c, float x, float y) {
    out[0] = a * b + c;
    out[1] = x * y;
    out[2] = in[10] * in[11];  // a denormal times 1
    out[3] = __expf(in[0]);
    out[4] = expf(in[0]);
    out[5] = __expf(in[1]);
    out[6] = __logf(in[2]);
    out[7] = __logf(in[3]);
    out[8] = __fdividef(in[4], in[5]);
    out[9] = in[4] / in[5];
    out[10] = __fdividef(1.0f, in[6]);
    out[11] = sqrtf(in[7]);
    out[12] = tanhf(in[8]);
    out[13] = rsqrtf(in[9]);
    out[14] = logf(in[3]);
    out[15] = tanhf(in[10]);
}

__global__ void expf_sweep(float* out, const float* in) { out[threadIdx.x] = __expf(in[threadIdx.x]); }

int main() {
    setenv("CUDA_CPU_BLOCK_WORKERS", "2", 1);  // read at the first launch
    setenv("CUDA_CPU_ORDER", "forward", 1);
    float *d_in, *d_out, *d_precise, *d_sweep;
    cudaMalloc(&d_in, 64 * sizeof(float));
    cudaMalloc(&d_out, 64 * sizeof(float));
    cudaMalloc(&d_precise, 64 * sizeof(float));
    cudaMalloc(&d_sweep, 64 * sizeof(float));
    // in: 1, -10, 1.5, 8, 2^100, 2^127, 3, 2, 0.5, 4, 2^-130, 1
    float in[64] = {1.0f, -10.0f, 1.5f, 8.0f, 0x1p100f, 0x1p127f, 3.0f, 2.0f, 0.5f, 4.0f, 0x1p-130f, 1.0f};
    cudaMemcpy(d_in, in, sizeof(in), cudaMemcpyHostToDevice);
    // a = b = 1 + 2^-12, c = -(1 + 2^-11): a*b = 1 + 2^-11 + 2^-24 exactly, which rounds (a tie,
    // to even) to 1 + 2^-11: 0 unfused, 2^-24 fused. x*y = 2^-126 * 0.5 = 2^-127, a denormal.
    float a = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f), x = 0x1p-126f, y = 0.5f;
    fast_math<<<1, 1>>>(d_out, d_in, a, a, c, x, y);
    float pin[5] = {1.0f, 8.0f, 0.5f, 2.0f, 4.0f};
    float* d_pin;
    cudaMalloc(&d_pin, sizeof(pin));
    cudaMemcpy(d_pin, pin, sizeof(pin), cudaMemcpyHostToDevice);
    run_precise_math(d_precise, d_pin, a, a, c, x, y);
    float sweep_in[64];
    for (int k = 0; k < 64; k++) sweep_in[k] = (float)k / 8.0f - 4.0f;
    cudaMemcpy(d_in + 0, sweep_in, sizeof(sweep_in), cudaMemcpyHostToDevice);  // after fast_math (stream order)
    expf_sweep<<<1, 64>>>(d_sweep, d_in);
    float out[64], precise[64], sweep[64], again[64];
    cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost);
    cudaMemcpy(precise, d_precise, sizeof(precise), cudaMemcpyDeviceToHost);
    cudaMemcpy(sweep, d_sweep, sizeof(sweep), cudaMemcpyDeviceToHost);
    expf_sweep<<<1, 64>>>(d_sweep, d_in);
    cudaMemcpy(again, d_sweep, sizeof(again), cudaMemcpyDeviceToHost);
    check(cudaDeviceSynchronize() == cudaSuccess, "the kernels run");

    check(out[0] == 0x1p-24f, "contraction: a*b+c is one fused multiply-add (2^-24, not 0)");
    check(precise[0] == 0.0f, "-fmad=false: a*b+c is rounded twice (0)");
    check(out[1] == 0.0f && bits(precise[1]) == 0x00400000u,
          "--use_fast_math flushes a denormal result (2^-126 * 0.5 = 0); without it 2^-127");
    check(out[2] == 0.0f, "--use_fast_math flushes a denormal input (2^-130 * 1 = 0)");

    long e1 = steps(out[3], 0x402df854u), e10 = steps(out[5], 0x383e6bceu);
    check((e1 == 3 || e1 == -3) && (e10 == 13 || e10 == -13),
          "__expf: 2 + floor(|1.173 x|) ulps from the correctly rounded value (3 at x = 1, 13 at x = -10)");
    check(bits(out[4]) == bits(out[3]), "--use_fast_math: expf is __expf");
    long pe = steps(precise[2], 0x402df854u);
    check(pe == 2 || pe == -2, "expf without fast math: 2 ulps (x = 1)");
    double err15 = fabs((double)out[6] - 0.4054651081081644);
    check(err15 <= exp2(-21.41) && bits(out[6]) != 0x3ecf991fu,
          "__logf on [0.5, 2]: an absolute error within 2^-21.41 (x = 1.5), not the correctly rounded value");
    long l8 = steps(out[7], 0x40051592u), pl8 = steps(precise[3], 0x40051592u);
    check((l8 == 3 || l8 == -3) && bits(out[14]) == bits(out[7]), "__logf elsewhere: 3 ulps (x = 8); logf is __logf");
    check(pl8 == 1 || pl8 == -1, "logf without fast math: 1 ulp (x = 8)");
    check(out[8] == 0.0f && out[9] == 0x1p-27f,
          "__fdividef(2^100, 2^127) = 0 (documented for 2^126 < |y| < 2^128); the division operator: 2^-27");
    long d3 = steps(out[10], 0x3eaaaaabu);
    check(d3 == 2 || d3 == -2, "__fdividef(1, 3): 2 ulps");
    // sqrt 2 = 1.41421356: the correctly rounded 0x3fb504f3 is 2.4e-8 below; 2^-23 relative is
    // 1.69e-7, which the floats one step either side are within and two steps are not.
    long s2 = steps(out[11], 0x3fb504f3u);
    check((s2 == 1 || s2 == -1) && bits(precise[5]) == 0x3fb504f3u,
          "sqrtf: sqrt.approx with fast math (one float away at sqrt 2), exact without");
    double t5 = tanh(0.5), terr = fabs((double)out[12] - t5), tbound = exp2(-11) * t5;
    long pt5 = steps(precise[4], 0x3eec9a9fu);
    check(terr <= tbound && terr > 0.99 * tbound && (pt5 == 2 || pt5 == -2),
          "tanhf: tanh.approx's 2^-11 relative with fast math, 2 ulps without (x = 0.5)");
    check(bits(out[15]) == 0x00080000u, "tanh.approx passes a subnormal input through (2^-130), ftz or not");
    long r4 = steps(out[13], 0x3f000000u), pr4 = steps(precise[6], 0x3f000000u);
    check((r4 == 2 || r4 == -2) && (pr4 == 2 || pr4 == -2), "rsqrtf: 2 ulps (x = 4)");

    int up = 0, down = 0, all_at_bound = 1, same = 1;
    for (int k = 0; k < 64; k++) {
        double exact = exp((double)sweep_in[k]);
        long bound = 2 + (long)floor(fabs(1.173 * sweep_in[k]));
        long s = steps(sweep[k], bits((float)exact));
        if (s == bound) up++;
        else if (s == -bound) down++;
        else all_at_bound = 0;
        same &= bits(again[k]) == bits(sweep[k]);
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "__expf on 64 inputs in [-4, 4): each at its bound, %d up and %d down", up, down);
    check(all_at_bound && up > 0 && down > 0, msg);
    check(same, "the same input gives the same bits in another launch (a fixed function, as a GPU's)");
    volatile float one = 1.0f, two = 2.0f;
    check(bits(expf(one)) == 0x402df854u && bits(sqrtf(two)) == 0x3fb504f3u,
          "host code keeps glibc's expf and sqrtf (nvcc's flags are the device code's)");
    // Blocks at once on two workers: 2^-130 * 1 in each, from the translation units with
    // flushing, without it, then with it again (each worker flushes for its blocks only).
    float den[2] = {0x1p-130f, 1.0f}, got[3][4];
    float *d_den, *d_got;
    int* d_arrived;
    cudaMalloc(&d_den, sizeof(den));
    cudaMalloc(&d_got, sizeof(got));
    cudaMalloc(&d_arrived, 3 * sizeof(int));
    cudaMemcpy(d_den, den, sizeof(den), cudaMemcpyHostToDevice);
    cudaMemset(d_arrived, 0, 3 * sizeof(int));
    // After a launch that waited for a preempted helper the helpers sit out up to 1 s
    // (docs/cuda_cpu.md, Kernels), and a lone worker's block 0 would wait its minute in vain.
    sit_out_over();
    denormal_on_two_workers<<<2, 1>>>(d_got, d_den, d_arrived);
    sit_out_over();
    run_precise_denormal_on_two_workers(d_got + 4, d_den, d_arrived + 1);
    sit_out_over();
    denormal_on_two_workers<<<2, 1>>>(d_got + 8, d_den, d_arrived + 2);
    cudaMemcpy(got, d_got, sizeof(got), cudaMemcpyDeviceToHost);
    int met = 1;
    for (int k = 0; k < 3; k++) met &= got[k][2] == 1.0f && got[k][3] == 1.0f;
    int flushed = got[0][0] == 0.0f && got[0][1] == 0.0f && got[1][0] == 0x1p-130f && got[1][1] == 0x1p-130f &&
                  got[2][0] == 0.0f && got[2][1] == 0.0f;
    check(met && flushed, "two blocks at once on two block workers: --use_fast_math's kernels flush in both (0), the "
          "other in neither (2^-130), between them");
    for (int k = 0; k < 3 && !(met && flushed); k++) {
        printf("# launch %d: products %a %a, met %g %g\n", k, got[k][0], got[k][1], got[k][2], got[k][3]);
    }
    return done_testing();
}
