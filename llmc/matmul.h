/*
 * Linear layer: out[BT,OC] = inp[BT,C] @ weight[OC,C]^T + bias[OC], weight stored as
 * PyTorch's nn.Linear does (OC rows of C). All products go through OpenBLAS sgemm; only
 * the bias sum is written here.
 * The backward accumulates (+=) into dinp, dweight and dbias via sgemm's beta = 1, so the
 * trainer can sum gradients over micro-steps straight in its gradient buffer.
 * The bias sum below gives the same bits for any OpenMP thread count. OpenBLAS itself does
 * not promise that: 0.3.21 changes the last bits of sgemm with its own thread count, so
 * bit-reproducible runs keep OPENBLAS_NUM_THREADS fixed.
 */
#ifndef LLMC_MATMUL_H
#define LLMC_MATMUL_H

#include <cblas.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int BT, int C, int OC) {
    float beta = 0.0f;
    if (bias != NULL) {
        // start from the bias and let sgemm add the product (beta = 1), as addmm does:
        // one pass over out instead of a second one to add the bias
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < BT; i++) {
            float* o = out + (size_t)i * OC;
            for (int j = 0; j < OC; j++) o[j] = bias[j];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C,
                1.0f, inp, C, weight, C, beta, out, OC);
}

// dinp += dout @ weight (skipped when dinp == NULL); dweight += dout^T @ inp;
// dbias += column sums of dout (skipped when dbias == NULL).
static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int BT, int C, int OC) {
    if (dinp != NULL) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC,
                    1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT,
                1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != NULL) {
        // each thread owns a block of output columns and walks the rows in order: the sum
        // order per element is fixed, and the inner loop runs along contiguous memory
        enum { OB = 64 };
        int nblocks = (OC + OB - 1) / OB;
        #pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * OB;
            int o1 = o0 + OB < OC ? o0 + OB : OC;
            double acc[OB];
            for (int o = 0; o < OB; o++) acc[o] = 0.0;
            for (int i = 0; i < BT; i++) {
                const float* d = dout + (size_t)i * OC;
                for (int o = o0; o < o1; o++) acc[o - o0] += (double)d[o];
            }
            for (int o = o0; o < o1; o++) dbias[o] += (float)acc[o - o0];
        }
    }
}

#ifdef __cplusplus
}
#endif
#endif
