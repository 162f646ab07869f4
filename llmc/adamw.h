/*
 * AdamW, one element at a time. The same static inline function runs in the CPU
 * trainer, in the zero1/ shard update and (as __host__ __device__) in the CUDA kernels,
 * so every path applies the same formula. Its bits are the same where it is compiled
 * alike: the CPU trainer and zero1/ on either device (zero1/'s CUDA objects are built
 * without fused multiply-adds or fast math for that). The GPU trainer's replicated update
 * (llmc/adamw.cuh) is compiled as the trainer is, with nvcc's contraction of a*b+c and, in
 * BF16, --use_fast_math's approximate division and square root: on a GPU it agrees with
 * the others to rounding, not bit for bit.
 *
 * PyTorch semantics (decoupled weight decay, applied before the moment update):
 *   p -= lr*wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 */
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "llmc/bf16.h"

#ifdef __CUDACC__
#define LLMC_HOST_DEVICE __host__ __device__
#else
#define LLMC_HOST_DEVICE
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;       // applied only where the caller says the tensor decays
    float beta1_correction;   // 1 - beta1^t
    float beta2_correction;   // 1 - beta2^t
    float grad_scale;         // clipping factor (1 when not clipping)
    // The write-back of the fp32 master into bf16 params (adamw_round_bf16):
    int step;                 // t, the 1-based step (the stochastic rounding's bits depend on it)
    int stochastic;           // 0: round to nearest even; 1: stochastic rounding
    uint64_t rounding_seed;   // --seed, for the stochastic rounding's bits
} AdamWStep;

static inline AdamWStep adamw_step_params(float lr, float beta1, float beta2, float eps, float weight_decay,
                                          int t, float grad_scale) {
    AdamWStep s;
    s.lr = lr;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.eps = eps;
    s.weight_decay = weight_decay;
    s.beta1_correction = 1.0f - powf(beta1, (float)t);
    s.beta2_correction = 1.0f - powf(beta2, (float)t);
    s.grad_scale = grad_scale;
    s.step = t;
    s.stochastic = 0;
    s.rounding_seed = 0;
    return s;
}

// --stochastic-rounding: the bf16 write-back of this step rounds stochastically.
static inline void adamw_step_stochastic(AdamWStep* s, int stochastic, uint64_t seed) {
    s->stochastic = stochastic;
    s->rounding_seed = seed;
}

// The updated master x of the element at index `element` in model space (its parameter's
// offset in definition order plus its index inside it), rounded into a bf16 param: to
// nearest even, or stochastically with bits that depend only on (seed, step, element), so
// that any DP, bucket layout, device or trainer, and a resume, store the same bits for the
// same master value.
LLMC_HOST_DEVICE static inline bf16_bits adamw_round_bf16(float x, const AdamWStep* s, size_t element) {
    if (!s->stochastic) return float_to_bf16(x);
    return float_to_bf16_stochastic(x, stochastic_rounding_bits(s->rounding_seed, (uint64_t)s->step, element));
}

// Returns the updated parameter; m and v are updated in place.
LLMC_HOST_DEVICE static inline float adamw_element(float param, float grad, float* m, float* v,
                                                   const AdamWStep* s, int decays) {
    float g = grad * s->grad_scale;
    if (decays) param -= s->lr * s->weight_decay * param;
    float m_new = s->beta1 * (*m) + (1.0f - s->beta1) * g;
    float v_new = s->beta2 * (*v) + (1.0f - s->beta2) * g * g;
    *m = m_new;
    *v = v_new;
    float m_hat = m_new / s->beta1_correction;
    float v_hat = v_new / s->beta2_correction;
    return param - s->lr * m_hat / (sqrtf(v_hat) + s->eps);
}

// A contiguous run of one tensor (or a piece of it): the CPU loop.
static inline void adamw_update_range(float* params, const float* grads, float* m, float* v, size_t n,
                                      const AdamWStep* s, int decays) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        params[i] = adamw_element(params[i], grads[i], &m[i], &v[i], s, decays);
    }
}

#ifdef __cplusplus
}
#endif
#endif
