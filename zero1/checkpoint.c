/*
 * zero1/checkpoint.c: the optimizer state in model space, for checkpoints that do not
 * depend on DP, bucket size or layout. Export gathers every rank's shards of m, v and
 * the fp32 master into dense (definition-order, unpadded) arrays; import takes this
 * rank's shards out of such arrays, whatever run wrote them.
 */
#include "llmc/utils.h"
#include "zero1/runtime.h"
#include "zero1/runtime_internal.h"

// Owned shards (owned-array layout) -> every rank's full buffer-layout copy -> dense.
static void export_array(Zero1Runtime* rt, const float* owned, float* full, const size_t* dense_offsets,
                         float* dense) {
    const Zero1DeviceOps* ops = rt->ops;
    ops->zero(full, rt->layout.numel * sizeof(float));
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1Range* sh = &rt->shards.buckets[b].shard;
        ops->copy(full + sh->start, owned + rt->buckets[b].owned_offset, (sh->end - sh->start) * sizeof(float));
    }
    if (stage1(rt)) {
        for (int b = 0; b < rt->layout.num_buckets; b++) {
            const Zero1Bucket* bk = &rt->layout.buckets[b];
            rt->comm->wait(rt->comm, rt->comm->all_gather(rt->comm, full + bk->start, bk->end - bk->start, ZERO1_FP32));
        }
    }
    for (int p = 0; p < rt->num_params; p++) {
        ops->copy(dense + dense_offsets[p], full + rt->layout.params[p].start, rt->numels[p] * sizeof(float));
    }
}

void zero1_export_state(Zero1Runtime* rt, const size_t* dense_offsets, float* m, float* v, float* master) {
    zero1_sync_params(rt);
    float* full = (float*)rt->ops->alloc(rt->layout.numel * sizeof(float));
    export_array(rt, rt->adam_m, full, dense_offsets, m);
    export_array(rt, rt->adam_v, full, dense_offsets, v);
    if (rt->master) {
        export_array(rt, rt->master, full, dense_offsets, master);
    } else {  // fp32 params are the master, and complete on every rank after the sync
        for (int p = 0; p < rt->num_params; p++) {
            rt->ops->copy(master + dense_offsets[p], rt->compute + rt->layout.params[p].start,
                          rt->numels[p] * sizeof(float));
        }
    }
    rt->ops->free(full);
}

void zero1_import_state(Zero1Runtime* rt, const size_t* dense_offsets, const float* m, const float* v) {
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1ParamView* view = &sh->views[i];
            size_t local = rt->buckets[b].owned_offset + view->gbuf_local.start;
            size_t src = dense_offsets[view->param] + view->param_range.start;
            size_t bytes = (view->param_range.end - view->param_range.start) * sizeof(float);
            rt->ops->copy(rt->adam_m + local, m + src, bytes);
            rt->ops->copy(rt->adam_v + local, v + src, bytes);
        }
    }
}

