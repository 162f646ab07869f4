/*
 * zero1/runtime.c: the ZeRO-1 step as a small state machine over buckets.
 *
 * Per bucket, two round trips (Megatron's grad sync and param sync):
 *   grad:  contributions counted down during the last micro-step's backward (to the counts
 *          the first step learned; zero1_register_grad_ready) -> start_grad_sync (the
 *          bucket "fires": reduce-scatter; all-reduce when replicated) -> finish_grad_sync
 *          in zero1_finish_step waits for it. A reduction passes up to four stages, one
 *          function each: group_collective_done (the group's collective completed),
 *          group_shard_ready (the shard holds the group's whole sum, split rows included),
 *          cross_all_reduce_done (instances only: the shard's all-reduce across the groups,
 *          issued in firing order on every rank, comm.h's same-order rule) and
 *          shard_grads_final (the shard's fp32 grads are final).
 *   param: AdamW writes the owned shard of the param buffer -> start_param_sync (all-gather)
 *          -> zero1_finish_param_sync waits for the bucket just before the first forward
 *          block that reads it.
 * With fp32 accumulation (Zero1Options.fp32_accumulation) a bucket's reduce-scatter is an
 * all_to_all of its bf16 copy into a receive temporary instead, and its completion queues
 * this rank's fp32 sum of the received slices into the fp32 grads (sum_slices); the
 * exchanges are chained (each bucket's waits for the one fired before it, Megatron's
 * previous_grad_reduce_bucket_group), so two temporaries serve every bucket.
 * The DP-invariant mode (Zero1Options.dp_invariant) exchanges fp32 slices the same way and
 * sums them with the pairwise tree; before that, every micro-step's gradient of a bucket is
 * folded into partial buffers as soon as it is final (fold_micro_step), and the grad norm
 * is summed exactly.
 * Buckets are in buffer order, which is reverse model order; the forward therefore
 * needs them from the last bucket to the first, and each wait starts the next bucket's
 * param sync before waiting (Megatron's chained param sync).
 *
 * All buffer work is queued on the device's compute stream through zero1/device_ops.h;
 * collectives follow zero1/comm.h's ordering rules. So on a GPU nothing here blocks the
 * host (a "wait" makes the compute stream wait), and on the CPU the same calls block.
 * Errors end the program (fatal), naming the parameter or the option at fault.
 */
#include "zero1/runtime.h"
#include "zero1/runtime_internal.h"
#include "zero1/layout_layerwise.h"
#include "zero1/split_embedding.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/files.h"

// ---------------------------------------------------------------------------- helpers

static const char* name_of(const Zero1Runtime* rt, int p, char* buf, size_t n) {
    if (rt->param_name) return rt->param_name(rt->name_ctx, p, buf, n);
    snprintf(buf, n, "parameter %d", p);
    return buf;
}

static void* grad_comm_at(const Zero1Runtime* rt, size_t offset) { return (char*)rt->grad_comm + offset * 2; }

// Waits for h on c (on the CPU the host blocks; on a GPU the compute stream waits),
// accounting the host time as blocked communication.
static void wait_blocked(Zero1Runtime* rt, Zero1Comm* c, Zero1Handle h, const char* what, int bucket) {
    double t0 = zero1_now_us();
    zero1_comm_wait(c, h);
    double t1 = zero1_now_us();
    rt->blocked_ms += (t1 - t0) / 1e3;
    if (t1 - t0 > 1.0) {
        if (bucket >= 0) zero1_trace(rt->tracer, TRACE_WAIT, t0, t1, "wait %s b%d", what, bucket);
        else zero1_trace(rt->tracer, TRACE_WAIT, t0, t1, "wait %s", what);
    }
}

// Where bucket data is reduced: the fp32 grads, or their bf16 copy for a bf16 reduction.
static void* reduce_buffer_at(const Zero1Runtime* rt, size_t offset) {
    return rt->grad_comm ? grad_comm_at(rt, offset) : (void*)(rt->grads + offset);
}

// Across instances the shard is all-reduced where the group left it: in the bf16 copy for a
// bf16 reduction, but with fp32 accumulation the fp32 grads already hold the group's sum
// (the shard: 1/DP of the bucket), so it crosses in fp32.
static Zero1Dtype cross_dtype(const Zero1Runtime* rt) { return fp32_accumulating(rt) ? ZERO1_FP32 : rt->opt.grad_dtype; }
static void* cross_buffer_at(const Zero1Runtime* rt, size_t offset) {
    return fp32_accumulating(rt) ? (void*)(rt->grads + offset) : reduce_buffer_at(rt, offset);
}

static const char* reduce_name(const Zero1Runtime* rt) {
    return exchanging_slices(rt) ? "all-to-all" : state_sharded(rt) ? "reduce-scatter" : "all-reduce";
}

// The step's sum of squares: one double, or the DP-invariant mode's exact limbs.
static int sumsq_words(const Zero1Runtime* rt) { return rt->opt.dp_invariant ? ZERO1_EXACT_WORDS : 1; }
static void sum_squares(Zero1Runtime* rt, const BucketState* s) {
    const Zero1DeviceOps* ops = rt->dev.ops;
    if (rt->opt.dp_invariant) ops->sum_squares_exact(rt->dev.ctx, rt->dev.compute, &s->owned, rt->grads, rt->sumsq);
    else ops->sum_squares(rt->dev.ctx, rt->dev.compute, &s->owned, rt->grads, rt->sumsq);
}

static void* dup_array(const void* src, size_t bytes) {
    void* p = mallocCheck(bytes);
    memcpy(p, src, bytes);
    return p;
}

// ---------------------------------------------------------------------------- grad path

// The split embedding's parameter has a bucket of its own (Zero1Options.shared_embedding).
static int split_bucket(const Zero1Runtime* rt) { return rt->layout.params[rt->opt.shared_embedding].bucket; }
static int is_split_bucket(const Zero1Runtime* rt, int b) { return rt->split && split_bucket(rt) == b; }

static void group_collective_done(Zero1Runtime* rt, int b);

// fp32 accumulation, DP-invariant: the bucket fired before this one must be done exchanging (its sum
// queued) before this one starts, so that its receive temporary is free for the bucket
// after this one. Blocking here is accounted like any other wait.
static void drain_previous_exchange(Zero1Runtime* rt) {
    if (rt->num_fired == 0) return;
    int prev = rt->fire_order[rt->num_fired - 1];
    if (!rt->buckets[prev].reduce_in_flight) return;
    wait_blocked(rt, rt->comm, rt->buckets[prev].reduce, "all-to-all", prev);
    group_collective_done(rt, prev);
}

