/*
 * Fused softmax + cross-entropy over a padded vocabulary.
 * logits are (BT,Vp); only the first V columns are real tokens, the rest (padding to a
 * multiple of 128 for fast matmuls) must not take probability mass.
 *   probs[i,v]  = softmax(logits[i, 0..V-1])[v] for v < V, 0 for V <= v < Vp
 *   losses[i]   = -log probs[i, targets[i]]
 * The loss is formed as logsumexp - logit[target] (PyTorch's log_softmax route), which
 * stays accurate where probs[target] underflows.
 */
#ifndef LLMC_CLASSIFIER_H
#define LLMC_CLASSIFIER_H

#include <math.h>
#include <stddef.h>
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

static void crossentropy_softmax_forward(float* losses, float* probs, const float* logits,
                                         const int* targets, int BT, int V, int Vp) {
    // checked up front: an out-of-range target would read outside the row below
    for (int i = 0; i < BT; i++) {
        if (targets[i] < 0 || targets[i] >= V) {
            fatal("crossentropy: target %d at row %d is outside the vocabulary [0, %d)", targets[i], i, V);
        }
    }
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float* lrow = logits + (size_t)i * Vp;
        float* prow = probs + (size_t)i * Vp;
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) maxv = lrow[v] > maxv ? lrow[v] : maxv;
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            float e = expf(lrow[v] - maxv);
            prow[v] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) prow[v] *= inv;
        for (int v = V; v < Vp; v++) prow[v] = 0.0f;
        losses[i] = (float)(log(sum) + (double)maxv - (double)lrow[targets[i]]);
    }
}

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
