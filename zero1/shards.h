/*
 * zero1/shards.h: which part of every bucket a rank owns, and the four views of each
 * parameter piece inside it (Megatron's _build_model_gbuf_range and
 * _build_model_gbuf_param_range_map).
 *
 * Bucket b of N elements (N divisible by DP) is cut into DP equal contiguous shards;
 * rank r owns [b.start + r*N/DP, b.start + (r+1)*N/DP). The cut ignores parameter
 * boundaries: a parameter may be split across ranks and a rank may own only padding.
 * For each parameter that intersects the shard, with I = [param ∩ shard) in buffer offsets:
 *   gbuf_world           = I                       (offsets in the whole buffer)
 *   gbuf_world_in_bucket = I - bucket.start        (offsets in the bucket: param_data/grad_data slice)
 *   gbuf_local           = I - shard.start         (offsets in this rank's shard: reduce-scatter output)
 *   param                = I - param.start         (offsets in the flattened parameter)
 * All four have the same length. Views are listed in buffer order (ascending offset).
 */
#ifndef ZERO1_SHARDS_H
#define ZERO1_SHARDS_H

#include <stddef.h>

#include "zero1/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t start, end;  // half-open, elements
} Zero1Range;

typedef struct {
    int param;  // definition index
    Zero1Range gbuf_world, gbuf_world_in_bucket, gbuf_local, param_range;
} Zero1ParamView;

typedef struct {
    int bucket;
    Zero1Range shard;  // world (buffer) offsets of this rank's shard of the bucket
    int num_views;     // may be 0: the shard is all padding
    Zero1ParamView* views;
} Zero1BucketShard;

typedef struct {
    int rank, dp;
    int num_buckets;
    Zero1BucketShard* buckets;  // one per bucket, buffer order
    size_t owned_numel;         // sum of shard sizes = layout numel / DP (padding included)
} Zero1RankShards;

// Rank's shard of one bucket, in buffer offsets (no checks: bucket and rank must be valid).
static inline Zero1Range zero1_bucket_shard_range(const Zero1Layout* layout, int bucket, int rank) {
    const Zero1Bucket* b = &layout->buckets[bucket];
    size_t shard_numel = (b->end - b->start) / (size_t)layout->dp;
    Zero1Range r;
    r.start = b->start + (size_t)rank * shard_numel;
    r.end = r.start + shard_numel;
    return r;
}

// Builds rank's shards of every bucket. Returns 0, or -1 with a message (rank out of
// range, an unbuilt layout, out of memory). On error *out is zeroed.
int zero1_shards_build(Zero1RankShards* out, const Zero1Layout* layout, int rank, char* err, size_t err_len);

void zero1_shards_free(Zero1RankShards* shards);

#ifdef __cplusplus
}
#endif
#endif
