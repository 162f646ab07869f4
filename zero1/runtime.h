/*
 * zero1/runtime.h: one optimizer step of bucketed ZeRO-1, device- and network-neutral.
 *
 * The runtime owns the param and grad buffers (laid out by zero1/layout.h), the fp32
 * master weights and AdamW moments of this rank's shards, and the per-bucket
 * communication. A trainer binds its tensors as views into the buffers and calls (the
 * verbs are Megatron's; a bucket's grad sync is its reduction, its param sync its all-gather):
 *
 *   zero1_begin_step            zero the grad buffer
 *   zero1_begin_micro_step      (is_last: grad syncs may start during this backward)
 *   zero1_finish_param_sync     before a forward block runs: wait for the all-gathers of
 *                               the buckets it reads first (starting the next one's)
 *   zero1_register_grad_ready   one gradient contribution of a parameter is complete (the
 *                               first step learns how many make it final; later steps
 *                               start a bucket's grad sync when they are all in, and stop
 *                               on a mismatch)
 *   zero1_progress              at layer boundaries: let the collectives in flight progress
 *                               and take each one that completed to its next stage
 *   zero1_finish_step           finish_grad_sync (start what has not started, wait for
 *                               every reduction), norm, clip, AdamW on the shard,
 *                               start_param_sync of every bucket for the next forward
 *   zero1_read_norm             the step's grad norm on the host (the one device read)
 *   zero1_sync_params           finish every param sync (before a checkpoint or the end)
 *
 * Every buffer lives on the device (zero1/device_ops.h) and is touched only through its
 * ops, queued on the device's compute stream. The runtime relies only on the ordering rules
 * of device_ops.h and comm.h, so a CPU run exercises the logic a GPU run depends on.
 * Nothing in a step needs the host to wait for the device: the norm, the clip factor and
 * the NaN flags stay in device memory (with --check-nan the host reads the flags once).
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
#include "zero1/layout_layerwise.h"
#include "zero1/shards.h"
#include "zero1/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int zero_stage;              // 0: replicated, 1: ZeRO-1
    long long bucket_size;       // elements; < 0 default; 0 one bucket (zero1_ddp_bucket_size: also without overlap)
    int pad_busbw;
    int shared_embedding;        // parameter index with its own bucket, or -1
    int overlap_grad_reduce;     // launch a bucket's reduction as soon as its grads are final
    int overlap_param_gather;    // gather during the next forward instead of after the update
    int check_nan;
    Zero1Dtype param_dtype;      // storage of the param buffer (fp32: master == params)
    Zero1Dtype compute_dtype;    // what the model reads: param_dtype (the buffer itself) or fp32 (a copy)
    Zero1Dtype grad_dtype;       // dtype of the gradient reduction
    // The split embedding (ZeRO-1; shared_embedding must name the model's embedding): its
    // gradient's dense part (the classifier's) is reduced as soon as it is final, and the
    // last micro-step's encoder part travels as sparse rows to the shards' owners
    // (zero1_embedding_rows). max_positions (tokens per micro-step) sizes its buffers.
    int split_embedding;
    int max_positions;
    // bf16 on the wire, fp32 sums (Megatron's reduce_scatter_with_fp32_accumulation; needs
    // grad_dtype bf16 and zero_stage 1): each bucket's reduce-scatter becomes an all_to_all
    // of its bf16 copy into one of two receive temporaries, and this rank sums the DP
    // received slices of its shard in fp32 (sum_slices, rank order) straight into the fp32
    // grads. A bucket that fires while the previous one's exchange is in flight first
    // waits for it, so at most two temporaries are ever in use. No-op at one rank.
    int fp32_accumulation;
    // The reductions average (ZERO1_AVG) instead of summing: the trainer then scales the
    // loss without the 1/world factor. With instances: over the group, then over the K groups.
    int average_in_collective;
    // The DP-invariant mode (--dp-invariant): the step's sum is the same bits for every split
    // of its micro-batches over ranks and micro-steps. Each micro-step's backward writes into
    // zeroed grads and the rank folds it into a binary counter of log2(micro_steps) partial
    // buffers (zero1/exact_sum.h's pairwise tree), bucket by bucket as each is final; a
    // bucket's exchange is an fp32 all_to_all whose DP slices the owner sums with the same
    // tree (sum_slices_pairwise), so the ranks' subtrees finish one tree; the grad norm is
    // exact (sum_squares_exact). Needs ZeRO-1 with fp32 grads, power-of-two ranks and
    // micro_steps, and none of split_embedding, fp32_accumulation, average_in_collective,
    // instances. micro_steps: the trainer's micro-steps per step (each step must have them).
    int dp_invariant;
    int micro_steps;
    float beta1, beta2, eps, weight_decay, grad_clip;
    // bf16 params: AdamW's write-back of the fp32 master rounds stochastically, with bits
    // from (rounding_seed, step, model-space index) (llmc/adamw.h's adamw_round_bf16). The
    // initial zero1_load_weights rounds to nearest even either way.
    int stochastic_rounding;
    uint64_t rounding_seed;
    // --optimizer muon: the model's matrices (Zero1ModelSpec.matrices) in Megatron's layer-wise
    // buffer (zero1/layout_layerwise.h), each updated whole by the rank that owns it with Muon;
    // AdamW on the rest. Not with instances (Megatron's layer-wise optimizer has none).
    int muon;
    MuonConfig muon_config;
    int muon_ns_bf16;  // --muon-ns-bf16 (the CUDA device's muon op; the CPU's refuses it)
} Zero1Options;

// What the runtime needs to know about the model: sizes, weight decay, which forward block
// first reads each parameter (in the model's own block numbers, the ones it passes to
// zero1_finish_param_sync, ascending in forward order), a name for messages, and the
// token embedding whose encoder part may travel as sparse rows (rows of embedding_width
// elements; -1: none). How many gradient contributions make a parameter final is not
// declared: the runtime counts them on the first step (zero1_register_grad_ready).
typedef struct {
    int num_params;
    const size_t* numels;
    const int* decays;
    const int* first_block;
    const char* (*param_name)(void* ctx, int param, char* buf, size_t n);
    void* name_ctx;
    int embedding;
    size_t embedding_width;
    const Zero1MatrixShape* matrices;  // per param (rows 0: not a matrix); NULL: none (Zero1Options.muon needs them)
} Zero1ModelSpec;

typedef struct Zero1Runtime Zero1Runtime;

// Invalid options or layout end the program (fatal, as every error in the runtime does).
// The device and the communicators are borrowed (made for the same device).
// comm: the ranks that shard the optimizer state; the layout's DP is comm->size.
// cross: NULL, or for distributed-optimizer instances (Megatron's
// num_distributed_optimizer_instances; ZeRO-1 only) the ranks at this rank's position in
// each of the K groups that comm is one of. Every group then shards the whole state; a
// bucket's reduce-scatter sums over the group, and the rank's reduced shard is all-reduced
// across the groups as soon as that completes; the grad norm is the group's (every group
// holds the same grads); the NaN flags are summed over both; all-gathers and checkpoint
// export stay inside the group. The gradients must be scaled for all K * comm->size ranks.
Zero1Runtime* zero1_runtime_create(const Zero1Options* opt, const Zero1ModelSpec* model, Zero1Comm* comm,
                                   Zero1Comm* cross, const Zero1Device* dev, Zero1Tracer* tracer);
void zero1_runtime_destroy(Zero1Runtime* rt);

const Zero1Layout* zero1_layout(const Zero1Runtime* rt);
float* zero1_grad_buffer(Zero1Runtime* rt);       // device, fp32, layout numel
void* zero1_compute_params(Zero1Runtime* rt);     // device, compute_dtype, layout numel
size_t zero1_param_offset(const Zero1Runtime* rt, int param);

// Sets every rank's weights (all ranks pass the same values): dense is a host fp32 array
// in definition order, parameter p at dense_offsets[p]. Fills the param buffer, the
// compute params and this rank's fp32 master shards. Returns when the device is done with
// dense.
void zero1_load_weights(Zero1Runtime* rt, const float* dense, const size_t* dense_offsets);

void zero1_begin_step(Zero1Runtime* rt, int step);
void zero1_begin_micro_step(Zero1Runtime* rt, int is_last);
void zero1_finish_param_sync(Zero1Runtime* rt, int block);
void zero1_register_grad_ready(Zero1Runtime* rt, int param);
// The split embedding, in the last micro-step, right before the encoder's backward: the
// zeroed device rows (one per distinct token of tokens[0..n), ascending) that the encoder
// accumulates into instead of the dense gradient, and in *row_of_position (device, n ints)
// each position's row. One small blocking host all-gather of every rank's token ids
// plans the exchange, so nothing more is exchanged for it. The param's next
// zero1_register_grad_ready then sends the rows. NULL where the dense path applies (no split,
// another parameter, an earlier micro-step).
float* zero1_embedding_rows(Zero1Runtime* rt, int param, const int* tokens, int n, const int** row_of_position);
// Rows of the split embedding this rank sent to other ranks, summed over the steps so far.
size_t zero1_embedding_rows_sent(const Zero1Runtime* rt);
// Between layers: lets the communicators progress (Open MPI does not progress non-blocking
// collectives by itself) and takes each collective that has completed on to its next stage.
void zero1_progress(Zero1Runtime* rt);
// Queues the rest of the step; adds the ms the host blocked on communication. skip (may be
// NULL): called once the norm is queued and before the update; it reads the norm
// (zero1_read_norm, after a wait under its backend's deadline) and returns 1 to leave the
// weights, the master and the moments as they were.
void zero1_finish_step(Zero1Runtime* rt, int step, float lr, int (*skip)(void* ctx), void* skip_ctx,
                       double* blocked_ms);
// The last step's grad norm on the host: syncs the compute stream.
float zero1_read_norm(Zero1Runtime* rt);
// Orders what the compute stream runs next after every all-gather in flight: afterwards
// the compute params are complete (the host sees them after a sync).
void zero1_sync_params(Zero1Runtime* rt);

// Checkpoints, in model space and piece by piece (zero1/checkpoint.c), so that no rank
// ever holds more than its own state plus the caller's host buffer. A piece is a range of
// one parameter (its definition index and a range inside the flattened parameter).
typedef struct {
    int param;
    Zero1Range range;
} Zero1Piece;
typedef enum { ZERO1_STATE_MASTER = 0, ZERO1_STATE_M = 1, ZERO1_STATE_V = 2 } Zero1State;

// This rank's pieces: its shard views at DP = the communicator's size, whatever the stage,
// so that over all ranks they cover every parameter exactly once (under ZeRO-1 they are
// what the rank owns; replicated, every rank holds everything and saves its slice of
// each bucket). Returns how many; writes at most max (out may be NULL to count).
int zero1_checkpoint_pieces(const Zero1Runtime* rt, Zero1Piece* out, int max);
// Copies the fp32 master, m or v of a range inside one of this rank's pieces to or from
// host memory; both return when the host memory may be used again. Read first finishes
// the all-gathers in flight (a checkpoint between steps sees the step's result).
void zero1_read_state(Zero1Runtime* rt, Zero1State which, int param, Zero1Range range, float* host);
void zero1_write_state(Zero1Runtime* rt, Zero1State which, int param, Zero1Range range, const float* host);
// Collective, once every rank has written all its pieces: the param buffer is rebuilt
// from the master pieces and all-gathered, so every rank computes with the complete
// weights; replicated, m, v and the master are all-gathered too (every rank keeps all).
// bf16 params are rounded from the master as the write-back of step steps_done rounded
// them (with stochastic rounding its bits; steps_done 0: as zero1_load_weights, to nearest).
void zero1_finish_import(Zero1Runtime* rt, int steps_done);
// Distributed-optimizer instances: every group holds the same state, so only group 0 (the
// ranks whose cross rank is 0) saves and loads pieces (the others have none: over all
// ranks the pieces still cover every parameter once). Collective, after a load and before
// zero1_finish_import: the ranks of the other groups get the state group 0 loaded, by an
// all-reduce across instances to which they contribute -0.0 (x + -0.0 == x for every
// float, -0.0 and NaN included, so it is a copy bit for bit). Nothing without instances.
int zero1_holds_checkpoint_pieces(const Zero1Runtime* rt);
void zero1_share_state_across(Zero1Runtime* rt);

// Bytes of the all-to-all receive temporaries: 2 x the largest bucket in bf16 (fp32
// accumulation) or fp32 (the DP-invariant mode); 0 when neither is on or they do nothing.
size_t zero1_recv_temporary_bytes(const Zero1Runtime* rt);
// The DP-invariant mode's partial sums: bytes of its log2(micro_steps) fp32 grad buffers.
size_t zero1_partial_grad_bytes(const Zero1Runtime* rt);

// --split-embedding: the tokens per micro-step, the row width and the size of the
// embedding's bucket (for the ledger); 0 without the split.
int zero1_split_shape(const Zero1Runtime* rt, size_t* tokens, size_t* width, size_t* bucket_numel);

// With Muon: the two buffers the run's layout merges (zero1/layout_layerwise.h), for the
// ledger; free with zero1_full_layout_free. 0, or -1 without Muon.
int zero1_runtime_full_layout(const Zero1Runtime* rt, Zero1FullLayout* out);

// Bytes of optimizer state this rank allocated (master + m + v), and its owned elements.
size_t zero1_state_bytes(const Zero1Runtime* rt);
size_t zero1_owned_numel(const Zero1Runtime* rt);

#ifdef __cplusplus
}
#endif
#endif
