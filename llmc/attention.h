/*
 * Causal multi-head self-attention (GPT-2), fp32 on the CPU.
 *
 * qkv is (B,T,3C) = [q | k | v] along the last dim; head h uses channels h*hs..(h+1)*hs-1
 * of each part, hs = C/NH. preatt and att are (B,NH,T,T); out is (B,T,C).
 *   preatt[t,t2] = q[t].k[t2] / sqrt(hs)   for t2 <= t
 *   att[t,:]     = softmax(preatt[t, 0..t]) (max-subtracted), 0 for t2 > t
 *   out[t]       = sum_t2 att[t,t2] v[t2]
 *
 * Why sgemm: the two products per head are the bulk of the work, and plain C dot products
 * do not vectorise without -ffast-math (which we avoid so results can be compared with
 * PyTorch). sgemm reads q, k, v in place through its leading dimension (3C), so nothing is
 * copied. To use the causal structure, the rows are processed in blocks of ATTN_BLOCK:
 * rows [i0,i1) only need keys [0,i1), so about half of the T*T products are skipped; the
 * few above-diagonal entries a block computes are masked out by zeros in att/dpreatt.
 * The (batch, head) pairs are independent: OpenMP threads take whole pairs as they come
 * free, each running its gemms single-threaded (llmc/matmul.h); with a multi-threaded
 * OpenBLAS (a user's OPENBLAS_NUM_THREADS) the pairs run in turn and OpenBLAS threads each gemm.
 */
#ifndef LLMC_ATTENTION_H
#define LLMC_ATTENTION_H

#include <cblas.h>
#include <math.h>
#include <stddef.h>

#include "llmc/matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_BLOCK 64

// Where head h of batch row b starts: its q row in qkv (k and v C and 2C further on), its
// output columns in a (B,T,C) tensor, its T x T block in preatt and att; and its size and
// score scale.
typedef struct {
    size_t qkv, btc, tt;
    int hs;
    float scale;
} AttentionHead;
static inline AttentionHead attention_head(int b, int h, int T, int C, int NH) {
    AttentionHead a;
    a.hs = C / NH;
    a.scale = 1.0f / sqrtf((float)a.hs);
    a.qkv = (size_t)b * T * 3 * C + h * a.hs;
    a.btc = (size_t)b * T * C + h * a.hs;
    a.tt = ((size_t)b * NH + h) * T * T;
    return a;
}

// One (batch, head) pair: q, k, v, o point at its first row (row strides 3C, 3C, 3C, C);
// pre and a are its T x T blocks.
static void attention_head_forward(float* o, float* pre, float* a, const float* q, const float* k, const float* v,
                                   int T, int C, int hs, float scale) {
    int C3 = 3 * C;
    for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
        int i1 = i0 + ATTN_BLOCK < T ? i0 + ATTN_BLOCK : T;
        // pre[i0:i1, 0:i1] = scale * q[i0:i1] @ k[0:i1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                    scale, q + (size_t)i0 * C3, C3, k, C3, 0.0f, pre + (size_t)i0 * T, T);
        for (int t = i0; t < i1; t++) {
            float* prow = pre + (size_t)t * T;
            float* arow = a + (size_t)t * T;
            float maxv = -INFINITY;
            for (int t2 = 0; t2 <= t; t2++) maxv = prow[t2] > maxv ? prow[t2] : maxv;
            float sum = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                float e = expf(prow[t2] - maxv);
                arow[t2] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
            for (int t2 = 0; t2 <= t; t2++) arow[t2] *= inv;
            // the masked part: zeros in att make the block gemm below exact, and
            // zeros in preatt keep the buffer free of stale values
            for (int t2 = t + 1; t2 < T; t2++) {
                arow[t2] = 0.0f;
                prow[t2] = 0.0f;
            }
        }
        // out[i0:i1] = att[i0:i1, 0:i1] @ v[0:i1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                    1.0f, a + (size_t)i0 * T, T, v, C3, 0.0f, o + (size_t)i0 * C, C);
    }
}

static void attention_forward(float* out, float* preatt, float* att, const float* qkv,
                              int B, int T, int C, int NH) {
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) if (matmul_split_threads())
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            AttentionHead a = attention_head(b, h, T, C, NH);
            const float* q = qkv + a.qkv;
            attention_head_forward(out + a.btc, preatt + a.tt, att + a.tt, q, q + C, q + 2 * C, T, C, a.hs, a.scale);
        }
    }
}

// One (batch, head) pair of the backward, pointers as in attention_head_forward; dq, dk,
// dv (row stride 3C) accumulate.
static void attention_head_backward(float* dq, float* dk, float* dv, float* dpre, float* da, const float* dO,
                                    const float* q, const float* k, const float* v, const float* a, int T, int C,
                                    int hs, float scale) {
    int C3 = 3 * C;
    for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
        int i1 = i0 + ATTN_BLOCK < T ? i0 + ATTN_BLOCK : T;
        // datt[i0:i1, 0:i1] = dout[i0:i1] @ v[0:i1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                    1.0f, dO + (size_t)i0 * C, C, v, C3, 0.0f, da + (size_t)i0 * T, T);
        // softmax backward: dpre = att * (datt - sum(att * datt))
        for (int t = i0; t < i1; t++) {
            const float* arow = a + (size_t)t * T;
            const float* darow = da + (size_t)t * T;
            float* dprow = dpre + (size_t)t * T;
            float dot = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) dot += arow[t2] * darow[t2];
            for (int t2 = 0; t2 <= t; t2++) dprow[t2] = arow[t2] * (darow[t2] - dot);
            for (int t2 = t + 1; t2 < T; t2++) dprow[t2] = 0.0f;
        }
        // dq[i0:i1] += scale * dpre[i0:i1, 0:i1] @ k[0:i1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                    scale, dpre + (size_t)i0 * T, T, k, C3, 1.0f, dq + (size_t)i0 * C3, C3);
    }
    // Keys and values: row block [j0,j1) of dk/dv collects from queries t >= j0
    // (dpre and att are zero above the diagonal, so t in [j0,j1) with t < t2 adds 0).
    for (int j0 = 0; j0 < T; j0 += ATTN_BLOCK) {
        int j1 = j0 + ATTN_BLOCK < T ? j0 + ATTN_BLOCK : T;
        // dv[j0:j1] += att[j0:T, j0:j1]^T @ dout[j0:T]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                    1.0f, a + (size_t)j0 * T + j0, T, dO + (size_t)j0 * C, C,
                    1.0f, dv + (size_t)j0 * C3, C3);
        // dk[j0:j1] += scale * dpre[j0:T, j0:j1]^T @ q[j0:T]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                    scale, dpre + (size_t)j0 * T + j0, T, q + (size_t)j0 * C3, C3,
                    1.0f, dk + (size_t)j0 * C3, C3);
    }
}

// dqkv accumulates (+=). dpreatt and datt are (B,NH,T,T) scratch that this function
// overwrites (entries above the diagonal are unspecified in datt, zero in dpreatt).
static void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout,
                               const float* qkv, const float* att, int B, int T, int C, int NH) {
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) if (matmul_split_threads())
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            AttentionHead a = attention_head(b, h, T, C, NH);
            const float* q = qkv + a.qkv;
            float* dq = dqkv + a.qkv;
            attention_head_backward(dq, dq + C, dq + 2 * C, dpreatt + a.tt, datt + a.tt, dout + a.btc, q, q + C,
                                    q + 2 * C, att + a.tt, T, C, a.hs, a.scale);
        }
    }
}

#ifdef __cplusplus
}
#endif
#endif
