/*
 * LayerNorm over the last dimension (C), as PyTorch: biased variance, eps = 1e-5.
 *   out = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps)
 * mean and rstd (B*T each) are saved for the backward.
 *
 * Row statistics are accumulated in double: the rows are short (C) so this costs little,
 * and it keeps the result within an ulp or so of PyTorch's.
 * The weight/bias gradients sum over all B*T rows. To make them independent of the
 * thread count they are computed in a second pass where each thread owns a block of
 * channels and walks the rows in order (no per-thread partials, no atomics).
 */
#ifndef LLMC_LAYERNORM_H
#define LLMC_LAYERNORM_H

#include <math.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LAYERNORM_EPS 1e-5f

static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) {
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float* x = inp + (size_t)bt * C;
        float* o = out + (size_t)bt * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += x[c];
        float m = (float)(s / C);
        // two passes (not E[x^2] - m^2) so a large mean cannot cancel the variance away
        double v = 0.0;
        for (int c = 0; c < C; c++) {
            double d = (double)x[c] - (double)m;
            v += d * d;
        }
        float r = (float)(1.0 / sqrt(v / C + (double)LAYERNORM_EPS));
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
        mean[bt] = m;
        rstd[bt] = r;
    }
}

// dinp, dweight, dbias accumulate (+=).
static void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int B, int T, int C) {
    int BT = B * T;
    // pass 1: input gradient, rows are independent
    //   dinp = rstd * (w*dout - mean(w*dout) - norm * mean(w*dout*norm))
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
        const float* x = inp + (size_t)bt * C;
        const float* d = dout + (size_t)bt * C;
        float* di = dinp + (size_t)bt * C;
        float m = mean[bt], r = rstd[bt];
        double sum_dn = 0.0, sum_dn_n = 0.0;
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * r;
            float dn = weight[c] * d[c];
            sum_dn += dn;
            sum_dn_n += (double)dn * n;
        }
        float mean_dn = (float)(sum_dn / C);
        float mean_dn_n = (float)(sum_dn_n / C);
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * r;
            float dn = weight[c] * d[c];
            di[c] += r * (dn - mean_dn - n * mean_dn_n);
        }
    }
    // pass 2: parameter gradients, each channel block summed over rows in a fixed order
    enum { CB = 64 };
    int nblocks = (C + CB - 1) / CB;
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * CB;
        int c1 = c0 + CB < C ? c0 + CB : C;
        double accw[CB], accb[CB];
        for (int c = 0; c < CB; c++) { accw[c] = 0.0; accb[c] = 0.0; }
        for (int bt = 0; bt < BT; bt++) {
            const float* x = inp + (size_t)bt * C;
            const float* d = dout + (size_t)bt * C;
            float m = mean[bt], r = rstd[bt];
            for (int c = c0; c < c1; c++) {
                float n = (x[c] - m) * r;
                accw[c - c0] += (double)(n * d[c]);
                accb[c - c0] += (double)d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += (float)accw[c - c0];
            dbias[c] += (float)accb[c - c0];
        }
    }
}

#ifdef __cplusplus
}
#endif
#endif
