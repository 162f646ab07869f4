/*
 * zero1/runtime.c: the ZeRO-1 step as a small state machine over buckets.
 *
 * Per bucket, two round trips (the seeds' "grad" and "param" paths):
 *   grad:  contributions counted down during the last micro-step's backward -> the
 *          bucket fires (reduce-scatter; all-reduce when replicated) -> waited for in
 *          zero1_finish_step -> the owned shard holds the summed gradient.
 *   param: AdamW writes the owned shard of the param buffer -> all-gather -> the next
 *          forward waits for the bucket just before the first block that reads it.
 * Buckets are in buffer order, which is reverse model order; the forward therefore
 * needs them from the last bucket to the first, and each wait dispatches the next
 * bucket's gather before blocking (Megatron's chained param sync).
 */
#include "zero1/runtime.h"
#include "zero1/runtime_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/utils.h"

// ---------------------------------------------------------------------------- helpers

static const char* name_of(const Zero1Runtime* rt, int p, char* buf, size_t n) {
    if (rt->param_name) return rt->param_name(rt->name_ctx, p, buf, n);
    snprintf(buf, n, "parameter %d", p);
    return buf;
}

static size_t param_elem_size(const Zero1Runtime* rt) { return zero1_dtype_size(rt->opt.param_dtype); }

static void* param_at(const Zero1Runtime* rt, size_t offset) {
    return (char*)rt->param_buffer + offset * param_elem_size(rt);
}

static void* grad_comm_at(const Zero1Runtime* rt, size_t offset) { return (char*)rt->grad_comm + offset * 2; }

// Blocks on h, accounting the time as blocked communication.
static void wait_blocked(Zero1Runtime* rt, Zero1Handle h, const char* what, int bucket) {
    double t0 = zero1_now_us();
    rt->comm->wait(rt->comm, h);
    double t1 = zero1_now_us();
    rt->blocked_ms += (t1 - t0) / 1e3;
    if (t1 - t0 > 1.0) zero1_trace(rt->tracer, TRACE_WAIT, t0, t1, "wait %s b%d", what, bucket);
}

static void *dup_array(const void* src, size_t bytes) {
    void* p = mallocCheck(bytes);
    memcpy(p, src, bytes);
    return p;
}

// ---------------------------------------------------------------------------- grad path

static void record_nonfinite(Zero1Runtime* rt, int b) {
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    for (int p = bk->first_param; p <= bk->last_param; p++) {
        const Zero1ParamPlace* pl = &rt->layout.params[p];
        long long i = rt->ops->first_nonfinite(rt->grads + pl->start, pl->end - pl->start);
        if (i >= 0 && (rt->nan_param < 0 || p < rt->nan_param)) {
            rt->nan_param = p;
            rt->nan_element = i;
        }
    }
}

static void fire_bucket(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    size_t n = bk->end - bk->start;
    if (rt->opt.check_nan) record_nonfinite(rt, b);  // before the gradient leaves this rank
    void* buf = rt->grads + bk->start;
    if (rt->grad_comm) {
        rt->ops->convert(grad_comm_at(rt, bk->start), ZERO1_BF16, buf, ZERO1_FP32, n);
        buf = grad_comm_at(rt, bk->start);
    }
    s->reduce_start_us = zero1_now_us();
    s->reduce = stage1(rt) ? rt->comm->reduce_scatter(rt->comm, buf, n, rt->opt.grad_dtype)
                           : rt->comm->all_reduce(rt->comm, buf, n, rt->opt.grad_dtype);
    s->reduce_in_flight = 1;
    s->reduce_fired = 1;
}

