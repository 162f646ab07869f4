/*
 * GPT-2's Muon matrices (llmc/gpt2_spec.h's gpt2_tensor_is_hidden_matrix) grouped by the shape
 * Newton-Schulz sees, for a device that orthogonalizes same-shaped matrices together
 * (llmc/muon.cuh's strided-batched GEMMs): every layer's attprojw; every fcw; every fcprojw;
 * every qkvw, or with split_qkv every Q, K and V third.
 */
#ifndef LLMC_MUON_GPT2_H
#define LLMC_MUON_GPT2_H

#include "llmc/gpt2_spec.h"
#include "llmc/muon.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MUON_GPT2_GROUPS 4

typedef struct {
    int kind;        // LAYER_QKVW, LAYER_ATTPROJW, LAYER_FCW or LAYER_FCPROJW
    int rows, cols;  // each matrix as stored (a third of qkvw's rows under split_qkv)
    int parts;       // matrices per layer's tensor: 3 for a split qkvw, else 1
    int count;       // matrices in the group: layers x parts
} MuonShapeGroup;

// Fills g[MUON_GPT2_GROUPS], in the blocks' tensor order.
static inline void muon_gpt2_groups(const GPT2Config* c, int split_qkv, MuonShapeGroup g[MUON_GPT2_GROUPS]) {
    static const int kinds[MUON_GPT2_GROUPS] = {LAYER_QKVW, LAYER_ATTPROJW, LAYER_FCW, LAYER_FCPROJW};
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        MuonShapeGroup* s = &g[k];
        s->kind = kinds[k];
        gpt2_matrix_shape(c, gpt2_idx_layer(0, s->kind), &s->rows, &s->cols);
        s->parts = s->kind == LAYER_QKVW && split_qkv ? 3 : 1;
        s->rows /= s->parts;
        s->count = c->num_layers * s->parts;
    }
}

// A batched Newton-Schulz's scratch, reused group after group: x elements for X and as many
// for its next value (a group's matrices), a for A and as many for B (their r x r products, r
// the smaller side).
static inline void muon_gpt2_batched_work(const GPT2Config* c, int split_qkv, size_t* x, size_t* a) {
    MuonShapeGroup g[MUON_GPT2_GROUPS];
    muon_gpt2_groups(c, split_qkv, g);
    *x = *a = 0;
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        size_t r = (size_t)(g[k].rows < g[k].cols ? g[k].rows : g[k].cols), n = (size_t)g[k].count;
        size_t nx = n * g[k].rows * g[k].cols, na = n * r * r;
        *x = nx > *x ? nx : *x;
        *a = na > *a ? na : *a;
    }
}

#ifdef __cplusplus
}
#endif
#endif