// fp32 accumulation's and the DP-invariant mode's exchange: the uniform all_to_all_v, slice
// j of the bucket (its bf16 copy, or the fp32 grads) to rank j, and rank j's slice of this
// rank's shard into recv[j*n_per_rank].
static Zero1Handle exchange_slices(Zero1Runtime* rt, const void* send, void* recv, size_t n_per_rank, int b) {
    size_t* counts = rt->exchange_counts;
    size_t* offsets = counts + rt->comm->size;
    for (int j = 0; j < rt->comm->size; j++) {
        counts[j] = n_per_rank;
        offsets[j] = (size_t)j * n_per_rank;
    }
    return zero1_comm_all_to_all_v(rt->comm, send, counts, offsets, recv, counts, offsets, exchange_dtype(rt), b);
}

// DP-invariant: micro-step rt->micro's gradient of bucket b joins the binary counter of
// zero1/exact_sum.h, whose level l is partials[l]: a micro-step with t trailing one bits
// completes t pairs (carry = partials[l] + carry for l < t). The last one leaves the rank's
// pairwise sum in the grads; the others park their carry in partials[t] and zero the bucket
// for the next backward, which accumulates into it.
static void fold_micro_step(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    if (!rt->opt.dp_invariant || s->folded == rt->micro) return;
    s->folded = rt->micro;
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    size_t n = bk->end - bk->start;
    float* grads = rt->grads + bk->start;
    int completes = 0;
    while ((rt->micro >> completes) & 1) completes++;
    int last = rt->micro == rt->opt.micro_steps - 1;
    float* carry = last ? grads : rt->partials[completes] + bk->start;
    for (int l = 0; l < completes; l++) {
        rt->dev.ops->add(rt->dev.ctx, rt->dev.compute, carry, rt->partials[l] + bk->start, l == 0 ? grads : carry, n);
    }
    if (last) return;
    if (completes == 0) rt_copy(rt, carry, grads, n * sizeof(float));
    rt_fill(rt, grads, 0, n * sizeof(float));
}

// Megatron's start_grad_sync for one bucket: its reduction launched (reduce-scatter,
// all-reduce when replicated, or the fp32-accumulation exchange).
static void start_grad_sync(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    size_t n = bk->end - bk->start;
    fold_micro_step(rt, b);  // DP-invariant: the rank's pairwise sum first
    if (rt->opt.check_nan) {  // flag non-finite local gradients before they leave this rank
        rt->dev.ops->nonfinite_flags(rt->dev.ctx, rt->dev.compute, &s->whole, rt->grads, rt->nan_flags);
    }
    void* buf = reduce_buffer_at(rt, bk->start);
    if (rt->grad_comm) rt_convert(rt, buf, ZERO1_BF16, rt->grads + bk->start, ZERO1_FP32, n);
    if (exchanging_slices(rt)) drain_previous_exchange(rt);
    s->reduce_start_us = zero1_now_us();
    Zero1ReduceOp op = grad_reduce_op(rt);
    if (exchanging_slices(rt)) {
        s->recv_slot = rt->num_fired % 2;
        s->reduce = exchange_slices(rt, buf, rt->recv_slots[s->recv_slot], n / (size_t)rt->comm->size, b);
    } else if (state_sharded(rt)) {
        s->reduce = zero1_comm_reduce_scatter(rt->comm, buf, n, rt->opt.grad_dtype, op, b);
    } else {
        s->reduce = zero1_comm_all_reduce(rt->comm, buf, n, rt->opt.grad_dtype, op, b);
    }
    s->reduce_in_flight = 1;
    s->grad_sync_started = 1;
    // The split embedding's bucket takes its place in the firing order when its rows go out.
    if (!is_split_bucket(rt, b)) rt->fire_order[rt->num_fired++] = b;
}

// Stage 4 (last) of a bucket's reduction: the shard's grads are final (across instances
// too); a bf16 result is brought back into the fp32 grads.
static void shard_grads_final(Zero1Runtime* rt, int b) {
    if (!rt->grad_comm || fp32_accumulating(rt)) return;  // fp32 accumulation: the grads hold it already
    const Zero1Range* sh = &rt->shards.buckets[b].shard;
    rt_convert(rt, rt->grads + sh->start, ZERO1_FP32, grad_comm_at(rt, sh->start), ZERO1_BF16, sh->end - sh->start);
}

// Issues the all-reduces across instances of every bucket whose group shard is ready, in
// the order the buckets fired, up to the first one still reducing in its group.
static void start_cross_all_reduces(Zero1Runtime* rt) {
    while (rt->num_crossed < rt->num_fired) {
        int b = rt->fire_order[rt->num_crossed];
        BucketState* s = &rt->buckets[b];
        if (!s->awaiting_cross) return;
        const Zero1Range* sh = &rt->shards.buckets[b].shard;
        s->awaiting_cross = 0;
        s->cross_start_us = zero1_now_us();
        s->cross = zero1_comm_all_reduce(rt->cross, cross_buffer_at(rt, sh->start), sh->end - sh->start,
                                         cross_dtype(rt), grad_reduce_op(rt), b);
        s->cross_in_flight = 1;
        rt->num_crossed++;
    }
}

// Stage 2: the shard holds the group's whole sum (stage 1 done and the split rows, if any,
// arrived and added): final without instances, else it goes across them (fp32 there: the
// rows join before the all-reduce).
static void group_shard_ready(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    if (!rt->cross) {
        shard_grads_final(rt, b);
        if (is_split_bucket(rt, b)) split_embedding_add(rt->split, &rt->dev, rt->grads);
        return;
    }
    if (is_split_bucket(rt, b)) split_embedding_add(rt->split, &rt->dev, rt->grads);
    s->awaiting_cross = 1;
    // Where the issue order across communicators matters (comm.h), a test() during the
    // backward only notes the completion; zero1_finish_step issues them, in firing order.
    if (!rt->cross->issue_order_matters || rt->in_finish_grad_sync) start_cross_all_reduces(rt);
}

