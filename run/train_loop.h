/*
 * What the CPU and GPU trainers share around the step itself: the step's result and its
 * update gate (non-finite steps, -sl/-sg), the model's initial weights, the batch checks,
 * batches from the data loader, sampling, the replica check, and the run's inputs and
 * outputs (RunIO). The training loop and the trainers' main are in run/train_main.h.
 */
#ifndef LLMC_TRAIN_LOOP_H
#define LLMC_TRAIN_LOOP_H

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "run/checkpoint.h"
#include "run/config.h"
#include "run/dataloader.h"
#include "run/dp_invariant.h"
#include "run/eval_hellaswag.h"
#include "llmc/gpt2_spec.h"
#include "run/log.h"
#include "run/model_file.h"
#include "run/mpi_wait.h"
#include "run/optimizer.h"
#include "run/outliers.h"
#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "run/tokenizer.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// MPI_Init, this process's rank and the world size; the error policy learns the rank.
void mpi_start(int* argc, char*** argv, int* rank, int* world);

double wall_ms(void);

// What made a step's loss or grad norm unusable: a non-finite value (NaN or infinity).
enum { STEP_NONFINITE_LOSS = 1, STEP_NONFINITE_NORM = 2 };

typedef struct {
    int step;                  // 0-based index of this optimizer step
    float loss;                // mean over micro-steps and ranks
    float grad_norm;           // global L2 norm before clipping
    float lr;
    double comm_blocked_ms;    // host time spent waiting on communication
    int skipped;               // the update was skipped: a non-finite step, or (-sl/-sg) an outlier
    int nonfinite;             // STEP_NONFINITE_* bits: which of the two was not finite (0: both were)
    double z_loss, z_norm;     // -sl/-sg's z-scores (NaN while the windows fill, and in a non-finite step)
} StepResult;

// Every step's last word before its update (run/optimizer.h's UpdateGate), given the
// all-reduced grad norm once the host has it. A step whose loss or norm is not finite is
// never applied and stays out of -sl/-sg's windows (run/outliers.h); a finite one joins
// them, and -sl/-sg may skip it as an outlier. Every rank sees the same loss and norm, so
// all decide alike. loss_now, when set, reads the step's loss at the gate (the GPU
// trainer's, which the wait for the norm has brought to the host); else result->loss is it.
typedef struct {
    OutlierState* state;       // NULL: no windows (tests that drive trainer_step)
    float loss_z_max, norm_z_max;
    float (*loss_now)(void* ctx);
    void* loss_ctx;
    StepResult* result;
} StepGate;

// The gate a trainer passes to finish_step, every step. Its cost is where the host has the
// norm: the CPU trainer at once; zero1/ after the norm's all-reduce, which it waits for
// anyway; the GPU trainer's one wait per step comes before AdamW instead of after it.
const UpdateGate* step_gate_begin(StepGate* g, UpdateGate* gate, OutlierState* state,
                                  const TrainConfig* cfg, StepResult* r, float (*loss_now)(void*),
                                  void* loss_ctx);

// Supplies the inputs and targets (B*T each, host memory) of micro-step `micro`.
typedef void (*BatchFn)(void* ctx, int micro, const int** inputs, const int** targets);

// Descriptors dN are GPT-2s: its vocabulary and context length.
#define DESCRIPTOR_VOCAB 50257
#define DESCRIPTOR_MAX_SEQ_LEN 1024

// 1 when -e is a descriptor dN (mc filled and checked), 0 when it names a file; a "dN"
// whose depth is out of range is an error, not a file name to look for.
int model_descriptor(const char* model, GPT2Config* mc);

// The shape of -e without its weights: a descriptor's, or a model file's header (checked).
void model_shape_of(const char* model, GPT2Config* mc);

// The model of -e: an llm.c model file, or a descriptor dN initialised from --seed.
// Every rank does the same. Returns a dense canonical fp32 array; NULL on a resume (-y
// found a checkpoint, and -e is its model.bin: run/checkpoint_io.h), which loads each
// rank's pieces instead and needs only the shape here.
float* load_initial_weights(const TrainConfig* cfg, GPT2Config* mc);

// Checks what every trainer needs of -t, -d and -o, and in a build without the zero1/ plugin
// (have_plugin 0) refuses the flags that need it, naming the make line that adds it.
// Returns the micro-steps per step.
int check_run_config(const TrainConfig* cfg, const GPT2Config* mc, int world, int have_plugin,
                     const char* rebuild);

// d(step loss)/d(position loss): the step loss is the mean over k*DP*B*T positions; with
// --average-in-collective the reduction divides by DP itself.
float step_loss_scale(const TrainConfig* cfg, int micro_steps, int world);

void loader_batch(void* ctx, int micro, const int** inputs, const int** targets);

// The same batch every time (-a 1).
void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets);

// 1 when every rank passed the same value.
int all_ranks_equal(uint64_t mine, int world);

// Autoregressive sampling around a trainer's forward: next_logits(ctx, tokens, n) runs the
// model on tokens[0..n) and writes the fp32 logits (Vp of them) of the last position.
// Every rank generates the same text (same seed, same weights); rank 0 prints it.
void print_sample(void* ctx, void (*next_logits)(void* ctx, const int* tokens, int n, float* logits),
                  const GPT2Config* c, int T, int gen_tokens, int rank, const Tokenizer* tok,
                  uint64_t* rng_state);

// The run's inputs and outputs: train and validation data, the HellaSwag-style eval set
// (-H 1), the tokenizer for samples, main.log (appended to on resume).
typedef struct {
    DataLoader train, val;
    int has_val;
    HellaswagSet hellaswag;
    int has_hellaswag;
    Tokenizer tok;
    Logger logger;
    OutlierState outliers;  // -sl/-sg's windows (saved in checkpoints)
    SkipBatches skipped;    // the --skip-batches ranges applied so far (saved in checkpoints)
    int nonfinite_in_a_row; // non-finite steps in a row so far, a resumed run's included (saved in checkpoints)
    DataIdentity train_identity;  // the corpus of -i (saved in checkpoints)
} RunIO;

void run_io_open(RunIO* io, const TrainConfig* cfg, int rank, int world, int vocab_size,
                 int grad_accum_steps);

void run_io_close(RunIO* io);

#ifdef __cplusplus
}
#endif
#endif