// The reduction of bucket b completed: bring a bf16 result back into the fp32 grads.
static void reduce_completed(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    s->reduce_in_flight = 0;
    zero1_trace(rt->tracer, TRACE_GRAD_COMM, s->reduce_start_us, zero1_now_us(), "%s b%d",
                stage1(rt) ? "reduce-scatter" : "all-reduce", b);
    if (!rt->grad_comm) return;
    const Zero1BucketShard* sh = &rt->shards.buckets[b];
    size_t start = sh->shard.start, n = sh->shard.end - sh->shard.start;
    rt->ops->convert(rt->grads + start, ZERO1_FP32, grad_comm_at(rt, start), ZERO1_BF16, n);
}

void zero1_grad_done(Zero1Runtime* rt, int p) {
    if (!rt->is_last_micro) return;
    rt->seen[p]++;
    if (!rt->opt.overlap_grad_reduce) return;
    int b = rt->layout.params[p].bucket;
    BucketState* s = &rt->buckets[b];
    if (--s->contributions_left == 0) fire_bucket(rt, b);
}

// Every bucket must have fired by the end of backward; otherwise name what never became final.
static void check_all_fired(Zero1Runtime* rt) {
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        if (rt->buckets[b].contributions_left == 0) continue;
        const Zero1Bucket* bk = &rt->layout.buckets[b];
        char names[1024] = "", one[64];
        for (int p = bk->first_param; p <= bk->last_param; p++) {
            if (rt->seen[p] == rt->contributions[p]) continue;
            size_t len = strlen(names);
            snprintf(names + len, sizeof(names) - len, "%s%s (%d of %d)", len ? ", " : "", name_of(rt, p, one, 64),
                     rt->seen[p], rt->contributions[p]);
        }
        fatal("zero1: bucket %d did not fire at step %d: gradients never became final: %s", b, rt->step, names);
    }
}

// ---------------------------------------------------------------------------- param path

static void gather_completed(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    s->gather_state = GATHER_DONE;
    zero1_trace(rt->tracer, TRACE_PARAM_COMM, s->gather_start_us, zero1_now_us(), "all-gather b%d", b);
    if (rt->opt.param_dtype == ZERO1_FP32) return;  // gathered straight into the compute params
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    rt->ops->convert(rt->compute + bk->start, ZERO1_FP32, param_at(rt, bk->start), rt->opt.param_dtype,
                     bk->end - bk->start);
}

static void launch_gather(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    s->gather_start_us = zero1_now_us();
    s->gather = rt->comm->all_gather(rt->comm, param_at(rt, bk->start), bk->end - bk->start, rt->opt.param_dtype);
    s->gather_state = GATHER_IN_FLIGHT;
}

// Makes bucket b's params current: dispatch the next bucket the forward will need, then wait.
static void finish_gather(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    if (s->gather_state == GATHER_DONE) return;
    if (s->gather_state == GATHER_PENDING) launch_gather(rt, b);
    if (b > 0 && rt->buckets[b - 1].gather_state == GATHER_PENDING) launch_gather(rt, b - 1);
    wait_blocked(rt, s->gather, "all-gather", b);
    gather_completed(rt, b);
}

void zero1_forward_block(Zero1Runtime* rt, int block) {
    if (block < 0 || block >= rt->num_blocks) return;
    rt->comm->progress(rt->comm);
    for (int i = 0; i < rt->block_num_buckets[block]; i++) finish_gather(rt, rt->block_buckets[block][i]);
}

void zero1_sync_params(Zero1Runtime* rt) {
    for (int b = rt->layout.num_buckets - 1; b >= 0; b--) finish_gather(rt, b);
}

void zero1_poke(Zero1Runtime* rt) {
    rt->comm->progress(rt->comm);
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        BucketState* s = &rt->buckets[b];
        if (s->reduce_in_flight && rt->comm->test(rt->comm, s->reduce)) reduce_completed(rt, b);
        if (s->gather_state == GATHER_IN_FLIGHT && rt->comm->test(rt->comm, s->gather)) gather_completed(rt, b);
    }
}

// ---------------------------------------------------------------------------- the step