// Stage 1: the group's collective of bucket b has completed (waited for, or tested complete).
static void group_collective_done(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    s->reduce_in_flight = 0;
    if (!rt->comm->traces_itself) {
        zero1_trace(rt->tracer, TRACE_GRAD_COMM, s->reduce_start_us, zero1_now_us(), "%s b%d", reduce_name(rt), b);
    }
    const Zero1Range* sh = &rt->shards.buckets[b].shard;
    if (rt->opt.dp_invariant && exchanging_slices(rt)) {  // the ranks' subtrees, the tree finished
        rt->dev.ops->sum_slices_pairwise(rt->dev.ctx, rt->dev.compute, rt->grads + sh->start,
                                         (const float*)rt->recv_slots[s->recv_slot], rt->comm->size,
                                         sh->end - sh->start);
    } else if (fp32_accumulating(rt)) {  // the received slices of this rank's shard, summed in fp32 into the grads
        float scale = rt->opt.average_in_collective ? zero1_avg_scale(rt->comm->size) : 1.0f;
        rt->dev.ops->sum_slices(rt->dev.ctx, rt->dev.compute, rt->grads + sh->start, rt->recv_slots[s->recv_slot],
                                ZERO1_BF16, rt->comm->size, sh->end - sh->start, scale);
    }
    if (is_split_bucket(rt, b) && !s->rows_arrived) return;  // split_rows_arrived goes on
    group_shard_ready(rt, b);
}

// The split embedding's rows go to the owners of their slots. Its bucket takes its place in
// the firing order now: its shard goes across instances only once the rows are in.
static void start_split_rows_exchange(Zero1Runtime* rt) {
    int b = split_bucket(rt);
    BucketState* s = &rt->buckets[b];
    s->rows_start_us = zero1_now_us();
    s->rows = split_embedding_send(rt->split, rt->comm, b);
    s->rows_in_flight = 1;
    rt->fire_order[rt->num_fired++] = b;
}

// The split embedding's rows have arrived; they are added once the dense part is reduced.
static void split_rows_arrived(Zero1Runtime* rt) {
    int b = split_bucket(rt);
    BucketState* s = &rt->buckets[b];
    s->rows_in_flight = 0;
    s->rows_arrived = 1;
    if (!rt->comm->traces_itself) {
        zero1_trace(rt->tracer, TRACE_GRAD_COMM, s->rows_start_us, zero1_now_us(), "all-to-all b%d", b);
    }
    if (s->grad_sync_started && !s->reduce_in_flight) group_shard_ready(rt, b);
}

// Stage 3 (instances only): the all-reduce of the shard across instances has completed.
static void cross_all_reduce_done(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    s->cross_in_flight = 0;
    if (!rt->cross->traces_itself) {
        zero1_trace(rt->tracer, TRACE_GRAD_COMM, s->cross_start_us, zero1_now_us(), "all-reduce across instances b%d",
                    b);
    }
    shard_grads_final(rt, b);
}

// The split embedding's rows for the model: only the embedding's, only in the last micro-step.
float* zero1_embedding_rows(Zero1Runtime* rt, int param, const int* tokens, int n, const int** row_of_position) {
    if (!rt->split || param != rt->opt.shared_embedding || !rt->is_last_micro) return NULL;
    if (rt->split_rows_given) fatal("zero1: the embedding's rows were asked for twice in one step");
    float* rows = split_embedding_plan(rt->split, rt->comm, &rt->dev, tokens, n, row_of_position);
    rt->split_rows_given = 1;
    return rows;
}

// Megatron's register_grad_ready. Gradient readiness is learned, not declared: the first step
// only counts each parameter's contributions in its last micro-step (no bucket fires during
// that backward: its finish fires them all, in order), and from then on a bucket fires as soon
// as every parameter in it has had the counted number. So the model never has to say that wte gets two (classifier and
// encoder), and a model that changes what it reports is caught instead of firing early.
void zero1_register_grad_ready(Zero1Runtime* rt, int p) {
    if (!rt->is_last_micro && !rt->opt.dp_invariant) return;  // DP-invariant: every micro-step folds
    // The split embedding's encoder rows are ready: they travel sparsely, not a dense contribution.
    if (rt->split && p == rt->opt.shared_embedding && rt->split_rows_given) {
        if (rt->opt.overlap_grad_reduce) start_split_rows_exchange(rt);
        return;
    }
    rt->seen[p]++;
    if (!rt->counts_learned) return;
    if (rt->seen[p] > rt->learned[p]) {  // its bucket may already be reducing: stop now
        char name[64];
        fatal("zero1: %s had %d gradient contributions at step %d, but %d at the first step, which set when its "
              "bucket fires", name_of(rt, p, name, sizeof(name)), rt->seen[p], rt->step + 1, rt->learned[p]);
    }
    if (!rt->opt.overlap_grad_reduce) return;
    int b = rt->layout.params[p].bucket;
    BucketState* s = &rt->buckets[b];
    if (--s->contributions_left != 0) return;
    if (rt->is_last_micro) start_grad_sync(rt, b);
    else fold_micro_step(rt, b);
}

// The end of the first step's backward: its counts become the readiness rule.
static void learn_counts(Zero1Runtime* rt) {
    memcpy(rt->learned, rt->seen, rt->num_params * sizeof(int));
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        const Zero1Bucket* bk = &rt->layout.buckets[b];
        rt->buckets[b].contributions_total = 0;
        for (int i = 0; i < zero1_bucket_num_params(bk); i++) {
            rt->buckets[b].contributions_total += rt->learned[zero1_bucket_param(bk, i)];
        }
    }
    rt->counts_learned = 1;
}

// Every later step must see the learned counts; a missing contribution (its bucket never
// fired, or fired without it) is named with both counts.
static void check_counts(Zero1Runtime* rt) {
    char names[1024] = "", one[64];
    for (int p = 0; p < rt->num_params; p++) {
        if (rt->seen[p] == rt->learned[p]) continue;
        size_t len = strlen(names);
        snprintf(names + len, sizeof(names) - len, "%s%s (%d, the first step %d)", len ? ", " : "",
                 name_of(rt, p, one, sizeof(one)), rt->seen[p], rt->learned[p]);
    }
    if (names[0]) {
        fatal("zero1: gradient contributions at step %d differ from the first step's, which set when each bucket "
              "fires: %s", rt->step + 1, names);
    }
}

// ---------------------------------------------------------------------------- param path

// Bucket b's all-gather has completed: the model reads its params (after a conversion when
// it computes in another dtype).
static void bucket_params_gathered(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    s->gather_state = GATHER_DONE;
    if (!rt->comm->traces_itself) {
        zero1_trace(rt->tracer, TRACE_PARAM_COMM, s->gather_start_us, zero1_now_us(), "all-gather b%d", b);
    }
    if (rt->compute == rt->param_buffer) return;  // gathered straight into the weights the model reads
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    rt_convert(rt, compute_at(rt, bk->start), rt->opt.compute_dtype, param_at(rt, bk->start), rt->opt.param_dtype,
               bk->end - bk->start);
}

// Megatron's start_param_sync for one bucket: its all-gather launched.
static void start_param_sync(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    const Zero1Bucket* bk = &rt->layout.buckets[b];
    s->gather_start_us = zero1_now_us();
    s->gather = zero1_comm_all_gather(rt->comm, param_at(rt, bk->start), bk->end - bk->start, rt->opt.param_dtype, b);
    s->gather_state = GATHER_IN_FLIGHT;
}

