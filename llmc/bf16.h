/*
 * bfloat16 storage on the host: round-to-nearest-even conversion, matching
 * torch.Tensor.to(torch.bfloat16) and CUDA's __float2bfloat16_rn (NaN stays NaN).
 */
#ifndef LLMC_BF16_H
#define LLMC_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16_bits;

static inline bf16_bits float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_bits)((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (bf16_bits)((u + rounding) >> 16);
}

static inline float bf16_to_float(bf16_bits b) {
    uint32_t u = ((uint32_t)b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __cplusplus
}
#endif
#endif
