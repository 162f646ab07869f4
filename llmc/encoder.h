/*
 * Token + position embedding (GPT-2's first layer), fp32 on the CPU.
 *
 * Forward: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
 * Backward scatters dout back into the rows of dwte that were looked up. Many positions
 * may share one token, so the scatter must not race; instead of atomics (which would make
 * the sum order, and so the last bits, depend on scheduling) every thread owns a fixed
 * slice of the channels and walks all positions in order. Each gradient element is then
 * summed in (b,t) order whatever the thread count, so results are bit-identical for any
 * OMP_NUM_THREADS.
 */
#ifndef LLMC_ENCODER_H
#define LLMC_ENCODER_H

#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

static void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                            int B, int T, int C) {
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        float* o = out + (size_t)bt * C;
        const float* we = wte + (size_t)inp[bt] * C;
        const float* pe = wpe + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

// dwte and dwpe accumulate (+=).
static void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                             int B, int T, int C) {
    #pragma omp parallel
    {
        int nth = 1, tid = 0;
#ifdef _OPENMP
        nth = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        // Channel slices in multiples of 16 floats (one cache line) so threads never
        // write to the same line; the split only decides who does the work, not the order.
        int lines = (C + 15) / 16;
        int c0 = (int)((long)lines * tid / nth) * 16;
        int c1 = (int)((long)lines * (tid + 1) / nth) * 16;
        if (c0 > C) c0 = C;
        if (c1 > C) c1 = C;
        if (c0 < c1) {
            for (int bt = 0; bt < B * T; bt++) {
                int t = bt % T;
                const float* d = dout + (size_t)bt * C;
                float* gw = dwte + (size_t)inp[bt] * C;
                float* gp = dwpe + (size_t)t * C;
                for (int c = c0; c < c1; c++) {
                    gw[c] += d[c];
                    gp[c] += d[c];
                }
            }
        }
    }
}

#ifdef __cplusplus
}
#endif
#endif
