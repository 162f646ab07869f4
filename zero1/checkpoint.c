/*
 * zero1/checkpoint.c: the optimizer state in model space, piece by piece, for checkpoints
 * that do not depend on DP, bucket size or layout and that no rank has to hold whole.
 *
 * A rank's pieces are its shard views at DP = the communicator's size (zero1/shards.h):
 * under ZeRO-1 exactly what it owns; replicated (every rank owns every bucket whole) the
 * same slices, so the ranks still save and load disjoint parts in parallel. A piece is
 * (parameter, range inside it), which is model space: the caller maps it to file offsets.
 * Device memory is reached only through the device ops, one range at a time.
 * Errors end the program (fatal).
 */
#include "run/files.h"
#include "zero1/runtime.h"
#include "zero1/runtime_internal.h"

int zero1_checkpoint_pieces(const Zero1Runtime* rt, Zero1Piece* out, int max) {
    Zero1RankShards io;
    char err[256];
    if (zero1_shards_build(&io, &rt->layout, rt->comm->rank, err, sizeof(err)) != 0) fatal("zero1: %s", err);
    int count = 0;
    for (int b = 0; b < io.num_buckets; b++) {
        for (int i = 0; i < io.buckets[b].num_views; i++, count++) {
            if (!out || count >= max) continue;
            out[count].param = io.buckets[b].views[i].param;
            out[count].range = io.buckets[b].views[i].param_range;
        }
    }
    zero1_shards_free(&io);
    return count;
}

// Where a range of parameter p starts in this rank's owned arrays (master, m, v): inside
// one of its views (replicated, the one view that covers the whole parameter).
static size_t owned_index(const Zero1Runtime* rt, int p, Zero1Range r) {
    if (p >= 0 && p < rt->num_params && r.start < r.end) {
        int b = rt->layout.params[p].bucket;
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1ParamView* v = &sh->views[i];
            if (v->param != p || r.start < v->param_range.start || r.end > v->param_range.end) continue;
            return rt->buckets[b].owned_offset + v->gbuf_local.start + (r.start - v->param_range.start);
        }
    }
    fatal("zero1: parameter %d [%zu, %zu) is not held by rank %d", p, r.start, r.end, rt->comm->rank);
}

// The device address of a state's range. fp32 params are their own master (no master
// array): the range sits in the param buffer at the parameter's place. NULL: v of a Muon
// matrix, which has none (a checkpoint holds zeros there).
static float* state_at(Zero1Runtime* rt, Zero1State which, int p, Zero1Range r) {
    size_t owned = owned_index(rt, p, r);
    if (which == ZERO1_STATE_V && zero1_bucket_is_muon(&rt->layout, rt->layout.params[p].bucket)) return NULL;
    if (which == ZERO1_STATE_M) return rt->adam_m + owned;
    if (which == ZERO1_STATE_V) return rt->adam_v + owned;
    if (rt->master) return rt->master + owned;
    return (float*)param_at(rt, rt->layout.params[p].start + r.start);
}

void zero1_read_state(Zero1Runtime* rt, Zero1State which, int param, Zero1Range range, float* host) {
    zero1_sync_params(rt);  // the param buffer (the fp32 master) may still be gathering
    const float* src = state_at(rt, which, param, range);
    if (src == NULL) {
        memset(host, 0, (range.end - range.start) * sizeof(float));
        return;
    }
    rt->dev.ops->to_host(rt->dev.ctx, rt->dev.compute, host, src, (range.end - range.start) * sizeof(float));
    rt_sync(rt);
}

void zero1_write_state(Zero1Runtime* rt, Zero1State which, int param, Zero1Range range, const float* host) {
    zero1_sync_params(rt);  // nothing may still be gathering into the param buffer
    float* dst = state_at(rt, which, param, range);
    if (dst == NULL) {  // what it saved: zeros, or the file is not this run's kind (another optimizer's moments)
        for (size_t i = 0; i < range.end - range.start; i++) {
            if (host[i] != 0.0f) fatal("zero1: the checkpoint's v of Muon matrix %d is not zero: not a Muon checkpoint", param);
        }
        return;
    }
    rt->dev.ops->from_host(rt->dev.ctx, rt->dev.compute, dst, host, (range.end - range.start) * sizeof(float));
    rt_sync(rt);  // a device may read host memory only when the copy runs: the caller reuses it
}

static void gather_bucket(Zero1Runtime* rt, void* buf, int b, Zero1Dtype t) {
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    zero1_comm_wait(rt->comm, zero1_comm_all_gather(rt->comm, buf, bk->end - bk->start, t, b));
}

// Each rank wrote its slot of every bucket (its io shard, zero1_checkpoint_pieces); the
// all-gathers of comm.h fill in the other ranks' slots of the same buckets.
void zero1_finish_import(Zero1Runtime* rt, int steps_done) {
    int gather = rt->comm->size > 1;
    for (int b = 0; gather && !state_sharded(rt) && b < rt->layout.num_buckets; b++) {
        // Replicated: the owned arrays are laid out as the buffer, every bucket whole.
        size_t owned = rt->buckets[b].owned_offset;
        gather_bucket(rt, rt->adam_m + owned, b, ZERO1_FP32);
        if (!zero1_bucket_is_muon(&rt->layout, b)) gather_bucket(rt, rt->adam_v + owned, b, ZERO1_FP32);
        gather_bucket(rt, rt->master ? (void*)(rt->master + owned) : param_at(rt, rt->layout.buckets[b].start), b,
                      ZERO1_FP32);
    }
    // The stored weights from the master, rounded as the last step's AdamW wrote them back.
    AdamWStep last = zero1_adamw_step(rt, 0.0f, steps_done);
    if (steps_done == 0) last.stochastic = 0;  // no step yet: the initial load's rounding
    for (int b = 0; rt->master && b < rt->shards.num_buckets; b++) {
        rt->dev.ops->round_master(rt->dev.ctx, rt->dev.compute, &rt->buckets[b].owned, rt->param_buffer,
                                  rt->opt.param_dtype, rt->master, &last);
    }
    for (int b = 0; gather && state_sharded(rt) && b < rt->layout.num_buckets; b++) {
        gather_bucket(rt, param_at(rt, rt->layout.buckets[b].start), b, rt->opt.param_dtype);
    }
    if (rt->compute != rt->param_buffer) {  // the model computes from what the buffer holds
        rt_convert(rt, rt->compute, rt->opt.compute_dtype, rt->param_buffer, rt->opt.param_dtype, rt->layout.numel);
    }
    rt_sync(rt);
}
