/*
 * Residual connection: out = a + b. Its backward passes the gradient through to both
 * branches unchanged, accumulating (+=) as every backward here does.
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

static void residual_backward(float* da, float* db, const float* dout, size_t N) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

#ifdef __cplusplus
}
#endif
#endif
