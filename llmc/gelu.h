/*
 * GELU with the tanh approximation, as GPT-2 and PyTorch's gelu(approximate='tanh'):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = s (x + k x^3),  s = sqrt(2/pi), k = 0.044715.
 *
 * Speed: glibc's tanhf is scalar and slow (~25 ns), which made this layer 6x slower than
 * PyTorch's vectorised one. We use the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)),
 * so gelu(x) = x / (1 + exp(-2u)), with an exp written so that the compiler vectorises
 * the loop (no -ffast-math needed). The identity has no cancellation: for u -> -inf,
 * exp overflows to inf and the result goes to -0, as the tanh form does.
 * The backward only gets the input, so it recomputes this one exp per element (storing it
 * in the forward would cost another B*T*4C activation buffer per layer).
 */
#ifndef LLMC_GELU_H
#define LLMC_GELU_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GELU_SCALING_FACTOR 0.7978845608028654f  // sqrt(2/pi)
#define GELU_CUBE_COEF 0.044715f

// GCC keeps the clamps below as branches (and the loops scalar) while it must assume that
// float compares may trap. -fno-trapping-math only drops that assumption about FP
// exceptions; it changes no result (unlike -ffast-math), so it is enabled here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

// exp(x) in fp32, within ~1 ulp of expf, branch-free so loops using it vectorise.
// x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2_hi is exact), then exp(r) by
// a degree-6 minimax polynomial (Cephes' coefficients), times 2^n built in the exponent
// bits. 2^n is applied as two halves so results in the denormal range and overflow to
// +inf come out of the multiplication itself, with no special cases.
static inline float gelu_expf_(float x) {
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

static void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE_COEF * x * x * x);
        out[i] = x / (1.0f + gelu_expf_(-2.0f * u));
    }
}

// dinp += gelu'(inp) * dout. With sg = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh u):
//   gelu'(x) = sg + 2 x sg (1 - sg) du/dx,   du/dx = s (1 + 3 k x^2)
static void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float x2 = x * x;
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE_COEF * x2 * x);
        float sg = 1.0f / (1.0f + gelu_expf_(-2.0f * u));
        float du = GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBE_COEF * x2);
        float g = sg + 2.0f * x * sg * (1.0f - sg) * du;
        dinp[i] += g * dout[i];
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#ifdef __cplusplus
}
#endif
#endif
