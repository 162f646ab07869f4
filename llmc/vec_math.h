/*
 * What lets the CPU kernels' elementwise loops vectorise without -ffast-math (which we
 * avoid so that results can be compared with PyTorch): an exp that vectorises, and the
 * GCC option it and its callers need.
 *
 * GCC keeps float compares as branches (and the loops scalar) while it must assume that
 * they may trap. -fno-trapping-math drops only that assumption about FP exceptions (which
 * nothing here reads); it changes no result, so it is enabled around these kernels only.
 * A function inlines into another only with the same options, so a kernel that calls
 * vec_expf sits between LLMC_VECTORIZE_BEGIN and LLMC_VECTORIZE_END as vec_expf does.
 * (sqrtf's errno cannot be dropped the same way: the Makefile's -fno-math-errno does it.)
 */
#ifndef LLMC_VEC_MATH_H
#define LLMC_VEC_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define LLMC_VECTORIZE_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"no-trapping-math\")")
#define LLMC_VECTORIZE_END _Pragma("GCC pop_options")
#else
#define LLMC_VECTORIZE_BEGIN
#define LLMC_VECTORIZE_END
#endif

#ifdef __cplusplus
extern "C" {
#endif

LLMC_VECTORIZE_BEGIN

// exp(x) in fp32, within ~1 ulp of expf, branch-free so loops using it vectorise.
// x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2_hi is exact), then exp(r) by
// a degree-6 minimax polynomial (Cephes' coefficients), times 2^n built in the exponent
// bits. 2^n is applied as two halves so results in the denormal range and overflow to
// +inf come out of the multiplication itself, with no special cases.
static inline float vec_expf(float x) {
    x = x < -104.0f ? -104.0f : x;  // exp(-104) underflows to 0 already
    x = x > 89.0f ? 89.0f : x;      // exp(89) overflows to +inf already
    // round x/ln2 to the nearest integer: adding 1.5*2^23 pushes the fraction bits out
    const float shifter = 12582912.0f;
    float n = (x * 1.44269504f + shifter) - shifter;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n;
    int32_t n1 = ni / 2;
    int32_t b1 = (n1 + 127) << 23;
    int32_t b2 = (ni - n1 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}

LLMC_VECTORIZE_END

#ifdef __cplusplus
}
#endif
#endif
