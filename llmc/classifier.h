/*
 * Fused softmax + cross-entropy over a padded vocabulary.
 * logits are (BT,Vp); only the first V columns are real tokens, the rest (padding to a
 * multiple of 128 for fast matmuls) must not take probability mass.
 *   probs[i,v]  = softmax(logits[i, 0..V-1])[v] for v < V, 0 for V <= v < Vp
 *   losses[i]   = -log probs[i, targets[i]]
 * The loss is formed as logsumexp - logit[target] (PyTorch's log_softmax route), which
 * stays accurate where probs[target] underflows.
 * Speed: a row is 50257 exps, the bulk of this layer's work, so the forward uses the exp
 * that vectorises (llmc/vec_math.h) and keeps the row's maximum and sum in CE_LANES
 * partials (a fixed order, so the same bits for any thread count).
 */
#ifndef LLMC_CLASSIFIER_H
#define LLMC_CLASSIFIER_H

#include <math.h>
#include <stddef.h>
#include "llmc/utils.h"
#include "llmc/vec_math.h"

#ifdef __cplusplus
extern "C" {
#endif

LLMC_VECTORIZE_BEGIN

enum { CE_LANES = 16 };  // partials per row: one 64-byte vector of floats

static void crossentropy_softmax_forward(float* losses, float* probs, const float* logits,
                                         const int* targets, int BT, int V, int Vp) {
    // checked up front: an out-of-range target would read outside the row below
    for (int i = 0; i < BT; i++) {
        if (targets[i] < 0 || targets[i] >= V) {
            fatal("crossentropy: target %d at row %d is outside the vocabulary [0, %d)", targets[i], i, V);
        }
    }
    int Vlanes = V / CE_LANES * CE_LANES;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float* restrict lrow = logits + (size_t)i * Vp;
        float* restrict prow = probs + (size_t)i * Vp;
        float lane_max[CE_LANES];
        for (int j = 0; j < CE_LANES; j++) lane_max[j] = -INFINITY;
        for (int v = 0; v < Vlanes; v += CE_LANES)
            for (int j = 0; j < CE_LANES; j++) lane_max[j] = lrow[v + j] > lane_max[j] ? lrow[v + j] : lane_max[j];
        for (int v = Vlanes; v < V; v++) lane_max[v - Vlanes] = lrow[v] > lane_max[v - Vlanes] ? lrow[v] : lane_max[v - Vlanes];
        float maxv = -INFINITY;
        for (int j = 0; j < CE_LANES; j++) maxv = lane_max[j] > maxv ? lane_max[j] : maxv;
        double lane_sum[CE_LANES];
        for (int j = 0; j < CE_LANES; j++) lane_sum[j] = 0.0;
        for (int v = 0; v < Vlanes; v += CE_LANES) {
            for (int j = 0; j < CE_LANES; j++) {
                float e = vec_expf(lrow[v + j] - maxv);
                prow[v + j] = e;
                lane_sum[j] += e;
            }
        }
        for (int v = Vlanes; v < V; v++) {
            float e = vec_expf(lrow[v] - maxv);
            prow[v] = e;
            lane_sum[v - Vlanes] += e;
        }
        double sum = 0.0;
        for (int j = 0; j < CE_LANES; j++) sum += lane_sum[j];
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) prow[v] *= inv;
        for (int v = V; v < Vp; v++) prow[v] = 0.0f;
        losses[i] = (float)(log(sum) + (double)maxv - (double)lrow[targets[i]]);
    }
}

LLMC_VECTORIZE_END

// dlogits is overwritten (not accumulated): it is a per-step scratch of the trainer.
static void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets,
                                          const float* dlosses, int BT, int V, int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float* prow = probs + (size_t)i * Vp;
        float* drow = dlogits + (size_t)i * Vp;
        float dl = dlosses[i];
        for (int v = 0; v < V; v++) drow[v] = prow[v] * dl;
        drow[targets[i]] = (prow[targets[i]] - 1.0f) * dl;
        for (int v = V; v < Vp; v++) drow[v] = 0.0f;
    }
}

#ifdef __cplusplus
}
#endif
#endif