// Makes bucket b's params current: dispatch the next bucket the forward will need, then wait.
static void finish_bucket_param_sync(Zero1Runtime* rt, int b) {
    BucketState* s = &rt->buckets[b];
    if (s->gather_state == GATHER_DONE) return;
    if (s->gather_state == GATHER_PENDING) start_param_sync(rt, b);
    if (b > 0 && rt->buckets[b - 1].gather_state == GATHER_PENDING) start_param_sync(rt, b - 1);
    wait_blocked(rt, rt->comm, s->gather, "all-gather", b);
    bucket_params_gathered(rt, b);
}

void zero1_finish_param_sync(Zero1Runtime* rt, int block) {
    int k = block - rt->first_block_number;
    if (k < 0 || k >= rt->num_blocks) return;  // a block that reads no parameter first
    zero1_comm_progress(rt->comm);
    for (int i = 0; i < rt->block_num_buckets[k]; i++) finish_bucket_param_sync(rt, rt->block_buckets[k][i]);
}

void zero1_sync_params(Zero1Runtime* rt) {
    for (int b = rt->layout.num_buckets - 1; b >= 0; b--) finish_bucket_param_sync(rt, b);
}

void zero1_progress(Zero1Runtime* rt) {
    zero1_comm_progress(rt->comm);
    if (rt->cross) zero1_comm_progress(rt->cross);
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        BucketState* s = &rt->buckets[b];
        if (s->reduce_in_flight && zero1_comm_test(rt->comm, s->reduce)) group_collective_done(rt, b);
        if (s->cross_in_flight && zero1_comm_test(rt->cross, s->cross)) cross_all_reduce_done(rt, b);
        if (s->gather_state == GATHER_IN_FLIGHT && zero1_comm_test(rt->comm, s->gather)) bucket_params_gathered(rt, b);
    }
    if (rt->split) {
        BucketState* s = &rt->buckets[split_bucket(rt)];
        if (s->rows_in_flight && zero1_comm_test(rt->comm, s->rows)) split_rows_arrived(rt);
    }
}

// ---------------------------------------------------------------------------- the step

void zero1_begin_step(Zero1Runtime* rt, int step) {
    rt->step = step;
    rt->comm->step = step;
    rt->blocked_ms = 0.0;
    rt_fill(rt, rt->grads, 0, rt->layout.numel * sizeof(float));
    rt_fill(rt, rt->sumsq, 0, sumsq_words(rt) * sizeof(double));
    if (rt->nan_flags) rt_fill(rt, rt->nan_flags, 0, rt->num_params * sizeof(float));
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        rt->buckets[b].contributions_left = rt->buckets[b].contributions_total;
        rt->buckets[b].grad_sync_started = 0;
        rt->buckets[b].rows_arrived = 0;
    }
    rt->num_fired = rt->num_crossed = 0;
    memset(rt->seen, 0, rt->num_params * sizeof(int));
    rt->split_rows_given = 0;
    rt->micro = -1;
    for (int b = 0; b < rt->layout.num_buckets; b++) rt->buckets[b].folded = -1;
}

// DP-invariant: every micro-step counts its gradient contributions (each bucket folds when
// its own are in), so between two micro-steps the counts are checked and reset, and what
// has not folded (the first step, before the counts are learned; no overlap) folds now.
static void next_micro_step(Zero1Runtime* rt, int is_last) {
    if (rt->micro >= 0) {
        if (rt->counts_learned) check_counts(rt);
        for (int b = 0; b < rt->layout.num_buckets; b++) fold_micro_step(rt, b);
    }
    rt->micro++;
    if (is_last != (rt->micro == rt->opt.micro_steps - 1)) {
        fatal("zero1: --dp-invariant was set up for %d micro-steps per step, but micro-step %d of step %d is%s the "
              "last", rt->opt.micro_steps, rt->micro + 1, rt->step + 1, is_last ? "" : " not");
    }
    memset(rt->seen, 0, rt->num_params * sizeof(int));
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        rt->buckets[b].contributions_left = rt->buckets[b].contributions_total;
    }
}

void zero1_begin_micro_step(Zero1Runtime* rt, int is_last) {
    if (rt->opt.dp_invariant) next_micro_step(rt, is_last);
    rt->is_last_micro = is_last;
}

// All ranks agree on the first parameter with a non-finite gradient (one small sum over
// every rank: the group's, then across instances) and stop together, naming it. The host
// reads the flags: --check-nan costs one sync a step.
static void stop_on_nonfinite(Zero1Runtime* rt) {
    Zero1Comm* comms[2] = {rt->comm, rt->cross};
    for (int i = 0; i < 2; i++) {
        Zero1Comm* c = comms[i];
        if (!c || c->size == 1) continue;
        Zero1Handle h =
            zero1_comm_all_reduce(c, rt->nan_flags, rt->num_params, ZERO1_FP32, ZERO1_SUM, ZERO1_LABEL_NAN_FLAGS);
        wait_blocked(rt, c, h, "nan flags", ZERO1_LABEL_NAN_FLAGS);
    }
    rt->dev.ops->to_host(rt->dev.ctx, rt->dev.compute, rt->nan_flags_host, rt->nan_flags,
                         rt->num_params * sizeof(float));
    rt_sync(rt);
    for (int p = 0; p < rt->num_params; p++) {
        if (rt->nan_flags_host[p] == 0.0f) continue;
        char name[64];
        fatal("non-finite gradient in %s at step %d (found by --check-nan before the gradient reduction)",
              name_of(rt, p, name, sizeof(name)), rt->step + 1);
    }
}

// Megatron's finish_grad_sync: the buckets not started during the backward are started
// (one group, except where slices are exchanged: there each exchange waits for the one
// before it, which no group allows), then every reduction is waited for, through all its
// stages. Each bucket's share of the norm is queued as soon as its grads are final (with
// instances: every group reduction first, which issues the ones across them).
static void finish_grad_sync(Zero1Runtime* rt) {
    int nb = rt->layout.num_buckets;
    rt->in_finish_grad_sync = 1;
    int grouped = !exchanging_slices(rt);
    if (grouped) zero1_comm_group_begin(rt->comm);
    for (int b = 0; b < nb; b++) {
        if (!rt->buckets[b].grad_sync_started) start_grad_sync(rt, b);
    }
    if (rt->split && !rt->opt.overlap_grad_reduce) start_split_rows_exchange(rt);
    if (grouped) zero1_comm_group_end(rt->comm);
    for (int b = 0; b < nb; b++) {
        BucketState* s = &rt->buckets[b];
        if (s->reduce_in_flight) {
            wait_blocked(rt, rt->comm, s->reduce, reduce_name(rt), b);
            group_collective_done(rt, b);
        }
        if (s->rows_in_flight) {
            wait_blocked(rt, rt->comm, s->rows, "all-to-all", b);
            split_rows_arrived(rt);
        }
        if (!rt->cross) sum_squares(rt, s);
    }
    if (rt->cross) start_cross_all_reduces(rt);  // those a test() saw complete and left for now
    for (int b = 0; rt->cross && b < nb; b++) {
        BucketState* s = &rt->buckets[b];
        if (s->cross_in_flight) {
            wait_blocked(rt, rt->cross, s->cross, "all-reduce across instances", b);
            cross_all_reduce_done(rt, b);
        }
        sum_squares(rt, s);
    }
    rt->in_finish_grad_sync = 0;
}

