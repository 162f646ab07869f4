/*
 * zero1/layout_layerwise.h: the two buffers of ZeRO-1 with Muon (--optimizer muon), laid out
 * as megatron-core 0.19.2's LayerWiseDistributedOptimizer.compute_full_param_layout lays them out.
 *
 * The parameters split by optimizer. AdamW's (embeddings, biases, LayerNorms) keep today's
 * element-wise buffer (zero1/layout.h, built over the AdamW parameters alone). Muon's matrices
 * go to a "layer-wise" buffer in which every matrix lies whole inside one rank's shard, so that
 * its owner can run Newton-Schulz on it (layer_wise_optimizer.py's _compute_per_buffer_param_layout):
 *   - the matrices are walked in reverse definition (backprop) order into a chunk; after each,
 *     the chunk closes when its numel >= max(bucket_size, int(DP x its largest matrix x 0.9)).
 *     The 0.9 floor keeps a chunk open while one matrix would leave the other shards mostly
 *     padding. No bucket size (0): one chunk;
 *   - a chunk becomes a bucket by greedy LPT: its matrices by numel descending (equal sizes in
 *     backprop order), each to the shard with the least load (the lowest index on ties), placed
 *     at that load rounded up to 64, the load then placement + numel;
 *   - shard size = the largest load rounded up to lcm(64, D / DP), D = zero1_bucket_divisor
 *     (lcm(DP, 128), or lcm(DP, 128, 65536) with pad_busbw): the bucket, DP shards back to back,
 *     ends on a multiple of D and every shard starts on a multiple of 64;
 *   - inside a shard the matrices sit in the order they were assigned, starts rounded up to 64;
 *   - rank r owns (gets the whole summed gradient of, and updates) the matrices of shard r of
 *     every bucket.
 * The layer-wise buffer is a Zero1Layout too (buckets = chunks, each a contiguous run of the
 * buffer's matrices; a bucket's numel_unpadded is the sum of its matrices), so zero1/shards.h's
 * views and zero1/ledger.h apply to it unchanged: a rank's views there are whole matrices. Only
 * the order inside a bucket differs from layout.h's (shard by shard, not reverse order).
 *
 * Pure C, no MPI, no CUDA; never aborts: errors come back as -1 plus a message (zero1_error).
 */
#ifndef ZERO1_LAYOUT_LAYERWISE_H
#define ZERO1_LAYOUT_LAYERWISE_H

#include <stddef.h>

#include "zero1/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO1_LAYERWISE_PADDING_FLOOR 0.9  // a chunk holds >= 0.9 x DP x its largest matrix

// Both buffers (Megatron's FullParamLayout). Either may be empty (num_params 0, no buckets).
// A buffer's params are its own, indexed in the model's definition order; *_param maps them back.
typedef struct {
    Zero1Layout adamw;      // element-wise (layout.h)
    Zero1Layout layerwise;  // Muon's matrices, whole per shard
    int* adamw_param;       // adamw.num_params entries: buffer index -> model index
    int* layerwise_param;   // layerwise.num_params entries: buffer index -> model index
    int num_params;         // of the model
} Zero1FullLayout;

// lcm(64, zero1_bucket_divisor(dp, pad_busbw) / dp): what a layer-wise shard is padded to.
size_t zero1_layerwise_shard_divisor(int dp, int pad_busbw);

// The layer-wise buffer of num_params matrices (numels in definition order, each >= 1).
// bucket_size: < 0 the default for dp, 0 none (one chunk), > 0 elements, as zero1_layout_build.
// Returns 0, or -1 with a message in err (err may be NULL). On error *out is zeroed.
int zero1_layerwise_layout_build(Zero1Layout* out, const size_t* numels, int num_params, int dp,
                                 long long bucket_size, int pad_busbw, char* err, size_t err_len);

// The rank that owns buffer param p of a layer-wise layout: its shard in its bucket.
int zero1_layerwise_owner(const Zero1Layout* layerwise, int p);

// The elements of the matrices owned by the rank that owns the most (Muon's state lives there).
size_t zero1_layerwise_most_owned(const Zero1Layout* layerwise);

// The buffer indices of the matrices rank owns, in definition order, into owned (may be NULL
// to count); returns how many.
int zero1_layerwise_owned(const Zero1Layout* layerwise, int rank, int* owned);

// Both buffers: is_muon[i] != 0 puts model param i in the layer-wise buffer. bucket_size and
// pad_busbw as above, for both; shared_embedding (-1 none) is a model index, AdamW's (an
// embedding is never Muon's). Returns 0, or -1 with a message. On error *out is zeroed.
int zero1_full_layout_build(Zero1FullLayout* out, const size_t* numels, const int* is_muon, int num_params,
                            int dp, long long bucket_size, int pad_busbw, int shared_embedding, char* err,
                            size_t err_len);

void zero1_full_layout_free(Zero1FullLayout* full);

// The runtime's view of both buffers: one Zero1Layout over the model's params (definition
// order), the AdamW buffer first and the layer-wise buffer after it, its offsets moved by the
// AdamW buffer's numel (a multiple of every alignment either uses). The layer-wise buckets come
// last (num_muon_buckets of them), each listing its matrices in buffer order (members).
// As DDP keeps the two buffers apart, no bucket spans both. Returns 0, or -1 with a message.
int zero1_full_layout_merge(const Zero1FullLayout* full, Zero1Layout* out, char* err, size_t err_len);

// The layout a run computes with: is_muon NULL (AdamW only), the element-wise layout
// (zero1_layout_build); else both buffers, merged. Arguments and errors as those functions'.
int zero1_run_layout_build(Zero1Layout* out, const size_t* numels, const int* is_muon, int num_params, int dp,
                           long long bucket_size, int pad_busbw, int shared_embedding, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
