/*
 * A small seeded RNG (xorshift*), so that initialisation, sampling and the data order
 * are reproducible from --seed, identical on every rank and across resumes.
 */
#ifndef LLMC_RNG_H
#define LLMC_RNG_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint32_t rng_u32(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

// Uniform in [0, 1).
static inline float rng_f32(uint64_t* state) { return (rng_u32(state) >> 8) / 16777216.0f; }

static inline uint64_t rng_seed(uint64_t seed) {
    // splitmix64 of the seed, so that nearby seed values give unrelated streams; never 0.
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

// Standard normal via Box-Muller.
static inline float rng_normal(uint64_t* state) {
    float u1 = rng_f32(state), u2 = rng_f32(state);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// Samples an index from probabilities probs[0..n) with coin in [0, 1).
static inline int sample_from_probs(const float* probs, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) return i;
    }
    return n - 1;
}

#ifdef __cplusplus
}
#endif
#endif