void zero1_finish_step(Zero1Runtime* rt, int step, float lr, int (*skip)(void* ctx), void* skip_ctx,
                       double* blocked_ms) {
    const Zero1DeviceOps* ops = rt->dev.ops;
    int nb = rt->layout.num_buckets;
    if (rt->split && !rt->split_rows_given) {
        char name[64];
        fatal("zero1: --split-embedding: the model did not ask for %s's rows (embedding_grad_rows) in the last "
              "micro-step of step %d", name_of(rt, rt->opt.shared_embedding, name, sizeof(name)), step + 1);
    }
    if (rt->opt.dp_invariant && rt->micro != rt->opt.micro_steps - 1) {
        fatal("zero1: --dp-invariant was set up for %d micro-steps per step, but step %d had %d", rt->opt.micro_steps,
              step + 1, rt->micro + 1);
    }
    if (rt->counts_learned) check_counts(rt);
    else learn_counts(rt);
    finish_grad_sync(rt);
    if (rt->opt.check_nan) stop_on_nonfinite(rt);
    // Every group holds the same reduced grads: the norm is the group's (DP-invariant: the
    // limbs, integers, sum exactly in any order).
    if (state_sharded(rt)) {
        Zero1Handle h = zero1_comm_all_reduce(rt->comm, rt->sumsq, sumsq_words(rt), ZERO1_FP64, ZERO1_SUM,
                                              ZERO1_LABEL_GRAD_NORM);
        wait_blocked(rt, rt->comm, h, "norm", ZERO1_LABEL_GRAD_NORM);
    }
    if (rt->opt.dp_invariant) {
        ops->norm_and_clip_exact(rt->dev.ctx, rt->dev.compute, rt->sumsq, rt->opt.grad_clip, rt->norm);
    } else {
        ops->norm_and_clip(rt->dev.ctx, rt->dev.compute, rt->sumsq, rt->opt.grad_clip, rt->norm);
    }
    // -sl/-sg: no AdamW, no all-gather; every bucket's params are current (the forward
    // waited for them all), so the next forward reads them unchanged.
    if (skip && skip(skip_ctx)) {
        *blocked_ms += rt->blocked_ms;
        return;
    }

    // AdamW in the order the next forward reads the buckets, so that the first all-gather
    // can go out while the others are still being updated.
    AdamWStep s = zero1_adamw_step(rt, lr, step + 1);
    Zero1MuonStep muon = {lr, rt->opt.weight_decay, rt->opt.muon_config, rt->opt.muon_ns_bf16};
    for (int b = nb - 1; b >= 0; b--) {
        const Zero1SpanList* owned = &rt->buckets[b].owned;
        if (zero1_bucket_is_muon(&rt->layout, b)) {  // whole matrices; their m holds Muon's momentum, v stays 0
            ops->muon(rt->dev.ctx, rt->dev.compute, owned, rt->matrices, (float*)rt->param_buffer, rt->master,
                      rt->grads, rt->adam_m, &muon, rt->norm + 1);
            if (rt->master) {
                ops->round_master(rt->dev.ctx, rt->dev.compute, owned, rt->param_buffer, rt->opt.param_dtype,
                                  rt->master, &s);
            }
        } else {
            ops->adamw(rt->dev.ctx, rt->dev.compute, owned, rt->param_buffer, rt->opt.param_dtype, rt->master,
                       rt->grads, rt->adam_m, rt->adam_v, &s, rt->norm + 1);
        }
        if (state_sharded(rt)) {
            rt->buckets[b].gather_state = GATHER_PENDING;
            if (rt->opt.overlap_param_gather && b == nb - 1) start_param_sync(rt, b);
        } else if (rt->compute != rt->param_buffer) {  // replicated: every rank updated it all
            const Zero1Bucket* bk = &rt->layout.buckets[b];
            rt_convert(rt, compute_at(rt, bk->start), rt->opt.compute_dtype, param_at(rt, bk->start),
                       rt->opt.param_dtype, bk->end - bk->start);
        }
    }
    if (state_sharded(rt) && !rt->opt.overlap_param_gather) {
        zero1_comm_group_begin(rt->comm);
        for (int b = nb - 1; b >= 0; b--) start_param_sync(rt, b);
        zero1_comm_group_end(rt->comm);
        zero1_sync_params(rt);
    }
    *blocked_ms += rt->blocked_ms;
}

float zero1_read_norm(Zero1Runtime* rt) {
    rt->dev.ops->to_host(rt->dev.ctx, rt->dev.compute, rt->norm_host, rt->norm, 2 * sizeof(float));
    rt_sync(rt);
    return rt->norm_host[0];
}

// ---------------------------------------------------------------------------- instances and checkpoints

int zero1_holds_checkpoint_pieces(const Zero1Runtime* rt) { return !rt->cross || rt->cross->rank == 0; }

// n floats of -0.0 into device memory, through a bounded host buffer.
static void fill_negative_zero(Zero1Runtime* rt, float* p, size_t n) {
    size_t chunk = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
    float* host = (float*)rt->dev.ops->alloc_host(rt->dev.ctx, chunk * sizeof(float));
    for (size_t i = 0; i < chunk; i++) host[i] = -0.0f;
    for (size_t at = 0; at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        rt->dev.ops->from_host(rt->dev.ctx, rt->dev.compute, p + at, host, k * sizeof(float));
    }
    rt_sync(rt);  // the device is done with host
    rt->dev.ops->free_host(rt->dev.ctx, host);
}

// Group 0's values of n floats at p on every rank of cross.
static void copy_from_group0(Zero1Runtime* rt, float* p, size_t n, int bucket) {
    if (n == 0) return;
    if (rt->cross->rank != 0) fill_negative_zero(rt, p, n);
    zero1_comm_wait(rt->cross, zero1_comm_all_reduce(rt->cross, p, n, ZERO1_FP32, ZERO1_SUM, bucket));
}

