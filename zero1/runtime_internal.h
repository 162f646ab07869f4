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
    Zero1Handle reduce;
    double reduce_start_us;
    GatherState gather_state;
    Zero1Handle gather;
    double gather_start_us;
    size_t owned_offset;         // start of this bucket's shard in master/m/v
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

    Zero1Comm* comm;
    const Zero1DeviceOps* ops;
    Zero1Tracer* tracer;
    Zero1Layout layout;
    Zero1RankShards shards;      // what this rank updates (every bucket whole when replicated)

    float* grads;                // fp32, layout numel
    void* grad_comm;             // bf16 copy for a bf16 reduction, else NULL
    void* param_buffer;          // param_dtype, layout numel
    float* compute;              // fp32 params for the kernels (== param_buffer for fp32)
    float* master;               // fp32 master of the owned shards (bf16 storage only)
    float* adam_m;
    float* adam_v;
    size_t owned_numel;

    BucketState* buckets;
    int* seen;                   // contributions seen per param in the last micro-step
    int** block_buckets;         // per forward block: buckets first read there, forward order
    int* block_num_buckets;
    int is_last_micro;
    int step;
    int nan_param;               // first parameter with a non-finite local gradient, or -1
    long long nan_element;
    double blocked_ms;
};

// Sharded (ZeRO-1 with more than one rank), or every rank owns every bucket whole.
static inline int stage1(const Zero1Runtime* rt) { return rt->opt.zero_stage == 1 && rt->comm->size > 1; }

#endif
