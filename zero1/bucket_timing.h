/*
 * zero1/bucket_timing.h: when a GPT-2 bucket's collectives can start, in llmc/model_hooks.h's
 * block numbers (-1 embeddings, 0..L-1 transformer blocks, L final LayerNorm + classifier).
 * The backward runs blocks L down to -1, so a bucket's gradients are final after the
 * backward of the lowest block that contributes to one of them: wte gets the classifier's
 * (L) and the encoder's (-1) contributions, and with --split-embedding only the
 * classifier's is dense. Its params are needed by the forward of the lowest block that
 * reads one of them. This holds from step 2 on: the runtime learns the contribution counts
 * on step 1, whose buckets all fire at its finish. Used by zero1_plan's timing table and
 * gpt2_cost's overlap model (header only).
 */
#ifndef ZERO1_BUCKET_TIMING_H
#define ZERO1_BUCKET_TIMING_H

#include "llmc/gpt2_spec.h"
#include "zero1/layout.h"

static inline void zero1_bucket_timing(const GPT2Config* c, int split_embedding, const Zero1Bucket* k,
                                       int* grads_final_after, int* needed_by) {
    *grads_final_after = *needed_by = c->num_layers;
    for (int i = 0; i < zero1_bucket_num_params(k); i++) {
        int p = zero1_bucket_param(k, i);
        int layer = gpt2_tensor_layer(c, p);
        int final_after = p == gpt2_idx_wte() && split_embedding ? c->num_layers : layer;
        if (final_after < *grads_final_after) *grads_final_after = final_after;
        if (layer < *needed_by) *needed_by = layer;
    }
}

#endif