void zero1_share_state_across(Zero1Runtime* rt) {
    if (!rt->cross) return;
    zero1_sync_params(rt);  // nothing may still be gathering into the param buffer
    copy_from_group0(rt, rt->adam_m, rt->owned_numel, ZERO1_LABEL_NONE);
    copy_from_group0(rt, rt->adam_v, rt->adamw_owned_numel, ZERO1_LABEL_NONE);
    if (rt->master) {
        copy_from_group0(rt, rt->master, rt->owned_numel, ZERO1_LABEL_NONE);
        return;
    }
    for (int b = 0; b < rt->shards.num_buckets; b++) {  // fp32 params are the master: the owned slots
        const Zero1Range* sh = &rt->shards.buckets[b].shard;
        copy_from_group0(rt, (float*)param_at(rt, sh->start), sh->end - sh->start, b);
    }
}

// ---------------------------------------------------------------------------- set-up

// The initial weights round to nearest even whatever Zero1Options.stochastic_rounding says:
// no step has run, and the stochastic bits are a step's (a resume at step 0 matches it).
void zero1_load_weights(Zero1Runtime* rt, const float* dense, const size_t* dense_offsets) {
    zero1_sync_params(rt);  // nothing may still be gathering into the buffers
    size_t numel = rt->layout.numel;
    float* staging = (float*)rt_alloc(rt, numel * sizeof(float));  // fp32 weights in buffer layout
    for (int p = 0; p < rt->num_params; p++) {
        rt->dev.ops->from_host(rt->dev.ctx, rt->dev.compute, staging + rt->layout.params[p].start,
                               dense + dense_offsets[p], rt->numels[p] * sizeof(float));
    }
    for (int b = 0; rt->master && b < rt->shards.num_buckets; b++) {
        const Zero1Range* sh = &rt->shards.buckets[b].shard;
        rt_copy(rt, rt->master + rt->buckets[b].owned_offset, staging + sh->start, (sh->end - sh->start) * sizeof(float));
    }
    rt_convert(rt, rt->param_buffer, rt->opt.param_dtype, staging, ZERO1_FP32, numel);
    if (rt->compute != rt->param_buffer) {  // the model computes from what the buffer holds
        rt_convert(rt, rt->compute, rt->opt.compute_dtype, rt->param_buffer, rt->opt.param_dtype, numel);
    }
    rt_sync(rt);  // the device is done with dense and staging
    rt_free(rt, staging);
}

// Per forward block, in the model's numbering from the lowest first_block on: the buckets
// whose params it reads first, in the order the forward needs them.
static void build_block_buckets(Zero1Runtime* rt) {
    int lo = 0, hi = -1;
    for (int p = 0; p < rt->num_params; p++) {
        if (p == 0 || rt->first_block[p] < lo) lo = rt->first_block[p];
        if (p == 0 || rt->first_block[p] > hi) hi = rt->first_block[p];
    }
    rt->first_block_number = lo;
    rt->num_blocks = hi - lo + 1;
    rt->block_buckets = (int**)callocCheck(rt->num_blocks, sizeof(int*));
    rt->block_num_buckets = (int*)callocCheck(rt->num_blocks, sizeof(int));
    int* mark = (int*)mallocCheck(rt->layout.num_buckets * sizeof(int));
    for (int k = 0; k < rt->num_blocks; k++) {
        for (int b = 0; b < rt->layout.num_buckets; b++) mark[b] = 0;
        for (int p = 0; p < rt->num_params; p++) {
            if (rt->first_block[p] - lo == k) mark[rt->layout.params[p].bucket] = 1;
        }
        rt->block_buckets[k] = (int*)mallocCheck(rt->layout.num_buckets * sizeof(int));
        for (int b = rt->layout.num_buckets - 1; b >= 0; b--) {  // forward order
            if (mark[b]) rt->block_buckets[k][rt->block_num_buckets[k]++] = b;
        }
    }
    free(mark);
}

static void span_list_upload(Zero1Runtime* rt, Zero1SpanList* list, Zero1Span* host, int count) {
    list->count = count;
    list->host = host;
    list->numel = 0;
    for (int i = 0; i < count; i++) list->numel += host[i].n;
    list->device = count ? rt->dev.ops->upload_spans(rt->dev.ctx, host, count) : NULL;
}

// Per bucket: this rank's views (AdamW, norm) and every parameter whole (NaN flags).
// Each span also knows its model-space index (a parameter's dense offset is the sum of
// the numels before it), which the layout's padding and bucket cuts do not change.
static void build_spans(Zero1Runtime* rt) {
    size_t* dense = (size_t*)mallocCheck(rt->num_params * sizeof(size_t));
    for (int p = 0; p < rt->num_params; p++) {
        dense[p] = p == 0 ? 0 : dense[p - 1] + rt->numels[p - 1];
    }
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        BucketState* s = &rt->buckets[b];
        const Zero1BucketShard* sh = &rt->shards.buckets[b];
        Zero1Span* owned = (Zero1Span*)callocCheck(sh->num_views, sizeof(Zero1Span));
        for (int i = 0; i < sh->num_views; i++) {
            const Zero1ParamView* v = &sh->views[i];
            owned[i].buffer = v->gbuf_world.start;
            owned[i].owned = s->owned_offset + v->gbuf_local.start;
            owned[i].n = v->gbuf_world.end - v->gbuf_world.start;
            owned[i].param = v->param;
            owned[i].decays = rt->decays[v->param];
            owned[i].model = dense[v->param] + v->param_range.start;
        }
        span_list_upload(rt, &s->owned, owned, sh->num_views);
        const Zero1Bucket* bk = &rt->layout.buckets[b];
        int count = zero1_bucket_num_params(bk);
        Zero1Span* whole = (Zero1Span*)callocCheck(count, sizeof(Zero1Span));
        for (int i = 0; i < count; i++) {
            int p = zero1_bucket_param(bk, i);
            whole[i].buffer = rt->layout.params[p].start;
            whole[i].n = rt->numels[p];
            whole[i].param = p;
            whole[i].decays = rt->decays[p];
            whole[i].model = dense[p];
        }
        span_list_upload(rt, &s->whole, whole, count);
    }
    free(dense);
}

