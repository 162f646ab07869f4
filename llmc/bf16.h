/*
 * bfloat16 storage: round-to-nearest-even conversion, matching torch.Tensor.to(torch.bfloat16)
 * and CUDA's __float2bfloat16_rn for numbers (a NaN keeps its sign and payload and gets the
 * quiet bit). The same functions run on the host and, under nvcc, on the GPU, so the CPU
 * trainer, zero1/ and its CUDA kernels round identically.
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
