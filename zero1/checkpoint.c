/*
 * zero1/checkpoint.c: the optimizer state in model space, for checkpoints that do not
 * depend on DP, bucket size or layout. Export gathers every rank's shards of m, v and
 * the fp32 master into dense (definition-order, unpadded) host arrays; import takes this
 * rank's shards out of such arrays, whatever run wrote them. Device memory is reached
 * only through the device ops.
 */
#include "llmc/utils.h"
#include "zero1/runtime.h"
#include "zero1/runtime_internal.h"

// A full buffer-layout device array -> the dense host array.
static void buffer_to_dense(Zero1Runtime* rt, const float* full, float* host_full, const size_t* dense_offsets,
                            float* dense) {
    rt->dev.ops->to_host(rt->dev.ctx, rt->dev.compute, host_full, full, rt->layout.numel * sizeof(float));
    rt_sync(rt);
    for (int p = 0; p < rt->num_params; p++) {
        memcpy(dense + dense_offsets[p], host_full + rt->layout.params[p].start, rt->numels[p] * sizeof(float));
    }
}

// Owned shards (owned-array layout) -> every rank's full buffer-layout copy -> dense.
static void export_array(Zero1Runtime* rt, const float* owned, float* full, float* host_full,
                         const size_t* dense_offsets, float* dense) {
    rt_fill(rt, full, 0, rt->layout.numel * sizeof(float));
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1Range* sh = &rt->shards.buckets[b].shard;
        rt_copy(rt, full + sh->start, owned + rt->buckets[b].owned_offset, (sh->end - sh->start) * sizeof(float));
    }
    if (stage1(rt)) {
        for (int b = 0; b < rt->layout.num_buckets; b++) {
            const Zero1Bucket* bk = &rt->layout.buckets[b];
            rt->comm->wait(rt->comm, rt->comm->all_gather(rt->comm, full + bk->start, bk->end - bk->start, ZERO1_FP32, b));
        }
    }
    buffer_to_dense(rt, full, host_full, dense_offsets, dense);
}

void zero1_export_state(Zero1Runtime* rt, const size_t* dense_offsets, float* m, float* v, float* master) {
    zero1_sync_params(rt);
    float* full = (float*)rt_alloc(rt, rt->layout.numel * sizeof(float));
    float* host_full = (float*)mallocCheck(rt->layout.numel * sizeof(float));
    export_array(rt, rt->adam_m, full, host_full, dense_offsets, m);
    export_array(rt, rt->adam_v, full, host_full, dense_offsets, v);
    if (rt->master) {
        export_array(rt, rt->master, full, host_full, dense_offsets, master);
    } else {  // fp32 params are the master, and complete on every rank after the sync
        buffer_to_dense(rt, (const float*)rt->param_buffer, host_full, dense_offsets, master);
    }
    free(host_full);
    rt_free(rt, full);
}

void zero1_import_state(Zero1Runtime* rt, const size_t* dense_offsets, const float* master, const float* m,
                        const float* v) {
    if (master) zero1_load_weights(rt, master, dense_offsets);
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1ParamView* view = &sh->views[i];
            size_t local = rt->buckets[b].owned_offset + view->gbuf_local.start;
            size_t src = dense_offsets[view->param] + view->param_range.start;
            size_t bytes = (view->param_range.end - view->param_range.start) * sizeof(float);
            rt->dev.ops->from_host(rt->dev.ctx, rt->dev.compute, rt->adam_m + local, m + src, bytes);
            rt->dev.ops->from_host(rt->dev.ctx, rt->dev.compute, rt->adam_v + local, v + src, bytes);
        }
    }
    rt_sync(rt);  // the device is done with m and v
}