static void allocate_buffers(Zero1Runtime* rt) {
    const Zero1Options* opt = &rt->opt;
    size_t numel = rt->layout.numel;
    rt->grads = (float*)rt_alloc(rt, numel * sizeof(float));
    rt->param_buffer = rt_alloc(rt, numel * zero1_dtype_size(opt->param_dtype));
    rt->compute = opt->compute_dtype == opt->param_dtype ? rt->param_buffer
                                                         : rt_alloc(rt, numel * zero1_dtype_size(opt->compute_dtype));
    if (opt->param_dtype != ZERO1_FP32) rt->master = (float*)rt_alloc(rt, rt->owned_numel * sizeof(float));
    if (opt->grad_dtype == ZERO1_BF16) rt->grad_comm = rt_alloc(rt, numel * 2);
    if (exchanging_slices(rt)) {  // two receive temporaries, each the largest bucket in the exchange's dtype
        rt->recv_slot_bytes = zero1_layout_largest_bucket(&rt->layout) * zero1_dtype_size(exchange_dtype(rt));
        for (int i = 0; i < 2; i++) rt->recv_slots[i] = rt_alloc(rt, rt->recv_slot_bytes);
        rt->exchange_counts = (size_t*)mallocCheck(2 * (size_t)rt->comm->size * sizeof(size_t));
    }
    rt->adam_m = (float*)rt_alloc(rt, rt->owned_numel * sizeof(float));
    rt->adam_v = (float*)rt_alloc(rt, rt->adamw_owned_numel * sizeof(float));  // Muon's matrices have no v
    if (opt->dp_invariant) {
        while ((1 << rt->num_partials) < opt->micro_steps) rt->num_partials++;
        rt->partials = (float**)callocCheck(rt->num_partials + 1, sizeof(float*));
        for (int l = 0; l < rt->num_partials; l++) rt->partials[l] = (float*)rt_alloc(rt, numel * sizeof(float));
    }
    rt->sumsq = (double*)rt_alloc(rt, sumsq_words(rt) * sizeof(double));
    rt->norm = (float*)rt_alloc(rt, 2 * sizeof(float));
    rt->norm_host = (float*)rt->dev.ops->alloc_host(rt->dev.ctx, 2 * sizeof(float));
    if (opt->check_nan) {
        rt->nan_flags = (float*)rt_alloc(rt, rt->num_params * sizeof(float));
        rt->nan_flags_host = (float*)rt->dev.ops->alloc_host(rt->dev.ctx, rt->num_params * sizeof(float));
    }
}

// --split-embedding: its checks, then the module on the embedding's own bucket.
static void create_split_embedding(Zero1Runtime* rt, const Zero1ModelSpec* model) {
    const Zero1Options* opt = &rt->opt;
    if (opt->zero_stage != 1) fatal("zero1: the split embedding needs ZeRO-1 (-z 1)");
    if (model->embedding < 0 || model->embedding >= model->num_params || model->embedding_width == 0)
        fatal("zero1: the split embedding needs a model that names its token embedding");
    if (opt->shared_embedding != model->embedding)
        fatal("zero1: the split embedding needs the embedding in a bucket of its own");
    if (opt->max_positions < 1) fatal("zero1: the split embedding needs the tokens per micro-step");
    if (rt->cross && opt->grad_dtype == ZERO1_BF16)  // the runtime's own contract; the trainers refuse it first
        fatal("zero1: the split embedding with distributed-optimizer instances needs --grad-dtype fp32 (the rows "
              "would have to join a bf16 shard before its all-reduce across instances)");
    int p = model->embedding;
    const Zero1Bucket* bk = &rt->layout.buckets[rt->layout.params[p].bucket];
    SplitEmbeddingShape shape = {rt->layout.params[p].start, rt->numels[p] / model->embedding_width,
                                 model->embedding_width, {bk->start, bk->end}, rt->layout.numel,
                                 opt->max_positions, opt->average_in_collective};
    rt->split = split_embedding_create(&shape, rt->comm, &rt->dev);
}

Zero1Runtime* zero1_runtime_create(const Zero1Options* opt, const Zero1ModelSpec* model, Zero1Comm* comm,
                                   Zero1Comm* cross, const Zero1Device* dev, Zero1Tracer* tracer) {
    if (cross && opt->zero_stage != 1) {
        fatal("zero1: distributed-optimizer instances need ZeRO-1 (the replicated mode reduces over all ranks)");
    }
    if (opt->param_dtype == ZERO1_FP64 || opt->grad_dtype == ZERO1_FP64 || opt->compute_dtype == ZERO1_FP64) {
        fatal("zero1: fp64 buffers are not supported");
    }
    if (opt->compute_dtype != opt->param_dtype && opt->compute_dtype != ZERO1_FP32) {
        fatal("zero1: the compute params are the param buffer itself or an fp32 copy of it");
    }
    if (opt->fp32_accumulation && (opt->grad_dtype != ZERO1_BF16 || opt->zero_stage != 1)) {
        fatal("zero1: fp32 accumulation needs a bf16 grad reduction under ZeRO-1 (it sums bf16 slices in fp32)");
    }
    int power_of_two = opt->micro_steps >= 1 && (opt->micro_steps & (opt->micro_steps - 1)) == 0 &&
                       (comm->size & (comm->size - 1)) == 0;
    if (opt->dp_invariant && (!power_of_two || cross || opt->zero_stage != 1 || opt->grad_dtype != ZERO1_FP32 ||
                              opt->fp32_accumulation || opt->split_embedding || opt->average_in_collective)) {
        fatal("zero1: the DP-invariant mode needs ZeRO-1 with fp32 grads, power-of-two ranks and micro-steps, and no "
              "instances, fp32 accumulation, split embedding or averaging in the collective");
    }
    Zero1Runtime* rt = (Zero1Runtime*)callocCheck(1, sizeof(Zero1Runtime));
    rt->opt = *opt;
    rt->num_params = model->num_params;
    rt->numels = (size_t*)dup_array(model->numels, model->num_params * sizeof(size_t));
    rt->decays = (int*)dup_array(model->decays, model->num_params * sizeof(int));
    rt->first_block = (int*)dup_array(model->first_block, model->num_params * sizeof(int));
    rt->param_name = model->param_name;
    rt->name_ctx = model->name_ctx;
    rt->comm = comm;
    rt->cross = cross;
    rt->dev = *dev;
    rt->tracer = tracer;
    comm->tracer = tracer;
    if (cross) cross->tracer = tracer;
    char err[256];
    int data_parallel_size = comm->size * (cross ? cross->size : 1);
    long long bucket_size = zero1_ddp_bucket_size(opt->bucket_size, data_parallel_size, opt->overlap_grad_reduce);
    int* is_muon = NULL;
    if (opt->muon) {
        if (model->matrices == NULL) fatal("zero1: Muon needs the model's matrix shapes");
        if (cross) fatal("zero1: Muon's layer-wise buffer has no distributed-optimizer instances");
        if (dev->ops->muon == NULL) fatal("zero1: the %s device has no Muon", dev->ops->name);
        rt->matrices = (Zero1MatrixShape*)dup_array(model->matrices, model->num_params * sizeof(Zero1MatrixShape));
        is_muon = (int*)callocCheck(model->num_params, sizeof(int));
        for (int p = 0; p < model->num_params; p++) is_muon[p] = model->matrices[p].rows > 0;
    }
    int rc = zero1_run_layout_build(&rt->layout, rt->numels, is_muon, rt->num_params, comm->size, bucket_size,
                                    opt->pad_busbw, opt->shared_embedding, err, sizeof(err));
    free(is_muon);
    if (rc != 0) fatal("zero1: %s", err);
    // Replicated: every rank updates every bucket whole, which is the shard map of DP=1.
    Zero1Layout view = rt->layout;
    int shard_rank = comm->rank;
    if (!state_sharded(rt)) {
        view.dp = 1;
        shard_rank = 0;
    }
    if (zero1_shards_build(&rt->shards, &view, shard_rank, err, sizeof(err)) != 0) fatal("zero1: %s", err);
    rt->owned_numel = rt->adamw_owned_numel = rt->shards.owned_numel;
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        const Zero1Range* r = &rt->shards.buckets[b].shard;
        if (zero1_bucket_is_muon(&rt->layout, b)) rt->adamw_owned_numel -= r->end - r->start;
    }
    if (opt->split_embedding) create_split_embedding(rt, model);
    allocate_buffers(rt);
    rt->buckets = (BucketState*)callocCheck(rt->layout.num_buckets, sizeof(BucketState));
    rt->fire_order = (int*)callocCheck(rt->layout.num_buckets, sizeof(int));
    size_t owned = 0;
    for (int b = 0; b < rt->layout.num_buckets; b++) {
        BucketState* s = &rt->buckets[b];
        s->owned_offset = owned;
        owned += rt->shards.buckets[b].shard.end - rt->shards.buckets[b].shard.start;
        s->reduce = s->gather = s->cross = s->rows = -1;
        s->gather_state = GATHER_DONE;  // the initial weights are loaded whole on every rank
    }
    build_spans(rt);
    rt->seen = (int*)callocCheck(rt->num_params, sizeof(int));
    rt->learned = (int*)callocCheck(rt->num_params, sizeof(int));
    build_block_buckets(rt);
    return rt;
}

