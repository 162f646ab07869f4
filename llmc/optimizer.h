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
 */
#ifndef LLMC_OPTIMIZER_H
#define LLMC_OPTIMIZER_H

#include <stddef.h>

#include "llmc/model_hooks.h"

typedef struct Optimizer Optimizer;

// What an optimizer does; every implementation has one static table of these.
typedef struct {
    // Sets the weights from a dense canonical fp32 host array (every rank the same).
    void (*load_weights)(Optimizer* o, const float* dense);
    void (*begin_step)(Optimizer* o, int step);             // zeroes the grads
    void (*begin_micro_step)(Optimizer* o, int is_last);
    // After the last backward: reduce, norm, clip, AdamW. Adds the ms the host blocked on
    // communication. On a GPU it only queues work.
    void (*finish_step)(Optimizer* o, int step, float lr, double* comm_blocked_ms);
    float (*read_norm)(Optimizer* o);   // the step's grad norm (before clipping); syncs the device
    void (*sync_params)(Optimizer* o);  // the params are complete for what the device runs next
    // Checkpoint state, dense canonical fp32 host arrays (collective: every rank calls).
    // import_state with master NULL keeps the weights loaded already.
    void (*export_state)(Optimizer* o, float* master, float* m, float* v);
    void (*import_state)(Optimizer* o, const float* master, const float* m, const float* v);
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

#endif