void zero1_begin_step(Zero1Runtime* rt, int step) {
    rt->step = step;
    rt->blocked_ms = 0.0;
    rt->ops->zero(rt->grads, rt->layout.numel * sizeof(float));
    rt->nan_param = -1;
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        rt->buckets[b].contributions_left = rt->buckets[b].contributions_total;
        rt->buckets[b].reduce_fired = 0;
    }
    memset(rt->seen, 0, rt->num_params * sizeof(int));
}

void zero1_begin_micro_step(Zero1Runtime* rt, int is_last) { rt->is_last_micro = is_last; }

// All ranks agree on the first non-finite gradient (one small sum) and stop together.
static void stop_on_nonfinite(Zero1Runtime* rt) {
    float* flags = (float*)callocCheck(rt->num_params, sizeof(float));
    if (rt->nan_param >= 0) flags[rt->nan_param] = 1.0f;
    wait_blocked(rt, rt->comm->all_reduce(rt->comm, flags, rt->num_params, ZERO1_FP32), "nan flags", -1);
    int first = -1;
    for (int p = 0; p < rt->num_params && first < 0; p++) {
        if (flags[p] != 0.0f) first = p;
    }
    free(flags);
    if (first < 0) return;
    char name[64];
    fatal("non-finite gradient in %s at step %d (found by --check-nan before the gradient reduction)",
          name_of(rt, first, name, sizeof(name)), rt->step + 1);
}

static double owned_sum_squares(Zero1Runtime* rt) {
    double sumsq = 0.0;
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1Range* w = &sh->views[i].gbuf_world;
            sumsq += rt->ops->sum_squares(rt->grads + w->start, w->end - w->start);
        }
    }
    return sumsq;
}

static void adamw_owned(Zero1Runtime* rt, const AdamWStep* s) {
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        size_t base = rt->buckets[b].owned_offset;
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1ParamView* v = &sh->views[i];
            size_t w = v->gbuf_world.start, local = base + v->gbuf_local.start, n = v->gbuf_world.end - w;
            rt->ops->adamw(param_at(rt, w), rt->opt.param_dtype, rt->master ? rt->master + local : NULL,
                           rt->grads + w, rt->adam_m + local, rt->adam_v + local, n, s, rt->decays[v->param]);
        }
    }
}

float zero1_finish_step(Zero1Runtime* rt, int step, float lr, double* blocked_ms) {
    if (rt->opt.overlap_grad_reduce) check_all_fired(rt);
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        if (!rt->buckets[b].reduce_fired) fire_bucket(rt, b);
    }
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        if (!rt->buckets[b].reduce_in_flight) continue;
        wait_blocked(rt, rt->buckets[b].reduce, stage1(rt) ? "reduce-scatter" : "all-reduce", b);
        reduce_completed(rt, b);
    }
    if (rt->opt.check_nan) stop_on_nonfinite(rt);

    double sumsq = owned_sum_squares(rt);
    if (stage1(rt)) wait_blocked(rt, rt->comm->all_reduce(rt->comm, &sumsq, 1, ZERO1_FP64), "norm", -1);
    float norm = (float)sqrt(sumsq);
    float clip = rt->opt.grad_clip;
    float grad_scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    AdamWStep s = adamw_step_params(lr, rt->opt.beta1, rt->opt.beta2, rt->opt.eps, rt->opt.weight_decay, step + 1,
                                    grad_scale);
    adamw_owned(rt, &s);

    if (stage1(rt)) {
        for (int b = 0; b < rt->layout.num_buckets; b++) rt->buckets[b].gather_state = GATHER_PENDING;
        if (rt->opt.overlap_param_gather) {
            launch_gather(rt, rt->layout.num_buckets - 1);  // the bucket the forward reads first
        } else {
            for (int b = rt->layout.num_buckets - 1; b >= 0; b--) launch_gather(rt, b);
            zero1_sync_params(rt);
        }
    } else if (rt->opt.param_dtype != ZERO1_FP32) {
        // Replicated with bf16 storage: every rank updated everything; refresh the compute copy.
        rt->ops->convert(rt->compute, ZERO1_FP32, rt->param_buffer, rt->opt.param_dtype, rt->layout.numel);
    }
    *blocked_ms += rt->blocked_ms;
    return norm;
}

