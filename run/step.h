/*
 * One optimizer step as both trainers run it: what it reports (StepResult), the gate its
 * update passes (non-finite steps, spikes, -sl/-sg), the loss scale, the batches, and the few
 * collectives around it (--dp-invariant's loss, the replica check). The trainers' own
 * trainer_step does the forward, backward and optimizer; run/run.h drives the steps.
 */
#ifndef RUN_STEP_H
#define RUN_STEP_H

#include <stdint.h>

#include "run/config.h"
#include "run/dataloader.h"
#include "run/optimizer.h"
#include "run/outliers.h"

#ifdef __cplusplus
extern "C" {
#endif

double wall_ms(void);

// What made a step's loss or grad norm unusable: a non-finite value (NaN or infinity).
enum { STEP_NONFINITE_LOSS = 1, STEP_NONFINITE_NORM = 2 };

typedef struct {
    int step;                  // 0-based index of this optimizer step
    float loss;                // mean over micro-steps and ranks
    float grad_norm;           // global L2 norm before clipping
    float lr;
    double comm_blocked_ms;    // host time spent waiting on communication
    int skipped;               // the update was skipped: a non-finite step, a spike, or (-sl/-sg) an outlier
    int nonfinite;             // STEP_NONFINITE_* bits: which of the two was not finite (0: both were)
    double z_loss, z_norm;     // -sl/-sg's z-scores (NaN while the windows fill, and in a non-finite step or spike)
    int spike;                 // run/spikes.h's SPIKE_* bits: which of the two spiked (0: neither)
    double loss_ratio, norm_ratio;  // each over the median of the recent good steps' (NaN: none yet)
} StepResult;

// Every step's last word before its update (run/optimizer.h's UpdateGate), given the
// all-reduced grad norm once the host has it. A step whose loss or norm is not finite, or
// that spikes (run/spikes.h), is never applied and stays out of -sl/-sg's windows
// (run/outliers.h) and the spike history; any other joins them, and -sl/-sg may skip it
// as an outlier. Every rank sees the same loss and norm, so
// all decide alike. loss_now, when set, reads the step's loss at the gate (the GPU
// trainer's, which the wait for the norm has brought to the host); else result->loss is it.
typedef struct {
    OutlierState* state;       // NULL: no windows (tests that drive trainer_step)
    float loss_z_max, norm_z_max;
    float spike_loss_factor, spike_norm_factor;
    float (*loss_now)(void* ctx);
    void* loss_ctx;
    StepResult* result;
} StepGate;

// The gate a trainer passes to finish_step, every step. Its cost is where the host has the
// norm: the CPU trainer at once; zero1/ after the norm's all-reduce, which it waits for
// anyway; the GPU trainer's one wait per step comes before AdamW instead of after it.
const UpdateGate* step_gate_begin(StepGate* g, UpdateGate* gate, OutlierState* state, const TrainConfig* cfg,
                                  StepResult* r, float (*loss_now)(void*), void* loss_ctx);

// d(step loss)/d(position loss): the step loss is the mean over k*DP*B*T positions; with
// --average-in-collective the reduction divides by DP itself.
float step_loss_scale(const TrainConfig* cfg, int micro_steps, int world);

// --dp-invariant's step loss: every rank's micro-step losses gathered (rank-major, so in
// the order of the step's micro-batches: run/dataloader.h), summed as a pairwise tree in
// double (zero1/exact_sum.h's binary counter), divided by their number. step is 1-based,
// for the deadline's message.
float step_dp_invariant_loss(const float* micro_losses, int micro_steps, int world, int step);

// Supplies the inputs and targets (B*T each, host memory) of micro-step `micro`.
typedef void (*BatchFn)(void* ctx, int micro, const int** inputs, const int** targets);
// The loader's next batch (ctx: a DataLoader).
void loader_batch(void* ctx, int micro, const int** inputs, const int** targets);
// The same batch every time (-a 1; ctx: a DataLoader).
void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets);

// 1 when every rank passed the same value (collective, under --comm-timeout).
int all_ranks_equal(uint64_t mine, int world);

#ifdef __cplusplus
}
#endif
#endif