static void span_list_free(Zero1Runtime* rt, Zero1SpanList* list) {
    rt_free(rt, (void*)list->device);
    free((void*)list->host);
}

void zero1_runtime_destroy(Zero1Runtime* rt) {
    if (!rt) return;
    if (rt->buckets) {
        zero1_sync_params(rt);
        rt_sync(rt);
        for (int b = 0; b < rt->layout.num_buckets; b++) {
            span_list_free(rt, &rt->buckets[b].owned);
            span_list_free(rt, &rt->buckets[b].whole);
        }
    }
    split_embedding_destroy(rt->split, &rt->dev);
    if (rt->compute != rt->param_buffer) rt_free(rt, rt->compute);
    void* device[] = {rt->param_buffer, rt->grads, rt->grad_comm, rt->recv_slots[0], rt->recv_slots[1], rt->master,
                      rt->adam_m, rt->adam_v, rt->sumsq, rt->norm, rt->nan_flags};
    for (size_t i = 0; i < sizeof(device) / sizeof(device[0]); i++) rt_free(rt, device[i]);
    for (int l = 0; l < rt->num_partials; l++) rt_free(rt, rt->partials[l]);
    free(rt->partials);
    if (rt->norm_host) rt->dev.ops->free_host(rt->dev.ctx, rt->norm_host);
    if (rt->nan_flags_host) rt->dev.ops->free_host(rt->dev.ctx, rt->nan_flags_host);
    for (int k = 0; rt->block_buckets && k < rt->num_blocks; k++) free(rt->block_buckets[k]);
    free(rt->block_buckets);
    free(rt->block_num_buckets);
    free(rt->buckets);
    free(rt->fire_order);
    free(rt->exchange_counts);
    free(rt->seen);
    free(rt->learned);
    zero1_shards_free(&rt->shards);
    zero1_layout_free(&rt->layout);
    free(rt->numels);
    free(rt->matrices);
    free(rt->decays);
    free(rt->first_block);
    free(rt);
}

const Zero1Layout* zero1_layout(const Zero1Runtime* rt) { return &rt->layout; }
float* zero1_grad_buffer(Zero1Runtime* rt) { return rt->grads; }
void* zero1_compute_params(Zero1Runtime* rt) { return rt->compute; }
size_t zero1_param_offset(const Zero1Runtime* rt, int p) { return rt->layout.params[p].start; }
size_t zero1_owned_numel(const Zero1Runtime* rt) { return rt->owned_numel; }

size_t zero1_recv_temporary_bytes(const Zero1Runtime* rt) { return 2 * rt->recv_slot_bytes; }
size_t zero1_partial_grad_bytes(const Zero1Runtime* rt) {
    return (size_t)rt->num_partials * rt->layout.numel * sizeof(float);
}

size_t zero1_state_bytes(const Zero1Runtime* rt) {
    return (rt->owned_numel * (rt->master ? 2 : 1) + rt->adamw_owned_numel) * sizeof(float);
}

size_t zero1_embedding_rows_sent(const Zero1Runtime* rt) {
    return rt->split ? split_embedding_rows_sent(rt->split) : 0;
}

int zero1_split_shape(const Zero1Runtime* rt, size_t* tokens, size_t* width, size_t* bucket_numel) {
    if (!rt->split) return 0;
    const SplitEmbeddingShape* shape = split_embedding_shape(rt->split);
    *tokens = (size_t)shape->max_positions;
    *width = shape->width;
    *bucket_numel = shape->bucket.end - shape->bucket.start;
    return 1;
}

int zero1_runtime_full_layout(const Zero1Runtime* rt, Zero1FullLayout* out) {
    if (rt->matrices == NULL) return -1;
    int* is_muon = (int*)callocCheck(rt->num_params, sizeof(int));
    for (int p = 0; p < rt->num_params; p++) is_muon[p] = rt->matrices[p].rows > 0;
    char err[256];
    int rc = zero1_full_layout_build(out, rt->numels, is_muon, rt->num_params, rt->layout.dp,
                                     (long long)rt->layout.bucket_size, rt->layout.pad_busbw,
                                     rt->layout.shared_embedding, err, sizeof(err));
    free(is_muon);
    if (rc != 0) fatal("zero1: %s", err);
    return 0;
}