// ---------------------------------------------------------------------------- set-up

void zero1_after_load(Zero1Runtime* rt) {
    if (rt->opt.param_dtype == ZERO1_FP32) return;  // the compute params are the param buffer and the master
    for (int b = 0; b < rt->shards.num_buckets; b++) {
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        memcpy(rt->master + rt->buckets[b].owned_offset, rt->compute + sh->shard.start,
               (sh->shard.end - sh->shard.start) * sizeof(float));
    }
    rt->ops->convert(rt->param_buffer, rt->opt.param_dtype, rt->compute, ZERO1_FP32, rt->layout.numel);
    rt->ops->convert(rt->compute, ZERO1_FP32, rt->param_buffer, rt->opt.param_dtype, rt->layout.numel);
}

static int fail(char* err, size_t err_len, const char* msg) {
    if (err) snprintf(err, err_len, "%s", msg);
    return -1;
}

static int build_block_buckets(Zero1Runtime* rt) {
    rt->block_buckets = (int**)callocCheck(rt->num_blocks, sizeof(int*));
    rt->block_num_buckets = (int*)callocCheck(rt->num_blocks, sizeof(int));
    int* mark = (int*)mallocCheck(rt->layout.num_buckets * sizeof(int));
    for (int k = 0; k < rt->num_blocks; k++) {
        for (int b = 0; b < rt->layout.num_buckets; b++) mark[b] = 0;
        for (int p = 0; p < rt->num_params; p++) {
            if (rt->first_block[p] == k) mark[rt->layout.params[p].bucket] = 1;
        }
        rt->block_buckets[k] = (int*)mallocCheck(rt->layout.num_buckets * sizeof(int));
        for (int b = rt->layout.num_buckets - 1; b >= 0; b--) {  // forward order
            if (mark[b]) rt->block_buckets[k][rt->block_num_buckets[k]++] = b;
        }
    }
    free(mark);
    return 0;
}

