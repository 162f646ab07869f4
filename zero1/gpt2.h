/*
 * zero1/gpt2.h: GPT-2 described to the zero1/ runtime, for both trainers (their models
 * share llmc/gpt2_spec.h's tensors and llmc/model_hooks.h's block numbering).
 *
 * Forward blocks are the model's (llmc/model_hooks.h): -1 = embeddings, 0..L-1 =
 * transformer blocks, L = final LayerNorm + classifier (which reads wte, gathered for
 * block -1 already). wte's gradient gets two contributions (classifier and encoder) and
 * every other tensor's one; the runtime learns these counts on the first step. wte is the
 * embedding whose encoder part may travel as sparse rows of C elements (--split-embedding).
 */
#ifndef ZERO1_GPT2_H
#define ZERO1_GPT2_H

#include "llmc/gpt2_spec.h"
#include "run/memory_check.h"
#include "zero1/layout_layerwise.h"
#include "zero1/ledger.h"
#include "zero1/optimizer.h"

static const char* zero1_gpt2_tensor_name(void* ctx, int p, char* buf, size_t n) {
    return gpt2_tensor_name((const GPT2Config*)ctx, p, buf, n);
}

// The hidden matrices' shapes (llmc/gpt2_spec.h: what --optimizer muon gives Muon), per tensor.
static inline Zero1MatrixShape* zero1_gpt2_matrices(const GPT2Config* c) {
    Zero1MatrixShape* m = (Zero1MatrixShape*)callocCheck(gpt2_num_tensors(c), sizeof(Zero1MatrixShape));
    for (int i = 0; i < gpt2_num_tensors(c); i++) {
        if (!gpt2_tensor_is_hidden_matrix(c, i)) continue;
        gpt2_matrix_shape(c, i, &m[i].rows, &m[i].cols);
        m[i].qkv = gpt2_matrix_is_qkv(c, i);
    }
    return m;
}

// The optimizer for GPT-2 of shape c (which must outlive it: tensor names are read from it).
static inline Optimizer* zero1_gpt2_optimizer(const TrainConfig* cfg, const GPT2Config* c, Zero1Backend* backend,
                                              Zero1Dtype compute_dtype) {
    int NT = gpt2_num_tensors(c);
    size_t* numels = (size_t*)mallocCheck(NT * sizeof(size_t));
    int* decays = (int*)mallocCheck(NT * sizeof(int));
    int* first_block = (int*)mallocCheck(NT * sizeof(int));
    for (int i = 0; i < NT; i++) {
        numels[i] = gpt2_tensor_numel(c, i);
        decays[i] = gpt2_tensor_decays(c, i);
        first_block[i] = gpt2_tensor_layer(c, i);
    }
    Zero1MatrixShape* matrices = zero1_gpt2_matrices(c);
    Zero1ModelSpec spec = {NT, numels, decays, first_block, zero1_gpt2_tensor_name, (void*)c, gpt2_idx_wte(),
                           (size_t)c->channels, matrices};
    Optimizer* o = zero1_optimizer_create(cfg, &spec, backend, compute_dtype);
    free(matrices);
    free(numels);
    free(decays);
    free(first_block);
    return o;
}

// The buffers zero1_gpt2_optimizer will allocate, for the trainers' memory check
// (run/memory_check.h): sized by the layout the runtime builds from the same options and by
// its ledger, so that the layout's rules live here only.
static inline MemoryBuffers zero1_gpt2_memory_buffers(const TrainConfig* cfg, const GPT2Config* c, int world) {
    int NT = gpt2_num_tensors(c), dp = zero1_instance_group_size(cfg, world);
    size_t* numels = (size_t*)mallocCheck(NT * sizeof(size_t));
    for (int i = 0; i < NT; i++) numels[i] = gpt2_tensor_numel(c, i);
    int split = cfg->split_embedding ? gpt2_idx_wte() : -1;  // zero1/optimizer.c: its own bucket
    Zero1Layout layout;
    char err[256];
    long long bucket_size = zero1_ddp_bucket_size(cfg->bucket_size, world, cfg->overlap_grad_reduce);  // as the runtime
    int* is_muon = NULL;
    if (config_uses_muon(cfg)) {
        is_muon = (int*)callocCheck(NT, sizeof(int));
        for (int i = 0; i < NT; i++) is_muon[i] = gpt2_tensor_is_hidden_matrix(c, i);
    }
    if (zero1_run_layout_build(&layout, numels, is_muon, NT, dp, bucket_size, cfg->pad_busbw, split, err,
                               sizeof(err)) != 0) {
        fatal("zero1: %s", err);
    }
    free(is_muon);
    free(numels);
    int sharded = cfg->zero_stage == 1 && dp > 1;
    Zero1Ledger g = zero1_ledger_of_layout(&layout, world / dp, cfg->param_dtype == DTYPE_BF16 ? 2 : 4,
                                           cfg->grad_dtype == DTYPE_BF16 ? 2 : 4, sharded && cfg->fp32_accumulation,
                                           split, (uint64_t)cfg->B * cfg->T, (uint64_t)c->channels,
                                           cfg->dp_invariant ? config_micro_steps(cfg, world) : 0);
    // The AdamW buffer comes first: AdamW's v covers its part of the owned elements.
    double adamw_numel = layout.num_muon_buckets ? (double)layout.buckets[layout.num_buckets - layout.num_muon_buckets].start
                                                 : (double)layout.numel;
    MemoryBuffers b = {(double)layout.numel, (double)(sharded ? g.owned_numel : layout.numel),
                       (double)(g.recv_temporaries + g.split_rows + g.partial_grads),
                       sharded ? adamw_numel / dp : adamw_numel,
                       (dp > 1) + (world / dp > 1)};  // zero1/backend_cuda.cu: its group's, and across groups
    zero1_layout_free(&layout);
    return b;
}

#endif
