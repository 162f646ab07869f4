/*
 * zero1/runtime_internal.h: the runtime's state, shared by the files that implement it
 * (runtime.c: the step; checkpoint.c: model-space state for checkpoints). Not for trainers.
 */
#ifndef ZERO1_RUNTIME_INTERNAL_H
#define ZERO1_RUNTIME_INTERNAL_H

#include "zero1/runtime.h"

typedef enum { GATHER_DONE = 0, GATHER_PENDING, GATHER_IN_FLIGHT } GatherState;

typedef struct {
    int contributions_left;      // in the last micro-step, before this bucket may fire
    int contributions_total;
    int reduce_in_flight;
    int reduce_fired;            // this step
    int recv_slot;               // fp32 accumulation: the receive temporary of its all_to_all
    Zero1Handle reduce;
    double reduce_start_us;
    int awaiting_cross;          // instances: reduced in the group, its all-reduce across them not yet issued
    int cross_in_flight;
    Zero1Handle cross;
    double cross_start_us;
    GatherState gather_state;
    Zero1Handle gather;
    double gather_start_us;
    size_t owned_offset;         // start of this bucket's shard in master/m/v
    Zero1SpanList owned;         // this rank's views of the bucket: AdamW and the norm
    Zero1SpanList whole;         // every parameter of the bucket, whole: the NaN flags
} BucketState;

struct Zero1Runtime {
    Zero1Options opt;
    int num_params, num_blocks;
    size_t* numels;
    int* decays;
    int* contributions;
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
    void* recv_slots[2];         // fp32 accumulation: the all_to_all receive temporaries, else NULL
    size_t recv_slot_bytes;
    void* param_buffer;          // param_dtype, layout numel
    void* compute;               // compute_dtype (== param_buffer when the dtypes agree)
    float* master;               // fp32 master of the owned shards (bf16 storage only)
    float* adam_m;
    float* adam_v;
    double* sumsq;               // the step's sum of squares over owned views
    float* norm;                 // [grad norm, clip factor]
    float* nan_flags;            // per parameter (check_nan)
    // Host memory for what the host reads back.
    float* norm_host;
    float* nan_flags_host;
    size_t owned_numel;

    BucketState* buckets;
    int* seen;                   // contributions seen per param in the last micro-step
    int* fire_order;             // buckets in the order they fired this step (the cross all-reduces follow it)
    int num_fired, num_crossed;
    int finishing;  // inside zero1_finish_step (where all-reduces across instances may go out)
    int** block_buckets;         // per forward block: buckets first read there, forward order
    int* block_num_buckets;
    int is_last_micro;
    int step;
    double blocked_ms;
};

// Sharded (ZeRO-1 with more than one rank), or every rank owns every bucket whole.
static inline int stage1(const Zero1Runtime* rt) { return rt->opt.zero_stage == 1 && rt->comm->size > 1; }
// Buckets are exchanged by all_to_all and summed here in fp32 (Zero1Options.fp32_accumulation).
static inline int fp32_accumulating(const Zero1Runtime* rt) { return stage1(rt) && rt->opt.fp32_accumulation; }
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
static inline void* param_at(const Zero1Runtime* rt, size_t offset) {
    return (char*)rt->param_buffer + offset * zero1_dtype_size(rt->opt.param_dtype);
}
static inline void* compute_at(const Zero1Runtime* rt, size_t offset) {
    return (char*)rt->compute + offset * zero1_dtype_size(rt->opt.compute_dtype);
}

#endif