Zero1Runtime* zero1_runtime_create(const Zero1Options* opt, const Zero1ModelSpec* model, Zero1Comm* comm,
                                   const Zero1DeviceOps* ops, Zero1Tracer* tracer, char* err, size_t err_len) {
    if (opt->param_dtype == ZERO1_FP64 || opt->grad_dtype == ZERO1_FP64) {
        fail(err, err_len, "fp64 buffers are not supported");
        return NULL;
    }
    for (int p = 0; p < model->num_params; p++) {
        if (model->first_block[p] < 0 || model->first_block[p] >= model->num_blocks || model->contributions[p] < 1) {
            fail(err, err_len, "invalid model description (block or contribution count)");
            return NULL;
        }
    }
    Zero1Runtime* rt = (Zero1Runtime*)callocCheck(1, sizeof(Zero1Runtime));
    rt->opt = *opt;
    rt->num_params = model->num_params;
    rt->num_blocks = model->num_blocks;
    rt->numels = (size_t*)dup_array(model->numels, model->num_params * sizeof(size_t));
    rt->decays = (int*)dup_array(model->decays, model->num_params * sizeof(int));
    rt->contributions = (int*)dup_array(model->contributions, model->num_params * sizeof(int));
    rt->first_block = (int*)dup_array(model->first_block, model->num_params * sizeof(int));
    rt->param_name = model->param_name;
    rt->name_ctx = model->name_ctx;
    rt->comm = comm;
    rt->ops = ops;
    rt->tracer = tracer;
    if (zero1_layout_build(&rt->layout, rt->numels, rt->num_params, comm->size, opt->bucket_size, opt->pad_busbw,
                           opt->shared_embedding, err, err_len) != 0) {
        zero1_runtime_destroy(rt);
        return NULL;
    }
    // Replicated: every rank updates every bucket whole, which is the shard map of DP=1.
    Zero1Layout view = rt->layout;
    int shard_rank = comm->rank;
    if (!stage1(rt)) {
        view.dp = 1;
        shard_rank = 0;
    }
    if (zero1_shards_build(&rt->shards, &view, shard_rank, err, err_len) != 0) {
        zero1_runtime_destroy(rt);
        return NULL;
    }
    size_t numel = rt->layout.numel;
    rt->owned_numel = rt->shards.owned_numel;
    rt->grads = (float*)ops->alloc(numel * sizeof(float));
    rt->param_buffer = ops->alloc(numel * param_elem_size(rt));
    if (opt->param_dtype == ZERO1_FP32) {
        rt->compute = (float*)rt->param_buffer;
    } else {
        rt->compute = (float*)ops->alloc(numel * sizeof(float));
        rt->master = (float*)ops->alloc(rt->owned_numel * sizeof(float));
    }
    if (opt->grad_dtype == ZERO1_BF16) rt->grad_comm = ops->alloc(numel * 2);
    rt->adam_m = (float*)ops->alloc(rt->owned_numel * sizeof(float));
    rt->adam_v = (float*)ops->alloc(rt->owned_numel * sizeof(float));

    rt->buckets = (BucketState*)callocCheck(rt->layout.num_buckets, sizeof(BucketState));
    size_t owned = 0;
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        BucketState* s = &rt->buckets[b];
        const Zero1Bucket* bk = &rt->layout.buckets[b];
        for (int p = bk->first_param; p <= bk->last_param; p++) s->contributions_total += rt->contributions[p];
        s->owned_offset = owned;
        owned += rt->shards.buckets[b].shard.end - rt->shards.buckets[b].shard.start;
        s->reduce = s->gather = -1;
        s->gather_state = GATHER_DONE;  // the initial weights are loaded whole on every rank
    }
    rt->seen = (int*)callocCheck(rt->num_params, sizeof(int));
    build_block_buckets(rt);
    rt->nan_param = -1;
    return rt;
}

void zero1_runtime_destroy(Zero1Runtime* rt) {
    if (!rt) return;
    if (rt->buckets) zero1_sync_params(rt);
    const Zero1DeviceOps* ops = rt->ops;
    if (rt->compute != (float*)rt->param_buffer) ops->free(rt->compute);
    ops->free(rt->param_buffer);
    ops->free(rt->grads);
    ops->free(rt->grad_comm);
    ops->free(rt->master);
    ops->free(rt->adam_m);
    ops->free(rt->adam_v);
    for (int k = 0; rt->block_buckets && k < rt->num_blocks; k++) free(rt->block_buckets[k]);
    free(rt->block_buckets);
    free(rt->block_num_buckets);
    free(rt->buckets);
    free(rt->seen);
    zero1_shards_free(&rt->shards);
    zero1_layout_free(&rt->layout);
    free(rt->numels);
    free(rt->decays);
    free(rt->contributions);
    free(rt->first_block);
    free(rt);
}

const Zero1Layout* zero1_layout(const Zero1Runtime* rt) { return &rt->layout; }
const Zero1RankShards* zero1_shards(const Zero1Runtime* rt) { return &rt->shards; }
float* zero1_grad_buffer(Zero1Runtime* rt) { return rt->grads; }
float* zero1_compute_params(Zero1Runtime* rt) { return rt->compute; }
size_t zero1_param_offset(const Zero1Runtime* rt, int p) { return rt->layout.params[p].start; }
size_t zero1_owned_numel(const Zero1Runtime* rt) { return rt->owned_numel; }

size_t zero1_state_bytes(const Zero1Runtime* rt) {
    return rt->owned_numel * sizeof(float) * (rt->master ? 3 : 2);
}
