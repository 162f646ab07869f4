/*
 * The optimizer as a trainer sees it: one small table, two implementations per trainer.
 *   replicated (in the trainer itself): one dense buffer, one all-reduce, full AdamW on
 *     every rank; the plain path that serves as the independent reference in tests;
 *   zero1/ (zero1/optimizer.h, built with USE_ZERO1=1): bucketed ZeRO-1, or with -z 0 its
 *     replicated mode on the same buffers.
 * The optimizer owns the param and grad buffers; the model's tensors are views into them
 * (params + offsets[i], grads + offsets[i]) and the model calls the optimizer's hooks.
 * Buffers live where the trainer computes (host memory for the CPU trainer, GPU memory
 * for the GPU trainer); dense arrays in this table are host arrays in canonical order.
 *
 * Checkpoints go piece by piece (run/checkpoint_io.h), so that no rank ever needs the
 * whole model in host memory: a piece is a contiguous run of one tensor, and each rank
 * saves, and on resume loads, only its own pieces. Over all ranks the pieces cover every
 * element of every tensor exactly once:
 *   ZeRO-1      the rank's shard views (what it owns; a rank may hold only padding);
 *   replicated  every rank holds everything, so the model (the tensors back to back in
 *               canonical order) is cut into `world` equal contiguous parts, one per rank,
 *               and the ranks still write and read in parallel (optimizer_split_pieces).
 * The checkpoint code moves a piece through its staging buffer in ranges small enough to
 * fit (read_piece/write_piece take any range inside one of the rank's pieces); after the
 * last write_piece, finish_import completes the state where the optimizer needs it.
 */
#ifndef RUN_OPTIMIZER_H
#define RUN_OPTIMIZER_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/model_hooks.h"
#include "run/config.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// The three fp32 arrays a checkpoint holds for every parameter.
typedef enum { OPTIMIZER_MASTER = 0, OPTIMIZER_M = 1, OPTIMIZER_V = 2, OPTIMIZER_NUM_STATES = 3 } OptimizerState;

typedef struct {
    int param;      // canonical tensor index
    size_t start;   // first element, inside the flattened tensor
    size_t n;       // elements
} OptimizerPiece;

typedef struct Optimizer Optimizer;

// The update's last word (a non-finite loss or norm, -sl/-sg: run/step.h's StepGate):
// finish_step calls skip with the step's grad norm, once the host has it and before any rank
// updates; 1 skips the update (the gradients are dropped; weights, m and v stay as they
// were). Every rank passes the same gate and sees the same all-reduced norm, so all decide
// alike. The trainers pass one every step; NULL (tests): always update, no host wait.
typedef struct {
    int (*skip)(void* ctx, float grad_norm);
    void* ctx;
} UpdateGate;

// What an optimizer does; every implementation has one static table of these.
typedef struct {
    // Sets the weights from a dense canonical fp32 host array (every rank the same): the
    // initial model of -e. A resume loads pieces instead.
    void (*load_weights)(Optimizer* o, const float* dense);
    void (*begin_step)(Optimizer* o, int step);             // zeroes the grads
    void (*begin_micro_step)(Optimizer* o, int is_last);
    // After the last backward: reduce, norm, clip, AdamW (unless gate skips it). Adds the ms
    // the host blocked on communication. On a GPU it only queues work (a gate waits for the norm).
    void (*finish_step)(Optimizer* o, int step, float lr, const UpdateGate* gate, double* comm_blocked_ms);
    float (*read_norm)(Optimizer* o);   // the step's grad norm (before clipping); syncs the device
    void (*sync_params)(Optimizer* o);  // the params are complete for what the device runs next
    // Checkpoints (see the top of this file). checkpoint_pieces: this rank's pieces, the
    // same at save and at load for a given rank count and layout; returns how many, and
    // writes at most max of them (out may be NULL to count).
    int (*checkpoint_pieces)(Optimizer* o, OptimizerPiece* out, int max);
    // fp32 host copies of `range`, which lies inside one of this rank's pieces. read_piece
    // returns the values after everything queued so far (it syncs the device); write_piece
    // returns when host may be reused. Neither communicates.
    void (*read_piece)(Optimizer* o, OptimizerState which, const OptimizerPiece* range, float* host);
    void (*write_piece)(Optimizer* o, OptimizerState which, const OptimizerPiece* range, const float* host);
    // Collective, once every rank has written all its pieces: the state is complete where
    // the optimizer keeps it, and the weights the model computes with are refreshed on
    // every rank (ZeRO-1: the param buffer all-gathered; replicated: every rank gets the
    // other ranks' parts). steps_done: the checkpoint's step, whose write-back rounding the
    // rebuilt bf16 params repeat (--stochastic-rounding's bits depend on the step).
    void (*finish_import)(Optimizer* o, int steps_done);
    size_t (*state_bytes)(const Optimizer* o);  // master + m + v this rank allocated
    void (*print_start)(Optimizer* o);          // rank 0: the layout and memory ledger
    void (*print_end)(Optimizer* o);            // every rank's state and peak memory; traces
    void (*destroy)(Optimizer* o);
} OptimizerOps;

struct Optimizer {
    const OptimizerOps* ops;
    const char* name;         // "replicated" or "zero1"
    void* params;             // what the model computes with (its dtype is the trainer's)
    float* grads;             // fp32 grad buffer; backward accumulates into it
    const size_t* offsets;    // per canonical tensor, into params and grads
    size_t numel;             // elements of each buffer (padding included)
    ModelHooks hooks;
    int world;                // data-parallel ranks
};

// A constructor's last step: what the table shows of the optimizer's buffers. Returns o.
Optimizer* optimizer_expose(Optimizer* o, const char* name, const OptimizerOps* ops, void* params,
                            float* grads, const size_t* offsets, size_t numel, int world);

// The replicated optimizers' split: the elements [lo, hi) of a model of `total` elements
// (its tensors back to back in canonical order) that rank saves and loads. Equal parts,
// the first total % world ranks one element larger.
void optimizer_split_range(size_t total, int rank, int world, size_t* lo, size_t* hi);

// That part as pieces of the tensors it crosses: tensor p occupies [offsets[p],
// offsets[p+1]) of the model, the last one up to total. Returns how many; writes at most
// max (out may be NULL to count).
int optimizer_split_pieces(const size_t* offsets, int num_tensors, size_t total, int rank, int world,
                           OptimizerPiece* out, int max);

// The host buffer every checkpoint save and load streams through, per rank: 64 MiB, or
// LLMC_CHECKPOINT_STAGING_MIB (1..1024; an MPI-IO call moves at most 2^31 bytes). Checked
// when the start ledger prints it, so a bad value stops the run before the first step.
#define CHECKPOINT_STAGING_ENV "LLMC_CHECKPOINT_STAGING_MIB"
#define CHECKPOINT_STAGING_DEFAULT_MIB 64

// The run header's lines that say which optimizer updates which parameters, and how many
// elements each (run_start prints them on rank 0, for both trainers and every optimizer).
void optimizer_print_routing(const TrainConfig* cfg, const GPT2Config* mc);

// The start ledger's checkpoint line, the same for every optimizer (rank 0 prints it).
void checkpoint_print_bound(void);

size_t checkpoint_staging_bytes(void);

#ifdef __cplusplus
}
#endif
#endif
