/*
 * zero1/runtime_internal.h: the runtime's state, shared by the files that implement it
 * (runtime.c: the step; checkpoint.c: model-space state for checkpoints). Not for trainers.
 */
#ifndef ZERO1_RUNTIME_INTERNAL_H
#define ZERO1_RUNTIME_INTERNAL_H

#include "zero1/runtime.h"
#include "zero1/split_embedding.h"

typedef enum { GATHER_DONE = 0, GATHER_PENDING, GATHER_IN_FLIGHT } GatherState;

typedef struct {
    int contributions_left;      // in the last micro-step, before this bucket may fire
    int contributions_total;     // learned on the first step (zero1_register_grad_ready)
    int reduce_in_flight;
    int grad_sync_started;            // this step
    int recv_slot;               // fp32 accumulation, DP-invariant: the receive temporary of its exchange
    int folded;                  // DP-invariant: the micro-step whose gradient it folded last (-1: none)
    Zero1Handle reduce;
    double reduce_start_us;
    int awaiting_cross;          // instances: reduced in the group, its all-reduce across them not yet issued
    int cross_in_flight;
    Zero1Handle cross;
    double cross_start_us;
    GatherState gather_state;
    Zero1Handle gather;
    double gather_start_us;
    int rows_in_flight, rows_arrived;  // the split embedding's bucket: its sparse rows' all-to-all
    Zero1Handle rows;
    double rows_start_us;
    size_t owned_offset;         // start of this bucket's shard in master/m/v
    Zero1SpanList owned;         // this rank's views of the bucket: AdamW and the norm
    Zero1SpanList whole;         // every parameter of the bucket, whole: the NaN flags
} BucketState;

struct Zero1Runtime {
    Zero1Options opt;
    int num_params;
    int first_block_number, num_blocks;  // the model's block numbers that read a parameter first
    size_t* numels;
    Zero1MatrixShape* matrices;  // Muon: per param (rows 0: AdamW's); NULL without Muon
    int* decays;
    int* first_block;
    const char* (*param_name)(void*, int, char*, size_t);
    void* name_ctx;

    Zero1Comm* comm;             // the ranks that shard the state (the group, with instances)
    Zero1Comm* cross;            // instances: this rank's position in every group; NULL without
    Zero1Device dev;
    Zero1Tracer* tracer;
    Zero1Layout layout;
    Zero1RankShards shards;      // what this rank updates (every bucket whole when replicated)

    // Device memory.
    float* grads;                // fp32, layout numel
    void* grad_comm;             // bf16 copy for a bf16 reduction, else NULL
    void* recv_slots[2];         // fp32 accumulation, DP-invariant: the exchange's receive temporaries, else NULL
    float** partials;            // DP-invariant: the binary counter's levels, log2(micro_steps) buffers of numel
    int num_partials;
    size_t* exchange_counts;     // host: its counts, then offsets (comm->size each)
    size_t recv_slot_bytes;
    void* param_buffer;          // param_dtype, layout numel
    void* compute;               // compute_dtype (== param_buffer when the dtypes agree)
    float* master;               // fp32 master of the owned shards (bf16 storage only)
    float* adam_m;
    float* adam_v;
    double* sumsq;               // the step's sum of squares over owned views (DP-invariant: exact limbs)
    float* norm;                 // [grad norm, clip factor]
    float* nan_flags;            // per parameter (check_nan)
    // Host memory for what the host reads back.
    float* norm_host;
    float* nan_flags_host;
    size_t owned_numel;
    size_t adamw_owned_numel;    // the AdamW buckets' part of it (first in owned order): what adam_v covers

    BucketState* buckets;
    int* seen;                   // contributions seen per param in the last micro-step
    int* learned;                // seen at the first step: what makes each param final
    int counts_learned;
    int* fire_order;             // buckets in the order they fired this step (the cross all-reduces follow it)
    int num_fired, num_crossed;
    int in_finish_grad_sync;     // all-reduces across instances go out here, in firing order (comm.h)
    int** block_buckets;         // per forward block (from first_block_number): buckets first read there
    int* block_num_buckets;
    SplitEmbedding* split;       // NULL unless opt.split_embedding; its parameter: opt.shared_embedding
    int split_rows_given;        // this step: the model has the split rows (last micro-step)
    int is_last_micro;
    int micro;                   // DP-invariant: this step's micro-step (0-based; -1 before the first)
    int step;
    double blocked_ms;
};

// The optimizer state is sharded (ZeRO-1 over more than one rank); otherwise every rank
// owns every bucket whole.
static inline int state_sharded(const Zero1Runtime* rt) { return rt->opt.zero_stage == 1 && rt->comm->size > 1; }
// Buckets are exchanged by all_to_all_v and summed here in fp32 (Zero1Options.fp32_accumulation).
static inline int fp32_accumulating(const Zero1Runtime* rt) { return state_sharded(rt) && rt->opt.fp32_accumulation; }
// ... in bf16 (fp32 accumulation) or, in the DP-invariant mode, in fp32.
static inline int exchanging_slices(const Zero1Runtime* rt) {
    return fp32_accumulating(rt) || (state_sharded(rt) && rt->opt.dp_invariant);
}
static inline Zero1Dtype exchange_dtype(const Zero1Runtime* rt) { return rt->opt.dp_invariant ? ZERO1_FP32 : ZERO1_BF16; }
static inline Zero1ReduceOp grad_reduce_op(const Zero1Runtime* rt) {
    return rt->opt.average_in_collective ? ZERO1_AVG : ZERO1_SUM;
}

// Device ops on the compute stream.
static inline void rt_copy(const Zero1Runtime* rt, void* dst, const void* src, size_t bytes) {
    rt->dev.ops->copy(rt->dev.ctx, rt->dev.compute, dst, src, bytes);
}
static inline void rt_fill(const Zero1Runtime* rt, void* p, int byte, size_t bytes) {
    rt->dev.ops->fill(rt->dev.ctx, rt->dev.compute, p, byte, bytes);
}
static inline void rt_convert(const Zero1Runtime* rt, void* dst, Zero1Dtype dt, const void* src, Zero1Dtype st,
                              size_t n) {
    rt->dev.ops->convert(rt->dev.ctx, rt->dev.compute, dst, dt, src, st, n);
}
static inline void rt_sync(const Zero1Runtime* rt) { rt->dev.ops->sync_stream(rt->dev.ctx, rt->dev.compute); }
static inline void* rt_alloc(const Zero1Runtime* rt, size_t bytes) { return rt->dev.ops->alloc(rt->dev.ctx, bytes); }
static inline void rt_free(const Zero1Runtime* rt, void* p) {
    if (p) rt->dev.ops->free(rt->dev.ctx, p);
}
// AdamW's step t (1-based) with this run's write-back rounding (Zero1Options).
static inline AdamWStep zero1_adamw_step(const Zero1Runtime* rt, float lr, int t) {
    AdamWStep s = adamw_step_params(lr, rt->opt.beta1, rt->opt.beta2, rt->opt.eps, rt->opt.weight_decay, t, 1.0f);
    adamw_step_stochastic(&s, rt->opt.stochastic_rounding, rt->opt.rounding_seed);
    return s;
}
static inline void* param_at(const Zero1Runtime* rt, size_t offset) {
    return (char*)rt->param_buffer + offset * zero1_dtype_size(rt->opt.param_dtype);
}
static inline void* compute_at(const Zero1Runtime* rt, size_t offset) {
    return (char*)rt->compute + offset * zero1_dtype_size(rt->opt.compute_dtype);
}

#endif
