/*
 * bfloat16 storage: round-to-nearest-even conversion, matching torch.Tensor.to(torch.bfloat16)
 * and CUDA's __float2bfloat16_rn for numbers (a NaN keeps its sign and payload and gets the
 * quiet bit), and stochastic rounding with caller-given random bits (--stochastic-rounding).
 * The same functions run on the host and, under nvcc, on the GPU, so the CPU trainer,
 * zero1/ and its CUDA kernels round identically.
 */
#ifndef LLMC_BF16_H
#define LLMC_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define LLMC_BF16_FN __host__ __device__ static inline
#else
#define LLMC_BF16_FN static inline
#endif

typedef uint16_t bf16_bits;

LLMC_BF16_FN bf16_bits float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_bits)((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (bf16_bits)((u + rounding) >> 16);
}

// Stochastic rounding: x rounds to the bf16 neighbour above |x| with probability
// (distance to the one below) / (their spacing), so the expected result is x. Adding the
// low 16 random bits to the fp32 pattern carries into the kept 16 bits exactly when they
// exceed 65536 minus the dropped bits, then truncating keeps the upper half. Exact bf16
// values (dropped bits 0) and +-Inf never carry; a NaN becomes a quiet NaN as in
// float_to_bf16; a finite value above the largest bf16 may round up to Inf.
LLMC_BF16_FN bf16_bits float_to_bf16_stochastic(float x, uint32_t random) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_bits)((u >> 16) | 0x40);  // quiet NaN
    return (bf16_bits)((u + (random & 0xffffu)) >> 16);
}

// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection of 64-bit words whose
// every output bit depends on every input bit.
LLMC_BF16_FN uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The random bits for stochastically rounding one element: a counter-based hash (no state,
// so any device, shard or order computes the same bits for the same element), keyed by the
// run's seed and the optimizer step (AdamW's 1-based t), counted by the element's index in
// model space (its parameter's offset in definition order plus its index inside it):
//   key  = mix(mix(seed + G) + G * step),   bits = high 32 bits of mix(key + G * (element + 1))
// with G = 0x9e3779b97f4a7c15 (splitmix64's increment) and mix = splitmix64_mix.
LLMC_BF16_FN uint32_t stochastic_rounding_bits(uint64_t seed, uint64_t step, uint64_t element) {
    const uint64_t G = 0x9e3779b97f4a7c15ull;
    uint64_t key = splitmix64_mix(splitmix64_mix(seed + G) + G * step);
    return (uint32_t)(splitmix64_mix(key + G * (element + 1)) >> 32);
}

LLMC_BF16_FN float bf16_to_float(bf16_bits b) {
    uint32_t u = ((uint32_t)b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __cplusplus
}
#endif
#endif
