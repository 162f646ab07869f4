/*
 * zero1/runtime.h: one optimizer step of bucketed ZeRO-1 (DESIGN.md 4.3), device- and
 * network-neutral.
 *
 * The runtime owns the param and grad buffers (laid out by zero1/layout.h), the fp32
 * master weights and AdamW moments of this rank's shards, and the per-bucket
 * communication. A trainer binds its tensors as views into the buffers and calls:
 *
 *   zero1_begin_step          zero the grad buffer
 *   zero1_begin_micro_step    (is_last: buckets may fire during this backward)
 *   zero1_forward_block       before a block runs: wait for the all-gathers of its buckets
 *   zero1_grad_done           one gradient contribution of a parameter is complete
 *   zero1_poke                at layer boundaries: let the backend progress
 *   zero1_finish_step         wait for the reductions, norm, clip, AdamW on the shard,
 *                             launch the all-gathers for the next forward
 *
 * With zero_stage 0 the same machinery runs replicated: an all-reduce per bucket and the
 * full AdamW on every rank (the baseline ZeRO-1 is compared with).
 */
#ifndef ZERO1_RUNTIME_H
#define ZERO1_RUNTIME_H

#include <stddef.h>

#include "zero1/comm.h"
#include "zero1/device_ops.h"
#include "zero1/layout.h"
#include "zero1/shards.h"
#include "zero1/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int zero_stage;              // 0: replicated, 1: ZeRO-1
    long long bucket_size;       // elements; < 0 default; 0 one bucket
    int pad_busbw;
    int shared_embedding;        // parameter index with its own bucket, or -1
    int overlap_grad_reduce;     // launch a bucket's reduction as soon as its grads are final
    int overlap_param_gather;    // gather during the next forward instead of after the update
    int check_nan;
    Zero1Dtype param_dtype;      // storage of the param buffer (fp32: master == params)
    Zero1Dtype grad_dtype;       // dtype of the gradient reduction
    float beta1, beta2, eps, weight_decay, grad_clip;
} Zero1Options;

// What the runtime needs to know about the model: sizes, weight decay, how many gradient
// contributions make a parameter final in one micro-step, which forward block first reads
// it (blocks run 0..num_blocks-1), and a name for messages.
typedef struct {
    int num_params;
    const size_t* numels;
    const int* decays;
    const int* contributions;
    const int* first_block;
    int num_blocks;
    const char* (*param_name)(void* ctx, int param, char* buf, size_t n);
    void* name_ctx;
} Zero1ModelSpec;

typedef struct Zero1Runtime Zero1Runtime;

// Returns NULL with a message in err on invalid options or layout.
Zero1Runtime* zero1_runtime_create(const Zero1Options* opt, const Zero1ModelSpec* model, Zero1Comm* comm,
                                   const Zero1DeviceOps* ops, Zero1Tracer* tracer, char* err, size_t err_len);
void zero1_runtime_destroy(Zero1Runtime* rt);

const Zero1Layout* zero1_layout(const Zero1Runtime* rt);
const Zero1RankShards* zero1_shards(const Zero1Runtime* rt);
float* zero1_grad_buffer(Zero1Runtime* rt);       // fp32, layout numel
float* zero1_compute_params(Zero1Runtime* rt);    // fp32 params the model computes with
size_t zero1_param_offset(const Zero1Runtime* rt, int param);

// After the trainer wrote initial weights into the compute params (all ranks alike):
// fills the param buffer, the fp32 master shards and (bf16 storage) rounds the compute
// params to what the bf16 buffer holds.
void zero1_after_load(Zero1Runtime* rt);

void zero1_begin_step(Zero1Runtime* rt, int step);
void zero1_begin_micro_step(Zero1Runtime* rt, int is_last);
void zero1_forward_block(Zero1Runtime* rt, int block);
void zero1_grad_done(Zero1Runtime* rt, int param);
void zero1_poke(Zero1Runtime* rt);
// Returns the global grad norm (before clipping); adds the ms blocked on communication.
float zero1_finish_step(Zero1Runtime* rt, int step, float lr, double* blocked_ms);
// Waits for every all-gather in flight: afterwards the compute params are complete.
void zero1_sync_params(Zero1Runtime* rt);

// Checkpoints, in model space: dense_offsets[p] is where parameter p starts in the dense
// (unpadded, definition-order) arrays. Export is collective (the shards are gathered)
// and fills m, v and the fp32 master on every rank; import takes this rank's shards from
// full arrays, so the DP and the layout may differ from the run that saved them.
// The master weights are imported through the compute params and zero1_after_load.
void zero1_export_state(Zero1Runtime* rt, const size_t* dense_offsets, float* m, float* v, float* master);
void zero1_import_state(Zero1Runtime* rt, const size_t* dense_offsets, const float* m, const float* v);

// Bytes of optimizer state this rank allocated (master + m + v), and its owned elements.
size_t zero1_state_bytes(const Zero1Runtime* rt);
size_t zero1_owned_numel(const Zero1Runtime* rt);

#ifdef __cplusplus
}
#endif
#endif
