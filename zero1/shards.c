// zero1/shards.c: per-rank shard ranges and the four views (see shards.h).
// Errors go back to the caller (-1 and a message in err), running out of memory included.
#include "zero1/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Zero1Range shifted(Zero1Range r, size_t origin) {
    Zero1Range s;
    s.start = r.start - origin;
    s.end = r.end - origin;
    return s;
}

int zero1_shards_build(Zero1RankShards* out, const Zero1Layout* layout, int rank, char* err, size_t err_len) {
    if (out == NULL) return zero1_error(err, err_len, "zero1_shards_build: out is NULL");
    memset(out, 0, sizeof(*out));
    if (layout == NULL || layout->num_buckets < 1 || layout->buckets == NULL || layout->params == NULL)
        return zero1_error(err, err_len, "zero1_shards_build: the layout is empty (was it built?)");
    if (rank < 0 || rank >= layout->dp)
        return zero1_error(err, err_len, "rank %d is outside 0..%d", rank, layout->dp - 1);

    Zero1RankShards S;
    memset(&S, 0, sizeof(S));
    S.rank = rank;
    S.dp = layout->dp;
    S.num_buckets = layout->num_buckets;
    S.buckets = (Zero1BucketShard*)calloc((size_t)layout->num_buckets, sizeof(Zero1BucketShard));
    if (S.buckets == NULL) return zero1_error(err, err_len, "out of memory for %d bucket shards", layout->num_buckets);

    for (int b = 0; b < layout->num_buckets; b++) {
        const Zero1Bucket* bucket = &layout->buckets[b];
        Zero1BucketShard* bs = &S.buckets[b];
        bs->bucket = b;
        bs->shard = zero1_bucket_shard_range(layout, b, rank);
        S.owned_numel += bs->shard.end - bs->shard.start;
        int capacity = zero1_bucket_num_params(bucket);
        bs->views = (Zero1ParamView*)calloc((size_t)capacity, sizeof(Zero1ParamView));
        if (bs->views == NULL) {
            zero1_shards_free(&S);
            return zero1_error(err, err_len, "out of memory for the views of bucket %d", b);
        }
        for (int i = 0; i < capacity; i++) {  // in buffer order
            int p = zero1_bucket_param(bucket, i);
            const Zero1ParamPlace* place = &layout->params[p];
            size_t lo = place->start > bs->shard.start ? place->start : bs->shard.start;
            size_t hi = place->end < bs->shard.end ? place->end : bs->shard.end;
            if (hi <= lo) continue;  // this piece of the parameter belongs to another rank
            Zero1ParamView* v = &bs->views[bs->num_views++];
            v->param = p;
            v->gbuf_world.start = lo;
            v->gbuf_world.end = hi;
            v->gbuf_world_in_bucket = shifted(v->gbuf_world, bucket->start);
            v->gbuf_local = shifted(v->gbuf_world, bs->shard.start);
            v->param_range = shifted(v->gbuf_world, place->start);
        }
    }
    *out = S;
    return 0;
}

void zero1_shards_free(Zero1RankShards* shards) {
    if (shards == NULL) return;
    if (shards->buckets != NULL) {
        for (int b = 0; b < shards->num_buckets; b++) free(shards->buckets[b].views);
        free(shards->buckets);
    }
    memset(shards, 0, sizeof(*shards));
}
