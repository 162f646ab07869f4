/*
 * Residual connection: out = a + b. Its backward needs no function: both branches
 * accumulate into the one dresidual buffer of the model's backward (llmc/gpt2_cpu.h).
 */
#ifndef LLMC_RESIDUAL_H
#define LLMC_RESIDUAL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

static void residual_forward(float* out, const float* a, const float* b, size_t N) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

#ifdef __cplusplus
}
#endif
#endif
